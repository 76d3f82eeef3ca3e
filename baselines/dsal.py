"""DS-AL: dual-stream analytic learning, ACIL's random expansion with two recursive least-squares classifiers: the
main stream (ReLU) as ACIL, and a compensation stream (tanh) fitted to what the main stream leaves of the new
classes' targets, added with a compensation ratio C.

Paper: Zhuang et al., "DS-AL: A Dual-Stream Analytic Learning for Exemplar-Free Class-Incremental Learning",
AAAI 2024, arXiv 2403.17503.
Reference implementation checked: ``ZHUANGHP/Analytic-continual-learning`` @
0afd6bf87622e808ce7f730f8556e78229b9e758, ``analytic/DSAL.py`` (``DSAL.fit`` / ``update`` / ``forward``,
``DSALLearner``), ``analytic/ACIL.py`` (``ACILLearner.learn``), ``analytic/AnalyticLinear.py``
(``RecursiveLinear.fit``), ``analytic/Buffer.py`` (``RandomBuffer``), ``config.py`` (defaults), ``main.py``.

Algorithm (d = backbone width, M = buffer size):

1. Once: the buffer W_b (d, M) ~ U(-1/sqrt(d), 1/sqrt(d)) (``RandomBuffer`` with ``activation=Identity``); two
   recursive least-squares classifiers (:class:`clbench.layers.analytic.RecursiveRidge`), main (gamma) and
   compensation (gamma_comp), each R = I / gamma, W = 0.
2. Every task t with new classes C_t, in mini-batches of its training images: X = f W_b (n, M), Y one-hot over the
   seen classes. (a) The main stream learns (ReLU(X), Y) by ACIL's recursion (eqs. 9-10). (b) Previous label
   cleansing: the residue Y_comp = Y - ReLU(X) W_main with the columns of the classes of earlier tasks set to 0.
   (c) The compensation stream learns (tanh(X), Y_comp) by the same recursion.
3. Inference: logits = ReLU(f W_b) W_main + C tanh(f W_b) W_comp.

``residue="task"`` (default, the paper's algorithm): (a) runs over all of the task's batches first and (b) takes the
residue of the main stream that has learnt the whole task. ``residue="batch"`` is the reference's ``DSAL.fit``
per IL batch (a shuffled order, ``ctx.generator``): each batch's residue is taken from the main stream after that
batch, before it has seen the rest of the task. The two agree when a task fits in one batch (the README's
``--IL-batch-size 4096``, and every task of the embedded benchmark).

Numerics: float64 for the buffer, both streams and the logits (the reference's ``dtype=torch.double``); Cholesky
factorisation in each update, a ClbenchError asking for a larger gamma where it fails or a weight is not finite (the
reference asserts ``isfinite``). Logits are returned as float32.

Cost and memory (``solver="recursive"``, the reference's form): two M x M float64 R matrices, 16 M^2 bytes (1 GiB
at M = 8192), saved in every checkpoint; each batch of n images costs 8 n M^2 flops. The default ``solver="auto"``
keeps both streams in the dual form of :class:`clbench.layers.analytic.AnalyticRidge` while it is
the cheaper form (as ACIL, ``baselines/acil.py``), then switches to the recursion once. The estimate
(:func:`clbench.layers.analytic.memory_estimate` with two streams; measured in ``reports/perf/dsal-growth.json``)
is checked before anything is learnt, and a width that does not fit is refused in one line with the estimate.

Deviations from the paper / reference code:

- No base training: the reference trains its ResNet on the base classes first (``ACILLearner.base_training``) and
  then re-aligns both streams on them; clbench's ViT is frozen (the reference's ``--cache-features`` with a given
  backbone), so the first task is learnt by the same two-stream update as every later one.
- ``residue="task"`` by default, as above; ``residue="batch"`` reproduces the reference's per-batch residue, with
  one difference: the reference one-hot encodes a batch over max(label) + 1 classes and zeroes all but the last
  ``increase_size`` columns, so a batch without the task's highest class leaves one earlier class's residue
  uncleansed; here Y always spans the seen classes and exactly the earlier classes are zeroed.
- Buffer weights from a private generator seeded by the run seed (``ctx.generator``), not torch's global RNG; the
  same distribution, kept in the state.
- ``solver="auto"`` (default): each stream in the dual form while it is the cheaper form (the same W
  to float64 rounding, checked against the reference's fixture in both forms; see ``baselines/acil.py``);
  ``solver="recursive"``: the recursion from the first batch.
- The recursion in the Cholesky form of :class:`~clbench.layers.analytic.RecursiveRidge` (the same update as the
  reference's explicit inverse, to float64 rounding: ``tests/test_reference_golden.py``; 4 n M^2 flops per stream
  and batch instead of the reference's 2 M^3 + 6 n M^2).
- Mini-batches of 4096 (the README's ``--IL-batch-size``; ``config.py`` falls back to the base-training batch size,
  256); under ``residue="task"`` the batching changes memory only.
- ``C`` defaults to ``config.py``'s ``--compensation-ratio 1``; the README's best values are 0.6 (CIFAR-100) and
  1.5 (ImageNet-1k), found by grid search over [0, 2] on the test split, which clbench does not do.
- The activations are the reference constructor's (ReLU main, tanh compensation); ``config.py`` exposes neither.
- Prediction in row blocks of ``eval_batch_size`` (memory only; rows are independent).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from baselines.cards.dsal import CARD, DSALConfig, extra_counts
from clbench.layers.analytic import (
    AnalyticRidge,
    RecursiveRidge,
    check_memory,
    growth_measurement,
    uniform_expansion,
)
from clbench.layers.checks import check_protocol, check_saved_buffer
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task


@CARD.strategy
class DSAL(Strategy[DSALConfig]):
    # scenarios: class only: the compensation stream's previous-label cleansing zeroes every earlier class's
    # column, and in a later domain every class is earlier, so that stream would learn nothing (defined for new classes)
    state_types = (AnalyticRidge, RecursiveRidge)
    streams: ClassVar[int] = 2  # R matrices held (the memory estimate)

    def __init__(self, config: DSALConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.dim = ctx.backbone.num_features
        check_memory("DS-AL", config.M, self.dim, config.il_batch_size, self.streams)
        self.buffer = uniform_expansion(self.dim, config.M, ctx.generator(5200))  # (d, M) float64
        self.main = AnalyticRidge(config.M, config.gamma, config.solver)  # on ReLU(f W_b)
        self.comp = AnalyticRidge(config.M, config.gamma_comp, config.solver)  # on tanh(f W_b)
        self.n_classes = 0
        self._sizes: list[int] = []

    def expand(self, f: torch.Tensor) -> torch.Tensor:
        """The buffer layer without activation: X = f W_b, (N, d) -> (N, M) float64."""
        return f.double() @ self.buffer

    def residue(self, X: torch.Tensor, Y: torch.Tensor, n_old: int) -> torch.Tensor:
        """Previous label cleansing: Y - ReLU(X) W_main, the columns of the ``n_old`` earlier classes set to 0."""
        Y_comp = Y - self.main(F.relu(X))  # (n, C)
        Y_comp[:, :n_old] = 0
        return Y_comp

    def _batches(self, task: Task, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        f, y, step = task.train.features, task.train.labels, self.cfg.il_batch_size
        for start in range(0, len(order), step):
            rows = order[start : start + step]
            yield self.expand(f[rows]), F.one_hot(y[rows], task.n_seen).double()  # (n, M), (n, C)

    def learn_task(self, task: Task) -> None:
        if sorted(task.classes) != list(range(self.n_classes, task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")
        n_old = self.n_classes
        if self.cfg.residue == "batch":  # DSAL.fit per batch of the reference's shuffled IL loader
            order = torch.randperm(len(task.train), generator=self.ctx.generator(5300 + task.id))
            for X, Y in self._batches(task, order):
                self.main.fit(F.relu(X), Y, "DS-AL's main stream")
                self.comp.fit(torch.tanh(X), self.residue(X, Y, n_old), "DS-AL's compensation stream")
        else:  # the paper: the main stream learns the whole task, then the compensation stream its residue
            order = torch.arange(len(task.train))
            # a task in one batch (every task here) is expanded once for both streams; larger ones twice (memory)
            kept = list(self._batches(task, order)) if len(order) <= self.cfg.il_batch_size else None
            for X, Y in kept or self._batches(task, order):
                self.main.fit(F.relu(X), Y, "DS-AL's main stream")
            for X, Y in kept or self._batches(task, order):
                self.comp.fit(torch.tanh(X), self.residue(X, Y, n_old), "DS-AL's compensation stream")
        for stream in (self.main, self.comp):
            stream.grow(task.n_seen)  # a task without images still gets its (zero) columns
        self.n_classes = task.n_seen
        self._sizes.append(len(task.classes))

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "DS-AL")
        f, step, C = split.features, self.cfg.eval_batch_size, self.cfg.compensation_ratio
        blocks = []
        for i in range(0, len(f), step):
            X = self.expand(f[i : i + step])  # (n, M)
            blocks.append((self.main(F.relu(X)) + C * self.comp(torch.tanh(X))).float())  # DSAL.forward
        return torch.cat(blocks) if blocks else torch.zeros(0, self.n_classes)  # (N, n_seen)

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """ReLU of the buffer layer, X = ReLU(f W_b): what the main stream scores (the compensation stream adds
        tanh of the same projection)."""
        return F.relu(self.expand(split.features)).float()

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        return {"M": self.cfg.M, "compensation_ratio": self.cfg.compensation_ratio}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_saved_buffer("dsal", state, self.dim, self.cfg.M)
        super().load_state_dict(state)

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        M = int(self.main.W.shape[0])
        first = self.buffer.numel() + 2 * self.cfg.M**2  # W_b and both R (or their dual forms), from task 0
        return ParamCounts(
            added_per_task=[2 * M * n for n in self._sizes],
            stored_per_task=[(first if t == 0 else 0) for t in range(len(self._sizes))],
            trainable_per_task=[0] * len(self._sizes),
            head=self.main.W.numel() + self.comp.W.numel(),
            extra=extra_counts(self.cfg, self.dim),
        )


# `clbench perf dsal-growth` (the card's ``perf_benchmarks``): seconds and memory at the reference's defaults
GROWTH = growth_measurement(DSAL, "dsal-growth", DSALConfig())
