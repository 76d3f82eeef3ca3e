"""What a report's t-SNE figure needs, kept beside each record in ``features.npz``: the embeddings of a fixed
subsample of test images, as the method's classifier sees them.

A t-SNE of the frozen backbone's features is the same picture for every method that classifies them (SimpleCIL,
SLDA) and tells nothing about the others. So each finished run keeps, for the same :data:`POINTS` test images
(chosen by :data:`SEED` from the test split's order, which the class order does not change):

- ``frozen``: the frozen backbone's features (the reference panel, drawn once per benchmark and backbone);
- ``adapted``, where the method scores something else (:meth:`clbench.methods.contract.Strategy.adapted_features`):
  TOSCA's calibrated [CLS] under the routed module, RanPAC's and ACIL's random projections, APER's and EASE's
  concatenated adapted features, FeCAM's Tukey-transformed features, RanDumb's random Fourier features, SLCA's
  tuned ViT's features; ``embedding`` names it.

Each array is L2-normalised per image (the cosine geometry the heads use) and reduced to at most :data:`DIMS`
dimensions by PCA before it is stored in float16: scikit-learn's t-SNE documentation recommends reducing dense data
to about 50 dimensions first, and it keeps the file small whatever the method's width (RanPAC projects to 10,000
dimensions, RanDumb to 25,000): about 50 KB per array, so the records of a study carry their figures.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

POINTS = 500  # test images per record: a readable t-SNE, and one more test pass of 500 images per method (EASE and
# MOS pass each image through every task's adapters)
SEED = 0  # which images: the same for every record of one test split
DIMS = 50  # PCA components kept (scikit-learn's advice for t-SNE input)
FORMAT = "pca50-fp16"  # how the arrays were reduced; a reader that meets another value refuses the file


def subsample(n: int, points: int = POINTS, seed: int = SEED) -> np.ndarray:
    """Sorted indices of at most ``points`` of ``n`` items, the same for the same ``n``."""
    if n <= points:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, points, replace=False))


def reduce(x: Any, dims: int = DIMS) -> np.ndarray:
    """(N, d) -> (N, min(dims, N, d)) float16: rows L2-normalised, centred, projected on their principal axes
    (float64 SVD, signs fixed so that each axis's largest coordinate is positive: the same input gives the same
    bytes). The distances between rows are those of the normalised features up to the discarded variance."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"embeddings must be (images, width), got shape {a.shape}")
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    a = a - a.mean(axis=0, keepdims=True)
    k = min(dims, *a.shape)
    if k == 0:
        return np.zeros((len(a), 0), dtype=np.float16)
    u, s, _ = np.linalg.svd(a, full_matrices=False)
    coords = u[:, :k] * s[:k]
    flip = np.sign(coords[np.abs(coords).argmax(axis=0), np.arange(k)])
    return (coords * np.where(flip == 0, 1.0, flip)).astype(np.float16)


def encode(
    index: np.ndarray, labels: np.ndarray, tasks: np.ndarray, frozen: Any, adapted: Any | None, embedding: str
) -> bytes:
    """The bytes of ``features.npz``: the subsample's test indices, labels and tasks, and its reduced embeddings."""
    arrays: dict[str, np.ndarray] = {
        "index": np.asarray(index, dtype=np.int64),
        "labels": np.asarray(labels, dtype=np.int64),
        "tasks": np.asarray(tasks, dtype=np.int64),
        "frozen": reduce(frozen),
        "format": np.array(FORMAT),
        "embedding": np.array(embedding if adapted is not None else "frozen"),
    }
    if adapted is not None:
        arrays["adapted"] = reduce(adapted)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()
