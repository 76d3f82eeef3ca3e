"""One parameter accounting for every method (clbench.methods.contract.ParamCounts): learned parameters added,
statistics stored and parameters trained, apart. Records written before it (schema 1 to 3) are restated once by
`clbench records upgrade` (clbench.records.upgrade) through each strategy's card's ``split_kept``, which keeps the
counts as written beside them; the restated counts must equal what the strategy's ``param_formula`` gives a new run of
the same configuration (which tests/test_cost_model.py ties to real runs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clbench.core.catalog import STRATEGIES
from clbench.records.results import load_record

REPO = Path(__file__).resolve().parent.parent
WIDTH_DEPTH = {"vit_small_patch14_dinov2": (384, 12)}  # the backbone of the committed records
OLD = sorted(  # written before one parameter accounting (schema 4), restated by `clbench records upgrade`
    p
    for p in REPO.glob("reports/**/result.json")
    if "restated_from_schema" in json.loads(p.read_text())["params"]
    and json.loads(p.read_text()).get("backbone") in WIDTH_DEPTH
    and json.loads(p.read_text()).get("complete")
)


def formula_for(rec):
    cls = STRATEGIES.get(rec.strategy)
    names = {f.name for f in dataclasses.fields(cls.Config)}
    cfg = cls.Config(**{k: v for k, v in rec.strategy_config.items() if k in names})
    d, depth = WIDTH_DEPTH[rec.backbone]
    return cls.param_formula(cfg, d, depth, tuple(rec.task_sizes))


# the strategies registered before one parameter accounting (schema 4); every later one writes its counts directly
BEFORE_SCHEMA_4 = {"aper", "dualprompt", "ease", "l2p", "mos", "ranpac", "simplecil", "tosca"}


def test_there_are_old_records_of_every_strategy_to_restate():
    assert BEFORE_SCHEMA_4 <= set(STRATEGIES.names())
    assert {json.loads(p.read_text())["strategy"] for p in OLD} == BEFORE_SCHEMA_4


@pytest.mark.parametrize("path", OLD, ids=lambda p: str(p.parent.relative_to(REPO)))
def test_an_old_record_is_restated_as_a_new_run_would_count(path):
    rec = load_record(path)
    want = formula_for(rec)
    p = rec.params
    assert p.trainable_per_task == want.trainable_per_task  # unchanged meaning: the same configuration
    assert p.added_per_task == want.added_per_task
    assert p.stored_per_task == want.stored_per_task
    assert (p.added_total, p.stored_total) == (sum(want.added_per_task), sum(want.stored_per_task))
    assert p.extra["restated_from_schema"] in (1, 2, 3)  # the version the counts were written in
    written = sum(p.extra["kept_as_written"])  # the old added_total: learned and stored together
    kept = p.added_total + p.stored_total
    if rec.strategy == "tosca":  # the old count left out TOSCA's trained head rows
        assert kept == written + p.head
    elif rec.strategy == "ranpac":  # and RanPAC's Gram matrix and class sums (in ``extra`` only)
        assert kept == written + p.extra["gram_floats"] + p.extra["class_sum_floats"]
    else:  # the rest kept learned parameters and statistics together
        assert kept == written


def test_the_split_puts_each_kind_where_it_belongs():
    sizes = (10,) * 10
    f = {name: formula_for_default(name, sizes) for name in STRATEGIES.names()}
    assert sum(f["simplecil"].added_per_task) == 0 and sum(f["simplecil"].stored_per_task) == 100 * 768
    assert sum(f["l2p"].stored_per_task) == sum(f["dualprompt"].stored_per_task) == 0
    assert f["tosca"].added_per_task[1] == 149_808 + 10 * 768  # the module and its classes' head rows
    ranpac = f["ranpac"]
    assert ranpac.stored_per_task[0] == 768 * 10_000 + 10_000**2 + 10_000 * 10  # W, G and Q (10 classes)
    mos = f["mos"]
    assert mos.stored_per_task[0] == 10 * (768 + 768 + 768 * 768)  # prototype, mean and covariance per class


def formula_for_default(name, sizes):
    from clbench.core.config import make_strategy_config

    cls = STRATEGIES.get(name)
    return cls.param_formula(make_strategy_config(cls, None, ()), 768, 12, sizes)
