"""SLCA: mechanics on the tiny random ViT (the slow learner's two learning rates, the one tuned copy of the ViT,
class statistics, classifier alignment and its logit normalisation, the reference's head recall, checkpoints).

Every test states an invariant of the reference code (``GengDavid/SLCA`` ``models/slca.py``, PILOT's copy) and
would fail if the code broke it. The golden comparison with the reference is in tests/test_reference_golden.py.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from tinytasks import make_split

import clbench.methods.shared as blocks_mod
from baselines.slca import SLCA, SLCAConfig
from clbench.core.costs import plain_vit_params
from clbench.features.backbones import state_digest
from clbench.layers.slow_learner import alignment_tasks, normalised_logits, shrink_factors
from clbench.methods.contract import Context, Split, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too

SMALL = SLCAConfig(epochs=2, batch_size=6, ca_epochs=2, ca_samples=16, lr=0.05, eval_batch_size=8)


@pytest.fixture(scope="module")
def tasks(backbone) -> list[Task]:
    first = make_split(backbone, [0, 1], 6, seed=1)
    second = make_split(backbone, [2, 3, 4], 6, seed=2)  # unequal tasks: 2 then 3 classes
    return [Task(0, [0, 1], 2, first), Task(1, [2, 3, 4], 5, second)]


@pytest.fixture(scope="module")
def test_split(backbone) -> Split:
    return make_split(backbone, [0, 1, 2, 3, 4], 2, seed=3)


def ctx_for(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lambda s: None)


@pytest.fixture(scope="module")
def trained(backbone, tasks) -> tuple[SLCA, dict[str, torch.Tensor]]:
    """Two tasks learnt; the head blocks before and after the second task recorded."""
    s = SLCA(SMALL, ctx_for(backbone))
    s.learn_task(tasks[0])
    before = {"block0": s.head.blocks[0].weight.detach().clone(), "vit": state_digest(s.model)}
    s.learn_task(tasks[1])
    return s, before


def test_the_vit_is_copied_once_and_the_frozen_backbone_never_changes(backbone, trained):
    s, before = trained
    frozen = state_digest(backbone.model)
    assert s.model is not backbone.model
    assert frozen == backbone.digest  # bit-identical after two tasks of full fine-tuning
    assert state_digest(s.model) not in (frozen, before["vit"])  # the tuned copy moved in both tasks
    vits = [m for m in vars(s).values() if isinstance(m, torch.nn.Module) and hasattr(m, "blocks") and m is not s.head]
    vits = [m for m in vits if m is not s.aligned]
    assert len(vits) == 1  # one tuned ViT per run, not one per task


def test_slow_learner_groups_the_whole_vit_at_a_hundredth_of_the_head_lr(backbone, tasks):
    seen = []
    real = blocks_mod.optimizer_step  # the step SLCA's training loop takes through clbench.methods.shared.EpochLog

    def record(optimizer, loss, where):
        seen.append([(g["lr"], g["weight_decay"], g["momentum"], list(g["params"])) for g in optimizer.param_groups])
        return real(optimizer, loss, where)

    s = SLCA(SLCAConfig(epochs=1, batch_size=12, ca_epochs=0), ctx_for(backbone))
    with mock.patch.object(blocks_mod, "optimizer_step", record):
        s.learn_task(tasks[0])
    (vit_lr, vit_wd, vit_m, vit_params), (head_lr, head_wd, head_m, head_params) = seen[0]
    assert (vit_lr, head_lr) == pytest.approx((0.01 * 0.01, 0.01))
    assert vit_wd == head_wd == 5e-4 and vit_m == head_m == 0.9
    assert {id(p) for p in vit_params} == {id(p) for p in s.model.parameters()}  # the whole ViT
    assert {id(p) for p in head_params} == {id(p) for p in s.head.blocks[0].parameters()}


def test_stage_one_trains_only_the_new_block_and_alignment_moves_every_block(trained):
    s, before = trained
    assert torch.equal(s.head.blocks[0].weight, before["block0"])  # old block frozen in stage 1, and recalled
    assert not torch.equal(s.aligned.blocks[0].weight, before["block0"])  # the alignment trains every block
    assert not torch.equal(s.aligned.blocks[1].weight, s.head.blocks[1].weight)
    assert s.head.sizes == s.aligned.sizes == [2, 3]


def test_statistics_are_the_tuned_features_mean_and_covariance_plus_ridge(backbone, tasks):
    s = SLCA(SLCAConfig(epochs=1, batch_size=12, ca_epochs=0), ctx_for(backbone))
    s.learn_task(tasks[0])
    feats = s.adapted_features(tasks[0].train).double()
    assert not torch.allclose(feats.float(), tasks[0].train.features)  # tuned, not the cached frozen features
    x = feats[tasks[0].train.labels == 1]
    d = x.shape[1]
    torch.testing.assert_close(s.class_mean[1], x.mean(0).float(), rtol=1e-5, atol=1e-6)
    want = torch.cov(x.T) + torch.eye(d, dtype=torch.float64) * 1e-4
    torch.testing.assert_close(s.class_cov[1], want.float(), rtol=1e-5, atol=1e-6)
    assert s.class_cov.shape == (2, d, d)


def test_logit_normalisation_divides_by_the_mean_task_block_norm_and_the_temperature():
    logits = torch.tensor([[3.0, 4.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0, 1.0]])
    out = normalised_logits(logits, [2, 3], 0.1)
    norms = torch.tensor([[(5.0 + 1.0) / 2], [(0.0 + 3.0) / 2]]) + 1e-7
    torch.testing.assert_close(out, logits / norms / 0.1)
    assert not torch.allclose(out, F.normalize(logits, dim=1) / 0.1)  # not the norm over all logits


def test_older_classes_means_shrink_more_and_the_reference_task_index_is_behind_a_switch():
    torch.testing.assert_close(shrink_factors([0, 0, 1], 1), torch.tensor([0.95, 0.95, 1.0], dtype=torch.float64))
    # after 2 + 3 classes, the reference's c // task_size (task size 3) puts class 2 in task 0, the exact index in 1
    assert alignment_tasks([0, 0, 1, 1, 1], 3, "reference") == [0, 0, 0, 1, 1]
    assert alignment_tasks([0, 0, 1, 1, 1], 3, "exact") == [0, 0, 1, 1, 1]
    assert alignment_tasks([0, 0, 1, 1], 2, "reference") == [0, 0, 1, 1]  # equal tasks: the same


def test_task_zero_predicts_with_the_slow_learner_head_and_later_tasks_with_the_aligned_one(trained, test_split):
    s, _ = trained
    logits = s.predict(test_split)
    assert logits.shape == (len(test_split), 5) and torch.isfinite(logits).all()
    feats = s.adapted_features(test_split)
    torch.testing.assert_close(logits, s.aligned(feats), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, s.head(feats))


def test_keep_aligned_continues_from_the_aligned_head(backbone, tasks):
    s = SLCA(SLCAConfig(**{**SMALL.__dict__, "keep_aligned": True}), ctx_for(backbone))
    s.learn_task(tasks[0])
    s.learn_task(tasks[1])
    assert torch.equal(s.head.blocks[0].weight, s.aligned.blocks[0].weight)


def test_state_round_trip_gives_the_same_predictions(backbone, trained, test_split):
    s, _ = trained
    saved = s.save_state()
    other = SLCA(SMALL, ctx_for(backbone))
    other.restore_state(saved)
    assert other.model is not backbone.model
    torch.testing.assert_close(other.predict(test_split), s.predict(test_split))
    assert state_digest(other.model) == state_digest(s.model)


def test_parameter_counts_include_the_whole_vit_once(backbone, trained):
    s, _ = trained
    pc = s.param_counts()
    vit = backbone.n_params()
    d = backbone.num_features
    assert pc.trainable_per_task == [vit + 2 * (d + 1), vit + 5 * (d + 1)]  # stage 1 + the aligned head
    assert pc.added_per_task == [vit + 2 * (d + 1), 3 * (d + 1)]
    assert pc.stored_per_task == [2 * (d + d * d), 3 * (d + d * d)]
    assert pc.extra["vit_copies"] == 1
    assert plain_vit_params(768, 12) == 85_798_656  # timm ViT-B/16 without its classifier


def test_cost_model_counts_full_fine_tuning_and_tuned_evaluation():
    from clbench.methods.contract import RunShape

    shape = RunShape.equal(100, 20, 2)  # 50 training images per task; 10 then 20 test images seen
    w = SLCA.card.cost(SLCAConfig(epochs=3), shape)
    assert w.b == 3 * 100  # every learnt image, every epoch, forward + backward through the whole ViT
    assert w.f_cacheable == 100 + 20  # the harness's frozen features, once
    assert w.f == 120 + 100 + (10 + 20) + 20  # + statistics, each evaluation, the final tuned features


def test_float64_setting_computes_every_stage_in_float64_and_needs_fp32(backbone, tasks, test_split):
    """The ci profile's ``float64``: the tuned ViT, the heads, the class statistics and the draws are float64, the
    features are the fp32 ones to rounding, a checkpoint restores it exactly; reduced precision is refused."""
    from clbench.errors import ClbenchError

    s = SLCA(SLCAConfig(**{**vars(SMALL), "float64": True}), ctx_for(backbone))
    images = next(iter(tasks[0].train.image_loader(4, augment=False)))[0]
    with torch.no_grad():
        plain = SLCA(SMALL, ctx_for(backbone))._features(images)
        torch.testing.assert_close(s._features(images).float(), plain, rtol=1e-4, atol=1e-4)
    for task in tasks:
        s.learn_task(task)
    assert {p.dtype for p in s.model.parameters()} == {torch.float64}
    assert {p.dtype for p in s.aligned.parameters()} == {torch.float64}
    assert s.class_mean.dtype == s.class_cov.dtype == torch.float64
    assert next(backbone.model.parameters()).dtype == torch.float32  # the run's frozen ViT is untouched
    other = SLCA(SLCAConfig(**{**vars(SMALL), "float64": True}), ctx_for(backbone))
    other.restore_state(s.save_state())
    torch.testing.assert_close(other.predict(test_split), s.predict(test_split), rtol=0, atol=0)
    bf16 = Context(backbone=backbone, device=torch.device("cpu"), precision="bf16", seed=7, log=lambda s: None)
    with pytest.raises(ClbenchError, match="--precision fp32"):
        SLCA(SLCAConfig(float64=True), bf16)
