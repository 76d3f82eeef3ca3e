"""APER's other first-session adaptations (``adapt=ssf|vpt|finetune``, PILOT ``models/aper_ssf.py``,
``aper_vpt.py``, ``aper_finetune.py``): the first session trains (loss falls, the tuned parameters move), the
frozen backbone stays bit-identical, the tuned module is frozen after task 0, the parameter formula equals a real
run's counts, a checkpoint round trip keeps the features, and bad settings are refused.

Mechanics on the tiny random ViT (``vit_micro``, 64-d, 4 blocks) with tiny data; the golden fixtures of the SSF
and VPT forwards are tests/test_reference_golden.py's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tinytasks import check_param_formula_after_a_real_run

from baselines.aper import APER, APERConfig
from clbench.benchmarks.base import ArraySource
from clbench.features.cache import extract
from clbench.features.transforms import TransformSpec
from clbench.layers.first_session import TunedViT
from clbench.layers.ssf import SSF, ssf_size
from clbench.layers.vpt import VisualPrompts, vpt_size
from clbench.methods.contract import Context, Split, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

TASK_CLASSES = ([0, 1], [2, 3])
VARIANTS = {  # adapt setting -> (extra settings, the tuned module's class)
    "ssf": ({}, SSF),
    "vpt": ({"vpt_type": "deep"}, VisualPrompts),
    "vpt-shallow": ({"adapt": "vpt", "vpt_type": "shallow"}, VisualPrompts),
    "finetune": ({}, TunedViT),
}


def _cfg(name: str, **kw) -> APERConfig:
    extra, _ = VARIANTS[name]
    settings = {"adapt": name, "epochs": 6, "batch_size": 12, "eval_batch_size": 6, "lr": 0.1, **extra, **kw}
    return APERConfig(**settings)


def _separable(backbone, classes: list[int], n: int, seed: int) -> Split:
    """``n`` random images per class, odd classes with a brighter red channel: a task the micro ViT can learn."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.asarray(classes), n)
    images = rng.integers(0, 128, size=(len(labels), 32, 32, 3), dtype=np.uint8)
    images[..., 0] += (128 * (labels % 2)).astype(np.uint8)[:, None, None]
    source = ArraySource(images, labels, f"separable-{seed}")
    eval_tf = TransformSpec(32, None, backbone.mean, backbone.std).build()
    train_tf = TransformSpec(32, None, backbone.mean, backbone.std, train=True).build()
    feats = extract(backbone, source, eval_tf, torch.device("cpu"), precision="fp32", batch_size=64)
    return Split(source, np.arange(len(labels)), torch.as_tensor(labels), feats, eval_tf, train_tf)


@pytest.fixture(scope="module")
def learnable(backbone) -> tuple[list[Task], Split]:
    """Two tasks of 6 images per class (classes 0, 1 then 2, 3) and 3 test images per class."""
    first, second = _separable(backbone, [0, 1], 6, 1), _separable(backbone, [2, 3], 6, 2)
    tasks = [Task(0, [0, 1], 2, first), Task(1, [2, 3], 4, second)]
    return tasks, _separable(backbone, [0, 1, 2, 3], 3, 3)


def _ctx(backbone, lines: list[str]) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lines.append)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_aper_variant_first_session_trains_and_freezes(backbone, learnable, name):
    tasks, test_split = learnable
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    lines: list[str] = []
    s = APER(_cfg(name), _ctx(backbone, lines))
    s.learn_task(tasks[0])
    losses = [float(m.group(1)) for m in map(re.compile(r"first session epoch \d+/\d+: loss (\S+)").search, lines) if m]
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0]  # the first session's loss falls
    tuned = s.adapters
    assert isinstance(tuned, VARIANTS[name][1])
    fresh = APER(_cfg(name), _ctx(backbone, []))._new_tuned()  # the same module as initialised
    moved = [not torch.equal(a, b) for a, b in zip(tuned.parameters(), fresh.parameters(), strict=True)]
    assert all(moved)  # every tuned parameter left its initial value
    assert not any(p.requires_grad for p in tuned.parameters()) and not tuned.training  # frozen after task 0
    frozen_after = {k: v.clone() for k, v in tuned.state_dict().items()}
    s.learn_task(tasks[1])
    assert all(torch.equal(frozen_after[k], v) for k, v in tuned.state_dict().items())  # task 1 trains nothing
    assert s.optimizer_steps[1] == 0
    for k, v in backbone.model.state_dict().items():  # the run's frozen backbone is bit-identical
        assert torch.equal(before[k], v), k
    feats = s.features(test_split)
    assert torch.equal(feats[:, : s.dim], test_split.features)  # frozen half: the cached frozen feature
    assert not torch.allclose(feats[:, s.dim :], test_split.features, atol=1e-4)  # adapted half differs
    assert torch.isfinite(s.predict(test_split)).all()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_aper_variant_checkpoint_round_trip_keeps_the_features(backbone, learnable, name):
    tasks, test_split = learnable
    s = APER(_cfg(name, epochs=1), _ctx(backbone, []))
    s.learn_task(tasks[0])
    saved = s.save_state()
    t = APER(_cfg(name, epochs=1), _ctx(backbone, []))
    t.restore_state(saved)
    t.store = type(t.store)(t.dim)  # recompute every adapted feature through the restored module
    torch.testing.assert_close(t.features(test_split), s.features(test_split), rtol=0, atol=0)


def test_aper_ssf_sites_and_size_follow_the_reference_layout(backbone):
    ssf = SSF(backbone.model, torch.Generator().manual_seed(0))
    d, depth = backbone.num_features, len(backbone.model.blocks)
    assert ssf.sites[:3] == ["patch_embed.proj", "blocks.0.norm1", "blocks.0.attn.qkv"]
    assert ssf.sites[-1] == "norm" and len(ssf.sites) == 6 * depth + 2
    assert sum(p.numel() for p in ssf.parameters()) == ssf_size(d, depth, 4 * d)
    scale = torch.cat([f.scale for f in ssf.factors])
    assert abs(float(scale.mean()) - 1) < 0.01 and 0.01 < float(scale.std()) < 0.03  # N(1, 0.02)
    with ssf.applied(backbone.model):
        pass
    assert all(not m._forward_hooks for m in backbone.model.modules())  # hooks removed on exit


def test_aper_vpt_prompt_shapes(backbone):
    d, depth = backbone.num_features, len(backbone.model.blocks)
    assert VisualPrompts(depth, 5, d, deep=True).prompts.shape == (depth, 5, d)
    assert VisualPrompts(depth, 5, d, deep=False).prompts.shape == (1, 5, d)
    assert vpt_size(d, depth, 5, True) == depth * 5 * d


VPT_SHALLOW = (("adapt", "vpt"), ("vpt_type", "shallow"))


@pytest.mark.parametrize("overrides", [(("adapt", "ssf"),), (("adapt", "vpt"),), VPT_SHALLOW])
def test_aper_variant_param_formula_equals_the_counts_after_a_real_run(tmp_path, overrides):
    check_param_formula_after_a_real_run(tmp_path, "aper", overrides)


def test_aper_finetune_counts_the_whole_vit_copy(backbone, learnable):
    tasks, _ = learnable
    from baselines.cards.aper import param_formula

    cfg = _cfg("finetune", epochs=1)
    s = APER(cfg, _ctx(backbone, []))
    for task in tasks:
        s.learn_task(task)
    vit = sum(p.numel() for p in backbone.model.parameters())
    got, want = s.param_counts(), param_formula(cfg, s.dim, len(backbone.model.blocks), (2, 2), backbone_params=vit)
    assert got.added_per_task == want.added_per_task == [vit, 0]  # the tuned copy is stored: a whole ViT
    assert got.trainable_per_task == want.trainable_per_task == [vit + 2 * s.dim + 1, 0]
    assert got.stored_per_task == want.stored_per_task == [2 * 2 * s.dim, 2 * 2 * s.dim]


def test_aper_variant_profiles_name_pilots_settings():
    from baselines.cards.aper import PROFILES

    assert PROFILES["reference-finetune"] == {"adapt": "finetune", "epochs": 6, "batch_size": 128, "weight_decay": 0.05}
    assert PROFILES["reference-ssf"] == {"adapt": "ssf"}
    assert PROFILES["reference-vpt-shallow"]["vpt_type"] == "shallow"


def test_aper_variant_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="adapt must be one of adapter, finetune, ssf, vpt"):
        APERConfig(adapt="lora")
    with pytest.raises(ValueError, match="vpt_type"):
        APERConfig(adapt="vpt", vpt_type="middle")
    with pytest.raises(ValueError, match="prompt_tokens"):
        APERConfig(adapt="vpt", prompt_tokens=0)
