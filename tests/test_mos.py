"""MOS: mechanics on the tiny random ViT and the reference protocol; its profiles and one veryslow real run are in
tests/test_method_profiles.py, shared with DualPrompt.

Every test states an invariant from the paper / PILOT code (merging formula, frozen stored sets, self-refinement,
parameter formula, per-sample predictions) and would fail if the code broke it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tinytasks import (
    check_param_formula_equals_the_counts,
    check_per_sample_predictions_ignore_order_and_batch_size,
    ctx_for,
    make_split,
    micro_harness_run,
)

from baselines.mos import MOS, MOSConfig, drifting, merge_toward, self_refine
from clbench.errors import ClbenchError
from clbench.features.backbones import state_digest
from clbench.layers.adapters import AdapterSet
from clbench.layers.prompts import orth_loss
from clbench.methods.contract import PER_SAMPLE, REFERENCE, RunShape, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

MOS_SMALL = MOSConfig(epochs=1, batch_size=8, eval_batch_size=4, ca_epochs=2)


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def trained_mos(backbone, tasks) -> MOS:
    strategy = MOS(MOS_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    return strategy


def random_set(backbone, seed: int) -> AdapterSet:
    s = AdapterSet(len(backbone.model.blocks), backbone.num_features, MOS_SMALL, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for p in s.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))
    return s


# ----------------------------------------------------------------------------------------------- MOS
def test_merge_moves_the_set_toward_the_mean_of_the_earlier_sets(backbone):
    a, b, cur = random_set(backbone, 1), random_set(backbone, 2), random_set(backbone, 3)
    before = [p.detach().clone() for p in cur.parameters()]
    merge_toward(cur, [a, b], 0.1)
    for p, p0, pa, pb in zip(cur.parameters(), before, a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, 0.9 * p0 + 0.1 * (pa + pb) / 2, atol=1e-6)
    unchanged = [p.detach().clone() for p in cur.parameters()]
    merge_toward(cur, [], 0.1)  # task 0: nothing to merge toward
    assert all(torch.equal(p, q) for p, q in zip(cur.parameters(), unchanged, strict=True))


def test_a_reference_forward_blends_every_layer_once_per_block(backbone, test_split):
    """PILOT's forward re-blends ALL layers before each block: after one forward the set's deviation from the
    earlier mean is (1 - m) ** n_blocks of what it was."""
    prev, s = random_set(backbone, 4), random_set(backbone, 5)
    s.eval()
    start = [p.detach().clone() for p in s.parameters()]
    strategy = MOS(MOS_SMALL, ctx_for(backbone))
    images = torch.stack([test_split.eval_transform(test_split.source.image(i)) for i in range(2)])
    with torch.no_grad():
        strategy._features(images, drifting(s, [prev], 0.1))
    k = 0.9 ** len(backbone.model.blocks)
    for p, p0, pp in zip(s.parameters(), start, prev.parameters(), strict=True):
        assert torch.allclose(p - pp, k * (p0 - pp), atol=1e-5)


def test_mos_stored_sets_are_frozen_after_their_task(backbone, tasks):
    strategy = MOS(MOS_SMALL, ctx_for(backbone))
    strategy.learn_task(tasks[0])
    first = state_digest(strategy.stored[0])
    assert any(float(a.up_weight.abs().sum()) > 0 for a in strategy.stored[0])  # set 0 was trained
    strategy.learn_task(tasks[1])
    assert len(strategy.stored) == 2
    assert state_digest(strategy.stored[0]) == first  # bit-identical after the next task
    assert not any(p.requires_grad for s in strategy.stored for p in s.parameters())
    assert state_digest(strategy.stored[1]) != first
    assert state_digest(strategy.current) == state_digest(strategy.stored[1])  # task 2 starts from set 1


def test_mos_statistics_and_prototypes_are_what_the_reference_stores(trained_mos, tasks):
    s = trained_mos
    for t, task in enumerate(tasks):
        with torch.no_grad():
            own = s._split_features(task.train, s.stored[t], 4)
            set0 = s._split_features(task.train, s.stored[0], 4)
        for c in task.classes:
            rows = task.train.labels == c
            assert torch.allclose(s.class_mean[c], own[rows].mean(0), atol=1e-5)
            cov = torch.cov(own[rows].double().T) + 1e-4 * torch.eye(own.shape[1], dtype=torch.float64)
            assert torch.allclose(s.class_cov[c], cov.float(), atol=1e-5)
            assert torch.allclose(s.prototypes[c], set0[rows].mean(0), atol=1e-5)


def test_orth_loss_is_cross_entropy_of_scaled_gram_matrix():
    g = torch.Generator().manual_seed(0)
    feats, means = torch.randn(4, 6, generator=g), torch.randn(3, 6, generator=g)
    m = torch.cat([means, feats])
    expected = F.cross_entropy(m @ m.T / 0.8, torch.arange(7))
    assert torch.allclose(orth_loss(feats, means, 0.8), expected)
    far = torch.eye(6)[:4] * 10  # orthogonal, long vectors: every row is its own best match
    assert float(orth_loss(far, torch.zeros(0, 6), 0.8)) < 1e-6


def test_self_refinement_follows_the_head_until_the_task_is_stable():
    class_task = torch.tensor([0, 0, 1, 1, 2, 2])
    head = torch.nn.Linear(3, 6, bias=False)
    with torch.no_grad():  # feature direction k -> a class of task k
        head.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0]]))
    e = torch.eye(3)
    feats = torch.stack(
        [
            torch.stack([e[1], e[1], e[1]]),  # starts at task 0, whose set points at task 1; set 1 agrees: stop at 1
            torch.stack([e[0], e[2], e[2]]),  # starts at task 0, which is stable at once
            torch.stack([e[1], e[2], e[1]]),  # 0 -> 1 -> 2 -> 1 -> ... cut after 4 rounds
        ]
    )
    logits, final = self_refine(feats, head, class_task, torch.tensor([0, 0, 0]), max_rounds=4)
    assert final.tolist() == [1, 0, 1]
    assert torch.equal(logits[0], head(e[1])) and torch.equal(logits[1], head(e[0]))
    assert torch.equal(logits[2], head(feats[2, 1]))  # the 4th round's set (task 1) gives the logits
    _, one = self_refine(feats, head, class_task, torch.tensor([0, 0, 0]), max_rounds=1)
    assert one.tolist() == [0, 0, 0]  # one round: the starting set, whatever the head says


@pytest.mark.parametrize("method", ["mos"])
def test_per_sample_predictions_do_not_depend_on_order_or_batch_size(trained_mos, test_split, method):
    strategy = trained_mos
    check_per_sample_predictions_ignore_order_and_batch_size(strategy, test_split, n_classes=5)


def test_mos_reference_protocol_drifts_its_own_copies_per_batch(backbone, tasks, test_split):
    strategy = MOS(MOS_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    own = strategy.predict(test_split, PER_SAMPLE)
    stored = [state_digest(s) for s in strategy.stored]
    n_batches = -(-len(test_split) // MOS_SMALL.eval_batch_size)
    a = strategy.predict(test_split, REFERENCE)
    # set 1 moved toward set 0 by (1 - m) per block and forward; set 0 never drifts
    k = 0.9 ** (len(backbone.model.blocks) * n_batches)
    for r, s, s0 in zip(
        strategy.reference_sets[1].parameters(),
        strategy.stored[1].parameters(),
        strategy.stored[0].parameters(),
        strict=True,
    ):
        assert torch.allclose(r - s0, k * (s - s0), atol=1e-5)
    assert state_digest(strategy.reference_sets[0]) == stored[0]
    b = strategy.predict(test_split, REFERENCE)  # the drift carries over: the same images, other outputs
    assert not torch.allclose(a, b)
    assert [state_digest(s) for s in strategy.stored] == stored  # the stored sets never drift
    assert torch.equal(strategy.predict(test_split, PER_SAMPLE), own)


def test_mos_reference_drift_switch_changes_training_from_task_1_only(backbone, tasks, test_split):
    sound = MOS(MOS_SMALL, ctx_for(backbone))
    drift = MOS(replace(MOS_SMALL, reference_drift=True), ctx_for(backbone))
    for s in (sound, drift):
        torch.manual_seed(0)  # the train transform's augmentation draws from the global RNG (as in the harness)
        s.learn_task(tasks[0])
    # task 0 has no earlier set: nothing drifts and no dropout leaks into the prototypes
    assert state_digest(sound.stored[0]) == state_digest(drift.stored[0])
    assert torch.allclose(sound.class_mean, drift.class_mean, atol=1e-6)
    assert torch.equal(sound.prototypes, drift.prototypes)
    for s in (sound, drift):
        torch.manual_seed(1)
        s.learn_task(tasks[1])
    assert state_digest(sound.stored[1]) != state_digest(drift.stored[1])
    # the reference's statistics come from the current set after it drifted further (taken after the snapshot)
    assert state_digest(drift.current) != state_digest(drift.stored[1])
    with torch.no_grad():
        snap = drift._split_features(tasks[1].train, drift.stored[1], 4)
    rows = tasks[1].train.labels == 2
    assert not torch.allclose(drift.class_mean[2], snap[rows].mean(0), atol=1e-4)
    # dropout was active for task 1's prototypes: they differ from the eval-mode class means under set 0
    with torch.no_grad():
        set0 = drift._split_features(tasks[1].train, drift.stored[0], 4)
    assert not torch.allclose(drift.prototypes[2], set0[rows].mean(0), atol=1e-6)


def test_mos_alignment_trains_only_the_head_and_only_from_task_1(backbone, tasks, monkeypatch):
    calls = []
    original = MOS._align_classifier

    def spy(self, task):
        sets = [state_digest(s) for s in self.stored]
        calls.append(task.id)
        original(self, task)
        assert [state_digest(s) for s in self.stored] == sets

    monkeypatch.setattr(MOS, "_align_classifier", spy)
    strategy = MOS(MOS_SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    assert calls == [1]


def test_mos_refuses_a_class_with_one_training_image(backbone):
    split = make_split(backbone, [0, 1], 1, seed=5)
    with pytest.raises(ClbenchError, match="2 training images"):
        MOS(MOS_SMALL, ctx_for(backbone)).learn_task(Task(0, [0, 1], 2, split))
    assert MOS.card.min_train_per_class == 2  # nor a run that would train on one (tests/test_harness.py)


# ----------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("method", ["mos"])
def test_param_formula_equals_the_counts_of_a_real_run(trained_mos, backbone, tasks, method):
    strategy = trained_mos
    counts = check_param_formula_equals_the_counts(strategy, backbone, tasks)
    d, depth = backbone.num_features, len(backbone.model.blocks)
    assert counts.extra["adapter_params_per_task"] == depth * (2 * d * 16 + 16 + d)
    stats = counts.extra["class_statistics_params"]
    assert stats == 5 * (d + d * d)


def test_cost_models_count_the_passes():
    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(10.0, 20.0), protocols=2)
    mos = MOS.card.cost(MOSConfig(epochs=3), shape)
    assert mos.b == 600 and mos.f == 2 * 200 + 2 * (10 * 1 + 20 * 2) and mos.f_cacheable == 0


# ----------------------------------------------------------------------------------------------- harness
@pytest.mark.full
@pytest.mark.gated  # the gate runs it through the harness on the real ViT, every protocol
@pytest.mark.parametrize("method", ["mos"])
def test_end_to_end_both_protocols_through_the_harness(tmp_path, method):
    """Full tier: the default tier carries MOS through the harness with
    tests/test_contract.py::test_session_contract[mos] and both protocols with
    test_mos_reference_protocol_drifts_its_own_copies_per_batch."""
    record = micro_harness_run(tmp_path, method, "both")
    assert set(record.protocols) == {"per-sample", "reference"} and record.protocol_gap is not None
    diag = record.per_task[-1].diagnostics
    assert diag["backbone_passes_per_image"] == 2 and len(diag["reference_set_drift_l2"]) == 2
    assert diag["reference_set_drift_l2"][0] == 0.0 and diag["reference_set_drift_l2"][1] > 0
