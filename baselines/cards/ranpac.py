"""RanPAC's card: its settings (:class:`RanPACConfig`, the defaults its reference uses) and its named profiles,
torch-free, so that reports, the gate and the CLI read them without loading the method (``baselines/ranpac.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from clbench.catalog import MethodCard
from clbench.config import CI_FIRST_SESSION
from clbench.layers.checks import check_first_session_fields


@dataclass(frozen=True)
class RanPACConfig:
    """Defaults: PILOT ``exps/ranpac.json`` (CIFAR-100 B0 Inc10) = the original repo's ``cifar100_publish.csv``."""

    M: int = 10000  # "M": random projection width
    first_session: bool = True  # "Phase 1": adapt the ViT on task 0 (False = the paper's "No Phase 1" ablation)
    head: Literal["plain", "cosine"] = "plain"  # original RanPAC: h Wo^T; "cosine": PILOT's CosineLinear
    ridge_numerics: Literal["exact", "reference"] = "exact"  # float64 exact ridge; "reference": float32 solves
    bottleneck: int = 64  # "ffn_num": adapter bottleneck r
    adapter_scale: float = 0.1  # tuning_config ffn_adapter_scalar "0.1"
    adapter_dropout: float = 0.1  # backbone/vit_adapter.py: Adapter(dropout=0.1)
    lr: float = 0.01  # "init_lr" (the original's body_lr 0.01)
    momentum: float = 0.9  # models/ranpac.py: optim.SGD(momentum=0.9) ("optimizer": "sgd")
    weight_decay: float = 5e-4  # "weight_decay"
    min_lr: float = 0.0  # "min_lr": eta_min of CosineAnnealingLR, stepped once per epoch
    epochs: int = 20  # "tuned_epoch": first session only; later tasks train nothing
    batch_size: int = 48  # "batch_size" (training)
    eval_batch_size: int = 48  # the reference's protonet/test loaders reuse "batch_size"; speed only

    def __post_init__(self) -> None:
        check_first_session_fields(self)
        if self.M < 1:
            raise ValueError(f"M must be >= 1, got {self.M}")
        if self.head not in ("plain", "cosine"):
            raise ValueError(f"head must be 'plain' or 'cosine', got {self.head!r}")
        if self.ridge_numerics not in ("exact", "reference"):
            raise ValueError(f"ridge_numerics must be 'exact' or 'reference', got {self.ridge_numerics!r}")


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores: 112 px input and 3 first-session epochs instead of 20 (the only backward passes of the run); M stays
# the reference's 10,000 (one 10,000 x 10,000 float64 Cholesky solve per task).
# ``ci``: the regression gate's first-session recipe (clbench.config.CI_FIRST_SESSION) and M = 2,000.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION, "M": 2000},
}
CARD = MethodCard("ranpac", RanPACConfig, PROFILES)
