"""Frozen-backbone features, computed once and cached on disk.

A cache entry is keyed by (backbone name, backbone state digest, input size, benchmark, split, content
fingerprint of the images, transform identity, precision, feature-code version). It is a safetensors
file carrying its key and the SHA-256 of the feature bytes in its metadata; both are verified on every read,
and an entry that fails (truncated, corrupted, wrong key) is reported, deleted and recomputed, never used.
A missing entry is computed under a file lock (``<entry>.lock``): runs sharing the cache, on one machine or on
shared storage, compute each entry once.

Trust: the digest an entry carries proves only that the file is whole, not who wrote it: anyone who can write to
the cache folder can write an entry with a matching digest. So an entry is spot-checked against the backbone:
:data:`SPOT_CHECK` images, drawn by the operating system's random source (no one can know which beforehand), are run
through the backbone and must give the entry's features (:func:`spot_mismatch`); an entry that does not is
reported, deleted and recomputed. This catches an entry rewritten with other features; it cannot catch one that
changed only a few rows.

Once per entry, not once per run: a run that reads every feature from the cache and whose strategy never enters the
backbone must not build the ViT only to check 8 images (:class:`clbench.features.backbones.LazyBackbone`). So an entry
that passed is remembered in :data:`CHECKED_FILE`, keyed by the entry's name and recording the SHA-256 of its features
and its key (which holds the backbone's digest); an entry whose bytes are the ones that passed is not checked again. A
rewritten entry has another digest, so it is checked (and caught) on its next use, as before. The memory is trusted only
when it cannot have been written by anyone but this user (:func:`read_private_json`: owned by this user, writable by no
one else, not a link), so whoever shares the cache folder cannot mark their entry as checked. A cache folder shared with
others trusts everyone who can write to it otherwise: share it only with people whose results you would trust, or give
each user their own ``$CLBENCH_CACHE``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from clbench.benchmarks.base import ImageSource
from clbench.core.precision import autocast
from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_bytes, cache_dir, cache_subdir
from clbench.files.safety import open_lock, special_file_problem

log = logging.getLogger(__name__)

FEATURE_VERSION = 1  # bump when extraction changes in a way that changes the numbers
SPOT_CHECK = 8  # images of a cached entry recomputed the first time it is used (module docstring)
CHECKED_FILE = "spot-checked-{uid}.json"  # in the features folder: entry name -> {sha256, key digest} that passed
# Largest relative distance ||cached - recomputed|| / ||recomputed|| of a spot-checked row: the same images in a
# batch of another size move fp32 features by ~1e-6 and bf16/fp16 ones by ~1e-2; features of other weights or
# images differ by order 1.
SPOT_TOLERANCE = {"fp32": 1e-3, "bf16": 0.1, "fp16": 0.1}
Spot = Callable[[list[int]], torch.Tensor]  # the features of these rows, recomputed with the backbone
Progress = Callable[[int], None]  # called with the number of images just processed


class TransformedImages(Dataset):
    """``source`` images through ``transform``, yielding (image tensor, position in ``indices``)."""

    def __init__(self, source: ImageSource, transform, indices=None) -> None:
        self.source, self.transform = source, transform
        self.indices = list(range(len(source))) if indices is None else [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, item: int | tuple[int, int]):
        """Position ``k``, or ``(k, seed)`` from :class:`SeededOrder`: the transform's random draws (crop, flip) then
        come from a generator seeded for this image and epoch, never from the global RNG's current state."""
        if isinstance(item, tuple):
            k, seed = item
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return self.transform(self.source.image(self.indices[k])), k
        return self.transform(self.source.image(self.indices[item])), item


class SeededOrder(Sampler[tuple[int, int]]):
    """Positions ``0..n-1`` (shuffled with ``generator`` when ``shuffle``), each paired with the seed of its
    augmentation: one draw from ``generator`` per pass, then ``(pass seed + k * odd constant) mod 2**63``.

    Augmented training images are then a function of the run seed, the pass and the image alone: not of what else
    drew from torch's global RNG before (a backbone built mid-run, a feature cache that was or was not warm, an
    evaluation loader), which made a run's numbers depend on the cache's state. Without a ``generator`` the pass
    seed is drawn from the global RNG (nothing else is)."""

    _STRIDE = 0x9E3779B97F4A7C15  # odd: distinct positions get distinct seeds within a pass

    def __init__(self, n: int, shuffle: bool, generator: torch.Generator | None) -> None:
        self.n, self.shuffle, self.generator = n, shuffle, generator

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        base = int(torch.randint(2**62, (1,), generator=self.generator).item())
        order = torch.randperm(self.n, generator=self.generator).tolist() if self.shuffle else range(self.n)
        for k in order:
            yield k, (base + k * self._STRIDE) % 2**63


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
    """Features (N, d) float32 on the CPU for ``source`` (or its ``indices``), in order. Draws nothing from the global
    RNG (the loader has its own generator): a run whose features came from the cache and one that computed them
    leave the global RNG in the same state, so their training augmentations, and results, are the same."""
    loader = DataLoader(
        TransformedImages(source, transform, indices),
        batch_size=batch_size,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(0),
    )
    out: list[torch.Tensor] = []
    for x, _ in loader:
        with autocast(precision, device.type):
            f = backbone(x.to(device, non_blocking=True))
        out.append(f.float().cpu())
        if progress:
            progress(len(x))
    feats = torch.cat(out) if out else torch.empty(0, 0)
    if not torch.isfinite(feats).all():
        bad = int((~torch.isfinite(feats)).any(dim=1).sum())
        raise ClbenchError(
            f"the backbone produced NaN/inf features for {bad} of {len(feats)} images of "
            f"{getattr(source, 'name', 'the data')}",
            "check the weights file, or run with --precision fp32 to rule out reduced-precision overflow",
        )
    return feats


def read_private_json(path: Path) -> dict:
    """The JSON object in ``path`` if only this user can have written it (a regular file, not a link, owned by this
    user, writable by neither group nor others), else {} (absent, unreadable, foreign or odd: nothing is trusted)."""
    try:
        st = os.lstat(path)
    except OSError:
        return {}
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return {}
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(16 << 20))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_private_json(path: Path, obj: dict) -> None:
    """Write ``obj`` to ``path`` atomically, readable and writable by this user only; a folder that cannot take it
    only means the memory is not kept (it is a cache). A folder that is a link is never written through: the caller
    checks it is owned (:func:`clbench.files.atomic.cache_subdir`); here a link is only skipped."""
    if path.parent.is_symlink():
        return
    with contextlib.suppress(OSError, ClbenchError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(obj, sort_keys=True) + "\n").encode())  # mkstemp: mode 0600


def cache_key(**fields) -> str:
    fields["feature_version"] = FEATURE_VERSION
    return json.dumps(fields, sort_keys=True)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


class FeatureCache:
    """On-disk cache of feature tensors under ``root`` (default: ``<cache dir>/features``, which must be a real folder
    inside the cache folder: a link there is refused, never written through, :func:`clbench.files.atomic.cache_subdir`).
    """

    def __init__(
        self, root: Path | None = None, enabled: bool = True, warn: Callable[[str], None] | None = None
    ) -> None:
        if root is not None:
            self.root = Path(root)
        elif enabled:
            self.root = cache_subdir("features", create=False)  # ClbenchError for a link or a file there
        else:
            self.root = cache_dir() / "features"
        self.enabled = enabled
        self._warn_to = warn  # where the one warning of an unwritable cache goes (default: the logging module)
        self.events: list[str] = []  # "hit", "miss", "corrupt" per lookup, "unsaved" per failed write, for the record
        self.writable = enabled and self._can_write()

    def _can_write(self) -> bool:
        """Whether entries can be written under ``root``; if not, the run goes on without saving any (one warning)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            ok = os.access(self.root, os.W_OK | os.X_OK)
            reason = "not writable"
        except OSError as e:
            ok, reason = False, e.strerror or str(e)
        if not ok:
            self._warn(f"{reason}")
        return ok

    def _warn(self, reason: str) -> None:
        message = f"feature cache {self.root}: {reason}; features are computed without caching this run"
        (self._warn_to or log.warning)(message)

    def path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".safetensors")

    def load(self, key: str, spot: Spot | None = None, precision: str = "fp32") -> torch.Tensor | None:
        """The entry of ``key``, or None (absent, unreadable, or failing its digest or the spot check ``spot``)."""
        path = self.path(key)
        if not (self.enabled and path.exists()):
            return None
        odd = special_file_problem(path)
        if odd is not None:  # a FIFO would block the read, a device never end it: not read, replaced on save
            log.warning("feature cache entry %s is %s, not a cache file; recomputing it", path.name, odd)
            self.events.append("corrupt")
            return None
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                feats = f.get_tensor("features")
            if meta.get("key") != key or meta.get("sha256") != _digest(feats):
                raise ValueError("key or digest mismatch")
            if feats.dim() != 2:
                raise ValueError(f"features of shape {tuple(feats.shape)}")
            seal = {"sha256": meta["sha256"], "key": _sha(key)}
            if spot is not None and self._checked().get(path.name) != seal:
                problem = spot_mismatch(feats, spot, SPOT_TOLERANCE.get(precision, 0.1))
                if problem is not None:
                    raise ValueError(problem)
                self._remember_checked(path.name, seal)
            return feats
        except Exception as e:  # truncated or corrupted files raise many kinds of errors
            log.warning("feature cache entry %s is corrupt (%s); recomputing it", path.name, e)
            self.events.append("corrupt")
            path.unlink(missing_ok=True)
            return None

    def _checked_path(self) -> Path:
        return self.root / CHECKED_FILE.format(uid=os.getuid())

    def _checked(self) -> dict:
        """The entries this user's runs spot-checked and found right (module docstring)."""
        return read_private_json(self._checked_path()) if self.enabled else {}

    def _remember_checked(self, name: str, seal: dict[str, str]) -> None:
        if self.enabled and self.writable:
            known = {k: v for k, v in self._checked().items() if (self.root / k).exists()}  # drop deleted entries
            write_private_json(self._checked_path(), {**known, name: seal})

    def save(self, key: str, feats: torch.Tensor) -> None:
        """Write an entry. A cache that cannot take it (full disk, read-only, quota) never aborts the run that
        computed the features: one warning, the event ``unsaved``, and no further writes this run."""
        if not (self.enabled and self.writable):
            return
        from safetensors.torch import save

        feats = feats.contiguous()
        digest = _digest(feats)
        data = save({"features": feats}, metadata={"key": key, "sha256": digest})
        try:
            free = shutil.disk_usage(self.root).free
            if free < len(data) + (1 << 20):
                raise OSError(errno.ENOSPC, f"{free / 2**20:.1f} MB free, the entry needs {len(data) / 2**20:.1f} MB")
            atomic_write_bytes(self.path(key), data)
            # computed here with the backbone: as good as spot-checked (a rewrite changes the digest)
            self._remember_checked(self.path(key).name, {"sha256": digest, "key": _sha(key)})
        except (OSError, ClbenchError) as e:
            self.writable = False
            self.events.append("unsaved")
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split("\n")[0]
            self._warn(f"cannot write an entry ({reason})")

    def get_or_compute(
        self, key: str, compute: Callable[[], torch.Tensor], spot: Spot | None = None, precision: str = "fp32"
    ) -> tuple[torch.Tensor, bool]:
        """(features, was_cached). A miss takes an exclusive lock on the entry first, so concurrent runs of a sweep
        that need the same features compute them once: the others wait and then read the entry. ``spot``: how to
        recompute a few rows with the backbone, to check a cached entry against it (module docstring)."""
        feats = self.load(key, spot, precision)
        if feats is not None:
            self.events.append("hit")
            return feats, True
        with self._entry_lock(key):
            feats = self.load(key, spot, precision)  # written by another process while this one waited
            if feats is not None:
                self.events.append("hit")
                return feats, True
            self.events.append("miss")
            feats = compute()
            self.save(key, feats)
        return feats, False

    @contextlib.contextmanager
    def _entry_lock(self, key: str):
        if not (self.enabled and self.writable):
            yield
            return
        lock_path = self.path(key).with_suffix(".lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle = open_lock(lock_path)  # a planted symbolic link is refused, never followed
        except OSError:  # a read-only or odd cache folder: no sharing, but the run goes on
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            handle.close()  # closing releases the lock


def spot_mismatch(feats: torch.Tensor, spot: Spot, tolerance: float, k: int = SPOT_CHECK) -> str | None:
    """Whether ``k`` rows of ``feats``, chosen by the operating system's random source (never the run's RNGs: a run
    from the cache and one that computed its features stay the same run), match ``spot``'s recomputation within
    ``tolerance`` (relative distance); a few words saying how they differ, or None."""
    import random

    n = feats.shape[0]
    if n == 0:
        return None
    rows = sorted(random.SystemRandom().sample(range(n), min(k, n)))
    fresh = spot(rows).float()
    if fresh.shape != (len(rows), feats.shape[1]):
        return f"the backbone gives features of shape {tuple(fresh.shape)} for {len(rows)} images"
    cached = feats[rows].float()
    distance = (cached - fresh).norm(dim=1) / fresh.norm(dim=1).clamp_min(1e-12)
    bad = int((distance > tolerance).sum())
    if bad:
        return (
            f"{bad} of {len(rows)} spot-checked images differ from what the backbone gives (relative distance up to "
            f"{float(distance.max()):.3g}); the entry was not written from these images and weights"
        )
    return None
