"""Curves over the task sequence: the accuracy curves (A_t against the classes seen, one panel per method family,
the baseline in every panel) and the budget curves (accuracy against optimizer steps per task)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.core.catalog import FAMILIES
from clbench.report.budget import QUICK, REFERENCE, BudgetCurve, curve_label
from clbench.report.collect import AccKey, Collection, Run
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _final,
    _save,
    provenance,
)
from clbench.report.figures.style import (
    BASELINE_COLOR,
    LEGEND_CHARS,
    MARKERS,
    PANEL_COLORS,
    PANEL_SERIES,
    PROTOCOL_STYLE,
    SERIES_COLORS,
    WIDE_BAND,
    base_strategy,
    count_label,
    hide_unused,
    legend_outside,
    mean_std_curves,
    method_family,
    new_figure,
    panel_grid,
    seen_ticks,
    unique_runs,
)
from clbench.report.labels import needs_backbone, short_label
from clbench.report.uncertainty import Predicted, row_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def series_key(groups: dict[AccKey, list[Run]], keys: Sequence[AccKey]) -> list[dict[str, str]]:
    """The full identity of each series a figure labels shortly: the key table printed beside it."""
    several = needs_backbone(keys)
    return [
        {
            "label": short_label(k, several),
            "configuration": k.strategy,
            "benchmark": k.bench,
            "backbone": k.backbone,
            "weights": k.weights,
            "protocol": k.protocol,
            "seeds": ", ".join(str(r.seed) for r in groups[k]),
            "records": ", ".join(str(r.path) for r in groups[k]),
        }
        for k in keys
    ]


def _family_order(title: str) -> int:
    titles = list(FAMILIES.values())
    return titles.index(title) if title in titles else len(titles)


def _baseline_key(keys: Sequence[AccKey], baseline: str | None) -> AccKey | None:
    """The baseline's row among ``keys`` (one benchmark): its per-sample protocol first."""
    mine = [k for k in keys if baseline is not None and base_strategy(k.strategy) == base_strategy(baseline)]
    mine = [k for k in mine if k.strategy == baseline] or mine
    mine.sort(key=lambda k: (k.protocol != "per-sample", k.protocol))
    return mine[0] if mine else None


def _family_grid(fig: Figure, n: int) -> list[Axes]:
    """``n`` panels two to a row; an odd last panel spans the row (no empty cell)."""
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    grid = fig.add_gridspec(nrows, ncols)
    axes = []
    for i in range(n):
        row, col = divmod(i, ncols)
        last_alone = ncols == 2 and i == n - 1 and n % 2 == 1
        axes.append(fig.add_subplot(grid[row, :] if last_alone else grid[row, col]))
    return axes


def _wrap_label(label: str, width: int = LEGEND_CHARS) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def accuracy_curves(
    coll: Collection,
    out_dir: Path,
    name: str = "accuracy_curves",
    title: str = "Accuracy after each task",
    predicted: Any = None,
    dpi: int | None = None,
    baseline: str | None = None,
) -> FigureOut | None:
    """A_t against the number of classes seen, one panel per method family (:func:`method_family`; per benchmark
    where there are several), one shared y range, the ``baseline`` (default: the first row) drawn in black in every
    panel; the series of a panel in distinct colour-blind-safe colours and markers (:data:`PANEL_COLORS`), lines the
    mean over seeds with their 95 % interval band (none where a band would cover much of the panel: the caption
    names them); short labels (the key table has the full identity of each line)."""
    import matplotlib

    groups = coll.acc_groups()
    benches = coll.benches()
    if not benches:
        return None
    several = needs_backbone(list(groups))
    predicted = predicted or Predicted()
    baseline = baseline or base_strategy(next(iter(groups)).strategy)
    panels: list[tuple[str, str, list[AccKey], AccKey | None]] = []  # (bench, title, keys, baseline key)
    for bench in benches:
        keys = [k for k in groups if k.bench == bench]
        base = _baseline_key(keys, baseline)
        families: dict[str, list[AccKey]] = {}
        for k in sorted(keys, key=lambda k: -_final(groups[k], k.protocol)):
            if k != base:
                families.setdefault(method_family(k.strategy), []).append(k)
        if base is not None and not families:
            families[method_family(base.strategy)] = []
        for fam in sorted(families, key=_family_order):
            parts = [families[fam][i : i + PANEL_SERIES] for i in range(0, len(families[fam]), PANEL_SERIES)] or [[]]
            for i, part in enumerate(parts):
                t = fam + (f" ({i + 1} of {len(parts)})" if len(parts) > 1 else "")
                panels.append((bench, f"{bench}: {t}" if len(benches) > 1 else t, part, base))
    curves: dict[AccKey, tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, str]] = {}
    for key, runs in groups.items():
        mean, std = mean_std_curves([r.summary(key.protocol).acc_curve for r in runs])
        x = np.array(runs[0].seen_axis[0][: len(mean)])
        ri = row_interval(runs, key.protocol, predicted)
        if ri.curve_lo is not None and ri.curve_hi is not None:  # the 95 % interval of every A_t
            lo, hi, kind = np.array(ri.curve_lo[: len(x)]), np.array(ri.curve_hi[: len(x)]), "interval"
        elif len(runs) > 1:
            lo, hi, kind = mean - std, mean + std, "std"
        else:
            lo = hi = None
            kind = ""
        curves[key] = (x, mean, lo, hi, kind)
    shown = [k for _, _, keys, base in panels for k in [*keys, *([base] if base else [])]]
    values = np.concatenate([curves[k][1] for k in shown])
    values = values[np.isfinite(values)]
    y0 = max(0.0, 5 * math.floor((float(values.min()) - 3) / 5)) if values.size else 0.0
    y1 = min(100.0, 5 * math.ceil((float(values.max()) + 3) / 5)) if values.size else 100.0
    bands: set[str] = set()
    wide: list[str] = []
    with matplotlib.rc_context({**RC, "font.size": 10, "legend.fontsize": 9, "axes.titlesize": 10.5}):
        from matplotlib.figure import Figure

        nrows = math.ceil(len(panels) / 2) if len(panels) > 1 else 1
        fig = Figure(figsize=(10.0 if len(panels) > 1 else 7.0, 3.3 * nrows + 0.4), layout="constrained")
        axes = _family_grid(fig, len(panels))
        for ax, (_bench, panel_title, keys, base) in zip(axes, panels, strict=True):
            series = [(k, PANEL_COLORS[i], MARKERS[i % len(MARKERS)]) for i, k in enumerate(keys)]
            if base is not None:
                series.append((base, BASELINE_COLOR, ""))
            for key, color, marker in series:
                x, mean, lo, hi, kind = curves[key]
                is_base = key == base
                style = PROTOCOL_STYLE.get(key.protocol, ":")
                label = short_label(key, several) + (", baseline" if is_base else "") + f" (n={len(groups[key])})"
                ax.plot(
                    x,
                    mean,
                    linestyle=style,
                    marker=marker or None,
                    ms=4,
                    lw=2.2 if is_base else 1.6,
                    color=color,
                    alpha=0.75 if is_base else 1.0,
                    label=_wrap_label(label),
                    zorder=2 if is_base else 3,
                )
                if lo is None or hi is None or is_base:
                    continue
                if float(np.nanmax(hi - lo)) > WIDE_BAND * (y1 - y0):
                    wide.append(short_label(key, several))
                    continue
                ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)
                bands.add(kind)
            ax.set_ylim(y0, y1)
            ax.set_title(panel_title, loc="left")
            seen_ticks(ax, groups[(keys or [base])[0]][0].seen_axis)
            ax.set_ylabel("accuracy A_t (%)")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0.0, handlelength=2.2)
        runs = unique_runs([groups[k] for k in dict.fromkeys(shown)])
        band_text = {
            frozenset(): "no bands",
            frozenset({"interval"}): "bands the 95 % interval (bootstrap over test images; several seeds: "
            "hierarchical, seeds then images)",
            frozenset({"std"}): "bands ± one standard deviation over seeds (the records kept no predictions for "
            "an interval)",
        }.get(
            frozenset(bands),
            "bands the 95 % interval where the runs kept predictions, else ± one standard deviation over seeds",
        )
        if wide:
            band_text += f"; no band for {', '.join(dict.fromkeys(wide))} (wider than {WIDE_BAND:.0%} of the axis)"
        base_name = next((short_label(b, several) for *_, b in panels if b is not None), None)
        caption = (
            f"{title}: A_t (%) after each task against the number of classes (domain-incremental: domains) seen, "
            "one panel per method family, one y range; lines are means over seeds (n = seeds), "
            f"{band_text}; solid = per-sample protocol, dashed = reference"
            + (f"; black: the baseline, {base_name}, in every panel" if base_name else "")
            + ". "
            + provenance(runs)
        )
        out = _save(fig, out_dir, name, title, caption, runs, dpi)
        out.key = series_key(groups, list(dict.fromkeys(shown)))
        return out


def budget_curves_figure(coll: Collection, out_dir: Path, curves: Sequence[BudgetCurve]) -> FigureOut | None:
    """Final accuracy against training budget in optimizer steps (log), one line per strategy and settings, from
    records that differ only in their budget (:mod:`clbench.report.budget`); the ``quick`` and reference-epoch
    points marked."""
    import matplotlib
    from matplotlib.ticker import FuncFormatter

    if not curves:
        return None
    benches = sorted({c.bench for c in curves})
    by_id = {r.run_id: r for r in coll.runs}
    with matplotlib.rc_context(RC):
        ncols, nrows = panel_grid(len(benches))
        fig, axes = new_figure(ncols, nrows, 5.2, 3.8)
        hide_unused(axes, len(benches))
        for ax, bench in zip(axes, benches, strict=False):
            for i, curve in enumerate(c for c in curves if c.bench == bench):
                xs = [max(p.steps, 1) for p in curve.points]  # log axis: a run without steps sits at 1
                ys = [p.mean for p in curve.points]
                color = SERIES_COLORS[i % len(SERIES_COLORS)]  # distinct within the panel; markers a second cue
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[p.std for p in curve.points],
                    fmt="-" + MARKERS[i % len(MARKERS)],
                    ms=4,
                    capsize=2,
                    color=color,
                    label=curve_label(curve),
                )
                for x, y, p in zip(xs, ys, curve.points, strict=True):
                    if QUICK in p.marks:
                        ax.plot([x], [y], "s", ms=10, mfc="none", mec=color, mew=1.5)
                    if REFERENCE in p.marks:
                        ax.plot([x], [y], "*", ms=13, color=color, mec="black", mew=0.5)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(count_label))
            ax.set_title(bench)
            ax.set_xlabel("training budget: optimizer steps, all tasks (log)")
            ax.set_ylabel("final accuracy A_T (%)")
            legend_outside(ax)
        runs = [by_id[rid] for c in curves for p in c.points for rid in p.runs if rid in by_id]
        title = "Final accuracy against training budget"
        caption = (
            f"{title}: each line holds one strategy's records that differ only in their budget (epochs, "
            "train_per_class, a step schedule's milestone) "
            "(mean ± std over seeds); open square = the strategy's quick profile's budget, star = the reference's "
            "epochs (its default config). " + provenance(runs)
        )
        return _save(fig, out_dir, "budget_curves", title, caption, runs)
