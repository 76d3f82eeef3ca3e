"""CIFAR-100 (Krizhevsky 2009): the official 50k/10k split, 100 fine classes, 32x32 RGB.

Read from torchvision's on-disk format, ``cifar-100-python/{train,test,meta}`` (pickles: ``data`` uint8 (N, 3072)
in channel-major order, ``fine_labels``; ``fine_label_names`` in ``meta``), found in ``--data-root`` (or
``$CLBENCH_CIFAR100``), either as that folder or its parent. Without a data root it is read from the clbench cache
(``<cache>/data/cifar100``, where earlier versions downloaded it). Nothing is downloaded: where the data is absent
the run stops at once saying where to put it (PILOT's ``iCIFAR224`` downloads it instead). The images are
upsampled to the network's input size by the benchmark's transforms, as in the reference code.

The pickles are read with an unpickler that only builds numpy arrays, lists, dicts and strings, so a tampered
data folder cannot run code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource
from clbench.errors import ClbenchError
from clbench.files.atomic import cache_dir
from clbench.files.safety import read_bytes

FOLDER = "cifar-100-python"
FILES = ("train", "test", "meta")
N_CLASSES = 100
# What a numpy array needs to unpickle (numpy 1 and 2 module names, protocols 2 to 5); nothing else is allowed.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


MAX_BYTES = 512 * 2**20  # the official train file is 155 MB
_REFETCH = "delete the cifar-100-python folder and download it again (torchvision's CIFAR100(download=True))"


def _read_pickle(path: Path) -> dict:
    import io

    data = read_bytes(path, MAX_BYTES, "CIFAR-100", name=f"CIFAR-100 file {path}")  # no FIFO, no /dev/zero
    try:
        obj = _ArrayUnpickler(io.BytesIO(data), encoding="latin1").load()  # the official files are Python 2 pickles
    except Exception as e:  # a crafted file fails in many ways (memo, shapes, sizes); find_class builds arrays only
        raise ClbenchError(f"cannot read CIFAR-100 file {path}: {type(e).__name__}: {str(e)[:160]}", _REFETCH) from None
    if not isinstance(obj, dict):
        raise ClbenchError(f"{path} is not a CIFAR-100 pickle (expected a dict, got {type(obj).__name__})")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def locate(data_root: Path | None) -> Path | None:
    """The ``cifar-100-python`` folder in ``data_root`` (that folder or its parent) or the cache; None if absent."""
    if data_root is not None:
        candidates = [data_root, data_root / FOLDER]
    else:
        candidates = [cache_dir() / "data" / "cifar100" / FOLDER]
    for c in candidates:
        if all((c / f).is_file() for f in FILES):
            return c
    return None


def _missing() -> ClbenchError:
    """CIFAR-100 is not on this machine: clbench never downloads a data set (it runs offline), so it says at once
    where to put it and how to fetch it."""
    return ClbenchError(
        "CIFAR-100 is not on this machine (clbench reads data sets, it never downloads them)",
        "pass --data-root DIR holding cifar-100-python/{train,test,meta} (torchvision's format: "
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz unpacked, or "
        "python -c \"import torchvision; torchvision.datasets.CIFAR100('DIR', download=True)\" on a machine with "
        "network), or set $CLBENCH_CIFAR100",
    )


def _split(folder: Path, split: str) -> ArraySource:
    d = _read_pickle(folder / split)
    if "data" not in d or "fine_labels" not in d:
        raise ClbenchError(f"{folder / split} lacks 'data' or 'fine_labels': not a CIFAR-100 pickle")
    x, labels = d["data"], d["fine_labels"]
    # plain values only, checked before numpy touches them: a list nesting shared references (a few bytes of pickle
    # naming 2^60 elements) or labels of another type would hang or fail inside np.asarray
    if not isinstance(x, np.ndarray):
        raise ClbenchError(f"{folder / split}: 'data' is a {type(x).__name__}, expected a uint8 array", _REFETCH)
    if isinstance(labels, np.ndarray):
        ok = labels.ndim == 1 and labels.dtype.kind in "iu"
    else:
        ok = isinstance(labels, list) and all(type(v) is int for v in labels)
    if not ok:
        raise ClbenchError(f"{folder / split}: 'fine_labels' is not a flat list of integers", _REFETCH)
    y = np.asarray(labels, dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or x.shape[0] != y.shape[0]:
        raise ClbenchError(
            f"{folder / split}: expected uint8 data (N, 3072) and N labels, got {x.dtype} {x.shape} and {y.shape[0]}"
        )
    images = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 3072) channel-major -> (N, 32, 32, 3)
    return ArraySource(np.ascontiguousarray(images), y, f"cifar100/{split}")


def load(data_root: Path | None) -> tuple[ArraySource, ArraySource, list[str]]:
    folder = locate(data_root)
    if folder is None:
        if data_root is not None:
            raise ClbenchError(
                f"{data_root} holds no CIFAR-100 in torchvision's format",
                f"expected {data_root}/{FOLDER}/{{train,test,meta}} (or {data_root} to be that folder)",
            )
        raise _missing()
    names = _read_pickle(folder / "meta").get("fine_label_names", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):  # checked before str() walks it
        raise ClbenchError(f"{folder / 'meta'}: fine_label_names is not a list of names", _REFETCH)
    if len(names) != N_CLASSES:
        raise ClbenchError(f"{folder / 'meta'}: expected {N_CLASSES} fine_label_names, found {len(names)}")
    train, test = _split(folder, "train"), _split(folder, "test")
    return train, test, names
