"""Pairs are keyed by the full identity of a row: one method at fp32 and bf16 in one compare gets two rows, two
tests against the baseline and two different "vs" cells, each its own (not the first one found); a batch-coupled
protocol's row says it was resampled by test batches. Run folders: tests/test_uncertainty_report.py's records with
simulated predictions of the embedded benchmark's test set."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from test_uncertainty_report import make_run

from clbench.records.results import load_record
from clbench.report.build import _versus
from clbench.report.collect import collect
from clbench.report.leaderboard import Study
from clbench.report.study import build_study
from clbench.report.tables import summary_table
from clbench.report.uncertainty import Predicted


@pytest.fixture(scope="module")
def test_y() -> np.ndarray:
    with resources.files("clbench").joinpath("data/emoji.npz").open("rb") as f, np.load(f) as npz:
        return np.asarray(npz["test_y"])


def _at_precision(folder: Path, precision: str, new_id: str) -> Path:
    """The run folder with its record at another precision (and run id), its predictions unchanged."""
    rec = load_record(folder)
    target = folder.parent / new_id
    folder.rename(target)
    dataclasses.replace(rec, run_id=new_id, precision=precision).write(target)
    return target


def test_one_method_at_two_precisions_gets_two_rows_and_two_tests(tmp_path, test_y):
    runs = tmp_path / "runs"
    make_run(runs, test_y, "simplecil", 1, 0.30)
    _at_precision(make_run(runs, test_y, "tosca", 1, 0.50), "fp32", "tosca-fp32-s1")  # fp32: 20 points better
    make_run(runs, test_y, "tosca", 1, 0.31)  # bf16 (the fixture's precision): no real difference
    coll = collect([runs], False).select("emoji")
    selection = Study(coll.acc_groups(), "simplecil")  # every row a main row: both precisions of TOSCA
    predicted = Predicted()
    model = build_study(selection, coll, predicted)
    table = summary_table(coll, predicted)
    rows = zip(table["strategy"], table["backbone"], strict=True)
    cells = dict(zip(rows, _versus(table, model), strict=True))
    tosca = {backbone: cell for (strategy, backbone), cell in cells.items() if strategy == "tosca"}
    assert len(tosca) == 2, cells  # two rows: the precision is part of the backbone label
    fp32 = next(c for b, c in tosca.items() if b.endswith("fp32"))
    bf16 = next(c for b, c in tosca.items() if b.endswith("bf16"))
    assert "differs" in fp32 and "not significantly different" in bf16, tosca
    assert float(fp32.split()[0]) > 15 > float(bf16.split()[0])
    sides = [(model.row(t.a).key, model.row(t.b).key) for t in model.tests]
    tested = {
        a.backbone if b.strategy == "simplecil" else b.backbone
        for a, b in sides
        if "simplecil" in (a.strategy, b.strategy)
    }
    assert tested == set(tosca)


def test_a_batch_coupled_protocol_is_resampled_by_test_batches(tmp_path, test_y):
    """A record whose strategy config names a test-batch size: its reference-protocol row says block bootstrap."""
    from clbench.report.uncertainty import batch_size

    folder = make_run(tmp_path / "runs", test_y, "tosca", 1, 0.40)
    rec = load_record(folder)
    rec = dataclasses.replace(rec, strategy_config={**rec.strategy_config, "ref_eval_batch": 48})
    rec.write(folder)
    run = collect([tmp_path / "runs"], False).runs[0]
    assert batch_size(run, "reference") == 48 and batch_size(run, "per-sample") is None
