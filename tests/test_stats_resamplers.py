"""The resamplers' defining properties and the p-value floors, pinned: a stratified resample keeps every class's
count, a block resample draws whole blocks, the closed-form image variance is the bootstrap's, the seed-level
interval is the hand formula over the seeds, a p-value at its floor stays a bound through Holm and prints as one,
and the seeded draws themselves are pinned (a change to how resamples are drawn fails here)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from clbench.evaluation import stats
from clbench.report.uncertainty import batch_blocks

STRATA = np.repeat(np.arange(6), [3, 5, 8, 2, 12, 6])  # unequal classes, 36 images


def test_every_stratified_resample_keeps_each_class_count():
    w = stats.resample_weights(STRATA, 500, np.random.default_rng(0))  # (500, 36)
    per_class = np.stack([w[:, STRATA == c].sum(axis=1) for c in range(6)], axis=1)
    assert (per_class == np.bincount(STRATA)).all()  # every resample, every class
    assert w.min() >= 0 and (w.sum(axis=1) == len(STRATA)).all()
    assert (w != 1).any()  # it does resample (not the identity)


def test_a_block_resample_draws_whole_blocks():
    blocks = np.arange(36) // 8  # 5 blocks: 8, 8, 8, 8, 4 images
    w = stats.block_weights(blocks, 500, np.random.default_rng(1))
    for k in range(5):
        inside = w[:, blocks == k]
        assert (inside == inside[:, :1]).all()  # an image counts as often as its block was drawn
    per_block = np.stack([w[:, blocks == k][:, 0] for k in range(5)], axis=1)
    assert (per_block.sum(axis=1) == 5).all()  # K draws of K blocks


def test_the_seeded_draws_are_pinned():
    """The first draws of the report's bootstrap on a fixed input: any change to how resamples are drawn (the
    generator, the stratification, the order of draws) changes them."""
    values = (np.arange(36) % 3 == 0).astype(float)
    draws = stats.bootstrap_means(values, STRATA, 4, seed=stats.SEED)[:, 0]
    assert draws.tolist() == pytest.approx(PINNED, abs=1e-12)
    again = stats.bootstrap_means(values, STRATA, 4, seed=stats.SEED)[:, 0]
    assert (draws == again).all()


PINNED = [0.3333333432674408, 0.4444444477558136, 0.3611111044883728, 0.3888888955116272]


def test_the_closed_form_image_variance_is_the_bootstraps():
    rng = np.random.default_rng(2)
    y = np.repeat(np.arange(36), rng.integers(12, 40, 36))
    x = (rng.random(len(y)) < rng.uniform(0.2, 0.8, 36)[y]).astype(float)
    draws = stats.bootstrap_means(x, y, 20_000, seed=3)[:, 0]
    assert stats.image_var(x[:, None], strata=y)[0] == pytest.approx(draws.var(), rel=0.05)
    blocks = batch_blocks(np.arange(len(y)), y, 48)
    draws = stats.bootstrap_means(x, y, 20_000, seed=4, blocks=blocks)[:, 0]
    assert stats.image_var(x[:, None], blocks=blocks)[0] == pytest.approx(draws.var(), rel=0.08)


def test_class_sorted_batches_are_cut_every_batch_size_images():
    label = np.array([2, 0, 1, 0, 2, 1, 0])  # test-index order
    # class by class: images 1, 3, 6 | 2, 5 | 0, 4 -> batches (1, 3), (6, 2), (5, 0), (4)
    assert batch_blocks(np.arange(7), label, 2).tolist() == [2, 0, 1, 0, 3, 2, 1]


def test_the_seed_level_interval_is_the_hand_formula():
    """Five seeds whose accuracy differs by a known shift on identical per-image outcomes otherwise: the seed sd is
    the shifts' sd, the shared image part is the stratified variance of the seed-averaged outcomes, and the
    half-width is sqrt(t4^2 sd^2 / 5 + 1.96^2 se^2)."""
    rng = np.random.default_rng(5)
    base = (rng.random(len(STRATA)) < 0.5).astype(float)
    values = np.stack([base] * 5)
    flips = [[], [0], [0, 9], [0, 9, 20], [0, 9, 20, 30]]  # seed s gets s images more right or wrong
    for s, idx in enumerate(flips):
        values[s, idx] = 1 - values[s, idx]
    sl = stats.seed_level(values[:, :, None], STRATA)
    per_seed = values.mean(axis=1)
    assert sl.value[0] == pytest.approx(per_seed.mean())
    assert sl.seed_sd[0] == pytest.approx(per_seed.std(ddof=1))
    v_bar = stats.image_var(values.mean(axis=0)[:, None], strata=STRATA)[0]
    v_within = np.mean([stats.image_var(values[s][:, None], strata=STRATA)[0] for s in range(5)])
    shared = max(0.0, v_bar - (v_within - v_bar) / 4)
    assert sl.image_se[0] ** 2 == pytest.approx(shared)
    half = np.sqrt(sps.t.ppf(0.975, 4) ** 2 * per_seed.var(ddof=1) / 5 + sps.norm.ppf(0.975) ** 2 * shared)
    assert sl.hi[0] - sl.value[0] == pytest.approx(half) and sl.value[0] - sl.lo[0] == pytest.approx(half)
    with pytest.raises(ValueError, match="at least two seeds"):
        stats.seed_level(values[:1, :, None], STRATA)


def test_seed_level_resamples_seeds_not_images_alone():
    """Seeds that differ by 10 points on otherwise identical outcomes: the interval is as wide as the seeds make
    it; an image-level interval of the seed-averaged outcomes is not (it conditions on the seeds)."""
    values = np.zeros((5, 36))
    for s in range(5):
        values[s, : 4 * s] = 1  # 0, 4, 8, 12, 16 of 36 right
    sl = stats.seed_level(values[:, :, None], np.zeros(36, int))  # one class: no image variance beyond seeds
    assert sl.hi[0] - sl.lo[0] > 2 * sps.t.ppf(0.975, 4) * values.mean(axis=1).std(ddof=1) / np.sqrt(5) * 0.99


def test_a_p_value_at_the_floor_is_a_bound_through_holm_and_prints_as_one():
    a = np.ones((2, 36))
    b = np.zeros((2, 36))  # every image better: no resample is as extreme as 0
    t = stats.paired_test(a, b, STRATA, n_resamples=1000)
    assert t.p == pytest.approx(1 / 1000) and t.at_floor  # no draw reached 0: the floor 1 / B, a bound
    adjusted, bound = stats.holm_bounds([t.p, 0.02, 0.5], [True, False, False])
    assert adjusted.tolist() == pytest.approx([3 / 1000, 0.04, 0.5]) and bound.tolist() == [True, False, False]
    assert stats.fmt_p(adjusted[0], bound[0]) == "< 0.003" and stats.fmt_p(adjusted[1], bound[1]) == "0.04"
    # a value after a bound whose Holm term is set by the bound is a bound too
    adjusted, bound = stats.holm_bounds([0.001, 0.0012], [True, False])
    assert adjusted.tolist() == pytest.approx([0.002, 0.002]) and bound.tolist() == [True, True]
    # one seed: the same bootstrap, so the same floor and the same bound
    one = stats.paired_test(a[:1], b[:1], STRATA, n_resamples=1000)
    assert one.test == stats.PAIRED_BOOTSTRAP and one.at_floor and one.p == pytest.approx(1 / 1000)


def test_the_sign_flip_test_is_exact_and_has_its_floor():
    assert stats.sign_flip_p(np.array([1.0, 2, 3, 4, 5])) == pytest.approx(1 / 16)  # 2 of 32 patterns
    assert stats.sign_flip_p(np.array([1.0, -1, 1, -1])) == 1.0
    # hand count: d = (3, -1, 2); |mean| of the 8 sign patterns: 4/3, 2/3, 0, 2, 2, 0, 2/3, 4/3 (obs 4/3) -> 4 of 8
    assert stats.sign_flip_p(np.array([3.0, -1, 2])) == pytest.approx(4 / 8)


def test_the_seed_test_rejects_exactly_when_its_interval_excludes_zero():
    rng = np.random.default_rng(7)
    for shift in (0.0, 0.02, 0.05, 0.1):
        a = (rng.random((5, 400)) < 0.5 + shift).astype(float)
        b = (rng.random((5, 400)) < 0.5).astype(float)
        t = stats.paired_seed_test(a, b, np.repeat(np.arange(20), 20))
        assert (t.p < 0.05) == (t.diff.lo > 0 or t.diff.hi < 0), (shift, t)
