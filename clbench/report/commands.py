"""``clbench report``, ``clbench compare`` and ``clbench check``: flags and command functions.

For each command, ``add_<name>_args(parser)`` adds its flags and ``cmd_<name>(args) -> int`` runs it; user errors
raise :class:`~clbench.errors.ClbenchError`. :data:`COMMANDS` has the same shape as ``clbench.cli.COMMANDS``.
This module imports only argparse and pathlib at import time, so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.files.escape import plain
from clbench.records.command import command_line


def add_run_dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (holding result.json), or parent folders searched 2 levels down",
    )


def _add_pool(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pool-class-orders",
        action="store_true",
        help="average runs of one benchmark and split over their class orders (seeds that also set the class "
        "order, `clbench sweep --vary both`); default: each class order is its own benchmark row",
    )


# ------------------------------------------------------------------------------------------- report
def add_report_args(p: argparse.ArgumentParser) -> None:
    add_run_dirs(p)
    _add_pool(p)
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="report folder: index.html, README.md, report.json and figures/ (made if absent)",
    )
    p.add_argument("--title", default="clbench report", help="page title (default: clbench report)")
    p.add_argument(
        "--tsne",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="t-SNE figure of what each main-table method classifies, from the features.npz its record kept "
        "(default: on; a few seconds per panel on a CPU)",
    )
    p.add_argument(
        "--tsne-points",
        type=int,
        default=500,
        metavar="N",
        help="test images per t-SNE panel, at most the 500 each record keeps, subsampled with a fixed seed "
        "(default: 500)",
    )
    p.add_argument(
        "--budget-curves",
        action="store_true",
        help="the records are a budget study: every strategy's records must differ only in their budget (epochs, "
        "train_per_class), else the report is refused naming the settings that differ (without it, the budget "
        "figure draws whichever records differ only in their budget)",
    )
    _add_study(p)
    p.add_argument(
        "--latex-only",
        action="store_true",
        help="write only what a paper needs: the leaderboard as LaTeX (booktabs) and CSV, and the main figure as "
        "PDF, SVG and a 300-dpi PNG",
    )
    p.add_argument(
        "--readme",
        action="append",
        metavar="FILE",
        help="also rewrite FILE's results block of this study (between its lines `<!-- clbench results: begin TAG "
        "... -->` and `<!-- clbench results: end TAG -->`, TAG the study file's name, e.g. emoji-table, or main "
        "without --study) with the study's leaderboard and its one-sentence answer; repeatable",
    )


def _add_study(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--study",
        metavar="FILE",
        help="the study's sweep file (the YAML `clbench sweep --config` runs, e.g. reports/emoji-table.yaml): its "
        "groups at default settings form the main table, the others their own sections (default: one main row "
        "per strategy and protocol at its default configuration, the records with the most seeds)",
    )
    p.add_argument(
        "--baseline",
        metavar="STRATEGY",
        help="the strategy the leaderboard tests every main row against (default: the study file's first "
        "strategy; without one, simplecil where present)",
    )
    _add_family(p)


def _add_family(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--all-pairs",
        action="store_true",
        help="the study's family of paired tests is every pair of main rows (default: each main row against the "
        "best row and against the baseline); Holm corrects over the family, the same in every table",
    )


def cmd_report(args: argparse.Namespace) -> int:
    # deferred: loads pandas, which importing this module does not
    from clbench.report.build import write_report
    from clbench.report.collect import collect

    if args.tsne_points < 10:
        raise ClbenchError(f"--tsne-points must be >= 10 (got {args.tsne_points})")
    coll = collect(args.run_dirs, args.pool_class_orders)
    written = write_report(
        coll,
        Path(args.out),
        title=args.title,
        command=command_line(),
        with_tsne=args.tsne,
        tsne_points=args.tsne_points,
        budget_strict=args.budget_curves,
        study_file=args.study,
        make_parser=getattr(args, "make_parser", None),
        baseline=args.baseline,
        latex_only=args.latex_only,
        family="all" if args.all_pairs else "default",
        readme=[Path(f) for f in args.readme or []],
    )
    print(
        f"report: {len(coll.runs)} runs, {len(coll.skipped)} skipped, {len(written.figures)} figures -> "
        f"{plain(Path(args.out) / ('leaderboard.tex' if args.latex_only else 'index.html'))}"
    )
    for s in coll.skipped:
        print(f"  skipped {plain(s.path)}: {plain(s.reason)}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------- compare
def add_compare_args(p: argparse.ArgumentParser) -> None:
    add_run_dirs(p)
    _add_pool(p)
    p.add_argument("--bench", required=True, metavar="NAME", help="the benchmark to compare strategies on")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="folder for compare.md / .csv / .tex, compare_pairs.csv and figures/compare_<bench>*.png|svg",
    )
    p.add_argument(
        "--baseline",
        metavar="STRATEGY",
        help="the strategy every main row is tested against (default: simplecil where present, else the first), "
        "e.g. simplecil",
    )
    p.add_argument(
        "--study",
        metavar="FILE",
        help="the study's sweep file, as `clbench report --study`: the same main rows and tests, so that each pair "
        "prints the p of the report of the same records",
    )
    _add_family(p)


def cmd_compare(args: argparse.Namespace) -> int:
    # deferred: loads pandas, which importing this module does not
    from clbench.report.build import write_compare
    from clbench.report.collect import collect

    coll = collect(args.run_dirs, args.pool_class_orders)
    written = write_compare(
        coll,
        args.bench,
        Path(args.out),
        command=command_line(),
        baseline=args.baseline,
        family="all" if args.all_pairs else "default",
        study_file=args.study,
        make_parser=getattr(args, "make_parser", None),
    )
    print(
        f"compare: {len(coll.select(args.bench).runs)} runs on {plain(args.bench)} -> "
        + ", ".join(plain(f) for f in written.files)
    )
    return 0


# ------------------------------------------------------------------------------------------- routing-study
def add_routing_study_args(p: argparse.ArgumentParser) -> None:
    add_run_dirs(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for study.md and figures/routing_study.*")
    p.add_argument(
        "--vary",
        metavar="FIELD",
        help="also tabulate the runs against this strategy setting (e.g. l1): module similarity and routing per router",
    )


def cmd_routing_study(args: argparse.Namespace) -> int:
    # deferred: loads pandas, which importing this module does not
    from clbench.report.collect import collect
    from clbench.report.routing_study import write_study

    path = write_study(collect(args.run_dirs), Path(args.out), args.vary, command=command_line())
    print(f"routing study -> {path}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "report": ("tables, figures and a static HTML page from run records", add_report_args, cmd_report),
    "compare": ("one figure and one table comparing strategies on one benchmark", add_compare_args, cmd_compare),
    "routing-study": (
        "router x (routing acc, final, average) tables and a figure from runs that recorded several "
        "routers (--set routers=...)",
        add_routing_study_args,
        cmd_routing_study,
    ),
}
