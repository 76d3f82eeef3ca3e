"""RanDumb: a random Fourier-feature embedding of the frozen features and linear discriminant analysis with one
shared, OAS-shrunk covariance, learnt class by class.

Paper: Prabhu, Sinha, Kumaraguru, Torr, Sener and Dokania, "RanDumb: Random Representations Outperform Online
Continually Learned Representations", NeurIPS 2024, arXiv 2402.08823.
Reference implementation checked: ``drimpossible/RanDumb`` @ 14a51ee0c045bff642f6ffbfe481efa4d49a3033,
``src/main.py`` (``parse_args`` and ``__main__``: ``RBFSampler(gamma='scale', n_components=embed_dim)``, then
``LinearDiscriminantAnalysis(solver='lsqr', covariance_estimator=OAS(assume_centered=False))``), ``scripts/runall.sh``
(the runs and their flags) and ``src/legacy_model.py``; scikit-learn 1.9.1 for the classes it calls
(``kernel_approximation.RBFSampler``, ``covariance.OAS``, ``discriminant_analysis._class_cov`` /
``_solve_lstsq``).

Algorithm (d = backbone width, W = M with the embedding, W = d without):

1. Embedding: phi(x) = sqrt(2 / M) cos(x Omega + b), Omega = sqrt(2 gamma) N(0, 1) of shape (d, M), b ~ U(0, 2 pi)
   (M,), gamma = 1 / (d Var(x)) (``gamma='scale'``: the variance of every entry of the training features).
   ``embed=False``: phi(x) = x.
2. Each new class c (all its images arrive in one task): mean mu_c, count n_c, and its own OAS-shrunk covariance
   OAS_c = (1 - s_c) S_c + s_c tr(S_c)/W I (S_c the biased empirical covariance, s_c the OAS coefficient,
   :func:`clbench.layers.lda.oas_shrinkage`); the shared covariance is Sigma = sum_c n_c OAS_c / sum_c n_c, the
   classes' OAS estimates weighted by their priors as scikit-learn's ``_class_cov``. Kept as the running sum, so a
   task adds its classes and nothing is recomputed (``LDAStatistics.add_classes_oas``).
3. After each task: coef_c = Sigma^-1 mu_c, intercept_c = -mu_c^T Sigma^-1 mu_c / 2 + log(n_c / N); logits =
   phi(x) coef^T + intercept (``_solve_lstsq`` with no extra ridge: "no lambda used when inverting", README).
Numerics: the embedding, the statistics, the solve (float64 Cholesky) and the logits are float64; logits are
returned as float32.

Defaults: the embedding on at M = 10,000 (``--embed_dim``'s default), which is what ``src/main.py`` computes for
every run, the pre-trained ViT ones included: its embedding branch tests only ``--embed_mode`` (default
``RanDumb``), never ``--embed``, so the ``vitbi1k_*``/``vitbi21k_*`` runs of ``scripts/runall.sh`` ("No embedding
for pretrained models", run without ``--embed``) still embed (the flag only names the log file). ``--set
embed=false`` gives what that comment intends (LDA on the raw features).

Memory and time: the covariance is M x M. While fewer training images than M have arrived (the embedded
benchmark's 2,320 at M = 10,000), its running sum is kept in low-rank form (each class's centred embedded samples,
scaled by sqrt(1 - s_c), their n x n Gram matrix, and the identity part) and the head is solved through the
Woodbury identity in an n x n system (``LDAStatistics.head``): the same numbers as the M x M solve (the golden test
holds it to 1e-9), at n^2 M + n^3 / 3 flops instead of M^3 / 3 per task. Past M images the sum becomes the dense
M x M matrix: the covariance sum, the copy that is factored, its Cholesky factor and the checkpoint's copy are
4 x 8 M^2 bytes (3.2 GB at M = 10,000, 20 GB at the README's example M = 25,000), and a width whose dense estimate
exceeds the available memory is refused before anything is computed (``check_memory``; conservative: the run may
never need the dense form). Measured in ``reports/perf/randumb-growth.json``. The checkpoint (``state_dict``) holds
neither Omega (drawn again from the run's seed on resume; its first row is kept and compared) nor the low-rank rows
and their Gram (rebuilt from the kept (N, d) training features, by the same operations: the same bits): about
10 MB per checkpoint of the embedded benchmark instead of the ~1 GB a dense zero covariance, Omega and the rows
took.

Deviations from the paper / reference code:

- ``embed`` switch: the reference has the flag but ignores it (above); here ``embed=False`` really skips the
  embedding. Default ``True``, what the reference runs.
- Streaming instead of one batch fit: the reference fits scikit-learn's LDA once on all training data. Because a
  class's images all arrive in one task, the per-class OAS estimates, the means and the counts are final when the
  class arrives, so the running sums give exactly the batch fit on the data seen so far after every task (the
  golden test checks both tasks against the batch fit).
- Random features: drawn from the run's seed (``ctx.generator``: Omega's normals then b's uniforms, torch's RNG)
  instead of scikit-learn's unseeded global numpy RNG (``random_state=None``); the golden test feeds the reference's
  own ``random_weights_``/``random_offset_`` in.
- gamma = "scale" uses the variance of the first task's training features (the data available when the embedding
  is fixed); the reference fits it on the whole training set, which a class-incremental learner never sees at
  once. It is then fixed for the run (kept in the state).
- The low-rank (Woodbury) solve above is an implementation choice with the reference's numbers; the reference forms
  the M x M covariance and calls ``lstsq`` on it.
- Float64 throughout (the reference runs float32 when the features are float32, as the saved ``.npy`` features are,
  since ``RBFSampler`` and the LDA preserve float32); the solve is a Cholesky solve where the reference calls
  ``scipy.linalg.lstsq``: the same answer for the positive definite Sigma that OAS gives (every class with at least
  2 images has a positive shrinkage target), and a clear error instead of a minimum-norm answer if Sigma is singular.
- A class with fewer than 2 training images is refused (its OAS covariance is zero; ``min_train_per_class = 2``).
- Not offered: the reference's ``--embed_mode RanPAC`` (a ReLU random projection: ``baselines/ranpac.py`` has it),
  ``--model NCM`` (the cosine nearest-mean classifier: ``simplecil``), and ``--augment`` (flipped copies of the
  training images' features: clbench's cache holds eval-transform features only). The reference reports the mean
  per-class accuracy (confusion-matrix diagonal); clbench reports its own metrics.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import psutil
import torch

from baselines.cards.randumb import CARD, RanDumbConfig, extra_counts
from clbench.errors import ClbenchError
from clbench.layers.first_session import check_width
from clbench.layers.lda import (
    F64,
    GROWTH_SHAPES,
    LDAStatistics,
    growth_report,
    growth_run,
    lda_logits,
    memory_estimate,
)
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.perf import Measurement

MEMORY_BATCH, MEMORY_CLASSES = 4096, 1000  # the task size and class count the memory check allows for


def scale_gamma(x: torch.Tensor) -> float:
    """RBFSampler's ``gamma='scale'``: 1 / (d Var(x)) over every entry of ``x`` (N, d); 1 if the variance is 0."""
    var = float(x.to(F64).var(unbiased=False))
    return 1.0 / (x.shape[1] * var) if var != 0 else 1.0


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


def check_memory(width: int) -> None:
    need, free = memory_estimate(width, MEMORY_BATCH, MEMORY_CLASSES), available_memory()
    if need > free:
        fits = int(math.sqrt(max(free - 24 * width * (MEMORY_BATCH + MEMORY_CLASSES), 0) / 32)) // 100 * 100
        raise ClbenchError(
            f"RanDumb with M={width}: the {width} x {width} covariance and its solve need about "
            f"{need / 2**30:.1f} GiB (~32 M^2 bytes), but only {free / 2**30:.1f} GiB of memory is available",
            f"lower M (--set M=...); about M={fits} fits now",
        )


@CARD.strategy
class RanDumb(Strategy[RanDumbConfig]):
    # scenarios: class only: each class's mean and OAS-shrunk statistics are added once (add_classes_oas);
    # a later domain of the same classes would need them merged, not done
    state_types = (LDAStatistics,)

    def __init__(self, config: RanDumbConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.dim = ctx.backbone.num_features
        self.width = config.M if config.embed else self.dim
        if config.embed:
            check_memory(self.width)  # before anything is computed
            g = ctx.generator(7100)
            self.omega = torch.randn(self.dim, self.width, generator=g, dtype=F64)  # (d, M) N(0, 1), scaled at task 0
            self.offset = torch.rand(self.width, generator=g, dtype=F64) * (2 * math.pi)  # (M,) U(0, 2 pi)
        else:
            self.omega = torch.zeros(0, 0, dtype=F64)
            self.offset = torch.zeros(0, dtype=F64)
        self.gamma = 0.0  # the RBF gamma in use (set by the first task with embed)
        self.stats = LDAStatistics(self.width)
        self.weight = torch.zeros(0, self.width, dtype=F64)  # (C, W) Sigma^-1 mu_c
        self.bias = torch.zeros(0, dtype=F64)  # (C,) -mu_c^T Sigma^-1 mu_c / 2 + log prior_c
        self.shrinkages: list[float] = []  # each class's OAS coefficient
        self.task_sizes: list[int] = []
        # The training features (N, d) float64 and labels of the tasks whose rows the low-rank sum holds: a checkpoint
        # keeps these instead of the rows (N, M) and their Gram (N, N) and rebuilds those on load (load_state_dict).
        self.features_seen = torch.zeros(0, self.dim, dtype=F64)
        self.labels_seen = torch.zeros(0, dtype=torch.long)
        self.images_per_task: list[int] = []

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x): (N, d) -> (N, W) float64; the random Fourier features sqrt(2/M) cos(x Omega + b) with embed."""
        x = x.to(F64)
        if not self.cfg.embed:
            return x
        return torch.cos(x @ self.omega + self.offset) * math.sqrt(2.0 / self.width)

    def learn_task(self, task: Task) -> None:
        if sorted(task.classes) != list(range(self.stats.means.shape[0], task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")
        if self.cfg.embed and self.gamma == 0.0:  # fix the embedding's scale on the first task
            self.gamma = self.cfg.gamma or scale_gamma(task.train.features)
            self.omega.mul_(math.sqrt(2.0 * self.gamma))  # RBFSampler: random_weights_ = sqrt(2 gamma) N(0, 1)
        self.stats.grow(task.n_seen)
        x = task.train.features.to(F64)  # (N_t, d)
        h = self.embed(x)  # (N_t, W)
        self.shrinkages += self.stats.add_classes_oas(h, task.train.labels, sorted(task.classes))
        del h
        if self.stats.low_rank_done:  # the sum is dense: no rows to rebuild, so no features to keep
            self.features_seen, self.labels_seen = self.features_seen[:0], self.labels_seen[:0]
        else:
            self.features_seen = torch.cat([self.features_seen, x])
            self.labels_seen = torch.cat([self.labels_seen, task.train.labels.long()])
        self.images_per_task.append(len(x))
        fix = "use at least 2 training images per class and a backbone whose features are not constant"
        self.weight, self.bias = self.stats.head(self.stats.priors().log(), "RanDumb", fix)
        self.task_sizes.append(len(task.classes))
        self.ctx.log(f"  RanDumb task {task.id}: OAS shrinkage {min(self.shrinkages):.3g}-{max(self.shrinkages):.3g}")

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        if protocol != PER_SAMPLE:
            raise ValueError(f"unknown protocol {protocol!r}; RanDumb supports {PER_SAMPLE}")
        logits = []
        for start in range(0, len(split), 1024):  # (1024, M) float64 at a time: memory, not the numbers
            logits.append(lda_logits(self.embed(split.features[start : start + 1024]), self.weight, self.bias))
        return torch.cat(logits) if logits else torch.zeros(0, self.weight.shape[0])  # (N, n_seen)

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """The random Fourier features phi(x) the LDA scores; None with ``embed`` off (the frozen features)."""
        return self.embed(split.features).float() if self.cfg.embed else None

    def diagnostics(self, split: Split, true_task: Any) -> dict[str, Any]:
        return {
            "width": self.width,
            "gamma": self.gamma if self.cfg.embed else None,
            "oas_shrinkage_min": min(self.shrinkages, default=None),
            "oas_shrinkage_max": max(self.shrinkages, default=None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_width("randumb", int(state["dim"]), self.dim)
        if int(state["width"]) != self.width:
            raise ClbenchError(
                f"randumb: the saved run's LDA works at width {state['width']}, this one at {self.width}",
                "resume with the same --set embed / M, or start over with --overwrite",
            )
        state = dict(state)
        first_row = state.pop("omega_first_row", None)
        regenerate = self.cfg.embed and "omega" not in state  # written by state_dict below (older states hold omega)
        super().load_state_dict(state)
        if regenerate and self.gamma != 0.0:  # __init__ drew Omega from the run's seed; scale it as task 0 did
            self.omega.mul_(math.sqrt(2.0 * self.gamma))
        if first_row is not None and not torch.equal(self.omega[:1], first_row):
            raise ClbenchError(
                "randumb: the saved run's random features are not the ones this run's seed draws",
                "resume with the same --seed, or start over with --overwrite",
            )
        if not self.stats.low_rank_done and len(self.features_seen):
            self._rebuild_rows()

    def state_dict(self) -> dict[str, Any]:
        """The learnt state without what the run's seed and the kept features give back: Omega (d x M) is drawn
        again from the seed (its first row is kept to check that), and the low-rank rows (N x M) and their Gram
        (N x N) are rebuilt from the training features (N x d): at M = 10,000 about 10 MB instead of 1 GB per
        checkpoint of the embedded benchmark."""
        state = super().state_dict()
        if self.cfg.embed:
            del state["omega"]
            state["omega_first_row"] = self.omega[:1].clone()
        if len(self.stats.rows):
            stats = copy.copy(self.stats)
            stats.rows, stats.gram = stats.rows[:0], stats.gram[:0, :0]
            state["stats"] = stats
        return state

    def _rebuild_rows(self) -> None:
        """The low-rank rows and Gram, task by task as learn_task built them (same shapes, so the same bits)."""
        start, first_class = 0, 0
        for n_images, n_classes in zip(self.images_per_task, self.task_sizes, strict=True):
            classes = list(range(first_class, first_class + n_classes))
            x, y = self.features_seen[start : start + n_images], self.labels_seen[start : start + n_images]
            self.stats.restore_rows(self.embed(x), y, classes, [self.shrinkages[c] for c in classes])
            start, first_class = start + n_images, first_class + n_classes

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        extra = extra_counts(self.cfg, self.dim)
        w = self.width
        kept = [
            (w + 1) * c + (w + 1) * c + (extra["covariance_floats"] + extra["random_features"] if t == 0 else 0)
            for t, c in enumerate(self.task_sizes)
        ]
        head = self.weight.numel() + self.bias.numel()
        added, stored = CARD.split_kept(kept, head, extra, self.task_sizes)
        return ParamCounts(
            added_per_task=added,
            stored_per_task=stored,
            trainable_per_task=[0] * len(self.task_sizes),
            head=head,
            extra=extra,
        )


GROWTH_WIDTHS = (1000, 2500, 5000)  # M on every shape; the reference's 10,000 on the embedded benchmark's


def _growth(flags: Any) -> dict[str, Any]:  # flags: the argparse namespace (no flags of its own)
    runs = []
    for c, t, d in GROWTH_SHAPES:
        runs.append({"embed": False, **growth_run(RanDumb, RanDumbConfig(embed=False), c, t, d)})
        for m in GROWTH_WIDTHS + ((10000,) if c == 36 else ()):
            cfg = RanDumbConfig(M=m)
            runs.append({"embed": True, "M": m, **growth_run(RanDumb, cfg, c, t, d)})
            runs[-1]["memory_estimate_mib"] = round(memory_estimate(m, c * 64 // t, c) / 2**20, 1)
    return growth_report("randumb-growth", runs)


# `clbench perf randumb-growth` (the card's ``perf_benchmarks``)
GROWTH = Measurement(
    "randumb-growth",
    help="RanDumb's fit + predict seconds and peak memory on synthetic features, without the embedding "
    "and with random Fourier features of M = 1,000-10,000: 36 classes / 6 tasks (d = 384) and 200 "
    "classes / 10 tasks (d = 384, 768)",
    run=_growth,
)
