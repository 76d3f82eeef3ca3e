"""Augmented training images are a function of the run seed, the pass and the image, not of the global RNG.

A run's numbers used to depend on whatever else had drawn from torch's global RNG before a training epoch (a
backbone built mid-run, a feature cache that was or was not warm, an evaluation loader): the crops and flips came
from the global state. :class:`clbench.features.cache.SeededOrder` pairs every position with its own augmentation seed.
"""

from __future__ import annotations

import numpy as np
import torch

from clbench.benchmarks.base import ArraySource
from clbench.features.cache import SeededOrder
from clbench.features.transforms import TransformSpec
from clbench.methods.contract import Split

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def _split(n: int = 12) -> Split:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 40, 40, 3), dtype=np.uint8)
    labels = np.arange(n) % 3
    source = ArraySource(images, labels, "augment-seeds")
    eval_tf = TransformSpec(32, None, MEAN, STD).build()
    train_tf = TransformSpec(32, None, MEAN, STD, train=True).build()
    return Split(source, np.arange(n), torch.as_tensor(labels), torch.zeros(n, 4), eval_tf, train_tf)


def _epoch(split: Split, seed: int, disturb: int) -> list[torch.Tensor]:
    torch.manual_seed(disturb)  # a different global state before each pass
    torch.rand(disturb + 1)
    g = torch.Generator().manual_seed(seed)
    return [x for x, _, _ in split.image_loader(4, augment=True, shuffle=True, generator=g)]


def test_augmentations_ignore_the_global_rng() -> None:
    split = _split()
    a, b = _epoch(split, seed=7, disturb=1), _epoch(split, seed=7, disturb=123)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_augmentations_differ_between_passes_and_images() -> None:
    split = _split()
    g = torch.Generator().manual_seed(7)
    loader = split.image_loader(12, augment=True, shuffle=False, generator=g)
    first, second = (next(iter(loader))[0] for _ in range(2))  # two passes of one loader
    assert not torch.equal(first, second)
    seeds = [s for _, s in SeededOrder(12, shuffle=True, generator=torch.Generator().manual_seed(1))]
    assert len(set(seeds)) == 12


def test_loaders_draw_nothing_from_the_global_rng() -> None:
    split = _split()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    for _ in split.image_loader(4, augment=False):
        pass
    for _ in split.image_loader(4, augment=True, shuffle=True, generator=torch.Generator().manual_seed(2)):
        pass
    assert torch.equal(torch.rand(3), expected)
