"""``clbench sweep``: every (strategy, benchmark, seed) of a paper table, on this machine or on a Ray cluster.

A sweep is a plan of ordinary runs (:func:`clbench.run.harness.run`), one run folder each, under ``--out DIR``:

- ``DIR/runs/<strategy>-<bench>-s<seed>/``: the run folder (``result.json``; ``checkpoint.safetensors`` while
  unfinished; ``features.npz``; ``run.log``, the run's messages; ``attempt.json``, where and when its
  last attempt started).
- ``DIR/sweep.json``: the plan, each run's state and outcome (:class:`~clbench.sweep.manifest.RunOutcome`) with
  its timestamps, the backend, and the measured sweep overhead. Rewritten (atomically) whenever a run ends.
- ``DIR/summary.md`` / ``summary.csv``: mean ± half the 95 % interval (and the std) over seeds per (benchmark, backbone,
  strategy, protocol), from :mod:`clbench.report.tables`; ``DIR/report/``: ``clbench report`` of every complete run.

Re-invoking the same command continues the sweep: a run whose record is complete with the same settings is skipped;
an unfinished one continues from its last checkpoint (the harness does this for any run folder). A run folder that
holds a run with other settings is refused before anything starts.

Backends (the scheduling is theirs; clbench only plans, submits and collects):

- ``local`` (default): :class:`concurrent.futures.ProcessPoolExecutor` with ``--jobs`` worker processes (spawned;
  each dies with the sweep). A run that fails with an error that is not the user's (a crash, a killed worker) is
  submitted again, up to ``--retries`` times, and continues from its checkpoint.
- ``ray``: each run is a Ray task with its resource needs (``num_cpus``, ``num_gpus``, ``memory``), submitted to the
  cluster at ``--ray-address`` or to a local Ray started for the sweep. Ray itself retries a task whose worker or
  node died (``max_retries``) or that raised (``retry_exceptions``); the retry continues from the run's checkpoint.
  ``DIR`` and the feature cache (``--cache``, default ``$CLBENCH_CACHE``) must be on storage every node sees.
  Errors the user must fix (a missing data folder, a bad setting) are returned, not raised, so they are not retried.

Overhead (``sweep.json`` -> ``overhead``): how it is measured is in :mod:`clbench.sweep.runner`.

Parts: :mod:`~clbench.sweep.plan` (what to run, and which run folders can be skipped or continued),
:mod:`~clbench.sweep.settings` (the sweep's own settings and resources, declared once: its flags are generated),
:mod:`~clbench.sweep.worker` (one run in a worker process), :mod:`~clbench.sweep.backends` (local process pool,
Ray), :mod:`~clbench.sweep.runner` (submit, collect, the overhead), :mod:`~clbench.sweep.manifest` (``sweep.json``:
its type, its one reader and writer) and :mod:`~clbench.sweep.summary`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time each name is imported from its part when first used
    from clbench.core.config import parse_list
    from clbench.sweep.backends import BACKENDS, LocalBackend, RayBackend, Resources
    from clbench.sweep.manifest import RunOutcome
    from clbench.sweep.plan import (
        ATTEMPT_FILE,
        LOG_FILE,
        SWEEP_FILE,
        PlannedRun,
        SweepSpec,
        check_folders,
        inspect,
        make_plan,
        parse_data_roots,
        parse_scoped_override,
        parse_seeds,
    )
    from clbench.sweep.runner import SweepView, overhead, run_sweep
    from clbench.sweep.summary import write_summary
    from clbench.sweep.worker import WorkerPayload, execute, execution_independent

# name -> the part that defines it: imported on first use (PEP 562), so that reading a sweep's plan (a report's study
# file) does not import the worker's run loop, and with it torch
_PARTS = {
    "BACKENDS": "backends",
    "LocalBackend": "backends",
    "RayBackend": "backends",
    "Resources": "backends",
    "RunOutcome": "manifest",
    "ATTEMPT_FILE": "plan",
    "LOG_FILE": "plan",
    "SWEEP_FILE": "plan",
    "PlannedRun": "plan",
    "SweepSpec": "plan",
    "check_folders": "plan",
    "inspect": "plan",
    "make_plan": "plan",
    "parse_data_roots": "plan",
    "parse_list": "plan",
    "parse_scoped_override": "plan",
    "parse_seeds": "plan",
    "SweepView": "runner",
    "overhead": "runner",
    "run_sweep": "runner",
    "write_summary": "summary",
    "WorkerPayload": "worker",
    "execute": "worker",
    "execution_independent": "worker",
}


def __getattr__(name: str) -> Any:
    if name in _PARTS:
        return getattr(importlib.import_module(f"clbench.sweep.{_PARTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATTEMPT_FILE",
    "BACKENDS",
    "LOG_FILE",
    "SWEEP_FILE",
    "LocalBackend",
    "PlannedRun",
    "RayBackend",
    "Resources",
    "RunOutcome",
    "SweepSpec",
    "SweepView",
    "WorkerPayload",
    "check_folders",
    "execute",
    "execution_independent",
    "inspect",
    "make_plan",
    "overhead",
    "parse_data_roots",
    "parse_list",
    "parse_scoped_override",
    "parse_seeds",
    "run_sweep",
    "write_summary",
]
