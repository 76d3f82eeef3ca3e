"""clbench.stats against simulations with a known truth: interval coverage, the paired tests' false-positive rate
and power, Holm's correction against hand values. Test sets have the embedded benchmark's size and class balance
(942 images, 36 classes of 12 to 54 images); 1,000 simulated runs each, vectorised through the functions' column
batches (the runs of one simulation share the bootstrap's resampling weights, as columns of one call do)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from clbench import stats

RUNS = 1000


@pytest.fixture(scope="module")
def classes() -> np.ndarray:
    """The embedded benchmark's test labels (942 images)."""
    with resources.files("clbench").joinpath("data/emoji.npz").open("rb") as f, np.load(f) as npz:
        return np.asarray(npz["test_y"])


def _class_accuracy(classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.15, 0.65, classes.max() + 1)  # per class, as methods differ by class


def _covered(draws: np.ndarray, truth: np.ndarray) -> float:
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    return float(((lo <= truth) & (truth <= hi)).mean())


def test_one_run_interval_covers_the_true_accuracy_95_percent_of_the_time(classes):
    rng = np.random.default_rng(1)
    p = _class_accuracy(classes, rng)[classes]  # (N,)
    truth = p.mean()  # the expected accuracy on this test set's classes
    correct = (rng.random((len(classes), RUNS)) < p[:, None]).astype(float)  # (N, runs)
    draws = stats.bootstrap_means(correct, classes, seed=2)  # (B, runs)
    coverage = _covered(draws, truth)
    assert 0.93 <= coverage <= 0.97, coverage
    # the interval is as wide as the binomial theory says (stratified: a little narrower than unstratified)
    half = (np.percentile(draws, 97.5, axis=0) - np.percentile(draws, 2.5, axis=0)) / 2
    binomial = 1.96 * np.sqrt(truth * (1 - truth) / len(classes))
    assert 0.85 * binomial < np.median(half) < 1.0 * binomial


def test_average_accuracy_interval_covers_over_tasks(classes):
    rng = np.random.default_rng(3)
    n_tasks, per = 6, 6  # 36 classes in 6 tasks
    task = classes // per
    p = _class_accuracy(classes, rng)
    drift = np.linspace(0.1, 0.0, n_tasks)  # accuracy of old classes falls as tasks arrive
    truth_curve, cols = [], []
    for t in range(n_tasks):
        pt = np.where(task <= t, p[classes] + drift[t], np.nan)
        truth_curve.append(np.nanmean(pt))
        c = (rng.random((len(classes), RUNS)) < pt[:, None]).astype(float)
        cols.append(np.where(np.isnan(pt)[:, None], np.nan, c))
    values = np.stack(cols, axis=2).reshape(len(classes), RUNS * n_tasks)  # columns: (run, task)
    draws = stats.bootstrap_means(values, classes, seed=4).reshape(-1, RUNS, n_tasks).mean(axis=2)
    coverage = _covered(draws, np.mean(truth_curve))
    assert 0.93 <= coverage <= 0.97, coverage


def test_hierarchical_interval_covers_the_mean_over_seeds(classes):
    """Seeds move accuracy by a known spread (1.5 points SD); each seed is tested on the same images (a shared
    per-image difficulty) with independent per-image noise; the interval of the mean over 5 seeds covers the truth."""
    rng = np.random.default_rng(5)
    n_seeds, runs = 5, RUNS
    p = _class_accuracy(classes, rng)[classes]
    truth = p.mean()
    difficulty = rng.random((1, len(classes), runs))  # (1, N, runs): a fresh test set per run
    seed_shift = rng.normal(0, 0.015, (n_seeds, 1, runs))
    noise = rng.normal(0, 0.05, (n_seeds, len(classes), runs))
    correct = (difficulty + noise < p[None, :, None] + seed_shift).astype(np.float32)  # (S, N, runs)
    draws = stats.hierarchical_draws(correct, classes, seed=6)  # (B, runs)
    coverage = _covered(draws, truth)
    assert 0.93 <= coverage <= 0.97, coverage


def _paired(classes, rng, gain: float, noise: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Two methods on the same images: a shared per-image difficulty, independent per-image noise, B ``gain``
    better. Returns (runs, N) 0/1 outcomes of A and B."""
    p = _class_accuracy(classes, rng)[classes]
    difficulty = rng.random((RUNS, len(classes)))
    a = difficulty + rng.normal(0, noise, difficulty.shape) < p
    b = difficulty + rng.normal(0, noise, difficulty.shape) < p + gain
    return a.astype(float), b.astype(float)


def test_paired_tests_have_5_percent_false_positives_under_the_null(classes):
    rng = np.random.default_rng(7)
    a, b = _paired(classes, rng, gain=0.0)
    mcnemar = np.array([stats.mcnemar_exact(a[r], b[r]) for r in range(RUNS)])
    assert 0.03 <= (mcnemar < 0.05).mean() <= 0.07, (mcnemar < 0.05).mean()
    d = (a - b).T  # (N, runs)
    boot = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, seed=8))
    assert 0.03 <= (boot < 0.05).mean() <= 0.07, (boot < 0.05).mean()
    assert 0.3 < np.mean(mcnemar) < 0.7  # p-values spread over (0, 1], not piled at one end


def test_the_several_seed_paired_test_has_5_percent_false_positives(classes):
    """5 seeds of two identical methods (shared image difficulty, independent noise per seed and image)."""
    rng = np.random.default_rng(12)
    n_seeds = 5
    p = _class_accuracy(classes, rng)[classes]
    difficulty = rng.random((1, len(classes), RUNS))
    a = difficulty + rng.normal(0, 0.05, (n_seeds, len(classes), RUNS)) < p[None, :, None]
    b = difficulty + rng.normal(0, 0.05, (n_seeds, len(classes), RUNS)) < p[None, :, None]
    d = (a.astype(np.float32) - b).mean(axis=0)  # (N, runs): what paired_test resamples, per simulated run
    p_values = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, seed=13))
    assert 0.03 <= (p_values < 0.05).mean() <= 0.07, (p_values < 0.05).mean()
    # resampling the seeds too (hierarchical) counts each seed's image noise twice: it (almost) never rejects
    hier = stats.hierarchical_draws((a.astype(np.float32) - b)[:, :, :200], classes, seed=14)
    assert (stats.bootstrap_p(d[:, :200].mean(axis=0), hier) < 0.05).mean() < 0.02
    one = stats.paired_test(a[:, :, 0], b[:, :, 0], classes)
    assert one.test == "paired bootstrap" and one.diff.lo < one.diff.value < one.diff.hi


def test_paired_tests_detect_a_3_point_difference(classes):
    rng = np.random.default_rng(9)
    a, b = _paired(classes, rng, gain=0.03)
    assert 2.5 < 100 * (b.mean() - a.mean()) < 3.5  # the planted difference
    mcnemar = np.array([stats.mcnemar_exact(a[r], b[r]) for r in range(RUNS)])
    assert (mcnemar < 0.05).mean() > 0.8, (mcnemar < 0.05).mean()
    d = (b - a).T
    boot = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, seed=10))
    assert (boot < 0.05).mean() > 0.8, (boot < 0.05).mean()


def test_mcnemar_and_holm_equal_hand_values():
    a = np.array([1] * 10 + [0] * 2 + [1] * 5, bool)  # 10 images only A gets right, 2 only B, 5 both
    b = np.array([0] * 10 + [1] * 2 + [1] * 5, bool)
    # binomial(12, 1/2): P(X <= 2) = (1 + 12 + 66) / 4096; two-sided doubles it
    assert stats.mcnemar_exact(a, b) == pytest.approx(2 * 79 / 4096)
    assert stats.mcnemar_exact(a, a) == 1.0
    # Holm: sorted p (0.01, 0.02, 0.04) times (3, 2, 1) -> 0.03, 0.04, 0.04 (monotone), back in the given order
    assert stats.holm([0.04, 0.01, 0.02]).tolist() == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.6]).tolist() == pytest.approx([1.0, 1.0])


def test_run_intervals_are_seeded_and_contain_the_estimate(classes):
    rng = np.random.default_rng(11)
    correct = (rng.random((len(classes), 1)) < 0.3).astype(float)
    last, avg = stats.run_intervals(correct, classes)
    again = stats.run_intervals(correct, classes)
    assert (last, avg) == again  # the same record after a resume
    assert last.lo < last.value < last.hi and last.value == pytest.approx(100 * correct.mean())
    assert 2.4 < last.half_width < 3.2  # 1.96 * sqrt(.3 * .7 / 942) = 2.9 points
    with pytest.raises(ValueError, match="at least two seeds"):
        stats.seeds_interval(correct.T[None], classes)
