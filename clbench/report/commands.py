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

from clbench.results import command_line
from clbench.text import plain


def _add_run_dirs(p: argparse.ArgumentParser) -> None:
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
    _add_run_dirs(p)
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


def cmd_report(args: argparse.Namespace) -> int:
    from clbench.errors import ClbenchError
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
    _add_run_dirs(p)
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
        help="test every strategy against this one only (default: every pair), e.g. simplecil",
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from clbench.report.build import write_compare
    from clbench.report.collect import collect

    coll = collect(args.run_dirs, args.pool_class_orders)
    written = write_compare(coll, args.bench, Path(args.out), command=command_line(), baseline=args.baseline)
    print(
        f"compare: {len(coll.select(args.bench).runs)} runs on {plain(args.bench)} -> "
        + ", ".join(plain(f) for f in written.files)
    )
    return 0


# ------------------------------------------------------------------------------------------- check
def add_check_args(p: argparse.ArgumentParser) -> None:
    from clbench.report.check import CALIBRATION_FILE, DEFAULT_TIME_FLOOR, DEFAULT_TIME_SLACK

    _add_run_dirs(p)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--reference", metavar="FILE", help="check the runs against this reference file")
    mode.add_argument(
        "--write-reference",
        metavar="FILE",
        help="write a reference file from the runs (their ids, git revisions and commands, and who "
        "wrote it and why, included)",
    )
    mode.add_argument(
        "--calibrate",
        action="store_true",
        help=f"time the calibration workload on this machine and add it to RUN_DIR/{CALIBRATION_FILE} "
        "(run it in the same job as the runs; the gate's times are ratios to it)",
    )
    mode.add_argument(
        "--plan",
        action="store_true",
        help="print the regression gate's runs into RUN_DIR, one `clbench run` argument list per line (shell-quoted), "
        "derived from the catalog's ci profiles (.ci/gate runs them)",
    )
    w = p.add_argument_group("with --write-reference")
    w.add_argument("--why", default="", metavar="TEXT", help="why the reference is (re)written (required; recorded)")
    w.add_argument("--who", default=None, metavar="NAME", help="who writes it (default: git user.name, else $USER)")
    w.add_argument("--description", default="", help="what the reference runs are for")
    w.add_argument(
        "--tolerances",
        default=None,
        metavar="FILE",
        help="per-metric tolerances per strategy:profile from a measured spread "
        "(e.g. reports/gate/tolerances.json; default: keep the rewritten reference's, else the built-in ones)",
    )
    w.add_argument(
        "--time-slack",
        type=float,
        default=DEFAULT_TIME_SLACK,
        metavar="FACTOR",
        help=f"train/eval time ratios may grow by this factor (default: {DEFAULT_TIME_SLACK})",
    )
    w.add_argument(
        "--time-floor",
        type=float,
        default=DEFAULT_TIME_FLOOR,
        metavar="UNITS",
        help=f"plus this many calibration units, for phases that take almost no time (default: {DEFAULT_TIME_FLOOR})",
    )
    w.add_argument(
        "--require-ci-profiles",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the check fails when a registered strategy's ci profile is not pinned (default: on; "
        "--no-require-ci-profiles for a reference of other runs)",
    )


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when every reference entry holds, 1 when one does not (the table and one line per failure say which),
    2 when a run record or the reference is refused (unreadable, mistyped, out of range)."""
    from clbench.errors import ClbenchError
    from clbench.report import check as chk
    from clbench.report.check_print import print_check
    from clbench.report.collect import collect

    write_only = [
        flag
        for flag, value, default in (
            ("--why", args.why, ""),
            ("--who", args.who, None),
            ("--description", args.description, ""),
            ("--tolerances", args.tolerances, None),
            ("--time-slack", args.time_slack, chk.DEFAULT_TIME_SLACK),
            ("--time-floor", args.time_floor, chk.DEFAULT_TIME_FLOOR),
            ("--require-ci-profiles", args.require_ci_profiles, True),
        )
        if value != default
    ]
    if (args.calibrate or args.plan) and write_only:
        raise ClbenchError(f"{', '.join(write_only)} apply only with --write-reference")
    if args.plan:
        import shlex

        if len(args.run_dirs) != 1:
            raise ClbenchError("--plan takes one RUN_DIR: the folder the gate's runs go into")
        for run in chk.gate_plan(Path(args.run_dirs[0])):
            print(shlex.join(run))
        return 0
    if args.calibrate:
        from clbench.perf.calibration import calibrate  # the one measuring step: the check itself reads files

        for folder in args.run_dirs:
            m = calibrate()
            path = chk.write_calibration(Path(folder), m)
            print(
                f"calibration: {m['seconds']:.3f} s per pass ({m['workload']}, {m['host']['torch_threads']} "
                f"threads, {m['host']['cpu_capability']}) -> {path}"
            )
        return 0
    coll = collect(args.run_dirs)
    calibration, _ = chk.find_calibration(args.run_dirs)
    if args.write_reference:
        target = Path(args.write_reference)
        previous = chk.load_reference(target, for_writing=True) if target.exists() else None
        tolerances = chk.load_tolerances(Path(args.tolerances)) if args.tolerances else None  # None: keep previous
        ref = chk.make_reference(
            coll,
            why=args.why,
            who=args.who,
            description=args.description,
            tolerances=tolerances,
            time_slack=args.time_slack,
            time_floor=args.time_floor,
            calibration=calibration,
            require_ci_profiles=args.require_ci_profiles,
            previous=previous,
            written_by=command_line(),
        )
        chk.write_reference(target, ref)
        print(f"reference: {len(ref.entries)} entries from {len(coll.runs)} runs -> {target}")
        if not calibration:
            print(
                f"  warning: no {chk.CALIBRATION_FILE} among the run folders: times are not pinned "
                "(run `clbench check --calibrate RUN_DIR` in the same job as the runs)",
                file=sys.stderr,
            )
        for line in ref.changes:
            print(f"  {plain(line)}")
        return 0
    if write_only:
        raise ClbenchError(
            f"{', '.join(write_only)} apply only with --write-reference",
            "a check uses the tolerances stored in the reference file; write a new one to change them",
        )
    ref = chk.load_reference(Path(args.reference))
    if coll.skipped:  # a record the gate cannot read is refused input (exit 2), not a regression (exit 1)
        s = coll.skipped[0]
        more = f" (and {len(coll.skipped) - 1} more)" if len(coll.skipped) > 1 else ""
        raise ClbenchError(
            f"{s.path}: {s.reason}{more}", "the gate reads every record given: remove the folder or rerun it"
        )
    result = chk.check(coll, ref, calibration, reference_path=args.reference)
    print_check(result, args.reference)
    return 0 if result.ok else 1


# ------------------------------------------------------------------------------------------- routing-study
def add_routing_study_args(p: argparse.ArgumentParser) -> None:
    _add_run_dirs(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for study.md and figures/routing_study.*")
    p.add_argument(
        "--vary",
        metavar="FIELD",
        help="also tabulate the runs against this strategy setting (e.g. l1): module similarity and routing per router",
    )


def cmd_routing_study(args: argparse.Namespace) -> int:
    from clbench.report.collect import collect
    from clbench.report.study import write_study

    path = write_study(collect(args.run_dirs), Path(args.out), args.vary, command=command_line())
    print(f"routing study -> {path}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "report": ("tables, figures and a static HTML page from run records", add_report_args, cmd_report),
    "compare": ("one figure and one table comparing strategies on one benchmark", add_compare_args, cmd_compare),
    "check": (
        "regression gate: compare runs with a reference file (or write one from runs)",
        add_check_args,
        cmd_check,
    ),
    "routing-study": (
        "router x (routing acc, final, average) tables and a figure from runs that recorded several "
        "routers (--set routers=...)",
        add_routing_study_args,
        cmd_routing_study,
    ),
}
