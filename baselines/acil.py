"""ACIL: analytic class-incremental learning, a fixed random expansion ("buffer") layer and a recursive
least-squares classifier on the frozen features, exemplar-free and equal to joint training on all tasks.

Paper: Zhuang et al., "ACIL: Analytic Class-Incremental Learning with Absolute Memorization and Privacy
Protection", NeurIPS 2022, arXiv 2205.14922 (the mini-batch form of the recursion from G-ACIL, arXiv 2403.15706).
Reference implementation checked: ``ZHUANGHP/Analytic-continual-learning`` @ 0afd6bf87622e808ce7f730f8556e78229b9e758,
``analytic/ACIL.py`` (``ACIL``, ``ACILLearner.learn`` / ``before_validation`` / ``inference``),
``analytic/AnalyticLinear.py`` (``RecursiveLinear.fit``), ``analytic/Buffer.py`` (``RandomBuffer``), ``config.py``
(defaults) and ``main.py`` (the phase loop, ``--cache-features``).

Algorithm (d = backbone width, M = buffer size (``M``), gamma = regularisation):

1. Once: the buffer weights W_b (d, M) ~ U(-1/sqrt(d), 1/sqrt(d)) (``RandomBuffer`` = ``nn.Linear`` without bias,
   its default initialisation), never trained; R = I / gamma (M, M); W = 0 (M, 0).
2. Every task, in mini-batches of ``il_batch_size`` of its training images (arrival order): X = ReLU(f W_b) (n, M), Y
   one-hot over the classes seen so far; R <- R - R X^T (I + X R X^T)^-1 X R (ACIL eq. 10), then W <- W + R X^T (Y - X
   W) (eq. 9), old columns of W included: no old sample is needed, yet after every task W is the ridge solution (sum X^T
   X + gamma I)^-1 sum X^T Y over all tasks so far (tested, ``tests/test_acil.py``).
3. Inference: logits = ReLU(f W_b) W.

Numerics: float64 for the buffer, R, W and the logits (the reference builds ``RandomBuffer`` and
``RecursiveLinear`` with ``dtype=torch.double``); the recursion subtracts nearly equal numbers and R is the inverse of
a Gram matrix. (I + X R X^T) is factorised by Cholesky (:class:`clbench.layers.analytic.RecursiveRidge`); should it
not be positive definite in float64, or W not finite, the run stops with a ClbenchError asking for a larger gamma
(the reference asserts ``isfinite`` with the same advice). Logits are returned as float32.

Cost and memory (``solver="recursive"``, the reference's form): R is M x M float64, 8 M^2 bytes (512 MiB at the
reference's M = 8192), saved in each checkpoint; each batch of n images costs 4 n M^2 flops. The default
``solver="auto"`` keeps the same solution in its dual form while it is the cheaper form
(:class:`clbench.layers.analytic.AnalyticRidge`: r M + r^2 floats after r images, 2 n r M + 4 n^2 M + n r^2 +
n^3 / 3 flops per batch: the Cholesky factor of F F^T + gamma I is kept and bordered), then switches to the
recursion once (a rent-or-buy rule on the flops).
:func:`clbench.layers.analytic.memory_estimate` (measured in
``reports/perf/acil-growth.json``) is checked before anything is learnt, and a width that does not fit is refused
in one line with the estimate.

Deviations from the paper / reference code:

- No base training: the reference first trains its ResNet backbone on the base classes with SGD (``base_training``,
  300 epochs) and then "re-aligns" the analytic classifier on them. clbench's backbone is the frozen pre-trained ViT
  (the reference's ``--cache-features`` path with a given ``--backbone-path``, where base training is skipped):
  the first task is learnt by the same recursion as every later one, which is what the re-alignment does.
- Buffer weights from a private generator seeded by the run seed (``ctx.generator``), not torch's global RNG; the
  same distribution. They are kept in the state (every checkpoint holds them).
- ``solver="auto"`` (default): while it is the cheaper form, W is computed in the dual form (rotated
  per-batch factors of X^T X and W = F^T (F F^T + gamma I)^-1 (rotated targets), the push-through identity), not by
  the recursion: the same W after every task to float64 rounding (the golden test holds both forms to the
  reference's R and W at 1e-9), about 10 x fewer flops and a checkpoint a quarter the size on the embedded
  benchmark. What it keeps beyond the recursion's single R is each batch's autocorrelation X^T X (factored;
  still no image: a batch is known only up to a rotation), not only their sum. ``solver="recursive"`` is the
  reference's recursion from the first batch.
- The recursion is evaluated as U = R X^T, V = (I + X U)^-1 U^T (Cholesky), R <- R - U V, W <- W + V^T (Y - X W)
  instead of the explicit ``torch.inverse`` and ``R @ X.T @ K @ X @ R``: the same update in exact arithmetic
  (because the new R X^T = U (I + X U)^-1). 4 n M^2 flops per batch of n and no M x M temporary, where the
  reference's left-to-right product forms (R X^T K X) (M x M) and multiplies it by R (2 M^3 flops: 1.1 TFLOP per
  batch at M = 8192); agrees with the reference to float64 rounding (``tests/test_reference_golden.py``).
- Mini-batches in the task's arrival order (the reference's training loader shuffles); ACIL's result does not depend
  on the batching or the order (up to rounding), so only memory does. Default 4096, the README's
  ``--IL-batch-size 4096`` (``config.py``'s fallback is the base-training batch size, 256).
- W grows by the new classes' columns per task (the reference pads the same zero ``tail``).
- Prediction in row blocks of ``eval_batch_size`` (memory only; rows are independent).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from baselines.cards.acil import CARD, ACILConfig, extra_counts
from clbench.core.labels import new_class_count
from clbench.layers.analytic import (
    AnalyticRidge,
    RecursiveRidge,
    check_memory,
    growth_measurement,
    relu_projection,
    uniform_expansion,
)
from clbench.layers.checks import check_protocol, check_saved_buffer
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task


@CARD.strategy
class ACIL(Strategy[ACILConfig]):
    # domain scenario: the recursive least-squares update is exact for any new images, new classes or not, so after
    # every domain the head is the joint ridge solution over all images seen (the paper's equivalence to joint
    # training holds unchanged)
    scenarios = ("class", "domain")
    state_types = (AnalyticRidge, RecursiveRidge)

    def __init__(self, config: ACILConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.dim = ctx.backbone.num_features
        check_memory("ACIL", config.M, self.dim, config.il_batch_size)  # before anything is learnt
        self.buffer = uniform_expansion(self.dim, config.M, ctx.generator(5100))  # (d, M) float64
        self.head = AnalyticRidge(config.M, config.gamma, config.solver)  # W (M, C) float64
        self.n_classes = 0
        self._sizes: list[int] = []

    def expand(self, f: torch.Tensor) -> torch.Tensor:
        """The buffer layer: X = ReLU(f W_b), (N, d) -> (N, M) float64."""
        return relu_projection(f.double(), self.buffer)

    def learn_task(self, task: Task) -> None:
        new = new_class_count(task.classes, task.n_seen, self.n_classes, task.id)  # a later domain: 0
        f, y = task.train.features, task.train.labels
        for start in range(0, len(y), self.cfg.il_batch_size):  # ACILLearner.learn: one fit per IL batch
            rows = slice(start, start + self.cfg.il_batch_size)
            X = self.expand(f[rows])  # (n, M)
            Y = F.one_hot(y[rows], task.n_seen).double()  # (n, C)
            self.head.fit(X, Y, "ACIL")
        self.head.grow(task.n_seen)  # a task without images still gets its (zero) columns
        self.n_classes = task.n_seen
        self._sizes.append(new)  # the head columns this task added

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "ACIL")
        f, step = split.features, self.cfg.eval_batch_size
        blocks = [self.head(self.expand(f[i : i + step])).float() for i in range(0, len(f), step)]
        return torch.cat(blocks) if blocks else torch.zeros(0, self.n_classes)  # (N, n_seen)

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """The buffer layer's output X = ReLU(f W_b): what the analytic head scores."""
        return self.expand(split.features).float()

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        return {"M": self.cfg.M, "gamma": self.cfg.gamma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_saved_buffer("acil", state, self.dim, self.cfg.M)
        super().load_state_dict(state)

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        M = int(self.head.W.shape[0])
        first = self.buffer.numel() + M * M  # W_b (d, M) and R (M, M) (or its dual form's factors), from task 0
        return ParamCounts(
            added_per_task=[M * n for n in self._sizes],
            stored_per_task=[(first if t == 0 else 0) for t in range(len(self._sizes))],
            trainable_per_task=[0] * len(self._sizes),
            head=self.head.W.numel(),
            extra=extra_counts(self.cfg, self.dim),
        )


# `clbench perf acil-growth` (the card's ``perf_benchmarks``): seconds and memory at the reference's defaults
GROWTH = growth_measurement(ACIL, "acil-growth", ACILConfig())
