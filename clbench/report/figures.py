"""Report figures (matplotlib + seaborn), each saved as PNG and SVG with a caption naming its runs.

No pyplot: figures are plain :class:`matplotlib.figure.Figure` objects, so making a report changes no global
backend or style of the calling process. Colours follow the strategy across every figure; line style follows
the protocol (per-sample solid, reference dashed); marker follows the backbone.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.core.catalog import FAMILIES, STRATEGY_LOOKS, card
from clbench.errors import ClbenchError
from clbench.features import embeddings
from clbench.features.embeddings import FORMAT, reduce
from clbench.features.embeddings import POINTS as EMBEDDED_POINTS
from clbench.features.embeddings import subsample as pick
from clbench.files.safety import npz_arrays, read_bytes
from clbench.records.features import checked_embeddings
from clbench.records.results import TaskEntry, Times
from clbench.records.routing_diagnostics import routing_or_none
from clbench.report.budget import QUICK, REFERENCE, BudgetCurve, curve_label
from clbench.report.collect import DOMAINS_SEEN, AccKey, Collection, Run
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _final,
    _save,
    provenance,
    slug,
)
from clbench.report.forest import forest_from_collection, forest_of_study
from clbench.report.labels import display_name, needs_backbone, short_label
from clbench.report.tables import routing_protocols
from clbench.report.uncertainty import Predicted, row_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MATRIX_PANELS = 12  # heatmaps per accuracy-matrix figure (more: further figures; 63 in one ran out of memory)
TSNE_MAX_POINTS = EMBEDDED_POINTS  # the test images a record keeps (clbench.features.embeddings.POINTS)
TSNE_SEED = 0  # fixed random_state and subsample seed: the same records give the same picture
PROTOCOL_STYLE = {"per-sample": "-", "reference": "--"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
# Okabe-Ito, no two closer than CIEDE2000 21 (tests/test_report_figures.py)
PHASE_COLORS = {"features": "#56B4E9", "train": "#E69F00", "eval": "#009E73", "other": "#BBBBBB"}


# ------------------------------------------------------------------------------------------- helpers


def _seen_ticks(ax: Any, axis: tuple[list[int], str], fontsize: float | None = None) -> None:
    """Label the x axis of curves after each task; domains seen (a handful of steps) get one tick each."""
    xs, label = axis
    ax.set_xlabel(label, **({"fontsize": fontsize} if fontsize else {}))

    if label == DOMAINS_SEEN:
        ax.set_xticks(xs)


def _unique_runs(groups: Sequence[Sequence[Run]]) -> list[Run]:
    seen: dict[str, Run] = {}
    for runs in groups:
        for r in runs:
            seen.setdefault(r.run_id, r)
    return list(seen.values())


# One colour per strategy, the same in every figure and every report (``clbench.core.catalog.STRATEGY_LOOKS``); a name
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


# Panels of the accuracy curves: a method card's ``family`` (clbench.core.catalog.MethodCard) -> the panel's title, in
# panel order; a method whose card names none (a plug-in) goes to OTHER_FAMILY.
OTHER_FAMILY = "Other methods"
# Okabe-Ito's colour-blind-safe colours (black kept for the baseline): the series of one panel take them in turn, so
# no two lines of a panel are closer than CIEDE2000 21 (tests/test_report_figures.py); markers are a second cue.
PANEL_COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")
# more series in one axes (budget curves): Okabe-Ito's, then Tol's wine, olive and indigo and a dark grey, each at
# least CIEDE2000 20 from the others
SERIES_COLORS = (*PANEL_COLORS, "#882255", "#999933", "#332288", "#666666")
BASELINE_COLOR = "#000000"
PANEL_SERIES = len(PANEL_COLORS)  # series per panel besides the baseline: more split the family into two panels
WIDE_BAND = 0.3  # a band wider than this share of the y range (anywhere) is left out: it would hide the panel
LEGEND_CHARS = 22  # characters per legend line beside a panel (README width: ~900 px for the whole figure)


def method_family(strategy: str) -> str:
    """The panel title of ``strategy``'s family (:data:`clbench.core.catalog.FAMILIES`) read from its method card."""
    try:
        family = card(base_strategy(strategy)).family
    except (ClbenchError, LookupError, ImportError, AttributeError):
        family = ""
    return FAMILIES.get(family, OTHER_FAMILY)


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
        mean, std = _mean_std_curves([r.summary(key.protocol).acc_curve for r in runs])
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
            _seen_ticks(ax, groups[(keys or [base])[0]][0].seen_axis)
            ax.set_ylabel("accuracy A_t (%)")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0.0, handlelength=2.2)
        runs = _unique_runs([groups[k] for k in dict.fromkeys(shown)])
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


# One colour and marker per method family (:data:`clbench.core.catalog.FAMILIES`, Okabe-Ito; grey for a plug-in's):
# the accuracy-memory figure's points, labelled by method.
FAMILY_LOOKS = {
    "Prompts": ("#0072B2", "o"),
    "Adapters": ("#E69F00", "s"),
    "LoRA": ("#009E73", "^"),
    "Whole ViT": ("#CC79A7", "D"),
    "Closed-form heads and prototypes": ("#56B4E9", "v"),
    "TOSCA and its routers": ("#D55E00", "P"),
    OTHER_FAMILY: ("#000000", "X"),
}
MEMORY_AXES = (
    ("added_total", "Added parameters", "parameters added to the frozen backbone (log)"),
    ("stored_total", "Stored numbers", "numbers stored besides them: prototypes, statistics (log)"),
)


def _zero_at(values: Sequence[float]) -> float:
    """Where a count of 0 sits on a log axis: a decade below the smallest positive count (1 if none)."""
    positive = [v for v in values if v > 0]
    return 10.0 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1.0


def _draw(fig: Figure) -> None:
    """Lay out and draw ``fig`` on an Agg canvas (text sizes known), without pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()


def _label_points(ax: Axes, texts: list[Any], xs: list[float], ys: list[float]) -> None:
    """Move the point labels of ``ax`` apart and off the points (adjustText), inside the axes."""
    from adjustText import adjust_text

    if not texts:
        return
    adjust_text(
        texts,
        x=xs,
        y=ys,
        ax=ax,
        expand=(1.15, 1.4),
        arrowprops={"arrowstyle": "-", "color": "#999999", "lw": 0.6},
        iter_lim=1000,
    )


def accuracy_vs_params(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Final accuracy (mean over seeds) against the parameters a method adds to the frozen backbone and, beside it,
    against the numbers it stores besides them (prototypes, covariances, Gram matrices, random projections), both on
    log axes; each point labelled by its method, coloured and marked by its family (:data:`FAMILY_LOOKS`)."""
    import matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    groups = coll.acc_groups()
    benches = coll.benches()
    if not benches:
        return None
    several = needs_backbone(list(groups))
    with matplotlib.rc_context({**RC, "font.size": 10, "legend.fontsize": 9}):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10.0, 4.6 * len(benches) + 0.5), layout="constrained")
        grid = fig.subplots(len(benches), 2, sharey="row", squeeze=False)
        placed: list[tuple[Axes, list[Any], list[float], list[float]]] = []
        seen_families: dict[str, None] = {}
        for row, bench in zip(grid, benches, strict=True):
            keys = [k for k in groups if k.bench == bench]
            for ax, (field_name, what, xlabel) in zip(row, MEMORY_AXES, strict=True):
                counts = {k: float(np.mean([getattr(r.record.params, field_name) for r in groups[k]])) for k in keys}
                zero = _zero_at(list(counts.values()))
                texts, xs, ys = [], [], []
                at: dict[tuple[float, float], list[str]] = {}  # one label for points drawn on each other
                for key in keys:
                    acc = float(np.mean([r.summary(key.protocol).last_acc for r in groups[key]]))
                    family = method_family(key.strategy)
                    seen_families[family] = None
                    color, marker = FAMILY_LOOKS[family]
                    x = counts[key] if counts[key] > 0 else zero
                    mfc = color if key.protocol == "per-sample" else "white"
                    ax.plot([x], [acc], marker=marker, ms=7, color=color, mfc=mfc, mew=1.4, lw=0, zorder=3)
                    label = short_label(key, several).replace(" protocol", "")
                    at.setdefault((round(math.log10(x), 2), round(acc, 1)), []).append(label)
                    xs.append(x)
                    ys.append(acc)
                for (lx, acc), labels in at.items():
                    heads = {label.split(", ")[0] for label in labels}
                    label = f"{heads.pop()}, {len(labels)} protocols" if len(heads) == 1 < len(labels) else None
                    texts.append((10**lx, acc, label or " / ".join(labels)))
                ax.set_xscale("log")
                top = max(xs) if xs else 10.0
                ax.set_xlim(zero / 3, top * 5)
                decades = [10.0**e for e in range(int(math.log10(zero)), int(math.log10(top * 5)) + 1)]
                ax.xaxis.set_major_locator(FixedLocator(decades[:: max(1, len(decades) // 6)]))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p, z=zero: "0" if v == z else _count_label(v)))
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_xlabel(xlabel)
                ax.set_title(f"{bench}: {what}" if len(benches) > 1 else what, loc="left")
                placed.append((ax, texts, xs, ys))
            row[0].set_ylabel("final accuracy A_T (%)")
        fig.legend(
            handles=[
                Line2D([], [], lw=0, marker=FAMILY_LOOKS[f][1], color=FAMILY_LOOKS[f][0], ms=7, label=f)
                for f in seen_families
            ],
            loc="outside lower center",
            ncol=min(3, len(seen_families)),
            frameon=False,
        )
        _draw(fig)
        fig.set_layout_engine("none")  # lay out once; the labels then move inside fixed axes
        for ax, labels, xs, ys in placed:  # added after the layout: a label never shrinks the axes
            texts = [ax.text(x, y, label, fontsize=8.5) for x, y, label in labels]
            _label_points(ax, texts, xs, ys)
        runs = _unique_runs(list(groups.values()))
        title = "Final accuracy against memory"
        caption = (
            f"{title}: final accuracy (mean over seeds) against the parameters a method adds to the frozen backbone "
            "(left) and the numbers it stores besides them, such as prototypes, covariances, Gram matrices and random "
            "projections (right), log axes, 0 at the left edge; colour and marker = method family; open markers = "
            "other protocols than per-sample. " + provenance(runs)
        )
        return _save(fig, out_dir, "accuracy_vs_params", title, caption, runs)


def _phase_seconds(t: Times, phase: str) -> float:
    if phase == "other":  # loading the backbone and data, building the strategy: total minus the timed phases
        return max(0.0, t.total - t.features - t.train - t.eval)
    return float(getattr(t, phase))


def _short_run_labels(keys: Sequence[Any]) -> list[str]:
    """``RanPAC``, ``TOSCA (bf16)``: a run group's method (display name and profile) and, where rows differ in them,
    the words of benchmark and backbone that tell them apart."""

    def method(strategy: str) -> str:
        base, _, rest = strategy.partition(" ")
        name, colon, profile = base.partition(":")
        return display_name(name) + (f":{profile}" if colon else "") + (f" {rest}" if rest else "")

    words = [f"{k.bench} {k.backbone}".split() for k in keys]
    common = set.intersection(*(set(w) for w in words)) if words else set()
    out = []
    for k, w in zip(keys, words, strict=True):
        extra = " ".join(x for x in w if x not in common)
        out.append(method(k.strategy) + (f" ({extra})" if extra else ""))
    return out


def wall_clock(coll: Collection, out_dir: Path) -> FigureOut | None:
    """Seconds per run (mean over seeds) on a log axis, slowest first, and beside it each run's split into
    frozen-feature extraction, training, evaluation and the rest (shares of its total)."""
    import matplotlib
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    groups = coll.run_groups()
    if not groups:
        return None
    seconds = {
        k: {ph: float(np.mean([_phase_seconds(r.record.time_s, ph) for r in runs])) for ph in PHASE_COLORS}
        for k, runs in groups.items()
    }
    keys = sorted(groups, key=lambda k: sum(seconds[k].values()))  # barh draws bottom-up: slowest at the top
    labels = [f"{lab} (n={len(groups[k])})" for lab, k in zip(_short_run_labels(keys), keys, strict=True)]
    with matplotlib.rc_context({**RC, "axes.grid": False, "font.size": 10, "legend.fontsize": 9}):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10.0, 1.6 + 0.3 * len(keys)), layout="constrained")
        fig.get_layout_engine().set(w_pad=0.1)  # inches: long labels keep clear of the canvas edge at every dpi
        ax, ax_share = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
        totals = [max(sum(seconds[k].values()), 1e-3) for k in keys]
        ax.barh(range(len(keys)), totals, color="#0072B2", height=0.6)
        for i, t in enumerate(totals):
            ax.text(t, i, f" {_seconds_label(t)}", va="center", fontsize=8.5)
        ax.set_xscale("log")
        ax.set_xlim(min(totals) / 2, max(totals) * 6)  # room for the value after the longest bar
        ax.xaxis.set_major_locator(FixedLocator([1, 10, 60, 600, 3600, 36000]))  # 1 s, 10 s, 1 min, 10 min, 1 h, 10 h
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: _seconds_label(x)))
        ax.set_yticks(range(len(keys)), labels)
        ax.set_xlabel("wall-clock per run (log; mean over seeds)")
        ax.grid(axis="x", alpha=0.3)
        for i, k in enumerate(keys):
            left = 0.0
            total = sum(seconds[k].values()) or 1.0
            for phase, color in PHASE_COLORS.items():
                share = 100 * seconds[k][phase] / total
                ax_share.barh(i, share, left=left, color=color, label=phase if i == 0 else None, height=0.6)
                left += share
        ax_share.set_xlim(0, 100)
        ax_share.set_xlabel("share of the run (%)")
        handles, names = ax_share.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside upper right", ncol=4, frameon=False)
        ax_share.tick_params(axis="y", left=False)
        runs = _unique_runs(list(groups.values()))
        common = sorted(set.intersection(*(set(f"{k.bench} {k.backbone}".split()) for k in keys)))
        title = "Wall-clock time per run"
        caption = (
            f"{title} ({' '.join(w for w in f'{keys[0].bench} {keys[0].backbone}'.split() if w in common)}): left, "
            "seconds per run (log axis); right, its split: features = frozen-feature extraction (near 0 on a "
            "feature-cache hit), train, eval (every protocol the run evaluated), other = the rest of the run's total "
            "(loading backbone and data). " + provenance(runs)
        )
        return _save(fig, out_dir, "wall_clock", title, caption, runs)


def _seconds_label(s: float) -> str:
    """``3.3 s``, ``45 s``, ``12 min``, ``1.5 h``: a duration as a short label."""
    if s >= 3600:
        return f"{s / 3600:.2g} h"
    if s >= 60:
        return f"{s / 60:.2g} min"
    return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"


def routing(coll: Collection, out_dir: Path) -> FigureOut | None:
    """For strategies that route between per-task modules: routing accuracy per task after the last task, and
    accuracy with the chosen modules against accuracy with each image's own task's module (oracle)."""
    import matplotlib

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
    return checked_embeddings(run.path / "features.npz", {**data, **{k: np.array(v) for k, v in text.items()}})


FEATURES_MAX_BYTES = 2**30  # frozen and adapted fp16 features of a 100k-image test split at d=2048 stay below
FEATURE_WIDTH = 8192  # widest feature a backbone gives (ViT-g: 1536; ViT-22B: 6144)
TSNE_PANELS = 16  # panels per t-SNE figure (4 x 4: the frozen features and 15 methods); more: further figures


def subsample(n: int, max_points: int = TSNE_MAX_POINTS, seed: int = TSNE_SEED) -> np.ndarray:
    """Sorted indices of at most ``max_points`` of ``n`` points, the same for the same ``n``."""
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
        # pages of even size (17 panels: 9 and 8, not 16 and a lone panel whose title the narrow page clips)
        per_page = math.ceil(len(panels) / math.ceil(len(panels) / TSNE_PANELS))
        for page, start in enumerate(range(0, len(panels), per_page)):
            chunk = panels[start : start + per_page]
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

    # deferred: loads pandas, which importing this module does not
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
    baseline: str | None = None
    study: Any = None  # the report's study (clbench.report.study.Study): its tests are the forest plot's


@dataclass(frozen=True)
class FigureKind:
    """One kind of report figure: its name (as the registry lists it) and how it is drawn; ``make`` returns the
    figures (none where the records hold nothing for it) and notes on what is absent."""

    name: str
    make: Callable[[FigureInputs], tuple[list[FigureOut], list[str]]]


def _one(f: FigureOut | None) -> tuple[list[FigureOut], list[str]]:
    return ([] if f is None else [f]), []


def _paired(i: FigureInputs) -> tuple[list[FigureOut], list[str]]:
    if i.study is not None:  # the study's own tests: the forest prints the p and verdict every table prints
        return _one(forest_of_study(i.study, i.out_dir, runs=i.rows.runs))
    return _one(forest_from_collection(i.rows, i.out_dir, i.predicted, i.baseline))  # where runs kept predictions


# The report's figures in the order the report shows them.
REPORT_FIGURES: tuple[FigureKind, ...] = (
    FigureKind(
        "accuracy_curves",
        lambda i: _one(accuracy_curves(i.rows, i.out_dir, predicted=i.predicted, baseline=i.baseline)),
    ),
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
    baseline: str | None = None,
    study: Any = None,
) -> tuple[list[FigureOut], list[str]]:
    """Every figure of :data:`REPORT_FIGURES`, saved under ``out_dir/figures``; returns them and notes on what is
    absent. ``budget``: the budget curves to draw (:func:`clbench.report.budget.budget_curves`); ``main``: the main
    table's rows (:mod:`clbench.report.leaderboard`): the accuracy curves, the accuracy matrices and the paired
    differences show those only (default: every row); ``baseline``: the strategy drawn in every panel of the accuracy
    curves and tested against in the forest plot (default: the first row); ``study``: the report's study
    (:class:`clbench.report.study.Study`), whose tests the forest plot draws (without one it tests the rows itself)."""
    inputs = FigureInputs(
        coll, coll if main is None else main, out_dir, predicted or Predicted(), budget, main, tsne_points, baseline,
        study,
    )  # fmt: skip
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
