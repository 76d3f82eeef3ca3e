"""SLDA: the streaming covariance against the batch formula it estimates, the LDA rule of the paper (nearest class
mean in the Mahalanobis metric of the shrunk shared covariance), Avalanche's own ``StreamingLDA`` run live on the
golden fixture's features, and the refusals. Features only (the strategy reads no image): synthetic splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from baselines.slda import SLDA, SLDAConfig
from clbench.errors import ClbenchError
from clbench.layers.lda import LDAStatistics, shrink
from clbench.methods.contract import Context, Split, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too
FIXTURE = Path(__file__).parent / "reference_golden" / "slda.safetensors"


def ctx_for(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0, log=lambda s: None)


def features_split(z: torch.Tensor, y: torch.Tensor) -> Split:
    return Split(None, np.arange(len(y)), y.long(), z.float(), None, None)  # features only


def clusters(classes: list[int], n: int, d: int = 64, seed: int = 0, shuffle: bool = True) -> Split:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(classes) + 1, d, generator=torch.Generator().manual_seed(99)) * 2
    y = torch.tensor(classes).repeat_interleave(n)
    if shuffle:
        y = y[torch.randperm(len(y), generator=g)]
    return features_split(centres[y] + torch.randn(len(y), d, generator=g) * (torch.arange(d) % 5 + 1) / 3, y)


def pooled_within_class_covariance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.double()
    centred = torch.cat([x[y == c] - x[y == c].mean(0) for c in torch.unique(y)])
    return centred.T @ centred / len(x)


def test_exact_update_is_the_pooled_within_class_covariance_in_any_order():
    """The paper's streaming covariance estimates the shared within-class covariance; the exact (Welford) update
    gives it exactly, however the samples and tasks are ordered."""
    a, b = clusters([0, 1, 2], 20, seed=1), clusters([3, 4], 30, seed=2)
    x, y = torch.cat([a.features, b.features]), torch.cat([a.labels, b.labels])
    want = pooled_within_class_covariance(x, y)
    for order in (torch.arange(len(y)), torch.randperm(len(y), generator=torch.Generator().manual_seed(3))):
        stats = LDAStatistics(64)
        stats.update_per_sample(x[order][:50], y[order][:50], "exact")
        stats.update_per_sample(x[order][50:], y[order][50:], "exact")
        torch.testing.assert_close(stats.covariance(), want, rtol=1e-10, atol=1e-10)
        for c in range(5):
            torch.testing.assert_close(stats.means[c], x[y == c].double().mean(0), rtol=1e-12, atol=1e-12)


def test_reference_update_is_avalanches_recursion_sample_by_sample():
    """The batched ``reference`` rule equals the recursion of StreamingLDA.fit written out per sample (float64)."""
    s = clusters([0, 1, 2], 8, d=16, seed=4)
    x, y = s.features.double(), s.labels
    mu, ck, sigma = torch.zeros(3, 16, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), None
    for t in range(len(y)):
        diff = (x[t] - mu[y[t]])[None]
        delta = diff.T @ diff * t / (t + 1)
        sigma = delta if sigma is None else (t * sigma + delta) / (t + 1)
        mu[y[t]] += (x[t] - mu[y[t]]) / (ck[y[t]] + 1)
        ck[y[t]] += 1
    stats = LDAStatistics(16)
    stats.update_per_sample(s.features[:10], y[:10], "reference")
    stats.update_per_sample(s.features[10:], y[10:], "reference")
    torch.testing.assert_close(stats.covariance(), sigma, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(stats.means, mu, rtol=1e-12, atol=1e-12)


def test_prediction_is_the_nearest_class_mean_in_the_shrunk_mahalanobis_metric(backbone):
    """LDA with equal priors: argmax_k x^T L mu_k - mu_k^T L mu_k / 2 = argmin_k (x - mu_k)^T L (x - mu_k)."""
    strategy = SLDA(SLDAConfig(), ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1, 2], 3, clusters([0, 1, 2], 20, seed=5)))
    strategy.learn_task(Task(1, [3, 4, 5], 6, clusters([3, 4, 5], 20, seed=6)))
    test = clusters([0, 1, 2, 3, 4, 5], 10, seed=7)
    lam = torch.linalg.inv(shrink(strategy.stats.covariance(), 1e-4))
    diff = test.features.double()[:, None, :] - strategy.stats.means[None]  # (N, C, d)
    mahalanobis = torch.einsum("ncd,de,nce->nc", diff, lam, diff)
    logits = strategy.predict(test)
    assert logits.dtype == torch.float32 and logits.shape == (60, 6)
    assert torch.equal(logits.argmax(1), mahalanobis.argmin(1))
    assert float((logits.argmax(1) == test.labels).float().mean()) > 0.9


def test_frozen_covariance_keeps_the_first_task_estimate(backbone):
    strategy = SLDA(SLDAConfig(streaming_update_sigma=False), ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1], 2, clusters([0, 1], 15, seed=8)))
    first = strategy.stats.covariance().clone()
    strategy.learn_task(Task(1, [2, 3], 4, clusters([2, 3], 15, seed=9)))
    assert torch.equal(strategy.stats.covariance(), first)
    assert strategy.stats.counts.tolist() == [15.0] * 4  # the means keep learning


def test_avalanche_streaming_lda_run_live_gives_the_same_predictions(backbone):
    """Avalanche's own StreamingLDA (as installed), fit() one sample at a time on the golden fixture's features in
    its order, predict() after each task; clbench with ``sigma_update="reference"`` predicts the same classes, its
    Sigma within float32's accumulated rounding (1e-5) of the reference's."""
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised.deep_slda import StreamingLDA
    from torch import nn

    f = load_file(FIXTURE)
    reference = StreamingLDA(
        slda_model=nn.Identity(),
        criterion=nn.CrossEntropyLoss(),
        input_size=64,
        num_classes=6,
        evaluator=EvaluationPlugin(),
        device="cpu",
    )
    assert (reference.shrinkage_param, reference.streaming_update_sigma) == (1e-4, True)  # SLDAConfig's defaults
    ours = SLDA(SLDAConfig(sigma_update="reference"), ctx_for(backbone))
    test = features_split(f["in.test.z"], f["in.test.y"])
    for t in range(2):
        z, y = f[f"in.task{t}.z"], f[f"in.task{t}.y"]
        for i in range(len(y)):
            reference.fit(z[i : i + 1], y[i : i + 1])
        ours.learn_task(Task(t, [3 * t, 3 * t + 1, 3 * t + 2], 3 * t + 3, features_split(z, y)))
        want = reference.predict(test.features)[:, : 3 * t + 3].argmax(1)
        assert torch.equal(ours.predict(test).argmax(1), want)
        torch.testing.assert_close(ours.stats.covariance().float(), reference.Sigma, rtol=1e-5, atol=1e-5)


def test_oas_start_is_scikit_learns_oas_of_the_residuals_then_streams_on(backbone):
    """``init="oas"`` (the authors' fit_base): after task 0 the class means and counts of the task, and Sigma =
    scikit-learn's OAS(assume_centered=True) of the within-class residuals, weighing as N0 samples; the exact update
    then adds each later class's within-class scatter: Sigma = (N0 OAS + S_1) / (N0 + N1)."""
    from sklearn.covariance import OAS

    a, b = clusters([0, 1, 2], 12, seed=15), clusters([3, 4], 20, seed=16)  # 36 samples in 64 dimensions first
    strategy = SLDA(SLDAConfig(init="oas"), ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1, 2], 3, a))
    xa, ya = a.features.double(), a.labels
    means = torch.stack([xa[ya == c].mean(0) for c in range(3)])
    oas = OAS(assume_centered=True).fit((xa - means[ya]).numpy())
    torch.testing.assert_close(strategy.stats.means, means, rtol=1e-12, atol=1e-12)
    assert strategy.stats.counts.tolist() == [12.0] * 3 and strategy.stats.n == 36
    torch.testing.assert_close(strategy.stats.covariance(), torch.from_numpy(oas.covariance_), rtol=1e-10, atol=1e-12)
    assert strategy.oas_shrinkage == pytest.approx(oas.shrinkage_, rel=1e-10) and 0 < strategy.oas_shrinkage < 1
    assert strategy.diagnostics(a, None) == {"oas_shrinkage": strategy.oas_shrinkage}
    strategy.learn_task(Task(1, [3, 4], 5, b))
    scatter_b = pooled_within_class_covariance(b.features, b.labels) * 40
    want = (36 * torch.from_numpy(oas.covariance_) + scatter_b) / 76
    torch.testing.assert_close(strategy.stats.covariance(), want, rtol=1e-10, atol=1e-12)
    assert SLDA(SLDAConfig(), ctx_for(backbone)).diagnostics(a, None) == {}  # the streaming start has no shrinkage


def test_oas_start_differs_from_the_streaming_start(backbone):
    streaming, oas = (SLDA(SLDAConfig(init=i), ctx_for(backbone)) for i in ("streaming", "oas"))
    for s in (streaming, oas):
        s.learn_task(Task(0, [0, 1, 2], 3, clusters([0, 1, 2], 12, seed=17)))
    torch.testing.assert_close(streaming.stats.means, oas.stats.means, rtol=1e-12, atol=1e-12)  # the same means
    assert (streaming.stats.covariance() - oas.stats.covariance()).abs().max() > 0.1  # a shrunk covariance


def test_singular_covariance_without_shrinkage_is_refused(backbone):
    strategy = SLDA(SLDAConfig(shrinkage=0.0), ctx_for(backbone))
    with pytest.raises(ClbenchError, match="singular"):
        strategy.learn_task(Task(0, [0, 1], 2, clusters([0, 1], 5, seed=10)))  # 10 samples in 64 dimensions


def test_one_image_per_class_is_enough_with_shrinkage(backbone):
    assert SLDA.card.min_train_per_class == 1  # the covariance is shared: a class needs no second image
    strategy = SLDA(SLDAConfig(), ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1, 2], 3, clusters([0, 1, 2], 1, seed=11)))
    assert torch.isfinite(strategy.predict(clusters([0, 1, 2], 2, seed=12))).all()


@pytest.mark.parametrize(
    "bad", [{"shrinkage": -0.1}, {"shrinkage": 1.5}, {"sigma_update": "welford"}, {"init": "ledoit-wolf"}]
)
def test_bad_config_values_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SLDAConfig(**bad)


def test_param_counts_follow_the_one_rule(backbone):
    strategy = SLDA(SLDAConfig(), ctx_for(backbone))
    strategy.learn_task(Task(0, [0, 1, 2], 3, clusters([0, 1, 2], 4, seed=13)))
    strategy.learn_task(Task(1, [3, 4], 5, clusters([3, 4], 4, seed=14)))
    counts = strategy.param_counts()
    want = SLDA.param_formula(SLDAConfig(), 64, 0, (3, 2))
    assert (counts.added_per_task, counts.stored_per_task, counts.head) == (
        want.added_per_task,
        want.stored_per_task,
        want.head,
    )
    assert counts.added_per_task == [65 * 3, 65 * 2] and counts.stored_per_task == [65 * 3 + 64 * 64, 65 * 2]
    assert counts.head == strategy.weight.numel() + strategy.bias.numel()
