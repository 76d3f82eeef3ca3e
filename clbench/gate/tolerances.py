"""How far a run may stray from the gate reference: per-metric tolerances in accuracy points.

A reference entry stores its own :class:`Tolerance`; it comes from a measured-spread table (``reports/gate/
tolerances.json``, written by ``reports/gate/spread.py`` from same-seed runs on other CPUs; read by
:func:`load_tolerances`) or, without one, from :data:`DEFAULT_TOLERANCE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from clbench.errors import ClbenchError
from clbench.files.safety import load_json

# Tolerances in points when no measured spread is given for an entry (the same-seed spread is measured per strategy
# and profile by reports/gate/spread.py; see reports/gate/README.md for the figures behind each).
DEFAULT_TOLERANCE = {"matrix": 1.5, "last_acc": 0.5, "avg_acc": 0.5}
TOLERANCE_METRICS = tuple(DEFAULT_TOLERANCE)
# How far a pinned training diagnostic (a loss, a relative parameter change) may move, relative to its pinned value:
# fp32 reruns on one CPU with one or two threads pinned the same values, and two Xeons (with and without AMX) differed
# by at most 4.4e-5 of a value (reports/gate/README.md), while a changed loss, learning rate or parameter set moves
# them by several percent and more.
TRAINING_REL_TOLERANCE = 0.01
MAX_TOLERANCE = 100.0  # points: a tolerance beyond the whole accuracy range would let every result pass


@dataclass(frozen=True)
class Tolerance:
    """Points a mean may move, either direction, before the gate flags it."""

    matrix: float  # each entry R[t][j] of the accuracy matrix
    last_acc: float  # the final accuracy
    avg_acc: float  # the average incremental accuracy

    def to_dict(self) -> dict[str, float]:
        return {m: getattr(self, m) for m in TOLERANCE_METRICS}

    def text(self) -> str:
        return " / ".join(f"{m} {getattr(self, m)}" for m in TOLERANCE_METRICS)


# A table of tolerances (:func:`load_tolerances`; a reference keeps the one its entries came from): ``source`` (the
# file it was read from), then strategy:profile (or ``default``) -> metric -> points.
ToleranceTable: TypeAlias = dict[str, str | dict[str, float]]


def is_tolerance_table(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(x, str)
        if k == "source"
        else isinstance(x, dict) and all(m in TOLERANCE_METRICS and is_tolerance(t) for m, t in x.items())
        for k, x in v.items()
    )


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_tolerance(v: Any) -> bool:
    return is_number(v) and 0 <= v <= MAX_TOLERANCE


def load_tolerances(path: Path) -> ToleranceTable:
    """Per-metric tolerances (points) per ``strategy:profile``, with a ``default``, from a measured-spread summary
    (reports/gate/tolerances.json). Each value must be a number >= 0."""
    data = load_json(path, "tolerances", name=f"--tolerances {path}")
    table = data.get("tolerances") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ClbenchError(f"--tolerances {path}: needs a 'tolerances' object of strategy:profile -> metric -> points")
    for name, tol in table.items():
        if not isinstance(tol, dict):
            raise ClbenchError(f"--tolerances {path}: {name} is not an object of metric -> points")
        for metric, value in tol.items():
            if metric not in TOLERANCE_METRICS:
                raise ClbenchError(
                    f"--tolerances {path}: {name}.{metric} is not a metric; valid: {', '.join(TOLERANCE_METRICS)}"
                )
            if not is_tolerance(value):
                raise ClbenchError(
                    f"--tolerances {path}: {name}.{metric} must be a number from 0 to {MAX_TOLERANCE:g} points "
                    f"(got {value!r:.40})"
                )
    return {"source": str(path), **table}


def tolerance_for(tolerances: ToleranceTable, strategy: str, profile: str | None) -> Tolerance:
    """The tolerance of ``strategy:profile`` in a table: its own values over the table's
    ``default`` over :data:`DEFAULT_TOLERANCE`."""
    name = f"{strategy}:{profile}" if profile else strategy
    tol = dict(DEFAULT_TOLERANCE)
    for block in (tolerances.get("default"), tolerances.get(name)):
        if isinstance(block, dict):
            tol.update(block)
    return Tolerance(**{m: float(tol[m]) for m in TOLERANCE_METRICS})
