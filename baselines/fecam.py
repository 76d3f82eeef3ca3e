"""FeCAM: a Mahalanobis-distance classifier from one shrunk, normalised covariance per class on frozen features.

Paper: Goswami et al., "FeCAM: Exploiting the Heterogeneity of Class Distributions in Exemplar-Free Continual
Learning", NeurIPS 2023, arXiv 2309.14062.
Reference implementations checked:

- the authors' ``dipamgoswami/FeCAM`` @ ``d2479b7bc9c3e704b0835ccd5928a2d7e0df5a09``: ``FeCAM_vit_cifar100.py``
  (``shrink_cov``, ``normalize_cov``, ``_mahalanobis`` and the task loop; also ``FeCAM_vit_imagenet-r.py``,
  ``FeCAM_vit_core50.py``), the paper's frozen pre-trained ViT experiments; and, for the ResNet experiments,
  ``models/fecam.py``, ``models/base.py`` (``shrink_cov``, ``normalize_cov``, ``_tukeys_transform``,
  ``_mahalanobis``), ``utils/maha_utils.py`` (``compute_new_cov``), ``exps/FeCAM_cifar100.json``;
- LAMDA-PILOT ``sun-hailong/LAMDA-PILOT`` @ ``264745534fc2233f5a50b020e50a3472c47eb756``: ``models/fecam.py``
  (``Learner.replace_fc``, ``shrink_cov``, ``_maha_dist``, ``_mahalanobis``, ``_init_train``), ``exps/fecam.json``.

clbench follows the authors' ViT scripts (``rule="authors"``, the default): they are the paper's own frozen
pre-trained ViT setting and train nothing. Algorithm, for each new class c of a task (d = backbone width):

1. z = f / ||f||: the frozen [CLS] feature, L2-normalised (the scripts' ``F.normalize(forward_features(x)[:, 0])``);
   optionally Tukey's power transform first (``tukey``: f^beta, log f for beta = 0; models/base.py).
2. mu_c = mean of z over c's training images; S_c = their sample covariance (``np.cov``, n - 1).
3. Shrinkage: S_c + alpha1 * V1 * I + alpha2 * V2 * (1 - I), V1 = mean of S_c's diagonal, V2 = mean of its non-zero
   off-diagonal entries (``shrink_cov``; alpha1 = 1, alpha2 = 0 in ``FeCAM_vit_cifar100.py``).
4. Normalisation to a correlation matrix: S_ij / (sigma_i sigma_j), sigma = sqrt(diag S) (``normalize_cov``).
5. P_c = S^-1, computed once per class (float64 Cholesky; the reference's pseudo-inverse equals the inverse of this
   positive definite matrix).
6. Prediction: the class with the smallest squared Mahalanobis distance (z - mu_c)^T P_c (z - mu_c); the logits are
   the negated distances, so argmax logits = argmin distance.

PILOT differs from the authors' ViT scripts in five ways; ``rule="pilot"`` reproduces its classifier (3-5) on
the frozen features:
(1) it trains AdaptFormer adapters (r = 64) and a cosine head on the first task for 20 epochs (SGD 0.01, batch 48,
``exps/fecam.json``, ``_init_train``), as APER and RanPAC do, and computes every statistic from the adapted ViT;
(2) no Tukey transform; (3) the covariance is taken of the raw, unnormalised features (while the distance uses
L2-normalised features and means); (4) shrinkage adds a fixed 100 * I (``self.alpha = 100``) instead of a multiple
of the mean variance; (5) ``torch.corrcoef(S + 100 I)``, the correlation between the *rows* of the shrunk covariance
(a rank d - 1 matrix: every centred row is orthogonal to S^-1 1), inverted with ``torch.linalg.pinv`` in float32.

Deviations from the paper / reference code:

- No first-session training (PILOT's (1)): clbench's FeCAM is the frozen-feature method of the authors' ViT scripts;
  ``rule="pilot"`` reproduces PILOT's classifier on the frozen features, not its adapted backbone.
- Defaults from ``FeCAM_vit_cifar100.py`` (alpha1 = 1, alpha2 = 0); the ImageNet-R script uses 10 and 10 and the
  ResNet config (``exps/FeCAM_cifar100.json``) 1 and 1: all are ``--set alpha1=... alpha2=...``.
- Tukey (``tukey=true``, the ResNet experiments' ``beta`` = 0.5) is off by default, as in the authors' ViT scripts:
  ViT features are signed and x^0.5 of a negative entry is undefined, so a Tukey run on features with a negative
  entry (a zero, for beta = 0) is refused. Where it is on, it is applied to every feature before the L2
  normalisation, for training and test alike; the ResNet code takes the covariance of Tukey-transformed raw features
  but the distance on normalised, transformed, renormalised ones (models/base.py ``_maha_dist``), which is not
  reproduced, nor the ResNet learner's first task (classified by its trained head's weights, identity covariance).
- Numerics (the only float64 in the method): statistics, shrinkage, normalisation, the inverse and the distances are
  float64 (the authors' numpy script computes the covariance and its pseudo-inverse in float64 too; PILOT runs
  float32). The inverse is computed once per class when the class is learnt (the references recompute a
  pseudo-inverse for every class on every test batch), by a Cholesky factorisation: a shrunk covariance that is not
  numerically positive definite (alpha1 = 0 with fewer images than dimensions; a class whose images are all
  alike) is refused with the class named, where the pseudo-inverse would silently drop directions.
  ``rule="pilot"`` keeps the pseudo-inverse, which its singular matrix needs (float64, hermitian).
- A class with fewer than 2 training images has no covariance and is refused (``min_train_per_class = 2``; the
  references return NaN). A run whose precision matrices would not fit in memory is refused before they are built
  (8 d^2 bytes per class, twice with the checkpoint's copy: ``memory_estimate``): 36 classes at d = 384 take 42 MB,
  200 classes at d = 768 take 0.94 GB (1.9 GB with the checkpoint). Measured by ``clbench perf fecam-growth``
  (``reports/perf/fecam-growth.json``): fit + predict raise the resident set by 0.17 GB and 1.83 GB there (the
  per-class d x d temporaries leave allocator slack). Prediction costs 2 d^2 flops per image and seen class.
- Features come from clbench's cache (the eval transform, computed once per image); the reference's width 768
  (``np.eye(768)``) is the backbone's ``num_features`` here. The Mahalanobis computation is per sample (the references
  compute the full N x N product per batch and keep its diagonal: the same numbers).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psutil
import torch
import torch.nn.functional as F

from baselines.cards.fecam import CARD, FeCAMConfig
from clbench.errors import ClbenchError
from clbench.layers.checks import check_protocol
from clbench.layers.first_session import check_width
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.perf import Measurement, arg


# ----------------------------------------------------------------------------------------------- the statistics
def tukey_transform(f: torch.Tensor, beta: float) -> torch.Tensor:
    """Tukey's ladder of powers, f^beta (log f for beta = 0), elementwise; refuses features it is undefined on."""
    low = float(f.min()) if f.numel() else 0.0
    if low < 0 or (beta == 0 and low <= 0):
        raise ClbenchError(
            f"FeCAM's Tukey transform ({'log f' if beta == 0 else f'f^{beta:g}'}) needs "
            f"{'positive' if beta == 0 else 'non-negative'} features, but this backbone's features reach {low:.3g} "
            "(a ViT's [CLS] features are signed)",
            "use --set tukey=false (the authors' ViT scripts use none), or a backbone with non-negative features",
        )
    return torch.log(f) if beta == 0 else f.pow(beta)


def embed(f: torch.Tensor, cfg: FeCAMConfig) -> torch.Tensor:
    """(N, d) features -> (N, d) float64 z: Tukey-transformed (if on), then L2-normalised."""
    z = f.double()
    if cfg.tukey:
        z = tukey_transform(z, cfg.beta)
    return F.normalize(z, dim=-1)


def shrink_cov(cov: torch.Tensor, alpha1: float, alpha2: float) -> torch.Tensor:
    """S + alpha1 V1 I + alpha2 V2 (1 - I): V1 the mean diagonal entry, V2 the mean non-zero off-diagonal entry."""
    d = cov.shape[0]
    eye = torch.eye(d, dtype=cov.dtype)
    off = cov * (1 - eye)
    nonzero = int((off != 0).sum())
    v1 = cov.diagonal().mean()
    v2 = off.sum() / nonzero if nonzero else off.sum()  # the reference's mask mean (0 / 0 there: no off-diagonal)
    return cov + alpha1 * v1 * eye + alpha2 * v2 * (1 - eye)


def normalize_cov(cov: torch.Tensor) -> torch.Tensor:
    """The correlation matrix S_ij / (sigma_i sigma_j), sigma = sqrt(diag S)."""
    sd = cov.diagonal().sqrt()  # (d,)
    return cov / (sd[:, None] * sd[None, :])


def inverse_pd(cov: torch.Tensor, what: str) -> torch.Tensor:
    """The inverse of a symmetric positive definite matrix by Cholesky (float64); refuses one that is not."""
    factor, info = torch.linalg.cholesky_ex(cov) if bool(torch.isfinite(cov).all()) else (None, 1)
    if factor is None or int(info) != 0:
        raise ClbenchError(
            f"FeCAM: the shrunk covariance of {what} is singular (not positive definite in float64)",
            "shrink it (--set alpha1=1, the reference's; alpha1 > 0 makes it positive definite unless every image "
            "of the class has the same feature), or give the class more distinct training images",
        )
    return torch.cholesky_inverse(factor)


def class_statistics(z: torch.Tensor, cfg: FeCAMConfig, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One class's mean and precision matrix from its training features: (n, d) -> (d,), (d, d), float64.

    ``z``: the class's embedded features (:func:`embed`) for ``rule="authors"``, its raw features for ``"pilot"``."""
    z = z.double()
    cov = torch.cov(z.T)  # (d, d), n - 1 in the denominator (np.cov, torch.cov)
    if cfg.rule == "pilot":  # PILOT replace_fc: corrcoef(cov(raw) + alpha I), then pinv; means normalised later
        corr = torch.corrcoef(cov + cfg.pilot_alpha * torch.eye(cov.shape[0], dtype=cov.dtype))
        return F.normalize(z.mean(0), dim=-1), torch.linalg.pinv(corr, hermitian=True)
    shrunk = shrink_cov(cov, cfg.alpha1, cfg.alpha2)
    return z.mean(0), inverse_pd(normalize_cov(shrunk) if cfg.norm_cov else shrunk, what)


def mahalanobis(z: torch.Tensor, mean: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """Squared distances (z_i - mu)^T P (z_i - mu) of every row: (N, d), (d,), (d, d) -> (N,)."""
    diff = z - mean  # (N, d)
    return ((diff @ precision) * diff).sum(dim=1)


# ----------------------------------------------------------------------------------------------- memory
def memory_estimate(n_classes: int, d: int) -> int:
    """Bytes of FeCAM's statistics for ``n_classes`` classes: a float64 d x d precision matrix and a d mean per class
    (8 (d^2 + d) each), twice (the checkpoint serialises a copy), plus one class's transient covariance work
    (covariance, shrunk, normalised, factor, inverse: 5 x 8 d^2)."""
    return 16 * n_classes * (d * d + d) + 40 * d * d


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


def check_memory(n_new: int, d: int) -> None:
    need, free = memory_estimate(n_new, d), available_memory()
    if need > free:
        raise ClbenchError(
            f"FeCAM: {n_new} more classes' d x d precision matrices (d = {d}) need about {need / 2**30:.2f} GiB "
            f"(16 (d^2 + d) bytes per class with the checkpoint's copy), but only {free / 2**30:.2f} GiB is available",
            "free memory, use a narrower backbone, or run fewer classes",
        )


# ----------------------------------------------------------------------------------------------- the strategy
@CARD.strategy
class FeCAM(Strategy[FeCAMConfig]):
    # scenarios: class only: each class's covariance is shrunk and normalised once from its images and kept per
    # task; a later domain would need the raw second moments (not kept), and a second block would repeat the classes

    def __init__(self, config: FeCAMConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.dim = ctx.backbone.num_features
        self.means: list[torch.Tensor] = []  # per task: (C_t, d) float64 class means (of z; normalised for "pilot")
        self.precisions: list[torch.Tensor] = []  # per task: (C_t, d, d) float64 inverse shrunk covariances
        self.n_classes = 0

    def learn_task(self, task: Task) -> None:
        if sorted(task.classes) != list(range(self.n_classes, task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")
        labels = task.train.labels
        counts = torch.bincount(labels, minlength=task.n_seen)[task.classes]
        if int(counts.min()) < 2:
            raise ClbenchError(
                f"task {task.id}: FeCAM needs >= 2 training images per class for the class covariance "
                f"(class {task.classes[int(counts.argmin())]} has {int(counts.min())})",
                "use more training images per class (--train-per-class 2 or more)",
            )
        check_memory(len(task.classes), self.dim)
        z = task.train.features.double() if self.cfg.rule == "pilot" else embed(task.train.features, self.cfg)
        stats = [class_statistics(z[labels == c], self.cfg, f"class {c} (task {task.id})") for c in task.classes]
        self.means.append(torch.stack([m for m, _ in stats]))  # (C_t, d)
        self.precisions.append(torch.stack([p for _, p in stats]))  # (C_t, d, d)
        self.n_classes = task.n_seen

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "FeCAM")
        z = embed(split.features, self.cfg)  # (N, d) float64 (both rules normalise the test feature)
        dists = [  # one column per class, each row from its own image only
            mahalanobis(z, mean, precision)
            for means, precisions in zip(self.means, self.precisions, strict=True)
            for mean, precision in zip(means, precisions, strict=True)
        ]
        if not dists:
            return torch.zeros(len(split), 0)
        return (-torch.stack(dists, dim=1)).float()  # (N, n_seen): the nearest class by Mahalanobis has the top logit

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """The Tukey-transformed, normalised features the Mahalanobis distances are taken on; None without the
        transform (the normalised frozen features: the reference panel)."""
        return embed(split.features, self.cfg).float() if self.cfg.tukey else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_width("fecam", int(state["dim"]), self.dim)
        super().load_state_dict(state)

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        stored = [m.numel() + p.numel() for m, p in zip(self.means, self.precisions, strict=True)]
        return ParamCounts(
            added_per_task=[0] * len(stored),
            stored_per_task=stored,
            trainable_per_task=[0] * len(stored),
            head=sum(stored),
        )


# ----------------------------------------------------------------------------------------------- perf (classes, tasks,
# d, test images per class): the embedded benchmark's shape (942 test images: 26 per class), then 200 classes at both
# widths with 5 test images per class (prediction costs 2 d^2 flops per image and class: one evaluation of 200 x 30
# images at d = 768 is 1.4 Tflop in float64, minutes on 2 cores; the per-(image, class) cost is what the rows record,
# and the evaluations after every task of a real run are extrapolated from it)
GROWTH_SHAPES = ((36, 6, 384, 26), (200, 10, 384, 5), (200, 10, 768, 5))


class PeakRSS:
    """The peak growth of the process's resident set (``psutil`` RSS, sampled every 5 ms by a thread) while the
    ``with`` block runs, in bytes (``.peak``): tracemalloc would not see torch's allocations."""

    def __enter__(self) -> PeakRSS:
        import threading

        self.process, self.done = psutil.Process(), threading.Event()
        self.start = self.top = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.top = max(self.top, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.top, self.process.memory_info().rss) - self.start


def synthetic_split(centres: torch.Tensor, classes: range, n: int, g: torch.Generator) -> Split:
    """``n`` features per class around the class centres (no images: FeCAM reads features only)."""
    y = torch.arange(classes.start, classes.stop).repeat_interleave(n)  # (n |classes|,)
    feats = centres[y] + 0.5 * torch.randn(len(y), centres.shape[1], generator=g)  # (n |classes|, d)
    return Split(None, y.numpy(), y, feats, None, None)  # type: ignore[arg-type]  # no image source


def growth_row(n_classes: int, n_tasks: int, d: int, test_per_class: int, train_per_class: int) -> dict[str, Any]:
    """One shape of ``fecam-growth``: fit every task, then predict ``test_per_class`` images of every class once."""
    import types

    g = torch.Generator().manual_seed(0)
    centres = torch.randn(n_classes, d, generator=g)
    per = n_classes // n_tasks
    tasks = [
        Task(t, list(classes), (t + 1) * per, synthetic_split(centres, classes, train_per_class, g))
        for t, classes in enumerate(range(t * per, (t + 1) * per) for t in range(n_tasks))
    ]
    test = synthetic_split(centres, range(n_classes), test_per_class, g)
    backbone = types.SimpleNamespace(num_features=d)  # FeCAM reads the width only
    ctx = Context(backbone, torch.device("cpu"), "fp32", 0, log=lambda s: None)  # type: ignore[arg-type]
    with PeakRSS() as memory:
        strategy = FeCAM(FeCAMConfig(), ctx)
        start = time.perf_counter()
        for task in tasks:
            strategy.learn_task(task)
        fit = time.perf_counter() - start
        start = time.perf_counter()
        strategy.predict(test)
        pred = time.perf_counter() - start
    stored = sum(
        m.numel() * m.element_size() + p.numel() * p.element_size()
        for m, p in zip(strategy.means, strategy.precisions, strict=True)
    )
    per_pair = pred / (len(test) * n_classes)
    # a run evaluates the seen classes' test images after every task: sum_t (t + 1)^2 of the last task's pairs / T^2
    pairs_all_tasks = sum(((t + 1) * per) ** 2 for t in range(n_tasks)) * test_per_class
    return {
        "classes": n_classes,
        "tasks": n_tasks,
        "d": d,
        "train_per_class": train_per_class,
        "test_per_class": test_per_class,
        "fit_seconds_all_tasks": round(fit, 3),
        "predict_seconds_once": round(pred, 3),
        "predict_microseconds_per_image_and_class": round(per_pair * 1e6, 3),
        "eval_seconds_after_every_task_estimate": round(per_pair * pairs_all_tasks, 2),
        "stored_statistics_bytes": stored,
        "memory_estimate_bytes": memory_estimate(n_classes, d),
        "peak_rss_growth_bytes": memory.peak,
    }


def fecam_growth(
    shapes: tuple[tuple[int, int, int, int], ...] = GROWTH_SHAPES, train_per_class: int = 64
) -> dict[str, Any]:
    """Seconds (``time.perf_counter``) and peak memory (:class:`PeakRSS`) of fitting and predicting FeCAM on synthetic
    features at each (classes, tasks, d, test images per class) of ``shapes``."""
    return {
        "benchmark": "fecam-growth",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory": "peak_rss_growth_bytes: psutil RSS sampled every 5 ms during fit + predict, minus the RSS before",
        "eval_estimate": "predict_microseconds_per_image_and_class x the (image, seen class) pairs of evaluations "
        "after every task at test_per_class images per class",
        "rows": [growth_row(*shape, train_per_class=train_per_class) for shape in shapes],
    }


def _growth(flags: argparse.Namespace) -> dict[str, Any]:
    return fecam_growth(train_per_class=flags.train_per_class)


GROWTH = Measurement(
    "fecam-growth",
    help="FeCAM's fit and predict seconds and peak memory on synthetic features: 36 classes / 6 tasks at d = 384 "
    "(the embedded benchmark's shape) and 200 classes / 10 tasks at d = 384 and 768",
    run=_growth,
    args=(arg("--train-per-class", type=int, default=64, help="training images per class (default: 64)"),),
)
