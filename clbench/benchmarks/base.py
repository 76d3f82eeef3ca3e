"""Benchmark descriptions, image sources and class-incremental splits.

Nothing here imports torch or Avalanche: a :class:`BenchmarkSpec` is cheap to register and list. A spec's
``load`` target returns the raw train/test :class:`ImageSource` objects; :func:`build_benchmark` applies the
class order (the literature's ``np.random.seed(1993); np.random.permutation(n)``), remaps labels to arrival
order and cuts the task sizes. The Avalanche view of a benchmark lives in :mod:`clbench.benchmarks.streams`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json, cache_dir
from clbench.weights.sources import file_identity

LITERATURE_ORDER_SEED = 1993  # PILOT / PyCIL / TOSCA: np.random.seed(1993); np.random.permutation(n)


class ImageSource(ABC):
    """A labelled list of images addressed by index. ``labels`` are the source's own class ids."""

    labels: np.ndarray
    # Domain-incremental benchmarks: the domain index (into ``BenchmarkSpec.domains``) of every image, same length
    # as ``labels``; None for a benchmark with a single domain.
    domains: np.ndarray | None = None
    # Images that must not be split apart (one base emoji's variants and vendors): a group id per image, where the
    # benchmark's own train/test split is grouped; a validation split (clbench.run.validation) then holds out whole
    # groups, as the test split does. None: every image stands alone.
    groups: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @abstractmethod
    def image(self, i: int):  # -> PIL.Image.Image in RGB
        """Decode image ``i`` as an RGB PIL image; raise ClbenchError naming the file if it cannot."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A short digest identifying the content (used in feature-cache keys)."""

    def data_id(self) -> str:
        """A short digest of what the images are, written in the run's record (``data_fingerprint``): two records
        with other digests were made on other data and are never averaged, paired or gated together. The content
        fingerprint unless a source says otherwise (:meth:`FileSource.data_id
        <clbench.benchmarks.folder.FileSource.data_id>`: the same for every copy of one tree)."""
        return self.fingerprint()


class ArraySource(ImageSource):
    """Images held in a uint8 array (N, H, W, 3) or (N, H, W) (grey, expanded to RGB)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, name: str) -> None:
        self.labels = labels.astype(np.int64)
        self.name = name
        self._fp: str | None = None
        self._images: np.ndarray | None = None
        self._set_images(images)

    def _set_images(self, images: np.ndarray) -> None:
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(f"{self.name}: images must be uint8 (N,H,W[,3]), got {images.dtype} {images.shape}")
        if images.shape[0] != self.labels.shape[0]:
            raise ValueError(f"{self.name}: {images.shape[0]} images but {self.labels.shape[0]} labels")
        self._images = images

    @property
    def images(self) -> np.ndarray:
        if self._images is None:
            raise RuntimeError(f"{self.name}: no images")
        return self._images

    def image(self, i: int):
        from PIL import Image

        a = self.images[i]
        img = Image.fromarray(a)
        return img.convert("RGB") if a.ndim == 2 else img

    def fingerprint(self) -> str:
        if self._fp is None:
            h = hashlib.sha256()
            h.update(str(self.images.shape).encode())
            h.update(np.ascontiguousarray(self.images).tobytes())
            h.update(self.labels.tobytes())
            self._fp = h.hexdigest()[:16]
        return self._fp


class NpzArraySource(ArraySource):
    """An :class:`ArraySource` whose images stay in their ``.npz`` file until something reads a pixel: a run whose
    frozen features are cached never decompresses them (0.2 s of the embedded benchmark's warm run). The content
    fingerprint is recorded in the clbench cache under the file's identity (path, size, mtime:
    :func:`clbench.weights.sources.file_identity`), as the weights' digest is, so it too is computed once per
    version of the file; a file whose identity changed is read and hashed again."""

    def __init__(self, path: Path, images_key: str, labels: np.ndarray, name: str) -> None:
        self.labels = labels.astype(np.int64)
        self.name = name
        self.path, self.images_key = path, images_key
        self._images = None
        self._fp = _known_fingerprints(path).get(images_key)

    @property
    def images(self) -> np.ndarray:
        if self._images is None:
            with np.load(self.path, allow_pickle=False) as z:
                self._set_images(z[self.images_key])
        return self._images  # type: ignore[return-value]  (set just above)

    def fingerprint(self) -> str:
        if self._fp is None:
            self._fp = super().fingerprint()
            _remember_fingerprint(self.path, self.images_key, self._fp)
        return self._fp


def _fingerprint_memo(path: Path) -> Path:
    return cache_dir() / "data" / f"{path.name}.{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}.json"


def _known_fingerprints(path: Path) -> dict[str, str]:
    """The fingerprints recorded for ``path`` at its current identity (none for another version of the file)."""
    import json

    try:
        memo = json.loads(_fingerprint_memo(path).read_text())
        if memo.get("identity") == file_identity(path) and isinstance(memo.get("fingerprints"), dict):
            return {str(k): str(v) for k, v in memo["fingerprints"].items()}
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def _remember_fingerprint(path: Path, key: str, fp: str) -> None:
    """Record one content fingerprint of ``path`` at its current identity; an unwritable cache only means hashing
    again next time."""
    import contextlib

    with contextlib.suppress(OSError, ClbenchError):
        memo = _fingerprint_memo(path)
        memo.parent.mkdir(parents=True, exist_ok=True)
        known = {**_known_fingerprints(path), key: fp}
        atomic_write_json(memo, {"identity": file_identity(path), "fingerprints": known})


@dataclass(frozen=True)
class BenchmarkSpec:
    """Everything a benchmark needs, with the split and transforms the literature uses for it."""

    name: str
    summary: str
    load: str  # "module:function"; function(data_root: Path | None) -> (train, test, class_names)
    init_cls: int  # default classes in the first task (B0 IncK: init_cls = increment = K)
    increment: int  # default classes per later task
    backbone: str  # default backbone name in the backbone registry
    n_classes: int | None = None  # expected class count; None when discovered from the data
    img_size: int = 224  # network input size
    resize: int | None = None  # eval: Resize(resize) + CenterCrop(img_size); None: Resize(img_size) only
    normalize: bool = True  # apply the backbone's mean/std (the TOSCA/PILOT reference code does not)
    data_env: str | None = None  # environment variable naming the data root
    needs_data_root: bool = False
    source_info: str = ""  # where the data is published and its layout (printed by errors / data check)
    licence: str = ""
    # test/train pairs known to be byte-identical in the benchmark as published ("test[i] = train[j]"): `clbench
    # data check` and a run note them instead of refusing the data, so that results stay comparable with it.
    known_leaks: tuple[str, ...] = ()
    # Domain names, in arrival order, for a benchmark whose images carry ``ImageSource.domains`` (the
    # domain-incremental scenario: one task per domain over the same classes); empty for a single-domain benchmark.
    domains: tuple[str, ...] = ()
    # The test images belong to no training domain (CORe50's NI test sessions): each carries domain 0, so the whole
    # test set is evaluated after every task, and no other domain needs test images of its own.
    shared_test: bool = False
    # another benchmark whose images are these same images (emoji-vendors: emoji's): the frozen-feature cache files
    # them under its name, so the two share one extraction (the key also holds the images' content digest)
    features_as: str | None = None


def literature_class_order(n_classes: int, seed: int = LITERATURE_ORDER_SEED) -> list[int]:
    """``np.random.seed(seed); np.random.permutation(n)`` without touching numpy's global RNG."""
    return [int(c) for c in np.random.RandomState(seed).permutation(n_classes)]


def task_sizes(n_classes: int, init_cls: int, increment: int) -> list[int]:
    """PILOT's split: ``[init_cls] + [increment] * k`` plus a final smaller task for any remainder."""
    if init_cls < 1 or increment < 1:
        raise ClbenchError(f"--init-cls and --increment must be >= 1 (got {init_cls} and {increment})")
    if init_cls > n_classes:
        raise ClbenchError(
            f"--init-cls {init_cls} is larger than the benchmark's {n_classes} classes",
            f"use a value <= {n_classes}",
        )
    if init_cls < n_classes and increment > n_classes - init_cls:
        raise ClbenchError(
            f"--increment {increment} is larger than the {n_classes - init_cls} classes left after the first task",
            f"use --increment <= {n_classes - init_cls}",
        )
    sizes = [init_cls]
    left = n_classes - init_cls
    while left > 0:
        sizes.append(min(increment, left))
        left -= sizes[-1]
    return sizes


@dataclass
class Benchmark:
    """A benchmark with its class order applied: labels are positions in ``class_order`` (arrival order)."""

    spec: BenchmarkSpec
    class_names: list[str]  # source order
    class_order: list[int]  # source class id at each arrival position
    task_sizes: list[int]
    train: ImageSource
    test: ImageSource
    # "class": tasks bring new classes (``task_sizes``); "domain": task t brings every class in domain t of
    # ``spec.domains`` (``task_sizes`` is then ``[n_classes, 0, ...]``: every class arrives with the first task).
    scenario: str = "class"
    train_y: np.ndarray = field(init=False)
    test_y: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        remap = np.full(len(self.class_names), -1, dtype=np.int64)
        remap[np.asarray(self.class_order)] = np.arange(len(self.class_order))
        self.train_y = remap[self.train.labels]
        self.test_y = remap[self.test.labels]

    @property
    def n_classes(self) -> int:
        return len(self.class_order)

    @property
    def n_tasks(self) -> int:
        return len(self.task_sizes)

    def task_of_label(self) -> np.ndarray:
        """Array mapping an arrival-order label to its task index."""
        return np.repeat(np.arange(self.n_tasks), self.task_sizes)

    def classes_of_task(self, t: int) -> list[int]:
        start = sum(self.task_sizes[:t])
        return list(range(start, start + self.task_sizes[t]))

    def image_tasks(self, split: str) -> np.ndarray:
        """The task of every image of ``split`` ("train" or "test"): its domain in the domain scenario, the task
        its class arrives with in the class scenario."""
        source, y = (self.train, self.train_y) if split == "train" else (self.test, self.test_y)
        if self.scenario == "domain":
            assert source.domains is not None  # checked by build_benchmark
            return np.asarray(source.domains, dtype=np.int64)
        return self.task_of_label()[y]

    def seen_test(self, t: int) -> np.ndarray:
        """Positions of the test images evaluated after task ``t`` (every task so far), class by class (stable)."""
        seen = np.flatnonzero(self.image_tasks("test") <= t)
        return seen[np.argsort(self.test_y[seen], kind="stable")]


def resolve_data_root(spec: BenchmarkSpec, data_root: str | Path | None) -> Path | None:
    """The data root from ``--data-root`` or the spec's environment variable; checked to exist."""
    root = data_root if data_root is not None else (os.environ.get(spec.data_env) if spec.data_env else None)
    if root is not None and not str(root).strip():
        raise ClbenchError("--data-root is empty: expected a data folder", spec.source_info or None)
    if root is None:
        if spec.needs_data_root:
            env = f" or set {spec.data_env}" if spec.data_env else ""
            raise ClbenchError(
                f"benchmark {spec.name!r} needs its data: pass --data-root DIR{env}", spec.source_info or None
            )
        return None
    path = Path(root).expanduser()
    if not path.exists():
        raise ClbenchError(f"--data-root {path} does not exist", spec.source_info or None)
    return path


def torchvision_download(dataset: str, subdir: str, what: str, hint: str) -> Path:
    """Download torchvision's ``dataset`` (train and test) into ``<cache>/data/<subdir>`` when online; a
    ClbenchError with ``hint`` otherwise. Returns the download folder."""
    target = cache_dir() / "data" / subdir
    try:
        import torchvision

        cls = getattr(torchvision.datasets, dataset)
        cls(str(target), train=True, download=True)
        cls(str(target), train=False, download=True)
    except Exception as e:  # network errors come in many types
        raise ClbenchError(f"{what} not found and the download failed ({type(e).__name__}: {e})", hint) from None
    return target


def check_labels(name: str, source: ImageSource, n_classes: int) -> None:
    """Every label must be a valid class id of the benchmark."""
    if len(source) == 0:
        raise ClbenchError(f"{name} has no images")
    lo, hi = int(source.labels.min()), int(source.labels.max())
    if lo < 0 or hi >= n_classes:
        raise ClbenchError(f"{name} has labels in [{lo}, {hi}] but the benchmark has {n_classes} classes")


def build_benchmark(
    spec: BenchmarkSpec,
    data_root: str | Path | None = None,
    init_cls: int | None = None,
    increment: int | None = None,
    class_order_seed: int = LITERATURE_ORDER_SEED,
    scenario: str = "class",
) -> Benchmark:
    """Load a benchmark's images and apply class order and task split (``scenario`` "domain": one task per domain
    of ``spec.domains``, every class in each; see :func:`check_domains`)."""
    module, _, attr = spec.load.partition(":")
    loader = getattr(importlib.import_module(module), attr)
    train, test, class_names = loader(resolve_data_root(spec, data_root))
    n = len(class_names)
    if spec.n_classes is not None and n != spec.n_classes:
        raise ClbenchError(
            f"benchmark {spec.name!r} should have {spec.n_classes} classes but the data has {n}",
            spec.source_info or None,
        )
    check_labels(f"{spec.name} train split", train, n)
    check_labels(f"{spec.name} test split", test, n)
    missing = sorted(set(range(n)) - set(np.unique(train.labels).tolist()))
    if missing:
        raise ClbenchError(
            f"{spec.name}: {len(missing)} classes have no training images (e.g. {class_names[missing[0]]!r})"
        )
    order = literature_class_order(n, class_order_seed)
    if scenario == "domain":
        check_domains(spec, train, test)
        return Benchmark(spec, class_names, order, [n] + [0] * (len(spec.domains) - 1), train, test, "domain")
    sizes = task_sizes(
        n, spec.init_cls if init_cls is None else init_cls, spec.increment if increment is None else increment
    )
    return Benchmark(spec, class_names, order, sizes, train, test)


def check_domains(spec: BenchmarkSpec, train: ImageSource, test: ImageSource) -> None:
    """A domain-incremental run needs the spec's domain names and every image's domain, each domain with training
    and test images."""
    if not spec.domains:
        raise ClbenchError(
            f"benchmark {spec.name!r} has a single domain: the domain scenario needs a benchmark with domains",
            "use --scenario class, or a benchmark whose `clbench list` entry names domains",
        )
    for name, source in (("train", train), ("test", test)):
        d = source.domains
        if d is None or len(d) != len(source):
            raise ClbenchError(f"benchmark {spec.name!r}: its {name} images carry no domain index")
        lo, hi = int(np.min(d)), int(np.max(d))
        if lo < 0 or hi >= len(spec.domains):
            raise ClbenchError(
                f"benchmark {spec.name!r}: {name} domain indices in [{lo}, {hi}], but it names "
                f"{len(spec.domains)} domains"
            )
        empty = sorted(set(range(len(spec.domains))) - set(np.unique(d).tolist()))
        if name == "test" and spec.shared_test:
            empty = [k for k in empty if k == 0]  # one held-out test set, filed under the first domain
        if empty:
            raise ClbenchError(f"benchmark {spec.name!r}: domain {spec.domains[empty[0]]!r} has no {name} images")
