"""DUCT: the reference's own functions on fixed inputs (tests/reference_golden/duct.safetensors, from LAMDA-PILOT @
5240714 ``models/duct.py``), and mechanics on the micro ViT (each task fine-tuned from the pre-trained weights, the
weighted task arithmetic, the head-only retraining, the transport onto old blocks, the domain scenario's blocks per
domain, checkpoints and parameter counts)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file
from tinytasks import (
    check_per_sample_predictions_ignore_order_and_batch_size,
    ctx_for,
    make_split,
)
from torch import nn

import baselines.duct as duct_mod
import clbench.methods.shared as blocks_mod
from baselines.duct import (
    DUCT,
    DUCTConfig,
    merge_task_vector,
    new_rows,
    similarity_weight,
    train_stage,
    transport_plan,
)
from clbench.errors import ClbenchError
from clbench.features.backbones import state_digest
from clbench.methods.contract import Task
from clbench.methods.shared import CosineHead, EpochLog

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

GOLDEN = Path(__file__).parent / "reference_golden" / "duct.safetensors"
RTOL, ATOL = 1e-5, 1e-6  # fp32 against the reference's fp32 (float64 plan and means in both)
SMALL = DUCTConfig(epochs=1, batch_size=6, retrain_epochs=1, eval_batch_size=8)


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return load_file(str(GOLDEN))


def _tiny_backbone(state: dict[str, torch.Tensor], prefix: str) -> nn.Module:
    """The fixture's stand-in ViT: Linear(5, 4) then LayerNorm(4), holding ``prefix``'s tensors."""
    model = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4))
    model.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    return model


def _quiet_log(epochs: int) -> EpochLog:
    return EpochLog(SimpleNamespace(progress=None, log=lambda s: None), "golden", epochs, 3)


# ------------------------------------------------------------------------------------------ golden
def test_both_training_stages_match_the_reference_train(golden):
    """``Learner._train`` ('train': 6 epochs, ViT at 0.1 * 0.01, head at 0.1, ConstantLR's third for 5 epochs;
    'retrain': 2 epochs of the head alone at lrate, the group's lr winning over lr_re) on the fixture's batches."""
    g = golden
    vit = _tiny_backbone(g, "in.train.backbone.")
    head = CosineHead(4)
    head.weight = nn.Parameter(g["in.train.fc.weight"].clone())
    with torch.no_grad():
        head.sigma.copy_(g["in.train.fc.sigma"])
    x, y = g["in.train.x"], g["in.train.y"]

    def batches():
        return [(x[i], y[i] - 3) for i in range(3)]  # the block of classes 3-5: targets y - known

    cfg = DUCTConfig(lr=0.1, backbone_lr_scale=0.01, weight_decay=5e-4, warmup_epochs=5, retrain_lr=0.1)
    train_stage(cfg, head, list(vit.parameters()), 6, (3, 6), batches, 3, vit, _quiet_log(6), "golden")
    for k, v in vit.state_dict().items():
        torch.testing.assert_close(v, g[f"out.train.backbone.{k}"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(head.weight.detach(), g["out.train.fc.weight"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(head.sigma.detach(), g["out.train.fc.sigma"], rtol=RTOL, atol=ATOL)
    train_stage(cfg, head, None, 2, (3, 6), batches, 3, vit, _quiet_log(2), "golden")
    torch.testing.assert_close(head.weight.detach(), g["out.retrain.fc.weight"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(head.sigma.detach(), g["out.retrain.fc.sigma"], rtol=RTOL, atol=ATOL)
    for k, v in vit.state_dict().items():  # the retraining leaves the ViT alone
        torch.testing.assert_close(v, g[f"out.train.backbone.{k}"], rtol=RTOL, atol=ATOL)


def test_weighted_task_arithmetic_matches_the_reference_merge(golden):
    """``_stage1_merge_backbone`` with ``_calculate_adjust_ratio``: pre-trained + (merged so far + 0.25 Sim tau)."""
    g = golden
    init = _tiny_backbone(g, "in.merge.init.backbone.")
    tuned = _tiny_backbone(g, "in.merge.tuned.backbone.")
    ratio = similarity_weight(g["in.merge.pre_means"][3:], g["in.merge.tuned_means"])
    assert ratio == pytest.approx(float(g["out.merge.ratio"]), rel=1e-6)
    merged = copy.deepcopy(init)
    names = sorted(merged.state_dict())  # the reference's vector: the state's tensors in sorted key order
    offset, before = 0, g["in.merge.merged_before"]
    with torch.no_grad():
        for name in names:
            t = merged.state_dict()[name]
            t.add_(before[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    merge_task_vector(merged, tuned, init, 0.25 * ratio)
    for k, v in merged.state_dict().items():
        torch.testing.assert_close(v, g[f"out.merge.backbone.{k}"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", ["reg01", "reg002"])
def test_classifier_transport_matches_the_reference_sinkhorn_step(golden, backbone, case):
    """``_stage2_transport_classifier`` at task 2 of three tasks of 3 classes: both old blocks moved towards
    T^T W_2 with POT's sinkhorn (ot_reg 0.1 and 0.02), the current block unchanged."""
    g = golden
    reg = {"reg01": 0.1, "reg002": 0.02}[case]
    s = DUCT(DUCTConfig(ot_reg=reg, head_merge_ratio=0.25, ot_method="sinkhorn"), ctx_for(backbone))
    s.head = CosineHead(4)
    s.head.weight = nn.Parameter(g[f"in.transport.{case}.weight"].clone())
    s.row_means = g[f"in.transport.{case}.means"].clone()
    s.blocks = [[0, 3], [3, 6], [6, 9]]
    s._transport(6, 9)
    torch.testing.assert_close(s.head.weight.detach(), g[f"out.transport.{case}.weight"], rtol=RTOL, atol=ATOL)
    assert not torch.allclose(s.head.weight[:6], g[f"in.transport.{case}.weight"][:6])


# ------------------------------------------------------------------------------------------ mechanics
@pytest.fixture(scope="module")
def trained(backbone, tasks):
    """Two class-incremental tasks (2 then 3 classes); every fine-tuned copy's start and the merged ViT recorded."""
    starts, merged_after = [], []
    real_copy, real_merge = DUCT._copy_of_pretrained, duct_mod.merge_task_vector

    def copy_and_record(self):
        model = real_copy(self)
        starts.append(state_digest(model))
        return model

    def merge_and_record(merged, tuned, pretrained, scale):
        real_merge(merged, tuned, pretrained, scale)
        merged_after.append(state_digest(merged))

    s = DUCT(SMALL, ctx_for(backbone))
    with (
        mock.patch.object(DUCT, "_copy_of_pretrained", copy_and_record),
        mock.patch.object(duct_mod, "merge_task_vector", merge_and_record),
    ):
        s.learn_task(tasks[0])
        rows0 = s.head.weight.detach().clone()
        s.learn_task(tasks[1])
    return s, SimpleNamespace(starts=starts, merged_after=merged_after, rows0=rows0)


def test_every_task_fine_tunes_from_the_pretrained_vit_and_the_merge_is_what_predicts(backbone, trained):
    s, rec = trained
    assert backbone.digest == state_digest(backbone.model)  # the run's ViT is untouched
    assert rec.starts == [backbone.digest, backbone.digest]  # not the merged ViT
    assert rec.merged_after[-1] == state_digest(s.model)  # the retraining and transport leave the merged ViT alone
    assert len(set(rec.merged_after)) == 2 and backbone.digest not in rec.merged_after
    assert all(0 < w <= 1 for w in s.task_weights)


def test_the_merged_vit_is_the_pretrained_one_plus_the_scaled_task_vector(backbone):
    pre = copy.deepcopy(backbone.model)
    tuned, merged = copy.deepcopy(pre), copy.deepcopy(pre)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.01)
    merge_task_vector(merged, tuned, pre, 0.5)
    merge_task_vector(merged, tuned, pre, 0.25)
    for (name, m), p in zip(merged.named_parameters(), pre.parameters(), strict=True):
        torch.testing.assert_close(m, p + 0.0075, rtol=0, atol=1e-6, msg=name)
    a, b = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert similarity_weight(a, b) == pytest.approx((2**-0.5 + 1.0) / 2)


def test_merge_scalar_zero_keeps_the_pretrained_vit(backbone, tasks):
    s = DUCT(DUCTConfig(**{**vars(SMALL), "merge_scalar": 0.0, "similarity_weight": False}), ctx_for(backbone))
    s.learn_task(tasks[0])
    assert state_digest(s.model) == backbone.digest
    assert s.task_weights == [1.0]


def test_stages_train_the_vit_and_whole_head_then_the_head_alone_with_a_warm_up(backbone, tasks):
    seen = []
    real = blocks_mod.optimizer_step

    def record(optimizer, loss, where):
        seen.append(
            (where, [(g["lr"], g["weight_decay"], g["momentum"], list(g["params"])) for g in optimizer.param_groups])
        )
        return real(optimizer, loss, where)

    cfg = DUCTConfig(epochs=2, batch_size=12, retrain_epochs=2, warmup_epochs=1, retrain_lr=0.05)
    s = DUCT(cfg, ctx_for(backbone))
    with mock.patch.object(blocks_mod, "optimizer_step", record):
        s.learn_task(tasks[0])
    tune = [groups for where, groups in seen if "fine-tuning" in where]
    retrain = [groups for where, groups in seen if "retraining" in where]
    assert len(tune) == len(retrain) == 2  # one batch of 12 per epoch
    (vit_lr, vit_wd, vit_m, vit_params), (head_lr, head_wd, _, head_params) = tune[0]
    assert (vit_lr, head_lr) == pytest.approx((0.1 * 0.01 / 3, 0.1 / 3))  # ConstantLR's third, first epoch
    assert [g[1][0] for g in tune[1:]] == pytest.approx([0.1])  # full rate after the warm-up
    assert vit_wd == head_wd == 5e-4 and vit_m == 0.9
    assert len(vit_params) == len(list(backbone.model.parameters()))  # the whole ViT copy
    assert {id(p) for p in head_params} == {id(s.head.weight), id(s.head.sigma)}  # every row and sigma
    assert [len(groups) for groups in retrain] == [1, 1]  # the head alone
    assert [groups[0][0] for groups in retrain] == pytest.approx([0.05 / 3, 0.05])


def test_transport_moves_old_blocks_only_and_ratio_zero_leaves_them(backbone, tasks, trained):
    s, rec = trained
    assert s.blocks == [[0, 2], [2, 5]] and s.row_class == [0, 1, 2, 3, 4]
    # no decay and no transport: task 1 leaves task 0's rows exactly as they were
    still = DUCT(DUCTConfig(**{**vars(SMALL), "weight_decay": 0.0, "head_merge_ratio": 0.0}), ctx_for(backbone))
    still.learn_task(tasks[0])
    before = still.head.weight[:2].detach().clone()
    still.learn_task(tasks[1])
    assert torch.equal(still.head.weight[:2], before)
    moved = DUCT(DUCTConfig(**{**vars(SMALL), "weight_decay": 0.0, "head_merge_ratio": 0.5}), ctx_for(backbone))
    moved.learn_task(tasks[0])
    with mock.patch.object(duct_mod, "transport_plan", wraps=duct_mod.transport_plan) as plan:
        moved.learn_task(tasks[1])
    assert plan.call_count == 1  # one earlier block
    assert not torch.allclose(moved.head.weight[:2], before)


def test_transport_plan_has_uniform_marginals_where_the_plain_sinkhorn_underflows():
    cur = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    old = torch.tensor([[0.1, 0.0], [0.0, 1.1]], dtype=torch.float64)
    plan = transport_plan(cur, old, 0.1, "sinkhorn_log")
    torch.testing.assert_close(plan.sum(1), torch.full((3,), 1 / 3, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(plan.sum(0), torch.full((2,), 1 / 2, dtype=torch.float64), rtol=0, atol=1e-6)
    far = transport_plan(cur * 30, old * 30, 0.02, "sinkhorn_log")  # means ~30 apart: exp(-cost / 0.02) underflows
    assert float(far.sum()) == pytest.approx(1.0, abs=1e-6) and int(far.argmax(1)[2]) == 1  # a plan, near the EMD
    torch.testing.assert_close(
        transport_plan(cur, old, 0.1, "sinkhorn"), transport_plan(cur, old, 0.1, "sinkhorn_log"), rtol=0, atol=1e-6
    )
    assert float(transport_plan(cur * 30, old * 30, 0.02, "sinkhorn").sum()) < 1e-60  # the reference's flaw
    with pytest.raises(ValueError, match="ot_method"):
        DUCTConfig(ot_method="emd")


def test_new_rows_are_uniform_by_default_and_zero_as_pilot():
    g = torch.Generator().manual_seed(0)
    rows = new_rows(3, 16, "uniform", g, torch.float32)
    assert rows.abs().max() <= 0.25 and rows.abs().min() > 0
    assert torch.equal(new_rows(3, 16, "zeros", g, torch.float32), torch.zeros(3, 16))


def test_predictions_are_per_sample_and_restore_from_a_checkpoint(backbone, trained, test_split):
    s, _ = trained
    check_per_sample_predictions_ignore_order_and_batch_size(s, test_split, 5)
    other = DUCT(SMALL, ctx_for(backbone))
    other.restore_state(s.save_state())
    assert state_digest(other.model) == state_digest(s.model)
    torch.testing.assert_close(other.predict(test_split), s.predict(test_split), rtol=0, atol=0)


def test_parameter_counts_store_the_merged_vit_once(backbone, tasks, trained):
    s, _ = trained
    vit, d = backbone.n_params(), backbone.num_features
    pc = s.param_counts()
    formula = DUCT.param_formula(s.cfg, d, len(backbone.model.blocks), (2, 3), backbone_params=vit)
    assert (formula.added_per_task, formula.stored_per_task) == (pc.added_per_task, pc.stored_per_task)
    assert (formula.trainable_per_task, formula.head) == (pc.trainable_per_task, pc.head)
    assert pc.stored_per_task == [vit + 2 * d, 3 * d]  # the merged ViT, each row's pre-trained class mean
    assert pc.added_per_task == [2 * d + 1, 3 * d]  # the head's rows (and sigma)
    assert pc.trainable_per_task == [vit + 2 * d + 1, vit + 5 * d + 1]
    assert pc.extra["vit_copies"] == 1 and pc.extra["peak_vit_copies"] == 2


def test_domain_scenario_gives_each_domain_a_block_and_predicts_the_best_row_per_class(backbone):
    first, second = make_split(backbone, [0, 1, 2], 4, seed=4), make_split(backbone, [0, 1, 2], 4, seed=5)
    s = DUCT(DUCTConfig(**{**vars(SMALL), "batch_size": 12}), ctx_for(backbone))
    s.learn_task(Task(0, [0, 1, 2], 3, first))
    s.learn_task(Task(1, [0, 1, 2], 3, second))
    assert s.row_class == [0, 1, 2, 0, 1, 2] and s.blocks == [[0, 3], [3, 6]]
    test = make_split(backbone, [0, 1, 2], 2, seed=6)
    rows = s.head(s.adapted_features(test))
    want = torch.maximum(rows[:, :3], rows[:, 3:]).float()
    torch.testing.assert_close(s.predict(test), want, rtol=1e-5, atol=1e-6)
    logits = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.2, 0.4]])
    torch.testing.assert_close(s.class_logits(logits), torch.tensor([[0.8, 0.9, 0.4]]))


def test_float64_needs_fp32_and_bad_settings_are_refused(backbone):
    from clbench.methods.contract import Context

    bf16 = Context(backbone=backbone, device=torch.device("cpu"), precision="bf16", seed=7, log=lambda s: None)
    with pytest.raises(ClbenchError, match="--precision fp32"):
        DUCT(DUCTConfig(float64=True), bf16)
    for bad in ({"head_merge_ratio": 1.5}, {"ot_reg": 0.0}, {"head_init": "normal"}, {"retrain_epochs": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DUCTConfig(**bad)
