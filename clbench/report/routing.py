"""The routing study in reports: one table row per (run, router) and a figure of routed accuracy after each task.

Reads ``per_task[t].diagnostics.routers`` of records from strategies that choose a per-task module per image and
record several rules from one trained run (``--set routers=a,b,c``, :mod:`clbench.routers`). Every number is read
from a record; the tables name the run each row comes from. ``clbench routing-study`` writes these tables (and,
with ``--vary FIELD``, a table across runs that differ in one strategy setting) to a Markdown file with the figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clbench.report.collect import Collection, Run

BOUND = "oracle"


def study_runs(coll: Collection) -> list[Run]:
    """Runs whose every task recorded a routing study."""
    return [r for r in coll.runs if r.record.get("per_task") and
            all(isinstance((t.get("diagnostics") or {}).get("routers"), dict) for t in r.record["per_task"])]


def own_router(run: Run) -> str | None:
    return (run.record.get("strategy_config") or {}).get("router")


def router_curves(run: Run) -> dict[str, list[float]]:
    """Routed accuracy after each task, per router (the order of the record; the bound last)."""
    per_task = run.record["per_task"]
    names = [n for n in per_task[-1]["diagnostics"]["routers"] if n != BOUND] + [BOUND]
    return {n: [float(t["diagnostics"]["routers"][n]["acc"]) for t in per_task] for n in names}


def router_rows(run: Run) -> list[dict[str, Any]]:
    """One row per router: routing and routed accuracy after the last task, average over tasks, newest-module share,
    the share of the gap between the run's own router and the oracle that the router closes (final accuracy)."""
    curves = router_curves(run)
    last = run.record["per_task"][-1]["diagnostics"]["routers"]
    base = own_router(run)
    base_final = curves[base][-1] if base in curves else None
    bound_final = curves[BOUND][-1]
    rows = []
    for name, curve in curves.items():
        d = last[name]
        gap = (None if base_final is None or bound_final == base_final
               else 100 * (curve[-1] - base_final) / (bound_final - base_final))
        rows.append({"router": name + (" (run's own)" if name == base else "") + (" (bound)" if name == BOUND else ""),
                     "routing acc %": d["routing_acc"], "final acc %": curve[-1], "avg acc %": float(np.mean(curve)),
                     "newest module share %": d["newest_module_share"], "oracle gap closed %": gap,
                     "collapse": d.get("collapse_warning") or "-"})
    return rows


def _fmt(value: Any, nd: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{nd}f}" if isinstance(value, float) else str(value)


def study_table(run: Run) -> pd.DataFrame:
    rows = router_rows(run)
    return pd.DataFrame([{k: _fmt(v, 1 if k in ("oracle gap closed %", "newest module share %") else 2)
                          for k, v in row.items()} for row in rows])


def routing_per_task_table(run: Run) -> pd.DataFrame:
    """Routing accuracy per true task after the last task, one row per router."""
    last = run.record["per_task"][-1]["diagnostics"]["routers"]
    rows = []
    for name, d in last.items():
        rows.append({"router": name, **{f"task {j + 1}": f"{v:.1f}" for j, v in enumerate(d["routing_acc_per_task"])}})
    return pd.DataFrame(rows)


def vary_table(runs: Sequence[Run], field: str) -> pd.DataFrame:
    """Runs that differ in strategy setting ``field``: module similarity (weights, outputs), final accuracy and
    routing accuracy after the last task per router."""
    rows = []
    for run in sorted(runs, key=lambda r: (r.record["bench"], _setting(r, field), r.seed)):
        diag = run.record["per_task"][-1]["diagnostics"]
        row: dict[str, Any] = {"bench": run.record["bench"], field: _setting(run, field), "seed": run.seed,
                               "run": run.run_id,
                               "weight cos": _fmt(diag.get("module_cosine_similarity"), 4),
                               "output cos": _fmt(diag.get("module_output_cosine"), 4),
                               "output cos (centred)": _fmt(diag.get("module_output_cosine_centred"), 4)}
        for name, d in diag["routers"].items():
            row[f"{name} routing / final %"] = f"{d['routing_acc']:.1f} / {d['acc']:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def _setting(run: Run, field: str) -> Any:
    return (run.record.get("strategy_config") or {}).get(field)


def _mean(values: list[Any]) -> float | None:
    return None if any(v is None for v in values) else float(np.mean(values))


def vary_mean_table(runs: Sequence[Run], field: str) -> pd.DataFrame:
    """:func:`vary_table` averaged over seeds: one row per (benchmark, value of ``field``)."""
    groups: dict[tuple[str, Any], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.record["bench"], _setting(run, field)), []).append(run)
    rows = []
    for (bench, value), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        diags = [r.record["per_task"][-1]["diagnostics"] for r in group]
        row: dict[str, Any] = {"bench": bench, field: value, "seeds": ", ".join(str(s) for s in sorted(r.seed for r in group)),
                               "weight cos": _fmt(_mean([d.get("module_cosine_similarity") for d in diags]), 4),
                               "output cos": _fmt(_mean([d.get("module_output_cosine") for d in diags]), 4),
                               "output cos (centred)": _fmt(_mean([d.get("module_output_cosine_centred") for d in diags]), 4)}
        for name in diags[0]["routers"]:
            if all(name in d["routers"] for d in diags):
                routing = _mean([d["routers"][name]["routing_acc"] for d in diags])
                final = _mean([d["routers"][name]["acc"] for d in diags])
                row[f"{name} routing / final %"] = f"{routing:.1f} / {final:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def sections(coll: Collection) -> list:
    """Report sections (one table per study run), for :func:`clbench.report.tables.sections`."""
    from clbench.report.tables import Section

    return [Section(f"Routing study: {r.run_id} ({r.strategy} on {r.record['bench']})", f"routing-study-{r.run_id}",
                    study_table(r),
                    intro="Every router evaluated on the same trained modules; accuracy in %, after the last task "
                          "(final) and averaged over tasks (avg). Oracle: each image through its own task's module. "
                          "Gap closed: (router - run's own router) / (oracle - run's own router), final accuracy.")
            for r in study_runs(coll)]


def _seed_groups(runs: Sequence[Run]) -> dict[tuple[str, str, str], list[Run]]:
    """Runs that differ only in their seed: (benchmark, strategy, settings) -> runs."""
    import json

    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        key = (run.record["bench"], run.strategy, json.dumps(run.record.get("strategy_config") or {}, sort_keys=True))
        groups.setdefault(key, []).append(run)
    return groups


def figure(coll: Collection, out_dir: Path):
    """Routed accuracy after each task per router (mean over seeds), oracle as the ceiling; one panel per benchmark
    and strategy setting."""
    import matplotlib

    from clbench.report.figures import RC, _new_figure, _save, provenance

    runs = study_runs(coll)
    if not runs:
        return None
    groups = _seed_groups(runs)
    with matplotlib.rc_context(RC):
        cols = min(len(groups), 4)
        fig, axes = _new_figure(cols, (len(groups) + cols - 1) // cols, 3.6, 2.7)
        for ax, ((bench, strategy, _), group) in zip(axes, groups.items()):
            curves = [router_curves(r) for r in group]
            xs = group[0].classes_seen
            for i, name in enumerate(curves[0]):
                mean = np.mean([c[name] for c in curves], axis=0)
                style = {"color": "black", "ls": "--", "marker": "s"} if name == BOUND else {"color": f"C{i}", "marker": "o"}
                ax.plot(xs[: len(mean)], mean, ms=2, lw=1, label=name, **style)
            ax.set_xlabel("number of classes seen", fontsize=7)
            ax.set_ylabel("routed accuracy (%)", fontsize=7)
            ax.set_title(f"{strategy} on {bench}: " + ", ".join(r.run_id for r in group), fontsize=6)
            ax.tick_params(labelsize=6)
        axes[0].legend(frameon=False, fontsize=5)
        for ax in axes[len(groups):]:
            ax.set_visible(False)
        title = "Routing study: routed accuracy per router"
        caption = (f"{title}, after each task (mean over the seeds of a panel's runs), every router on the same "
                   f"trained modules; the dashed black line is oracle routing (each image through its own task's "
                   f"module). " + provenance(runs))
        return _save(fig, out_dir, "routing_study", title, caption, runs)


def _cpu(rec: dict[str, Any]) -> str:
    host = rec.get("host") or {}
    return f"{host.get('cpu_capability')}{', AMX' if host.get('amx') else ''}, {host.get('cpus')} cores"


def write_study(coll: Collection, out: Path, vary: str | None = None, command: str | None = None) -> Path:
    """``out``/study.md with every table above and ``out``/figures/routing_study.png|svg."""
    from clbench.errors import ClbenchError
    from clbench.report.tables import to_markdown

    runs = study_runs(coll)
    if not runs:
        raise ClbenchError("no complete run record with a routing study among the given folders",
                           "run a strategy with --set routers=a,b,c (e.g. clbench run --strategy tosca "
                           "--set routers=energy,prototype) and pass its folder")
    out.mkdir(parents=True, exist_ok=True)
    fig = figure(coll, out)
    parts = ["# Routing study", "", f"Generated by `{command}` from {len(runs)} run records." if command else
             f"Generated from {len(runs)} run records.", ""]
    for run in runs:
        rec = run.record
        parts += [f"## {run.run_id}: {rec['strategy']} on {rec['bench']}", "",
                  (f"Record `{run.path}` (git {rec.get('git_revision')}, backbone {rec.get('backbone')} @ "
                   f"{rec.get('img_size')} px, seed {rec.get('seed')}, {len(rec['task_sizes'])} tasks, "
                   f"{rec.get('n_images', {}).get('test')} test images, CPU {_cpu(rec)}). "
                   f"Command: `{rec.get('command')}`"), "", to_markdown(study_table(run)), "",
                  "Routing accuracy per true task after the last task (%):", "",
                  to_markdown(routing_per_task_table(run)), ""]
    if vary:
        parts += [f"## Across `{vary}`", "", ("Module similarity after the last task (mean pairwise cosine of the "
                  "modules' weight matrices; of their outputs on the test images; the same after removing each "
                  "module's mean output) and, per router, routing accuracy / routed accuracy after the last task."),
                  "", to_markdown(vary_table(runs, vary)), "",
                  f"Mean over seeds per benchmark and `{vary}`:", "", to_markdown(vary_mean_table(runs, vary)), ""]
    if fig is not None:
        parts += [f"![{fig.title}]({fig.files['png']})", "", fig.caption, ""]
    path = out / "study.md"
    from clbench.io import atomic_write_bytes

    atomic_write_bytes(path, "\n".join(parts).encode())
    return path
