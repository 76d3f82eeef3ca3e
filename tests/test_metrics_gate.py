"""The gate compares every metric a record stores, not only the accuracy matrix: a record whose forgetting, BWT,
ECE, curves or interval endpoints moved (what a changed metric definition writes) fails ``clbench check`` as
``changed`` while its accuracy matrix still holds; an entry written before the metrics were pinned still reads and
checks what it pins. The committed gate records and reference (reports/gate/runs, reports/reference-emoji.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clbench.gate import check as chk
from clbench.gate.reference import STORED_METRICS
from clbench.report.collect import collect

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference-emoji.json"
RECORDS = ROOT / "reports" / "gate" / "runs"


def _gate(runs: Path, ref: chk.Reference) -> chk.CheckResult:
    calibration, _ = chk.find_calibration([runs])
    return chk.check(collect([runs]), ref, calibration, str(REFERENCE))


@pytest.fixture
def runs(tmp_path) -> Path:
    dest = tmp_path / "runs"
    shutil.copytree(RECORDS, dest)
    return dest


def _edit(runs: Path, change) -> None:
    path = runs / "tosca-ci" / "result.json"
    rec = json.loads(path.read_text())
    change(rec["protocols"]["per-sample"])
    path.write_text(json.dumps(rec))


def test_every_committed_entry_pins_every_stored_metric():
    entries = json.loads(REFERENCE.read_text())["entries"]
    assert entries and all(set(e["metrics"]) == set(STORED_METRICS) for e in entries)


@pytest.mark.parametrize(
    ("metric", "change"),
    [
        ("forgetting", lambda s: s.update(forgetting=s["forgetting"] + 5)),  # e.g. max over every evaluation
        ("bwt", lambda s: s.update(bwt=-s["bwt"])),
        ("ece", lambda s: s.update(ece=s["ece"] / 2)),
        ("acc_curve", lambda s: s["acc_curve"].__setitem__(0, s["acc_curve"][0] - 3)),
        ("last_acc_ci", lambda s: s.update(last_acc_ci=[s["last_acc_ci"][0] - 1, s["last_acc_ci"][1]])),
    ],
)
def test_a_moved_stored_metric_fails_the_gate(runs, metric, change):
    ref = chk.load_reference(REFERENCE)
    assert _gate(runs, ref).ok
    _edit(runs, change)
    result = _gate(runs, ref)
    assert [(r.check, r.status) for r in result.failures] == [(metric, chk.CHANGED)], result.failures
    assert "definition" in result.failures[0].detail


def test_a_move_within_tolerance_passes(runs):
    ref = chk.load_reference(REFERENCE)
    _edit(runs, lambda s: s.update(forgetting=s["forgetting"] + 0.1))
    assert _gate(runs, ref).ok


def test_an_entry_without_metrics_still_reads_and_checks_the_rest(runs, tmp_path):
    raw = json.loads(REFERENCE.read_text())
    for e in raw["entries"]:
        del e["metrics"]
    old = tmp_path / "old-reference.json"
    old.write_text(json.dumps(raw))
    ref = chk.load_reference(old)
    assert all(e.metrics is None for e in ref.entries)
    _edit(runs, lambda s: s.update(forgetting=s["forgetting"] + 5))
    assert _gate(runs, ref).ok  # nothing pinned the stored metrics then
