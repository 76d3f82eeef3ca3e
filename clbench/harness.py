"""Runs one (strategy, benchmark, backbone, seed): builds the parts from the registries, computes the
frozen features once, drives the strategy through the Avalanche stream, fills the accuracy matrices,
times every phase and writes the run record. No method name appears here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clbench import metrics, training_check
from clbench.blocks import TrainingTrace
from clbench.catalog import BACKBONES, BENCHMARKS, STRATEGIES
from clbench.config import (  # noqa: F401  (RunConfig, make_strategy_config: imported from here by callers)
    PROTOCOL_CHOICES,
    RESUME_AND_OVERWRITE,
    RUN_LEVEL_PROFILE_KEYS,
    RunConfig,
    check_settings,
    differences,
    fingerprint,
    make_strategy_config,
    run_level,
)
from clbench.errors import ClbenchError, setting
from clbench.precision import Precision
from clbench.precision import check_request as check_precision
from clbench.precision import choose as choose_precision
from clbench.predictions import PREDICTIONS_FILE, Predictions
from clbench.results import (
    Host,
    Params,
    ProtocolGap,
    ProtocolSummary,
    RunRecord,
    TaskEntry,
    Times,
    command_line,
    git_revision,
    library_versions,
    peak_rss_mb,
    reset_peak_rss,
)
from clbench.rundir import (
    RunDir,
    check_folder,
    check_free_space,
    default_run_dir,
    estimate_run_bytes,
)

if TYPE_CHECKING:
    from clbench.backbones import FrozenBackbone
    from clbench.benchmarks.base import Benchmark, BenchmarkSpec
    from clbench.strategy import Split, Strategy, Task
    from clbench.transforms import TransformSpec

# Settings named in this module's messages: their Python names in str(error), their flags on the command line.
OUT, OVERWRITE, RESUME, DEVICE = setting("out"), setting("overwrite"), setting("resume"), setting("device")


@dataclass(frozen=True)
class RunStart:
    """What an observer learns when a run starts (after loading, before the first task)."""

    run_dir: Path
    config: RunConfig
    fingerprint: dict[str, Any]  # the defining settings (clbench.config.DEFINING_FIELDS)
    strategy_config: dict[str, Any]
    backbone: str
    weights_digest: str
    precision: str
    revision: str  # git revision of the clbench source


class Reporter:
    """Progress and messages, and the run's milestones for observers (experiment trackers,
    :class:`clbench.trackers.TrackerHub`). The CLI subclasses this with rich; the default is silent."""

    def log(self, message: str) -> None:
        pass

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def done(self, description: str) -> None:
        pass

    def run_started(self, start: RunStart) -> None:
        pass

    def task_done(self, t: int, summary: ProtocolSummary, entry: TaskEntry, peak_rss_mb: float) -> None:
        """Task ``t`` (0-based) is learnt and evaluated: ``summary``, the main protocol's metrics so far."""

    def run_finished(self, record: RunRecord, run_dir: Path) -> None:
        """The complete record, before it is written: an observer may add its ``tracker_events``."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ClbenchError(f"{DEVICE} cuda: no CUDA device is available", f"use {DEVICE} cpu or auto")
    if name not in ("cpu", "cuda"):
        raise ClbenchError(f"{DEVICE} {name}: expected auto, cpu or cuda")
    return torch.device(name)


# ----------------------------------------------------------------------------------------------- the run
@dataclass
class _ProtocolLog:
    matrix: list[list[float]] = field(default_factory=list)
    curve: list[float] = field(default_factory=list)
    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)
    top5: list[float] = field(default_factory=list)
    # Per image, per task (plain lists, so the checkpoint carries them; clbench.predictions writes the file):
    index: list[list[int]] = field(default_factory=list)  # positions in the benchmark's test split
    pred: list[list[int]] = field(default_factory=list)  # argmax of the logits
    conf: list[list[float]] = field(default_factory=list)  # softmax probability of the argmax, float16 values

    def add(self, logits: torch.Tensor, y: np.ndarray, sample_task: np.ndarray, t: int, index: np.ndarray) -> None:
        pred = logits.argmax(dim=1).numpy()
        conf = torch.softmax(logits.float(), dim=1).amax(dim=1).numpy().astype(np.float16)
        self.index.append(np.asarray(index).tolist())
        self.pred.append(pred.tolist())
        self.conf.append(conf.astype(np.float64).tolist())  # float16 values: a resumed run writes the same file
        self.matrix.append(metrics.task_row(pred, y, sample_task, t + 1))
        self.curve.append(metrics.accuracy(pred, y))
        old = sample_task < t
        self.old.append(metrics.accuracy(pred[old], y[old]) if old.any() else float("nan"))
        self.new.append(metrics.accuracy(pred[~old], y[~old]))
        self.top5.append(metrics.topk_accuracy(logits.numpy(), y, 5))

    def summary(self) -> ProtocolSummary:
        return ProtocolSummary(
            accuracy_matrix=self.matrix,
            acc_curve=self.curve,
            last_acc=metrics.last_acc(self.curve) if self.curve else None,
            avg_acc=metrics.avg_acc(self.curve) if self.curve else None,
            forgetting=metrics.forgetting(self.matrix) if self.matrix else None,
            forgetting_first_last=metrics.forgetting_first_last(self.matrix) if self.matrix else None,
            old_acc=self.old,
            new_acc=self.new,
            top5_curve=self.top5,
            bwt=metrics.bwt(self.matrix) if self.matrix else None,
        )


def _protocols(cfg: RunConfig, strategy_cls: type) -> list[str]:
    if cfg.protocol not in PROTOCOL_CHOICES:
        raise ClbenchError(
            f"{setting('protocol')} {cfg.protocol!r} is unknown; valid protocols: {', '.join(PROTOCOL_CHOICES)}"
        )
    wanted = ["per-sample", "reference"] if cfg.protocol == "both" else [cfg.protocol]
    for p in wanted:
        if p not in strategy_cls.protocols:
            raise ClbenchError(
                f"strategy {strategy_cls.name} has no {p!r} protocol; it supports: {', '.join(strategy_cls.protocols)}"
            )
    return wanted


@dataclass
class TaskAndTest:
    """One task of the stream: what the strategy learns from, and the test images it is evaluated on afterwards."""

    task: Task
    test: Split  # every seen class's test images, class by class
    sample_task: np.ndarray  # (N_test,) the task each test image belongs to


@dataclass
class PreparedRun:
    """A run ready to loop over its tasks: benchmark, frozen backbone, transforms, cached features and the strategy."""

    cfg: RunConfig
    spec: BenchmarkSpec
    bench: Benchmark
    backbone: FrozenBackbone
    eval_tf: TransformSpec
    train_tf: TransformSpec
    precision: Precision
    features: dict[str, torch.Tensor]  # "train" / "test" -> (N, d) frozen features
    cache_events: list[str]
    t_features: float  # seconds spent on frozen features (computing or loading them)
    strategy: Strategy
    protocols: list[str]
    data_problems: list[str] = field(default_factory=list)  # found and run anyway (ignore_data_problems)
    rng_at_build: dict[str, Any] | None = None  # global RNG states just before the strategy was built

    def split(self, which: str, indices: np.ndarray) -> Split:
        from clbench.strategy import Split

        source, y = (self.bench.train, self.bench.train_y) if which == "train" else (self.bench.test, self.bench.test_y)
        idx = np.asarray(indices, dtype=np.int64)
        return Split(source, idx, torch.as_tensor(y[idx]), self.features[which][idx], self._eval, self._train)

    def __post_init__(self) -> None:
        self._eval, self._train = self.eval_tf.build(), self.train_tf.build()

    def tasks(self) -> Iterator[TaskAndTest]:
        """The Avalanche train stream, one :class:`TaskAndTest` per task (the test split covers all seen classes)."""
        from clbench.benchmarks.streams import avalanche_benchmark, experience_classes, experience_indices
        from clbench.strategy import Task

        task_of = self.bench.task_of_label()
        n_seen = 0
        for exp in avalanche_benchmark(self.bench).train_stream:
            classes = experience_classes(exp)
            n_seen += len(classes)
            task = Task(exp.current_experience, classes, n_seen, self.split("train", experience_indices(exp)))
            seen = np.flatnonzero(self.bench.test_y < n_seen)
            seen = seen[np.argsort(self.bench.test_y[seen], kind="stable")]  # class by class, as the reference
            yield TaskAndTest(task, self.split("test", seen), task_of[self.bench.test_y[seen]])


def resolve(cfg: RunConfig) -> tuple[type[Strategy], BenchmarkSpec, str, list[str], Any]:
    """Check every name and setting of ``cfg`` (cheap; nothing is loaded). Raises ClbenchError."""
    check_settings({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})  # also set by RunConfig
    strategy_cls = STRATEGIES.get(cfg.strategy)
    spec = BENCHMARKS.get(cfg.bench)
    backbone_name = BACKBONES.check(spec.backbone if cfg.backbone is None else cfg.backbone)
    protocols = _protocols(cfg, strategy_cls)
    strategy_cfg = make_strategy_config(strategy_cls, cfg.profile, cfg.overrides)
    if strategy_cls.needs_vit and BACKBONES.get(backbone_name).family != "vit":
        vits = [n for n in BACKBONES.names() if BACKBONES.get(n).family == "vit"]
        raise ClbenchError(
            f"{strategy_cls.name} enters the transformer's layers and needs a ViT backbone; {backbone_name} is not one",
            f"choose one of: {', '.join(vits)}",
        )
    device = resolve_device(cfg.device)
    check_precision(cfg.precision)
    if cfg.precision != "auto":  # a forced precision the device cannot run fails here, before anything loads
        choose_precision(cfg.precision, device.type)
    return strategy_cls, spec, backbone_name, protocols, strategy_cfg


def frozen_inputs(
    cfg: RunConfig, spec: BenchmarkSpec, backbone_name: str, strategy_cls: type[Strategy], device: torch.device
) -> tuple[FrozenBackbone, TransformSpec, TransformSpec]:
    """The frozen backbone on ``device`` and the (eval, train) :class:`~clbench.transforms.TransformSpec` of a run:
    input size from ``cfg.img_size``, else the profile's, else the benchmark's; the benchmark's resize/crop scaled
    to it; the benchmark's normalisation unless ``cfg.normalize`` says otherwise. :func:`prepare` and
    :class:`clbench.avalanche_api.ClbenchStrategy` both build their inputs here, so they see the same pixels."""
    from clbench.backbones import load_backbone
    from clbench.transforms import TransformSpec

    img_size = run_level(strategy_cls, cfg.profile, cfg.img_size, "img_size")
    img_size = spec.img_size if img_size is None else img_size
    backbone = load_backbone(backbone_name, cfg.weights, img_size, seed=cfg.seed).to(device)
    normalize = spec.normalize if cfg.normalize is None else cfg.normalize
    mean, std = (backbone.mean, backbone.std) if normalize else (None, None)
    img = backbone.img_size
    resize = round(spec.resize * img / spec.img_size) if spec.resize else None
    return backbone, TransformSpec(img, resize, mean, std), TransformSpec(img, resize, mean, std, train=True)


def feature_key(
    backbone_name: str,
    backbone: FrozenBackbone,
    bench: str,
    split: str,
    data: str,
    eval_tf: TransformSpec,
    precision: str,
    device: torch.device,
) -> str:
    """The feature-cache key of one set of images (``data``: their content fingerprint) under ``eval_tf``."""
    from clbench.features import cache_key

    return cache_key(
        backbone=backbone_name,
        digest=backbone.digest,
        bench=bench,
        split=split,
        data=data,
        transform=eval_tf.identity(),
        precision=precision,
        device=device.type,
    )


def prepare(cfg: RunConfig, reporter: Reporter | None = None, precision: Precision | None = None) -> PreparedRun:
    """Resolve every name, load the benchmark and backbone, compute (or load) the frozen features once, and
    build the strategy. Raises ClbenchError for any bad input before anything long starts. ``precision``: the one
    to use instead of resolving ``cfg.precision`` (a resumed run keeps the precision it started with)."""
    from clbench.benchmarks import build_benchmark
    from clbench.features import FeatureCache, extract
    from clbench.precision import for_backbone as precision_for_backbone
    from clbench.strategy import Context

    rep = reporter or Reporter()
    strategy_cls, spec, backbone_name, protocols, strategy_cfg = resolve(cfg)
    device = resolve_device(cfg.device)

    rep.log(f"benchmark {spec.name}: loading")
    bench = build_benchmark(
        spec,
        cfg.data_root,
        run_level(strategy_cls, cfg.profile, cfg.init_cls, "init_cls"),
        run_level(strategy_cls, cfg.profile, cfg.increment, "increment"),
        cfg.class_order_seed,
    )
    rep.log(f"backbone {backbone_name} (weights: {cfg.weights})")
    backbone, eval_tf, train_tf = frozen_inputs(cfg, spec, backbone_name, strategy_cls, device)

    # Frozen features, once per image: cached across runs and strategies.
    t0 = time.perf_counter()
    cache = FeatureCache(enabled=cfg.feature_cache, warn=lambda m: rep.log(f"warning: {m}"))
    precision = precision or precision_for_backbone(backbone, device, cfg.precision, use_cache=cfg.feature_cache)
    rep.log(f"precision {precision.name}: {precision.reason}")
    feats: dict[str, torch.Tensor] = {}
    for split_name, source in (("train", bench.train), ("test", bench.test)):
        key = feature_key(
            backbone_name, backbone, spec.name, split_name, source.fingerprint(), eval_tf, precision.name, device
        )

        def compute(source=source, split_name=split_name):
            adv = rep.progress(f"features {split_name} ({len(source)} images)", len(source))
            return extract(backbone, source, eval_tf.build(), device, precision.name, cfg.batch_size, progress=adv)

        feats[split_name], hit = cache.get_or_compute(key, compute)
        rep.log(f"features {split_name}: {'cache hit' if hit else 'computed'} {tuple(feats[split_name].shape)}")
    t_features = time.perf_counter() - t0

    ctx = Context(
        backbone=backbone, device=device, precision=precision.name, seed=cfg.seed, log=rep.log, progress=rep.progress
    )
    from clbench.checkpoint import capture_rng

    rng_at_build = capture_rng()  # the under-training detector builds an untrained twin from the same states
    strategy = strategy_cls(strategy_cfg, ctx)
    return PreparedRun(
        cfg,
        spec,
        bench,
        backbone,
        eval_tf,
        train_tf,
        precision,
        feats,
        cache.events,
        t_features,
        strategy,
        protocols,
        rng_at_build=rng_at_build,
    )


def run(cfg: RunConfig, reporter: Reporter | None = None, resume: bool = False) -> RunRecord:
    """Run one configuration end to end, writing a checkpoint and the record after every task; return the complete
    record. An unfinished run in ``cfg.out`` with a checkpoint and the same settings is continued from its last
    finished task (``resume=True``: it must be). See :mod:`clbench.checkpoint`."""
    from clbench import checkpoint
    from clbench.backbones import state_digest
    from clbench.datacheck import check_before_run, check_loaded
    from clbench.safestate import StateError
    from clbench.weights.resolve import check_weights_file

    rep = reporter or Reporter()
    t_start = time.perf_counter()
    _, _, backbone_name, _, _ = resolve(cfg)  # every bad name or setting fails here, before a run folder is made
    if resume and cfg.overwrite:
        raise ClbenchError(RESUME_AND_OVERWRITE)
    out = Path(cfg.out) if cfg.out is not None else default_run_dir(cfg)
    check_folder(out, "out")
    check_weights_file(cfg.weights)
    data_problems = check_before_run(cfg.bench, cfg.data_root, cfg.ignore_data_problems)  # as `clbench data check`
    run_dir = RunDir(out, cfg.overwrite)
    caller_rng = checkpoint.capture_rng()
    reset_peak_rss()  # the record's peak memory is this run's, also in a process that ran others before
    try:
        settings_fp, revision = fingerprint(cfg, backbone_name), git_revision()
        ckpt = run_dir.resumable(settings_fp, required=resume)
        if ckpt is None:
            run_dir.start_afresh()
        torch.manual_seed(cfg.seed)  # the run owns the seed; strategies draw from ctx.generator()
        started_at = None  # --precision auto: a resumed run keeps the precision auto chose when it started
        if ckpt is not None and cfg.precision == "auto" and ckpt.precision is not None:
            started_at = Precision(ckpt.precision, ckpt.precision_reason or "auto, when the run started")
        session = prepare(cfg, rep, precision=started_at)
        session.data_problems = data_problems + check_loaded(session.bench, cfg.ignore_data_problems)
        for problem in session.data_problems:
            rep.log(f"warning: data problem, run anyway (ignore_data_problems): {problem}")
        check_free_space(run_dir.path, estimate_run_bytes(session), "out", "the record, checkpoint and features")
        strategy, bench, protocols = session.strategy, session.bench, session.protocols
        logs = {p: _ProtocolLog() for p in protocols}
        per_task: list[TaskEntry] = []
        done, resumed_from, cache_events = 0, [], list(session.cache_events)
        before = {"features": 0.0, "train": 0.0, "eval": 0.0, "checkpoint": 0.0, "total": 0.0}  # earlier segments
        peak_before = 0.0
        if ckpt is not None:
            checkpoint.check_inputs(
                ckpt,
                run_dir.checkpoint_path,
                session.backbone.digest,
                session.precision.name,
                session.precision.reason,
                checkpoint.data_identity(session.bench),
            )
            if ckpt.git_revision != revision:
                rep.log(f"note: the checkpoint was written by code at {ckpt.git_revision}, now {revision}")
            try:
                strategy.restore_state(ckpt.strategy)
                logs = {p: _ProtocolLog(**ckpt.logs[p]) for p in protocols}
                before = {k: float(ckpt.times[k]) for k in before}
            except (StateError, KeyError, TypeError) as e:
                raise ClbenchError(
                    f"{run_dir.checkpoint_path} does not hold a {cfg.strategy} run's state ({type(e).__name__}: "
                    f"{str(e)[:200]})",
                    f"pass {OVERWRITE} to start the run over",
                ) from None
            per_task, done = [TaskEntry.from_dict(t) for t in ckpt.per_task], ckpt.tasks_done
            resumed_from = [*ckpt.resumed_from_task, done]
            cache_events = [*ckpt.feature_cache, *cache_events]
            peak_before = ckpt.peak_rss_mb
            rep.log(f"continuing {run_dir.path} after task {done}/{bench.n_tasks} (from its checkpoint)")
        t_train = t_eval = t_ckpt = 0.0
        rep.run_started(
            RunStart(
                run_dir.path,
                cfg,
                settings_fp,
                dataclasses.asdict(strategy.cfg),
                backbone_name,
                session.backbone.digest,
                session.precision.name,
                revision,
            )
        )

        def times() -> dict[str, float]:
            return {
                "features": before["features"] + session.t_features,
                "train": before["train"] + t_train,
                "eval": before["eval"] + t_eval,
                "checkpoint": before["checkpoint"] + t_ckpt,
                "total": before["total"] + time.perf_counter() - t_start,
            }

        for step in session.tasks():
            task, t = step.task, step.task.id
            if t < done:  # learnt before the checkpoint; its RNG state is the one after task done - 1
                if t == done - 1:
                    checkpoint.restore_rng(ckpt.rng)
                continue
            rep.log(
                f"task {t + 1}/{bench.n_tasks}: classes {task.classes[0]}..{task.classes[-1]} "
                f"({len(task.train)} images)"
            )
            rng_before_task = checkpoint.capture_rng() if t == 0 else None
            t0 = time.perf_counter()
            with TrainingTrace.active() as trace:  # losses and parameter movement, for the record
                strategy.learn_task(task)
            dt_train = time.perf_counter() - t0
            trained_change = trace.relative_change()
            t_train += dt_train

            t0 = time.perf_counter()
            y = step.test.labels.numpy()
            first_logits = None
            for p in protocols:
                logits = strategy.predict(step.test, p)
                if logits.shape != (len(y), task.n_seen):
                    raise RuntimeError(
                        f"{cfg.strategy}.predict returned {tuple(logits.shape)}, expected {(len(y), task.n_seen)}"
                    )
                if not torch.isfinite(logits).all():
                    raise ClbenchError(f"{cfg.strategy} produced NaN/inf logits after task {t}")
                logs[p].add(logits, y, step.sample_task, t, step.test.indices)
                first_logits = logits if first_logits is None else first_logits
            diagnostics = strategy.diagnostics(step.test, step.sample_task)
            if training := trace.summary():
                diagnostics = {**diagnostics, "training": training}
            reset = None  # the first task only: does training change what the strategy predicts?
            if t == 0 and trained_change is not None:
                reset = training_check.reset_share(
                    strategy, task, step.test, protocols[0], first_logits, session.rng_at_build, rng_before_task
                )
            dt_eval = time.perf_counter() - t0
            t_eval += dt_eval
            per_task.append(TaskEntry(t, task.classes, dt_train, diagnostics, dt_eval, trained_change, reset))
            main = logs[protocols[0]]
            rep.log(f"  A_{t + 1} = {main.curve[-1]:.2f}%  (old {main.old[-1]:.2f}, new {main.new[-1]:.2f})")
            rep.task_done(t, main.summary(), per_task[-1], max(peak_before, peak_rss_mb()))

            t0 = time.perf_counter()  # the checkpoint first: a record never claims more than it holds
            checkpoint.save(
                run_dir.checkpoint_path,
                checkpoint.Checkpoint(
                    config=dataclasses.asdict(cfg),
                    fingerprint=settings_fp,
                    backbone_digest=session.backbone.digest,
                    precision=session.precision.name,
                    precision_reason=session.precision.reason,
                    data=checkpoint.data_identity(session.bench),
                    tasks_done=t + 1,
                    strategy=strategy.save_state(),
                    rng=checkpoint.capture_rng(),
                    logs={p: dataclasses.asdict(log) for p, log in logs.items()},
                    per_task=[e.to_dict() for e in per_task],
                    times=times(),
                    peak_rss_mb=max(peak_before, peak_rss_mb()),
                    resumed_from_task=resumed_from,
                    feature_cache=cache_events,
                    git_revision=revision,
                ),
            )
            t_ckpt += time.perf_counter() - t0
            preds = _predictions(session, logs)
            record = _record(
                cfg,
                session,
                logs,
                per_task,
                run_dir.path,
                times(),
                complete=False,
                resumed_from_task=resumed_from,
                cache_events=cache_events,
                fingerprint=settings_fp,
                preds=preds,
            )
            record.peak_rss_mb = max(peak_before, record.peak_rss_mb)  # over every segment of the run
            _write_record(record, run_dir.path, preds)

        if state_digest(session.backbone.model) != session.backbone.digest:
            raise RuntimeError(f"{cfg.strategy} changed the frozen backbone's weights; the run is not valid")
        _save_features(run_dir.path, session, strategy)
        preds = _predictions(session, logs)
        record = _record(
            cfg,
            session,
            logs,
            per_task,
            run_dir.path,
            times(),
            complete=True,
            resumed_from_task=resumed_from,
            cache_events=cache_events,
            fingerprint=settings_fp,
            preds=preds,
        )
        record.peak_rss_mb = max(peak_before, record.peak_rss_mb)
        record.finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
        rep.run_finished(record, run_dir.path)
        _write_record(record, run_dir.path, preds)
        run_dir.checkpoint_path.unlink(missing_ok=True)  # the record is complete; nothing is left to continue
        return record
    finally:
        checkpoint.restore_rng(caller_rng)
        run_dir.release()


def host_info() -> Host:
    """The machine a run's times come from: cores, CPU and its capability, and the thread settings in force."""
    from clbench import OMP_WAIT_POLICY
    from clbench.precision import CpuInfo, isa_limits

    cpu = CpuInfo.detect()
    return Host(
        cpus=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        omp_wait_policy=OMP_WAIT_POLICY,
        cpu=cpu.model,
        cpu_capability=cpu.capability,
        amx=cpu.amx,
        avx512_bf16=cpu.avx512_bf16,
        isa_limits=isa_limits(),
    )


def _save_features(path: Path, session: PreparedRun, strategy: Strategy) -> None:
    """Test features for t-SNE figures: frozen and (when the method has them) adapted, fp16."""
    import io

    from clbench.files import atomic_write_bytes

    bench = session.bench
    split = session.split("test", np.arange(len(bench.test)))
    adapted = strategy.adapted_features(split)
    arrays = {
        "frozen": session.features["test"].half().numpy(),
        "labels": bench.test_y,
        "tasks": bench.task_of_label()[bench.test_y],
    }
    if adapted is not None:
        arrays["adapted"] = adapted.half().numpy()
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(path / "features.npz", buf.getvalue())


def _predictions(session: PreparedRun, logs: dict[str, _ProtocolLog]) -> Predictions | None:
    """The predictions of every evaluation so far; None when the logs lack an evaluated task's images (a run
    resumed from a checkpoint written before clbench kept predictions)."""
    from clbench import predictions

    protocols, bench = session.protocols, session.bench
    n_tasks = len(logs[protocols[0]].matrix)
    if any(len(logs[p].pred) != n_tasks or len(logs[p].index) != n_tasks for p in protocols):
        return None
    task_of = bench.task_of_label()
    per_task = []
    for t in range(n_tasks):
        index = np.asarray(logs[protocols[0]].index[t], dtype=np.int64)
        per_task.append((index, bench.test_y[index], task_of[bench.test_y[index]]))
    return predictions.build(
        protocols,
        per_task,
        {p: [np.asarray(x) for x in logs[p].pred] for p in protocols},
        {p: [np.asarray(x) for x in logs[p].conf] for p in protocols},
        bench.n_classes,
    )


def _write_record(record: RunRecord, path: Path, preds: Predictions | None) -> None:
    """``predictions.npz`` first (or no stale one), then the record that names it."""
    from clbench import predictions

    if preds is None:
        (path / PREDICTIONS_FILE).unlink(missing_ok=True)
    record.predictions = None if preds is None else predictions.write(path, preds)
    record.write(path)


def budget_extra(strategy: Strategy, tasks_done: int) -> dict[str, list[int]]:
    """``{"optimizer_steps_per_task": [...]}`` where the strategy noted its training steps (:meth:`Strategy.note_steps`)
    for every task so far; empty otherwise (a method that trains nothing, or a run resumed from an older checkpoint)."""
    steps = list(getattr(strategy, "optimizer_steps", []))
    return {"optimizer_steps_per_task": steps} if steps and len(steps) == tasks_done else {}


def _record(
    cfg: RunConfig,
    session: PreparedRun,
    logs: dict[str, _ProtocolLog],
    per_task: list[TaskEntry],
    run_path: Path,
    times: dict[str, float],
    complete: bool,
    resumed_from_task: list[int] | None = None,
    cache_events: list[str] | None = None,
    fingerprint: dict[str, Any] | None = None,
    preds: Predictions | None = None,
) -> RunRecord:
    strategy, spec, bench, backbone, protocols = (
        session.strategy,
        session.spec,
        session.bench,
        session.backbone,
        session.protocols,
    )
    params = strategy.param_counts()
    added = list(params.added_per_task)
    stored = list(params.stored_per_task)
    trainable = list(params.trainable_per_task)
    summaries = {p: logs[p].summary() for p in protocols}
    if preds is not None:  # intervals and calibration need every image's prediction
        from clbench.predictions import uncertainty

        for p, summary in summaries.items():
            u = uncertainty(preds, p)
            summary.last_acc_ci, summary.avg_acc_ci, summary.ece = u.last_acc_ci, u.avg_acc_ci, u.ece
    gap = None
    if len(protocols) > 1:
        ref, ps = summaries["reference"], summaries["per-sample"]
        gap = ProtocolGap(last_acc=ref.last_acc - ps.last_acc, avg_acc=ref.avg_acc - ps.avg_acc)
    return RunRecord(
        run_id=run_path.name,
        complete=complete,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command_line(),
        fingerprint=fingerprint,  # the run's defining settings (clbench.config.DEFINING_FIELDS)
        strategy=strategy.name,
        strategy_config=dataclasses.asdict(strategy.cfg),
        profile=cfg.profile,
        bench=spec.name,
        n_classes=bench.n_classes,
        n_images={"train": len(bench.train), "test": len(bench.test)},
        task_sizes=bench.task_sizes,
        class_order=bench.class_order,
        class_order_seed=cfg.class_order_seed,
        class_names=[bench.class_names[c] for c in bench.class_order],
        backbone=backbone.spec.name,
        weights_source=backbone.weights_source,
        weights_digest=backbone.digest,
        img_size=backbone.img_size,
        transform=session.eval_tf.identity(),
        seed=cfg.seed,
        device=next(backbone.model.parameters()).device.type,
        precision=session.precision.name,
        precision_reason=session.precision.reason,
        protocol=protocols[0],
        protocols=summaries,
        params=Params(
            backbone=backbone.n_params(),
            trainable=max(trainable) if trainable else 0,
            trainable_per_task=trainable,
            added_per_task=added,
            added_total=sum(added),
            stored_per_task=stored,
            stored_total=sum(stored),
            head=params.head,
            extra={**params.extra, **budget_extra(strategy, len(trainable))},
        ),
        time_s=Times(**times),
        per_task=list(per_task),
        feature_cache=list(session.cache_events if cache_events is None else cache_events),
        data_problems=list(session.data_problems),  # `clbench data check` problems run anyway
        resumed_from_task=list(resumed_from_task or []),  # tasks_done at each resume from a checkpoint
        peak_rss_mb=peak_rss_mb(),
        versions=library_versions(),
        git_revision=git_revision(),
        metric_definitions=metrics.DEFINITIONS,
        host=host_info(),
        protocol_gap=gap,
        training_warning=training_check.warning(
            per_task[0].reset_share if per_task else None, [e.trained_change for e in per_task]
        ),
    )
