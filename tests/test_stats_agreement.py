"""A printed difference's interval and its unadjusted test come from one procedure: the interval excludes 0 exactly
when p < 0.05 (clbench.evaluation.stats.percentile_bootstrap, paired_test, paired_seed_test), over many random
prediction pairs near and far from the boundary, per-image and by test batches; and the printed interval keeps
that: an end that is not 0 never prints as 0 (clbench.report.uncertainty.fmt_range)."""

from __future__ import annotations

import numpy as np
import pytest

from clbench.evaluation import stats
from clbench.report.uncertainty import fmt_range

N = 240  # test images
CLASSES = np.repeat(np.arange(12), N // 12)
B = 999  # resamples: fewer than the reports' 10,000 keeps the test fast; the construction does not depend on B


def _pair(rng: np.random.Generator, seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """Two methods' 0/1 outcomes on the same images, with a random true gap (often near the test's boundary)."""
    base = rng.uniform(0.3, 0.7)
    gap = rng.normal(0, 0.04)
    a = (rng.random((seeds, N)) < base + gap).astype(np.float64)
    b = (rng.random((seeds, N)) < base).astype(np.float64)
    return a, b


def _printed_excludes_zero(interval: stats.Interval) -> bool:
    lo, hi = (float(x) for x in fmt_range(interval).strip("[]").split(", "))
    text_lo, text_hi = fmt_range(interval).strip("[]").split(", ")
    return (lo > 0 or (lo == 0 and text_lo.startswith("+") and interval.lo > 0)) or (
        hi < 0 or (hi == 0 and text_hi.startswith("-") and interval.hi < 0)
    )


@pytest.mark.parametrize("seed", range(40))
def test_one_seed_interval_excludes_zero_exactly_when_p_below_5_percent(seed):
    rng = np.random.default_rng(seed)
    for _ in range(5):
        a, b = _pair(rng, 1)
        t = stats.paired_test(a, b, CLASSES, n_resamples=B, seed=seed)
        excludes = t.diff.lo > 0 or t.diff.hi < 0
        assert excludes == (t.p < 0.05), (t.diff, t.p)
        assert _printed_excludes_zero(t.diff) == excludes, fmt_range(t.diff)


@pytest.mark.parametrize("seed", range(20))
def test_block_bootstrap_interval_agrees_with_its_p(seed):
    rng = np.random.default_rng(100 + seed)
    blocks = np.arange(N) // 12
    for _ in range(5):
        a, b = _pair(rng, 1)
        t = stats.paired_test(a, b, CLASSES, n_resamples=B, seed=seed, blocks=blocks)
        assert (t.diff.lo > 0 or t.diff.hi < 0) == (t.p < 0.05), (t.diff, t.p)


@pytest.mark.parametrize("seed", range(20))
def test_seed_level_interval_agrees_with_its_p(seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(5):
        a, b = _pair(rng, 5)
        t = stats.paired_seed_test(a, b, CLASSES)
        assert (t.diff.lo > 0 or t.diff.hi < 0) == (t.p < 0.05), (t.diff, t.p)


def test_the_agreement_holds_at_the_boundary():
    """Draws placed so that exactly k = ceil(0.025 B) - 1 (then k + 1) of them are <= 0: the first interval just
    excludes 0 with p just under 0.05, the second just includes it with p = 0.05 (not below)."""
    n = 1000
    k = int(np.ceil(0.025 * n)) - 1  # 24
    draws = np.concatenate([-np.ones(k), np.linspace(0.1, 1, n - k)])
    interval, p, _ = stats.percentile_bootstrap(0.5, draws)
    assert interval.lo > 0 and p < 0.05
    draws = np.concatenate([-np.ones(k + 1), np.linspace(0.1, 1, n - k - 1)])
    interval, p, _ = stats.percentile_bootstrap(0.5, draws)
    assert interval.lo < 0 and p == pytest.approx(0.05)


def test_a_bootstrap_interval_with_an_exact_mcnemar_p_would_disagree():
    """What the reports printed before: a bootstrap interval beside the exact McNemar p of the same pair. Some
    random pairs make the two disagree (the interval excludes 0, McNemar does not reject, or the reverse), which
    is why one procedure now makes both."""
    rng = np.random.default_rng(7)
    disagree = 0
    for _ in range(200):
        a, b = _pair(rng, 1)
        t = stats.paired_test(a, b, CLASSES, n_resamples=B, seed=1)
        mcnemar = stats.mcnemar_exact(a[0], b[0])
        disagree += (t.diff.lo > 0 or t.diff.hi < 0) != (mcnemar < 0.05)
    assert disagree > 0


def test_printed_end_keeps_its_side_of_zero():
    assert fmt_range(stats.Interval(1.0, 0.04, 2.13)) == "[+0.04, +2.1]"
    assert fmt_range(stats.Interval(-1.0, -2.13, -0.004)) == "[-2.1, -0.004]"
    assert fmt_range(stats.Interval(0.0, -1.26, 1.24)) == "[-1.3, +1.2]"
