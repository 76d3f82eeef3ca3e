"""Experiment trackers (``--log``, ``clbench export``): what each tracker received, read back with the tracker's own
reader, equals the run's record; a tracker that fails leaves the run complete with one warning and a record event;
bad ``--log`` values are refused with one line before anything runs."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clbench.cli import main
from clbench.records.results import load_record
from clbench.records.schema import RunRecord

ROOT = Path(__file__).resolve().parent.parent
MICRO = ["--backbone", "vit_micro", "--weights", "random"]
ROUTING = "routing/per-sample/acc"  # TOSCA's routing accuracy under the main protocol


def _cli(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, cache_root) -> tuple[RunRecord, Path]:
    """One micro TOSCA run (routing accuracy included) logged to all three trackers under one --log-dir."""
    tmp = tmp_path_factory.mktemp("trackers")
    out, logs = tmp / "run", tmp / "logs"
    env = {"CLBENCH_CACHE": str(cache_root), "HF_HUB_OFFLINE": "1"}
    argv = ["run", "--strategy", "tosca", *MICRO, "--init-cls", "18", "--increment", "9", "--set", "epochs=1"]
    argv += ["--out", str(out), "--log", "tensorboard,mlflow,wandb", "--log-dir", str(logs)]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("WANDB_MODE", raising=False)
        assert main(argv) == 0
    record = load_record(out)
    assert record.tracker_events == []  # every tracker finished
    return record, logs


def expected_per_task(record: RunRecord) -> dict[str, dict[int, float]]:
    """metric -> {step: value} as the record holds them (steps are tasks, from 1)."""
    s = record.main
    out: dict[str, dict[int, float]] = {"acc/A_t": {}, "acc/new": {}, "acc/old": {}, "time/train_s": {}}
    out[ROUTING] = {}
    for t, entry in enumerate(record.per_task):
        out["acc/A_t"][t + 1] = s.acc_curve[t]
        out["acc/new"][t + 1] = s.new_acc[t]
        if not math.isnan(s.old_acc[t]):
            out["acc/old"][t + 1] = s.old_acc[t]
        out["time/train_s"][t + 1] = entry.train_s
        out[ROUTING][t + 1] = entry.diagnostics["per-sample"]["routing_acc"]
        for j, r in enumerate(s.accuracy_matrix[t]):
            out.setdefault(f"R/task_{j + 1}", {})[t + 1] = r
    out["acc/forgetting"] = {len(record.per_task): s.forgetting}
    return out


def test_tensorboard_event_files_hold_the_records_metrics(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record, logs = logged_run
    acc = EventAccumulator(str(logs / "tensorboard" / record.run_id), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    for tag, by_step in expected_per_task(record).items():
        got = {e.step: e.value for e in acc.Scalars(tag) if e.step > 0}
        if tag == "acc/forgetting":  # logged after every task; the record keeps the final value
            got = {k: v for k, v in got.items() if k in by_step}
        # TensorBoard stores scalars as float32
        assert got == {k: float(np.float32(v)) for k, v in by_step.items()}, tag
    assert acc.Scalars("final/last_acc")[0].value == pytest.approx(record.last_acc, rel=1e-6)
    assert {"figures/accuracy_curves"} <= set(acc.Tags()["images"])


def mlflow_uri(logs: Path) -> str:
    """The store clbench writes by default in ``--log-dir LOGS``: MLflow's SQLite store (the one MLflow 3 opens
    without MLFLOW_ALLOW_FILE_STORE)."""
    return f"sqlite:///{logs / 'mlruns.db'}"


def test_mlflow_store_holds_the_records_metrics(logged_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    record, logs = logged_run
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    client = MlflowClient(tracking_uri=mlflow_uri(logs))
    runs = client.search_runs([client.get_experiment_by_name("clbench").experiment_id])
    assert [r.info.run_name for r in runs] == [record.run_id]
    run = runs[0]
    assert run.info.status == "FINISHED"
    for tag, by_step in expected_per_task(record).items():
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag) if m.step > 0}
        if tag == "acc/forgetting":
            got = {k: v for k, v in got.items() if k in by_step}
        assert got == by_step, tag
    assert run.data.metrics["final/last_acc"] == record.last_acc
    assert run.data.params["fingerprint.seed"] == str(record.seed)
    assert run.data.tags["weights_digest"] == record.weights_digest
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "result.json" in artifacts and "figures" in artifacts
    saved = json.loads(Path(client.download_artifacts(run.info.run_id, "result.json")).read_text())
    assert saved["accuracy_matrix"] == record.accuracy_matrix
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(logs / "mlruns")


def test_mlflows_own_client_reads_the_run_in_a_fresh_process(logged_run):
    """`MlflowClient` in a new Python, with no MLFLOW_ALLOW_FILE_STORE in its environment (a user's `mlflow ui` or
    script): it opens clbench's store and finds the run, its final accuracy and its record."""
    record, logs = logged_run
    script = (
        "import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(tracking_uri=sys.argv[1]); "
        "r = c.search_runs([c.get_experiment_by_name('clbench').experiment_id])[0]; "
        "print(r.info.run_name, repr(r.data.metrics['final/last_acc']), "
        "[a.path for a in c.list_artifacts(r.info.run_id)])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    done = subprocess.run(
        [sys.executable, "-c", script, mlflow_uri(logs)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    name, last, artifacts = done.stdout.strip().split(" ", 2)
    assert (name, float(last)) == (record.run_id, record.last_acc)
    assert "result.json" in artifacts


def test_mlflows_file_store_stays_an_option(tmp_path, capsys, monkeypatch):
    """MLFLOW_TRACKING_URI=file:... keeps MLflow's (maintenance-mode) file store: clbench writes it, and MLflow reads
    it where MLFLOW_ALLOW_FILE_STORE is set."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "files").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    out = tmp_path / "run"
    argv = ["run", "--strategy", "simplecil", *MICRO, "--init-cls", "18", "--increment", "18", "--out", str(out)]
    code, _, err = _cli([*argv, "--log", "mlflow"], capsys)
    assert code == 0, err
    record = load_record(out)
    assert record.tracker_events == [] and not (tmp_path / "mlruns.db").exists()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(tmp_path / "files").as_uri())
    runs = client.search_runs([client.get_experiment_by_name("clbench").experiment_id])
    assert [(r.info.run_name, r.data.metrics["final/last_acc"]) for r in runs] == [(record.run_id, record.last_acc)]


def wandb_records(path: Path):
    """The protobuf records of a W&B offline run file (``run-ID.wandb``): W&B's framing of LevelDB's log format,
    a 7-byte file header (":W&B", magic, version), then 32 KiB blocks of chunks (CRC, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # full, or last of several
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_run_holds_the_records_metrics(logged_run):
    record, logs = logged_run
    (run_file,) = (logs / "wandb").glob("offline-run-*/run-*.wandb")
    history, summary, config, name = [], {}, {}, None
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            summary.update({"/".join(i.nested_key) or i.key: i.value_json for i in r.summary.update})
        elif kind == "run":
            name = r.run.display_name
            config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
    assert name == record.run_id
    assert config["fingerprint.seed"] == record.seed
    rows = {int(h["task"]): h for h in history if "task" in h}
    for tag, by_step in expected_per_task(record).items():
        got = {step: rows[step][tag] for step in by_step}
        assert got == by_step, tag
    assert json.loads(summary["final/last_acc"]) == record.last_acc


def test_export_of_the_committed_runs_into_mlflow(tmp_path, capsys, monkeypatch):
    """`clbench export reports/emoji/runs/reference --to mlflow`: one MLflow run per committed record (the six
    rivals' reference-budget runs: a sample of the 70 committed records, at a tenth of their export time), each with
    the record's accuracy curve per task and its final accuracy."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, out, err = _cli(
        ["export", str(ROOT / "reports/emoji/runs/reference"), "--to", "mlflow", "--log-dir", str(tmp_path)], capsys
    )
    assert code == 0, err
    records = {p.parent: load_record(p) for p in (ROOT / "reports/emoji/runs/reference").rglob("result.json")}
    assert len(records) >= 6
    client = MlflowClient(tracking_uri=mlflow_uri(tmp_path))
    runs = client.search_runs([client.get_experiment_by_name("clbench").experiment_id], max_results=1000)
    assert len(runs) == len(records) == out.count("exported ")
    by_dir = {r.data.tags["clbench.run_dir"]: r for r in runs}
    for folder, rec in records.items():
        run = by_dir[str(folder)]
        curve = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "acc/A_t"), key=lambda m: m.step)]
        assert curve == rec.acc_curve, folder
        assert run.data.metrics["final/avg_acc"] == rec.avg_acc


@pytest.mark.full
def test_a_sweep_logs_one_tracker_run_per_run_grouped_by_sweep(tmp_path, capsys, cache_root, monkeypatch):
    """`clbench sweep --log mlflow`: each run of the sweep is one MLflow run, in the experiment named after the
    sweep's folder, with the run's final accuracy. Full tier: a sweep's runs log through the tracker code of a
    single run, whose MLflow records the default tier checks (test_mlflow_store_holds_the_records_metrics)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("CLBENCH_CACHE", str(cache_root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out, logs = tmp_path / "grid", tmp_path / "logs"
    argv = ["sweep", "--strategies", "simplecil", "--seeds", "1,2", *MICRO, "--init-cls", "12", "--increment", "12"]
    code, _, err = _cli([*argv, "--out", str(out), "--no-report", "--log", "mlflow", "--log-dir", str(logs)], capsys)
    assert code == 0, err
    client = MlflowClient(tracking_uri=mlflow_uri(logs))
    runs = client.search_runs([client.get_experiment_by_name("grid").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["simplecil-emoji-s1", "simplecil-emoji-s2"]
    for r in runs:
        assert r.data.tags["clbench.sweep"] == "grid"
        assert r.data.metrics["final/last_acc"] == load_record(out / "runs" / r.info.run_name).last_acc


# ----------------------------------------------------------------------------------------------- where
def test_a_run_says_where_it_went_and_writes_no_store_in_the_working_folder(tmp_path, capsys, monkeypatch):
    """`clbench run --log tensorboard,mlflow` without --log-dir: every store is inside the run folder, none in the
    folder the command was typed in, and the run's last lines name the record folder and each tracker's location."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    here, out = tmp_path / "here", tmp_path / "run"
    here.mkdir()
    monkeypatch.chdir(here)
    argv = ["run", "--strategy", "simplecil", *MICRO, "--init-cls", "18", "--increment", "18", "--out", str(out)]
    code, stdout, err = _cli([*argv, "--log", "tensorboard,mlflow"], capsys)
    assert code == 0, err
    assert list(here.iterdir()) == []  # no mlruns.db, mlruns/ or tensorboard/ where the command was typed
    assert (out / "mlruns.db").is_file() and (out / "tensorboard").is_dir()
    lines = stdout.splitlines()
    assert f"record: {out}" in lines
    assert any(x.startswith(f"tensorboard: {out / 'tensorboard'} (view: tensorboard --logdir ") for x in lines), lines
    uri = mlflow_uri(out)
    mlflow_line = next(x for x in lines if x.startswith("mlflow: "))
    assert mlflow_line.startswith(f"mlflow: {uri}, run ") and f"mlflow ui --backend-store-uri {uri}" in mlflow_line
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("clbench").experiment_id])
    assert [r.info.run_name for r in runs] == [load_record(out).run_id]


def test_mlflows_store_goes_in_the_log_dir_else_the_sweeps_folder_else_the_run_folder(tmp_path, monkeypatch):
    from clbench.run.trackers import LogSpec

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    sweep = LogSpec.from_flags("mlflow", None, "grid", out=str(tmp_path / "grid"))
    assert sweep.mlflow_uri == mlflow_uri(tmp_path / "grid")
    assert sweep.mlflow_artifacts == (tmp_path / "grid" / "mlruns").as_uri()
    logs = LogSpec.from_flags("mlflow", str(tmp_path / "logs"), "grid", out=str(tmp_path / "grid"))
    assert logs.mlflow_uri == mlflow_uri(tmp_path / "logs")
    run = LogSpec.from_flags("mlflow", None)
    assert run.mlflow_uri is None  # the run's folder, decided when the run starts (a run's --out may be unset)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert LogSpec.from_flags("mlflow", None, out=str(tmp_path / "grid")).mlflow_uri == "http://tracking.example:5000"


def test_export_without_log_dir_writes_into_the_exported_folder(tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs, here = tmp_path / "runs", tmp_path / "here"
    shutil.copytree(ROOT / "reports/emoji/runs/reference/l2p", runs / "l2p")
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = _cli(["export", str(runs), "--to", "mlflow"], capsys)
    assert code == 0, err
    assert list(here.iterdir()) == [] and (runs / "mlruns.db").is_file()


# ----------------------------------------------------------------------------------------------- failures
def test_a_failing_tracker_leaves_the_run_complete(tmp_path, capsys, monkeypatch):
    """MLflow pointed at a store it cannot write: the run finishes, says so once, and the record keeps the event."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (blocker / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    out = tmp_path / "run"
    argv = ["run", "--strategy", "simplecil", *MICRO, "--init-cls", "18", "--increment", "18", "--out", str(out)]
    code, _, err = _cli([*argv, "--log", "mlflow"], capsys)
    assert code == 0
    record = load_record(out)
    assert record.complete and len(record.tracker_events) == 1
    assert record.tracker_events[0].startswith("mlflow: failed at start")
    assert err.count("warning: tracker mlflow") == 1


def test_a_hung_tracker_is_left_behind_after_the_timeout(tmp_path):
    """A tracker whose call never returns costs the run at most the timeout, then becomes an event. Shown without a
    clock: the wait ends while the tracker's call is still blocked (it returns only once the test releases it)."""
    import threading

    from clbench.records.schema import ProtocolSummary, TaskEntry
    from clbench.run import trackers

    release, returned = threading.Event(), threading.Event()

    class Hung:
        def __init__(self, spec):
            pass

        def start(self, run):
            release.wait()
            returned.set()

        def log_task(self, step, metrics):
            pass

        def finish(self, metrics, artifacts):
            pass

    hub = trackers.TrackerHub(trackers.LogSpec(("tensorboard",)), timeout=0.5)
    original = trackers.ADAPTERS["tensorboard"]
    trackers.ADAPTERS["tensorboard"] = Hung
    try:
        hub._start(trackers.RunInfo("r", tmp_path, None, {}, {"strategy": "s", "bench": "b"}))
        summary = ProtocolSummary([[50.0]], [50.0], 50.0, 50.0, old_acc=[float("nan")], new_acc=[50.0])
        hub.task_done(0, summary, TaskEntry(0, [0], 1.0), 10.0)
        hub._wait()
        assert not returned.is_set()  # the wait gave up on the tracker; it did not wait for it to return
    finally:
        trackers.ADAPTERS["tensorboard"] = original
        release.set()
    assert hub.events == [
        "tensorboard: did not finish within 0.5 s (its data may be incomplete); the run went on without it"
    ]


def test_a_run_that_stops_with_an_error_ends_its_tracker_runs_as_failed(tmp_path, monkeypatch):
    from clbench.run import trackers

    calls = []

    class Fake:
        def __init__(self, spec):
            pass

        def start(self, run):
            calls.append("start")

        def log_task(self, step, metrics):
            calls.append("log_task")

        def finish(self, metrics, artifacts):
            calls.append("finish")

        def abort(self):
            calls.append("abort")

    monkeypatch.setitem(trackers.ADAPTERS, "mlflow", Fake)
    hub = trackers.TrackerHub(trackers.LogSpec(("mlflow",)))
    hub._start(trackers.RunInfo("r", tmp_path, None, {}, {"strategy": "s", "bench": "b"}))
    hub.abort()
    assert calls == ["start", "abort"] and hub.events == []


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--log", "tensorbord"], "--log tensorbord: unknown tracker; valid trackers: tensorboard, mlflow, wandb"),
        (["--log", "tensorbord"], "did you mean 'tensorboard'"),
        (["--log", ","], "--log is empty"),
        (["--log-dir", "x"], "--log-dir is for --log"),
    ],
)
def test_bad_log_flags(tmp_path, capsys, argv, needle):
    out = tmp_path / "run"
    code, _, err = _cli(["run", "--strategy", "simplecil", *MICRO, "--out", str(out), *argv], capsys)
    assert code == 2 and needle in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("tracker,package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny")])
def test_tracker_not_installed_names_the_extra(tmp_path, tracker, package):
    """With the tracker's library unimportable (blocked in sys.modules, as a missing package looks), `--log` says
    which extra to install, in one line, before anything runs."""
    out = tmp_path / "run"
    code = (
        f"import sys; sys.modules[{tracker!r}] = None\n"
        "from clbench.cli import main\n"
        f"sys.exit(main(['run', '--strategy', 'simplecil', '--out', {str(out)!r}, '--log', {tracker!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"clbench: error: --log {tracker}: {package} is not installed"
    assert "pip install 'clbench[trackers]'" in lines[1]
    assert not out.exists()


def test_trackers_are_not_imported_unless_asked(tmp_path):
    code = (
        "import sys; from clbench.cli import build_parser; build_parser().parse_args(['run', '--strategy', 'x']);"
        "import clbench.run.trackers;"
        "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
