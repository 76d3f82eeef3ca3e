"""Warnings shown to the user: the under-training warning beside its report row, the routing warning of each
protocol from that protocol's own module choices, and both at the end of ``clbench run``."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from test_report import copy_runs

from clbench.records.results import load_record
from clbench.report.collect import collect
from clbench.report.tables import routing_table, summary_table
from clbench.ui import print_result, run_warnings

UNDERTRAINED = "the adapters barely moved: this run measures the frozen backbone"
PER_SAMPLE_TEXT = "entropy routing sends 90% of test images to the newest module (its task holds 17% of them)"


def warn(rec):
    rec["training_warning"] = UNDERTRAINED


def per_sample_collapse(rec):
    """The per-sample router collapsed; the reference protocol's batch vote spreads its choices as the tasks do."""
    diag = rec["per_task"][-1]["diagnostics"]
    diag["routing_warning"] = PER_SAMPLE_TEXT
    diag["reference"]["chosen_hist"] = [157] * 5 + [157]


def test_the_training_warning_sits_beside_its_row_only(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["sc-s1993", "tosca-s1993"], {"tosca-s1993": warn})
    df = summary_table(collect([runs]))
    assert set(df.loc[df["strategy"] == "tosca", "training warning"]) == {UNDERTRAINED}
    assert set(df.loc[df["strategy"] == "simplecil", "training warning"]) == {"-"}


def test_no_warning_column_without_warnings(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["sc-s1993", "tosca-s1993"])
    assert "training warning" not in summary_table(collect([runs])).columns


def test_each_protocol_row_shows_its_own_routing_warning(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["tosca-s1993"], {"tosca-s1993": per_sample_collapse})
    df = routing_table(collect([runs])).set_index("protocol")
    assert df.loc["per-sample", "warning"] == PER_SAMPLE_TEXT
    assert df.loc["reference", "warning"] == "-"  # its own choices are spread: the per-sample text is not repeated


def test_a_collapsed_reference_vote_is_named_as_such(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["tosca-ref-s1995"])  # the batch vote sends every image to module 2
    df = routing_table(collect([runs])).set_index("protocol")
    assert df.loc["reference", "warning"].startswith("reference-protocol routing sends 100% of test images to module 2")


def test_clbench_run_prints_both_warnings_at_the_end(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["tosca-s1993"], {"tosca-s1993": lambda r: (warn(r), per_sample_collapse(r))})
    record = load_record(Path(runs / "tosca-s1993"))
    assert run_warnings(record) == [PER_SAMPLE_TEXT, UNDERTRAINED]
    console = Console(record=True, width=200)
    print_result(record, console)
    text = console.export_text()
    assert f"warning: {PER_SAMPLE_TEXT}" in text and f"warning: {UNDERTRAINED}" in text
    assert text.rstrip().endswith(UNDERTRAINED)  # after the tables, where the run ends
