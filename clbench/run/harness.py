"""Runs one (strategy, benchmark, backbone, seed): builds the parts from the registries, computes the
frozen features once, drives the strategy through the Avalanche stream, fills the accuracy matrices,
times every phase and writes the run record. No method name appears here.
"""

from __future__ import annotations

import contextlib
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

from clbench import OMP_WAIT_POLICY
from clbench.benchmarks import BENCHMARKS
from clbench.benchmarks.check import check_before_run, check_loaded
from clbench.benchmarks.folder import with_data_domains
from clbench.benchmarks.streams import avalanche_benchmark, experience_classes, experience_indices
from clbench.core.catalog import BACKBONES, STRATEGIES, card
from clbench.core.config import (  # noqa: F401  (RunConfig, make_strategy_config: imported from here by callers)
    PROTOCOL_CHOICES,
    RESUME_AND_OVERWRITE,
    Fingerprint,
    RunConfig,
    check_settings,
    make_strategy_config,
    run_level,
)
from clbench.core.precision import CpuInfo, Precision, for_backbone, isa_limits
from clbench.core.precision import check_request as check_precision
from clbench.core.precision import choose as choose_precision
from clbench.core.rng import RngState, capture_rng, restore_rng
from clbench.errors import ClbenchError, setting
from clbench.evaluation import metrics
from clbench.evaluation.declared import LOGGED
from clbench.features import embeddings
from clbench.features.backbones import LazyBackbone, load_backbone, state_digest, vit_geometry
from clbench.features.cache import cache_key
from clbench.features.decoded import DecodedImages, budget_bytes
from clbench.files.atomic import atomic_write_bytes, cache_dir
from clbench.files.safestate import StateError
from clbench.methods import training_check
from clbench.methods.answers import checked
from clbench.methods.contract import Context, Split, Task, strategy_class
from clbench.methods.shared import TrainingTrace
from clbench.records import predictions
from clbench.records.command import command_line
from clbench.records.host import git_revision, library_versions, peak_rss_mb, reset_peak_rss
from clbench.records.predictions import PREDICTIONS_FILE, Predictions, uncertainty
from clbench.records.schema import Host, Params, ProtocolGap, ProtocolSummary, RunRecord, TaskEntry, Times
from clbench.records.tuning import read_summary
from clbench.run import checkpoint
from clbench.run.checkpoint import ProtocolLogState
from clbench.run.rundir import (
    RunDir,
    check_folder,
    check_free_space,
    default_run_dir,
    estimate_run_bytes,
)
from clbench.run.scenario import check_scenario
from clbench.run.validation import first_classes, hold_out, rows_in
from clbench.weights.resolve import check_input_size, check_weights_file

if TYPE_CHECKING:
    from clbench.benchmarks.base import Benchmark, BenchmarkSpec, ImageSource
    from clbench.features.backbones import FrozenBackbone
    from clbench.features.transforms import TransformSpec
    from clbench.methods.contract import Split, Strategy, Task
    from clbench.run.checkpoint import Checkpoint

# Settings named in this module's messages: their Python names in str(error), their flags on the command line.
OVERWRITE, DEVICE = setting("overwrite"), setting("device")


@dataclass(frozen=True)
class RunStart:
    """What an observer learns when a run starts (after loading, before the first task)."""

    run_dir: Path
    config: RunConfig
    fingerprint: Fingerprint  # the defining settings (clbench.core.config.DEFINING_FIELDS)
    strategy_config: dict[str, Any]
    backbone: str
    weights_digest: str
    precision: str
    revision: str  # git revision of the clbench source


class Reporter:
    """Progress and messages, and the run's milestones for observers (experiment trackers,
    :class:`clbench.run.trackers.TrackerHub`). The CLI subclasses this with rich; the default is silent."""

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
class _ProtocolLog(ProtocolLogState):
    """One protocol's evaluations so far: the fields the checkpoint saves (:class:`ProtocolLogState`: accuracy rows
    and per-image predictions as plain lists; clbench.records.predictions writes the predictions file from them), filled
    after each task."""

    @classmethod
    def restored(cls, saved: ProtocolLogState) -> _ProtocolLog:
        """The log a checkpoint saved, to be filled on."""
        return cls(**{f.name: getattr(saved, f.name) for f in dataclasses.fields(saved)})

    def add(
        self,
        logits: torch.Tensor,
        y: np.ndarray,
        sample_task: np.ndarray,
        t: int,
        index: np.ndarray,
        task_classes: np.ndarray | None = None,
        in_task: torch.Tensor | None = None,
    ) -> None:
        """One evaluation after task ``t``. ``task_classes``: (N, n_seen) which classes belong to each image's task
        (class scenario); ``in_task``: the strategy's logits given each image's task (domain scenario, a method
        with per-task modules). Without either the task-aware accuracy is the task-agnostic one."""
        pred = logits.argmax(dim=1).numpy()
        conf = torch.softmax(logits.float(), dim=1).amax(dim=1).numpy().astype(np.float16)
        self.index.append(np.asarray(index).tolist())
        self.pred.append(pred.tolist())
        self.conf.append(conf.astype(np.float64).tolist())  # float16 values: a resumed run writes the same file
        self.accuracy_matrix.append(metrics.task_row(pred, y, sample_task, t + 1))
        self.acc_curve.append(metrics.accuracy(pred, y))
        old = sample_task < t
        self.old_acc.append(metrics.accuracy(pred[old], y[old]) if old.any() else float("nan"))
        self.new_acc.append(metrics.accuracy(pred[~old], y[~old]))
        self.top5_curve.append(metrics.topk_accuracy(logits.numpy(), y, 5))
        aware = metrics.task_aware_prediction(logits.numpy() if in_task is None else in_task.numpy(), task_classes)
        self.task_aware_curve.append(metrics.accuracy(aware, y))

    def summary(self) -> ProtocolSummary:
        curve, matrix, aware = self.acc_curve, self.accuracy_matrix, self.task_aware_curve
        return ProtocolSummary(
            **{name: getattr(self, name) for name in LOGGED},  # the logged series, under the same names
            last_acc=metrics.last_acc(curve) if curve else None,
            avg_acc=metrics.avg_acc(curve) if curve else None,
            forgetting=metrics.forgetting(matrix) if matrix else None,
            forgetting_first_last=metrics.forgetting_first_last(matrix) if matrix else None,
            bwt=metrics.bwt(matrix) if matrix else None,
            task_aware_last=aware[-1] if len(aware) == len(curve) > 0 else None,
        )


def _protocols(cfg: RunConfig, strategy_cls: type[Strategy[Any]]) -> list[str]:
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


@dataclass(frozen=True)
class ResolvedRun:
    """A :class:`RunConfig` with every name and every choice that depends on the registries or the machine
    decided, once (:func:`resolve`; nothing is loaded). Everything downstream takes this and decides nothing again:
    :func:`load_inputs`, :func:`prepare`, the task loop, the record, sweeps and the Avalanche API."""

    config: RunConfig
    strategy_cls: type[Strategy[Any]]
    strategy_config: Any  # the strategy's Config dataclass, profile and --set applied and checked
    spec: BenchmarkSpec
    backbone_name: str  # the explicit backbone, else the benchmark's
    protocols: tuple[str, ...]  # evaluated in this order; the first is the record's main protocol
    device: torch.device
    init_cls: int | None  # classes in the first task: explicit, else the profile's; None: the benchmark's split
    increment: int | None  # classes per later task: the same
    img_size: int  # network input size asked for: explicit, else the profile's, else the benchmark's
    train_per_class: int | None  # each task learns from its first k images per class: explicit, else the profile's
    normalize: bool  # the backbone's mean/std: explicit, else the benchmark's choice
    fingerprint: Fingerprint  # the defining settings, backbone by name


def resolve(cfg: RunConfig) -> ResolvedRun:
    """Check every name and setting of ``cfg`` and decide what depends on them (cheap; nothing is
    loaded). Raises ClbenchError."""
    check_settings({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})  # also set by RunConfig

    spec = with_data_domains(BENCHMARKS.get(cfg.bench), cfg.data_root)  # a folder of domains declares them
    STRATEGIES.check(cfg.strategy)
    check_scenario(cfg.strategy, cfg.scenario, spec.domains, spec.name)  # one line, before the strategy imports

    strategy_cls = strategy_class(cfg.strategy)
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

    check_input_size(backbone_name, cfg.img_size)  # an explicit size the backbone would ignore: refused
    img_size = run_level(strategy_cls, cfg.profile, cfg.img_size, "img_size")
    train_per_class = run_level(strategy_cls, cfg.profile, cfg.train_per_class, "train_per_class")
    least = card(cfg.strategy).min_train_per_class
    if train_per_class is not None and train_per_class < least:
        raise ClbenchError(
            f"{setting('train_per_class')} {train_per_class}: {strategy_cls.name} learns from at least "
            f"{least} images per class",
            f"give {setting('train_per_class')} {least} or more, or leave it out",
        )
    domain = cfg.scenario == "domain"
    if domain and (cfg.init_cls is not None or cfg.increment is not None):
        raise ClbenchError(
            f"{setting('init_cls')} and {setting('increment')} cut classes into tasks; with {setting('scenario')} "
            f"domain the tasks are the benchmark's {len(spec.domains)} domains ({', '.join(spec.domains)})",
            f"leave {setting('init_cls')} and {setting('increment')} out",
        )
    return ResolvedRun(
        config=cfg,
        strategy_cls=strategy_cls,
        strategy_config=strategy_cfg,
        spec=spec,
        backbone_name=backbone_name,
        protocols=tuple(protocols),
        device=device,
        # the domain scenario's tasks are the domains: a profile's class split does not apply
        init_cls=None if domain else run_level(strategy_cls, cfg.profile, cfg.init_cls, "init_cls"),
        increment=None if domain else run_level(strategy_cls, cfg.profile, cfg.increment, "increment"),
        img_size=spec.img_size if img_size is None else img_size,
        train_per_class=train_per_class,
        normalize=spec.normalize if cfg.normalize is None else cfg.normalize,
        fingerprint=Fingerprint.from_config(cfg, backbone_name),
    )


@dataclass(frozen=True)
class FrozenInputs:
    """What every image of a run goes through, loaded once (:func:`load_inputs`): the frozen backbone on the run's
    device (its weights source and digest), the eval and train transforms, and the precision (with its reason)."""

    backbone: FrozenBackbone
    eval_tf: TransformSpec
    train_tf: TransformSpec
    precision: Precision


def load_inputs(resolved: ResolvedRun, precision: Precision | None = None) -> FrozenInputs:
    """Load the frozen backbone and decide the transforms and precision of ``resolved``: the benchmark's resize/crop
    scaled to the input size, the backbone's mean/std where the run normalises, ``precision`` where given (a resumed
    run keeps the one it started with), else the request resolved on the backbone. :func:`prepare` and
    :class:`clbench.run.avalanche_api.ClbenchStrategy` both build their inputs here, so they see the same pixels."""
    # deferred: loads torchvision, which importing this module does not
    from clbench.features.transforms import TransformSpec

    cfg, spec = resolved.config, resolved.spec

    # built on first use where the facts of these weights are cached (clbench.features.backbones.LazyBackbone)
    backbone = load_backbone(
        resolved.backbone_name,
        cfg.weights,
        resolved.img_size,
        seed=cfg.seed,
        device=resolved.device,
        lazy=cfg.feature_cache,
        cache_root=cache_dir(),
    )
    check_batch_memory(backbone, cfg.batch_size, resolved.device)  # before the precision probe runs a batch
    mean, std = (backbone.mean, backbone.std) if resolved.normalize else (None, None)
    img = backbone.img_size
    resize = round(spec.resize * img / spec.img_size) if spec.resize else None
    precision = precision or for_backbone(backbone, resolved.device, cfg.precision, use_cache=cfg.feature_cache)
    return FrozenInputs(
        backbone, TransformSpec(img, resize, mean, std), TransformSpec(img, resize, mean, std, train=True), precision
    )


def batch_bytes(backbone: Any, batch_size: int) -> int:
    """A generous estimate of the memory one forward pass of ``batch_size`` images takes (inference: one block's
    activations at a time): the float32 input, then per image a ViT block's widest moment, the MLP's hidden
    activations and the attention scores of every head (``tokens^2``, as the reference attention materialises them);
    for other backbones 32 times the input."""
    img = int(backbone.img_size)
    image = 3 * img * img * 4

    # a lazy backbone knows its shape from its facts; else the timm model, or anything, is probed for a ViT's shape
    lazy = isinstance(backbone, LazyBackbone)
    geometry = backbone.vit_geometry if lazy else vit_geometry(getattr(backbone, "model", None))
    try:
        if geometry is None:
            raise ValueError("not a timm ViT")
        patch_h, patch_w, heads, prefix = geometry
        width = int(backbone.num_features)
        tokens = (img // patch_h) * (img // patch_w) + prefix
        per_image = image + 4 * tokens * (8 * width + heads * tokens)
    except (AttributeError, TypeError, IndexError, ValueError, ZeroDivisionError):  # not a timm ViT
        per_image = 32 * image
    return batch_size * per_image


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a batch: the GPU's free memory, or the host's available memory (``MemAvailable``); None
    where it cannot be told."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def check_batch_memory(backbone: Any, batch_size: int, device: torch.device) -> None:
    """Refuse, in one line and before anything is allocated, an input size and batch size whose forward pass cannot
    fit in the memory this machine has free (each in its range, together they can ask for petabytes)."""
    need, free = batch_bytes(backbone, batch_size), available_memory(device)
    if free is None or need <= free:
        return
    fits = max(0, batch_size * free // need)
    img = backbone.img_size
    fix = (
        f"use {setting('batch_size')} {fits} or less (or a smaller {setting('img_size')})"
        if fits >= 1
        else f"use a smaller {setting('img_size')}: at {img} px not even one image fits"
    )
    raise ClbenchError(
        f"{setting('img_size')} {img} with {setting('batch_size')} {batch_size}: one batch of features needs about "
        f"{need / 2**30:,.1f} GB, and {device.type} has {free / 2**30:,.1f} GB free",
        fix,
    )


def feature_key(resolved: ResolvedRun, inputs: FrozenInputs, split: str, data: str) -> str:
    """The feature-cache key of one set of images (``data``: their content fingerprint) through ``inputs``."""
    return cache_key(
        backbone=resolved.backbone_name,
        digest=inputs.backbone.digest,
        bench=resolved.spec.features_as or resolved.spec.name,
        split=split,
        data=data,
        transform=inputs.eval_tf.identity(),
        precision=inputs.precision.name,
        device=resolved.device.type,
    )


@dataclass
class PreparedRun:
    """A run ready to loop over its tasks: what was resolved, the benchmark, the frozen inputs, the cached features
    and the strategy."""

    resolved: ResolvedRun
    inputs: FrozenInputs
    bench: Benchmark
    features: dict[str, torch.Tensor]  # "train" / "test" -> (N, d) frozen features
    cache_events: list[str]
    t_features: float  # seconds spent on frozen features (computing or loading them)
    strategy: Strategy[Any]
    data_problems: list[str] = field(default_factory=list)  # found and run anyway (ignore_data_problems)
    rng_at_build: RngState | None = None  # global RNG states just before the strategy was built
    # a validation run's split (clbench.run.validation.ValidationSplit.summary); None: evaluated on the test split
    validation: dict[str, Any] | None = None

    @property
    def cfg(self) -> RunConfig:
        return self.resolved.config

    @property
    def spec(self) -> BenchmarkSpec:
        return self.resolved.spec

    @property
    def protocols(self) -> list[str]:
        return list(self.resolved.protocols)

    @property
    def backbone(self) -> FrozenBackbone:
        return self.inputs.backbone

    @property
    def eval_tf(self) -> TransformSpec:
        return self.inputs.eval_tf

    @property
    def train_tf(self) -> TransformSpec:
        return self.inputs.train_tf

    @property
    def precision(self) -> Precision:
        return self.inputs.precision

    def split(self, which: str, indices: np.ndarray) -> Split:
        # training images through the decoded-image cache (clbench.features.decoded): decoded once,
        # augmented every epoch
        source, y = (self.decoded, self.bench.train_y) if which == "train" else (self.bench.test, self.bench.test_y)
        idx = np.asarray(indices, dtype=np.int64)
        return Split(source, idx, torch.as_tensor(y[idx]), self.features[which][idx], self._eval, self._train)

    def __post_init__(self) -> None:
        self._eval, self._train = self.eval_tf.build(), self.train_tf.build()
        self.decoded = DecodedImages(self.bench.train, budget_bytes())

    def tasks(self) -> Iterator[TaskAndTest]:
        """The Avalanche train stream, one :class:`TaskAndTest` per task (the test split covers all seen classes)."""
        test_task = self.bench.image_tasks("test")  # the class's task, or in the domain scenario the image's domain
        domain = self.bench.scenario == "domain"
        n_seen = 0
        for exp in avalanche_benchmark(self.bench).train_stream:
            classes = experience_classes(exp)  # domain scenario: the classes of this domain, all seen before t > 0
            # the domain scenario's label space is every class from the first task on (the head has them all)
            n_seen = self.bench.n_classes if domain else n_seen + len(classes)
            task = Task(exp.current_experience, classes, n_seen, self.split("train", experience_indices(exp)))
            task = task.first_per_class(self.resolved.train_per_class)  # the run's subset, cut here for every method
            seen = self.bench.seen_test(exp.current_experience)  # class by class, as the reference
            yield TaskAndTest(task, self.split("test", seen), test_task[seen])


def prepare(
    run: ResolvedRun | RunConfig, reporter: Reporter | None = None, precision: Precision | None = None
) -> PreparedRun:
    """Load the benchmark and the frozen inputs of a resolved run (a RunConfig is resolved first), compute (or
    load) the frozen features once, and build the strategy. ``precision``: the one to use instead of resolving the
    request (a resumed run keeps the precision it started with)."""
    # looked up at call time: `clbench perf main-job` times it by wrapping the module attribute
    from clbench.benchmarks import build_benchmark
    from clbench.features.cache import FeatureCache, extract

    resolved = run if isinstance(run, ResolvedRun) else resolve(run)
    cfg, spec, device = resolved.config, resolved.spec, resolved.device
    rep = reporter or Reporter()

    rep.log(f"benchmark {spec.name}: loading")
    bench = build_benchmark(
        spec, cfg.data_root, resolved.init_cls, resolved.increment, cfg.class_order_seed, cfg.scenario
    )
    loaded = {"train": bench.train, "test": bench.test}  # the splits as loaded: what the feature cache holds
    holdout = None
    if cfg.classes is not None:  # the first K classes of the class order only (a smaller benchmark to tune on)
        bench = first_classes(bench, cfg.classes, resolved.init_cls, resolved.increment)
        rep.log(f"classes: the first {cfg.classes} of the class order ({len(bench.train)} training images)")
    if cfg.validation is not None:  # learn from part of the training images, evaluate on the rest; test sealed
        holdout = hold_out(bench, cfg.validation)
        bench = holdout.bench
        rep.log(
            f"validation split: {len(holdout.held)} of {len(holdout.full_train)} training images held out "
            f"({cfg.validation:g} of each class); the test split is not read"
        )
    rep.log(f"backbone {resolved.backbone_name} (weights: {cfg.weights})")
    cache = FeatureCache(enabled=cfg.feature_cache, warn=lambda m: rep.log(f"warning: {m}"))
    inputs = load_inputs(resolved, precision)
    rep.log(f"precision {inputs.precision.name}: {inputs.precision.reason}")

    # Frozen features, once per image: cached across runs and strategies.
    t0 = time.perf_counter()
    feats: dict[str, torch.Tensor] = {}
    # A run on part of the images (--validation, --classes) featurises the splits as loaded (the cache entries every
    # run shares) and takes its images' rows below; a validation run never featurises the test split.

    parts = {name: rows_in(getattr(bench, name), loaded) for name in ("train", "test")}  # name -> (split, rows)
    needed = list(dict.fromkeys(split for split, _ in parts.values()))
    for split_name, source in ((n, loaded[n]) for n in needed):
        key = feature_key(resolved, inputs, split_name, source.fingerprint())

        def compute(source: ImageSource = source, split_name: str = split_name) -> torch.Tensor:
            adv = rep.progress(f"features {split_name} ({len(source)} images)", len(source))
            return extract(
                inputs.backbone,
                source,
                inputs.eval_tf.build(),
                device,
                inputs.precision.name,
                cfg.batch_size,
                progress=adv,
            )

        def spot(rows: list[int], source: ImageSource = source) -> torch.Tensor:  # a cached entry's spot check
            return extract(
                inputs.backbone, source, inputs.eval_tf.build(), device, inputs.precision.name, len(rows), rows
            )

        feats[split_name], hit = cache.get_or_compute(key, compute, spot, inputs.precision.name)
        rep.log(f"features {split_name}: {'cache hit' if hit else 'computed'} {tuple(feats[split_name].shape)}")
    feats = {
        name: feats[split] if rows is None else feats[split][torch.as_tensor(rows)]
        for name, (split, rows) in parts.items()
    }
    t_features = time.perf_counter() - t0

    ctx = Context(
        backbone=inputs.backbone,
        device=device,
        precision=inputs.precision.name,
        seed=cfg.seed,
        log=rep.log,
        progress=rep.progress,
    )
    rng_at_build = capture_rng()  # the under-training detector builds an untrained twin from the same states
    strategy = resolved.strategy_cls(resolved.strategy_config, ctx)
    return PreparedRun(
        resolved,
        inputs,
        bench,
        feats,
        cache.events,
        t_features,
        strategy,
        rng_at_build=rng_at_build,
        validation=None if holdout is None else holdout.summary(),
    )


def run(cfg: RunConfig, reporter: Reporter | None = None, resume: bool = False) -> RunRecord:
    """Run one configuration end to end, writing a checkpoint and the record after tasks (:class:`Cadence
    <clbench.run.checkpoint.Cadence>`: once the work since the last one outweighs writing it); return the complete
    record. An unfinished run in ``cfg.out`` with a checkpoint and the same settings is continued from its last
    finished task (``resume=True``: it must be). See :mod:`clbench.run.checkpoint`."""

    rep = reporter or Reporter()
    t_start = time.perf_counter()
    resolved = resolve(cfg)  # every bad name or setting fails here, before a run folder is made
    cadence = checkpoint.Cadence.from_env()  # so does a bad $CLBENCH_CHECKPOINT_S
    _tuning(cfg)  # and a --tuning file that is not a tuning summary
    run_dir, data_problems = _claim_run_folder(resolved, resume)
    caller_rng = capture_rng()
    reset_peak_rss()  # the record's peak memory is this run's, also in a process that ran others before
    try:
        ckpt = run_dir.resumable(resolved.fingerprint, required=resume)
        if ckpt is None:
            run_dir.start_afresh()
        torch.manual_seed(cfg.seed)  # the run owns the seed; strategies draw from ctx.generator()
        session = prepare(resolved, rep, precision=_precision_started_with(cfg, ckpt))
        _note_data_problems(session, data_problems, rep)
        need = estimate_run_bytes(
            session.backbone.num_features, len(session.bench.test), session.bench.n_classes, session.bench.n_tasks
        )
        check_free_space(run_dir.path, need, "out", "the record, checkpoint and features")
        state = _RunState(session, t_start)
        if ckpt is not None:
            state.restore(ckpt, run_dir, rep)
        rep.run_started(state.run_start(run_dir.path))
        resumed_at = state.done if ckpt is not None else None
        for step in session.tasks():
            if step.task.id < state.done:  # learnt before the checkpoint; its RNG state is the one after task done - 1
                if step.task.id == state.done - 1 and ckpt is not None:  # state.done > 0: restored from it
                    restore_rng(ckpt.rng)
                continue
            work = time.perf_counter()
            with _restored_state_used(run_dir, resumed_at == step.task.id, session.cfg.strategy):
                _learn_and_evaluate(session, step, state, rep)
            if cadence.due(time.perf_counter() - work):
                cadence.written(_save_progress(state, run_dir))
        with _restored_state_used(run_dir, resumed_at == session.bench.n_tasks, session.cfg.strategy):
            return _finish(state, run_dir, rep)
    finally:
        restore_rng(caller_rng)
        run_dir.release()


@contextlib.contextmanager
def _restored_state_used(run_dir: RunDir, first_use: bool, strategy: str) -> Iterator[None]:
    """Where a resumed run first uses the state its checkpoint held (``first_use``: the first task after the resume,
    or the finish when none was left), a failure of the strategy's code is a checkpoint whose values have the right
    types but impossible meanings (a tensor of another shape, an index past a list): one line naming the file. A
    failure anywhere else stays the programming error it is."""
    try:
        yield
    except ClbenchError:
        raise
    except (RuntimeError, ValueError, IndexError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
        if not first_use:
            raise
        raise ClbenchError(
            f"{run_dir.checkpoint_path} does not hold a {strategy} run's state that can be continued: its first use "
            f"failed ({type(e).__name__}: {str(e)[:200]})",
            f"pass {OVERWRITE} to start the run over",
        ) from None


def _claim_run_folder(resolved: ResolvedRun, resume: bool) -> tuple[RunDir, list[str]]:
    """The run's folder, checked and locked, and the data problems found before anything loads (as `clbench data
    check`; refused unless ignore_data_problems)."""
    cfg = resolved.config
    if resume and cfg.overwrite:
        raise ClbenchError(RESUME_AND_OVERWRITE)
    out = Path(cfg.out) if cfg.out is not None else default_run_dir(cfg)
    check_folder(out, "out")
    check_weights_file(cfg.weights)
    data_problems = check_before_run(cfg.bench, cfg.data_root, cfg.ignore_data_problems)
    return RunDir(out, cfg.overwrite), data_problems


def _precision_started_with(cfg: RunConfig, ckpt: Checkpoint | None) -> Precision | None:
    """--precision auto: a resumed run keeps the precision auto chose when it started (None: resolve it now)."""
    if ckpt is not None and cfg.precision == "auto" and ckpt.precision is not None:
        return Precision(ckpt.precision, ckpt.precision_reason or "auto, when the run started")
    return None


def _note_data_problems(session: PreparedRun, before_loading: list[str], rep: Reporter) -> None:
    session.data_problems = before_loading + check_loaded(session.bench, session.cfg.ignore_data_problems)
    for problem in session.data_problems:
        rep.log(f"warning: data problem, run anyway (ignore_data_problems): {problem}")


class _RunState:
    """What a run has done so far: restored from its checkpoint when it continues, saved in it after a task
    (:class:`clbench.run.checkpoint.Cadence` says which)."""

    def __init__(self, session: PreparedRun, t_start: float) -> None:
        self.session, self.t_start, self.revision = session, t_start, git_revision()
        self.logs = {p: _ProtocolLog() for p in session.protocols}  # protocol -> its matrices and predictions
        self.per_task: list[TaskEntry] = []
        self.done = 0  # tasks learnt and evaluated
        self.resumed_from: list[int] = []  # tasks_done at each resume from a checkpoint
        self.cache_events = list(session.cache_events)
        self.before = Times(features=0.0, train=0.0, eval=0.0, checkpoint=0.0, total=0.0)  # of earlier segments
        self.peak_before = 0.0  # peak memory of earlier segments, MB
        self.t_train = self.t_eval = self.t_ckpt = 0.0
        self.resume_warning: str | None = None  # a resume that found every task done (RunRecord.resume_warning)

    def restore(self, ckpt: Checkpoint, run_dir: RunDir, rep: Reporter) -> None:
        """Continue from ``ckpt``, once its inputs (backbone, precision, data) are checked to be this run's."""

        session = self.session
        checkpoint.check_inputs(
            ckpt,
            run_dir.checkpoint_path,
            session.backbone.digest,
            session.precision.name,
            session.precision.reason,
            checkpoint.data_identity(session.bench),
        )
        if ckpt.git_revision != self.revision:
            rep.log(f"note: the checkpoint was written by code at {ckpt.git_revision}, now {self.revision}")
        problem = _impossible_counts(ckpt, session)
        if problem is not None:
            raise ClbenchError(
                f"{run_dir.checkpoint_path} cannot be continued: {problem}", f"pass {OVERWRITE} to start the run over"
            )
        try:
            checkpoint.restore_strategy(session.strategy, ckpt.strategy, run_dir.checkpoint_path)  # and its settings
        except (StateError, KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
            raise ClbenchError(
                f"{run_dir.checkpoint_path} does not hold a {session.cfg.strategy} run's state ({type(e).__name__}: "
                f"{str(e)[:200]})",
                f"pass {OVERWRITE} to start the run over",
            ) from None
        self.logs = {p: _ProtocolLog.restored(ckpt.logs[p]) for p in session.protocols}
        self.before = ckpt.times
        self.per_task, self.done = list(ckpt.per_task), ckpt.tasks_done
        self.resumed_from = [*ckpt.resumed_from_task, self.done]
        self.cache_events = [*ckpt.feature_cache, *self.cache_events]
        self.peak_before = ckpt.peak_rss_mb
        rep.log(f"continuing {run_dir.path} after task {self.done}/{session.bench.n_tasks} (from its checkpoint)")
        if self.done == session.bench.n_tasks:
            self.resume_warning = (
                f"resumed from a checkpoint with every task ({self.done} of {self.done}) done: this segment trained "
                "and evaluated nothing; the numbers are the checkpoint's"
            )
            rep.log(f"warning: {self.resume_warning}")

    def run_start(self, run_path: Path) -> RunStart:
        s = self.session
        return RunStart(
            run_path,
            s.cfg,
            s.resolved.fingerprint,
            dataclasses.asdict(s.strategy.cfg),
            s.resolved.backbone_name,
            s.backbone.digest,
            s.precision.name,
            self.revision,
        )

    def times(self) -> Times:
        """Seconds per phase over every segment of the run."""
        before = self.before
        return Times(
            features=before.features + self.session.t_features,
            train=before.train + self.t_train,
            eval=before.eval + self.t_eval,
            checkpoint=(before.checkpoint or 0.0) + self.t_ckpt,  # None: a checkpoint without it
            total=before.total + time.perf_counter() - self.t_start,
        )

    def peak_rss_mb(self) -> float:
        """Peak memory over every segment of the run, MB."""
        return max(self.peak_before, peak_rss_mb())

    def record(self, run_path: Path, complete: bool, preds: Predictions | None) -> RunRecord:
        record = _record(
            self.session.cfg,
            self.session,
            self.logs,
            self.per_task,
            run_path,
            self.times(),
            complete=complete,
            resumed_from_task=self.resumed_from,
            cache_events=self.cache_events,
            fingerprint=self.session.resolved.fingerprint,
            preds=preds,
        )
        record.peak_rss_mb = max(self.peak_before, record.peak_rss_mb or 0.0)  # over every segment of the run
        record.resume_warning = self.resume_warning
        # the code this process imported when the run (or its last segment) started: the tree may have moved on
        # while a long run was going, and the record is of the code that ran, not of the tree when it was written
        record.git_revision = self.revision
        return record


# one entry per task done (ProtocolLogState); the task-aware curve only in checkpoints written since it was logged
_LOG_ROWS = tuple(name for name in LOGGED if name != "task_aware_curve")
_LOG_IMAGES = ("index", "pred", "conf")  # one list per task done, or none (checkpoints before predictions were kept)


def _impossible_counts(ckpt: Checkpoint, session: PreparedRun) -> str | None:
    """What in a checkpoint's counts no run of this benchmark can have written (more tasks done than it has, per-task
    entries, accuracy rows or evaluated images in other numbers, indices or classes outside the test split), said in a
    few words; None when they fit. The reader checked the JSON types (:class:`clbench.run.checkpoint.Checkpoint`);
    values of the right type but impossible meaning stop here, before the harness or the strategy index
    anything with them."""
    bench, done = session.bench, ckpt.tasks_done
    if done > bench.n_tasks:
        return f"it claims {done} tasks done, but the run has {bench.n_tasks}"

    if (wrong := checkpoint.impossible_values(ckpt, bench)) is not None:  # classes, cache events, diagnostics
        return wrong
    if len(ckpt.per_task) != done or any(e.task != i for i, e in enumerate(ckpt.per_task)):
        return f"it holds {len(ckpt.per_task)} per-task entries for {done} tasks done"
    resumes = ckpt.resumed_from_task
    if any(not 1 <= r <= done for r in resumes) or resumes != sorted(resumes):
        return f"its resumes ({resumes[:8]}) are not task counts from 1 to {done} in order"
    sizes = np.cumsum(bench.task_sizes)
    for p in session.protocols:
        log = ckpt.logs.get(p)
        if log is None:
            return f"it holds no evaluations of protocol {p!r}"
        kept = any(getattr(log, name) for name in _LOG_IMAGES)  # none: a checkpoint from before they were kept
        for name in (*_LOG_ROWS, *(_LOG_IMAGES if kept else ())):
            rows = getattr(log, name)
            if len(rows) != done:
                return f"its {p} {name} has {len(rows)} entries for {done} tasks done"
        for t, row in enumerate(log.accuracy_matrix):
            if len(row) != t + 1:
                return f"its {p} accuracy matrix row {t} is not {t + 1} accuracies"
        for name in _LOG_ROWS:
            values = (
                [v for row in log.accuracy_matrix for v in row] if name == "accuracy_matrix" else getattr(log, name)
            )
            if not all(v != v or 0 <= v <= 100 for v in values):  # v != v: NaN (old accuracy after the first task)
                return f"its {p} {name} holds a value that is not a percentage"
        for t in range(len(log.index)):
            seen = bench.seen_test(t)  # as PreparedRun.tasks evaluates them
            index, pred, conf = log.index[t], log.pred[t], log.conf[t]
            if index != seen.tolist():
                return f"its {p} evaluation after task {t + 1} is not of the {len(seen)} test images seen by then"
            if len(pred) != len(seen):
                return f"its {p} predictions after task {t + 1} are not {len(seen)} class ids"
            if pred and not 0 <= min(pred) <= max(pred) < sizes[t]:
                return f"its {p} predictions after task {t + 1} name classes outside the {sizes[t]} seen"
            if len(conf) != len(seen):
                return f"its {p} confidences after task {t + 1} are not {len(seen)} numbers"
            if conf and not 0 <= min(conf) <= max(conf) <= 1:
                return f"its {p} confidences after task {t + 1} are not probabilities"
    return None


def _learn_and_evaluate(session: PreparedRun, step: TaskAndTest, state: _RunState, rep: Reporter) -> None:
    """Learn one task, then evaluate on every seen class under each protocol; the task's entry joins ``state``."""
    strategy, task, t, protocols = session.strategy, step.task, step.task.id, session.protocols
    what = (
        f"domain {session.spec.domains[t]!r}, {len(task.classes)} classes"
        if session.bench.scenario == "domain"
        else f"classes {task.classes[0]}..{task.classes[-1]}"
    )
    rep.log(f"task {t + 1}/{session.bench.n_tasks}: {what} ({len(task.train)} images)")
    rng_before_task = capture_rng() if t == 0 else None
    t0 = time.perf_counter()
    with TrainingTrace.active() as trace:  # losses and parameter movement, for the record
        strategy.learn_task(task)
    dt_train = time.perf_counter() - t0
    trained_change = trace.relative_change()
    state.t_train += dt_train

    t0 = time.perf_counter()
    y = step.test.labels.numpy()
    first_logits = None
    for p in protocols:
        seen = {"images": len(y), "classes": task.n_seen}  # what every answer about the test images must fit
        logits = checked(session.cfg.strategy, "predict", strategy.predict(step.test, p), **seen)
        if session.bench.scenario == "domain":  # every task has every class: a per-task module given the task
            given = strategy.predict_given_task(step.test, step.sample_task, p)
            given = checked(session.cfg.strategy, "predict_given_task", given, **seen)
            state.logs[p].add(logits, y, step.sample_task, t, step.test.indices, in_task=given)
        else:  # class scenario: the prediction restricted to the classes of the image's task
            task_of = session.bench.task_of_label()[: task.n_seen]
            in_its_task = task_of[None, :] == step.sample_task[:, None]
            state.logs[p].add(logits, y, step.sample_task, t, step.test.indices, task_classes=in_its_task)
        first_logits = logits if first_logits is None else first_logits
    diagnostics = checked(session.cfg.strategy, "diagnostics", strategy.diagnostics(step.test, step.sample_task))
    if training := trace.summary():
        diagnostics = {**diagnostics, "training": training}
    reset = None  # the first task only: does training change what the strategy predicts?
    if t == 0 and trained_change is not None and first_logits is not None:
        reset = training_check.reset_share(
            strategy, task, step.test, protocols[0], first_logits, session.rng_at_build, rng_before_task
        )
    dt_eval = time.perf_counter() - t0
    state.t_eval += dt_eval
    state.per_task.append(TaskEntry(t, task.classes, dt_train, diagnostics, dt_eval, trained_change, reset))
    state.done = t + 1
    main = state.logs[protocols[0]]
    rep.log(f"  A_{t + 1} = {main.acc_curve[-1]:.2f}%  (old {main.old_acc[-1]:.2f}, new {main.new_acc[-1]:.2f})")
    rep.task_done(t, main.summary(), state.per_task[-1], state.peak_rss_mb())


def _save_progress(state: _RunState, run_dir: RunDir) -> float:
    """The checkpoint, then the (unfinished) record: a record never claims more than the checkpoint holds. Returns
    the seconds this took (the :class:`~clbench.run.checkpoint.Cadence` weighs them against the work they protect)."""

    session = state.session
    t0 = time.perf_counter()
    checkpoint.save(
        run_dir.checkpoint_path,
        checkpoint.Checkpoint(
            config=dataclasses.asdict(session.cfg),
            fingerprint=session.resolved.fingerprint,
            backbone_digest=session.backbone.digest,
            precision=session.precision.name,
            precision_reason=session.precision.reason,
            data=checkpoint.data_identity(session.bench),
            tasks_done=state.done,
            strategy=session.strategy.save_state(),
            rng=capture_rng(),
            logs=dict(state.logs),
            per_task=list(state.per_task),
            times=state.times(),
            peak_rss_mb=state.peak_rss_mb(),
            resumed_from_task=state.resumed_from,
            feature_cache=state.cache_events,
            git_revision=state.revision,
        ),
    )
    state.t_ckpt += time.perf_counter() - t0
    preds = _predictions(session, state.logs)
    _write_record(state.record(run_dir.path, complete=False, preds=preds), run_dir.path, preds)
    return time.perf_counter() - t0


def _finish(state: _RunState, run_dir: RunDir, rep: Reporter) -> RunRecord:
    """Check the backbone is untouched, write the features and the complete record, drop the checkpoint."""
    session = state.session
    built = getattr(session.backbone, "built", True)  # one never built was never changed
    if built and state_digest(session.backbone.model) != session.backbone.digest:
        raise RuntimeError(f"{session.cfg.strategy} changed the frozen backbone's weights; the run is not valid")
    _save_features(run_dir.path, session, session.strategy)
    preds = _predictions(session, state.logs)
    record = state.record(run_dir.path, complete=True, preds=preds)
    record.finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rep.run_finished(record, run_dir.path)
    _write_record(record, run_dir.path, preds)
    run_dir.checkpoint_path.unlink(missing_ok=True)  # the record is complete; nothing is left to continue
    return record


def host_info() -> Host:
    """The machine a run's times come from: cores, CPU and its capability, and the thread settings in force."""
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


def _save_features(path: Path, session: PreparedRun, strategy: Strategy[Any]) -> None:
    """``features.npz`` for the report's t-SNE figure (:mod:`clbench.features.embeddings`): a fixed subsample of the
    test images, their frozen features and what the method's classifier scores, reduced and fp16."""

    bench = session.bench
    index = embeddings.subsample(len(bench.test))
    adapted = strategy.adapted_features(session.split("test", index))
    adapted = checked(session.cfg.strategy, "adapted_features", adapted, images=len(index))
    data = embeddings.encode(
        index,
        np.asarray(bench.test_y)[index],
        np.asarray(bench.image_tasks("test"))[index],
        session.features["test"][torch.as_tensor(index)].float().numpy(),
        None if adapted is None else adapted.float().cpu().numpy(),
        card(session.cfg.strategy).embedding,
    )
    atomic_write_bytes(path / "features.npz", data)


def _predictions(session: PreparedRun, logs: dict[str, _ProtocolLog]) -> Predictions | None:
    """The predictions of every evaluation so far; None when the logs lack an evaluated task's images (a run
    resumed from a checkpoint written before clbench kept predictions)."""
    protocols, bench = session.protocols, session.bench
    n_tasks = len(logs[protocols[0]].accuracy_matrix)
    if any(len(logs[p].pred) != n_tasks or len(logs[p].index) != n_tasks for p in protocols):
        return None
    task_of = bench.image_tasks("test")
    per_task = []
    for t in range(n_tasks):
        index = np.asarray(logs[protocols[0]].index[t], dtype=np.int64)
        per_task.append((index, bench.test_y[index], task_of[index]))
    return predictions.build(
        protocols,
        per_task,
        {p: [np.asarray(x) for x in logs[p].pred] for p in protocols},
        {p: [np.asarray(x) for x in logs[p].conf] for p in protocols},
        bench.n_classes,
    )


def _tuning(cfg: RunConfig) -> dict[str, Any] | None:
    """The content of ``--tuning FILE`` (how ``clbench tune`` chose the run's settings), for the record."""
    if cfg.tuning is None:
        return None

    return read_summary(Path(cfg.tuning))


def _write_record(record: RunRecord, path: Path, preds: Predictions | None) -> None:
    """``predictions.npz`` first (or no stale one), then the record that names it."""
    if preds is None:
        (path / PREDICTIONS_FILE).unlink(missing_ok=True)
    record.predictions = None if preds is None else predictions.write(path, preds)
    record.write(path)


def budget_extra(strategy: Strategy[Any], tasks_done: int) -> dict[str, list[int]]:
    """``{"optimizer_steps_per_task": [...]}`` where the strategy noted its training steps (:meth:`Strategy.note_steps`)
    for every task so far; empty otherwise (a method that trains nothing, or a run resumed from an older checkpoint)."""
    steps = list(getattr(strategy, "optimizer_steps", []))
    return {"optimizer_steps_per_task": steps} if steps and len(steps) == tasks_done else {}


_VERSIONS: dict[str, str] = {}


def _versions() -> dict[str, str]:
    """:func:`library_versions`, read once per process (the package metadata scan is 30 ms; a run writes its record
    after every task)."""
    if not _VERSIONS:
        _VERSIONS.update(library_versions())
    return dict(_VERSIONS)


def _record(
    cfg: RunConfig,
    session: PreparedRun,
    logs: dict[str, _ProtocolLog],
    per_task: list[TaskEntry],
    run_path: Path,
    times: Times,
    complete: bool,
    resumed_from_task: list[int] | None = None,
    cache_events: list[str] | None = None,
    fingerprint: Fingerprint | None = None,
    preds: Predictions | None = None,
) -> RunRecord:
    device = session.resolved.device  # where the backbone runs (built on it, or to be)
    strategy, spec, bench, backbone, protocols = (
        session.strategy,
        session.spec,
        session.bench,
        session.backbone,
        session.protocols,
    )
    params = checked(cfg.strategy, "param_counts", strategy.param_counts(), tasks=len(per_task))
    evaluated = "test" if session.validation is None else "validation"  # the split the accuracies are on
    added = list(params.added_per_task)
    stored = list(params.stored_per_task)
    trainable = list(params.trainable_per_task)
    summaries = {p: logs[p].summary() for p in protocols}
    # Intervals and calibration need every image's prediction, and are the finished run's: the bootstrap (half a
    # second per protocol) is not repeated for the unfinished record written after every task.
    if preds is not None and complete:
        for p, summary in summaries.items():
            u = uncertainty(preds, p)
            summary.last_acc_ci, summary.avg_acc_ci, summary.ece = u.last_acc_ci, u.avg_acc_ci, u.ece
    gap = None
    if len(protocols) > 1:
        ref, ps = summaries["reference"], summaries["per-sample"]
        r_last, p_last, r_avg, p_avg = ref.last_acc, ps.last_acc, ref.avg_acc, ps.avg_acc
        if r_last is not None and p_last is not None and r_avg is not None and p_avg is not None:  # after a task
            gap = ProtocolGap(last_acc=r_last - p_last, avg_acc=r_avg - p_avg)
    return RunRecord(
        run_id=run_path.name,
        complete=complete,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command_line(),
        fingerprint=fingerprint,  # the run's defining settings (clbench.core.config.DEFINING_FIELDS)
        strategy=strategy.name,
        strategy_config=dataclasses.asdict(strategy.cfg),
        train_per_class=session.resolved.train_per_class,
        profile=cfg.profile,
        bench=spec.name,
        n_classes=bench.n_classes,
        n_images={"train": len(bench.train), evaluated: len(bench.test)},
        data_fingerprint={"train": bench.train.data_id(), evaluated: bench.test.data_id()},
        evaluated_on=None if session.validation is None else evaluated,
        validation=session.validation,
        tuning=_tuning(cfg),
        # classes each task brings: in the domain scenario every task brings the classes of its domain
        task_sizes=[bench.n_classes] * bench.n_tasks if bench.scenario == "domain" else bench.task_sizes,
        scenario=None if bench.scenario == "class" else bench.scenario,
        domains=list(spec.domains) if bench.scenario == "domain" else None,
        class_order=bench.class_order,
        class_order_seed=cfg.class_order_seed,
        class_names=[bench.class_names[c] for c in bench.class_order],
        backbone=backbone.spec.name,
        weights_source=backbone.weights_source,
        weights_digest=backbone.digest,
        img_size=backbone.img_size,
        transform=session.eval_tf.identity(),
        seed=cfg.seed,
        device=device.type,
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
        time_s=times,
        per_task=list(per_task),
        feature_cache=list(session.cache_events if cache_events is None else cache_events),
        data_problems=list(session.data_problems),  # `clbench data check` problems run anyway
        resumed_from_task=list(resumed_from_task or []),  # tasks_done at each resume from a checkpoint
        peak_rss_mb=peak_rss_mb(),
        versions=_versions(),
        git_revision=git_revision(),
        metric_definitions=metrics.definitions(bench.scenario),
        host=host_info(),
        protocol_gap=gap,
        training_warning=training_check.warning(
            per_task[0].reset_share if per_task else None, [e.trained_change for e in per_task]
        ),
    )
