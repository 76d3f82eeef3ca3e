"""APER's card: its settings (:class:`APERConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them without
loading the method (``baselines/aper.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.layers.checks import check_first_session_fields
from clbench.methods.costs import ParamCounts, RunShape, Work, adapter_set_size
from clbench.run.catalog import MethodCard
from clbench.run.config import CI_FIRST_SESSION


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
# ``ci``: the regression gate's first-session recipe (clbench.run.config.CI_FIRST_SESSION).
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def param_formula(cfg: APERConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Task 0 adds the adapters (depth * (2 d r + r + d)); trained in it: adapters, the task-0 cosine head (d per
    class, thrown away) and its sigma. Every task stores a 2d prototype per new class; later tasks train nothing."""
    adapters = adapter_set_size(depth, d, cfg.bottleneck)
    added = [adapters if t == 0 else 0 for t in range(len(task_sizes))]
    trainable = [adapters + d * n + 1 if t == 0 else 0 for t, n in enumerate(task_sizes)]
    return ParamCounts(
        added_per_task=added,
        stored_per_task=[2 * d * n for n in task_sizes],
        trainable_per_task=trainable,
        head=2 * d * sum(task_sizes),
        extra={"adapter_params": adapters, "prototype_width": 2 * d},
    )


def work(cfg: APERConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward with the adapters in the first task, none later
    (the adapted ViT is then fixed, so each image's adapted feature is computed once and kept).
    Frozen features of every image (clbench's cache), task-0 training passes, then one adapted pass per
    training and test image (kept by the strategy)."""
    learnt = shape.learnt  # the images tuning and prototypes use
    n_test = max(shape.test_seen, default=0)
    frozen = sum(shape.train_per_task) + n_test
    return Work(f=frozen + sum(learnt) + n_test, b=cfg.epochs * learnt[0], f_cacheable=frozen)


CARD = MethodCard("aper", APERConfig, PROFILES, param_formula=param_formula, work=work, family="adapters")
