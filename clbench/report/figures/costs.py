"""What a method costs: final accuracy against the parameters it adds and stores (one colour and marker per method
family, points labelled by method), and the wall-clock seconds per phase."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.records.schema import Times
from clbench.report.collect import Collection
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _save,
    provenance,
)
from clbench.report.figures.style import (
    OTHER_FAMILY,
    PHASE_COLORS,
    count_label,
    method_family,
    unique_runs,
)
from clbench.report.labels import display_name, needs_backbone, short_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p, z=zero: "0" if v == z else count_label(v)))
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
        runs = unique_runs(list(groups.values()))
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
        runs = unique_runs(list(groups.values()))
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
