"""SimpleCIL's card: its settings (:class:`SimpleCILConfig`, the defaults its reference uses), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/simplecil.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import QUICK_INPUT, MethodCard, all_stored
from clbench.core.config import CI_INPUT
from clbench.core.costs import ParamCounts, RunShape, Work


@dataclass(frozen=True)
class SimpleCILConfig:
    """SimpleCIL has no hyperparameters beyond the backbone; kept for the uniform --set interface."""


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the embedded benchmark at 56 px (4x4
# patches of 14 px) so that every CI run shares one feature cache and the whole gate fits in 8 minutes on 2 cores.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": dict(QUICK_INPUT),
    "ci": dict(CI_INPUT),
}


def param_formula(cfg: SimpleCILConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    return ParamCounts(
        added_per_task=[0] * len(task_sizes),
        stored_per_task=[c * d for c in task_sizes],
        trainable_per_task=[0] * len(task_sizes),
        head=sum(task_sizes) * d,
    )  # one prototype row per class (a class mean: stored); nothing is learned


def work(cfg: SimpleCILConfig, shape: RunShape) -> Work:
    """No training pass (nothing is trained). Every image once through the frozen backbone (train for the prototypes,
    test for prediction), all of it from clbench's feature cache, which shares it across seeds and strategies."""
    return Work.cached_features(shape)


split_kept = all_stored  # the prototypes are class means: stored, not learned


CARD = MethodCard(
    "simplecil",
    SimpleCILConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="closed-form",
    trains="nothing: one prototype (class mean) per class",
    gate_scenarios=("class", "domain"),  # the gate pins its domain-incremental path too
    split_kept=split_kept,
)
