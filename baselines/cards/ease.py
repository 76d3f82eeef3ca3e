"""EASE's card: its settings (:class:`EASEConfig`, the defaults its reference uses) and its named profiles, torch-free,
so that reports, the gate and the CLI read them without loading the method (``baselines/ease.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clbench.catalog import MethodCard
from clbench.config import CI_FIRST_SESSION
from clbench.layers.checks import check_first_session_fields


@dataclass(frozen=True)
class EASEConfig:
    """Defaults: PILOT ``exps/ease.json`` (CIFAR-100 B0 Inc5) and the ``tuning_config`` of ``utils/inc_net.py``."""

    bottleneck: int = 64  # "ffn_num": adapter bottleneck r
    adapter_scale: float = 0.1  # tuning_config ffn_adapter_scalar "0.1"
    adapter_dropout: float = 0.1  # backbone/vit_ease.py get_new_adapter: Adapter(dropout=0.1)
    lr: float = 0.025  # "init_lr" = "later_lr"
    momentum: float = 0.9  # models/ease.py get_optimizer: SGD momentum 0.9
    weight_decay: float = 5e-4  # "weight_decay"
    min_lr: float = 0.0  # "min_lr": floor of the cosine schedule (stepped once per epoch)
    epochs: int = 20  # "init_epochs" = "later_epochs"
    batch_size: int = 48  # "batch_size" (training)
    eval_batch_size: int = 48  # the reference's test/prototype loaders reuse "batch_size"; speed only
    alpha: float = 0.1  # "alpha": other subspaces weigh alpha / t at inference
    use_reweight: bool = True  # "use_reweight": false = plain cosine on the concatenated feature

    def __post_init__(self) -> None:
        check_first_session_fields(self, nonnegative=("alpha",))


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores within 15 minutes: 112 px input (8x8 patches of 14 px; the emoji images are 64 px) and 3 epochs
# instead of 20. Measured on one core at 112 px: ~49 ms CPU per training image and step, ~21 ms per backbone
# pass; inference needs t + 1 passes per test image after task t, so ~15 CPU-minutes in all.
# ``ci``: the regression gate's first-session recipe (clbench.config.CI_FIRST_SESSION): 3 tasks of 12 classes,
# since inference after task t costs t + 1 ViT passes per seen test image.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION},
}
CARD = MethodCard("ease", EASEConfig, PROFILES)
