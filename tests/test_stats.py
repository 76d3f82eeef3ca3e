"""clbench.evaluation.stats against simulations with a known truth: interval coverage, the paired tests' false-positive
rate
and power, Holm's correction against hand values. Test sets have the embedded benchmark's size and class balance
(942 images, 36 classes of 12 to 54 images); 1,000 simulated runs each, vectorised through the functions' column
batches (the runs of one simulation share the bootstrap's resampling weights, as columns of one call do)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from clbench.evaluation import stats

RUNS = 1000
B = 2000  # resamples in the simulations (coverage needs no more; the reports use stats.N_RESAMPLES = 10,000)


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
    draws = stats.bootstrap_means(correct, classes, B, seed=2)  # (B, runs)
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
    draws = stats.bootstrap_means(values, classes, B, seed=4).reshape(-1, RUNS, n_tasks).mean(axis=2)
    coverage = _covered(draws, np.mean(truth_curve))
    assert 0.93 <= coverage <= 0.97, coverage


def _seed_study(classes, rng, n_seeds: int, seed_sd: float, runs: int = RUNS) -> tuple[np.ndarray, float]:
    """``runs`` simulated studies of ``n_seeds`` seeds on one test set each: a per-image difficulty all seeds share
    (a fresh test set per study), a per-seed shift of accuracy (``seed_sd``, the training runs' spread) and
    independent per-seed image noise. Returns (S, N, runs) 0/1 outcomes and the true expected accuracy."""
    p = _class_accuracy(classes, rng)[classes]
    difficulty = rng.random((1, len(classes), runs))
    shift = rng.normal(0, seed_sd, (n_seeds, 1, runs))
    noise = rng.normal(0, 0.05, (n_seeds, len(classes), runs))
    return (difficulty + noise < p[None, :, None] + shift).astype(np.float32), float(p.mean())


@pytest.mark.parametrize("n_seeds", [3, 5, 10])
def test_seed_level_interval_covers_the_truth_where_seeds_dominate(classes, n_seeds):
    """1,000 studies, seed spread 8 points (TOSCA's reference rows: 10) against ~1.5 points of image noise."""
    correct, truth = _seed_study(classes, np.random.default_rng(100 + n_seeds), n_seeds, 0.08)
    sl = stats.seed_level(correct, classes)  # closed form: all 1,000 studies at once
    coverage = float(((sl.lo <= truth) & (truth <= sl.hi)).mean())
    assert 0.93 <= coverage <= 0.97, coverage


def test_seed_level_interval_covers_where_images_dominate(classes):
    """Seed spread 0.5 points, image noise ~1.5: the interval is the image interval, not t(4) times it."""
    correct, truth = _seed_study(classes, np.random.default_rng(21), 5, 0.005)
    sl = stats.seed_level(correct, classes)
    coverage = float(((sl.lo <= truth) & (truth <= sl.hi)).mean())
    assert 0.93 <= coverage <= 0.97, coverage
    assert np.median(sl.quantile) < 2.1  # close to 1.96, far from t(4) = 2.78


def test_the_old_hierarchical_bootstrap_under_covers_at_5_seeds_with_a_large_seed_spread(classes):
    """Why the seed-level interval replaced it: a percentile bootstrap over 5 seeds uses the normal quantile and
    the (S-1)/S-biased spread, about 90 % coverage where 95 % is claimed (the same studies as above)."""
    correct, truth = _seed_study(classes, np.random.default_rng(105), 5, 0.08, runs=RUNS)
    draws = stats.hierarchical_draws(correct, classes, 1000, seed=6)  # (B, runs)
    coverage = _covered(draws, truth)
    assert coverage < 0.93, coverage
    sl = stats.seed_level(correct, classes)
    assert 0.93 <= float(((sl.lo <= truth) & (truth <= sl.hi)).mean()) <= 0.97


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
    boot = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, B, seed=8))
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
    p_values = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, B, seed=13))
    assert 0.03 <= (p_values < 0.05).mean() <= 0.07, (p_values < 0.05).mean()
    # resampling the seeds too (hierarchical) counts each seed's image noise twice: it (almost) never rejects
    hier = stats.hierarchical_draws((a.astype(np.float32) - b)[:, :, :200], classes, B, seed=14)
    assert (stats.bootstrap_p(d[:, :200].mean(axis=0), hier) < 0.05).mean() < 0.02
    one = stats.paired_test(a[:, :, 0], b[:, :, 0], classes)
    assert one.test == stats.PAIRED_BOOTSTRAP and one.diff.lo < one.diff.value < one.diff.hi


def test_paired_tests_detect_a_3_point_difference(classes):
    rng = np.random.default_rng(9)
    a, b = _paired(classes, rng, gain=0.03)
    assert 2.5 < 100 * (b.mean() - a.mean()) < 3.5  # the planted difference
    mcnemar = np.array([stats.mcnemar_exact(a[r], b[r]) for r in range(RUNS)])
    assert (mcnemar < 0.05).mean() > 0.8, (mcnemar < 0.05).mean()
    d = (b - a).T
    boot = stats.bootstrap_p(d.mean(axis=0), stats.bootstrap_means(d, classes, B, seed=10))
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
