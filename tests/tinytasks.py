"""Tiny random tasks on the micro ViT, shared by the method tests (L2P/EASE, RanPAC/APER, MOS/DualPrompt, ...):
``backbone`` (a module-scoped random ``vit_micro``), ``one_thread`` (one intra-op thread for a module that asks for
it), ``tasks`` and ``test_split`` (two tiny tasks and the test images of their classes; a module picks the classes
with ``TASK_CLASSES``), :func:`ctx_for` (a quiet CPU context) and :func:`make_split`, a
:class:`~clbench.methods.contract.Split` of random 32 px images with their frozen features; for the closed-form heads,
which
read features only, :func:`gaussian_split` (features drawn around fixed class centres, no images) and
:func:`features_context` (a context whose backbone is just a feature width). :func:`micro_harness_run` and
:func:`check_param_formula_after_a_real_run` run a method through the harness on the micro ViT; the ``check_*``
functions and :class:`PassCounter` hold checks that two sibling methods' tests make alike.
Registered for every test module by ``pytest_plugins`` in conftest.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from clbench.benchmarks.base import ArraySource
from clbench.features.backbones import load_backbone
from clbench.features.cache import extract
from clbench.features.transforms import TransformSpec
from clbench.methods.contract import Context, ParamCounts, Split, Task

if TYPE_CHECKING:
    from clbench.records.schema import RunRecord


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def backbone():
    return load_backbone("vit_micro", "random", seed=0)


# The classes of the two ``tasks`` a test module gets unless it sets its own ``TASK_CLASSES``: unequal task sizes, for
# the parameter formulas that depend on them.
TASK_CLASSES = ([0, 1], [2, 3, 4])


@pytest.fixture(scope="module")
def tasks(request, backbone) -> list[Task]:
    """Two tasks of 6 random images per class, their classes the test module's ``TASK_CLASSES``."""
    first, second = getattr(request.module, "TASK_CLASSES", TASK_CLASSES)
    return [
        Task(0, list(first), len(first), make_split(backbone, first, 6, seed=1)),
        Task(1, list(second), len(first) + len(second), make_split(backbone, second, 6, seed=2)),
    ]


@pytest.fixture(scope="module")
def test_split(request, backbone) -> Split:
    """3 random test images of each class the two ``tasks`` learn."""
    first, second = getattr(request.module, "TASK_CLASSES", TASK_CLASSES)
    return make_split(backbone, [*first, *second], 3, seed=3)


def ctx_for(backbone, seed: int = 7) -> Context:
    """A context on ``backbone`` on the CPU in fp32 that logs nothing."""
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=seed, log=lambda s: None)


def make_split(backbone, classes: list[int], n_per_class: int, seed: int) -> Split:
    """``n_per_class`` random images of each of ``classes`` (labels in that order), features from ``backbone``."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.asarray(classes), n_per_class)
    images = rng.integers(0, 256, size=(len(labels), 32, 32, 3), dtype=np.uint8)
    source = ArraySource(images, labels, f"tiny-{seed}")
    eval_tf = TransformSpec(32, None, backbone.mean, backbone.std).build()
    train_tf = TransformSpec(32, None, backbone.mean, backbone.std, train=True).build()
    feats = extract(backbone, source, eval_tf, torch.device("cpu"), precision="fp32", batch_size=64)
    return Split(source, np.arange(len(labels)), torch.as_tensor(labels), feats, eval_tf, train_tf)


class FeatureWidth:
    """A stand-in backbone for strategies that read only ``split.features``: its width and nothing else."""

    def __init__(self, d: int) -> None:
        self.num_features = d


def features_context(d: int = 64, seed: int = 3) -> Context:
    return Context(
        backbone=FeatureWidth(d), device=torch.device("cpu"), precision="fp32", seed=seed, log=lambda s: None
    )


def gaussian_split(
    classes: list[int], n: int, seed: int, d: int = 64, noise: float = 1.0, interleave: bool = False
) -> Split:
    """``n`` features of each of ``classes`` around fixed class centres (the same centres for every seed) plus
    ``noise`` times N(0, 1); grouped by class, or in a seeded interleaved arrival order. No images."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([c for c in classes for _ in range(n)])
    if interleave:
        y = y[torch.randperm(len(y), generator=g)]
    centres = torch.randn(max(classes) + 1, d, generator=torch.Generator().manual_seed(0))
    z = centres[y] + noise * torch.randn(len(y), d, generator=g)
    return Split(None, np.arange(len(y)), y, z.float(), None, None)


def micro_harness_run(tmp_path, method: str, protocol: str) -> RunRecord:
    """``method`` through the harness on the micro ViT: the emoji benchmark in two tasks of 18 classes, one epoch,
    batches of 64, on the CPU in fp32, evaluated under ``protocol``; checked complete with both tasks."""
    from clbench.run.harness import RunConfig, run

    record = run(
        RunConfig(
            strategy=method,
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            out=str(tmp_path / method),
            init_cls=18,
            increment=18,
            device="cpu",
            precision="fp32",
            protocol=protocol,
            overrides=(("epochs", "1"), ("batch_size", "64"), ("eval_batch_size", "64")),
        )
    )
    assert record.complete and record.task_sizes == [18, 18]
    return record


def check_param_formula_after_a_real_run(tmp_path, strategy: str, overrides: tuple[tuple[str, str], ...]) -> None:
    """``strategy``'s ``param_formula`` (its config alone) equals the parameters a real run on the micro ViT counts
    (d = 64, 4 blocks; the emoji benchmark in tasks of 12, 6, 6, 6, 6 classes; one epoch plus ``overrides``)."""
    from clbench.core.catalog import STRATEGIES
    from clbench.run.harness import RunConfig, make_strategy_config, run

    record = run(
        RunConfig(
            strategy=strategy,
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            init_cls=12,
            increment=6,
            overrides=(("epochs", "1"), *overrides),
            train_per_class=4,  # the counts depend on the classes, not on the images
            precision="fp32",
            out=str(tmp_path / strategy),
        )
    )
    cls = STRATEGIES.get(strategy)
    cfg = make_strategy_config(cls, None, (("epochs", "1"), *overrides))
    want = cls.param_formula(cfg, 64, 4, tuple(record.task_sizes))
    params = record.params
    assert params.added_per_task == want.added_per_task
    assert params.trainable_per_task == want.trainable_per_task
    assert params.head == want.head
    assert {k: params.extra[k] for k in want.extra} == want.extra
    assert record.task_sizes == [12, 6, 6, 6, 6]


class PassCounter:
    """Counts images entering the ViT (a forward hook on the patch embedding), split by grad mode."""

    def __init__(self, model) -> None:
        self.grad = self.nograd = 0
        self.handle = model.patch_embed.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        if torch.is_grad_enabled():
            self.grad += inputs[0].shape[0]
        else:
            self.nograd += inputs[0].shape[0]

    def reset(self) -> None:
        self.grad = self.nograd = 0

    def close(self) -> None:
        self.handle.remove()


def check_one_adapted_pass_per_image(s, backbone, tasks: list[Task], test_split: Split) -> None:
    """``s``, an untrained APER-style strategy on ``backbone`` (adapters trained on task 0 only, one epoch), learns
    ``tasks`` and predicts ``test_split``: every image passes the adapted ViT once, however often it is asked for."""
    count = PassCounter(backbone.model)
    try:
        s.learn_task(tasks[0])
        assert all(float(a.up_weight.abs().sum()) > 0 for a in s.adapters)  # every block's adapter was trained
        assert not any(p.requires_grad for p in s.adapters.parameters())  # and frozen afterwards
        assert count.grad == len(tasks[0].train) * 1  # 1 epoch of training passes
        assert count.nograd == len(tasks[0].train)  # then one eval-transform pass per task-0 image
        count.reset()
        s.predict(test_split)
        s.predict(test_split)
        s.predict(test_split.subset([5, 0, 7]))
        assert (count.grad, count.nograd) == (0, len(test_split))  # each test image once, however often asked
        count.reset()
        s.learn_task(tasks[1])
        s.predict(test_split)
        assert count.grad == 0  # no training after task 0
        assert count.nograd == len(tasks[1].train)  # only the new training images, once each
    finally:
        count.close()
    assert s.store.passes == len(tasks[0].train) + len(test_split) + len(tasks[1].train)


def check_per_sample_predictions_ignore_order_and_batch_size(strategy, test_split: Split, n_classes: int) -> None:
    """A trained strategy's per-sample logits (over ``n_classes``) for an image are the same in another order, with
    other neighbours, in batches of one or of all ``test_split``, and on a second call."""
    from dataclasses import replace

    from clbench.methods.contract import PER_SAMPLE

    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), n_classes) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3, 5, 14, 2]  # another order and other neighbours in every batch
    part = strategy.predict(test_split.subset(rows), PER_SAMPLE)
    cfg = strategy.cfg
    try:
        strategy.cfg = replace(cfg, eval_batch_size=1)
        single = strategy.predict(test_split.subset(rows), PER_SAMPLE)
        strategy.cfg = replace(cfg, eval_batch_size=100)
        whole = strategy.predict(test_split, PER_SAMPLE)
    finally:
        strategy.cfg = cfg
    for got in (part, single, whole[rows]):
        assert torch.allclose(got, full[rows], atol=1e-5, rtol=1e-5)
        assert torch.equal(got.argmax(1), full[rows].argmax(1))
    assert torch.equal(strategy.predict(test_split, PER_SAMPLE), full)  # nothing changed across calls


def check_param_formula_equals_the_counts(strategy, backbone, tasks: list[Task]) -> ParamCounts:
    """``strategy``, trained on ``tasks`` over ``backbone``: its ``param_formula`` (config alone) gives the added,
    trainable and head counts that ``param_counts()`` reads off the trained modules; the counts are returned."""
    d, depth = backbone.num_features, len(backbone.model.blocks)
    formula = type(strategy).param_formula(strategy.cfg, d, depth, [len(t.classes) for t in tasks])
    counts = strategy.param_counts()
    assert formula.added_per_task == counts.added_per_task
    assert formula.trainable_per_task == counts.trainable_per_task
    assert formula.head == counts.head
    return counts
