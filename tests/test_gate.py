"""The CI regression gate as shipped: the committed reference (reports/reference-emoji.json), its tolerances and time
slack, checked against copies of the very records it was written from (reports/gate/runs/), with bugs planted in
them. Every test here fails if the gate lets the planted bug through or refuses an honest run.

The planted bugs are edits of real records, so each test takes milliseconds; that the records and the reference
agree unedited is the first test.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from clbench.errors import ClbenchError
from clbench.gate import check as chk
from clbench.report.collect import collect

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "reports" / "reference-emoji.json"
RECORDS = REPO / "reports" / "gate" / "runs"  # the runs the reference was written from (result.json + calibration)
SHIPPED = json.loads(REFERENCE.read_text())
ENTRIES = SHIPPED["entries"]


def entry_id(e: dict) -> str:
    return f"{e['strategy']}:{e['profile']}/{e['protocol']}"


def run_folder(entry: dict) -> str:
    (name,) = entry["runs"]
    return name


@pytest.fixture
def runs(tmp_path) -> Path:
    """A fresh copy of the shipped gate records (result.json and calibration.json only)."""
    dest = tmp_path / "runs"
    shutil.copytree(RECORDS, dest)
    return dest


def edit(runs: Path, name: str, change) -> None:
    path = runs / name / "result.json"
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def gate(runs: Path, ref: chk.Reference | None = None) -> chk.CheckResult:
    calibration, _ = chk.find_calibration([runs])
    return chk.check(collect([runs]), ref or chk.load_reference(REFERENCE), calibration, str(REFERENCE))


def failed(result: chk.CheckResult) -> list[tuple[str, str, str]]:
    return [(r.entry, r.check, r.status) for r in result.failures]


def shift_task(protocol: str, task: int, points: float):
    """Move task ``task``'s accuracy in the final matrix row by ``points`` and update final/average consistently
    (the final-row accuracy of one task moves the run's final accuracy by points * its share of the test set)."""

    def change(rec):
        for metrics in [rec["protocols"][protocol]] + ([rec] if rec["protocol"] == protocol else []):
            row = metrics["accuracy_matrix"][-1]
            share = rec["task_sizes"][task] / sum(rec["task_sizes"])  # the emoji test set is balanced per class
            row[task] += points
            metrics["acc_curve"][-1] += points * share
            metrics["last_acc"] += points * share
            metrics["avg_acc"] += points * share / len(rec["task_sizes"])

    return change


# ------------------------------------------------------------------------------------------- the shipped gate
def test_the_reference_pins_every_registered_ci_profile_and_protocol():
    from clbench.core.catalog import STRATEGIES

    pinned = {(e["strategy"], e["profile"], e["protocol"]) for e in ENTRIES}
    for name in STRATEGIES.names():
        cls = STRATEGIES.get(name)
        ci = [p for p in cls.profiles if p == "ci" or p.startswith("ci-")]
        assert ci, f"{name} has no ci profile"
        for profile in ci:
            assert (name, profile, "per-sample") in pinned, (name, profile)
        assert all((name, "ci", p) in pinned for p in cls.protocols), f"{name}: every protocol of its ci profile"
    assert ("tosca", "ci", "reference") in pinned and ("tosca", "ci-augment", "per-sample") in pinned
    assert SHIPPED["require_ci_profiles"] is True
    assert {e["precision"] for e in ENTRIES} == {"fp32"}  # the precision every machine shares


def _pairs(args: list[str]) -> set[tuple[str, str]]:
    """A `clbench run` argument list as its (flag, value) pairs, without --out: the same run whatever the order."""
    pairs = set(zip(args[::2], args[1::2], strict=True))
    return {(flag, value) for flag, value in pairs if flag != "--out"}


def test_the_gate_plan_is_the_runs_the_reference_was_written_from():
    """`.ci/gate` runs `clbench check --plan` (derived from the catalog): exactly the shipped reference's runs, each
    with the flags its recorded command had, into the folder the reference names."""
    plan = chk.gate_plan(Path("OUT"))
    assert all(run[-2] == "--out" and Path(run[-1]).parent == Path("OUT") for run in plan)
    planned = {Path(run[-1]).name: _pairs(run) for run in plan}
    made = {Path(p["command"].split()[-1]).name: _pairs(p["command"].split()[2:]) for p in SHIPPED["produced_by"]}
    assert planned == made
    assert set(planned) == {run_folder(e) for e in ENTRIES}


def test_ci_gate_runs_the_plan_between_two_calibrations_with_the_extra_flags(tmp_path):
    """The script itself, with a stand-in clbench that logs its calls and plans two runs (one folder with a space):
    the plan's quoting survives, every run gets the extra flags, and a run cannot eat the rest of the plan."""
    import shlex
    import subprocess

    log = tmp_path / "calls.log"
    out = tmp_path / "gate runs"
    plan = [
        ["--strategy", "a", "--out", str(out / "a-ci")],
        ["--strategy", "b", "--profile", "ci-x", "--out", str(out / "b c")],
    ]
    stub = tmp_path / "clbench"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" >> {shlex.quote(str(log))}\n"
        'if [ "$1 $2" = "check --plan" ]; then\n'
        + "".join(f"  echo {shlex.quote(shlex.join(run))}\n" for run in plan)
        + "fi\n"
        'if [ "$1" = run ]; then cat > /dev/null; fi\n'  # a run that reads its input would eat the plan
    )
    stub.chmod(0o755)
    done = subprocess.run(
        ["bash", str(REPO / ".ci" / "gate"), str(stub), str(out), "--precision", "bf16"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        f"check --plan {out}",
        f"check --calibrate {out}",
        *(f"run {' '.join(run)} --precision bf16" for run in plan),
        f"check --calibrate {out}",
    ]


def test_the_unedited_records_pass(runs):
    result = gate(runs)
    assert result.ok, failed(result)
    checks = {r.check for r in result.rows}
    assert {
        "accuracy matrix",
        "final acc %",
        "avg inc acc %",
        "train time / calibration",
        "eval time / calibration",
    } <= checks


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_a_two_point_drop_on_one_task_fails(runs, entry):
    final = entry["accuracy_matrix"][-1]
    task = 1 if final[1] >= 2.0 else max(range(len(final)), key=final.__getitem__)  # a drop that stays >= 0 %
    edit(runs, run_folder(entry), shift_task(entry["protocol"], task=task, points=-2.0))
    result = gate(runs)
    assert not result.ok
    rows = [r for r in result.failures if r.check == "accuracy matrix"]
    assert rows and rows[0].status == chk.FAIL and "R[" in rows[0].detail, failed(result)


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_id)
def test_a_two_point_gain_on_one_task_fails_as_changed(runs, entry):
    """A planted leak: one task's accuracy rises by 2 points. An improvement must be written into the reference on
    purpose, so the gate fails and says so."""
    edit(runs, run_folder(entry), shift_task(entry["protocol"], task=0, points=+2.0))
    result = gate(runs)
    assert not result.ok
    rows = [r for r in result.failures if r.check == "accuracy matrix"]
    assert rows and rows[0].status == chk.CHANGED and "--write-reference" in rows[0].detail


def test_a_drop_within_the_measured_spread_passes(runs):
    entry = next(e for e in ENTRIES if e["runs"] == ["simplecil-ci"])  # the control at its own split
    tol = entry["tolerance"]["matrix"]
    edit(runs, run_folder(entry), shift_task("per-sample", task=2, points=-(tol - 0.01)))
    assert gate(runs).ok


def test_tosca_training_three_times_slower_fails(runs):
    def slower(rec):
        extra = 2.0 * rec["time_s"]["train"]
        rec["time_s"]["train"] += extra
        rec["time_s"]["total"] += extra

    for name in {run_folder(e) for e in ENTRIES if e["strategy"] == "tosca"}:
        edit(runs, name, slower)
    result = gate(runs)
    fails = failed(result)
    assert fails and all(check == "train time / calibration" and "tosca" in entry for entry, check, _ in fails), fails


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["time"]["train"] >= SHIPPED["time"]["floor"]], ids=entry_id)
def test_any_training_three_times_slower_fails(runs, entry):
    """Each strategy that spends at least one calibration unit training (SimpleCIL only averages features)."""

    def slower(rec):
        rec["time_s"]["train"] *= 3.0

    edit(runs, run_folder(entry), slower)
    assert ("train time / calibration", chk.FAIL) in {(c, s) for e, c, s in failed(gate(runs))}


def test_a_uniformly_slower_machine_passes(runs):
    for folder in runs.iterdir():
        if folder.is_dir():
            edit(runs, folder.name, lambda rec: rec.update(time_s={k: 3.0 * v for k, v in rec["time_s"].items()}))
    cal = runs / chk.CALIBRATION_FILE
    data = json.loads(cal.read_text())
    for m in data["measurements"]:
        m["seconds"] *= 3.0
    cal.write_text(json.dumps(data))
    assert gate(runs).ok


def test_slack_and_floor_are_the_documented_ones():
    assert SHIPPED["time"]["slack"] == chk.DEFAULT_TIME_SLACK and SHIPPED["time"]["floor"] == chk.DEFAULT_TIME_FLOOR
    assert chk.DEFAULT_TIME_SLACK < 3.0  # a 3x slowdown must not fit in the slack


# ------------------------------------------------------------------------------------------- bad input
def test_an_older_format_reference_is_refused_in_one_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "clbench-reference/1", "tolerance_points": 1.0, "entries": []}))
    with pytest.raises(ClbenchError) as e:
        chk.load_reference(old)
    msg = str(e.value)
    assert "older format 'clbench-reference/1'" in msg and "--write-reference" in msg and "\n" not in msg


def test_a_reference_naming_an_unknown_strategy_is_flagged(runs):
    ref = chk.load_reference(REFERENCE)
    ref = replace(ref, entries=[*ref.entries, replace(ref.entries[0], strategy="no-such-method")])
    rows = [r for r in gate(runs, ref).failures if "no-such-method" in r.entry]
    assert len(rows) == 1 and "does not register" in rows[0].detail


def test_a_reference_naming_a_profile_not_run_says_how_to_run_it(runs):
    ref = chk.load_reference(REFERENCE)
    ref = replace(
        ref, entries=[*ref.entries, replace(next(e for e in ref.entries if e.strategy == "ease"), profile="quick")]
    )
    rows = [r for r in gate(runs, ref).failures if "ease:quick" in r.entry]
    assert len(rows) == 1 and rows[0].status == chk.MISSING
    assert "clbench run --strategy ease --bench emoji --profile quick --precision fp32" in rows[0].detail


def test_a_run_the_reference_does_not_pin_fails(runs):
    ref = chk.load_reference(REFERENCE)
    ref = replace(ref, entries=[e for e in ref.entries if e.strategy != "ease"])
    fails = failed(gate(runs, ref))
    assert any("ease:ci" in entry and check == "pinned" for entry, check, _ in fails)  # the run is not pinned
    assert any(entry == "ease:ci" and check == "pinned" for entry, check, _ in fails)  # the registered profile


def test_a_run_at_another_precision_is_refused(runs):
    entry = next(e for e in ENTRIES if e["runs"] == ["simplecil-ci"])  # the control at its own split
    edit(runs, run_folder(entry), lambda rec: rec.update(precision="bf16"))
    rows = gate(runs).failures
    assert [r.check for r in rows] == ["precision"]
    assert "runs at bf16, reference at fp32: rerun with --precision fp32" in rows[0].detail


def test_an_old_record_with_autocast_counts_as_bf16(runs):
    entry = next(e for e in ENTRIES if e["runs"] == ["simplecil-ci"])  # the control at its own split

    def old(rec):
        del rec["precision"]
        rec["autocast"] = True

    edit(runs, run_folder(entry), old)
    assert [r.check for r in gate(runs).failures] == ["precision"]


def test_another_backbone_digest_is_refused(runs):
    entry = next(e for e in ENTRIES if e["strategy"] == "tosca")
    edit(runs, run_folder(entry), lambda rec: rec.update(weights_digest="0" * 64))
    rows = gate(runs).failures
    assert {r.check for r in rows} == {"backbone weights"} and "000000000000" in rows[0].detail


def test_missing_calibration_fails(runs):
    (runs / chk.CALIBRATION_FILE).unlink()
    rows = gate(runs).failures
    assert [r.check for r in rows] == ["calibration present"] and "--calibrate" in rows[0].detail


def _at(*path):
    """The JSON value at ``path`` of a copy of the shipped reference, and the copy."""
    raw = json.loads(REFERENCE.read_text())
    node = raw
    for k in path:
        node = node[k]
    return node, raw


def _refusal(call) -> str:
    with pytest.raises(ClbenchError) as e:
        call()
    assert "\n" not in e.value.args[0] and e.value.hint, e.value.args[0]
    return e.value.args[0]


@pytest.mark.parametrize(
    "path, value, words",
    [
        (("entries", 2, "img_size"), "56", ["field entries[2].img_size is str '56'", "an integer >= 1 or null"]),
        (("entries", 0, "seeds", 0), "1993", ["field entries[0].seeds is list", "a list of integers >= 0"]),
        (("produced_by", 0, "seed"), "1993", ["field produced_by[0].seed is str '1993'", "an integer >= 0"]),
        (("entries", 4, "tolerance", "avg_acc"), -1, ["field entries[4].tolerance.avg_acc is int -1", "points"]),
        (("history", 1, "changes"), "moved", ["field history[1].changes is str 'moved'", "a list of strings"]),
        (
            ("time", "calibration", "measurements", 1, "seconds"),
            0,
            ["field time.calibration.measurements[1].seconds is int 0", "seconds > 0"],
        ),
    ],
    ids=["entry-img-size", "entry-seed", "run-seed", "tolerance", "history", "calibration"],
)
def test_a_wrong_typed_reference_field_is_refused_naming_it(tmp_path, path, value, words):
    """Every part of the reference is typed: a wrong value anywhere is refused in one line naming the file, the dotted
    field, what it must be, and (in an entry) which strategy's entry it is."""
    parent, raw = _at(*path[:-1])
    parent[path[-1]] = value
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps(raw))
    message = _refusal(lambda: chk.load_reference(bad))
    assert message.startswith(f"--reference {bad}: ") and all(w in message for w in words), message
    if path[0] == "entries":
        assert f"(entries[{path[1]}]: {ENTRIES[path[1]]['strategy']})" in message


def test_the_committed_reference_writes_back_byte_identical(tmp_path):
    """Read and written again, the committed reference is the same bytes: every field, its order, and the fields
    written only where set (an entry's data and metrics, params.stored_total, a format-1 block in the history)."""
    ref = chk.load_reference(REFERENCE)
    chk.write_reference(tmp_path / "ref.json", ref)
    assert (tmp_path / "ref.json").read_bytes() == REFERENCE.read_bytes()
    raw = json.loads(REFERENCE.read_text())  # a key this clbench does not know is kept, last, where it was
    raw["entries"][0]["from_the_future"] = {"x": 1}
    (tmp_path / "future.json").write_text(json.dumps(raw))
    assert list(chk.load_reference(tmp_path / "future.json").to_dict()["entries"][0])[-1] == "from_the_future"


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m.pop("seconds"), "field measurements[1].seconds is missing"),
        (lambda m: m.update(seconds=-1), "field measurements[1].seconds is int -1, expected seconds > 0"),
        (lambda m: m.update(workload=7), "field measurements[1].workload is int 7"),
    ],
    ids=["no-seconds", "negative-seconds", "workload"],
)
def test_a_bad_calibration_file_is_refused_naming_the_field(runs, change, words):
    cal = runs / chk.CALIBRATION_FILE
    data = json.loads(cal.read_text())
    change(data["measurements"][1])
    cal.write_text(json.dumps(data))
    message = _refusal(lambda: chk.find_calibration([runs]))
    assert message.startswith(f"{cal}: not a calibration file: {words}"), message


def test_a_calibration_file_reads_and_writes_back_the_same(runs, tmp_path):
    cal = runs / chk.CALIBRATION_FILE
    (first, second), files = chk.find_calibration([runs])
    assert files == [str(cal)] and first.workload == chk.CALIBRATION_ID and first.torch_threads == 2
    chk.write_calibration(tmp_path, first.to_dict())
    chk.write_calibration(tmp_path, second.to_dict())
    assert (tmp_path / chk.CALIBRATION_FILE).read_bytes() == cal.read_bytes()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda rec: rec.update(complete="yes"), "complete"),
        (lambda rec: rec.update(complete=False), "not complete"),
        (lambda rec: rec["time_s"].update(train="fast"), "time_s.train"),
        (lambda rec: rec.update(seed="1993"), "seed"),
        (lambda rec: rec["params"].update(added_total=1.5), "params.added_total"),
        (lambda rec: rec.update(accuracy_matrix=[[50.0, "x"]]), "accuracy_matrix"),
    ],
)
def test_a_bad_record_fails_the_gate_naming_file_and_field(runs, change, field):
    entry = next(e for e in ENTRIES if e["runs"] == ["simplecil-ci"])  # the control at its own split
    edit(runs, run_folder(entry), change)
    rows = [r for r in gate(runs).failures if r.check == "record readable"]
    assert len(rows) == 1 and run_folder(entry) in rows[0].entry and field in rows[0].detail


def test_an_unreadable_record_fails_the_gate(runs):
    entry = next(e for e in ENTRIES if e["strategy"] == "l2p")
    (runs / run_folder(entry) / "result.json").write_text('{"torn": ')
    rows = [r for r in gate(runs).failures if r.check == "record readable"]
    assert len(rows) == 1 and "not a readable JSON record" in rows[0].detail


# ------------------------------------------------------------------------------------------- writing
def test_write_reference_needs_why_and_records_who_what_why(runs, tmp_path):
    coll = collect([runs])
    calibration, _ = chk.find_calibration([runs])
    with pytest.raises(ClbenchError, match="--why"):
        chk.make_reference(coll, why="", calibration=calibration)
    previous = chk.load_reference(REFERENCE)
    edit(runs, run_folder(ENTRIES[0]), shift_task(ENTRIES[0]["protocol"], task=0, points=+3.0))
    ref = chk.make_reference(
        collect([runs]),
        why="a fix raised task 1",
        who="tester",
        calibration=calibration,
        previous=previous,
        written_by="clbench check --write-reference X",
    )
    wb = ref.written_by
    assert wb is not None and wb.who == "tester" and wb.why == "a fix raised task 1" and wb.git_revision
    assert len(ref.changes) == 1 and entry_id(ENTRIES[0]).split("/")[0] in ref.changes[0]
    assert ref.history[0] == previous.written_by
    path = tmp_path / "ref.json"
    chk.write_reference(path, ref)
    assert chk.load_reference(path).entries[0].last_acc > ENTRIES[0]["last_acc"]


# ------------------------------------------------------------------------------------------- tolerances
TOLERANCES = REPO / "reports" / "gate" / "tolerances.json"


def test_every_entry_has_the_measured_tolerance_of_tolerances_json():
    """The committed reference's tolerances are the ones reports/gate/spread.py derived (tolerances.json), entry by
    entry: a rewrite that fell back to the defaults, or widened one, fails here."""
    table = chk.load_tolerances(TOLERANCES)
    for e in ENTRIES:
        name = f"{e['strategy']}:{e['profile']}"
        assert name in table, f"{name} has no measured tolerance in {TOLERANCES.name}: run reports/gate/spread.py"
        assert e["tolerance"] == table[name], (entry_id(e), e["tolerance"], table[name])
    assert {k: v for k, v in SHIPPED["tolerances"].items() if k != "source"} == {
        k: v for k, v in table.items() if k != "source"
    }


def test_a_rewrite_keeps_the_tolerances_unless_a_file_is_given(runs, tmp_path):
    calibration, _ = chk.find_calibration([runs])
    previous = chk.load_reference(REFERENCE)
    kept = chk.make_reference(collect([runs]), why="same runs", calibration=calibration, previous=previous)
    assert [e.tolerance.to_dict() for e in kept.entries] == [e["tolerance"] for e in ENTRIES]
    assert kept.tolerances == previous.tolerances
    assert not any("tolerance" in line for line in kept.changes)
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps({"tolerances": {"ease:ci": {"matrix": 1.5, "last_acc": 0.5, "avg_acc": 0.5}}}))
    moved = chk.make_reference(
        collect([runs]),
        why="wider EASE",
        calibration=calibration,
        previous=previous,
        tolerances=chk.load_tolerances(wider),
    )
    changes = moved.changes
    ease = [line for line in changes if "ease:ci" in line and not line.startswith("tolerance table:")]
    assert len(ease) == 1 and "tolerance matrix 0.77 / last_acc 0.32 / avg_acc 0.56 -> matrix 1.5" in ease[0]
    # every other entry falls back to the defaults: each is listed, and so is the table
    assert sum("tolerance matrix" in line for line in changes) == len(ENTRIES)
    assert any(line.startswith("tolerance table:") for line in changes)


# ------------------------------------------------------------------------------------------- training in the gate
LOSS_RATIO_MAX = 0.95  # last-epoch mean loss over first-epoch mean, every task that trains (reports/gate/README.md)
PARAM_CHANGE_MIN = 1e-3  # ||after - init|| / ||init|| of what the task's main optimiser stepped


@pytest.mark.parametrize("folder", sorted(p.name for p in RECORDS.iterdir() if p.is_dir()))
def test_every_gate_run_that_trains_shows_its_loss_fall_and_its_parts_move(folder):
    """A ci profile that trains must train visibly: in each task whose optimiser ran, the mean loss of the last
    epoch is at most LOSS_RATIO_MAX of the first's and the trained parts moved by PARAM_CHANGE_MIN of their norm at
    least. The gate then pins trained methods, not their initialisation (records written before the per-task
    ``training`` diagnostics fail here: re-run .ci/gate and re-pin)."""
    from clbench.records.results import load_record

    rec = load_record(RECORDS / folder)
    for t, entry in enumerate(rec.per_task):
        if not rec.params.trainable_per_task[t]:
            continue
        assert entry.diagnostics.get("training"), f"{folder} task {t}: no training diagnostics; re-pin the gate"
        main = entry.diagnostics["training"][0]  # the task's first optimiser: the method's training loop
        ratio = main["loss_last_epoch"] / main["loss_first_epoch"]
        fell = f"{main['loss_first_epoch']:.4f} -> {main['loss_last_epoch']:.4f}"
        assert ratio <= LOSS_RATIO_MAX, f"{folder} task {t}: loss {fell}"
        assert main["param_change"] >= PARAM_CHANGE_MIN, f"{folder} task {t}: parts moved {main['param_change']:.2e}"


def test_every_gate_run_has_an_untrained_control_at_its_split():
    """The plan runs the untrained control at every split a ci profile uses (first task, increment, training images
    per class), so the gate prints each method's margin over it: on the committed gate records, no run lacks one."""
    from clbench.gate.printing import CONTROL, margin_lines

    plan = chk.gate_plan(Path("OUT"))
    controls = [run for run in plan if run[1] == CONTROL and "--train-per-class" in run]
    assert controls, "no control at the 3-task ci splits"
    lines = margin_lines(collect([RECORDS]).seeded())
    assert lines and not [line for line in lines if "no untrained control" in line], lines


def _scale_training(name: str, task: int, key: str, factor: float):
    def change(rec):
        for o in rec["per_task"][task]["diagnostics"]["training"]:
            o[key] *= factor

    return name, change


@pytest.mark.parametrize(
    ("name", "task", "key", "factor"),
    [("coda_prompt-ci", 1, "loss_last_epoch", 1.03), ("slca-ci", 2, "param_change", 0.9)],
)
def test_a_run_whose_training_moved_fails_though_its_accuracy_holds(runs, name, task, key, factor):
    """A method whose ci accuracy sits below the untrained control's (CODA-Prompt, SLCA) still has its training
    pinned: a last-epoch loss 3 % higher, or parameters that moved 10 % less, fail the entry as changed while every
    accuracy stays where it was."""
    assert all(e.get("training") for e in ENTRIES if e["strategy"] != "simplecil"), "training not pinned"
    edit(runs, *_scale_training(name, task, key, factor))
    bad = failed(gate(runs))
    assert [(check, status) for _, check, status in bad] == [("training", "changed")], bad
    assert f"| {name.removesuffix('-ci')}:ci |" in bad[0][0], bad


def test_training_within_the_tolerance_passes(runs):
    edit(runs, *_scale_training("coda_prompt-ci", 1, "loss_last_epoch", 1.005))
    assert gate(runs).ok
