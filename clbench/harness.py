"""Runs one (strategy, benchmark, backbone, seed): builds the parts from the registries, computes the
frozen features once, drives the strategy through the Avalanche stream, fills the accuracy matrices,
times every phase and writes the run record. No method name appears here.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clbench import metrics
from clbench.catalog import BACKBONES, BENCHMARKS, DEFAULT_BENCH, STRATEGIES
from clbench.errors import ClbenchError
from clbench.io import atomic_write_json
from clbench.results import RESULT_FILE, SCHEMA_VERSION, command_line, git_revision, library_versions, peak_rss_mb

PROTOCOL_CHOICES = ("per-sample", "reference", "both")


@dataclass(frozen=True)
class RunConfig:
    strategy: str
    bench: str = DEFAULT_BENCH
    backbone: str | None = None  # None: the benchmark's default
    weights: str = "auto"  # auto | offline | hub | random | PATH
    data_root: str | None = None
    init_cls: int | None = None  # None: the benchmark's split
    increment: int | None = None
    seed: int = 1993  # PILOT's default seed; drives every RNG of the run
    class_order_seed: int = 1993  # the literature's class order; separate from --seed on purpose
    device: str = "auto"  # auto | cpu | cuda
    autocast: bool = True  # bf16 autocast for the backbone (faster on AMX CPUs and GPUs)
    protocol: str = "per-sample"  # per-sample | reference | both
    profile: str | None = None  # a strategy's named profile (e.g. "quick")
    overrides: tuple[tuple[str, str], ...] = ()  # --set key=value on the strategy config
    out: str | None = None  # run folder; None: runs/<strategy>-<bench>-<time>
    overwrite: bool = False
    batch_size: int = 64  # feature-extraction / evaluation batch
    img_size: int | None = None  # None: the benchmark's input size
    normalize: bool | None = None  # None: the benchmark's choice
    save_features: bool = True  # test features for t-SNE figures
    feature_cache: bool = True


class Reporter:
    """Progress and messages. The CLI subclasses this with rich; the default is silent."""

    def log(self, message: str) -> None:
        pass

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def done(self, description: str) -> None:
        pass


# ----------------------------------------------------------------------------------------------- config
def _convert(value: str, typ: Any, key: str) -> Any:
    origin = typing.get_origin(typ)
    if typ is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ClbenchError(f"--set {key}={value}: expected true or false")
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value.lower() == "none" and len(args) < len(typing.get_args(typ)):
            return None
        typ = args[0]
    if typing.get_origin(typ) is typing.Literal:
        allowed = typing.get_args(typ)
        if value not in allowed:
            raise ClbenchError(f"--set {key}={value}: expected one of {', '.join(map(str, allowed))}")
        return value
    try:
        return typ(value)
    except (TypeError, ValueError):
        raise ClbenchError(f"--set {key}={value}: expected a value of type {getattr(typ, '__name__', typ)}") from None


def make_strategy_config(strategy_cls: type, profile: str | None, overrides: tuple[tuple[str, str], ...]) -> Any:
    """The strategy's config dataclass with a named profile and ``--set`` overrides applied and validated."""
    config_cls = strategy_cls.Config
    hints = typing.get_type_hints(config_cls)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    values: dict[str, Any] = {}
    if profile is not None:
        if profile not in strategy_cls.profiles:
            valid = ", ".join(strategy_cls.profiles) or "none"
            raise ClbenchError(f"strategy {strategy_cls.name} has no profile {profile!r}; valid profiles: {valid}")
        values.update(strategy_cls.profiles[profile])
    for key, value in overrides:
        if key not in fields:
            import difflib

            close = difflib.get_close_matches(key, sorted(fields), n=1)
            raise ClbenchError(
                f"--set {key}: {strategy_cls.name} has no setting {key!r}; valid keys: {', '.join(sorted(fields)) or 'none'}",
                f"did you mean {close[0]!r}?" if close else None,
            )
        values[key] = _convert(value, hints[key], key)
    try:
        return config_cls(**values)
    except (ValueError, TypeError) as e:
        raise ClbenchError(f"invalid {strategy_cls.name} setting: {e}") from None


# ----------------------------------------------------------------------------------------------- run folder
class RunDir:
    """The run folder: refuses finished runs unless overwriting, and holds an exclusive lock while running."""

    def __init__(self, path: Path, overwrite: bool) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock = open(path / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ClbenchError(f"another clbench process is writing to {path}",
                               "wait for it to finish or choose another --out") from None
        result = path / RESULT_FILE
        if result.exists() and not overwrite:
            try:
                complete = json.loads(result.read_text()).get("complete", False)
            except (OSError, json.JSONDecodeError):
                complete = False
            what = "a finished run" if complete else "an unfinished run"
            self.release()
            raise ClbenchError(f"--out {path} already holds {what}", "pass --overwrite to replace it, or choose another --out")

    def release(self) -> None:
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def default_run_dir(cfg: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.strategy}-{cfg.bench}-s{cfg.seed}-{stamp}"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ClbenchError("--device cuda: no CUDA device is available", "use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise ClbenchError(f"--device {name}: expected auto, cpu or cuda")
    return torch.device(name)


# ----------------------------------------------------------------------------------------------- the run
@dataclass
class _ProtocolLog:
    matrix: list[list[float]] = field(default_factory=list)
    curve: list[float] = field(default_factory=list)
    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)
    top5: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "accuracy_matrix": self.matrix,
            "acc_curve": self.curve,
            "last_acc": metrics.last_acc(self.curve) if self.curve else None,
            "avg_acc": metrics.avg_acc(self.curve) if self.curve else None,
            "forgetting": metrics.forgetting(self.matrix) if self.matrix else None,
            "forgetting_first_last": metrics.forgetting_first_last(self.matrix) if self.matrix else None,
            "old_acc": self.old,
            "new_acc": self.new,
            "top5_curve": self.top5,
        }


def _protocols(cfg: RunConfig, strategy_cls: type) -> list[str]:
    if cfg.protocol not in PROTOCOL_CHOICES:
        raise ClbenchError(f"--protocol {cfg.protocol!r} is unknown; valid protocols: {', '.join(PROTOCOL_CHOICES)}")
    wanted = ["per-sample", "reference"] if cfg.protocol == "both" else [cfg.protocol]
    for p in wanted:
        if p not in strategy_cls.protocols:
            raise ClbenchError(f"strategy {strategy_cls.name} has no {p!r} protocol; it supports: "
                               f"{', '.join(strategy_cls.protocols)}")
    return wanted


def run(cfg: RunConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run one configuration end to end and return the (complete) record."""
    from clbench.backbones import load_backbone
    from clbench.benchmarks import build_benchmark
    from clbench.features import FeatureCache, cache_key, extract
    from clbench.strategy import Context, Split, Task
    from clbench.transforms import TransformSpec

    rep = reporter or Reporter()
    t_start = time.perf_counter()
    strategy_cls = STRATEGIES.get(cfg.strategy)
    spec = BENCHMARKS.get(cfg.bench)
    backbone_name = BACKBONES.check(cfg.backbone or spec.backbone)
    protocols = _protocols(cfg, strategy_cls)
    strategy_cfg = make_strategy_config(strategy_cls, cfg.profile, cfg.overrides)
    if strategy_cls.needs_vit and BACKBONES.get(backbone_name).family != "vit":
        vits = [n for n in BACKBONES.names() if BACKBONES.get(n).family == "vit"]
        raise ClbenchError(f"{strategy_cls.name} enters the transformer's layers and needs a ViT backbone; "
                           f"{backbone_name} is not one", f"choose one of: {', '.join(vits)}")
    device = resolve_device(cfg.device)
    run_dir = RunDir(Path(cfg.out) if cfg.out else default_run_dir(cfg), cfg.overwrite)
    try:
        (run_dir.path / RESULT_FILE).unlink(missing_ok=True)
        torch.manual_seed(cfg.seed)  # the run owns the seed; strategies draw from ctx.generator()
        np_rng_state = np.random.get_state()

        rep.log(f"benchmark {spec.name}: loading")
        bench = build_benchmark(spec, cfg.data_root, cfg.init_cls, cfg.increment, cfg.class_order_seed)
        rep.log(f"backbone {backbone_name} (weights: {cfg.weights})")
        backbone = load_backbone(backbone_name, cfg.weights, cfg.img_size or spec.img_size, seed=cfg.seed).to(device)
        normalize = spec.normalize if cfg.normalize is None else cfg.normalize
        mean, std = (backbone.mean, backbone.std) if normalize else (None, None)
        img = backbone.img_size
        resize = round(spec.resize * img / spec.img_size) if spec.resize else None
        eval_tf = TransformSpec(img, resize, mean, std)
        train_tf = TransformSpec(img, resize, mean, std, train=True)

        # -- frozen features, once per image (cached across runs and strategies)
        t0 = time.perf_counter()
        cache = FeatureCache(enabled=cfg.feature_cache)
        feats: dict[str, torch.Tensor] = {}
        for split_name, source in (("train", bench.train), ("test", bench.test)):
            key = cache_key(backbone=backbone_name, digest=backbone.digest, bench=spec.name,
                            split=split_name, data=source.fingerprint(), transform=eval_tf.identity(),
                            autocast=bool(cfg.autocast), device=device.type)
            advance = None

            def compute(source=source, split_name=split_name):
                adv = rep.progress(f"features {split_name} ({len(source)} images)", len(source))
                return extract(backbone, source, eval_tf.build(), device, cfg.autocast, cfg.batch_size, progress=adv)

            feats[split_name], hit = cache.get_or_compute(key, compute)
            rep.log(f"features {split_name}: {'cache hit' if hit else 'computed'} {tuple(feats[split_name].shape)}")
            del advance
        t_features = time.perf_counter() - t0

        # -- the stream
        from clbench.benchmarks.streams import avalanche_benchmark, experience_classes, experience_indices

        stream = avalanche_benchmark(bench)
        ctx = Context(backbone=backbone, device=device, autocast=cfg.autocast, seed=cfg.seed, log=rep.log,
                      progress=rep.progress)
        strategy = strategy_cls(strategy_cfg, ctx)
        train_labels = torch.as_tensor(bench.train_y)
        test_labels = torch.as_tensor(bench.test_y)
        eval_build, train_build = eval_tf.build(), train_tf.build()

        def split_of(source, labels, features, idx):
            return Split(source, idx, labels[idx], features[idx], eval_build, train_build)

        task_of = bench.task_of_label()
        logs = {p: _ProtocolLog() for p in protocols}
        per_task: list[dict[str, Any]] = []
        t_train = t_eval = 0.0
        n_seen = 0
        record: dict[str, Any] = {}
        for exp in stream.train_stream:
            t = exp.current_experience
            classes = experience_classes(exp)
            n_seen += len(classes)
            task = Task(t, classes, n_seen, split_of(bench.train, train_labels, feats["train"], experience_indices(exp)))
            rep.log(f"task {t + 1}/{bench.n_tasks}: classes {classes[0]}..{classes[-1]} ({len(task.train)} images)")
            t0 = time.perf_counter()
            strategy.learn_task(task)
            dt_train = time.perf_counter() - t0
            t_train += dt_train

            t0 = time.perf_counter()
            seen = np.flatnonzero(bench.test_y < n_seen)
            seen = seen[np.argsort(bench.test_y[seen], kind="stable")]  # class by class, as the reference builds it
            test_split = split_of(bench.test, test_labels, feats["test"], seen)
            y = bench.test_y[seen]
            sample_task = task_of[y]
            entry: dict[str, Any] = {"task": t, "classes": classes, "train_s": dt_train}
            for p in protocols:
                logits = strategy.predict(test_split, p)
                if logits.shape != (len(seen), n_seen):
                    raise RuntimeError(f"{strategy_cls.name}.predict returned {tuple(logits.shape)}, "
                                       f"expected {(len(seen), n_seen)}")
                if not torch.isfinite(logits).all():
                    raise ClbenchError(f"{strategy_cls.name} produced NaN/inf logits after task {t}")
                pred = logits.argmax(dim=1).numpy()
                lg = logs[p]
                lg.matrix.append(metrics.task_row(pred, y, sample_task, t + 1))
                lg.curve.append(metrics.accuracy(pred, y))
                old = sample_task < t
                lg.old.append(metrics.accuracy(pred[old], y[old]) if old.any() else float("nan"))
                lg.new.append(metrics.accuracy(pred[~old], y[~old]))
                lg.top5.append(metrics.topk_accuracy(logits.numpy(), y, 5))
            entry["diagnostics"] = strategy.diagnostics(test_split, sample_task)
            dt_eval = time.perf_counter() - t0
            t_eval += dt_eval
            entry["eval_s"] = dt_eval
            per_task.append(entry)
            main = logs[protocols[0]]
            rep.log(f"  A_{t + 1} = {main.curve[-1]:.2f}%  (old {main.old[-1]:.2f}, new {main.new[-1]:.2f})")

            record = _record(cfg, strategy_cls, strategy_cfg, spec, bench, backbone, protocols, logs, per_task,
                             strategy.param_counts(), run_dir.path, cache.events, device,
                             {"features": t_features, "train": t_train, "eval": t_eval,
                              "total": time.perf_counter() - t_start}, complete=False)
            atomic_write_json(run_dir.path / RESULT_FILE, record)

        if cfg.save_features:
            _save_features(run_dir.path, feats["test"], bench, strategy, split_of(
                bench.test, test_labels, feats["test"], np.arange(len(bench.test))))
        record["time_s"]["total"] = time.perf_counter() - t_start
        record["peak_rss_mb"] = peak_rss_mb()
        record["complete"] = True
        record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        atomic_write_json(run_dir.path / RESULT_FILE, record)
        np.random.set_state(np_rng_state)
        return record
    finally:
        run_dir.release()


def _save_features(path: Path, frozen: torch.Tensor, bench, strategy, split) -> None:
    """Test features for t-SNE figures: frozen and (when the method has them) adapted, fp16."""
    adapted = strategy.adapted_features(split)
    arrays = {"frozen": frozen.half().numpy(), "labels": bench.test_y, "tasks": bench.task_of_label()[bench.test_y]}
    if adapted is not None:
        arrays["adapted"] = adapted.half().numpy()
    import io

    from clbench.io import atomic_write_bytes

    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(path / "features.npz", buf.getvalue())


def _record(cfg, strategy_cls, strategy_cfg, spec, bench, backbone, protocols, logs, per_task, params, run_path,
            cache_events, device, times, complete) -> dict[str, Any]:
    main = logs[protocols[0]].summary()
    added = list(params.added_per_task)
    trainable = list(params.trainable_per_task)
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_path.name,
        "complete": complete,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "strategy": strategy_cls.name,
        "strategy_config": dataclasses.asdict(strategy_cfg),
        "profile": cfg.profile,
        "bench": spec.name,
        "n_classes": bench.n_classes,
        "task_sizes": bench.task_sizes,
        "class_order": bench.class_order,
        "class_order_seed": cfg.class_order_seed,
        "class_names": [bench.class_names[c] for c in bench.class_order],
        "backbone": backbone.spec.name,
        "weights_source": backbone.weights_source,
        "weights_digest": backbone.digest,
        "img_size": backbone.img_size,
        "normalize": spec.normalize if cfg.normalize is None else cfg.normalize,
        "seed": cfg.seed,
        "device": device.type,
        "autocast": cfg.autocast,
        "protocol": protocols[0],
        **main,
        "protocols": {p: logs[p].summary() for p in protocols},
        "params": {
            "backbone": backbone.n_params(),
            "trainable": max(trainable) if trainable else 0,
            "trainable_per_task": trainable,
            "added_per_task": added,
            "added_total": sum(added),
            "head": params.head,
            **params.extra,
        },
        "time_s": times,
        "per_task": per_task,
        "feature_cache": cache_events,
        "peak_rss_mb": peak_rss_mb(),
        "versions": library_versions(),
        "git_revision": git_revision(),
        "metric_definitions": metrics.DEFINITIONS,
        "host": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
    }
    if len(protocols) > 1:
        ref, ps = logs["reference"].summary(), logs["per-sample"].summary()
        rec["protocol_gap"] = {"last_acc": ref["last_acc"] - ps["last_acc"], "avg_acc": ref["avg_acc"] - ps["avg_acc"],
                               "note": "reference minus per-sample, in points"}
    return rec
