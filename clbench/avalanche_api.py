"""Drive a clbench strategy from any Avalanche class-incremental stream.

    from clbench.avalanche_api import Learner
    learner = Learner("tosca", backbone="vit_small_patch14_dinov2")   # frozen backbone + strategy
    for exp in benchmark.train_stream:                                 # any Avalanche benchmark
        learner.train(exp)                                             # one task per experience
        acc = learner.accuracy(benchmark.test_stream[: exp.current_experience + 1])

The experiences' images must already be tensors of the backbone's input size (apply the Avalanche
benchmark's transforms; ``Learner.eval_transform`` gives the one clbench would use). Labels may be any class
ids: the learner maps them to arrival order internally and maps predictions back. This module duck-types the
Avalanche objects (``dataset``, ``targets``, ``classes_in_this_experience``) and never imports Avalanche.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clbench.benchmarks.base import ImageSource
from clbench.features import extract
from clbench.harness import make_strategy_config, resolve_device
from clbench.strategy import Context, Split, Task


class _DatasetSource(ImageSource):
    """An Avalanche (or any (x, y, ...)) dataset whose x are image tensors."""

    def __init__(self, dataset: Any, labels: np.ndarray) -> None:
        self.dataset, self.labels = dataset, labels

    def image(self, i: int):
        return self.dataset[i][0]

    def fingerprint(self) -> str:
        return f"dataset-{id(self.dataset)}"


def _identity(x):
    return x


class Learner:
    """A clbench strategy on a frozen backbone, trained one Avalanche experience at a time."""

    def __init__(self, strategy: str, backbone: str = "vit_small_patch14_dinov2", weights: str = "auto",
                 device: str = "auto", precision: str = "auto", seed: int = 1993, batch_size: int = 64,
                 img_size: int | None = None, **settings: Any) -> None:
        from clbench.backbones import load_backbone
        from clbench.catalog import STRATEGIES
        from clbench.transforms import TransformSpec

        cls = STRATEGIES.get(strategy)
        self.device = resolve_device(device)
        self.backbone = load_backbone(backbone, weights, img_size, seed=seed).to(self.device)
        from clbench.precision import for_backbone

        self.precision = for_backbone(self.backbone, self.device, precision)
        self.batch_size = batch_size
        cfg = make_strategy_config(cls, None, tuple((k, str(v)) for k, v in settings.items()))
        self.strategy = cls(cfg, Context(self.backbone, self.device, self.precision.name, seed, log=lambda m: None))
        self.eval_transform = TransformSpec(self.backbone.img_size, None, self.backbone.mean, self.backbone.std).build()
        self.class_ids: list[int] = []  # arrival order of the original class ids
        self._task = 0

    def _split(self, dataset: Any) -> Split:
        targets = np.asarray([int(t) for t in dataset.targets])
        index = {c: i for i, c in enumerate(self.class_ids)}
        labels = np.asarray([index.get(int(t), -1) for t in targets])
        source = _DatasetSource(dataset, labels)
        feats = extract(self.backbone, source, _identity, self.device, self.precision.name, self.batch_size)
        return Split(source, np.arange(len(targets)), torch.as_tensor(labels), feats, _identity, _identity)

    def train(self, experience: Any) -> None:
        new = sorted(int(c) for c in experience.classes_in_this_experience if int(c) not in self.class_ids)
        self.class_ids += new
        split = self._split(experience.dataset)
        first = len(self.class_ids) - len(new)
        self.strategy.learn_task(Task(self._task, list(range(first, len(self.class_ids))), len(self.class_ids), split))
        self._task += 1

    @torch.no_grad()
    def predict(self, dataset: Any) -> np.ndarray:
        """Predicted original class ids for every item of ``dataset``."""
        logits = self.strategy.predict(self._split(dataset))
        return np.asarray(self.class_ids)[logits.argmax(1).numpy()]

    def accuracy(self, experiences: Any) -> float:
        """Top-1 accuracy (%) over the given test experiences (a stream slice or a list)."""
        correct = total = 0
        for exp in experiences:
            pred = self.predict(exp.dataset)
            y = np.asarray([int(t) for t in exp.dataset.targets])
            correct += int((pred == y).sum())
            total += len(y)
        return 100.0 * correct / max(total, 1)
