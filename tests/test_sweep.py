"""``clbench sweep``: the local and the Ray backend give identical records, a killed worker or a killed sweep is
continued from the run's checkpoint (not restarted), a complete run is skipped, and bad sweeps are refused early.

The sweeps run the real CLI on the micro ViT (random weights) and the embedded benchmark, 3 tasks of 12 classes.
TOSCA trains 30 epochs per task here (about 1 s a task on the micro ViT) so that a kill can land between two tasks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.files import typedfile
from clbench.records.results import load_record
from clbench.records.schema import RunRecord
from clbench.sweep import (
    ATTEMPT_FILE,
    SWEEP_FILE,
    RunOutcome,
    SweepSpec,
    WorkerPayload,
    execute,
    execution_independent,
    make_plan,
    overhead,
)
from clbench.sweep.manifest import load_manifest, write_manifest
from clbench.sweep.worker import read_outcome

RUNS = ("simplecil-emoji-s1", "simplecil-emoji-s2", "tosca-emoji-s1", "tosca-emoji-s2")
MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "12", "--increment", "12"]
SWEEP = ["sweep", "--strategies", "simplecil,tosca", "--seeds", "1,2", *MICRO, "--set", "tosca.epochs=30", "--no-tsne"]


def records(out: Path) -> dict[str, RunRecord]:
    return {r: load_record(out / "runs" / r) for r in RUNS}


def sweep(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    cap = capsys.readouterr()
    return code, " ".join((cap.out + cap.err).split())  # rich wraps lines at the captured width


class Preempt(threading.Thread):
    """Kills the process running ``run_dir``'s run (SIGKILL, from its attempt.json) once its record holds at least
    one task and it is not complete: a pre-empted node, as far as the run can tell."""

    def __init__(self, run_dir: Path, timeout: float = 240.0) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.timeout = run_dir, timeout
        self.killed_after: int | None = None

    def run(self) -> None:
        end = time.time() + self.timeout
        while time.time() < end and self.killed_after is None:
            try:
                rec = json.loads((self.run_dir / "result.json").read_text())
                pid = json.loads((self.run_dir / ATTEMPT_FILE).read_text())["pid"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.01)
                continue
            if rec.get("complete"):
                return  # too late: the test fails on resumed_from_task
            if 1 <= len(rec["per_task"]):
                os.kill(pid, signal.SIGKILL)
                self.killed_after = len(rec["per_task"])
            time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, cache_root):
    """The reference sweep on the local backend (2 workers), with one worker killed mid-run."""
    os.environ["CLBENCH_CACHE"] = str(cache_root)
    out = tmp_path_factory.mktemp("sweep") / "local"
    killer = Preempt(out / "runs" / "tosca-emoji-s1")
    killer.start()
    code = main([*SWEEP, "--out", str(out), "--jobs", "2"])
    killer.join()
    return out, code, killer.killed_after


def test_local_sweep_survives_a_killed_worker_and_writes_the_table(local_sweep):
    out, code, killed_after = local_sweep
    assert code == 0
    assert killed_after is not None, "the kill never landed"
    recs = records(out)
    assert all(r.complete for r in recs.values())
    assert recs["tosca-emoji-s1"].resumed_from_task == [killed_after]  # continued, not restarted
    manifest = json.loads((out / SWEEP_FILE).read_text())
    assert manifest["complete"] and manifest["backend"]["backend"] == "local"
    assert manifest["runs"]["tosca-emoji-s1"]["attempts"] >= 2
    assert manifest["overhead"]["runs_executed"] == 4 and manifest["overhead"]["max_concurrent_runs"] == 2
    summary = (out / "summary.md").read_text()
    for strategy in ("simplecil", "tosca"):  # one row per strategy, 2 seeds each, mean ± half the interval
        row = next(line for line in summary.splitlines() if f"| {strategy} |" in line)
        assert "2 (1, 2)" in row and row.count(" ± ") == 2 and "seed level: t over 2 seeds" in row
    csv = (out / "summary.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[0].startswith("bench,")
    assert (out / "report" / "index.html").exists()


@pytest.mark.full
def test_ray_cluster_gives_the_local_records_and_retries_a_preempted_run(local_sweep, tmp_path, capsys):
    """Full tier: the default tier carries the Ray path with
    test_ray_backend_starts_its_own_local_ray_when_given_no_address."""
    if importlib.util.find_spec("ray") is None:  # not imported: Ray reads its settings once, at import
        pytest.skip("Ray is not installed: pip install -e '.[test]' installs it")
    local, code, _ = local_sweep
    assert code == 0
    ray_bin = Path(sys.executable).parent / "ray"
    port = free_port()
    # `--block` keeps `ray start` in the foreground: terminating it stops this cluster only, not the user's others.
    head = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    try:
        deadline = time.time() + 120
        while True:  # the head's GCS port answers once the cluster is up
            assert head.poll() is None and time.time() < deadline, "ray start --head failed"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        out = tmp_path / "ray"
        killer = Preempt(out / "runs" / "tosca-emoji-s1")
        killer.start()
        code, text = sweep(
            [*SWEEP, "--out", str(out), "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--no-report"], capsys
        )
        killer.join()
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
    assert code == 0, text
    assert killer.killed_after is not None, "the kill never landed"
    ray_recs, local_recs = records(out), records(local)
    for run_id in RUNS:
        assert execution_independent(ray_recs[run_id]) == execution_independent(local_recs[run_id]), run_id
    assert ray_recs["tosca-emoji-s1"].resumed_from_task == [killer.killed_after]
    manifest = json.loads((out / SWEEP_FILE).read_text())
    assert manifest["backend"]["backend"] == "ray" and manifest["backend"]["cpus_per_run"] == 1
    hosts = {manifest["runs"][r]["pid"] for r in RUNS}
    assert os.getpid() not in hosts  # the runs ran in Ray's workers, not in this process


def test_completed_runs_are_skipped_on_reinvocation(local_sweep, tmp_path, capsys):
    local, _, _ = local_sweep
    out = tmp_path / "again"
    shutil.copytree(local, out)
    mtimes = {r: (out / "runs" / r / "result.json").stat().st_mtime_ns for r in RUNS}
    code, text = sweep([*SWEEP, "--out", str(out), "--no-report"], capsys)
    assert code == 0, text
    assert "0 runs executed, 4 skipped" in text
    assert {r: (out / "runs" / r / "result.json").stat().st_mtime_ns for r in RUNS} == mtimes
    manifest = json.loads((out / SWEEP_FILE).read_text())
    assert {v["status"] for v in manifest["runs"].values()} == {"skipped"}
    assert manifest["history"][-1]["overhead"]["runs_executed"] == 4  # the first invocation's figures are kept


@pytest.mark.full
def test_a_killed_sweep_is_continued_not_restarted(local_sweep, tmp_path, capsys, cache_root):
    """SIGKILL the sweep process itself (not its worker) mid-run; its worker dies with it, and the same command
    continues the run from its checkpoint to the record the uninterrupted sweep wrote. Full tier: the default tier
    carries the continuation with test_completed_runs_are_skipped_on_reinvocation and the killed worker of
    test_local_sweep_survives_a_killed_worker_and_writes_the_table."""
    local, _, _ = local_sweep
    out = tmp_path / "killed"
    argv = [*SWEEP[:2], "tosca", "--seeds", "1", *SWEEP[5:], "--out", str(out), "--no-report"]
    env = {**os.environ, "CLBENCH_CACHE": str(cache_root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clbench.cli", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run_dir = out / "runs" / "tosca-emoji-s1"
    deadline, killed_after = time.time() + 240, None
    while time.time() < deadline and proc.poll() is None:
        try:
            rec = json.loads((run_dir / "result.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
            continue
        if not rec["complete"] and rec["per_task"]:
            proc.send_signal(signal.SIGKILL)  # the sweep only: its pool worker must not go on writing
            killed_after = len(rec["per_task"])
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert killed_after is not None, "the sweep ended before the kill"
    worker = json.loads((run_dir / ATTEMPT_FILE).read_text())["pid"]
    for _ in range(1200):  # the worker dies with the sweep (PR_SET_PDEATHSIG); a minute at most, so that a busy
        # machine, slow to schedule the dying worker, does not fail the test (it dies within milliseconds when idle)
        if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the pool worker outlived the killed sweep")
    manifest = json.loads((out / SWEEP_FILE).read_text())
    assert not manifest["complete"]

    code, text = sweep(argv, capsys)
    assert code == 0, text
    assert "1 to continue from their checkpoint" in text
    rec = load_record(run_dir)
    assert rec.resumed_from_task == [killed_after]
    assert execution_independent(rec) == execution_independent(records(local)["tosca-emoji-s1"])


# ----------------------------------------------------------------------------------------------- refusals
def test_folder_with_other_settings_is_refused_before_anything_runs(local_sweep, tmp_path, capsys):
    local, _, _ = local_sweep
    out = tmp_path / "other"
    shutil.copytree(local, out)
    argv = [*SWEEP, "--out", str(out), "--no-report"]
    argv[argv.index("tosca.epochs=30")] = "tosca.epochs=31"
    code, text = sweep(argv, capsys)
    assert code == 2
    assert "2 run folder(s) of this sweep hold runs it cannot skip or continue" in text
    assert "--set: epochs=30 there, epochs=31 here" in text and "choose another --out" in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--strategies", "simplecil,tosca", "--set", "epochs=5"], "scope a setting to one strategy"),
        (["--strategies", "tosca", "--set", "l2p.epochs=5"], "'l2p' is not one of the sweep's strategies"),
        (["--strategies", "simplecil,tosk"], "did you mean 'tosca'"),
        (["--strategies", "tosca", "--seeds", "1,x"], "--seeds: 'x' is not an integer"),
        (["--strategies", "tosca", "--seeds", "5..1"], "--seeds: the range '5..1' runs backwards"),
        (["--strategies", "tosca", "--seeds", "1..5000"], "asks for more than 1000 seeds"),
        (["--strategies", ","], "--strategies is empty"),
        (["--strategies", "tosca", "--profile", "turbo"], "none of tosca has that profile"),
        (["--strategies", "tosca", "--ray-address", "127.0.0.1:1"], "--ray-address is for --backend ray"),
        (["--strategies", "tosca", "--jobs", "0"], "--jobs must be >= 1"),
    ],
)
def test_bad_sweeps_are_one_clear_line(argv, needle, tmp_path, capsys):
    code, text = sweep(["sweep", *argv, *MICRO, "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and needle in text, text
    assert "Traceback" not in text


def test_every_sweep_flag_comes_from_one_declaration():
    """`clbench sweep`'s flags are generated from clbench.sweep.settings (SweepArgs, Resources) and RunConfig, each
    with the field's default and help; cli.py writes only --set and the options every run takes."""
    import dataclasses
    import inspect

    from clbench import cli
    from clbench.core import config
    from clbench.errors import ClbenchError
    from clbench.sweep.settings import Resources, SweepArgs

    sub = cli.build_parser("sweep").commands["sweep"]
    options = {o: a for a in sub._actions for o in a.option_strings}
    classes = (SweepArgs, Resources, config.RunConfig)
    declared = {name for cls in classes for name in config.flag_fields("sweep", cls)}
    generated = {o for o, a in options.items() if a.dest in declared}
    assert set(options) - generated == {"--set", "--config", "--log", "--log-dir", "-h", "--help"}
    assert {"--jobs", "--memory-per-run", "--ray-timeout", "--retries", "--report", "--no-tsne"} <= generated
    for cls in (SweepArgs, Resources):
        for f in dataclasses.fields(cls):
            action = next(a for a in sub._actions if a.dest == f.name)
            default = None if f.default is dataclasses.MISSING else f.default
            assert action.default == (list(default) if isinstance(default, tuple) else default), f.name
            assert action.help == f.metadata["cli"].help, f.name
    assert options["--memory-per-run"].dest == "memory_per_run_gb" and options["--memory-per-run"].metavar == "GB"
    # each default is written once: the parser's defaults build the declarations' defaults
    args = sub.parse_args(["--strategies", "tosca", "--out", "x"])
    assert Resources(**{n: getattr(args, n) for n in config.flag_fields("sweep", Resources)}) == Resources()
    assert SweepArgs(**{n: getattr(args, n) for n in config.flag_fields("sweep", SweepArgs)}) == SweepArgs(
        strategies="tosca", out="x"
    )
    assert (Resources().retries, Resources().ray_timeout) == (2, 30.0)
    assert "(default: 30)" in options["--ray-timeout"].help % {"default": Resources().ray_timeout}
    assert inspect.getsource(cli._add_sweep_args).count("default=") == 1  # --set's
    # the checks are the fields': the same message from Python (the setting) and the command line (the flag)
    with pytest.raises(ClbenchError, match="^memory_per_run_gb must be > 0") as e:
        Resources(memory_per_run_gb=0)
    assert e.value.render(as_flags=True).startswith("--memory-per-run must be > 0 and <= 1048576 (got 0)")
    with pytest.raises(ClbenchError, match="^retries must be >= 0 and <= 100 \\(got -1\\)"):
        Resources(retries=-1)
    with pytest.raises(ClbenchError, match="^backend 'slurm' is unknown; valid backends: local, ray"):
        SweepArgs(strategies="tosca", out="x", backend="slurm")
    with pytest.raises(ClbenchError, match="^clbench sweep needs out"):
        SweepArgs(strategies="tosca", out=None)


def test_a_run_no_ray_node_can_hold_is_refused_before_submitting(tmp_path, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[test]' installs it")
    code, text = sweep(
        [
            "sweep",
            "--strategies",
            "simplecil",
            *MICRO,
            "--out",
            str(tmp_path / "r"),
            "--backend",
            "ray",
            "--jobs",
            "1",
            "--gpus-per-run",
            "1",
        ],
        capsys,
    )
    assert code == 2 and "no Ray node can hold one run (CPU 1, GPU 1" in text, text
    assert "lower --cpus-per-run / --gpus-per-run / --memory-per-run" in text
    assert not sys.modules["ray"].is_initialized()  # the local Ray started for the sweep is shut down again


def test_ray_backend_starts_its_own_local_ray_when_given_no_address(local_sweep, tmp_path, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[test]' installs it")
    local, _, _ = local_sweep
    out = tmp_path / "own"
    argv = [
        "sweep",
        "--strategies",
        "simplecil",
        "--seeds",
        "1",
        *MICRO,
        "--out",
        str(out),
        "--backend",
        "ray",
        "--jobs",
        "1",
        "--no-report",
    ]
    code, text = sweep(argv, capsys)
    assert code == 0, text
    manifest = json.loads((out / SWEEP_FILE).read_text())
    assert manifest["backend"]["address"] == "local (started for the sweep)"
    assert manifest["backend"]["cluster"]["CPU"] == 1  # --jobs 1 x 1 CPU per run
    rec = load_record(out / "runs" / "simplecil-emoji-s1")
    assert execution_independent(rec) == execution_independent(records(local)["simplecil-emoji-s1"])
    assert not sys.modules["ray"].is_initialized()


def test_ray_backend_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    code, text = sweep([*SWEEP, "--out", str(tmp_path / "n"), "--backend", "ray"], capsys)
    assert code == 2 and "--backend ray needs Ray, which is not installed" in text, text
    assert "pip install 'clbench[ray]'" in text


def test_a_failing_run_is_reported_and_the_table_says_incomplete(tmp_path, capsys):
    """A run that fails with a user error is not retried; the others finish, the sweep exits 1 and its summary
    says which runs are missing."""
    out = tmp_path / "partial"
    code, text = sweep(
        [
            "sweep",
            "--strategies",
            "simplecil",
            "--benches",
            "emoji,folder",
            "--seeds",
            "1",
            "--data-root",
            f"folder={tmp_path / 'nowhere'}",
            *MICRO,
            "--out",
            str(out),
            "--no-report",
        ],
        capsys,
    )
    assert code == 1, text
    manifest = json.loads((out / SWEEP_FILE).read_text())
    failed = manifest["runs"]["simplecil-folder-s1"]
    assert failed["state"] == "failed" and failed["attempts"] == 1 and "nowhere" in failed["error"]
    assert manifest["runs"]["simplecil-emoji-s1"]["state"] == "complete" and not manifest["complete"]
    assert "Incomplete sweep: 1 of 2 runs" in (out / "summary.md").read_text()


def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path, capsys):
    import fcntl

    from clbench.files.safety import mark_folder

    out = tmp_path / "busy"
    out.mkdir()
    mark_folder(out, "sweep")  # as the running sweep marked it, first
    with open(out / ".sweep.lock", "w") as held:  # as a running sweep holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, text = sweep([*SWEEP, "--out", str(out)], capsys)
    assert code == 2 and f"another clbench sweep is running in {out}" in text, text
    assert not (out / "runs").exists()


def test_dry_run_shows_the_plan_and_starts_nothing(tmp_path, capsys):
    code, text = sweep([*SWEEP, "--out", str(tmp_path / "d"), "--dry-run"], capsys)
    assert code == 0 and all(r in text for r in RUNS) and "nothing was started" in text
    assert not (tmp_path / "d").exists()


def test_seeds_take_ranges_and_vary_the_seed_asked_for(tmp_path, capsys):
    from clbench.sweep.plan import make_plan, parse_seeds

    assert parse_seeds("1993..1997") == (1993, 1994, 1995, 1996, 1997)
    assert parse_seeds("7,1..3,2") == (7, 1, 2, 3)  # order kept, repeats dropped
    base = ["sweep", "--strategies", "simplecil", "--seeds", "1..2", *MICRO, "--dry-run"]
    expected = {  # --vary -> (run ids, (seed, class-order seed) per run)
        "seed": (["simplecil-emoji-s1", "simplecil-emoji-s2"], [(1, 5), (2, 5)]),
        "class-order": (["simplecil-emoji-s9-o1", "simplecil-emoji-s9-o2"], [(9, 1), (9, 2)]),
        "both": (["simplecil-emoji-s1-o1", "simplecil-emoji-s2-o2"], [(1, 1), (2, 2)]),
    }
    for vary, (ids, _seeds) in expected.items():
        code, text = sweep(
            [*base, "--vary", vary, "--seed", "9", "--class-order-seed", "5", "--out", str(tmp_path)], capsys
        )
        assert code == 0 and all(i in text for i in ids), text
    from clbench.sweep.plan import SweepSpec

    for vary, (ids, seeds) in expected.items():
        spec = SweepSpec(("simplecil",), ("emoji",), (1, 2), tmp_path, {"class_order_seed": 5}, vary=vary, seed=9)
        plan = make_plan(spec)
        assert [r.run_id for r in plan] == ids
        assert [(r.cfg.seed, r.cfg.class_order_seed) for r in plan] == seeds


def test_overhead_arithmetic():
    seq = [RunOutcome(started_at=10.0 + 5 * i, finished_at=14.0 + 5 * i, collected_at=14.5 + 5 * i) for i in range(3)]
    ov = overhead([*seq, RunOutcome(status="skipped")], sweep_start=8.0)  # a run not executed does not count
    assert ov["startup_s"] == pytest.approx(2.0) and ov["max_concurrent_runs"] == 1 and ov["runs_executed"] == 3
    assert ov["per_run_s"] == pytest.approx((14.5 + 10 - 10 - 12) / 3)  # window 14.5 s, 12 s of runs
    par = [RunOutcome(started_at=0.0, finished_at=4.0, collected_at=4.0) for _ in range(2)]
    ov = overhead(par, sweep_start=0.0)
    assert ov["max_concurrent_runs"] == 2 and ov["per_run_s"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------------------------- sweep.json, typed
COMMITTED = Path(__file__).resolve().parent.parent / "reports" / "sweep-emoji" / SWEEP_FILE


def test_the_manifest_of_a_sweep_reads_and_writes_back_byte_identical(local_sweep, tmp_path):
    """sweep.json as the sweep wrote it: read (each run's outcome typed) and written again, the same bytes."""
    out, _, _ = local_sweep
    manifest = load_manifest(out / SWEEP_FILE)
    outcome = manifest.runs["tosca-emoji-s1"].outcome
    assert outcome.status == "done" and outcome.attempts >= 2 and outcome.resumed_from_task
    assert outcome.span() is not None and outcome.extra == {}
    write_manifest(tmp_path / SWEEP_FILE, manifest)
    assert (tmp_path / SWEEP_FILE).read_bytes() == (out / SWEEP_FILE).read_bytes()


def rewritten(raw: dict, tmp_path: Path) -> str:
    """The text of ``raw`` written as the sweep writes it, read as a manifest and written again."""
    (tmp_path / "in.json").write_text(json.dumps(raw, indent=2) + "\n")
    write_manifest(tmp_path / "out.json", load_manifest(tmp_path / "in.json"))
    assert (tmp_path / "out.json").read_text() == (tmp_path / "in.json").read_text()
    return (tmp_path / "out.json").read_text()


def test_an_outcomes_unknown_key_and_an_earlier_layout_are_written_back_as_read(tmp_path):
    """A key this clbench does not know, among the outcome's, is kept in ``extra`` and written back in its place;
    a failed run as an earlier clbench wrote it (attempts before collected_at) keeps that order."""
    raw = load_manifest(COMMITTED).to_dict()  # as this clbench writes it (the committed file predates --vary)
    run_id, entry = next(iter(raw["runs"].items()))
    keys = list(entry)
    at = keys.index("status") + 1
    raw["runs"][run_id] = {**{k: entry[k] for k in keys[:at]}, "from_the_future": [1, 2], **entry}
    rewritten(raw, tmp_path)
    outcome = load_manifest(tmp_path / "in.json").runs[run_id].outcome
    assert outcome.extra == {"from_the_future": [1, 2]} and outcome.status == "done"
    head = {k: entry[k] for k in ("path", "state_at_start", "tasks_done_at_start", "fingerprint")}
    failed = {**head, "state": "failed", "queued_at": 1.0, "status": "failed", "error": "x", "attempts": 3}
    raw["runs"][run_id] = {**failed, "collected_at": 2.0}
    assert '"attempts": 3,\n      "collected_at": 2.0' in rewritten(raw, tmp_path)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("attempts", "two", "an integer >= 1"),
        ("status", "error", "one of done, failed, skipped"),
        ("queued_at", -1, "a time (epoch seconds, a finite number >= 0)"),
        ("resumed_from_task", [1, "2"], "a list of integers >= 0"),
        ("last_acc", 101, "a percentage (0 to 100)"),
    ],
)
def test_a_manifest_with_a_wrong_typed_outcome_field_is_refused_naming_it(tmp_path, field, value, expected):
    raw = json.loads(COMMITTED.read_text())
    run_id = next(iter(raw["runs"]))
    raw["runs"][run_id][field] = value
    path = tmp_path / SWEEP_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(ClbenchError) as e:
        load_manifest(path)
    message = e.value.args[0]
    assert message.startswith(f"{path}: field runs.{run_id}.{field} is {type(value).__name__} ") and message.endswith(
        f", expected {expected}"
    ), message
    assert "delete or move sweep.json" in e.value.hint


def test_the_worker_payload_and_outcome_are_typed_across_the_process_boundary(local_sweep):
    """What crosses to a worker and back is the JSON form of a WorkerPayload / RunOutcome, checked on arrival: a
    payload with a wrong-typed field comes back as a failed outcome naming it (a user error: not retried), an
    outcome with one is refused naming it."""
    import torch

    out, _, _ = local_sweep
    (run,) = [r for r in make_plan(spec_of(load_manifest(out / SWEEP_FILE), out)) if r.run_id == RUNS[0]]
    payload = WorkerPayload(
        run_id=run.run_id,
        config=dataclasses.asdict(run.cfg),
        fingerprint=run.fingerprint,
        env={},
        threads=torch.get_num_threads(),  # this process's own: the worker's setting changes nothing here
        sweep_id="test",
    )
    sent = json.loads(json.dumps(typedfile.write(payload)))  # as JSON, wherever the worker runs
    assert not typedfile.problems(WorkerPayload, sent) and typedfile.read(WorkerPayload, sent).run_id == run.run_id
    done = read_outcome(execute(sent))  # the run is complete: its retry reports it done without running it
    assert done.status == "done" and done.run_id == run.run_id and done.resumed_from_task == []
    failed = read_outcome(execute({**sent, "threads": "two"}))
    assert failed.status == "failed" and failed.run_id is None
    assert "payload for this run is not one this clbench reads: field threads is str 'two', expected an integer" in (
        failed.error
    ), failed.error
    with pytest.raises(ClbenchError, match="outcome is not one this clbench reads: field attempts is str 'two'"):
        read_outcome({**done.to_dict(), "attempts": "two"})


def spec_of(manifest, out: Path) -> SweepSpec:
    """The SweepSpec that planned ``manifest`` (a sweep without --data-root)."""
    overrides = tuple((scope, key, value) for scope, key, value in manifest.overrides)
    return SweepSpec(
        tuple(manifest.strategies),
        tuple(manifest.benches),
        tuple(manifest.seeds),
        out,
        dict(manifest.settings),
        profile=manifest.profile,
        overrides=overrides,
        vary=manifest.vary,
    )
