"""Report figures (matplotlib + seaborn), each saved as PNG and SVG with a caption naming its runs: the
figures a report draws (:data:`REPORT_FIGURES`) and :func:`make_figures`; each family of figures lives in
its own module (``curves``, ``matrices``, ``costs``, ``routing_plots``, ``tsne_maps``; their shared look in ``style``).

No pyplot: figures are plain :class:`matplotlib.figure.Figure` objects, so making a report changes no global
backend or style of the calling process. Colours follow the strategy across every figure; line style follows
the protocol (per-sample solid, reference dashed); marker follows the backbone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clbench.report.budget import BudgetCurve
from clbench.report.collect import Collection
from clbench.report.figure_base import FigureOut
from clbench.report.figures.costs import accuracy_vs_params, wall_clock
from clbench.report.figures.curves import accuracy_curves, budget_curves_figure
from clbench.report.figures.matrices import accuracy_matrices
from clbench.report.figures.routing_plots import routing, routing_study
from clbench.report.figures.tsne_maps import TSNE_MAX_POINTS, tsne
from clbench.report.forest import forest_from_collection, forest_of_study
from clbench.report.uncertainty import Predicted


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
