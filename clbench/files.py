"""Files: the cache folder and writes that never leave a torn file behind.

Every record, checkpoint and cache entry is written to a temporary file in the same folder, flushed,
fsynced and renamed over the target, so a reader sees either the old file or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from clbench.owned import atomic_write_bytes as atomic_write_bytes  # re-exported: where the writers import it


def cache_dir() -> Path:
    """``$CLBENCH_CACHE`` or ``~/.cache/clbench``: converted weights, wheels and feature caches."""
    root = os.environ.get("CLBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "clbench")
    return Path(root)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, allow_nan=True) + "\n").encode())


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
