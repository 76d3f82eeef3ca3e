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


def _invocation() -> str:
    argv = sys.argv
    return " ".join(["clbench", *argv[1:]]) if argv and argv[0].endswith("clbench") else " ".join(argv)


def _add_run_dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run folders (holding result.json), or parent folders searched 2 levels down")


# ------------------------------------------------------------------------------------------- report
def add_report_args(p: argparse.ArgumentParser) -> None:
    _add_run_dirs(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="report folder: index.html, README.md, report.json and figures/ (made if absent)")
    p.add_argument("--title", default="clbench report", help="page title (default: clbench report)")
    p.add_argument("--tsne", action=argparse.BooleanOptionalAction, default=True,
                   help="t-SNE figures from each configuration's features.npz (default: on; about 10 s each on a CPU)")
    p.add_argument("--tsne-points", type=int, default=1500, metavar="N",
                   help="test images per t-SNE, subsampled with a fixed seed (default: 1500)")


def cmd_report(args: argparse.Namespace) -> int:
    from clbench.errors import ClbenchError
    from clbench.report.build import write_report
    from clbench.report.collect import collect

    if args.tsne_points < 10:
        raise ClbenchError(f"--tsne-points must be >= 10 (got {args.tsne_points})")
    coll = collect(args.run_dirs)
    written = write_report(coll, Path(args.out), title=args.title, command=_invocation(), with_tsne=args.tsne,
                           tsne_points=args.tsne_points)
    print(f"report: {len(coll.runs)} runs, {len(coll.skipped)} skipped, {len(written.figures)} figures -> "
          f"{Path(args.out) / 'index.html'}")
    for s in coll.skipped:
        print(f"  skipped {s.path}: {s.reason}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------- compare
def add_compare_args(p: argparse.ArgumentParser) -> None:
    _add_run_dirs(p)
    p.add_argument("--bench", required=True, metavar="NAME", help="the benchmark to compare strategies on")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for compare.md / .csv / .tex and figures/compare_<bench>.png|svg")


def cmd_compare(args: argparse.Namespace) -> int:
    from clbench.report.build import write_compare
    from clbench.report.collect import collect

    coll = collect(args.run_dirs)
    written = write_compare(coll, args.bench, Path(args.out), command=_invocation())
    print(f"compare: {len(coll.select(args.bench).runs)} runs on {args.bench} -> "
          + ", ".join(str(f) for f in written.files))
    return 0


# ------------------------------------------------------------------------------------------- check
def add_check_args(p: argparse.ArgumentParser) -> None:
    from clbench.report.check import (
        DEFAULT_TIME_MEASURE,
        DEFAULT_TIME_REFERENCE,
        DEFAULT_TIME_SLACK,
        DEFAULT_TOLERANCE,
        TIME_MEASURES,
    )

    _add_run_dirs(p)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--reference", metavar="FILE", help="check the runs against this reference file")
    mode.add_argument("--write-reference", metavar="FILE",
                      help="write a reference file from the runs (their ids, git revisions and commands included)")
    w = p.add_argument_group("with --write-reference")
    w.add_argument("--description", default="", help="what the reference runs are for")
    w.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="POINTS",
                   help=f"accuracy may fall short by at most this many points (default: {DEFAULT_TOLERANCE})")
    w.add_argument("--time-slack", type=float, default=DEFAULT_TIME_SLACK, metavar="FACTOR",
                   help=f"time ratios may grow by at most this factor (default: {DEFAULT_TIME_SLACK})")
    w.add_argument("--time-reference-strategy", default=DEFAULT_TIME_REFERENCE, metavar="NAME",
                   help="times are ratios to this strategy's on the same benchmark "
                        f"(default: {DEFAULT_TIME_REFERENCE})")
    w.add_argument("--time-measure", default=DEFAULT_TIME_MEASURE, choices=sorted(TIME_MEASURES),
                   help=f"seconds compared (default: {DEFAULT_TIME_MEASURE}: excludes the cached feature extraction)")


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when every reference entry holds, 1 when one falls short (the table says which)."""
    from clbench.errors import ClbenchError
    from clbench.report import check as chk
    from clbench.report.collect import collect

    coll = collect(args.run_dirs)
    if args.write_reference:
        ref = chk.make_reference(coll, description=args.description, tolerance=args.tolerance,
                                 time_slack=args.time_slack, time_reference=args.time_reference_strategy,
                                 time_measure=args.time_measure, written_by=_invocation())
        chk.write_reference(Path(args.write_reference), ref)
        missing_time = sum(e["time_ratio"] is None for e in ref["entries"])
        print(f"reference: {len(ref['entries'])} entries from {len(coll.runs)} runs -> {args.write_reference}")
        if missing_time:
            print(f"  warning: {missing_time} entries have no time ratio (no {args.time_reference_strategy} run on "
                  f"their benchmark and backbone)", file=sys.stderr)
        for s in coll.skipped:
            print(f"  skipped {s.path}: {s.reason}", file=sys.stderr)
        return 0
    write_only = [flag for flag, value, default in (
        ("--description", args.description, ""), ("--tolerance", args.tolerance, chk.DEFAULT_TOLERANCE),
        ("--time-slack", args.time_slack, chk.DEFAULT_TIME_SLACK),
        ("--time-reference-strategy", args.time_reference_strategy, chk.DEFAULT_TIME_REFERENCE),
        ("--time-measure", args.time_measure, chk.DEFAULT_TIME_MEASURE)) if value != default]
    if write_only:
        raise ClbenchError(f"{', '.join(write_only)} apply only with --write-reference",
                           "a check uses the tolerances stored in the reference file; write a new one to change them")
    ref = chk.load_reference(Path(args.reference))
    result = chk.check(coll, ref)
    chk.print_check(result, args.reference)
    return 0 if result.ok else 1


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "report": ("tables, figures and a static HTML page from run records", add_report_args, cmd_report),
    "compare": ("one figure and one table comparing strategies on one benchmark", add_compare_args, cmd_compare),
    "check": ("regression gate: compare runs with a reference file (or write one from runs)", add_check_args,
              cmd_check),
}
