"""FeCAM's card: its settings (:class:`FeCAMConfig`, the defaults its reference uses), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/fecam.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard, all_stored
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work


@dataclass(frozen=True)
class FeCAMConfig:
    """Defaults: the authors' ``FeCAM_vit_cifar100.py`` (frozen ViT-B/16 IN-21k, CIFAR-100 B10 Inc10)."""

    alpha1: float = 1.0  # FeCAM_vit_cifar100.py shrink_cov: alpha1 = 1 (x the mean variance, on the diagonal)
    alpha2: float = 0.0  # FeCAM_vit_cifar100.py shrink_cov: alpha2 = 0 (x the mean covariance, off the diagonal)
    norm_cov: bool = True  # FeCAM_vit_cifar100.py normalize_cov; exps/FeCAM_cifar100.json "norm_cov": true
    tukey: bool = False  # the ViT scripts transform nothing; exps/FeCAM_cifar100.json "tukey": true (ResNet)
    beta: float = 0.5  # exps/FeCAM_cifar100.json "beta": 0.5 (models/base.py _tukeys_transform; 0 = log)
    rule: Literal["authors", "pilot"] = "authors"  # "pilot": PILOT models/fecam.py replace_fc's covariance rule
    pilot_alpha: float = 100.0  # PILOT models/fecam.py: self.alpha = 100 (rule="pilot" only)

    def __post_init__(self) -> None:
        if self.rule not in ("authors", "pilot"):
            raise ValueError(f"rule must be 'authors' or 'pilot', got {self.rule!r}")
        for name in ("alpha1", "alpha2", "pilot_alpha"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta}")
        if self.tukey and self.rule == "pilot":
            raise ValueError("tukey: PILOT's rule has no Tukey transform (use rule='authors' with tukey=true)")


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the embedded benchmark at 56 px (the
# shared CI feature cache), all 6 tasks and every training image: nothing is trained, the run takes seconds.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": {**CI_INPUT},
}


def param_formula(cfg: FeCAMConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Nothing learned or trained; stored per class: its mean (d) and its precision matrix (d^2), which together
    are the classifier (``head``)."""
    stored = [c * (d + d * d) for c in task_sizes]
    return ParamCounts(
        added_per_task=[0] * len(task_sizes),
        stored_per_task=stored,
        trainable_per_task=[0] * len(task_sizes),
        head=sum(stored),
    )


def work(cfg: FeCAMConfig, shape: RunShape) -> Work:
    """No training pass. Every image once through the frozen backbone (training images for the statistics, test
    images for prediction), all of it from clbench's feature cache. Not counted: the per-class d x d algebra
    (a Cholesky inverse per class, d^3 / 3 flops each, and 2 d^2 flops per test image and seen class), which has
    no unit in the projection; ``fecam-growth`` measures it."""
    return Work.cached_features(shape)


# `clbench tune`: the two shrinkages of the covariance (diagonal and off-diagonal). Not Tukey's transform: it needs
# non-negative features and a ViT's [CLS] features are signed. alpha1 from 0.1: at 0.02 to 0.16 a class's shrunk
# covariance (about 50 images in 384 dimensions on the embedded benchmark) was singular in a study, and such a
# trial fails (reports/tuning/README.md counts them)
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"alpha1": (0.1, 10.0, True), "alpha2": (0.0, 1.0)}


split_kept = all_stored  # means and precision matrices: statistics


CARD = MethodCard(
    "fecam",
    FeCAMConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing: class means and one shrunk covariance per class",
    tune_space=TUNE_SPACE,
    perf_benchmarks={"fecam-growth": "baselines.fecam:GROWTH"},
    embedding="FeCAM's Tukey-transformed, normalised features",
    min_train_per_class=2,  # a class covariance needs 2 images
    split_kept=split_kept,
)
