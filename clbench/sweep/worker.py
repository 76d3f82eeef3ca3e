"""One planned run, executed in a worker process (a pool worker or a Ray worker): the function both backends submit
(:func:`execute`), what it takes (:class:`WorkerPayload`) and returns (a :class:`~clbench.sweep.manifest.RunOutcome`),
each as its JSON form across the process boundary, the reporter that writes the run's messages to ``run.log``, and
what two executions of a run must agree on."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from clbench.core.config import Fingerprint
from clbench.errors import ClbenchError
from clbench.files import typedfile
from clbench.files.atomic import atomic_write_json
from clbench.files.safety import mark_folder, open_append
from clbench.files.typedfile import (
    NAME,
    OBJECT,
    JsonObject,
    Typed,
    is_json_object,
    is_name,
    is_object,
    is_positive,
    is_str,
    json_field,
    list_of,
    map_of,
    or_none,
)
from clbench.records.schema import RunRecord
from clbench.report.run_figures import run_figures
from clbench.run.harness import Reporter
from clbench.run.rundir import check_run_folder
from clbench.run.trackers import LogSpec, TrackerHub
from clbench.sweep.manifest import RunOutcome
from clbench.sweep.plan import ATTEMPT_FILE, LOG_FILE, read_run_record

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
Json = dict[str, Any]


class _LogReporter(Reporter):
    """The harness's Reporter for a run in a worker: messages appended to ``run.log`` (flushed at once, so the
    sweep's progress view and a user on another node can follow them)."""

    def __init__(self, path: Path) -> None:
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


@dataclass(frozen=True, kw_only=True)
class TrackerSettings(Typed):
    """``--log``: the run's experiment trackers, :class:`clbench.run.trackers.LogSpec`'s fields as JSON."""

    trackers: list[str] = json_field("a list of names", list_of(is_name), required=True)
    log_dir: str | None = json_field("a string or null", or_none(is_str), default=None)
    group: str | None = json_field("a string or null", or_none(is_str), default=None)
    mlflow_uri: str | None = json_field("a string or null", or_none(is_str), default=None)
    mlflow_artifacts: str | None = json_field("a string or null", or_none(is_str), default=None)


@dataclass(kw_only=True)
class WorkerPayload:
    """What the sweep sends a worker to execute one run (:func:`execute`). It crosses the process boundary as its
    JSON form (:func:`clbench.files.typedfile.write`) and is checked where it arrives: a worker of another clbench (a
    Ray node not upgraded) refuses it, naming the field, instead of running something else."""

    run_id: str = json_field(NAME, is_name, required=True)
    # RunConfig's fields as JSON (RunConfig checks them where the worker builds it)
    config: JsonObject = json_field("an object of run settings", is_json_object, required=True)
    # the plan's, for a retry's completed record
    fingerprint: Fingerprint = json_field(OBJECT, is_object, codec=Fingerprint, required=True)
    env: dict[str, str] = json_field("an object of strings", map_of(is_str), required=True)  # runner.PASSED_ENV
    threads: int = json_field("an integer >= 1", is_positive, required=True)  # torch threads
    sweep_id: str = json_field(NAME, is_name, required=True)  # written to the attempt file
    # --log: the run's experiment trackers (clbench.run.trackers.LogSpec as a dict)
    log: TrackerSettings | None = json_field(
        "an object or null", or_none(is_object), part=TrackerSettings, default=None
    )


_SKEW = "install the same clbench on the machine that runs the sweep and on every node that runs its runs"


def execute(payload: Json) -> Json:
    """What both backends submit: run one planned run in this process (a pool worker or a Ray worker). ``payload``
    is a :class:`WorkerPayload`'s JSON form; the result is the run's :class:`RunOutcome`'s (what crosses the
    process boundary is JSON, checked on arrival: :func:`read_outcome`).

    A user error (a payload that is not one, a folder of other files, a bad setting) comes back as a failed
    outcome; anything else raises, so the backend can retry it."""
    found = typedfile.problems(WorkerPayload, payload)
    if found:
        error = ClbenchError(f"the sweep's payload for this run is not one this clbench reads: {found.first()}", _SKEW)
        return RunOutcome(status="failed", error=error.render(as_flags=True), finished_at=time.time()).to_dict()
    return run_payload(typedfile.read(WorkerPayload, payload)).to_dict()


def read_outcome(data: Any) -> RunOutcome:
    """The :class:`RunOutcome` of :func:`execute`'s result; a ClbenchError naming the field where it is not one."""
    found = typedfile.problems(RunOutcome, data)
    if found:
        raise ClbenchError(f"the worker's outcome is not one this clbench reads: {found.first()}", _SKEW)
    return RunOutcome.from_dict(data)


def run_payload(payload: WorkerPayload) -> RunOutcome:
    """Run one planned run in this process and return its outcome (:func:`execute`)."""
    for key, value in payload.env.items():
        os.environ[key] = value
    import torch

    # looked up at call time: tests replace it on its module
    from clbench.run.harness import RunConfig, run

    torch.set_num_threads(payload.threads)
    values = dict(payload.config)
    values["overrides"] = tuple(tuple(kv) for kv in values["overrides"])
    cfg = RunConfig(**values)
    path = Path(cfg.out)
    base = RunOutcome(run_id=payload.run_id, started_at=time.time(), host=socket.gethostname(), pid=os.getpid())
    try:  # before the attempt file and the log: a folder of other files (planted since the plan) gets neither
        check_run_folder(path)
        path.mkdir(parents=True, exist_ok=True)
        mark_folder(path, "run")
    except ClbenchError as e:
        return dataclasses.replace(base, status="failed", error=e.render(as_flags=True), finished_at=time.time())
    try:
        record = read_run_record(path)
    except ClbenchError:  # not a record this run can be; the harness says why when it meets the folder
        record = None
    if record and record.complete and record.fingerprint == payload.fingerprint:
        # a retry of an attempt that finished writing but died before it reported
        return _done(base, record)
    atomic_write_json(path / ATTEMPT_FILE, {"sweep": payload.sweep_id, **base.to_dict()})
    reporter = _LogReporter(path / LOG_FILE)
    reporter.log(f"attempt started on {base.host} (pid {base.pid}, {payload.threads} threads)")
    hub = None
    if payload.log:  # --log: the run's experiment trackers (clbench.run.trackers)
        spec = LogSpec(**{**payload.log.to_dict(), "trackers": tuple(payload.log.trackers)})
        hub = TrackerHub(spec, reporter, figures=run_figures)
    try:
        record = run(cfg, hub or reporter)
    except ClbenchError as e:
        message = e.render(as_flags=True)  # a sweep is driven by the flags of `clbench sweep`
        reporter.log(f"error: {message}")
        if hub is not None:
            hub.abort()  # the trackers' runs end as failed
        return dataclasses.replace(base, status="failed", error=message, finished_at=time.time())
    except BaseException as e:
        reporter.log(f"failed: {type(e).__name__}: {e}")
        if hub is not None:
            hub.abort()
        raise
    finally:
        reporter.close()
    return _done(base, record)


def _done(base: RunOutcome, record: RunRecord) -> RunOutcome:
    """The outcome of a run whose record is complete (run here, or by an attempt that died before it reported)."""
    return dataclasses.replace(
        base, status="done", finished_at=time.time(), resumed_from_task=list(record.resumed_from_task)
    )


def execution_independent(record: RunRecord) -> dict[str, Any]:
    """A record as JSON without the fields that differ between two executions of the same run (times, host, cache
    events, resumes). Two backends that ran the same plan must agree on everything left."""
    out = {k: v for k, v in record.to_dict().items() if k not in VOLATILE_FIELDS}
    out["per_task"] = [{k: v for k, v in t.items() if k not in VOLATILE_PER_TASK} for t in out["per_task"]]
    return out
