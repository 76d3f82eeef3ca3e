"""A strategy defined only in this test file runs through ``clbench run``, ``report``, ``check``, ``sweep`` (its
spawned worker processes included) and ``perf projection`` / ``perf params``, registered by the environment variable
``CLBENCH_PLUGINS`` alone: adding a method needs no edit of clbench (baselines/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from clbench.core.catalog import MethodCard
from clbench.methods.contract import PER_SAMPLE, ParamCounts, RunShape, Split, Strategy, Task, Work
from clbench.methods.shared import CosineHead, class_means

ROOT = Path(__file__).resolve().parents[1]
NAME = "plugnn"
PLUGIN = f"{NAME}=test_plugin_strategy:PlugNearest"  # tests/ goes on PYTHONPATH


@dataclass(frozen=True)
class PlugNearestConfig:
    shrink: float = 0.0  # pulls each prototype towards the mean of all prototypes seen (0: plain class means)

    def __post_init__(self) -> None:
        if not 0 <= self.shrink < 1:
            raise ValueError(f"shrink must be in [0, 1), got {self.shrink}")


def param_formula(cfg: PlugNearestConfig, d: int, depth: int, task_sizes: tuple[int, ...]) -> ParamCounts:
    return ParamCounts(
        added_per_task=[c * d for c in task_sizes],
        trainable_per_task=[0] * len(task_sizes),
        head=sum(task_sizes) * d,
    )


def work(cfg: PlugNearestConfig, shape: RunShape) -> Work:
    f = sum(shape.train_per_task) + shape.test_seen[-1]
    return Work(f=f, f_cacheable=f, extra={"plugnn_rows": sum(shape.test_seen)})


def unit_seconds(d: int, device) -> dict[str, float]:
    return {"plugnn_rows": 1e-7 * d}


def probe(backbone: str, img_size: int) -> dict[str, Any]:
    return {"benchmark": "plugnn-probe", "backbone": backbone}


# the plug-in's one declaration: its name, settings, profiles, formulas and what the tools read of it
CARD = MethodCard(
    NAME,
    PlugNearestConfig,
    {"quick": {}, "ci": {"shrink": 0.1}},
    param_formula=param_formula,
    work=work,
    projection_profiles=("ci",),
    perf_benchmarks={"plugnn-probe": "test_plugin_strategy:probe"},
    unit_seconds="test_plugin_strategy:unit_seconds",
)


@CARD.strategy
class PlugNearest(Strategy[PlugNearestConfig]):  # the parameter types self.cfg, work and param_formula
    """Nearest class mean on cached features with an optional shrinkage; the smallest complete strategy."""

    def __init__(self, config: PlugNearestConfig, ctx) -> None:
        super().__init__(config, ctx)
        self.head = CosineHead(ctx.backbone.num_features, learn_sigma=False)
        self._added: list[int] = []

    def learn_task(self, task: Task) -> None:
        self.head.grow(task.n_seen)
        protos = class_means(task.train.features, task.train.labels, task.classes)
        center = protos.mean(0, keepdim=True)
        self.head.set_rows(task.classes, (1 - self.cfg.shrink) * protos + self.cfg.shrink * center)
        self._added.append(protos.numel())

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        return self.head(split.features)

    def param_counts(self) -> ParamCounts:
        return ParamCounts(
            added_per_task=list(self._added), trainable_per_task=[0] * len(self._added), head=self.head.weight.numel()
        )


def clbench(*args: str, cwd: Path, plugins: str = PLUGIN, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CLBENCH_PLUGINS": plugins,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "clbench.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


MICRO = ("--bench", "emoji", "--backbone", "vit_micro", "--weights", "random", "--init-cls", "12", "--increment", "12")


@pytest.mark.full
@pytest.mark.slow  # minutes: a dozen clbench processes, a sweep with a spawned worker
def test_a_test_file_strategy_runs_through_every_command(tmp_path):
    """Full tier: the default tier carries the plugin with test_the_plugin_passes_the_shared_cost_and_parameter_checks
    and every command with the shipped strategies' CLI tests (tests/test_cli.py)."""
    # run, twice (the check needs a reference and runs to check)
    out = ok(
        clbench("run", "--strategy", NAME, "--profile", "ci", *MICRO, "--out", str(tmp_path / "runs/a"), cwd=tmp_path)
    )
    rec = json.loads((tmp_path / "runs/a/result.json").read_text())
    assert rec["strategy"] == NAME and rec["complete"] and rec["strategy_config"] == {"shrink": 0.1}, out
    assert rec["params"]["added_per_task"] == [12 * 64] * 3
    # report
    ok(clbench("report", str(tmp_path / "runs/a"), "--out", str(tmp_path / "report"), "--no-tsne", cwd=tmp_path))
    assert NAME in (tmp_path / "report/index.html").read_text()
    # check: calibrate, write a reference from the run, check the run against it (and a changed run fails it)
    ok(clbench("check", str(tmp_path / "runs"), "--calibrate", cwd=tmp_path))
    ref = tmp_path / "ref.json"
    ok(
        clbench(
            "check",
            str(tmp_path / "runs"),
            "--write-reference",
            str(ref),
            "--why",
            "plug-in test",
            "--who",
            "test",
            "--no-require-ci-profiles",
            cwd=tmp_path,
        )
    )
    assert {e["strategy"] for e in json.loads(ref.read_text())["entries"]} == {NAME}
    ok(clbench("check", str(tmp_path / "runs"), "--reference", str(ref), cwd=tmp_path))
    path = tmp_path / "runs/a/result.json"
    changed = json.loads(path.read_text())
    changed["params"]["added_total"] += 1  # a parameter more than the reference: the gate compares exactly
    path.write_text(json.dumps(changed))
    ok(clbench("check", str(tmp_path / "runs"), "--reference", str(ref), cwd=tmp_path), code=1)
    # sweep: the local backend's spawned workers register the plug-in from the inherited environment
    ok(
        clbench(
            "sweep",
            "--strategies",
            NAME,
            "--seeds",
            "1,2",
            *MICRO,
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "sweep"),
            "--no-report",
            cwd=tmp_path,
            timeout=600,
        )
    )
    manifest = json.loads((tmp_path / "sweep/sweep.json").read_text())
    assert manifest["complete"], manifest
    assert len(list((tmp_path / "sweep/runs").glob("*/result.json"))) == 2
    # perf: the projection has the plug-in's rows and unit; params has its formula; its own benchmark is listed
    proj = tmp_path / "proj.json"
    ok(
        clbench(
            "perf",
            "projection",
            "--device",
            "cpu",
            "--backbone",
            "vit_micro",
            "--img-size",
            "32",
            "--out",
            str(proj),
            cwd=tmp_path,
        )
    )
    got = json.loads(proj.read_text())
    assert {NAME, f"{NAME}-ci"} <= set(got["projection"]["per_strategy"])
    assert got["costs"]["s_per_image"]["plugnn_rows"] == pytest.approx(6.4e-6)
    assert NAME in got["projection"]["table_strategies"]
    params = ok(clbench("perf", "params", "--d", "768", "--tasks", "10x10", cwd=tmp_path))
    assert f"| {NAME} | 7,680 |" in params
    assert "plugnn-probe" in ok(clbench("perf", "--help", cwd=tmp_path))
    probe = tmp_path / "probe.json"
    ok(clbench("perf", "plugnn-probe", "--out", str(probe), cwd=tmp_path))
    assert json.loads(probe.read_text())["backbone"] == "vit_small_patch14_dinov2"


def test_without_the_variable_the_strategy_is_unknown_and_bad_entries_are_one_line(tmp_path):
    proc = clbench("run", "--strategy", NAME, *MICRO, cwd=tmp_path, plugins="")
    assert proc.returncode == 2 and f"unknown strategy {NAME!r}" in proc.stderr and "Traceback" not in proc.stderr
    proc = clbench("list", cwd=tmp_path, plugins="test_plugin_strategy:PlugNearest")
    assert proc.returncode == 2 and "is not NAME=module.path:Class" in proc.stderr and "Traceback" not in proc.stderr
    proc = clbench("run", "--strategy", "nope", *MICRO, cwd=tmp_path, plugins="nope=no_such_module:X")
    assert proc.returncode == 2 and "cannot load no_such_module:X" in proc.stderr and "Traceback" not in proc.stderr
    proc = clbench("list", cwd=tmp_path, plugins="simplecil=test_plugin_strategy:PlugNearest")
    assert proc.returncode == 2 and "registered already" in proc.stderr


def test_the_plugin_passes_the_shared_cost_and_parameter_checks(micro_session_factory, monkeypatch):
    """Registered in this process too, it meets the same param_formula check as the shipped methods."""
    from clbench.core.catalog import STRATEGIES

    monkeypatch.setitem(STRATEGIES._items, NAME, PlugNearest)
    s = micro_session_factory(NAME, init_cls=18, increment=9)
    for step in s.tasks():
        s.strategy.learn_task(step.task)
    real = s.strategy.param_counts()
    formula = PlugNearest.param_formula(s.strategy.cfg, 64, 4, (18, 9, 9))
    assert (formula.added_per_task, formula.trainable_per_task, formula.head) == (
        real.added_per_task,
        real.trainable_per_task,
        real.head,
    )


def test_the_tools_read_the_plugins_card(monkeypatch):
    """What a tool reads of a method is data on its card: the plug-in's projection rows come from its card, which
    its decorated class gives (no card module registered)."""
    from clbench.core.catalog import STRATEGIES, card
    from clbench.perf.projection import projection_rows

    monkeypatch.setitem(STRATEGIES._items, NAME, PlugNearest)
    assert card(NAME) is CARD and PlugNearest.name == NAME and PlugNearest.profiles is CARD.profiles
    assert [row for row, _, _ in projection_rows([NAME])] == [NAME, f"{NAME}-ci"]


def test_a_plugin_registered_under_another_name_than_its_cards_is_refused(monkeypatch):
    from clbench.core.catalog import STRATEGIES, card
    from clbench.errors import ClbenchError

    monkeypatch.setitem(STRATEGIES._items, "othername", PlugNearest)
    with pytest.raises(ClbenchError, match=f"registered from a class whose card names it '{NAME}'"):
        card("othername")
