"""RanDumb's card: its settings (:class:`RanDumbConfig`, the defaults its reference uses), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/randumb.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import QUICK_INPUT, MethodCard, closed_form_head
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work


@dataclass(frozen=True)
class RanDumbConfig:
    """Defaults: ``src/main.py`` ``parse_args`` and ``scripts/runall.sh``'s runs on pre-trained ViT features."""

    embed: bool = True  # main.py embeds in every run (its branch tests --embed_mode 'RanDumb' only, never --embed)
    M: int = 10000  # --embed_dim default: the random Fourier features' width
    gamma: float = 0.0  # RBFSampler(gamma='scale'), written 0: 1 / (d Var(x)); > 0: that RBF gamma

    def __post_init__(self) -> None:
        if self.M < 1:
            raise ValueError(f"M must be >= 1, got {self.M}")
        if not self.gamma >= 0.0 or math.isinf(self.gamma):
            raise ValueError(f"gamma must be a finite number >= 0 (0 = 'scale'), got {self.gamma}")


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the whole embedded benchmark at 56 px (the
# shared CI feature cache) with M = 1,000 random Fourier features (runall.sh's smallest width) instead of
# 10,000: a few seconds on 2 cores instead of minutes.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": {**CI_INPUT, "M": 1000},
}


def extra_counts(cfg: RanDumbConfig, d: int) -> dict[str, Any]:
    """The method's own counts in ``ParamCounts.extra`` (the live count's and the formula's)."""
    width = cfg.M if cfg.embed else d
    return {
        "feature_width": d,
        "lda_width": width,
        "random_features": (d * width + width) if cfg.embed else 0,
        "covariance_floats": width * width,
    }


def param_formula(cfg: RanDumbConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """W = M with the embedding, d without. Added: W + 1 head numbers per class; stored: W + 1 per class (mean, count),
    and in task 0 the covariance (W^2) and the random features (d M + M, with the embedding); nothing is trained."""
    extra = extra_counts(cfg, d)
    w, first = extra["lda_width"], extra["covariance_floats"] + extra["random_features"]
    return ParamCounts(
        added_per_task=[(w + 1) * c for c in task_sizes],
        stored_per_task=[(w + 1) * c + (first if t == 0 else 0) for t, c in enumerate(task_sizes)],
        trainable_per_task=[0] * len(task_sizes),
        head=(w + 1) * sum(task_sizes),
        extra=extra,
    )


def work(cfg: RanDumbConfig, shape: RunShape) -> Work:
    """No training pass. Every image once through the frozen backbone (training images for the statistics,
    test images for prediction), all of it from clbench's feature cache. Not counted: the W x W linear algebra
    (2 N W^2 flops for a task's covariance update and W^3 / 3 for its Cholesky solve): milliseconds without the
    embedding, seconds per task at M = 10,000 (``reports/perf/randumb-growth.json``)."""
    return Work.cached_features(shape)


# `clbench tune`: the random Fourier features' width and RBF gamma (0: the "scale" rule, so the range starts above it)
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"M": (1000, 20000, True), "gamma": (1e-4, 1.0, True)}


# Learned: the LDA head solved in closed form (W weights and a bias per class); stored: the class means and counts
# (W + 1 per class), the shared covariance (W^2, counted as the W x W statistic it is even while it is held in low-rank
# form, which keeps fewer numbers) and the fixed random features (d M + M), in task 0.
split_kept = closed_form_head("lda_width")


CARD = MethodCard(
    "randumb",
    RanDumbConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing: LDA on random Fourier features, one shared covariance",
    tune_space=TUNE_SPACE,
    perf_benchmarks={"randumb-growth": "baselines.randumb:GROWTH"},
    embedding="RanDumb's random Fourier features",
    min_train_per_class=2,  # a class's OAS covariance needs 2 images
    split_kept=split_kept,
)
