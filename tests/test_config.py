"""clbench.core.config: every run setting declared once (default, check, flag, help), validated the same from Python and
the command line."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from clbench.cli import build_parser, main
from clbench.core import config
from clbench.errors import ClbenchError, setting

# `clbench run` and `clbench sweep` flags before the parser was generated from RunConfig (flag, dest), in order.
RUN_FLAGS_BEFORE = {
    "--strategy", "--bench", "--data-root", "--seed", "--backbone", "--weights", "--init-cls", "--increment",
    "--class-order-seed", "--device", "--precision", "--autocast", "--no-autocast", "--protocol", "--profile",
    "--img-size", "--normalize", "--no-normalize", "--batch-size", "--no-feature-cache", "--ignore-data-problems",
    "--config", "--log", "--log-dir", "--set", "--out", "--overwrite", "--resume", "--trust-checkpoint", "-h",
    "--help",
}  # fmt: skip
SWEEP_FLAGS_BEFORE = {
    "--strategies", "--benches", "--seeds", "--vary", "--seed", "--out", "--data-root", "--set", "--backbone",
    "--weights", "--init-cls", "--increment", "--class-order-seed", "--device", "--precision", "--autocast",
    "--no-autocast", "--protocol", "--profile", "--img-size", "--normalize", "--no-normalize", "--batch-size",
    "--no-feature-cache", "--ignore-data-problems", "--config", "--log", "--log-dir", "--backend", "--jobs",
    "--cpus-per-run", "--gpus-per-run", "--memory-per-run", "--ray-address", "--ray-timeout", "--retries", "--cache",
    "--report", "--no-report", "--tsne", "--no-tsne", "--dry-run", "-h", "--help",
}  # fmt: skip


def _options(command: str) -> dict[str, object]:
    return {o: a for a in build_parser().commands[command]._actions for o in a.option_strings}


def test_the_generated_parser_has_the_flags_it_had():
    run, sweep = _options("run"), _options("sweep")
    added = {"--train-per-class"}  # a run setting since (it was a strategy setting of six methods)
    added |= {"--scenario"}  # class | domain (issue #40)
    added |= {"--validation", "--classes"}  # held-out training images; a class subset (issue #61)
    # a chosen config's provenance; every check of a run without the run: run only
    assert set(run) == RUN_FLAGS_BEFORE | added | {"--tuning", "--dry-run"}
    assert set(sweep) == SWEEP_FLAGS_BEFORE | added
    # defaults, types, choices and aliases as they were written by hand
    assert run["--seed"].default == 1993 and run["--seed"].type is int
    assert run["--class-order-seed"].default == 1993 and run["--batch-size"].default == 64
    assert run["--bench"].default == "emoji" and run["--weights"].default == "auto"
    assert run["--init-cls"].default is None and run["--img-size"].type is int
    assert list(run["--device"].choices) == ["auto", "cpu", "cuda"]
    assert list(run["--precision"].choices) == ["auto", "fp32", "bf16", "fp16"]
    assert run["--protocol"].choices is None  # refused by RunConfig, with its own message
    assert (run["--autocast"].dest, run["--autocast"].const) == ("precision", "bf16")
    assert (run["--no-autocast"].dest, run["--no-autocast"].const) == ("precision", "fp32")
    assert run["--normalize"] is run["--no-normalize"] and run["--normalize"].default is None
    assert (run["--no-feature-cache"].dest, run["--no-feature-cache"].default) == ("feature_cache", True)
    assert sweep["--seed"].help.startswith("initialisation seed") and sweep["--seed"].default == 1993
    assert sweep["--data-root"].default == [] and "--strategy" not in sweep


def test_help_shows_the_defaults_from_the_fields(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in (
        "seed of every RNG in the run (default: 1993)",
        "feature-extraction batch (default: 64)",
        "benchmark (default: emoji, embedded)",
        "seed of the class-order permutation (default: 1993, the literature's order)",
        "default: auto (GPU if present)",
    ):
        assert text in out


def test_every_field_declares_its_check_and_help():
    for f in dataclasses.fields(config.RunConfig):
        if f.name == "overrides":  # --set: each command declares its own spelling
            assert f.metadata["cli"] is None
            continue
        assert f.metadata["check"] is not None and f.metadata["cli"].help, f.name
        assert config.RUN_SETTINGS[f.name].name == f.name


def test_a_new_field_is_a_flag_with_no_other_edit(monkeypatch, capsys):
    """One declaration: a field added to RunConfig (here a subclass patched in) is a `clbench run` and `clbench
    sweep` flag with its help and default, and reaches the RunConfig `clbench run` builds."""
    import clbench.run.harness  # noqa: F401  (imported before the patch: it binds RunConfig by name)

    @dataclasses.dataclass(frozen=True)
    class More(config.RunConfig):
        max_tasks: int | None = config.run_field(
            7, config.Number(int, 1, 100, meaning="tasks to learn"), config.Cli("stop after this many tasks")
        )

    monkeypatch.setattr(config, "RunConfig", More)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--max-tasks MAX_TASKS" in out and "stop after this many tasks" in out
    assert _options("run")["--max-tasks"].default == 7
    assert _options("sweep")["--max-tasks"].type is int
    assert "max_tasks" in config.flag_fields("sweep")
    with pytest.raises(config.ClbenchError, match="^max_tasks must be >= 1"):
        More(strategy="simplecil", max_tasks=0)

    seen = {}

    def fake_run(cfg, observer, resume=False):
        seen["cfg"] = cfg
        raise config.ClbenchError("stop here")

    monkeypatch.setattr("clbench.run.harness.run", fake_run)
    assert main(["run", "--strategy", "simplecil", "--max-tasks", "3"]) == 2
    assert isinstance(seen["cfg"], More) and seen["cfg"].max_tasks == 3
    assert main(["run", "--strategy", "simplecil", "--max-tasks", "0"]) == 2
    assert "--max-tasks must be >= 1" in capsys.readouterr().err


def test_a_field_without_metadata_still_gets_a_flag():
    @dataclasses.dataclass(frozen=True)
    class Plain(config.RunConfig):
        plain_setting: int = 3

    import argparse

    p = argparse.ArgumentParser()
    config.add_run_flags(p, "run", Plain)
    assert p.parse_args(["--plain-setting", "5"]).plain_setting == 5
    assert p.parse_args([]).plain_setting == 3


def test_python_api_validates_as_the_cli(tmp_path):
    from clbench.core.config import RunConfig
    from clbench.errors import ClbenchError
    from clbench.run.harness import RunConfig as FromHarness

    assert FromHarness is RunConfig
    for bad, needle in (
        (dict(increment=0), r"^increment must be >= 1 .*\(got 0\)"),
        (dict(seed=2**64), "^seed"),
        (dict(img_size=0), r"^img_size must be .*\(got 0\)"),
        (dict(batch_size=True), "expected an integer"),
        (dict(seed="7"), "expected an integer"),
        (dict(device="tpu"), "valid devices"),
    ):
        with pytest.raises(ClbenchError, match=needle) as e:
            RunConfig(strategy="simplecil", **bad)
        # the Python API names the setting as written in Python; the CLI renders it as the flag, same wording
        name = next(iter(bad))
        assert str(e.value).startswith(name) and e.value.settings == [name], str(e.value)
        assert e.value.render(as_flags=True).startswith("--" + name.replace("_", "-"))
    cfg = RunConfig(strategy="simplecil", init_cls=None, increment=None)  # None: not given
    assert cfg.increment is None


def test_the_fingerprint_and_the_profile_keys_are_read_from_runconfigs_declaration():
    """Which settings define a run (its fingerprint), which a profile may set, and which a fingerprint leaves out at
    one value (added after records were written) are marks on RunConfig's fields, not lists beside them."""
    fields = {f.name: f.metadata for f in dataclasses.fields(config.RunConfig)}
    assert config.DEFINING_FIELDS == tuple(n for n, m in fields.items() if m["defining"])
    assert {"strategy", "bench", "seed", "class_order_seed", "overrides", "scenario"} <= set(config.DEFINING_FIELDS)
    assert not {"device", "out", "batch_size", "feature_cache"} & set(config.DEFINING_FIELDS)  # how, not what
    assert config.RUN_LEVEL_PROFILE_KEYS == {"img_size", "init_cls", "increment", "train_per_class"}
    plain = config.Fingerprint.from_config(config.RunConfig(strategy="tosca"), "vit_micro")
    added_later = {"train_per_class", "scenario", "validation", "classes"}
    assert set(plain) == set(config.DEFINING_FIELDS) - added_later  # as records before them
    marked = config.Fingerprint.from_config(
        config.RunConfig(strategy="tosca", scenario="domain", train_per_class=8), "vit_micro"
    )
    assert marked["scenario"] == "domain" and marked["train_per_class"] == 8 and marked["backbone"] == "vit_micro"
    assert plain.differences({**plain, "scenario": "class"}) == []  # absent reads as its omitted value


# ----------------------------------------------------------------------------------------------- Fingerprint
_REPO = Path(__file__).resolve().parents[1]


def _committed_sweeps() -> list[Path]:
    return sorted(p for p in (_REPO / "reports").rglob("sweep.json") if "inflora" not in p.parts)


def test_a_fingerprint_reads_and_writes_back_the_committed_files_json_unchanged():
    """Every fingerprint the committed sweep manifests and their runs' records hold (an earlier clbench's too:
    ``autocast`` before --precision, no ``scenario``) reads and writes back key for key, in its order; equal
    digests are equal JSON objects, and the digest is the one ``clbench sweep --dry-run`` always listed."""
    import hashlib

    seen = 0
    for sweep in _committed_sweeps():
        for run_id, entry in json.loads(sweep.read_text())["runs"].items():
            raw = entry["fingerprint"]
            fp = config.Fingerprint.from_json(raw)
            assert json.dumps(fp.to_json()) == json.dumps(raw), (sweep, run_id)
            assert fp.digest() == hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:12]
            record = sweep.parent / entry["path"] / "result.json"
            if record.exists():  # the record of the run the manifest planned: the same settings
                saved = config.Fingerprint.from_json(json.loads(record.read_text())["fingerprint"])
                assert saved == fp and saved.digest() == fp.digest() and not saved.differences(fp)
                seen += 1
    assert seen >= 40


def test_a_fingerprint_from_a_config_is_its_defining_fields_and_reads_back_equal():
    cfg = config.RunConfig(strategy="tosca", overrides=(("lr", "0.1"), ("epochs", "2"), ("lr", "0.2")))
    fp = config.Fingerprint.from_config(cfg, "vit_micro")
    left_out = ("train_per_class", "scenario", "validation", "classes")  # at the values earlier records were made at
    assert tuple(fp) == tuple(n for n in config.DEFINING_FIELDS if n not in left_out)
    assert fp["backbone"] == "vit_micro" and dict(fp["overrides"]) == {"epochs": "2", "lr": "0.2"}  # sorted, last wins
    back = config.Fingerprint.from_json(json.loads(json.dumps(fp.to_json())))
    assert back == fp and back.digest() == fp.digest() and hash(back) == hash(fp)
    with pytest.raises(TypeError):
        fp["overrides"]["lr"] = "1"  # type: ignore[index]  (immutable: a read-only view)
    with pytest.raises(AttributeError):
        fp._values = {}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("seed", "7", "field fingerprint.seed is str '7', expected an integer"),
        ("seed", True, "field fingerprint.seed is bool True, expected an integer"),
        ("img_size", 1.5, "field fingerprint.img_size is float 1.5, expected an integer or null"),
        ("strategy", None, "field fingerprint.strategy is NoneType None, expected a string"),
        ("overrides", {"lr": 1}, "field fingerprint.overrides is dict {'lr': 1}, expected an object of strategy"),
        ("autocast", "yes", "field fingerprint.autocast is str 'yes', expected true or false"),
    ],
)
def test_a_fingerprint_with_an_ill_typed_setting_is_refused_naming_it(key, value, expected):
    raw = {**config.Fingerprint.from_config(config.RunConfig(strategy="tosca"), "b").to_json(), key: value}
    with pytest.raises(ClbenchError, match=re.escape(expected)):
        config.Fingerprint.from_json(raw)
    with pytest.raises(ClbenchError, match=re.escape("field fingerprint is list [1], expected an object")):
        config.Fingerprint.from_json([1])


def test_an_old_records_fingerprint_without_later_settings_matches_the_same_run_now():
    """A record written before ``train_per_class`` and ``scenario`` lacks them: it reads, and matches a run that
    leaves them at the values they are omitted at (and only such a run)."""
    now = config.Fingerprint.from_config(config.RunConfig(strategy="tosca"), "b")
    old = config.Fingerprint.from_json({k: v for k, v in now.to_json().items()})
    assert old == now and not old.differences(now)
    domain = config.Fingerprint.from_config(config.RunConfig(strategy="tosca", scenario="domain"), "b")
    assert old != domain and old.differences(domain) == [f"{setting('scenario')}: class in the checkpoint, domain here"]


def test_a_newer_clbenchs_setting_is_kept_and_makes_the_sweep_say_so(tmp_path):
    """A key this clbench does not know (a newer clbench's setting) is kept, like a record's unknown fields, and
    written back; it never matches a run of this clbench, and the sweep names it as the reason."""
    from types import SimpleNamespace

    from clbench.sweep.plan import PlannedRun, inspect

    now = config.Fingerprint.from_config(config.RunConfig(strategy="simplecil"), "b")
    newer = config.Fingerprint.from_json({**now.to_json(), "warmup": 3})
    assert newer.unknown == ("warmup",) and list(newer.to_json())[-1] == "warmup" and newer != now
    assert not newer.differences(now)  # the defining settings this clbench knows agree
    record = json.loads((_REPO / "tests/fixtures/records/simplecil/sc-s1993/result.json").read_text())
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text(json.dumps({**record, "fingerprint": newer.to_json()}))
    planned = PlannedRun("r", SimpleNamespace(out=str(tmp_path / "run")), now)  # type: ignore[arg-type]
    why = inspect(planned)
    assert why is not None and "warmup" in why and "newer clbench" in why
