"""``clbench tune --jobs N`` / ``--backend ray``: trials run at once through the sweep's backends, each an ordinary
record written by a worker; the first settings are the same as those of the study run one trial at a time; the
progress counts finished trials; a study whose process was killed with trials in flight continues them. Micro ViT
(random weights) on the embedded benchmark, SLDA's closed-form head: seconds per trial."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clbench.core.config import RunConfig
from clbench.records.results import load_record

MICRO = dict(bench="emoji", backbone="vit_micro", weights="random", precision="fp32")
TUNE_ARGV = ["--backbone", "vit_micro", "--weights", "random", "--precision", "fp32"]
ARGV = ["tune", "--strategy", "slda", "--bench", "emoji", "--validation", "0.2", "--no-pruner", *TUNE_ARGV]


def _cli(argv: list[str]) -> int:
    from clbench.cli import main

    return main(argv)


def _trials(out) -> list:
    import optuna

    from clbench.tune.study import _storage

    return optuna.load_study(study_name="slda-emoji", storage=_storage(out)).get_trials()


def _request(out, trials: int, pruner: bool = False, **where):
    from clbench.tune.parallel import Where
    from clbench.tune.space import search_space
    from clbench.tune.study import TuneRequest

    base = RunConfig(strategy="slda", validation=0.2, **MICRO)
    return TuneRequest("slda", search_space("slda"), trials, base, out, pruner=pruner, where=Where(**where))


def _check_records(out, trials) -> None:
    """Every finished trial is a complete validation record, written by a worker process, not by this one."""
    for t in trials:
        if t.state.name != "COMPLETE":
            continue
        folder = out / "trials" / f"trial-{t.number:04d}"
        record = load_record(folder)
        assert record.summary(record.protocol).last_acc == t.value
        assert record.strategy_config["shrinkage"] == t.params["shrinkage"]
        assert json.loads((folder / "result.json").read_text())["evaluated_on"] == "validation"
        assert json.loads((folder / "attempt.json").read_text())["pid"] != os.getpid()
        assert sorted(t.intermediate_values) == list(range(len(record.task_sizes)))  # each task's accuracy, told


def test_two_workers_finish_the_trials_with_the_first_settings_of_a_study_run_one_at_a_time(tmp_path):
    from clbench.tune.study import run_study

    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    run_study(_request(serial, 4), log=lambda m: None)
    progress: list[int] = []
    messages: list[str] = []
    request = _request(parallel, 4, pruner=True, jobs=2)  # the pruner asked for: trials run at once are not pruned
    outcome = run_study(request, log=messages.append, advance=lambda n, best: progress.append(n))
    trials = _trials(parallel)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    # trial 0 (the defaults) and TPE's seeded start-up draws: the same whatever order the workers finish in
    assert [t.params for t in trials] == [t.params for t in _trials(serial)]
    assert trials[0].params == {"shrinkage": 1e-4}
    _check_records(parallel, trials)
    assert progress == [1, 2, 3, 4]  # the progress bar counts finished trials
    assert "trials run through the local backend, 2 at once (not pruned)" in messages
    assert any(m.startswith("measured: ") and m.endswith(", 2 at once") for m in messages), messages
    summary = outcome.summary
    assert summary["search"]["trials_at_once_this_session"] == "2 trials at once (local worker processes)"
    assert summary["search"]["pruner"].endswith("not applied to trials run at once")
    assert summary["trials"]["complete"] == 4 and outcome.chosen.exists()


def test_the_cost_printed_before_the_study_counts_the_trials_run_at_once(tmp_path, capsys):
    assert _cli([*ARGV, "--trials", "3", "--jobs", "2", "--out", str(tmp_path / "s")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    cost = "cost of the study: 3 trials, 2 trials at once (local worker processes): wall time about 2 x one trial's"
    assert cost in out
    assert "cost of the study: 3 trials one after another" not in out


@pytest.mark.full  # four trials in worker processes, a kill and a resume: a minute idle, several on a loaded machine
def test_a_study_killed_with_trials_in_flight_continues_them(tmp_path):
    out = tmp_path / "study"
    argv = [*ARGV, "--trials", "4", "--jobs", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    code = "import sys; from clbench.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=subprocess.DEVNULL)
    killed = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if (out / "study.journal").exists():
                states = [t.state.name for t in _trials(out)]
                if "COMPLETE" in states and "RUNNING" in states:  # one told, others in the workers
                    proc.send_signal(signal.SIGKILL)
                    killed = states
                    break
            time.sleep(0.02)
    finally:
        if proc.poll() is None and killed is None:
            proc.kill()
        proc.wait()
    assert killed is not None, "the kill never landed"
    before = _trials(out)
    # a trial killed between its ask and its draws has no settings to try again: it is only marked failed
    cut = [t for t in before if t.state.name == "RUNNING"]
    assert any(t.params for t in cut), [(t.number, t.state.name, t.params) for t in before]
    assert _cli(argv) == 0
    after = _trials(out)
    for t in before:
        if t.state.name == "COMPLETE":  # finished trials are kept, not rerun
            assert after[t.number].value == t.value and after[t.number].state.name == "COMPLETE"
    for t in cut:  # marked failed, and their settings run again under new numbers
        assert after[t.number].state.name == "FAIL" and after[t.number].user_attrs["interrupted"]
        again = [u for u in after if u.params == t.params and u.number > t.number and u.state.name == "COMPLETE"]
        assert again or not t.params, [(u.number, u.state.name, u.params) for u in after]
    assert sum(t.state.name == "COMPLETE" for t in after) == 4
    _check_records(out, after)


@pytest.mark.full  # starts a local Ray
def test_trials_run_as_ray_tasks_on_a_local_ray(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[test]' installs it")
    from clbench.tune.study import run_study

    out = tmp_path / "ray"
    messages: list[str] = []
    outcome = run_study(_request(out, 2, backend="ray", jobs=2), log=messages.append)
    trials = _trials(out)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    _check_records(out, trials)  # written in Ray's workers
    assert "trials run through the ray backend, 2 at once (not pruned)" in messages
    assert outcome.summary["search"]["trials_at_once_this_session"] == "2 trials at once on a local Ray"
    assert not sys.modules["ray"].is_initialized()  # the local Ray started for the study is shut down again


def test_ray_backend_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    assert _cli([*ARGV, "--trials", "2", "--backend", "ray", "--out", str(tmp_path / "s")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--backend ray needs Ray, which is not installed" in err and "pip install 'clbench[ray]'" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--ray-address", "127.0.0.1:1"], "--ray-address is for --backend ray"),
        (["--jobs", "0"], "--jobs 0: expected 1 or more"),
        (["--cpus-per-run", "2"], "--cpus-per-run is for trials run at once"),
    ],
)
def test_bad_backend_flags_are_refused_before_the_study_starts(tmp_path, capsys, flags, message):
    out = tmp_path / "s"
    assert _cli([*ARGV, "--trials", "2", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.full
def test_trials_run_on_a_ray_cluster_at_its_address(tmp_path, capsys):
    """Full tier, as the sweep's cluster test: the default tier carries the Ray path with a local Ray."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[test]' installs it")
    import socket
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_bin = Path(sys.executable).parent / "ray"
    # `--block` keeps `ray start` in the foreground: terminating it stops this cluster only, not the user's others.
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--node-ip-address=127.0.0.1"]
        + ["--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    out = tmp_path / "study"
    try:
        deadline = time.monotonic() + 120
        while True:  # the head's GCS port answers once the cluster is up
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head failed"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        argv = [*ARGV, "--trials", "3", "--out", str(out), "--backend", "ray", "--ray-address", f"127.0.0.1:{port}"]
        code = _cli(argv)
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
    text = " ".join(capsys.readouterr().out.split())
    assert code == 0, text
    where = f"as many trials as its CPUs hold at once on 127.0.0.1:{port}"
    assert f"cost of the study: 3 trials, {where}" in text  # the cluster's CPUs decide
    assert "trials run through the ray backend, 2 at once (not pruned)" in text  # its 2 CPUs, 1 per trial
    trials = _trials(out)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    _check_records(out, trials)
    summary = json.loads((out / "tuning.json").read_text())
    assert (
        summary["search"]["trials_at_once_this_session"]
        == f"as many trials as its CPUs hold at once on 127.0.0.1:{port}"
    )
