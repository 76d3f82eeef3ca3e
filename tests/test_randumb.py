"""RanDumb: class-incremental LDA equal to scikit-learn's batch fit (the reference's classifier) after every task,
the random Fourier features approximating the RBF kernel, the embedding drawn from the run's seed and fixed at
task 0, and the refusals (one image per class, a width that does not fit in memory, bad settings). Features only
(the strategy reads no image): synthetic splits on the micro ViT's width (64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import baselines.randumb as randumb_mod
from baselines.randumb import RanDumb, RanDumbConfig, scale_gamma
from clbench.errors import ClbenchError
from clbench.layers.lda import oas_shrinkage
from clbench.methods.contract import Context, Split, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too


def ctx_for(backbone, seed: int = 0) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=seed, log=lambda s: None)


def clusters(classes: list[int], n: int, d: int = 64, seed: int = 0) -> Split:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(classes) + 1, d, generator=torch.Generator().manual_seed(98)) * 1.5
    y = torch.tensor(classes).repeat_interleave(n)
    z = centres[y] + torch.randn(len(y), d, generator=g) * (torch.arange(d) % 4 + 1) / 2
    return Split(None, np.arange(len(y)), y, z.float(), None, None)


def test_streaming_lda_equals_scikit_learns_batch_fit_after_every_task(backbone):
    """The reference's classifier, LinearDiscriminantAnalysis(solver='lsqr', covariance_estimator=OAS()), fit on all
    the training data seen so far, is what the class-incremental running sums give after each task."""
    from sklearn.covariance import OAS
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    strategy = RanDumb(RanDumbConfig(embed=False), ctx_for(backbone))
    tasks = [clusters([0, 1, 2], 12, seed=1), clusters([3, 4], 30, seed=2)]
    test = clusters([0, 1, 2, 3, 4], 6, seed=3)
    seen_z, seen_y = [], []
    for t, split in enumerate(tasks):
        classes = sorted(set(split.labels.tolist()))
        strategy.learn_task(Task(t, classes, max(classes) + 1, split))
        seen_z.append(split.features.double().numpy())
        seen_y.append(split.labels.numpy())
        lda = LinearDiscriminantAnalysis(solver="lsqr", covariance_estimator=OAS(assume_centered=False))
        lda.fit(np.concatenate(seen_z), np.concatenate(seen_y))
        np.testing.assert_allclose(strategy.stats.covariance().numpy(), lda.covariance_, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(strategy.weight.numpy(), lda.coef_, rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(strategy.bias.numpy(), lda.intercept_, rtol=1e-8, atol=1e-8)
        want = lda.predict(test.features.double().numpy())
        assert np.array_equal(strategy.predict(test).argmax(1).numpy(), want)


def test_oas_shrinkage_is_scikit_learns():
    from sklearn.covariance import OAS

    x = clusters([0], 10, d=30, seed=4).features.double()
    centred = x - x.mean(0)
    assert oas_shrinkage(centred) == pytest.approx(OAS().fit(x.numpy()).shrinkage_, rel=1e-12)


def test_random_fourier_features_approximate_the_rbf_kernel(backbone):
    """phi(x) . phi(y) -> exp(-gamma ||x - y||^2) (Rahimi and Recht), the kernel RanDumb's embedding stands for."""
    strategy = RanDumb(RanDumbConfig(M=4000), ctx_for(backbone))
    strategy.omega.mul_(math.sqrt(2 * 0.05))  # what the first task does with gamma = 0.05 (no LDA needed here)
    x = clusters([0, 1], 4, seed=5).features.double() / 4  # (8, 64)
    phi = strategy.embed(x)
    kernel = torch.exp(-0.05 * torch.cdist(x, x).pow(2))
    assert (phi @ phi.T - kernel).abs().max() < 0.08  # ~ 1 / sqrt(M) = 0.016 per entry, with margin
    assert (phi @ phi.T - kernel).abs().max() > 1e-4  # an approximation: not the kernel itself
    assert phi.shape == (8, 4000) and phi.dtype == torch.float64


def test_embedding_comes_from_the_seed_and_its_scale_from_the_first_task(backbone):
    first, later = clusters([0, 1], 5, seed=6), clusters([2, 3], 5, seed=7)
    a = RanDumb(RanDumbConfig(M=300), ctx_for(backbone, seed=1))
    b = RanDumb(RanDumbConfig(M=300), ctx_for(backbone, seed=1))
    c = RanDumb(RanDumbConfig(M=300), ctx_for(backbone, seed=2))
    assert torch.equal(a.omega, b.omega) and torch.equal(a.offset, b.offset)
    assert not torch.equal(a.omega, c.omega)
    raw = a.omega.clone()
    a.learn_task(Task(0, [0, 1], 2, first))
    assert a.gamma == pytest.approx(1.0 / (64 * float(first.features.double().var(unbiased=False))), rel=1e-12)
    assert a.gamma == scale_gamma(first.features)
    torch.testing.assert_close(a.omega, raw * math.sqrt(2 * a.gamma), rtol=0, atol=0)
    kept = a.omega.clone()
    a.learn_task(Task(1, [2, 3], 4, later))
    assert torch.equal(a.omega, kept)  # fixed after task 0
    assert ((a.offset >= 0) & (a.offset < 2 * math.pi)).all()


def test_a_class_with_one_training_image_is_refused(backbone):
    assert RanDumb.card.min_train_per_class == 2
    split = clusters([0, 1], 1, seed=8)
    with pytest.raises(ClbenchError, match="at least 2"):
        RanDumb(RanDumbConfig(M=64), ctx_for(backbone)).learn_task(Task(0, [0, 1], 2, split))


def test_a_width_that_does_not_fit_in_memory_is_refused_before_anything_runs(backbone, monkeypatch):
    monkeypatch.setattr(randumb_mod, "available_memory", lambda: 2 * 2**30)  # 2 GiB free
    with pytest.raises(ClbenchError, match=r"M=10000.*GiB") as e:
        RanDumb(RanDumbConfig(), ctx_for(backbone))
    fits = int(str(e.value.hint).split("M=")[-1].split()[0])
    assert 5000 < fits < 10000  # ~32 M^2 bytes: about 7,500 fit in 2 GiB
    RanDumb(RanDumbConfig(M=fits), ctx_for(backbone))  # the suggested width is accepted
    RanDumb(RanDumbConfig(embed=False, M=10**6), ctx_for(backbone))  # no embedding: M unused, nothing to refuse


@pytest.mark.parametrize("bad", [{"M": 0}, {"gamma": -1.0}, {"gamma": math.inf}])
def test_bad_config_values_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RanDumbConfig(**bad)


@pytest.mark.parametrize("embed", [True, False])
def test_param_counts_follow_the_one_rule(backbone, embed):
    cfg = RanDumbConfig(embed=embed, M=100)
    strategy = RanDumb(cfg, ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1, 2], 3, clusters([0, 1, 2], 4, seed=9)))
    strategy.learn_task(Task(1, [3, 4], 5, clusters([3, 4], 4, seed=10)))
    counts, want = strategy.param_counts(), RanDumb.param_formula(cfg, 64, 0, (3, 2))
    assert (counts.added_per_task, counts.stored_per_task, counts.head) == (
        want.added_per_task,
        want.stored_per_task,
        want.head,
    )
    w = 100 if embed else 64
    first = w * w + (64 * 100 + 100 if embed else 0)
    assert counts.added_per_task == [(w + 1) * 3, (w + 1) * 2]
    assert counts.stored_per_task == [(w + 1) * 3 + first, (w + 1) * 2]


@pytest.mark.parametrize("M", [300, 12])  # 300: the low-rank sum throughout; 12 < the 15 images: dense from task 0
def test_checkpoint_round_trip_continues_bit_for_bit_from_a_small_state(backbone, M):
    """The saved state holds neither Omega (drawn again from the seed; its first row checks that) nor the low-rank
    rows and Gram (rebuilt from the kept training features): a resumed run continues with the same bits, and a
    state resumed under another seed is refused."""
    from clbench.files.safestate import SavedState

    tasks = [
        Task(t, [3 * t, 3 * t + 1, 3 * t + 2], 3 * t + 3, clusters([3 * t, 3 * t + 1, 3 * t + 2], 5, seed=20 + t))
        for t in range(3)
    ]
    a = RanDumb(RanDumbConfig(M=M), ctx_for(backbone, seed=4))
    a.learn_task(tasks[0])
    a.learn_task(tasks[1])
    saved = a.save_state()
    assert "omega" not in a.state_dict()
    biggest = max(t.numel() for t in saved.tensors.values())
    assert biggest < 64 * M  # no Omega (d x M), no rows (30 x M) nor their Gram
    b = RanDumb(RanDumbConfig(M=M), ctx_for(backbone, seed=4))
    b.restore_state(SavedState(saved.tree, dict(saved.tensors)))
    assert torch.equal(a.omega, b.omega)
    assert torch.equal(a.stats.rows, b.stats.rows) and torch.equal(a.stats.gram, b.stats.gram)
    for s in (a, b):
        s.learn_task(tasks[2])
    assert torch.equal(a.predict(tasks[2].train), b.predict(tasks[2].train))
    other = RanDumb(RanDumbConfig(M=M), ctx_for(backbone, seed=5))
    with pytest.raises(ClbenchError, match="seed"):
        other.restore_state(SavedState(saved.tree, dict(saved.tensors)))
