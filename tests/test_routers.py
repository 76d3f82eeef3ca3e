"""Routers (clbench/methods/routers.py) and TOSCA's routing study: per-sample rules, fitted on training data only."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.errors import ClbenchError
from clbench.methods.routers import (
    ROUTERS,
    RouteInputs,
    RoutingMemory,
    collapse_warning,
    fit_temperature,
    route,
)
from clbench.perf.routers import synthetic_memory

BASELINE = Path(__file__).parent / "fixtures" / "routing" / "entropy_baseline.json"
# The micro ViT's random init (seed 1993, 32 px) saved once: the init itself differs between CPU kinds (an Intel Xeon
# with AMX and an AMD EPYC gave other digests), so the pinned run loads these weights instead of drawing them.
MICRO_WEIGHTS = BASELINE.parent / "vit_micro_s1993.safetensors"
SUM_RTOL = 1e-6  # logits/features sums across CPU kernels (measured 3e-8); a changed rule moves them by far more
ALL = ("max-logit", "energy", "margin", "entropy-calibrated", "prototype", "mahalanobis", "mahalanobis-task")


def _inputs(T=5, N=300, C_per=6, d=24, seed=0) -> RouteInputs:
    g = torch.Generator().manual_seed(seed)
    mem = synthetic_memory(d, T, per_task=40, classes_per_task=C_per, seed=seed)
    task = torch.randint(0, T, (N,), generator=g)
    feats = torch.stack([mem.tasks[t].mean.float() for t in task.tolist()]) + torch.randn(N, d, generator=g)
    return RouteInputs(torch.randn(T, N, T * C_per, generator=g) * 4, feats, mem, task.numpy())


def _subset(inp: RouteInputs, idx: torch.Tensor) -> RouteInputs:
    return RouteInputs(inp.logits[:, idx], inp.features[idx], inp.memory, inp.task_id[idx.numpy()])


@pytest.mark.parametrize("name", ROUTERS.names())
def test_every_router_is_invariant_to_shuffling_and_batch_size(name):
    inp = _inputs()
    full = route(name, inp)
    assert full.shape == (300,) and full.dtype == torch.long
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(3))
    assert torch.equal(route(name, _subset(inp, perm)), full[perm])
    for batch in (1, 7, 128):
        chunks = [route(name, _subset(inp, torch.arange(s, min(s + batch, 300)))) for s in range(0, 300, batch)]
        assert torch.equal(torch.cat(chunks), full), batch
    assert len(set(full.tolist())) > 1, "a rule choosing one module for every random image shows nothing"


def test_feature_rules_route_well_separated_tasks_perfectly_while_an_overconfident_module_fools_entropy():
    T, d, per = 4, 16, 60
    g = torch.Generator().manual_seed(0)
    centroids = torch.eye(d)[:T] * 8.0  # well separated task centroids
    mem = RoutingMemory()
    for t in range(T):
        z = centroids[t] + torch.randn(per, d, generator=g)
        y = torch.randint(0, 3, (per,), generator=g) + 3 * t
        mem.fit_task(t, z, y, torch.randn(per, 3 * (t + 1), generator=g))
    task = torch.arange(T).repeat_interleave(50)
    feats = centroids[task] + torch.randn(len(task), d, generator=g)
    logits = torch.randn(T, len(task), 3 * T, generator=g)
    logits[0, :, 0] += 50.0  # module 0 is over-confident on every image
    inp = RouteInputs(logits, feats, mem, task.numpy())
    acc = {n: float((route(n, inp) == task).float().mean()) for n in ROUTERS.names()}
    assert acc["prototype"] == acc["mahalanobis"] == acc["mahalanobis-task"] == acc["oracle"] == 1.0
    assert acc["entropy"] == acc["max-logit"] == acc["margin"] == 0.25  # every image to module 0
    assert (route("entropy", inp) == 0).all()


def test_temperature_fit_recovers_a_known_temperature():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4000, 10, generator=g) * 2
    labels = torch.multinomial(base.softmax(-1), 1, generator=g).squeeze(1)
    assert fit_temperature(base * 3, labels) == pytest.approx(3.0, rel=0.1)
    assert fit_temperature(base / 2, labels) == pytest.approx(0.5, rel=0.1)


def test_collapse_onto_any_module_is_flagged():
    task = np.repeat(np.arange(5), 40)
    onto_second = np.where(np.arange(200) < 191, 1, task)  # 191 of 200 to module 2 of 5 (the case)
    msg = collapse_warning(onto_second, task, 5, "entropy")
    assert msg and "module 2 of 5" in msg and "96%" in msg
    onto_newest = np.full(200, 4)
    assert "newest module" in collapse_warning(onto_newest, task, 5, "entropy")
    assert collapse_warning(task, task, 5, "entropy") is None  # perfect routing
    rng = np.random.default_rng(0)
    assert collapse_warning(rng.integers(0, 5, 200), task, 5, "entropy") is None  # uniform mistakes
    assert collapse_warning(np.zeros(10, dtype=int), np.zeros(10, dtype=int), 1, "entropy") is None


# ----------------------------------------------------------------------------------------------- TOSCA
def entropy_trace(session) -> dict:
    """Per-task fingerprints of TOSCA's per-sample logits and predictions, at fp32. Predictions, accuracies and the
    routing histogram are pinned exactly; logits by sums and features by sums of magnitudes (float64), within
    :data:`SUM_RTOL`, because their last bits differ between CPU kernels (AVX-512 against AVX2: 3e-8 relative)."""
    out = []
    for step in session.tasks():
        session.strategy.learn_task(step.task)
        logits = session.strategy.predict(step.test, "per-sample")
        d = session.strategy.diagnostics(step.test, step.sample_task)
        out.append(
            {
                "task": step.task.id,
                "preds_sha256": hashlib.sha256(logits.argmax(1).numpy().astype("int64").tobytes()).hexdigest(),
                "acc": d["per-sample"]["acc"],
                "chosen_hist": d["per-sample"]["chosen_hist"],
                "logits_sum": float(logits.double().sum()),
                "logits_abs_sum": float(logits.double().abs().sum()),
                "diag": d,
            }
        )
    feats = session.features["test"].double()
    return {
        "weights_digest": session.backbone.digest,
        "features_sq_sum": float(feats.square().sum()),
        "features_abs_sum": float(feats.abs().sum()),
        "tasks": out,
    }


@pytest.mark.pins_numbers
def test_entropy_default_is_the_pre_router_result_and_oracle_is_the_recorded_bound(micro_session_factory):
    """The fixture pins TOSCA's entropy routing, at fp32 and from saved micro-ViT weights so that it holds on every CPU
    kind (AMX, AVX-512 without AMX, AVX2; .ci/run also runs it with ATEN_CPU_CAPABILITY=avx2)."""
    s = micro_session_factory(
        "tosca",
        seed=1993,
        precision="fp32",
        weights=str(MICRO_WEIGHTS),
        overrides=(("epochs", "3"), ("routers", ",".join(ALL))),
    )
    assert s.strategy.cfg.router == "entropy"
    got = entropy_trace(s)
    if os.environ.get("CLBENCH_UPDATE_GOLDEN"):  # regenerate after an intended change, and review the diff
        made_with = "tests/test_routers.py::entropy_trace, micro ViT from MICRO_WEIGHTS, seed 1993, epochs 3, fp32"
        fixture = {
            "made_with": made_with,
            **got,
            "tasks": [{k: v for k, v in t.items() if k != "diag"} for t in got["tasks"]],
        }
        BASELINE.write_text(json.dumps(fixture, indent=1) + "\n")
    want = json.loads(BASELINE.read_text())
    assert got["weights_digest"] == want["weights_digest"], "the micro ViT's weights file changed"
    for key in ("features_sq_sum", "features_abs_sum"):
        assert got[key] == pytest.approx(want[key], rel=SUM_RTOL), f"the micro ViT's features changed ({key})"
    for g, w in zip(got["tasks"], want["tasks"], strict=True):
        exact = ("task", "preds_sha256", "acc", "chosen_hist")
        assert {k: g[k] for k in exact} == {k: w[k] for k in exact}, f"task {w['task']}"
        for key in ("logits_sum", "logits_abs_sum"):
            assert g[key] == pytest.approx(w[key], rel=SUM_RTOL), f"task {w['task']}: {key}"
        study = g["diag"]["routers"]
        assert set(study) == {"entropy", *ALL, "oracle"}
        assert study["entropy"]["acc"] == g["acc"] and study["entropy"]["chosen_hist"] == g["chosen_hist"]
        assert study["oracle"]["acc"] == g["diag"]["oracle_acc"]
        assert study["oracle"]["routing_acc"] == 100.0
        conf = np.array(study["entropy"]["confusion"])
        assert conf.sum(axis=0).tolist() == g["chosen_hist"] and conf.trace() / conf.sum() * 100 == pytest.approx(
            study["entropy"]["routing_acc"]
        )
    last = got["tasks"][-1]["diag"]
    assert last["routing_warning"] == last["routers"]["entropy"]["collapse_warning"] is not None  # 3 epochs: collapse
    assert len(last["router_temperatures"]) == 6 and last["module_output_cosine"] is not None


def _trained(micro_session_factory, overrides, disturb: bool):
    """TOSCA trained on 3 tasks; ``disturb``: after every task, test images with wrong labels and wrong task ids go
    through prediction and the routing study (the only way test data reaches a strategy)."""
    s = micro_session_factory("tosca", init_cls=12, increment=12, overrides=(("epochs", "1"), *overrides))
    steps = list(s.tasks())
    for step in steps:
        s.strategy.learn_task(step.task)
        if disturb:
            wrong = step.test.subset(np.arange(len(step.test)))
            wrong.labels = (wrong.labels + 1) % step.task.n_seen
            s.strategy.predict(wrong)
            s.strategy.diagnostics(wrong, (step.sample_task + 1) % (step.task.id + 1))
    return s, steps[-1]


def test_fitted_routers_learn_from_each_tasks_training_split_only(micro_session_factory):
    over = (("router", "mahalanobis"), ("routers", "entropy-calibrated,mahalanobis-task,prototype"))
    a, step = _trained(micro_session_factory, over, disturb=False)
    b, _ = _trained(micro_session_factory, over, disturb=True)
    ma, mb = a.strategy.routing, b.strategy.routing
    assert len(ma) == 3
    for ta, tb in zip(ma.tasks, mb.tasks, strict=True):
        assert ta.temperature == tb.temperature and ta.count == tb.count
        assert torch.equal(ta.mean, tb.mean) and torch.equal(ta.precision, tb.precision)
    assert torch.equal(ma.shared_precision, mb.shared_precision)
    # and they equal statistics fitted by hand from the training splits alone
    ref = RoutingMemory()
    for step_ in a.tasks():
        t = step_.task
        feats = torch.stack([m(t.train.features) for m in a.strategy.modules_[t.id : t.id + 1]])[0]
        ref.fit_task(t.id, t.train.features, t.train.labels, a.strategy.head(feats)[:, : t.n_seen].detach())
    assert [x.count for x in ref.tasks] == [x.count for x in ma.tasks]
    for x, y in zip(ref.tasks, ma.tasks, strict=True):
        torch.testing.assert_close(x.mean, y.mean)
        torch.testing.assert_close(x.precision, y.precision)
    for name in ("mahalanobis", "entropy-calibrated", "mahalanobis-task"):
        logits = a.strategy.all_logits(step.test)
        assert torch.equal(
            a.strategy.route_with(name, step.test, logits), b.strategy.route_with(name, step.test, logits)
        )
    assert torch.equal(a.strategy.predict(step.test), b.strategy.predict(step.test))


def test_strategy_routing_is_per_sample_for_every_router(micro_session_factory):
    s, step = _trained(micro_session_factory, (), disturb=False)
    split, true = step.test, step.sample_task
    perm = np.random.default_rng(0).permutation(len(split))
    logits = s.strategy.all_logits(split)
    for name in ROUTERS.names():
        full = s.strategy.route_with(name, split, logits, true)
        shuffled = s.strategy.route_with(
            name, split.subset(perm), s.strategy.all_logits(split.subset(perm)), true[perm]
        )
        assert torch.equal(shuffled, full[torch.as_tensor(perm)]), name


def test_unknown_router_lists_the_valid_ones():
    from clbench.core.config import make_strategy_config
    from tosca.strategy import TOSCA

    with pytest.raises(ClbenchError) as e:
        make_strategy_config(TOSCA, None, (("router", "entropyy"),))
    assert "unknown router 'entropyy'" in str(e.value) and "mahalanobis-task" in str(e.value)
    assert "did you mean 'entropy'" in str(e.value)
    with pytest.raises(ClbenchError, match="--set routers: unknown router 'nope'"):
        make_strategy_config(TOSCA, None, (("routers", "energy,nope"),))
    with pytest.raises(ClbenchError, match="bound"):
        make_strategy_config(TOSCA, None, (("router", "oracle"),))


def test_a_checkpoint_without_routing_statistics_refuses_rules_that_need_them(micro_session_factory):
    from clbench.core.config import make_strategy_config
    from tosca.strategy import TOSCA

    s, step = _trained(micro_session_factory, (), disturb=False)
    old = {k: v for k, v in s.strategy.state_dict().items() if k != "routing"}  # as written before routers
    fresh = TOSCA(make_strategy_config(TOSCA, None, (("router", "prototype"),)), s.strategy.ctx)
    with pytest.raises(ClbenchError, match="rerun the tasks") as e:
        fresh.load_state_dict(old)
    assert "0 of its 3 tasks" in str(e.value) and "--overwrite" in str(e.value)
    plain = TOSCA(make_strategy_config(TOSCA, None, ()), s.strategy.ctx)  # entropy needs nothing: loads, same result
    plain.load_state_dict(old)
    assert torch.equal(plain.predict(step.test), s.strategy.predict(step.test))
    with pytest.raises(ClbenchError, match="rerun the tasks"):
        plain.route_with("mahalanobis", step.test, plain.all_logits(step.test))  # never a silent fallback


def test_router_costs_runs_on_the_micro_vit():
    from clbench.perf.routers import router_costs

    out = router_costs(backbone="vit_micro", img_size=32, batch=8, tasks=(1, 3), log=lambda m: None)
    assert {r["router"] for r in out["rules"]} == set(ROUTERS.names())
    assert len(out["rules"]) == 2 * len(ROUTERS.names()) and all(r["ms_per_image"] > 0 for r in out["rules"])


def test_routing_study_tables_come_from_the_record(tmp_path):
    from clbench.report.collect import collect
    from clbench.report.routing import router_rows
    from clbench.report.routing_study import write_study
    from clbench.report.tables import markdown_tables
    from clbench.run.harness import RunConfig, run

    rec = run(
        RunConfig(
            strategy="tosca",
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            overrides=(("epochs", "2"), ("routers", "prototype,energy")),
            out=str(tmp_path / "run"),
        )
    )
    coll = collect([str(tmp_path / "run")])
    rows = {r["router"]: r for r in router_rows(coll.runs[0])}
    assert list(rows) == ["entropy (run's own)", "prototype", "energy", "oracle (bound)"]
    assert rows["entropy (run's own)"]["final acc %"] == rec.last_acc  # the run's own router is its result
    assert rows["entropy (run's own)"]["avg acc %"] == pytest.approx(rec.avg_acc)
    assert rows["oracle (bound)"]["final acc %"] == rec.per_task[-1].diagnostics["oracle_acc"]
    assert (
        rows["oracle (bound)"]["oracle gap closed %"] == 100.0
        and rows["entropy (run's own)"]["oracle gap closed %"] == 0
    )
    path = write_study(coll, tmp_path / "study", vary="l1")
    text = path.read_text()
    assert (
        f"{rec.last_acc:.2f}" in text
        and "Across `l1`" in text
        and (tmp_path / "study/figures/routing_study.png").exists()
    )
    assert "Routing study: run" in markdown_tables(coll)
    from clbench.report.routing import vary_mean_table, vary_table

    one, mean = vary_table(coll.runs, "l1").iloc[0], vary_mean_table(coll.runs, "l1").iloc[0]
    d = rec.per_task[-1].diagnostics["routers"]["prototype"]
    assert (
        one["prototype routing / final %"]
        == mean["prototype routing / final %"]
        == f"{d['routing_acc']:.1f} / {d['acc']:.2f}"
    )
    assert mean["seeds"] == str(rec.seed) and one["output cos"] == mean["output cos"] != "-"


def test_gate_reference_written_before_routers_still_pins_tosca_settings():
    """The regression gate compares a run's settings with its reference's: the router settings added since, at their
    defaults, are the same run; a non-default router, or any other changed setting, still differs."""
    import dataclasses

    from clbench.gate.check import settings_differences
    from tosca.strategy import TOSCAConfig

    now = dataclasses.asdict(TOSCAConfig())
    before = {k: v for k, v in now.items() if k not in ("router", "routers")}
    assert settings_differences("tosca", before, now) == []
    assert settings_differences("tosca", before, {**now, "router": "mahalanobis"}) == ["router"]
    assert settings_differences("tosca", before, {**now, "l1": 0.0}) == ["l1"]
    assert settings_differences("tosca", {**before, "epochs": 5}, now) == ["epochs"]
    assert settings_differences("tosca", now, before) == ["router", "routers"]  # the reference has it, the run not
