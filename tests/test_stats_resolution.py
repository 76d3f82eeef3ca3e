"""The precision the reports print follows the measured Monte-Carlo error of the bootstrap: the half-width of a
one-run 95 % interval on the embedded benchmark's test set (942 images, 36 classes), redrawn under 30 bootstrap
seeds, moves by sd ~0.06 points with 2,000 resamples (the second decimal is noise; an endpoint by ~0.09) and by
~0.03 with the reports' 10,000 (one decimal holds: stats.INTERVAL_DECIMALS; an endpoint by ~0.045, near the 0.106
points one image is worth). The seed-level intervals are closed-form: no Monte-Carlo error at all. The first test
takes ~10 s on 2 loaded cores: full tier (the default tier carries
test_reports_print_intervals_to_the_decimal_the_resamples_support)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from clbench.evaluation import stats


@pytest.fixture(scope="module")
def classes() -> np.ndarray:
    with resources.files("clbench").joinpath("data/emoji.npz").open("rb") as f, np.load(f) as npz:
        return np.asarray(npz["test_y"])


def _half_width_sd(correct: np.ndarray, classes: np.ndarray, n_resamples: int, n_seeds: int = 30) -> float:
    """The sd over ``n_seeds`` bootstrap seeds of the printed ``±`` (half the 95 % percentile interval), points."""
    halves = []
    for s in range(n_seeds):
        lo, hi = np.percentile(100 * stats.bootstrap_means(correct, classes, n_resamples, seed=s)[:, 0], [2.5, 97.5])
        halves.append((hi - lo) / 2)
    return float(np.std(halves, ddof=1))


@pytest.mark.full
def test_the_printed_decimals_follow_the_monte_carlo_error(classes):
    rng = np.random.default_rng(0)
    correct = (rng.random(len(classes)) < rng.uniform(0.15, 0.65, 36)[classes]).astype(float)
    coarse = _half_width_sd(correct, classes, 2000)
    fine = _half_width_sd(correct, classes, stats.N_RESAMPLES)
    assert stats.N_RESAMPLES >= 10_000 and stats.INTERVAL_DECIMALS == 1
    assert coarse > 0.04, coarse  # 2,000: the second decimal moves between bootstrap seeds
    assert fine < 0.04, fine  # 10,000: a tenth of a point holds (sd under half the last digit)
    assert fine < coarse


def test_seed_level_intervals_have_no_monte_carlo_error(classes):
    rng = np.random.default_rng(1)
    values = (rng.random((5, len(classes), 1)) < 0.4).astype(float)
    a, b = stats.seed_level(values, classes), stats.seed_level(values, classes)
    assert (a.lo == b.lo).all() and (a.hi == b.hi).all()


def test_reports_print_intervals_to_the_decimal_the_resamples_support():
    """The default tier's part of the proof (the measurement above runs in the full tier): the reports resample
    10,000 times and print one decimal of every ``±`` and interval, whatever the value's own decimals."""
    from clbench.report.uncertainty import fmt_interval, fmt_range

    assert stats.N_RESAMPLES >= 10_000 and stats.INTERVAL_DECIMALS == 1
    interval = stats.Interval(28.766, 26.3149, 31.2171)
    assert fmt_interval(28.766, interval) == "28.77 ± 2.5"
    assert fmt_range(interval) == "[+26.3, +31.2]"
