"""SD-LoRA: the authors' numbers (golden fixture) and mechanics on the tiny random ViT (LoRA on queries and values,
normalised frozen directions, magnitudes, what trains, the schedule, the rank schedule, accounting, checkpoints).

The golden fixture ``tests/reference_golden/sd_lora.safetensors`` holds inputs and the outputs of the authors' code
(``WuYichen-97/SD-Lora-CL`` @ 8bacded; provenance in ``tests/reference_golden/README.md``): ``LoRA_ViT_timm``'s
forward after tasks 0, 1 and 2 (the last at SD-LoRA-RR's reduced rank) and one epoch of
``Learner._update_representation``. Tolerance: fp32 on both sides, 1e-5 (values O(1)). Every other test states an
invariant of the method and would fail if the code broke it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer
from tinytasks import make_split

from baselines.sd_lora import (
    QVLoRA,
    SDLoRA,
    SDLoRAConfig,
    TaskHeads,
    lora_features,
    lr_at,
    qv_lora_attention,
    qv_lora_block,
    task_optimizer,
)
from clbench.features.backbones import state_digest
from clbench.methods.contract import PER_SAMPLE, Context, RunShape, Split, Task
from clbench.methods.shared import vit_block

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too

GOLDEN = Path(__file__).parent / "reference_golden" / "sd_lora.safetensors"
TOL = 1e-5
SMALL = SDLoRAConfig(rank=2, epochs=2, batch_size=8, init_lr=0.05, lr=0.05)


def ctx_for(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lambda s: None)


# ----------------------------------------------------------------------------------------------- golden
@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return load_file(str(GOLDEN))


def golden_vit(f: dict[str, torch.Tensor]) -> VisionTransformer:
    vit = VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=0)
    vit.load_state_dict({k[len("in.vit.") :]: v for k, v in f.items() if k.startswith("in.vit.")})
    return vit.eval()


def golden_lora(f: dict[str, torch.Tensor], pairs: list[str], alpha: torch.Tensor) -> QVLoRA:
    """A QVLoRA holding the fixture's pairs (``in.t0`` ...) in task order and the magnitudes ``alpha``."""
    lora = QVLoRA(depth=2, dim=32)
    for t, prefix in enumerate(pairs):
        lora.add_task(int(f[f"{prefix}.a_q"].shape[1]), torch.Generator().manual_seed(t), torch.device("cpu"), 0.0)
        with torch.no_grad():
            for name in ("a_q", "b_q", "a_v", "b_v"):
                for i, p in enumerate(getattr(lora, name)[t]):
                    p.copy_(f[f"{prefix}.{name}"][i])
    with torch.no_grad():
        for a, v in zip(lora.alpha, alpha, strict=True):
            a.fill_(float(v))
    return lora


def test_forward_matches_the_reference_after_tasks_0_1_and_a_reduced_rank_task_2(golden):
    """``LoRA_ViT_timm`` (``_LoRA_qkv_timm_train``): task 0's pair as is; then task 0 normalised by
    ||B|| ||A|| with its own magnitude plus task 1's pair as is; then two old pairs (rank 3) and a rank-2 one."""
    f = golden
    vit = golden_vit(f)
    with torch.no_grad():
        for pairs, alpha, out in (
            (["in.t0"], f["in.t0.alpha"], "out.features0"),
            (["in.t0", "in.t1"], f["in.t1.alpha"], "out.features1"),
            (["in.t0", "out.trained.t1", "in.t2"], f["in.t2.alpha"], "out.features2"),
        ):
            got = lora_features(vit, golden_lora(f, pairs, alpha), f["in.x"])
            torch.testing.assert_close(got, f[out], rtol=TOL, atol=TOL, msg=lambda m, o=out: f"{o}: {m}")


def test_one_epoch_of_task_1_matches_the_references_update_representation(golden):
    """Two SGD steps (momentum 0.9) on task 1: cross-entropy over the new head rows; the current pair, both
    magnitudes and the new head rows move exactly as the authors' ``_update_representation`` moved them; the old
    head rows stay."""
    f = golden
    vit = golden_vit(f)
    for p in vit.parameters():
        p.requires_grad_(False)
    lora = golden_lora(f, ["in.t0", "in.t1"], f["in.t1.alpha"])
    lora.a_q[0].requires_grad_(False)
    lora.b_q[0].requires_grad_(False)
    lora.a_v[0].requires_grad_(False)
    lora.b_v[0].requires_grad_(False)
    heads = TaskHeads()
    g = torch.Generator().manual_seed(0)
    old = heads.add(32, 2, g, torch.device("cpu"), torch.float32)
    new = heads.add(32, 3, g, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        old.weight.copy_(f["in.head_w"][:2])
        old.bias.copy_(f["in.head_b"][:2])
        new.weight.copy_(f["in.head_w"][2:])
        new.bias.copy_(f["in.head_b"][2:])
    old.requires_grad_(False)
    optimizer = task_optimizer(SDLoRAConfig(), lora, new, float(f["in.lr"]))
    for images, labels in zip(f["in.train_x"], f["in.train_y"], strict=True):
        loss = F.cross_entropy(new(lora_features(vit, lora, images)), labels - 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name in ("a_q", "b_q", "a_v", "b_v"):
        got = torch.stack([p.detach() for p in getattr(lora, name)[1]])
        torch.testing.assert_close(got, f[f"out.trained.t1.{name}"], rtol=TOL, atol=TOL, msg=lambda m, n=name: n + m)
    alphas = torch.stack([a.detach() for a in lora.alpha])
    torch.testing.assert_close(alphas, f["out.trained.alpha"], rtol=TOL, atol=TOL)
    head_w = torch.cat([old.weight, new.weight]).detach()
    torch.testing.assert_close(head_w, f["out.trained.head_w"], rtol=TOL, atol=TOL)
    torch.testing.assert_close(torch.cat([old.bias, new.bias]).detach(), f["out.trained.head_b"], rtol=TOL, atol=TOL)
    with torch.no_grad():
        logits = heads(lora_features(vit, lora, f["in.x"]))
    torch.testing.assert_close(logits, f["out.trained.logits"], rtol=TOL, atol=TOL)


# ----------------------------------------------------------------------------------------------- the LoRA layer
def test_a_block_without_branches_is_the_timm_block(backbone):
    block = backbone.model.blocks[1]
    x = torch.randn(2, 7, backbone.num_features, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(qv_lora_block(block, x, None), vit_block(block, x), rtol=1e-5, atol=1e-5)


def test_branches_shift_the_query_and_value_projections_only(backbone):
    """q and v (never k) gain x (B A)^T: the same as adding B A to those rows of the qkv weight."""
    attn = backbone.model.blocks[0].attn
    d = backbone.num_features
    g = torch.Generator().manual_seed(1)
    aq, bq = torch.randn(3, d, generator=g), torch.randn(d, 3, generator=g) * 0.1
    av, bv = torch.randn(3, d, generator=g), torch.randn(d, 3, generator=g) * 0.1
    x = torch.randn(2, 5, d, generator=g)
    merged = copy.deepcopy(attn)
    with torch.no_grad():
        merged.qkv.weight[:d] += bq @ aq
        merged.qkv.weight[2 * d :] += bv @ av
    with torch.no_grad():
        torch.testing.assert_close(qv_lora_attention(attn, x, (aq, bq, av, bv)), merged(x), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(qv_lora_attention(attn, x, (aq, bq, av, bv)), attn(x), atol=1e-3)


def test_old_directions_are_normalised_and_scaled_by_their_magnitude_the_current_one_is_not():
    d = 8
    lora = QVLoRA(depth=1, dim=d)
    for t in range(2):
        lora.add_task(2, torch.Generator().manual_seed(t), torch.device("cpu"), 0.5 + t)
        with torch.no_grad():
            for b in (*lora.b_q[t], *lora.b_v[t]):
                b.copy_(torch.randn(d, 2, generator=torch.Generator().manual_seed(10 + t)))
    aq, bq, av, bv = lora.factors(0)
    a0, b0, a1, b1 = lora.a_q[0][0], lora.b_q[0][0], lora.a_q[1][0], lora.b_q[1][0]
    want = 0.5 * b0 @ a0 / (b0.norm() * a0.norm()) + 1.5 * b1 @ a1
    torch.testing.assert_close(bq @ aq, want.detach(), rtol=1e-5, atol=1e-6)
    assert aq.shape == (4, d) and bv.shape == (d, 4)
    # an old pair that never moved off zero adds nothing (the reference divides 0 by 0)
    with torch.no_grad():
        lora.b_q[0][0].zero_()
    aq, bq, _, _ = lora.factors(0)
    assert torch.isfinite(bq).all()
    torch.testing.assert_close(bq @ aq, (1.5 * b1 @ a1).detach(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------- settings
def test_schedule_and_rank_schedule_are_the_references():
    cfg = SDLoRAConfig()
    assert cfg.schedule(0) == (0.008, (60, 120, 170), 0.1) and cfg.schedule(3) == (0.008, (40, 70), 0.0)
    assert [lr_at(1.0, (10, 15), 0.05, e) for e in (0, 9, 10, 14, 15, 19)] == pytest.approx(
        [1.0, 1.0, 0.05, 0.05, 0.0025, 0.0025]
    )
    assert lr_at(0.008, (40, 70), 0.0, 19) == 0.008  # CIFAR-100: constant over the 20 epochs
    rr = SDLoRAConfig(rank_schedule="10,10,10,10,8,8,8,8,6")
    assert [rr.rank_of(t) for t in (0, 3, 4, 7, 8, 15)] == [10, 10, 8, 8, 6, 6]
    assert [cfg.rank_of(t) for t in (0, 9)] == [10, 10]
    for bad in ({"rank_schedule": "10,x"}, {"milestones": "0"}, {"magnitudes": "sometimes"}, {"lr": 0.0}):
        with pytest.raises(ValueError):
            SDLoRAConfig(**bad)


# ----------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def tasks(backbone) -> list[Task]:
    first = make_split(backbone, [0, 1], 6, seed=1)
    second = make_split(backbone, [2, 3, 4], 6, seed=2)
    return [Task(0, [0, 1], 2, first), Task(1, [2, 3, 4], 5, second)]


@pytest.fixture(scope="module")
def test_split(backbone) -> Split:
    return make_split(backbone, [0, 1, 2, 3, 4], 3, seed=3)


@pytest.fixture(scope="module")
def trained(backbone, tasks):
    """SD-LoRA after each task, with copies of its branches and heads taken after task 0."""
    strategy = SDLoRA(SMALL, ctx_for(backbone))
    strategy.learn_task(tasks[0])
    after0 = (copy.deepcopy(strategy.lora), copy.deepcopy(strategy.heads))
    strategy.learn_task(tasks[1])
    return strategy, after0


def test_old_directions_freeze_while_every_magnitude_and_the_new_pair_train(trained, backbone):
    strategy, (lora0, heads0) = trained
    assert strategy.lora.n_tasks == 2 and len(strategy.heads.heads) == 2
    for name in ("a_q", "b_q", "a_v", "b_v"):  # task 0's direction stayed put during task 1
        for p, q in zip(getattr(lora0, name)[0], getattr(strategy.lora, name)[0], strict=True):
            assert torch.equal(p, q), name
    for p, q in zip(heads0.parameters(), strategy.heads.heads[0].parameters(), strict=True):
        assert torch.equal(p, q)
    for t in range(2):
        assert all(float(b.abs().sum()) > 0 for b in (*strategy.lora.b_q[t], *strategy.lora.b_v[t]))
    # task 1's A trained too (LoRA, not a designed subspace)
    fresh = QVLoRA(strategy.depth, strategy.lora.dim)
    fresh.add_task(2, torch.Generator(), torch.device("cpu"), 0.8)
    fresh.add_task(2, strategy.ctx.generator(1000 + 1), torch.device("cpu"), 0.8)
    assert not torch.equal(fresh.a_q[1][0], strategy.lora.a_q[1][0])
    # every magnitude left its 0.8 start in task 1, the old task's included (the reference reset it to 0.8)
    assert float(lora0.alpha[0]) != pytest.approx(0.8, abs=1e-6)
    assert all(abs(float(a) - 0.8) > 1e-6 for a in strategy.lora.alpha)
    assert not any(p.requires_grad for p in strategy.lora.parameters())


def test_magnitudes_reset_at_each_task_or_carry_on(backbone, tasks):
    """ "reset" (the reference) starts task 1 with every magnitude at 0.8; "keep" keeps task 0's learnt one."""
    seen: dict[str, list[float]] = {}
    for mode in ("reset", "keep"):
        strategy = SDLoRA(SDLoRAConfig(**{**vars(SMALL), "epochs": 1, "magnitudes": mode}), ctx_for(backbone))
        strategy.learn_task(tasks[0])
        learnt = float(strategy.lora.alpha[0])
        starts: list[float] = []
        original = strategy.lora.add_task

        def spy(*args, _orig=original, _s=strategy, _starts=starts, **kw):
            _starts.extend(float(a) for a in _s.lora.alpha)
            return _orig(*args, **kw)

        strategy.lora.add_task = spy  # type: ignore[method-assign]
        strategy.learn_task(tasks[1])
        seen[mode] = [learnt, *starts]
    assert seen["reset"][1] == pytest.approx(0.8) and seen["reset"][0] != pytest.approx(0.8)
    assert seen["keep"][1] == pytest.approx(seen["keep"][0])


def test_reduced_ranks_follow_the_schedule(backbone, tasks):
    cfg = SDLoRAConfig(**{**vars(SMALL), "epochs": 1, "rank_schedule": "3,1"})
    strategy = SDLoRA(cfg, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    assert [strategy.lora.a_q[t][0].shape[0] for t in range(2)] == [3, 1]
    d, depth = backbone.num_features, len(backbone.model.blocks)
    assert strategy.param_counts().added_per_task == SDLoRA.param_formula(cfg, d, depth, (2, 3)).added_per_task


def test_predictions_are_per_sample_and_survive_a_checkpoint(trained, backbone, test_split):
    strategy = trained[0]
    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 5) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3]
    torch.testing.assert_close(strategy.predict(test_split.subset(rows)), full[rows], rtol=1e-5, atol=1e-5)
    other = SDLoRA(SMALL, ctx_for(backbone))
    other.restore_state(strategy.save_state())
    torch.testing.assert_close(other.predict(test_split), full, rtol=0, atol=0)
    assert state_digest(backbone.model) == state_digest(other.ctx.backbone.model)


def test_param_counts_follow_the_formula_and_the_cost_model(trained, backbone):
    strategy = trained[0]
    d, depth = backbone.num_features, len(backbone.model.blocks)
    real = strategy.param_counts()
    formula = SDLoRA.param_formula(SMALL, d, depth, (2, 3))
    lora = 2 * depth * 2 * d * SMALL.rank
    assert real.added_per_task == formula.added_per_task == [lora + 1 + 2 * (d + 1), lora + 1 + 3 * (d + 1)]
    assert real.trainable_per_task == formula.trainable_per_task == [lora + 1 + 2 * (d + 1), lora + 2 + 3 * (d + 1)]
    assert real.stored_per_task == formula.stored_per_task == [0, 0]
    assert real.head == formula.head == 5 * (d + 1)
    assert strategy.optimizer_steps == [2 * 2, 2 * 3]  # 12 and 18 images in batches of 8, 2 epochs
    w = SDLoRA.card.cost(SMALL, RunShape((12.0, 18.0), (6.0, 15.0)))
    assert (w.f, w.b, w.f_cacheable) == (21, 2 * 30, 0.0)


def test_float64_setting_runs_on_a_float64_copy_that_checkpoints_do_not_hold(backbone, tasks, test_split):
    cfg = SDLoRAConfig(**{**vars(SMALL), "epochs": 1, "float64": True})
    strategy = SDLoRA(cfg, ctx_for(backbone))
    assert strategy.model is not backbone.model and next(backbone.model.parameters()).dtype == torch.float32
    digest = state_digest(backbone.model)
    strategy.learn_task(tasks[0])
    assert {p.dtype for p in strategy.lora.parameters()} == {torch.float64}
    assert state_digest(backbone.model) == digest
    assert "model" not in strategy.state_dict()
    other = SDLoRA(cfg, ctx_for(backbone))
    other.restore_state(strategy.save_state())
    torch.testing.assert_close(other.predict(test_split), strategy.predict(test_split), rtol=0, atol=0)
