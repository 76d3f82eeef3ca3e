"""TOSCA's card: its settings (:class:`TOSCAConfig`, the defaults its reference uses), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``tosca/strategy.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.errors import ClbenchError
from clbench.layers.checks import check_lr, check_range

VARIANTS: tuple[str, ...] = ("luca", "adapter", "calibrator", "tosca_r")  # the module variants (tosca.luca)
DEFAULT_ROUTER = "entropy"  # the paper's rule


@dataclass(frozen=True)
class TOSCAConfig:
    ratio: int = 16  # bottleneck r = d / ratio (paper: r = 48 for d = 768)
    variant: Literal["luca", "adapter", "calibrator", "tosca_r"] = "luca"  # paper's best: adapter then calibrator
    l1: float = 5e-4  # weight of sum |p| over the task's module (reference args["l1"])
    lr: float = 0.025  # SGD learning rate (reference config)
    momentum: float = 0.9  # SGD momentum (reference get_optimizer)
    weight_decay: float = 0.0  # reference config
    epochs: int = 20  # reference config
    batch_size: int = 48  # reference config
    eta_min: float = 1e-8  # cosine schedule floor (reference get_scheduler)
    train_mode: Literal["cached", "augment"] = "cached"  # clbench default: cached features (see docstring)
    ref_eval_batch: int = 48  # reference test-loader batch for the ``reference`` protocol
    eval_batch: int = 4096  # per-sample evaluation chunk (any value gives identical predictions)
    router: str = DEFAULT_ROUTER  # per-sample module choice (clbench.methods.routers); the paper's rule is entropy
    routers: str = ""  # more routers to evaluate from the same run, comma-separated (diagnostics only)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}")
        if self.train_mode not in ("cached", "augment"):
            raise ValueError("train_mode must be 'cached' or 'augment'")
        for name in ("ratio", "epochs", "batch_size", "ref_eval_batch", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.epochs > 10_000:
            raise ValueError("epochs must be <= 10000")
        check_lr(self.lr)
        check_range(self, "eta_min", 0.0, self.lr)  # the cosine schedule's floor, below its start
        check_range(self, "momentum", 0.0, 1.0, high_open=True)  # SGD's momentum: 1 or more never settles
        check_range(self, "weight_decay", 0.0, 1.0)  # a decay of 1 or more zeroes the weights every step
        check_range(self, "l1", 0.0, 1e3)  # the sparsity weight (reference 5e-4); inf or 1e308 overflows the loss
        if self.router == DEFAULT_ROUTER and not self.routers:
            return  # the paper's rule alone: nothing to look up in the router registry (which loads torch)
        # deferred: loads torch, which importing this module does not
        from clbench.methods.routers import ROUTERS, parse_names

        parse_names(self.router, "router")
        parse_names(self.routers, "routers")
        if ROUTERS.get(self.router).needs_task_id:
            raise ClbenchError(
                f"--set router={self.router}: that rule reads each test image's true task, a bound and not a method",
                f"evaluate it beside the method with --set routers={self.router}",
            )

    @property
    def study_routers(self) -> tuple[str, ...]:
        """The routers recorded in diagnostics: the run's own, those asked for, and the oracle bound."""
        # deferred: loads torch, which importing this module does not
        from clbench.methods.routers import parse_names

        return tuple(dict.fromkeys((self.router, *parse_names(self.routers, "routers"), "oracle")))


# ``quick``: the embedded benchmark at 112 px (clbench.core.catalog.COMMON_PROFILES); TOSCA trains on cached features,
# so its reference epochs stay.
# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the embedded benchmark at 56 px (4x4
# patches of 14 px) so that every CI run shares one feature cache and the whole gate fits in 8 minutes on 2 cores.
# ``ci`` is the default cached training (run with --protocol both); ``ci-augment`` trains through the frozen
# ViT with the reference's augmentation, 2 epochs instead of 20 (one ViT pass per training image per epoch), in
# batches of 16 at lr 0.1 (3x the steps of batch 48 for the same passes: at batch 48 and lr 0.025 the loss ended
# at 0.98 of its first epoch, now 0.83-0.90; reports/gate/README.md).
# ``augment``: the reference's training (train_mode=augment, see tosca/strategy.py's docstring); it gets its own row
# in ``clbench perf projection``.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": dict(CI_INPUT),
    "ci-augment": {**CI_INPUT, "train_mode": "augment", "epochs": 2, "batch_size": 16, "lr": 0.1},
    "augment": {"train_mode": "augment"},
}


def work(cfg: TOSCAConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: ``cached``, none (LuCA trains on the cached frozen [CLS] feature);
    ``augment``, one frozen forward (the augmented image changes every epoch). ``cached`` (default): every
    image once through the frozen backbone, from clbench's feature cache; E
    module steps per training image on cached features. ``augment``: E frozen passes per training image on
    augmented images, plus one per test image. Both: after task t, every seen test image is routed through t
    modules, per protocol. Units ``luca_steps`` and ``route_module_images``: :func:`tosca.perf.unit_seconds`."""
    n_train, n_test = sum(shape.train_per_task), shape.test_seen[-1]
    with_t = sum(n * (t + 1) for t, n in enumerate(shape.test_seen))  # test images x modules
    cached = cfg.train_mode == "cached"
    f = n_train + n_test if cached else cfg.epochs * n_train + n_test
    return Work(
        f=f,
        f_cacheable=f if cached else 0.0,
        extra={"luca_steps": cfg.epochs * n_train, "route_module_images": shape.protocols * with_t},
    )


def param_formula(cfg: TOSCAConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    if d % cfg.ratio:
        raise ValueError(f"ratio {cfg.ratio} does not divide the backbone width {d}")
    r = d // cfg.ratio
    module = 4 * d * r + r + d + 2 * d  # W_down, W_up, W_1, W_2; b_down, b_up; LayerNorm (every variant)
    trainable, added, seen = [], [], 0
    for t, c in enumerate(task_sizes):
        seen += c
        trainable.append(module + seen * d + 1)  # the task's module and the whole head (all rows, the scale)
        added.append(module + c * d + (1 if t == 0 else 0))  # the module and its classes' trained head rows
    return ParamCounts(added_per_task=added, trainable_per_task=trainable, head=seen * d + 1)


# `clbench tune`: the learning rate and the L1 weight that makes the LuCA modules sparse, both on a log scale
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"lr": (1e-3, 0.2, True), "l1": (1e-6, 1e-2, True)}


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Records before schema 3 kept TOSCA's module only: its head rows (trained with the module, d per class,
    and the scale) are learned parameters too."""
    d = (head - 1) // sum(task_sizes)
    added = [k + c * d + (1 if t == 0 else 0) for t, (k, c) in enumerate(zip(kept_per_task, task_sizes, strict=True))]
    return added, [0] * len(added)


CARD = MethodCard(
    "tosca",
    TOSCAConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="routed-modules",
    trains="one LuCA module on the final [CLS] feature per task, and the cosine head",
    tune_space=TUNE_SPACE,
    gate_scenarios=("class", "domain"),  # the gate pins its domain-incremental path too
    projection_profiles=("augment",),  # the reference's training gets its own row in ``clbench perf projection``
    perf_benchmarks={"tosca-routing": "tosca.perf:ROUTING"},
    unit_seconds="tosca.perf:unit_seconds",  # its cost model's luca_steps and route_module_images
    embedding="TOSCA's calibrated [CLS] under the routed module",
    split_kept=split_kept,
)
