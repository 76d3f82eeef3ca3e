"""Report figures (matplotlib + seaborn), each saved as PNG and SVG with a caption naming its runs.

No pyplot: figures are plain :class:`matplotlib.figure.Figure` objects, so making a report changes no global
backend or style of the calling process. Colours follow the strategy across every figure; line style follows
the protocol (per-sample solid, reference dashed); marker follows the backbone.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.features.embeddings import POINTS as EMBEDDED_POINTS
from clbench.records.results import TaskEntry, Times
from clbench.records.routing_diagnostics import routing_or_none
from clbench.report.budget import QUICK, REFERENCE, BudgetCurve, curve_label
from clbench.report.collect import AccKey, Collection, Run
from clbench.report.tables import routing_protocols

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIG_DIR = "figures"
FORMATS = ("png", "svg", "pdf")  # the page shows the PNG; SVG and PDF for papers
PNG_DPI = 110  # the page's PNGs; paper exports (--latex-only) are written at PAPER_DPI
PAPER_DPI = 300
MATRIX_PANELS = 12  # heatmaps per accuracy-matrix figure (more: further figures; 63 in one ran out of memory)
TSNE_MAX_POINTS = EMBEDDED_POINTS  # the test images a record keeps (clbench.features.embeddings.POINTS)
TSNE_SEED = 0  # fixed random_state and subsample seed: the same records give the same picture
PROTOCOL_STYLE = {"per-sample": "-", "reference": "--"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
PHASE_COLORS = {"features": "#8da0cb", "train": "#fc8d62", "eval": "#66c2a5", "other": "#cccccc"}
RC = {  # a quiet paper style; set per figure through rc_context, never globally
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
    "svg.hashsalt": "clbench-report",
    "svg.fonttype": "none",
}


@dataclass
class FigureOut:
    """A saved figure: files relative to the report folder, its caption and the runs it shows."""

    name: str
    title: str
    caption: str
    runs: list[str]
    files: dict[str, str] = field(default_factory=dict)  # format -> path relative to the report folder
    key: list[dict[str, str]] = field(default_factory=list)  # the full identity of each labelled series


# ------------------------------------------------------------------------------------------- helpers


def _seen_ticks(ax: Any, axis: tuple[list[int], str], fontsize: float | None = None) -> None:
    """Label the x axis of curves after each task; domains seen (a handful of steps) get one tick each."""
    xs, label = axis
    ax.set_xlabel(label, **({"fontsize": fontsize} if fontsize else {}))
    from clbench.report.collect import DOMAINS_SEEN

    if label == DOMAINS_SEEN:
        ax.set_xticks(xs)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "x"


def provenance(runs: Sequence[Run]) -> str:
    """``Runs: a, b. Git: 1234abcd. Backbone weights: 4d4897b0fc05.``: what a figure or number came from."""
    ids = ", ".join(r.run_id for r in runs)
    revs = ", ".join(sorted({r.git_short for r in runs}))
    digests = ", ".join(sorted({(r.record.weights_digest or "unknown")[:12] for r in runs}))
    return f"Runs: {ids}. Git: {revs}. Backbone weights: {digests}."


def _unique_runs(groups: Sequence[Sequence[Run]]) -> list[Run]:
    seen: dict[str, Run] = {}
    for runs in groups:
        for r in runs:
            seen.setdefault(r.run_id, r)
    return list(seen.values())


# One colour per strategy, the same in every figure and every report (``clbench.run.catalog.STRATEGY_LOOKS``); a name
# not listed there takes one of these colours by its digest.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442",
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
)  # fmt: skip
VARIANT_STYLES = ("-", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))  # a strategy's 1st, 2nd, ... variant


def base_strategy(variant: str) -> str:
    """``ranpac`` of ``ranpac:quick epochs=300``."""
    return variant.split(" ")[0].partition(":")[0].partition("[")[0]


def strategy_color(strategy: str) -> str:
    """The fixed colour of a strategy (variants included: ``base_strategy``)."""
    name = base_strategy(strategy)
    from clbench.run.catalog import STRATEGY_LOOKS

    if name in STRATEGY_LOOKS:
        return STRATEGY_LOOKS[name][1]
    return PALETTE[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(PALETTE)]


def strategy_colors(coll: Collection) -> dict[str, Any]:
    """Variant label -> its strategy's fixed colour (:func:`strategy_color`)."""
    return {r.variant: strategy_color(r.variant) for r in coll.runs}


def variant_styles(variants: Sequence[str]) -> dict[str, Any]:
    """Variant label -> line style: a strategy's variants in sorted order take :data:`VARIANT_STYLES` in turn."""
    out: dict[str, Any] = {}
    by_base: dict[str, list[str]] = {}
    for v in sorted(set(variants)):
        by_base.setdefault(base_strategy(v), []).append(v)
    for vs in by_base.values():
        for i, v in enumerate(vs):
            out[v] = VARIANT_STYLES[i % len(VARIANT_STYLES)]
    return out


def _new_figure(ncols: int, nrows: int, w: float, h: float) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.flat)


def _save(
    fig: Figure, out_dir: Path, name: str, title: str, caption: str, runs: Sequence[Run], dpi: int | None = None
) -> FigureOut:
    """Save ``fig`` in every format of :data:`FORMATS` under ``out_dir/figures``; PNG at ``dpi`` (default
    :data:`PNG_DPI`)."""
    dpi = dpi or PNG_DPI
    (out_dir / FIG_DIR).mkdir(parents=True, exist_ok=True)
    files = {}
    for fmt in FORMATS:
        rel = f"{FIG_DIR}/{name}.{fmt}"
        meta: dict[str, Any] = {"Title": title, "Description": caption}
        if fmt == "svg":
            meta["Date"] = None  # reproducible SVG
        if fmt == "pdf":
            meta = {"Title": title, "Subject": caption, "CreationDate": None}  # reproducible PDF
        fig.savefig(out_dir / rel, format=fmt, dpi=dpi, metadata=meta)
        files[fmt] = rel
        if fig.get_layout_engine() is not None:
            # the first save laid the figure out; the other formats reuse its positions instead of laying it out
            # again (a report's figures took a fifth less time). None drops the engine where neither rc default
            # names one; "none" would keep a placeholder engine that still costs a layout draw per save
            import matplotlib

            with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
                fig.set_layout_engine(None)
    return FigureOut(name, title, caption, [r.run_id for r in runs], files)


def _panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    ncols = max(1, min(max_cols, n))
    return ncols, math.ceil(n / ncols)


def _hide_unused(axes: list[Axes], used: int) -> None:
    """Remove the grid's unused panels: a hidden axes still carries its tick labels into the saved SVG and PDF."""
    for ax in axes[used:]:
        ax.remove()


@dataclass
class _Panel:
    """One benchmark's panel of a figure with one panel per benchmark: its row keys and backbones."""

    ax: Axes
    bench: str
    keys: list[AccKey]
    backbones: list[tuple[str, str]]

    def marker(self, key: AccKey) -> str:
        return MARKERS[self.backbones.index((key.backbone, key.weights)) % len(MARKERS)]


def _bench_panels(benches: list[str], groups: dict[AccKey, list[Run]]) -> tuple[Figure, list[_Panel]]:
    """A figure with one panel per benchmark (call inside the figure's rc_context); spare grid cells hidden."""
    ncols, nrows = _panel_grid(len(benches))
    # One benchmark: a wide, taller panel (legend below), so the page shows it at a readable size.
    fig, axes = _new_figure(ncols, nrows, 9.0 if ncols == 1 else 5.0, 7.0 if ncols == 1 else 4.6)
    _hide_unused(axes, len(benches))
    panels = []
    for ax, bench in zip(axes, benches, strict=False):
        keys = [k for k in groups if k.bench == bench]
        panels.append(_Panel(ax, bench, keys, sorted({(k.backbone, k.weights) for k in keys})))
    return fig, panels


def _routed_acc(entry: TaskEntry, protocol: str) -> float | None:
    """The accuracy with the modules ``protocol`` chose after one task (None where not recorded)."""
    routing = routing_or_none(entry.diagnostics)
    choices = routing.protocols.get(protocol) if routing is not None else None
    return choices.acc if choices is not None else None


def _oracle_acc(entry: TaskEntry) -> float | None:
    """The accuracy with every image routed to its own task's module after one task (None where not recorded)."""
    routing = routing_or_none(entry.diagnostics)
    return routing.oracle_acc if routing is not None else None


def _mean_std_curves(curves: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    n = min(len(c) for c in curves)
    arr = np.array([[np.nan if v is None else v for v in c[:n]] for c in curves], dtype=float)  # (runs, T)
    mean = _nanmean(arr)
    count = np.sum(~np.isnan(arr), axis=0)
    sq = np.nansum((arr - mean) ** 2, axis=0)
    std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), 0.0)  # sample std; 0 for a single run
    return mean, std


LEGEND_WRAP = 34  # characters per legend line to the right of a panel: longer labels wrap instead of leaving the canvas


def _legend_outside(ax: Axes) -> None:
    """Legend to the right of the panel, outside every axes (constrained layout makes room for it); a label longer
    than :data:`LEGEND_WRAP` characters wraps at a space (``HiDe-Prompt:reference, reference protocol (n=1)``)."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    wrapped = ["\n".join(textwrap.wrap(label, LEGEND_WRAP)) or label for label in labels]
    ax.legend(handles, wrapped, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, ncol=1, borderaxespad=0.0)


def _legend_below(ax: Axes) -> None:
    """Legend under the panel: labels name strategy, protocol and backbone and may be long."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False, ncol=1)


def _line_label(key: AccKey, n: int, several_backbones: bool) -> str:
    label = f"{key.strategy}, {key.protocol}"
    if several_backbones:
        label += f", {key.backbone} ({key.weights})"
    return f"{label} (n={n})"


# ------------------------------------------------------------------------------------------- figures
MAX_SERIES = 8  # lines per axes: more are split into further panels (best final accuracy first)


def series_key(groups: dict[AccKey, list[Run]], keys: Sequence[AccKey]) -> list[dict[str, str]]:
    """The full identity of each series a figure labels shortly: the key table printed beside it."""
    from clbench.report.leaderboard import needs_backbone, short_label

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


def _final(runs: Sequence[Run], protocol: str) -> float:
    vals = [r.summary(protocol).last_acc for r in runs]
    vals = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else -math.inf


def accuracy_curves(
    coll: Collection,
    out_dir: Path,
    name: str = "accuracy_curves",
    title: str = "Accuracy after each task",
    predicted: Any = None,
    dpi: int | None = None,
) -> FigureOut | None:
    """A_t against the number of classes seen: one line per row (strategy x backbone x protocol), the mean over
    seeds with its 95 % interval band; at most :data:`MAX_SERIES` lines per panel (a benchmark's rows by final
    accuracy, best first, then further panels), the legend outside the axes, short labels (the key table has the
    full identity of each line)."""
    import matplotlib

    from clbench.report.leaderboard import needs_backbone, short_label
    from clbench.report.uncertainty import Predicted, row_interval

    groups = coll.acc_groups()
    benches = coll.benches()
    if not benches:
        return None
    colors = strategy_colors(coll)
    styles = variant_styles([k.strategy for k in groups])
    several = needs_backbone(list(groups))
    predicted = predicted or Predicted()
    bands: set[str] = set()
    chunks: list[tuple[str, list[AccKey]]] = []
    for bench in benches:
        keys = sorted((k for k in groups if k.bench == bench), key=lambda k: -_final(groups[k], k.protocol))
        parts = [keys[i : i + MAX_SERIES] for i in range(0, len(keys), MAX_SERIES)]
        for i, part in enumerate(parts):
            chunks.append((bench + (f" ({i + 1} of {len(parts)})" if len(parts) > 1 else ""), part))
    with matplotlib.rc_context(RC):
        ncols, nrows = _panel_grid(len(chunks), 2)
        fig, axes = _new_figure(ncols, nrows, 7.6, 4.2)
        _hide_unused(axes, len(chunks))
        for ax, (panel_title, keys) in zip(axes, chunks, strict=False):
            backbones = sorted({(k.backbone, k.weights) for k in groups if k.bench == keys[0].bench})
            for key in keys:
                runs = groups[key]
                mean, std = _mean_std_curves([r.summary(key.protocol).acc_curve for r in runs])
                ri = row_interval(runs, key.protocol, predicted)
                x = np.array(runs[0].seen_axis[0][: len(mean)])
                style = "--" if key.protocol == "reference" else styles.get(key.strategy, "-")
                if key.protocol not in PROTOCOL_STYLE:
                    style = ":"
                ax.plot(
                    x,
                    mean,
                    linestyle=style,
                    marker=MARKERS[backbones.index((key.backbone, key.weights)) % len(MARKERS)],
                    ms=3.5,
                    lw=1.6,
                    color=colors[key.strategy],
                    label=f"{short_label(key, several)} (n={len(runs)})",
                )
                if ri.curve_lo is not None and ri.curve_hi is not None:  # the 95 % interval of every A_t
                    lo, hi = np.array(ri.curve_lo[: len(x)]), np.array(ri.curve_hi[: len(x)])
                    ax.fill_between(x, lo, hi, color=colors[key.strategy], alpha=0.12, lw=0)
                    bands.add("interval")
                elif len(runs) > 1:
                    ax.fill_between(x, mean - std, mean + std, color=colors[key.strategy], alpha=0.12, lw=0)
                    bands.add("std")
            ax.set_title(panel_title)
            _seen_ticks(ax, groups[keys[0]][0].seen_axis)
            ax.set_ylabel("accuracy A_t (%)")
            _legend_outside(ax)
        runs = _unique_runs(list(groups.values()))
        band_text = {
            frozenset(): "no bands (one run per line, without predictions)",
            frozenset({"interval"}): "bands the 95 % interval (bootstrap over test images; several seeds: "
            "hierarchical, seeds then images)",
            frozenset({"std"}): "bands ± one standard deviation over seeds (the records kept no predictions for "
            "an interval)",
        }.get(
            frozenset(bands),
            "bands the 95 % interval where the runs kept predictions, else ± one standard deviation over seeds",
        )
        caption = (
            f"{title}: A_t (%) after each task against the number of classes (domain-incremental: domains) seen; "
            "lines are means over "
            f"seeds, {band_text}; solid = per-sample protocol, dashed = reference. " + provenance(runs)
        )
        out = _save(fig, out_dir, name, title, caption, runs, dpi)
        out.key = series_key(groups, [k for _, ks in chunks for k in ks])
        return out


def accuracy_matrices(coll: Collection, out_dir: Path) -> list[FigureOut]:
    """Heatmaps of R[t][j] (mean over seeds) per strategy: one panel per row key, up to :data:`MATRIX_PANELS` per
    figure, one or more figures per benchmark."""
    groups = coll.acc_groups()
    out = []
    for bench in coll.benches():
        bench_keys = [k for k in groups if k.bench == bench]
        several_backbones = len({(k.backbone, k.weights) for k in bench_keys}) > 1
        pages = [bench_keys[i : i + MATRIX_PANELS] for i in range(0, len(bench_keys), MATRIX_PANELS)]
        for page, keys in enumerate(pages, start=1):
            out.append(_matrix_page(groups, keys, bench, several_backbones, page, len(pages), out_dir))
    return out


def _matrix_page(
    groups: dict[Any, list[Run]],
    keys: list[Any],
    bench: str,
    several_backbones: bool,
    page: int,
    pages: int,
    out_dir: Path,
) -> FigureOut:
    """One figure of :func:`accuracy_matrices`: up to :data:`MATRIX_PANELS` row keys of one benchmark."""
    import matplotlib
    import seaborn as sns

    with matplotlib.rc_context({**RC, "axes.grid": False}):
        ncols, nrows = _panel_grid(len(keys))
        fig, axes = _new_figure(ncols, nrows, 4.2, 3.6)
        for ax, key in zip(axes, keys, strict=False):
            mats = [_square(r.summary(key.protocol).accuracy_matrix) for r in groups[key]]
            n = min(m.shape[0] for m in mats)
            mean = _nanmean(np.stack([m[:n, :n] for m in mats]))  # (T, T), NaN above the diagonal
            labels = [str(i + 1) for i in range(n)]
            sns.heatmap(
                mean,
                mask=np.isnan(mean),
                vmin=0,
                vmax=100,
                cmap="viridis",
                annot=n <= 10,
                fmt=".0f",
                annot_kws={"fontsize": 7},
                square=True,
                ax=ax,
                xticklabels=labels,
                yticklabels=labels,
                cbar_kws={"label": "accuracy (%)", "shrink": 0.8},
            )
            ax.set_xlabel("task j (test classes)")
            ax.set_ylabel("after learning task t")
            t = f"{key.strategy}, {key.protocol} (n={len(groups[key])})"
            ax.set_title(t + (f"\n{key.backbone} ({key.weights})" if several_backbones else ""))
        _hide_unused(axes, len(keys))
        runs = _unique_runs([groups[k] for k in keys])
        title = f"Accuracy matrices, {bench}" + (f" ({page} of {pages})" if pages > 1 else "")
        caption = (
            f"{title}: R[t][j] (%), accuracy on task j's classes after learning task t, mean over seeds. "
            + provenance(runs)
        )
        name = f"accuracy_matrix_{slug(bench)}" + (f"_{page}" if page > 1 else "")
        return _save(fig, out_dir, name, title, caption, runs)


def _nanmean(stack: np.ndarray) -> np.ndarray:
    """Mean over axis 0 ignoring NaN; NaN (without a warning) where every value is NaN."""
    count = np.sum(~np.isnan(stack), axis=0)
    total = np.nansum(stack, axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _count_label(x: float, _pos: Any = None) -> str:
    """1, 10, 100, 1k, 10k, 1M: parameter counts on a log axis."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:g}{suffix}"
    return f"{x:g}"


def _square(matrix: Sequence[Sequence[float]]) -> np.ndarray:
    n = len(matrix)
    out = np.full((n, n), np.nan)
    for t, row in enumerate(matrix):
        out[t, : len(row)] = [np.nan if v is None else v for v in row]
    return out


def accuracy_vs_params(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Final accuracy (mean ± std over seeds) against parameters added to the frozen backbone (log scale)."""
    import matplotlib
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from clbench.report.leaderboard import needs_backbone, short_label

    groups = coll.acc_groups()
    benches = coll.benches()
    if not benches:
        return None
    colors = strategy_colors(coll)
    several = needs_backbone(list(groups))
    with matplotlib.rc_context(RC):
        fig, panels = _bench_panels(benches, groups)
        for panel in panels:
            ax = panel.ax
            xs = []
            for key in panel.keys:
                runs = groups[key]
                acc = [r.summary(key.protocol).last_acc for r in runs]
                added = float(np.mean([r.record.params.added_total for r in runs]))
                x = max(added, 1.0)  # log axis: a method that adds nothing sits at 1
                xs.append(x)
                std = float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0
                ax.errorbar(
                    [x],
                    [float(np.mean(acc))],
                    yerr=[std],
                    fmt=panel.marker(key),
                    ms=6,
                    capsize=3,
                    color=colors[key.strategy],
                    mfc="white" if key.protocol != "per-sample" else None,
                    label=f"{short_label(key, several)} (n={len(runs)})" + ("" if added > 0 else ", adds 0"),
                )
            ax.set_xscale("log")
            ax.set_xlim(min(xs) / 2.5, max(xs) * 4)  # at least a decade
            ax.xaxis.set_major_formatter(FuncFormatter(_count_label))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(panel.bench)
            ax.set_xlabel("parameters added to the frozen backbone (log)")
            ax.set_ylabel("final accuracy A_T (%)")
            _legend_outside(ax)
        runs = _unique_runs(list(groups.values()))
        title = "Final accuracy against added parameters"
        caption = (
            f"{title}: mean ± std over seeds; filled markers = per-sample protocol, open = other protocols. "
            + provenance(runs)
        )
        return _save(fig, out_dir, "accuracy_vs_params", title, caption, runs)


def _phase_seconds(t: Times, phase: str) -> float:
    if phase == "other":  # loading the backbone and data, building the strategy: total minus the timed phases
        return max(0.0, t.total - t.features - t.train - t.eval)
    return float(getattr(t, phase))


def wall_clock(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Seconds per run (mean over seeds) split into frozen-feature extraction, training and evaluation."""
    import matplotlib

    groups = coll.run_groups()
    if not groups:
        return None
    keys = list(groups)[::-1]  # barh draws bottom-up; keep table order top-down
    with matplotlib.rc_context({**RC, "axes.grid": False}):
        fig, (ax,) = _new_figure(1, 1, 9.0, 1.2 + 0.42 * len(keys))
        parts = [(k.bench, k.strategy, k.backbone, k.protocols) for k in keys]
        shared = [j for j in range(4) if len({p[j] for p in parts}) == 1 and len(keys) > 1]
        labels = []
        for i, key in enumerate(keys):
            runs = groups[key]
            left = 0.0
            for phase, color in PHASE_COLORS.items():
                sec = float(np.mean([_phase_seconds(r.record.time_s, phase) for r in runs]))
                ax.barh(i, sec, left=left, color=color, label=phase if i == 0 else None, height=0.65)
                left += sec
            ax.text(left, i, f" {left:,.1f} s", va="center", fontsize=7)
            differing = [p for j, p in enumerate(parts[i]) if j not in shared]  # what tells the rows apart
            labels.append(f"{' | '.join(differing)} (n={len(runs)})")
        ax.set_yticks(range(len(keys)), labels)
        common = " | ".join(parts[0][j] for j in shared)
        ax.set_xlabel("wall-clock seconds per run (mean over seeds)")
        if common:
            ax.set_title(f"every row: {common}", fontsize=7, loc="left")
        ax.margins(x=0.15)
        ax.legend(loc="lower right", ncol=1, frameon=False)
        runs = _unique_runs(list(groups.values()))
        title = "Wall-clock time per run"
        caption = (
            f"{title}: features = frozen-feature extraction (near 0 on a feature-cache hit), train, eval "
            f"(every protocol the run evaluated), other = the rest of the run's total (loading backbone and "
            f"data). " + provenance(runs)
        )
        return _save(fig, out_dir, "wall_clock", title, caption, runs)


def routing(coll: Collection, out_dir: Path) -> FigureOut | None:
    """For strategies that route between per-task modules: routing accuracy per task after the last task, and
    accuracy with the chosen modules against accuracy with each image's own task's module (oracle)."""
    import matplotlib

    from clbench.report.leaderboard import display_name

    groups = {k: [r for r in runs if routing_protocols(r)] for k, runs in coll.run_groups().items()}
    groups = {k: runs for k, runs in groups.items() if runs}
    if not groups:
        return None
    with matplotlib.rc_context(RC):
        fig, axes = _new_figure(2, len(groups), 5.0, 3.4)
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
                mean, std = _mean_std_curves(diag_curves)
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
            mean, std = _mean_std_curves(oracle)
            xs = np.array(runs[0].seen_axis[0][: len(mean)])
            ax_curve.plot(xs, mean, ":", marker="s", ms=3, color="black", label="oracle (own task's module)")
            _seen_ticks(ax_curve, runs[0].seen_axis)
            ax_curve.set_ylabel("accuracy (%)")
            ax_curve.set_title(f"{short}: routed vs oracle accuracy")
            ax_curve.legend(frameon=False)
        runs = _unique_runs(list(groups.values()))
        title = "Routing between per-task modules"
        benches = ", ".join(sorted({k.bench for k in groups}))
        caption = (
            f"{title} ({benches}): left, share of each task's test images routed to that task's module after the last "
            f"task (mean ± std over seeds); right, accuracy with the routed modules and with each image's own "
            f"task's module (oracle) after each task. " + provenance(runs)
        )
        return _save(fig, out_dir, "routing", title, caption, runs)


# ------------------------------------------------------------------------------------------- t-SNE
def load_features(run: Run) -> dict[str, np.ndarray]:
    """``features.npz`` beside the record (:mod:`clbench.features.embeddings`): ``index`` (the subsample's test images),
    ``labels``, ``tasks``, ``frozen`` and maybe ``adapted``, reduced (``format``). A file of an older clbench holds
    the whole test split's unreduced features without ``index``: it is read as the subsample of every image. Read
    bounded (:data:`FEATURES_MAX_BYTES` on disk and expanded, every array header checked before it is allocated:
    :func:`clbench.files.safety.npz_arrays`); ValueError for a file that is not one, or whose sizes differ from its
    record's test split."""
    from clbench.errors import ClbenchError
    from clbench.features.embeddings import FORMAT
    from clbench.files.safety import npz_arrays, read_bytes

    n_test = (run.record.n_images or {}).get("test")
    # what the record's test split can need: fp16 frozen and adapted features up to FEATURE_WIDTH wide per image
    limit = FEATURES_MAX_BYTES if n_test is None else min(FEATURES_MAX_BYTES, 2**26 + n_test * 4 * FEATURE_WIDTH)
    try:
        raw = read_bytes(run.path / "features.npz", limit, "features")
    except ClbenchError as e:
        raise ValueError(str(e.args[0]).rsplit(": ", 1)[-1]) from None
    data = npz_arrays(raw, limit)
    missing = {"frozen", "labels", "tasks"} - set(data)
    if missing:
        raise ValueError(f"features.npz lacks {', '.join(sorted(missing))}")
    text = {k: str(data.pop(k)) for k in ("format", "embedding") if k in data and data[k].dtype.kind == "U"}
    if "format" in text and text["format"] != FORMAT:
        raise ValueError(f"features.npz holds {text['format']!r} embeddings; this clbench reads {FORMAT!r}")
    if "index" not in data:  # an older clbench's file: every test image, unreduced
        n = len(data["labels"]) if n_test is None else n_test
        data["index"] = np.arange(n)
    n = len(data["index"])
    for name, arr in data.items():
        if name in ("format", "embedding"):
            raise ValueError(f"{name} is {arr.dtype}, expected text")
        if arr.ndim not in (1, 2) or arr.shape[0] != n or arr.dtype.kind not in "iuf":
            raise ValueError(f"{name} is {arr.dtype} {arr.shape}, expected {n} rows of numbers (the test split)")
    index = data["index"]
    if n and (index.min() < 0 or (n_test is not None and index.max() >= n_test)):
        raise ValueError(f"index names test images outside the record's {n_test}")
    return {**data, **{k: np.array(v) for k, v in text.items()}}


FEATURES_MAX_BYTES = 2**30  # frozen and adapted fp16 features of a 100k-image test split at d=2048 stay below
FEATURE_WIDTH = 8192  # widest feature a backbone gives (ViT-g: 1536; ViT-22B: 6144)
TSNE_PANELS = 16  # panels per t-SNE figure (4 x 4: the frozen features and 15 methods); more: further figures


def subsample(n: int, max_points: int = TSNE_MAX_POINTS, seed: int = TSNE_SEED) -> np.ndarray:
    """Sorted indices of at most ``max_points`` of ``n`` points, the same for the same ``n``."""
    from clbench.features.embeddings import subsample as pick

    return pick(n, max_points, seed)


def tsne_embed(x: np.ndarray, seed: int = TSNE_SEED) -> np.ndarray:
    """(N, k) -> (N, 2): scikit-learn t-SNE of embeddings reduced by :func:`clbench.features.embeddings.reduce`
    (L2-normalised,
    PCA: the cosine geometry the heads see)."""
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    x = x.astype(np.float32)
    perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
    tsne = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity, learning_rate="auto")
    # One OpenMP thread: on a shared machine, spinning OpenMP threads made a 1000-point t-SNE 7x slower
    # (49 s against 6.6 s on 2 busy cores); at <= 1500 points one thread is fast enough anywhere.
    with threadpool_limits(limits=1, user_api="openmp"):
        return tsne.fit_transform(x)


def _digest(x: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes()).hexdigest()


TSNE_PARALLEL_POINTS = 300  # below this many points per embedding, worker processes cost more than they save


def embed_all(xs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`tsne_embed` of each distinct array, keyed by its digest. Several large ones run in worker processes,
    one per available core, each on one thread: the same numbers as in this process (one OpenMP thread each, so
    no reduction order depends on the thread count), a report's seven 500-point panels in about half the time
    on two cores."""
    todo = {_digest(x): x for x in xs}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(cores, len(todo))
    if jobs < 2 or max(len(x) for x in todo.values()) < TSNE_PARALLEL_POINTS:
        return {h: tsne_embed(x) for h, x in todo.items()}
    from joblib import Parallel, delayed

    done = Parallel(n_jobs=jobs, backend="loky")(delayed(tsne_embed)(x) for x in todo.values())
    return dict(zip(todo, done, strict=True))


@dataclass
class _TsnePanel:
    """One t-SNE panel: a title, the embedding drawn and each point's task."""

    title: str
    x: np.ndarray  # (n, k) reduced embeddings
    tasks: np.ndarray
    runs: list[Run]


def _tsne_panels(
    runs: Sequence[Run], labels: dict[str, str], max_points: int, notes: list[str]
) -> dict[tuple[str, str], list[_TsnePanel]]:
    """Per (benchmark, backbone): the frozen features' panel first (naming the methods that classify them), then
    one panel per run whose method scores something else; the same test images (the first run's subsample) in
    every panel."""
    from clbench.features import embeddings
    from clbench.features.embeddings import reduce

    out: dict[tuple[str, str], list[_TsnePanel]] = {}
    frozen_users: dict[tuple[str, str], list[str]] = {}
    chosen: dict[tuple[str, str], np.ndarray] = {}
    for run in runs:
        try:
            data = load_features(run)
        except (OSError, ValueError, KeyError) as e:
            notes.append(f"no t-SNE for run {run.run_id}: features.npz is unreadable ({e})")
            continue
        rec = run.record
        group = (rec.bench, f"{rec.backbone} {rec.img_size}px, {run.weights_label}" if rec.img_size else rec.backbone)
        index = data["index"]
        if group not in chosen:  # the images every record of this test split keeps (an older file: all of them)
            kept = embeddings.subsample((rec.n_images or {}).get("test") or len(index))
            chosen[group] = kept[subsample(len(kept), max_points)]
        keep = np.isin(index, chosen[group])
        if keep.sum() != len(chosen[group]):
            notes.append(f"no t-SNE panel for run {run.run_id}: its features.npz holds other test images")
            continue

        arrays = {k: data[k][keep] for k in ("frozen", "adapted") if k in data}
        if "format" not in data:  # an older clbench's file holds unreduced features
            arrays = {k: reduce(a) for k, a in arrays.items()}
        panels = out.setdefault(group, [])
        if not panels:
            panels.append(_TsnePanel("", arrays["frozen"], data["tasks"][keep], [run]))
        if "adapted" in arrays:
            kind = str(data.get("embedding", "adapted features"))
            panels.append(_TsnePanel(f"{labels[run.run_id]}\n{kind}", arrays["adapted"], data["tasks"][keep], [run]))
        else:
            frozen_users.setdefault(group, []).append(labels[run.run_id])
            if run not in panels[0].runs:
                panels[0].runs.append(run)
    for group, panels in out.items():
        users = frozen_users.get(group, [])
        panels[0].title = "frozen features" + (
            f"\n(what {', '.join(users)} classif{'y' if len(users) > 1 else 'ies'})" if users else ""
        )
    return out


def tsne(
    coll: Collection, out_dir: Path, max_points: int = TSNE_MAX_POINTS, main: Collection | None = None
) -> tuple[list[FigureOut], list[str]]:
    """t-SNE of what each method's classifier sees, coloured by task: per benchmark and backbone, the frozen
    features once (the reference panel) and one panel per method of the main table (``main``; default: every run
    configuration) that scores something else, from the first seed whose record kept ``features.npz``; the same
    test images, t-SNE settings and seed in every panel. Returns figures and notes (which rows have none, why)."""
    import matplotlib

    from clbench.report.leaderboard import short_label

    rows = coll if main is None else main
    figures: list[FigureOut] = []
    notes: list[str] = []
    picked: list[Run] = []
    labels: dict[str, str] = {}
    missing: set[AccKey] = set()
    for key, group in rows.acc_groups().items():
        run = next((r for r in sorted(group, key=lambda r: r.seed) if r.has_features()), None)
        if run is None and key._replace(protocol="per-sample") in missing:
            continue  # another protocol of the same runs: named once
        if run is None:
            missing.add(key._replace(protocol="per-sample"))
            name = short_label(key._replace(protocol="per-sample"))
            notes.append(
                f"no t-SNE panel for {name} on {key.bench}: no features.npz beside "
                f"{', '.join(r.run_id for r in group)} (made before records kept them: run it again to draw its panel)"
            )
        elif run.run_id not in labels:  # one run evaluated under two protocols embeds once
            picked.append(run)
            labels[run.run_id] = short_label(key._replace(protocol="per-sample"))
    groups = _tsne_panels(picked, labels, max_points, notes)
    cache = embed_all([p.x for panels in groups.values() for p in panels])
    for (bench, backbone), panels in groups.items():
        for page, start in enumerate(range(0, len(panels), TSNE_PANELS)):
            chunk = panels[start : start + TSNE_PANELS]
            cols = min(4, len(chunk))
            with matplotlib.rc_context({**RC, "axes.grid": False}):
                fig, axes = _new_figure(cols, math.ceil(len(chunk) / cols), 3.4, 3.5)
                n_tasks = int(max(p.tasks.max() for p in chunk)) + 1 if chunk[0].tasks.size else 1
                runs = [r for p in chunk for r in p.runs]
                domain = any((r.record.scenario or "class") == "domain" for r in runs)
                unit = "domain" if domain else "task"  # the domain scenario's tasks are its domains
                cmap = matplotlib.colormaps["tab10" if n_tasks <= 10 else "tab20"]
                for ax, panel in zip(axes, chunk, strict=False):
                    e = cache[_digest(panel.x)]
                    for t in range(n_tasks):
                        m = panel.tasks == t
                        ax.scatter(e[m, 0], e[m, 1], color=cmap(t % cmap.N), s=4, linewidths=0, label=f"{unit} {t + 1}")
                    ax.set_title(panel.title, fontsize=8)
                for ax in axes:
                    ax.set_xticks([])
                    ax.set_yticks([])
                    ax.spines[:].set_visible(False)
                for ax in axes[len(chunk) :]:
                    ax.set_visible(False)
                handles, names = axes[0].get_legend_handles_labels()
                fig.legend(handles, names, loc="outside right upper", frameon=False, markerscale=3, fontsize=7)
                suffix = f" ({page + 1})" if len(panels) > TSNE_PANELS else ""
                title = f"t-SNE of what each method classifies, {bench} ({backbone}){suffix}"
                colour = "the domain they were drawn in" if domain else "the task that brought their class"
                caption = (
                    f"{title}: {len(chunk[0].tasks)} test images (the same in every panel), coloured by {colour}; "
                    "each method's embeddings L2-normalised and reduced to 50 dimensions "
                    f"by PCA when the run was recorded, then scikit-learn t-SNE (init pca, random_state {TSNE_SEED}). "
                    "The first panel is the frozen backbone's features, which the methods it names classify "
                    "directly. " + provenance(runs)
                )
                name = f"tsne_{slug(bench)}_{slug(backbone)}" + (f"_{page + 1}" if suffix else "")
                figures.append(_save(fig, out_dir, name, title, caption, runs))
    return figures, notes


# ------------------------------------------------------------------------------------------- routing study
def routing_study(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Routed accuracy after each task per router (mean over seeds), oracle as the ceiling; one panel per benchmark
    and strategy setting."""
    import matplotlib

    from clbench.report.routing import BOUND, _seed_groups, router_curves, study_runs

    runs = study_runs(coll)
    if not runs:
        return None
    groups = _seed_groups(runs)
    varied = _varied_settings(list(groups))
    with matplotlib.rc_context(RC):
        cols = min(len(groups), 4)
        fig, axes = _new_figure(cols, (len(groups) + cols - 1) // cols, 3.6, 2.7)
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
            _seen_ticks(ax, (xs, xlabel), fontsize=7)
            ax.set_ylabel("routed accuracy (%)", fontsize=7)
            setting = f", {varied[key]}" if varied[key] else ""
            ax.set_title(f"{strategy} on {bench}{setting} ({len(group)} runs)", fontsize=8)  # the caption names them
            ax.tick_params(labelsize=6)
        handles, labels = axes[0].get_legend_handles_labels()  # every panel draws the same routers
        fig.legend(handles, labels, loc="outside right upper", frameon=False, fontsize=7)
        _hide_unused(axes, len(groups))
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
        ncols, nrows = _panel_grid(len(benches))
        fig, axes = _new_figure(ncols, nrows, 5.2, 3.8)
        _hide_unused(axes, len(benches))
        for ax, bench in zip(axes, benches, strict=False):
            for curve in (c for c in curves if c.bench == bench):
                xs = [max(p.steps, 1) for p in curve.points]  # log axis: a run without steps sits at 1
                ys = [p.mean for p in curve.points]
                color = strategy_color(curve.strategy)  # the strategy's colour in every figure
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[p.std for p in curve.points],
                    fmt="-o",
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
            ax.xaxis.set_major_formatter(FuncFormatter(_count_label))
            ax.set_title(bench)
            ax.set_xlabel("training budget: optimizer steps, all tasks (log)")
            ax.set_ylabel("final accuracy A_T (%)")
            _legend_outside(ax)
        runs = [by_id[rid] for c in curves for p in c.points for rid in p.runs if rid in by_id]
        title = "Final accuracy against training budget"
        caption = (
            f"{title}: each line holds one strategy's records that differ only in their budget (epochs, "
            "train_per_class, a step schedule's milestone) "
            "(mean ± std over seeds); open square = the strategy's quick profile's budget, star = the reference's "
            "epochs (its default config). " + provenance(runs)
        )
        return _save(fig, out_dir, "budget_curves", title, caption, runs)


# ------------------------------------------------------------------------------------------- all
@dataclass(frozen=True)
class FigureInputs:
    """What a report's figures are drawn from: every record (``coll``), the main table's rows (``rows``), and the
    report's options."""

    coll: Collection
    rows: Collection
    out_dir: Path
    predicted: Any
    budget: Sequence[BudgetCurve]
    main: Collection | None
    tsne_points: int


@dataclass(frozen=True)
class FigureKind:
    """One kind of report figure: its name (as the registry lists it) and how it is drawn; ``make`` returns the
    figures (none where the records hold nothing for it) and notes on what is absent."""

    name: str
    make: Callable[[FigureInputs], tuple[list[FigureOut], list[str]]]


def _one(f: FigureOut | None) -> tuple[list[FigureOut], list[str]]:
    return ([] if f is None else [f]), []


def _paired(i: FigureInputs) -> tuple[list[FigureOut], list[str]]:
    from clbench.report.uncertainty import paired_rows

    rows = paired_rows(i.rows, i.predicted)  # only where runs kept predictions
    return _one(paired_matrix(rows, i.rows, i.out_dir, "paired_differences", "Paired differences"))


# The report's figures in the order the report shows them.
REPORT_FIGURES: tuple[FigureKind, ...] = (
    FigureKind("accuracy_curves", lambda i: _one(accuracy_curves(i.rows, i.out_dir, predicted=i.predicted))),
    FigureKind("accuracy_matrices", lambda i: (accuracy_matrices(i.rows, i.out_dir), [])),
    FigureKind("accuracy_vs_params", lambda i: _one(accuracy_vs_params(i.rows, i.out_dir))),
    FigureKind("wall_clock", lambda i: _one(wall_clock(i.rows, i.out_dir))),
    FigureKind("routing", lambda i: _one(routing(i.rows, i.out_dir))),
    FigureKind("routing_study", lambda i: _one(routing_study(i.coll, i.out_dir))),
    FigureKind("budget_curves", lambda i: _one(budget_curves_figure(i.coll, i.out_dir, i.budget))),
    FigureKind("paired_differences", _paired),
    FigureKind("tsne", lambda i: tsne(i.coll, i.out_dir, i.tsne_points, i.main)),
)


def make_figures(
    coll: Collection,
    out_dir: Path,
    with_tsne: bool = True,
    tsne_points: int = TSNE_MAX_POINTS,
    budget: Sequence[BudgetCurve] = (),
    main: Collection | None = None,
    predicted: Any = None,
) -> tuple[list[FigureOut], list[str]]:
    """Every figure of :data:`REPORT_FIGURES`, saved under ``out_dir/figures``; returns them and notes on what is
    absent. ``budget``: the budget curves to draw (:func:`clbench.report.budget.budget_curves`); ``main``: the main
    table's rows (:mod:`clbench.report.leaderboard`): the accuracy curves, the accuracy matrices and the paired
    differences show those only (default: every row)."""
    from clbench.report.uncertainty import Predicted

    inputs = FigureInputs(
        coll, coll if main is None else main, out_dir, predicted or Predicted(), budget, main, tsne_points
    )
    figs: list[FigureOut] = []
    notes: list[str] = []
    for kind in REPORT_FIGURES:
        if kind.name == "tsne" and not with_tsne:
            notes.append("t-SNE figures were not made (--no-tsne)")
            continue
        made, said = kind.make(inputs)
        figs += made
        notes += said
        if kind.name == "budget_curves" and main is not None:
            notes.append(
                "accuracy curves, accuracy matrices, accuracy vs parameters, wall-clock, routing and paired "
                "differences show the main table's rows; the other records are in their sections' tables"
            )
    return figs, notes


def paired_matrix(rows: Sequence[Any], coll: Collection, out_dir: Path, name: str, title: str) -> FigureOut | None:
    """Final accuracy of row minus column (points) for every tested pair (:class:`clbench.report.uncertainty.
    PairRow`), one panel per benchmark and protocol; * marks pairs that differ at 5 % after Holm's correction,
    n/p pairs that could not be paired."""
    import matplotlib

    from clbench.report.leaderboard import needs_backbone, short_label

    settings = sorted({(r.bench, r.protocol) for r in rows})
    if not any(r.test is not None for r in rows):
        return None
    keys = list({k for r in rows for k in (r.key_a, r.key_b) if k is not None})
    several = needs_backbone(keys)

    def name_of(r: Any, side: str) -> str:  # the short label of a pair's side (its key), else the row's own label
        key = r.key_a if side == "a" else r.key_b
        label = short_label(key, several) if key is not None else (r.a if side == "a" else r.b)
        return label.replace(f", {key.protocol} protocol", "") if key is not None else label

    biggest = max(len({name_of(r, "a") for r in rows} | {name_of(r, "b") for r in rows}), 2)
    side = max(4.6, 0.5 * biggest + 2.6)  # a cell of about half an inch, room for the labels and the colour bar
    with matplotlib.rc_context({**RC, "axes.grid": False}):
        ncols, nrows = _panel_grid(len(settings), 2)
        fig, axes = _new_figure(ncols, nrows, side + 1.2, side)
        fig.get_layout_engine().set(w_pad=0.15, h_pad=0.15)  # inches: rotated tick labels stay on the canvas
        for ax, (bench, protocol) in zip(axes, settings, strict=False):
            mine = [r for r in rows if (r.bench, r.protocol) == (bench, protocol)]
            names = sorted({name_of(r, "a") for r in mine} | {name_of(r, "b") for r in mine})
            at = {n: i for i, n in enumerate(names)}
            diff = np.full((len(names), len(names)), np.nan)
            marks = [["" for _ in names] for _ in names]
            for r in mine:
                i, j = at[name_of(r, "a")], at[name_of(r, "b")]
                if r.test is None:
                    marks[i][j] = marks[j][i] = "n/p"
                    continue
                diff[i, j], diff[j, i] = r.test.diff.value, -r.test.diff.value
                star = "*" if r.significant else ""
                marks[i][j] = f"{r.test.diff.value:+.1f}{star}"
                marks[j][i] = f"{-r.test.diff.value:+.1f}{star}"
            lim = max(1.0, float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 1.0)
            im = ax.imshow(diff, cmap="RdBu", vmin=-lim, vmax=lim)
            for i in range(len(names)):
                for j in range(len(names)):
                    if marks[i][j]:
                        dark = np.isfinite(diff[i, j]) and abs(diff[i, j]) > 0.6 * lim
                        color = "white" if dark else "black"
                        ax.text(j, i, marks[i][j], ha="center", va="center", fontsize=6.5, color=color)
            ax.set_xticks(range(len(names)), names, rotation=90)  # upright boxes: neighbours never touch
            ax.set_yticks(range(len(names)), names)
            one_bench = len({b for b, _ in settings}) == 1
            ax.set_title(f"{protocol} protocol" if one_bench else f"{bench}, {protocol}", fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.8, label="row - column (points)")
        _hide_unused(axes, len(settings))
        caption = (
            f"{title} ({', '.join(sorted({b for b, _ in settings}))}): final accuracy of the row's strategy minus "
            "the column's, in points, on the same test images "
            "and seeds; * = significantly different at 5 % (exact McNemar for one seed, paired bootstrap over "
            "images for several, seeds held fixed; Holm-corrected over the pairs of each panel); n/p = not "
            "paired (other seeds, class order or test set). " + provenance(coll.runs)
        )
        return _save(fig, out_dir, name, title, caption, coll.runs)
