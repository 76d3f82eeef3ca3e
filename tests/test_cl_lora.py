"""CL-LoRA: the authors' numbers (``tests/reference_golden/cl_lora.safetensors``, made by the reference code itself;
provenance in ``tests/reference_golden/README.md``) and mechanics on the micro ViT (what trains and what stays, the
prototype head, per-sample predictions, checkpoints, accounting).

Every test states an invariant from the paper / the authors' code (``JiangpengHe/CL-LoRA``) and would fail if the
code broke it.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tinytasks import check_per_sample_predictions_ignore_order_and_batch_size, ctx_for
from torch import nn

from baselines.cl_lora import (
    CLLoRA,
    CLLoRAConfig,
    QVLoRA,
    TrainingHead,
    kd_loss,
    orthogonal_down,
    orthogonality_loss,
    qv_lora_block,
    reassignment_weights,
)
from clbench.errors import ClbenchError
from clbench.features.backbones import state_digest
from clbench.methods.contract import RunShape
from clbench.methods.shared import class_means, vit_block

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

GOLDEN = Path(__file__).parent / "reference_golden" / "cl_lora.safetensors"
TOL = {"rtol": 1e-5, "atol": 1e-5}  # fp32, the same operations in another order (fused qkv, SDPA)
SMALL = CLLoRAConfig(rank=4, epochs=2, batch_size=8, lr=0.05)


# ----------------------------------------------------------------------------------------------- golden
@pytest.fixture(scope="module")
def golden():
    return load_file(GOLDEN)


def _timm_vit(f: dict[str, torch.Tensor]) -> nn.Module:
    """A timm ViT (d 16, 4 blocks, 2 heads, 8 px in patches of 4) holding the reference ViT's weights: its separate
    q, k, v projections fused into ``qkv``, its ``fc1``/``fc2`` as the block's ``mlp``."""
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=4, num_heads=2, num_classes=0, qkv_bias=True
    ).eval()
    w = {k[len("in.vit.") :]: v for k, v in f.items() if k.startswith("in.vit.")}
    state = {}
    for name, value in w.items():
        if ".attn.q_proj." in name:
            kind = name.rsplit(".", 1)[1]
            pre = name.split(".attn.")[0]
            state[f"{pre}.attn.qkv.{kind}"] = torch.cat(
                [w[f"{pre}.attn.{p}_proj.{kind}"] for p in ("q", "k", "v")], dim=0
            )
        elif ".attn.k_proj." in name or ".attn.v_proj." in name:
            continue
        else:
            state[name.replace(".fc1.", ".mlp.fc1.").replace(".fc2.", ".mlp.fc2.")] = value
    missing, unexpected = vit.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if not m.startswith("head")], (missing, unexpected)
    for p in vit.parameters():
        p.requires_grad_(False)
    return vit


def _set(lora: QVLoRA, f: dict[str, torch.Tensor], prefix: str) -> None:
    with torch.no_grad():
        for n in ("q", "v"):
            getattr(lora, f"down_{n}").copy_(f[f"{prefix}.{n}.down"])
            getattr(lora, f"up_{n}").copy_(f[f"{prefix}.{n}.up"])


@pytest.fixture()
def golden_strategy(golden):
    """CL-LoRA on the reference ViT's weights after task 1: the shared LoRA as it moved during task 1, task 0's and
    task 1's LoRA and block weights, the teacher (the shared LoRA after task 0)."""
    f = golden
    vit = _timm_vit(f)
    ctx = ctx_for(types.SimpleNamespace(model=vit, num_features=16))
    s = CLLoRA(CLLoRAConfig(rank=3), ctx)
    assert s.n_shared == 2  # the reference's general_pos [0, 1] of 4 blocks
    for k in range(2):
        _set(s.shared[k], f, f"in.t0.shared.{k}")
    s.teacher = copy.deepcopy(s.shared)
    for k in range(2):
        _set(s.shared[k], f, f"in.t1.shared.{k}")
    gen = torch.Generator().manual_seed(0)
    for t in range(2):
        loras = nn.ModuleList([QVLoRA(16, 3, gen, torch.float32) for _ in range(2)])
        for k in range(2):
            _set(loras[k], f, f"in.t{t}.specific.{k}")
        s.specific.append(loras)
        s.block_weights.append(nn.Parameter(f[f"in.t{t}.block_weight"].clone()))
    for lora in s.teacher:
        lora.requires_grad_(False)
    return s


def test_golden_features_of_every_path_match_the_reference(golden, golden_strategy):
    """``forward_train`` (task 1's path), ``forward_general_cls`` (the shared blocks alone, current and teacher LoRA),
    ``forward_test`` (every task's path, concatenated) and ``forward_proto`` of each task."""
    s, x = golden_strategy, golden["in.x"]
    with torch.no_grad():
        torch.testing.assert_close(s._features(x, 1), golden["out.train_features"], **TOL)
        tokens = s._tokens(x)
        torch.testing.assert_close(s._pool(s._shared_blocks(tokens, s.shared)), golden["out.kd_student"], **TOL)
        torch.testing.assert_close(s._pool(s._shared_blocks(tokens, s.teacher)), golden["out.kd_teacher"], **TOL)
        torch.testing.assert_close(torch.cat(s._all_task_features(x), dim=1), golden["out.test_features"], **TOL)
        torch.testing.assert_close(s._features(x, 0), golden["out.proto_path_0"], **TOL)
        torch.testing.assert_close(s._features(x, 1), golden["out.proto_path_1"], **TOL)
    assert not torch.allclose(golden["out.kd_student"], golden["out.kd_teacher"], atol=1e-3)  # the teacher differs


def test_golden_prototypes_and_diagonal_cosine_logits_match_the_reference(golden, golden_strategy):
    """``replace_fc``'s rows for the task's classes (class means through its path) and ``forward_diagonal``'s
    logits: each task's classes scored by the cosine on that task's path only (scale 1)."""
    s, fc = golden_strategy, golden["out.fc_weight"]
    with torch.no_grad():
        protos = class_means(s._features(golden["in.proto_x"], 1), golden["in.proto_y"].long(), [2, 3, 4])
    torch.testing.assert_close(protos, fc[2:5, 16:], **TOL)
    s.prototypes = [golden["in.fc_task0"], protos]
    s.task_classes, s.n_seen = [[0, 1], [2, 3, 4]], 5
    with torch.no_grad():
        torch.testing.assert_close(s._logits(golden["in.x"]), golden["out.logits"], **TOL)


def test_golden_losses_match_the_reference(golden):
    kd = kd_loss(golden["in.kd.pred"], golden["in.kd.soft"], 2.0)
    torch.testing.assert_close(kd.reshape(1), golden["out.kd"], **TOL)
    prev = [golden["in.orth.prev0"], golden["in.orth.prev1"]]
    torch.testing.assert_close(orthogonality_loss(prev, golden["in.orth.cur"]).reshape(1), golden["out.orth"], **TOL)


def test_golden_distillation_step_reassigns_the_reference_gradient_and_keeps_the_cross_entropys(
    golden, golden_strategy
):
    """One batch of task 1 at lr 1 without momentum: the distillation step moves each shared up-projection by the
    reference's reassigned gradient and the head by its distillation gradient (through student and teacher), leaves
    the task's LoRA alone; the loss handed back carries the cross-entropy's (+ orthogonality) gradient at the
    parameters before that step, the reference's graph."""
    s, x = golden_strategy, golden["in.x"]
    head = TrainingHead(16, 3, torch.Generator().manual_seed(0), torch.float32)
    with torch.no_grad():
        head.weight.copy_(golden["in.proxy.weight"])
        head.sigma.copy_(golden["in.proxy.sigma"])
    named = {
        f"backbone.cur_adapter.{k}.{j}.lora_A.weight": getattr(s.shared[k], f"up_{n}")
        for k in range(2)
        for j, n in ((0, "q"), (2, "v"))
    }
    for k in range(2):
        for j, n in ((0, "q"), (2, "v")):
            named[f"backbone.cur_adapter.{k + 2}.{j}.lora_A.weight"] = getattr(s.specific[1][k], f"up_{n}")
            named[f"backbone.cur_adapter.{k + 2}.{j}.lora_B.weight"] = getattr(s.specific[1][k], f"down_{n}")
    named["backbone.block_weight"] = s.block_weights[1]
    named["proxy_fc.weight"], named["proxy_fc.sigma"] = head.weight, head.sigma
    params = list(named.values())
    before = [p.detach().clone() for p in params]
    loss = F.cross_entropy(head(s._features(x, 1)), golden["in.y"].long() - 2)
    loss = loss + 1e-4 * orthogonality_loss([s.block_weights[0]], s.block_weights[1])
    torch.testing.assert_close(loss.detach().reshape(1), golden["out.step.ce_total"], **TOL)
    optimizer = torch.optim.SGD(params, lr=1.0)
    handed = s._distillation_step(optimizer, x, head, params, loss)
    moved = {name: b - p.detach() for (name, p), b in zip(named.items(), before, strict=True)}
    for k in range(2):
        for j, n in ((0, "q"), (2, "v")):
            ref = golden[f"out.step.kd_grad.{k}.{n}"]
            torch.testing.assert_close(moved[f"backbone.cur_adapter.{k}.{j}.lora_A.weight"], ref, **TOL)
    torch.testing.assert_close(moved["proxy_fc.weight"], golden["out.step.proxy_kd_grad.weight"], **TOL)
    torch.testing.assert_close(moved["proxy_fc.sigma"], golden["out.step.proxy_kd_grad.sigma"], **TOL)
    for name in named:
        if "cur_adapter.2" in name or "cur_adapter.3" in name or name == "backbone.block_weight":
            assert torch.equal(moved[name], torch.zeros_like(moved[name])), name
    torch.testing.assert_close(handed.detach().reshape(1), golden["out.step.ce_total"], **TOL)
    grads = torch.autograd.grad(handed, params, allow_unused=True)
    for name, g in zip(named, grads, strict=True):
        torch.testing.assert_close(g, golden[f"out.step.ce_grad.{name}"], **TOL)


# ----------------------------------------------------------------------------------------------- the LoRA layer
def test_lora_starts_as_the_frozen_block_and_shifts_only_queries_and_values(backbone):
    """Up-projections start at zero (the block is the timm block); with weights w the block equals the timm block whose
    query and value rows of ``qkv`` gained w up @ down (the key rows untouched)."""
    block, d = backbone.model.blocks[1], backbone.num_features
    g = torch.Generator().manual_seed(0)
    lora = QVLoRA(d, 4, g, torch.float32)
    x = torch.randn(2, 7, d, generator=g)
    torch.testing.assert_close(qv_lora_block(block, x, lora), vit_block(block, x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lora.down_q @ lora.down_q.T, torch.eye(4), rtol=0, atol=1e-5)  # orthonormal rows
    with torch.no_grad():
        lora.up_q.copy_(0.2 * torch.randn(d, 4, generator=g))
        lora.up_v.copy_(0.2 * torch.randn(d, 4, generator=g))
    w = torch.tensor([0.7, 1.9, 1.3])
    merged = copy.deepcopy(block)
    with torch.no_grad():
        merged.attn.qkv.weight[:d] += w[0] * lora.up_q @ lora.down_q
        merged.attn.qkv.weight[2 * d :] += w[2] * lora.up_v @ lora.down_v
    torch.testing.assert_close(qv_lora_block(block, x, lora, w), vit_block(merged, x), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(qv_lora_block(block, x, lora, w), vit_block(block, x), atol=1e-3)


def test_orthogonal_down_and_reassignment_weights():
    down = orthogonal_down(12, 3, torch.Generator().manual_seed(2))
    torch.testing.assert_close(down @ down.T, torch.eye(3), rtol=0, atol=1e-5)
    up = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])  # row norms 5, 0, 1
    torch.testing.assert_close(reassignment_weights(up), torch.tensor([[2.5], [0.0], [0.5]]))
    assert torch.equal(reassignment_weights(torch.zeros(3, 2)), torch.ones(3, 1))


# ----------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def trained(backbone, tasks):
    """CL-LoRA after each task, with its shared LoRA, task 0's LoRA, weights and prototypes as after task 0."""
    s = CLLoRA(SMALL, ctx_for(backbone))
    downs = [(lora.down_q.clone(), lora.down_v.clone()) for lora in s.shared]
    s.learn_task(tasks[0])
    after0 = (copy.deepcopy(s.shared), copy.deepcopy(s.specific[0]), s.block_weights[0].detach().clone())
    protos0 = s.prototypes[0].clone()
    s.learn_task(tasks[1])
    return s, downs, after0, protos0


def test_what_trains_and_what_stays(trained):
    """The shared down-projections never train; the shared up-projections train on every task (the teacher is their
    copy after task 0); task 0's LoRA, block weights and prototypes stay put during task 1."""
    s, downs, (shared0, specific0, weights0), protos0 = trained
    for lora, (dq, dv) in zip(s.shared, downs, strict=True):
        assert torch.equal(lora.down_q, dq) and torch.equal(lora.down_v, dv)
    for lora, old, teacher in zip(s.shared, shared0, s.teacher, strict=True):
        assert float(old.up_q.detach().abs().sum()) > 0  # moved off zero on task 0
        assert not torch.equal(lora.up_q, old.up_q)  # and again on task 1
        assert torch.equal(teacher.up_q, lora.up_q)  # the teacher of a next task: the shared LoRA now
    for a, b in zip(specific0.parameters(), s.specific[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(weights0, s.block_weights[0]) and not torch.equal(weights0, s.block_weights[1])
    assert torch.equal(protos0, s.prototypes[0])
    assert [p.shape for p in s.prototypes] == [(2, 64), (3, 64)]
    assert s.optimizer_steps == [2 * 2, 2 * 3]  # 12 and 18 images in batches of 8, 2 epochs


def test_predictions_are_per_sample_and_survive_a_checkpoint(trained, backbone, test_split):
    s = trained[0]
    check_per_sample_predictions_ignore_order_and_batch_size(s, test_split, 5)
    other = CLLoRA(SMALL, ctx_for(backbone))
    other.restore_state(s.save_state())
    torch.testing.assert_close(other.predict(test_split), s.predict(test_split), rtol=0, atol=0)
    assert state_digest(backbone.model) == state_digest(other.ctx.backbone.model)


def test_param_counts_follow_the_formula_and_the_cost_model(trained, backbone):
    s = trained[0]
    d, depth, r = backbone.num_features, len(backbone.model.blocks), SMALL.rank
    real, formula = s.param_counts(), CLLoRA.param_formula(SMALL, d, depth, (2, 3))
    half, per_task = 2 * 2 * d * r, 4 * 2 * d * r + 3 * 2  # 2 shared and 2 specific blocks of the micro ViT
    assert real.added_per_task == formula.added_per_task == [half + per_task, per_task]
    assert real.stored_per_task == formula.stored_per_task == [2 * half + 2 * d, 3 * d]
    assert real.trainable_per_task == formula.trainable_per_task == [half + per_task + c * d + 1 for c in (2, 3)]
    assert real.head == formula.head == 5 * d
    w = CLLoRA.card.cost(SMALL, RunShape((12.0, 18.0), (6.0, 15.0)))
    assert w.b == pytest.approx(2 * (30 + 0.5 * 18))
    assert w.f == pytest.approx(30 + 0.5 * 2 * 18 + 6 * 1.0 + 15 * 1.5)


def test_bad_settings_are_refused(backbone):
    with pytest.raises(ClbenchError, match="shared_blocks"):
        CLLoRA(CLLoRAConfig(shared_blocks=4), ctx_for(backbone))
    with pytest.raises(ValueError, match="kd_temperature"):
        CLLoRAConfig(kd_temperature=0)


def test_float64_setting_runs_on_a_float64_copy_that_checkpoints_do_not_hold(backbone, tasks, test_split):
    """The ci profile's ``float64``: a float64 copy of the frozen ViT with float64 LoRA and prototypes; the
    frozen ViT stays as it was; a checkpoint keeps what was learnt but not the copy, and restores exactly."""
    cfg = CLLoRAConfig(**{**vars(SMALL), "float64": True, "epochs": 1})
    s = CLLoRA(cfg, ctx_for(backbone))
    assert s.model is not backbone.model and next(backbone.model.parameters()).dtype == torch.float32
    digest = state_digest(backbone.model)
    for task in tasks:
        s.learn_task(task)
    assert {p.dtype for p in s.specific.parameters()} == {torch.float64}
    assert {p.dtype for p in s.prototypes} == {torch.float64}
    assert state_digest(backbone.model) == digest
    assert "model" not in s.state_dict()
    other = CLLoRA(cfg, ctx_for(backbone))
    other.restore_state(s.save_state())
    torch.testing.assert_close(other.predict(test_split), s.predict(test_split), rtol=0, atol=0)
