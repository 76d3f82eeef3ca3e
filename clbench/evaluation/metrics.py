"""Metrics of class-incremental learning: pure functions of accuracy matrices and predictions.

Definitions (printed in every report, see :data:`DEFINITIONS`; each metric's name, kind, unit, definition and gate
rule are declared once in :mod:`clbench.evaluation.declared`, from which :data:`DEFINITIONS` is derived):

- ``R[t][j]``: top-1 accuracy (percent) on task ``j``'s test classes after learning task ``t`` (``j <= t``),
  predicting over all classes seen so far (class-incremental: no task id is given).
- ``A_t``: top-1 accuracy on the test images of all classes seen after task ``t``. It weights tasks by
  their number of test images, so it is computed from predictions, not as a mean of ``R[t]``.
- ``last_acc = A_T``; ``avg_acc`` (average incremental accuracy, PILOT's "Average Accuracy") ``= mean_t A_t``.
- ``forgetting`` (Chaudhry et al. 2018, as in PILOT): mean over old tasks ``j < T`` of
  ``max_{t<T} R[t][j] - R[T][j]``. Avalanche's "forgetting" is first minus last instead; we report that as
  ``forgetting_first_last`` so the two are never confused.
- ``bwt`` (backward transfer, Lopez-Paz and Ranzato 2017, GEM): mean over old tasks ``j < T`` of
  ``R[T][j] - R[j][j]``; negative when learning later tasks hurt earlier ones (it is ``-forgetting_first_last``).
- ``ece`` (expected calibration error, Guo et al. 2017) of the final model: test images binned by their top-1 confidence
  into 15 equal-width bins of (0, 1]; the image-weighted mean over bins of ``|accuracy - mean confidence|``, in points.
- Intervals (:mod:`clbench.evaluation.stats`): a record's ``last_acc_ci`` / ``avg_acc_ci`` are 95 % percentile intervals
  of a bootstrap over test images resampled within each class (2,000 resamples, a fixed seed). Reports recompute theirs
  from the predictions: 10,000 resamples (by test batch for a batch-coupled protocol) and, over seeds, the seed-level
  interval (a t interval over seeds combined with the shared test-image noise), not the hierarchical bootstrap the
  ``last_acc_ci / avg_acc_ci`` entry still names: that text is what every record stores, so it stays as it was (a
  changed text would mark every record as redefined); ``report intervals`` says what reports print.
- ``task-aware`` accuracy (Mammoth's Task-IL beside its Class-IL): the prediction when each test image's task is
  given. Class scenario: the argmax of the logits restricted to the classes of the image's task
  (:func:`task_aware_prediction`); it equals the task-agnostic accuracy where a run has one task. Their gap
  separates "confuses classes within a task" from "does not know which task".

Domain-incremental scenario (``--scenario domain``, :data:`DOMAIN_DEFINITIONS`): task ``t`` brings every class of
the benchmark in domain ``t``, and the label space holds every class from the first task on. The same functions
apply with tasks read as domains: ``R[t][d]`` is the accuracy on domain ``d``'s test images (``d <= t``) over every
class; ``A_t`` covers the test images of domains ``0..t``; ``forgetting`` / ``bwt`` are means over old domains.
Task-aware accuracy there is the prediction of the image's own domain's module, for a method that keeps one per
domain (:meth:`clbench.methods.contract.Strategy.predict_given_task`); for every other method it equals the
task-agnostic accuracy, since every task holds the same classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clbench.evaluation.declared import glossary

# The glossary every record stores and every report prints, derived from the metrics' declarations
# (clbench.evaluation.declared): a term's text is what records compare, so a changed text marks records as redefined.
DEFINITIONS: dict[str, str] = glossary("class")
ECE_BINS = 15
DOMAIN_DEFINITIONS: dict[str, str] = glossary("domain")


def definitions(scenario: str = "class") -> dict[str, str]:
    """The definitions a record of ``scenario`` carries and a report prints under its tables (the class
    scenario's: :data:`DEFINITIONS`, which every record has stored)."""
    return dict(DOMAIN_DEFINITIONS if scenario == "domain" else DEFINITIONS)


def task_aware_prediction(logits: np.ndarray, task_classes: np.ndarray | None = None) -> np.ndarray:
    """The argmax of ``logits`` (N, C) over the classes ``task_classes`` (N, C, bool) marks for each row: the classes
    of the image's task. None: the plain argmax (every class is in every task, or the logits are already the
    image's task's module's). A row with no class marked falls back to the plain argmax."""
    logits = np.asarray(logits, dtype=np.float64)
    if task_classes is None:
        return logits.argmax(axis=1)
    mask = np.asarray(task_classes, dtype=bool)
    if mask.shape != logits.shape:
        raise ValueError(f"task_classes has shape {mask.shape}, the logits {logits.shape}")
    masked = np.where(mask, logits, -np.inf)
    empty = ~mask.any(axis=1)
    masked[empty] = logits[empty]
    return masked.argmax(axis=1)


def accuracy(pred: np.ndarray, target: np.ndarray) -> float:
    """Percentage of ``pred == target``; NaN for an empty set."""
    pred, target = np.asarray(pred), np.asarray(target)
    if target.size == 0:
        return float("nan")
    return float((pred == target).mean() * 100.0)


def topk_accuracy(logits: np.ndarray, target: np.ndarray, k: int = 5) -> float:
    """Percentage of samples whose target is among the ``k`` highest logits (all of them if fewer)."""
    logits = np.asarray(logits)
    if logits.shape[0] == 0:
        return float("nan")
    k = min(k, logits.shape[1])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return float((top == np.asarray(target)[:, None]).any(axis=1).mean() * 100.0)


def task_row(pred: np.ndarray, target: np.ndarray, sample_task: np.ndarray, n_tasks_seen: int) -> list[float]:
    """One row of the accuracy matrix: accuracy per task ``0..n_tasks_seen-1``."""
    return [accuracy(pred[sample_task == j], target[sample_task == j]) for j in range(n_tasks_seen)]


def last_acc(curve: Sequence[float]) -> float:
    return float(curve[-1])


def avg_acc(curve: Sequence[float]) -> float:
    return float(np.mean(curve))


def _lower_triangle(matrix: Sequence[Sequence[float]]) -> np.ndarray:
    """Square float array from a ragged lower-triangular matrix, NaN above the diagonal."""
    n = len(matrix)
    out = np.full((n, n), np.nan)
    for t, row in enumerate(matrix):
        if len(row) != t + 1:
            raise ValueError(f"accuracy matrix row {t} has {len(row)} entries, expected {t + 1}")
        out[t, : t + 1] = row
    return out


def forgetting(matrix: Sequence[Sequence[float]]) -> float:
    """Chaudhry/PILOT forgetting: mean over old tasks of (best earlier accuracy - final accuracy).

    NaN when there is only one task (nothing can be forgotten).
    """
    r = _lower_triangle(matrix)
    n = r.shape[0]
    if n < 2:
        return float("nan")
    drops = [np.nanmax(r[j : n - 1, j]) - r[n - 1, j] for j in range(n - 1)]
    return float(np.mean(drops))


def forgetting_first_last(matrix: Sequence[Sequence[float]]) -> float:
    """Avalanche-style forgetting: mean over old tasks of (accuracy right after learning it - final)."""
    r = _lower_triangle(matrix)
    n = r.shape[0]
    if n < 2:
        return float("nan")
    return float(np.mean([r[j, j] - r[n - 1, j] for j in range(n - 1)]))


def bwt(matrix: Sequence[Sequence[float]]) -> float:
    """Backward transfer (Lopez-Paz and Ranzato 2017): mean over old tasks of (final - just after learning it).
    NaN with one task."""
    r = _lower_triangle(matrix)
    n = r.shape[0]
    if n < 2:
        return float("nan")
    return float(np.mean([r[n - 1, j] - r[j, j] for j in range(n - 1)]))


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error in points: images binned by confidence into ``bins`` equal-width bins of (0, 1]
    (a confidence of exactly k/bins falls in bin k-1), the image-weighted mean of |accuracy - mean confidence|."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        return float("nan")
    which = np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)
    gap = np.bincount(which, weights=correct - confidence, minlength=bins)  # per bin: sum(correct - confidence)
    return float(np.abs(gap).sum() / confidence.size * 100.0)
