"""What the report's figures share in look: one colour per strategy and line style per variant, markers per
backbone, line style per protocol, the panel grid, legends outside the axes, seen-class ticks, the method-family
panels' colours, and the small helpers every family draws with (mean and spread of curves, count labels)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.core.catalog import FAMILIES, STRATEGY_LOOKS, card
from clbench.errors import ClbenchError
from clbench.report.collect import DOMAINS_SEEN, Collection, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PROTOCOL_STYLE = {"per-sample": "-", "reference": "--"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
# Okabe-Ito, no two closer than CIEDE2000 21 (tests/test_report_figures.py)
PHASE_COLORS = {"features": "#56B4E9", "train": "#E69F00", "eval": "#009E73", "other": "#BBBBBB"}


def seen_ticks(ax: Any, axis: tuple[list[int], str], fontsize: float | None = None) -> None:
    """Label the x axis of curves after each task; domains seen (a handful of steps) get one tick each."""
    xs, label = axis
    ax.set_xlabel(label, **({"fontsize": fontsize} if fontsize else {}))

    if label == DOMAINS_SEEN:
        ax.set_xticks(xs)


def unique_runs(groups: Sequence[Sequence[Run]]) -> list[Run]:
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


def new_figure(ncols: int, nrows: int, w: float, h: float) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.flat)


def panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    ncols = max(1, min(max_cols, n))
    return ncols, math.ceil(n / ncols)


def hide_unused(axes: list[Axes], used: int) -> None:
    """Remove the grid's unused panels: a hidden axes still carries its tick labels into the saved SVG and PDF."""
    for ax in axes[used:]:
        ax.remove()


def mean_std_curves(curves: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    n = min(len(c) for c in curves)
    arr = np.array([[np.nan if v is None else v for v in c[:n]] for c in curves], dtype=float)  # (runs, T)
    mean = nanmean(arr)
    count = np.sum(~np.isnan(arr), axis=0)
    sq = np.nansum((arr - mean) ** 2, axis=0)
    std = np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), 0.0)  # sample std; 0 for a single run
    return mean, std


LEGEND_WRAP = 34  # characters per legend line to the right of a panel: longer labels wrap instead of leaving the canvas


def legend_outside(ax: Axes) -> None:
    """Legend to the right of the panel, outside every axes (constrained layout makes room for it); a label longer
    than :data:`LEGEND_WRAP` characters wraps at a space (``HiDe-Prompt:reference, reference protocol (n=1)``)."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    wrapped = ["\n".join(textwrap.wrap(label, LEGEND_WRAP)) or label for label in labels]
    ax.legend(handles, wrapped, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, ncol=1, borderaxespad=0.0)


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


def nanmean(stack: np.ndarray) -> np.ndarray:
    """Mean over axis 0 ignoring NaN; NaN (without a warning) where every value is NaN."""
    count = np.sum(~np.isnan(stack), axis=0)
    total = np.nansum(stack, axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def count_label(x: float, _pos: Any = None) -> str:
    """1, 10, 100, 1k, 10k, 1M: parameter counts on a log axis."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:g}{suffix}"
    return f"{x:g}"
