import math

import numpy as np
import pytest

from clbench.evaluation import metrics


def test_forgetting_hand_computed():
    # R[t][j]: task 0 goes 80 -> 90 -> 60, task 1 goes 70 -> 50.
    r = [[80.0], [90.0, 70.0], [60.0, 50.0, 40.0]]
    # max earlier minus final: task0 max(80, 90) - 60 = 30; task1 70 - 50 = 20 -> mean 25
    assert metrics.forgetting(r) == pytest.approx(25.0)
    # first minus final: task0 80 - 60 = 20; task1 70 - 50 = 20 -> 20
    assert metrics.forgetting_first_last(r) == pytest.approx(20.0)


def test_forgetting_single_task_is_nan():
    assert math.isnan(metrics.forgetting([[50.0]]))


def test_forgetting_rejects_ragged_rows():
    with pytest.raises(ValueError):
        metrics.forgetting([[1.0], [1.0]])


def test_curve_metrics_and_task_row():
    assert metrics.avg_acc([50.0, 70.0, 90.0]) == pytest.approx(70.0)
    assert metrics.last_acc([50.0, 70.0, 90.0]) == 90.0
    pred = np.array([0, 1, 2, 2, 3, 0])
    y = np.array([0, 1, 2, 3, 3, 1])
    task = np.array([0, 0, 1, 1, 1, 0])
    assert metrics.task_row(pred, y, task, 2) == pytest.approx([2 / 3 * 100, 2 / 3 * 100])
    assert metrics.accuracy(pred, y) == pytest.approx(4 / 6 * 100)


def test_topk():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.05]])
    assert metrics.topk_accuracy(logits, np.array([0, 2]), k=1) == 0.0
    assert metrics.topk_accuracy(logits, np.array([0, 2]), k=2) == 50.0
    assert metrics.topk_accuracy(logits, np.array([0, 2]), k=5) == 100.0


def test_bwt_equals_hand_computed_values():
    r = [[80.0], [60.0, 90.0], [50.0, 70.0, 85.0]]
    # (R[2][0] - R[0][0] + R[2][1] - R[1][1]) / 2 = (50 - 80 + 70 - 90) / 2
    assert metrics.bwt(r) == pytest.approx(-25.0)
    assert metrics.bwt(r) == pytest.approx(-metrics.forgetting_first_last(r))
    assert math.isnan(metrics.bwt([[70.0]]))  # one task: nothing to transfer backwards


def test_ece_equals_hand_computed_values():
    conf = np.array([0.95, 0.95, 0.95, 0.95, 0.55, 0.55, 0.10, 1.0])
    correct = np.array([1, 1, 1, 0, 1, 0, 0, 1])
    # bins of width 1/15: 0.95 and 1.0 share bin 15 ((14/15, 1]); 0.55 bin 9; 0.10 bin 2
    # bin 15: 5 images, accuracy 4/5, confidence (4 * .95 + 1) / 5 = .96 -> |.8 - .96| * 5 = 0.8
    # bin 9: |.5 - .55| * 2 = 0.1; bin 2: |0 - .1| * 1 = 0.1; ECE = (0.8 + 0.1 + 0.1) / 8 = 0.125 -> 12.5 points
    assert metrics.ece(conf, correct) == pytest.approx(12.5)


def test_ece_of_a_calibrated_classifier_is_near_zero_and_of_an_overconfident_one_is_not():
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.2, 1.0, 20000)
    calibrated = rng.random(conf.shape) < conf  # right with the probability it states
    assert metrics.ece(conf, calibrated) < 1.0
    overconfident = rng.random(conf.shape) < conf - 0.15
    assert metrics.ece(conf, overconfident) == pytest.approx(15.0, abs=1.5)
