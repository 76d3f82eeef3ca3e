"""Tiny random tasks on the micro ViT, shared by the method tests (L2P/EASE, RanPAC/APER, MOS/DualPrompt):
``backbone`` (a module-scoped random ``vit_micro``), ``one_thread`` (one intra-op thread for a module that asks for
it) and :func:`make_split`, a :class:`~clbench.strategy.Split` of random 32 px images with their frozen features;
for the closed-form heads, which read features only, :func:`gaussian_split` (features drawn around fixed class
centres, no images) and :func:`features_context` (a context whose backbone is just a feature width).
Registered for every test module by ``pytest_plugins`` in conftest.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clbench.backbones import load_backbone
from clbench.benchmarks.base import ArraySource
from clbench.features import extract
from clbench.strategy import Context, Split
from clbench.transforms import TransformSpec


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def backbone():
    return load_backbone("vit_micro", "random", seed=0)


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
