"""The tuning study's table: per method, test accuracy at the reference defaults, with settings tuned on the same
benchmark's validation split, and with settings tuned on another benchmark's, each with its 95% interval, and each
tuned run against the defaults run on the same test images (paired).

Reads the records under ``FOLDER/runs/`` (each a normal run on the test split; a record's ``tuning`` says where its
settings were chosen: none, the benchmark it was tested on, or another) and the studies' ``tuning.json`` for the
validation accuracies. ``python -m clbench.tune.report FOLDER`` prints the Markdown table.

The intervals come from :mod:`clbench.evaluation.stats`: a record's final accuracy interval is the stratified image
bootstrap the run computed (``last_acc_ci``); a tuned run against the defaults run is :func:`stats.paired_test`
(one paired image bootstrap for the interval of the difference and its p, so that the interval excludes 0 exactly
when p < 0.05).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clbench.evaluation import stats
from clbench.records.predictions import correctness, read
from clbench.records.results import load_record
from clbench.records.schema import RunRecord


@dataclass(frozen=True)
class Cell:
    """One (method, condition) run: its record and folder."""

    record: RunRecord
    folder: Path

    @property
    def tuning(self) -> dict[str, Any] | None:
        """How the run's settings were chosen (its record's ``tuning``), as a plain dict."""
        return None if self.record.tuning is None else dict(self.record.tuning)

    @property
    def condition(self) -> str:
        t = self.tuning
        if t is None:
            return "defaults"
        same = t.get("tuning_bench") == self.record.bench and t.get("tuning_classes") is None
        return "same" if same else "elsewhere"

    @property
    def tuned_on(self) -> str:
        """Where the settings were chosen: a benchmark, or a class subset of one."""
        t = self.tuning or {}
        k = t.get("tuning_classes")
        return f"{t.get('tuning_bench')}'s first {k} classes" if k else str(t.get("tuning_bench"))


def collect(folder: Path) -> dict[str, dict[str, Cell]]:
    """method -> condition -> its run, from ``folder/runs/*/result.json``."""
    out: dict[str, dict[str, Cell]] = {}
    for f in sorted((folder / "runs").glob("*/result.json")):
        cell = Cell(load_record(f), f.parent)
        out.setdefault(cell.record.strategy, {})[cell.condition] = cell
    return out


def _final_correct(cell: Cell) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(test index, class, 0/1 correct) of the final evaluation, in test-index order."""
    rec = cell.record
    if rec.predictions is None:
        raise ValueError(f"{cell.folder}: the record keeps no predictions")
    preds = read(cell.folder, rec.predictions, expect=rec.protocols)
    correct, index, label = correctness(preds, rec.protocol)
    order = np.argsort(index)
    return index[order], label[order], correct[order, -1]


def paired(tuned: Cell, defaults: Cell) -> Any:
    """Tuned minus defaults on the same test images (:func:`clbench.evaluation.stats.paired_test`)."""

    ia, la, a = _final_correct(tuned)
    ib, _, b = _final_correct(defaults)
    if not np.array_equal(ia, ib):
        raise ValueError(f"{tuned.folder} and {defaults.folder} were not evaluated on the same test images")
    return stats.paired_test(a[None, :], b[None, :], la)


def _acc(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    s = cell.record.summary(cell.record.protocol)
    ci = s.last_acc_ci
    return f"{s.last_acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{s.last_acc:.2f}"


def _delta(cell: Cell | None, defaults: Cell | None) -> str:
    if cell is None or defaults is None:
        return "-"
    t = paired(cell, defaults)
    d = t.diff
    p = f"p {t.p:.2g}" if t.p >= 1e-4 else "p < 1e-4"
    return f"{d.value:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}], {p}"


def _settings(cell: Cell | None) -> str:
    if cell is None or cell.tuning is None:
        return "-"
    best = cell.tuning.get("best_settings", {})
    return ", ".join(f"{k}={_short(v)}" for k, v in best.items())


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _validation(cell: Cell | None) -> str:
    """Validation accuracy at the defaults -> best, and the finished trials (pruned ones included)."""
    if cell is None or cell.tuning is None:
        return "-"
    t = cell.tuning
    trials = t.get("trials", {})
    before = t.get("defaults_validation_acc")
    best = t.get("best_validation_acc")
    head = f"{before:.2f} -> {best:.2f}" if isinstance(before, (int, float)) else f"best {best:.2f}"
    finished = trials.get("complete", 0) + trials.get("pruned", 0) + trials.get("failed", 0)
    pruned = f", {trials.get('pruned')} pruned" if trials.get("pruned") else ""
    failed = f", {trials.get('failed')} failed" if trials.get("failed") else ""
    return f"{head} ({finished} trials{pruned}{failed})"


def table(folder: Path) -> str:
    """The Markdown tables of the study in ``folder``."""
    cells = collect(folder)
    elsewhere = sorted({c.tuned_on for m in cells.values() for c in m.values() if c.condition == "elsewhere"})
    where = ", ".join(elsewhere) or "another benchmark"
    lines = [
        f"| method | defaults | tuned on the same benchmark | Δ vs defaults | tuned on {where} | Δ vs defaults |",
        "|---|---|---|---|---|---|",
    ]
    for method, by in sorted(cells.items()):
        d, s, e = by.get("defaults"), by.get("same"), by.get("elsewhere")
        lines.append(f"| {method} | {_acc(d)} | {_acc(s)} | {_delta(s, d)} | {_acc(e)} | {_delta(e, d)} |")
    lines += [
        "",
        "| method | settings tuned on the same benchmark | its validation accuracy, defaults -> best | "
        f"settings tuned on {where} | its validation accuracy, defaults -> best |",
        "|---|---|---|---|---|",
    ]
    for method, by in sorted(cells.items()):
        s, e = by.get("same"), by.get("elsewhere")
        lines.append(f"| {method} | {_settings(s)} | {_validation(s)} | {_settings(e)} | {_validation(e)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(table(Path(args[0] if args else "reports/tuning")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
