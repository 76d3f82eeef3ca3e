"""Frozen timm backbones: the wrapper every strategy sees, and :func:`load_backbone`.

The feature every method uses is the final [CLS] token after the last LayerNorm (timm's
``forward_head(forward_features(x), pre_logits=True)``); for a CNN it is the pooled feature. Where the weights come
from (``--weights``) is :mod:`clbench.weights.resolve`. The digest recorded in results is the SHA-256 of the loaded
backbone's state (keys, shapes and bytes), so it identifies what actually ran whatever the source.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from clbench.catalog import BackboneSpec


def state_digest(module: nn.Module) -> str:
    """SHA-256 over (key, shape, bytes) of every tensor of ``module``'s state dict."""
    h = hashlib.sha256()
    for key, t in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class FrozenBackbone(nn.Module):
    """A timm model in eval mode with all parameters frozen; ``forward`` returns pre-logits features (B, d)."""

    def __init__(self, model: nn.Module, spec: BackboneSpec, weights_source: str, img_size: int) -> None:
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.spec = spec
        self.weights_source = weights_source
        self.img_size = img_size
        self.num_features: int = int(model.num_features)
        cfg = model.pretrained_cfg
        self.mean: tuple[float, ...] = tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
        self.std: tuple[float, ...] = tuple(cfg.get("std", (0.229, 0.224, 0.225)))
        self.digest = state_digest(self.model)

    @property
    def is_vit(self) -> bool:
        return self.spec.family == "vit"

    def train(self, mode: bool = True) -> FrozenBackbone:
        # Frozen means frozen: dropout/drop-path/BN statistics never switch to training behaviour.
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, d)
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_backbone(name: str, weights: str = "auto", img_size: int | None = None, seed: int = 0) -> FrozenBackbone:
    """Build backbone ``name`` with weights from ``weights`` (:mod:`clbench.weights.resolve`), frozen."""
    from clbench.weights.resolve import load_model

    model, spec, source, size = load_model(name, weights, img_size, seed)
    return FrozenBackbone(model, spec, source, size)
