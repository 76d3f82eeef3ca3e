"""argparse wiring of ``clbench check``: the regression gate (:mod:`clbench.gate.check`), its calibration
(``--calibrate``), its plan (``--plan``) and writing a reference (``--write-reference``).

This module imports only argparse and pathlib at import time, so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.files.escape import plain
from clbench.gate import check as chk
from clbench.gate.check import CALIBRATION_FILE, DEFAULT_TIME_FLOOR, DEFAULT_TIME_SLACK
from clbench.gate.printing import print_check, print_margins
from clbench.records.command import command_line
from clbench.report.commands import add_run_dirs


def add_check_args(p: argparse.ArgumentParser) -> None:
    add_run_dirs(p)
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
    # looked up at call time: tests replace it on its module
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
    print_margins(coll.seeded())  # what each method's ci profile learns beyond the untrained control
    return 0 if result.ok else 1


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "check": (
        "regression gate: compare runs with a reference file (or write one from runs)",
        add_check_args,
        cmd_check,
    ),
}
