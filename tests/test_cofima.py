"""CoFiMA: the golden Fisher diagonal and weight merge against PILOT's own functions, and the mechanics on the micro
ViT (the merge of each task's model with the previous one, the Fisher pass, the switches, the one tuned copy and the
bounded, pickle-free state it keeps between tasks, its parameter accounting).

The golden fixture ``tests/reference_golden/cofima.safetensors`` holds what LAMDA-PILOT @ 5240714
``models/cofima.py`` ``Learner.getFisherDiagonal`` and ``interpolate_weights`` computed on a tiny network
(provenance: tests/reference_golden/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from tinytasks import ctx_for, make_split
from torch import nn

import baselines.cofima as cofima_mod
import clbench.methods.shared as blocks_mod
from baselines.cofima import CoFiMA, CoFiMAConfig, fisher_diagonal, merge_weights
from clbench.features.backbones import state_digest
from clbench.files.safestate import SavedState
from clbench.methods.contract import Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too

GOLDEN = Path(__file__).parent / "reference_golden" / "cofima.safetensors"
RTOL, ATOL = 1e-5, 1e-10  # Fisher entries are <= 1e-4: an absolute tolerance far below them
SMALL = CoFiMAConfig(epochs=2, batch_size=6, ca_epochs=2, ca_samples=16, lr=0.05, eval_batch_size=8)


# ----------------------------------------------------------------------------------------------- golden
def _golden(prefix: str) -> dict[str, torch.Tensor]:
    f = load_file(GOLDEN)
    return {k[len(prefix) :]: v for k, v in f.items() if k.startswith(prefix)}


class _Net(nn.Module):
    """The fixture's network, with the reference's parameter names (``backbone.*``, ``fc.heads.<t>.0.*``)."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8))
        self.backbone.register_parameter("unused", nn.Parameter(torch.zeros(3)))
        self.fc = nn.Module()
        self.fc.heads = nn.ModuleList([nn.Sequential(nn.Linear(8, c)) for c in sizes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.backbone(x)
        return torch.cat([head(h) for head in self.fc.heads], dim=1)


@pytest.mark.parametrize(("task", "sizes"), [(0, [3]), (1, [3, 2])])
def test_fisher_diagonal_equals_the_references(task, sizes):
    net = _Net(sizes)
    net.load_state_dict(_golden(f"in.theta{task}."))
    data = _golden(f"in.batch{task}.")
    batches = [(data[f"{i}.x"], data[f"{i}.y"]) for i in range(len({k.split(".")[0] for k in data}))]
    got = fisher_diagonal(dict(net.named_parameters()), batches, net, 1e-4)
    want = _golden(f"out.fisher{task}.")
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=RTOL, atol=ATOL)
    capped = torch.cat([v.flatten() for v in want.values()])
    assert 0 < int((capped == 1e-4).sum()) < len(capped)  # the fixture reaches the cap, and not everywhere
    assert torch.equal(got["backbone.unused"], torch.zeros(3))  # no loss reaches it


def test_fisher_weighted_merge_equals_the_references_and_replaces_its_nan():
    theta0, theta1 = _golden("in.theta0."), _golden("in.theta1.")
    f0, f1 = _golden("out.fisher0."), _golden("out.fisher1.")
    want = _golden("out.merged_fisher.")
    scaled = merge_weights(theta0, theta1, 0.4, f0, f1, new_head="fisher_scaled")
    copied = merge_weights(theta0, theta1, 0.4, f0, f1)
    for k in want:
        if k == "backbone.unused":  # both Fisher entries 0: the reference's 0 / 0
            assert torch.isnan(want[k]).all()
            torch.testing.assert_close(scaled[k], 0.6 * theta0[k] + 0.4 * theta1[k])
        else:
            torch.testing.assert_close(scaled[k], want[k], rtol=RTOL, atol=1e-7)
    new = [k for k in theta1 if k not in theta0]
    assert set(new) == {"fc.heads.1.0.weight", "fc.heads.1.0.bias"}
    for k in new:  # the reference's F_theta1 for the new block; copied by default
        torch.testing.assert_close(scaled[k], f1[k] * theta1[k])
        assert torch.equal(copied[k], theta1[k])
        assert not torch.allclose(copied[k], scaled[k])
    moved = [k for k in theta0 if k != "backbone.unused"]
    # Fisher-weighted: not the plain average (they agree only where both entries sit at the cap)
    assert any(not torch.allclose(want[k], 0.6 * theta0[k] + 0.4 * theta1[k]) for k in moved)


def test_plain_interpolation_equals_the_references():
    theta0, theta1 = _golden("in.theta0."), _golden("in.theta1.")
    want = _golden("out.merged_plain.")
    got = merge_weights(theta0, theta1, 0.4)
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=RTOL, atol=1e-7)


# ----------------------------------------------------------------------------------------------- mechanics
@pytest.fixture(scope="module")
def three_tasks(backbone) -> list[Task]:
    return [
        Task(0, [0, 1], 2, make_split(backbone, [0, 1], 6, seed=1)),
        Task(1, [2, 3, 4], 5, make_split(backbone, [2, 3, 4], 6, seed=2)),
        Task(2, [5, 6], 7, make_split(backbone, [5, 6], 6, seed=4)),
    ]


@pytest.fixture(scope="module")
def test_split(backbone):
    return make_split(backbone, list(range(7)), 2, seed=3)


def _weights(s: CoFiMA) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in s._weights(s.aligned).items()}


@pytest.fixture(scope="module")
def merged(backbone, three_tasks):
    """Two tasks without alignment (the merged head is evaluation's head): the merge's inputs and output recorded."""
    s = CoFiMA(CoFiMAConfig(**{**vars(SMALL), "ca_epochs": 0}), ctx_for(backbone))
    s.learn_task(three_tasks[0])
    after0, fisher0 = _weights(s), s.fisher
    calls = []
    real = cofima_mod.merge_weights

    def spy(theta0, theta1, alpha, f0, f1, new_head):
        calls.append(({k: v.clone() for k, v in theta1.items()}, alpha, f0, f1, new_head, theta0))
        return real(theta0, theta1, alpha, f0, f1, new_head)

    with mock.patch.object(cofima_mod, "merge_weights", spy):
        s.learn_task(three_tasks[1])
    return s, after0, fisher0, calls


def test_each_task_averages_its_model_with_the_previous_one_by_their_fishers(merged):
    s, after0, fisher0, calls = merged
    (theta1, alpha, f0, f1, new_head, theta0) = calls[0]
    assert len(calls) == 1 and alpha == 0.4 and new_head == "copy"
    assert set(theta0) == set(after0) and all(torch.equal(theta0[k], after0[k]) for k in after0)  # previous model
    assert f0 is fisher0 and f1 is s.fisher  # the previous task's Fisher and this task's, which is kept
    now = _weights(s)
    want = merge_weights(after0, theta1, 0.4, fisher0, s.fisher)
    for k, v in now.items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0)
    vit = [k for k in now if k.startswith("model.")]
    assert all(not torch.equal(now[k], theta1[k]) for k in vit[:5])  # the merge moved the tuned ViT
    assert torch.equal(now["head.blocks.1.weight"], theta1["head.blocks.1.weight"])  # the new block copied


def test_the_fisher_covers_the_vit_and_every_head_block_capped(merged, backbone):
    s, _, fisher0, _ = merged
    vit_names = {f"model.{n}" for n, _ in s.model.named_parameters()}
    assert set(s.fisher) == vit_names | {f"head.{n}" for n, _ in s.head.named_parameters()}
    assert set(fisher0) == vit_names | {"head.blocks.0.weight", "head.blocks.0.bias"}
    for f in s.fisher.values():
        assert float(f.min()) >= 0 and float(f.max()) <= 1e-4
    assert float(s.fisher["head.blocks.0.weight"].abs().sum()) > 0  # the earlier block: its real gradient
    assert float(sum(s.fisher[k].sum() for k in vit_names)) > 0


def test_wt_lambda_zero_keeps_the_previous_vit_and_one_the_tuned_one(backbone, three_tasks):
    kept = []
    for lam in (0.0, 1.0):
        s = CoFiMA(CoFiMAConfig(**{**vars(SMALL), "ca_epochs": 0, "wt_lambda": lam}), ctx_for(backbone))
        s.learn_task(three_tasks[0])
        before = {k: v for k, v in _weights(s).items() if k.startswith("model.")}
        s.learn_task(three_tasks[1])
        after = {k: v for k, v in _weights(s).items() if k.startswith("model.")}
        kept.append(all(torch.allclose(after[k], before[k], rtol=1e-6, atol=1e-7) for k in before))
    assert kept == [True, False]  # lambda 0: the task's tuning undone; lambda 1: kept


def test_new_head_merge_fisher_scaled_reproduces_the_references_product(backbone, three_tasks):
    s = CoFiMA(CoFiMAConfig(**{**vars(SMALL), "ca_epochs": 0, "new_head_merge": "fisher_scaled"}), ctx_for(backbone))
    s.learn_task(three_tasks[0])
    s.learn_task(three_tasks[1])
    want = s.fisher["head.blocks.1.weight"] * s.head.blocks[1].weight
    torch.testing.assert_close(s.aligned.blocks[1].weight, want)
    new, trained = s.aligned.blocks[1].weight.detach(), s.head.blocks[1].weight.detach()
    assert float(new.abs().max()) <= 1.0001e-4 * float(trained.abs().max())  # entries <= 1e-4 times the weights


def test_slow_learner_groups_the_whole_vit_at_a_hundredth_of_the_head_lr(backbone, three_tasks):
    seen = []
    real = blocks_mod.optimizer_step

    def record(optimizer, loss, where):
        seen.append([(g["lr"], len(g["params"])) for g in optimizer.param_groups])
        return real(optimizer, loss, where)

    s = CoFiMA(CoFiMAConfig(epochs=1, batch_size=12, ca_epochs=0), ctx_for(backbone))
    with mock.patch.object(blocks_mod, "optimizer_step", record):
        s.learn_task(three_tasks[0])
    (vit_lr, vit_n), (head_lr, head_n) = seen[0]
    assert (vit_lr, head_lr) == pytest.approx((1e-4, 0.01))
    assert vit_n == len(list(s.model.parameters())) and head_n == 2


def test_statistics_and_predictions_use_the_merged_vit_and_the_aligned_head(backbone, three_tasks, test_split):
    s = CoFiMA(SMALL, ctx_for(backbone))
    s.learn_task(three_tasks[0])
    s.learn_task(three_tasks[1])
    feats = s.adapted_features(three_tasks[1].train).double()
    x = feats[three_tasks[1].train.labels == 3]
    torch.testing.assert_close(s.class_mean[3], x.mean(0).float(), rtol=1e-5, atol=1e-6)
    logits = s.predict(test_split)
    assert logits.shape == (len(test_split), 5)
    torch.testing.assert_close(logits, s.aligned(s.adapted_features(test_split)), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(s.aligned.blocks[0].weight, s.head.blocks[0].weight)  # aligned; head recalled


def _through_a_file(saved: SavedState) -> tuple[SavedState, int]:
    """``saved`` as a checkpoint writes it (JSON text and safetensors bytes, no pickle) and read back; its bytes."""
    blob = save_tensors(saved.tensors)
    return SavedState(json.loads(json.dumps(saved.tree)), load_tensors(blob)), len(blob)


def test_state_between_tasks_is_one_tuned_vit_and_one_fisher_whatever_the_tasks(backbone, three_tasks, test_split):
    """Issue 59 item 2: the whole-model copies are bounded (the tuned ViT and one Fisher, never one per task), counted
    as stored, and a checkpoint is safetensors plus JSON that restores the run exactly."""
    s = CoFiMA(SMALL, ctx_for(backbone))
    vit = backbone.n_params()
    sizes = []
    for task in three_tasks:
        s.learn_task(task)
        restored = CoFiMA(SMALL, ctx_for(backbone))
        saved, nbytes = _through_a_file(s.save_state())
        restored.restore_state(saved)
        torch.testing.assert_close(restored.predict(test_split), s.predict(test_split), rtol=0, atol=0)
        assert state_digest(restored.model) == state_digest(s.model)
        sizes.append(nbytes)
    assert 2 * 4 * vit < sizes[0] < 2.5 * 4 * vit  # the tuned ViT and its Fisher (fp32), heads and statistics
    assert sizes[2] - sizes[0] < 0.2 * 4 * vit  # two more tasks: rows and statistics only, no ViT-sized copy
    assert backbone.digest == state_digest(backbone.model)  # the frozen ViT bit-identical
    modules = [v for v in vars(s).values() if isinstance(v, nn.Module) and hasattr(v, "patch_embed")]
    assert modules == [s.model]  # one tuned ViT, never one per task
    pc = s.param_counts()
    d = backbone.num_features
    assert pc.stored_per_task == [
        2 * (d + d * d) + vit + 2 * (d + 1),
        3 * (d + d * d) + 3 * (d + 1),
        2 * (d + d * d) + 2 * (d + 1),
    ]
    assert pc.added_per_task == [vit + 2 * (d + 1), 3 * (d + 1), 2 * (d + 1)]
    assert pc.extra["vit_sized_kept"] == 2 and pc.extra["fisher_floats"] == sum(f.numel() for f in s.fisher.values())


def test_without_fisher_weighting_nothing_is_kept_and_the_merge_is_plain(backbone, three_tasks):
    s = CoFiMA(CoFiMAConfig(**{**vars(SMALL), "ca_epochs": 0, "fisher_weighting": False}), ctx_for(backbone))
    s.learn_task(three_tasks[0])
    before = _weights(s)
    seen, real = [], cofima_mod.merge_weights

    def spy(theta0, theta1, alpha, f0, f1, new_head):
        seen.append(({k: v.clone() for k, v in theta1.items()}, f0, f1))
        return real(theta0, theta1, alpha, f0, f1, new_head)

    with mock.patch.object(cofima_mod, "merge_weights", spy):
        s.learn_task(three_tasks[1])
    theta1, f0, f1 = seen[0]
    assert s.fisher == {} and f0 is None and f1 is None
    k = "model.blocks.0.attn.qkv.weight"
    torch.testing.assert_close(s._weights(s.aligned)[k].detach(), 0.6 * before[k] + 0.4 * theta1[k])
    assert s.param_counts().stored_per_task[0] == 2 * (backbone.num_features + backbone.num_features**2)


def test_bad_settings_are_refused():
    for bad in ({"wt_lambda": 1.5}, {"fisher_max": 0.0}, {"new_head_merge": "scaled"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CoFiMAConfig(**bad)
