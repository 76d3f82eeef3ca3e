"""L2P: mechanics on the tiny random ViT and end to end through the harness; its profiles, refusal of a non-ViT
backbone and one slow real run are in tests/test_method_profiles.py, shared with EASE.

The clbench cache (``CLBENCH_CACHE``) is isolated per session by ``conftest.py``.

Every test states an invariant from the paper / reference code (top-k by cosine, masked loss, parameter counts,
per-sample predictions) and would fail if the code broke it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tinytasks import ctx_for, micro_harness_run

from baselines.l2p import L2P, L2PConfig, PromptPool, select_prompts
from clbench.features.backbones import state_digest
from clbench.methods.contract import PER_SAMPLE, REFERENCE
from clbench.methods.shared import masked_cross_entropy, vit_forward_tokens, vit_inserted_position, vit_tokens

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

L2P_SMALL = L2PConfig(epochs=1, batch_size=8, eval_batch_size=4)


# ----------------------------------------------------------------------------------------------- fixtures
TASK_CLASSES = ([0, 1], [2, 3])  # two equal tasks: the classes of tinytasks' `tasks` and `test_split`


# ----------------------------------------------------------------------------------------------- L2P
def test_select_prompts_takes_top_k_keys_by_cosine_not_dot_product():
    pool = PromptPool(4, 2, 3, torch.Generator().manual_seed(0))
    with torch.no_grad():  # key 1 is long, so a dot product would rank it first
        pool.keys.copy_(torch.tensor([[0.01, 0, 0], [0, 100.0, 0], [0, 0, 1.0], [-1.0, 0, 0]]))
    query = torch.tensor([[1.0, 0.5, 0.1], [0.0, 0.1, 1.0]])
    sim = pool.similarity(query)
    assert torch.allclose(sim, F.normalize(query, dim=1) @ F.normalize(pool.keys, dim=1).T)
    idx = select_prompts(sim, 2, batchwise=False)
    assert idx.tolist() == [[0, 1], [2, 1]]


def test_batchwise_selection_is_the_batch_vote_with_ties_to_lower_id():
    sim = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.9, 0.7, 0.0, 0.2], [0.0, 0.1, 0.9, 0.8]])
    voted = select_prompts(sim, 2, batchwise=True)
    assert voted.tolist() == [[0, 1]] * 3  # ids 0 and 1 were chosen twice, 2 and 3 once
    tie = select_prompts(sim[[0, 2]], 2, batchwise=True)  # every id chosen once: lowest ids win
    assert tie.tolist() == [[0, 1]] * 2


def test_masked_cross_entropy_ignores_classes_outside_the_task():
    logits = torch.randn(5, 6, requires_grad=True)
    target = torch.tensor([2, 3, 3, 2, 2])
    loss = masked_cross_entropy(logits, target, [2, 3])
    expected = F.cross_entropy(logits[:, 2:4], target - 2)
    assert torch.allclose(loss, expected)
    loss.backward()
    assert torch.all(logits.grad[:, [0, 1, 4, 5]] == 0)
    shifted = logits.detach().clone()
    shifted[:, [0, 1, 4, 5]] += 50.0  # other classes' logits cannot change the loss
    assert torch.allclose(masked_cross_entropy(shifted, target, [2, 3]), expected)


def test_vit_helpers_reproduce_the_frozen_feature_and_insert_after_cls(backbone):
    model = backbone.model
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        plain = model.forward_head(vit_forward_tokens(model, vit_tokens(model, x)), pre_logits=True)
        assert torch.equal(plain, backbone(x))
        extra = torch.randn(3, 5, backbone.num_features)
        tokens = vit_tokens(model, x, extra + vit_inserted_position(model))
    n_patches = model.patch_embed.num_patches
    assert tokens.shape == (3, 1 + 5 + n_patches, backbone.num_features)
    assert torch.equal(tokens[:, 1:6], extra + model.pos_embed[:, :1])  # [CLS] position, as PILOT's table
    assert torch.equal(tokens[:, 6:], vit_tokens(model, x)[:, 1:])  # patches unchanged, after the prompts


@pytest.mark.parametrize("method", ["l2p"])
def test_training_leaves_the_backbone_bit_identical(backbone, tasks, method):
    before = state_digest(backbone.model)
    strategy = L2P(L2P_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    assert state_digest(backbone.model) == before == backbone.digest
    assert not any(p.requires_grad for p in backbone.model.parameters())


def test_l2p_learns_prompts_keys_and_head_and_counts_them(backbone, tasks):
    strategy = L2P(L2P_SMALL, ctx_for(backbone))
    prompts0 = strategy.pool.prompts.detach().clone()
    strategy.learn_task(tasks[0])
    assert not torch.equal(prompts0, strategy.pool.prompts)  # prompts were trained
    d, cfg = backbone.num_features, L2P_SMALL
    pool = cfg.pool_size * cfg.prompt_length * d + cfg.pool_size * d
    strategy.learn_task(tasks[1])
    counts = strategy.param_counts()
    assert counts.added_per_task == [pool + 2 * (d + 1), 2 * (d + 1)]
    assert counts.trainable_per_task == [pool + 2 * (d + 1)] * 2
    assert counts.head == 4 * (d + 1)


@pytest.mark.parametrize("method", ["l2p"])
def test_per_sample_predictions_do_not_depend_on_the_batch(backbone, tasks, test_split, method):
    strategy = L2P(L2P_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    # keys at the (centred) test queries: images choose different prompts
    feats = test_split.features
    with torch.no_grad():
        strategy.pool.keys.copy_(feats[: L2P_SMALL.pool_size] - feats.mean(0))
    own = select_prompts(strategy.pool.similarity(feats), L2P_SMALL.top_k, batchwise=False)
    assert len({tuple(sorted(r)) for r in own.tolist()}) > 1
    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 4) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3, 5]  # another order and other neighbours in every batch of 4
    part = strategy.predict(test_split.subset(rows), PER_SAMPLE)
    assert torch.allclose(part, full[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(part.argmax(1), full[rows].argmax(1))


def test_l2p_reference_protocol_with_batches_of_one_is_per_sample(backbone, tasks, test_split):
    strategy = L2P(L2PConfig(epochs=1, batch_size=8, eval_batch_size=1), ctx_for(backbone))
    strategy.learn_task(tasks[0])
    assert torch.allclose(strategy.predict(test_split, REFERENCE), strategy.predict(test_split, PER_SAMPLE))


# ----------------------------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="top_k"):
        L2PConfig(top_k=11)
    with pytest.raises(ValueError, match="epochs"):
        L2PConfig(epochs=0)


# ----------------------------------------------------------------------------------------------- harness
@pytest.mark.full
@pytest.mark.gated  # the gate runs it through the harness on the real ViT, every protocol
@pytest.mark.parametrize("method,protocol", [("l2p", "both")])
def test_end_to_end_through_the_harness(tmp_path, method, protocol):
    """Full tier: the default tier carries L2P through the harness with
    tests/test_contract.py::test_session_contract[l2p] and the reference protocol with
    test_l2p_reference_protocol_with_batches_of_one_is_per_sample."""
    record = micro_harness_run(tmp_path, method, protocol)
    assert len(record.accuracy_matrix) == 2 and all(np.isfinite(record.acc_curve))
    assert set(record.protocols) == {"per-sample", "reference"} and record.protocol_gap is not None
    assert record.per_task[-1].diagnostics["reference_eval_batch_size"] == 64
