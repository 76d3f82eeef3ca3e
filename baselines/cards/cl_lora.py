"""CL-LoRA's card: its settings (:class:`CLLoRAConfig`, the defaults of its reference), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them
without loading the method (``baselines/cl_lora.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work


@dataclass(frozen=True)
class CLLoRAConfig:
    """Defaults: the reference's ``exps/cifar.json`` (CIFAR-100, B5 Inc5) and the constants of its ``_init_train``."""

    rank: int = 8  # "ffn_num" (10 in exps/inr.json, ina.json, vtab.json)
    shared_blocks: int = -1  # "general_pos" [0..5] of 12 blocks (task-shared LoRA; the rest task-specific): -1 = half
    lr: float = 0.03  # "init_lr" = "later_lr" (SGD, momentum 0.9 in get_optimizer)
    weight_decay: float = 0.0001  # "weight_decay"
    epochs: int = 30  # "init_epochs" = "later_epochs"
    batch_size: int = 64  # "batch_size"
    min_lr: float = 0.0  # "min_lr": the cosine schedule's eta_min (stepped per epoch, T_max = epochs)
    kd_weight: float = 5.0  # "kd_ratio" in _init_train (hard-coded)
    kd_temperature: float = 2.0  # "Temperature" in _init_train (hard-coded)
    orth_weight: float = 0.0001  # the block-weight orthogonality loss's factor in _init_train (hard-coded)
    gradient_reassignment: bool = True  # the KD gradient of the shared LoRA rescaled by the old up-projection's rows
    eval_batch_size: int = 64  # prediction batch (speed only: every row depends on its own image)
    float64: bool = False  # compute in float64 (the ci profile: the same numbers under every CPU's kernels)

    def __post_init__(self) -> None:
        for name in ("rank", "epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.shared_blocks < -1:
            raise ValueError(f"shared_blocks must be -1 (half the blocks) or >= 0, got {self.shared_blocks}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        for name in ("weight_decay", "min_lr", "kd_weight", "orth_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number >= 0, got {value}")
        if not (self.kd_temperature > 0 and math.isfinite(self.kd_temperature)):
            raise ValueError(f"kd_temperature must be a positive number, got {self.kd_temperature}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")

    def n_shared(self, depth: int) -> int:
        """Blocks with the task-shared LoRA (the first ones); the others carry the task-specific LoRA."""
        return depth // 2 if self.shared_blocks == -1 else self.shared_blocks


# ``reference``: exps/cifar.json (the default, stated); ``reference-imr``: exps/inr.json (ImageNet-R, B5 Inc5).
# ``quick``: a short CPU run of the embedded benchmark at 112 px (clbench.core.catalog.COMMON_PROFILES): 3 epochs of
# batches of 32 at the reference's learning rate.
# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 8 training
# images of each class, 4 epochs of batches of 32 (3 steps an epoch), in float64 (as InfLoRA's and SLCA's ci
# profiles, so that the gate's numbers do not depend on the CPU's kernels; reports/gate/README.md), at lr 0.3: the
# cosine head's scale starts at 1, and 12 steps at the reference's 0.03 leave the loss at log 12. Measured (2 cores
# at load ~20): loss 2.49 -> 2.36 / 2.23 / 2.17 per task, parameters moved 11-21 %, 34 % of the first task's
# predictions changed by training; A_t 25.8 / 26.2 / 21.4, average 24.5 (SimpleCIL on the same split: 21.2 / 21.8 /
# 21.2, average 21.4); 660 s. At lr 0.1: loss 2.49 -> 2.45, A_t 23.0 / 22.7 / 21.5, average 22.4.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {**QUICK_INPUT, "epochs": 3, "batch_size": 32},
    "ci": {**CI_SHAPE, "epochs": 4, "train_per_class": 8, "batch_size": 32, "lr": 0.3, "float64": True},
    "reference": {"rank": 8, "lr": 0.03, "weight_decay": 0.0001, "epochs": 30, "batch_size": 64},
    "reference-imr": {"rank": 10, "lr": 0.05, "weight_decay": 0.0005, "epochs": 20, "batch_size": 32},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def param_formula(cfg: CLLoRAConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """LoRA on the queries and values (2 per block, each a down (r x d) and an up (d x r) projection).

    Added: the first task adds the task-shared up-projections (2 S d r, trained on every task); every task adds its
    task-specific LoRA (4 P d r, both projections trained) and its block weights (3 x P: query, key, value rows, as
    the reference). Stored: the shared down-projections (random orthogonal, never trained: 2 S r d) and the
    teacher's copy of the shared up-projections (2 S d r) from the first task on, and each class's prototype (d
    numbers, the head). Trainable per task: the shared up-projections, the task's LoRA and block weights, and the
    task's training head (cosine, c_t d + 1, thrown away after the task)."""
    shared = cfg.n_shared(depth)
    specific = depth - shared
    half = 2 * shared * d * cfg.rank  # the shared up-projections (or, alike, the down-projections)
    per_task = 4 * specific * d * cfg.rank + 3 * specific
    added = [per_task + (half if t == 0 else 0) for t in range(len(task_sizes))]
    stored = [c * d + (2 * half if t == 0 else 0) for t, c in enumerate(task_sizes)]
    trainable = [half + per_task + c * d + 1 for c in task_sizes]
    return ParamCounts(
        added_per_task=added,
        trainable_per_task=trainable,
        head=sum(task_sizes) * d,
        stored_per_task=stored,
        extra={"shared_blocks": shared, "specific_blocks": specific},
    )


def work(cfg: CLLoRAConfig, shape: RunShape) -> Work:
    """Counted in whole-ViT passes, a block being 1/depth of one; s = the shared blocks' share of the depth (1/2 by
    default). Per task: ``epochs`` training passes (forward + backward) per learnt image; from the second task on,
    the distillation also runs each image through the shared blocks with the current LoRA (forward + backward) and
    with the teacher's (forward): s of a training pass and s of a forward pass more; after training, one forward pass
    per learnt image for the prototypes. Evaluation after task t: the shared blocks once and the specific blocks once
    per task learnt, s + (t + 1)(1 - s) forward passes per seen test image, for every protocol. No part runs the frozen
    ViT alone, so the feature cache serves nothing."""
    s = 0.5 if cfg.shared_blocks == -1 else min(cfg.shared_blocks / 12, 1.0)  # the depth is not known here: ViT-B's
    learnt = shape.learnt
    n_learn = sum(learnt)
    later = sum(learnt[1:])
    test = sum(n * (s + (t + 1) * (1 - s)) for t, n in enumerate(shape.test_seen))
    return Work(f=n_learn + s * cfg.epochs * later + shape.protocols * test, b=cfg.epochs * (n_learn + s * later))


# The settings that matter for a search: the SGD learning rate, the rank and the distillation's weight.
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"lr": (0.003, 0.3, True), "rank": (4, 8, 16), "kd_weight": (0.5, 20.0, True)}

CARD = MethodCard(
    "cl_lora",
    CLLoRAConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="lora",
    trains="a task-shared LoRA (distilled) in early blocks and a task-specific LoRA with block weights in later ones",
    tune_space=TUNE_SPACE,
    embedding="CL-LoRA's [CLS] through the shared and the last task's LoRA",
)
