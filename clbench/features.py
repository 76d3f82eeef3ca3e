"""Frozen-backbone features, computed once and cached on disk.

A cache entry is keyed by (backbone name, backbone state digest, input size, benchmark, split, content
fingerprint of the images, transform identity, precision, feature-code version). It is a safetensors
file carrying its key and the SHA-256 of the feature bytes in its metadata; both are verified on every read,
and an entry that fails (truncated, corrupted, wrong key) is reported, deleted and recomputed, never used.
A missing entry is computed under a file lock (``<entry>.lock``): runs sharing the cache, on one machine or on
shared storage, compute each entry once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from clbench.benchmarks.base import ImageSource
from clbench.io import atomic_write_bytes, cache_dir
from clbench.precision import autocast

log = logging.getLogger(__name__)

FEATURE_VERSION = 1  # bump when extraction changes in a way that changes the numbers
Progress = Callable[[int], None]  # called with the number of images just processed


class TransformedImages(Dataset):
    """``source`` images through ``transform``, yielding (image tensor, position in ``indices``)."""

    def __init__(self, source: ImageSource, transform, indices=None) -> None:
        self.source, self.transform = source, transform
        self.indices = list(range(len(source))) if indices is None else [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        return self.transform(self.source.image(self.indices[k])), k


@torch.inference_mode()
def extract(
    backbone: torch.nn.Module,
    source: ImageSource,
    transform,
    device: torch.device,
    precision: str,
    batch_size: int = 64,
    indices=None,
    progress: Progress | None = None,
    num_workers: int = 0,
) -> torch.Tensor:
    """Features (N, d) float32 on the CPU for ``source`` (or its ``indices``), in order."""
    loader = DataLoader(TransformedImages(source, transform, indices), batch_size=batch_size, num_workers=num_workers)
    out: list[torch.Tensor] = []
    for x, _ in loader:
        with autocast(precision, device.type):
            f = backbone(x.to(device, non_blocking=True))
        out.append(f.float().cpu())
        if progress:
            progress(len(x))
    feats = torch.cat(out) if out else torch.empty(0, 0)
    if not torch.isfinite(feats).all():
        from clbench.errors import ClbenchError

        bad = int((~torch.isfinite(feats)).any(dim=1).sum())
        raise ClbenchError(
            f"the backbone produced NaN/inf features for {bad} of {len(feats)} images of {getattr(source, 'name', 'the data')}",
            "check the weights file, or run with --precision fp32 to rule out reduced-precision overflow",
        )
    return feats


def cache_key(**fields) -> str:
    fields["feature_version"] = FEATURE_VERSION
    return json.dumps(fields, sort_keys=True)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


class FeatureCache:
    """On-disk cache of feature tensors under ``root`` (default: ``<cache dir>/features``)."""

    def __init__(self, root: Path | None = None, enabled: bool = True) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "features"
        self.enabled = enabled
        self.events: list[str] = []  # "hit", "miss", "corrupt" per lookup, for the run record

    def path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".safetensors")

    def load(self, key: str) -> torch.Tensor | None:
        path = self.path(key)
        if not (self.enabled and path.exists()):
            return None
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                feats = f.get_tensor("features")
            if meta.get("key") != key or meta.get("sha256") != _digest(feats):
                raise ValueError("key or digest mismatch")
            return feats
        except Exception as e:  # truncated or corrupted files raise many kinds of errors
            log.warning("feature cache entry %s is corrupt (%s); recomputing it", path.name, e)
            self.events.append("corrupt")
            path.unlink(missing_ok=True)
            return None

    def save(self, key: str, feats: torch.Tensor) -> None:
        if not self.enabled:
            return
        from safetensors.torch import save

        feats = feats.contiguous()
        data = save({"features": feats}, metadata={"key": key, "sha256": _digest(feats)})
        atomic_write_bytes(self.path(key), data)

    def get_or_compute(self, key: str, compute: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, bool]:
        """(features, was_cached). A miss takes an exclusive lock on the entry first, so concurrent runs of a sweep
        that need the same features compute them once: the others wait and then read the entry."""
        feats = self.load(key)
        if feats is not None:
            self.events.append("hit")
            return feats, True
        with self._entry_lock(key):
            feats = self.load(key)  # written by another process while this one waited
            if feats is not None:
                self.events.append("hit")
                return feats, True
            self.events.append("miss")
            feats = compute()
            self.save(key, feats)
        return feats, False

    @contextlib.contextmanager
    def _entry_lock(self, key: str):
        if not self.enabled:
            yield
            return
        lock_path = self.path(key).with_suffix(".lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_path, "w")
        except OSError:  # a read-only or odd cache folder: no sharing, but the run goes on
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            handle.close()  # closing releases the lock
