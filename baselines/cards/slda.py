"""SLDA's card: its settings (:class:`SLDAConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them without
loading the method (``baselines/slda.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard, closed_form_head
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work


@dataclass(frozen=True)
class SLDAConfig:
    """Defaults: Avalanche ``StreamingLDA.__init__``."""

    shrinkage: float = 1e-4  # shrinkage_param=1e-4: Sigma -> (1 - eps) Sigma + eps I before the inverse
    streaming_update_sigma: bool = True  # streaming_update_sigma=True: the covariance keeps learning (plastic)
    sigma_update: Literal["exact", "reference"] = "exact"  # "reference": fit()'s update (see the deviations)
    # How the statistics start. "streaming": the first task's samples are absorbed one by one like every later one,
    # from zero means and covariance (Avalanche's StreamingLDA, and the authors' README's "start streaming from
    # scratch"). "oas": the authors' experiment (tyler-hayes/Deep_SLDA experiment.py, StreamingLDA.fit_base): the
    # first task's samples taken at once, its class means and counts, and the covariance the OAS-shrunk estimate
    # (scikit-learn OAS(assume_centered=True)) of the within-class residuals, counted as that many samples; the
    # later tasks stream. The default stays "streaming": it is the reference these defaults follow, what a user of
    # Avalanche gets, and the protocol of clbench's recorded SLDA results.
    init: Literal["streaming", "oas"] = "streaming"

    def __post_init__(self) -> None:
        if not 0.0 <= self.shrinkage <= 1.0:
            raise ValueError(f"shrinkage must be in [0, 1], got {self.shrinkage}")
        if self.sigma_update not in ("exact", "reference"):
            raise ValueError(f"sigma_update must be 'exact' or 'reference', got {self.sigma_update!r}")
        if self.init not in ("streaming", "oas"):
            raise ValueError(f"init must be 'streaming' or 'oas', got {self.init!r}")


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the whole embedded benchmark at 56 px (the
# shared CI feature cache), the reference's defaults; it runs in about a second on cached features.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": {**CI_INPUT},
}


def param_formula(cfg: SLDAConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Added: d + 1 head numbers per class (W column and c); stored: d + 1 per class (mean and count) and the
    covariance (d^2) in task 0; nothing is trained."""
    return ParamCounts(
        added_per_task=[(d + 1) * c for c in task_sizes],
        stored_per_task=[(d + 1) * c + (d * d if t == 0 else 0) for t, c in enumerate(task_sizes)],
        trainable_per_task=[0] * len(task_sizes),
        head=(d + 1) * sum(task_sizes),
        extra={"feature_width": d},
    )


def work(cfg: SLDAConfig, shape: RunShape) -> Work:
    """No training pass. Every image once through the frozen backbone (training images for the statistics,
    test images for prediction), all of it from clbench's feature cache. Not counted: the d x d linear algebra
    (a rank-N update and one d^3 / 3 Cholesky per task), milliseconds at d = 384."""
    return Work.cached_features(shape)


# `clbench tune`: the covariance shrinkage, on a log scale (the reference fixes 1e-4)
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"shrinkage": (1e-6, 0.5, True)}


# Learned: the head solved in closed form (d weights and a bias per class); stored: the class means (d per class), the
# class counts (1 per class) and the shared covariance (d^2, in task 0).
split_kept = closed_form_head("feature_width")


CARD = MethodCard(
    "slda",
    SLDAConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing: streaming LDA, class means and one shared covariance",
    tune_space=TUNE_SPACE,
    perf_benchmarks={"slda-growth": "baselines.slda:GROWTH"},
    split_kept=split_kept,
)
