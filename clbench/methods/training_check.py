"""The under-training detector: how far training moved a strategy's trained parts, and whether that
changed what it predicts.

A run whose trained parts barely leave their initial values measures the frozen backbone, not the method (a CPU
budget of a few epochs on a small first task does this to first-session methods). Two measurements, both generic
(no method name, nothing a strategy has to declare):

- **Relative change per task** (:meth:`clbench.methods.shared.TrainingTrace.relative_change`): every tensor an optimizer
  steps through :func:`clbench.methods.shared.optimizer_step` during ``learn_task`` is copied just before its first step
  of the task, and after the task ``||after - before|| / ||before||`` is taken over all of them together. ``None``
  where no optimizer stepped (a task that trains nothing, e.g. SimpleCIL, or RanPAC's and APER's later tasks).
- **Reset share** (:func:`reset_share`, first task only): the same strategy, built afresh with its training epochs
  set to 0 (so its trained parts keep their initial values, while prototypes, heads and statistics are computed as
  usual from them), learns the first task from the same global RNG states as the trained one (same initial
  values); the share of the first task's test images whose predicted class differs from the trained strategy's is
  recorded. The caller's RNG state is put back afterwards, so the run's own results do not change.

The warning (:func:`warning`) fires when the reset share is below :data:`RESET_SHARE_MIN` or, where no reset share
was measured, when every measured relative change is below :data:`CHANGE_MIN`. Thresholds from measurements on
the embedded benchmark (the ``quick`` records): APER's adapters at 3 epochs change no prediction of the first task
(SimpleCIL's predictions to the image), DualPrompt's E-prompt at 2 epochs changes 0.9 %; trained runs change
several percent and more.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from clbench.core.rng import RngState
    from clbench.methods.contract import Split, Strategy, Task

RESET_SHARE_MIN = 0.02  # below: training changed fewer than 2 % of the first task's predictions
CHANGE_MIN = 1e-3  # below: the trained parts moved by less than 0.1 % of their norm
EPOCH_FIELDS = ("epochs",)  # config fields that set the training epochs of every task (0: nothing trains)


def untrained_config(cfg: Any) -> Any | None:
    """A copy of a strategy config with its training epochs set to 0; None where the config has no epochs field.
    Field validation is not run again: the copy is never shown or recorded, only used by :func:`reset_share`."""
    if not dataclasses.is_dataclass(cfg) or not any(hasattr(cfg, f) for f in EPOCH_FIELDS):
        return None
    twin = copy.copy(cfg)
    for name in EPOCH_FIELDS:
        if hasattr(twin, name):
            object.__setattr__(twin, name, 0)
    return twin


def reset_share(
    strategy: Strategy[Any],
    task: Task,
    test: Split,
    protocol: str,
    trained: torch.Tensor,
    rng_at_build: RngState | None = None,
    rng_before_task: RngState | None = None,
) -> float | None:
    """Share of ``test`` images (the first task's) whose predicted class changes when the strategy learns the first
    task with its trained parts left at their initial values. ``trained``: the trained strategy's logits on ``test``.
    ``rng_at_build`` / ``rng_before_task``: the global RNG states when the trained strategy was built and when it
    started the first task, so that the twin draws the same initial values (a strategy that trained with lr 0
    gives a share of exactly 0). None where the strategy's config has no epochs field."""
    # deferred: loads numpy, which importing this module does not
    from clbench.core.rng import capture_rng, restore_rng

    cfg = untrained_config(strategy.cfg)
    if cfg is None:
        return None
    ctx = dataclasses.replace(strategy.ctx, log=lambda message: None, progress=None)
    state = capture_rng()
    try:
        if rng_at_build is not None:
            restore_rng(rng_at_build)
        twin = type(strategy)(cfg, ctx)
        if rng_before_task is not None:
            restore_rng(rng_before_task)
        twin.learn_task(task)
        logits = twin.predict(test, protocol)
    finally:
        restore_rng(state)
    changed = (logits.argmax(dim=1) != trained.argmax(dim=1)).float().mean()
    return float(changed)


def warning(reset: float | None, changes: list[float | None]) -> str | None:
    """The record's ``training_warning``, or None when training visibly moved the strategy."""
    if reset is not None:
        if reset < RESET_SHARE_MIN:
            return (
                f"training barely changed the predictions: resetting the first task's trained parts to their initial "
                f"values changes {100 * reset:.1f} % of its test predictions (< {100 * RESET_SHARE_MIN:.0f} %); "
                f"this run measures the frozen backbone more than the method (train longer: more epochs or steps)"
            )
        return None
    measured = [c for c in changes if c is not None]
    if measured and max(measured) < CHANGE_MIN:
        return (
            f"the trained parts barely moved (largest relative change {max(measured):.2e} < {CHANGE_MIN:.0e}); "
            f"this run measures the frozen backbone more than the method (train longer: more epochs or steps)"
        )
    return None
