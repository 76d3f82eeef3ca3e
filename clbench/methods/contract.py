"""The whole method contract: what a strategy gets per task and what it must return.

A strategy is built once per run with its frozen config dataclass and a :class:`Context` (the frozen
backbone, device, precision, seed). The harness then calls, for each task ``t`` of the stream:

1. ``learn_task(task)``: ``task.train`` is a :class:`Split` of the task's training images, with their cached
   frozen features and labels in arrival order (``task.classes`` are new; ``task.n_seen`` classes in all). Where the
   run sets ``train_per_class`` (a run setting, :class:`clbench.core.config.RunConfig`), the harness has already cut
   ``task.train`` to the first k images of each class (:meth:`Task.first_per_class`).
2. ``predict(split, protocol)``: logits (N, n_seen) for every image of ``split``. Under the default
   ``per-sample`` protocol a row may depend only on its own image (the harness tests this); a strategy may
   also offer a ``reference`` protocol that reproduces a reference implementation's batch behaviour.
3. ``param_counts()``: learned parameters added, statistics stored and parameters trained (:class:`ParamCounts`).

Strategies never see test labels, never reseed global RNGs (use ``ctx.generator()``), and must leave the
backbone untouched (bit-identical after a run; the contract tests check it). A method that fine-tunes the ViT
(:attr:`Strategy.fine_tunes_backbone`) trains its own copy of it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar, overload

import numpy as np
import torch
from torch.utils.data import DataLoader

from clbench.benchmarks.base import ImageSource
from clbench.core.catalog import STRATEGIES
from clbench.core.costs import ParamCounts as ParamCounts  # re-exported: methods import them from here
from clbench.core.costs import RunShape as RunShape
from clbench.core.costs import Work as Work
from clbench.core.precision import autocast
from clbench.errors import ClbenchError
from clbench.features.backbones import FrozenBackbone
from clbench.features.cache import SeededOrder, TransformedImages
from clbench.files.safestate import ContextRef, SavedState, StateError, allowed, decode, encode
from clbench.methods.shared import CosineHead, first_per_class

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from PIL.Image import Image

    from clbench.core.catalog import MethodCard

# A strategy's settings: a (frozen) dataclass instance, its class the strategy's ``Config``. ``Strategy[MyConfig]``
# types ``self.cfg`` and :meth:`Strategy.param_formula` with it; a subclass that names no parameter
# (``class M(Strategy)``) leaves it unchecked.
ConfigT = TypeVar("ConfigT", bound="DataclassInstance")
Transform = Callable[["Image"], torch.Tensor]  # an RGB PIL image to the network's input tensor (C, H, W)

# The layers of clbench.methods.shared that any strategy's state may hold (see Strategy.state_types for a method's own).
BLOCK_TYPES: tuple[type, ...] = (CosineHead,)

PER_SAMPLE = "per-sample"
REFERENCE = "reference"


@dataclass
class Split:
    """Images of one benchmark split chosen by index, in a fixed order, with frozen features and labels."""

    source: ImageSource
    indices: np.ndarray  # (N,) positions in ``source``
    labels: torch.Tensor  # (N,) long, arrival-order labels
    features: torch.Tensor  # (N, d) float32 frozen [CLS] features (eval transform)
    eval_transform: Transform
    train_transform: Transform

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def subset(self, positions: Sequence[int] | np.ndarray | torch.Tensor) -> Split:
        pos = torch.as_tensor(np.asarray(positions), dtype=torch.long)
        return Split(
            self.source,
            self.indices[pos.numpy()],
            self.labels[pos],
            self.features[pos],
            self.eval_transform,
            self.train_transform,
        )

    def image_loader(
        self, batch_size: int, augment: bool, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> DataLoader[tuple[torch.Tensor, int]]:
        """Batches of (images, labels, positions) through the train (``augment``) or eval transform."""
        ds = TransformedImages(self.source, self.train_transform if augment else self.eval_transform, self.indices)
        labels = self.labels

        def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = torch.stack([a for a, _ in items])
            pos = torch.tensor([k for _, k in items])
            return x, labels[pos], pos

        if not augment:  # the loader's own generator: iterating draws nothing from the global RNG either
            own = generator if generator is not None else torch.Generator()
            return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=own, collate_fn=collate)
        order = SeededOrder(len(ds), shuffle, generator)  # per-image augmentation seeds (see SeededOrder)
        return DataLoader(ds, batch_size=batch_size, sampler=order, generator=torch.Generator(), collate_fn=collate)


@dataclass(frozen=True)
class Task:
    id: int
    classes: list[int]  # new classes of this task (arrival-order labels)
    n_seen: int  # classes seen after this task
    train: Split

    def first_per_class(self, k: int | None) -> Task:
        """This task learning from the first ``k`` training images of each class only (itself when ``k`` is None): the
        fixed, seed-independent subset of the run's ``train_per_class`` (:func:`clbench.methods.shared.first_per_class`;
        :attr:`RunShape.learnt` is its cost). The harness applies it before ``learn_task``."""
        if k is None:
            return self
        return dataclasses.replace(self, train=self.train.subset(first_per_class(self.train.labels, k)))


@dataclass
class Context:
    backbone: FrozenBackbone
    device: torch.device
    precision: str  # fp32 | bf16 | fp16: the backbone's precision (clbench.core.precision), resolved by the harness
    seed: int
    log: Callable[[str], None] = print
    progress: Callable[[str, int], Callable[[int], None]] | None = None  # (description, total) -> advance(n)

    def autocast(self) -> AbstractContextManager[object]:
        """Autocast context for passes through the frozen backbone at the run's precision (fp32: none)."""
        return autocast(self.precision, self.device.type)

    def seed_for(self, salt: int = 0) -> int:
        """A reproducible seed derived from the run seed and a purpose-specific salt."""
        return (self.seed * 1_000_003 + salt) % (2**63)

    def generator(self, salt: int = 0) -> torch.Generator:
        """A private RNG for shuffling/initialisation: reproducible, never the global one."""
        return torch.Generator().manual_seed(self.seed_for(salt))


class Strategy(ABC, Generic[ConfigT]):
    """Base class of every method. Subclasses implement the three methods and take ``name``, ``Config``,
    ``profiles`` and ``card`` from their method card, whose decorator the class wears (``@CARD.strategy``); a
    plug-in without a card sets ``name`` and ``Config`` (and ``profiles``) itself."""

    name: ClassVar[str]
    Config: ClassVar[type[DataclassInstance]]  # = ConfigT (a class variable cannot name the type parameter)
    protocols: ClassVar[tuple[str, ...]] = (PER_SAMPLE,)
    # named config overrides, e.g. a CPU "quick" profile: setting -> value, of whatever type the Config field has (Any)
    profiles: ClassVar[dict[str, dict[str, Any]]] = {}
    # the method's card (torch-free: baselines/cards/NAME.py, tosca/card.py), set by its decorator: its one
    # declaration, where its parameter formula (:meth:`param_formula` reads it), cost model and tool data are stated
    card: ClassVar[MethodCard | None] = None
    needs_vit: ClassVar[bool] = False  # methods that enter the transformer's layers
    # methods that fine-tune the ViT's own weights. Such a method trains a copy of ``ctx.backbone.model`` that
    # it keeps (one per run, never one per task) and leaves the frozen backbone bit-identical like every method; the
    # cached frozen features (``Split.features``) are not its features once it has trained; its trained and added
    # parameters include the whole ViT, so its :meth:`param_formula` takes the ViT's count as ``backbone_params``
    # (width and depth do not fix it), and :meth:`adapted_features` gives its tuned features.
    fine_tunes_backbone: ClassVar[bool] = False
    # the scenarios (clbench.core.config.SCENARIO_CHOICES) the method is defined for; "domain": a later task brings the
    # classes of earlier ones again, in a new domain (``task.classes`` then names classes already seen)
    scenarios: ClassVar[tuple[str, ...]] = ("class",)
    # classes (besides tensors, plain data, torch's layers and BLOCK_TYPES) whose instances the strategy's state holds;
    # a checkpoint rebuilds these and no others (:meth:`restore_state`)
    state_types: ClassVar[tuple[type, ...]] = ()

    def __init__(self, config: ConfigT, ctx: Context) -> None:
        self.cfg = config
        self.ctx = ctx
        # per task: optimizer steps of the task's training through the ViT (0: none), see :meth:`note_steps`
        self.optimizer_steps: list[int] = []

    def note_steps(self, steps: int) -> None:
        """Record this task's training budget: the optimizer steps its training through the ViT made (0 for a
        task that trains nothing there). Called once per task by methods that train; the harness writes the list
        into the record (``params.extra["optimizer_steps_per_task"]``), where the report's budget curves read it."""
        self.optimizer_steps.append(int(steps))

    @abstractmethod
    def learn_task(self, task: Task) -> None: ...

    @abstractmethod
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        """Logits (N, n_seen) on the CPU, float32."""

    @abstractmethod
    def param_counts(self) -> ParamCounts: ...

    def predict_given_task(self, split: Split, tasks: np.ndarray, protocol: str = PER_SAMPLE) -> torch.Tensor | None:
        """Domain scenario, a diagnostic: logits (N, n_seen) when each image's task (its domain, ``tasks``) is given,
        for a method with a module per task (the task's module predicts). None (the default): the method has no
        per-task part, and its task-aware prediction is its task-agnostic one. Never used for the run's accuracy."""
        return None

    @classmethod
    def param_formula(
        cls, cfg: ConfigT, d: int, depth: int, task_sizes: tuple[int, ...], **kw: Any
    ) -> ParamCounts:  # kw: a method's own facts of the ViT (SLCA: backbone_params)
        """:meth:`param_counts` of a finished run, from the config alone: a ViT of width ``d`` and ``depth``
        blocks, tasks of ``task_sizes`` classes (``added_per_task``, ``trainable_per_task`` and ``head``; the
        tests compare it with a real run): its card's ``param_formula``. Read by ``clbench perf params``."""
        if cls.card is None or cls.card.param_formula is None:
            raise NotImplementedError(f"strategy {cls.name} states no parameter formula (its card's `param_formula`)")
        return cls.card.param_formula(cfg, d, depth, task_sizes, **kw)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """Optional per-evaluation diagnostics (e.g. routing accuracy) stored in the record: a free JSON object."""
        return {}

    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """What the method's classifier scores for each image of ``split`` (N, width), where that is not the frozen
        features: kept for the report's t-SNE figure (:mod:`clbench.features.embeddings`; the card's ``embedding``
        names it). Per-sample, like :meth:`predict`. None: the classifier scores the frozen features."""
        return None

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:  # Any: the attributes are whatever the method keeps
        """Everything the strategy has learnt, for a checkpoint (:mod:`clbench.run.checkpoint`): every attribute except
        ``cfg`` and ``ctx`` (modules, heads, tensors, lists, objects of :attr:`state_types`). An attribute that is the
        context's frozen backbone (or its timm model) is a :class:`~clbench.files.safestate.ContextRef` to
        it, never a copy."""
        shared = _context_objects(self.ctx)
        return {
            name: ContextRef(shared[id(value)]) if id(value) in shared else value
            for name, value in vars(self).items()
            if name not in ("cfg", "ctx")
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:  # Any: as state_dict
        """Set back the attributes saved by :meth:`state_dict` (on a strategy built with the same config)."""
        for name, value in state.items():
            if isinstance(value, ContextRef):
                value = _context_objects(self.ctx, by_name=True)[value.name]
            setattr(self, name, value)

    @classmethod
    def saved_types(cls) -> dict[str, type]:
        """The classes a saved state of this strategy may hold, by qualified name: torch's containers and layers
        (:data:`clbench.files.safestate.TORCH_TYPES`), clbench's shared blocks (:data:`BLOCK_TYPES`) and
        :attr:`state_types`. Reading a checkpoint rebuilds these only."""
        return allowed((*BLOCK_TYPES, *cls.state_types))

    def save_state(self) -> SavedState:
        """:meth:`state_dict` as JSON and named tensors (:mod:`clbench.files.safestate`): no pickle, no code. Raises
        TypeError naming an attribute that cannot be saved (an object of a class missing from :attr:`state_types`,
        a function, an open file)."""
        try:
            return encode(self.state_dict(), self.saved_types(), _context_objects(self.ctx), prefix="strategy.")
        except TypeError as e:
            raise TypeError(f"{self.name}: {e}") from None

    def restore_state(self, saved: SavedState) -> None:
        """Load a state written by :meth:`save_state`, rebuilding only classes of :meth:`saved_types` (nothing named
        by the file is imported) and referring to this run's frozen backbone. Raises
        :class:`~clbench.files.safestate.StateError` for a state that is not this strategy's."""
        state = decode(saved, self.saved_types(), _context_objects(self.ctx, by_name=True), self.ctx.device)
        if type(state) is not dict:
            raise StateError(f"a {self.name} state is a dict of attributes, not a {type(state).__name__}")
        mine = vars(self)
        for name in state:  # attributes only: never cfg, ctx, or what the class defines (methods, name, Config)
            if name in ("cfg", "ctx") or (name not in mine and (name.startswith("__") or hasattr(type(self), name))):
                raise StateError(f"{name!r} is not a {self.name} attribute that a state can set")
        self.load_state_dict(state)


_ContextRef = ContextRef  # its name in the old pickled checkpoints (read only by --trust-checkpoint)


@overload
def _context_objects(ctx: Context, by_name: Literal[False] = False) -> dict[int, str]: ...
@overload
def _context_objects(ctx: Context, by_name: Literal[True]) -> dict[str, object]: ...
def _context_objects(ctx: Context, by_name: bool = False) -> dict[int, str] | dict[str, object]:
    """The run's own objects a state refers to instead of copying: the frozen backbone, its timm model and every
    sub-module of it (a strategy may keep the ViT's blocks). ``{id: name}``, or ``{name: object}`` with
    ``by_name``. A backbone built on first use (:class:`clbench.features.backbones.LazyBackbone`) and not built yet has
    no sub-module a saved state can refer to, so saving leaves it unbuilt; restoring (``by_name``) builds it."""
    objects: dict[str, object] = {"backbone": ctx.backbone}
    unbuilt = not by_name and not getattr(ctx.backbone, "built", True)
    model = None if unbuilt else getattr(ctx.backbone, "model", None)
    if isinstance(model, torch.nn.Module):
        objects["backbone.model"] = model
        for name, module in model.named_modules():
            if name:
                objects[f"backbone.model.{name}"] = module
        for name, param in model.named_parameters():
            objects[f"backbone.model.{name}"] = param
    return objects if by_name else {id(obj): name for name, obj in objects.items() if obj is not None}


def strategy_class(name: str) -> type[Strategy[Any]]:
    """The strategy class registered as ``name`` (:data:`clbench.core.catalog.STRATEGIES`; importing its module on
    first use). ClbenchError for a name not registered, and for a plug-in whose target is not a Strategy subclass."""
    cls = STRATEGIES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ClbenchError(
            f"strategy {name!r} is registered as {cls!r}, which is not a subclass of clbench.methods.contract.Strategy",
            "point the plug-in's registration (CLBENCH_PLUGINS or the clbench.strategies entry point) at its Strategy "
            "subclass",
        )
    return cls
