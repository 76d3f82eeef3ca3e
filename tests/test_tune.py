"""The validation split (``--validation``) and ``clbench tune``: the held-out images are stratified, seeded from the
data alone and training images; a validation run never reads a test image; a study resumes after an interruption;
its chosen config runs as is on the test split and the record says how its settings were chosen."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clbench.benchmarks.base import ImageSource
from clbench.core.config import Fingerprint, RunConfig
from clbench.errors import ClbenchError
from clbench.run.validation import SealedSource, held_out, hold_out, split_seed

MICRO = dict(bench="emoji", backbone="vit_micro", weights="random", precision="fp32")
TUNE_ARGV = ["--backbone", "vit_micro", "--weights", "random", "--precision", "fp32"]


def _cli(argv: list[str]) -> int:
    from clbench.cli import main

    return main(argv)


# ----------------------------------------------------------------------------------------------- the split
def test_held_out_is_stratified_and_seeded_by_the_data_alone():
    labels = np.repeat(np.arange(5), [10, 20, 3, 2, 1])  # a class of one image keeps it for training
    seed = split_seed("digest-a", 0.2)
    held = held_out(labels, 0.2, seed)
    counts = np.bincount(labels[held], minlength=5)
    assert counts.tolist() == [2, 4, 1, 1, 0]  # round(0.2 n), at least one, never the whole class
    assert np.array_equal(held, held_out(labels, 0.2, split_seed("digest-a", 0.2)))  # the same data: the same images
    assert not np.array_equal(held, held_out(labels, 0.2, split_seed("digest-b", 0.2)))  # other data: another draw
    domains = np.tile([0, 1], len(labels) // 2 + 1)[: len(labels)]
    by_domain = held_out(labels, 0.5, seed, domains)
    strata = labels * 2 + domains
    for s in np.unique(strata):  # each (class, domain) stratum of two or more gives half its images
        n = int((strata == s).sum())
        if n >= 2:
            assert int((strata[by_domain] == s).sum()) == min(max(1, round(0.5 * n)), n - 1)


def test_a_grouped_benchmark_holds_out_whole_groups():
    labels = np.repeat([0, 1], 12)
    groups = np.repeat(np.arange(8), 3)  # class 0: groups 0-3, class 1: groups 4-7, three images each
    held = held_out(labels, 0.25, 7, groups=groups)
    assert sorted(np.bincount(groups[held], minlength=8)) == [0, 0, 0, 0, 0, 0, 3, 3]  # one whole group per class
    assert set(np.bincount(labels[held]).tolist()) == {3}
    domains = np.tile([0, 1, 0], 8)
    with_domains = held_out(labels, 0.25, 7, domains, groups)  # a group's images go together across domains
    assert set(np.bincount(groups[with_domains], minlength=8).tolist()) <= {0, 3}


def test_hold_out_cuts_the_training_split_and_seals_the_test_split():
    from clbench.benchmarks import BENCHMARKS, build_benchmark

    bench = build_benchmark(BENCHMARKS.get("emoji"))
    train, n_test = bench.train, len(bench.test)
    split = hold_out(bench, 0.2)
    view = split.bench
    assert view.test.parent is train and view.train.parent is train  # validation images are training images
    assert set(split.kept).isdisjoint(split.held) and len(split.kept) + len(split.held) == len(train)
    per_class = np.bincount(view.test_y, minlength=view.n_classes)
    assert (per_class >= 1).all() and view.test_y.tolist() == bench.train_y[split.held].tolist()
    assert len(view.seen_test(0)) == per_class[: view.task_sizes[0]].sum()  # every task is evaluated on its classes
    kept_groups, held_groups = set(train.groups[split.kept]), set(train.groups[split.held])
    assert held_groups and kept_groups.isdisjoint(held_groups)  # emoji's split is grouped: so is this one
    assert isinstance(bench.test, SealedSource) and len(bench.test) == n_test
    with pytest.raises(ClbenchError, match="read the test split: it is sealed"):
        bench.test.image(0)
    with pytest.raises(ClbenchError, match="sealed"):
        bench.test.fingerprint()


class _Counting(ImageSource):
    """A test split that counts every read of its images or content."""

    reads = 0

    def __init__(self, source: ImageSource) -> None:
        self.source, self.labels, self.domains = source, source.labels, source.domains

    def image(self, i: int):
        type(self).reads += 1
        return self.source.image(i)

    def fingerprint(self) -> str:
        type(self).reads += 1
        return self.source.fingerprint()

    def data_id(self) -> str:
        type(self).reads += 1
        return self.source.data_id()


@pytest.fixture
def counted_test_split(monkeypatch):
    """The embedded benchmark with its test split counting reads."""
    import clbench.benchmarks.emoji as emoji

    real = emoji.load

    def load(root):
        train, test, names = real(root)
        return train, _Counting(test), names

    monkeypatch.setattr(emoji, "load", load)
    _Counting.reads = 0
    return _Counting


def test_a_validation_run_reads_no_test_image_and_is_the_same_for_every_method_and_seed(tmp_path, counted_test_split):
    from clbench.run.harness import run

    # the frozen features of the whole training split computed anew (no cache): still no test image is read
    a = run(RunConfig(strategy="slda", validation=0.2, seed=1, out=str(tmp_path / "a"), feature_cache=False, **MICRO))
    b = run(RunConfig(strategy="simplecil", validation=0.2, seed=7, out=str(tmp_path / "b"), **MICRO))
    assert counted_test_split.reads == 0
    assert a.evaluated_on == b.evaluated_on == "validation"
    assert a.data_fingerprint == b.data_fingerprint and set(a.data_fingerprint) == {"train", "validation"}
    assert a.validation == b.validation and a.validation["held_out"] == a.n_images["validation"]
    assert a.n_images["train"] + a.n_images["validation"] == a.validation["learnt_from"] + a.validation["held_out"]
    test_run = run(RunConfig(strategy="slda", seed=1, out=str(tmp_path / "t"), **MICRO))
    assert counted_test_split.reads > 0  # the counter counts: a test run reads its test split
    assert test_run.evaluated_on is None and a.fingerprint != test_run.fingerprint
    assert Fingerprint.from_json(a.fingerprint.to_json())["validation"] == 0.2


def test_validation_fraction_is_checked_before_anything_loads():
    with pytest.raises(ClbenchError, match="validation must be > 0 and <= 0.9"):
        RunConfig(strategy="slda", validation=0.0)
    with pytest.raises(ClbenchError, match="validation must be > 0 and <= 0.9"):
        RunConfig(strategy="slda", validation=1.0)


def test_a_validation_run_is_labelled_in_the_report(tmp_path):
    from clbench.report.collect import collect
    from clbench.run.harness import run

    run(RunConfig(strategy="slda", validation=0.2, out=str(tmp_path / "v"), **MICRO))
    (r,) = collect([tmp_path]).runs
    assert r.bench_label.endswith(" validation 0.2")


# ----------------------------------------------------------------------------------------------- the space
def test_the_card_declares_the_space_and_a_yaml_file_overrides_it(tmp_path):
    from clbench.tune.space import search_space

    space = search_space("acil")
    assert space["gamma"].log and space["M"].kind is int
    f = tmp_path / "space.yaml"
    f.write_text("gamma: [0.5, 2.0]\nsolver: {choices: [auto, recursive]}\n")
    space = search_space("acil", str(f))
    assert (space["gamma"].low, space["gamma"].high, space["gamma"].log) == (0.5, 2.0, False)
    assert space["solver"].choices == ("auto", "recursive") and "M" in space
    f.write_text("gamma: null\n")  # left out of the search
    assert list(search_space("acil", str(f))) == ["M"]
    f.write_text("gama: null\n")
    with pytest.raises(ClbenchError, match="acil has no setting 'gama'"):
        search_space("acil", str(f))
    f.write_text("gama: [0.5, 2.0]\n")
    with pytest.raises(ClbenchError, match="acil has no setting 'gama'"):
        search_space("acil", str(f))
    f.write_text("gamma: [2.0, 0.5]\n")
    with pytest.raises(ClbenchError, match="is not a range"):
        search_space("acil", str(f))
    with pytest.raises(ClbenchError, match="declares no search space"):
        search_space("simplecil")


# ----------------------------------------------------------------------------------------------- the study
def test_tune_resumes_after_an_interruption_and_its_chosen_config_runs_with_provenance(tmp_path, monkeypatch):
    import clbench.run.harness as harness
    from clbench.tune.study import _storage

    out = tmp_path / "study"
    argv = ["tune", "--strategy", "slda", "--bench", "emoji", "--validation", "0.2", "--out", str(out), *TUNE_ARGV]
    real, calls = harness.run, []

    def interrupted(cfg, reporter=None, resume=False):
        calls.append(cfg)
        assert cfg.validation == 0.2  # every trial on the validation split
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process dies in its third trial
        return real(cfg, reporter, resume)

    monkeypatch.setattr(harness, "run", interrupted)
    assert _cli([*argv, "--trials", "4"]) == 130
    import optuna

    study = optuna.load_study(study_name="slda-emoji", storage=_storage(out))
    killed = study.ask()  # and a trial a killed process left running
    killed.suggest_float("shrinkage", 1e-6, 0.5, log=True)
    before = study.get_trials()
    assert [t.state.name for t in before] == ["COMPLETE", "COMPLETE", "FAIL", "RUNNING"]
    monkeypatch.setattr(harness, "run", real)
    assert _cli([*argv, "--trials", "4"]) == 0
    after = optuna.load_study(study_name="slda-emoji", storage=_storage(out)).get_trials()
    assert [t.value for t in after[:2]] == [t.value for t in before[:2]]  # finished trials are kept, not rerun
    assert [t.state.name for t in after[2:4]] == ["FAIL", "FAIL"]
    assert [t.params for t in after[4:6]] == [before[2].params, before[3].params]  # the cut-off trials run again
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in after) == 4 and len(after) == 6
    assert after[0].params == {"shrinkage": 1e-4}  # trial 0: the card's defaults
    assert _cli([*argv, "--trials", "4"]) == 0  # a finished study: nothing runs again
    assert len(optuna.load_study(study_name="slda-emoji", storage=_storage(out)).get_trials()) == 6

    summary = json.loads((out / "tuning.json").read_text())
    best = max((t for t in after if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert summary["best_validation_acc"] == best.value and summary["trials"]["complete"] == 4
    assert summary["split"] == {"name": "validation", "fraction": 0.2, "split_seed": 20240403}
    assert summary["tuning_bench"] == "emoji" and summary["search_space"]["shrinkage"]["log"] is True

    assert _cli(["run", "--config", str(out / "chosen.yaml"), "--out", str(tmp_path / "runs" / "chosen")]) == 0
    record = json.loads((tmp_path / "runs" / "chosen" / "result.json").read_text())
    assert "evaluated_on" not in record and set(record["n_images"]) == {"train", "test"}  # the test split
    assert record["strategy_config"]["shrinkage"] == best.params["shrinkage"]
    assert record["tuning"] == summary  # how the settings were chosen, in the record
    assert record["backbone"] == "vit_micro"

    from clbench.tune.report import table

    defaults = ["run", "--strategy", "slda", "--out", str(tmp_path / "runs" / "defaults"), *TUNE_ARGV]
    assert _cli(defaults) == 0
    row = next(line for line in table(tmp_path).splitlines() if line.startswith("| slda |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2].startswith(f"{record['last_acc']:.2f} [") and ", p " in cells[3]  # tuned, and paired with defaults
    assert cells[4] == "-"  # nothing tuned elsewhere


def test_tune_refuses_another_study_in_the_same_folder(tmp_path, capsys):
    out = tmp_path / "study"
    base = ["tune", "--strategy", "slda", "--out", str(out), "--trials", "1", *TUNE_ARGV]
    assert _cli([*base, "--validation", "0.2"]) == 0
    assert _cli([*base, "--validation", "0.3"]) == 2
    assert "holds a study of other settings (validation: 0.2 there, 0.3 here)" in capsys.readouterr().err


def test_a_tuning_file_that_is_not_a_summary_is_refused_before_the_run(tmp_path):
    from clbench.run.harness import run

    bad = tmp_path / "tuning.json"
    bad.write_text("{}")
    with pytest.raises(ClbenchError, match="not a tuning summary"):
        run(RunConfig(strategy="slda", tuning=str(bad), out=str(tmp_path / "r"), **MICRO))
    assert not (tmp_path / "r").exists()


def test_a_class_subset_keeps_the_first_classes_of_the_order_and_their_images():
    from clbench.benchmarks import BENCHMARKS, build_benchmark
    from clbench.run.validation import first_classes, rows_in

    bench = build_benchmark(BENCHMARKS.get("emoji"), class_order_seed=7)
    loaded = {"train": bench.train, "test": bench.test}
    sub = first_classes(bench, 18, None, None)
    assert sub.class_order == bench.class_order[:18] and sub.task_sizes == [6, 6, 6]
    assert set(sub.train_y.tolist()) == set(range(18)) and sub.test_y.max() == 17
    split, rows = rows_in(sub.train, loaded)
    assert split == "train" and np.isin(bench.train.labels[rows], bench.class_order[:18]).all()
    assert len(rows) == np.isin(bench.train.labels, bench.class_order[:18]).sum()
    held = hold_out(sub, 0.2)
    assert rows_in(held.bench.test, loaded)[0] == "train"  # validation images of the subset: training images
    with pytest.raises(ClbenchError, match="has 36 classes"):
        first_classes(bench, 40, None, None)
