"""ACIL (baselines/acil.py): the paper's invariant (the recursive, exemplar-free update equals the joint ridge solve
over every task so far), its refusals (memory, gamma, non-finite updates) and a checkpoint round trip. The
reference's numbers are pinned in tests/test_reference_golden.py (``check_acil``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tinytasks import features_context, gaussian_split

import clbench.layers.analytic as analytic_mod
from baselines.acil import ACIL, ACILConfig
from clbench.errors import ClbenchError
from clbench.files.safestate import SavedState
from clbench.layers.analytic import RecursiveRidge, relu_projection, ridge_solution
from clbench.methods.contract import Context, Split, Task

D = 64  # vit_micro's width


def ctx(seed: int = 3) -> Context:
    return features_context(D, seed)


def split(classes: list[int], n: int, seed: int) -> Split:
    return gaussian_split(classes, n, seed, D)


def three_tasks() -> list[Task]:
    return [Task(t, [2 * t, 2 * t + 1], 2 * t + 2, split([2 * t, 2 * t + 1], 9, seed=10 + t)) for t in range(3)]


# ----------------------------------------------------------------------------------------------- the invariant
@pytest.mark.parametrize("solver", ["auto", "recursive"])
@pytest.mark.parametrize("M, il_batch_size", [(160, 4096), (80, 5), (40, 4096), (48, 5)])
def test_recursive_update_equals_the_joint_ridge_solve_over_all_tasks(M, il_batch_size, solver):
    """ACIL's claim (Theorem 1, "absolute memorization"): after task t, with no old sample kept, W equals the ridge
    solution (X^T X + gamma I)^-1 X^T Y over the expanded features of tasks 0..t together (and, in the recursion,
    R equals (X^T X + gamma I)^-1); whatever the mini-batching, and in either form of the solver: the dual form
    throughout (M = 160: the 54 images' factors stay within the memory of R, 54 M + 54^2 <= M^2), or switching to
    the recursion part-way (M = 40, 48 < 54, and M = 80 in batches of 5)."""
    s = ACIL(ACILConfig(M=M, gamma=0.1, il_batch_size=il_batch_size, solver=solver), ctx())
    seen: list[Task] = []
    forms = []
    for task in three_tasks():
        s.learn_task(task)
        seen.append(task)
        forms.append(s.head.form)
        X = relu_projection(torch.cat([t.train.features for t in seen]).double(), s.buffer)  # (N, M)
        Y = F.one_hot(torch.cat([t.train.labels for t in seen]), task.n_seen).double()  # (N, C)
        G = X.T @ X
        joint = ridge_solution(G, X.T @ Y, 0.1)  # (M, C)
        torch.testing.assert_close(s.head.W, joint, rtol=1e-8, atol=1e-10)
        if s.head.recursive is not None:
            eye = torch.eye(M, dtype=torch.float64)
            R = s.head.recursive.R
            torch.testing.assert_close(R, torch.linalg.inv(G + 0.1 * eye), rtol=1e-8, atol=1e-10)
        logits = s.predict(seen[0].train)
        torch.testing.assert_close(logits, (X[: len(logits)] @ joint).float())
    if solver == "recursive":
        assert forms == ["recursive"] * 3
    elif (M, il_batch_size) == (160, 4096):
        assert forms == ["dual"] * 3
    elif M < 54:  # 18 images per task: dual until r M + r^2 would exceed M^2, then the recursion for good
        assert forms[0] == "dual" and forms[-1] == "recursive"
    else:  # batches of 5: the dual form's solve grows with the rows; the recursion once it is cheaper
        assert forms[0] == "dual"


def test_the_dual_form_keeps_no_sample_and_less_than_r():
    """The dual form's state: per-batch factors (r, M) whose Gram is X^T X but which are not the images' expanded
    features (each batch rotated by the eigenvectors of its X X^T), and no M x M matrix."""
    s = ACIL(ACILConfig(M=80), ctx())
    task = three_tasks()[0]
    s.learn_task(task)
    X = relu_projection(task.train.features.double(), s.buffer)  # (18, 80)
    head = s.head
    assert head.factor.shape == (18, 80) and head.chol.shape == (18, 18)
    torch.testing.assert_close(head.factor.T @ head.factor, X.T @ X, rtol=1e-10, atol=1e-10)
    gram = head.factor @ head.factor.T + head.gamma * torch.eye(18, dtype=torch.float64)
    torch.testing.assert_close(head.chol @ head.chol.T, gram, rtol=1e-10, atol=1e-10)  # the kept Cholesky factor
    assert not any(torch.allclose(row, x) or torch.allclose(row, -x) for row in head.factor for x in X[1:])
    assert max(t.numel() for t in (head.factor, head.chol, head.targets, head.W)) < 80 * 80


def test_the_buffer_is_the_reference_init_from_the_run_seed():
    """W_b ~ U(-1/sqrt(d), 1/sqrt(d)) (nn.Linear's default init), (d, M), from ctx.generator: same seed, same
    buffer; another seed, another."""
    a, b, c = (ACIL(ACILConfig(M=4000), ctx(seed)).buffer for seed in (1, 1, 2))
    assert a.shape == (D, 4000) and a.dtype == torch.float64
    assert torch.equal(a, b) and not torch.equal(a, c)
    bound = 1 / D**0.5
    assert float(a.abs().max()) <= bound and float(a.abs().max()) > 0.99 * bound
    assert abs(float(a.mean())) < 0.01 * bound


# ----------------------------------------------------------------------------------------------- refusals
def test_a_buffer_too_large_for_memory_is_refused_with_the_estimate(monkeypatch):
    monkeypatch.setattr(analytic_mod, "available_memory", lambda: 2**30)  # 1 GiB free
    with pytest.raises(ClbenchError, match=r"M=16384.*GiB.*16 M\^2") as e:
        ACIL(ACILConfig(M=16384), ctx())
    assert "fits now" in str(e.value)
    ACIL(ACILConfig(M=4096), ctx())  # 16 x 4096^2 = 256 MiB fits


@pytest.mark.parametrize("field, value", [("gamma", 0.0), ("gamma", -1.0), ("M", 0), ("il_batch_size", 0)])
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ACILConfig(**{field: value})


def test_a_non_finite_update_is_refused_asking_for_a_larger_gamma():
    head = RecursiveRidge(8, 0.1)
    X = torch.full((3, 8), float("nan"), dtype=torch.float64)
    with pytest.raises(ClbenchError, match="gamma"):
        head.fit(X, torch.eye(3, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------- state
def test_checkpoint_round_trip_continues_bit_for_bit():
    tasks = three_tasks()
    a = ACIL(ACILConfig(M=48), ctx())
    a.learn_task(tasks[0])
    saved = a.save_state()
    b = ACIL(ACILConfig(M=48), ctx(seed=99))  # another seed: the buffer must come from the state
    b.restore_state(SavedState(saved.tree, dict(saved.tensors)))
    for s in (a, b):
        s.learn_task(tasks[1])
    assert torch.equal(a.predict(tasks[2].train), b.predict(tasks[2].train))
    assert a.param_counts() == b.param_counts()


def test_a_state_of_another_width_is_refused():
    a = ACIL(ACILConfig(M=48), ctx())
    b = ACIL(ACILConfig(M=40), ctx())
    with pytest.raises(ClbenchError, match="48"):
        b.load_state_dict(a.state_dict())


def test_param_counts_follow_the_formula():
    s = ACIL(ACILConfig(M=48), ctx())
    for task in three_tasks():
        s.learn_task(task)
    p, want = s.param_counts(), ACIL.param_formula(s.cfg, D, 0, (2, 2, 2))
    assert p == want
    assert p.added_per_task == [96, 96, 96] and p.stored_per_task == [D * 48 + 48 * 48, 0, 0]
    assert p.trainable_per_task == [0, 0, 0] and p.head == 48 * 6


def test_non_finite_features_are_refused_in_the_dual_form():
    head = analytic_mod.AnalyticRidge(8, 0.1)
    X = torch.full((3, 8), float("inf"), dtype=torch.float64)
    with pytest.raises(ClbenchError, match="NaN or inf"):
        head.fit(X, torch.eye(3, dtype=torch.float64))
