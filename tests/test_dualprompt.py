"""DualPrompt: mechanics on the tiny random ViT and the reference protocol; its profiles and one veryslow real run
are in tests/test_method_profiles.py, shared with MOS.

Every test states an invariant from the paper / PILOT code (prefix attention, forced E-prompt, batch-wise prompt
vote, parameter formula, per-sample predictions) and would fail if the code broke it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tinytasks import (
    check_param_formula_equals_the_counts,
    check_per_sample_predictions_ignore_order_and_batch_size,
    ctx_for,
    micro_harness_run,
)

from baselines.dualprompt import DualPrompt, DualPromptConfig
from clbench.errors import ClbenchError
from clbench.layers.prompts import prefix_attention, prefix_block
from clbench.methods.contract import PER_SAMPLE, REFERENCE, RunShape
from clbench.methods.shared import vit_block

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

DP_SMALL = DualPromptConfig(epochs=1, batch_size=8, eval_batch_size=4, e_prompt_layers="2,3", pool_size=4)


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def trained_dp(backbone, tasks) -> DualPrompt:
    strategy = DualPrompt(DP_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    return strategy


@pytest.mark.parametrize("method", ["dualprompt"])
def test_per_sample_predictions_do_not_depend_on_order_or_batch_size(trained_dp, test_split, method):
    strategy = trained_dp
    # keys at the (centred) test queries: images choose different prompts
    feats = test_split.features
    aim_keys(strategy, feats, [0, 14])
    assert len(set(strategy.select(feats, batchwise=False).tolist())) > 1
    check_per_sample_predictions_ignore_order_and_batch_size(strategy, test_split, n_classes=5)


# ----------------------------------------------------------------------------------------------- DualPrompt
def test_prefix_attention_without_prefix_is_the_timm_block(backbone):
    block = backbone.model.blocks[1]
    x = torch.randn(2, 7, backbone.num_features)
    with torch.no_grad():
        assert torch.allclose(prefix_block(block, x, None), vit_block(block, x), atol=1e-5)


def test_prefixes_are_extra_keys_and_values_of_every_head(backbone):
    attn = backbone.model.blocks[0].attn
    d, heads = backbone.num_features, attn.num_heads
    x, prefix = torch.randn(1, 3, d), torch.randn(1, 2, 4, d)
    with torch.no_grad():
        got = prefix_attention(attn, x, prefix)
        q, k, v = attn.qkv(x).reshape(1, 3, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        pk = prefix[:, 0].reshape(1, 4, heads, d // heads).transpose(1, 2)
        pv = prefix[:, 1].reshape(1, 4, heads, d // heads).transpose(1, 2)
        w = torch.softmax(q @ torch.cat([pk, k], 2).transpose(-2, -1) / (d // heads) ** 0.5, dim=-1)
        expected = attn.proj((w @ torch.cat([pv, v], 2)).transpose(1, 2).reshape(1, 3, d))
    assert torch.allclose(got, expected, atol=1e-5)
    with torch.no_grad():  # a prefix changes the output (no silent no-op)
        assert not torch.allclose(got, prefix_attention(attn, x, None), atol=1e-3)


def test_training_forces_the_task_slot_and_copies_the_previous_prompt(backbone, tasks):
    strategy = DualPrompt(DP_SMALL, ctx_for(backbone))
    init_e, init_keys = strategy.prompts.e.detach().clone(), strategy.prompts.keys.detach().clone()
    strategy.learn_task(tasks[0])
    e0, keys0 = strategy.prompts.e.detach().clone(), strategy.prompts.keys.detach().clone()
    assert not torch.equal(e0[0], init_e[0]) and not torch.equal(keys0[0], init_keys[0])  # slot 0 trained
    assert torch.equal(e0[1:], init_e[1:]) and torch.equal(keys0[1:], init_keys[1:])  # others untouched
    seen = {}
    original = DualPrompt._forward

    def spy(self, images, slots):
        seen.setdefault("e1", self.prompts.e[1].detach().clone())
        seen.setdefault("slots", set()).update(slots.tolist())
        return original(self, images, slots)

    DualPrompt._forward = spy
    try:
        strategy.learn_task(tasks[1])
    finally:
        DualPrompt._forward = original
    assert torch.equal(seen["e1"], e0[0])  # slot 1 started as a copy of slot 0
    assert seen["slots"] == {1}  # prompt_mask: every training image used slot 1
    assert torch.equal(strategy.prompts.e[0], e0[0]) and torch.equal(strategy.prompts.keys[0], keys0[0])
    assert torch.equal(strategy.prompts.e[2:], init_e[2:])


def aim_keys(strategy: DualPrompt, feats: torch.Tensor, rows: list[int]) -> None:
    """Key i = the query of test image rows[i] (so that image picks slot i); other keys point away from all."""
    with torch.no_grad():
        strategy.prompts.keys.copy_(-feats.mean(0).expand_as(strategy.prompts.keys))
        strategy.prompts.keys[: len(rows)] = feats[rows]


def test_dualprompt_reference_protocol_is_the_batch_vote(trained_dp, test_split):
    """A constructed case: a batch of 4 (``eval_batch_size``) holding three images that pick slot A and one that
    picks slot B: under the reference protocol the fourth is outvoted and uses slot A; in a batch of its own it
    keeps slot B. Per-sample rows never change."""
    s = trained_dp
    feats = test_split.features
    saved = s.prompts.keys.detach().clone()
    try:
        aim_keys(s, feats, [0, 14])
        own = s.select(feats, batchwise=False)
        counts = torch.bincount(own, minlength=2)
        major = int(counts[:2].argmax())
        a_rows = torch.nonzero(own == major).flatten().tolist()[:3]
        b_row = int(torch.nonzero(own == 1 - major).flatten()[0])
        assert len(a_rows) == 3
        batch = test_split.subset(a_rows + [b_row])
        ref, per = s.predict(batch, REFERENCE), s.predict(batch, PER_SAMPLE)
        with torch.no_grad():
            images = torch.stack([test_split.eval_transform(test_split.source.image(i)) for i in a_rows + [b_row]])
            forced = s._forward(images, torch.full((4,), major, dtype=torch.long))[:, : s.n_seen]
        assert torch.allclose(ref, forced, atol=1e-5)  # everyone used the majority's slot
        assert torch.allclose(ref[:3], per[:3], atol=1e-5)  # the majority's own rows are unchanged
        assert not torch.allclose(ref[3], per[3], atol=1e-4)  # the fourth image was outvoted
        alone = s.predict(test_split.subset([b_row]), REFERENCE)  # the same image in another batch
        assert torch.allclose(alone[0], per[3], atol=1e-5)
    finally:
        with torch.no_grad():
            s.prompts.keys.copy_(saved)


def test_untrained_keys_are_matched_only_with_the_reference_switch(trained_dp, test_split):
    s = trained_dp
    feats = test_split.features
    saved = s.prompts.keys.detach().clone()
    try:
        aim_keys(s, feats, [0, 14])
        with torch.no_grad():
            s.prompts.keys[3] = feats[5]  # slot 3 belongs to no task learnt so far (2 tasks)
        assert s.select(feats[[5]], batchwise=False).tolist() != [3]
        s.cfg = replace(s.cfg, match_unseen_keys=True)
        assert s.select(feats[[5]], batchwise=False).tolist() == [3]
    finally:
        s.cfg = replace(s.cfg, match_unseen_keys=False)
        with torch.no_grad():
            s.prompts.keys.copy_(saved)


def test_dualprompt_refuses_more_tasks_than_slots(backbone, tasks):
    strategy = DualPrompt(replace(DP_SMALL, pool_size=1), ctx_for(backbone))
    strategy.learn_task(tasks[0])
    with pytest.raises(ClbenchError, match="pool_size"):
        strategy.learn_task(tasks[1])


def test_dualprompt_config_rejects_bad_layers():
    with pytest.raises(ValueError, match="e_prompt_layers"):
        DualPromptConfig(e_prompt_layers="2,x")
    with pytest.raises(ValueError, match="share a block"):
        DualPromptConfig(g_prompt_layers="0,1", e_prompt_layers="1,2")


# ----------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("method", ["dualprompt"])
def test_param_formula_equals_the_counts_of_a_real_run(trained_dp, backbone, tasks, method):
    strategy = trained_dp
    counts = check_param_formula_equals_the_counts(strategy, backbone, tasks)
    used = sum(p.numel() for p in (strategy.prompts.g, strategy.prompts.keys[:2], strategy.prompts.e[:2]))
    assert sum(counts.added_per_task) == used + counts.head


def moved_elements(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per saved tensor, a mask of the elements ``after`` holds that are new (the tensor grew: head rows) or differ
    from ``before``: what a task's training changed, read off the saved state, not from any formula."""
    out = {}
    for key, new in after.items():
        moved = torch.ones(new.shape, dtype=torch.bool)
        old = before.get(key)
        if old is not None and old.numel():
            overlap = tuple(slice(0, n) for n in old.shape)
            moved[overlap] = new[overlap] != old
        out[key] = moved
    return out


@pytest.mark.parametrize("weight_decay", [0.0, 1e-4])
def test_param_counts_equal_the_elements_training_moved(backbone, tasks, weight_decay):
    """The counts the record keeps against what each task's training changed in the saved state: trainable in task t
    = the elements that moved (or were added) in it, added in task t = the elements that moved for the first time.
    DualPrompt's param_counts() is built from its param_formula, so the formula test above cannot tell the two
    apart; this one measures. With weight decay Adam moves every tensor it holds (every seen head row, every slot
    and key of the pool); the unused slots only decay, so "added" keeps the slots that learn and is measured at the
    reference's weight decay, 0."""
    strategy = DualPrompt(replace(DP_SMALL, weight_decay=weight_decay), ctx_for(backbone))
    state = {k: v.clone() for k, v in strategy.save_state().tensors.items()}
    ever: dict[str, torch.Tensor] = {}
    added, trainable = [], []
    for task in tasks:
        strategy.learn_task(task)
        after = {k: v.clone() for k, v in strategy.save_state().tensors.items()}
        moved = moved_elements(state, after)
        first = {k: m & ~_padded(ever.get(k), m.shape) for k, m in moved.items()}
        trainable.append(sum(int(m.sum()) for m in moved.values()))
        added.append(sum(int(m.sum()) for m in first.values()))
        ever = {k: m | _padded(ever.get(k), m.shape) for k, m in moved.items()}
        state = after
    counts = strategy.param_counts()
    assert counts.trainable_per_task == trainable
    if weight_decay == 0:
        assert counts.added_per_task == added


def _padded(mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """``mask`` (an earlier, possibly smaller tensor's) in a False mask of ``shape``."""
    out = torch.zeros(shape, dtype=torch.bool)
    if mask is not None and mask.numel():
        out[tuple(slice(0, n) for n in mask.shape)] = mask
    return out


def test_cost_models_count_the_passes():
    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(10.0, 20.0), protocols=2)
    dp = DualPrompt.card.cost(DualPromptConfig(epochs=3, query="cached"), shape)
    assert dp.b == 600 and dp.f == 220 + 2 * 30 and dp.f_cacheable == 220
    assert DualPrompt.card.cost(DualPromptConfig(epochs=3), shape).f == dp.f + 600  # augmented queries


# ----------------------------------------------------------------------------------------------- harness
@pytest.mark.full
@pytest.mark.gated  # the gate runs it through the harness on the real ViT, every protocol
@pytest.mark.parametrize("method", ["dualprompt"])
def test_end_to_end_both_protocols_through_the_harness(tmp_path, method):
    """Full tier: the default tier carries DualPrompt through the harness with
    tests/test_contract.py::test_session_contract[dualprompt] and the reference protocol with
    test_dualprompt_reference_protocol_is_the_batch_vote."""
    record = micro_harness_run(tmp_path, method, "both")
    assert set(record.protocols) == {"per-sample", "reference"} and record.protocol_gap is not None
    diag = record.per_task[-1].diagnostics
    assert diag["reference_eval_batch_size"] == 64 and 0 <= diag["prompt_id_accuracy"] <= 100
