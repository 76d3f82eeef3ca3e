"""Every metric of clbench.evaluation.metrics against matrices computed by hand, one case of its definition each: a task
that
improves after it was learnt (forgetting's max runs over the evaluations *before* the last, so it can be negative;
first-minus-last and BWT use the evaluation right after learning), ties in the best earlier accuracy, a single task
(nothing to forget or transfer), unequal task sizes (A_t weights tasks by their images, unlike a mean of R[t]), and
ECE's bin edges. A change to any definition changes one of these numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clbench.evaluation import metrics

# R[t][j]. Task 0: 50 after learning it, 70 after task 1, 80 at the end (it improves after it was learnt).
# Task 1: 60, then 40 at the end. Task 2: 90 (the last task: never "old").
IMPROVES = [[50.0], [70.0, 60.0], [80.0, 40.0, 90.0]]


def test_forgetting_takes_the_best_evaluation_before_the_last():
    # task 0: max(50, 70) - 80 = -10 (the final 80 is not among the "earlier" evaluations); task 1: 60 - 40 = 20
    assert metrics.forgetting(IMPROVES) == pytest.approx((-10 + 20) / 2)


def test_first_minus_last_and_bwt_use_the_evaluation_right_after_learning():
    # task 0: 50 - 80 = -30; task 1: 60 - 40 = 20
    assert metrics.forgetting_first_last(IMPROVES) == pytest.approx((-30 + 20) / 2)
    assert metrics.bwt(IMPROVES) == pytest.approx((30 - 20) / 2)


def test_ties_in_the_best_earlier_accuracy():
    r = [[70.0], [70.0, 50.0], [70.0, 50.0, 30.0], [40.0, 50.0, 10.0, 80.0]]
    # task 0: max(70, 70, 70) - 40 = 30; task 1: max(50, 50) - 50 = 0; task 2: 30 - 10 = 20
    assert metrics.forgetting(r) == pytest.approx(50 / 3)
    # first minus last: 70 - 40, 50 - 50, 30 - 10
    assert metrics.forgetting_first_last(r) == pytest.approx(50 / 3)
    assert metrics.bwt(r) == pytest.approx(-50 / 3)


def test_a_single_task_has_nothing_to_forget_or_transfer():
    assert math.isnan(metrics.forgetting([[42.0]]))
    assert math.isnan(metrics.forgetting_first_last([[42.0]]))
    assert math.isnan(metrics.bwt([[42.0]]))
    assert metrics.last_acc([42.0]) == metrics.avg_acc([42.0]) == 42.0


def test_the_accuracy_matrix_shape_is_checked():
    with pytest.raises(ValueError, match="row 1 has 1 entries, expected 2"):
        metrics.bwt([[1.0], [2.0]])
    with pytest.raises(ValueError):
        metrics.forgetting_first_last([[1.0, 2.0]])


def test_unequal_task_sizes_weight_by_images():
    """Task 0 has 1 test image, task 1 has 4: A_1 is 4/5 right here, not the mean of R[1] (50 and 75)."""
    target = np.array([0, 1, 1, 2, 2])
    pred = np.array([9, 1, 1, 2, 9])  # task 0's one image wrong; task 1: 3 of 4 right
    task = np.array([0, 1, 1, 1, 1])
    row = metrics.task_row(pred, target, task, 2)
    assert row == pytest.approx([0.0, 75.0])
    assert metrics.accuracy(pred, target) == pytest.approx(60.0)  # 3 of 5, not mean(0, 75) = 37.5
    assert math.isnan(metrics.accuracy(np.array([]), np.array([])))
    # a task with no test image yet gives NaN in its row
    assert math.isnan(metrics.task_row(pred, target, task, 3)[2])
    assert metrics.avg_acc([60.0, 20.0, 10.0]) == pytest.approx(30.0)
    assert metrics.last_acc([60.0, 20.0, 10.0]) == 10.0


def test_topk_counts_the_target_among_the_k_highest():
    logits = np.array([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 0.0]])
    target = np.array([2, 2, 0])
    assert metrics.topk_accuracy(logits, target, k=1) == 0.0
    assert metrics.topk_accuracy(logits, target, k=2) == pytest.approx(100 / 3)  # row 1
    assert metrics.topk_accuracy(logits, target, k=3) == pytest.approx(100.0)
    assert math.isnan(metrics.topk_accuracy(np.zeros((0, 4)), np.zeros(0, int)))


def test_ece_bin_edges_and_weights():
    # 15 bins of (0, 1]: a confidence of exactly 2/15 falls in bin 1 ((1/15, 2/15]), 0 in bin 0
    conf = np.array([2 / 15, 2 / 15 + 1e-9, 0.0, 0.0])
    correct = np.array([1.0, 0.0, 0.0, 1.0])
    # bin 1: |1 - 2/15| * 1; bin 2: |0 - (2/15 + 1e-9)| * 1; bin 0: |0.5 - 0| * 2 -> sum / 4 images
    hand = (13 / 15 + 2 / 15 + 1.0) / 4 * 100
    assert metrics.ece(conf, correct) == pytest.approx(hand, abs=1e-6)
    # gaps of opposite sign inside one bin cancel (the bin's mean accuracy against its mean confidence)
    assert metrics.ece(np.array([0.5, 0.5]), np.array([1.0, 0.0])) == pytest.approx(0.0)
    assert math.isnan(metrics.ece(np.array([]), np.array([])))
