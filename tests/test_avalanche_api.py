"""ClbenchStrategy: a clbench method driven as an Avalanche strategy gives the CLI's numbers.

Plain Avalanche benchmarks are built from the embedded data with ``nc_benchmark`` (as a user would), evaluated
with an ``EvaluationPlugin``, and Avalanche's own accuracy metrics are compared with ``clbench run``'s record.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from clbench.errors import ClbenchError
from clbench.records.schema import RunRecord


def _avalanche():
    """Avalanche's public API, imported when a test first needs it: importing it takes about 10 s (its catalogue
    pulls in torchvision's models and torch's compiler), which every test worker paid at collection before."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import avalanche.benchmarks
        import avalanche.evaluation.metrics
        import avalanche.logging
        import avalanche.training.plugins
        import avalanche.training.templates
    return avalanche


MICRO = dict(bench="emoji", backbone="vit_micro", weights="random")  # as tests/conftest.py
MICRO_KW = dict(backbone=MICRO["backbone"], weights=MICRO["weights"])


def _evaluator(*loggers):
    av = _avalanche()
    metrics = av.evaluation.metrics
    return av.training.plugins.EvaluationPlugin(
        metrics.accuracy_metrics(experience=True, stream=True), metrics.loss_metrics(stream=True), loggers=list(loggers)
    )


def _benchmark(strategy=None, train=None, test=None, **kw):
    from clbench.examples.avalanche_loop import embedded_datasets

    tr, te, order = embedded_datasets()
    args = dict(
        n_experiences=6,
        task_labels=False,
        fixed_class_order=order,
        class_ids_from_zero_from_first_exp=True,
        eval_transform=strategy.eval_transform if strategy is not None else None,
    )
    args.update(kw)
    return _avalanche().benchmarks.nc_benchmark(tr if train is None else train, te if test is None else test, **args)


def _avalanche_run(strategy, benchmark) -> dict:
    from clbench.run.avalanche_api import accuracy_rows

    results = []
    for t, exp in enumerate(benchmark.train_stream):
        strategy.train(exp)
        results.append(strategy.eval(benchmark.test_stream[: t + 1]))
    return accuracy_rows(results)


def _cli_record(tmp_path: Path, method: str, **kw) -> RunRecord:
    from clbench.run.harness import RunConfig, run

    return run(RunConfig(strategy=method, out=str(tmp_path / f"cli-{method}"), **kw))


def _assert_same(mine: dict, record: RunRecord) -> None:
    assert len(mine["accuracy_matrix"]) == len(record.accuracy_matrix) == 6
    for t, (row, ref) in enumerate(zip(mine["accuracy_matrix"], record.accuracy_matrix, strict=True)):
        assert len(row) == len(ref) == t + 1
        for j, (a, b) in enumerate(zip(row, ref, strict=True)):
            assert a == pytest.approx(b, abs=1e-9), f"R[{t}][{j}]: avalanche {a} vs clbench run {b}"
    assert mine["acc_curve"] == pytest.approx(record.acc_curve, abs=1e-9)


# [tosca] trains through the micro ViT (a minute): the full tier; the default tier carries the proof with [simplecil]
# and TOSCA's Avalanche path with test_readme_section_runs_on_the_micro_vit_and_gives_the_cli_numbers.
TIERED = ["simplecil", pytest.param("tosca", marks=pytest.mark.full)]


@pytest.mark.parametrize("method", TIERED)
def test_avalanche_metrics_equal_the_cli_record(tmp_path, method):
    from clbench.run.avalanche_api import ClbenchStrategy

    csv = _avalanche().logging.CSVLogger(log_folder=str(tmp_path / "csv"))
    strategy = ClbenchStrategy(strategy=method, evaluator=_evaluator(csv), **MICRO_KW)
    assert isinstance(strategy, _avalanche().training.templates.SupervisedTemplate)
    mine = _avalanche_run(strategy, _benchmark(strategy))
    csv.close()  # its files are read below (and an open one would leak past the test)
    record = _cli_record(tmp_path, method, **MICRO)
    assert strategy.eval_tf.identity() == record.transform and strategy.precision.name == record.precision
    _assert_same(mine, record)
    assert len({round(a, 6) for row in mine["accuracy_matrix"] for a in row}) > 3  # not a constant matrix
    # Avalanche's CSV logger saw the same numbers (rounded to 4 digits by the logger)
    lines = (tmp_path / "csv" / "eval_results.csv").read_text().splitlines()[1:]
    last = [float(line.split(",")[2]) for line in lines if line.split(",")[1] == "5"]
    assert last == pytest.approx([a / 100 for a in mine["accuracy_matrix"][-1]], abs=6e-5)


def test_one_backbone_pass_per_image_and_the_feature_cache(tmp_path):
    """Evaluating test_stream[: t + 1] after every experience reuses the features of earlier evaluations; a second
    strategy on the same stream reads every experience's features from the disk cache."""
    from clbench.run.avalanche_api import ClbenchStrategy

    images = []
    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), feature_cache=False, **MICRO_KW)
    strategy.backbone.register_forward_hook(lambda module, inp, out: images.append(len(inp[0])))
    benchmark = _benchmark(strategy)
    _avalanche_run(strategy, benchmark)
    n_images = sum(len(e.dataset) for e in benchmark.train_stream) + sum(len(e.dataset) for e in benchmark.test_stream)
    assert sum(images) == n_images

    first = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    _avalanche_run(first, benchmark)
    second = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    images.clear()
    second.backbone.register_forward_hook(lambda module, inp, out: images.append(len(inp[0])))
    _avalanche_run(second, benchmark)
    assert sum(images) == 0 and second.cache.events == ["hit"] * 12


def test_logits_cover_every_evaluated_class_id():
    """mb_output has a column per class id up to the largest evaluated; classes not learnt yet are masked."""
    from avalanche.core import SupervisedPlugin

    from clbench.run.avalanche_api import MASK_VALUE, ClbenchStrategy

    seen = []

    class Spy(SupervisedPlugin):
        def after_eval_forward(self, strategy, **kwargs):
            seen.append((strategy.mb_output.clone(), strategy.mb_y.clone()))

    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), plugins=[Spy()], **MICRO_KW)
    benchmark = _benchmark(strategy)
    strategy.train(benchmark.train_stream[0])
    strategy.eval(benchmark.test_stream)  # all 36 classes, 6 learnt
    out = torch.cat([o for o, _ in seen if o.shape[1] == 36])
    assert out.shape[1] == 36 and torch.all(out[:, 6:] == MASK_VALUE) and torch.all(out[:, :6] > MASK_VALUE)


# ---------------------------------------------------------------------------------------------------- bad input
def test_non_contiguous_class_ids_are_refused():
    from clbench.run.avalanche_api import ClbenchStrategy

    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    benchmark = _benchmark(strategy, class_ids_from_zero_from_first_exp=False)  # original ids, not arrival order
    with pytest.raises(ClbenchError, match=r"next class ids in arrival order \(0\.\.5\)") as e:
        strategy.train(benchmark.train_stream[0])
    assert "class_ids_from_zero_from_first_exp=True" in e.value.hint


def test_a_transform_that_does_not_match_the_cached_features_is_refused():
    from clbench.features.transforms import TransformSpec
    from clbench.run.avalanche_api import ClbenchStrategy

    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    imagenet = TransformSpec(strategy.backbone.img_size, None, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)).build()
    benchmark = _benchmark(strategy, eval_transform=imagenet)
    with pytest.raises(ClbenchError, match=re.escape(strategy.eval_tf.identity())) as e:
        strategy.train(benchmark.train_stream[0])
    assert "eval_transform=strategy.eval_transform" in e.value.hint


def test_an_experience_with_no_data_is_refused():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.supervised import with_classes_timeline

    from clbench.run.avalanche_api import ClbenchStrategy

    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    full = _benchmark(strategy)
    train, test = full.train_stream[0].dataset, full.test_stream[0].dataset
    benchmark = with_classes_timeline(benchmark_from_datasets(train=[train], test=[test, test.subset([])]))
    strategy.train(benchmark.train_stream[0])
    with pytest.raises(ClbenchError, match="experience 1 of test has no samples"):
        strategy.eval(benchmark.test_stream)


def test_images_transformed_by_the_dataset_itself_are_refused():
    from clbench.examples.avalanche_loop import ImageDataset, embedded_datasets
    from clbench.run.avalanche_api import ClbenchStrategy

    class Tensors(ImageDataset):
        def __getitem__(self, i):
            return torch.rand(3, 8, 8), self.targets[i]

    tr, te, _ = embedded_datasets()
    strategy = ClbenchStrategy(strategy="simplecil", evaluator=_evaluator(), **MICRO_KW)
    benchmark = _benchmark(train=Tensors(tr.source), test=Tensors(te.source))
    with pytest.raises(ClbenchError, match="needs PIL images or uint8 arrays") as e:
        strategy.train(benchmark.train_stream[0])
    assert "transform=None" in e.value.hint


def test_bad_settings_fail_like_the_cli():
    from clbench.run.avalanche_api import ClbenchStrategy

    with pytest.raises(ClbenchError, match="did you mean"):
        ClbenchStrategy(strategy="tosac", **MICRO_KW)
    with pytest.raises(ClbenchError, match="no setting 'epoch'"):
        ClbenchStrategy(strategy="tosca", overrides={"epoch": 2}, **MICRO_KW)
    with pytest.raises(ClbenchError, match="seed must be >= 0"):  # RunConfig's own check and message
        ClbenchStrategy(strategy="simplecil", seed=-1, **MICRO_KW)


# ---------------------------------------------------------------------------------------------------- the keywords
def test_every_run_setting_is_a_keyword_with_runconfigs_name_and_default_or_is_refused_with_a_reason():
    """Each RunConfig field (read from the dataclass, so a new field is covered) is either a ClbenchStrategy keyword
    under its RunConfig name with RunConfig's default, or listed in NOT_APPLICABLE and refused with that reason."""
    import dataclasses
    import inspect

    from clbench.core.config import RunConfig
    from clbench.run.avalanche_api import NOT_APPLICABLE, RENAMED, ClbenchStrategy

    params = inspect.signature(ClbenchStrategy).parameters
    fields = dataclasses.fields(RunConfig)
    assert set(NOT_APPLICABLE) <= {f.name for f in fields}, "NOT_APPLICABLE names a field RunConfig no longer has"
    for f in fields:
        if f.name in NOT_APPLICABLE:
            assert f.name not in params, f"{f.name} is a keyword and listed as not applicable"
            with pytest.raises(ClbenchError, match=re.escape(NOT_APPLICABLE[f.name])):
                ClbenchStrategy(strategy="simplecil", **{f.name: f.default}, **MICRO_KW)
            continue
        assert f.name in params, f"RunConfig.{f.name} is neither a ClbenchStrategy keyword nor in NOT_APPLICABLE"
        p = params[f.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        assert p.default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default), f.name
    # the wrapper's own keywords (Avalanche's) and the earlier names shadow no run setting
    own = set(params) - {f.name for f in fields}
    assert {"plugins", "evaluator", "eval_every", "eval_mb_size", *RENAMED} <= own

    # every forwarded field given explicitly at RunConfig's default: the same RunConfig as leaving them out
    given = {f.name: f.default for f in fields if f.name in params and f.default is not dataclasses.MISSING}
    strategy = ClbenchStrategy(**{**given, "strategy": "simplecil", **MICRO_KW}, evaluator=None)
    assert strategy.config == RunConfig(strategy="simplecil", **MICRO_KW)
    assert [n for n in given if getattr(strategy.config, n) != given[n]] == ["backbone", "weights"]  # MICRO_KW's


def test_run_settings_reach_the_run_config():
    """Values other than the defaults arrive in the RunConfig the strategy resolves, overrides also as a dict."""
    from clbench.run.avalanche_api import ClbenchStrategy

    strategy = ClbenchStrategy(
        strategy="tosca", seed=7, batch_size=16, train_per_class=2, overrides={"epochs": 3}, evaluator=None, **MICRO_KW
    )
    assert (strategy.config.seed, strategy.config.batch_size, strategy.config.train_per_class) == (7, 16, 2)
    assert strategy.config.overrides == (("epochs", "3"),) and strategy.resolved.strategy_config.epochs == 3
    assert strategy.resolved.train_per_class == 2


def test_an_unknown_keyword_is_refused_in_one_line_naming_the_valid_ones():
    from clbench.run.avalanche_api import ClbenchStrategy, run_fields

    with pytest.raises(ClbenchError) as e:
        ClbenchStrategy(strategy="simplecil", bnech="emoji", **MICRO_KW)
    message = str(e.value.args[0])
    assert "\n" not in message and "no setting 'bnech'" in message
    assert all(f.name in message for f in run_fields()) and "eval_mb_size" in message
    assert e.value.hint == "did you mean 'bench'?"
    with pytest.raises(ClbenchError, match="needs strategy="):
        ClbenchStrategy(**MICRO_KW)


def test_the_earlier_names_still_work_with_a_deprecation_warning():
    from clbench.run.avalanche_api import ClbenchStrategy

    with pytest.warns(DeprecationWarning, match=r"is deprecated") as caught:  # both: a non-matching one re-emits
        old = ClbenchStrategy(method="tosca", settings={"epochs": 3}, evaluator=None, **MICRO_KW)
    mine = [w for w in caught if "ClbenchStrategy(" in str(w.message)]
    assert [str(w.message).split(":")[0] for w in mine] == [
        "ClbenchStrategy(method=...) is deprecated",
        "ClbenchStrategy(settings=...) is deprecated",
    ]
    assert "pass strategy=" in str(mine[0].message) and "pass overrides=" in str(mine[1].message)
    assert {w.filename for w in mine} == {__file__}  # the warning points at the caller's line
    new = ClbenchStrategy(strategy="tosca", overrides={"epochs": 3}, evaluator=None, **MICRO_KW)
    assert old.config == new.config
    with pytest.raises(ClbenchError, match="both method= and strategy="):
        ClbenchStrategy(method="simplecil", strategy="simplecil", **MICRO_KW)


def test_the_old_learner_points_to_the_new_strategy():
    import clbench.run.avalanche_api as api

    with pytest.raises(AttributeError, match="replaced by ClbenchStrategy"):
        api.Learner  # noqa: B018


@pytest.mark.parametrize("method", TIERED)
def test_example_script_equals_the_cli_record(tmp_path, capsys, method):
    """The runnable example (clbench/examples/avalanche_loop.py) on the micro ViT against a `clbench run` record."""
    from clbench.examples.avalanche_loop import main

    record = _cli_record(tmp_path, method, **MICRO)
    flags = ["--backbone", MICRO["backbone"], "--weights", MICRO["weights"]]
    mine = main(["--strategy", method, *flags, "--quiet", "--json", str(tmp_path / f"{method}.json")])
    assert mine["transform"] == record.transform and mine["precision"] == record.precision
    _assert_same(mine, record)
    assert f"final {record.last_acc:.2f}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- real backbone
@pytest.mark.slow
@pytest.mark.veryslow  # 224 px features of 3,262 images through the real ViT: 8-15 min on 2 cores, too long for CI
def test_example_on_the_real_backbone_equals_the_cli_record(tmp_path, capsys):
    """The runnable example (real offline ViT-S/14, embedded data) against real `clbench run` records. A slower
    repeat (``veryslow``: not in CI) of test_example_script_equals_the_cli_record (the same script on the micro ViT)."""
    from clbench.examples.avalanche_loop import main

    for method in ("simplecil", "tosca"):
        record = _cli_record(tmp_path, method)
        assert record.backbone == "vit_small_patch14_dinov2" and record.weights_source != "random"
        mine = main(["--strategy", method, "--quiet", "--json", str(tmp_path / f"{method}.json")])
        assert mine["transform"] == record.transform and mine["precision"] == record.precision
        _assert_same(mine, record)
        assert f"final {record.last_acc:.2f}" in capsys.readouterr().out


def _guide_code() -> str:
    guide = (Path(__file__).resolve().parents[1] / "clbench" / "examples" / "README.md").read_text()
    return re.search(r"```python\n(.*?)```", guide, re.S).group(1)


def test_readme_section_runs_on_the_micro_vit_and_gives_the_cli_numbers(tmp_path, monkeypatch):
    """The Avalanche guide's example (clbench/examples/README.md, linked from the README), executed as written but
    for the backbone: every ClbenchStrategy it builds takes the micro ViT, and its final accuracy is the CLI's."""
    import clbench.run.avalanche_api

    class OnTheMicroViT(clbench.run.avalanche_api.ClbenchStrategy):
        def __init__(self, **kwargs):  # keyword-only, as Avalanche asks of a strategy constructor
            super().__init__(**{**kwargs, **MICRO_KW})

    monkeypatch.setattr(clbench.run.avalanche_api, "ClbenchStrategy", OnTheMicroViT)
    namespace: dict = {}
    exec(compile(_guide_code(), "clbench/examples/README.md", "exec"), namespace)
    assert isinstance(namespace["strategy"], OnTheMicroViT)
    record = _cli_record(tmp_path, "tosca", **MICRO)
    metrics = namespace["strategy"].evaluator.get_last_metrics()
    assert 100 * metrics["Top1_Acc_Stream/eval_phase/test_stream/Task000"] == pytest.approx(record.last_acc, abs=1e-9)


@pytest.mark.slow
@pytest.mark.veryslow  # the real ViT at 224 px, as the guide is written: minutes, too long for CI
def test_readme_section_runs_and_gives_the_cli_numbers(tmp_path):
    """The Avalanche guide's example executed exactly as written (the real offline ViT-S/14). A slower repeat
    (``veryslow``, not in CI) of test_readme_section_runs_on_the_micro_vit_and_gives_the_cli_numbers (the same code on
    the micro ViT)."""
    namespace: dict = {}
    exec(compile(_guide_code(), "clbench/examples/README.md", "exec"), namespace)
    record = _cli_record(tmp_path, "tosca")
    metrics = namespace["strategy"].evaluator.get_last_metrics()
    assert 100 * metrics["Top1_Acc_Stream/eval_phase/test_stream/Task000"] == pytest.approx(record.last_acc, abs=1e-9)
