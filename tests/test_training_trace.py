"""clbench.methods.shared.TrainingTrace: the first and last epoch's mean loss and the relative parameter change of every
optimiser a ``learn_task`` steps through ``optimizer_step``, stored by the harness as ``diagnostics["training"]``."""

from __future__ import annotations

import pytest
import torch

from clbench.methods.shared import TrainingTrace, optimizer_step


def test_epochs_are_the_steps_sharing_a_label_and_the_change_is_over_all_parameters():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))  # norm 5
    zero = torch.nn.Parameter(torch.zeros(2))  # a zero-initialised part counts in the whole
    opt = torch.optim.SGD([w, zero], lr=0.5)
    with TrainingTrace.active() as trace:
        for epoch, losses in enumerate([(4.0, 2.0), (1.0, 1.0, 1.0)]):
            for value in losses:
                pull = (zero * torch.tensor([2.0, 0.0])).sum()  # gradient (2, 0) on zero, none on w
                loss = (w * 0).sum() + pull - pull.detach() + value  # its value: ``value``
                optimizer_step(opt, loss, f"epoch {epoch}")
    (s,) = trace.summary()
    assert s["steps"] == 5 and s["epochs"] == 2 and s["params"] == 4
    assert s["loss_first_epoch"] == pytest.approx(3.0) and s["loss_last_epoch"] == pytest.approx(1.0)
    assert s["param_change_abs"] == pytest.approx(5.0)  # zero moved by 5 steps x 0.5 x 2 = (5, 0)
    assert s["param_change"] == pytest.approx(1.0)  # / ||init|| = 5


def test_no_trace_outside_the_block_and_one_entry_per_optimiser():
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    oa, ob = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
    optimizer_step(oa, (a * 2).sum(), "before")  # no active trace: nothing recorded, nothing fails
    with TrainingTrace.active() as trace:
        optimizer_step(oa, (a * 2).sum(), "main epoch 0")
        optimizer_step(ob, (b * 3).sum(), "alignment epoch 0")
    assert [s["steps"] for s in trace.summary()] == [1, 1]
    assert TrainingTrace.current() is None
    with TrainingTrace.active() as empty:
        pass
    assert empty.summary() == []


def test_an_optimiser_made_after_another_is_freed_is_its_own_entry():
    """MOS frees its adapter optimiser before making the alignment one; CPython may give the new one the freed id, which
    once merged the two entries (seen as a resumed MOS run whose trace differed from the uninterrupted one)."""
    with TrainingTrace.active() as trace:
        for phase, steps in (("main", 1), ("alignment", 2)):
            p = torch.nn.Parameter(torch.ones(3))
            opt = torch.optim.SGD([p], lr=0.1)  # the previous phase's optimiser is gone by now
            for _ in range(steps):
                optimizer_step(opt, (p * 2).sum(), f"{phase} epoch 0")
            del opt, p
    assert [(s["steps"], s["epochs"]) for s in trace.summary()] == [(1, 1), (2, 1)]


def test_epoch_log_logs_each_epochs_mean_loss_per_image_advances_and_counts_steps():
    """clbench.methods.shared.EpochLog, the trained methods' loop bookkeeping: the progress bar over all steps, one line
    per
    epoch with the mean loss per image (batches weighted by their size), after the epoch's own code."""
    from types import SimpleNamespace

    from clbench.methods.shared import EpochLog

    lines, bars, advanced = [], [], []
    ctx = SimpleNamespace(
        log=lines.append, progress=lambda label, total: bars.append((label, total)) or advanced.append
    )
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=0.1)
    log = EpochLog(ctx, "M task 0", 2, 2)
    for epoch in log.epochs():
        for value, n in [(1.0, 3), (3.0, 1)] if epoch == 0 else [(2.0, 2), (2.0, 2)]:
            assert log.step(opt, (w * 0).sum() + value, n, f"task 0 epoch {epoch}") == value
        lines.append(f"epoch {epoch} body done")  # e.g. the schedule's step: before the epoch's line
    assert bars == [("M task 0", 4)] and advanced == [1, 1, 1, 1] and log.steps == 4
    assert lines == [
        "epoch 0 body done",
        "  M task 0 epoch 1/2: loss 1.5000",  # (1 x 3 + 3 x 1) / 4
        "epoch 1 body done",
        "  M task 0 epoch 2/2: loss 2.0000",
    ]
    quiet = EpochLog(SimpleNamespace(log=lines.append, progress=None), "M", 1, 1)  # no progress bar: none made
    assert quiet.advance is None
