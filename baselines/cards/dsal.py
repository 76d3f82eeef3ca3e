"""DSAL's card: its settings (:class:`DSALConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them without
loading the method (``baselines/dsal.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.layers.checks import check_analytic_fields


@dataclass(frozen=True)
class DSALConfig:
    """Defaults: ``config.py`` of the reference (its argparse defaults) and ``DSAL.__init__``."""

    M: int = 8192  # buffer size, --buffer-size / --expansion-size 8192 (README: CIFAR-100; 16384 on ImageNet-1k)
    gamma: float = 0.1  # --gamma / --gamma-main 0.1: the main stream's regularisation
    gamma_comp: float = 0.1  # --gamma-comp 0.1: the compensation stream's regularisation
    compensation_ratio: float = 1.0  # -C / --compensation-ratio 1 (README: 0.6 CIFAR-100, 1.5 ImageNet-1k)
    residue: Literal["task", "batch"] = "task"  # "task": the paper; "batch": the reference's per-IL-batch residue
    il_batch_size: int = 4096  # --IL-batch-size 4096 in every README command
    eval_batch_size: int = 4096  # rows per prediction block; memory only
    solver: str = "auto"  # clbench: the dual form while it is the cheaper form; "recursive": the reference's

    def __post_init__(self) -> None:
        check_analytic_fields(self)
        if not self.gamma_comp > 0:
            raise ValueError(f"gamma_comp must be > 0 (R starts at I / gamma_comp), got {self.gamma_comp}")
        if not math.isfinite(self.compensation_ratio):
            raise ValueError(f"compensation_ratio must be finite, got {self.compensation_ratio}")
        if self.residue not in ("task", "batch"):
            raise ValueError(f"residue must be 'task' or 'batch', got {self.residue!r}")


# ``ci``: the regression gate's run: the embedded benchmark at 56 px (the shared CI feature cache), the
# reference's gammas and C, and a buffer of 2048 (two 2048 x 2048 float64 R, so the run takes a few seconds).
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": {**CI_INPUT, "M": 2048},
}


def extra_counts(cfg: DSALConfig, d: int) -> dict[str, Any]:
    """The method's own counts in ``ParamCounts.extra`` (the live count's and the formula's)."""
    M = cfg.M
    return {"M": M, "feature_width": d, "buffer_weights": d * M, "autocorrelation_floats": 2 * M * M}


def param_formula(cfg: DSALConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Learned: both streams' weights, 2 M per class (solved in closed form); stored in task 0: the fixed random
    buffer W_b (d M) and the two R (2 M^2); nothing is trained by an optimiser."""
    M = cfg.M
    return ParamCounts(
        added_per_task=[2 * M * n for n in task_sizes],
        stored_per_task=[(d * M + 2 * M * M if t == 0 else 0) for t in range(len(task_sizes))],
        trainable_per_task=[0] * len(task_sizes),
        head=2 * M * sum(task_sizes),
        extra=extra_counts(cfg, d),
    )


def work(cfg: DSALConfig, shape: RunShape) -> Work:
    """No pass through the ViT beyond clbench's feature cache: every training image and every test image once
    (frozen [CLS] features, eval transform), all cacheable, as SimpleCIL. Not counted: the buffer-size
    dependent linear algebra (8 n M^2 float64 flops per n training images, two streams), which has no unit in
    the committed projection costs; measured in ``reports/perf/dsal-growth.json``."""
    return Work.cached_features(shape)


# `clbench tune`: both streams' regularisation, the buffer width and the compensation ratio
TUNE_SPACE: dict[str, tuple[Any, ...]] = {
    "gamma": (1e-4, 100.0, True),
    "gamma_comp": (1e-4, 100.0, True),
    "M": (512, 16384, True),
    "compensation_ratio": (0.0, 2.0),
}


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Learned: 2 M per class (both streams); stored: W_b and both R in task 0."""
    M, d = int(extra["M"]), int(extra["feature_width"])
    return [2 * M * c for c in task_sizes], [(d * M + 2 * M * M if t == 0 else 0) for t in range(len(task_sizes))]


CARD = MethodCard(
    "dsal",
    DSALConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing by gradient: two least-squares heads (main and compensation)",
    tune_space=TUNE_SPACE,
    perf_benchmarks={"dsal-growth": "baselines.dsal:GROWTH"},
    embedding="DS-AL's buffer layer ReLU(f W_b)",
    split_kept=split_kept,
)
