"""Figures of routing strategies: the routed and oracle accuracy per task, and the routing study's accuracy over the
varied routing settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clbench.records.routing_diagnostics import routing_or_none
from clbench.records.schema import TaskEntry
from clbench.report.collect import Collection
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _save,
    provenance,
)
from clbench.report.figures.style import (
    PROTOCOL_STYLE,
    base_strategy,
    hide_unused,
    mean_std_curves,
    new_figure,
    seen_ticks,
    unique_runs,
)
from clbench.report.labels import display_name
from clbench.report.tables import routing_protocols


def _routed_acc(entry: TaskEntry, protocol: str) -> float | None:
    """The accuracy with the modules ``protocol`` chose after one task (None where not recorded)."""
    routing = routing_or_none(entry.diagnostics)
    choices = routing.protocols.get(protocol) if routing is not None else None
    return choices.acc if choices is not None else None


def _oracle_acc(entry: TaskEntry) -> float | None:
    """The accuracy with every image routed to its own task's module after one task (None where not recorded)."""
    routing = routing_or_none(entry.diagnostics)
    return routing.oracle_acc if routing is not None else None


def routing(coll: Collection, out_dir: Path) -> FigureOut | None:
    """For strategies that route between per-task modules: routing accuracy per task after the last task, and
    accuracy with the chosen modules against accuracy with each image's own task's module (oracle)."""
    import matplotlib

    groups = {k: [r for r in runs if routing_protocols(r)] for k, runs in coll.run_groups().items()}
    groups = {k: runs for k, runs in groups.items() if runs}
    if not groups:
        return None
    with matplotlib.rc_context(RC):
        fig, axes = new_figure(2, len(groups), 5.0, 3.4)
        several = len({(k.bench, k.strategy) for k in groups}) < len(groups)
        for row, (key, runs) in enumerate(groups.items()):
            ax_bar, ax_curve = axes[2 * row], axes[2 * row + 1]
            short = display_name(base_strategy(key.strategy)) + key.strategy[len(base_strategy(key.strategy)) :]
            if several:
                short += f" ({key.backbone})"
            protocols = routing_protocols(runs[0])
            width = 0.8 / len(protocols)
            for i, p in enumerate(protocols):
                per_task = np.array([r.routing().protocols[p].routing_acc_per_task for r in runs], dtype=float)
                x = np.arange(per_task.shape[1])
                err = per_task.std(axis=0, ddof=1) if len(runs) > 1 else None
                ax_bar.bar(
                    x + (i - (len(protocols) - 1) / 2) * width,
                    per_task.mean(axis=0),
                    width,
                    yerr=err,
                    capsize=2,
                    label=p,
                    color=f"C{i}",
                )
                diag_curves = [[_routed_acc(t, p) for t in r.record.per_task] for r in runs]
                mean, std = mean_std_curves(diag_curves)
                xs = np.array(runs[0].seen_axis[0][: len(mean)])
                ax_curve.plot(
                    xs, mean, PROTOCOL_STYLE.get(p, ":"), marker="o", ms=3, color=f"C{i}", label=f"routed, {p}"
                )
                if len(runs) > 1:
                    ax_curve.fill_between(xs, mean - std, mean + std, color=f"C{i}", alpha=0.15, lw=0)
            ax_bar.set_xticks(x, [str(j + 1) for j in x])
            ax_bar.set_ylim(0, 105)
            ax_bar.set_xlabel("task j (test images of task j)")
            ax_bar.set_ylabel("routed to module j (%)")
            ax_bar.set_title(f"{short}: routing after the last task (n={len(runs)})")
            ax_bar.legend(frameon=False)
            oracle = [[_oracle_acc(t) for t in r.record.per_task] for r in runs]
            mean, std = mean_std_curves(oracle)
            xs = np.array(runs[0].seen_axis[0][: len(mean)])
            ax_curve.plot(xs, mean, ":", marker="s", ms=3, color="black", label="oracle (own task's module)")
            seen_ticks(ax_curve, runs[0].seen_axis)
            ax_curve.set_ylabel("accuracy (%)")
            ax_curve.set_title(f"{short}: routed vs oracle accuracy")
            ax_curve.legend(frameon=False)
        runs = unique_runs(list(groups.values()))
        title = "Routing between per-task modules"
        benches = ", ".join(sorted({k.bench for k in groups}))
        caption = (
            f"{title} ({benches}): left, share of each task's test images routed to that task's module after the last "
            f"task (mean ± std over seeds); right, accuracy with the routed modules and with each image's own "
            f"task's module (oracle) after each task. " + provenance(runs)
        )
        return _save(fig, out_dir, "routing", title, caption, runs)


def routing_study(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Routed accuracy after each task per router (mean over seeds), oracle as the ceiling; one panel per benchmark
    and strategy setting."""
    import matplotlib

    # deferred: loads pandas, which importing this module does not
    from clbench.report.routing import BOUND, _seed_groups, router_curves, study_runs

    runs = study_runs(coll)
    if not runs:
        return None
    groups = _seed_groups(runs)
    varied = _varied_settings(list(groups))
    with matplotlib.rc_context(RC):
        cols = min(len(groups), 4)
        fig, axes = new_figure(cols, (len(groups) + cols - 1) // cols, 3.6, 2.7)
        for ax, (key, group) in zip(axes, groups.items(), strict=False):
            bench, strategy, _ = key
            curves = [router_curves(r) for r in group]
            xs, xlabel = group[0].seen_axis
            for i, name in enumerate(curves[0]):
                mean = np.mean([c[name] for c in curves], axis=0)
                style = (
                    {"color": "black", "ls": "--", "marker": "s"}
                    if name == BOUND
                    else {"color": f"C{i}", "marker": "o"}
                )
                ax.plot(xs[: len(mean)], mean, ms=2, lw=1, label=name, **style)
            seen_ticks(ax, (xs, xlabel), fontsize=7)
            ax.set_ylabel("routed accuracy (%)", fontsize=7)
            setting = f", {varied[key]}" if varied[key] else ""
            ax.set_title(f"{strategy} on {bench}{setting} ({len(group)} runs)", fontsize=8)  # the caption names them
            ax.tick_params(labelsize=6)
        handles, labels = axes[0].get_legend_handles_labels()  # every panel draws the same routers
        fig.legend(handles, labels, loc="outside right upper", frameon=False, fontsize=7)
        hide_unused(axes, len(groups))
        title = "Routing study: routed accuracy per router"
        caption = (
            f"{title}, after each task (mean over the seeds of a panel's runs), every router on the same "
            f"trained modules; the dashed black line is oracle routing (each image through its own task's "
            f"module). " + provenance(runs)
        )
        return _save(fig, out_dir, "routing_study", title, caption, runs)


def _varied_settings(keys: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
    """Per (benchmark, strategy, settings JSON) panel key, the settings in which it differs from the other panels of
    the same benchmark and strategy, as ``name=value`` (``l1=0.0005``); "" where it is the only one."""
    import json

    out = {}
    for key in keys:
        bench, strategy, settings = key
        mine = json.loads(settings)
        others = [json.loads(k[2]) for k in keys if k[:2] == (bench, strategy) and k != key]
        names = sorted(n for n in mine if any(o.get(n) != mine[n] for o in others))
        out[key] = ", ".join(f"{n}={mine[n]:g}" if isinstance(mine[n], float) else f"{n}={mine[n]}" for n in names)
    return out
