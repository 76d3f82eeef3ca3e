"""What a method costs, read without torch: its parameter counts (:class:`ParamCounts`, one rule for every method), the
size of a run (:class:`RunShape`) and the work a run does (:class:`Work`), and the sizes of parts several methods share.
Each method's card (``baselines/cards/NAME.py``, ``tosca/card.py``) states its parameter formula and cost model with
these (:class:`clbench.core.catalog.MethodCard`); the strategy class counts its live parameters with the same types."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParamCounts:
    """Parameter accounting, recorded in ``result.json``; one rule for every method, three separate counts.

    ``added_per_task[t]``: learned parameters kept after task t because of it, beyond the frozen backbone:
    modules, prompts, prompt keys, adapters, and head rows (trained, or solved in closed form as RanPAC's ridge
    head). ``stored_per_task[t]``: numbers kept because of task t that no optimiser or solver learns: prototypes,
    class means, covariances, Gram matrices and sums, fixed random projections. ``trainable_per_task[t]``:
    parameters the optimiser updated during task t, whether kept or not (a task-local head thrown away after the
    task counts here only). ``head``: the size of the final classifier, whichever of the two it counts in.
    """

    added_per_task: list[int] = field(default_factory=list)
    trainable_per_task: list[int] = field(default_factory=list)
    head: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # the method's own counts, written to JSON as they are (Any)
    stored_per_task: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.stored_per_task:
            self.stored_per_task = [0] * len(self.added_per_task)
        if len(self.stored_per_task) != len(self.added_per_task):
            raise ValueError(
                f"stored_per_task has {len(self.stored_per_task)} tasks, added_per_task {len(self.added_per_task)}"
            )


@dataclass(frozen=True)
class RunShape:
    """The size of one run, for cost models (a method card's ``work``)."""

    train_per_task: tuple[float, ...]  # training images of task t
    test_seen: tuple[float, ...]  # test images evaluated after task t (every seen class)
    tokens: int = 197  # tokens per image through the backbone at its input size, [CLS] included (ViT-B/16 @ 224)
    protocols: int = 1  # evaluation protocols run; each predicts the test set again
    classes_per_task: tuple[int, ...] = ()  # new classes of task t, where known (a recorded run's split)
    train_per_class: int | None = None  # the run's train_per_class: tasks learn from the first k images per class

    @property
    def tasks(self) -> int:
        return len(self.train_per_task)

    @property
    def learnt(self) -> tuple[float, ...]:
        """Training images each task learns from: all of ``train_per_task``, or where the run sets
        ``train_per_class`` = k, at most k x the task's classes (unchanged where the classes per task are not
        known). The frozen features of every training image are still computed (``train_per_task``)."""
        k = self.train_per_class
        if k is None or not self.classes_per_task:
            return self.train_per_task
        return tuple(min(n, k * c) for n, c in zip(self.train_per_task, self.classes_per_task, strict=True))

    @classmethod
    def equal(cls, n_train: float, n_test: float, tasks: int, **kw: Any) -> RunShape:  # kw: RunShape's other fields
        """``tasks`` equal tasks over ``n_train`` / ``n_test`` images."""
        return cls(tuple([n_train / tasks] * tasks), tuple(n_test * (t + 1) / tasks for t in range(tasks)), **kw)


@dataclass(frozen=True)
class Work:
    """What one run costs, in units whose seconds per unit ``clbench perf`` measures on a device.

    ``f`` and ``b`` are timed generically (a frozen forward pass; a forward + backward pass through the ViT to
    input-side parameters). Method-specific units go in ``extra``; the method times them itself (its card's
    ``unit_seconds``: :class:`clbench.core.catalog.MethodCard`).
    """

    f: float = 0.0  # frozen forward passes through the backbone, in images
    b: float = 0.0  # training passes (forward + backward through the ViT), in images
    f_cacheable: float = 0.0  # the part of ``f`` that clbench's feature cache shares across seeds and strategies
    extra: Mapping[str, float] = field(default_factory=dict)  # unit name -> count

    @classmethod
    def cached_features(cls, shape: RunShape) -> Work:
        """The work of a method that trains nothing through the ViT and reads only the frozen features: every
        training image and the final test set once through the frozen backbone (eval transform), all of it served
        by clbench's feature cache, which shares it across seeds and strategies."""
        f = sum(shape.train_per_task) + max(shape.test_seen, default=0)
        return cls(f=f, f_cacheable=f)


def prefix_prompt_work(epochs: int, query: str, shape: RunShape) -> Work:
    """The work of a method that prefixes prompts to the ViT's blocks and chooses them by a frozen query (DualPrompt,
    CODA-Prompt): the frozen features of every image (the queries; cacheable), one query pass per learnt image and
    epoch with ``query="augmented"`` (the augmented image changes every epoch, so it cannot be cached), ``epochs``
    prompted training passes per learnt image (``RunShape.learnt``), and one prompted pass per seen test image,
    evaluation and protocol. Prefixes add no tokens: a prompted pass costs a plain one."""
    n_train, n_test = sum(shape.train_per_task), shape.test_seen[-1]
    n_learn = sum(shape.learnt)
    cached = n_train + n_test
    augmented = epochs * n_learn if query == "augmented" else 0.0
    return Work(f=cached + augmented + shape.protocols * sum(shape.test_seen), b=epochs * n_learn, f_cacheable=cached)


def tuned_vit_work(shape: RunShape, passes_per_learnt: float, trained_epochs: float) -> Work:
    """The work of a method that fine-tunes a copy of the whole ViT (SLCA, CoFiMA, DUCT): the harness's frozen
    features of every training image and the final test set (cacheable); ``passes_per_learnt`` tuned passes per
    learnt image (``RunShape.learnt``: statistics, retraining), one tuned pass per seen test image, evaluation and
    protocol, and one over the final test set (:meth:`adapted_features`), none cacheable (the ViT changes); and
    ``trained_epochs`` training passes per learnt image (``b``)."""
    learnt = shape.learnt
    cached = sum(shape.train_per_task) + max(shape.test_seen, default=0)
    tuned = passes_per_learnt * sum(learnt) + shape.protocols * sum(shape.test_seen) + max(shape.test_seen, default=0)
    return Work(f=cached + tuned, b=trained_epochs * sum(learnt), f_cacheable=cached)


def whole_vit_formula(counts: Callable[..., ParamCounts]) -> Callable[..., ParamCounts]:
    """The parameter formula of a method that fine-tunes the whole ViT, from its ``counts(cfg, d, vit, sizes)``:
    ``param_formula(cfg, d, depth, task_sizes, backbone_params=None)``, where ``backbone_params`` is the ViT's own
    parameter count (a fine-tuning method's trained parameters include it, and width and depth do not fix it: patch
    size, input size, LayerScale); where not given, a plain timm ViT with 16 px patches at 224 px
    (:func:`plain_vit_params`: 85,798,656 for ViT-B/16)."""

    def param_formula(
        cfg: Any, d: int, depth: int, task_sizes: Sequence[int], backbone_params: int | None = None
    ) -> ParamCounts:
        vit = plain_vit_params(d, depth) if backbone_params is None else backbone_params
        return counts(cfg, d, vit, task_sizes)

    param_formula.__doc__ = whole_vit_formula.__doc__
    return param_formula


# ------------------------------------------------------------------------------------- sizes of shared parts
def adapter_set_size(n_blocks: int, dim: int, bottleneck: int) -> int:
    """One adapter per block (:class:`clbench.layers.adapters.AdapterSet`): n_blocks * (2 d r + r + d): W_down,
    b_down, W_up, b_up in every block."""
    return n_blocks * (2 * dim * bottleneck + bottleneck + dim)


def lora_task_size(depth: int, dim: int, rank: int) -> int:
    """Numbers of one task's LoRA branches (:mod:`clbench.layers.lora`): 2 (key, value) x depth x (A: r d + B: d r)."""
    return 2 * depth * 2 * dim * rank


def plain_vit_params(d: int, depth: int, patch: int = 16, img_size: int = 224) -> int:
    """Parameters of a timm ViT without its classifier: patch embedding, [CLS] token, position table, ``depth``
    pre-norm blocks (MLP ratio 4, qkv bias, no LayerScale) and the final norm."""
    tokens = (img_size // patch) ** 2 + 1
    block = 12 * d * d + 13 * d
    return 3 * patch * patch * d + d + d + tokens * d + depth * block + 2 * d
