"""clbench strategies as Avalanche strategies: drive any registered method from your own Avalanche loop.

    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.logging import InteractiveLogger
    from avalanche.training.plugins import EvaluationPlugin
    from clbench.run.avalanche_api import ClbenchStrategy

    strategy = ClbenchStrategy(strategy="tosca", bench="emoji", evaluator=EvaluationPlugin(
        accuracy_metrics(experience=True, stream=True), loggers=[InteractiveLogger()]))
    for t, exp in enumerate(benchmark.train_stream):
        strategy.train(exp)
        strategy.eval(benchmark.test_stream[: t + 1])

:class:`ClbenchStrategy` is an Avalanche ``SupervisedTemplate``: ``train``/``eval`` fire the usual plugin
callbacks, and during evaluation ``mb_output`` (logits indexed by class id) and ``mb_y`` are set per minibatch, so
Avalanche's metrics, ``EvaluationPlugin`` and loggers work unchanged.

Same numbers as ``clbench run`` by construction: the strategy takes the CLI's own settings, the fields of
:class:`clbench.core.config.RunConfig` under their names and with their defaults and checks (``strategy=``, ``bench=``,
``backbone=``, ``seed=``, ``overrides=``, ...; ``help(ClbenchStrategy)`` lists them), and builds its backbone, input
size, transforms and precision with the CLI's code (:func:`clbench.run.harness.resolve`, then
:func:`clbench.run.harness.load_inputs`). The keywords are derived from RunConfig, not restated: a new RunConfig field
is a new keyword, unless :data:`NOT_APPLICABLE` says why the stream decides it. An unknown keyword is refused with the
valid ones and the closest; ``method=`` and ``settings=``, the earlier names of ``strategy=`` and ``overrides=``, still
work with a DeprecationWarning. It reads each experience's *raw* images (the stream's transform groups removed) and
applies the benchmark transform itself; a stream whose eval transform gives other tensors is refused. Frozen features
are computed once per experience and cached on disk under the CLI's key fields (:func:`clbench.run.harness.feature_key`;
``data`` is the content digest of the experience's raw images).

What a stream must be: class-incremental, with class ids in arrival order (experience 0 holds classes
``0..k0-1``, experience 1 the next ids, ...; ``nc_benchmark(..., class_ids_from_zero_from_first_exp=True)`` or
``class_incremental_benchmark`` over remapped targets), images as PIL images or uint8 arrays before any transform.

During evaluation ``mb_x`` holds the frozen features of the minibatch (the backbone input is never rebuilt when
the features are cached); ``mb_output`` has one column per class id up to the largest seen or evaluated, and
the columns of classes not learnt yet hold -1000 (Avalanche's ``IncrementalClassifier`` mask value). Learning an
experience is one call of the method's ``learn_task`` on cached features, so no training-iteration callbacks fire
and train-phase minibatch/epoch metrics stay empty.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from clbench.benchmarks.base import ImageSource
from clbench.core.config import RunConfig
from clbench.errors import ClbenchError
from clbench.features.cache import FeatureCache
from clbench.methods.answers import checked
from clbench.methods.contract import PER_SAMPLE, Context, Split, Task
from clbench.run.harness import feature_key, load_inputs, resolve

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # The whole of Avalanche, as its users import it: a run's stream (clbench.benchmarks.streams) may have imported
    # only its scenario classes, with avalanche/__init__ deferred (clbench.imports).
    from clbench.imports import complete

    complete("avalanche")
    from avalanche.core import BasePlugin
    from avalanche.training.plugins.evaluation import EvaluationPlugin, default_evaluator
    from avalanche.training.templates import SupervisedTemplate

MASK_VALUE = -1000.0  # logits of classes not learnt yet (Avalanche's IncrementalClassifier masks with -1000)


def _to_pil(x: Any, where: str):
    """A raw dataset item as an RGB PIL image, converted exactly as clbench's own sources do."""
    from PIL import Image

    if isinstance(x, Image.Image):
        return x if x.mode == "RGB" else x.convert("RGB")
    if isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.ndim in (2, 3):
        x = (x.permute(1, 2, 0) if x.ndim == 3 and x.shape[0] in (1, 3) else x).numpy()
    if isinstance(x, np.ndarray) and x.dtype == np.uint8 and (x.ndim == 2 or (x.ndim == 3 and x.shape[2] in (1, 3))):
        x = x[..., 0] if x.ndim == 3 and x.shape[2] == 1 else x
        img = Image.fromarray(np.ascontiguousarray(x))
        return img.convert("RGB") if img.mode != "RGB" else img
    kind = f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}".strip()
    raise ClbenchError(
        f"{where}: an image reaches the strategy as {kind} before any Avalanche transform; clbench applies the "
        "benchmark transform itself and needs PIL images or uint8 arrays",
        "give the underlying dataset no transform of its own (e.g. torchvision.datasets.CIFAR100(root, "
        "transform=None)) and put transforms in the benchmark (eval_transform=strategy.eval_transform), or none",
    )


class ExperienceImages(ImageSource):
    """The raw images of an Avalanche dataset (its current transform group removed), as an :class:`ImageSource`."""

    def __init__(self, dataset: Any, where: str) -> None:
        self.raw = dataset.remove_current_transform_group()
        self.labels = np.asarray([int(t) for t in dataset.targets], dtype=np.int64)
        self.name = where
        self._fp: str | None = None

    def image(self, i: int):
        return _to_pil(self.raw[int(i)][0], self.name)

    def fingerprint(self) -> str:
        """SHA-256 over every image's size, mode and pixels, in order (what the frozen features depend on)."""
        if self._fp is None:
            h = hashlib.sha256()
            for i in range(len(self)):
                img = self.image(i)
                h.update(f"{img.size}{img.mode}".encode())
                h.update(img.tobytes())
            self._fp = h.hexdigest()[:16]
        return self._fp


def dataset_order(dataset: Any) -> np.ndarray:
    """Positions that put an experience's samples in the order of the user's dataset they were drawn from.

    Avalanche's generators group an experience's samples class by class; ``clbench run`` (and the user's dataset)
    keeps them in dataset order, and a method's seeded shuffles depend on that order. The position of each sample
    in its root dataset is read from Avalanche's flat-data index (``_flat_data._get_idx``, private in Avalanche 0.6);
    where the samples do not come from one root dataset, the stream's own order is kept."""
    positions, roots = [], set()
    for i in range(len(dataset)):
        data, j = getattr(dataset, "_flat_data", None), i
        if data is None:
            return np.arange(len(dataset))
        while hasattr(data, "_get_idx") and hasattr(data, "_datasets"):
            k, j = data._get_idx(j)
            data = data._datasets[k]
        roots.add(id(data))
        positions.append(j)
    if len(roots) != 1:
        return np.arange(len(dataset))
    return np.argsort(np.asarray(positions), kind="stable")


class _Logits(nn.Module):
    """``strategy.model``: frozen features (B, d) -> the method's logits (B, n_seen). Holds no parameters itself."""

    def __init__(self, method: Any) -> None:
        super().__init__()
        self.__dict__["method"] = method  # not a submodule: Avalanche's train()/eval() toggles must not reach it

    def forward(self, features: torch.Tensor, split: Split | None = None) -> torch.Tensor:
        return self.method.predict(split, PER_SAMPLE)


# ---------------------------------------------------------------------------------------------- the run settings
# RunConfig fields that ClbenchStrategy does not take, and why: the Avalanche stream and loop decide them. Every other
# RunConfig field is a keyword of ClbenchStrategy, with RunConfig's name, default and check (a new field is a new
# keyword with no edit here). A new field that only `clbench run`'s own loop reads (clbench.run.harness.run, not
# resolve or load_inputs) belongs in this table.
NOT_APPLICABLE: dict[str, str] = {
    "data_root": "the stream brings the images",
    "init_cls": "the stream's experiences are the tasks",
    "increment": "the stream's experiences are the tasks",
    "class_order_seed": "the stream's class order is the order learnt",
    "scenario": "the stream is class-incremental (see the module docstring)",
    "protocol": "Avalanche evaluates per sample here; the batch protocol `reference` is `clbench run`'s only",
    "out": "no run folder is written: Avalanche's loggers record the run",
    "overwrite": "no run folder is written: Avalanche's loggers record the run",
    "ignore_data_problems": "the data checks read a benchmark's files; the stream's images are yours",
}
# Earlier keyword -> the RunConfig field it gives: still accepted, with a DeprecationWarning naming the field.
RENAMED = {"method": "strategy", "settings": "overrides"}
# What a keyword accepts where it is more than RunConfig's type: overrides also as a mapping ({"epochs": 5}).
_ACCEPTS = {"overrides": "Mapping[str, object] | tuple[tuple[str, str], ...]"}


def run_fields() -> list[dataclasses.Field[Any]]:
    """The :class:`RunConfig` fields ClbenchStrategy takes as keywords: all but :data:`NOT_APPLICABLE`, in order."""
    return [f for f in dataclasses.fields(RunConfig) if f.name not in NOT_APPLICABLE]


def _with_run_settings(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` with a signature whose ``**run`` is spelt out as the :func:`run_fields` (name, default, type): what
    ``help()``, IDEs and Avalanche's keyword check (``BaseTemplate.__init_subclass__``) read."""
    sig = inspect.signature(init)
    hints = typing.get_type_hints(RunConfig)
    run = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
            annotation=_ACCEPTS.get(f.name, hints[f.name]),
        )
        for f in run_fields()
    ]
    self_, *own = (p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD)
    init.__signature__ = sig.replace(parameters=[self_, *run, *own])  # type: ignore[attr-defined]
    return init


def run_config(run: Mapping[str, Any], renamed: Mapping[str, Any]) -> RunConfig:
    """The :class:`RunConfig` of a ClbenchStrategy built with the keywords ``run`` (RunConfig fields, as given) and
    ``renamed`` (earlier name -> value, None where not given). Raises ClbenchError."""
    given = dict(run)
    for old, value in renamed.items():
        if value is None:
            continue
        new = RENAMED[old]
        if new in given:
            raise ClbenchError(
                f"ClbenchStrategy got both {old}= and {new}=: {old} is the earlier name of {new}", f"pass {new}= only"
            )
        warnings.warn(
            f"ClbenchStrategy({old}=...) is deprecated: pass {new}=..., the name RunConfig gives the setting",
            DeprecationWarning,
            stacklevel=3,  # the caller of ClbenchStrategy(...)
        )
        given[new] = value
    names = [f.name for f in run_fields()]
    for key in given:
        if key in NOT_APPLICABLE:
            raise ClbenchError(
                f"ClbenchStrategy does not take {key}=, a `clbench run` setting: {NOT_APPLICABLE[key]}",
                f"leave {key}= out",
            )
        if key not in names:
            own = [p for p in inspect.signature(ClbenchStrategy).parameters if p not in {*names, *RENAMED}]
            close = difflib.get_close_matches(key, [*names, *own], n=1)
            raise ClbenchError(
                f"ClbenchStrategy has no setting {key!r}; valid: {', '.join(names)} (RunConfig's, `clbench run`'s "
                f"flags) and {', '.join(own)}",
                f"did you mean {close[0]!r}?" if close else None,
            )
    if isinstance(given.get("overrides"), Mapping):  # {"epochs": 5}: the pairs `--set epochs=5` gives
        given["overrides"] = tuple((str(k), str(v)) for k, v in given["overrides"].items())
    missing = [f.name for f in run_fields() if f.default is dataclasses.MISSING and f.name not in given]
    if missing:
        raise ClbenchError(
            f"ClbenchStrategy needs {', '.join(f'{m}=' for m in missing)}", "e.g. strategy='tosca' (see `clbench list`)"
        )
    return RunConfig(**given)


class ClbenchStrategy(SupervisedTemplate):
    """A registered clbench method (``clbench list``) on a frozen backbone, as an Avalanche strategy.

    Configuration is the CLI's (``clbench run``): the keywords other than Avalanche's are the :class:`RunConfig`
    fields (:func:`run_fields`), with their names, defaults and checks: ``strategy`` names the method, ``bench`` the
    benchmark setting that fixes the default backbone, input size, resize/crop and normalisation; ``backbone``,
    ``weights``, ``img_size``, ``normalize``, ``precision``, ``profile``, ``overrides`` (``--set key=value``, here
    also a dict) and the rest override it as the flags of the same name do, and are validated the same way.
    ``eval_transform``/``train_transform`` are the transforms in force.
    """

    @_with_run_settings
    def __init__(
        self,
        *,
        eval_mb_size: int = 256,
        plugins: Sequence[BasePlugin] | None = None,
        evaluator: EvaluationPlugin | Callable[[], EvaluationPlugin] | None = default_evaluator,
        eval_every: int = -1,
        log: Callable[[str], None] | None = None,
        method: str | None = None,  # deprecated: strategy=
        settings: Mapping[str, Any] | None = None,  # deprecated: overrides=
        **run: Any,  # RunConfig fields (run_fields), checked by run_config and RunConfig
    ) -> None:
        self.config = run_config(run, {"method": method, "settings": settings})
        self.resolved = resolve(self.config)  # names, device and input size decided once, as for `clbench run`
        self.inputs = load_inputs(self.resolved)
        self.spec, self.backbone_name = self.resolved.spec, self.resolved.backbone_name
        self.backbone, self.eval_tf, self.train_tf = self.inputs.backbone, self.inputs.eval_tf, self.inputs.train_tf
        self.precision = self.inputs.precision
        dev = self.resolved.device
        self.eval_transform, self.train_transform = self.eval_tf.build(), self.train_tf.build()
        ctx = Context(
            backbone=self.backbone,
            device=dev,
            precision=self.precision.name,
            seed=self.config.seed,
            log=log or (lambda message: None),
        )
        self.method = self.resolved.strategy_cls(self.resolved.strategy_config, ctx)
        self.cache = FeatureCache(enabled=self.config.feature_cache)
        self.n_seen = 0  # classes learnt so far (arrival-order ids 0..n_seen-1)
        self.tasks_learnt = 0
        self._features: dict[int, tuple[Any, ExperienceImages, torch.Tensor]] = {}  # id(dataset) -> features
        self._warned_train_tf = False
        super().__init__(
            model=_Logits(self.method),
            optimizer=None,
            train_mb_size=self.config.batch_size,
            train_epochs=1,
            eval_mb_size=eval_mb_size,
            device=dev,
            plugins=plugins,
            evaluator=evaluator,
            eval_every=eval_every,
        )

    # ------------------------------------------------------------------------------------------ features
    def _where(self) -> str:
        exp = self.experience
        stream = getattr(getattr(exp, "origin_stream", None), "name", "stream")
        return f"experience {getattr(exp, 'current_experience', '?')} of {stream}"

    def experience_features(self, experience: Any) -> tuple[ExperienceImages, torch.Tensor]:
        """(raw images, frozen features (N, d)) of an experience, from memory, the disk cache, or one backbone pass."""
        dataset = experience.dataset
        hit = self._features.get(id(dataset))
        if hit is not None and hit[0] is dataset:
            return hit[1], hit[2]
        where = self._where()
        if len(dataset) == 0:
            raise ClbenchError(
                f"{where} has no samples",
                "drop empty experiences from the stream, or split the classes so every experience "
                "holds some of their images",
            )
        source = ExperienceImages(dataset, where)
        self._check_transform(dataset, source, where)
        # looked up at call time: tests replace it on its module
        from clbench.features.cache import extract

        key = feature_key(self.resolved, self.inputs, "avalanche-experience", source.fingerprint())
        feats, _ = self.cache.get_or_compute(
            key,
            lambda: extract(
                self.backbone, source, self.eval_transform, self.device, self.precision.name, self.config.batch_size
            ),
        )
        self._features[id(dataset)] = (dataset, source, feats)
        return source, feats

    def _check_transform(self, dataset: Any, source: ExperienceImages, where: str) -> None:
        """The stream's eval transform, if it has one, must give the tensors the cached features were made from."""
        fix = (
            f"build the benchmark with eval_transform=strategy.eval_transform or with no transform (the strategy "
            f"applies {self.eval_tf.identity()} itself), or choose the strategy setting that matches yours "
            f"(bench=, img_size=, normalize=)"
        )
        for i in sorted({0, len(dataset) - 1}):
            given = dataset.eval()[i][0]
            if not isinstance(given, torch.Tensor) or given.dtype == torch.uint8:
                continue  # a raw image: no transform in the eval group
            expected = self.eval_transform(source.image(i))
            if given.shape != expected.shape or not torch.allclose(given.float(), expected, atol=1e-5):
                raise ClbenchError(
                    f"{where}: the stream's eval transform gives {tuple(given.shape)} tensors that differ from the "
                    f"benchmark transform the frozen features are computed and cached with "
                    f"({self.eval_tf.identity()}, {tuple(expected.shape)})",
                    fix,
                )
        if not self._warned_train_tf:
            given = dataset.train()[0][0]
            if isinstance(given, torch.Tensor) and given.dtype != torch.uint8:
                expected = self.eval_transform(source.image(0))
                if given.shape != expected.shape or not torch.allclose(given.float(), expected, atol=1e-5):
                    self._warned_train_tf = True
                    warnings.warn(
                        f"{where}: the stream's train transform is not used: clbench learns from frozen "
                        f"features under strategy.eval_transform and augments, where the method does, with "
                        f"strategy.train_transform ({self.train_tf.identity()}), as `clbench run` does",
                        stacklevel=2,
                    )

    # ------------------------------------------------------------------------------------------ training
    def _train_exp(self, experience: Any, eval_streams=None, **kwargs) -> None:
        source, feats = self.experience_features(experience)
        classes = sorted(int(c) for c in experience.classes_in_this_experience)
        expected = list(range(self.n_seen, self.n_seen + len(classes)))
        if classes != expected:
            shown = classes if len(classes) <= 8 else classes[:8] + ["..."]
            raise ClbenchError(
                f"{self._where()} holds classes {shown}, but after {self.n_seen} learnt classes clbench needs the next "
                f"class ids in arrival order ({self.n_seen}..{self.n_seen + len(classes) - 1}): each experience "
                "brings new classes whose ids follow the ones already seen",
                "build the benchmark with contiguous arrival-order ids, e.g. nc_benchmark(..., "
                "class_ids_from_zero_from_first_exp=True), or remap the targets to their position in the class order",
            )
        order = dataset_order(experience.dataset)  # (N,) the user's dataset order, as `clbench run` learns
        split = Split(
            source,
            order,
            torch.as_tensor(source.labels[order]),
            feats[torch.as_tensor(order)],
            self.eval_transform,
            self.train_transform,
        )
        task = Task(self.tasks_learnt, classes, self.n_seen + len(classes), split)
        self.method.learn_task(task.first_per_class(self.resolved.train_per_class))  # the run's subset, as in a run
        self.n_seen += len(classes)
        self.tasks_learnt += 1

    def make_train_dataloader(self, **kwargs) -> None:
        self.dataloader = []  # learning is one call on cached features (see _train_exp)

    def check_model_and_optimizer(self, **kwargs) -> None:
        pass  # the method builds and steps its own optimisers inside learn_task

    def make_optimizer(self, **kwargs) -> None:
        pass

    def model_adaptation(self, model=None):
        return self.model

    # ------------------------------------------------------------------------------------------ evaluation
    def make_eval_dataloader(self, **kwargs) -> None:
        """Minibatches of (frozen features, targets, positions, task labels) of the experience, in order."""
        source, feats = self.experience_features(self.experience)
        targets = torch.as_tensor(source.labels)
        tasks = (
            torch.as_tensor([int(t) for t in self.adapted_dataset.targets_task_labels])
            if hasattr(self.adapted_dataset, "targets_task_labels")
            else torch.zeros(len(source), dtype=torch.long)
        )
        self._eval_source = source
        self.dataloader = DataLoader(
            TensorDataset(feats, targets, torch.arange(len(source)), tasks), batch_size=self.eval_mb_size, shuffle=False
        )

    def forward(self) -> torch.Tensor:
        feats, y, pos = self.mb_x, self.mb_y, self.mbatch[2]
        width = max(self.n_seen, int(y.max()) + 1 if len(y) else 0)
        out = torch.full((len(y), width), MASK_VALUE, device=self.device)
        if self.n_seen == 0:  # nothing learnt yet: every class alike
            return out.zero_()
        split = Split(
            self._eval_source, pos.cpu().numpy(), y.cpu(), feats.cpu(), self.eval_transform, self.train_transform
        )
        logits = checked(self.config.strategy, "predict", self.model(feats, split), images=len(y), classes=self.n_seen)
        out[:, : self.n_seen] = logits.to(self.device)
        return out


# Avalanche wraps every strategy's __init__ (BaseTemplate.__init_subclass__) to take legacy positional arguments and to
# refuse an unknown keyword with a TypeError that names no valid one. ClbenchStrategy takes keywords only and refuses
# an unknown one itself (run_config: the valid ones and the closest, a ClbenchError like the CLI's). A subclass's
# __init__ is still wrapped; Avalanche's check there reads the signature above.
ClbenchStrategy.__init__ = inspect.unwrap(ClbenchStrategy.__init__)  # type: ignore[method-assign]


def accuracy_rows(results: Sequence[dict[str, Any]], stream: str = "test_stream") -> dict[str, list]:
    """clbench's accuracy matrix and curve (percent) from Avalanche's metrics: ``results[t]`` is what
    ``strategy.eval(test_stream[: t + 1])`` returned after training experience ``t`` (with
    ``accuracy_metrics(experience=True, stream=True)``). ``R[t][j]`` is Avalanche's ``Top1_Acc_Exp`` of test
    experience ``j`` and ``A_t`` its ``Top1_Acc_Stream``, both read by name from Avalanche's metric dict."""
    matrix, curve = [], []
    for t, metrics in enumerate(results):
        row = []
        for j in range(t + 1):
            key = next(
                (
                    k
                    for k in metrics
                    if k.startswith(f"Top1_Acc_Exp/eval_phase/{stream}/") and k.endswith(f"/Exp{j:03d}")
                ),
                None,
            )
            if key is None:
                raise ClbenchError(
                    f"no Top1_Acc_Exp metric for experience {j} of {stream} after experience {t}",
                    "evaluate with accuracy_metrics(experience=True, stream=True) on "
                    "test_stream[: t + 1] after each training experience",
                )
            row.append(100.0 * float(metrics[key]))
        matrix.append(row)
        stream_key = next(k for k in metrics if k.startswith(f"Top1_Acc_Stream/eval_phase/{stream}"))
        curve.append(100.0 * float(metrics[stream_key]))
    return {"accuracy_matrix": matrix, "acc_curve": curve}


def __getattr__(name: str):
    if name == "Learner":
        raise AttributeError(
            "clbench.run.avalanche_api.Learner was replaced by ClbenchStrategy, a real Avalanche "
            "strategy that gives the CLI's numbers (see the README, 'Use a strategy from your own "
            "Avalanche loop')"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
