"""Every file clbench reads is checked before use, every size it is given is bounded, and every folder it writes into
is its own (issue 55, items 4, 5 and 8): each hostile case of round five kept as a regression test.

Fixtures are built under ``tmp_path``; runs use the micro ViT with random weights, a four-class image folder made
here and this module's own feature cache. No test reads the wall-clock: the SIGTERM test waits on the measurement's
own line saying it holds its temporary folder, not on a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_checks import assert_outcome, run_cli
from datatrees import make_tree
from test_budget import budget_runs
from test_report import REPO, copy_runs

from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.run import checkpoint
from clbench.run.checkpoint import CHECKPOINT_FILE

MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "2", "--increment", "2"]


def run_argv(data: Path, out: Path, *extra: str, strategy: str = "simplecil") -> list[str]:
    return ["run", "--strategy", strategy, "--bench", "folder", "--data-root", str(data), *MICRO, "--out", str(out)]


# ----------------------------------------------------------------------------------------------- item 4: folders
def test_a_cache_sub_folder_that_links_elsewhere_is_refused_never_written_through(tmp_path, monkeypatch, capsys):
    cache, foreign = tmp_path / "cache", tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "theirs.txt").write_text("someone else's\n")
    cache.mkdir()
    (cache / "features").symlink_to(foreign)
    monkeypatch.setenv("CLBENCH_CACHE", str(cache))
    code, out, err = run_cli(run_argv(make_tree(tmp_path / "data"), tmp_path / "run"), capsys)
    assert_outcome(code, out, err, 2, "features/ is a symbolic link")
    assert "cache folder" in err and "delete the link" in err, err
    assert sorted(p.name for p in foreign.iterdir()) == ["theirs.txt"]  # no entry, no lock, no memo written there


@pytest.mark.parametrize("name", ["machine", "weights", "wheels"])
def test_every_cache_sub_folder_is_checked(name, tmp_path, monkeypatch):
    from clbench.files.atomic import cache_subdir

    (tmp_path / "foreign").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / name).symlink_to(tmp_path / "foreign")
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ClbenchError, match=f"{name}/ is a symbolic link"):
        cache_subdir(name)


# ----------------------------------------------------------------------------------------------- item 4: sizes
BOUNDED = {  # measurement, its flags, the bound the refusal names
    "records-1e9": ("report-scale", ["--records", "1000000000"], "--records must be >= 1 and <= 10000"),
    "steps-1e9": ("train-step", ["--steps", "1000000000"], "--steps must be >= 1 and <= 1000"),
    "epochs-1e6": ("decoded-cache", ["--epochs", "1000000"], "--epochs must be >= 2 and <= 50"),
    "epochs-1": ("decoded-cache", ["--epochs", "1"], "--epochs must be >= 2 and <= 50"),
    "warm-runs-1e6": ("main-job", ["--warm-runs", "1000000"], "--warm-runs must be >= 1 and <= 20"),
    "runs-1e6": ("warm-runs", ["--runs", "1000000"], "--runs must be >= 1 and <= 20"),
    "sweep-runs-1e6": ("sweep-overhead", ["--runs", "1000000"], "--runs must be >= 2 and <= 50"),
    "repeats-1e9": ("calibrate", ["--repeats", "1000000000"], "--repeats must be >= 1 and <= 100"),
    "img-size-1e5": ("feature-probe", ["--img-size", "100000"], "--img-size must be >= 16 and <= 1024"),
    "width-1e9": ("params", ["--d", "1000000000"], "--d must be >= 1 and <= 16384"),
}


@pytest.mark.parametrize("case", list(BOUNDED))
def test_perf_sizes_are_bounded_where_read(case, capsys):
    """Parsed only (nothing is measured): the bound is checked as the flag is read, and named in one line."""
    from clbench.cli import _Parser
    from clbench.perf import measurements

    name, flags, needle = BOUNDED[case]
    parser = _Parser(prog=f"clbench perf {name}")
    measurements().get(name).add_arguments(parser)
    with pytest.raises(ClbenchError) as refused:
        parser.parse_args(flags)
    assert needle in refused.value.args[0] and "\n" not in refused.value.args[0]


def test_the_cli_refuses_a_size_out_of_bounds_in_one_line(capsys):
    code, out, err = run_cli(["perf", "report-scale", "--records", "1000000000"], capsys)
    assert_outcome(code, out, err, 2, "--records must be >= 1 and <= 10000 (got 1000000000")


def test_a_task_plan_too_large_to_build_is_refused_before_it_is_built():
    from clbench.perf.params import parse_tasks

    with pytest.raises(ClbenchError, match="1,000,000,000 tasks; the bound is 1 to 1,000"):
        parse_tasks("1000000000x1")  # (1,) * 10^9 would be built first, 8 GB
    assert parse_tasks("10x10") == (10,) * 10


HOLDER = """
import sys, tempfile
from clbench.perf import MEASUREMENTS, Measurement, measurements

def hold(flags):
    with tempfile.TemporaryDirectory(prefix="clbench-held-") as tmp:
        open(tmp + "/partial.json", "w").write("{}")
        print(tmp, flush=True)
        sys.stdin.read()  # until the test closes it: SIGTERM arrives here
    return {"benchmark": "hold"}

measurements()
MEASUREMENTS.register("hold-tmp", Measurement("hold-tmp", "holds a temporary folder", hold))
from clbench.cli import main
sys.exit(main(["perf", "hold-tmp"]))
"""


def test_sigterm_during_a_measurement_removes_its_temporary_folder(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    held = Path(proc.stdout.readline().decode().strip())  # printed once the folder exists: no timing involved
    assert held.parent == tmp_path and (held / "partial.json").is_file(), proc.stderr.read().decode()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait()
    assert code == 128 + signal.SIGTERM, proc.stderr.read().decode()
    assert not held.exists() and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------- item 5: features.npz
def _features(kind: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    frozen = rng.normal(size=(300, 8)).astype(np.float16)
    if kind == "nan":
        frozen[5, 2] = np.nan
    elif kind == "inf":
        frozen[7, 0] = np.inf
    elif kind == "one-column":
        frozen = frozen[:, :1]
    elif kind == "constant":
        frozen[:] = 0.5
    labels = np.arange(300) % 12
    return {"frozen": frozen, "labels": labels, "tasks": labels // 2}


FEATURE_CASES = {
    "nan": "frozen holds 1 NaN or infinite value(s)",
    "inf": "frozen holds 1 NaN or infinite value(s)",
    "one-column": "frozen has 1 column(s); a t-SNE needs at least 2",
    "constant": "frozen has the same values in every row (no variance)",
}


@pytest.mark.parametrize("kind", list(FEATURE_CASES))
def test_a_features_file_that_cannot_be_drawn_skips_its_figure_with_a_note(kind, tmp_path, capsys):
    runs = copy_runs(tmp_path / "runs", ["sc-s1993"])
    path = runs / "sc-s1993" / "features.npz"
    np.savez_compressed(path, **_features(kind))
    code, out, err = run_cli(["report", str(runs), "--out", str(tmp_path / "rep"), "--tsne"], capsys)
    assert_outcome(code, out, err, 0, "report: 1 runs", stream="out")
    readme = " ".join((tmp_path / "rep" / "README.md").read_text().split())
    assert f"no t-SNE for run sc-s1993: features.npz is unreadable ({path}: {FEATURE_CASES[kind]}" in readme, readme


def test_the_features_check_passes_what_a_run_writes():
    from clbench.features.embeddings import encode
    from clbench.files.safety import npz_arrays
    from clbench.records.features import checked_embeddings

    rng = np.random.default_rng(1)
    data = npz_arrays(
        encode(np.arange(20), np.arange(20) % 4, np.arange(20) // 10, rng.normal(size=(20, 16)), None, ""), 2**20
    )
    assert checked_embeddings("features.npz", data) is data


# ----------------------------------------------------------------------------------------------- item 5: predictions
def test_a_negative_index_in_predictions_is_refused_naming_the_file():
    from clbench.records import predictions

    preds = predictions.Predictions(
        ("per-sample",),
        np.zeros(3, np.int32),
        np.array([0, -1, 2], np.int32),
        np.zeros(3, np.int32),
        np.zeros(3, np.int32),
        np.zeros((1, 3), np.int32),
        np.full((1, 3), 0.5, np.float32),
    )
    with pytest.raises(ClbenchError, match=r"theirs/predictions.npz: .*index holds a negative value \(-1\)"):
        predictions.from_bytes(predictions.to_bytes(preds), "theirs/predictions.npz")
    fine = dataclasses.replace(preds, index=np.array([0, 1, 2], np.int32))
    assert predictions.from_bytes(predictions.to_bytes(fine)).index.tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------------------------- item 5: weights
def test_a_weights_file_loads_the_state_dict_that_was_checked(tmp_path):
    from clbench.weights.resolve import load_model

    model, *_ = load_model("vit_micro", "random", None, 1)
    checked = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "w.pt"
    torch.save({"state_dict": checked, "state_dict_ema": {k: torch.zeros_like(v) for k, v in checked.items()}}, path)
    loaded, *_ = load_model("vit_micro", str(path), None, 0)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in checked.items())  # not timm's pick, the EMA zeros


# ----------------------------------------------------------------------------------------------- item 5: checkpoints
@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A folder run of SimpleCIL stopped after its first task (record + checkpoint), with this module's own cache."""
    from baselines.simplecil import SimpleCIL

    base = tmp_path_factory.mktemp("stopped")
    data = make_tree(base / "data")

    class Stop(Exception):
        pass

    learn = SimpleCIL.learn_task

    def stop_at(self, task):
        if task.id == 1:
            raise Stop
        learn(self, task)

    with pytest.MonkeyPatch.context() as m, pytest.raises(Stop):
        m.setenv("CLBENCH_CACHE", str(base / "cache"))
        m.setattr(SimpleCIL, "learn_task", stop_at)
        main(run_argv(data, base / "run"))
    assert checkpoint.load(base / "run" / CHECKPOINT_FILE).tasks_done == 1
    return {"data": data, "run": base / "run", "cache": base / "cache"}


def _edit(path: Path, doc_edit=None, tensor_edit=None) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    doc = json.loads(meta["checkpoint"])
    if doc_edit:
        doc_edit(doc)
    if tensor_edit:
        tensor_edit(tensors)
    save_file(tensors, str(path), metadata={**meta, "checkpoint": json.dumps(doc)})


def _nan_in_first_float(tensors):
    name = next(n for n, t in tensors.items() if n.startswith("strategy.") and t.is_floating_point() and t.numel())
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")


TAMPERED = {
    "strategy-tensor-nan": (None, _nan_in_first_float, "holds 1 NaN or infinite value(s)"),
    "task-classes": (
        lambda d: d["per_task"][0].update(classes=[0, 3]),
        None,
        "its task 1 entry names classes [0, 3], not the 2 that task brings",
    ),
    "cache-event": (
        lambda d: d.update(feature_cache=["hit", "trusted"]),
        None,
        "feature-cache events include 'trusted'",
    ),
    "reset-share": (lambda d: d["per_task"][0].update(reset_share=7.5), None, "reset_share is 7.5, not a share"),
}


@pytest.mark.parametrize("name", list(TAMPERED))
def test_a_tampered_checkpoint_value_is_refused_naming_the_file(name, stopped, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(stopped["cache"]))
    run = tmp_path / "run"
    shutil.copytree(stopped["run"], run)
    doc_edit, tensor_edit, needle = TAMPERED[name]
    _edit(run / CHECKPOINT_FILE, doc_edit, tensor_edit)
    code, out, err = run_cli(["run", "--resume", str(run), "--data-root", str(stopped["data"])], capsys)
    assert_outcome(code, out, err, 2, needle)
    assert f"{run / CHECKPOINT_FILE} cannot be continued" in err and "gamma" not in err, err


def test_resume_opens_no_path_the_checkpoint_names(stopped, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(stopped["cache"]))
    run = tmp_path / "run"
    shutil.copytree(stopped["run"], run)
    fifo = tmp_path / "their-data"
    os.mkfifo(fifo)  # opened, it would block the run
    _edit(run / CHECKPOINT_FILE, lambda d: d["config"].update(data_root=str(fifo)))
    code, out, err = run_cli(["run", "--resume", str(run)], capsys)
    assert_outcome(code, out, err, 2, f"names a data folder ({fifo}); clbench opens no path a checkpoint names")
    assert "--data-root PATH" in err, err
    code, out, err = run_cli(["run", "--resume", str(run), "--data-root", str(stopped["data"])], capsys)
    assert_outcome(code, out, err, 0, "continuing")  # the path given here, not the checkpoint's
    assert json.loads((run / "result.json").read_text())["complete"] is True


def test_resume_takes_no_trusting_setting_from_the_checkpoint():
    saved = {"strategy": "simplecil", "ignore_data_problems": True, "data_root": "/theirs", "weights": "random"}
    out = checkpoint._without_paths(Path("ckpt"), saved, {"data_root": "/mine"})
    assert out == {"strategy": "simplecil", "data_root": "/mine", "weights": "random"}


def test_a_restored_solver_state_must_match_the_run_settings(micro_session_factory):
    from clbench.files.safestate import SavedState

    a = micro_session_factory("acil", init_cls=12, increment=12, overrides=(("M", "128"),))
    b = micro_session_factory("acil", init_cls=12, increment=12, overrides=(("M", "128"),))
    a.strategy.learn_task(next(iter(a.tasks())).task)
    saved = a.strategy.save_state()
    tree = json.loads(json.dumps(saved.tree).replace('"gamma": 0.1', '"gamma": 1e-300'))
    assert tree != saved.tree
    with pytest.raises(ClbenchError, match=r"ckpt cannot be continued: its strategy state sets head\..*gamma = 1e-300"):
        checkpoint.restore_strategy(b.strategy, SavedState(tree, saved.tensors), Path("ckpt"))


def _small(step):
    """4 training images per class, a sixteenth of the test images: seconds for the methods that train on images."""
    y = step.task.train.labels.numpy()
    keep = np.concatenate([np.flatnonzero(y == c)[:4] for c in step.task.classes])
    task = dataclasses.replace(step.task, train=step.task.train.subset(keep))
    return dataclasses.replace(step, task=task, test=step.test.subset(np.arange(0, len(step.test), 16)))


def test_every_strategys_state_after_a_task_passes_the_restore_checks(micro_session_factory):
    """No false refusal: what every registered strategy saves after a task is finite and agrees with its settings."""
    from clbench.core.catalog import STRATEGIES

    for name in STRATEGIES.names():
        fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).Config)}
        overrides = tuple((k, v) for k, v in (("epochs", "1"), ("M", "128")) if k in fields)
        a = micro_session_factory(name, init_cls=12, increment=12, overrides=overrides)
        b = micro_session_factory(name, init_cls=12, increment=12, overrides=overrides)
        a.strategy.learn_task(_small(next(iter(a.tasks()))).task)
        saved = a.strategy.save_state()
        assert checkpoint.nonfinite_state(saved) is None, name
        checkpoint.restore_strategy(b.strategy, saved, Path("checkpoint.safetensors"))
        assert torch.is_tensor(b.strategy.predict(_small(next(iter(b.tasks()))).test)), name


# ----------------------------------------------------------------------------------------------- LOW: settings
@pytest.mark.parametrize(
    "setting, needle",
    [
        ("lr=1e308", "lr must be a number > 0 and <= 10, got 1e+308"),
        ("momentum=5", "momentum must be in [0, 1), got 5.0"),
        ("l1=1e300", "l1 must be in [0, 1000], got 1e+300"),
    ],
)
def test_tosca_settings_that_overflow_are_refused_in_one_line(setting, needle, tmp_path, capsys):
    argv = ["run", "--strategy", "tosca", "--backbone", "vit_micro", "--weights", "random", "--set", setting]
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "run")], capsys)
    assert_outcome(code, out, err, 2, needle)
    assert not (tmp_path / "run").exists()


def test_an_input_size_the_backbone_would_ignore_is_refused(tmp_path, capsys):
    argv = ["run", "--strategy", "simplecil", "--backbone", "vit_micro", "--weights", "random", "--img-size", "64"]
    code, out, err = run_cli([*argv, "--out", str(tmp_path / "run")], capsys)
    assert_outcome(code, out, err, 2, "--img-size 64: backbone vit_micro takes 32 px inputs only")


def test_negative_step_counts_are_never_drawn(tmp_path):
    from clbench.report.budget import budget_curves
    from clbench.report.collect import collect

    negative = {"tosca-e20": lambda r: r["params"].update(optimizer_steps_per_task=[-60] * len(r["task_sizes"]))}
    coll = collect([budget_runs(tmp_path / "runs", negative)])
    with pytest.raises(ClbenchError, match="tosca-e20's record is not one clbench wrote .*negative step count"):
        budget_curves(coll, strict=True)
    curves, notes = budget_curves(coll)
    assert [p.steps >= 0 for c in curves for p in c.points] == [True, True]
    assert any("leaves out tosca-e20" in n and "negative step count (-60)" in n for n in notes), notes


def test_a_bound_refusal_names_the_flag_the_bound_and_why():
    from clbench.perf import bounded

    with pytest.raises(ClbenchError, match="--x must be >= 1 and <= 3 \\(got 4; why\\)"):
        bounded("--x", 1, 3, "why")("4")
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
        bounded("--x", 1, 3, "why")("four")
    assert bounded("--x", 1, 3, "why")("3") == 3


# ----------------------------------------------------------------------------------------------- item 7: the gate
def test_the_gate_prints_each_methods_margin_over_the_untrained_control():
    from types import SimpleNamespace

    from clbench.gate.printing import margin_lines

    def run(strategy, acc, per_class=None, bench="emoji B0 Inc6"):
        rec = SimpleNamespace(
            profile="ci", train_per_class=per_class, scenario=None, protocol="per-sample", last_acc=acc
        )
        return SimpleNamespace(strategy=strategy, record=rec, bench_label=bench, backbone_label="vit 56px fp32")

    runs = [run("simplecil", 26.0), run("simplecil", 27.0), run("tosca", 27.1), run("coda_prompt", 10.6, 16, "x")]
    assert margin_lines(runs) == [
        "coda_prompt ci (x, 16 images per class): final 10.60 %, no untrained control in these runs",
        "tosca ci (emoji B0 Inc6): final 27.10 %, untrained control 26.50 %, margin +0.60 points",
    ]
