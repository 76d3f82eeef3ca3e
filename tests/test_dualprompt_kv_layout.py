"""DualPrompt's E-prompt key/value layout: ``kv_layout="paired"`` (every image gets its prompt's key and value) and
``kv_layout="pilot"`` (LAMDA-PILOT 2647455 ``backbone/prompt.py`` ``EPrompt.forward``: ``self.prompt[:, :, idx]``
of shape (layers, 2, B, top_k, L, heads, d / heads) reshaped to (layers, B, 2, top_k * L, heads, d / heads) without
a permute; ``PreT_Attention`` then takes ``prompt[:, 0]`` as the key prefix and ``prompt[:, 1]`` as the value)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tinytasks import make_split

from baselines.dualprompt import DualPrompt, DualPromptConfig
from clbench.layers.prompts import pilot_kv_layout
from clbench.methods.contract import Context

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too


def one_slot_batch(b: int, length: int = 3, d: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key, value = torch.randn(length, d), torch.randn(length, d)
    prefix = torch.stack([key, value]).unsqueeze(0).expand(b, -1, -1, -1)  # (B, 2, L, d): one slot for all
    return prefix, key, value


@pytest.mark.parametrize("b", [4, 6])
def test_one_slot_first_half_key_twice_second_half_value_twice(b):
    prefix, key, value = one_slot_batch(b)
    got = pilot_kv_layout(prefix)
    for row in range(b):
        want = key if row < b // 2 else value
        assert torch.equal(got[row, 0], want) and torch.equal(got[row, 1], want), row
    assert not torch.equal(got, prefix)  # "paired" gives every row (key, value)


def test_odd_batch_middle_row_keeps_key_and_value():
    prefix, key, value = one_slot_batch(5)
    got = pilot_kv_layout(prefix)
    assert all(torch.equal(got[r, 0], key) and torch.equal(got[r, 1], key) for r in (0, 1))
    assert torch.equal(got[2, 0], key) and torch.equal(got[2, 1], value)
    assert all(torch.equal(got[r, 0], value) and torch.equal(got[r, 1], value) for r in (3, 4))


def test_a_single_image_batch_is_the_same_in_both_layouts():
    prefix, _, _ = one_slot_batch(1)
    assert torch.equal(pilot_kv_layout(prefix), prefix)


def test_equals_pilots_reshape_with_per_image_slots():
    """PILOT's expression on its own parameter layout, for images that chose different slots: image b gets stacked
    row 2b as key and 2b + 1 as value (other images' prompts), and the clbench layout reproduces it."""
    layers, pool, length, heads, hd = 3, 4, 2, 2, 3
    prompt = torch.randn(layers, 2, pool, length, heads, hd)  # EPrompt.prompt with use_prefix_tune_for_e_prompt
    idx = torch.tensor([[2], [0], [3], [3], [1]])  # (B, top_k): per-image slots
    raw = prompt[:, :, idx]  # (layers, 2, B, top_k, L, heads, hd)
    n_layers, dual, b, k, ln, nh, hdim = raw.shape
    pilot = raw.reshape(n_layers, b, dual, k * ln, nh, hdim)  # backbone/prompt.py, EPrompt.forward
    ours = prompt.reshape(layers, 2, pool, length, heads * hd).permute(2, 0, 1, 3, 4)  # (M, layers, 2, L, d)
    e = ours[idx[:, 0]]  # (B, layers, 2, L, d): what DualPrompt._forward indexes
    for layer in range(layers):
        got = pilot_kv_layout(e[:, layer])  # (B, 2, L, d)
        assert torch.equal(got, pilot[layer].reshape(b, 2, length, heads * hd)), layer
        stacked = torch.cat([e[:, layer, 0], e[:, layer, 1]])  # every key, then every value
        for row in range(b):
            assert torch.equal(got[row, 0], stacked[2 * row]) and torch.equal(got[row, 1], stacked[2 * row + 1])


def test_the_layouts_change_the_forward_pass_of_a_batch_only(backbone):
    ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lambda s: None)
    cfg = DualPromptConfig(epochs=1, batch_size=8, eval_batch_size=4, e_prompt_layers="2,3", pool_size=4)
    paired = DualPrompt(cfg, ctx)
    pilot = DualPrompt(replace(cfg, kv_layout="pilot"), ctx)
    pilot.prompts.load_state_dict(paired.prompts.state_dict())
    for s in (paired, pilot):
        s.head.grow(3, torch.Generator().manual_seed(0))
    pilot.head.load_state_dict(paired.head.state_dict())
    images, _, _ = next(iter(make_split(backbone, [0, 1], 2, seed=1).image_loader(4, augment=False)))
    slots = torch.zeros(4, dtype=torch.long)
    with torch.no_grad():
        a, b = paired._forward(images, slots), pilot._forward(images, slots)
        assert not torch.allclose(a, b, atol=1e-4)
        assert torch.allclose(paired._forward(images[:1], slots[:1]), pilot._forward(images[:1], slots[:1]))


def test_kv_layout_is_checked():
    with pytest.raises(ValueError, match="kv_layout"):
        DualPromptConfig(kv_layout="swapped")  # type: ignore[arg-type]
