"""How sure a number is: bootstrap intervals over test images, seed-level intervals over training runs, paired
tests between methods and the Holm correction. Pure numpy (scipy for the t quantiles), vectorised, and seeded: the
same inputs give the same interval.

- One run: the 95 % percentile interval of a bootstrap over test images that resamples *within each class*
  (stratified), so every resample keeps the test set's class balance; accuracies after every task use the same
  resampled images, so ``avg_acc``'s interval accounts for the images shared between tasks. A protocol whose
  predictions depend on the test batch (``reference`` rows that route or vote per batch, or drift state per batch)
  is resampled by whole test batches instead (a block bootstrap over the batches as the protocol formed them:
  :func:`block_weights`), since images of one batch are not independent.
- Several seeds (the same test images): :func:`seed_level`, a t interval over the seeds combined with the test-image
  variance the seeds share. The mean over S seeds varies by ``sigma_seed^2 / S`` (training runs; the spread of the
  per-seed accuracies estimates it, with S - 1 degrees of freedom) plus the variance of drawing this test set, which
  all seeds share and which the seed spread therefore cannot show. That shared part is the analytic variance of
  the stratified (or block) image bootstrap of the seed-averaged correctness, less the part of it that is each seed's
  own image noise (already in the seed spread: :func:`_shared_image_var`). The two add; the interval is
  ``mean +- t_q(df) * sqrt(seed^2/S + image)`` with Welch-Satterthwaite's ``df`` (S - 1 when the seeds dominate,
  large when the images do). Why not the hierarchical bootstrap of the previous version (:func:`hierarchical_draws`,
  kept for the tests): a percentile bootstrap over 5 seeds under-covers when the seed spread dominates (it uses
  the normal quantile and the ``(S-1)/S``-biased spread: about 90 % where 95 % is claimed, tests/test_stats.py); a
  studentised bootstrap over 5 seeds is unstable. The analytic form has no Monte-Carlo error.
- Two methods on the same images and seeds: every printed difference's interval and its p-value come from one
  procedure, so that the interval excludes 0 exactly when the unadjusted test rejects at 5 %. One seed:
  :func:`paired_test`, the paired bootstrap over test images (within classes; by whole test batches for a
  batch-coupled protocol), its percentile interval and the bootstrap p of the same draws (:func:`percentile_bootstrap`;
  it conditions on the two trained runs: test-image noise only). Several seeds, the unit is the seed:
  :func:`paired_seed_test`, the t test of the per-seed differences with the shared test-image variance added as
  above (it generalises over training runs and test images), whose p is solved from its own interval
  (:func:`_combined_p`). :func:`mcnemar_exact` and :func:`sign_flip_p` stay as library functions (tests) but no
  report prints them beside another test's interval. A resampling p-value at its floor (``1 / B``: no resample
  reached 0) is a bound, not a value: :class:`PairedTest` says so (``at_floor``) and :func:`holm_bounds` keeps a
  Holm-adjusted bound a bound. :func:`holm` corrects p-values for the number of pairs.

Everything is in the units of its input (the harness passes 0/1 correctness, intervals come out in
percent after ``100 *``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# Resamples per bootstrap. Measured (tests/test_stats_resolution.py, 942 test images, 40 bootstrap seeds): with
# 2,000 a one-run interval's printed half-width moves by sd 0.06 points between bootstrap seeds (an endpoint by
# 0.09), with 10,000 by 0.03 (an endpoint by 0.045, where one image is 0.106 points). Reports print intervals to
# one decimal (INTERVAL_DECIMALS), which 10,000 supports; the second decimal would be noise at either count.
N_RESAMPLES = 10_000
INTERVAL_DECIMALS = 1
# The record's own ``last_acc_ci`` / ``avg_acc_ci`` (run_intervals, written by the harness): 2,000 resamples, as
# clbench.evaluation.metrics.DEFINITIONS states and every committed record was made; kept so that records stay
# comparable (the reports recompute their intervals from the predictions with N_RESAMPLES).
RECORD_RESAMPLES = 2000
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


def block_weights(blocks: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, N) float32: how often each of the N images is drawn in each of ``n`` block resamples: the K blocks
    (``blocks`` (N,): each image's block id, e.g. its test batch) are drawn K times with replacement and an image
    counts as often as its block was drawn."""
    _, block_of = np.unique(np.asarray(blocks), return_inverse=True)
    k = int(block_of.max()) + 1
    picks = rng.integers(0, k, (n, k))
    counts = np.zeros((n, k), np.float32)
    np.add.at(counts, (np.arange(n)[:, None], picks), 1.0)
    return counts[:, block_of]


def bootstrap_means(
    values: np.ndarray,
    strata: np.ndarray,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    blocks: np.ndarray | None = None,
) -> np.ndarray:
    """Stratified bootstrap of column means: ``values`` (N, M) with NaN where a row does not count (an image not
    yet seen after task t); returns (n_resamples, M). Every column of a resample uses the same resampled rows.
    ``blocks`` (N,): resample whole blocks (test batches) instead of images within classes (:func:`block_weights`)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        values = values[:, None]
    mask = ~np.isnan(values)
    filled = np.where(mask, values, 0.0).astype(np.float32)
    out = np.empty((n_resamples, values.shape[1]))
    s = 0
    for w in _weight_chunks(strata, n_resamples, seed, blocks):  # (b, N) each
        out[s : s + len(w)] = (w @ filled) / np.maximum(w @ mask.astype(np.float32), 1)
        s += len(w)
    return out


_WEIGHTS_CACHE: dict[tuple[bytes, bytes, int, int], list[np.ndarray]] = {}
_CACHE_MAX_ENTRIES = 40_000_000  # weights kept (float32: 160 MB); the report's 10,000 x 942 is 9.4 million


def _weight_chunks(
    strata: np.ndarray, n_resamples: int, seed: int, blocks: np.ndarray | None
) -> list[np.ndarray] | Iterator[np.ndarray]:
    """The resampling weights of :func:`bootstrap_means`, chunk by chunk, drawn from ``seed`` in order. The same
    (strata, blocks, count, seed) always give the same weights, so they are kept for the next call (a report tests
    hundreds of pairs on one test set): the numbers are those of drawing them afresh."""
    strata = np.asarray(strata)
    key = (
        strata.tobytes() + str(strata.dtype).encode(),
        b"" if blocks is None else np.asarray(blocks).tobytes(),
        n_resamples,
        seed,
    )
    if key in _WEIGHTS_CACHE:
        return _WEIGHTS_CACHE[key]
    rng = np.random.default_rng(seed)

    def draw() -> Iterator[np.ndarray]:
        for s in range(0, n_resamples, _CHUNK):
            b = min(_CHUNK, n_resamples - s)
            yield resample_weights(strata, b, rng) if blocks is None else block_weights(blocks, b, rng)

    if n_resamples * len(strata) > _CACHE_MAX_ENTRIES:
        return draw()
    chunks = list(draw())
    while sum(c.size for v in _WEIGHTS_CACHE.values() for c in v) + n_resamples * len(strata) > _CACHE_MAX_ENTRIES:
        _WEIGHTS_CACHE.pop(next(iter(_WEIGHTS_CACHE)))  # the oldest first
    _WEIGHTS_CACHE[key] = chunks
    return chunks


def percentile_interval(value: float, draws: np.ndarray, level: float = LEVEL) -> Interval:
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(value), float(lo), float(hi))


def run_intervals(
    correct: np.ndarray, strata: np.ndarray, n_resamples: int = RECORD_RESAMPLES, seed: int = SEED
) -> tuple[Interval, Interval]:
    """Final and average accuracy (percent) of one run with their stratified-bootstrap intervals, as the record
    keeps them (:data:`RECORD_RESAMPLES`). ``correct`` (N, T): 1/0 per test image after every task, NaN where the
    image was not yet seen; ``strata`` (N,): its class."""
    correct = np.asarray(correct, dtype=np.float64)
    draws = bootstrap_means(correct, strata, n_resamples, seed)  # (B, T)
    curve = np.nanmean(correct, axis=0)
    last = percentile_interval(curve[-1], draws[:, -1]).scaled(100)
    avg = percentile_interval(curve.mean(), draws.mean(axis=1)).scaled(100)
    return last, avg


def hierarchical_draws(
    values: np.ndarray, strata: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """The previous version's interval over seeds, kept to show in the tests why it was replaced (it under-covers
    where the seed spread dominates): hierarchical bootstrap of the mean over seeds, ``values`` (S, N, M) per seed,
    image and column (NaN: does not count); returns (n_resamples, M). Each resample draws S seeds with replacement
    and one stratified image resample that all drawn seeds share (they were tested on the same images)."""
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


# ----------------------------------------------------------------------------------------------- seed level
def with_average(values: np.ndarray) -> np.ndarray:
    """``values`` (..., N, T) with one more column: each image's share of the mean over tasks of the per-task
    accuracies (``avg_acc``), so that its column mean is ``avg_acc`` (NaN where an image counts in no task)."""
    values = np.asarray(values, dtype=np.float64)
    mask = ~np.isnan(values)
    n_img, n_cols = values.shape[-2], values.shape[-1]
    seen = mask.sum(axis=-2, keepdims=True)  # (..., 1, T) images counted per task
    share = np.where(mask, values, 0.0) * n_img / np.maximum(seen, 1) / n_cols
    return np.concatenate([values, share.sum(axis=-1, keepdims=True)], axis=-1)


def image_var(values: np.ndarray, strata: np.ndarray | None = None, blocks: np.ndarray | None = None) -> np.ndarray:
    """The variance of each column mean of ``values`` (..., N, M) (NaN: does not count) under the image bootstrap,
    in closed form (first order, exact for a stratified mean): within classes ``sum_c n_c var_c / n^2``, by blocks
    ``sum_k (sum_(i in k) (x_i - mean))^2 / n^2``. Give ``strata`` (N,) or ``blocks`` (N,)."""
    values = np.asarray(values, dtype=np.float64)
    mask = ~np.isnan(values)
    n = np.maximum(mask.sum(axis=-2, keepdims=True), 1)
    mean = np.where(mask, values, 0.0).sum(axis=-2, keepdims=True) / n
    dev = np.where(mask, values - mean, 0.0)  # (..., N, M)
    groups = blocks if blocks is not None else strata
    if groups is None:
        raise ValueError("image_var needs strata or blocks")
    _, g = np.unique(np.asarray(groups), return_inverse=True)
    k = int(g.max()) + 1
    moved = np.moveaxis(dev, -2, 0)  # (N, ..., M)
    sums = np.zeros((k, *moved.shape[1:]))
    np.add.at(sums, g, moved)
    if blocks is not None:
        total = (sums**2).sum(axis=0)
    else:  # within classes: sum over images of (x - class mean)^2
        sq = np.zeros_like(sums)
        np.add.at(sq, g, moved**2)
        counted = np.zeros_like(sums)
        np.add.at(counted, g, np.moveaxis(mask, -2, 0).astype(np.float64))
        total = (sq - sums**2 / np.maximum(counted, 1)).sum(axis=0)
    return total / np.squeeze(n, axis=-2) ** 2


@dataclass(frozen=True)
class SeedLevel:
    """Per column: the mean over seeds, its 95 % interval, and the parts: ``seed_sd`` (the sample standard deviation of
    the per-seed values), ``image_se`` (the shared test-image standard error) and ``quantile`` (the multiple of the
    combined standard error the half-width is: t(S-1) where the seeds dominate, 1.96 where the images do)."""

    value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    seed_sd: np.ndarray
    image_se: np.ndarray
    quantile: np.ndarray

    def interval(self, j: int) -> Interval:
        return Interval(float(self.value[j]), float(self.lo[j]), float(self.hi[j]))


def _shared_image_var(
    values: np.ndarray, strata: np.ndarray, blocks: list[np.ndarray] | np.ndarray | None = None
) -> np.ndarray:
    """The test-image variance all seeds share (what the seed spread cannot show), per column of ``values``
    (S, N, M): the variance of the seed-averaged correctness, less each seed's own image noise (``(mean of the
    per-seed variances - that) / (S - 1)``, which the seed spread already holds), at least 0. Within classes
    (``blocks`` None), by the shared test batches (one (N,) array), or, where the batches differ between seeds (a
    batch protocol under a class order that varies with the seed: a list of per-seed arrays), by whole classes:
    the clusters every seed shares (class-sorted batches lie within one or two adjacent classes); the batch noise
    that differs between seeds is in the seed spread."""
    n_seeds = values.shape[0]
    if blocks is not None and not isinstance(blocks, np.ndarray):
        blocks = np.asarray(strata)
    kw = {"blocks": blocks} if blocks is not None else {"strata": strata}
    mask = ~np.isnan(values)
    counted = mask.sum(axis=0)
    pooled = np.where(counted > 0, np.where(mask, values, 0.0).sum(axis=0) / np.maximum(counted, 1), np.nan)
    v_bar = image_var(pooled, **kw)
    v_within = image_var(values, **kw).mean(axis=0)
    return np.maximum(0.0, v_bar - (v_within - v_bar) / (n_seeds - 1))


def seed_level(
    values: np.ndarray,
    strata: np.ndarray,
    blocks: list[np.ndarray] | np.ndarray | None = None,
    level: float = LEVEL,
) -> SeedLevel:
    """The seed-level interval (module docstring) of each column mean of ``values`` (S, N, M), S >= 2 seeds tested
    on the same images (NaN: does not count). ``blocks``: one (N,) array of test-batch ids shared by every seed, or
    one per seed, for a batch-coupled protocol."""
    from scipy import stats as sps

    values = np.asarray(values, dtype=np.float64)
    n_seeds = values.shape[0]
    if n_seeds < 2:
        raise ValueError("an interval over seeds needs at least two seeds")
    per_seed = np.nanmean(values, axis=1)  # (S, M)
    mean = per_seed.mean(axis=0)
    sd = per_seed.std(axis=0, ddof=1)
    seed_part = sd**2 / n_seeds
    img = _shared_image_var(values, strata, blocks)
    t_q, z_q = float(sps.t.ppf(0.5 + level / 2, n_seeds - 1)), float(sps.norm.ppf(0.5 + level / 2))
    half = np.sqrt(t_q**2 * seed_part + z_q**2 * img)  # each part at its own quantile, added in quadrature
    total = seed_part + img
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(total > 0, half / np.sqrt(total), z_q)  # the quantile the interval used
    return SeedLevel(mean, mean - half, mean + half, sd, np.sqrt(img), q)


def seeds_interval(
    correct: np.ndarray, strata: np.ndarray, blocks: list[np.ndarray] | np.ndarray | None = None
) -> tuple[Interval, Interval]:
    """Mean over seeds of final and average accuracy (percent), seed-level intervals. ``correct`` (S, N, T)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.shape[0] < 2:
        raise ValueError("an interval over seeds needs at least two seeds")
    sl = seed_level(with_average(correct), strata, blocks)
    return sl.interval(-2).scaled(100), sl.interval(-1).scaled(100)


# ----------------------------------------------------------------------------------------------- paired tests
@dataclass(frozen=True)
class PairedTest:
    """A minus B in percentage points, its interval, and the two-sided p-value of "no difference". ``at_floor``:
    ``p`` is the test's resolution (``1 / (B + 1)`` for a bootstrap; no resample was as extreme), an upper bound,
    not a value. ``conditions``: what the test holds fixed."""

    diff: Interval
    p: float
    test: str  # PAIRED_BOOTSTRAP / PAIRED_BLOCK_BOOTSTRAP / "paired t over seeds"
    at_floor: bool = False
    conditions: str = ""


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
    difference, at least as far from 0 as it. ``observed`` (...,), ``draws`` (B, ...). Its smallest value is
    ``1 / (B + 1)`` (:func:`p_floor`): a bound, never a value to print."""
    far = np.abs(draws - observed) >= np.abs(observed) - 1e-12
    return (1 + far.sum(axis=0)) / (draws.shape[0] + 1)


def p_floor(n_resamples: int) -> float:
    """The smallest p-value :func:`bootstrap_p` can give with ``n_resamples`` draws."""
    return 1.0 / (n_resamples + 1)


IMAGE_CONDITIONS = "conditions on the trained runs (test-image noise only)"
SEED_CONDITIONS = "unit: the seed; generalises over training runs and test images"
MCNEMAR_CONDITIONS = "conditions on the two trained runs (test-image noise only)"


def percentile_bootstrap(observed: float, draws: np.ndarray, level: float = LEVEL) -> tuple[Interval, float, bool]:
    """The interval and the two-sided p-value of one bootstrap of a difference, made so that they agree exactly: the
    interval's ends are order statistics of the B draws, ``lo`` the (k+1)-th smallest and ``hi`` the (k+1)-th
    largest with ``k = ceil(B (1 - level) / 2) - 1``; the p-value is ``2 min(#draws <= 0, #draws >= 0) / B`` (at
    most 1). Then ``lo > 0`` exactly when at most k draws are <= 0, that is exactly when ``p < 1 - level`` with the
    draws on the positive side (and ``hi < 0`` likewise): the interval excludes 0 exactly when the test rejects.
    Where no draw reaches 0 the p-value is the floor ``1 / B`` (third value True: a bound, not a value).
    ``observed``, ``draws`` (B,) in the units of the difference."""
    d = np.sort(np.asarray(draws, np.float64).ravel())
    n = len(d)
    k = max(0, math.ceil(round(n * (1 - level) / 2, 9)) - 1)  # round: 1000 * 0.05 / 2 is 25.000000000000004
    lo, hi = float(d[k]), float(d[n - 1 - k])
    below, above = int((d <= 0).sum()), int((d >= 0).sum())
    tail = min(below, above)
    p = min(1.0, max(2 * tail, 1) / n)
    return Interval(float(observed), lo, hi), p, tail == 0


PAIRED_BOOTSTRAP = "paired bootstrap over test images"
PAIRED_BLOCK_BOOTSTRAP = "paired block bootstrap over test batches"


def paired_test(
    a: np.ndarray,
    b: np.ndarray,
    strata: np.ndarray,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    blocks: np.ndarray | None = None,
) -> PairedTest:
    """A against B on the same images: ``a``, ``b`` (S, N) 0/1 final correctness per seed (the same seeds in the same
    order). One procedure gives the interval and the p-value (:func:`percentile_bootstrap`): a stratified bootstrap over
    test images (by whole blocks with ``blocks``), each image carrying its difference averaged over the seeds (the seeds
    held fixed: this test conditions on the trained runs); its interval excludes 0 exactly when its p is below 0.05.
    (Resampling the seeds as well would count each seed's image-level noise twice: under the null such a test almost
    never rejects, see tests/test_stats.py; :func:`paired_seed_test` is the test over training runs.)"""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need the same shape, got {a.shape} and {b.shape}")
    d = (a - b).mean(axis=0)  # (N,) per image, over seeds
    draws = bootstrap_means(d, strata, n_resamples, seed, blocks)[:, 0]
    diff, p, at_floor = percentile_bootstrap(float(d.mean()), draws)
    name = PAIRED_BLOCK_BOOTSTRAP if blocks is not None else PAIRED_BOOTSTRAP
    return PairedTest(diff.scaled(100), p, name, at_floor, IMAGE_CONDITIONS)


def paired_seed_test(
    a: np.ndarray, b: np.ndarray, strata: np.ndarray, blocks: list[np.ndarray] | np.ndarray | None = None
) -> PairedTest:
    """A against B over S >= 2 seeds: ``a``, ``b`` (S, N) 0/1 final correctness (the same seeds in the same order).
    The t test of the per-seed differences with the shared test-image variance of the difference added (the
    interval of :func:`seed_level` applied to A - B, and the p-value that matches it: :func:`_combined_p`): it
    generalises over training runs and test images."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"a test over seeds needs (S >= 2, N) outcomes of the same shape, got {a.shape}, {b.shape}")
    sl = seed_level((a - b)[:, :, None], strata, blocks)
    value, sd, img = float(sl.value[0]), float(sl.seed_sd[0]), float(sl.image_se[0])
    p = _combined_p(value, sd**2 / a.shape[0], img**2, a.shape[0] - 1)
    return PairedTest(sl.interval(0).scaled(100), p, "paired t over seeds", False, SEED_CONDITIONS)


def _combined_p(value: float, seed_var: float, image_var_: float, df: int) -> float:
    """The two-sided p-value that matches :func:`seed_level`'s interval: the level alpha at which ``sqrt(t_(df, alpha)^2
    * seed_var + z_alpha^2 * image_var_)`` equals ``|value|`` (p < 0.05 exactly when the 95 % interval excludes 0)."""
    from scipy import optimize
    from scipy import stats as sps

    if value == 0:
        return 1.0
    if seed_var == 0 and image_var_ == 0:
        return 0.0

    def excess(log_alpha: float) -> float:
        alpha = math.exp(log_alpha)
        t_q, z_q = sps.t.isf(alpha / 2, df), sps.norm.isf(alpha / 2)
        return math.hypot(t_q * math.sqrt(seed_var), z_q * math.sqrt(image_var_)) - abs(value)

    lo = math.log(1e-300)
    if excess(lo) <= 0:
        return 1e-300
    if excess(0.0) >= 0:
        return 1.0
    return float(math.exp(optimize.brentq(excess, lo, 0.0, xtol=1e-10)))


def sign_flip_p(differences: np.ndarray) -> float:
    """Exact two-sided sign-flip (permutation) p-value of per-seed differences (S,): the share of the 2^S sign
    patterns whose mean is at least as far from 0 as the observed one. It conditions on the test images; its
    floor is ``2 / 2^S`` (1/16 with 5 seeds) when no difference is 0."""
    d = np.asarray(differences, np.float64)
    n = len(d)
    signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # (2^S, S) every pattern
    means = np.abs((signs * d).mean(axis=1))
    return float((means >= abs(d.mean()) - 1e-12).mean())


def holm(p: np.ndarray | list[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where adjusted < alpha."""
    return holm_bounds(p)[0]


def holm_bounds(
    p: np.ndarray | list[float], bound: np.ndarray | list[bool] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Holm-Bonferroni adjusted p-values and, per value, whether it is an upper bound: an adjusted p is a bound
    where the term that sets it (Holm's running maximum) comes from a p that is a bound (a resampling floor)."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    flags = np.zeros(m, bool) if bound is None else np.asarray(bound, bool)
    if m == 0:
        return p, flags
    order = np.argsort(p, kind="stable")
    terms = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.maximum.accumulate(terms)
    setter = np.maximum.accumulate(np.where(terms >= adjusted - 1e-300, np.arange(m), -1))  # index of the max term
    out, out_bound = np.empty(m), np.empty(m, bool)
    out[order] = adjusted
    out_bound[order] = flags[order][setter] & (adjusted < 1.0)
    return out, out_bound


def fmt_p(p: float, bound: bool = False) -> str:
    """A p-value as printed: two significant digits, or ``< x`` where it is a bound (at a resampling floor)."""
    if bound:
        return f"< {p:.2g}"
    return f"{p:.2g}"
