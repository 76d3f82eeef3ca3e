"""``clbench sweep``: every (strategy, benchmark, seed) of a paper table, on this machine or on a Ray cluster.

A sweep is a plan of ordinary runs (:func:`clbench.harness.run`), one run folder each, under ``--out DIR``:

- ``DIR/runs/<strategy>-<bench>-s<seed>/``: the run folder (``result.json``; ``checkpoint.pt`` while unfinished;
  ``features.npz``; ``run.log``, the run's messages; ``attempt.json``, where and when its last attempt started).
- ``DIR/sweep.json``: the plan, each run's state and outcome with its timestamps, the backend, and the measured
  sweep overhead. Rewritten (atomically) whenever a run ends.
- ``DIR/summary.md`` / ``summary.csv``: mean ± standard deviation over seeds per (benchmark, backbone, strategy,
  protocol), from :mod:`clbench.report.tables`; ``DIR/report/``: ``clbench report`` of every complete run.

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

Overhead (``sweep.json`` -> ``overhead``): each run's start and end are taken inside the worker around
:func:`clbench.harness.run`; the sweep adds its own submission and collection times. ``per_run_s`` is
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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clbench.config import WEIGHT_SOURCES  # --weights values that are not a file
from clbench.errors import ClbenchError
from clbench.io import atomic_write_json

SWEEP_FILE = "sweep.json"
ATTEMPT_FILE = "attempt.json"
LOG_FILE = "run.log"
BACKENDS = ("local", "ray")
# Environment passed from the sweep to every run (wherever it executes): where weights and caches live, offline mode.
PASSED_ENV = ("CLBENCH_CACHE", "HF_HUB_OFFLINE", "HF_HOME", "TORCH_HOME", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")
# Record fields that differ between two executions of the same run (time, place, order of cache use).
VOLATILE_FIELDS = ("created", "finished", "command", "time_s", "peak_rss_mb", "feature_cache", "host",
                   "precision_reason",
                   "git_revision", "versions", "run_id", "resumed_from_task")
VOLATILE_PER_TASK = ("train_s", "eval_s")
HISTORY_FIELDS = ("command", "started", "finished", "interrupted", "complete", "backend", "overhead")


# ----------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class SweepSpec:
    strategies: tuple[str, ...]
    benches: tuple[str, ...]
    seeds: tuple[int, ...]
    out: Path
    settings: dict[str, Any] = field(default_factory=dict)  # RunConfig fields shared by every run
    data_roots: dict[str | None, str] = field(default_factory=dict)  # bench (None: every bench) -> folder
    profile: str | None = None  # applied to the strategies that define it
    overrides: tuple[tuple[str | None, str, str], ...] = ()  # (strategy or None for all, key, value)


@dataclass
class PlannedRun:
    run_id: str
    cfg: Any  # clbench.harness.RunConfig
    fingerprint: dict[str, Any]
    state: str = "new"  # new | partial (continues from its checkpoint) | complete (skipped)
    tasks_done: int = 0
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.cfg.out)


def parse_list(text: str, what: str) -> tuple[str, ...]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ClbenchError(f"--{what} is empty", f"give a comma-separated list, e.g. --{what} " +
                           {"strategies": "tosca,simplecil", "benches": "emoji", "seeds": "1993,1994,1995"}[what])
    return tuple(dict.fromkeys(items))  # order kept, repeats dropped


def parse_seeds(text: str) -> tuple[int, ...]:
    from clbench.config import RUN_SETTINGS

    seeds = []
    for item in parse_list(text, "seeds"):
        try:
            seeds.append(int(item))
        except ValueError:
            raise ClbenchError(f"--seeds: {item!r} is not an integer", "e.g. --seeds 1993,1994,1995") from None
        dataclasses.replace(RUN_SETTINGS["seed"], flag="--seeds").check(seeds[-1])
    return tuple(seeds)


def parse_scoped_override(key: str, value: str) -> tuple[str | None, str, str]:
    """``tosca.epochs=5`` -> ("tosca", "epochs", "5"); ``epochs=5`` -> (None, "epochs", "5")."""
    scope, dot, name = key.partition(".")
    return (scope, name, value) if dot else (None, key, value)


def parse_data_roots(values: Sequence[str], benches: Sequence[str]) -> dict[str | None, str]:
    """``--data-root DIR`` (every benchmark) or ``--data-root BENCH=DIR`` (one), repeatable."""
    roots: dict[str | None, str] = {}
    for v in values:  # absolute: a run may execute in another working directory (a Ray worker, another node)
        name, eq, path = v.partition("=")
        if eq and name in benches:
            roots[name] = str(Path(path).expanduser().resolve())
        else:
            roots[None] = str(Path(v).expanduser().resolve())
    return roots


def make_plan(spec: SweepSpec) -> list[PlannedRun]:
    """Every run of the sweep, each checked (names, settings) before anything is loaded."""
    from clbench.catalog import STRATEGIES
    from clbench.checkpoint import fingerprint
    from clbench.harness import RunConfig, resolve

    for scope, key, _ in spec.overrides:
        if scope is not None and scope not in spec.strategies:
            raise ClbenchError(f"--set {scope}.{key}: {scope!r} is not one of the sweep's strategies "
                               f"({', '.join(spec.strategies)})")
    if spec.profile is not None and not any(spec.profile in STRATEGIES.get(s).profiles for s in spec.strategies):
        raise ClbenchError(f"--profile {spec.profile}: none of {', '.join(spec.strategies)} has that profile")
    plan = []
    for bench in spec.benches:
        for strategy in spec.strategies:
            cls = STRATEGIES.get(strategy)
            overrides = tuple((k, v) for scope, k, v in spec.overrides if scope in (None, strategy))
            profile = spec.profile if spec.profile in cls.profiles else None
            for seed in spec.seeds:
                run_id = f"{strategy}-{bench}-s{seed}"
                cfg = RunConfig(strategy=strategy, bench=bench, seed=seed, profile=profile, overrides=overrides,
                                data_root=spec.data_roots.get(bench, spec.data_roots.get(None)),
                                out=str(spec.out / "runs" / run_id), **spec.settings)
                try:
                    _, _, backbone, _, _ = resolve(cfg)
                except ClbenchError as e:
                    if any(s is None for s, _, _ in spec.overrides) and "has no setting" in str(e):
                        raise ClbenchError(e.args[0], "scope a setting to one strategy with --set "
                                           "STRATEGY.KEY=VALUE, e.g. --set tosca.epochs=5") from None
                    raise
                plan.append(PlannedRun(run_id, cfg, fingerprint(cfg, backbone)))
    return plan


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _same_fingerprint(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    return json.loads(json.dumps(saved)) == json.loads(json.dumps(current))


def inspect(run: PlannedRun) -> str | None:
    """Set ``run.state`` from its folder; return why the folder cannot be used (other settings), or None."""
    from clbench.checkpoint import CHECKPOINT_FILE, differences
    from clbench.results import RESULT_FILE

    record = _read_json(run.path / RESULT_FILE)
    if record is None:
        run.state = "partial" if (run.path / CHECKPOINT_FILE).exists() else "new"
        return None
    saved = record.get("fingerprint")
    if saved is None:
        return "its record has no settings fingerprint (written by an older clbench)"
    if not _same_fingerprint(saved, run.fingerprint):
        return "; ".join(d.replace("in the checkpoint", "there") for d in differences(saved, run.fingerprint))
    run.tasks_done = len(record.get("per_task", []))
    if record.get("complete"):
        run.state = "complete"
    elif (run.path / CHECKPOINT_FILE).exists():
        run.state = "partial"
    else:
        return "it holds an unfinished record without a checkpoint to continue from"
    return None


def check_folders(plan: list[PlannedRun]) -> None:
    conflicts = [f"{r.path}: {why}" for r in plan if (why := inspect(r)) is not None]
    if conflicts:
        shown = "\n  ".join(conflicts[:10]) + (f"\n  ... and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise ClbenchError(f"{len(conflicts)} run folder(s) of this sweep hold runs it cannot skip or continue "
                           f"(other settings, or nothing to continue from):\n  {shown}",
                           "choose another --out, or delete those run folders to run them again")


# ----------------------------------------------------------------------------------------------- one run (worker)
class _LogReporter:
    """The harness's Reporter for a run in a worker: messages appended to ``run.log`` (flushed at once, so the
    sweep's progress view and a user on another node can follow them)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1)

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
    from clbench.results import RESULT_FILE

    torch.set_num_threads(payload["threads"])
    values = dict(payload["config"])
    values["overrides"] = tuple(tuple(kv) for kv in values["overrides"])
    cfg = RunConfig(**values)
    path = Path(cfg.out)
    path.mkdir(parents=True, exist_ok=True)
    started = time.time()
    where = {"host": socket.gethostname(), "pid": os.getpid()}
    base = {"run_id": payload["run_id"], "started_at": started, **where}
    record = _read_json(path / RESULT_FILE)
    if record and record.get("complete") and _same_fingerprint(record.get("fingerprint"), payload["fingerprint"]):
        # a retry of an attempt that finished writing but died before it reported
        return {**base, "status": "done", "finished_at": time.time(), "resumed_from_task": record["resumed_from_task"]}
    atomic_write_json(path / ATTEMPT_FILE, {"sweep": payload["sweep_id"], **base})
    reporter = _LogReporter(path / LOG_FILE)
    reporter.log(f"attempt started on {where['host']} (pid {where['pid']}, {payload['threads']} threads)")
    try:
        record = run(cfg, reporter)
    except ClbenchError as e:
        reporter.log(f"error: {e}")
        return {**base, "status": "error", "error": str(e), "finished_at": time.time()}
    except BaseException as e:
        reporter.log(f"failed: {type(e).__name__}: {e}")
        raise
    finally:
        reporter.close()
    return {**base, "status": "done", "finished_at": time.time(), "resumed_from_task": record["resumed_from_task"]}


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the fields that differ between two executions of the same run (times, host, cache events,
    resumes). Two backends that ran the same plan must agree on everything left."""
    out = {k: v for k, v in record.items() if k not in VOLATILE_FIELDS}
    out["per_task"] = [{k: v for k, v in t.items() if k not in VOLATILE_PER_TASK} for t in record.get("per_task", [])]
    return out


# ----------------------------------------------------------------------------------------------- backends
@dataclass
class Resources:
    jobs: int | None  # runs at once (local: pool size; ray: cap on the local Ray's CPUs); None: the default
    cpus_per_run: int | None
    gpus_per_run: float | None  # None: 1 where the cluster has GPUs, else 0
    memory_per_run_gb: float | None
    retries: int = 2
    ray_timeout: float = 30.0  # seconds to reach a Ray cluster (--ray-address) before giving up

    def __post_init__(self) -> None:
        from clbench.config import SWEEP_SETTINGS, check_settings

        check_settings(dataclasses.asdict(self), SWEEP_SETTINGS)


class LocalBackend:
    """``--jobs`` spawned worker processes on this machine; a run that crashes or whose worker dies is submitted
    again (up to ``retries`` times) and continues from its checkpoint."""

    name = "local"

    def __init__(self, res: Resources) -> None:
        self.jobs = 1 if res.jobs is None else res.jobs
        self.threads = res.cpus_per_run if res.cpus_per_run is not None else max(1, (os.cpu_count() or 1) // self.jobs)
        self.retries = res.retries
        self._pool = None
        self._futures: dict[Any, tuple[str, Any]] = {}  # future -> (run id, the pool that runs it)

    def describe(self) -> dict[str, Any]:
        return {"backend": "local", "jobs": self.jobs, "threads_per_run": self.threads, "retries": self.retries}

    def _ensure_pool(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_die_with_parent)
        return self._pool

    def submit(self, run_id: str, payload: dict[str, Any]) -> None:
        pool = self._ensure_pool()
        self._futures[pool.submit(execute, payload)] = (run_id, pool)

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any] | None, str | None]]:
        """(run_id, outcome, failure) for every run that ended."""
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as futures_wait
        from concurrent.futures.process import BrokenProcessPool

        if not self._futures:
            return []
        finished, _ = futures_wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        ended = []
        for fut in finished:
            run_id, pool = self._futures.pop(fut)
            try:
                ended.append((run_id, fut.result(), None))
            except BrokenProcessPool:
                ended.append((run_id, None, "a worker process of the pool died (killed, or out of memory)"))
                if pool is self._pool:  # every future of a broken pool fails; a new pool serves the retries
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = None
            except Exception as e:  # the run's own crash, whatever its type: reported, and retried
                ended.append((run_id, None, f"{type(e).__name__}: {e}"))
        return ended

    def retries_left(self, attempts: int) -> bool:
        return attempts <= self.retries

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None


def _die_with_parent() -> None:
    """Pool initializer: the worker gets SIGKILL when the sweep process dies (Linux), so a killed sweep leaves no
    run writing on its own; the re-invoked sweep continues it from its checkpoint."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _token_auth_for_existing_cluster() -> None:
    """Ray >= 2.5x starts clusters with token authentication by default, but a driver connecting to one sends its
    token only when ``RAY_AUTH_MODE=token`` is set. Where the mode is not set and a token is at hand, set it (a
    cluster without authentication accepts such a driver too)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        if "ray" in sys.modules:  # Ray read the mode when it was imported: make it read it again
            try:
                from ray._private.authentication.authentication_token_setup import _enable_token_auth

                _enable_token_auth()
            except (ImportError, AttributeError):
                pass


RAY_HINT = ("start one with `ray start --head` and pass the address it prints (e.g. 127.0.0.1:6379), or leave "
            "--ray-address out to start a local Ray")


def _probe_ray_address(address: str, timeout: float) -> None:
    """Open (and close) a TCP connection to ``HOST:PORT`` (or ``ray://HOST:PORT``) within ``timeout`` seconds; a
    ClbenchError naming the address otherwise. ``auto`` (the cluster recorded on this machine) is left to Ray."""
    import socket

    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise ClbenchError(f"--ray-address {address}: expected HOST:PORT (or ray://HOST:PORT)", RAY_HINT)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
        raise ClbenchError(f"--ray-address {address}: no Ray cluster answers there ({why}, --ray-timeout "
                           f"{timeout:g} s)", RAY_HINT) from None


class RayBackend:
    """Each run is a Ray task with its resource needs; Ray schedules, places and retries them."""

    name = "ray"

    def __init__(self, res: Resources, address: str | None) -> None:
        if address:
            _probe_ray_address(address, res.ray_timeout)  # nothing listening: one line now, not a hang in ray.init
            _token_auth_for_existing_cluster()  # before Ray is imported: it reads the mode once
            # Ray's own wait for the cluster's GCS (read when Ray is imported), for a port that answers but is no Ray
            os.environ.setdefault("RAY_gcs_server_request_timeout_seconds", str(max(1, round(res.ray_timeout))))
        try:
            import ray
        except ImportError:
            raise ClbenchError("--backend ray needs Ray, which is not installed",
                               "pip install 'clbench[ray]' (or use --backend local)") from None
        self.ray = ray
        self.address = address
        self.cpus = 1 if res.cpus_per_run is None else res.cpus_per_run
        started_here = not ray.is_initialized()
        if started_here:
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level="warning")
                else:  # "local": a new Ray for this sweep, never a cluster that happens to run on this machine
                    ray.init(address="local", num_cpus=(res.jobs * self.cpus) if res.jobs else None,
                             include_dashboard=False, log_to_driver=False, logging_level="warning")
            except (ConnectionError, ValueError, RuntimeError) as e:
                if not address:
                    raise ClbenchError(f"--backend ray: could not start a local Ray ({e})",
                                       "check `ray start --head` works here, or use --backend local") from None
                raise ClbenchError(f"--ray-address {address}: could not connect to a Ray cluster ({e})",
                                   "start one with `ray start --head` and pass the address it prints "
                                   "(e.g. 127.0.0.1:6379), or leave --ray-address out to start a local Ray; a "
                                   "cluster with token authentication needs its token here (~/.ray/auth_token, "
                                   "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)") from None
        self._shutdown = started_here
        total = ray.cluster_resources()
        self.gpus = res.gpus_per_run if res.gpus_per_run is not None else (1.0 if total.get("GPU", 0) > 0 else 0.0)
        self.memory = None if res.memory_per_run_gb is None else int(res.memory_per_run_gb * 2**30)
        try:
            self._check_fits()
        except ClbenchError:
            self.close()
            raise
        self.threads = self.cpus
        self.retries = res.retries
        self._remote = ray.remote(execute).options(
            num_cpus=self.cpus, num_gpus=self.gpus, memory=self.memory, max_retries=res.retries,
            retry_exceptions=True)
        self._refs: dict[Any, str] = {}

    def _check_fits(self) -> None:
        """A task no node can hold would wait forever: refuse it now."""
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        need = {"CPU": self.cpus, "GPU": self.gpus, "memory": self.memory or 0}
        if not any(all(node.get(k, 0) >= v for k, v in need.items() if v) for node in nodes):
            have = "; ".join(f"CPU {n.get('CPU', 0):g}, GPU {n.get('GPU', 0):g}, memory {n.get('memory', 0) / 2**30:.1f} GB"
                             for n in nodes) or "no live nodes"
            raise ClbenchError(f"no Ray node can hold one run (CPU {self.cpus:g}, GPU {self.gpus:g}, memory "
                               f"{(self.memory or 0) / 2**30:.1f} GB); nodes: {have}",
                               "lower --cpus-per-run / --gpus-per-run / --memory-per-run, or add nodes")

    def describe(self) -> dict[str, Any]:
        return {"backend": "ray", "address": self.address or "local (started for the sweep)",
                "ray_version": self.ray.__version__, "cluster": self.ray.cluster_resources(),
                "cpus_per_run": self.cpus, "gpus_per_run": self.gpus,
                "memory_per_run_gb": None if self.memory is None else self.memory / 2**30, "max_retries": self.retries}

    def submit(self, run_id: str, payload: dict[str, Any]) -> None:
        self._refs[self._remote.remote(payload)] = run_id

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any] | None, str | None]]:
        if not self._refs:
            return []
        ready, _ = self.ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout)
        ended = []
        for ref in ready:
            run_id = self._refs.pop(ref)
            try:
                ended.append((run_id, self.ray.get(ref), None))
            except self.ray.exceptions.RayError as e:  # retries exhausted
                ended.append((run_id, None, str(e).strip().splitlines()[-1][:500]))
        return ended

    def retries_left(self, attempts: int) -> bool:
        return False  # Ray has already retried

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in list(getattr(self, "_refs", ())):
                self.ray.cancel(ref, force=True)
        if self._shutdown:
            self.ray.shutdown()


# ----------------------------------------------------------------------------------------------- the sweep
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
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400))
            lines = f.read().decode(errors="replace").strip().splitlines()
        return lines[-1][9:] if lines else ""
    except OSError:
        return ""


def overhead(outcomes: list[dict[str, Any]], sweep_start: float) -> dict[str, Any]:
    """Sweep overhead from the runs' timestamps (see the module docstring)."""
    done = [o for o in outcomes if all(o.get(k) is not None for k in ("started_at", "finished_at", "collected_at"))]
    if not done:
        return {}
    durations = [o["finished_at"] - o["started_at"] for o in done]
    events = sorted([(o["started_at"], 1) for o in done] + [(o["finished_at"], -1) for o in done])
    at_once = peak = 0
    for _, step in events:
        at_once += step
        peak = max(peak, at_once)
    first, last = min(o["started_at"] for o in done), max(o["collected_at"] for o in done)
    return {
        "runs_executed": len(done),
        "startup_s": first - sweep_start,
        "max_concurrent_runs": peak,
        "active_window_s": last - first,
        "run_time_s": sum(durations),
        "per_run_s": ((last - first) * peak - sum(durations)) / len(done),
        "collection_s_mean": sum(o["collected_at"] - o["finished_at"] for o in done) / len(done),
        "definition": "per_run_s = (active window x max concurrent runs - sum of run durations) / runs executed; "
                      "startup_s = sweep start to first run start",
    }


def run_sweep(spec: SweepSpec, backend_name: str = "local", res: Resources | None = None,
              ray_address: str | None = None, view: SweepView | None = None, cache: str | None = None,
              dry_run: bool = False, command: str | None = None) -> dict[str, Any]:
    """Plan, skip what is done, run the rest on the backend, and write ``sweep.json``. Returns the manifest."""
    view = view or SweepView()
    res = res or Resources(None, None, None, None)
    if backend_name not in BACKENDS:
        raise ClbenchError(f"--backend {backend_name!r} is unknown; valid backends: {', '.join(BACKENDS)}")
    if backend_name == "local" and ray_address:
        raise ClbenchError("--ray-address is for --backend ray", "add --backend ray, or drop --ray-address")
    from clbench.harness import check_folder

    check_folder(spec.out, "--out")
    if cache is not None:
        check_folder(Path(cache), "--cache")
    out = spec.out.resolve()
    settings = dict(spec.settings)
    if settings.get("weights") not in (None, *WEIGHT_SOURCES):  # a weights file: absolute, as the data roots
        settings["weights"] = str(Path(settings["weights"]).expanduser().resolve())
    spec = dataclasses.replace(spec, out=out, settings=settings)
    plan = make_plan(spec)
    if dry_run:
        check_folders(plan)
        return {**_manifest(spec, plan, command), "dry_run": True}
    if cache:
        os.environ["CLBENCH_CACHE"] = str(Path(cache).resolve())
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if "CLBENCH_CACHE" not in env:
        from clbench.io import cache_dir

        env["CLBENCH_CACHE"] = str(cache_dir().resolve())
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock_sweep(out)  # before the folders are read: a second sweep on DIR must not change them meanwhile
    try:
        check_folders(plan)
        manifest = _manifest(spec, plan, command)
        manifest["cache"] = env["CLBENCH_CACHE"]
        return _execute_plan(plan, manifest, out, backend_name, res, ray_address, view, env)
    finally:
        lock.close()  # releases the lock


def _manifest(spec: SweepSpec, plan: list[PlannedRun], command: str | None) -> dict[str, Any]:
    from clbench.results import git_revision

    manifest: dict[str, Any] = {
        "format": "clbench-sweep", "version": 1, "command": command,
        "strategies": list(spec.strategies), "benches": list(spec.benches), "seeds": list(spec.seeds),
        "settings": dict(spec.settings), "profile": spec.profile, "overrides": [list(o) for o in spec.overrides],
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_revision": git_revision(),
        "complete": False, "runs": {},
    }
    earlier = _read_json(spec.out / SWEEP_FILE)  # earlier invocations of this sweep: kept, with their overhead
    manifest["history"] = ([*earlier.get("history", []), {k: earlier.get(k) for k in HISTORY_FIELDS}]
                           if earlier else [])
    for r in plan:
        manifest["runs"][r.run_id] = {"path": str(r.path.relative_to(spec.out)), "state_at_start": r.state,
                                      "tasks_done_at_start": r.tasks_done, "fingerprint": r.fingerprint}
    return manifest


def _lock_sweep(out: Path):
    import fcntl

    handle = open(out / ".sweep.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ClbenchError(f"another clbench sweep is running in {out}",
                           "wait for it to finish (it writes sweep.json as runs end) or choose another --out") from None
    return handle


def _execute_plan(plan: list[PlannedRun], manifest: dict[str, Any], out: Path, backend_name: str,
                  res: Resources, ray_address: str | None, view: SweepView, env: dict[str, str]) -> dict[str, Any]:
    from clbench.results import RESULT_FILE

    todo = [r for r in plan if r.state != "complete"]
    sweep_start = time.time()
    backend = (LocalBackend(res) if backend_name == "local" else RayBackend(res, ray_address)) if todo else None
    manifest["backend"] = backend.describe() if backend else {"backend": backend_name, "note": "nothing to run"}
    sweep_id = f"{socket.gethostname()}-{os.getpid()}-{int(sweep_start)}"
    by_id = {r.run_id: r for r in plan}
    attempts: dict[str, int] = {}

    def payload(r: PlannedRun) -> dict[str, Any]:
        return {"run_id": r.run_id, "config": dataclasses.asdict(r.cfg), "fingerprint": r.fingerprint, "env": env,
                "threads": backend.threads, "sweep_id": sweep_id}

    def submit(r: PlannedRun) -> None:
        attempts[r.run_id] = attempts.get(r.run_id, 0) + 1
        r.outcome.setdefault("queued_at", time.time())
        backend.submit(r.run_id, payload(r))

    def save() -> None:
        for r in plan:
            manifest["runs"][r.run_id].update(state=r.state, **r.outcome)
        manifest["overhead"] = overhead([r.outcome for r in plan], sweep_start)
        atomic_write_json(out / SWEEP_FILE, manifest)

    view.start(plan, todo)
    for r in plan:
        if r.state == "complete":
            r.outcome = {"status": "skipped", "note": "complete record with the same settings"}
    save()
    running = set()
    try:
        for r in todo:
            submit(r)
            running.add(r.run_id)
        while running:
            for run_id, outcome, failure in backend.wait(timeout=0.5):
                r = by_id[run_id]
                now = time.time()
                if outcome is not None and outcome["status"] == "done":
                    record = _read_json(r.path / RESULT_FILE)
                    if not (record and record.get("complete")):
                        failure, outcome = "the run reported success but its record is not complete", None
                    else:
                        r.outcome.update(outcome, collected_at=time.time(), attempts=attempts[run_id],
                                         last_acc=record.get("last_acc"), avg_acc=record.get("avg_acc"))
                        r.state = "complete"
                        running.discard(run_id)
                        resumed = record.get("resumed_from_task") or []
                        note = f" (continued after task {resumed[-1]})" if resumed else ""
                        view.ended(r, True, f"final {record['last_acc']:.2f}  avg {record['avg_acc']:.2f}  "
                                            f"{outcome['finished_at'] - outcome['started_at']:.0f} s{note}")
                        save()
                        continue
                if outcome is not None:  # a user error: retrying cannot help
                    failure = outcome["error"]
                elif backend.retries_left(attempts[run_id]):
                    view.log(f"{run_id}: {failure}; attempt {attempts[run_id] + 1} continues from its checkpoint")
                    submit(r)
                    continue
                r.state = "failed"
                r.outcome.update(status="failed", error=failure, attempts=attempts[run_id], collected_at=now)
                running.discard(run_id)
                view.ended(r, False, failure)
                save()
            for run_id in running:
                r = by_id[run_id]
                attempt = _read_json(r.path / ATTEMPT_FILE)
                if attempt and attempt.get("sweep") == sweep_id:
                    record = _read_json(r.path / RESULT_FILE)
                    done_tasks = len(record.get("per_task", [])) if record else 0
                    n_tasks = len(record["task_sizes"]) if record and record.get("task_sizes") else None
                    view.running(r, done_tasks, n_tasks, _last_line(r.path / LOG_FILE))
    except BaseException:
        manifest["interrupted"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        save()
        if backend:
            backend.close(cancel=True)
        raise
    if backend:
        backend.close()
    manifest["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["complete"] = all(r.state == "complete" for r in plan)
    save()
    return manifest


# ----------------------------------------------------------------------------------------------- aggregate
def write_summary(out: Path, manifest: dict[str, Any], report: bool, tsne: bool, command: str | None) -> list[Path]:
    """``summary.md`` / ``summary.csv`` (mean ± std over seeds) and, with ``report``, ``report/``."""
    from clbench.io import atomic_write_bytes
    from clbench.report.build import write_report
    from clbench.report.collect import collect
    from clbench.report.tables import summary_frame, summary_table, to_markdown

    folders = [out / info["path"] for info in manifest["runs"].values() if (out / info["path"]).is_dir()]
    coll = collect(folders) if folders else None  # this plan's runs only, not whatever else lies in DIR/runs
    if coll is None or not coll.runs:
        return []
    failed = {k: v for k, v in manifest["runs"].items() if v.get("state") != "complete"}
    lines = [f"# Sweep summary: {out.name}", "",
             f"Generated by `{command or 'clbench sweep'}` from the records in `runs/` "
             f"({len(coll.runs)} complete runs); mean ± sample standard deviation over seeds, n per row.", ""]
    if failed:
        lines += [f"**Incomplete sweep: {len(failed)} of {len(manifest['runs'])} runs are not complete "
                  f"({', '.join(sorted(failed))}).** Rows average only the seeds that finished; re-run the same "
                  "command to finish them.", ""]
    lines += [to_markdown(summary_table(coll)), ""]
    written = [out / "summary.md", out / "summary.csv"]
    atomic_write_bytes(written[0], "\n".join(lines).encode())
    atomic_write_bytes(written[1], summary_frame(coll).to_csv(index=False).encode())
    if report:
        write_report(coll, out / "report", title=f"clbench sweep: {out.name}", command=command, with_tsne=tsne)
        written.append(out / "report" / "index.html")
    return written


def invocation() -> str:
    argv = sys.argv
    return " ".join(["clbench", *argv[1:]]) if argv and argv[0].endswith("clbench") else " ".join(argv)
