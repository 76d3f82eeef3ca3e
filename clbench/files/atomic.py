"""Files: the cache folder and writes that never leave a torn file behind.

Every record, checkpoint and cache entry is written to a temporary file in the same folder, flushed,
fsynced and renamed over the target, so a reader sees either the old file or the new one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from clbench.files.safety import atomic_write_bytes as atomic_write_bytes  # re-exported: where the writers import it
from clbench.files.safety import owned_folder


def cache_dir() -> Path:
    """``$CLBENCH_CACHE`` or ``~/.cache/clbench``: converted weights, wheels and feature caches."""
    root = os.environ.get("CLBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "clbench")
    return Path(root)


def cache_subdir(name: str, create: bool = True, root: Path | None = None) -> Path:
    """``<cache>/name`` (``features``, ``weights``, ``wheels``, ``machine``): a real folder inside the cache folder
    (``root``, default :func:`cache_dir`), made if missing (``create``). A link there (to a folder of someone else's)
    is refused with one ClbenchError line, never written through: clbench writes only into real sub-folders of the
    folders it owns (:func:`clbench.files.safety.owned_folder`)."""
    return owned_folder(cache_dir() if root is None else Path(root), name, "cache folder", create=create)


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    atomic_write_bytes(path, text.encode())
    return path


def atomic_write_json(path: Path, obj: Any, *, standard: bool = False) -> None:
    """``obj`` as indented JSON, written atomically. ``standard``: every NaN or infinity written as null (standard
    JSON has neither; Python's ``json`` would write the non-standard ``NaN`` that jq, JavaScript and most other
    readers refuse), for the files other tools read, such as the run record."""
    if standard:
        obj = without_nan(obj)
    text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=not standard)
    atomic_write_bytes(path, (text + "\n").encode())


def without_nan(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (nested dicts, lists and tuples followed)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: without_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [without_nan(v) for v in obj]
    return obj


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
