"""The strategies' own cost models (their cards' work and param_formula) and the generic perf code that reads them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clbench.core.catalog import STRATEGIES, card
from clbench.core.config import make_strategy_config
from clbench.methods.contract import RunShape

ROOT = Path(__file__).resolve().parents[1]
FAST = {"epochs": "1", "M": "512"}  # RanPAC's M: no 10,000 x 10,000 solves on the micro ViT


def _cfg(name: str, profile: str | None = None, **overrides):
    return make_strategy_config(STRATEGIES.get(name), profile, tuple((k, str(v)) for k, v in overrides.items()))


def _work(name: str, shape: RunShape, profile: str | None = None, **overrides):
    from clbench.perf.projection import work_counts

    return work_counts(card(name).cost(_cfg(name, profile, **overrides), shape))


def test_each_method_counts_what_it_does_per_image():
    """Hand-counted on a 2-task split: 100 training images, 10 then 20 test images seen."""
    shape = RunShape.equal(100, 20, 2)
    assert _work("simplecil", shape) == {"f": 120}
    tosca = _work("tosca", shape)
    assert tosca == {"f": 120, "luca_steps": 20 * 100, "route_module_images": 10 * 1 + 20 * 2}
    augment = _work("tosca", shape, "augment")  # the reference's training: E frozen passes per training image
    assert augment["f"] == 20 * 100 + 20 and augment["luca_steps"] == 2000
    k = (197 + 5 * 5) / 197  # 5 prompts of 5 tokens on ViT-B/16's 197
    l2p = _work("l2p", shape)
    assert l2p["b"] == pytest.approx(5 * 100 * k)  # prompted training pass on every image, every epoch
    assert l2p["f"] == pytest.approx(5 * 100 + (10 + 20) * (1 + k))  # queries; query + prompted eval
    ease = _work("ease", shape)
    assert ease == {"f": pytest.approx(50 * 1 + 50 * 2 + 10 * 1 + 20 * 2), "b": 20 * 100}
    cacheable = {n: card(n).cost(_cfg(n), shape).f_cacheable for n in ("simplecil", "tosca", "l2p", "ease")}
    assert cacheable == {"simplecil": 120, "tosca": 120, "l2p": 0, "ease": 0}
    assert card("tosca").cost(_cfg("tosca", "augment"), shape).f_cacheable == 0


def test_counts_follow_a_runs_own_split_protocols_and_config():
    """projection-check counts on the run's actual task sizes, protocols, tokens and L2P's query mode."""
    shape = RunShape((10.0, 20.0), (5.0, 12.0), tokens=10, protocols=2)
    k = (10 + 1 * 5) / 10
    assert _work("l2p", shape, query="cached", epochs=3, top_k=1) == {
        "f": pytest.approx(2 * (5 + 12) * k),
        "b": pytest.approx(3 * 30 * k),
    }
    assert _work("l2p", shape, epochs=3, top_k=1)["f"] == pytest.approx(3 * 30 + 2 * (5 + 12) * (1 + k))
    assert _work("ease", shape, epochs=3) == {"f": (10 * 1 + 20 * 2) + 2 * (5 * 1 + 12 * 2), "b": 90}
    assert _work("tosca", shape, epochs=3)["route_module_images"] == 2 * (5 * 1 + 12 * 2)


def test_ci_profiles_count_only_the_images_they_learn_from():
    """The run's ``train_per_class`` (the ci profiles'): at most k images per class of a task enter training and
    prototypes; without the split's classes per task the shape cannot say, and stays as it is."""
    full = RunShape((100.0, 30.0), (5.0, 12.0), classes_per_task=(4, 2))
    shape = dataclasses.replace(full, train_per_class=16)
    assert shape.learnt == (64, 30) and full.learnt == full.train_per_task
    assert RunShape((100.0,), (5.0,), train_per_class=16).learnt == (100.0,)
    assert _work("ease", shape, epochs=2) == {"f": 64 * 1 + 30 * 2 + 5 * 1 + 12 * 2, "b": 2 * 94}
    assert _work("l2p", shape, epochs=2, query="cached")["b"] == pytest.approx(2 * 94 * (197 + 25) / 197)


def test_projection_reproduces_the_committed_paper_table():
    """The committed reports/perf/projection-cpu.json, recomputed from its own measured costs by the strategies'
    cost models: the same rows, counts and hours (the counts' float sums may differ in the last bit)."""
    from clbench.perf.projection import format_projection, projection

    old = json.loads((ROOT / "reports/perf/projection-cpu.json").read_text())
    new = projection(old["costs"], seeds=old["projection"]["seeds"], names=["simplecil", "tosca", "l2p", "ease"])
    before = {(r["strategy"], r["bench"]): r for r in old["projection"]["per_run"]}
    after = {(r["strategy"], r["bench"]): r for r in new["per_run"]}
    assert before.keys() == after.keys()
    for key, row in before.items():
        assert row.keys() == after[key].keys(), key
        for field, value in row.items():
            expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-12)
            assert after[key][field] == expected, (key, field)
    for row, totals in old["projection"]["per_strategy"].items():
        assert new["per_strategy"][row] == pytest.approx(totals, rel=1e-12)
    assert new["table_hours_with_cache"] == pytest.approx(
        old["projection"]["table_hours_4_strategies_with_cache"], rel=1e-12
    )
    assert "| tosca-augment |" in format_projection(new, old["costs"])


def test_projection_has_a_row_for_every_registered_strategy():
    from clbench.perf.projection import projection, projection_rows

    rows = [r for r, _, _ in projection_rows()]
    assert set(STRATEGIES.names()) <= set(rows) and "tosca-augment" in rows
    costs = json.loads((ROOT / "reports/perf/projection-cpu.json").read_text())["costs"]
    proj = projection(costs)
    assert set(proj["per_strategy"]) | set(proj["unmodelled"]) == set(rows)
    assert proj["unmodelled"] == []  # every registered strategy states its cost
    simple = proj["per_strategy"]["simplecil"]
    assert simple["hours"] == pytest.approx(3 * simple["hours_with_feature_cache"])  # features once, not per seed


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_param_formula_equals_a_real_runs_counts(name, micro_session_factory):
    """param_formula (config alone) against param_counts() after a real run on the micro ViT (d = 64, 4 blocks), for
    every registered strategy: a new method's formula is checked the moment it is registered."""
    cls = STRATEGIES.get(name)
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    s = micro_session_factory(  # 4 images per class: the counts depend on the classes, not on the images
        name,
        init_cls=18,
        increment=9,
        overrides=tuple((k, v) for k, v in FAST.items() if k in fields),
        train_per_class=4,
    )
    sizes = []
    for step in s.tasks():
        s.strategy.learn_task(step.task)
        sizes.append(len(step.task.classes))
    real = s.strategy.param_counts()
    model = s.backbone.model
    # a method that fine-tunes the ViT trains all of it: its formula takes the ViT's count (fine_tunes_backbone)
    vit = {"backbone_params": s.backbone.n_params()} if cls.fine_tunes_backbone else {}
    formula = cls.param_formula(s.strategy.cfg, s.backbone.num_features, len(model.blocks), tuple(sizes), **vit)
    assert sizes == [18, 9, 9]
    assert formula.added_per_task == real.added_per_task
    assert formula.stored_per_task == real.stored_per_task
    assert formula.trainable_per_task == real.trainable_per_task
    assert formula.head == real.head


def test_tosca_module_at_vit_b16_is_the_papers_149808():
    from clbench.perf.params import param_table

    table = param_table(768, 12, (10,) * 10)
    assert set(table["strategies"]) == set(STRATEGIES.names()) and table["unstated"] == []
    tosca = table["strategies"]["tosca"]
    assert tosca["added_per_task"] == [149_808 + 10 * 768 + 1] + [149_808 + 10 * 768] * 9  # module and head rows
    assert tosca["stored_total"] == 0 and tosca["added_over_tosca"] == 1.0
    assert table["strategies"]["simplecil"]["added_per_task"] == [0] * 10  # class means: stored, not learned
    assert table["strategies"]["simplecil"]["stored_per_task"] == [10 * 768] * 10


def test_perf_params_cli_records_json_and_refuses_bad_tasks(tmp_path, capsys):
    from clbench.cli import main

    out = tmp_path / "params.json"
    assert main(["perf", "params", "--d", "768", "--depth", "12", "--tasks", "10x10", "--out", str(out)]) == 0
    assert "| tosca | 157,489 | 157,488 | 1,574,881 | 0 |" in capsys.readouterr().out  # module + head rows
    assert json.loads(out.read_text())["strategies"]["tosca"]["added_total"] == 1_498_080 + 100 * 768 + 1
    assert main(["perf", "params", "--tasks", "10y"]) == 2
    assert "--tasks '10y'" in capsys.readouterr().err
    assert main(["perf", "params", "--d", "100"]) == 2  # TOSCA's ratio 16 does not divide 100
    assert "d=100" in capsys.readouterr().err


def test_perf_lists_the_strategies_own_benchmarks(capsys):
    from clbench.cli import main

    with pytest.raises(SystemExit):
        main(["perf", "--help"])
    assert "tosca-routing" in capsys.readouterr().out


def test_projection_check_reads_any_strategys_record(tmp_path):
    """projection-check on a real TOSCA run (micro ViT): the work counted on the run's own split and config; the
    cached features are left out of the prediction; a run whose work is all cached has no ratio."""
    from clbench.perf.projection import check_against_run
    from clbench.run.harness import RunConfig, run

    common = {
        "bench": "emoji",
        "backbone": "vit_micro",
        "weights": "random",
        "init_cls": 18,
        "increment": 9,
    }
    rec = run(RunConfig(strategy="tosca", overrides=(("epochs", "2"),), out=str(tmp_path / "t"), **common))
    n_train, n_test = rec.n_images["train"], rec.n_images["test"]  # 2,320 and 942 on the embedded benchmark
    got = check_against_run(tmp_path / "t", log=lambda m: None)
    assert got["strategy"] == "tosca" and got["work"]["luca_steps"] == 2 * n_train
    assert got["f_cacheable"] == got["work"]["f"] == n_train + n_test
    # after tasks 1, 2, 3: a part, more, all n_test test images routed through 1, 2, 3 modules
    assert n_test * 3 < got["work"]["route_module_images"] < n_test * 6
    unit = got["costs"]["s_per_image"]
    assert got["predicted_s"] == pytest.approx(
        got["work"]["luca_steps"] * unit["luca_steps"]
        + got["work"]["route_module_images"] * unit["route_module_images"]
    )
    run(RunConfig(strategy="simplecil", out=str(tmp_path / "s"), **common))
    simple = check_against_run(tmp_path / "s", log=lambda m: None)
    assert simple["predicted_s"] == 0 and simple["ratio"] is None
    assert simple["work"]["f"] == got["work"]["f"]  # the same images once each
