"""Fashion-MNIST (Xiao et al. 2017), the official 60k/10k split, read from IDX files.

Looked for in ``--data-root``, ``$CLBENCH_FASHION_MNIST``, Debian's ``dataset-fashion-mnist`` path, then the clbench
cache; nothing is downloaded: without any of those the run stops at once saying where to put it.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource
from clbench.errors import ClbenchError
from clbench.files.atomic import cache_dir
from clbench.files.safety import read_bytes

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
MAX_BYTES = 64 * 2**20  # the training images are 47 MB uncompressed
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a uint8 array of its declared shape."""
    import io
    import math

    raw = read_bytes(path, MAX_BYTES, "IDX", name=f"IDX file {path}")  # a regular file, bounded
    try:
        data = raw
        if path.suffix == ".gz":
            with gzip.open(io.BytesIO(raw), "rb") as f:
                data = f.read(MAX_BYTES + 1)  # a small .gz may expand to any size: read no further than the bound
    except Exception as e:  # gzip.BadGzipFile, EOFError, zlib.error: a torn or crafted file fails in many ways
        raise ClbenchError(f"cannot read IDX file {path}: {type(e).__name__}: {e}") from None
    if len(data) > MAX_BYTES:
        raise ClbenchError(f"IDX file {path} expands to more than {MAX_BYTES // 2**20} MB, more than Fashion-MNIST")
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08 or not 1 <= data[3] <= 3:
        raise ClbenchError(f"{path} is not an unsigned-byte IDX file of 1 to 3 dimensions")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise ClbenchError(f"{path} is truncated: its header is cut short")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != math.prod(shape):
        raise ClbenchError(f"{path} is truncated: header says {shape}, found {body.size} bytes")
    return body.reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem, folder / "FashionMNIST" / "raw" / stem):
        if candidate.is_file():
            return candidate
    return None


def _folder_with_files(folder: Path) -> bool:
    return all(_find(folder, s) for pair in FILES.values() for s in pair)


def _cached() -> Path:
    """Where earlier versions of clbench had torchvision download it (read if present; nothing is downloaded)."""
    return cache_dir() / "data" / "fashion-mnist" / "FashionMNIST" / "raw"


def _missing() -> ClbenchError:
    return ClbenchError(
        "Fashion-MNIST is not on this machine (clbench reads data sets, it never downloads them)",
        "apt-get install dataset-fashion-mnist, or pass --data-root DIR holding "
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (or set $CLBENCH_FASHION_MNIST)",
    )


def load(data_root: Path | None) -> tuple[ArraySource, ArraySource, list[str]]:
    if data_root is not None:
        if not _folder_with_files(data_root):
            raise ClbenchError(
                f"{data_root} does not hold the Fashion-MNIST IDX files",
                "expected {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] directly in that folder",
            )
        folder = data_root
    elif _folder_with_files(DEBIAN_DIR):
        folder = DEBIAN_DIR
    elif _folder_with_files(_cached()):
        folder = _cached()
    else:
        raise _missing()
    out = []
    for split, (img_stem, lab_stem) in FILES.items():
        x = read_idx(_find(folder, img_stem))  # (N, 28, 28)
        y = read_idx(_find(folder, lab_stem))  # (N,)
        out.append(ArraySource(x, y, f"fashion-mnist/{split}"))
    return out[0], out[1], list(CLASS_NAMES)
