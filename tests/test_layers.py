"""Shared layers (``clbench/layers/``): what they compute, and that checkpoints written before they moved out of the
method files still load (``clbench.files.safestate.MOVED_TYPES``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from baselines.aper import APER
from baselines.mos import MOS
from clbench.core.catalog import STRATEGIES
from clbench.core.costs import adapter_set_size
from clbench.files.safestate import MOVED_TYPES, SavedState, decode, encode, unknown_classes
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.first_session import AdaptedFeatures
from clbench.layers.heads import LinearHead
from clbench.layers.prompts import key_similarity


class _AdapterCfg:
    bottleneck, adapter_scale, adapter_dropout = 3, 0.1, 0.0


def _old_names(node):
    """The tree as an earlier clbench wrote it: every moved class under its old qualified name."""
    old = {new: old for old, new in MOVED_TYPES.items()}
    if isinstance(node, list):
        return [_old_names(v) for v in node]
    if isinstance(node, dict):
        return {k: old.get(v, v) if k in ("$module", "$object") else _old_names(v) for k, v in node.items()}
    return node


def test_key_similarity_is_the_cosine_of_query_and_key():
    keys = torch.tensor([[0.01, 0, 0], [0, 100.0, 0], [0, 0, 1.0]])
    query = torch.tensor([[1.0, 0.5, 0.1]], dtype=torch.float64)
    sim = key_similarity(query, keys)
    assert sim.dtype == torch.float32
    assert torch.allclose(sim, F.normalize(query.float(), dim=1) @ F.normalize(keys, dim=1).T)


def test_a_checkpoint_naming_the_classes_where_they_were_loads():
    adapters = AdapterSet(2, 4, _AdapterCfg(), torch.Generator().manual_seed(0))
    head = LinearHead(4)
    head.grow(3, torch.Generator().manual_seed(1))
    store = AdaptedFeatures(4)
    store.tables["abc"] = (torch.tensor([0, -1], dtype=torch.int32), torch.ones(1, 4))
    for strategy, value in ((MOS, {"sets": [adapters], "head": head}), (APER, {"a": adapters, "store": store})):
        types = strategy.saved_types()
        saved = encode(value, types)
        text = json.dumps(saved.tree)
        assert "baselines." not in text  # written under the current names
        old_tree = _old_names(json.loads(text))
        assert "baselines.ease.AdapterSet" in json.dumps(old_tree)  # the file an earlier clbench wrote
        old = SavedState(old_tree, dict(saved.tensors))
        assert unknown_classes(old, types) == []
        back = decode(old, types)
        for key, v in value.items():
            got = back[key]
            assert type(got) is type(v)
            if isinstance(v, torch.nn.Module):
                mine, theirs = got.state_dict(), v.state_dict()
                assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        if "sets" in back:
            assert type(back["sets"][0][0]) is Adapter and back["head"](torch.ones(1, 4)).shape == (1, 3)
        else:
            assert torch.equal(back["store"].tables["abc"][1], torch.ones(1, 4))


@pytest.mark.parametrize("old_name", ["baselines.slca.TaskHeads", "baselines.cofima.CoFiMAHeads"])
def test_slca_and_cofima_heads_saved_under_their_own_modules_load(old_name):
    """SLCA and CoFiMA each defined their task heads until the slow learner was held once: a checkpoint of either
    names its own class and must resume as the shared one."""
    from baselines.cofima import CoFiMA
    from clbench.layers.slow_learner import TaskHeads

    heads = TaskHeads()
    heads.add(4, 3, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    types = CoFiMA.saved_types()
    saved = encode({"heads": heads}, types)
    text = json.dumps(saved.tree).replace("clbench.layers.slow_learner.TaskHeads", old_name)
    assert old_name in text
    old = SavedState(json.loads(text), dict(saved.tensors))
    assert unknown_classes(old, types) == []
    back = decode(old, types)["heads"]
    assert type(back) is TaskHeads and torch.equal(back(torch.ones(1, 4)), heads(torch.ones(1, 4)))


def test_every_moved_name_points_at_a_class_a_strategy_saves():
    saved_by_some = set()
    for name in STRATEGIES.names():
        saved_by_some |= set(STRATEGIES.get(name).saved_types())
    assert set(MOVED_TYPES.values()) <= saved_by_some
    assert not set(MOVED_TYPES) & saved_by_some  # an old name is never a current one


def test_adapter_set_size_counts_the_parameters():
    s = AdapterSet(3, 5, _AdapterCfg(), torch.Generator().manual_seed(0))
    assert sum(p.numel() for p in s.parameters()) == adapter_set_size(3, 5, 3)
