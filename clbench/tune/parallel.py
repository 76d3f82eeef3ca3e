"""Trials of a study run at once through ``clbench sweep``'s backends (:mod:`clbench.sweep.backends`): ``--jobs N``
worker processes on this machine, or Ray tasks (``--backend ray``, on a local Ray or the cluster at
``--ray-address``). Each trial is submitted as the sweep submits a run (:func:`clbench.sweep.worker.execute` with a
:class:`~clbench.sweep.worker.WorkerPayload`), so it is the same ordinary record in ``OUT/trials/`` and a crashed or
pre-empted worker is started again from the trial's checkpoint (twice at most: a sweep's default ``--retries``).

Optuna's ask-and-tell interface keeps the study in this process: a trial's settings are drawn here
(``study.ask``), its run executes in a worker, and its validation accuracy is told here (``study.tell``) when the
worker returns. Only this process writes the journal, so a study on a Ray cluster needs no shared journal; the trial
folders and the feature cache must be on storage every node sees, as for a sweep.

What is and is not deterministic with several trials at once:

- The settings of the first trials are: trial 0 is the method's defaults, and TPE's start-up trials (its first ten)
  are seeded random draws made in trial order, whatever order the workers finish in. A study with ``--jobs N`` tries
  the same first settings as one run trial by trial.
- Each trial's record depends on its settings (and, for float sums, the worker's thread count), not on the backend.
- After the start-up trials, TPE draws from the trials told so far, treating those still running as bad ones
  (Optuna's ``constant_liar``); which trials are finished when a trial is asked depends on the workers' timing, so
  the later settings, the chosen settings among them, can differ between two runs of the same study.
- Trials run at once are not pruned: each runs to its last task (its per-task validation accuracies are reported
  to the study afterwards, for the pruner of later trials run one at a time).

Resuming is the journal's, as for trials run one at a time: a trial asked but never told (the process was killed) or
told failed after an interruption is tried again first, with its settings, under a new trial number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files.atomic import cache_dir


@dataclass(frozen=True)
class Where:
    """Where a study's trials run: ``jobs`` None on the local backend runs them one at a time in this process (with
    the pruner); otherwise through the backend (``local``: ``jobs`` worker processes; ``ray``: Ray tasks, ``jobs``
    at once, default as many as the cluster's CPUs hold)."""

    backend: str = "local"
    jobs: int | None = None
    ray_address: str | None = None
    cpus_per_run: int | None = None

    def __post_init__(self) -> None:
        # deferred: loads numpy, which importing this module does not
        from clbench.sweep.settings import BACKENDS

        if self.backend not in BACKENDS:
            raise ClbenchError(f"--backend {self.backend!r} is unknown; valid backends: {', '.join(BACKENDS)}")
        if self.backend == "local" and self.ray_address:
            raise ClbenchError("--ray-address is for --backend ray", "add --backend ray, or drop --ray-address")
        for name in ("jobs", "cpus_per_run"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ClbenchError(f"--{name.replace('_', '-')} {value}: expected 1 or more")
        if self.in_process and self.cpus_per_run is not None:
            raise ClbenchError("--cpus-per-run is for trials run at once", "add --jobs N (or --backend ray)")

    @property
    def in_process(self) -> bool:
        return self.backend == "local" and self.jobs is None

    def describe(self) -> str:
        if self.in_process:
            return "one trial at a time, in this process"
        if self.backend == "local":
            return f"{self.jobs} trials at once (local worker processes)"
        where = self.ray_address or "a local Ray"
        return f"{self.jobs or 'as many trials as its CPUs hold'}{' trials' if self.jobs else ''} at once on {where}"


def _backend(where: Where) -> tuple[Any, int]:
    """The sweep's backend for ``where`` and the number of trials it runs at once."""
    # deferred: loads torch, which importing this module does not
    from clbench.sweep.backends import LocalBackend, RayBackend, Resources

    res = Resources(jobs=where.jobs, cpus_per_run=where.cpus_per_run)
    if where.backend == "local":
        backend = LocalBackend(res)
        return backend, backend.jobs
    backend = RayBackend(res, where.ray_address)
    cpus = backend.ray.cluster_resources().get("CPU", 1)
    return backend, where.jobs or max(1, int(cpus // backend.cpus))


def _env() -> dict[str, str]:
    """The environment every trial's worker gets: the sweep's (cache, offline mode, threads)."""
    # deferred: loads torch, which importing this module does not
    from clbench.sweep.runner import PASSED_ENV

    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.setdefault("CLBENCH_CACHE", str(cache_dir().resolve()))
    return env


@dataclass(frozen=True)
class StudyHooks:
    """What :func:`run_trials` takes from the study (:mod:`clbench.tune.study`, which calls it): a trial's run
    (``config(req, number, params)``), the record's summary field that is the trial's value, the count of finished
    trials and the best value so far (each of the study)."""

    config: Callable[[Any, int, dict[str, Any]], Any]
    objective: str
    finished: Callable[[Any], int]
    best_value: Callable[[Any], float | None]


def run_trials(
    study: Any,  # an optuna.Study
    req: Any,  # a clbench.tune.study.TuneRequest
    hooks: StudyHooks,
    log: Callable[[str], None],
    advance: Callable[[int, float | None], None] | None,
    seconds: list[float],
) -> None:
    """Ask, submit and tell trials until ``req.trials`` have finished, up to the backend's number at once."""
    from optuna.trial import TrialState

    # deferred: loads numpy, torch, which importing this module does not
    from clbench.records.results import load_record
    from clbench.run.harness import resolve
    from clbench.sweep.worker import WorkerPayload

    finished, best_value = hooks.finished, hooks.best_value

    backend, at_once = _backend(req.where)
    log(f"trials run through the {req.where.backend} backend, {at_once} at once (not pruned)")
    resolved = dataclasses.replace(req, out=req.out.resolve())  # a worker may run elsewhere: absolute folders
    env, study_id = _env(), f"tune-{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
    in_flight: dict[str, tuple[Any, Any, Any]] = {}  # run id -> (trial, its RunConfig, its payload)
    attempts: dict[str, int] = {}

    def submit(run_id: str) -> None:
        attempts[run_id] = attempts.get(run_id, 0) + 1
        backend.submit(run_id, in_flight[run_id][2])

    def ended(trial: Any) -> None:
        if advance is not None:
            advance(finished(study), best_value(study))
        if len(seconds) == 1 and (left := req.trials - finished(study)) > 0:
            rounds = math.ceil(left / at_once)
            log(
                f"measured: {seconds[0]:.1f} s for the first trial; about {rounds * seconds[0] / 60:.1f} min for the "
                f"{left} left, {at_once} at once"
            )

    try:
        while True:
            while len(in_flight) < at_once and finished(study) + len(in_flight) < req.trials:
                trial = study.ask()
                params = {k: d.suggest(trial) for k, d in req.space.items()}
                cfg = hooks.config(resolved, trial.number, params)
                try:
                    fingerprint = resolve(cfg).fingerprint  # a bad setting fails here, as in a trial run here
                except ClbenchError as e:
                    log(f"trial {trial.number} failed: {e.args[0]}")
                    study.tell(trial, state=TrialState.FAIL)
                    ended(trial)
                    continue
                run_id = Path(cfg.out).name
                payload = WorkerPayload(
                    run_id=run_id,
                    config=json.loads(json.dumps(dataclasses.asdict(cfg))),
                    fingerprint=fingerprint,
                    env=env,
                    threads=backend.threads,
                    sweep_id=study_id,
                )
                in_flight[run_id] = (trial, cfg, payload)
                submit(run_id)
            if not in_flight:
                backend.close()
                return
            for run_id, outcome, failure in backend.wait(timeout=0.5):
                trial, cfg, _ = in_flight[run_id]
                if outcome is not None and outcome.status == "done":
                    try:
                        record = load_record(cfg.out)
                    except ClbenchError as e:
                        outcome, failure = None, f"its record cannot be used ({e.args[0]})"
                        attempts[run_id] = 1 << 30  # no retry: the worker said it finished
                    else:
                        summary = record.summary(record.protocol)
                        for t, acc in enumerate(summary.acc_curve):
                            trial.report(acc, t)  # the per-task values the pruner reads in later trials
                        trial.set_user_attr("run", record.run_id)
                        if outcome.started_at is not None and outcome.finished_at is not None:
                            seconds.append(outcome.finished_at - outcome.started_at)  # in the worker, one clock
                        del in_flight[run_id]
                        value = getattr(summary, hooks.objective)
                        if value is None:
                            log(f"trial {trial.number} finished without a validation accuracy")
                            study.tell(trial, state=TrialState.FAIL)
                        else:
                            study.tell(trial, float(value))
                        ended(trial)
                        continue
                if outcome is not None:  # the user's error (a bad setting): a retry cannot help
                    failure = outcome.error or f"the worker reported {outcome.status or 'no status'}"
                elif backend.retries_left(attempts[run_id]):
                    again = attempts[run_id] + 1
                    log(f"trial {trial.number}: {failure}; attempt {again} continues from its checkpoint")
                    submit(run_id)
                    continue
                log(f"trial {trial.number} failed: {failure}")
                del in_flight[run_id]
                study.tell(trial, state=TrialState.FAIL)
                ended(trial)
    except BaseException:
        for trial, _, _ in in_flight.values():  # a rerun tries these settings again (study._retry_interrupted)
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)
        backend.close(cancel=True)
        raise
