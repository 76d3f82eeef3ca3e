"""How sure a number is: bootstrap intervals over test images, hierarchical intervals over seeds, paired tests
between methods and the Holm correction. Pure numpy, vectorised, and seeded: the same inputs give the same interval.

- One run: the 95 % percentile interval of a bootstrap over test images that resamples *within each class*
  (stratified), so every resample keeps the test set's class balance; accuracies after every task use the same
  resampled images, so ``avg_acc``'s interval accounts for the images shared between tasks.
- Several seeds (the same test images): a hierarchical bootstrap, seeds drawn with replacement, then the images
  (one stratified resample shared by the drawn seeds, since every seed was tested on the same images).
- Two methods on the same images and seeds: a paired bootstrap over images of the difference in accuracy (each
  image carries its difference averaged over the seeds; p-value: the share of resampled differences, centred on the
  observed one, at least as far from zero as the observed difference), or, for one seed, the exact McNemar test on
  the discordant images. :func:`holm` corrects p-values for the number
  of pairs.

Everything is in the units of its input (the harness passes 0/1 correctness, intervals come out in percent after
``100 *``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 2000  # resamples per interval: the 2.5 % and 97.5 % percentiles move by < 0.1 points between seeds
LEVEL = 0.95
SEED = 20260101  # the bootstrap's own seed: a record's interval is reproducible (and equal after a resume)
_CHUNK = 256  # resamples per block: bounds memory to _CHUNK * N_test weights


@dataclass(frozen=True)
class Interval:
    """A value with its two-sided interval."""

    value: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def scaled(self, k: float) -> Interval:
        return Interval(self.value * k, self.lo * k, self.hi * k)

    def to_list(self) -> list[float]:
        return [self.lo, self.hi]


def _strata_slots(strata: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every position of the stratum-sorted order: the original index order, its stratum's start and size."""
    strata = np.asarray(strata)
    order = np.argsort(strata, kind="stable")
    _, start, size = np.unique(strata[order], return_index=True, return_counts=True)
    slot_start = np.repeat(start, size)
    slot_size = np.repeat(size, size)
    return order, slot_start, slot_size


def resample_weights(strata: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, N) float32: how often each of the N images is drawn in each of ``n`` stratified resamples (every
    stratum keeps its size)."""
    order, slot_start, slot_size = _strata_slots(strata)
    size = len(order)
    picks = slot_start + (rng.random((n, size)) * slot_size).astype(np.int64)  # (n, N) sorted positions
    flat = (np.arange(n)[:, None] * size + order[picks]).ravel()
    return np.bincount(flat, minlength=n * size).reshape(n, size).astype(np.float32)


def bootstrap_means(
    values: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """Stratified bootstrap of column means: ``values`` (N, M) with NaN where a row does not count (an image not
    yet seen after task t); returns (n_resamples, M). Every column of a resample uses the same resampled rows."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        values = values[:, None]
    mask = ~np.isnan(values)
    filled = np.where(mask, values, 0.0).astype(np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, values.shape[1]))
    for s in range(0, n_resamples, _CHUNK):
        w = resample_weights(strata, min(_CHUNK, n_resamples - s), rng)  # (b, N)
        out[s : s + len(w)] = (w @ filled) / np.maximum(w @ mask.astype(np.float32), 1)
    return out


def percentile_interval(value: float, draws: np.ndarray, level: float = LEVEL) -> Interval:
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(value), float(lo), float(hi))


def run_intervals(
    correct: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> tuple[Interval, Interval]:
    """Final and average accuracy (percent) of one run with their stratified-bootstrap intervals. ``correct`` (N, T):
    1/0 per test image after every task, NaN where the image was not yet seen; ``strata`` (N,): its class."""
    correct = np.asarray(correct, dtype=np.float64)
    draws = bootstrap_means(correct, strata, n_resamples, seed)  # (B, T)
    curve = np.nanmean(correct, axis=0)
    last = percentile_interval(curve[-1], draws[:, -1]).scaled(100)
    avg = percentile_interval(curve.mean(), draws.mean(axis=1)).scaled(100)
    return last, avg


def hierarchical_draws(
    values: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """Hierarchical bootstrap of the mean over seeds: ``values`` (S, N, M) per seed, image and column (NaN: does not
    count); returns (n_resamples, M). Each resample draws S seeds with replacement and one stratified image resample
    that all drawn seeds share (they were tested on the same images)."""
    values = np.asarray(values, dtype=np.float64)
    n_seeds, n_img, m = values.shape
    mask = ~np.isnan(values)
    filled = np.where(mask, values, 0.0).astype(np.float32).transpose(1, 0, 2).reshape(n_img, n_seeds * m)
    counts = mask.astype(np.float32).transpose(1, 0, 2).reshape(n_img, n_seeds * m)
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, m))
    for s in range(0, n_resamples, _CHUNK):
        b = min(_CHUNK, n_resamples - s)
        w = resample_weights(strata, b, rng)
        per_seed = ((w @ filled) / np.maximum(w @ counts, 1)).reshape(b, n_seeds, m)  # (b, S, M)
        pick = rng.integers(0, n_seeds, (b, n_seeds))  # (b, S) seeds drawn
        out[s : s + b] = np.take_along_axis(per_seed, pick[:, :, None], axis=1).mean(axis=1)
    return out


def seeds_interval(
    correct: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> tuple[Interval, Interval]:
    """Mean over seeds of final and average accuracy (percent), hierarchical intervals. ``correct`` (S, N, T)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.shape[0] < 2:
        raise ValueError("an interval over seeds needs at least two seeds")
    draws = hierarchical_draws(correct, strata, n_resamples, seed)
    curves = np.nanmean(correct, axis=1)  # (S, T)
    last = percentile_interval(curves[:, -1].mean(), draws[:, -1]).scaled(100)
    avg = percentile_interval(curves.mean(), draws.mean(axis=1)).scaled(100)
    return last, avg


# ----------------------------------------------------------------------------------------------- paired tests
@dataclass(frozen=True)
class PairedTest:
    """A minus B in percentage points, its interval, and the two-sided p-value of "no difference"."""

    diff: Interval
    p: float
    test: str  # "exact McNemar" / "paired bootstrap"


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes (binomial test on the discordant images)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    n01, n10 = int((a & ~b).sum()), int((~a & b).sum())
    n = n01 + n10
    if n == 0:
        return 1.0
    k = np.arange(min(n01, n10) + 1)
    logpmf = _log_comb(n, k) - n * math.log(2)
    return float(min(1.0, 2 * np.exp(logpmf).sum()))


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    lg = np.vectorize(math.lgamma, otypes=[float])
    return math.lgamma(n + 1) - lg(k + 1) - lg(n - k + 1)


def bootstrap_p(observed: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Two-sided p-values from bootstrap draws of a difference: the share of draws, centred on the observed
    difference, at least as far from 0 as it. ``observed`` (...,), ``draws`` (B, ...)."""
    far = np.abs(draws - observed) >= np.abs(observed) - 1e-12
    return (1 + far.sum(axis=0)) / (draws.shape[0] + 1)


def paired_test(
    a: np.ndarray, b: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> PairedTest:
    """A against B on the same images: ``a``, ``b`` (S, N) 0/1 final correctness per seed (the same seeds in the
    same order). The interval: a stratified bootstrap over test images, each image carrying its difference averaged
    over the seeds (both methods ran the same seeds, so the seeds are held fixed, as a paired design does). The
    p-value: exact McNemar for one seed, that bootstrap's for several. (Resampling the seeds as well would count
    each seed's image-level noise twice: under the null such a test almost never rejects, see tests/test_stats.py.)"""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need the same shape, got {a.shape} and {b.shape}")
    d = (a - b).mean(axis=0)  # (N,) per image, over seeds
    draws = bootstrap_means(d, strata, n_resamples, seed)[:, 0]
    observed = float(d.mean())
    diff = percentile_interval(observed, draws).scaled(100)
    if a.shape[0] == 1:
        return PairedTest(diff, mcnemar_exact(a[0], b[0]), "exact McNemar")
    return PairedTest(diff, float(bootstrap_p(np.array(observed), draws[:, None])[0]), "paired bootstrap")


def holm(p: np.ndarray | list[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where adjusted < alpha."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out
