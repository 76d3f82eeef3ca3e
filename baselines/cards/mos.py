"""MOS's card: its settings (:class:`MOSConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them without
loading the method (``baselines/mos.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard, rest_stored
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work, adapter_set_size
from clbench.layers.checks import check_adapter_sets_fields, check_range


@dataclass(frozen=True)
class MOSConfig:
    """Defaults: PILOT ``exps/mos.json`` (CIFAR-100 B0 Inc5) and the ``tuning_config`` of ``utils/inc_net.py``."""

    bottleneck: int = 16  # "ffn_num": adapter bottleneck r
    adapter_scale: float = 0.1  # tuning_config ffn_adapter_scalar "0.1"
    adapter_dropout: float = 0.1  # backbone/vit_mos.py init_adapters: Adapter(dropout=0.1)
    lr: float = 0.03  # "init_lr": adapter parameter group
    head_lr_scale: float = 0.1  # models/mos.py get_optimizer: head group lr = 0.1 * init_lr
    momentum: float = 0.9  # get_optimizer: SGD momentum 0.9
    weight_decay: float = 5e-4  # "weight_decay" (both groups, and the alignment group)
    min_lr: float = 0.0  # "min_lr": floor of the cosine schedule (stepped once per epoch)
    epochs: int = 20  # "tuned_epoch" (every task)
    batch_size: int = 48  # "batch_size" (training; alignment draws 5 * batch_size per class)
    eval_batch_size: int = 48  # the test loader reuses "batch_size": the batches of the 'reference' protocol
    reg: float = 0.1  # "reg": weight of the orthogonality term
    orth_temperature: float = 0.8  # models/mos.py orth_loss: M M^T / 0.8 (hard-coded)
    adapter_momentum: float = 0.1  # "adapter_momentum": m of the merge toward the previous sets' mean
    ca_epochs: int = 30  # "crct_epochs": classifier alignment epochs (tasks >= 1)
    ca_lr: float = 0.005  # "ca_lr"
    ca_samples_scale: int = 5  # classifer_align: num_sampled_pcls = batch_size * 5
    ca_storage: Literal["covariance", "variance"] = "covariance"  # "ca_storage_efficient_method"
    cov_eps: float = 1e-4  # _compute_mean: cov + 1e-4 I
    max_refine: int = 4  # _eval_cnn: MAX_ITER of the self-refinement loop
    ensemble: bool = True  # "ensemble": add softmax((t+1) * prototype logits) to the refined softmax
    reference_drift: bool = False  # True: PILOT's in-place merging in every forward (see module docstring)

    def __post_init__(self) -> None:
        check_adapter_sets_fields(self, at_least_one=("max_refine",), positive=("orth_temperature", "head_lr_scale"))
        check_range(self, "adapter_momentum", 0.0, 1.0)


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores within ~15 minutes: 112 px input, the first 32 training images of each class (about half), 2 epochs
# instead of 20 and 10 alignment epochs instead of 30 (head-only steps on sampled features). With EASE's
# measured unit costs at 112 px (~49 ms CPU per training image and step, ~21 ms per frozen pass): training
# ~115 s, class statistics and prototypes (one pass each per training image) ~50 s, evaluation ~300 s (t + 1
# passes per seen test image after task t: evaluation dominates), ~8 CPU-min.
# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 8
# training images of each class, 4 epochs of batches of 16 (the 32 image passes per class of 2 epochs of 16
# images, in 24 steps instead of 8: the loss falls to ~0.6-0.7 of its first epoch, reports/gate/README.md),
# 5 alignment epochs.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 2, "ca_epochs": 10, "train_per_class": 32},
    "ci": {
        **CI_SHAPE,
        "epochs": 4,
        "ca_epochs": 5,
        "train_per_class": 8,
        "batch_size": 16,
    },
}


# ------------------------------------------------------------------------------------ parameters and cost model
def head_rows_updated(cfg: MOSConfig, t: int, n_new: int, n_seen: int, d: int) -> int:
    """Head parameters changed in task t: old rows get zero gradient, but weight decay (and, from task 1 on,
    the alignment) moves every seen row."""
    return (d + 1) * (n_seen if cfg.weight_decay > 0 or (t >= 1 and cfg.ca_epochs > 0) else n_new)


def param_formula(cfg: MOSConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Per task: one adapter set depth * (2 d r + r + d), and per new class a head row (d + 1), a prototype
    row d and its statistics (mean d + covariance d^2, or d + d with ``ca_storage="variance"``)."""
    adapters = adapter_set_size(depth, d, cfg.bottleneck)
    stats_per_class = d + d + (d * d if cfg.ca_storage == "covariance" else d)  # prototype, mean, covariance
    added, stored, trainable, seen = [], [], [], 0
    for t, n in enumerate(task_sizes):
        seen += n
        added.append(adapters + n * (d + 1))  # the adapter set and the new head rows
        stored.append(n * stats_per_class)
        trainable.append(adapters + head_rows_updated(cfg, t, n, seen, d))
    return ParamCounts(
        added_per_task=added,
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=seen * (d + 1),
        extra={"adapter_params_per_task": adapters, "prototype_params": seen * d},
    )


def work(cfg: MOSConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward with the current adapter set (the merge toward
    earlier sets is parameter arithmetic after the step, not a pass). Training: ``epochs`` forward +
    backward passes per training image; end of task: two frozen passes per
    training image (statistics under set t, prototypes under set 0); evaluation after task t: t + 1 passes
    per seen test image and protocol. Alignment is head-only (negligible). Nothing is cacheable: set 0 is not
    the frozen backbone. With the run's ``train_per_class`` only the first k images of each class count."""
    n_train = sum(shape.learnt)
    evals = sum(n * (t + 1) for t, n in enumerate(shape.test_seen))
    return Work(f=2 * n_train + shape.protocols * evals, b=cfg.epochs * n_train, f_cacheable=0.0)


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Learned: the adapter set and the head rows (d + 1 per class); stored: each class's prototype, mean and
    covariance (or variance)."""
    adapters = int(extra["adapter_params_per_task"])
    d = int(extra["prototype_params"]) // sum(task_sizes)
    return rest_stored(kept_per_task, [adapters + c * (d + 1) for c in task_sizes])


CARD = MethodCard(
    "mos",
    MOSConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="adapters",
    trains="per-task adapters merged into their predecessors, and the head",
    embedding="MOS's [CLS] under the self-refined adapter set",
    min_train_per_class=2,  # a class covariance needs 2 images
    split_kept=split_kept,
)
