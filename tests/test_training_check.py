"""The under-training detector (clbench.methods.training_check): relative change of what the optimizers stepped, the
reset
share of the first task's predictions, and the record's ``training_warning``."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MICRO

from clbench.methods import training_check
from clbench.methods.shared import TrainingTrace, optimizer_step
from clbench.records.results import load_record
from clbench.run.harness import RunConfig, run


def test_trace_measures_only_what_an_optimizer_stepped():
    moved = torch.nn.Parameter(torch.ones(4))
    untouched = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([moved], lr=0.5)
    with TrainingTrace.active() as trace:
        for _ in range(2):  # the copy is the value before the first step, not before the last
            optimizer_step(opt, (moved + 0 * untouched).sum(), "test")
    assert trace.relative_change() == pytest.approx(1.0)  # ||(0,0,0,0) - (1,1,1,1)|| / ||(1,1,1,1)||
    assert untouched.grad is None or float(untouched.grad.abs().sum()) == 0.0
    with TrainingTrace.active() as trace:
        pass
    assert trace.relative_change() is None  # nothing trained


def test_zero_initialised_parts_that_move_count_as_moved():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=1.0)
    with TrainingTrace.active() as trace:
        optimizer_step(opt, p.sum(), "test")
    assert math.isinf(trace.relative_change())


def test_warning_thresholds():
    assert training_check.warning(0.0, [0.5]) is not None  # the reset share decides where it was measured
    assert training_check.warning(0.019, [0.5]) is not None
    assert training_check.warning(0.02, [0.0]) is None
    assert training_check.warning(None, [None, 5e-4, 1e-4]) is not None
    assert training_check.warning(None, [None, 2e-3]) is None
    assert training_check.warning(None, [None, None]) is None  # nothing trained: nothing to warn about


def test_untrained_config_sets_epochs_to_zero_without_touching_the_original():
    from baselines.l2p import L2PConfig

    cfg = L2PConfig()
    twin = training_check.untrained_config(cfg)
    assert twin.epochs == 0 and cfg.epochs == L2PConfig().epochs
    assert training_check.untrained_config(object()) is None


def _micro_run(tmp_path, name, **overrides):
    """L2P's ci profile on the micro ViT, two tasks of 18 classes: the detector reads the first task (its movement
    and its twin's predictions), so the default six tasks proved no more in three times the time."""
    cfg = RunConfig(
        strategy="l2p",
        profile="ci",
        precision="fp32",
        out=str(tmp_path / name),
        overrides=tuple(overrides.items()),
        init_cls=18,
        increment=18,
        **MICRO,
    )
    run(cfg)
    return load_record(tmp_path / name)


def test_detector_fires_when_nothing_moves_and_is_silent_when_training_moves(tmp_path):
    # one epoch instead of the ci profile's four: the detector reads movement and the twin's predictions, which the
    # first epoch already decides (lr 0 itself is refused by the config)
    frozen = _micro_run(tmp_path, "lr0", lr="1e-12", epochs="1")
    assert frozen.training_movement[0] < 1e-9
    assert frozen.reset_share == 0.0  # the twin starts from the same initial values: the same predictions
    assert frozen.training_warning is not None and "barely" in frozen.training_warning

    trained = _micro_run(tmp_path, "trained", lr="0.05", epochs="1")
    assert trained.training_movement[0] > training_check.CHANGE_MIN
    assert trained.reset_share > training_check.RESET_SHARE_MIN
    assert trained.training_warning is None


@pytest.mark.full
def test_detector_leaves_the_run_unchanged(tmp_path):
    """The untrained twin draws from copies of the RNG states: the run's matrix equals one without the twin. Full tier:
    the default tier carries the twin's isolation with
    test_detector_fires_when_nothing_moves_and_is_silent_when_training_moves (its frozen run's reset share is 0: same
    initial values) and tests/test_contract.py::test_same_seed_same_matrix."""
    with_twin = _micro_run(tmp_path, "a", lr="0.05")
    original = training_check.reset_share
    try:
        training_check.reset_share = lambda *a, **k: None
        without = _micro_run(tmp_path, "b", lr="0.05")
    finally:
        training_check.reset_share = original
    assert with_twin.accuracy_matrix == without.accuracy_matrix
    assert without.reset_share is None and with_twin.reset_share is not None
