"""FeCAM (baselines/fecam.py): the paper's statistics and classifier, its limits, and its refusals.

Invariants from the paper (Goswami et al. 2023, Sec. 3-4): each class is a Gaussian with its own mean and covariance,
shrunk by the mean variance and normalised to a correlation matrix; a test feature goes to the class of smallest
Mahalanobis distance; with an identity covariance that is the nearest class mean (the NCM baseline the paper
compares against); and nothing of an old class changes when new classes arrive (exemplar-free, the backbone frozen).
The expected values are computed here with torch directly, not with the module's own helpers.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import baselines.fecam as fecam_mod
from baselines.fecam import FeCAM, FeCAMConfig
from clbench.core.config import RunConfig
from clbench.errors import ClbenchError
from clbench.methods.contract import Context, Split, Task
from clbench.run import harness

D = 64  # vit_micro's width


def ctx_for(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0, log=lambda s: None)


def features_split(z: torch.Tensor, y: torch.Tensor) -> Split:
    return Split(None, np.arange(len(y)), y.long(), z, None, None)


def gaussian_split(classes: list[int], n: int, seed: int, offset: float = 0.0, sep: float = 1.5) -> Split:
    """``n`` features per class, each class its own mean and (correlated) covariance; ``offset`` shifts every
    feature (a positive offset makes them non-negative); ``sep`` scales the class means apart."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes).repeat_interleave(n)
    centre = torch.randn(max(classes) + 1, D, generator=torch.Generator().manual_seed(99))
    mix = torch.randn(max(classes) + 1, D, D, generator=torch.Generator().manual_seed(98)) / D**0.5  # correlated noise
    mix = mix * torch.rand(max(classes) + 1, 1, D, generator=torch.Generator().manual_seed(97)) * 2
    z = sep * centre[y] + torch.einsum("nd,nde->ne", torch.randn(len(y), D, generator=g), mix[y]) + offset
    return features_split(z.float(), y)


def two_tasks(cfg: FeCAMConfig, backbone, n: int = 40, sep: float = 1.5) -> tuple[FeCAM, list[Task]]:
    strategy = FeCAM(cfg, ctx_for(backbone))
    tasks = [
        Task(t, [3 * t, 3 * t + 1, 3 * t + 2], 3 * t + 3, gaussian_split([3 * t, 3 * t + 1, 3 * t + 2], n, t, sep=sep))
        for t in range(2)
    ]
    return strategy, tasks


def test_fecam_statistics_are_the_shrunk_normalised_class_covariance_and_logits_the_mahalanobis_distance(backbone):
    strategy, tasks = two_tasks(FeCAMConfig(), backbone)
    for task in tasks:
        strategy.learn_task(task)
    test = gaussian_split(list(range(6)), 10, seed=7)
    logits = strategy.predict(test)
    zt = F.normalize(test.features.double(), dim=1)
    for task in tasks:
        z, y = F.normalize(task.train.features.double(), dim=1), task.train.labels
        for k, c in enumerate(task.classes):
            zc = z[y == c]
            mean = zc.mean(0)
            cov = (zc - mean).T @ (zc - mean) / (len(zc) - 1)  # the sample covariance
            shrunk = cov + cov.diagonal().mean() * torch.eye(D, dtype=torch.float64)  # alpha1 = 1, alpha2 = 0
            corr = shrunk / torch.outer(shrunk.diagonal().sqrt(), shrunk.diagonal().sqrt())
            torch.testing.assert_close(strategy.means[task.id][k], mean)
            torch.testing.assert_close(torch.linalg.inv(strategy.precisions[task.id][k]), corr)
            assert torch.allclose(corr.diagonal(), torch.ones(D, dtype=torch.float64))  # a correlation matrix
            diff = zt - mean
            want = torch.einsum("nd,de,ne->n", diff, torch.linalg.inv(corr), diff)
            torch.testing.assert_close(-logits[:, c].double(), want, rtol=1e-5, atol=1e-5)
    # the features are L2-normalised first, so scaling them changes nothing
    scaled = features_split(3.0 * test.features, test.labels)
    torch.testing.assert_close(strategy.predict(scaled), logits, rtol=1e-6, atol=1e-6)


def test_fecam_with_overwhelming_shrinkage_is_the_nearest_class_mean(backbone):
    """alpha1 -> infinity makes every normalised covariance the identity: FeCAM becomes NCM on normalised features,
    while the default shrinkage (alpha1 = 1) uses each class's own covariance and decides otherwise on overlapping,
    heterogeneous classes."""
    test = gaussian_split(list(range(6)), 20, seed=8, sep=0.3)
    zt = F.normalize(test.features.double(), dim=1)
    predictions = {}
    for alpha1 in (1e9, 1.0):
        strategy, tasks = two_tasks(FeCAMConfig(alpha1=alpha1), backbone, sep=0.3)
        for task in tasks:
            strategy.learn_task(task)
        ncm = torch.cdist(zt, torch.cat(strategy.means)).argmin(1)  # (N,) nearest normalised class mean
        predictions[alpha1] = strategy.predict(test).argmax(1)
    assert torch.equal(predictions[1e9], ncm)
    assert not torch.equal(predictions[1.0], ncm)
    accuracy = {a: float((p == test.labels).float().mean()) for a, p in predictions.items()}
    assert accuracy[1.0] > accuracy[1e9], accuracy  # the class covariances help (the paper's point)


def test_fecam_old_classes_are_untouched_by_new_tasks(backbone):
    strategy, tasks = two_tasks(FeCAMConfig(), backbone)
    test = gaussian_split(list(range(6)), 10, seed=9)
    strategy.learn_task(tasks[0])
    means, precisions, logits = strategy.means[0].clone(), strategy.precisions[0].clone(), strategy.predict(test)
    strategy.learn_task(tasks[1])
    assert torch.equal(strategy.means[0], means) and torch.equal(strategy.precisions[0], precisions)
    assert torch.equal(strategy.predict(test)[:, :3], logits)  # old classes' scores: bit for bit
    assert strategy.predict(test).shape == (len(test), 6)


def test_fecam_counts_its_statistics_as_stored(backbone):
    strategy, tasks = two_tasks(FeCAMConfig(), backbone)
    for task in tasks:
        strategy.learn_task(task)
    pc = strategy.param_counts()
    want = FeCAM.param_formula(FeCAMConfig(), D, 4, (3, 3))
    assert pc.stored_per_task == want.stored_per_task == [3 * (D + D * D)] * 2
    assert pc.added_per_task == pc.trainable_per_task == [0, 0] and pc.head == want.head == 6 * (D + D * D)


def test_fecam_pilot_rule_is_a_row_correlation_of_rank_d_minus_1(backbone):
    """PILOT's ``torch.corrcoef(cov + 100 I)`` correlates the rows of the shrunk covariance: a singular matrix (hence
    its pseudo-inverse), unlike the authors' correlation normalisation."""
    strategy, tasks = two_tasks(FeCAMConfig(rule="pilot"), backbone)
    strategy.learn_task(tasks[0])
    z, y = tasks[0].train.features.double(), tasks[0].train.labels
    cov = torch.cov(z[y == 0].T) + 100 * torch.eye(D, dtype=torch.float64)
    rows = cov - cov.mean(1, keepdim=True)
    corr = rows @ rows.T / torch.outer(rows.norm(dim=1), rows.norm(dim=1))
    torch.testing.assert_close(strategy.precisions[0][0], torch.linalg.pinv(corr, hermitian=True))
    assert int(torch.linalg.matrix_rank(corr)) == D - 1
    torch.testing.assert_close(strategy.means[0][0], F.normalize(z[y == 0].mean(0), dim=0))


def test_fecam_tukey_transform_on_non_negative_features_and_refused_on_signed_ones(backbone):
    strategy = FeCAM(FeCAMConfig(tukey=True), ctx_for(backbone))
    task = Task(0, [0, 1, 2], 3, gaussian_split([0, 1, 2], 30, 0, offset=20.0))
    assert float(task.train.features.min()) > 0
    strategy.learn_task(task)
    z = F.normalize(task.train.features.double().sqrt(), dim=1)  # beta = 0.5, then L2
    torch.testing.assert_close(strategy.means[0][1], z[task.train.labels == 1].mean(0))
    signed = FeCAM(FeCAMConfig(tukey=True), ctx_for(backbone))
    with pytest.raises(ClbenchError, match=r"Tukey transform .* needs non-negative features"):
        signed.learn_task(Task(0, [0, 1, 2], 3, gaussian_split([0, 1, 2], 30, 0)))


def test_fecam_refuses_a_class_with_one_image_and_the_run_setting_below_two(backbone):
    strategy = FeCAM(FeCAMConfig(), ctx_for(backbone))
    split = gaussian_split([0, 1], 3, 0).subset([0, 1, 2, 3])  # class 1 keeps one image
    with pytest.raises(ClbenchError, match=r"FeCAM needs >= 2 training images per class .*class 1 has 1"):
        strategy.learn_task(Task(0, [0, 1], 2, split))
    assert FeCAM.card.min_train_per_class == 2
    with pytest.raises(ClbenchError, match=r"train_per_class 1: fecam learns from at least 2 images per class"):
        harness.resolve(RunConfig(strategy="fecam", train_per_class=1))


def test_fecam_refuses_a_singular_covariance(backbone):
    """No shrinkage and fewer images (10) than dimensions (64): the covariance has rank 9."""
    strategy = FeCAM(FeCAMConfig(alpha1=0.0), ctx_for(backbone))
    with pytest.raises(ClbenchError, match=r"shrunk covariance of class 0 \(task 0\) is singular"):
        strategy.learn_task(Task(0, [0, 1], 2, gaussian_split([0, 1], 10, 0)))
    same = features_split(torch.ones(6, D), torch.tensor([0, 0, 0, 1, 1, 1]))  # every image alike: zero covariance
    with pytest.raises(ClbenchError, match="singular"):
        FeCAM(FeCAMConfig(), ctx_for(backbone)).learn_task(Task(0, [0, 1], 2, same))


def test_fecam_refuses_statistics_beyond_the_available_memory(backbone):
    strategy = FeCAM(FeCAMConfig(), ctx_for(backbone))
    with (
        mock.patch.object(fecam_mod, "available_memory", lambda: 10_000),
        pytest.raises(ClbenchError, match=r"FeCAM: 3 more classes' d x d precision matrices \(d = 64\)"),
    ):
        strategy.learn_task(Task(0, [0, 1, 2], 3, gaussian_split([0, 1, 2], 10, 0)))
    # 200 classes at d = 768: 16 (d^2 + d) bytes per class with the checkpoint's copy, 1.9 GB
    assert fecam_mod.memory_estimate(200, 768) == 16 * 200 * (768 * 768 + 768) + 40 * 768 * 768


def test_fecam_config_refuses_bad_values():
    with pytest.raises(ValueError, match="rule"):
        FeCAMConfig(rule="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha1"):
        FeCAMConfig(alpha1=-1.0)
    with pytest.raises(ValueError, match="tukey"):
        FeCAMConfig(tukey=True, rule="pilot")


def test_fecam_checkpoint_round_trip(backbone):
    strategy, tasks = two_tasks(FeCAMConfig(), backbone)
    strategy.learn_task(tasks[0])
    saved = strategy.save_state()
    resumed = FeCAM(FeCAMConfig(), ctx_for(backbone))
    resumed.restore_state(saved)
    strategy.learn_task(tasks[1])
    resumed.learn_task(tasks[1])
    test = gaussian_split(list(range(6)), 5, seed=3)
    assert torch.equal(resumed.predict(test), strategy.predict(test))
    other = FeCAM(FeCAMConfig(), ctx_for(backbone))
    other.dim = 32  # a backbone of another width
    with pytest.raises(ClbenchError, match="64-d backbone features"):
        other.restore_state(saved)
