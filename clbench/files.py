"""Files: the cache folder and writes that never leave a torn file behind.

Every record, checkpoint and cache entry is written to a temporary file in the same folder, flushed,
fsynced and renamed over the target, so a reader sees either the old file or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.owned import TMP_PREFIX, TMP_SUFFIX


def cache_dir() -> Path:
    """``$CLBENCH_CACHE`` or ``~/.cache/clbench``: converted weights, wheels and feature caches."""
    root = os.environ.get("CLBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "clbench")
    return Path(root)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: O_EXCL, a fresh name; the prefix marks it as clbench's, the only kind clbench.owned sweeps up
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ClbenchError(
            f"could not write {path}: {e.strerror or e}", "free disk space or choose another folder"
        ) from None


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
