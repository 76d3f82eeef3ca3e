"""The Avalanche view of a clbench benchmark: the harness's one Avalanche import (the other is
:mod:`clbench.run.avalanche_api`, the strategy Avalanche users drive).

:func:`avalanche_benchmark` turns a :class:`~clbench.benchmarks.base.Benchmark` into an Avalanche
class-incremental benchmark (``train_stream``/``test_stream``, ``classes_in_this_experience``) built with an
explicit class order. Labels are already remapped to arrival order by :func:`build_benchmark`, so the order
passed to Avalanche is ``0..n-1`` (Avalanche's own ``seed=`` would reseed torch's global RNG and give another
order, and it neither remaps labels nor keeps leftover classes: both pitfalls are avoided here).

In the domain scenario (``Benchmark.scenario == "domain"``) the view is Avalanche's dataset-incremental one
(new instances of the same classes): :func:`benchmark_from_datasets` with one train and one test dataset per
domain (the benchmark's images whose ``domains`` index is that domain), decorated by :func:`with_classes_timeline`
so that every experience states its classes as a class-incremental one does (later domains: no new class).

Each sample carries a ``sample_idx`` data attribute, its position in the benchmark split, which the harness
uses to look up cached frozen features. Avalanche users get image payloads with
:func:`avalanche_image_benchmark` and drive a clbench method with :class:`clbench.run.avalanche_api.ClbenchStrategy`.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.utils.data import Dataset

from clbench.benchmarks.base import Benchmark
from clbench.imports import submodule

# Avalanche's scenario classes without ``avalanche/__init__`` (all of Avalanche: its classic catalogue, metrics,
# training) and torchvision's transforms (which Avalanche's dataset utilities import) without ``torchvision.ops``
# and ``torch._dynamo``: clbench.imports; the tasks still come through these Avalanche streams.
submodule("torchvision.transforms", defer=("torchvision",))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    submodule("avalanche.benchmarks.scenarios.supervised", defer=("avalanche", "avalanche.benchmarks"))
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.supervised import class_incremental_benchmark, with_classes_timeline
    from avalanche.benchmarks.utils import DataAttribute
    from avalanche.benchmarks.utils.classification_dataset import ClassificationDataset


class _Payload(Dataset):
    """Items are (payload, arrival label); the payload is the sample index or the transformed image."""

    def __init__(self, labels: np.ndarray, images=None, transform=None) -> None:
        self.labels, self.images, self.transform = labels, images, transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i: int):
        if self.images is None:
            return i, int(self.labels[i])
        img = self.images.image(i)
        return (self.transform(img) if self.transform else img), int(self.labels[i])


def _dataset(labels: np.ndarray, images=None, transform=None) -> ClassificationDataset:
    return ClassificationDataset(
        [_Payload(labels, images, transform)],
        data_attributes=[
            DataAttribute(torch.as_tensor(labels, dtype=torch.long), "targets"),
            DataAttribute(torch.arange(len(labels)), "sample_idx"),
        ],
    )


def _benchmark(bench: Benchmark, train: ClassificationDataset, test: ClassificationDataset):
    if bench.scenario == "domain":  # one experience per domain, every class in each (Avalanche's new instances)
        streams = {}
        for name, data, split in (("train", train, "train"), ("test", test, "test")):
            tasks = bench.image_tasks(split)
            streams[name] = [data.subset(np.flatnonzero(tasks == d)) for d in range(bench.n_tasks)]
        return with_classes_timeline(benchmark_from_datasets(**streams))
    return class_incremental_benchmark(
        {"train": train, "test": test},
        class_order=list(range(bench.n_classes)),
        num_classes_per_exp=list(bench.task_sizes),
    )


def avalanche_benchmark(bench: Benchmark):
    """Avalanche benchmark whose samples are (sample index, label); cheap, used by the harness."""
    return _benchmark(bench, _dataset(bench.train_y), _dataset(bench.test_y))


def avalanche_image_benchmark(bench: Benchmark, train_transform=None, eval_transform=None):
    """Avalanche benchmark whose samples are (image, label), for use in Avalanche training loops."""
    return _benchmark(
        bench,
        _dataset(bench.train_y, bench.train, train_transform),
        _dataset(bench.test_y, bench.test, eval_transform),
    )


def experience_indices(experience) -> np.ndarray:
    """Sorted sample indices held by an Avalanche experience."""
    return np.sort(np.asarray(list(experience.dataset.sample_idx), dtype=np.int64))


def experience_classes(experience) -> list[int]:
    return sorted(int(c) for c in experience.classes_in_this_experience)
