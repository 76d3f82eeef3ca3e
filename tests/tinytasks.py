"""Tiny random tasks on the micro ViT, shared by the method tests (L2P/EASE, RanPAC/APER, MOS/DualPrompt):
``backbone`` (a module-scoped random ``vit_micro``), ``one_thread`` (one intra-op thread for a module that asks for
it) and :func:`make_split`, a :class:`~clbench.strategy.Split` of random 32 px images with their frozen features.
Registered for every test module by ``pytest_plugins`` in conftest.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clbench.backbones import load_backbone
from clbench.benchmarks.base import ArraySource
from clbench.features import extract
from clbench.strategy import Split
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
