"""CODA-Prompt: mechanics on the tiny random ViT (component attention, Gram-Schmidt growth, the freeze of earlier
tasks' components, the reference's schedule and ortho penalty, per-sample predictions, accounting).

Every test states an invariant from the paper / reference code and would fail if the code broke it.
"""

from __future__ import annotations

import math

import pytest
import torch
from tinytasks import ctx_for

from baselines.coda_prompt import (
    CodaPrompt,
    CodaPromptConfig,
    coda_cosine_lr,
    component_weights,
    gram_schmidt,
    ortho_penalty,
)
from clbench.core.config import make_strategy_config
from clbench.methods.contract import PER_SAMPLE, Context, RunShape, Split

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

SMALL = CodaPromptConfig(components_per_task=3, prompt_length=4, epochs=1, batch_size=8, prompt_layers="0,1,2")


@pytest.fixture(scope="module")
def trained(backbone, tasks) -> tuple[CodaPrompt, list[dict[str, torch.Tensor]]]:
    """The strategy after both tasks, and a snapshot of its state after each task."""
    strategy = CodaPrompt(SMALL, ctx_for(backbone))
    snaps = []
    for task in tasks:
        strategy.learn_task(task)
        snaps.append({k: v.detach().clone() for k, v in _state(strategy).items()})
    return strategy, snaps


def _state(self: CodaPrompt) -> dict[str, torch.Tensor]:
    c = self.components
    return {"K": c.keys, "A": c.attn, "P": c.prompts, "W": self.head.weight, "b": self.head.bias}


# ----------------------------------------------------------------------------------------------- pieces
def test_gram_schmidt_rows_are_orthonormal_to_earlier_orthonormal_rows():
    g = torch.Generator().manual_seed(0)
    first = gram_schmidt(torch.zeros(0, 12), 4, g)
    assert torch.allclose(first @ first.T, torch.eye(4), atol=1e-5)
    more = gram_schmidt(first, 3, g)
    both = torch.cat([first, more])
    assert torch.allclose(both @ both.T, torch.eye(7), atol=1e-5)
    # a zero earlier row is skipped (the reference would redraw forever), the rest still orthogonal
    with_zero = torch.cat([first, torch.zeros(1, 12)])
    new = gram_schmidt(with_zero, 2, g)
    assert torch.allclose(new @ first.T, torch.zeros(2, 4), atol=1e-5) and torch.isfinite(new).all()


def test_gram_schmidt_draws_one_normal_vector_per_row_in_order():
    """The reference draws ``randn_like`` (D,) per new row: the first new row of an empty block is that draw,
    normalised."""
    v = torch.randn(10, generator=torch.Generator().manual_seed(5))
    row = gram_schmidt(torch.zeros(0, 10), 1, torch.Generator().manual_seed(5))[0]
    assert torch.allclose(row, v / v.norm(), atol=1e-6)


def test_component_weights_are_cosines_of_the_attended_query_with_the_keys():
    g = torch.Generator().manual_seed(1)
    q, K, A = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    got = component_weights(q, K, A)
    want = torch.tensor(
        [[float(torch.cosine_similarity(q[b] * A[m], K[m], dim=0)) for m in range(5)] for b in range(3)]
    )
    assert got.shape == (3, 5) and torch.allclose(got, want, atol=1e-6)


def test_ortho_penalty_is_zero_on_orthonormal_rows_only():
    q = torch.linalg.qr(torch.randn(6, 4, generator=torch.Generator().manual_seed(2)))[0].T  # (4, 6) orthonormal
    assert float(ortho_penalty(q)) < 1e-10
    assert float(ortho_penalty(2 * q)) == pytest.approx(9 * 4 / 16, rel=1e-5)  # (4 - 1)^2 on the diagonal


def test_cosine_schedule_is_the_references():
    assert coda_cosine_lr(0.001, 0, 20) == 0.001
    assert coda_cosine_lr(0.001, 19, 20) == pytest.approx(0.001 * math.cos(0.495 * math.pi))
    assert coda_cosine_lr(0.001, 10, 20) == pytest.approx(0.001 * math.cos(99 * math.pi * 10 / (200 * 19)))
    assert coda_cosine_lr(0.001, 0, 1) == 0.001  # the reference divides by zero there


def test_config_rejects_bad_values():
    for bad in ({"prompt_length": 5}, {"prompt_layers": "1,1"}, {"components_per_task": 0}, {"ortho_mu": -1.0}):
        with pytest.raises(ValueError):
            CodaPromptConfig(**bad)


# ----------------------------------------------------------------------------------------------- training
def test_prefixes_are_the_weighted_component_sums_split_into_keys_and_values(trained, test_split):
    strategy, _ = trained
    q = test_split.features[:4].clone()
    prefixes, penalty = strategy.prefixes(q)
    c = strategy.components
    assert len(prefixes) == 3 and float(penalty) == 0.0  # ortho_mu = 0: no penalty
    for i, pre in enumerate(prefixes):
        alpha = component_weights(q, c.keys[i], c.attn[i])
        prompt = torch.einsum("bk,kld->bld", alpha, c.prompts[i])
        assert pre.shape == (4, 2, 2, 64)
        assert torch.allclose(pre[:, 0], prompt[:, :2]) and torch.allclose(pre[:, 1], prompt[:, 2:])


def test_each_task_adds_its_components_and_earlier_ones_stay_frozen(trained):
    strategy, (after0, after1) = trained
    assert after0["K"].shape[1] == 3 and after1["K"].shape[1] == 6  # components_per_task per task
    for name in ("K", "A", "P"):
        assert torch.equal(after1[name][:, :3], after0[name])  # task 0's components untouched in task 1
    # the head's task-0 rows get no gradient (their logits are -inf in task 1's loss, no weight decay)
    assert torch.equal(after1["W"][:2], after0["W"]) and torch.equal(after1["b"][:2], after0["b"])


def test_training_moves_the_new_components_and_the_loss_falls(backbone, tasks):
    logs: list[str] = []
    ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=logs.append)
    strategy = CodaPrompt(CodaPromptConfig(**{**SMALL.__dict__, "epochs": 4, "lr": 0.01}), ctx)
    grown = {}
    original = strategy.components.grow

    def spy(n_new, generator):
        original(n_new, generator)
        grown["K"] = strategy.components.keys.detach().clone()
        grown["P"] = strategy.components.prompts.detach().clone()

    strategy.components.grow = spy  # type: ignore[method-assign]
    strategy.learn_task(tasks[0])
    c = strategy.components
    assert not torch.allclose(c.keys, grown["K"]) and not torch.allclose(c.prompts, grown["P"])
    # the new components start orthonormal (Gram-Schmidt), per block
    for i in range(3):
        flat = grown["P"][i].reshape(3, -1)
        assert torch.allclose(flat @ flat.T, torch.eye(3), atol=1e-5)
    losses = [float(line.rsplit("loss ", 1)[1]) for line in logs if "loss" in line]
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_ortho_penalty_enters_the_loss_over_every_component_in_use(trained, test_split):
    strategy, _ = trained
    cfg = strategy.cfg
    try:
        strategy.cfg = CodaPromptConfig(**{**cfg.__dict__, "ortho_mu": 0.5})
        _, penalty = strategy.prefixes(test_split.features[:2].clone(), frozen=3)
    finally:
        strategy.cfg = cfg
    c = strategy.components
    want = sum(
        0.5 * (ortho_penalty(c.keys[i]) + ortho_penalty(c.attn[i]) + ortho_penalty(c.prompts[i].reshape(6, -1)))
        for i in range(3)
    )
    assert torch.allclose(penalty, want)


def test_frozen_components_get_no_gradient(trained, test_split):
    strategy, _ = trained
    prefixes, _ = strategy.prefixes(test_split.features[:2].clone(), frozen=3)
    sum(p.sum() for p in prefixes).backward()
    grad = strategy.components.prompts.grad
    strategy.components.zero_grad(set_to_none=True)
    assert grad is not None and float(grad[:, :3].abs().sum()) == 0 and float(grad[:, 3:].abs().sum()) > 0


# ----------------------------------------------------------------------------------------------- prediction
def test_per_sample_predictions_depend_on_the_image_only(trained, test_split):
    strategy, _ = trained
    full = strategy.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 5) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3, 5, 14, 2]
    part = strategy.predict(test_split.subset(rows), PER_SAMPLE)
    assert torch.allclose(part, full[rows], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        strategy.predict(test_split, "reference")


def test_the_query_chooses_the_prompt(trained, test_split):
    """The same images with other queries give other logits: the prompt is assembled from the query."""
    strategy, _ = trained
    full = strategy.predict(test_split, PER_SAMPLE)
    other = Split(
        test_split.source,
        test_split.indices,
        test_split.labels,
        test_split.features.flip(0),
        test_split.eval_transform,
        test_split.train_transform,
    )
    assert not torch.allclose(strategy.predict(other, PER_SAMPLE), full, atol=1e-4)


# ----------------------------------------------------------------------------------------------- accounting
def test_param_formula_equals_the_counts_of_a_real_run(trained, backbone, tasks):
    strategy, _ = trained
    d, depth = backbone.num_features, len(backbone.model.blocks)
    formula = CodaPrompt.param_formula(strategy.cfg, d, depth, tuple(len(t.classes) for t in tasks))
    counts = strategy.param_counts()
    assert formula.added_per_task == counts.added_per_task
    assert formula.trainable_per_task == counts.trainable_per_task
    assert formula.head == counts.head
    c = strategy.components
    assert sum(counts.added_per_task) == c.keys.numel() + c.attn.numel() + c.prompts.numel() + counts.head
    # 3 blocks x 3 components x (2 d + L d), plus the task's head rows
    assert counts.added_per_task[0] == 3 * 3 * (2 * 64 + 4 * 64) + 2 * 65


def test_cost_model_counts_the_passes():
    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(10.0, 20.0))
    cached = CodaPrompt.card.cost(CodaPromptConfig(epochs=3, query="cached"), shape)
    assert cached.b == 600 and cached.f == 220 + 30 and cached.f_cacheable == 220
    assert CodaPrompt.card.cost(CodaPromptConfig(epochs=3), shape).f == cached.f + 600  # augmented queries


def test_profiles_are_valid_configs():
    for profile in ("quick", "ci"):
        assert make_strategy_config(CodaPrompt, profile, ()) != CodaPromptConfig()
    assert CodaPrompt.profiles["ci"]["img_size"] == 56
