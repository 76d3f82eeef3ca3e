"""Experiment trackers: a run's progress and record in TensorBoard, MLflow or Weights & Biases.

``clbench run --log tensorboard,mlflow,wandb`` (and ``clbench sweep``, and ``clbench export`` for records that
exist) sends every tracker asked for the same things:

- at the start, the resolved settings as parameters (``config.*``, ``strategy.*``, ``fingerprint.*``) and tags
  (strategy, benchmark, backbone, weights digest, precision, git revision);
- after each task t (step t, from 1): ``acc/A_t``, ``acc/old``, ``acc/new``, ``acc/top5``, ``acc/forgetting`` (so far),
  ``R/task_<j>`` (the row R[t] of the accuracy matrix, j from 1), ``routing/<protocol>/acc`` (or ``routing/acc``) where
  the strategy reports routing accuracy, ``time/train_s``, ``time/eval_s`` and ``memory/peak_rss_mb``;
- at the end, the summary metrics (``final/*``), the record (``result.json``) and the figures (accuracy curve and
  matrix) as artifacts.

Offline by default, and never in the working folder: TensorBoard event files under ``RUN_DIR/tensorboard`` (or
``LOG_DIR/tensorboard/RUN_ID``), an MLflow SQLite store ``RUN_DIR/mlruns.db`` with its artifacts in ``RUN_DIR/mlruns/``
(a sweep's runs share ``SWEEP_OUT/mlruns.db``; with ``--log-dir``, ``LOG_DIR/mlruns.db`` and ``LOG_DIR/mlruns/``;
``MLFLOW_TRACKING_URI`` wins where set), W&B in offline mode under the run folder (or ``LOG_DIR``) unless
``WANDB_MODE`` says otherwise. ``clbench run`` ends by printing where each tracker wrote (:meth:`TrackerHub.locations`).

MLflow's store is SQLite because that is the store MLflow 3 recommends and opens without being asked: its file store
is in maintenance mode, and ``mlflow ui`` or ``MlflowClient`` refuse it unless ``MLFLOW_ALLOW_FILE_STORE=true`` is
set in the reader's environment too. The file store stays an option: ``MLFLOW_TRACKING_URI=file:./mlruns`` (clbench
then sets that variable for its own writes, and a reader must set it as well). Creating the database (MLflow's
migrations, about 2 s) happens once, under a lock beside it, so the workers of a sweep never race to create it.

A tracker never fails a run and never holds it up for longer than :data:`FINISH_TIMEOUT_S`: each runs on its own
daemon thread, the run hands it work without waiting, and at the end waits for it at most that long. A tracker that
raises (not installed in a worker, a server that does not answer, a full disk) is dropped with one warning and an
entry in the record's ``tracker_events``. ``clbench export`` sends all its records through one
:class:`TrackerHub`: each tracker is made once (one MLflow client), and one that failed or missed the deadline is
dropped for the rest of the export (an unreachable server costs the deadline once, not once per record).

The folders trackers write in (``tensorboard/``, ``mlruns/``, ``wandb/`` in ``LOG_DIR`` or the run folder, and
``LOG_DIR/tensorboard/RUN_ID``) are real folders inside their parent, never links, and ``RUN_ID`` (from a record, in
an export) is one plain folder name (:func:`tracker_folder`).

The adapters import their library only when used; this module imports neither torch nor any tracker.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import difflib
import importlib.util
import json
import math
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clbench.errors import ClbenchError
from clbench.evaluation import metrics
from clbench.files.escape import plain
from clbench.files.safety import folder_name_problem, open_lock, owned_folder
from clbench.records.routing_diagnostics import routing_or_none
from clbench.records.schema import ProtocolSummary
from clbench.run.rundir import check_folder

if TYPE_CHECKING:
    from clbench.records.schema import RunRecord, TaskEntry
    from clbench.run.harness import RunStart

EXTRA = "trackers"  # pip install 'clbench[trackers]'
# tracker name -> (module that must be importable, pip package)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
}
FINISH_TIMEOUT_S = 60.0  # the most a run waits at its end for its trackers (W&B's start alone takes ~5 s)
DEFAULT_PROJECT = "clbench"  # MLflow experiment and W&B project when no sweep groups the run


# ----------------------------------------------------------------------------------------------- choosing
def installed(name: str) -> str | None:
    """The installed version of tracker ``name``'s library, or None when it cannot be imported."""
    module, package = TRACKERS[name]
    if module in sys.modules:
        if sys.modules[module] is None:  # import blocked
            return None
    elif importlib.util.find_spec(module) is None:
        return None
    from importlib import metadata

    for dist in (package, module):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown version"


def parse_trackers(text: str | list[str] | tuple[str, ...], check_installed: bool = True) -> tuple[str, ...]:
    """``tensorboard,mlflow`` -> ("tensorboard", "mlflow"): known names, each installed (``check_installed``)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(dict.fromkeys(str(x).strip().lower() for x in items if str(x).strip()))
    if not names:
        raise ClbenchError("--log is empty", f"give one or more of {', '.join(TRACKERS)}, e.g. --log tensorboard")
    for name in names:
        if name not in TRACKERS:
            close = difflib.get_close_matches(name, list(TRACKERS), n=1)
            raise ClbenchError(
                f"--log {name}: unknown tracker; valid trackers: {', '.join(TRACKERS)}",
                f"did you mean {close[0]!r}?" if close else None,
            )
        if check_installed and installed(name) is None:
            raise ClbenchError(
                f"--log {name}: {TRACKERS[name][1]} is not installed",
                f"pip install 'clbench[{EXTRA}]' (or pip install {TRACKERS[name][1]})",
            )
    return names


@dataclass(frozen=True)
class LogSpec:
    """Which trackers a run logs to, and where."""

    trackers: tuple[str, ...]
    log_dir: str | None = None  # None: the run folder (TensorBoard, W&B; MLflow too unless a sweep's --out is given)
    group: str | None = None  # the sweep a run belongs to (MLflow experiment, W&B group)
    mlflow_uri: str | None = None  # resolved where the run was asked for (a sweep's workers run elsewhere)
    mlflow_artifacts: str | None = None  # clbench's own store: the artifact folder beside it (None: MLflow's choice)

    @classmethod
    def from_flags(cls, log: str, log_dir: str | None, group: str | None = None, out: str | None = None) -> LogSpec:
        """Checked and resolved on the machine where the command was given: names, installation, folders. MLflow's
        store goes into ``log_dir``, else ``out`` (a sweep's folder: its runs share one store), else each run's
        folder (decided when the run starts)."""
        trackers = parse_trackers(log)
        if log_dir is not None:
            check_folder(Path(log_dir), "log_dir")
            log_dir = str(Path(log_dir).expanduser().resolve())
        uri = artifacts = None
        if "mlflow" in trackers:
            uri = os.environ.get("MLFLOW_TRACKING_URI")
            if not uri and (log_dir or out):  # clbench's own store: mlruns.db (artifacts in mlruns/) in LOG_DIR or OUT
                uri, artifacts = mlflow_store(Path(log_dir or out or ".").resolve())
        if log_dir is not None:
            for name in trackers:
                if name in TRACKER_FOLDERS:
                    tracker_folder(Path(log_dir), TRACKER_FOLDERS[name], create=False)
        return cls(trackers, log_dir, group, uri, artifacts)


MLFLOW_DATABASE = "mlruns.db"  # MLflow's SQLite store clbench writes in LOG_DIR, a sweep's folder or the run folder


def mlflow_store(parent: Path) -> tuple[str, str]:
    """clbench's own MLflow store in ``parent``: (the SQLite URI of ``parent/mlruns.db``, the URI of the artifact
    folder ``parent/mlruns``), each checked to be a file or folder clbench may write (not a link)."""
    tracker_folder(parent, "mlruns", create=False)  # a real folder, not a link
    database = parent / MLFLOW_DATABASE
    if database.is_symlink() or (database.exists() and not database.is_file()):
        raise ClbenchError(
            f"{database} is not a file clbench can use as MLflow's database (a link or a folder)",
            "delete or move it, or give another --log-dir",
        )
    return f"sqlite:///{database}", (parent / "mlruns").as_uri()


TRACKER_FOLDERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # the folder each writes in LOG_DIR or RUN_DIR


def tracker_folder(parent: Path, name: str, create: bool = True, what: str = "--log-dir") -> Path:
    """``parent/name``, a folder a tracker writes into (``tensorboard``, ``mlruns``, ``wandb``, a run's folder
    under ``tensorboard``): one plain name, and a real folder inside ``parent``, never a link leading out of it
    (:func:`clbench.files.safety.owned_folder`). ``what``: the setting that gave ``parent``. Raises ClbenchError."""
    why = folder_name_problem(name)
    if why is not None:
        raise ClbenchError(
            f"{plain(repr(name))[:80]} cannot name a tracker's folder inside {parent} ({why})",
            "give the run a plain name (its record's run_id, or its folder's name)",
        )
    return owned_folder(parent, name, what, create=create)


# ----------------------------------------------------------------------------------------------- what is sent
@dataclass(frozen=True)
class RunInfo:
    """What a tracker gets at the start of a run."""

    run_id: str
    run_dir: Path
    group: str | None
    params: dict[str, Any]  # flat: "config.seed", "strategy.epochs", "fingerprint.bench", ...
    tags: dict[str, str]


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(f"{prefix}.{key}", value))
        elif isinstance(value, (list, tuple)):
            out[f"{prefix}.{key}"] = json.dumps(value)
        else:
            out[f"{prefix}.{key}"] = value
    return out


def _tags(strategy: str, bench: str, backbone: str, digest: str | None, precision: str, rev: str | None) -> dict:
    tags = {"strategy": strategy, "bench": bench, "backbone": backbone, "weights_digest": digest or "unknown"}
    return {**tags, "precision": precision, "git_revision": rev or "unknown"}


def info_from_start(start: RunStart, group: str | None) -> RunInfo:
    cfg = {k: v for k, v in dataclasses.asdict(start.config).items() if k != "overrides"}
    params = {**_flat("config", cfg), **_flat("strategy", start.strategy_config)}
    params.update(_flat("fingerprint", start.fingerprint.to_json()))
    tags = _tags(
        start.config.strategy, start.config.bench, start.backbone, start.weights_digest, start.precision, start.revision
    )
    return RunInfo(start.run_dir.name, start.run_dir, group, params, tags)


def info_from_record(record: RunRecord, run_dir: Path, group: str | None) -> RunInfo:
    params = {
        **_flat("strategy", record.settings),
        **_flat("fingerprint", record.fingerprint.to_json() if record.fingerprint else {}),
    }
    tags = _tags(
        record.strategy, record.bench, record.backbone, record.weights_digest, record.precision, record.git_revision
    )
    return RunInfo(record.run_id, run_dir, group, params, tags)


def _finite(values: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def task_metrics(summary: ProtocolSummary, entry: TaskEntry, peak_rss_mb: float | None) -> dict[str, float]:
    """The metrics of the last task in ``summary`` (the main protocol's metrics so far). NaN and unknown values
    (old accuracy after the first task) are left out."""
    t = len(summary.acc_curve) - 1
    values: dict[str, Any] = {
        "acc/A_t": summary.acc_curve[t],
        "acc/old": summary.old_acc[t] if t < len(summary.old_acc) else None,
        "acc/new": summary.new_acc[t] if t < len(summary.new_acc) else None,
        "acc/top5": summary.top5_curve[t] if t < len(summary.top5_curve) else None,
        "acc/forgetting": summary.forgetting if t > 0 else None,
        "time/train_s": entry.train_s,
        "time/eval_s": entry.eval_s,
        "memory/peak_rss_mb": peak_rss_mb,
    }
    routing = routing_or_none(entry.diagnostics)
    if routing is not None:
        for protocol, choices in routing.protocols.items():  # routing per evaluation protocol
            values[f"routing/{protocol}/acc"] = choices.routing_acc
        for router, choices in (routing.routers or {}).items():  # TOSCA's routing study, router by router
            values[f"routing/router/{router}/acc"] = choices.routing_acc
    values.update({f"R/task_{j + 1}": r for j, r in enumerate(summary.accuracy_matrix[t])})
    return _finite(values)


def summary_so_far(summary: ProtocolSummary, t: int) -> ProtocolSummary:
    """``summary`` as it stood after task ``t`` (0-based): what the run logged then, for records replayed."""
    m, c = summary.accuracy_matrix[: t + 1], summary.acc_curve[: t + 1]
    return ProtocolSummary(
        accuracy_matrix=m,
        acc_curve=c,
        last_acc=metrics.last_acc(c),
        avg_acc=metrics.avg_acc(c),
        forgetting=metrics.forgetting(m),
        forgetting_first_last=metrics.forgetting_first_last(m),
        old_acc=summary.old_acc[: t + 1],
        new_acc=summary.new_acc[: t + 1],
        top5_curve=summary.top5_curve[: t + 1],
    )


def final_metrics(record: RunRecord) -> dict[str, float]:
    """The summary metrics of a complete record, per protocol (``final/<protocol>/...``) and for the main one."""
    out: dict[str, Any] = {}
    for name in record.protocol_names:
        s = record.summary(name)
        prefix = "final/" if name == record.protocol else f"final/{name}/"
        out.update(
            {
                f"{prefix}last_acc": s.last_acc,
                f"{prefix}avg_acc": s.avg_acc,
                f"{prefix}forgetting": s.forgetting,
                f"{prefix}forgetting_first_last": s.forgetting_first_last,
            }
        )
    out.update(
        {
            "final/params_added_total": record.params.added_total,
            "final/params_trainable": record.params.trainable,
            "final/peak_rss_mb": record.peak_rss_mb,
            **{f"final/time_{k}_s": v for k, v in record.time_s.to_dict().items()},
        }
    )
    return _finite(out)


# (record, run folder, out) -> the figure files written under out (clbench.report.run_figures.run_figures)
Figures = Callable[["RunRecord", Path, Path], list[Path]]


def write_artifacts(record: RunRecord, run_dir: Path, out: Path, figures: Figures | None = None) -> list[Path]:
    """The record and, where ``figures`` is given, its figures (accuracy curve, accuracy matrix), written under
    ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "result.json"]
    files[0].write_text(json.dumps(record.to_dict(), indent=1))
    if figures is None:
        return files
    try:
        files += figures(record, run_dir, out)
    except Exception as e:  # figures are a courtesy; the metrics and the record are what matter
        print(f"clbench: warning: tracker figures not made ({type(e).__name__}: {e})", file=sys.stderr)
    return files


# ----------------------------------------------------------------------------------------------- adapters
class Tracker(Protocol):
    """One experiment tracker: the whole interface an adapter implements."""

    def start(self, run: RunInfo) -> None: ...

    def log_task(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, metrics: dict[str, float], artifacts: list[Path]) -> None: ...

    def abort(self) -> None:
        """The run stopped with an error: close the tracker's run as failed."""

    def location(self) -> str:
        """Where the tracker wrote the run, and how to open it (after :meth:`start`)."""
        ...


class TensorBoardTracker:
    """Event files read by ``tensorboard --logdir``: scalars per task, settings as text, figures as images."""

    def __init__(self, spec: LogSpec) -> None:
        self.spec = spec

    def start(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self.spec.log_dir:  # LOG_DIR/tensorboard/RUN_ID: the run id (from a record) is one plain folder name
            where = tracker_folder(tracker_folder(Path(self.spec.log_dir), "tensorboard"), run.run_id)
        else:
            where = tracker_folder(run.run_dir, "tensorboard", what="--out")
        self.where = Path(where).resolve()
        self.writer = SummaryWriter(log_dir=str(where))
        lines = [f"| {k} | {v} |" for k, v in {**run.tags, **run.params}.items()]
        self.writer.add_text("settings", "| setting | value |\n|---|---|\n" + "\n".join(lines), 0)

    def log_task(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, metrics: dict[str, float], artifacts: list[Path]) -> None:
        import numpy as np
        from PIL import Image

        for key, value in metrics.items():
            self.writer.add_scalar(key, value, 0)
        for path in artifacts:
            if path.suffix == ".png":
                image = np.asarray(Image.open(path).convert("RGB"))  # (H, W, 3)
                self.writer.add_image(f"figures/{path.stem}", image, 0, dataformats="HWC")
            elif path.suffix == ".json":
                self.writer.add_text("record", "```\n" + path.read_text()[:100_000] + "\n```", 0)
        self.writer.close()

    def abort(self) -> None:
        self.writer.close()

    def location(self) -> str:
        logdir = self.where.parent if self.spec.log_dir else self.where  # LOG_DIR/tensorboard holds every run
        return f"{self.where} (view: tensorboard --logdir {logdir})"


class MlflowTracker:
    """One MLflow run per clbench run, in the experiment of its sweep (else ``clbench``)."""

    PARAM_CHARS = 6000  # MLflow's limit on a parameter value

    def __init__(self, spec: LogSpec) -> None:
        self.spec = spec
        self.client: Any = None
        self._experiments: dict[str, str] = {}  # experiment name -> id

    def start(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        if self.spec.mlflow_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):  # the store in the run folder
            uri, artifacts = mlflow_store(run.run_dir.resolve())
            self.spec = dataclasses.replace(self.spec, mlflow_uri=uri, mlflow_artifacts=artifacts)
        uri = self.spec.mlflow_uri or ""
        if uri.startswith("file:") or (uri and "://" not in uri):
            # the file store, which the user chose with MLFLOW_TRACKING_URI: MLflow 3 keeps it in maintenance mode
            # and refuses it unless asked
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        name = run.group or DEFAULT_PROJECT
        exp_id = self._experiments.get(name)
        if exp_id is None:
            with self._creating():  # the database's tables and the experiment: once, whichever process comes first
                if self.client is None:  # one client (one connection) for every run this adapter logs (an export)
                    self.client = MlflowClient(tracking_uri=self.spec.mlflow_uri)
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    where = f"{self.spec.mlflow_artifacts}/{name}" if self.spec.mlflow_artifacts else None
                    try:
                        exp_id = self.client.create_experiment(name, artifact_location=where)
                    except Exception:  # created meanwhile by a run of the sweep on a store no lock covers
                        exp_id = self.client.get_experiment_by_name(name).experiment_id
                else:
                    exp_id = exp.experiment_id
            self._experiments[name] = exp_id
        tags = {**run.tags, "clbench.run_dir": str(run.run_dir), **({"clbench.sweep": run.group} if run.group else {})}
        self.run_id = self.client.create_run(exp_id, run_name=run.run_id, tags=tags).info.run_id
        params = [Param(k, str(v)[: self.PARAM_CHARS]) for k, v in run.params.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    @contextlib.contextmanager
    def _creating(self):
        """Held while the client is made and the experiment found or created: an flock beside clbench's own SQLite
        store (MLflow creates its tables on the first connection, and two processes doing so at once collide).
        MLflow's messages about the migrations it runs are kept off the run's console."""
        import logging

        for noisy in ("mlflow.store.db.utils", "alembic.runtime.migration"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        if not self.spec.mlflow_artifacts or not (self.spec.mlflow_uri or "").startswith("sqlite:///"):
            yield
            return
        import fcntl

        database = Path(self.spec.mlflow_uri.removeprefix("sqlite:///"))
        database.parent.mkdir(parents=True, exist_ok=True)  # --log-dir, made on first use as the other trackers do
        with open_lock(database.with_name(database.name + ".lock")) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def log_task(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, metrics: dict[str, float], artifacts: list[Path]) -> None:
        self.log_task(0, metrics)
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path), "figures" if path.suffix == ".png" else None)
        self.client.set_terminated(self.run_id, "FINISHED")

    def abort(self) -> None:
        self.client.set_terminated(self.run_id, "FAILED")

    def location(self) -> str:
        uri = self.spec.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or "MLflow's default store"
        return f"{uri}, run {self.run_id} (view: mlflow ui --backend-store-uri {uri})"


class WandbTracker:
    """One W&B run per clbench run, grouped by sweep; offline unless ``WANDB_MODE`` says otherwise."""

    def __init__(self, spec: LogSpec) -> None:
        self.spec = spec

    def start(self, run: RunInfo) -> None:
        import wandb

        where = Path(self.spec.log_dir) if self.spec.log_dir else run.run_dir
        where.mkdir(parents=True, exist_ok=True)
        tracker_folder(where, "wandb", what="--log-dir" if self.spec.log_dir else "--out")  # W&B writes in there
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            group=run.group,
            name=run.run_id,
            dir=str(where),
            mode=os.environ.get("WANDB_MODE", "offline"),
            config=run.params,
            tags=[run.tags["strategy"], run.tags["bench"]],
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.run.summary.update({f"tag/{k}": v for k, v in run.tags.items()})
        self.where = (where / "wandb").resolve()

    def log_task(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "task": step}, step=step)

    def finish(self, metrics: dict[str, float], artifacts: list[Path]) -> None:
        import wandb

        self.run.summary.update(metrics)
        for path in artifacts:
            if path.suffix == ".png":
                self.run.summary[f"figures/{path.stem}"] = wandb.Image(str(path))
        art = wandb.Artifact(f"record-{self.run.id}", type="clbench-record")
        for path in artifacts:
            art.add_file(str(path))
        self.run.log_artifact(art)
        self.run.finish()

    def abort(self) -> None:
        self.run.finish(exit_code=1)

    def location(self) -> str:
        url = getattr(self.run, "url", None)
        if url:
            return str(url)
        return f"{self.where} (offline; upload with: wandb sync {self.where}/offline-run-*)"


ADAPTERS: dict[str, Callable[[LogSpec], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}


# ----------------------------------------------------------------------------------------------- safety
class _Lane:
    """One daemon thread that runs a tracker's calls in order, so the run never waits for them (a hung tracker
    cannot keep the process alive either)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, name=f"clbench-tracker-{name}", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn, future = self._queue.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:
                    future.set_exception(e)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        return future


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


class TrackerHub:
    """The harness's observer for ``--log``: forwards the run's hooks to every tracker on its own lane, drops a
    tracker that fails (one warning, one event in the record) and waits at most :data:`FINISH_TIMEOUT_S` at the end.
    A dropped tracker stays dropped for the hub's life: ``clbench export`` replays every record through one hub, so
    a tracker that cannot be reached costs one deadline per export, not one per record.

    Wraps the reporter that shows progress (``inner``): messages and progress bars go there unchanged. ``figures``
    draws the figures sent with the record (the report's :func:`clbench.report.run_figures.run_figures`; None: the
    record only), so that the trackers import nothing of the report."""

    def __init__(
        self, spec: LogSpec, inner: Any = None, timeout: float | None = None, figures: Figures | None = None
    ) -> None:
        # deferred: loads torch, which importing this module does not
        from clbench.run.harness import Reporter

        self.spec, self.inner, self.figures = spec, inner or Reporter(), figures
        self.timeout = FINISH_TIMEOUT_S if timeout is None else timeout  # read when made: a test may lower it
        self.events: list[str] = []
        self._failed: dict[str, str] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._lanes = {name: _Lane(name) for name in spec.trackers}
        self._trackers: dict[str, Tracker] = {}
        self._last: dict[str, concurrent.futures.Future] = {}

    @property
    def dropped(self) -> list[str]:
        """The trackers that failed or missed a deadline, dropped for the rest of the hub's life."""
        with self._lock:
            return list(self._failed)

    # the Reporter interface, forwarded
    def log(self, message: str) -> None:
        self.inner.log(message)

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        return self.inner.progress(description, total)

    def done(self, description: str) -> None:
        self.inner.done(description)

    # ------------------------------------------------------------------------------------------- hooks
    def run_started(self, start: RunStart) -> None:
        self.inner.run_started(start)
        self._start(info_from_start(start, self.spec.group))

    def task_done(self, t: int, summary: ProtocolSummary, entry: TaskEntry, peak_rss_mb: float | None) -> None:
        metrics = task_metrics(summary, entry, peak_rss_mb)
        self._each("log_task", lambda tr: tr.log_task(t + 1, metrics))
        self._warn()

    def run_finished(self, record: RunRecord, run_dir: Path) -> None:
        """Send the summary and artifacts, wait for the trackers (at most the timeout) and add their events to the
        record, which the harness writes next."""
        metrics = final_metrics(record)
        with tempfile.TemporaryDirectory(prefix="clbench-trackers-") as tmp:
            artifacts = write_artifacts(record, run_dir, Path(tmp), self.figures)
            self._each("finish", lambda tr: tr.finish(metrics, artifacts))
            self._wait()
        record.tracker_events = [*record.tracker_events, *self.events]
        self.inner.run_finished(record, run_dir)

    def locations(self) -> dict[str, str]:
        """Tracker name -> where it wrote the last run and how to open it, for the trackers that started and
        were not dropped."""
        out = {}
        for name in self.spec.trackers:
            tracker = self._trackers.get(name)
            if tracker is None or name in self.dropped:
                continue
            try:
                out[name] = tracker.location()
            except Exception as e:  # a tracker's own attribute that is missing: said, never raised
                out[name] = f"unknown ({_why(e)})"
        return out

    def abort(self, timeout: float = 10.0) -> None:
        """The run stopped with an error: close every tracker's run as failed, waiting at most ``timeout``."""
        self._each("abort", lambda tr: tr.abort(), started_only=True)
        self._wait(timeout)

    def replay(self, record: RunRecord, run_dir: Path) -> list[str]:
        """Send an existing complete record as its run would have (``clbench export``); return this record's events.
        One hub replays every record of an export: each tracker is made (and connects) once, and one that failed
        or missed its deadline on an earlier record is not tried again."""
        before = len(self.events)
        if all(name in self.dropped for name in self.spec.trackers):  # nothing left to send to: no figures made
            return []
        self._start(info_from_record(record, run_dir, self.spec.group))
        main = record.main
        for t, entry in enumerate(record.per_task):
            self.task_done(t, summary_so_far(main, t), entry, None)
        with tempfile.TemporaryDirectory(prefix="clbench-trackers-") as tmp:
            artifacts = write_artifacts(record, run_dir, Path(tmp), self.figures)
            self._each("finish", lambda tr: tr.finish(final_metrics(record), artifacts))
            self._wait()
        return self.events[before:]

    # ------------------------------------------------------------------------------------------- machinery
    def _start(self, info: RunInfo) -> None:
        for name in self.spec.trackers:

            def start(name: str = name) -> None:
                tracker = self._trackers.get(name) or ADAPTERS[name](self.spec)  # made once per hub
                self._trackers[name] = tracker
                tracker.start(info)

            self._submit(name, "start", start)

    def _each(self, what: str, call: Callable[[Tracker], None], started_only: bool = False) -> None:
        for name in self.spec.trackers:
            if started_only and name not in self._last:
                continue
            self._submit(name, what, lambda name=name: call(self._trackers[name]))

    def _submit(self, name: str, what: str, fn: Callable[[], None]) -> None:
        if name in self._failed:
            return

        def guarded() -> None:
            if name in self._failed:  # an earlier call failed: skip the rest
                return
            try:
                fn()
            except BaseException as e:
                self._fail(name, f"failed at {what} ({_why(e)})")

        self._last[name] = self._lanes[name].submit(guarded)

    def _fail(self, name: str, why: str) -> None:
        with self._lock:
            if name not in self._failed:
                self._failed[name] = why
                self.events.append(f"{name}: {why}; the run went on without it")

    def _warn(self) -> None:
        with self._lock:
            new = [(n, w) for n, w in self._failed.items() if n not in self._warned]
            self._warned.update(n for n, _ in new)
        for name, why in new:
            self.inner.log(f"warning: tracker {name} {why}; the run goes on without it")

    def _wait(self, timeout: float | None = None) -> None:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        for name, future in self._last.items():
            if name in self._failed:  # dropped: its last call may hang for ever, and is waited for never again
                continue
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                self._fail(name, f"did not finish within {timeout:g} s (its data may be incomplete)")
        self._warn()
