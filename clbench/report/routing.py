"""The routing study in reports: one table row per (run, router) and a figure of routed accuracy after each task.

Reads ``per_task[t].diagnostics.routers`` of records from strategies that choose a per-task module per image and
record several rules from one trained run (``--set routers=a,b,c``, :mod:`clbench.methods.routers`). Every number is
read from a record; the tables name the run each row comes from. ``clbench routing-study`` writes these tables (and,
with ``--vary FIELD``, a table across runs that differ in one strategy setting) to a Markdown file with the figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from clbench.records.routing_diagnostics import ModuleChoices
from clbench.report.collect import Collection, Run

BOUND = "oracle"


def study_runs(coll: Collection) -> list[Run]:
    """Runs whose every task recorded a routing study."""
    return [
        r
        for r in coll.runs
        if r.record.per_task and all(_study(r, t) is not None for t in range(len(r.record.per_task)))
    ]


def own_router(run: Run) -> str | None:
    return (run.record.strategy_config or {}).get("router")


def router_curves(run: Run) -> dict[str, list[float]]:
    """Routed accuracy after each task, per router (the order of the record; the bound last)."""
    studies = [_study(run, t) for t in range(len(run.record.per_task))]
    names = [n for n in studies[-1] if n != BOUND] + [BOUND]
    return {n: [float(s[n].acc) for s in studies] for n in names}


def _study(run: Run, task: int = -1) -> dict[str, ModuleChoices] | None:
    """The routing study after ``task``: router -> its choices (None: none recorded)."""
    routing = run.routing(task)
    return routing.routers if routing is not None else None


def router_rows(run: Run) -> list[dict[str, Any]]:
    """One row per router: routing and routed accuracy after the last task, average over tasks, newest-module share,
    the share of the gap between the run's own router and the oracle that the router closes (final accuracy)."""
    curves = router_curves(run)
    last = _study(run)
    base = own_router(run)
    base_final = curves[base][-1] if base in curves else None
    bound_final = curves[BOUND][-1]
    rows = []
    for name, curve in curves.items():
        d = last[name]
        gap = (
            None
            if base_final is None or bound_final == base_final
            else 100 * (curve[-1] - base_final) / (bound_final - base_final)
        )
        rows.append(
            {
                "router": name + (" (run's own)" if name == base else "") + (" (bound)" if name == BOUND else ""),
                "routing acc %": d.routing_acc,
                "final acc %": curve[-1],
                "avg acc %": float(np.mean(curve)),
                "newest module share %": d.newest_module_share,
                "oracle gap closed %": gap,
                "collapse": d.collapse_warning or "-",
            }
        )
    return rows


def _fmt(value: Any, nd: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{nd}f}" if isinstance(value, float) else str(value)


def study_table(run: Run) -> pd.DataFrame:
    rows = router_rows(run)
    return pd.DataFrame(
        [
            {k: _fmt(v, 1 if k in ("oracle gap closed %", "newest module share %") else 2) for k, v in row.items()}
            for row in rows
        ]
    )


def routing_per_task_table(run: Run) -> pd.DataFrame:
    """Routing accuracy per true task after the last task, one row per router."""
    rows = []
    for name, d in (_study(run) or {}).items():
        rows.append({"router": name, **{f"task {j + 1}": f"{v:.1f}" for j, v in enumerate(d.routing_acc_per_task)}})
    return pd.DataFrame(rows)


def vary_table(runs: Sequence[Run], field: str) -> pd.DataFrame:
    """Runs that differ in strategy setting ``field``: module similarity (weights, outputs), final accuracy and
    routing accuracy after the last task per router."""
    rows = []
    for run in sorted(runs, key=lambda r: (r.record.bench, _setting(r, field), r.seed)):
        routing = run.routing()
        row: dict[str, Any] = {
            "bench": run.record.bench,
            field: _setting(run, field),
            "seed": run.seed,
            "run": run.run_id,
            "weight cos": _fmt(routing.module_cosine_similarity, 4),
            "output cos": _fmt(routing.module_output_cosine, 4),
            "output cos (centred)": _fmt(routing.module_output_cosine_centred, 4),
        }
        for name, d in (routing.routers or {}).items():
            row[f"{name} routing / final %"] = f"{d.routing_acc:.1f} / {d.acc:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def _setting(run: Run, field: str) -> Any:
    return (run.record.strategy_config or {}).get(field)


def _mean(values: list[Any]) -> float | None:
    return None if any(v is None for v in values) else float(np.mean(values))


def vary_mean_table(runs: Sequence[Run], field: str) -> pd.DataFrame:
    """:func:`vary_table` averaged over seeds: one row per (benchmark, value of ``field``)."""
    groups: dict[tuple[str, Any], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.record.bench, _setting(run, field)), []).append(run)
    rows = []
    for (bench, value), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        diags = [r.routing() for r in group]
        row: dict[str, Any] = {
            "bench": bench,
            field: value,
            "seeds": ", ".join(str(s) for s in sorted(r.seed for r in group)),
            "weight cos": _fmt(_mean([d.module_cosine_similarity for d in diags]), 4),
            "output cos": _fmt(_mean([d.module_output_cosine for d in diags]), 4),
            "output cos (centred)": _fmt(_mean([d.module_output_cosine_centred for d in diags]), 4),
        }
        for name in diags[0].routers or {}:
            if all(name in (d.routers or {}) for d in diags):
                routing = _mean([d.routers[name].routing_acc for d in diags])
                final = _mean([d.routers[name].acc for d in diags])
                row[f"{name} routing / final %"] = f"{routing:.1f} / {final:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def _seed_groups(runs: Sequence[Run]) -> dict[tuple[str, str, str], list[Run]]:
    """Runs that differ only in their seed: (benchmark, strategy, settings) -> runs."""
    import json

    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        key = (run.record.bench, run.strategy, json.dumps(run.record.strategy_config or {}, sort_keys=True))
        groups.setdefault(key, []).append(run)
    return groups
