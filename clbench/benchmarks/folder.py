"""ImageFolder trees: ``<root>/train/<class>/<image>`` and ``<root>/test/<class>/<image>``.

This is the layout of PILOT's pre-sampled benchmarks (CUB-200, ImageNet-R/A, ObjectNet, OmniBenchmark, VTAB; read
with torchvision ``ImageFolder`` in LAMDA-PILOT ``utils/data.py``) and of the generic ``folder`` benchmark. Class
discovery follows ``ImageFolder``: class names are the sorted sub-folder names of ``train/``; images are the files
with an ImageFolder extension found by a sorted recursive walk of each class folder. Labels come from the names of
the train classes, so a test split can never be silently relabelled (PILOT builds two independent ImageFolders and
would be, if the two folders held different class sets).

Deviations from ``ImageFolder`` (both would crash or mislabel a run): hidden folders and files (``.ipynb_checkpoints``,
macOS ``._x.jpg`` resource forks) are ignored, and every structural problem below is an error found in the first
seconds, before any image is decoded: a missing ``train/`` or ``test/``, an empty class folder, a class in only one
split, no images at all, and (for presets) the wrong class count.

A tree of domains, ``DIR/<domain>/{train,test}/<class>/<image>`` (:data:`DOMAIN_LAYOUT`; two or more domain
folders holding the same class folders), is read as one tree whose images carry their domain (the sorted domain
folder names, in that order): ``--scenario domain`` learns one domain per task, ``--scenario class`` all of them
together. :func:`scan_tree` collects all of them (``clbench
data check`` prints the list); :func:`load_tree` raises the first as a :class:`~clbench.errors.ClbenchError`.

Nothing here imports torch; PIL is imported when an image is decoded.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import BenchmarkSpec, ImageSource
from clbench.benchmarks.registry import BENCHMARKS
from clbench.errors import ClbenchError
from clbench.files.safety import read_bytes, special_file_problem

SPLITS = ("train", "test")
MAX_IMAGE_BYTES = 512 * 2**20  # one image file; larger is refused unread (PIL would refuse its pixels anyway)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # = torchvision's
LAYOUT = "DIR/train/<class>/<image> and DIR/test/<class>/<image> (ImageFolder layout, the same class folders in both)"


def decode_image(path: Path, data: bytes | None = None, verify: bool = False):
    """Open and fully decode ``path`` (or its bytes ``data``) as an RGB PIL image; ``verify`` first runs PIL's
    ``verify()`` (structure and checksums) as well.

    PIL's decompression-bomb check (a file declaring more than ``Image.MAX_IMAGE_PIXELS`` pixels; one Openclipart PNG
    declares 623 megapixels) becomes a ClbenchError naming the file instead of a warning or a PIL exception; so does
    any file PIL cannot decode (truncated, not an image, a corrupt chunk).
    """
    from PIL import Image, UnidentifiedImageError

    def source():
        return io.BytesIO(data) if data is not None else path

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            if verify:
                with Image.open(source()) as im:
                    im.verify()  # a verified image cannot be decoded: open it again below
            with Image.open(source()) as im:
                im.load()  # the pixels: verify() alone misses truncated JPEGs
                return to_rgb(im)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ClbenchError(
            f"image {path} is too large to decode safely ({e})",
            "delete or downscale the file; PIL refuses images above Image.MAX_IMAGE_PIXELS "
            f"({Image.MAX_IMAGE_PIXELS:,} pixels) as possible decompression bombs",
        ) from None
    except UnidentifiedImageError:
        reason = "not an image file PIL can identify"
    except Exception as e:  # PIL's format plugins raise OSError, SyntaxError, ValueError, struct.error, ...
        reason = f"{type(e).__name__}: {e}"
    raise ClbenchError(
        f"cannot decode image {path}: {reason}", "replace or delete the file; `clbench data check` lists every bad file"
    )


def to_rgb(im):
    """``im`` as 8-bit RGB, for the modes where PIL's ``convert("RGB")`` loses the picture:

    - 16- and 32-bit integer grey (``I;16*``, ``I``): scaled from the full 16-bit range (``value / 257``), where
      ``convert`` clips every value above 255 to white;
    - transparency (``RGBA``, ``LA``, ``PA``, ``P`` or ``L``/``RGB`` with a transparent colour): composited onto white,
      as the embedded emoji benchmark was built, where ``convert`` keeps whatever colour hides under transparent pixels;
    - ``CMYK`` and ``YCbCr``: ``convert`` (PIL undoes the inverted CMYK of Adobe JPEGs when decoding);
    - floating-point grey (``F``): refused, since it has no standard 8-bit mapping.

    A multi-frame file gives its first frame (``clbench data check`` lists such files).
    """
    import numpy as np
    from PIL import Image

    mode = im.mode
    if mode == "RGB":
        return im.copy() if "transparency" not in im.info else _on_white(im.convert("RGBA"))
    if mode.startswith("I"):  # I;16, I;16B, I;16L, I;16N, I (16-bit PNGs open as one of these)
        a = np.asarray(im, dtype=np.int64)
        grey = np.clip(np.rint(a / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "F":
        raise ValueError("32-bit floating-point pixels have no standard 8-bit mapping; save the image as 8-bit")
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info:
        return _on_white(im.convert("RGBA"))
    return im.convert("RGB")


def _on_white(rgba):
    from PIL import Image

    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


# Formats PIL reports for each extension clbench reads (MPO: a JPEG with extra pictures, e.g. from cameras).
FORMATS_OF_EXTENSION = {
    ".jpg": ("JPEG", "MPO"),
    ".jpeg": ("JPEG", "MPO"),
    ".png": ("PNG",),
    ".ppm": ("PPM",),
    ".pgm": ("PPM",),
    ".bmp": ("BMP", "DIB"),
    ".tif": ("TIFF",),
    ".tiff": ("TIFF",),
    ".webp": ("WEBP",),
}


@dataclass
class FileFacts:
    """What reading one image file's bytes and header found (nothing is decoded): ``problem`` makes the file unfit
    for a run; ``note`` is a mode clbench converts with care (16-bit, transparency, CMYK)."""

    sha256: str | None = None
    problem: str | None = None
    kind: str | None = None  # "empty", "unreadable", "mismatch", "frames", "undecodable"
    note: str | None = None


def inspect_file(path: Path, rel: str, decode: bool) -> FileFacts:
    """Read ``path``: its sha256, whether it is empty, whether its content is the format its extension says, how
    many frames it holds and whether its mode needs care; with ``decode``, also PIL ``verify()`` and a full decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = read_bytes(path, MAX_IMAGE_BYTES, "image", rel)  # a regular file, bounded: never a FIFO or a device
    except ClbenchError as e:
        return FileFacts(problem=str(e).split("\n")[0], kind="unreadable")
    facts = FileFacts(sha256=hashlib.sha256(data).hexdigest())
    if not data:
        facts.problem, facts.kind = f"{rel}: empty file (0 bytes)", "empty"
        return facts
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # decompression bombs are the full decode's to report
            with Image.open(io.BytesIO(data)) as im:
                fmt, mode, frames = im.format, im.mode, getattr(im, "n_frames", 1)
                transparent = "transparency" in im.info
    except UnidentifiedImageError:  # worded as decode_image words it: the message a run would stop with
        facts.problem, facts.kind = f"cannot decode image {path}: not an image file PIL can identify", "undecodable"
        return facts
    except Exception as e:
        facts.problem, facts.kind = f"cannot decode image {path}: {type(e).__name__}: {e}", "undecodable"
        return facts
    expected = FORMATS_OF_EXTENSION.get(Path(rel).suffix.lower(), ())
    if expected and fmt not in expected:
        facts.problem, facts.kind = f"{rel}: the name says {expected[0]} but the content is {fmt}", "mismatch"
        return facts
    if frames > 1:
        facts.problem, facts.kind = f"{rel}: {frames} frames in one file (a run would read the first only)", "frames"
        return facts
    if mode == "F":
        facts.problem, facts.kind = f"{rel}: 32-bit floating-point pixels (no standard 8-bit mapping)", "undecodable"
        return facts
    if mode.startswith("I"):
        facts.note = "16-bit"
    elif mode in ("RGBA", "LA", "PA") or transparent:
        facts.note = "transparency"
    elif mode == "CMYK":
        facts.note = "CMYK"
    if decode:
        err = verify_image(path, data)
        if err is not None:
            facts.problem, facts.kind = err, "undecodable"
    return facts


def verify_image(path: Path, data: bytes) -> str | None:
    """None if ``data`` (the bytes of ``path``) passes PIL ``verify()`` and a full decode, else the reason."""
    try:
        decode_image(path, data, verify=True)
    except ClbenchError as e:
        return str(e).split("\n")[0]
    return None


class FileSource(ImageSource):
    """Images addressed by path relative to ``root``; ``labels`` are indices into the sorted class names."""

    def __init__(self, root: Path, paths: list[str], labels: np.ndarray, name: str) -> None:
        if len(paths) != labels.shape[0]:
            raise ValueError(f"{name}: {len(paths)} paths but {labels.shape[0]} labels")
        self.root = Path(root)
        self.paths = list(paths)  # relative, e.g. "train/cat/0001.jpg"
        self.labels = np.asarray(labels, dtype=np.int64)
        self.name = name
        self._fp: str | None = None
        self._id: str | None = None  # data_id, once computed

    def path(self, i: int) -> Path:
        return self.root / self.paths[i]

    def image(self, i: int):
        return decode_image(self.path(i))

    def fingerprint(self) -> str:
        """Digest of (relative path, label, size, mtime) of every file: cheap (one stat per file, no reads), and it
        changes when a file is added, removed, renamed, relabelled or rewritten."""
        if self._fp is None:
            h = hashlib.sha256()
            for rel, label in zip(self.paths, self.labels.tolist(), strict=True):
                try:
                    st = os.stat(self.root / rel)
                except OSError as e:
                    raise ClbenchError(f"cannot read {self.root / rel}: {e.strerror or e}") from None
                h.update(f"{rel}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            self._fp = h.hexdigest()[:16]
        return self._fp

    def data_id(self) -> str:
        """Digest of (relative path, label, size) of every file: as :meth:`fingerprint` without the times, so that
        every copy of one tree (another machine, a restored backup) gives the same digest while two trees that
        differ in a class, a file name or a file's size do not. One stat per file, no reads; computed once."""
        if self._id is None:
            h = hashlib.sha256()
            for rel, label in zip(self.paths, self.labels.tolist(), strict=True):
                try:
                    size = os.stat(self.root / rel).st_size
                except OSError as e:
                    raise ClbenchError(f"cannot read {self.root / rel}: {e.strerror or e}") from None
                h.update(f"{rel}\0{label}\0{size}\n".encode())
            self._id = h.hexdigest()[:16]
        return self._id


@dataclass
class TreeScan:
    """What a walk of ``<root>/{train,test}`` found; ``problems`` are the reasons it cannot be used as a benchmark."""

    root: Path
    files: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # split -> class -> relative paths
    problems: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # relative paths of non-image or hidden files
    link_problems: list[str] = field(default_factory=list)  # symbolic link loops, dangling links, links leaving root
    # a domain tree (DOMAIN_LAYOUT): the domain folder names in arrival order (sorted), and split -> class -> the
    # domain index of each file in ``files``; empty for a single-domain tree
    domains: list[str] = field(default_factory=list)
    file_domains: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def class_names(self) -> list[str]:
        return sorted(self.files.get("train", {}))

    def n_images(self, split: str) -> int:
        return sum(len(v) for v in self.files.get(split, {}).values())


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _near_tree(root: Path, depth: int = 2) -> Path | None:
    """A folder up to ``depth`` levels below ``root`` that holds both train/ and test/ (e.g. PILOT's vtab-cil/vtab)."""
    frontier = [root]
    for _ in range(depth):
        nxt = []
        for d in frontier:
            try:
                subs = sorted(p for p in d.iterdir() if p.is_dir() and not _is_hidden(p.name))
            except OSError:
                continue
            for s in subs:
                if all((s / sp).is_dir() for sp in SPLITS):
                    return s
            nxt += subs
        frontier = nxt
    return None


def _layout_problem(root: Path, missing: list[str]) -> str:
    what = " and ".join(f"{m}/" for m in missing)
    msg = f"{root} has no {what} folder: expected {LAYOUT.replace('DIR', str(root))}"
    near = _near_tree(root)
    if near is not None:
        msg += f"; did you mean --data-root {near}?"
    elif "test" in missing and (root / "val").is_dir():
        msg += "; it has val/: rename it to test/"
    elif "train" in missing and "test" in missing:
        try:
            if any(p.is_dir() for p in root.iterdir() if not _is_hidden(p.name)):
                msg += "; its sub-folders look like classes of one unsplit tree: split them into train/ and test/"
        except OSError:
            pass
    return msg


def _is_utf8(name: str) -> bool:
    """Whether a file name decoded from the file system is UTF-8 (Python keeps other bytes as lone surrogates, which
    no record, report or terminal can hold)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_utf8(where: str, name: str, root: Path) -> str:
    shown = os.fsencode(name).decode("utf-8", "backslashreplace")
    return f"{where}{shown}: a file or folder name that is not UTF-8 (in {root}); rename it"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _walk_class(class_dir: Path, rel_prefix: str, scan: TreeScan, seen: set[tuple[int, int]]) -> list[str]:
    """Image files below ``class_dir`` as paths relative to the tree root, in ImageFolder's order (``sorted(os.walk(
    followlinks=True))``, files sorted in each folder). Symbolic links inside the data root are followed, but a
    folder reached twice (a link loop, or a link to a folder walked already) is walked once; links that leave the
    data root (never followed, also with ``--ignore-data-problems``) or lead nowhere are listed in
    ``scan.link_problems``; hidden folders and files are skipped."""
    real_root = os.path.realpath(scan.root)
    folders: list[tuple[str, str, list[str]]] = []  # (path for sorting, relative path, file names)

    def walk(path: str, rel: str) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as e:
            scan.link_problems.append(f"{rel}: cannot list the folder ({e.strerror or e})")
            return
        names: list[str] = []
        subdirs: list[tuple[str, str]] = []
        for entry in entries:
            r = f"{rel}/{entry.name}"
            if not _is_utf8(entry.name):
                scan.problems.append(_not_utf8(f"{rel}/", entry.name, scan.root))
                continue
            if _is_hidden(entry.name):
                scan.ignored.append(r)
                continue
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not os.path.exists(target):
                    scan.link_problems.append(
                        f"{r}: a symbolic link to {os.readlink(entry.path)}, which does not exist"
                    )
                    continue
                if not _inside(target, real_root):  # listed, never followed: nothing outside the root is read
                    odd = special_file_problem(entry.path)  # a device or FIFO is said as such (never opened)
                    if odd is not None and odd != "a folder":
                        scan.problems.append(
                            f"{r} is {odd}, not an image file (in {scan.root}), through a symbolic link to {target}"
                        )
                    else:
                        scan.link_problems.append(
                            f"{r}: a symbolic link that leaves the data root (to {target}); not followed"
                        )
                    continue
            try:
                is_dir = entry.is_dir()
            except OSError:  # a link loop pointing at itself
                is_dir = False
            if is_dir:
                try:
                    st = os.stat(entry.path)
                except OSError as e:
                    scan.link_problems.append(f"{r}: a symbolic link that cannot be followed ({e.strerror or e})")
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    scan.link_problems.append(
                        f"{r}: a symbolic link loop (it leads to a folder already walked, "
                        f"{os.path.realpath(entry.path)}); walked once"
                    )
                    continue
                seen.add((st.st_dev, st.st_ino))
                subdirs.append((entry.path, r))
            elif not entry.name.lower().endswith(IMG_EXTENSIONS):
                scan.ignored.append(r)
            elif not os.path.exists(entry.path):
                scan.link_problems.append(f"{r}: a symbolic link loop")
            elif (odd := special_file_problem(entry.path)) is not None:  # never opened: a FIFO blocks, /dev/zero
                scan.problems.append(  # never ends
                    f"{r} is {odd}, not an image file (in {scan.root})"
                    + (f", through a symbolic link to {os.path.realpath(entry.path)}" if entry.is_symlink() else "")
                )
            else:
                names.append(entry.name)
        folders.append((path, rel, names))
        for sub_path, sub_rel in subdirs:
            walk(sub_path, sub_rel)

    st = os.stat(class_dir)
    seen.add((st.st_dev, st.st_ino))
    walk(str(class_dir), rel_prefix)
    return [f"{rel}/{name}" for _, rel, names in sorted(folders) for name in names]


def scan_tree(root: Path, expected_classes: int | None = None, name: str = "folder") -> TreeScan:
    """Walk ``<root>/train`` and ``<root>/test`` (no image is opened) and list every structural problem."""
    root = Path(root)
    scan = TreeScan(root)
    missing = [s for s in SPLITS if not (root / s).is_dir()]
    if missing and (domains := domain_folders(root)):
        return _scan_domains(root, domains, expected_classes, name)
    if missing:
        scan.problems.append(_layout_problem(root, missing))
        return scan
    seen: set[tuple[int, int]] = set()  # folders walked, across both splits: each is walked once
    for split in SPLITS:
        classes: dict[str, list[str]] = {}
        for entry in sorted(os.scandir(root / split), key=lambda e: e.name):
            if not _is_utf8(entry.name):
                scan.problems.append(_not_utf8(f"{split}/", entry.name, root))
                continue
            if _is_hidden(entry.name):
                continue
            if entry.is_symlink() and not _inside(os.path.realpath(entry.path), os.path.realpath(root)):
                scan.link_problems.append(
                    f"{split}/{entry.name}: a symbolic link that leaves the data root (to "
                    f"{os.path.realpath(entry.path)}); not followed"
                )
                continue
            if entry.is_dir():
                st = os.stat(entry.path)
                if (st.st_dev, st.st_ino) in seen:
                    scan.link_problems.append(
                        f"{split}/{entry.name}: a symbolic link to a folder already walked "
                        f"({os.path.realpath(entry.path)})"
                    )
                    classes[entry.name] = []
                    continue
                classes[entry.name] = _walk_class(Path(entry.path), f"{split}/{entry.name}", scan, seen)
            else:
                scan.ignored.append(f"{split}/{entry.name}")
        scan.files[split] = classes
    train, test = scan.files["train"], scan.files["test"]
    if not train and not test:
        scan.problems.append(f"{root}/train and {root}/test hold no class folders: expected {LAYOUT}")
        return scan
    if not any(train.values()) and not any(test.values()):
        scan.problems.append(f"{root} holds no images at all (extensions read: {', '.join(IMG_EXTENSIONS)})")
        return scan
    for split, classes in scan.files.items():
        empty = [c for c, files in classes.items() if not files]
        if empty:
            scan.problems.append(
                f"{len(empty)} class folder(s) in {root}/{split} hold no images: {_few(empty)} "
                f"(extensions read: {', '.join(IMG_EXTENSIONS)})"
            )
    only_test = sorted(set(test) - set(train))
    if only_test:
        scan.problems.append(
            f"{len(only_test)} class(es) in {root}/test have no folder in {root}/train: {_few(only_test)}"
        )
    only_train = sorted(set(train) - set(test))
    if only_train:
        scan.problems.append(
            f"{len(only_train)} class(es) in {root}/train have no folder in {root}/test: {_few(only_train)}"
        )
    if expected_classes is not None and len(train) != expected_classes:
        scan.problems.append(
            f"benchmark {name!r} should have {expected_classes} classes but {root}/train has {len(train)}"
        )
    return scan


DOMAIN_LAYOUT = "DIR/<domain>/train/<class>/<image> and DIR/<domain>/test/<class>/<image> (the same classes in each)"


def domain_folders(root: Path) -> list[str]:
    """The domain folders of a domain tree (:data:`DOMAIN_LAYOUT`): the sorted sub-folders of ``root`` when it has
    no ``train/`` and ``test/`` of its own and two or more sub-folders each hold both; else an empty list (one such
    sub-folder is a tree one level down, which :func:`_layout_problem` points to)."""
    try:
        subs = sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not _is_hidden(p.name))
    except OSError:
        return []
    if any((Path(root) / sp).is_dir() for sp in SPLITS):
        return []
    found = [d for d in subs if all((Path(root) / d / sp).is_dir() for sp in SPLITS)]
    return found if len(found) >= 2 else []


def _scan_domains(root: Path, domains: list[str], expected_classes: int | None, name: str) -> TreeScan:
    """Scan each domain's train/test tree and join them: one class list (every domain must hold the same classes,
    since a domain-incremental task brings every class in a new domain), paths relative to ``root``."""
    scan = TreeScan(root, domains=list(domains))
    others = sorted(p.name for p in root.iterdir() if p.is_dir() and not _is_hidden(p.name) and p.name not in domains)
    if others:
        scan.problems.append(
            f"{root} is a domain tree ({_few(domains)}) but {_few(others)} hold no train/ and test/: expected "
            f"{DOMAIN_LAYOUT}"
        )
    first: list[str] | None = None
    for d_index, d in enumerate(domains):
        one = scan_tree(root / d, None, name)
        scan.problems += [f"domain {d!r}: {p}" for p in one.problems]
        scan.link_problems += [f"{d}/{p}" for p in one.link_problems]
        scan.ignored += [f"{d}/{p}" for p in one.ignored]
        if first is None:
            first = one.class_names
        elif one.class_names != first:
            missing, extra = sorted(set(first) - set(one.class_names)), sorted(set(one.class_names) - set(first))
            scan.problems.append(
                f"domain {d!r} holds other classes than domain {domains[0]!r}"
                + (f": lacks {_few(missing)}" if missing else "")
                + (f"; has {_few(extra)} in addition" if extra else "")
                + " (every domain must hold the same class folders)"
            )
        for split, classes in one.files.items():
            into, where = scan.files.setdefault(split, {}), scan.file_domains.setdefault(split, {})
            for c, paths in classes.items():
                into.setdefault(c, []).extend(f"{d}/{p}" for p in paths)
                where.setdefault(c, []).extend([d_index] * len(paths))
    if expected_classes is not None and first is not None and len(first) != expected_classes:
        scan.problems.append(
            f"benchmark {name!r} should have {expected_classes} classes but each domain has {len(first)}"
        )
    return scan


def with_data_domains(spec: BenchmarkSpec, data_root: str | Path | None) -> BenchmarkSpec:
    """``spec`` with the domains its data root declares (a discovered-class tree benchmark, ``folder``, whose root
    has the :data:`DOMAIN_LAYOUT`), so that ``--scenario domain`` runs on it; ``spec`` unchanged otherwise."""
    import dataclasses

    if spec.n_classes is not None or spec.domains or data_root is None or not spec.load.endswith(":load_folder"):
        return spec
    domains = domain_folders(Path(data_root))
    return dataclasses.replace(spec, domains=tuple(domains)) if domains else spec


def split_problem(n_classes: int, init_cls: int, increment: int, defaults: bool) -> str | None:
    """Why the split ``init_cls`` + ``increment`` per later task cannot cut ``n_classes`` classes into tasks (the
    check a run makes, :func:`~clbench.benchmarks.base.task_sizes`), naming the flags that fix it; None if it can.
    ``defaults``: the split is the benchmark's default (no flag given)."""
    given = "the default split" if defaults else "the split"
    what = f"{given} --init-cls {init_cls} --increment {increment}"
    if init_cls > n_classes or (init_cls < n_classes and increment > n_classes - init_cls):
        k = max(1, n_classes // 2)
        return (
            f"{what} does not fit the {n_classes} classes found: pass --init-cls K --increment M with "
            f"K <= {n_classes} and M <= {n_classes} - K, e.g. --init-cls {k} --increment {n_classes - k}"
            if n_classes > 1
            else f"{what} does not fit: a class-incremental run needs at least 2 classes, found {n_classes}"
        )
    return None


def _few(names: list[str], k: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def sources_from_scan(scan: TreeScan, name: str) -> tuple[FileSource, FileSource, list[str]]:
    """Train and test :class:`FileSource` objects labelled by the sorted train class names."""
    class_names = scan.class_names
    index = {c: i for i, c in enumerate(class_names)}
    out = []
    for split in SPLITS:
        paths: list[str] = []
        labels: list[int] = []
        for c in sorted(scan.files[split]):
            paths += scan.files[split][c]
            labels += [index[c]] * len(scan.files[split][c])
        source = FileSource(scan.root, paths, np.asarray(labels, dtype=np.int64), f"{name}/{split}")
        if scan.domains:
            source.domains = np.asarray(
                [d for c in sorted(scan.files[split]) for d in scan.file_domains[split][c]], dtype=np.int64
            )
        out.append(source)
    return out[0], out[1], class_names


def load_tree(
    root: Path | None, name: str = "folder", expected_classes: int | None = None, hint: str | None = None
) -> tuple[FileSource, FileSource, list[str]]:
    """Load an ImageFolder train/test tree, raising a ClbenchError for its first structural problem."""
    if root is None:
        raise ClbenchError(f"benchmark {name!r} needs its data: pass --data-root DIR holding {LAYOUT}", hint)
    scan = scan_tree(root, expected_classes, name)
    if scan.problems:
        more = len(scan.problems) - 1
        suffix = f" (and {more} more problem{'s' * (more > 1)}: run `clbench data check {name} --data-root {root}`)"
        raise ClbenchError(scan.problems[0] + (suffix if more else ""), hint)
    return sources_from_scan(scan, name)


class TreeLoader:
    """The ``load`` target of a registered tree benchmark: reads ``<data_root>/{train,test}`` and checks the class
    count and hints with the benchmark's spec (``n_classes``, ``source_info``)."""

    def __init__(self, bench: str) -> None:
        self.bench = bench

    def __call__(self, data_root: Path | None) -> tuple[FileSource, FileSource, list[str]]:
        spec = BENCHMARKS.get(self.bench)
        return load_tree(data_root, spec.name, spec.n_classes, spec.source_info or f"expected {LAYOUT}")
