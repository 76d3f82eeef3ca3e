"""What a record's ``features.npz`` must hold before a report draws it (:mod:`clbench.features.embeddings` writes it).

The file sits in a run folder anyone may have handed over, so its embeddings are checked before scikit-learn's PCA
and t-SNE see them: a NaN or an infinity, a single column, or the same values in every row made those abort the
whole report with a traceback from inside the library (one case ended the process). A file that fails is refused
with a ValueError naming it and the problem; the report skips that figure with a one-line note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

EMBEDDINGS = ("frozen", "adapted")  # the arrays a t-SNE panel is drawn from
MIN_COLUMNS = 2  # a t-SNE of one dimension is a line, and its PCA initialisation needs two components
MIN_ROWS = 3  # scikit-learn's t-SNE needs more points than its perplexity, which is at least 2 here


def checked_embeddings(path: Path | str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (the arrays read from ``path``, a ``features.npz``) if every embedding in it can be drawn: a 2-D array
    of finite numbers with at least :data:`MIN_COLUMNS` columns and :data:`MIN_ROWS` rows that are not all the same;
    ``labels`` and ``tasks`` whole numbers, at least 0. Else ValueError ``PATH: what is wrong``."""
    for key in ("labels", "tasks"):
        arr = np.asarray(data.get(key, np.zeros(0, np.int64)))
        whole = arr.dtype.kind in "iu"
        if arr.dtype.kind == "f":  # an older file's labels may be floats: whole numbers still
            whole = bool(np.all(np.isfinite(arr) & (arr == np.round(arr))))
        if not whole:
            raise ValueError(f"{path}: {key} holds values that are not whole numbers")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{path}: {key} holds a negative value ({arr.min():g})")
    for key in EMBEDDINGS:
        if key not in data:
            continue
        arr = np.asarray(data[key])
        if arr.ndim != 2:
            raise ValueError(f"{path}: {key} has shape {arr.shape}, expected (images, dimensions)")
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"{path}: {key} is {arr.dtype}, expected numbers")
        rows, columns = arr.shape
        if columns < MIN_COLUMNS:
            raise ValueError(f"{path}: {key} has {columns} column(s); a t-SNE needs at least {MIN_COLUMNS}")
        if rows < MIN_ROWS:
            raise ValueError(f"{path}: {key} has {rows} row(s); a t-SNE needs at least {MIN_ROWS} images")
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        if bad:
            raise ValueError(f"{path}: {key} holds {bad:,} NaN or infinite value(s)")
        if np.all(arr == arr[0]):
            raise ValueError(f"{path}: {key} has the same values in every row (no variance): nothing to draw")
    return data
