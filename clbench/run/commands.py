"""The bodies of ``clbench run`` and ``clbench export``, from the flags :mod:`clbench.cli` parsed: check them, build
the run's :class:`~clbench.run.config.RunConfig` (or resume one), run it with the terminal view and the trackers, and
print where it went; or send finished records to the trackers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clbench.errors import ClbenchError


def log_spec(args: argparse.Namespace, group: str | None = None, out: str | None = None):
    """``--log`` / ``--log-dir`` as a checked :class:`clbench.run.trackers.LogSpec`, or None without ``--log``;
    ``out``: a sweep's folder, where its runs' MLflow store goes without ``--log-dir`` (a run's: its folder)."""
    if args.log is None:
        if args.log_dir is not None:
            raise ClbenchError("--log-dir is for --log", "add --log tensorboard (or mlflow, wandb), or drop --log-dir")
        return None
    from clbench.run.trackers import LogSpec

    return LogSpec.from_flags(args.log, args.log_dir, group, out)


def run_command(args: argparse.Namespace) -> int:
    """``clbench run``: one run from its parsed flags (or ``--resume DIR``), its result printed; 0 when it finished."""
    log = log_spec(args)  # checked first: a tracker that is not installed is refused at once
    from clbench.run.config import RunConfig, flag_fields

    values = {name: getattr(args, name) for name in flag_fields("run")}
    values["overrides"] = tuple(args.overrides)
    if args.trust_checkpoint:
        from clbench.run.checkpoint import convert_legacy

        if not (args.resume or args.out):
            raise ClbenchError("--trust-checkpoint converts the checkpoint of a run folder: name it with --resume DIR")
        convert_legacy(
            Path(args.resume or args.out), lambda m: print(f"clbench: --trust-checkpoint: {m}", file=sys.stderr)
        )
    if args.resume:
        from clbench.run.checkpoint import resume_config
        from clbench.run.config import given_settings

        # a flag left at its default counts as not given; checked as in a fresh run, before the checkpoint is read
        cfg = resume_config(args.resume, given_settings(values))
    elif args.strategy is None:
        raise ClbenchError("clbench run needs --strategy", "or --resume DIR to continue an unfinished run")
    else:
        from clbench.run.precheck import check_run

        cfg = RunConfig(**values)
        check_run(cfg)  # every name, profile and --set key from the cards: a mistake costs no torch import
    if args.dry_run:
        from clbench.run.dryrun import print_plan

        print_plan(cfg)
        return 0
    from clbench.run.harness import run
    from clbench.ui import RichReporter, print_result, print_where

    with RichReporter() as reporter:
        observer = reporter
        if log is not None:
            from clbench.run.trackers import TrackerHub

            observer = TrackerHub(log, reporter)
        try:
            record = run(cfg, observer, resume=bool(args.resume))
        except BaseException:
            if log is not None:
                observer.abort()  # the trackers' runs end as failed
            raise
    print_result(record)
    print_where(reporter.run_dir, observer.locations() if log is not None else {})
    return 0


def export_command(args: argparse.Namespace) -> int:
    """``clbench export RUNS --to T``: every finished record under RUNS sent to the trackers; 1 when one failed."""
    from clbench.records.results import load_record
    from clbench.report.collect import find_run_dirs
    from clbench.run.trackers import LogSpec, TrackerHub

    log = LogSpec.from_flags(args.to, args.log_dir or args.runs[0], args.group)
    dirs, skipped = find_run_dirs(args.runs)
    for s in skipped:
        print(f"clbench: skipped {s.path}: {s.reason}", file=sys.stderr)
    if not dirs:
        raise ClbenchError(f"no run records under {', '.join(args.runs)}", "give run folders that hold result.json")
    from clbench.files.escape import plain
    from clbench.files.safety import folder_name_problem

    records = [(Path(d), load_record(d)) for d in dirs]  # every record checked before anything is sent
    for d, record in records:
        why = folder_name_problem(record.run_id)  # TensorBoard's folder LOG_DIR/tensorboard/RUN_ID, the runs' names
        if why is not None:
            raise ClbenchError(
                f"{d}: run_id {plain(repr(record.run_id))[:80]} is not a plain name ({why})",
                "correct the record's run_id, or leave that run folder out of the export",
            )
        ref = record.predictions  # a record that disagrees with its own predictions is refused, as by the gate
        if ref is not None and (d / ref.file).exists():
            from clbench.records.predictions import read

            read(d, ref, expect=record.protocols)
    hub = TrackerHub(log)  # one for the export: each tracker connects once; one that fails is dropped for the rest
    failed = 0
    for d, record in records:
        events = hub.replay(record, d.parent)
        for e in events:
            print(f"clbench: warning: {plain(record.run_id)}: {plain(e)}", file=sys.stderr)
        failed += bool(events)
        left = [t for t in log.trackers if t not in hub.dropped]
        print(f"exported {plain(d.parent)} ({len(record.per_task)} tasks) to {', '.join(left) or 'no tracker'}")
    return 1 if failed or hub.dropped else 0
