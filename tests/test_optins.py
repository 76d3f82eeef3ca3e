"""Settings that lower a safety barrier (:mod:`clbench.core.optins`) come from the command line only: a settings
file for ``run``, ``sweep`` (and its groups) and ``report --study`` that holds one is refused, naming the key and
why, before anything is read or run; a resumed run does not take one from its checkpoint."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from clbench.cli import build_parser, main
from clbench.core.optins import COMMAND_LINE_ONLY, file_key_problem
from clbench.errors import ClbenchError

MICRO = ["--backbone", "vit_micro", "--weights", "random"]


class _Marker:
    """Unpickling this creates a folder: proof that a pickle was executed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.mkdir, (str(self.path),))


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return str(path)


def test_the_one_list_names_both_opt_ins_with_a_reason():
    assert set(COMMAND_LINE_ONLY) == {"trust-checkpoint", "ignore-data-problems"}
    assert "executes any code" in file_key_problem("trust_checkpoint")
    assert file_key_problem("seed") is None


def test_run_config_holding_trust_checkpoint_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    executed = tmp_path / "executed"
    (run / "checkpoint.pt").write_bytes(pickle.dumps(_Marker(executed)))
    cfg = _write(tmp_path, "strategy: simplecil\ntrust-checkpoint: true\n")
    code = main(["run", "--config", cfg, *MICRO, "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--config {cfg}: trust-checkpoint: --trust-checkpoint is taken from the command line only" in err
    assert "executes any code the file carries" in err and "Traceback" not in err
    assert not executed.exists()  # the pickle was never opened
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"]


@pytest.mark.parametrize(
    "command,text,key",
    [
        ("run", "strategy: simplecil\nignore_data_problems: true\n", "ignore_data_problems"),
        ("run", "strategy: simplecil\ntrust_checkpoint: false\n", "trust_checkpoint"),  # even off: not a file's
        ("sweep", "strategies: simplecil\nout: x\nignore-data-problems: true\n", "ignore-data-problems"),
        ("sweep", "strategies: simplecil\nout: x\ntrust-checkpoint: true\n", "trust-checkpoint"),
        (
            "sweep",
            "strategies: simplecil\nout: x\ngroups:\n  - name: a\n  - name: b\n    ignore-data-problems: true\n",
            "ignore-data-problems",
        ),
    ],
)
def test_every_settings_file_refuses_the_opt_ins(tmp_path, capsys, monkeypatch, command, text, key):
    cfg = _write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    argv = [command, "--config", cfg, *MICRO]
    argv += ["--dry-run"] if command == "sweep" else ["--out", str(tmp_path / "r")]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{key}: --{key.replace('_', '-')} is taken from the command line only" in err, err
    assert not (tmp_path / "r").exists() and not (tmp_path / "x").exists()


def test_the_command_line_still_switches_them_on_beside_a_file(tmp_path):
    from clbench.run.configfile import apply

    cfg = _write(tmp_path, "strategy: simplecil\n")
    (args,) = apply(build_parser, ["run", "--config", cfg, "--ignore-data-problems"], "run", cfg)
    assert args.ignore_data_problems is True


def test_a_study_file_with_an_opt_in_is_refused(tmp_path):
    from clbench.report.leaderboard import study_groups

    study = _write(tmp_path, "strategies: simplecil\nbenches: emoji\nout: x\nignore_data_problems: true\n")
    with pytest.raises(ClbenchError, match="ignore_data_problems: --ignore-data-problems is taken from the command"):
        study_groups(study, build_parser)


def test_a_resumed_run_takes_no_opt_in_from_its_checkpoint(tmp_path):
    from clbench.core.config import Fingerprint, RunConfig, resume_config

    started = RunConfig(strategy="simplecil", bench="emoji", out=str(tmp_path), ignore_data_problems=True)
    saved = {k: v for k, v in vars(started).items() if k != "overrides"}
    fp = Fingerprint.from_config(started, "b")
    assert resume_config(tmp_path, saved, fp, {}).ignore_data_problems is False
    assert resume_config(tmp_path, saved, fp, {"ignore_data_problems": True}).ignore_data_problems is True
