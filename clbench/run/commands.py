"""The body of ``clbench run``, from the flags :mod:`clbench.cli` parsed: check them, build the run's
:class:`~clbench.core.config.RunConfig` (or resume one), run it with the terminal view and the trackers, and print
where it went. (``clbench export``, which reads finished records, is a tool: :mod:`clbench.report.tracker_export`.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clbench.core.config import given_settings
from clbench.errors import ClbenchError
from clbench.run.dryrun import print_plan
from clbench.run.precheck import check_run
from clbench.run.trackers import Figures, TrackerHub


def log_spec(args: argparse.Namespace, group: str | None = None, out: str | None = None):
    """``--log`` / ``--log-dir`` as a checked :class:`clbench.run.trackers.LogSpec`, or None without ``--log``;
    ``out``: a sweep's folder, where its runs' MLflow store goes without ``--log-dir`` (a run's: its folder)."""
    if args.log is None:
        if args.log_dir is not None:
            raise ClbenchError("--log-dir is for --log", "add --log tensorboard (or mlflow, wandb), or drop --log-dir")
        return None
    # deferred: loads numpy, which importing this module does not
    from clbench.run.trackers import LogSpec

    return LogSpec.from_flags(args.log, args.log_dir, group, out)


def run_command(args: argparse.Namespace, figures: Figures | None = None) -> int:
    """``clbench run``: one run from its parsed flags (or ``--resume DIR``), its result printed; 0 when it finished.
    ``figures``: what draws the run's figures for the trackers (``--log``, :class:`~clbench.run.trackers.TrackerHub`).
    """
    log = log_spec(args)  # checked first: a tracker that is not installed is refused at once
    # looked up at call time: tests replace it on its module
    from clbench.core.config import RunConfig, flag_fields

    values = {name: getattr(args, name) for name in flag_fields("run")}
    values["overrides"] = tuple(args.overrides)
    if args.trust_checkpoint:
        # deferred: loads torch, which importing this module does not
        from clbench.run.checkpoint import convert_legacy

        if not (args.resume or args.out):
            raise ClbenchError("--trust-checkpoint converts the checkpoint of a run folder: name it with --resume DIR")
        convert_legacy(
            Path(args.resume or args.out), lambda m: print(f"clbench: --trust-checkpoint: {m}", file=sys.stderr)
        )
    if args.resume:
        # deferred: loads torch, which importing this module does not
        from clbench.run.checkpoint import resume_config

        # a flag left at its default counts as not given; checked as in a fresh run, before the checkpoint is read
        cfg = resume_config(args.resume, given_settings(values))
    elif args.strategy is None:
        raise ClbenchError("clbench run needs --strategy", "or --resume DIR to continue an unfinished run")
    else:
        cfg = RunConfig(**values)
        check_run(cfg)  # every name, profile and --set key from the cards: a mistake costs no torch import
    if args.dry_run:
        print_plan(cfg)
        return 0
    # deferred: loads rich, torch, which importing this module does not
    from clbench.run.harness import run
    from clbench.ui import RichReporter, print_result, print_where

    with RichReporter() as reporter:
        observer = reporter
        if log is not None:
            observer = TrackerHub(log, reporter, figures=figures)
        try:
            record = run(cfg, observer, resume=bool(args.resume))
        except BaseException:
            if log is not None:
                observer.abort()  # the trackers' runs end as failed
            raise
    print_result(record)
    print_where(reporter.run_dir, observer.locations() if log is not None else {})
    return 0
