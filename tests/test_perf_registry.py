"""``clbench perf``: every measurement is found through one registry (clbench.perf), with its own flags; strategies
contribute theirs through their cards (MethodCard.perf_benchmarks, name -> module:attribute)."""

from __future__ import annotations

import argparse
import json

import pytest

import clbench.perf as perf
from clbench.cli import main
from clbench.core.catalog import MethodCard
from clbench.core.registry import Registry
from clbench.perf import Measurement, arg, from_strategy, load

GENERIC = {
    "calibrate",
    "feature-probe",
    "main-job",
    "params",
    "precision",
    "projection",
    "projection-check",
    "report-scale",
    "routers",
    "sweep-overhead",
    "threads",
    "train-step",
    "warm-runs",
}


def test_the_registry_holds_every_generic_measurement_and_the_strategies_own():
    reg = perf.measurements()
    assert GENERIC <= set(reg.names()) and "tosca-routing" in reg
    assert reg.get("tosca-routing").owner == "tosca" and reg.get("params").owner is None
    for name in reg.names():
        m = reg.get(name)
        assert m.name == name and m.help.strip(), name
        p = argparse.ArgumentParser()
        m.add_arguments(p)  # every declared flag is a valid argparse flag, and --out is there
        assert p.parse_args([]).out is None


def test_perf_help_lists_the_registry(capsys):
    with pytest.raises(SystemExit) as e:
        main(["perf", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in perf.measurements().names():
        assert f"{name}: " in text, name


def test_a_measurement_has_its_own_flags_and_help(capsys):
    with pytest.raises(SystemExit):
        main(["perf", "projection-check", "--help"])
    out = capsys.readouterr().out
    assert "usage: clbench perf projection-check" in out and "--run RUN_DIR" in out and "--d " not in out
    with pytest.raises(SystemExit) as e:  # a flag error exits as argparse's do, before anything is measured
        main(["perf", "params", "--runs", "3"])  # sweep-overhead's flag
    assert e.value.code == 2
    assert "unrecognized arguments: --runs" in capsys.readouterr().err


def test_an_unknown_name_suggests_the_closest(capsys):
    assert main(["perf", "parms"]) == 2
    err = capsys.readouterr().err
    assert "unknown measurement 'parms'" in err and "did you mean 'params'?" in err and "tosca-routing" in err


def test_dispatch_runs_the_named_measurement_with_its_flags_and_records_it(tmp_path, monkeypatch, capsys):
    calls = []

    def run(flags: argparse.Namespace) -> dict:
        calls.append(flags)
        return {"benchmark": "fake", "k": flags.k}

    reg = Registry("measurement")
    reg.register("fake", Measurement("fake", "a fake measurement", run, (arg("--k", type=int, default=1),)))
    reg.register("other", Measurement("other", "never run", lambda f: pytest.fail("wrong measurement")))
    monkeypatch.setattr(perf, "measurements", lambda: reg)
    out = tmp_path / "fake.json"
    assert main(["perf", "fake", "--k", "7", "--out", str(out)]) == 0
    assert [c.k for c in calls] == [7]
    got = json.loads(out.read_text())
    assert got["benchmark"] == "fake" and got["k"] == 7
    assert {"git_revision", "versions", "command"} <= set(got)  # stamped as every committed perf JSON
    assert f"wrote {out}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["perf", "fake", "--k", "x"])  # the measurement's own flag types
    assert e.value.code == 2 and len(calls) == 1


# A method's own measurements, named by its card as module:attribute (this module is on sys.path under pytest).
DECLARED = Measurement(
    "fake-own", "a declared one", lambda f: {"benchmark": "fake-own", "n": f.n}, (arg("--n", default="a"),)
)


def bare(backbone, img_size):
    return {"backbone": backbone, "px": img_size}


def _cards(*names: str) -> list[MethodCard]:
    own = {"fake-own": f"{__name__}:DECLARED", "fake-bare": f"{__name__}:bare"}
    return [MethodCard(name, object, {}, perf_benchmarks=own) for name in names]


def test_a_strategy_registers_its_own_measurements():
    reg = Registry("measurement")
    load(reg, (), _cards("fake"))
    assert reg.names() == ["fake-bare", "fake-own"]
    own, bare = reg.get("fake-own"), reg.get("fake-bare")
    assert own.owner == bare.owner == "fake"
    p = argparse.ArgumentParser()
    own.add_arguments(p)
    assert own.run(p.parse_args(["--n", "b"])) == {"benchmark": "fake-own", "n": "b"}
    p = argparse.ArgumentParser()
    bare.add_arguments(p)  # the plug-in form gets --backbone and --img-size with the perf defaults
    assert bare.run(p.parse_args([])) == {"backbone": perf.PERF_BACKBONE[0], "px": perf.PERF_BACKBONE[1]}


def test_a_name_given_twice_or_misdeclared_is_refused():
    with pytest.raises(ValueError, match="named twice"):
        load(Registry("measurement"), (), _cards("one", "two"))
    with pytest.raises(ValueError, match="declared as"):
        from_strategy("fake", "other-name", Measurement("fake-own", "h", lambda f: {}))


def test_a_card_naming_a_measurement_that_does_not_load_is_refused_in_one_line():
    from clbench.errors import ClbenchError

    broken = MethodCard("broken", object, {}, perf_benchmarks={"broken-x": "no_such_module:X"})
    with pytest.raises(ClbenchError, match="method card 'broken': cannot load 'no_such_module:X'"):
        load(Registry("measurement"), (), [broken])
