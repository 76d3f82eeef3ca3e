"""The validation split (``--validation FRACTION``): settings are chosen without looking at the test images.

A validation run holds out a stratified share of each class's training images, learns from the rest and is evaluated
on the held-out ones, in place of the test split (Cha and Cho, "Hyperparameters in Continual Learning: a Reality
Check", arXiv 2403.09066, tune on held-out data and report elsewhere). Three properties make the split honest:

- **The same images for every method and seed.** The held-out images depend only on the training data's content
  digest, the fraction and :data:`SPLIT_SEED`, never on ``--seed``: every trial of a study, of every method, is
  scored on one validation set.
- **Stratified, and grouped where the benchmark is.** Each class (and in the domain scenario each class within each
  domain) gives ``round(fraction * n)`` of its ``n`` images, at least one and never all of them, so every task's
  validation set covers each of its classes. Where the benchmark's own split keeps groups of images together (the
  emoji benchmarks: a base emoji's skin tones and vendors), the validation split holds out whole groups too: on
  emoji an image-level split put the other vendor's drawing of a held-out emoji in training, and SLDA scored 82% on
  such a split against 55% on the test split.
- **The test split stays sealed.** The benchmark a validation run sees has the kept training images as its training
  split and the held-out ones as its evaluation split; the benchmark's own test images are replaced by
  :class:`SealedSource`, which refuses every read (decoding an image, hashing the split for the feature cache). A
  validation run that reached for a test image stops with that message instead of measuring on it.

The frozen features of the whole training split are computed once (and cached under the same key as a test run's);
a validation run takes its two parts by index, so a study's trials compute no features.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from clbench.benchmarks.base import Benchmark, ImageSource, task_sizes
from clbench.errors import ClbenchError, setting

# The split's seed, fixed: combined with the training data's digest and the fraction, it names the held-out images.
# Changing it changes every validation set (and so every validation record's meaning).
SPLIT_SEED = 20240403  # the reality-check paper's arXiv month (2403), a fixed date-like constant
SPLIT_NAME = "validation"


class SubsetSource(ImageSource):
    """The images ``indices`` of ``parent``, in that order; its digests name the parent's and the indices."""

    def __init__(self, parent: ImageSource, indices: np.ndarray, name: str) -> None:
        self.parent, self.indices, self.name = parent, np.asarray(indices, dtype=np.int64), name
        self.labels = np.asarray(parent.labels)[self.indices]
        self.domains = None if parent.domains is None else np.asarray(parent.domains)[self.indices]
        self.groups = None if parent.groups is None else np.asarray(parent.groups)[self.indices]

    def image(self, i: int) -> Any:  # PIL.Image.Image
        return self.parent.image(int(self.indices[i]))

    def _digest(self, of: str) -> str:
        h = hashlib.sha256(f"{self.name}:{of}:".encode())
        h.update(self.indices.tobytes())
        return h.hexdigest()[:16]

    def fingerprint(self) -> str:
        return self._digest(self.parent.fingerprint())

    def data_id(self) -> str:
        return self._digest(self.parent.data_id())


class SealedSource(ImageSource):
    """A benchmark's test split during a validation run: its labels stay (the benchmark's structure is built from
    them), every read of an image or of its content refuses, so no test image is decoded, hashed or featurised."""

    def __init__(self, sealed: ImageSource, fraction: float) -> None:
        self.labels, self.domains, self._fraction = sealed.labels, sealed.domains, fraction

    def _refuse(self) -> ClbenchError:
        return ClbenchError(
            f"a validation run ({setting('validation')} {self._fraction:g}) read the test split: it is sealed, "
            "settings chosen on validation must not see a test image",
            f"evaluate on the test split with a run without {setting('validation')}",
        )

    def image(self, i: int) -> Any:  # never returns
        raise self._refuse()

    def fingerprint(self) -> str:
        raise self._refuse()

    def data_id(self) -> str:
        raise self._refuse()


def split_seed(train_digest: str, fraction: float) -> int:
    """The seed of the held-out draw: :data:`SPLIT_SEED`, the training data's digest and the fraction, and nothing of
    the run (not ``--seed``)."""
    text = f"{SPLIT_SEED}:{train_digest}:{fraction!r}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def held_out(
    labels: np.ndarray,
    fraction: float,
    seed: int,
    domains: np.ndarray | None = None,
    groups: np.ndarray | None = None,
) -> np.ndarray:
    """Sorted positions of the held-out images. Without ``groups``: from each stratum (a class, or a class within a
    domain) of ``n`` images, ``round(fraction * n)`` drawn with ``seed``, at least 1 and at most ``n - 1`` (a stratum
    of one image keeps it for training). With ``groups`` (images that must stay together, as the benchmark's own
    test split keeps them): from each class, ``round(fraction * g)`` of its ``g`` groups, whole, across every domain
    (a class of one group falls back to drawing images)."""
    labels = np.asarray(labels, dtype=np.int64)
    if groups is None and domains is not None:
        strata = labels * (int(np.max(domains)) + 1) + np.asarray(domains, dtype=np.int64)
    else:
        strata = labels
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for s in np.unique(strata):  # sorted: the draw order does not depend on the images' order within the split
        members = np.flatnonzero(strata == s)
        if groups is not None:
            of = np.asarray(groups)[members]
            names = np.unique(of)
            if len(names) >= 2:
                k = min(max(1, round(fraction * len(names))), len(names) - 1)
                out.append(members[np.isin(of, names[rng.choice(len(names), size=k, replace=False)])])
                continue
        k = min(max(1, round(fraction * len(members))), len(members) - 1)
        if k > 0:
            out.append(rng.choice(members, size=k, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class ValidationSplit:
    """A benchmark cut for a validation run: ``bench`` learns from ``kept`` and evaluates on ``held``, both
    positions in ``full_train`` (the benchmark's whole training split, whose frozen features are cached once)."""

    bench: Benchmark
    full_train: ImageSource
    kept: np.ndarray  # (N_train - N_val,) positions in full_train
    held: np.ndarray  # (N_val,)
    fraction: float
    seed: int

    def summary(self) -> dict[str, float | int | str]:
        """What the record says of the split (RunRecord.validation)."""
        return {
            "fraction": self.fraction,
            "split_seed": SPLIT_SEED,
            "learnt_from": len(self.kept),
            "held_out": len(self.held),
            "grouped": self.full_train.groups is not None,
            "train_digest": self.full_train.data_id(),
        }


def hold_out(bench: Benchmark, fraction: float) -> ValidationSplit:
    """``bench`` as a validation run sees it: the kept training images as its training split, the held-out ones as
    its evaluation split (same labels, class order and tasks), the test split sealed (:class:`SealedSource`)."""
    train = bench.train
    seed = split_seed(train.fingerprint(), fraction)
    held = held_out(train.labels, fraction, seed, train.domains, train.groups)
    kept = np.setdiff1d(np.arange(len(train)), held)
    view = replace(
        bench,
        train=SubsetSource(train, kept, "train-kept"),
        test=SubsetSource(train, held, SPLIT_NAME),
    )
    bench.test = SealedSource(bench.test, fraction)  # whoever still holds the benchmark as loaded cannot read its test
    return ValidationSplit(view, train, kept, held, fraction, seed)


def rows_in(source: ImageSource, loaded: dict[str, ImageSource]) -> tuple[str, np.ndarray | None]:
    """Which split as loaded ``source``'s images come from ("train" or "test"), and their rows in it (None: all of
    them, in order): a :class:`SubsetSource` of a subset of a loaded split is its rows of that split."""
    rows: np.ndarray | None = None
    while isinstance(source, SubsetSource):
        rows = source.indices if rows is None else source.indices[rows]
        source = source.parent
    name = next((n for n, s in loaded.items() if s is source), None)
    if name is None:
        raise ValueError("a split that is no part of the benchmark as loaded")
    return name, rows


def first_classes(bench: Benchmark, k: int, init_cls: int | None, increment: int | None) -> Benchmark:
    """``bench`` with the first ``k`` classes of its class order only (``--classes K``): their training and test
    images, cut into tasks as the benchmark's split (or ``init_cls`` / ``increment``) cuts ``k`` classes."""
    if bench.scenario == "domain":
        raise ClbenchError(
            f"{setting('classes')} keeps classes of a class-incremental run; a domain run's tasks are domains",
            f"drop {setting('classes')} or use {setting('scenario')} class",
        )
    if k > bench.n_classes:
        raise ClbenchError(
            f"{setting('classes')} {k}: benchmark {bench.spec.name!r} has {bench.n_classes} classes",
            f"give {setting('classes')} {bench.n_classes} or less",
        )
    order = bench.class_order[:k]
    sizes = task_sizes(
        k,
        bench.spec.init_cls if init_cls is None else init_cls,
        bench.spec.increment if increment is None else increment,
    )
    train = SubsetSource(bench.train, np.flatnonzero(np.isin(bench.train.labels, order)), f"classes-{k}")
    test = SubsetSource(bench.test, np.flatnonzero(np.isin(bench.test.labels, order)), f"classes-{k}")
    return Benchmark(bench.spec, bench.class_names, list(order), sizes, train, test, bench.scenario)
