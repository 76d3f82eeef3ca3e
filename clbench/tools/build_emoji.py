"""Build the embedded default benchmark "emoji" (``clbench/data/emoji.npz``).

The benchmark is made of real, labelled 64x64 images: emoji artwork from two
vendors, distributed on npm by the emoji-data project (iamcal/emoji-data, MIT):

* ``emoji-datasource-google@16.0.0``  -- Google Noto Emoji artwork
  (Apache License 2.0);
* ``emoji-datasource-twitter@16.0.0`` -- Twitter Twemoji graphics
  (Copyright Twitter Inc. and other contributors, CC-BY 4.0, attribution
  required).

Only these two vendors are used (never apple or facebook). Images are read
from ``node_modules/emoji-datasource-<vendor>/img/<vendor>/64/<image>`` and
labels from the package's ``emoji.json``.

Rules
-----
1. Each image is one emoji -- a base emoji or one of its ``skin_variations``
   -- drawn by one vendor for which ``has_img_<vendor>`` is true.
   The label is the emoji's Unicode subcategory. The *group* is the base
   emoji's ``unified`` code: all skin-tone variants and both vendors of one
   base emoji share a group.
2. Classes are the subcategories with at least 42 images in total (36 classes
   for version 16.0.0; asserted). Class names are ``"category/subcategory"``
   and their alphabetical order gives the class indices 0..35.
3. Per-class cap of 160 images, to limit imbalance: the class's groups are
   shuffled with ``np.random.default_rng(0)`` (one generator, classes visited
   in class-index order); whole groups are taken in that order while the
   running total stays <= 160. The first group is always taken; a group that
   would overflow the cap is skipped and the next one is tried.
4. The train/test split is grouped by base emoji: within each class, the
   chosen groups (in their shuffled order) go to test until test holds at
   least 25% of the class's chosen images; the remaining groups go to train.
   Every class has at least one group in each split and no group appears in
   both splits (both asserted).
5. Each RGBA image is composited onto white and converted to RGB uint8, kept
   at 64x64. Each split is sorted by (label, group, vendor, image name).
6. The output is written with ``np.savez_compressed`` holding ``train_x``
   (N, 64, 64, 3) uint8, ``train_y`` int16, ``train_group`` (str, base
   unified), ``test_x``, ``test_y``, ``test_group``, ``class_names`` (str) and
   ``meta`` (a JSON string: sources, rules, counts). It is written atomically
   (temporary file in the same directory, then ``os.replace``), must not
   exceed 25 MB, and is deterministic (same arrays on every run).
7. The attribution is written at the top of the ``NOTICE`` file next to the output; the other benchmarks' marked
   sections there are kept.

Usage::

    python -m clbench.tools.build_emoji --npm-root DIR --out clbench/data/emoji.npz

``DIR`` is a directory holding ``node_modules/emoji-datasource-google`` and
``node_modules/emoji-datasource-twitter``. Without ``--npm-root`` the script
runs ``npm install --prefix <tmpdir> --no-audit --no-fund
emoji-datasource-google@16.0.0 emoji-datasource-twitter@16.0.0`` itself
(npm must be on PATH). ``--out`` defaults to the package's ``data/emoji.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clbench.files.safety import default_file_mode

VENDORS: tuple[str, ...] = ("google", "twitter")
PACKAGE_VERSION = "16.0.0"
IMAGE_SIZE = 64
MIN_CLASS_IMAGES = 42
EXPECTED_NUM_CLASSES = 36
CLASS_CAP = 160
TEST_FRACTION = 0.25
SEED = 0
MAX_FILE_BYTES = 25 * 1024 * 1024

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_OUT = DATA_DIR / "emoji.npz"

NPM_PACKAGES: tuple[str, ...] = tuple(f"emoji-datasource-{v}@{PACKAGE_VERSION}" for v in VENDORS)
REBUILD_COMMAND = "python -m clbench.tools.build_emoji --npm-root DIR --out clbench/data/emoji.npz"

RULES: tuple[str, ...] = (
    "Each image is one emoji (base or skin-tone variant) from one vendor "
    "(google or twitter) where has_img_<vendor> is true.",
    "Label = Unicode emoji subcategory; group = base emoji 'unified' code "
    "(skin variants and both vendors of a base emoji share a group).",
    f"Classes = subcategories with >= {MIN_CLASS_IMAGES} images in total; "
    "class names 'category/subcategory' sorted alphabetically give indices.",
    f"Per-class cap {CLASS_CAP}: groups shuffled with "
    f"np.random.default_rng({SEED}) (classes in index order), whole groups "
    "taken while the running total stays <= cap; the first group is always "
    "taken, overflowing groups are skipped.",
    "Grouped split: chosen groups in shuffled order go to test until test "
    f"holds >= {TEST_FRACTION:.0%} of the class's chosen images, the rest to "
    "train; no group in both splits.",
    "RGBA composited on white, converted to RGB uint8, 64x64; each split sorted by (label, group, vendor, image name).",
)


@dataclass(frozen=True)
class Sample:
    """One image of the benchmark before it is loaded."""

    label: int
    group: str
    vendor: str
    image: str
    path: Path

    def sort_key(self) -> tuple[int, str, str, str]:
        return (self.label, self.group, self.vendor, self.image)


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def package_dir(npm_root: Path, vendor: str) -> Path:
    """Return the installed ``emoji-datasource-<vendor>`` package directory."""
    return npm_root / "node_modules" / f"emoji-datasource-{vendor}"


def read_package_version(npm_root: Path, vendor: str) -> str:
    """Read the version of an installed emoji-datasource package."""
    pkg_json = package_dir(npm_root, vendor) / "package.json"
    if not pkg_json.is_file():
        raise SystemExit(
            f"error: {pkg_json} not found; is emoji-datasource-{vendor} installed under {npm_root}/node_modules?"
        )
    with pkg_json.open(encoding="utf-8") as fh:
        version = json.load(fh).get("version")
    if version != PACKAGE_VERSION:
        raise SystemExit(f"error: emoji-datasource-{vendor} is version {version!r}, expected {PACKAGE_VERSION}")
    return str(version)


def load_emoji_table(npm_root: Path) -> list[dict[str, Any]]:
    """Load ``emoji.json`` (identical in both vendor packages; checked)."""
    tables: list[list[dict[str, Any]]] = []
    for vendor in VENDORS:
        path = package_dir(npm_root, vendor) / "emoji.json"
        with path.open(encoding="utf-8") as fh:
            tables.append(json.load(fh))
    if any(t != tables[0] for t in tables[1:]):
        raise SystemExit("error: emoji.json differs between vendor packages")
    return tables[0]


def npm_install(prefix: Path) -> None:
    """Install the two pinned packages with npm into ``prefix``."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "error: npm is not on PATH; install Node.js/npm or pass "
            "--npm-root pointing at a directory with node_modules/"
            "emoji-datasource-google and emoji-datasource-twitter "
            f"({PACKAGE_VERSION})"
        )
    cmd = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", *NPM_PACKAGES]
    print("running:", " ".join(cmd), file=sys.stderr)
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: npm install failed (exit {result.returncode})")


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------


def iter_images(table: Sequence[dict[str, Any]], npm_root: Path) -> Iterator[tuple[str, str, str, str, Path]]:
    """Yield (class name, group, vendor, image name, path) for every image."""
    for entry in table:
        class_name = f"{entry['category']}/{entry['subcategory']}"
        group = str(entry["unified"])
        variants = [entry, *(entry.get("skin_variations") or {}).values()]
        for variant in variants:
            for vendor in VENDORS:
                if not variant.get(f"has_img_{vendor}"):
                    continue
                image = str(variant["image"])
                path = package_dir(npm_root, vendor) / "img" / vendor / str(IMAGE_SIZE) / image
                yield class_name, group, vendor, image, path


def collect_groups(
    table: Sequence[dict[str, Any]], npm_root: Path
) -> dict[str, dict[str, list[tuple[str, str, Path]]]]:
    """Map class name -> group -> list of (vendor, image, path)."""
    bases = [str(e["unified"]) for e in table]
    assert len(bases) == len(set(bases)), "base 'unified' codes are not unique"
    subcat_to_cat: dict[str, str] = {}
    for e in table:
        prev = subcat_to_cat.setdefault(e["subcategory"], e["category"])
        assert prev == e["category"], f"subcategory {e['subcategory']} in 2 categories"

    classes: dict[str, dict[str, list[tuple[str, str, Path]]]] = defaultdict(lambda: defaultdict(list))
    for class_name, group, vendor, image, path in iter_images(table, npm_root):
        if not path.is_file():
            raise SystemExit(f"error: missing image {path}")
        classes[class_name][group].append((vendor, image, path))
    return classes


def select_classes(classes: dict[str, dict[str, list[tuple[str, str, Path]]]]) -> list[str]:
    """Return the sorted names of classes with enough images."""
    names = sorted(name for name, groups in classes.items() if sum(len(v) for v in groups.values()) >= MIN_CLASS_IMAGES)
    assert len(names) == EXPECTED_NUM_CLASSES, f"expected {EXPECTED_NUM_CLASSES} classes, got {len(names)}"
    return names


def cap_groups(group_sizes: dict[str, int], rng: np.random.Generator) -> list[str]:
    """Shuffle groups and take whole ones while the total stays <= cap."""
    order = sorted(group_sizes)
    perm = rng.permutation(len(order))
    shuffled = [order[i] for i in perm]
    chosen: list[str] = []
    total = 0
    for group in shuffled:
        size = group_sizes[group]
        if not chosen or total + size <= CLASS_CAP:
            chosen.append(group)
            total += size
    return chosen


def split_groups(chosen: Sequence[str], group_sizes: dict[str, int]) -> tuple[list[str], list[str]]:
    """Assign groups in order to test until it holds >= 25%, rest to train."""
    total = sum(group_sizes[g] for g in chosen)
    test: list[str] = []
    n_test = 0
    idx = 0
    while idx < len(chosen) and n_test < TEST_FRACTION * total:
        test.append(chosen[idx])
        n_test += group_sizes[chosen[idx]]
        idx += 1
    train = list(chosen[idx:])
    assert test and train, "each class needs >= 1 group in test and in train"
    return train, test


def grouped_splits(
    class_names: Sequence[str], sizes_of: Callable[[str], dict[str, int]]
) -> Iterator[tuple[int, str, dict[str, int], list[str], list[str]]]:
    """Each class in order: its label, name, group sizes (``sizes_of(name)``) and its capped grouped split (train
    groups, test groups), one generator seeded ``SEED`` drawing the caps of all classes in turn."""
    rng = np.random.default_rng(SEED)
    for label, name in enumerate(class_names):
        sizes = sizes_of(name)
        chosen = cap_groups(sizes, rng)
        train_groups, test_groups = split_groups(chosen, sizes)
        yield label, name, sizes, train_groups, test_groups


def sort_disjoint(train: list[Any], test: list[Any], key: Callable[[Any], Any]) -> None:
    """Sort both splits by ``key`` in place and check no group stands in both."""
    train.sort(key=key)
    test.sort(key=key)
    assert not ({s.group for s in train} & {s.group for s in test}), "a group appears in both splits"


def build_samples(
    classes: dict[str, dict[str, list[tuple[str, str, Path]]]],
    class_names: Sequence[str],
) -> tuple[list[Sample], list[Sample], list[dict[str, Any]]]:
    """Apply the cap and the grouped split; return train, test, class stats."""
    train: list[Sample] = []
    test: list[Sample] = []
    stats: list[dict[str, Any]] = []
    sizes_of = lambda name: {g: len(items) for g, items in classes[name].items()}  # noqa: E731
    for label, name, sizes, train_groups, test_groups in grouped_splits(class_names, sizes_of):
        groups = classes[name]
        for split, split_groups_ in ((train, train_groups), (test, test_groups)):
            for g in split_groups_:
                for vendor, image, path in groups[g]:
                    split.append(Sample(label, g, vendor, image, path))
        stats.append(
            {
                "class": name,
                "available_images": sum(sizes.values()),
                "available_groups": len(sizes),
                "train_images": sum(sizes[g] for g in train_groups),
                "test_images": sum(sizes[g] for g in test_groups),
                "train_groups": len(train_groups),
                "test_groups": len(test_groups),
            }
        )
    sort_disjoint(train, test, Sample.sort_key)
    return train, test, stats


# --------------------------------------------------------------------------
# Images and output
# --------------------------------------------------------------------------


def load_rgb(path: Path) -> np.ndarray:
    """Load a PNG, composite it on white and return (64, 64, 3) uint8."""
    with Image.open(path) as im:
        rgba = im.convert("RGBA")
    if rgba.size != (IMAGE_SIZE, IMAGE_SIZE):
        raise SystemExit(f"error: {path} is {rgba.size}, expected 64x64")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, rgba).convert("RGB")
    return np.asarray(rgb, dtype=np.uint8)


def to_arrays(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Turn samples into (x, y, group) arrays."""
    x = np.empty((len(samples), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, s in enumerate(samples):
        x[i] = load_rgb(s.path)
    y = np.array([s.label for s in samples], dtype=np.int16)
    group = np.array([s.group for s in samples], dtype=np.str_)
    return x, y, group


def build_arrays(npm_root: Path) -> dict[str, np.ndarray]:
    """Build every array of the benchmark from an npm root directory."""
    versions = {f"emoji-datasource-{v}": read_package_version(npm_root, v) for v in VENDORS}
    table = load_emoji_table(npm_root)
    classes = collect_groups(table, npm_root)
    class_names = select_classes(classes)
    train, test, stats = build_samples(classes, class_names)
    train_x, train_y, train_group = to_arrays(train)
    test_x, test_y, test_group = to_arrays(test)
    meta = {
        "name": "emoji",
        "sources": versions,
        "packaged_by": "emoji-data (https://github.com/iamcal/emoji-data, MIT)",
        "vendors": list(VENDORS),
        "licenses": {
            "google": "Noto Emoji artwork, Apache License 2.0",
            "twitter": "Twemoji graphics, Copyright Twitter Inc. and other "
            "contributors, CC-BY 4.0 "
            "(https://creativecommons.org/licenses/by/4.0/)",
        },
        "image_size": [IMAGE_SIZE, IMAGE_SIZE, 3],
        "rules": list(RULES),
        "parameters": {
            "min_class_images": MIN_CLASS_IMAGES,
            "class_cap": CLASS_CAP,
            "test_fraction": TEST_FRACTION,
            "seed": SEED,
        },
        "counts": {
            "num_classes": len(class_names),
            "train_images": int(len(train)),
            "test_images": int(len(test)),
            "train_groups": int(len({s.group for s in train})),
            "test_groups": int(len({s.group for s in test})),
            "per_class": stats,
        },
        "rebuild": REBUILD_COMMAND,
    }
    return {
        "train_x": train_x,
        "train_y": train_y,
        "train_group": train_group,
        "test_x": test_x,
        "test_y": test_y,
        "test_group": test_group,
        "class_names": np.array(class_names, dtype=np.str_),
        "meta": np.array(json.dumps(meta, sort_keys=True, ensure_ascii=False)),
    }


def write_npz_atomic(arrays: dict[str, np.ndarray], out: Path) -> int:
    """Write arrays with savez_compressed via a temp file + os.replace."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, default_file_mode())
        size = os.path.getsize(tmp_name)
        if size > MAX_FILE_BYTES:
            raise SystemExit(
                f"error: output would be {size / 1e6:.2f} MB, over the {MAX_FILE_BYTES / 1e6:.2f} MB limit"
            )
        os.replace(tmp_name, out)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    return size


def notice_text() -> str:
    """Return the attribution text written to ``NOTICE``."""
    return f"""\
clbench embedded benchmark "emoji" (emoji.npz)
================================================

The images in emoji.npz come from two npm packages of the emoji-data project
(https://github.com/iamcal/emoji-data, packaging and metadata under the MIT
License):

* emoji-datasource-google {PACKAGE_VERSION}
  Google Noto Emoji artwork (https://github.com/googlefonts/noto-emoji),
  licensed under the Apache License, Version 2.0
  (https://www.apache.org/licenses/LICENSE-2.0).

* emoji-datasource-twitter {PACKAGE_VERSION}
  Twemoji graphics, Copyright Twitter Inc. and other contributors,
  licensed under CC-BY 4.0 (https://creativecommons.org/licenses/by/4.0/).
  Attribution is required when redistributing these images.

The images were composited onto a white background and stored as 64x64 RGB
arrays; no other modification was made.

Labels are the Unicode emoji subcategories ("category/subcategory") as given
in the packages' emoji.json; groups are the base emoji code points.

Rebuild command:

    {REBUILD_COMMAND}

(DIR holds node_modules/emoji-datasource-google and
node_modules/emoji-datasource-twitter; omit --npm-root to let the script run
`npm install` for {" ".join(NPM_PACKAGES)} itself.)
"""


def write_text_atomic(text: str, out: Path) -> None:
    """Write a text file atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp_name, default_file_mode())
        os.replace(tmp_name, out)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


# where another benchmark's builder keeps its own section of NOTICE (build_emoji_domains: ``-- begin: clbench
# benchmark "emoji-domains" ...``); this builder owns the text before the first such section
SECTION_MARK = "-- begin: clbench benchmark"


def write_notice(path: Path) -> None:
    """Write this benchmark's attribution at the top of ``NOTICE``, keeping the other benchmarks' marked sections
    (rebuilding emoji.npz must not drop emoji-domains' licences)."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    kept = old[old.index(SECTION_MARK) :] if SECTION_MARK in old else ""
    write_text_atomic(notice_text() + ("\n" + kept if kept else ""), path)


def build(npm_root: Path, out: Path) -> dict[str, np.ndarray]:
    """Build the benchmark from ``npm_root`` and write it to ``out``."""
    arrays = build_arrays(npm_root)
    size = write_npz_atomic(arrays, out)
    write_notice(out.parent / "NOTICE")
    meta = json.loads(str(arrays["meta"]))
    counts = meta["counts"]
    print(
        f"wrote {out} ({size / 1e6:.2f} MB, {size} bytes): "
        f"{counts['num_classes']} classes, {counts['train_images']} train / "
        f"{counts['test_images']} test images"
    )
    print(f"wrote {out.parent / 'NOTICE'}")
    return arrays


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m clbench.tools.build_emoji", description="Build the embedded 'emoji' benchmark (emoji.npz)."
    )
    parser.add_argument(
        "--npm-root",
        type=Path,
        default=None,
        help="directory containing node_modules/emoji-datasource-{google,"
        "twitter}; if omitted, npm install is run into a temp dir",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output .npz path (default: {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.npm_root is not None:
        build(args.npm_root, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="clbench-emoji-npm-") as tmp:
            npm_install(Path(tmp))
            build(Path(tmp), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
