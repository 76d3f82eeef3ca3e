"""EASE's card: its settings (:class:`EASEConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them without
loading the method (``baselines/ease.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_FIRST_SESSION
from clbench.core.costs import ParamCounts, RunShape, Work, adapter_set_size
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
# ``ci``: the regression gate's first-session recipe (clbench.core.config.CI_FIRST_SESSION): 3 tasks of 12 classes,
# since inference after task t costs t + 1 ViT passes per seen test image.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def param_formula(cfg: EASEConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    adapters = adapter_set_size(depth, d, cfg.bottleneck)
    stored, trainable, seen = [], [], 0
    for t, c in enumerate(task_sizes):
        # new classes: a prototype in each of the t + 1 subspaces; old classes: a synthesised one in subspace t
        stored.append(c * (t + 1) * d + seen * d)
        trainable.append(adapters + c * d + 1)  # the adapter set and its task-local cosine head (rows, scale)
        seen += c
    return ParamCounts(
        added_per_task=[adapters] * len(task_sizes),  # the task head is thrown away after the task
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=seen * len(task_sizes) * d,
    )


def work(cfg: EASEConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward with the new adapter set only (the old sets
    are frozen and play no part in the task's loss). Training: every epoch, every image once through the ViT
    with the new adapter set and a backward pass (b).
    After task t (t = 1..T subspaces): the task's training images through each of the t subspaces for the new
    prototypes, and, per protocol, every seen test image through each of the t subspaces (t f each)."""
    train = shape.learnt
    prototypes = sum(n * (t + 1) for t, n in enumerate(train))
    with_t = sum(n * (t + 1) for t, n in enumerate(shape.test_seen))
    return Work(f=prototypes + shape.protocols * with_t, b=cfg.epochs * sum(train))


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    adapters = int(extra["adapter_params_per_task"])  # learned; the rest is prototypes (class means, synthesised)
    return [adapters] * len(kept_per_task), [k - adapters for k in kept_per_task]


CARD = MethodCard(
    "ease",
    EASEConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="adapters",
    trains="one adapter set per task; prototypes in every subspace",
    embedding="EASE's concatenated adapter-subspace features",
    split_kept=split_kept,
)
