"""EASE: mechanics on the tiny random ViT and end to end through the harness; its profiles, refusal of a non-ViT
backbone and one slow real run are in tests/test_method_profiles.py, shared with L2P.

The clbench cache (``CLBENCH_CACHE``) is isolated per session by ``conftest.py``.

Every test states an invariant from the paper / reference code (one frozen adapter set per task, parameter
formula, prototypes, per-sample predictions) and would fail if the code broke it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tinytasks import ctx_for, micro_harness_run

from baselines.ease import EASE, AdapterSet, EASEConfig, subspace_weights, synthesize_prototypes
from clbench.core.costs import adapter_set_size
from clbench.features.backbones import state_digest
from clbench.methods.contract import PER_SAMPLE

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

EASE_SMALL = EASEConfig(epochs=1, batch_size=8, eval_batch_size=4, bottleneck=8)


# ----------------------------------------------------------------------------------------------- fixtures
TASK_CLASSES = ([0, 1], [2, 3])  # two equal tasks: the classes of tinytasks' `tasks` and `test_split`


@pytest.mark.parametrize("method", ["ease"])
def test_training_leaves_the_backbone_bit_identical(backbone, tasks, method):
    before = state_digest(backbone.model)
    strategy = EASE(EASE_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    assert state_digest(backbone.model) == before == backbone.digest
    assert not any(p.requires_grad for p in backbone.model.parameters())


@pytest.mark.parametrize("method", ["ease"])
def test_per_sample_predictions_do_not_depend_on_the_batch(backbone, tasks, test_split, method):
    strategy = EASE(EASE_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 4) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3, 5]  # another order and other neighbours in every batch of 4
    part = strategy.predict(test_split.subset(rows), PER_SAMPLE)
    assert torch.allclose(part, full[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(part.argmax(1), full[rows].argmax(1))


# ----------------------------------------------------------------------------------------------- EASE
def test_new_adapter_set_starts_as_the_frozen_backbone(backbone, test_split):
    strategy = EASE(EASE_SMALL, ctx_for(backbone))
    fresh = AdapterSet(len(backbone.model.blocks), backbone.num_features, EASE_SMALL, torch.Generator().manual_seed(0))
    fresh.eval()
    images = torch.stack([test_split.eval_transform(test_split.source.image(i)) for i in range(4)])
    with torch.no_grad():
        feats = strategy._features(images, [fresh])  # W_up = 0: the adapter adds nothing
    assert torch.allclose(feats[:, 0], test_split.features[:4], atol=1e-5)


def test_ease_adds_one_frozen_adapter_set_per_task_of_the_formula_size(backbone, tasks):
    strategy = EASE(EASE_SMALL, ctx_for(backbone))
    n_blocks, d, r = len(backbone.model.blocks), backbone.num_features, EASE_SMALL.bottleneck
    assert r != d  # so the formula's d and r cannot be swapped unnoticed
    expected = n_blocks * (2 * d * r + r + d)
    strategy.learn_task(tasks[0])
    assert len(strategy.adapter_sets) == 1
    first = state_digest(strategy.adapter_sets[0])
    assert any(float(a.up_weight.abs().sum()) > 0 for a in strategy.adapter_sets[0])  # it was trained
    strategy.learn_task(tasks[1])
    assert len(strategy.adapter_sets) == 2
    assert state_digest(strategy.adapter_sets[0]) == first  # old set bit-identical after the next task
    for s in strategy.adapter_sets:
        assert sum(p.numel() for p in s.parameters()) == expected == adapter_set_size(n_blocks, d, r)
        assert not any(p.requires_grad for p in s.parameters())
    counts = strategy.param_counts()
    assert counts.extra["adapter_params_per_task"] == expected
    assert counts.trainable_per_task == [expected + 2 * d + 1] * 2  # adapters + task head (2 classes) + sigma
    assert strategy.protos.shape == (4, 2, d)
    assert counts.extra["backbone_passes_per_test_image_per_task"] == [1, 2]


def test_ease_prototypes_are_class_means_in_every_subspace(backbone, tasks):
    strategy = EASE(EASE_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    feats = strategy._split_features(tasks[1].train)  # (N, 2, d)
    labels = tasks[1].train.labels
    for c in (2, 3):
        for j in (0, 1):  # task 1's classes are real in both subspaces
            assert torch.allclose(strategy.protos[c, j], feats[labels == c, j].mean(0), atol=1e-5)


def test_synthesized_prototypes_follow_solve_sim_reset():
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(6, 3, 4, generator=g)  # tasks: [0, 1], [2, 3], [4, 5]
    tasks = [[0, 1], [2, 3], [4, 5]]
    out = synthesize_prototypes(protos, tasks)
    for i, j, ref in [(0, 1, [2, 3, 4, 5]), (0, 2, [4, 5]), (1, 2, [4, 5])]:
        old = tasks[i]
        w = torch.softmax(F.cosine_similarity(protos[old, i][:, None], protos[ref, i][None], dim=-1), dim=1)
        assert torch.allclose(out[old, j], w @ protos[ref, j], atol=1e-6)
    for c, task in enumerate([0, 0, 1, 1, 2, 2]):  # real prototypes are kept
        assert torch.equal(out[c, : task + 1], protos[c, : task + 1])


def test_subspace_weights_follow_forward_reweight():
    w = subspace_weights([0, 0, 1, 2], 3, alpha=0.1)
    assert torch.allclose(w, torch.tensor([[1, 0.05, 0.05], [1, 0.05, 0.05], [0.05, 1, 0.05], [0.05, 0.05, 1]]))
    assert torch.equal(subspace_weights([0, 0], 1, alpha=0.1), torch.ones(2, 1))


# ----------------------------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="adapter_dropout"):
        EASEConfig(adapter_dropout=1.0)
    with pytest.raises(ValueError, match="min_lr"):
        EASEConfig(min_lr=1.0)


# ----------------------------------------------------------------------------------------------- harness
@pytest.mark.full
@pytest.mark.gated  # the gate runs it through the harness on the real ViT, every protocol
@pytest.mark.parametrize("method,protocol", [("ease", "per-sample")])
def test_end_to_end_through_the_harness(tmp_path, method, protocol):
    """Full tier: the default tier carries EASE through the harness with
    tests/test_contract.py::test_session_contract[ease]."""
    record = micro_harness_run(tmp_path, method, protocol)
    assert len(record.accuracy_matrix) == 2 and all(np.isfinite(record.acc_curve))
    params = record.params
    assert params.extra["adapter_params_per_task"] == 4 * (2 * 64 * 64 + 64 + 64)  # vit_micro: 4 blocks, d = r = 64
    assert [t.diagnostics["backbone_passes_per_image"] for t in record.per_task] == [1, 2]
