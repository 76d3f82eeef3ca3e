"""TUNA: golden checks against the authors' code (tests/reference_golden/tuna.safetensors) and mechanics on the
tiny random ViT.

Golden: numbers computed by LAMDA-CL/ICCV2025-TUNA @ 77d4f10 itself (tests/reference_golden/README.md says how):
the adapter merge (``VisionTransformer.merge`` / ``emr_merge``), the features under every adapter id, the whole
evaluation (``Learner._eval_cnn``, both the code's universal branch and the paper's merged one, and ``_eval_cnn1``),
the orthogonality term and its gradients (``Learner.orth_loss``), the CosFace loss (``AngularPenaltySMLoss``) and
the decayed alignment means (``Learner.classifer_align``). Float32 on both sides, ``RTOL``/``ATOL`` 1e-5 (the
values are O(1), the scaled logits O(20); measured: 3.4e-6 on those logits, 1.1e-6 elsewhere), discrete outputs
exactly. Every other test states an invariant of the
paper / code and would fail if the code broke it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from tinytasks import (
    check_param_formula_equals_the_counts,
    check_per_sample_predictions_ignore_order_and_batch_size,
    ctx_for,
    make_split,
)
from torch import nn

from baselines.cards.tuna import PROFILES
from baselines.tuna import (
    TUNA,
    TUNAConfig,
    cosface_loss,
    decay_factors,
    emr_merge,
    entropy_select,
    orth_loss,
)
from clbench.errors import ClbenchError
from clbench.features.backbones import state_digest
from clbench.layers.adapters import AdapterSet
from clbench.methods.contract import Context, RunShape, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

SMALL = TUNAConfig(epochs=1, batch_size=8, eval_batch_size=4, ca_epochs=2)
FIXTURE = Path(__file__).parent / "reference_golden" / "tuna.safetensors"
RTOL = ATOL = 1e-5
GOLDEN_VIT = dict(img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2)  # the fixture's ViT
REF_NAMES = {"down_proj.weight": "down_weight", "down_proj.bias": "down_bias", "up_proj.weight": "up_weight"}
REF_NAMES["up_proj.bias"] = "up_bias"


# ----------------------------------------------------------------------------------------------- golden helpers
@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(
        actual.detach().float(), expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what} differs from the reference: {m}"
    )


def golden_set(f: dict[str, torch.Tensor], prefix: str, n_blocks: int) -> AdapterSet:
    adapters = AdapterSet(n_blocks, 16, TUNAConfig(), torch.Generator().manual_seed(0))
    adapters.load_state_dict(
        {f"{i}.{ours}": f[f"{prefix}{i}.{ref}"] for i in range(n_blocks) for ref, ours in REF_NAMES.items()}
    )
    return adapters.eval()


def golden_tuna(f: dict[str, torch.Tensor], **settings) -> TUNA:
    """A TUNA over a timm ViT holding the fixture's weights, with its three stored sets and head."""
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(num_classes=0, **GOLDEN_VIT)
    vit.load_state_dict({k[len("in.vit.") :]: v for k, v in f.items() if k.startswith("in.vit.")})
    vit.eval()
    ctx = Context(
        backbone=SimpleNamespace(model=vit, num_features=16),  # type: ignore[arg-type]
        device=torch.device("cpu"),
        precision="fp32",
        seed=0,
        log=lambda s: None,
    )
    s = TUNA(TUNAConfig(**settings), ctx)
    s.stored = nn.ModuleList(golden_set(f, f"in.set{t}.", 2) for t in range(3))
    s.merged = nn.ModuleList([emr_merge(list(s.stored))])
    s.head.grow(9, torch.Generator().manual_seed(0))
    with torch.no_grad():
        s.head.weight.copy_(f["in.head.weight"])
    s.class_task = [c // 3 for c in range(9)]
    return s


def check_merge(f: dict[str, torch.Tensor]) -> None:
    merged = emr_merge([golden_set(f, f"in.set{t}.", 2) for t in range(3)])
    state = merged.state_dict()
    for i in range(2):
        for ref, ours in REF_NAMES.items():
            close(state[f"{i}.{ours}"], f[f"out.merged.{i}.{ref}"], f"merged set, block {i} {ours}")


def check_features_and_outputs(f: dict[str, torch.Tensor]) -> None:
    s = golden_tuna(f)
    with torch.no_grad():
        feats = s._all_features(f["in.x"])  # (6, 4, 16): sets 0..2, then the merged set
        for i in range(3):
            close(feats[:, i], f["out.features"][i], f"features under stored set {i}")
        close(feats[:, 3], f["out.features"][4], "features under the merged set (adapter_id t + 2)")
        out, chosen = s.outputs_from_features(feats)
        close(out, f["out.outputs_merged"], "outputs with the merged universal set")
        specific = 20.0 * s.head(feats[:, :3])
        close(specific.transpose(0, 1), f["out.specific_logits"], "scaled logits under each stored set")
        s.cfg = replace(s.cfg, universal="last")  # the code: adapter_id t + 1 reaches the last set
        out_last, _ = s.outputs_from_features(s._all_features(f["in.x"]))
        close(out_last, f["out.outputs"], "outputs with the code's universal branch")
        assert torch.equal(out_last.topk(5, dim=1).indices, f["out.top5"].long()), "top-5 differ"
        s.stored = s.stored[:1]  # after task 0: the cosine logits under set 0, over the first 3 classes
        s.head.weight = nn.Parameter(s.head.weight[:3].clone())
        out0, _ = s.outputs_from_features(s._all_features(f["in.x"]))
        close(out0, f["out.outputs_task0"], "outputs after task 0 (_eval_cnn1)")
    assert chosen.shape == (6,)


def check_orth(f: dict[str, torch.Tensor]) -> None:
    def make(prefix: str) -> AdapterSet:
        s = AdapterSet(12, 16, TUNAConfig(), torch.Generator().manual_seed(0))
        with torch.no_grad():
            for j, a in enumerate(s):
                a.up_weight.copy_(f[f"{prefix}.{j}"])
        return s

    cur, prev = make("in.orth.cur"), [make(f"in.orth.prev{i}") for i in range(2)]
    loss = orth_loss(cur, prev, detach_previous=False)
    close(loss.reshape(1), f["out.orth"], "orthogonality term")
    loss.backward()
    for j in range(12):
        close(cur[j].up_weight.grad, f[f"out.orth.grad_cur.{j}"], f"gradient of the current W_up, block {j}")
        for i in range(2):
            close(prev[i][j].up_weight.grad, f[f"out.orth.grad_prev{i}.{j}"], f"gradient reaching stored set {i}")


def check_cosface_and_decay(f: dict[str, torch.Tensor]) -> None:
    cos, y = f["in.cos"], f["in.cos_y"].long()
    close(cosface_loss(cos, y, 20.0, 0.0).reshape(1), f["out.cosface_m0"], "CosFace loss, m = 0")
    close(cosface_loss(cos, y, 20.0, 0.3).reshape(1), f["out.cosface_m03"], "CosFace loss, m = 0.3")
    class_task = [c // 3 for c in range(9)]
    means = f["in.means"].double() * decay_factors(class_task, 2, 3, "reference")[:, None]
    close(means, f["out.decay_means"], "decayed alignment means (the code's class // (known - total))")


# ----------------------------------------------------------------------------------------------- golden tests
@pytest.mark.pins_numbers
def test_merge_matches_the_authors_emr_merge(golden):
    check_merge(golden)


@pytest.mark.pins_numbers
def test_features_and_evaluation_match_the_authors_eval_cnn(golden):
    # the reference fact behind universal="last": its adapter_id t + 1 gives the last set's features exactly
    assert torch.equal(golden["out.features"][3], golden["out.features"][2])
    assert not torch.allclose(golden["out.features"][3], golden["out.features"][4])
    check_features_and_outputs(golden)


@pytest.mark.pins_numbers
def test_orthogonality_term_and_its_gradients_match_the_authors_orth_loss(golden):
    check_orth(golden)


@pytest.mark.pins_numbers
def test_cosface_and_decayed_means_match_the_authors_code(golden):
    check_cosface_and_decay(golden)


# ----------------------------------------------------------------------------------------------- pieces
def test_emr_merge_elects_the_sign_of_the_mean_and_keeps_the_largest_agreeing_magnitude(backbone):
    sets = [AdapterSet(1, 2, replace(SMALL, bottleneck=2), torch.Generator().manual_seed(i)) for i in range(3)]
    values = [torch.tensor([[1.0, -3.0], [0.5, 2.0]]), torch.tensor([[-2.0, 1.0], [0.2, -2.0]]), torch.zeros(2, 2)]
    with torch.no_grad():
        for s, v in zip(sets, values, strict=True):
            s[0].up_weight.copy_(v)
    merged = emr_merge(sets)
    # means: [[-1/3, -2/3], [0.7/3, 0]] -> signs [[-, -], [+, -]] (0 elects -1)
    assert torch.equal(merged[0].up_weight, torch.tensor([[-2.0, -3.0], [0.5, -2.0]]))
    assert not any(p.requires_grad for p in merged.parameters())


def test_entropy_selection_is_per_row_and_takes_the_first_minimum():
    sharp, flat = torch.tensor([10.0, 0.0, 0.0]), torch.zeros(3)
    logits = torch.stack([torch.stack([flat, sharp, sharp]), torch.stack([sharp, flat, flat])])  # (2, 3, 3)
    chosen_logits, chosen = entropy_select(logits, 1e-10)
    assert chosen.tolist() == [1, 0]
    assert torch.equal(chosen_logits, torch.stack([sharp, sharp]))


def test_decay_rules_differ_as_the_module_docstring_says():
    class_task = [c // 3 for c in range(9)]
    task = decay_factors(class_task, 2, 3, "task")
    ref = decay_factors(class_task, 2, 3, "reference")
    assert torch.allclose(task, torch.tensor([0.9 + 0.1 * (c // 3 + 1) / 3 for c in range(9)], dtype=torch.float64))
    assert task[-1] == 1.0 and task[0] < task[3] < task[6]  # older tasks shrink more
    assert ref[0] == 0.9 + 0.1 / 3 and bool((ref[1:4] == 0.9).all()) and bool((ref[4:] < 0.9).all())


def test_orth_loss_detaches_the_stored_sets_unless_told_not_to():
    cur, prev = (AdapterSet(2, 4, SMALL, torch.Generator().manual_seed(i)) for i in range(2))
    with torch.no_grad():
        for p in (*cur.parameters(), *prev.parameters()):
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    orth_loss(cur, [prev]).backward()
    assert prev[0].up_weight.grad is None and cur[0].up_weight.grad is not None
    orth_loss(cur, [prev], detach_previous=False).backward()
    assert prev[0].up_weight.grad is not None


# ----------------------------------------------------------------------------------------------- the strategy
@pytest.fixture(scope="module")
def trained(backbone, tasks) -> TUNA:
    strategy = TUNA(SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    return strategy


def test_stored_sets_are_frozen_and_the_next_task_starts_from_the_last(backbone, tasks):
    s = TUNA(SMALL, ctx_for(backbone))
    s.learn_task(tasks[0])
    first = state_digest(s.stored[0])
    assert any(float(a.up_weight.abs().sum()) > 0 for a in s.stored[0])  # set 0 was trained
    assert len(s.merged) == 0  # no universal set after one task
    s.learn_task(tasks[1])
    assert state_digest(s.stored[0]) == first  # bit-identical after the next task
    assert not any(p.requires_grad for st in s.stored for p in st.parameters())
    assert state_digest(s.current) == state_digest(s.stored[1]) != first
    assert state_digest(s.merged[0]) == state_digest(emr_merge(list(s.stored)))


def test_reference_code_switch_moves_the_stored_sets_through_the_orthogonality_term(backbone, tasks):
    s = TUNA(replace(SMALL, orth_updates_old=True, reg=1.0), ctx_for(backbone))
    s.learn_task(tasks[0])
    before = [a.up_weight.detach().clone() for a in s.stored[0]]
    down = state_digest(nn.ModuleList(a for a in s.stored[0]))
    s.learn_task(tasks[1])
    assert any(not torch.equal(b, a.up_weight) for b, a in zip(before, s.stored[0], strict=True))
    assert state_digest(nn.ModuleList(a for a in s.stored[0])) != down
    assert not any(p.requires_grad for st in s.stored for p in st.parameters())


def test_statistics_are_the_class_moments_under_the_class_set(trained, tasks):
    s = trained
    for t, task in enumerate(tasks):
        with torch.no_grad():
            own = s._split_features(task.train, s.stored[t])
        for c in task.classes:
            rows = task.train.labels == c
            assert torch.allclose(s.class_mean[c], own[rows].mean(0), atol=1e-5)
            cov = torch.cov(own[rows].double().T) + 1e-4 * torch.eye(own.shape[1], dtype=torch.float64)
            assert torch.allclose(s.class_cov[c], cov.float(), atol=1e-5)


def test_alignment_trains_only_the_head_and_only_from_task_1(backbone, tasks, monkeypatch):
    calls = []
    original = TUNA._align_classifier

    def spy(self, task):
        sets = [state_digest(st) for st in self.stored]
        calls.append(task.id)
        before = self.head.weight.detach().clone()
        original(self, task)
        assert [state_digest(st) for st in self.stored] == sets
        assert not torch.equal(before, self.head.weight)

    monkeypatch.setattr(TUNA, "_align_classifier", spy)
    strategy = TUNA(SMALL, ctx_for(backbone))
    for task in tasks:
        strategy.learn_task(task)
    assert calls == [1]


def test_universal_setting_picks_the_merged_or_the_last_set(trained, test_split):
    s = trained
    with torch.no_grad():
        feats = s._all_features(next(iter(test_split.image_loader(4, augment=False)))[0])
    assert feats.shape[1] == 3  # two stored sets and the merged one
    out, _ = s.outputs_from_features(feats)
    specific, _ = entropy_select(20.0 * s.head(feats[:, :2]), 1e-10)
    expected = torch.softmax(20.0 * s.head(feats[:, 2]), 1) + torch.softmax(specific, 1)
    assert torch.allclose(out, expected, atol=1e-6)
    last = torch.softmax(20.0 * s.head(feats[:, 1]), 1) + torch.softmax(specific, 1)
    assert not torch.allclose(out, last, atol=1e-4)
    s.cfg = replace(s.cfg, universal="last")
    try:
        assert torch.allclose(s.outputs_from_features(feats[:, :2])[0], last, atol=1e-6)
    finally:
        s.cfg = SMALL


@pytest.mark.parametrize("method", ["tuna"])
def test_per_sample_predictions_do_not_depend_on_order_or_batch_size(trained, test_split, method):
    check_per_sample_predictions_ignore_order_and_batch_size(trained, test_split, n_classes=5)


def test_refuses_a_class_with_one_training_image(backbone):
    split = make_split(backbone, [0, 1], 1, seed=5)
    with pytest.raises(ClbenchError, match="2 training images"):
        TUNA(SMALL, ctx_for(backbone)).learn_task(Task(0, [0, 1], 2, split))
    assert TUNA.card.min_train_per_class == 2


def test_config_refuses_bad_values():
    for bad in ({"universal": "mean"}, {"decay_rule": "x"}, {"epochs": 0}, {"scale": 0.0}, {"ca_tmax": 0}):
        with pytest.raises(ValueError):
            TUNAConfig(**bad)
    assert PROFILES["reference-code"] == {"universal": "last", "decay_rule": "reference", "orth_updates_old": True}


def test_every_profile_is_a_valid_config_and_the_default_is_the_reference():
    from clbench.core.config import make_strategy_config

    for profile in PROFILES:
        cfg = make_strategy_config(TUNA, profile, ())
        assert (cfg == TUNAConfig()) == (profile == "default")
    assert PROFILES["quick"]["img_size"] == 112 and PROFILES["ci"]["img_size"] == 56
    assert make_strategy_config(TUNA, "reference-cifar", ()).use_orth is False  # exps/tuna_cifar.json


# ----------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("method", ["tuna"])
def test_param_formula_equals_the_counts_of_a_real_run(trained, backbone, tasks, method):
    counts = check_param_formula_equals_the_counts(trained, backbone, tasks)
    d, depth = backbone.num_features, len(backbone.model.blocks)
    adapters = depth * (2 * d * 16 + 16 + d)
    assert counts.extra["adapter_params_per_task"] == adapters
    assert counts.added_per_task == [adapters + 2 * d, adapters + 3 * d]
    assert counts.stored_per_task == [2 * (d + d * d), 3 * (d + d * d) + adapters]  # the merged set from task 1
    formula = TUNA.param_formula(SMALL, d, depth, [2, 3])
    assert formula.stored_per_task == counts.stored_per_task


def test_param_formula_counts_the_stored_sets_the_reference_code_moves(backbone):
    d, depth = 64, 4
    sound = TUNA.param_formula(SMALL, d, depth, [2, 3, 3])
    code = TUNA.param_formula(replace(SMALL, orth_updates_old=True, universal="last"), d, depth, [2, 3, 3])
    assert [c - s for c, s in zip(code.trainable_per_task, sound.trainable_per_task, strict=True)] == [
        0,
        depth * d * 16,
        2 * depth * d * 16,
    ]
    assert code.stored_per_task[1] == sound.stored_per_task[1] - depth * (2 * d * 16 + 16 + d)


def test_cost_model_counts_the_passes():
    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(10.0, 20.0), protocols=1)
    w = TUNA.card.cost(TUNAConfig(epochs=3), shape)
    assert w.b == 600 and w.f == 200 + 10 * 1 + 20 * 3 and w.f_cacheable == 0
    last = TUNA.card.cost(TUNAConfig(epochs=3, universal="last"), shape)
    assert last.f == 200 + 10 * 1 + 20 * 2
