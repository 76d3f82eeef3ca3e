"""`clbench records upgrade DIR` (clbench.records.upgrade): records of schema 1 to 3 are refused by every reader with a
message naming the command, which rewrites them once at the current schema; reading records imports neither torch
nor any method."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.records.results import load_record, read_record
from clbench.records.schema import RESULT_FILE
from clbench.records.upgrade import upgrade_folders
from clbench.records.versions import SCHEMA_VERSION

REPO = Path(__file__).resolve().parent.parent
LEGACY = REPO / "tests" / "fixtures" / "records-legacy"  # one record of each old schema, as it was written
NAMES = sorted(p.name for p in LEGACY.iterdir() if p.is_dir())


@pytest.fixture
def legacy(tmp_path):
    shutil.copytree(LEGACY, tmp_path / "runs")
    return tmp_path / "runs"


def test_the_fixtures_cover_every_old_schema():
    versions = {json.loads((LEGACY / n / RESULT_FILE).read_text())["schema_version"] for n in NAMES}
    assert versions == {1, 2, 3}


@pytest.mark.parametrize("name", NAMES)
def test_a_reader_refuses_an_old_record_and_names_the_command(name):
    with pytest.raises(ClbenchError, match="predates one parameter accounting") as e:
        load_record(LEGACY / name)
    assert e.value.hint.startswith(f"upgrade it once: `clbench records upgrade {LEGACY / name}`")
    with pytest.raises(ClbenchError, match="clbench records upgrade"):
        read_record(LEGACY / name)  # the sweep's reader too


def test_upgrade_rewrites_every_old_record_once_and_keeps_its_numbers(legacy, capsys):
    before = {n: json.loads((legacy / n / RESULT_FILE).read_text()) for n in NAMES}
    assert main(["records", "upgrade", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert f"{len(NAMES)} records: {len(NAMES)} upgraded, 0 already current" in out
    for name, raw in before.items():
        rec = load_record(legacy / name)
        data = json.loads((legacy / name / RESULT_FILE).read_text())
        assert data["schema_version"] == SCHEMA_VERSION
        assert rec.accuracy_matrix == raw["accuracy_matrix"] and rec.last_acc == raw["last_acc"]
        assert rec.time_s.total == raw["time_s"]["total"] and rec.class_order == raw["class_order"]
        p = rec.params
        assert p.extra["restated_from_schema"] == raw["schema_version"]  # said, with the counts as written
        assert p.extra["kept_as_written"] == (raw["params"].get("added_per_task") or [raw["params"]["added_total"]])
        written, kept = raw["params"]["added_total"], p.added_total + p.stored_total
        if rec.strategy == "tosca":  # the old count left out TOSCA's head rows
            assert kept == written + p.head
        elif rec.strategy == "ranpac":  # and RanPAC's Gram matrix and class sums
            assert kept == written + raw["params"]["gram_floats"] + raw["params"]["class_sum_floats"]
        else:
            assert kept == written
    texts = {n: (legacy / n / RESULT_FILE).read_bytes() for n in NAMES}
    assert main(["records", "upgrade", str(legacy)]) == 0  # again: nothing to do, nothing rewritten
    assert f"0 upgraded, {len(NAMES)} already current" in capsys.readouterr().out
    assert texts == {n: (legacy / n / RESULT_FILE).read_bytes() for n in NAMES}


def test_a_dry_run_writes_nothing(legacy, capsys):
    texts = {n: (legacy / n / RESULT_FILE).read_bytes() for n in NAMES}
    assert main(["records", "upgrade", "--dry-run", str(legacy)]) == 0
    assert f"{len(NAMES)} would upgrade" in capsys.readouterr().out
    assert texts == {n: (legacy / n / RESULT_FILE).read_bytes() for n in NAMES}


def test_a_folder_a_run_is_writing_is_left_alone(legacy, capsys):
    folder = legacy / NAMES[0]
    text = (folder / RESULT_FILE).read_bytes()
    with open(folder / ".lock", "w") as held:  # as clbench.run.rundir.RunDir holds it during a run
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["records", "upgrade", str(folder)]) == 1
    assert "busy" in capsys.readouterr().out and (folder / RESULT_FILE).read_bytes() == text
    assert main(["records", "upgrade", str(folder)]) == 0  # once the run let go


def test_a_rewrite_that_does_not_read_back_is_undone(legacy, monkeypatch):
    import clbench.records.upgrade as upgrade

    folder = legacy / NAMES[0]
    text = (folder / RESULT_FILE).read_bytes()

    def torn(path):
        raise ClbenchError(f"{path}: torn")

    monkeypatch.setattr(upgrade, "read_record", torn)
    [outcome] = upgrade_folders([folder])
    assert outcome.status == "refused" and "did not read back" in outcome.why
    assert (folder / RESULT_FILE).read_bytes() == text  # the record as it was, not half an upgrade


def test_records_it_cannot_read_are_named_and_fail_the_command(tmp_path, capsys):
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / RESULT_FILE).write_text('{"schema_version": 1, "complete": tr')
    assert main(["records", "upgrade", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "refused" in captured.out and "not a readable JSON record" in captured.out
    assert "hint:" in captured.err
    assert main(["records", "upgrade", str(tmp_path / "nowhere")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_reading_every_committed_record_imports_neither_torch_nor_a_method():
    """The record reader (reports, `compare`, the gate and sweeps read records through it) imports no torch and no
    method module, in a fresh process, over every committed record."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from clbench.records.results import load_record, read_record\n"
        "paths = sorted(Path('reports').rglob('result.json'))\n"
        "records = [load_record(p) if read_record(p).complete else read_record(p) for p in paths]\n"
        "assert len(records) > 150, len(records)\n"
        "heavy = ('baselines', 'tosca', 'clbench.core.catalog')\n"
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith(heavy)]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
