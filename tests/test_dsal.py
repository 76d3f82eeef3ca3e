"""DS-AL (baselines/dsal.py): the paper's invariants (the main stream is ACIL: the joint ridge solve on ReLU(X); the
compensation stream is the joint ridge solve on tanh(X) of the cleansed residues, zero on earlier classes), the two
residue modes, refusals and a checkpoint round trip. The reference's numbers are pinned in
tests/test_reference_golden.py (``check_dsal``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tinytasks import features_context, gaussian_split

import clbench.layers.analytic as analytic_mod
from baselines.acil import ACIL, ACILConfig
from baselines.dsal import DSAL, DSALConfig
from clbench.errors import ClbenchError
from clbench.files.safestate import SavedState
from clbench.layers.analytic import ridge_solution
from clbench.methods.contract import Context, Split, Task

D, M = 64, 40  # vit_micro's width; a buffer narrower than the 3 x 24 training images, so residues are not ~0


def ctx(seed: int = 3) -> Context:
    return features_context(D, seed)


def split(classes: list[int], n: int, seed: int) -> Split:
    return gaussian_split(classes, n, seed, D, noise=1.5, interleave=True)  # classes interleaved in arrival order


def three_tasks() -> list[Task]:
    return [Task(t, [2 * t, 2 * t + 1], 2 * t + 2, split([2 * t, 2 * t + 1], 12, seed=20 + t)) for t in range(3)]


def stacked_ridge(parts: list[tuple[torch.Tensor, torch.Tensor]], gamma: float, C: int) -> torch.Tensor:
    """The joint ridge solution over (X_s, Y_s) of every task, Y_s padded to C columns."""
    X = torch.cat([x for x, _ in parts])
    Y = torch.cat([F.pad(y, (0, C - y.shape[1])) for _, y in parts])
    return ridge_solution(X.T @ X, X.T @ Y, gamma)


# ----------------------------------------------------------------------------------------------- the invariants
@pytest.mark.parametrize("il_batch_size", [4096, 7])
def test_both_streams_equal_their_joint_ridge_solves(il_batch_size):
    """Main stream: W_main = joint ridge of (ReLU(X), Y) over all tasks (ACIL). Compensation stream (paper,
    ``residue="task"``): W_comp = joint ridge of (tanh(X), Y_comp) where each task's residue Y - ReLU(X) W_main is
    taken from the main stream after that task, with the earlier classes' columns zero (previous label
    cleansing). Whatever the mini-batching."""
    s = DSAL(DSALConfig(M=M, gamma=0.1, gamma_comp=0.3, il_batch_size=il_batch_size), ctx())
    main, comp = [], []
    for task in three_tasks():
        s.learn_task(task)
        X = s.expand(task.train.features)
        Y = F.one_hot(task.train.labels, task.n_seen).double()
        residue = Y - F.relu(X) @ s.main.W
        if task.id > 0:
            assert residue[:, : task.classes[0]].abs().max() > 0.01  # there is something to cleanse
        residue[:, : task.classes[0]] = 0
        main.append((F.relu(X), Y))
        comp.append((torch.tanh(X), residue))
        torch.testing.assert_close(s.main.W, stacked_ridge(main, 0.1, task.n_seen), rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(s.comp.W, stacked_ridge(comp, 0.3, task.n_seen), rtol=1e-8, atol=1e-10)


def test_without_compensation_dsal_is_acil_on_the_same_buffer():
    """C = 0: the logits are the main stream's, i.e. ACIL's with the same buffer weights."""
    d = DSAL(DSALConfig(M=M, compensation_ratio=0.0), ctx())
    a = ACIL(ACILConfig(M=M), ctx())
    a.buffer = d.buffer.clone()
    tasks = three_tasks()
    for task in tasks:
        d.learn_task(task)
        a.learn_task(task)
    torch.testing.assert_close(d.predict(tasks[0].train), a.predict(tasks[0].train), rtol=1e-6, atol=1e-6)
    d2 = DSAL(DSALConfig(M=M, compensation_ratio=1.5), ctx())
    for task in tasks:
        d2.learn_task(task)
    C_logits = d2.predict(tasks[0].train) - a.predict(tasks[0].train)  # = 1.5 tanh(X) W_comp
    want = (1.5 * torch.tanh(d2.expand(tasks[0].train.features)) @ d2.comp.W).float()
    torch.testing.assert_close(C_logits, want, rtol=1e-4, atol=1e-5)


def test_batch_residue_differs_from_task_residue_only_when_a_task_spans_batches():
    whole = [DSAL(DSALConfig(M=M, residue=r), ctx()) for r in ("task", "batch")]
    split_up = DSAL(DSALConfig(M=M, residue="batch", il_batch_size=5), ctx())
    tasks = three_tasks()
    for task in tasks:
        for s in (*whole, split_up):
            s.learn_task(task)
    torch.testing.assert_close(whole[0].comp.W, whole[1].comp.W, rtol=1e-8, atol=1e-10)  # one batch: same
    torch.testing.assert_close(whole[0].main.W, split_up.main.W, rtol=1e-8, atol=1e-10)  # the main stream: exact
    assert (whole[0].comp.W - split_up.comp.W).abs().max() > 1e-3  # the reference's per-batch residue


# ----------------------------------------------------------------------------------------------- refusals
def test_a_buffer_too_large_for_memory_is_refused_with_the_estimate(monkeypatch):
    monkeypatch.setattr(analytic_mod, "available_memory", lambda: 2**30)  # 1 GiB free
    with pytest.raises(ClbenchError, match=r"DS-AL with M=8192.*2 R matri.*32 M\^2"):
        DSAL(DSALConfig(), ctx())
    DSAL(DSALConfig(M=2048), ctx())  # 32 x 2048^2 = 128 MiB fits


@pytest.mark.parametrize(
    "field, value",
    [("gamma", 0.0), ("gamma_comp", -0.1), ("M", 0), ("residue", "epoch"), ("compensation_ratio", np.inf)],
)
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        DSALConfig(**{field: value})


# ----------------------------------------------------------------------------------------------- state
def test_checkpoint_round_trip_continues_bit_for_bit():
    tasks = three_tasks()
    a = DSAL(DSALConfig(M=M), ctx())
    a.learn_task(tasks[0])
    saved = a.save_state()
    b = DSAL(DSALConfig(M=M), ctx(seed=99))
    b.restore_state(SavedState(saved.tree, dict(saved.tensors)))
    for s in (a, b):
        s.learn_task(tasks[1])
    assert torch.equal(a.predict(tasks[2].train), b.predict(tasks[2].train))


def test_param_counts_follow_the_formula():
    s = DSAL(DSALConfig(M=M), ctx())
    for task in three_tasks():
        s.learn_task(task)
    p = s.param_counts()
    assert p == DSAL.param_formula(s.cfg, D, 0, (2, 2, 2))
    assert p.added_per_task == [2 * M * 2] * 3 and p.stored_per_task == [D * M + 2 * M * M, 0, 0]
    assert p.head == 2 * M * 6 and p.trainable_per_task == [0, 0, 0]
