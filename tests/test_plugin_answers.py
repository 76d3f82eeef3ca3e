"""A plug-in strategy's malformed answer is refused in one line naming the strategy, the method, what came back and
what was expected, and no finished record is written from it (clbench.methods.answers, called by the harness)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clbench.core import catalog
from clbench.core.config import RunConfig
from clbench.errors import ClbenchError
from clbench.methods.contract import PER_SAMPLE, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import CosineHead, class_means
from clbench.run import harness

ROOT = Path(__file__).resolve().parents[1]
NAME = "plugfaulty"
PLUGIN = f"{NAME}=test_plugin_answers:Faulty"  # as a user registers one (clbench/README.md, "Adding a method")
SIX_TASKS = dict(bench="emoji", backbone="vit_micro", weights="random", init_cls=6, increment=6)


@dataclass(frozen=True)
class FaultyConfig:
    fault: str = ""  # which answer comes back malformed ("": none)


class Faulty(Strategy[FaultyConfig]):
    """Nearest class mean on the cached features whose ``fault`` setting spoils one of its answers."""

    name = NAME
    Config = FaultyConfig

    def __init__(self, config: FaultyConfig, ctx) -> None:
        super().__init__(config, ctx)
        self.head = CosineHead(ctx.backbone.num_features, learn_sigma=False)
        self._added: list[int] = []

    def learn_task(self, task: Task) -> None:
        self.head.grow(task.n_seen)
        self.head.set_rows(task.classes, class_means(task.train.features, task.train.labels, task.classes))
        self._added.append(len(task.classes) * self.head.weight.shape[1])

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        logits = self.head(split.features)
        fault = self.cfg.fault
        if fault == "logits_shape":
            return logits[:, :-1]
        if fault == "logits_int":  # the class index as a score: the right shape, but no logits
            return torch.nn.functional.one_hot(logits.argmax(1), logits.shape[1])
        if fault == "logits_nan":
            logits[0, 0] = float("nan")
        if fault == "logits_rows":
            return logits[1:]
        return logits

    def param_counts(self) -> ParamCounts:
        added, fault = list(self._added), self.cfg.fault
        trainable = [0] * len(added)
        head: Any = self.head.weight.numel()
        extra: dict[str, Any] = {"rows": len(self.head.weight)}
        if fault == "one_count":  # the first task's count only, whatever the tasks done
            added = added[:1]
        if fault == "negative_count":
            trainable[-1] = -1
        if fault == "float_count":
            added[-1] = float(added[-1])
        if fault == "head":
            head = torch.tensor(head)
        if fault == "extra":
            extra["rows"] = np.int64(3)
        return ParamCounts(added_per_task=added, trainable_per_task=trainable, head=head, extra=extra)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        if self.cfg.fault == "diagnostics":
            return {"routing": torch.ones(2)}
        if self.cfg.fault == "diagnostics_list":
            return ["routing", 1.0]  # type: ignore[return-value]  # the malformed answer under test
        return {"rows": len(self.head.weight)}

    def adapted_features(self, split: Split) -> torch.Tensor | None:
        if self.cfg.fault == "features":
            return split.features[:-1]
        return None


@pytest.fixture
def plugin(monkeypatch):
    """``NAME`` registered through ``CLBENCH_PLUGINS``, the way clbench reads it at import; gone afterwards."""
    monkeypatch.setenv(catalog.PLUGINS_ENV, PLUGIN)
    catalog._register_plugins()
    yield NAME
    catalog.STRATEGIES._lazy.pop(NAME, None)
    catalog.STRATEGIES._items.pop(NAME, None)


def _run(tmp_path: Path, fault: str):
    cfg = RunConfig(strategy=NAME, out=str(tmp_path / "run"), overrides=(("fault", fault),), **SIX_TASKS)
    return harness.run(cfg)


def _no_finished_record(run: Path) -> bool:
    path = run / "result.json"
    return not path.exists() or json.loads(path.read_text())["complete"] is False


MALFORMED = [  # (fault, method, what the refusal says came back, what it says was expected)
    ("one_count", "param_counts", "added_per_task of 1 entry for 2 tasks done", None),
    ("negative_count", "param_counts", "trainable_per_task holding -1", "one non-negative integer per task"),
    ("float_count", "param_counts", "added_per_task holding 384.0", "one non-negative integer per task"),
    ("head", "param_counts", "head = tensor(", "a non-negative integer"),
    ("extra", "param_counts", "extra that is not JSON", "a dict of string keys to JSON values"),
    ("logits_shape", "predict", "tensor of shape (", "float logits of shape ("),
    ("logits_rows", "predict", "tensor of shape (", "one row per image"),
    ("logits_int", "predict", "a torch.int64 tensor", "float logits of shape ("),
    ("logits_nan", "predict", "1 NaN or infinite values", "finite logits"),
    ("diagnostics", "diagnostics", "the diagnostics that is not JSON", "JSON values"),
    ("diagnostics_list", "diagnostics", "the diagnostics = a list", "a dict of string keys"),
    ("features", "adapted_features", "tensor of shape (", "None or finite float features of shape ("),
]


@pytest.mark.parametrize(("fault", "method", "wrong", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_answer_is_refused_in_one_line_and_no_record_is_finished(
    plugin, tmp_path, fault, method, wrong, expected
):
    with pytest.raises(ClbenchError) as refused:
        _run(tmp_path, fault)
    message = refused.value.for_terminal()  # what the command line prints
    assert "\n" not in message, message
    assert message.startswith(f"strategy {NAME!r}: {method}() returned "), message
    assert wrong in message and "; expected " in message, message
    if expected is not None:
        assert expected in message.split("; expected ", 1)[1], message
    assert _no_finished_record(tmp_path / "run")


def test_param_counts_of_one_task_for_six_are_refused_on_the_command_line(tmp_path):
    """The case that once wrote a record without a word: one entry for six tasks, registered by the variable."""
    env = {
        **os.environ,
        catalog.PLUGINS_ENV: PLUGIN,
        "HF_HUB_OFFLINE": "1",
        "CLBENCH_CHECKPOINT_S": "100000",  # the record is first written when the run ends, after its six tasks
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SIX_TASKS.items()]
    proc = subprocess.run(
        [sys.executable, "-m", "clbench.cli", "run", "--strategy", NAME, *flags, "--set", "fault=one_count"]
        + ["--out", str(tmp_path / "run")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"clbench: error: strategy {NAME!r}: param_counts() returned added_per_task of 1 entry for 6 tasks done; "
        "expected added_per_task with one non-negative integer per task done (6)"
    ), proc.stderr[-3000:]
    assert sum(line.startswith("clbench: error:") for line in proc.stderr.splitlines()) == 1
    assert _no_finished_record(tmp_path / "run")


def test_a_well_formed_plugin_has_every_answer_checked_and_finishes(plugin, tmp_path, monkeypatch):
    from clbench.methods import answers

    seen: list[str] = []
    for method, check in list(answers.CHECKS.items()):

        def counting(answer, _method=method, _check=check, **known):
            seen.append(_method)
            return _check(answer, **known)

        monkeypatch.setitem(answers.CHECKS, method, counting)
    record = _run(tmp_path, "")
    tasks = len(record.per_task)
    assert record.complete and tasks == 6
    assert record.params.added_per_task == [6 * 64] * tasks and record.params.trainable_per_task == [0] * tasks
    assert seen.count("predict") == tasks and seen.count("diagnostics") == tasks
    assert seen.count("param_counts") >= 1 and seen.count("adapted_features") == 1
    assert "predict_given_task" not in seen  # the class scenario gives no image's task
