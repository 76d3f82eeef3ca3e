"""Where the runs execute: :class:`LocalBackend` (a process pool on this machine) and :class:`RayBackend` (a Ray
cluster). A backend submits :func:`clbench.sweep.worker.execute` with a run's
:class:`~clbench.sweep.worker.WorkerPayload` (its JSON form) and reports each run that ended as ``(run_id,
outcome, failure)``: the :class:`~clbench.sweep.manifest.RunOutcome` the worker returned, or why there is none; the
scheduling and placement are the backend's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files import typedfile
from clbench.sweep.manifest import RunOutcome
from clbench.sweep.settings import BACKENDS, Resources  # declared with their flags there
from clbench.sweep.worker import WorkerPayload, execute, read_outcome

__all__ = ["BACKENDS", "LocalBackend", "RayBackend", "Resources"]

Ended = tuple[str, RunOutcome | None, str | None]  # (run id, the worker's outcome, or why there is none)


def _ended(run_id: str, result: Any) -> Ended:
    """A run whose worker returned ``result`` (:func:`execute`'s JSON outcome), checked as it arrives."""
    try:
        return run_id, read_outcome(result), None
    except ClbenchError as e:
        return run_id, None, e.render(as_flags=True)


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

            self._pool = ProcessPoolExecutor(
                self.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_die_with_parent
            )
        return self._pool

    def submit(self, run_id: str, payload: WorkerPayload) -> None:
        pool = self._ensure_pool()
        self._futures[pool.submit(execute, typedfile.write(payload))] = (run_id, pool)

    def wait(self, timeout: float) -> list[Ended]:
        """(run_id, outcome, failure) for every run that ended."""
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as futures_wait
        from concurrent.futures.process import BrokenProcessPool

        if not self._futures:
            return []
        finished, _ = futures_wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        ended: list[Ended] = []
        for fut in finished:
            run_id, pool = self._futures.pop(fut)
            try:
                result = fut.result()
            except BrokenProcessPool:
                ended.append((run_id, None, "a worker process of the pool died (killed, or out of memory)"))
                if pool is self._pool:  # every future of a broken pool fails; a new pool serves the retries
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = None
            except Exception as e:  # the run's own crash, whatever its type: reported, and retried
                ended.append((run_id, None, f"{type(e).__name__}: {e}"))
            else:
                ended.append(_ended(run_id, result))
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
            # Ray (2.60) has no public call for this: the environment variable is its only public switch, read once
            # into a cached config. Its own CLI refreshes that cache with this function; where it is gone, ray.init
            # fails and the error below names the token settings.
            try:
                from ray._private.authentication.authentication_token_setup import _enable_token_auth

                _enable_token_auth()
            except (ImportError, AttributeError):
                pass


RAY_HINT = (
    "start one with `ray start --head` and pass the address it prints (e.g. 127.0.0.1:6379), or leave "
    "--ray-address out to start a local Ray"
)


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
        raise ClbenchError(
            f"--ray-address {address}: no Ray cluster answers there ({why}, --ray-timeout {timeout:g} s)", RAY_HINT
        ) from None


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
            raise ClbenchError(
                "--backend ray needs Ray, which is not installed", "pip install 'clbench[ray]' (or use --backend local)"
            ) from None
        self.ray = ray
        self.address = address
        self.cpus = 1 if res.cpus_per_run is None else res.cpus_per_run
        started_here = not ray.is_initialized()
        if started_here:
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level="warning")
                else:  # "local": a new Ray for this sweep, never a cluster that happens to run on this machine
                    ray.init(
                        address="local",
                        num_cpus=(res.jobs * self.cpus) if res.jobs else None,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level="warning",
                    )
            except (ConnectionError, ValueError, RuntimeError) as e:
                if not address:
                    raise ClbenchError(
                        f"--backend ray: could not start a local Ray ({e})",
                        "check `ray start --head` works here, or use --backend local",
                    ) from None
                raise ClbenchError(
                    f"--ray-address {address}: could not connect to a Ray cluster ({e})",
                    "start one with `ray start --head` and pass the address it prints "
                    "(e.g. 127.0.0.1:6379), or leave --ray-address out to start a local Ray; a "
                    "cluster with token authentication needs its token here (~/.ray/auth_token, "
                    "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)",
                ) from None
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
            num_cpus=self.cpus, num_gpus=self.gpus, memory=self.memory, max_retries=res.retries, retry_exceptions=True
        )
        self._refs: dict[Any, str] = {}

    def _check_fits(self) -> None:
        """A task no node can hold would wait forever: refuse it now."""
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        need = {"CPU": self.cpus, "GPU": self.gpus, "memory": self.memory or 0}
        if not any(all(node.get(k, 0) >= v for k, v in need.items() if v) for node in nodes):
            have = (
                "; ".join(
                    f"CPU {n.get('CPU', 0):g}, GPU {n.get('GPU', 0):g}, memory {n.get('memory', 0) / 2**30:.1f} GB"
                    for n in nodes
                )
                or "no live nodes"
            )
            raise ClbenchError(
                f"no Ray node can hold one run (CPU {self.cpus:g}, GPU {self.gpus:g}, memory "
                f"{(self.memory or 0) / 2**30:.1f} GB); nodes: {have}",
                "lower --cpus-per-run / --gpus-per-run / --memory-per-run, or add nodes",
            )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "ray",
            "address": self.address or "local (started for the sweep)",
            "ray_version": self.ray.__version__,
            "cluster": self.ray.cluster_resources(),
            "cpus_per_run": self.cpus,
            "gpus_per_run": self.gpus,
            "memory_per_run_gb": None if self.memory is None else self.memory / 2**30,
            "max_retries": self.retries,
        }

    def submit(self, run_id: str, payload: WorkerPayload) -> None:
        self._refs[self._remote.remote(typedfile.write(payload))] = run_id

    def wait(self, timeout: float) -> list[Ended]:
        if not self._refs:
            return []
        ready, _ = self.ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout)
        ended: list[Ended] = []
        for ref in ready:
            run_id = self._refs.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayError as e:  # retries exhausted
                ended.append((run_id, None, str(e).strip().splitlines()[-1][:500]))
            else:
                ended.append(_ended(run_id, result))
        return ended

    def retries_left(self, attempts: int) -> bool:
        return False  # Ray has already retried

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in list(getattr(self, "_refs", ())):
                self.ray.cancel(ref, force=True)
        if self._shutdown:
            self.ray.shutdown()
