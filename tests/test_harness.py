"""clbench.run.harness: a run is resolved once (:class:`ResolvedRun`), its inputs loaded once, and the task loop writes
the same record as before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from clbench.core.config import Fingerprint, RunConfig
from clbench.errors import ClbenchError
from clbench.run import harness

MICRO = dict(bench="emoji", backbone="vit_micro", weights="random", init_cls=18, increment=9)


def test_resolve_decides_every_name_once():
    r = harness.resolve(RunConfig(strategy="tosca", bench="emoji", device="cpu", protocol="both"))
    assert isinstance(r, harness.ResolvedRun)
    assert r.backbone_name == r.spec.backbone  # the benchmark's default, by name
    assert r.protocols == ("per-sample", "reference") and r.device.type == "cpu"
    assert r.img_size == r.spec.img_size and r.normalize == r.spec.normalize
    assert r.init_cls is None and r.increment is None  # the benchmark's split
    assert r.fingerprint == Fingerprint.from_config(r.config, r.backbone_name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.device = None  # type: ignore[misc]


def test_resolve_takes_the_profiles_run_level_settings():
    r = harness.resolve(RunConfig(strategy="aper", profile="ci"))  # ci: img_size 56, init_cls 12, increment 12
    assert (r.img_size, r.init_cls, r.increment) == (56, 12, 12)
    explicit = harness.resolve(RunConfig(strategy="aper", profile="ci", img_size=48, increment=5))
    assert (explicit.img_size, explicit.init_cls, explicit.increment) == (48, 12, 5)  # explicit wins
    assert r.train_per_class == 8 and explicit.train_per_class == 8  # a run setting since record schema 5
    assert harness.resolve(RunConfig(strategy="aper", profile="ci", train_per_class=3)).train_per_class == 3
    assert harness.resolve(RunConfig(strategy="aper")).train_per_class is None  # every image
    assert "train_per_class" not in dataclasses.asdict(r.strategy_config)  # not a strategy setting any more


def test_train_per_class_is_a_run_setting_that_each_method_may_bound():
    with pytest.raises(ClbenchError, match=r"^train_per_class 1: mos learns from at least 2 images per class"):
        harness.resolve(RunConfig(strategy="mos", train_per_class=1))
    harness.resolve(RunConfig(strategy="mos", train_per_class=2))
    with pytest.raises(ClbenchError, match=r"(?s)train_per_class is a run setting.*give train_per_class 8 instead"):
        harness.resolve(RunConfig(strategy="aper", overrides=(("train_per_class", "8"),)))
    # an unset train_per_class stays out of the fingerprint, so that older runs' fingerprints still match
    assert "train_per_class" not in harness.resolve(RunConfig(strategy="aper")).fingerprint
    assert harness.resolve(RunConfig(strategy="aper", train_per_class=4)).fingerprint["train_per_class"] == 4


def test_resolve_refuses_before_anything_loads():
    with pytest.raises(ClbenchError, match="has no 'reference' protocol|valid"):
        harness.resolve(RunConfig(strategy="simplecil", protocol="reference", backbone="no_such_backbone"))


def test_a_run_resolves_its_device_once_and_passes_the_resolution_on(tmp_path, monkeypatch):
    calls = []
    real = harness.resolve_device

    def counting(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(harness, "resolve_device", counting)
    prepared = []
    real_prepare = harness.prepare

    def spy(run, *a, **kw):
        prepared.append(run)
        return real_prepare(run, *a, **kw)

    monkeypatch.setattr(harness, "prepare", spy)
    cfg = RunConfig(strategy="simplecil", out=str(tmp_path / "run"), **MICRO)
    record = harness.run(cfg)
    assert calls == ["auto"]
    assert len(prepared) == 1 and isinstance(prepared[0], harness.ResolvedRun) and prepared[0].config is cfg
    assert record.complete and record.fingerprint == prepared[0].fingerprint
    assert record.backbone == "vit_micro" and len(record.per_task) == record.n_classes // 9 - 1
    assert (tmp_path / "run" / "features.npz").is_file()  # always written (the report's t-SNE figures read it)


def test_prepare_takes_a_config_or_a_resolved_run(micro_session_factory):
    session = micro_session_factory("simplecil")
    assert isinstance(session.resolved, harness.ResolvedRun) and isinstance(session.inputs, harness.FrozenInputs)
    assert session.backbone is session.inputs.backbone and session.protocols == ["per-sample"]
    key = harness.feature_key(session.resolved, session.inputs, "test", session.bench.test.fingerprint())
    assert isinstance(key, str) and key == harness.feature_key(
        session.resolved, session.inputs, "test", session.bench.test.fingerprint()
    )


def test_a_record_names_the_code_revision_its_run_started_with(tmp_path, monkeypatch):
    """A long run's record names the revision of the code it imported at its start, not the tree's revision when the
    record is written (a commit made while the run went on is not the code that ran)."""
    revisions = iter(["started-at", *["committed-later"] * 100])
    monkeypatch.setattr(harness, "git_revision", lambda: next(revisions))
    record = harness.run(RunConfig(strategy="simplecil", out=str(tmp_path / "run"), **MICRO))
    assert record.complete and record.git_revision == "started-at"
    assert json.loads((tmp_path / "run" / "result.json").read_text())["git_revision"] == "started-at"
