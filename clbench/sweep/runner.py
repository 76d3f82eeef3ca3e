"""Run a sweep: plan, skip what is done, submit the rest to a backend, collect the outcomes and keep ``sweep.json``
up to date (rewritten atomically whenever a run ends).

Overhead (``sweep.json`` -> ``overhead``): each run's start and end are taken inside the worker around
:func:`clbench.run.harness.run`; the sweep adds its own submission and collection times. ``per_run_s`` is
(active window x the largest number of runs seen running at once - the sum of run durations) / runs executed: with
one run at a time it is exactly the mean gap between one run's end and the next one's start plus the collection of
the last. ``startup_s`` is the time from the sweep's start to the first run's start (pool or Ray start, worker
imports). On a cluster the timestamps come from several clocks; durations are taken on one host each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clbench.core.config import WEIGHT_SOURCES  # --weights values that are not a file
from clbench.errors import ClbenchError
from clbench.files.atomic import cache_dir
from clbench.files.safety import (
    check_output_folder,
    folder_mark,
    mark_folder,
    open_lock,
    owned_folder,
    special_file_problem,
)
from clbench.records.host import git_revision
from clbench.records.results import load_record
from clbench.run.rundir import check_folder
from clbench.sweep.backends import LocalBackend, RayBackend
from clbench.sweep.manifest import (
    BackendInfo,
    Invocation,
    Overhead,
    PlannedEntry,
    RunOutcome,
    SweepManifest,
    load_manifest,
    write_manifest,
)
from clbench.sweep.plan import (
    ATTEMPT_FILE,
    LOG_FILE,
    SWEEP_FILE,
    PlannedRun,
    SweepSpec,
    check_folders,
    make_plan,
    read_json,
    read_run_record,
)
from clbench.sweep.settings import BACKENDS, Resources
from clbench.sweep.worker import TrackerSettings, WorkerPayload

# Environment passed from the sweep to every run (wherever it executes): where weights and caches live, offline mode.
PASSED_ENV = (
    "CLBENCH_CACHE",
    "HF_HUB_OFFLINE",
    "HF_HOME",
    "TORCH_HOME",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "WANDB_MODE",  # --log wandb: offline unless the user set another mode (clbench.run.trackers)
    "WANDB_PROJECT",
)


class SweepView:
    """No output (tests, library use). The CLI's view is :class:`clbench.ui.RichSweepView`."""

    def start(self, plan: list[PlannedRun], todo: list[PlannedRun]) -> None:
        pass

    def running(self, run: PlannedRun, tasks_done: int, n_tasks: int | None, last_line: str) -> None:
        pass

    def ended(self, run: PlannedRun, ok: bool, message: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass


def _last_line(path: Path) -> str:
    if special_file_problem(path) is not None:  # missing, or a FIFO that would block the read
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400))
            lines = f.read().decode(errors="replace").strip().splitlines()
        return lines[-1][9:] if lines else ""
    except OSError:
        return ""


def overhead(outcomes: list[RunOutcome], sweep_start: float) -> dict[str, Any]:
    """Sweep overhead from the runs' timestamps (see the module docstring)."""
    spans = [span for o in outcomes if (span := o.span()) is not None]
    if not spans:
        return {}
    durations = [finished - started for started, finished, _ in spans]
    events = sorted([(started, 1) for started, _, _ in spans] + [(finished, -1) for _, finished, _ in spans])
    at_once = peak = 0
    for _, step in events:
        at_once += step
        peak = max(peak, at_once)
    first, last = min(started for started, _, _ in spans), max(collected for _, _, collected in spans)
    return {
        "runs_executed": len(spans),
        "startup_s": first - sweep_start,
        "max_concurrent_runs": peak,
        "active_window_s": last - first,
        "run_time_s": sum(durations),
        "per_run_s": ((last - first) * peak - sum(durations)) / len(spans),
        "collection_s_mean": sum(collected - finished for _, finished, collected in spans) / len(spans),
        "definition": "per_run_s = (active window x max concurrent runs - sum of run durations) / runs executed; "
        "startup_s = sweep start to first run start",
    }


def run_sweep(
    spec: SweepSpec,
    backend_name: str = "local",
    res: Resources | None = None,
    ray_address: str | None = None,
    view: SweepView | None = None,
    cache: str | None = None,
    dry_run: bool = False,
    command: str | None = None,
    log: dict[str, Any] | None = None,
) -> SweepManifest:
    """Plan, skip what is done, run the rest on the backend, and write ``sweep.json``. Returns the manifest.
    ``log``: the experiment trackers of every run (:class:`clbench.run.trackers.LogSpec` as a dict)."""
    view = view or SweepView()
    res = res or Resources()
    if backend_name not in BACKENDS:
        raise ClbenchError(f"--backend {backend_name!r} is unknown; valid backends: {', '.join(BACKENDS)}")
    if backend_name == "local" and ray_address:
        raise ClbenchError("--ray-address is for --backend ray", "add --backend ray, or drop --ray-address")

    check_folder(spec.out, "out")
    check_sweep_folder(spec.out)
    if cache is not None:
        check_folder(Path(cache), "cache")
    out = spec.out.resolve()
    settings = dict(spec.settings)
    if settings.get("weights") not in (None, *WEIGHT_SOURCES):  # a weights file: absolute, as the data roots
        settings["weights"] = str(Path(settings["weights"]).expanduser().resolve())
    spec = dataclasses.replace(spec, out=out, settings=settings)
    plan = make_plan(spec)
    check_folders(plan)  # before anything is written (again under the lock below: a second sweep may change them)
    if dry_run:
        return dataclasses.replace(_manifest(spec, plan, command), dry_run=True)
    if cache:
        os.environ["CLBENCH_CACHE"] = str(Path(cache).resolve())
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if "CLBENCH_CACHE" not in env:
        env["CLBENCH_CACHE"] = str(cache_dir().resolve())
    out.mkdir(parents=True, exist_ok=True)

    mark_folder(out, "sweep")  # first: a sweep killed before sweep.json is still recognised as clbench's
    lock = _lock_sweep(out)  # before the folders are read: a second sweep on DIR must not change them meanwhile
    try:
        owned_folder(out, "runs", "--out")  # a real folder inside DIR, not a link
        check_folders(plan)
        manifest = _manifest(spec, plan, command)
        manifest.cache = env["CLBENCH_CACHE"]
        return _execute_plan(plan, manifest, out, backend_name, res, ray_address, view, env, log)
    finally:
        lock.close()  # releases the lock


def is_sweep_folder(path: Path) -> bool:
    """Whether ``path`` is a sweep folder clbench made: its mark file says so, or (a sweep of an older clbench) it
    holds a ``sweep.json`` that reads as a sweep manifest."""
    mark = folder_mark(path)
    if mark is not None:
        return mark == "sweep"
    if not (path / SWEEP_FILE).is_file() or (path / SWEEP_FILE).is_symlink():
        return False
    try:
        load_manifest(path / SWEEP_FILE)
    except ClbenchError:
        return False
    return True


def check_sweep_folder(out: Path) -> None:
    """Refuse ``--out`` before anything is written when it is an existing folder of other files (not new, empty or
    a clbench sweep folder), or when its ``runs/`` or ``report/`` is a link or a file, or its ``report/`` a folder
    of other files: the sweep writes, replaces and deletes files in all of them. Writes nothing."""
    # deferred: loads pandas, which importing this module does not
    from clbench.report.build import check_report_folder

    owned_folder(out, "runs", "--out", create=False)
    owned_folder(out, "report", "--out", create=False)
    check_output_folder(out, "sweep", "--out", is_sweep_folder, example="sweep")
    check_report_folder(out / "report")


def _manifest(spec: SweepSpec, plan: list[PlannedRun], command: str | None) -> SweepManifest:

    return SweepManifest(
        command=command,
        strategies=list(spec.strategies),
        benches=list(spec.benches),
        seeds=list(spec.seeds),
        vary=spec.vary,
        settings=dict(spec.settings),
        profile=spec.profile,
        overrides=[list(o) for o in spec.overrides],
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git_revision=git_revision(),
        complete=False,
        runs={
            r.run_id: PlannedEntry(
                path=str(r.path.relative_to(spec.out)),
                state_at_start=r.state,
                tasks_done_at_start=r.tasks_done,
                fingerprint=r.fingerprint,
            )
            for r in plan
        },
        history=_history(spec.out / SWEEP_FILE),
    )


def _history(path: Path) -> list[Invocation]:
    """The earlier invocations of this sweep (kept, with their overhead); none where ``sweep.json`` is missing or
    unreadable (a torn write, a file edited by hand): the runs' folders, not the manifest, say what is done."""
    if not path.exists():
        return []
    try:
        earlier = load_manifest(path)
    except ClbenchError:
        return []
    return [*earlier.history, earlier.summary()]


def _lock_sweep(out: Path):
    import fcntl

    handle = open_lock(out / ".sweep.lock")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ClbenchError(
            f"another clbench sweep is running in {out}",
            "wait for it to finish (it writes sweep.json as runs end) or choose another --out",
        ) from None
    return handle


def _execute_plan(
    plan: list[PlannedRun],
    manifest: SweepManifest,
    out: Path,
    backend_name: str,
    res: Resources,
    ray_address: str | None,
    view: SweepView,
    env: dict[str, str],
    log: dict[str, Any] | None = None,
) -> SweepManifest:
    todo = [r for r in plan if r.state != "complete"]
    sweep_start = time.time()
    backend = (LocalBackend(res) if backend_name == "local" else RayBackend(res, ray_address)) if todo else None
    described = backend.describe() if backend else {"backend": backend_name, "note": "nothing to run"}
    manifest.backend = BackendInfo.from_json(described)
    trackers = TrackerSettings.from_dict(json.loads(json.dumps(log))) if log else None
    sweep_id = f"{socket.gethostname()}-{os.getpid()}-{int(sweep_start)}"
    by_id = {r.run_id: r for r in plan}
    attempts: dict[str, int] = {}

    def payload(r: PlannedRun) -> WorkerPayload:
        return WorkerPayload(
            run_id=r.run_id,
            config=json.loads(json.dumps(dataclasses.asdict(r.cfg))),  # as JSON (tuples as lists)
            fingerprint=r.fingerprint,
            env=env,
            threads=backend.threads,
            sweep_id=sweep_id,
            log=trackers,
        )

    def submit(r: PlannedRun) -> None:
        attempts[r.run_id] = attempts.get(r.run_id, 0) + 1
        queued = manifest.runs[r.run_id].outcome
        if queued.queued_at is None:  # the first submission's: a retry keeps it
            queued.queued_at = time.time()
        backend.submit(r.run_id, payload(r))

    def save() -> None:
        for r in plan:
            manifest.runs[r.run_id].state = r.state
        manifest.overhead = Overhead.from_dict(overhead([e.outcome for e in manifest.runs.values()], sweep_start))
        write_manifest(out / SWEEP_FILE, manifest)

    view.start(plan, todo)
    for r in plan:
        if r.state == "complete":
            note = "complete record with the same settings"
            manifest.runs[r.run_id].outcome = RunOutcome(status="skipped", note=note)
    save()
    running = set()
    try:
        for r in todo:
            submit(r)
            running.add(r.run_id)
        while running:
            for run_id, outcome, failure in backend.wait(timeout=0.5):
                r, entry = by_id[run_id], manifest.runs[run_id]
                now = time.time()
                if outcome is not None and outcome.status == "done":
                    try:
                        record = load_record(r.path)
                    except ClbenchError as e:
                        failure, outcome = f"the run reported success but its record cannot be used ({e.args[0]})", None
                    else:
                        entry.outcome = dataclasses.replace(
                            outcome,
                            queued_at=entry.outcome.queued_at,
                            collected_at=time.time(),
                            attempts=attempts[run_id],
                            last_acc=record.last_acc,
                            avg_acc=record.avg_acc,
                        )
                        r.state = "complete"
                        running.discard(run_id)
                        resumed = record.resumed_from_task
                        note = f" (continued after task {resumed[-1]})" if resumed else ""
                        span = entry.outcome.span()
                        took = f"  {span[1] - span[0]:.0f} s" if span else ""
                        view.ended(r, True, f"final {record.last_acc:.2f}  avg {record.avg_acc:.2f}{took}{note}")
                        save()
                        continue
                if outcome is not None:  # a user error: retrying cannot help
                    failure = outcome.error or f"the worker reported {outcome.status or 'no status'} and no error"
                elif backend.retries_left(attempts[run_id]):
                    view.log(f"{run_id}: {failure}; attempt {attempts[run_id] + 1} continues from its checkpoint")
                    submit(r)
                    continue
                r.state = "failed"
                entry.outcome = dataclasses.replace(
                    entry.outcome, status="failed", error=failure, attempts=attempts[run_id], collected_at=now
                )
                running.discard(run_id)
                view.ended(r, False, failure)
                save()
            for run_id in running:
                r = by_id[run_id]
                attempt = read_json(r.path / ATTEMPT_FILE)
                if attempt and attempt.get("sweep") == sweep_id:
                    try:
                        record = read_run_record(r.path)
                    except ClbenchError:
                        record = None
                    done_tasks = record.tasks_done if record else 0
                    n_tasks = len(record.task_sizes) if record else None
                    view.running(r, done_tasks, n_tasks, _last_line(r.path / LOG_FILE))
    except BaseException:
        manifest.interrupted = datetime.now(timezone.utc).isoformat(timespec="seconds")
        save()
        if backend:
            backend.close(cancel=True)
        raise
    if backend:
        backend.close()
    manifest.finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest.complete = all(r.state == "complete" for r in plan)
    save()
    return manifest
