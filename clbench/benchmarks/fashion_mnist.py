"""Fashion-MNIST (Xiao et al. 2017), the official 60k/10k split, read from IDX files.

Looked for in ``--data-root``, ``$CLBENCH_FASHION_MNIST``, then Debian's ``dataset-fashion-mnist`` path; with
network access and none of those, torchvision downloads it into the clbench cache.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource, torchvision_download
from clbench.errors import ClbenchError

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a uint8 array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ClbenchError(f"cannot read IDX file {path}: {e}") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ClbenchError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ClbenchError(f"{path} is truncated: header says {shape}, found {body.size} bytes")
    return body.reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem, folder / "FashionMNIST" / "raw" / stem):
        if candidate.is_file():
            return candidate
    return None


def _folder_with_files(folder: Path) -> bool:
    return all(_find(folder, s) for pair in FILES.values() for s in pair)


def _download() -> Path:
    hint = (
        "apt-get install dataset-fashion-mnist, or pass --data-root DIR holding "
        "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"
    )
    return torchvision_download("FashionMNIST", "fashion-mnist", "Fashion-MNIST", hint)


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
    else:
        folder = _download()
    out = []
    for split, (img_stem, lab_stem) in FILES.items():
        x = read_idx(_find(folder, img_stem))  # (N, 28, 28)
        y = read_idx(_find(folder, lab_stem))  # (N,)
        out.append(ArraySource(x, y, f"fashion-mnist/{split}"))
    return out[0], out[1], list(CLASS_NAMES)
