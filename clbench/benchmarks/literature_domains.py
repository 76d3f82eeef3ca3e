"""The literature's domain-incremental benchmarks as presets, read from their published layouts under ``--data-root``.

Why: a domain-incremental result is comparable with the literature only on the literature's data and split. These
specs read each release as published (S-Prompts' README and ``utils/data.py``, whose layouts InfLoRA reuses), so a
researcher unpacks the archive and passes ``--data-root``; nothing is downloaded. Every image carries its domain
(``ImageSource.domains``, an index into the spec's ``domains``, in arrival order); in the class scenario the domains'
images are pooled.

- ``domainnet``: 6 domains (S-Prompts' order clipart, infograph, painting, quickdraw, real, sketch), 345 classes,
  the release's split lists ``<domain>_train.txt`` / ``<domain>_test.txt`` (lines ``<domain>/<class>/<file> <label>``)
  beside the domain folders.
- ``core50``: the NI scenario, 50 objects; domains are the 8 training sessions s1, s2, s4, s5, s6, s8, s9, s11 in
  session order, the test set is sessions s3, s7, s10 (CORe50's NI protocol, as in Avalanche, L2P and S-Prompts),
  read from ``core50_128x128/s<k>/o<j>/*.png``. The reference code takes each run's batch order from
  ``LUP.pkl``; clbench does not unpickle it and uses the session order (run 0 of the NI scenario). The test
  sessions are no training domain: every test image carries domain 0 and the spec says ``shared_test``, so the
  whole test set is evaluated after every task, as the reference (and Avalanche's one NI test experience)
  evaluates it; in the accuracy matrix it is the first domain's column, the others stay empty.
- ``cddb``: CDDB-Hard, the task list of S-Prompts' and InfLoRA's configs (gaugan, biggan, wild, whichfaceisreal,
  san), classes real / fake, ``<task>/{train,val}/[<object>/]{0_real,1_fake}/<image>``; ``val`` is the test split,
  as in the reference. (S-Prompts labels the two classes of task t as 2t and 2t+1 and scores real/fake; here the two
  classes are shared by every domain, which is the domain-incremental reading.)
- ``office-home``: Art, Clipart, Product, Real World (the release's folders, alphabetical), 65 classes. The release
  has no train/test split: clbench's is seeded and stated here: in every (domain, class) folder, the sorted image
  files are permuted by ``np.random.RandomState(1993)`` and the first ``round(0.2 * n)`` (at least 1) go to test.

Structural problems (a missing list or folder, a listed file that is not there, a split-list line that is not
``<path> <label>``, a label outside the spec's classes, a path with a ``..`` part, a label that disagrees with its
folder, a domain without images) raise a ClbenchError naming the file (and the line), found before any image is
decoded or anything sized by a label is built. A path that leaves the data root, by ``..`` or through a symbolic
link of the file or of any folder above it, is refused too, also with ``--ignore-data-problems``: nothing outside
the root is read. What a run also checks before it starts and ``clbench data check <name> --data-root DIR`` lists
(:func:`clbench.benchmarks.check.check_file_sources`, the folder benchmark's checks): files listed twice through a
link, unreadable or undecodable images, test images equal to training images. Torch-free: importing this module
only builds specs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import BenchmarkSpec
from clbench.benchmarks.folder import IMG_EXTENSIONS, FileSource
from clbench.benchmarks.literature import register_preset
from clbench.benchmarks.registry import BENCHMARKS
from clbench.errors import ClbenchError
from clbench.files.escape import plain
from clbench.files.safety import read_bytes

LISTS_FILES = True  # its loaders list image files: a run checks them before it starts (check.check_before_run)
S_PROMPTS = "S-Prompts (Wang et al. 2022, github.com/iamwangyabin/S-Prompts) README and configs"
REFERENCE_TF = {
    "img_size": 224,
    "resize": 256,
    "normalize": True,
}  # S-Prompts: Resize 256, CenterCrop 224, ImageNet mean/std

DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
CORE50_TRAIN = ("s1", "s2", "s4", "s5", "s6", "s8", "s9", "s11")
CORE50_TEST = ("s3", "s7", "s10")
CDDB_TASKS = ("gaugan", "biggan", "wild", "whichfaceisreal", "san")
CDDB_CLASSES = ("0_real", "1_fake")
OFFICE_HOME_DOMAINS = ("Art", "Clipart", "Product", "Real World")
OFFICE_HOME_SEED = 1993
OFFICE_HOME_TEST_FRACTION = 0.2


class DomainFileSource(FileSource):
    """A :class:`FileSource` whose images each carry a domain index. Every path is resolved once, here: one that
    leaves the data root (by ``..`` or through a symbolic link, of the file or of a folder above it) is refused,
    also with ``--ignore-data-problems``, so that nothing outside the root is read; ``real_paths`` keeps where each
    file lies, for :func:`clbench.benchmarks.check.check_file_sources` (two listed paths that are one file)."""

    def __init__(self, root: Path, paths: list[str], labels: list[int], domains: list[int], name: str) -> None:
        super().__init__(root, paths, np.asarray(labels, dtype=np.int64), name)
        self.domains = np.asarray(domains, dtype=np.int64)
        self.real_paths = _confined(self.root, self.paths, name)


def _confined(root: Path, paths: list[str], name: str) -> list[str]:
    """The real path of every ``root``/path (one ``realpath`` per folder, one ``lstat`` per file); a ClbenchError
    naming the first path that resolves outside ``root``."""
    real_root = os.path.realpath(root)
    folders: dict[str, str] = {}
    out = []
    for rel in paths:
        parent, _, file = rel.rpartition("/")
        where = folders.get(parent)
        if where is None:
            where = folders[parent] = os.path.realpath(os.path.join(root, parent))
        real = os.path.join(where, file)
        if file in ("", ".", "..") or os.path.islink(real):
            real = os.path.realpath(real)
        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
            raise ClbenchError(
                f"{name}: {root / rel} leaves the data root {root} (it is {real}); nothing outside the root is read",
                "copy the file into the data root, or remove the symbolic link (or the '..') that leads out of it",
            )
        out.append(real)
    return out


def _images_in(folder: Path) -> list[str]:
    """Image file names in ``folder`` (sorted, hidden files skipped); [] if it is not a folder."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if not n.startswith(".") and n.lower().endswith(IMG_EXTENSIONS)]


def _require_dir(path: Path, what: str, fix: str) -> None:
    if not path.is_dir():
        raise ClbenchError(f"{path} is missing: {what}", fix)


def _spec(name: str) -> BenchmarkSpec:
    return BENCHMARKS.get(name)


def _root(data_root: Path | None, name: str) -> Path:
    if data_root is None:
        spec = _spec(name)
        raise ClbenchError(f"benchmark {name!r} needs its data: pass --data-root DIR", spec.source_info)
    return Path(data_root)


# ------------------------------------------------------------------------------------------------ DomainNet
_LABEL = re.compile(r"[0-9]+")  # a class index in decimal digits: no sign, no '--1'


def _read_list(root: Path, domain: str, split: str, names: dict[int, str]) -> tuple[list[str], list[int]]:
    """The paths and labels of ``<domain>_<split>.txt``; every line checked before it is used: its form, a label
    in 0 ... n_classes - 1 (before anything sized by a label is built), a relative path in the domain's folder
    without ``.`` or ``..`` parts, one class name per label."""
    path = root / f"{domain}_{split}.txt"
    spec = _spec("domainnet")
    fix = spec.source_info
    n_classes = spec.n_classes or 0
    if not path.is_file():
        near = [p for p in sorted(root.glob(f"*/{domain}_{split}.txt"))[:1]]
        hint = f"did you mean --data-root {near[0].parent}? " if near else ""
        raise ClbenchError(f"DomainNet split list {path} is missing", hint + fix)
    _confined(root, [path.name], "DomainNet split list")  # a link out of the root is not read
    paths: list[str] = []
    labels: list[int] = []
    for n, line in enumerate(_list_text(path).splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not _LABEL.fullmatch(parts[1]):
            raise ClbenchError(
                f"{path} line {n}: expected '<domain>/<class>/<file> <label>' (a label in decimal digits), "
                f"got {plain(line)[:120]!r}",
                fix,
            )
        rel = parts[0]
        label = int(parts[1]) if len(parts[1]) <= 9 else n_classes  # longer: no class, and int() is never asked
        if label >= n_classes:
            raise ClbenchError(
                f"{path} line {n}: label {parts[1][:20]} is not a class of DomainNet (labels 0 ... {n_classes - 1})",
                fix,
            )
        pieces = rel.split("/")
        if len(pieces) < 3 or pieces[0] != domain:
            raise ClbenchError(f"{path} line {n}: {plain(rel)[:120]!r} is not a path '{domain}/<class>/<file>'", fix)
        if any(p in ("", ".", "..") for p in pieces):
            raise ClbenchError(
                f"{path} line {n}: {plain(rel)[:120]!r} has an empty, '.' or '..' part: a listed path names a file "
                f"inside {root / domain}, without climbing out of it",
                fix,
            )
        if names.setdefault(label, pieces[1]) != pieces[1]:
            raise ClbenchError(
                f"{path} line {n}: label {label} is class {pieces[1]!r} here but {names[label]!r} elsewhere", fix
            )
        paths.append(rel)
        labels.append(label)
    if not paths:
        raise ClbenchError(f"DomainNet split list {path} lists no images", fix)
    return paths, labels


def _check_listed_files(root: Path, paths: list[str], what: str, fix: str) -> None:
    missing = [p for p in paths if not os.path.isfile(root / p)]
    if missing:
        raise ClbenchError(
            f"{len(missing)} image(s) listed in {what} are not in {root}, e.g. {root / missing[0]}",
            fix,
        )


def load_domainnet(data_root: Path | None) -> tuple[DomainFileSource, DomainFileSource, list[str]]:
    root = _root(data_root, "domainnet")
    fix = _spec("domainnet").source_info
    names: dict[int, str] = {}
    out = []
    for split in ("train", "test"):
        paths: list[str] = []
        labels: list[int] = []
        domains: list[int] = []
        for d, domain in enumerate(DOMAINNET_DOMAINS):
            p, y = _read_list(root, domain, split, names)
            _check_listed_files(root, p, f"{domain}_{split}.txt", fix)
            paths += p
            labels += y
            domains += [d] * len(p)
        out.append(DomainFileSource(root, paths, labels, domains, f"domainnet/{split}"))
    n = _spec("domainnet").n_classes or 0  # every label was checked to lie below it
    gaps = [c for c in range(n) if c not in names]
    if gaps:
        raise ClbenchError(
            f"DomainNet split lists: labels must be 0 ... {n - 1}; no line has label {gaps[0]} "
            f"({len(gaps)} label(s) missing)",
            fix,
        )
    return out[0], out[1], [names[i] for i in range(n)]


MAX_LIST_BYTES = 64 * 2**20  # the largest released list (real_train.txt, 120,906 lines) is about 6 MB


def _list_text(path: Path) -> str:
    """A split list's text: a regular file of at most :data:`MAX_LIST_BYTES`, UTF-8."""
    data = read_bytes(path, MAX_LIST_BYTES, "DomainNet split list", name=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClbenchError(f"{path}: not UTF-8 text (byte {e.start})", _spec("domainnet").source_info) from None


# ------------------------------------------------------------------------------------------------ CORe50
def _core50_dir(root: Path) -> Path:
    for candidate in (root, root / "core50_128x128", root / "data" / "core50_128x128"):
        if (candidate / "s1").is_dir():
            return candidate
    raise ClbenchError(
        f"{root} holds no CORe50 session folders (s1 ... s11, nor core50_128x128/s1 ...)", _spec("core50").source_info
    )


def load_core50(data_root: Path | None) -> tuple[DomainFileSource, DomainFileSource, list[str]]:
    root = _core50_dir(_root(data_root, "core50"))
    fix = _spec("core50").source_info
    n_objects = 50
    out = []
    for split, sessions in (("train", CORE50_TRAIN), ("test", CORE50_TEST)):
        paths: list[str] = []
        labels: list[int] = []
        domains: list[int] = []
        for d, session in enumerate(sessions):
            _require_dir(root / session, f"CORe50 session {session} (NI {split} sessions: {', '.join(sessions)})", fix)
            for obj in range(n_objects):
                folder = root / session / f"o{obj + 1}"
                files = _images_in(folder)
                if not files:
                    raise ClbenchError(f"{folder} is missing or holds no images: every session has o1 ... o50", fix)
                paths += [f"{session}/o{obj + 1}/{f}" for f in files]
                labels += [obj] * len(files)
                domains += [d if split == "train" else 0] * len(files)
        out.append(DomainFileSource(root, paths, labels, domains, f"core50/{split}"))
    return out[0], out[1], [f"o{i + 1}" for i in range(n_objects)]


# ------------------------------------------------------------------------------------------------ CDDB
def _cddb_class_dirs(split_dir: Path) -> list[Path]:
    """The folders holding ``0_real`` and ``1_fake``: ``split_dir`` itself, or each object folder below it (the
    reference's ``multiclass`` tasks)."""
    if any((split_dir / c).is_dir() for c in CDDB_CLASSES):
        return [split_dir]
    try:
        subs = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        subs = []
    return [s for s in subs if any((s / c).is_dir() for c in CDDB_CLASSES)]


def load_cddb(data_root: Path | None) -> tuple[DomainFileSource, DomainFileSource, list[str]]:
    root = _root(data_root, "cddb")
    fix = _spec("cddb").source_info
    if not (root / CDDB_TASKS[0]).is_dir() and (root / "CDDB" / CDDB_TASKS[0]).is_dir():
        raise ClbenchError(f"{root} holds CDDB/, not the task folders", f"pass --data-root {root / 'CDDB'}")
    out = []
    for split, folder in (("train", "train"), ("test", "val")):
        paths: list[str] = []
        labels: list[int] = []
        domains: list[int] = []
        for d, task in enumerate(CDDB_TASKS):
            split_dir = root / task / folder
            _require_dir(split_dir, f"CDDB task {task!r}, split {folder}/", fix)
            class_dirs = _cddb_class_dirs(split_dir)
            if not class_dirs:
                raise ClbenchError(f"{split_dir} holds no 0_real/ and 1_fake/ folders (nor <object>/0_real ...)", fix)
            for base in class_dirs:
                for label, cls in enumerate(CDDB_CLASSES):
                    files = _images_in(base / cls)
                    if not files:
                        raise ClbenchError(f"{base / cls} is missing or holds no images", fix)
                    rel = base.relative_to(root).as_posix()
                    paths += [f"{rel}/{cls}/{f}" for f in files]
                    labels += [label] * len(files)
                    domains += [d] * len(files)
        out.append(DomainFileSource(root, paths, labels, domains, f"cddb/{split}"))
    return out[0], out[1], ["real", "fake"]


# ------------------------------------------------------------------------------------------------ Office-Home
def office_home_split(n: int, seed: int = OFFICE_HOME_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Positions (into a class folder's sorted files) of the train and test images: a seeded permutation, the first
    ``round(0.2 n)`` (at least 1) to test."""
    if n < 2:
        raise ValueError("a class folder needs at least 2 images to split")
    perm = np.random.RandomState(seed).permutation(n)
    n_test = max(1, int(round(OFFICE_HOME_TEST_FRACTION * n)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def load_office_home(data_root: Path | None) -> tuple[DomainFileSource, DomainFileSource, list[str]]:
    root = _root(data_root, "office-home")
    fix = _spec("office-home").source_info
    if not (root / "Art").is_dir():
        near = sorted(p for p in root.glob("*/Art") if p.is_dir())
        if near:
            raise ClbenchError(f"{root} has no Art/ folder", f"did you mean --data-root {near[0].parent}?")
    for domain in OFFICE_HOME_DOMAINS:
        _require_dir(root / domain, f"Office-Home domain folder {domain!r}", fix)
    classes = sorted(p.name for p in (root / OFFICE_HOME_DOMAINS[0]).iterdir() if p.is_dir() and p.name[0] != ".")
    split: dict[str, tuple[list[str], list[int], list[int]]] = {"train": ([], [], []), "test": ([], [], [])}
    for d, domain in enumerate(OFFICE_HOME_DOMAINS):
        found = sorted(p.name for p in (root / domain).iterdir() if p.is_dir() and p.name[0] != ".")
        if found != classes:
            odd = sorted(set(found) ^ set(classes))
            raise ClbenchError(
                f"Office-Home domain {domain!r} has other class folders than {OFFICE_HOME_DOMAINS[0]!r}, "
                f"e.g. {odd[0]!r}",
                fix,
            )
        for label, cls in enumerate(classes):
            files = _images_in(root / domain / cls)
            if len(files) < 2:
                raise ClbenchError(f"{root / domain / cls} holds {len(files)} image(s): the split needs >= 2", fix)
            for name, positions in zip(("train", "test"), office_home_split(len(files)), strict=True):
                paths, labels, domains = split[name]
                paths += [f"{domain}/{cls}/{files[i]}" for i in positions]
                labels += [label] * len(positions)
                domains += [d] * len(positions)
    train, test = (DomainFileSource(root, *split[s], name=f"office-home/{s}") for s in ("train", "test"))
    return train, test, classes


# ------------------------------------------------------------------------------------------------ specs
def _preset(
    name: str, summary: str, n: int, domains: tuple[str, ...], source_info: str, licence: str, shared_test: bool = False
) -> None:
    # the class scenario pools every domain: one task of every class (the reference is DIL only)
    register_preset(__name__, name, summary, n, n, source_info, licence, REFERENCE_TF, domains, shared_test)


_preset(
    "domainnet",
    "DomainNet, 6 domains x 345 classes, the release's train/test lists (S-Prompts/InfLoRA domain order)",
    345,
    DOMAINNET_DOMAINS,
    "DomainNet (Peng et al. 2019, http://ai.bu.edu/M3SDA/), as laid out in the " + S_PROMPTS + ": unpack the six "
    "domain archives and the split lists so that DIR/<domain>/<class>/<image> and DIR/<domain>_train.txt, "
    "DIR/<domain>_test.txt (domains clipart, infograph, painting, quickdraw, real, sketch) lie side by side; "
    "pass --data-root DIR",
    "research and educational use (the DomainNet page's terms: http://ai.bu.edu/M3SDA/); not redistributable here",
)
_preset(
    "core50",
    "CORe50 NI, 50 objects, 8 training sessions as domains, test sessions s3/s7/s10 (S-Prompts, L2P, Avalanche)",
    50,
    CORE50_TRAIN,
    "CORe50 (Lomonaco & Maltoni 2017, https://vlomonaco.github.io/core50/): unpack core50_128x128.zip so that "
    "DIR/core50_128x128/s<k>/o<j>/C_<k>_<j>_<n>.png (sessions s1 ... s11, objects o1 ... o50) exist, as in the "
    + S_PROMPTS
    + "; pass --data-root DIR (or DIR/core50_128x128). Train sessions s1, s2, s4, s5, s6, s8, s9, s11; test s3, "
    "s7, s10",
    "CC BY 4.0 (the CORe50 page)",
    shared_test=True,
)
_preset(
    "cddb",
    "CDDB-Hard continual deepfake detection, 5 tasks (gaugan, biggan, wild, whichfaceisreal, san), real vs fake",
    2,
    CDDB_TASKS,
    "CDDB (Li et al. 2023, https://github.com/Coral79/CDDB), as laid out in the " + S_PROMPTS + " (InfLoRA uses the "
    "same): DIR/<task>/train/[<object>/]{0_real,1_fake}/<image> and DIR/<task>/val/... for the tasks gaugan, "
    "biggan, wild, whichfaceisreal, san; val/ is the test split; pass --data-root DIR (the CDDB folder)",
    "see https://github.com/Coral79/CDDB: images collected from published GAN/deepfake data sets, each with its "
    "own terms; research use",
)
_preset(
    "office-home",
    "Office-Home, 4 domains (Art, Clipart, Product, Real World) x 65 classes, clbench's seeded 80/20 split",
    65,
    OFFICE_HOME_DOMAINS,
    "Office-Home (Venkateswara et al. 2017, https://www.hemanthdv.org/officeHomeDataset.html): unzip "
    "OfficeHomeDataset_10072016.zip and pass --data-root DIR/OfficeHomeDataset_10072016, the folder holding Art/, "
    "Clipart/, Product/ and 'Real World'/ with the same 65 class folders each. No official split: clbench "
    "permutes each class folder's sorted files with np.random.RandomState(1993) and sends round(20 %) to test",
    "non-commercial research and educational use only (the Office-Home page's fair-use notice)",
)
