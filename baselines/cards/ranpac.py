"""RanPAC's card: its settings (:class:`RanPACConfig`, the defaults its reference uses), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them
without loading the method (``baselines/ranpac.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_FIRST_SESSION
from clbench.core.costs import ParamCounts, RunShape, Work, adapter_set_size
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
# ``ci``: the regression gate's first-session recipe (clbench.core.config.CI_FIRST_SESSION) and M = 2,000.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION, "M": 2000},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def param_extra(cfg: RanPACConfig, d: int, depth: int, n_classes: int) -> dict[str, Any]:
    """The method's own counts of :class:`ParamCounts` (``extra``), of the formula and of a live run alike."""
    return {
        "M": cfg.M,
        "feature_width": d,
        "random_projection": d * cfg.M,
        "adapter_params": adapter_set_size(depth, d, cfg.bottleneck) if cfg.first_session else 0,
        "gram_floats": cfg.M * cfg.M,
        "class_sum_floats": cfg.M * n_classes,
        "head_kind": cfg.head,
    }


def param_formula(cfg: RanPACConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Added: the adapters (with Phase 1) in task 0 and M output weights per class (the ridge head); stored:
    W (d M, fixed random) and G (M^2) in task 0 and Q (M per class); trained in task 0: adapters, the task-0
    cosine head (d per class, thrown away) and its sigma; later tasks train nothing."""
    adapters = adapter_set_size(depth, d, cfg.bottleneck) if cfg.first_session else 0
    added = [cfg.M * n + (adapters if t == 0 else 0) for t, n in enumerate(task_sizes)]
    stored = [cfg.M * n + (d * cfg.M + cfg.M * cfg.M if t == 0 else 0) for t, n in enumerate(task_sizes)]
    trainable = [adapters + d * n + 1 if t == 0 and cfg.first_session else 0 for t, n in enumerate(task_sizes)]
    return ParamCounts(
        added_per_task=added,
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=cfg.M * sum(task_sizes),
        extra=param_extra(cfg, d, depth, sum(task_sizes)),
    )


def work(cfg: RanPACConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: with Phase 1, one forward + backward with the adapters in the first
    task, none later (the adapted ViT is then fixed; each image's adapted feature is computed once and kept).
    Frozen features of every image (clbench's cache); with Phase 1 the task-0 training passes and one adapted
    pass per training and test image. Not counted: the M-dependent linear algebra (per task the Gram update,
    2 n M^2 flops for n images, and one M x M float64 Cholesky, M^3 / 3), which has no unit in the committed
    projection costs (``reports/perf/projection-cpu.json``); measured ~15-25 s per task at M = 10,000 on the
    2-core CPU of ``reports/rivals/ranpac-aper.md``."""
    learnt = shape.learnt  # the images tuning and statistics use
    n_test = max(shape.test_seen, default=0)
    frozen = sum(shape.train_per_task) + n_test
    adapted = sum(learnt) + n_test if cfg.first_session else 0
    train = cfg.epochs * learnt[0] if cfg.first_session else 0
    return Work(f=frozen + adapted, b=train, f_cacheable=frozen)


# `clbench tune`: the projection width M and the first session's learning rate; RanPAC picks its ridge lambda
# itself (by cross-validation on the task's data), so lambda is not a setting. Phase 1 off (first_session=false, the
# paper's ablation) makes a study of cached-feature trials: tune with --set first_session=false
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"M": (1000, 20000, True), "lr": (1e-3, 0.1, True)}


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Learned: the first-session adapters and the ridge head (M per class, solved in closed form); stored: the
    fixed random projection W (d M), the Gram matrix G (M^2) and the class sums Q (M per class)."""
    w, g, m = int(extra["random_projection"]), int(extra["gram_floats"]), int(extra["M"])
    added = [k - (w if t == 0 else 0) for t, k in enumerate(kept_per_task)]
    stored = [(w + g if t == 0 else 0) + m * c for t, c in enumerate(task_sizes)]
    return added, stored


CARD = MethodCard(
    "ranpac",
    RanPACConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="adapters on the first task only; then a ridge head on a random projection",
    tune_space=TUNE_SPACE,
    embedding="RanPAC's ReLU random projection h = ReLU(f W)",
    split_kept=split_kept,
)
