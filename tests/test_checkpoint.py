"""clbench.run.checkpoint: the one writer and reader of ``checkpoint.safetensors``, the RNG states it carries, the
checks
of what a resumed run loads again, and how a resume decides its settings. End-to-end kills and resumes of every
strategy are in tests/test_reliability.py; planted and hostile files in tests/test_hostile_checkpoints.py."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import pytest
import torch

from clbench.core.config import Fingerprint, RunConfig
from clbench.core.rng import capture_rng, restore_rng
from clbench.errors import ClbenchError
from clbench.files.safestate import SavedState
from clbench.records.schema import TaskEntry, Times
from clbench.run import checkpoint as ck

DATA = ck.DataIdentity(train="a" * 8, test="b" * 8, class_order=[2, 0, 1], task_sizes=[2, 1])


def _checkpoint(**changes) -> ck.Checkpoint:
    cfg = RunConfig(strategy="simplecil", backbone="vit_micro", weights="random")
    values = dict(
        config=dataclasses.asdict(cfg),
        fingerprint=Fingerprint.from_config(cfg, "vit_micro"),
        backbone_digest="d" * 64,
        precision="fp32",
        precision_reason="forced",
        data=DATA,
        tasks_done=1,
        strategy=SavedState({"protos": {"tensor": "strategy.0"}}, {"strategy.0": torch.arange(6.0).reshape(2, 3)}),
        rng=capture_rng(),
        logs={
            "per-sample": ck.ProtocolLogState(
                accuracy_matrix=[[50.0]],
                acc_curve=[50.0],
                old_acc=[math.nan],  # after the first task: no old classes
                new_acc=[50.0],
                top5_curve=[100.0],
                task_aware_curve=[50.0],
                index=[[0, 1]],
                pred=[[1, 1]],
                conf=[[0.5, 0.75]],
            )
        },
        per_task=[TaskEntry(0, [0, 1], 0.25, {"loss": 1.5}, 0.5, math.inf)],  # inf: only zero-initialised parts moved
        times=Times(features=1.5, train=0.25, eval=0.5, checkpoint=0.0, total=2.25),
        peak_rss_mb=123.5,
        resumed_from_task=[],
        feature_cache=["train:hit", "test:miss"],
        git_revision=None,
    )
    values.update(changes)
    return ck.Checkpoint(**values)


def test_save_then_load_gives_every_field_back(tmp_path):
    saved = _checkpoint()
    path = tmp_path / ck.CHECKPOINT_FILE
    ck.save(path, saved)
    back = ck.load(path)
    assert isinstance(back.data, ck.DataIdentity) and isinstance(back.times, Times)
    assert type(back.per_task[0]) is TaskEntry and type(back.logs["per-sample"]) is ck.ProtocolLogState
    log = back.logs["per-sample"]
    assert math.isnan(log.old_acc[0])  # NaN is never equal to itself: compared on its own
    assert dataclasses.replace(log, old_acc=saved.logs["per-sample"].old_acc) == saved.logs["per-sample"]
    assert back.config == json.loads(json.dumps(saved.config))  # as JSON: the config's tuples come back as lists
    for f in dataclasses.fields(ck.Checkpoint):
        if f.name not in ("strategy", "rng", "logs", "config"):
            assert getattr(back, f.name) == getattr(saved, f.name), f.name
    assert back.per_task[0].trained_change == math.inf
    assert back.strategy.tree == saved.strategy.tree
    assert torch.equal(back.strategy.tensors["strategy.0"], saved.strategy.tensors["strategy.0"])
    assert torch.equal(back.rng.torch, saved.rng.torch) and back.rng.python == saved.rng.python
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary file left


def test_a_checkpoint_of_an_earlier_clbench_loads_with_what_it_lacks_empty(tmp_path):
    """Fields added to the logs and the times after the first checkpoints: a checkpoint without them reads as empty
    (no task-aware accuracy, no per-image predictions kept) or unknown, not as wrong."""
    path = tmp_path / ck.CHECKPOINT_FILE
    ck.save(path, _checkpoint())

    def older(doc, meta):
        for name in ("task_aware_curve", "index", "pred", "conf"):
            doc["logs"]["per-sample"].pop(name)
        doc["times"].pop("checkpoint")

    _rewrite(path, older)
    back = ck.load(path)
    log = back.logs["per-sample"]
    assert log.task_aware_curve == log.index == log.pred == log.conf == [] and log.acc_curve == [50.0]
    assert back.times.checkpoint is None and back.times.total == 2.25


def test_a_checkpoint_whose_log_rows_have_their_old_names_loads_under_the_record_names(tmp_path):
    """Before the log took the record's names, a checkpoint's log held ``matrix``, ``curve``, ``old``, ``new``,
    ``top5`` and ``task_aware``: such a checkpoint still loads (and so resumes), each row under its record name."""
    path = tmp_path / ck.CHECKPOINT_FILE
    saved = _checkpoint()
    ck.save(path, saved)

    def old_names(doc, meta):
        log = doc["logs"]["per-sample"]
        doc["logs"]["per-sample"] = {old: log.pop(new) for old, new in ck.OLD_LOG_NAMES.items()} | log

    _rewrite(path, old_names)
    held = set(_document(path)["logs"]["per-sample"])  # the file holds the old names only
    assert set(ck.OLD_LOG_NAMES) <= held and not set(ck.OLD_LOG_NAMES.values()) & held
    log = ck.load(path).logs["per-sample"]
    want = saved.logs["per-sample"]
    assert log.accuracy_matrix == [[50.0]] and log.acc_curve == [50.0] and math.isnan(log.old_acc[0])
    assert log.new_acc == [50.0] and log.top5_curve == [100.0] and log.task_aware_curve == [50.0]
    assert dataclasses.replace(log, old_acc=want.old_acc) == want


def _document(path) -> dict:
    """The JSON document of the checkpoint at ``path``, as the file holds it."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["checkpoint"])


def test_a_restored_rng_draws_what_the_captured_one_would_have():
    state = capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()  # the run goes on drawing
    restore_rng(state)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_the_rng_survives_the_file(tmp_path):
    path = tmp_path / ck.CHECKPOINT_FILE
    ck.save(path, _checkpoint())
    expected = torch.rand(4)
    restore_rng(ck.load(path).rng)
    assert torch.equal(torch.rand(4), expected)


def _rewrite(path, edit) -> None:
    """The checkpoint at ``path`` with its JSON document passed through ``edit`` (tensors unchanged)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    doc = json.loads(meta["checkpoint"])
    edit(doc, meta)
    save_file(tensors, str(path), metadata={**meta, "checkpoint": json.dumps(doc)})


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda doc, meta: meta.update(version="1"), "is a version 1 checkpoint; this clbench reads version 2"),
        (lambda doc, meta: doc.pop("fingerprint"), "field fingerprint is missing"),
        (lambda doc, meta: doc.update(fingerprint=[1]), "field fingerprint is list [1], expected an object"),
        (lambda doc, meta: doc.update(tasks_done=0), "field tasks_done is int 0, expected an integer >= 1"),
        (lambda doc, meta: doc["times"].update(train="fast"), "field times.train is str 'fast', expected seconds"),
        (lambda doc, meta: doc["times"].update(train=-1.0), "field times.train is float -1.0, expected seconds"),
        (lambda doc, meta: doc["data"].pop("class_order"), "field data.class_order is missing"),
        (lambda doc, meta: doc["data"].pop("test"), "field data.test is missing"),
        (
            lambda doc, meta: doc["logs"]["per-sample"]["pred"][0].append("1"),
            "field logs.per-sample.pred is list [[1, 1, '1']], expected a list of lists of integers",
        ),
        (
            lambda doc, meta: doc["logs"]["per-sample"].update(acc_curve=["50"]),
            "field logs.per-sample.acc_curve is list ['50'], expected a list of numbers",
        ),
        (
            lambda doc, meta: doc["logs"]["per-sample"].pop("accuracy_matrix"),
            "field logs.per-sample.accuracy_matrix is missing",
        ),
        (lambda doc, meta: doc["logs"].update(x=[]), "field logs.x is list [], expected an object"),
        (lambda doc, meta: doc["per_task"][0].pop("task"), "field per_task[0].task is missing"),
        (lambda doc, meta: doc["per_task"][0].update(train_s=-2), "field per_task[0].train_s is int -2"),
        (lambda doc, meta: doc["rng"].update(numpy=[1, 2]), "its RNG state is not one"),
    ],
)
def test_a_file_that_is_not_a_sound_checkpoint_is_one_line_naming_it(tmp_path, edit, needle):
    path = tmp_path / ck.CHECKPOINT_FILE
    ck.save(path, _checkpoint())
    _rewrite(path, edit)
    with pytest.raises(ClbenchError) as err:
        ck.load(path)
    assert needle in str(err.value) and str(path) in str(err.value)
    assert "--overwrite" in err.value.render(as_flags=True)  # and how to start over


def test_a_torn_file_is_refused(tmp_path):
    path = tmp_path / ck.CHECKPOINT_FILE
    ck.save(path, _checkpoint())
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ClbenchError, match="cannot be read as a clbench checkpoint"):
        ck.load(path)


def test_strategy_tensors_must_carry_the_prefix(tmp_path):
    bad = _checkpoint(strategy=SavedState({}, {"weights": torch.zeros(1)}))
    with pytest.raises(ValueError, match="strategy tensor names must start with 'strategy.'"):
        ck.save(tmp_path / ck.CHECKPOINT_FILE, bad)


def test_inputs_that_changed_since_the_checkpoint_are_refused(tmp_path):
    saved = _checkpoint()
    ck.check_inputs(saved, tmp_path, "d" * 64, "fp32", "forced", DATA)  # the same inputs: continues
    with pytest.raises(ClbenchError, match="other backbone weights"):
        ck.check_inputs(saved, tmp_path, "e" * 64, "fp32", "forced", DATA)
    with pytest.raises(ClbenchError, match="was made at precision fp32; here the backbone runs at bf16"):
        ck.check_inputs(saved, tmp_path, "d" * 64, "bf16", "AMX", DATA)
    with pytest.raises(ClbenchError, match=r"data changed since the checkpoint \(test differ\)"):
        ck.check_inputs(saved, tmp_path, "d" * 64, "fp32", "forced", dataclasses.replace(DATA, test="c" * 8))
    other_order = dataclasses.replace(DATA, class_order=[0, 1, 2], task_sizes=[1, 2])
    with pytest.raises(ClbenchError, match=r"\(class_order, task_sizes differ\)"):
        ck.check_inputs(saved, tmp_path, "d" * 64, "fp32", "forced", other_order)


def test_a_resume_takes_the_checkpoints_settings_and_fills_later_ones_with_their_defaults(tmp_path):
    """A checkpoint written before a setting existed (here train_per_class, which it lacks in its config and its
    fingerprint) continues with that setting's default; a given setting that defines the run is refused."""
    saved = _checkpoint(
        config=dict(_checkpoint().config, seed=7), fingerprint=Fingerprint({**_checkpoint().fingerprint, "seed": 7})
    )
    saved.config.pop("train_per_class")
    assert "train_per_class" not in saved.fingerprint
    ck.save(tmp_path / ck.CHECKPOINT_FILE, saved)
    cfg = ck.resume_config(tmp_path, {})
    assert cfg.seed == 7 and cfg.train_per_class is None and cfg.strategy == "simplecil"
    with pytest.raises(ClbenchError, match="seed"):
        ck.resume_config(tmp_path, {"seed": 8})
    with pytest.raises(ClbenchError, match="train_per_class"):
        ck.resume_config(tmp_path, {"train_per_class": 4})


def test_resume_without_a_checkpoint_says_why(tmp_path):
    with pytest.raises(ClbenchError, match="no checkpoint.safetensors to continue from"):
        ck.resume_config(tmp_path, {})
    (tmp_path / "result.json").write_text(json.dumps({"complete": True}))
    with pytest.raises(ClbenchError, match="the run is finished; there is nothing to continue"):
        ck.resume_config(tmp_path, {})


# ----------------------------------------------------------------------------------------------- cadence
def test_the_cadence_writes_once_the_work_outweighs_the_interval_and_the_last_write():
    c = ck.Cadence(10.0)
    assert [c.due(3.0), c.due(3.0), c.due(3.9)] == [False, False, False]  # 9.9 s of work: not yet
    assert c.due(0.2)  # 10.1 s
    c.written(25.0)  # a slow write: the next one waits for as much work as it cost
    assert not c.due(20.0) and c.due(5.0)
    c.written(1.0)
    assert not c.due(-5.0) and c.unsaved_s == 0.0  # a clock step back counts as nothing
    every = ck.Cadence(0.0)
    assert every.due(0.0) and (every.written(99.0) or every.due(0.0))  # 0: after every task, whatever a write costs


@pytest.mark.parametrize(
    ("raw", "interval"), [(None, ck.DEFAULT_INTERVAL_S), ("", ck.DEFAULT_INTERVAL_S), ("2.5", 2.5)]
)
def test_the_cadence_reads_its_interval_from_the_environment(monkeypatch, raw, interval):
    if raw is None:
        monkeypatch.delenv(ck.INTERVAL_ENV, raising=False)
    else:
        monkeypatch.setenv(ck.INTERVAL_ENV, raw)
    assert ck.Cadence.from_env().interval_s == interval


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "inf"])
def test_a_bad_cadence_interval_is_one_line_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(ck.INTERVAL_ENV, raw)
    with pytest.raises(ClbenchError, match=r"\$CLBENCH_CHECKPOINT_S is .* not a number of seconds") as e:
        ck.Cadence.from_env()
    assert "unset it" in e.value.hint


def test_a_run_of_millisecond_tasks_writes_no_checkpoint_and_the_same_record(tmp_path, monkeypatch, capsys):
    """The default cadence skips the checkpoints of a run whose tasks take milliseconds (the warm main job, the
    closed-form heads); its record is the one a run that checkpointed after every task writes."""
    from clbench.cli import main
    from clbench.run import harness

    writes = []
    real = harness._save_progress
    monkeypatch.setattr(
        harness, "_save_progress", lambda state, run_dir: writes.append(state.done) or real(state, run_dir)
    )
    argv = ["run", "--strategy", "simplecil", "--backbone", "vit_micro", "--weights", "random", "--init-cls", "12"]
    argv += ["--increment", "12", "--train-per-class", "4"]
    monkeypatch.setenv(ck.INTERVAL_ENV, "0")
    assert main([*argv, "--out", str(tmp_path / "every")]) == 0
    assert writes == [1, 2, 3]
    writes.clear()
    monkeypatch.setenv(ck.INTERVAL_ENV, "3600")
    assert main([*argv, "--out", str(tmp_path / "cadence")]) == 0
    assert writes == []
    a, b = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("every", "cadence"))
    assert a["complete"] and b["complete"] and a["accuracy_matrix"] == b["accuracy_matrix"]
    assert a["predictions"] == b["predictions"] and b["time_s"]["checkpoint"] == 0.0
    assert not (tmp_path / "cadence" / ck.CHECKPOINT_FILE).exists()
