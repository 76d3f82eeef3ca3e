"""InfLoRA: mechanics on the tiny random ViT (LoRA in keys and values, the designed down-projection, the DualGPM
memory, what trains, the schedule, accounting, checkpoints).

Every test states an invariant from the paper / the authors' code (``liangyanshuo/InfLoRA``) and would fail if the
code broke it. The reference's own numbers are pinned in ``tests/test_reference_golden.py``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tinytasks import make_split

from baselines.inflora import InfLoRA, InfLoRAConfig, memory_threshold, reference_cosine
from clbench.features.backbones import state_digest
from clbench.layers.lora import design_down_projection, lora_attention, lora_block, update_dual_gpm
from clbench.methods.contract import PER_SAMPLE, Context, RunShape, Split, Task
from clbench.methods.shared import vit_block

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too

SMALL = InfLoRAConfig(rank=4, epochs=2, batch_size=8, lr=0.01)


def ctx_for(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lambda s: None)


@pytest.fixture(scope="module")
def tasks(backbone) -> list[Task]:
    first = make_split(backbone, [0, 1], 6, seed=1)
    second = make_split(backbone, [2, 3, 4], 6, seed=2)  # unequal task sizes: one head per task, its own size
    return [Task(0, [0, 1], 2, first), Task(1, [2, 3, 4], 5, second)]


@pytest.fixture(scope="module")
def test_split(backbone) -> Split:
    return make_split(backbone, [0, 1, 2, 3, 4], 3, seed=3)


@pytest.fixture(scope="module")
def trained(backbone, tasks):
    """InfLoRA after each task, with copies of its branches, heads and memory taken after task 0."""
    strategy = InfLoRA(SMALL, ctx_for(backbone))
    strategy.learn_task(tasks[0])
    after0 = (copy.deepcopy(strategy.lora), copy.deepcopy(strategy.heads), [b.clone() for b in strategy.bases])
    types0 = list(strategy.project_types)
    strategy.learn_task(tasks[1])
    return strategy, after0, types0


def _orthonormal(d: int, k: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def _covariance(d: int, seed: int, decay: float = 0.7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(200, d, generator=g, dtype=torch.float64) * decay ** torch.arange(d, dtype=torch.float64)
    return x.T @ x / 200


# ----------------------------------------------------------------------------------------------- the LoRA layer
def test_a_block_without_branches_is_the_timm_block(backbone):
    block = backbone.model.blocks[1]
    x = torch.randn(2, 7, backbone.num_features, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lora_block(block, x, None), vit_block(block, x), rtol=1e-5, atol=1e-5)


def test_branches_shift_the_key_and_value_projections_by_sum_b_a(backbone):
    """k and v (never q) gain x (sum_t B_t A_t)^T: the same as adding the summed update to those rows of qkv."""
    attn = backbone.model.blocks[0].attn
    d = backbone.num_features
    g = torch.Generator().manual_seed(1)
    a = [torch.randn(3, d, generator=g) for _ in range(2)]
    b = [torch.randn(d, 3, generator=g) * 0.1 for _ in range(2)]
    wk = b[0] @ a[0] + b[1] @ a[1]
    a2 = [torch.randn(3, d, generator=g) for _ in range(2)]
    b2 = [torch.randn(d, 3, generator=g) * 0.1 for _ in range(2)]
    wv = b2[0] @ a2[0] + b2[1] @ a2[1]
    factors = (torch.cat(a), torch.cat(b, dim=1), torch.cat(a2), torch.cat(b2, dim=1))
    x = torch.randn(2, 5, d, generator=g)
    merged = copy.deepcopy(attn)
    with torch.no_grad():
        merged.qkv.weight[d : 2 * d] += wk
        merged.qkv.weight[2 * d :] += wv
    torch.testing.assert_close(lora_attention(attn, x, factors), merged(x), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(lora_attention(attn, x, factors), attn(x), atol=1e-3)  # the branches do something


# ----------------------------------------------------------------------------------------------- the subspace
def test_down_projection_avoids_a_remove_memory_and_lies_in_a_retain_one():
    d, rank = 16, 3
    cov, basis = _covariance(d, 2), _orthonormal(d, 5, 3)
    removed = design_down_projection(cov, basis, "remove", rank).double()
    assert removed.shape == (rank, d)
    torch.testing.assert_close(removed @ basis, torch.zeros(rank, 5, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(removed @ removed.T, torch.eye(rank, dtype=torch.float64) / 3, rtol=0, atol=1e-6)
    kept = design_down_projection(cov, basis, "retain", rank).double()
    outside = kept - kept @ basis @ basis.T
    torch.testing.assert_close(outside, torch.zeros_like(outside), rtol=0, atol=1e-6)
    # no memory: the covariance's own top directions
    first = design_down_projection(cov, None, None, rank).double()
    top = torch.linalg.eigh(cov).eigenvectors[:, -rank:]
    torch.testing.assert_close((first.T @ first) * 3, top @ top.T, rtol=0, atol=1e-6)


def test_the_memory_keeps_the_thresholds_energy_and_turns_into_its_complement_past_half_the_width():
    d = 16
    cov = _covariance(d, 4, decay=0.6)
    basis, kind = update_dual_gpm(cov, None, None, 0.9)
    s = torch.linalg.svdvals(cov) ** 2
    r = basis.shape[1]
    assert kind == "remove" and r < d / 2
    # the reference's r: the directions whose cumulative energy stays below the threshold (its "+1" is commented out)
    assert float(s[:r].sum() / s.sum()) < 0.9 <= float(s[: r + 1].sum() / s.sum())
    # a second task in other directions grows the basis, which stays orthonormal and keeps the old directions
    other = _covariance(d, 5, decay=0.6).flip(0).flip(1)
    grown, kind2 = update_dual_gpm(other, basis, "remove", 0.9)
    assert kind2 == "remove" and grown.shape[1] > r
    torch.testing.assert_close(grown[:, :r], basis)
    torch.testing.assert_close(grown.T @ grown, torch.eye(grown.shape[1], dtype=torch.float64), rtol=0, atol=1e-8)
    # a flat spectrum needs most directions: past d / 2 the memory is the complement ("retain")
    flat, kind3 = update_dual_gpm(torch.eye(d, dtype=torch.float64), None, None, 0.9)
    assert kind3 == "retain" and flat.shape[1] == 2  # 14 of 16 equal directions stay below 0.9: 16 - 14 free
    # a retain memory shrinks when a task claims some of its free directions
    shrunk, kind4 = update_dual_gpm(flat @ flat.T * 5 + 0.01 * torch.eye(d, dtype=torch.float64), flat, "retain", 0.9)
    assert kind4 == "retain" and shrunk.shape[1] < flat.shape[1]


def test_threshold_and_learning_rate_schedules_are_the_references():
    cfg = InfLoRAConfig()
    assert [memory_threshold(cfg, t) for t in (0, 5)] == pytest.approx([0.95, 0.975])
    assert reference_cosine(1.0, 0, 20) == 1.0
    assert reference_cosine(1.0, 19, 20) == pytest.approx(math.cos(99 * math.pi / 200))
    assert reference_cosine(0.5, 0, 1) == 0.5  # the reference divides by zero here


# ----------------------------------------------------------------------------------------------- training
def test_only_the_current_tasks_b_and_head_train(trained, backbone):
    strategy, (lora0, heads0, bases0), types0 = trained
    assert strategy.lora.n_tasks == 2 and len(strategy.heads.heads) == 2
    for name, p in lora0.named_parameters():  # task 0's A, B stayed put during task 1
        assert torch.equal(p, dict(strategy.lora.named_parameters())[name]), name
    for p, q in zip(heads0.parameters(), strategy.heads.heads[0].parameters(), strict=True):
        assert torch.equal(p, q)
    for t in range(2):
        assert all(float(b.abs().sum()) > 0 for b in strategy.lora.b_k[t])  # every task's B moved off zero
        assert all(float(b.abs().sum()) > 0 for b in strategy.lora.b_v[t])
    # task 1's A was designed against the memory left by task 0
    for i, basis in enumerate(bases0):
        a1 = strategy.lora.a_k[1][i].double()
        torch.testing.assert_close(a1, strategy.lora.a_v[1][i].double())  # keys and values share A
        leak = a1 @ basis if types0[i] == "remove" else a1 - a1 @ basis @ basis.T
        assert float(leak.abs().max()) < 1e-5, (i, types0[i])


def test_predictions_are_per_sample_and_survive_a_checkpoint(trained, backbone, test_split):
    strategy = trained[0]
    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 5) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3]
    torch.testing.assert_close(strategy.predict(test_split.subset(rows)), full[rows], rtol=1e-5, atol=1e-5)
    other = InfLoRA(SMALL, ctx_for(backbone))
    other.restore_state(strategy.save_state())
    torch.testing.assert_close(other.predict(test_split), full, rtol=0, atol=0)
    assert state_digest(backbone.model) == state_digest(other.ctx.backbone.model)


def test_param_counts_follow_the_formula_and_the_cost_model(trained, backbone):
    strategy = trained[0]
    d, depth = backbone.num_features, len(backbone.model.blocks)
    real = strategy.param_counts()
    formula = InfLoRA.param_formula(SMALL, d, depth, (2, 3))
    lora = 2 * depth * 2 * d * SMALL.rank
    assert real.added_per_task == formula.added_per_task == [lora + 2 * (d + 1), lora + 3 * (d + 1)]
    assert real.trainable_per_task == formula.trainable_per_task == [lora // 2 + 2 * (d + 1), lora // 2 + 3 * (d + 1)]
    assert real.stored_per_task == formula.stored_per_task == [depth * d * d, 0]
    assert real.head == formula.head == 5 * (d + 1)
    assert strategy.optimizer_steps == [2 * 2, 2 * 3]  # 12 and 18 images in batches of 8, 2 epochs
    w = InfLoRA.card.cost(SMALL, RunShape((12.0, 18.0), (6.0, 15.0)))
    assert (w.f, w.b, w.f_cacheable) == (2 * 30 + 21, 2 * 30, 0.0)


def test_float64_setting_runs_on_a_float64_copy_that_checkpoints_do_not_hold(backbone, tasks, test_split):
    """The ci profile's ``float64``: a float64 copy of the frozen ViT with float64 branches and heads, the same
    features as fp32 to rounding; a checkpoint keeps the branches and heads but not the copy, and restores exactly."""
    cfg = InfLoRAConfig(**{**vars(SMALL), "float64": True})
    strategy = InfLoRA(cfg, ctx_for(backbone))
    assert strategy.model is not backbone.model and next(backbone.model.parameters()).dtype == torch.float32
    images = next(iter(tasks[0].train.image_loader(4, augment=False)))[0]
    with torch.no_grad():
        plain = InfLoRA(SMALL, ctx_for(backbone))._features(images)
        torch.testing.assert_close(strategy._features(images).float(), plain, rtol=1e-4, atol=1e-4)
    digest = state_digest(backbone.model)
    for task in tasks:
        strategy.learn_task(task)
    assert {p.dtype for p in strategy.lora.parameters()} == {torch.float64}
    assert {p.dtype for p in strategy.heads.parameters()} == {torch.float64}
    assert state_digest(backbone.model) == digest
    assert "model" not in strategy.state_dict()
    other = InfLoRA(cfg, ctx_for(backbone))
    other.restore_state(strategy.save_state())
    torch.testing.assert_close(other.predict(test_split), strategy.predict(test_split), rtol=0, atol=0)
