"""TUNA's card: its settings (:class:`TUNAConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them without
loading the method (``baselines/tuna.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work, adapter_set_size
from clbench.layers.checks import check_adapter_sets_fields, check_fields


@dataclass(frozen=True)
class TUNAConfig:
    """Defaults: the authors' ``exps/tuna_imgr.json`` (ImageNet-R B0 Inc20, the run with the orthogonality loss on),
    ``models/tuna.py``, ``backbone/vit_tuna.py`` and the ``tuning_config`` of ``utils/inc_net.py``
    (LAMDA-CL/ICCV2025-TUNA @ 77d4f10, kept in the fork Ngahoang2005/ICCV2025-TUNA)."""

    bottleneck: int = 16  # vit_tuna.py init_adapters: Adapter(bottleneck=16) (= tuning_config ffn_num 16)
    adapter_scale: float = 0.1  # init_adapters: adapter_scalar="0.1"
    adapter_dropout: float = 0.1  # init_adapters: Adapter(dropout=0.1)
    lr: float = 0.02  # "init_lr": the adapter group and the head group alike
    momentum: float = 0.9  # models/tuna.py get_optimizer: SGD momentum 0.9
    weight_decay: float = 5e-4  # "weight_decay" (both groups, and the alignment group)
    min_lr: float = 0.0  # "min_lr": floor of the cosine schedule (stepped once per epoch)
    epochs: int = 10  # "tuned_epoch" (every task)
    batch_size: int = 32  # "batch_size" (training; alignment draws 5 * batch_size per class)
    eval_batch_size: int = 32  # the test loader reuses "batch_size"; speed only (predictions are per sample)
    scale: float = 20.0  # "scale": s of the CosFace loss, of the alignment logits and of the test-time logits
    margin: float = 0.0  # "m": the CosFace margin
    use_orth: bool = True  # "use_orth": the orthogonality term from task 1 on
    reg: float = 0.001  # "reg": its weight, times exp(-(t + 1)) (models/tuna.py _init_train)
    ca_epochs: int = 30  # "crct_epochs": classifier alignment epochs (tasks >= 1)
    ca_lr: float = 0.005  # "ca_lr"
    ca_tmax: int = 5  # classifer_align: CosineAnnealingLR(T_max=5), hard-coded (periodic past epoch 5)
    ca_samples_scale: int = 5  # classifer_align: num_sampled_pcls = batch_size * 5
    ca_storage: Literal["covariance", "variance"] = "covariance"  # "ca_storage_efficient_method"
    cov_eps: float = 1e-4  # _compute_mean: cov + 1e-4 I
    decay: bool = True  # "decay": alignment means of older tasks scaled by 0.9 + 0.1 (task + 1) / (t + 1)
    # which task a class is counted in for "decay": "task" its own task (sound); "reference" the code's
    # class // (known - total), a floor division by minus the current task's size (see the module docstring)
    decay_rule: Literal["task", "reference"] = "task"
    # the universal adapter at test time: "merged" (the paper: the sign-elected merge of every task's adapter set);
    # "last" reproduces the code, whose adapter_id = t + 1 reaches the current (last) set, never the merged one
    universal: Literal["merged", "last"] = "merged"
    # the code's orthogonality term also reaches the stored sets' W_up (not detached, in the optimizer), so weight
    # decay and the term move earlier tasks' adapters; False (default): stored sets stay frozen
    orth_updates_old: bool = False
    entropy_eps: float = 1e-10  # _eval_cnn: -sum p log(p + 1e-10)

    def __post_init__(self) -> None:
        check_adapter_sets_fields(
            self, at_least_one=("ca_tmax",), positive=("scale",), nonnegative=("margin", "entropy_eps")
        )
        check_fields(self, choices={"decay_rule": ("task", "reference"), "universal": ("merged", "last")})


# ``quick``: CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14
# on 2 cores: 112 px input, the first 32 training images of each class, 2 epochs instead of 10 and 10 alignment
# epochs instead of 30 (head-only steps on sampled features); evaluation after task t costs t + 2 ViT passes per
# seen test image (every task's set and the merged one), as in MOS's quick profile it dominates.
# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 8 training
# images of each class, 4 epochs of batches of 16 (24 steps per task), 5 alignment epochs, the reference's lr 0.02.
# Measured (seed 1993, 2 busy cores): the CosFace loss falls from 5.8 / 4.8 / 4.8 to 2.5 / 1.9 / 2.4 over a task's
# 4 epochs, A_T 30.3 against SimpleCIL's 21.2 on the same split; at lr 0.1 the adapters drifted and A_T was 22.6.
# Evaluation dominates (t + 2 passes per seen test image): 85-130 s training, 235-315 s evaluation there.
# ``reference-cifar``: the authors' exps/tuna_cifar.json (CIFAR-100 B0 Inc5): no orthogonality term, no decay.
# ``reference-code``: the defaults with the three code behaviours the module docstring lists as flaws.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 2, "ca_epochs": 10, "train_per_class": 32},
    "ci": {**CI_SHAPE, "epochs": 4, "ca_epochs": 5, "train_per_class": 8, "batch_size": 16},
    "reference-cifar": {
        "epochs": 15,
        "lr": 0.01,
        "batch_size": 16,
        "eval_batch_size": 16,
        "use_orth": False,
        "ca_epochs": 30,
        "ca_lr": 0.005,
        "decay": False,
    },
    "reference-code": {"universal": "last", "decay_rule": "reference", "orth_updates_old": True},
}

TUNE_SPACE: dict[str, tuple[Any, ...]] = {
    "lr": (1e-3, 0.1, True),
    "ca_lr": (1e-3, 0.05, True),
    "epochs": (5, 20),
    "reg": (1e-4, 1e-1, True),
}


# ------------------------------------------------------------------------------------ parameters and cost model
def head_rows_updated(cfg: TUNAConfig, t: int, n_new: int, n_seen: int) -> int:
    """Head rows changed in task t: old rows get zero gradient from the task-local loss, but weight decay (and,
    from task 1 on, the alignment) moves every seen row."""
    return n_seen if cfg.weight_decay > 0 or (t >= 1 and cfg.ca_epochs > 0) else n_new


def old_up_weights_updated(cfg: TUNAConfig, t: int, depth: int, d: int) -> int:
    """W_up of the t stored sets, moved by the orthogonality term with ``orth_updates_old`` (the reference code)."""
    return t * depth * d * cfg.bottleneck if cfg.orth_updates_old and cfg.use_orth and t >= 1 else 0


def param_formula(cfg: TUNAConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Per task: one adapter set depth * (2 d r + r + d) and a cosine head row d per new class (no bias); stored:
    each new class's mean d and covariance d^2 (or variance d), and from task 1 on the merged universal set (one
    set, rebuilt after every task, counted once where it appears)."""
    adapters = adapter_set_size(depth, d, cfg.bottleneck)
    stats_per_class = d + (d * d if cfg.ca_storage == "covariance" else d)
    added, stored, trainable, seen = [], [], [], 0
    for t, n in enumerate(task_sizes):
        seen += n
        added.append(adapters + n * d)
        merged = adapters if t == 1 and cfg.universal == "merged" else 0
        stored.append(n * stats_per_class + merged)
        trainable.append(adapters + d * head_rows_updated(cfg, t, n, seen) + old_up_weights_updated(cfg, t, depth, d))
    return ParamCounts(
        added_per_task=added,
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=seen * d,
        extra={"adapter_params_per_task": adapters},
    )


def work(cfg: TUNAConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward with the current adapter set (the
    orthogonality term and the merge are parameter arithmetic, not passes). Training: ``epochs`` forward + backward
    passes per training image; end of task: one frozen pass per training image (class statistics under set t);
    evaluation after task t: t + 1 passes per seen test image and protocol (every task's set, for the entropy
    selection), plus one through the merged set from task 1 on (``universal="merged"``; ``"last"`` reuses set t).
    Alignment is head-only (negligible). Nothing is cacheable: every pass goes through an adapter set."""
    n_train = sum(shape.learnt)
    universal = 1 if cfg.universal == "merged" else 0
    evals = sum(n * (t + 1 + (universal if t >= 1 else 0)) for t, n in enumerate(shape.test_seen))
    return Work(f=n_train + shape.protocols * evals, b=cfg.epochs * n_train, f_cacheable=0.0)


CARD = MethodCard(
    "tuna",
    TUNAConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="adapters",
    trains="one adapter set per task (orthogonality term) and a cosine head; a merged universal set",
    tune_space=TUNE_SPACE,
    embedding="TUNA's [CLS] under the adapter set the entropy rule selects",
    min_train_per_class=2,  # a class covariance needs 2 images
)
