"""Every file clbench saves is typed: the gate reference, the sweep manifest, the routing diagnostics and the run
record each have one dataclass, one reader and one writer. For each: the committed files load and write back the
same (with the upgrade of older versions applied), an older version is upgraded on load, and a file with a wrong
type, a missing field or a newer version is refused with one line naming the file, the field and the fix."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from clbench.errors import ClbenchError
from clbench.files.atomic import without_nan
from clbench.gate.reference import Reference, load_reference, write_reference
from clbench.records.results import read_record
from clbench.records.routing_diagnostics import VERSION_KEY, RoutingDiagnostics, read_routing
from clbench.records.schema import LAYOUT, OPTIONAL_FIELDS, REQUIRED_FIELDS, RunRecord
from clbench.records.versions import SCHEMA_VERSION, UPGRADES
from clbench.sweep.manifest import SweepManifest, load_manifest, upgrade, write_manifest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "reports" / "reference-emoji.json"
MANIFESTS = sorted(REPO.glob("reports/**/sweep.json"))
RECORDS = sorted(Path(p) for p in glob.glob(str(REPO / "reports" / "**" / "result.json"), recursive=True))


def refusal(call) -> str:
    """The message of the ClbenchError ``call`` raises: one line (the hint is apart)."""
    with pytest.raises(ClbenchError) as e:
        call()
    message = e.value.args[0]
    assert "\n" not in message and e.value.hint, message
    return message


def dumped(value) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


# ------------------------------------------------------------------------------------------- the gate reference
def test_the_committed_reference_round_trips(tmp_path):
    raw = json.loads(REFERENCE.read_text())
    ref = load_reference(REFERENCE)
    assert isinstance(ref, Reference) and ref.schema_version == 2
    assert json.dumps(ref.to_dict()) == json.dumps(raw)  # same keys, same order, same values
    write_reference(tmp_path / "ref.json", ref)
    assert load_reference(tmp_path / "ref.json") == ref
    assert json.loads((tmp_path / "ref.json").read_text()) == raw


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "file.json"
    path.write_text(json.dumps(data))
    return path


def test_an_older_reference_entry_is_upgraded(tmp_path):
    """Entries written before class orders were chosen, and before stored statistics were counted apart."""
    raw = json.loads(REFERENCE.read_text())
    entry = raw["entries"][0]
    del entry["class_order_seed"], entry["params"]["stored_total"]
    ref = load_reference(write(tmp_path, raw))
    assert ref.entries[0].class_order_seed == 1993 and ref.entries[0].params.stored_total is None
    assert ref.entries[0].params.pinned() == {
        "added_total": entry["params"]["added_total"],
        "trainable": entry["params"]["trainable"],
    }
    assert (
        ref.entries[0].to_dict()["class_order_seed"] == 1993
        and "stored_total" not in ref.entries[0].to_dict()["params"]
    )


def test_a_format_1_reference_being_rewritten_keeps_its_provenance(tmp_path):
    path = write(tmp_path, {"format": "clbench-reference/1", "written_by": "clbench check ...", "created": "then"})
    ref = load_reference(path, for_writing=True)
    assert ref.schema_version == 1 and ref.entries == []
    assert ref.to_dict()["written_by"] == {
        "command": "clbench check ...",
        "created": "then",
        "format": "clbench-reference/1",
    }


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda r: r["entries"][0].update(last_acc="high"), ["entries[0].last_acc", "'high'", "percentage"]),
        (lambda r: r.pop("time"), ["field time is missing"]),
        (lambda r: r["entries"][1]["params"].pop("trainable"), ["entries[1].params.trainable", "missing"]),
        (lambda r: r.update(format="clbench-reference/3"), ["'clbench-reference/3'", "newer clbench"]),
    ],
    ids=["wrong-type", "missing-field", "missing-nested-field", "newer"],
)
def test_a_bad_reference_is_refused_in_one_line(tmp_path, change, words):
    raw = json.loads(REFERENCE.read_text())
    change(raw)
    path = write(tmp_path, raw)
    message = refusal(lambda: load_reference(path))
    assert str(path) in message and all(w in message for w in words), message


# ------------------------------------------------------------------------------------------- the sweep manifest
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_manifests_round_trip(tmp_path, path):
    raw = json.loads(path.read_text())
    manifest = load_manifest(path)
    assert isinstance(manifest, SweepManifest) and manifest.complete == raw["complete"]
    assert manifest.to_dict() == upgrade(raw)
    assert [k for k in manifest.to_dict() if k in raw] == list(raw)  # the keys it had, in their order
    write_manifest(tmp_path / "sweep.json", manifest)
    assert load_manifest(tmp_path / "sweep.json") == manifest


def test_there_is_a_committed_manifest():
    assert MANIFESTS


def test_an_older_manifest_is_upgraded(tmp_path):
    raw = json.loads(MANIFESTS[0].read_text())
    raw.pop("version"), raw.pop("vary", None)
    manifest = load_manifest(write(tmp_path, raw))
    assert manifest.schema_version == 1 and manifest.vary == "seed"
    assert manifest.to_dict()["version"] == 1


def test_a_manifest_keeps_fields_it_does_not_know(tmp_path):
    raw = {**json.loads(MANIFESTS[0].read_text()), "from_the_future": [1, 2]}
    assert load_manifest(write(tmp_path, raw)).to_dict()["from_the_future"] == [1, 2]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m.update(complete="yes"), ["field complete", "'yes'", "true or false"]),
        (lambda m: m.pop("runs"), ["field runs is missing"]),
        (lambda m: next(iter(m["runs"].values())).pop("path"), ["field runs.", ".path is missing"]),
        (lambda m: m.update(version=2), ["version 2", "newer clbench"]),
    ],
    ids=["wrong-type", "missing-field", "missing-run-field", "newer"],
)
def test_a_bad_manifest_is_refused_in_one_line(tmp_path, change, words):
    raw = json.loads(MANIFESTS[0].read_text())
    change(raw)
    path = write(tmp_path, raw)
    message = refusal(lambda: load_manifest(path))
    assert message.startswith(str(path)) and all(w in message for w in words), message


# ------------------------------------------------------------------------------------------- routing diagnostics
def routing_diagnostics() -> list[tuple[str, dict]]:
    out = []
    for path in RECORDS:
        for t, task in enumerate(json.loads(path.read_text()).get("per_task") or []):
            if read_routing(task["diagnostics"]) is not None:
                out.append((f"{path.parent.relative_to(REPO)}[{t}]", task["diagnostics"]))
    return out


ROUTING = routing_diagnostics()


def test_committed_routing_diagnostics_round_trip():
    """Every routing diagnostic of a committed record reads, writes back the keys it had unchanged (older ones gain
    only what they predate, as null, and the version), and reads again to the same value."""
    assert ROUTING
    for where, diag in ROUTING:
        routing = read_routing(diag, where)
        assert routing.schema_version == 1  # committed records predate the field
        written = routing.to_diagnostics()
        assert written[VERSION_KEY] == 1
        kept = {k: diag[k] for k in diag if k in written}
        assert dumped({k: written[k] for k in kept}) == dumped(kept), where
        assert all(written[k] is None for k in set(written) - set(diag) - {VERSION_KEY}), where
        assert read_routing(written) == routing, where


def test_a_record_without_a_routing_study_reads_as_one_without():
    old = next(d for _, d in ROUTING if "routers" not in d)
    routing = read_routing(old)
    assert routing.routers is None and "routers" not in routing.to_diagnostics()


def test_diagnostics_without_routing_are_none():
    assert read_routing({"task_id_accuracy": 50.0, "training": {}}) is None


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d["per-sample"].update(routing_acc="most"), ["per-sample.routing_acc", "'most'", "percentage"]),
        (lambda d: d["per-sample"].pop("routing_acc_per_task"), ["per-sample.routing_acc_per_task is missing"]),
        (lambda d: d.update(oracle_acc=[1]), ["oracle_acc", "a percentage or null"]),
        (lambda d: d.update({VERSION_KEY: 2}), ["version 2", "newer clbench"]),
    ],
    ids=["wrong-type", "missing-field", "wrong-type-top", "newer"],
)
def test_bad_routing_diagnostics_are_refused_in_one_line(change, words):
    diag = json.loads(json.dumps(ROUTING[-1][1]))
    change(diag)
    message = refusal(lambda: read_routing(diag, "runs/x: per_task[5].diagnostics"))
    assert message.startswith("runs/x: per_task[5].diagnostics") and all(w in message for w in words), message


def test_routing_diagnostics_write_their_version():
    assert RoutingDiagnostics(protocols={}).to_diagnostics()[VERSION_KEY] == 1


# ------------------------------------------------------------------------------------------- the run record
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.parent.relative_to(REPO)))
def test_every_committed_record_writes_back_identically(tmp_path, path):
    """A current-version record writes back byte for byte (key order included); an older one writes back every
    field it had as upgraded (the upgrades of clbench.records.versions.UPGRADES applied), and the rewrite is a fixed
    point."""
    raw = json.loads(path.read_text())
    record = read_record(path)
    written = record.to_dict()
    if raw["schema_version"] == SCHEMA_VERSION:  # the file says null where the record holds NaN (standard JSON)
        assert json.dumps(without_nan(written)) == json.dumps(raw)
    else:
        upgraded, version = raw, raw["schema_version"]
        while version < SCHEMA_VERSION:
            upgraded, version = UPGRADES[version](upgraded), version + 1
        upgraded = {"run_id": path.parent.name, **upgraded, "schema_version": SCHEMA_VERSION}
        assert {k: dumped(written.get(k)) for k in upgraded} == {k: dumped(v) for k, v in upgraded.items()}
    record.write(tmp_path)
    assert read_record(tmp_path) == record or dumped(read_record(tmp_path).to_dict()) == dumped(written)


def test_the_layout_is_the_declaration():
    """Key order, required and optional fields all come from RunRecord's declaration."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(RunRecord)]
    assert list(LAYOUT) == [n for n in names if n != "extra"]
    newest = max(json.loads(p.read_text())["schema_version"] for p in RECORDS)  # committed: SCHEMA_VERSION or older
    assert newest >= SCHEMA_VERSION - 1
    current = next(p for p in RECORDS if json.loads(p.read_text())["schema_version"] == newest)
    keys = [k for k in json.loads(current.read_text()) if k in LAYOUT]
    assert keys == [k for k in LAYOUT if k in keys]
    required = [".".join(p) for p, _, _ in REQUIRED_FIELDS]
    assert required[:7] == ["complete", "strategy", "bench", "task_sizes", "backbone", "seed", "protocol"]
    assert {"last_acc", "params.trainable", "time_s.total"} <= set(required)
    assert {"run_id", "params.stored_total", "time_s.checkpoint", "predictions"} <= {
        ".".join(p) for p, _, _ in OPTIONAL_FIELDS
    }
