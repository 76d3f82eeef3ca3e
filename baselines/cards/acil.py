"""ACIL's card: its settings (:class:`ACILConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them without
loading the method (``baselines/acil.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.layers.checks import check_analytic_fields


@dataclass(frozen=True)
class ACILConfig:
    """Defaults: ``config.py`` of the reference (its argparse defaults, which the README's commands keep)."""

    M: int = 8192  # buffer size, --buffer-size 8192 (README: CIFAR-100; 16384 on ImageNet-1k)
    gamma: float = 0.1  # --gamma 0.1 (README: "On both CIFAR-100 and ImageNet-1k, gamma is 0.1")
    il_batch_size: int = 4096  # --IL-batch-size 4096 in every README command; memory only for ACIL
    eval_batch_size: int = 4096  # rows per prediction block (the README's IL batch size); memory only
    solver: str = "auto"  # clbench: the dual form while it is the cheaper form; "recursive": the reference's

    def __post_init__(self) -> None:
        check_analytic_fields(self)


# ``ci``: the regression gate's run: the embedded benchmark at 56 px (the shared CI feature cache), the
# reference's gamma and a buffer of 2048 (one 2048 x 2048 float64 R, so the run takes about a second).
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": {**CI_INPUT, "M": 2048},
}


def extra_counts(cfg: ACILConfig, d: int) -> dict[str, Any]:
    """The method's own counts in ``ParamCounts.extra`` (the live count's and the formula's)."""
    M = cfg.M
    return {"M": M, "feature_width": d, "buffer_weights": d * M, "autocorrelation_floats": M * M}


def param_formula(cfg: ACILConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Learned: the analytic classifier W, M weights per class (solved in closed form); stored in task 0: the
    fixed random buffer W_b (d M) and R (M^2, the regularised inverse autocorrelation of the expanded
    features); nothing is trained by an optimiser."""
    M = cfg.M
    return ParamCounts(
        added_per_task=[M * n for n in task_sizes],
        stored_per_task=[(d * M + M * M if t == 0 else 0) for t in range(len(task_sizes))],
        trainable_per_task=[0] * len(task_sizes),
        head=M * sum(task_sizes),
        extra=extra_counts(cfg, d),
    )


def work(cfg: ACILConfig, shape: RunShape) -> Work:
    """No pass through the ViT beyond clbench's feature cache: every training image and every test image once
    (frozen [CLS] features, eval transform), all cacheable, as SimpleCIL. Not counted: the buffer-size
    dependent linear algebra (4 n M^2 float64 flops per n training images), which has no unit in the committed
    projection costs; measured in ``reports/perf/acil-growth.json``."""
    return Work.cached_features(shape)


# `clbench tune`: the ridge regularisation and the random buffer's width, both on a log scale
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"gamma": (1e-4, 100.0, True), "M": (512, 16384, True)}


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Learned: M per class (W); stored: W_b and R in task 0."""
    M, d = int(extra["M"]), int(extra["feature_width"])
    return [M * c for c in task_sizes], [(d * M + M * M if t == 0 else 0) for t in range(len(task_sizes))]


CARD = MethodCard(
    "acil",
    ACILConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing by gradient: a least-squares head on a fixed random expansion",
    tune_space=TUNE_SPACE,
    perf_benchmarks={"acil-growth": "baselines.acil:GROWTH"},
    embedding="ACIL's buffer layer ReLU(f W_b)",
    split_kept=split_kept,
)
