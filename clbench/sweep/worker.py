"""One planned run, executed in a worker process (a pool worker or a Ray worker): the function both backends submit,
the reporter that writes the run's messages to ``run.log``, and what two executions of a run must agree on."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files import atomic_write_json
from clbench.harness import Reporter
from clbench.results import RunRecord
from clbench.sweep.plan import ATTEMPT_FILE, LOG_FILE, read_run_record, same_fingerprint

# Record fields that differ between two executions of the same run (time, place, order of cache use).
VOLATILE_FIELDS = (
    "created",
    "finished",
    "command",
    "time_s",
    "peak_rss_mb",
    "feature_cache",
    "host",
    "precision_reason",
    "git_revision",
    "versions",
    "run_id",
    "resumed_from_task",
)
VOLATILE_PER_TASK = ("train_s", "eval_s")


class _LogReporter(Reporter):
    """The harness's Reporter for a run in a worker: messages appended to ``run.log`` (flushed at once, so the
    sweep's progress view and a user on another node can follow them)."""

    def __init__(self, path: Path) -> None:
        from clbench.owned import open_append

        self._file = open_append(path)

    def log(self, message: str) -> None:
        self._file.write(f"{datetime.now().strftime('%H:%M:%S')} {message}\n")

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        self.log(f"{description}: started")
        return lambda n: None

    def done(self, description: str) -> None:
        pass

    def close(self) -> None:
        self._file.close()


def execute(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one planned run in this process (a pool worker or a Ray worker) and return its outcome.

    User errors come back as ``status: "error"``; anything else raises, so the backend can retry it."""
    for key, value in payload["env"].items():
        os.environ[key] = value
    import torch

    from clbench.harness import RunConfig, run

    torch.set_num_threads(payload["threads"])
    values = dict(payload["config"])
    values["overrides"] = tuple(tuple(kv) for kv in values["overrides"])
    cfg = RunConfig(**values)
    path = Path(cfg.out)
    started = time.time()
    where = {"host": socket.gethostname(), "pid": os.getpid()}
    base = {"run_id": payload["run_id"], "started_at": started, **where}
    try:  # before the attempt file and the log: a folder of other files (planted since the plan) gets neither
        from clbench.owned import mark_folder
        from clbench.rundir import check_run_folder

        check_run_folder(path)
        path.mkdir(parents=True, exist_ok=True)
        mark_folder(path, "run")
    except ClbenchError as e:
        return {**base, "status": "error", "error": e.render(as_flags=True), "finished_at": time.time()}
    try:
        record = read_run_record(path)
    except ClbenchError:  # not a record this run can be; the harness says why when it meets the folder
        record = None
    if record and record.complete and same_fingerprint(record.fingerprint, payload["fingerprint"]):
        # a retry of an attempt that finished writing but died before it reported
        return {**base, "status": "done", "finished_at": time.time(), "resumed_from_task": record.resumed_from_task}
    atomic_write_json(path / ATTEMPT_FILE, {"sweep": payload["sweep_id"], **base})
    reporter = _LogReporter(path / LOG_FILE)
    reporter.log(f"attempt started on {where['host']} (pid {where['pid']}, {payload['threads']} threads)")
    hub = None
    if payload.get("log"):  # --log: the run's experiment trackers (clbench.trackers)
        from clbench.trackers import LogSpec, TrackerHub

        log = dict(payload["log"])
        hub = TrackerHub(LogSpec(**{**log, "trackers": tuple(log["trackers"])}), reporter)
    try:
        record = run(cfg, hub or reporter)
    except ClbenchError as e:
        message = e.render(as_flags=True)  # a sweep is driven by the flags of `clbench sweep`
        reporter.log(f"error: {message}")
        if hub is not None:
            hub.abort()  # the trackers' runs end as failed
        return {**base, "status": "error", "error": message, "finished_at": time.time()}
    except BaseException as e:
        reporter.log(f"failed: {type(e).__name__}: {e}")
        if hub is not None:
            hub.abort()
        raise
    finally:
        reporter.close()
    return {**base, "status": "done", "finished_at": time.time(), "resumed_from_task": record.resumed_from_task}


def execution_independent(record: RunRecord) -> dict[str, Any]:
    """A record as JSON without the fields that differ between two executions of the same run (times, host, cache
    events, resumes). Two backends that ran the same plan must agree on everything left."""
    out = {k: v for k, v in record.to_dict().items() if k not in VOLATILE_FIELDS}
    out["per_task"] = [{k: v for k, v in t.items() if k not in VOLATILE_PER_TASK} for t in out["per_task"]]
    return out
