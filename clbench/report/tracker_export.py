"""``clbench export RUNS --to T``: finished run records sent to experiment trackers (TensorBoard, MLflow, W&B), with
the figures each tracker shows beside a run (:func:`clbench.report.run_figures.run_figures`). A tool over finished
records, as the report is; the live path (``clbench run --log``) is :mod:`clbench.run.commands`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.files.escape import plain
from clbench.files.safety import folder_name_problem
from clbench.records.predictions import read
from clbench.report.run_figures import run_figures


def export_command(args: argparse.Namespace) -> int:
    """``clbench export RUNS --to T``: every finished record under RUNS sent to the trackers; 1 when one failed."""
    # deferred: loads numpy, which importing this module does not
    from clbench.records.results import load_record
    from clbench.report.collect import find_run_dirs
    from clbench.run.trackers import LogSpec, TrackerHub

    log = LogSpec.from_flags(args.to, args.log_dir or args.runs[0], args.group)
    dirs, skipped = find_run_dirs(args.runs)
    for s in skipped:
        print(f"clbench: skipped {s.path}: {s.reason}", file=sys.stderr)
    if not dirs:
        raise ClbenchError(f"no run records under {', '.join(args.runs)}", "give run folders that hold result.json")

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
            read(d, ref, expect=record.protocols)
    hub = TrackerHub(
        log, figures=run_figures
    )  # one for the export: each tracker connects once; one that fails is dropped for the rest
    failed = 0
    for d, record in records:
        events = hub.replay(record, d.parent)
        for e in events:
            print(f"clbench: warning: {plain(record.run_id)}: {plain(e)}", file=sys.stderr)
        failed += bool(events)
        left = [t for t in log.trackers if t not in hub.dropped]
        print(f"exported {plain(d.parent)} ({len(record.per_task)} tasks) to {', '.join(left) or 'no tracker'}")
    return 1 if failed or hub.dropped else 0
