"""Every metric a record stores, declared once: its name, whether it is a per-task series or a final value, its
definition in each scenario, its unit, how the regression gate compares it, whether the checkpoint's log keeps it
per task and whether a report's summary averages it over seeds.

The rest is derived from :data:`METRICS`: the glossary that records store and reports print
(:data:`clbench.evaluation.metrics.DEFINITIONS`, :func:`glossary`), the metrics a gate reference pins
(:data:`clbench.gate.reference.STORED_METRICS`) and the tolerance each is checked with, the rows the checkpoint's
protocol log holds (:data:`LOGGED`, named as the record names them), the metrics a report's summary averages over
seeds (:data:`SUMMARISED`) and the list of summary fields that are metrics (:data:`NAMES`). Adding a metric takes
its declaration here, its typed field in the record (:class:`clbench.records.schema.ProtocolSummary`, which keeps
its JSON check beside its type) and the code that computes it; ``tests/test_declared_metrics.py`` checks that the
three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["per-task", "final"]  # one value after each task (a curve; the matrix: one row) | one for the run


@dataclass(frozen=True)
class Term:
    """One entry of the glossary: a term and what it means in each scenario (the domain scenario's text where it
    differs from the class scenario's)."""

    term: str
    definition: str
    domain_definition: str | None = None


@dataclass(frozen=True)
class GateRule:
    """How the regression gate compares a metric with a reference entry: within ``times`` the entry's tolerance
    ``tolerance`` (a field of :class:`clbench.gate.tolerances.Tolerance`), in points, either direction."""

    tolerance: Literal["matrix", "last_acc", "avg_acc"]
    times: float = 1.0
    # pinned as the entry's own field with its own tolerance (the matrix, final and average accuracy), not among
    # the entry's ``metrics``
    own_field: bool = False
    # a reference rewrite's summary lists its old and new value (clbench.gate.reference.reference_changes)
    listed_on_rewrite: bool = False

    def allowed(self, tolerances: object) -> float:
        """Points the metric may move under ``tolerances`` (a :class:`~clbench.gate.tolerances.Tolerance`)."""
        return float(getattr(tolerances, self.tolerance)) * self.times


@dataclass(frozen=True)
class Metric:
    """One metric of a protocol's summary."""

    name: str  # the record's field (ProtocolSummary), and the checkpoint log's where it is logged
    kind: Kind
    unit: str  # "percent", "points" (a difference of two accuracies), "percent interval" ([low, high])
    # the glossary entry that defines it; metrics defined together (old_acc and new_acc) share one, which the first
    # of them declares; None: not in the glossary (records store the glossary; see top5_curve)
    term: Term | None
    gate: GateRule | None  # None: not pinned by the gate
    logged: bool = False  # the checkpoint's protocol log keeps one entry per task under ``name``
    # a report's summary (summary.csv) gives its mean and standard deviation over seeds, as <name>_mean, <name>_std
    summarised: bool = False
    # glossary terms that are no metric of a record, printed after this metric's (how reports compute intervals)
    notes: tuple[Term, ...] = ()


_OLD_NEW = Term(
    "old_acc / new_acc",
    "accuracy after task t on classes of earlier tasks / of task t",
    "accuracy after task t on the test images of earlier domains / of domain t",
)
_INTERVALS = Term(
    "last_acc_ci / avg_acc_ci",
    "95 % interval: bootstrap over test images resampled within each class, 2,000 "
    "resamples; over seeds: hierarchical bootstrap (seeds, then images)",
)
_TASK_AWARE = Term(
    "task-aware",
    "accuracy when each test image's task is given: the argmax restricted to the classes of its task "
    "(Mammoth's Task-IL); with one task, the task-agnostic accuracy",
    "the prediction of the image's own domain's module where a method keeps one per "
    "domain (domain given); for every other method the task-agnostic accuracy (every domain has every class)",
)
_MATRIX = GateRule("matrix")

# In the order of the record's fields (ProtocolSummary), which is the glossary's order.
METRICS: tuple[Metric, ...] = (
    Metric(
        "accuracy_matrix",
        "per-task",
        "percent",
        Term(
            "R[t][j]",
            "top-1 accuracy (%) on task j's test classes after learning task t, over all seen classes (no task id)",
            "top-1 accuracy (%) on domain j's test images after learning domain t, over every class (no domain id)",
        ),
        GateRule("matrix", own_field=True),
        logged=True,
    ),
    Metric(
        "acc_curve",
        "per-task",
        "percent",
        Term(
            "A_t",
            "top-1 accuracy (%) on the test images of all classes seen after task t",
            "top-1 accuracy (%) on the test images of the domains seen after task t",
        ),
        _MATRIX,
        logged=True,
    ),
    Metric(
        "last_acc",
        "final",
        "percent",
        Term("last_acc", "A_T, accuracy after the last task"),
        GateRule("last_acc", own_field=True),
        summarised=True,
    ),
    Metric(
        "avg_acc",
        "final",
        "percent",
        Term("avg_acc", "average incremental accuracy: mean over tasks t of A_t"),
        GateRule("avg_acc", own_field=True),
        summarised=True,
    ),
    Metric(
        "forgetting",
        "final",
        "points",
        Term(
            "forgetting",
            "mean over old tasks j of (max_{t<T} R[t][j] - R[T][j]) (Chaudhry et al.; PILOT)",
            "mean over old domains j of (max_{t<T} R[t][j] - R[T][j]) (Chaudhry et al.)",
        ),
        GateRule("matrix", times=2, listed_on_rewrite=True),  # a difference of two matrix entries
        summarised=True,
    ),
    Metric(
        "forgetting_first_last",
        "final",
        "points",
        Term(
            "forgetting_first_last",
            "mean over old tasks j of (R[j][j] - R[T][j]) (Avalanche's definition)",
            "mean over old domains j of (R[j][j] - R[T][j]) (Avalanche's definition)",
        ),
        GateRule("matrix", times=2),
    ),
    Metric("old_acc", "per-task", "percent", _OLD_NEW, _MATRIX, logged=True),
    Metric("new_acc", "per-task", "percent", _OLD_NEW, _MATRIX, logged=True),
    # Not in the glossary: records store the glossary and reports print it, and it has never held top-5 accuracy
    # (top-5 accuracy after task t over every seen class, in percent).
    Metric("top5_curve", "per-task", "percent", None, _MATRIX, logged=True),
    Metric(
        "bwt",
        "final",
        "points",
        Term(
            "bwt",
            "backward transfer: mean over old tasks j of (R[T][j] - R[j][j]) (Lopez-Paz and Ranzato, GEM)",
            "backward transfer: mean over old domains j of (R[T][j] - R[j][j]) (Lopez-Paz and Ranzato, GEM)",
        ),
        GateRule("matrix", times=2, listed_on_rewrite=True),
    ),
    Metric(
        "ece",
        "final",
        "points",
        Term(
            "ece",
            "expected calibration error of the final model, 15 equal-width confidence bins, in points (Guo et al.)",
        ),
        GateRule("matrix", listed_on_rewrite=True),
        summarised=True,
    ),
    Metric("last_acc_ci", "final", "percent interval", _INTERVALS, GateRule("last_acc")),
    Metric(
        "avg_acc_ci",
        "final",
        "percent interval",
        _INTERVALS,
        GateRule("avg_acc"),
        notes=(
            Term(
                "report intervals",
                "reports: 95 % intervals from 10,000 resamples (one run: within classes; a batch-coupled "
                "protocol: by whole test batches); several seeds: t interval over the seeds combined with the "
                "test-image noise they share (clbench.evaluation.stats.seed_level); one decimal",
            ),
        ),
    ),
    Metric("task_aware_curve", "per-task", "percent", _TASK_AWARE, None, logged=True),
    Metric("task_aware_last", "final", "percent", _TASK_AWARE, None),
)
BY_NAME = {m.name: m for m in METRICS}
NAMES = tuple(BY_NAME)

# The domain scenario's one term of its own, after every metric's.
SCENARIO = Term(
    "scenario",
    "domain-incremental: task t brings every class in domain t; every class is in the label space from the first "
    "task on",
)

# What the gate pins in an entry's ``metrics`` (the rest of the pinned metrics are the entry's own fields).
GATE_STORED = tuple(m.name for m in METRICS if m.gate is not None and not m.gate.own_field)
# The pinned metrics whose moves a reference rewrite lists by value.
GATE_LISTED = tuple(m.name for m in METRICS if m.gate is not None and m.gate.listed_on_rewrite)
# The checkpoint log's per-task rows, by their record names.
LOGGED = tuple(m.name for m in METRICS if m.logged)
# The final values a report's summary gives as mean and standard deviation over seeds.
SUMMARISED = tuple(m.name for m in METRICS if m.summarised)


def glossary(scenario: str = "class") -> dict[str, str]:
    """Term -> definition, in the order records store and reports print them, for ``"class"`` or ``"domain"``."""
    domain = scenario == "domain"
    out: dict[str, str] = {}
    for m in METRICS:
        for t in (m.term, *m.notes) if m.term is not None else m.notes:
            if t.term not in out:
                out[t.term] = t.domain_definition if domain and t.domain_definition else t.definition
    if domain:
        out[SCENARIO.term] = SCENARIO.definition
    return out
