"""``--config FILE.yaml``: the committed table configs plan the committed runs; flags override the file; every bad
file is refused with one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clbench.cli import main
from clbench.core.config import Fingerprint

ROOT = Path(__file__).resolve().parent.parent
MICRO = ["--backbone", "vit_micro", "--weights", "random"]


def _run(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # rich lays the plan table out at this width
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return str(path)


def test_readme_table_config_plans_the_committed_records(capsys, monkeypatch, tmp_path):
    """Every record the README's table is read from is one run of reports/emoji-table.yaml, with the same settings
    fingerprint (listed by `--dry-run` as a digest), and the file plans no other run."""
    from test_readme_numbers import FIVE_SEEDS, ONE_SEED, five_seed_folders

    folders = sorted(
        {folder for folder, _ in ONE_SEED.values()} | {f for s, _ in FIVE_SEEDS.values() for f in five_seed_folders(s)}
    )
    committed = {
        Fingerprint.from_json(json.loads((ROOT / f / "result.json").read_text())["fingerprint"]).digest(): f
        for f in folders
    }
    monkeypatch.chdir(tmp_path)  # the file's out: is relative; nothing is written by a dry run
    code, out, err = _run(
        ["sweep", "--config", str(ROOT / "reports/emoji-table.yaml"), "--dry-run"], capsys, monkeypatch
    )
    assert code == 0, err
    listed = [line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") >= 5]
    assert sorted(listed) == sorted(committed), (listed, committed)


def test_paper_table_config_plans_the_projection_rows(capsys, monkeypatch, tmp_path):
    """reports/paper-table.yaml plans exactly what `clbench perf projection` prices: every projection row (strategy
    and profile) on every paper benchmark, three seeds, each benchmark's default split and backbone."""
    from clbench.cli import build_parser
    from clbench.perf.projection import PAPER_BENCHMARKS, projection_rows
    from clbench.run.configfile import apply
    from clbench.sweep import SweepSpec, make_plan, parse_list, parse_scoped_override, parse_seeds

    argv = ["sweep", "--config", str(ROOT / "reports/paper-table.yaml"), "--dry-run"]
    planned = set()
    monkeypatch.chdir(tmp_path)
    for args in apply(build_parser, argv, "sweep", argv[2]):
        spec = SweepSpec(
            strategies=parse_list(args.strategies, "strategies"),
            benches=parse_list(args.benches, "benches"),
            seeds=parse_seeds(args.seeds),
            out=Path(args.out),
            profile=args.profile,
            overrides=tuple(parse_scoped_override(k, v) for k, v in args.overrides),
        )
        for r in make_plan(spec):
            row = r.cfg.strategy + (f"-{r.cfg.profile}" if r.cfg.profile else "")
            planned.add((row, r.cfg.bench, r.cfg.seed))
    expected = {(row, b, s) for row, _, _ in projection_rows() for b in PAPER_BENCHMARKS for s in (1993, 1994, 1995)}
    assert planned == expected
    code, out, err = _run(argv, capsys, monkeypatch)
    assert code == 0, err
    assert out.count("new ") >= len(expected)


def test_run_config_flags_override_the_file(tmp_path, capsys, monkeypatch):
    """A micro run from a file: its values reach the record, a flag given on the command line wins, and strategy
    settings under the strategy's name are --set pairs (the command line's --set applied after them)."""
    cfg = _write(
        tmp_path,
        "strategy: tosca\nbackbone: vit_micro\nweights: random\ninit-cls: 18\nincrement: 9\nseed: 5\n"
        "tosca:\n  epochs: 1\n  l1: 0.001\n",
    )
    out = tmp_path / "run"
    code, _, err = _run(
        ["run", "--config", cfg, "--increment", "18", "--set", "l1=0", "--out", str(out)], capsys, monkeypatch
    )
    assert code == 0, err
    rec = json.loads((out / "result.json").read_text())
    assert rec["task_sizes"] == [18, 18]  # init-cls from the file, increment from the flag
    assert rec["seed"] == 5
    assert rec["strategy_config"]["epochs"] == 1 and rec["strategy_config"]["l1"] == 0.0
    assert rec["fingerprint"]["overrides"] == {"epochs": "1", "l1": "0"}


@pytest.mark.parametrize(
    "command,text,needle",
    [
        ("run", "strategy: simplecil\nincrement: 6\nseeed: 3\n", "unknown key 'seeed'"),
        ("run", "strategy: simplecil\nseeed: 3\n", "did you mean 'seed'"),
        ("run", "strategy: simplecil\nincrement: six\n", "increment: expected an integer, got a string"),
        ("run", "strategy: simplecil\nincrement: true\n", "increment: expected an integer, got true/false"),
        ("run", "strategy: simplecil\nnormalize: 1\n", "normalize: expected true or false"),
        ("run", "strategy: simplecil\nprecision: fp64\n", "'fp64' is not one of auto, fp32, bf16, fp16"),
        (
            "run",
            "strategy: simplecil\ntosca:\n  epochs: 1\n",
            "settings for strategy tosca, which this command does not",
        ),
        ("run", "strategy: tosca\ntosca:\n  epoch: 1\n", "did you mean 'epochs'"),
        ("run", "strategy: tosca\ntosca: 5\n", "tosca: expected a mapping"),
        ("run", "strategy: tosca\ntosca:\n  epochs: many\n", "tosca.epochs: 'many': expected a value of type int"),
        ("run", "- strategy: simplecil\n", "expected a mapping of settings (key: value), got a list"),
        ("run", "", "got an empty file"),
        ("run", "strategy: [simplecil\n", "not valid YAML at line"),
        ("run", "strategy: simplecil\ngroups: []\n", "only a clbench sweep file has groups"),
        ("sweep", "strategies: simplecil\nout: x\nsimplecil: {}\ntosca:\n  epochs: 1\n", "(it runs simplecil)"),
        ("sweep", "strategies: simplecil\nout: x\ngroups:\n  - strategies: tosca\n", "groups[0]: expected a name"),
        ("sweep", "strategies: simplecil\nout: x\njbos: 2\n", "did you mean 'jobs'"),
    ],
)
def test_bad_config_files_fail_with_one_line(tmp_path, capsys, monkeypatch, command, text, needle):
    cfg = _write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(
        [command, "--config", cfg, *MICRO, "--dry-run"]
        if command == "sweep"
        else [command, "--config", cfg, *MICRO, "--out", str(tmp_path / "r")],
        capsys,
        monkeypatch,
    )
    assert code == 2
    assert needle in err, err
    assert "Traceback" not in err
    assert err.startswith("clbench: error: --config ")
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_missing_config_file(tmp_path, capsys, monkeypatch):
    code, _, err = _run(["run", "--config", str(tmp_path / "nope.yaml")], capsys, monkeypatch)
    assert code == 2 and "no such file" in err
