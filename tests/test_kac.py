"""KAC's Kolmogorov-Arnold classifier (``clbench/layers/kan.py``) as the head of the prompt methods (``--set
head=kac`` of L2P, DualPrompt and CODA-Prompt): its start and growth, the mechanics of training it on the micro ViT
(the loss falls, the head moves, the earlier classes' rows stay put while the shared LayerNorm keeps learning) and
its parameter accounting. The numbers of its forward and backward pass are pinned to the authors' ``KACLayer`` in
``tests/test_reference_golden.py`` (``check_kac_head``)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from tinytasks import check_param_formula_after_a_real_run, check_param_formula_equals_the_counts

from baselines.coda_prompt import CodaPrompt, CodaPromptConfig
from baselines.dualprompt import DualPrompt, DualPromptConfig
from baselines.l2p import L2P, L2PConfig
from clbench.layers.heads import LinearHead, build_head, head_size
from clbench.layers.kan import KAC_GRIDS, KACHead
from clbench.methods.contract import Context

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

TASK_CLASSES = ([0, 1], [2, 3])
EPOCHS = 4
METHODS = {  # small but trainable settings on the micro ViT (4 blocks, d = 64)
    "l2p": (L2P, L2PConfig(head="kac", epochs=EPOCHS, batch_size=4, eval_batch_size=4, lr=0.01)),
    "dualprompt": (
        DualPrompt,
        DualPromptConfig(head="kac", epochs=EPOCHS, batch_size=4, eval_batch_size=4, lr=0.01, pool_size=2),
    ),
    "coda_prompt": (
        CodaPrompt,
        CodaPromptConfig(head="kac", epochs=EPOCHS, batch_size=4, lr=0.01, components_per_task=2, prompt_layers="0,1"),
    ),
}


def logging_ctx(backbone, lines: list[str]) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lines.append)


def epoch_losses(lines: list[str], task: int) -> list[float]:
    pattern = re.compile(rf"task {task} epoch \d+/\d+: loss (-?[\d.]+)")
    return [float(m.group(1)) for line in lines if (m := pattern.search(line))]


def test_kac_head_starts_at_zero_and_grows_zero_rows():
    head = build_head("kac", 8)
    assert isinstance(head, KACHead) and head.n_classes == 0
    head.grow(3)
    x = torch.randn(5, 8)
    assert torch.equal(head(x), torch.zeros(5, 3))  # SplineLinear(init_scale=0): every logit 0 at first
    with torch.no_grad():
        head.weight.copy_(torch.randn(3, 8 * KAC_GRIDS))
    before = head.weight.detach().clone()
    head.grow(5)
    assert torch.equal(head.weight[:3], before) and torch.equal(head.weight[3:], torch.zeros(2, 8 * KAC_GRIDS))
    assert (head.per_class, head.shared, head_size(head)) == (8 * KAC_GRIDS, 16, 5 * 8 * KAC_GRIDS + 16)
    with pytest.raises(ValueError, match="never shrinks"):
        head.grow(4)
    linear = build_head("linear", 8)
    assert isinstance(linear, LinearHead) and (linear.per_class, linear.shared) == (9, 0)


def test_kac_basis_is_a_gaussian_bump_per_grid_point():
    """Each coordinate z of LayerNorm(x) gives exp(-((z - g) / h)^2) for g on linspace(-2, 2, 16), h = 4 / 15."""
    head = KACHead(4)
    x = torch.tensor([[0.3, -1.2, 2.0, 0.7]])
    z = F.layer_norm(x, (4,))
    grid = torch.linspace(-2, 2, 16)
    want = torch.exp(-(((z[0, :, None] - grid) / (4 / 15)) ** 2)).flatten()
    torch.testing.assert_close(head.basis(x)[0], want)


@pytest.mark.parametrize("method", list(METHODS))
def test_kac_head_trains_in_the_prompt_methods(backbone, tasks, method):
    """The masked loss falls over the epochs of each task; the LayerNorm and the new classes' rows move, the
    earlier classes' rows do not (their logits are masked out of the loss and Adam has no weight decay)."""
    cls, cfg = METHODS[method]
    lines: list[str] = []
    s = cls(cfg, logging_ctx(backbone, lines))
    assert isinstance(s.head, KACHead)
    norm0 = [p.detach().clone() for p in s.head.norm.parameters()]
    s.learn_task(tasks[0])
    first = epoch_losses(lines, 0)
    assert len(first) == EPOCHS and first[-1] < first[0], first
    assert s.head.n_classes == 2 and float(s.head.weight.abs().sum()) > 0  # the zero rows learnt
    assert any(not torch.equal(p, p0) for p, p0 in zip(s.head.norm.parameters(), norm0, strict=True))
    rows0 = s.head.weight.detach().clone()
    norm1 = [p.detach().clone() for p in s.head.norm.parameters()]
    s.learn_task(tasks[1])
    second = epoch_losses(lines, 1)
    assert len(second) == EPOCHS and second[-1] < second[0], second
    assert torch.equal(s.head.weight[:2], rows0)  # the earlier classes' rows are where task 0 left them
    assert float(s.head.weight[2:].abs().sum()) > 0
    assert any(not torch.equal(p, p1) for p, p1 in zip(s.head.norm.parameters(), norm1, strict=True))
    logits = s.predict(tasks[1].train)
    assert logits.shape == (len(tasks[1].train), 4) and torch.isfinite(logits).all()
    counts = check_param_formula_equals_the_counts(s, backbone, tasks)
    d = backbone.num_features
    assert counts.head == head_size(s.head) == 4 * d * KAC_GRIDS + 2 * d  # four classes' rows and the LayerNorm


def test_l2p_kac_param_formula_matches_a_real_run(tmp_path):
    """L2P counts its parameters from its modules (DualPrompt and CODA-Prompt from the formula, checked above), so
    a real run through the harness pins the formula's KAC rows and LayerNorm."""
    check_param_formula_after_a_real_run(tmp_path, "l2p", (("head", "kac"),))


@pytest.mark.parametrize("config", [L2PConfig, DualPromptConfig, CodaPromptConfig])
def test_unknown_head_is_refused_naming_the_field(config):
    with pytest.raises(ValueError, match="head must be one of 'linear', 'kac'"):
        config(head="mlp")


def test_a_checkpoint_restores_the_kac_head(backbone, tasks, test_split):
    """The head is saved and rebuilt from the checkpoint (``state_types``) and predicts the same logits."""
    cls, cfg = METHODS["l2p"]
    s = cls(cfg, logging_ctx(backbone, []))
    s.learn_task(tasks[0])
    restored = cls(cfg, logging_ctx(backbone, []))
    restored.restore_state(s.save_state())
    assert isinstance(restored.head, KACHead) and restored.head.width == s.head.width
    assert torch.equal(restored.predict(test_split), s.predict(test_split))
