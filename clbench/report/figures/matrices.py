"""The accuracy-matrix heatmaps: R[t][j] after task t on task j, one panel per row of the report, split into figures
of at most :data:`MATRIX_PANELS` panels."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clbench.report.collect import Collection, Run
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _save,
    provenance,
    slug,
)
from clbench.report.figures.style import (
    hide_unused,
    nanmean,
    new_figure,
    panel_grid,
    unique_runs,
)

MATRIX_PANELS = 12  # heatmaps per accuracy-matrix figure (more: further figures; 63 in one ran out of memory)


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
        ncols, nrows = panel_grid(len(keys))
        fig, axes = new_figure(ncols, nrows, 4.2, 3.6)
        for ax, key in zip(axes, keys, strict=False):
            mats = [_square(r.summary(key.protocol).accuracy_matrix) for r in groups[key]]
            n = min(m.shape[0] for m in mats)
            mean = nanmean(np.stack([m[:n, :n] for m in mats]))  # (T, T), NaN above the diagonal
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
        hide_unused(axes, len(keys))
        runs = unique_runs([groups[k] for k in keys])
        title = f"Accuracy matrices, {bench}" + (f" ({page} of {pages})" if pages > 1 else "")
        caption = (
            f"{title}: R[t][j] (%), accuracy on task j's classes after learning task t, mean over seeds. "
            + provenance(runs)
        )
        name = f"accuracy_matrix_{slug(bench)}" + (f"_{page}" if page > 1 else "")
        return _save(fig, out_dir, name, title, caption, runs)


def _square(matrix: Sequence[Sequence[float]]) -> np.ndarray:
    n = len(matrix)
    out = np.full((n, n), np.nan)
    for t, row in enumerate(matrix):
        out[t, : len(row)] = [np.nan if v is None else v for v in row]
    return out
