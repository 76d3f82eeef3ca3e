"""CLI smoke tests and error messages: one clear line, non-zero exit, no traceback, nothing complete written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clbench.cli import main

MICRO = ["--backbone", "vit_micro", "--weights", "random"]


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_imports_nothing_heavy():
    """`clbench --help` and the catalog stay light: neither torch, timm nor Avalanche is imported (how fast that is
    on a given machine is a benchmark's business, not a test's)."""
    code = (
        "import sys; from clbench.cli import build_parser; build_parser(); import clbench.core.catalog;"
        "print(sorted(m for m in ('torch', 'avalanche', 'timm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    help_text = subprocess.run(
        [sys.executable, "-m", "clbench.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "doctor" in help_text and "run" in help_text


def test_list(capsys):
    code, out, _ = _run(["list"], capsys)
    assert code == 0 and "tosca" in out and "emoji" in out and "vit_small_patch14_dinov2" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run", "--strategy", "toska"], "did you mean 'tosca'"),
        (["run", "--strategy", "tosca", "--bench", "emojis"], "unknown benchmark 'emojis'"),
        (["run", "--strategy", "tosca", "--backbone", "vit_tiny"], "unknown backbone"),
        (["run", "--strategy", "tosca", "--protocol", "batch", *MICRO], "valid protocols"),
        (["run", "--strategy", "tosca", "--set", "epochz=3", *MICRO], "did you mean 'epochs'"),
        (["run", "--strategy", "tosca", "--set", "epochs=many", *MICRO], "expected a value of type int"),
        (["run", "--strategy", "tosca", "--profile", "turbo", *MICRO], "has no profile"),
        (["run", "--strategy", "simplecil", "--increment", "99", *MICRO], "--increment 99 is larger"),
        (
            ["run", "--strategy", "simplecil", "--bench", "fashion-mnist", "--data-root", "/nonexistent", *MICRO],
            "does not exist",
        ),
        (
            [
                "run",
                "--strategy",
                "simplecil",
                "--backbone",
                "vit_small_patch14_dinov2",
                "--weights",
                "/nonexistent.pt",
            ],
            "no such file",
        ),
    ],
)
def test_bad_input_is_one_clear_line(argv, needle, capsys, tmp_path):
    code, _, err = _run([*argv, "--out", str(tmp_path / "run")], capsys)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "result.json").exists()


def test_bad_weights_files(capsys, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    code, _, err = _run(
        [
            "run",
            "--strategy",
            "simplecil",
            "--backbone",
            "vit_small_patch14_dinov2",
            "--weights",
            str(garbage),
            "--out",
            str(tmp_path / "r1"),
        ],
        capsys,
    )
    assert code == 2 and "cannot be read" in err
    import torch

    wrong = tmp_path / "wrong.pt"
    torch.save({"layer.weight": torch.zeros(3, 3)}, wrong)
    code, _, err = _run(
        [
            "run",
            "--strategy",
            "simplecil",
            "--backbone",
            "vit_small_patch14_dinov2",
            "--weights",
            str(wrong),
            "--out",
            str(tmp_path / "r2"),
        ],
        capsys,
    )
    assert code == 2 and "does not fit backbone" in err
    notdict = tmp_path / "list.pt"
    torch.save([1, 2, 3], notdict)
    code, _, err = _run(
        [
            "run",
            "--strategy",
            "simplecil",
            "--backbone",
            "vit_small_patch14_dinov2",
            "--weights",
            str(notdict),
            "--out",
            str(tmp_path / "r3"),
        ],
        capsys,
    )
    assert code == 2 and "not a state dict" in err


def test_run_writes_record_and_refuses_to_overwrite(capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, _ = _run(
        ["run", "--strategy", "simplecil", *MICRO, "--init-cls", "18", "--increment", "18", "--out", str(out)], capsys
    )
    assert code == 0
    assert "accuracy matrix" in stdout
    rec = json.loads((out / "result.json").read_text())
    for key in (
        "strategy",
        "bench",
        "backbone",
        "weights_digest",
        "seed",
        "protocol",
        "class_order",
        "accuracy_matrix",
        "acc_curve",
        "last_acc",
        "avg_acc",
        "forgetting",
        "params",
        "time_s",
        "peak_rss_mb",
        "versions",
        "git_revision",
        "complete",
        "schema_version",
    ):
        assert key in rec, key
    assert rec["complete"] is True
    assert set(rec["params"]) >= {"backbone", "trainable", "added_per_task", "added_total"}
    assert set(rec["time_s"]) >= {"features", "train", "eval", "total"}
    assert rec["weights_source"].startswith("random-init")
    code, _, err = _run(["run", "--strategy", "simplecil", *MICRO, "--out", str(out)], capsys)
    assert code == 2 and "already holds a finished run" in err and "--overwrite" in err
    assert json.loads((out / "result.json").read_text()) == rec  # untouched


def test_a_random_only_backbone_takes_random_or_a_file_of_its_weights(tmp_path):
    """vit_micro has no published weights: offline and hub are refused by name; a saved file loads bit for bit (the
    pinned routing test relies on it, since the random init itself differs between CPU kinds)."""
    from safetensors.torch import save_file

    from clbench.errors import ClbenchError
    from clbench.features.backbones import load_backbone

    for source in ("offline", "hub"):
        with pytest.raises(ClbenchError, match="vit_micro has no published weights"):
            load_backbone("vit_micro", source)
    drawn = load_backbone("vit_micro", "random", seed=7)
    path = tmp_path / "micro.safetensors"
    save_file({k: v.contiguous() for k, v in drawn.model.state_dict().items()}, str(path))
    loaded = load_backbone("vit_micro", str(path))
    assert loaded.digest == drawn.digest and loaded.weights_source == f"file:{path}"
    assert load_backbone("vit_micro", "auto", seed=7).digest == drawn.digest  # auto: a random init, as before


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """`clbench list | head -1` where the reader went away before clbench wrote: no traceback, the status of a
    closed pipe (141), and the final flush of the standard streams does not fail again."""
    import io
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone: every write now fails with EPIPE
    stdout = io.TextIOWrapper(os.fdopen(write_end, "wb"), line_buffering=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    from clbench.cli import main

    assert main(["list"]) == 141
    stdout.write("more\n")
    stdout.flush()  # now lands in /dev/null
    assert "Traceback" not in capsys.readouterr().err
    stdout.close()
