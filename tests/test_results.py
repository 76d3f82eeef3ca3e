"""The run record (``clbench.records.results``): every committed record loads, writing and reading give the same record,
older schema versions are upgraded with the fields they lack, and what is not a readable record is refused with a
message that says why."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from clbench.errors import ClbenchError
from clbench.files.atomic import without_nan
from clbench.files.safety import mark_folder
from clbench.records.command import as_typed
from clbench.records.results import load_record, read_record
from clbench.records.schema import RESULT_FILE, ProtocolSummary, RunRecord
from clbench.records.upgrade import upgraded
from clbench.records.versions import SCHEMA_VERSION
from clbench.run.checkpoint import CHECKPOINT_FILE

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "records"
COMMITTED = sorted(p for root in ("reports", "tests/fixtures") for p in (REPO / root).rglob(RESULT_FILE))
LEGACY = REPO / "tests" / "fixtures" / "records-legacy"  # records as schema 1 to 3 wrote them (tests/test_upgrade.py)
BROKEN = {  # the fixtures that must be refused, and what the refusal says
    "garbage": "not a readable JSON record",
    "old-schema": "schema version 0 (this clbench reads 4 to 6",
    "tosca-incomplete": "the run is not complete (finished 3 of 6 tasks)",
    **{p.name: "predates one parameter accounting (schema 4)" for p in LEGACY.iterdir() if p.is_dir()},
}


def _text(record: RunRecord) -> str:
    return json.dumps(record.to_dict(), indent=2, allow_nan=True)


def _write(folder: Path, data: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULT_FILE).write_text(data if isinstance(data, str) else json.dumps(data, allow_nan=True))
    return folder


def _fixture(name: str) -> dict:
    return json.loads(next(FIXTURES.rglob(f"{name}/{RESULT_FILE}")).read_text())


def _legacy(name: str) -> dict:
    return json.loads((LEGACY / name / RESULT_FILE).read_text())


# ------------------------------------------------------------------------------------------- committed records
def test_the_repository_holds_records_of_both_schema_generations():
    versions = {json.loads(p.read_text()).get("schema_version") for p in COMMITTED if p.parent.name != "garbage"}
    assert len(COMMITTED) >= 30 and {0, 1} <= versions


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO).parent))
def test_every_committed_record_loads_or_is_refused_as_its_fixture_says(path):
    if path.parent.name in BROKEN:
        with pytest.raises(ClbenchError, match=BROKEN[path.parent.name].replace("(", r"\(").replace(")", r"\)")):
            load_record(path.parent)
        return
    raw = json.loads(path.read_text())
    rec = load_record(path.parent)
    assert rec.complete is True and rec.run_id == raw["run_id"]
    assert rec.precision in ("fp32", "bf16")
    assert rec.protocol_names[0] == raw["protocol"] and set(rec.protocols) == set(raw["protocols"])
    assert rec.main.acc_curve == raw["acc_curve"] and rec.last_acc == raw["last_acc"]
    kept = rec.params.added_total + rec.params.stored_total  # schema 3 splits what schema 1/2 counted as added
    assert kept >= raw["params"]["added_total"] and rec.time_s.train == raw["time_s"]["train"]
    assert [t.diagnostics for t in rec.per_task] == [t["diagnostics"] for t in raw["per_task"]]
    # the typed layer keeps every field as the file has it: only the version, autocast -> precision, the
    # parameter accounting (restated, tests/test_param_accounting.py) and train_per_class (a run setting since
    # schema 5, moved out of strategy_config) change
    written = rec.to_dict()
    config = dict(raw.get("strategy_config", {}))
    moved = config.pop("train_per_class", None)  # schema < 5 kept it among the strategy's settings
    assert rec.train_per_class == raw.get("train_per_class", moved) and rec.strategy_config == config
    expected = {k: v for k, v in raw.get("strategy_config", {}).items() if v is not None or k != "train_per_class"}
    if raw.get("train_per_class") is not None:
        expected["train_per_class"] = raw["train_per_class"]
    assert rec.settings == expected
    # the command reads as typed (clbench.records.command.as_typed): no interpreter, worktree or absolute path of the
    # maker
    if raw.get("command"):
        assert rec.command == as_typed(raw["command"].split(" "), None) and "/work/" not in rec.command
        assert rec.command.split(" ")[0] in ("clbench", "pytest"), rec.command
    for key, value in raw.items():
        if key not in ("schema_version", "autocast", "params", "strategy_config", "command"):
            # NaN in memory is null in a file of schema 6 and NaN in an older one: compared as standard JSON
            assert json.dumps(without_nan(written[key])) == json.dumps(without_nan(value)), key


def test_train_per_class_moves_out_of_the_strategy_settings_and_back_into_what_the_run_trained_with(tmp_path):
    """Schema 5: a schema-4 record's train_per_class (MOS quick: 32) reads as the run setting; written again it sits
    at the top level, and the settings the run trained with (what the gate and the budget curves compare) are
    the file's, before and after."""
    current = json.loads((REPO / "reports/emoji/runs/budget/mos-quick" / RESULT_FILE).read_text())
    assert current["train_per_class"] == 32 and "train_per_class" not in current["strategy_config"]
    raw = {**current, "schema_version": 4}  # as schema 4 wrote it (the record before `clbench records upgrade`)
    raw["strategy_config"] = {**raw.pop("strategy_config"), "train_per_class": raw.pop("train_per_class")}
    path = _write(tmp_path / "v4", raw)
    rec = load_record(path)
    assert rec.train_per_class == 32 and "train_per_class" not in rec.strategy_config
    assert rec.settings == raw["strategy_config"]
    rec.write(tmp_path / "r")
    data = json.loads((tmp_path / "r" / RESULT_FILE).read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 6 and data["train_per_class"] == 32
    assert "train_per_class" not in data["strategy_config"]
    assert load_record(tmp_path / "r").settings == raw["strategy_config"]
    unset = dataclasses.replace(rec, train_per_class=None)  # every image: the key is not written
    unset.write(tmp_path / "u")
    assert "train_per_class" not in json.loads((tmp_path / "u" / RESULT_FILE).read_text())


# ------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", ["tosca-s1993", "sc-s1993"])
def test_write_then_read_gives_the_same_record(tmp_path, name):
    rec = load_record(next(FIXTURES.rglob(name)))
    rec.write(tmp_path / "run")  # a folder that does not exist yet is created
    again = load_record(tmp_path / "run")
    assert _text(again) == _text(rec)  # text: NaN (old_acc after task 1) is not == itself
    assert again.per_task == rec.per_task and again.params == rec.params and again.host == rec.host
    first = (tmp_path / "run" / RESULT_FILE).read_text()
    again.write(tmp_path / "run")
    assert (tmp_path / "run" / RESULT_FILE).read_text() == first  # a current record is written byte for byte
    assert json.loads(first)["schema_version"] == SCHEMA_VERSION


def test_a_written_record_is_standard_json_and_reads_back_its_nan(tmp_path):
    """No NaN in result.json (jq and JavaScript refuse it): old_acc after the first task is written null and read
    back as NaN, so a version-5 file (NaN written) and its version-6 rewrite give the same record."""
    raw = _fixture("tosca-s1993")
    assert raw["old_acc"][0] is None  # written at version 6: null
    raw["schema_version"] = 5  # as version 5 wrote it: NaN
    for summary in (raw, *raw["protocols"].values()):
        summary["old_acc"][0] = math.nan
    path = _write(tmp_path / "v5", raw)
    assert "NaN" in (path / RESULT_FILE).read_text()
    rec = load_record(path)
    assert math.isnan(rec.main.old_acc[0])
    rec.write(tmp_path / "run")
    text = (tmp_path / "run" / RESULT_FILE).read_text()

    def refuse(constant):
        raise AssertionError(f"{constant} in a written record")

    data = json.loads(text, parse_constant=refuse)
    assert data["old_acc"][0] is None and data["protocols"][rec.protocol]["old_acc"][0] is None
    again = load_record(tmp_path / "run")
    assert math.isnan(again.main.old_acc[0]) and again.main.old_acc[1:] == rec.main.old_acc[1:]
    assert _text(again) == _text(rec)


def test_the_command_is_recorded_as_the_user_typed_it(tmp_path, monkeypatch):
    """`clbench ...` whichever entry point ran it, paths relative to the working directory, `<abs>/NAME` outside it."""
    from clbench.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/some/worktree/.venv/bin/python", "/some/worktree/clbench/cli.py"])
    out, elsewhere = tmp_path / "runs" / "sc", tmp_path.parent / f"{tmp_path.name}-elsewhere" / "sc2"
    micro = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "18", "--increment", "18"]
    assert main(["run", "--strategy", "simplecil", *micro, "--out", str(out)]) == 0
    assert load_record(out).command == f"clbench run --strategy simplecil {' '.join(micro)} --out runs/sc"
    assert main(["run", "--strategy", "simplecil", *micro, f"--out={elsewhere}"]) == 0
    assert load_record(elsewhere).command.endswith("--out=<abs>/sc2")
    assert as_typed(["/opt/venv/bin/clbench", "report", "/data/runs", "runs/x"], Path("/data")) == (
        "clbench report runs runs/x"
    )


def test_a_current_record_keeps_the_file_layout(tmp_path):
    """Outside readers of result.json keep working: same keys in the same order, main metrics at the top."""
    rec = load_record(FIXTURES / "tosca" / "tosca-s1993")
    rec.write(tmp_path / "r")
    data = json.loads((tmp_path / "r" / RESULT_FILE).read_text())
    keys = list(data)
    assert keys[0] == "schema_version" and keys.index("protocol") + 1 == keys.index("accuracy_matrix")
    assert keys[-2:] == ["protocol_gap", "finished"]
    assert data["protocols"]["per-sample"]["last_acc"] == data["last_acc"] == rec.summary("per-sample").last_acc
    assert data["per_task"][0] == {
        "task": 0,
        "classes": rec.per_task[0].classes,
        "train_s": rec.per_task[0].train_s,
        "diagnostics": rec.per_task[0].diagnostics,
        "eval_s": rec.per_task[0].eval_s,
    }


# ------------------------------------------------------------------------------------------- upgrade
def test_a_version_1_record_is_upgraded_with_the_fields_it_lacks():
    raw = _legacy("simplecil-v1")  # version 1, before --precision, checkpoints, fingerprints and transform
    assert raw["schema_version"] == 1 and raw["autocast"] is True
    assert not {"precision", "fingerprint", "transform", "resumed_from_task"} & set(raw)
    rec = upgraded(LEGACY / "simplecil-v1" / RESULT_FILE, raw)  # what `clbench records upgrade` writes
    assert rec.precision == "bf16" and rec.precision_reason is None  # autocast: true meant bf16
    assert rec.fingerprint is None and rec.transform is None and rec.class_names is None
    assert rec.resumed_from_task == [] and rec.data_problems == [] and rec.n_images is None
    assert rec.time_s.checkpoint is None and "checkpoint" not in rec.to_dict()["time_s"]
    assert rec.extra == {"normalize": True}  # a field this clbench no longer writes is kept, not dropped
    assert rec.host.cpus == raw["host"]["cpus"] and rec.host.cpu is None and "cpu" not in rec.host.to_dict()
    assert math.isnan(rec.main.old_acc[0]) and rec.main.forgetting == raw["forgetting"]
    written = rec.to_dict()
    assert written["schema_version"] == SCHEMA_VERSION and "autocast" not in written


def test_autocast_false_reads_as_fp32_and_neither_as_unknown(tmp_path):
    raw = _legacy("simplecil-v1")
    raw["autocast"] = False
    assert upgraded(tmp_path / "a", raw).precision == "fp32"
    del raw["autocast"]
    assert upgraded(tmp_path / "b", raw).precision == "unknown"  # never guessed


def test_a_version_1_autocast_that_is_not_a_boolean_is_refused(tmp_path):
    raw = _legacy("simplecil-v1")
    raw["autocast"] = "yes"
    with pytest.raises(ClbenchError, match="field autocast is str 'yes', expected true or false"):
        upgraded(tmp_path / RESULT_FILE, raw)


def test_a_record_lacking_protocols_uses_its_top_level_metrics(tmp_path):
    raw = _fixture("sc-s1995")
    del raw["protocols"], raw["run_id"]
    rec = load_record(_write(tmp_path / "folder-name", raw))
    assert rec.run_id == "folder-name"  # the folder names the run
    assert rec.protocols == {"per-sample": ProtocolSummary.from_dict(raw)}


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda r: r.update(schema_version=SCHEMA_VERSION + 1),
            f"schema version {SCHEMA_VERSION + 1} is newer than this clbench reads \\(4 to {SCHEMA_VERSION}\\)",
        ),
        (lambda r: r.update(schema_version="2"), "not a clbench run record \\(schema_version is '2'\\)"),
        (lambda r: r.pop("schema_version"), "not a clbench run record \\(schema_version is None\\)"),
        (lambda r: r.update(schema_version=-1), "schema version -1 \\(this clbench reads"),
        (lambda r: r["time_s"].update(train="fast"), "field time_s.train is str 'fast', expected seconds"),
        (lambda r: r.pop("last_acc") and r["params"].pop("trainable"), "record lacks last_acc, params.trainable"),
        (
            lambda r: r.update(per_task=[{"task": "one"}]),
            r"field per_task\[0\]\.task is str 'one', expected an integer",
        ),
        (lambda r: r.update(host=[]), "field host is list \\[\\], expected an object"),
        (lambda r: r.update(complete="yes"), "field complete is 'yes', expected the boolean true"),
        (lambda r: r.update(acc_curve=r["acc_curve"][:2]), "accuracy curve has 2 points for 6 tasks"),
    ],
)
def test_a_bad_record_is_refused_with_one_line_naming_the_problem(tmp_path, edit, message):
    raw = _fixture("sc-s1994")
    edit(raw)
    folder = _write(tmp_path / "run", raw)
    with pytest.raises(ClbenchError, match=message) as e:
        load_record(folder)
    assert str(e.value.args[0]).startswith(str(folder / RESULT_FILE)) and "\n" not in e.value.args[0]


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"schema_version": 2, "complete": tr', "not a readable JSON record"),
        ("[1, 2]", "not a JSON record object \\(a list\\)"),
        ('{"hello": "world"}', "not a clbench run record"),
        (b"\xff\xfe\x00garbage", "not a readable JSON record"),
    ],
)
def test_garbage_is_refused(tmp_path, content, message):
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / RESULT_FILE
    target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    with pytest.raises(ClbenchError, match=message):
        read_record(tmp_path / "run")
    with pytest.raises(ClbenchError, match="no result.json"):
        read_record(tmp_path / "empty-folder-that-is-not-there")


def test_an_unfinished_record_is_read_but_not_loaded():
    folder = FIXTURES / "broken" / "tosca-incomplete"
    rec = read_record(folder)  # the sweep reads unfinished runs to continue them
    assert rec.complete is False and rec.tasks_done == 3 and len(rec.task_sizes) == 6
    with pytest.raises(ClbenchError, match="not complete") as e:
        load_record(folder)
    assert "clbench run --resume" in e.value.hint


def test_a_too_new_record_is_skipped_by_the_report_and_named(tmp_path):
    from clbench.report.collect import collect

    raw = _fixture("sc-s1994")
    raw["schema_version"] = SCHEMA_VERSION + 1
    _write(tmp_path / "runs" / "future", raw)
    _write(tmp_path / "runs" / "now", _fixture("sc-s1995"))
    coll = collect([tmp_path / "runs"])
    assert [r.run_id for r in coll.runs] == ["sc-s1995"]
    assert [(Path(s.path).name, s.reason) for s in coll.skipped] == [
        ("future", f"schema version {SCHEMA_VERSION + 1} is newer than this clbench reads (4 to {SCHEMA_VERSION})")
    ]


# ------------------------------------------------------------------------------------------- the harness
def test_the_harness_returns_the_record_it_wrote(tmp_path):
    from clbench.run.harness import RunConfig, run

    rec = run(
        RunConfig(
            strategy="simplecil",
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            init_cls=18,
            increment=18,
            precision="fp32",
            out=str(tmp_path / "run"),
        )
    )
    assert isinstance(rec, RunRecord) and rec.complete and rec.tasks_done == 2
    assert _text(load_record(tmp_path / "run")) == _text(rec)
    assert rec.precision_reason == "forced (--precision fp32)" and rec.fingerprint["strategy"] == "simplecil"
    assert rec.host.cpus and rec.host.isa_limits is not None and rec.finished


# ------------------------------------------------------------------------------------------- the sweep
def test_the_sweep_reads_unfinished_records_and_names_the_ones_it_cannot_use(tmp_path):
    from types import SimpleNamespace

    from clbench.sweep.plan import PlannedRun, inspect

    unfinished = _fixture("tosca-s1994")
    unfinished.update(complete=False, fingerprint={"seed": 1994})
    planned = PlannedRun("r", SimpleNamespace(out=str(_write(tmp_path / "a", unfinished))), {"seed": 1994})
    (tmp_path / "a" / CHECKPOINT_FILE).write_bytes(b"")
    assert inspect(planned) is None and (planned.state, planned.tasks_done) == ("partial", 6)

    future = {**unfinished, "schema_version": SCHEMA_VERSION + 1}
    planned = PlannedRun("r", SimpleNamespace(out=str(_write(tmp_path / "b", future))), {"seed": 1994})
    assert inspect(planned) == (
        f"its record cannot be used (schema version {SCHEMA_VERSION + 1} is newer than "
        f"this clbench reads (4 to {SCHEMA_VERSION}))"
    )

    torn = _write(tmp_path / "c", '{"complete": tr')
    planned = PlannedRun("r", SimpleNamespace(out=str(torn)), {"seed": 1994})
    assert inspect(planned) == "it is a folder of other files, not a clbench run folder"  # a torn record proves nothing
    mark_folder(torn, "run")  # clbench's own run folder whose record was torn: as if none was written
    assert inspect(planned) is None and planned.state == "new"
