"""LAE: mechanics on the tiny random ViT, and the golden check against PILOT's own classes
(``test_matches_the_reference_*``, fixture tests/reference_golden/lae.safetensors).

Every test states an invariant from the paper / reference code (a zero PET is the plain block, the prefix
compensation, the offline moving average and its start, the freeze epochs, the ensemble's max, per-sample predictions,
the parameter formula) and would fail if the code broke it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tinytasks import (
    check_param_formula_equals_the_counts,
    check_per_sample_predictions_ignore_order_and_batch_size,
    ctx_for,
)

from baselines.lae import LAE, AdapterPET, LAEConfig, LoRAPET, PrefixPET, pet_attention, pet_block
from clbench.methods.shared import vit_block

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

SMALL = LAEConfig(epochs=2, num_freeze_epochs=1, batch_size=4, eval_batch_size=5, blocks="0,1", lr=0.01, ema_decay=0.5)
GOLDEN = Path(__file__).parent / "reference_golden" / "lae.safetensors"


def run(backbone, tasks, cfg: LAEConfig = SMALL) -> LAE:
    strategy = LAE(cfg, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    return strategy


@pytest.fixture(scope="module")
def trained(backbone, tasks) -> LAE:
    return run(backbone, tasks)


# ----------------------------------------------------------------------------------------------- the forward
@pytest.mark.parametrize("kind", ["adapter", "lora"])
def test_a_fresh_adapter_or_lora_is_the_plain_block(backbone, kind):
    """W_up = 0 (adapter) and B = 0 (LoRA) at the start: the block is unchanged."""
    d = backbone.num_features
    g = torch.Generator().manual_seed(0)
    pet = AdapterPET(d, 5, g) if kind == "adapter" else LoRAPET(d, 5, g)
    block = backbone.model.blocks[0]
    x = torch.randn(2, 7, d)
    with torch.no_grad():
        assert torch.allclose(pet_block(block, x, pet), vit_block(block, x), atol=1e-5)
        assert torch.allclose(pet_block(block, x, None), vit_block(block, x), atol=1e-5)
        pet.up_weight.fill_(0.1) if kind == "adapter" else pet.B.fill_(0.1)
        assert not torch.allclose(pet_block(block, x, pet), vit_block(block, x), atol=1e-3)


def test_prefix_compensation_adds_the_prefix_values_average_on_top_of_the_tokens_share(backbone):
    """Prefix.compensate: out = sum_p (a_p / sum a_p) v_p + sum_n a_n v_n, with a the joint softmax. With equal value
    tokens u, the prefix adds exactly u (through the projection) to what the tokens' own share gives."""
    d = backbone.num_features
    attn = backbone.model.blocks[0].attn
    pet = PrefixPET(3, d, torch.Generator().manual_seed(0))
    x = torch.randn(2, 5, d)
    with torch.no_grad():
        u = torch.randn(d)
        pet.val.copy_(u.expand(3, -1))
        pet.val_scale.fill_(2.0)
        out = pet_attention(attn, x, pet)
        # the same with the prefix values zero: the tokens' share alone
        pet.val.zero_()
        tokens_only = pet_attention(attn, x, pet)
        want = tokens_only + F.linear(2.0 * u, attn.proj.weight)  # the projection of the prefix average 2u
        assert torch.allclose(out, want, atol=1e-5)


# ----------------------------------------------------------------------------------------------- learning
def test_the_offline_module_is_the_moving_average_of_the_online_one(backbone, tasks):
    """After task 0 (authors' rules) offline = online; in task 1 every step does offline <- a off + (1 - a) on."""
    s = LAE(SMALL, ctx_for(backbone))
    s.learn_task(tasks[0])
    assert s.offline is not None
    for p, q in zip(s.online.parameters(), s.offline.parameters(), strict=True):
        assert torch.equal(p, q) and not q.requires_grad
    before_off = [q.clone() for q in s.offline.parameters()]
    on = [p.clone() for p in s.online.parameters()]
    s.ema_update()
    for p, q, q0 in zip(on, s.offline.parameters(), before_off, strict=True):
        assert torch.allclose(q, 0.5 * q0 + 0.5 * p)
    s.learn_task(tasks[1])
    moved = [not torch.equal(q, q0) for q, q0 in zip(s.offline.parameters(), before_off, strict=True)]
    assert any(moved)
    differ = [not torch.equal(p, q) for p, q in zip(s.online.parameters(), s.offline.parameters(), strict=True)]
    assert any(differ)  # the average lags the online module


def test_pilot_rules_start_the_offline_module_from_the_untrained_one(backbone, tasks):
    s = LAE(replace(SMALL, rules="pilot", ema_decay=0.9999), ctx_for(backbone))
    start = [p.clone() for p in s.online.parameters()]
    s.learn_task(tasks[0])
    assert s.offline is not None
    for q, q0, p in zip(s.offline.parameters(), start, s.online.parameters(), strict=True):
        # almost the start (decay 0.9999 over a handful of steps), far from the trained module
        assert (q - q0).abs().max() <= 1e-3 * max((p - q0).abs().max().item(), 1e-12) + 1e-12


def test_the_module_is_frozen_in_the_freeze_epochs_and_task0_trains_from_its_first(backbone, tasks):
    """Task >= 1 with num_freeze_epochs = epochs: only the head learns. Task 0 (authors' rules) trains the module."""
    s = LAE(replace(SMALL, num_freeze_epochs=2), ctx_for(backbone))
    start = [p.clone() for p in s.online.parameters()]
    s.learn_task(tasks[0])
    after0 = [p.clone() for p in s.online.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, after0, strict=True))
    head0 = s.head.weight[:2].clone()
    s.learn_task(tasks[1])
    assert all(torch.equal(a, b) for a, b in zip(after0, s.online.parameters(), strict=True))
    assert torch.equal(head0, s.head.weight[:2])  # old rows: masked out of the loss, never move (weight decay 0)
    assert s.param_counts().trainable_per_task[1] == 3 * (backbone.num_features + 1)


def test_pilot_rules_freeze_task0_too(backbone, tasks):
    s = LAE(replace(SMALL, num_freeze_epochs=2, rules="pilot"), ctx_for(backbone))
    start = [p.clone() for p in s.online.parameters()]
    s.learn_task(tasks[0])
    assert all(torch.equal(a, b) for a, b in zip(start, s.online.parameters(), strict=True))


# ----------------------------------------------------------------------------------------------- prediction
def test_scores_are_the_larger_of_the_online_and_offline_log_softmax(trained, test_split):
    images = torch.stack([test_split.eval_transform(test_split.source.image(int(i))) for i in test_split.indices[:6]])
    with torch.no_grad():
        on = F.log_softmax(trained._forward(images, trained.online), dim=1)
        off = F.log_softmax(trained._forward(images, trained.offline), dim=1)
        got = trained.scores(images)
    assert not torch.allclose(on, off, atol=1e-4)  # the two modules differ after task 1
    assert torch.allclose(got, torch.maximum(on, off), atol=1e-6)


def test_per_sample_predictions_do_not_depend_on_order_or_batch_size(trained, test_split):
    check_per_sample_predictions_ignore_order_and_batch_size(trained, test_split, n_classes=5)


@pytest.mark.parametrize("pet", ["prefix", "adapter", "lora"])
def test_param_formula_equals_the_counts(backbone, tasks, pet):
    cfg = replace(SMALL, pet=pet, epochs=1, num_freeze_epochs=1)  # task 1 trains the head only
    s = run(backbone, tasks, cfg)
    counts = check_param_formula_equals_the_counts(s, backbone, tasks)
    assert counts.stored_per_task[0] == counts.extra["pet_params"] > 0
    assert counts.trainable_per_task[1] == 3 * (backbone.num_features + 1)


def test_bad_settings_are_refused():
    for bad in ({"pet": "vpt"}, {"rules": "paper"}, {"ema_decay": 1.0}, {"blocks": ""}, {"prefix_length": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LAEConfig(**bad)


# ----------------------------------------------------------------------------------------------- golden
# tests/reference_golden/README.md, "lae.safetensors": PILOT 5240714 backbone/vit_lae.py's own Block, Prefix, Adapter
# and KVLoRA, timm's ModelEmaV2 (the authors' offline update) and models/lae.py's ensemble, on fixed tiny inputs.
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture(scope="module")
def golden():
    from safetensors.torch import load_file

    return load_file(GOLDEN)


def reference_block(g):
    from timm.models.vision_transformer import Block

    block = Block(dim=16, num_heads=4, qkv_bias=True)
    block.load_state_dict({k[len("in.block.") :]: v for k, v in g.items() if k.startswith("in.block.")})
    return block.eval()


def test_matches_the_reference_block_with_each_pet(golden):
    g = golden
    block, x = reference_block(g), g["in.x"]
    gen = torch.Generator().manual_seed(0)
    prefix = PrefixPET(3, 16, gen)
    adapter = AdapterPET(16, 5, gen)
    lora = LoRAPET(16, 5, gen)
    with torch.no_grad():
        prefix.key.copy_(g["in.prefix.key"])
        prefix.val.copy_(g["in.prefix.val"])
        prefix.key_scale.copy_(g["in.prefix.key_scale"])
        prefix.val_scale.copy_(g["in.prefix.val_scale"])
        adapter.down_weight.copy_(g["in.adapter.layer.0.weight"])
        adapter.down_bias.copy_(g["in.adapter.layer.0.bias"])
        adapter.up_weight.copy_(g["in.adapter.layer.2.weight"])
        adapter.up_bias.copy_(g["in.adapter.layer.2.bias"])
        adapter.scale.copy_(g["in.adapter.layer.3.scale"])
        for i in range(2):
            lora.A[i].copy_(g[f"in.lora.lora_A.{i}"])
            lora.B[i].copy_(g[f"in.lora.lora_B.{i}"])
            lora.scale[i].copy_(g[f"in.lora.scale.{i}.scale"])
        assert torch.allclose(pet_block(block, x, None), g["out.plain"], rtol=RTOL, atol=ATOL)
        for name, pet in (("prefix", prefix), ("adapter", adapter), ("lora", lora)):
            got = pet_block(block, x, pet)
            assert torch.allclose(got, g[f"out.{name}"], rtol=RTOL, atol=ATOL), name


def test_matches_the_reference_offline_average_and_ensemble(golden, backbone):
    g = golden
    cfg = replace(SMALL, prefix_length=3, blocks="0", ema_decay=0.9)
    s = LAE(cfg, ctx_for(backbone))
    s.online = torch.nn.ModuleList([PrefixPET(3, 16, torch.Generator().manual_seed(0))])
    names = ("key", "val", "key_scale", "val_scale")
    with torch.no_grad():
        for n in names:
            getattr(s.online[0], n).copy_(g[f"in.ema.start.{n}"])
        s.offline = s._copy(s.online)
        for step in range(3):
            for n in names:
                getattr(s.online[0], n).copy_(g[f"in.ema.online{step}.{n}"])
            s.ema_update()
    for n in names:
        assert torch.allclose(getattr(s.offline[0], n), g[f"out.ema.{n}"], rtol=RTOL, atol=ATOL), n
    # the ensemble: clbench's log-space max gives the log of the reference's max of softmaxes
    on, off = g["in.logits_online"], g["in.logits_offline"]
    ours = torch.maximum(F.log_softmax(on, dim=1), F.log_softmax(off, dim=1))
    assert torch.allclose(ours.exp(), g["out.ensemble"], rtol=RTOL, atol=ATOL)
    assert torch.equal(ours.argmax(dim=1), g["out.ensemble_pred"])
