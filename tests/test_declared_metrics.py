"""clbench.evaluation.declared: each metric is declared once, and the record, the glossary, the gate and the
checkpoint's log agree with the declarations. Adding a metric means one declaration and the code that computes it:
a record field without a declaration, a declaration without a field, a pinned metric the gate does not list or a
logged one the checkpoint does not keep fails here."""

from __future__ import annotations

import dataclasses

import pytest

from clbench.evaluation import declared, metrics
from clbench.gate import check, reference
from clbench.gate.tolerances import TOLERANCE_METRICS, Tolerance
from clbench.records.schema import SUMMARY_FIELDS, ProtocolSummary
from clbench.run.checkpoint import OLD_LOG_NAMES, ProtocolLogState


def test_every_summary_field_is_a_declared_metric_in_the_same_order():
    assert declared.NAMES == SUMMARY_FIELDS
    assert len(set(declared.NAMES)) == len(declared.NAMES)


def test_each_declaration_is_well_formed():
    for m in declared.METRICS:
        assert m.kind in ("per-task", "final"), m.name
        assert m.unit in ("percent", "points", "percent interval"), m.name
        if m.gate is not None:
            assert m.gate.tolerance in TOLERANCE_METRICS and m.gate.times > 0, m.name
        assert not m.logged or m.kind == "per-task", m.name  # the log keeps one entry per task


def test_the_record_field_types_match_the_kind():
    """A per-task metric is a list (one entry per task); a final one a number, or an interval's [low, high]."""
    hints = {f.name: str(f.type) for f in dataclasses.fields(ProtocolSummary)}
    for m in declared.METRICS:
        if m.kind == "per-task" or m.unit == "percent interval":
            assert hints[m.name].startswith("list["), m.name
        else:
            assert hints[m.name] == "float | None", m.name


def test_every_metric_but_top5_has_a_definition_in_both_scenarios():
    for scenario in ("class", "domain"):
        glossary = metrics.definitions(scenario)
        for m in declared.METRICS:
            if m.term is not None:
                assert glossary[m.term.term], (scenario, m.name)
    assert [m.name for m in declared.METRICS if m.term is None] == ["top5_curve"]


def test_the_glossary_records_store_is_derived_and_unchanged():
    """Records store the glossary and reports compare it: derived from the declarations, it keeps its terms, their
    order and texts (tests/golden/report_tables.md prints the class scenario's)."""
    assert list(metrics.DEFINITIONS) == [
        "R[t][j]",
        "A_t",
        "last_acc",
        "avg_acc",
        "forgetting",
        "forgetting_first_last",
        "old_acc / new_acc",
        "bwt",
        "ece",
        "last_acc_ci / avg_acc_ci",
        "report intervals",
        "task-aware",
    ]
    assert list(metrics.DOMAIN_DEFINITIONS) == [*metrics.DEFINITIONS, "scenario"]
    differ = {k for k in metrics.DEFINITIONS if metrics.DEFINITIONS[k] != metrics.DOMAIN_DEFINITIONS[k]}
    assert differ == {"R[t][j]", "A_t", "forgetting", "forgetting_first_last", "old_acc / new_acc", "bwt", "task-aware"}


def test_every_metric_the_gate_pins_is_listed_or_an_entry_field():
    entry_fields = {f.name for f in dataclasses.fields(reference.ReferenceEntry)}
    assert reference.STORED_METRICS == declared.GATE_STORED
    for m in declared.METRICS:
        if m.gate is None:
            assert m.name not in reference.STORED_METRICS and m.name not in entry_fields, m.name
        elif m.gate.own_field:
            assert m.name in entry_fields and m.name not in reference.STORED_METRICS, m.name
        else:
            assert m.name in reference.STORED_METRICS, m.name
    assert set(declared.GATE_LISTED) <= set(reference.STORED_METRICS)


@pytest.mark.parametrize(
    ("metric", "allowed"),
    [  # the entry's tolerance below: matrix 1.5, last_acc 0.25, avg_acc 0.75
        ("acc_curve", 1.5),
        ("old_acc", 1.5),
        ("new_acc", 1.5),
        ("top5_curve", 1.5),
        ("ece", 1.5),
        ("forgetting", 3.0),  # differences of two matrix entries: twice the matrix tolerance
        ("forgetting_first_last", 3.0),
        ("bwt", 3.0),
        ("last_acc_ci", 0.25),  # an interval endpoint moves with its accuracy
        ("avg_acc_ci", 0.75),
    ],
)
def test_each_pinned_metric_is_checked_with_its_declared_tolerance(metric, allowed):
    entry = dataclasses.replace(_entry(), tolerance=reference.PinnedTolerance(matrix=1.5, last_acc=0.25, avg_acc=0.75))
    assert check._metric_tolerance(entry, metric) == allowed
    assert declared.BY_NAME[metric].gate.allowed(Tolerance(1.5, 0.25, 0.75)) == allowed


def _entry() -> reference.ReferenceEntry:
    return reference.ReferenceEntry(
        bench="b",
        task_sizes=[1],
        strategy="s",
        backbone="v",
        protocol="per-sample",
        precision="fp32",
        weights="random init",
        seeds=[0],
        runs=["r"],
        accuracy_matrix=[[50.0]],
        last_acc=50.0,
        avg_acc=50.0,
        tolerance=reference.PinnedTolerance(matrix=1.5, last_acc=0.5, avg_acc=0.5),
        params=reference.ParamPins(added_total=0, trainable=0),
    )


def test_the_checkpoint_log_keeps_the_logged_metrics_under_their_record_names():
    rows = [f.name for f in dataclasses.fields(ProtocolLogState) if f.name not in ("index", "pred", "conf")]
    assert tuple(rows) == declared.LOGGED
    assert set(OLD_LOG_NAMES.values()) == set(declared.LOGGED)  # every row had an old name to map from


def test_the_gate_changes_listed_on_a_rewrite_are_the_declared_ones():
    assert declared.GATE_LISTED == ("forgetting", "bwt", "ece")


def test_the_report_summary_averages_the_declared_final_metrics():
    assert declared.SUMMARISED == ("last_acc", "avg_acc", "forgetting", "ece")  # summary.csv's <name>_mean/_std
    assert all(declared.BY_NAME[m].kind == "final" for m in declared.SUMMARISED)
