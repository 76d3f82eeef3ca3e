"""APER's card: its settings (:class:`APERConfig`, the defaults its reference uses) and its named profiles, torch-free,
so that reports, the gate and the CLI read them without loading the method (``baselines/aper.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clbench.catalog import MethodCard
from clbench.config import CI_FIRST_SESSION
from clbench.layers.checks import check_first_session_fields


@dataclass(frozen=True)
class APERConfig:
    """Defaults: PILOT ``exps/aper_aperpter.json`` (CIFAR-100 B0 Inc10) and ``utils/inc_net.py`` ``tuning_config``."""

    bottleneck: int = 64  # "ffn_num": adapter bottleneck r
    adapter_scale: float = 0.1  # tuning_config ffn_adapter_scalar "0.1"
    adapter_dropout: float = 0.1  # backbone/vit_adapter.py: Adapter(dropout=0.1)
    lr: float = 0.01  # "init_lr"
    momentum: float = 0.9  # models/aper_adapter.py: optim.SGD(momentum=0.9) ("optimizer": "sgd")
    weight_decay: float = 5e-4  # "weight_decay"
    min_lr: float = 0.0  # "min_lr": eta_min of CosineAnnealingLR, stepped once per epoch
    epochs: int = 20  # "tuned_epoch": first session only; later tasks train nothing
    batch_size: int = 48  # "batch_size" (training)
    eval_batch_size: int = 48  # the reference's prototype/test loaders reuse "batch_size"; speed only

    def __post_init__(self) -> None:
        check_first_session_fields(self)


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores: 112 px input (8x8 patches of 14 px) and 3 first-session epochs instead of 20 (the only backward
# passes of the run); afterwards one adapted pass per image.
# ``ci``: the regression gate's first-session recipe (clbench.config.CI_FIRST_SESSION).
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION},
}
CARD = MethodCard("aper", APERConfig, PROFILES)
