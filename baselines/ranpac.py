"""RanPAC: a frozen random projection with ReLU after first-session adaptation, and a class-incremental ridge
regression solved in closed form from accumulated Gram and class-sum matrices.

Paper: McDonnell et al., "RanPAC: Random Projections and Pre-trained Models for Continual Learning",
NeurIPS 2023, arXiv 2307.02251.
Reference implementations checked: LAMDA-PILOT ``models/ranpac.py`` (``setup_RP``, ``replace_fc``,
``optimise_ridge_parameter``, ``_train``), ``utils/inc_net.py`` (``SimpleVitNet``), ``backbone/vit_adapter.py``,
``backbone/linears.py`` (``CosineLinear``), ``exps/ranpac.json``; and the original ``RanPAC/RanPAC``
(``RanPAC.py``, ``inc_net.py``, ``args/*_publish.csv``) for the head.

Algorithm, for task t with new classes C_t (d = backbone width, M = projection width):

1. Task 0 only ("Phase 1", ``first_session=True``): train one AdaptFormer adapter per block (r = 64) with a cosine head
   over the task-0 classes, as APER does (``clbench.layers.first_session.tune_first_session``): SGD lr 0.01, momentum
   0.9, weight decay 5e-4, cosine schedule to 0 over 20 epochs, batch 48. The head is discarded (its learnt sigma is
   kept for the ``cosine`` head); the adapted ViT is frozen from then on. ``first_session=False`` is the paper's "No
   Phase 1" ablation: the frozen pre-trained features, no ViT pass at all beyond clbench's feature cache.
2. Once: W ~ N(0, 1), shape (d, M), drawn from the run's seed (``ctx.generator``) and kept in the strategy state
   (so every checkpoint holds it). G = 0 (M x M), Q = 0 (M x C).
3. Every task: f = the [CLS] features of the task's training images (test transform), h = ReLU(f W) (N, M);
   Q += h^T Y (Y one-hot, 0/1), G += h^T h.
4. Ridge parameter: the grid lambda in {10^-8, ..., 10^8}; on the CURRENT task's h (in a shuffled order, as the
   reference's shuffled loader), fit Wo(lambda) = (H_a^T H_a + lambda I)^-1 H_a^T Y_a on the first 80% (a),
   score the mean squared error of H_b Wo(lambda) against Y_b on the last 20% (b); take the argmin (over the grid
   values the float32 statistics resolve, lambda >= eps_32 trace(G): see the deviations).
5. Wo = ((G + lambda I)^-1 Q)^T over all seen classes (cumulative G, Q).
6. Inference: logits = ReLU(f(x) W) Wo^T (``head="plain"``, the paper and the original repository); PILOT's
   ``head="cosine"`` gives sigma * cos(ReLU(f W), Wo_c) instead.

Cost: only task 0 trains. With Phase 1 the adapted ViT is frozen after task 0 and its features are kept per image
(``clbench.layers.first_session.AdaptedFeatures``), so every later training image and every test image passes it
exactly once; everything after that runs on those d-dimensional features. Memory: G is M x M float32 and the
float64 solve needs two more M x M float64 matrices; measured ~35 M^2 bytes at peak (3.5 GB at M = 10,000, see
``memory_estimate``); a larger M than the machine has memory for is refused before training, with the estimate.

Deviations from the paper / reference code:

- Head: PILOT keeps its ``CosineLinear`` after the projection, so h and every row of Wo are L2-normalised at test
  time (sigma from the task-0 training). The paper and the original repository replace it by the plain inner
  product h Wo^T, which is what the ridge regression fits. Default ``head="plain"`` (the sound rule);
  ``head="cosine"`` reproduces PILOT.
- Numerics (``ridge_numerics``): the reference solves the 17 grid systems and the final one with ``torch.linalg.solve``
  in float32 on the M x M matrices. With fewer fitting samples than M (a task of a few hundred images, M = 10,000), G_a
  + lambda I is numerically singular in float32 for small lambda, so the reference's scores at small lambda are rounding
  noise. Default ``"exact"``: the same ridge solutions computed stably in float64 (the grid through one
  eigendecomposition of the smaller of H_a H_a^T and H_a^T H_a, which gives every lambda at once; the final system by a
  float64 Cholesky factorisation, with an LU solve if rounding makes it indefinite). ``"reference"`` reproduces the
  float32 ``torch.linalg.solve`` calls. G and Q are accumulated in float32 as in the reference.
- Ridge floor (``"exact"`` only): G is accumulated in float32 (as the reference), so its entries carry rounding
  errors of about eps_32 * trace(G) in norm. Computed exactly, the grid on a small task often prefers the tiniest
  lambda (10^-8: the minimum-norm interpolator of a few hundred points in M = 10,000 dimensions), which the
  cumulative float32 G cannot resolve: the first measured run chose 10^-8 at task 2 and fell from 60.6 % to 14.1 %
  accuracy. The reference never sees this because its own float32 solves turn those grid points into noise with a
  large held-out error. So the argmin is taken over grid values >= eps_32 * trace(G) (cumulative G after the
  task; recorded per task as ``ridge_floor``); above that floor G + lambda I is positive definite despite the
  rounding and the solve is a small perturbation of the exact one. ``ridge_numerics="reference"`` has no floor.
- The grid's MSE is taken over the current task's classes only; the reference averages over all ``nb_classes``
  one-hot columns, whose other columns are zero in both target and prediction (Q_a has no entry there), so the
  argmin is the same. A task with fewer than 2 training images cannot be split and is refused.
- W is drawn from a private generator seeded by the run seed, not from the global RNG after training (PILOT), so it
  does not depend on what training consumed; Q grows with the seen classes instead of holding all
  ``nb_classes`` columns from the start (unseen columns are zero in the reference).
- Prediction: the projection and logits are computed in float64 and returned as float32 (rows independent of the
  batch to the last bit that matters for the argmax).
- Adapted features are kept per image after task 0 (the reference recomputes them for each evaluation); the adapted
  ViT is frozen then, so the numbers are the same. The reference's per-epoch test-accuracy log is skipped.
- The reference's width is hard-coded 768; here d is the backbone's ``num_features`` (recorded with M in the run's
  ``params``). A resumed run whose saved width differs from the backbone's is refused.
- Adapter details (LayerScale in DINOv2, private dropout generator, task-0 head init) as in ``baselines/aper.py``.
- The run setting ``train_per_class`` (``--train-per-class``; the ``ci`` profile sets 8) restricts tuning and
  statistics to the first k training images per class: the harness cuts each task before ``learn_task``.
- Profiles (not the default): ``quick`` = 112 px and 3 first-session epochs (CPU); ``ci`` = 56 px, 3 tasks of 12
  classes, 16 images per class, 2 epochs and M = 2,000 so that the gate's run stays well under a minute.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from baselines.cards.ranpac import CARD, RanPACConfig, param_extra
from clbench.core.costs import adapter_set_size
from clbench.core.labels import new_class_count
from clbench.errors import ClbenchError
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.analytic import available_memory, relu_projection, ridge_solution
from clbench.layers.checks import check_protocol
from clbench.layers.first_session import (
    AdaptedFeatures,
    adapted_cls,
    check_width,
    n_head_params,
    tune_first_session,
)
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import check_vit_blocks

RIDGE_GRID = tuple(10.0**k for k in range(-8, 9))  # optimise_ridge_parameter: 10.0 ** np.arange(-8, 9)
FIT_FRACTION = 0.8  # optimise_ridge_parameter: num_val_samples = int(N * 0.8) rows fit, the rest score


# ----------------------------------------------------------------------------------------------- ridge regression
def solve_ridge(G: torch.Tensor, Q: torch.Tensor, lam: float, numerics: str = "exact") -> torch.Tensor:
    """Wo = ((G + lam I)^-1 Q)^T: (M, M), (M, C) -> (C, M) float32."""
    if numerics == "reference":  # replace_fc: torch.linalg.solve in float32
        return torch.linalg.solve(G + lam * torch.eye(G.shape[0], dtype=G.dtype), Q).T.contiguous()
    return ridge_solution(G, Q, lam).T.float().contiguous()  # float64 Cholesky (LU where rounding needs it)


def ridge_losses(H: torch.Tensor, Y: torch.Tensor, numerics: str = "exact") -> list[float]:
    """Held-out MSE of every grid lambda: fit on the first 80% of the rows of (H, Y), score on the rest.

    ``exact``: in float64 via the eigendecomposition of the smaller Gram matrix. With n fitting rows and M columns,
    Wo(l) = (H_a^T H_a + l I)^-1 H_a^T Y_a = H_a^T (H_a H_a^T + l I)^-1 Y_a, so for n <= M the held-out
    predictions are K_ba U diag(1 / (s + l)) U^T Y_a with K = H_a H_a^T = U diag(s) U^T, K_ba = H_b H_a^T; for n > M,
    H_b V diag(1 / (s + l)) V^T H_a^T Y_a with H_a^T H_a = V diag(s) V^T.
    """
    n = H.shape[0]
    n_fit = int(n * FIT_FRACTION)
    if n_fit < 1 or n_fit >= n:
        raise ClbenchError(
            f"RanPAC's ridge selection splits a task's training images 80/20, but this task has {n}",
            "use tasks with at least 2 training images (or a larger --train-per-class)",
        )
    if numerics == "reference":  # optimise_ridge_parameter, float32 solves on the M x M fit Gram
        Ha, Hb, Ya, Yb = H[:n_fit], H[n_fit:], Y[:n_fit], Y[n_fit:]
        Ga, Qa = Ha.T @ Ha, Ha.T @ Ya
        eye = torch.eye(Ga.shape[0], dtype=Ga.dtype)
        return [float(F.mse_loss(Hb @ torch.linalg.solve(Ga + lam * eye, Qa), Yb)) for lam in RIDGE_GRID]
    Ha, Hb, Ya, Yb = H[:n_fit].double(), H[n_fit:].double(), Y[:n_fit].double(), Y[n_fit:].double()
    if n_fit <= H.shape[1]:
        s, U = torch.linalg.eigh(Ha @ Ha.T)  # (n,), (n, n)
        left, right = (Hb @ Ha.T) @ U, U.T @ Ya  # (n_b, n), (n, C)
    else:
        s, V = torch.linalg.eigh(Ha.T @ Ha)  # (M,), (M, M)
        left, right = Hb @ V, V.T @ (Ha.T @ Ya)
    s = s.clamp_min(0)  # a Gram matrix is PSD; rounding can leave tiny negative eigenvalues
    return [float(((left / (s + lam)) @ right - Yb).pow(2).mean()) for lam in RIDGE_GRID]


def select_ridge(H: torch.Tensor, Y: torch.Tensor, numerics: str = "exact", floor: float = 0.0) -> float:
    """The grid lambda with the smallest held-out MSE (the first on ties, as ``np.argmin``) among the grid values
    >= ``floor`` (the largest grid value if none is)."""
    losses = ridge_losses(H, Y, numerics)
    allowed = [i for i, lam in enumerate(RIDGE_GRID) if lam >= floor] or [len(RIDGE_GRID) - 1]
    return RIDGE_GRID[min(allowed, key=lambda i: (losses[i], i))]


def ridge_floor(G: torch.Tensor) -> float:
    """The smallest lambda the stored statistics resolve: eps(G's dtype) * trace(G). G is accumulated in float32, so
    its entries carry rounding errors of about that size in norm; with lambda above them G + lambda I stays
    positive definite and the solve is a small perturbation of the exact one, while below them the solution is
    rounding noise (what the reference's float32 solves produce there)."""
    return float(torch.finfo(G.dtype).eps * G.diagonal().double().sum())


def memory_estimate(M: int, d: int) -> int:
    """Bytes RanPAC needs at projection width M beyond the harness: 36 M^2 + 4 d M + 32 KiB * M. By count, G (4 M^2,
    float32), the h^T h update (4 M^2), the float64 system and its Cholesky factor (16 M^2) and the checkpoint's
    serialised G (4 M^2) make 28 M^2; the measured peak resident memory of the quick run (M = 10,000) was 3.5 GB above
    the ~1.4 GB of a SimpleCIL run, i.e. ~35 M^2 with the allocator's slack, hence 36. Plus W (d M) and a
    batch of projected features."""
    return 36 * M * M + 4 * d * M + 8 * 4096 * M


def largest_M(d: int, free: int) -> int:
    """The largest M (a multiple of 100) whose :func:`memory_estimate` fits in ``free`` bytes."""
    a, b = memory_estimate(1, 0) - 8 * 4096, 4 * d + 8 * 4096  # a M^2 + b M <= free
    m = int((-b + math.sqrt(b * b + 4 * a * free)) / (2 * a)) // 100 * 100
    return m if memory_estimate(m, d) <= free else max(m - 100, 0)


def check_memory(M: int, d: int) -> None:
    need, free = memory_estimate(M, d), available_memory()
    if need > free:
        raise ClbenchError(
            f"RanPAC with M={M}: the Gram matrix and its solve need about {need / 2**30:.1f} GiB "
            f"(~36 M^2 bytes), but only {free / 2**30:.1f} GiB of memory is available",
            f"lower M (--set M=...); M={largest_M(d, free)} fits now",
        )


# ----------------------------------------------------------------------------------------------- the strategy
@CARD.strategy
class RanPAC(Strategy):
    # domain scenario: Phase 1 adapts on the first domain only; G and Q accumulate every domain's images, so the
    # ridge head is the joint solution over all domains seen (its columns: every class from the first task)
    scenarios = ("class", "domain")
    state_types = (AdapterSet, Adapter, AdaptedFeatures)
    needs_vit = True

    def __init__(self, config: RanPACConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        if config.first_session:
            check_vit_blocks(self.model)
        self.dim = ctx.backbone.num_features
        check_memory(config.M, self.dim)  # before anything is trained
        self.W = torch.randn(self.dim, config.M, generator=ctx.generator(5000))  # (d, M), fixed for the run
        self.G: torch.Tensor | None = None  # (M, M) float32, allocated at the first task
        self.Q = torch.zeros(config.M, 0)  # (M, C) class sums of h
        self.Wo = torch.zeros(0, config.M)  # (C, M) ridge output weights
        self.sigma = 1.0  # the task-0 head's learnt scale (PILOT keeps it in its cosine head)
        self.adapters: AdapterSet | None = None
        self.store = AdaptedFeatures(self.dim)
        self.lambdas: list[float] = []
        self.floors: list[float] = []  # ridge_floor of the cumulative G at each task ("exact" numerics)
        self.n_classes = 0
        self._added: list[int] = []
        self._trainable: list[int] = []

    # ---------------------------------------------------------------------------------------- features
    def features(self, split: Split) -> torch.Tensor:
        """(N, d) float32: adapted [CLS] features (kept per image), or the cached frozen ones without Phase 1."""
        if self.adapters is None:
            return split.features.float()
        return self.store.get(
            split,
            lambda x: adapted_cls(self.model, x, self.adapters, self.ctx),
            self.cfg.eval_batch_size,
            self.ctx.device,
        )

    def project(self, f: torch.Tensor) -> torch.Tensor:
        """h = ReLU(f W): (N, d) -> (N, M) in ``f``'s dtype."""
        return relu_projection(f, self.W)

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg = self.cfg
        # head columns this task adds (the domain scenario: every class with the first domain, none later)
        new = new_class_count(task.classes, task.n_seen, self.n_classes, task.id)
        adapters = trainable = steps = 0
        if cfg.first_session and self.adapters is None:  # Phase 1 on the first task only
            self.adapters, head = tune_first_session(self.model, task, cfg, self.ctx, "RanPAC")
            steps = cfg.epochs * math.ceil(len(task.train) / cfg.batch_size)  # batches per epoch x epochs
            self.sigma = float(head.sigma.detach())
            adapters = adapter_set_size(len(self.model.blocks), self.dim, cfg.bottleneck)
            trainable = adapters + n_head_params(head)

        H = self.project(self.features(task.train))  # (N_t, M) float32
        Y = F.one_hot(task.train.labels, task.n_seen).float()  # (N_t, C)
        if self.G is None:
            self.G = torch.zeros(cfg.M, cfg.M)
        self.Q = torch.cat([self.Q, torch.zeros(cfg.M, task.n_seen - self.Q.shape[1])], dim=1)
        self.Q += H.T @ Y
        self.G += H.T @ H
        order = torch.randperm(len(H), generator=self.ctx.generator(6000 + task.id))  # the shuffled loader's order
        floor = ridge_floor(self.G) if cfg.ridge_numerics == "exact" else 0.0
        lam = select_ridge(H[order], Y[order][:, sorted(task.classes)], cfg.ridge_numerics, floor)
        self.lambdas.append(lam)
        self.floors.append(floor)
        self.Wo = solve_ridge(self.G, self.Q, lam, cfg.ridge_numerics)  # (C, M)
        self.n_classes = task.n_seen
        self.ctx.log(f"  RanPAC task {task.id}: lambda {lam:g} (floor {floor:.3g}, M={cfg.M})")
        first = len(self._added) == 0
        self._added.append(adapters + cfg.M * new + (self.W.numel() if first else 0))
        self._trainable.append(trainable)
        self.note_steps(steps)

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "RanPAC")
        h = self.project(self.features(split).double())  # (N, M) float64
        wo = self.Wo.double()
        if self.cfg.head == "cosine":  # PILOT CosineLinear: sigma * cos(h, Wo_c)
            return (self.sigma * F.normalize(h, dim=1) @ F.normalize(wo, dim=1).T).float()
        return (h @ wo.T).float()  # (N, n_seen)

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """h = ReLU(f W) of the (adapted, with Phase 1) features: what the ridge head scores."""
        return self.project(self.features(split).double()).float()

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        return {
            "ridge_lambda": self.lambdas[-1] if self.lambdas else None,
            "ridge_floor": self.floors[-1] if self.floors else None,
            "M": self.cfg.M,
            "adapted_passes_total": self.store.passes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_width("ranpac", int(state["W"].shape[0]), self.dim)
        if state["W"].shape[1] != self.cfg.M:
            raise ClbenchError(
                f"ranpac: the saved run projects to M={state['W'].shape[1]}, this one to M={self.cfg.M}",
                "resume with the same --set M, or start over with --overwrite",
            )
        super().load_state_dict(state)

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        extra = param_extra(self.cfg, self.dim, len(self.model.blocks), self.n_classes)
        sizes = [
            (k - (extra["adapter_params"] + extra["random_projection"] if t == 0 else 0)) // self.cfg.M
            for t, k in enumerate(self._added)
        ]
        added, stored = CARD.split_kept(self._added, self.Wo.numel(), extra, sizes)
        return ParamCounts(
            added_per_task=added,
            stored_per_task=stored,
            trainable_per_task=list(self._trainable),
            head=self.Wo.numel(),
            extra=extra,
        )
