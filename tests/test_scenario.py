"""The domain-incremental scenario (``--scenario domain``, issue #40): the run setting, its fingerprint, the metrics
over domains, the refusal of a strategy that does not support it, each supporting strategy on a tiny two-domain set, and
runs of the ``emoji-vendors`` benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tinytasks import features_context, gaussian_split, make_split

from clbench.benchmarks import BENCHMARKS
from clbench.core.catalog import STRATEGIES
from clbench.core.config import Fingerprint, RunConfig
from clbench.core.labels import new_class_count
from clbench.errors import ClbenchError, setting
from clbench.evaluation import metrics
from clbench.methods.contract import Context, Split, Task
from clbench.run.scenario import _from_source, declared_scenarios, supporting

DOMAIN_STRATEGIES = ["acil", "dualprompt", "l2p", "ranpac", "simplecil", "slda", "tosca"]
CLASS_ONLY = ["aper", "dsal", "ease", "fecam", "mos", "randumb"]  # see each class's ``scenarios`` comment


# ----------------------------------------------------------------------------------------------- the setting
def test_scenario_is_a_checked_run_setting_in_the_fingerprint_only_where_not_class():
    assert RunConfig(strategy="simplecil").scenario == "class"
    with pytest.raises(ClbenchError, match="scenario"):
        RunConfig(strategy="simplecil", scenario="task")
    cls = Fingerprint.from_config(RunConfig(strategy="simplecil"), "b")
    dom = Fingerprint.from_config(RunConfig(strategy="simplecil", bench="emoji-vendors", scenario="domain"), "b")
    assert "scenario" not in cls  # a record or checkpoint written before the setting is a class run's: same print
    assert dom["scenario"] == "domain"
    said = f"{setting('scenario')}: class in the checkpoint, domain here"
    assert cls.differences({**cls, "scenario": "domain"}) == [said]
    assert cls.differences({**cls, "scenario": "class"}) == []


def test_records_without_a_scenario_read_as_class(tmp_path):
    from clbench.records.schema import RunRecord

    assert RunRecord.__dataclass_fields__["scenario"].default is None  # None: class (the old schema)


# ----------------------------------------------------------------------------------------------- metrics
def test_metrics_over_domains_from_a_hand_computed_matrix():
    # three domains; R[t][d] = accuracy on domain d's test images after domain t
    r = [[80.0], [60.0, 90.0], [70.0, 50.0, 85.0]]
    # forgetting: d0: max(80, 60) - 70 = 10; d1: 90 - 50 = 40 -> 25. bwt: (70-80 + 50-90)/2 = -25
    assert metrics.forgetting(r) == pytest.approx(25.0)
    assert metrics.bwt(r) == pytest.approx(-25.0)
    assert metrics.forgetting_first_last(r) == pytest.approx(25.0)
    defs = metrics.definitions("domain")
    assert "domain" in defs["R[t][j]"] and "old domains" in defs["forgetting"] and "task-aware" in defs
    assert metrics.definitions("class") == metrics.DEFINITIONS


def test_task_aware_prediction_restricts_the_argmax_to_the_images_task():
    logits = np.array([[5.0, 1.0, 2.0, 0.0], [0.0, 3.0, 1.0, 4.0]])
    tasks = np.array([[False, False, True, True], [True, True, False, False]])  # image 0: task {2,3}; 1: {0,1}
    assert metrics.task_aware_prediction(logits, tasks).tolist() == [2, 1]
    assert metrics.task_aware_prediction(logits).tolist() == [0, 3]  # no task given: the plain argmax
    assert metrics.task_aware_prediction(logits, np.zeros_like(tasks)).tolist() == [0, 3]  # no class marked


# ----------------------------------------------------------------------------------------------- refusal
def test_an_unsupported_strategy_is_refused_in_one_line_naming_the_supporters():
    from clbench.run import harness

    with pytest.raises(ClbenchError) as e:
        harness.resolve(RunConfig(strategy="ease", bench="emoji-vendors", scenario="domain"))
    text = str(e.value)
    assert "\n" not in text and text.startswith("ease does not support scenario domain; strategies that do: ")
    assert all(name in text for name in DOMAIN_STRATEGIES)
    with pytest.raises(ClbenchError, match="single domain"):
        harness.resolve(RunConfig(strategy="simplecil", bench="emoji", scenario="domain"))
    with pytest.raises(ClbenchError, match="domains"):
        harness.resolve(RunConfig(strategy="simplecil", bench="emoji-vendors", scenario="domain", increment=6))


def test_the_refusal_reads_the_strategies_without_importing_them():
    code = (
        "import sys\nfrom clbench.run.scenario import check_scenario, supporting\n"
        "print(','.join(supporting('domain')))\n"
        "assert 'torch' not in sys.modules and 'baselines.ease' not in sys.modules, sorted(sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    named = out.stdout.strip().split(",")
    assert set(DOMAIN_STRATEGIES) <= set(named) and not set(CLASS_ONLY) & set(named)


def test_the_source_read_scenarios_are_the_class_attributes():
    named = supporting("domain")
    assert set(DOMAIN_STRATEGIES) <= set(named) and not set(CLASS_ONLY) & set(named)
    for name in DOMAIN_STRATEGIES + CLASS_ONLY:
        target = STRATEGIES._lazy.get(name)
        cls = STRATEGIES.get(name)
        assert declared_scenarios(name) == cls.scenarios, name
        if target is not None:
            assert _from_source(target) in (None, cls.scenarios)


def test_a_strategy_with_shared_layer_mixins_is_read_from_its_source_without_importing_it():
    """SLCA derives from a mixin of shared layers and Strategy: its scenarios (the contract's default) are read from
    the source, so a refusal that needs them imports no torch."""
    target = STRATEGIES._lazy.get("slca") or "baselines.slca:SLCA"
    assert _from_source(target) == ("class",)


def test_new_class_count_accepts_the_next_labels_or_a_known_domain_only():
    assert new_class_count([3, 4], 5, 3, 1) == 2
    assert new_class_count([0, 1, 2], 3, 3, 1) == 0  # a later domain of known classes
    with pytest.raises(ValueError):
        new_class_count([0, 5], 6, 3, 1)


# ----------------------------------------------------------------------------------------------- strategies
CLASSES = [0, 1, 2, 3]


def _domain_tasks(split0: Split, split1: Split) -> list[Task]:
    return [Task(0, CLASSES, 4, split0), Task(1, CLASSES, 4, split1)]


def _features_tasks() -> tuple[list[Task], Split]:
    a = gaussian_split(CLASSES, 12, seed=1)
    b = gaussian_split(CLASSES, 12, seed=2, noise=1.5)  # another domain: other noise around the same centres
    b = Split(None, b.indices, b.labels, b.features + 0.5, None, None)  # and a shift
    return _domain_tasks(a, b), gaussian_split(CLASSES, 5, seed=3)


def test_simplecil_prototypes_are_means_over_every_domain():
    from baselines.simplecil import SimpleCIL, SimpleCILConfig

    tasks, test = _features_tasks()
    s = SimpleCIL(SimpleCILConfig(), features_context())
    for task in tasks:
        s.learn_task(task)
        assert s.predict(test).shape == (len(test), 4)
    both = torch.cat([t.train.features for t in tasks])
    labels = torch.cat([t.train.labels for t in tasks])
    joint = torch.stack([both[labels == c].mean(0) for c in CLASSES])
    assert torch.allclose(s.head.weight.detach(), joint, atol=1e-5)
    assert s.param_counts().stored_per_task == [4 * 64, 0]  # rows come with the first domain only


@pytest.mark.parametrize("name", ["acil", "slda", "ranpac"])
def test_closed_form_heads_after_two_domains_equal_one_task_of_both(name, backbone):
    """ACIL's recursive least squares and RanPAC's accumulated G/Q are exact over any new images, and SLDA's
    class means are streaming means: after two domains the head is the one a single task of both domains gives."""
    from clbench.core.catalog import STRATEGIES as S

    cls = S.get(name)
    cfg = {
        "acil": lambda c: c(M=80, gamma=0.1),
        "slda": lambda c: c(streaming_update_sigma=True),
        "ranpac": lambda c: c(M=96, first_session=False),
    }[name](cls.Config)
    tasks, test = _features_tasks()
    make_ctx = (lambda: _ctx(backbone)) if name == "ranpac" else features_context  # RanPAC holds the ViT (64-d)
    two = cls(cfg, make_ctx())
    for task in tasks:
        two.learn_task(task)
    both = Split(
        None,
        np.arange(48),
        torch.cat([t.train.labels for t in tasks]),
        torch.cat([t.train.features for t in tasks]),
        None,
        None,
    )
    one = cls(cfg, make_ctx())
    one.learn_task(Task(0, CLASSES, 4, both))
    a, b = two.predict(test), one.predict(test)
    assert a.shape == (len(test), 4)
    if name == "ranpac":  # the ridge lambda is chosen on the current task's images: compare at the same lambda
        from baselines.ranpac import solve_ridge

        two.Wo = solve_ridge(two.G, two.Q, one.lambdas[-1], cfg.ridge_numerics)
        a = two.predict(test)
    assert torch.allclose(a, b, rtol=1e-3, atol=1e-3), (a - b).abs().max()
    assert len(two.param_counts().added_per_task) == 2


def _ctx(backbone) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=7, log=lambda s: None)


@pytest.fixture(scope="module")
def image_tasks(backbone):
    # two domains of the same four classes: other random images (a micro ViT sees them as another distribution)
    return _domain_tasks(make_split(backbone, CLASSES, 4, seed=11), make_split(backbone, CLASSES, 4, seed=12)), (
        make_split(backbone, CLASSES, 2, seed=13)
    )


def test_tosca_keeps_one_module_and_one_prototype_set_per_domain(backbone, image_tasks):
    from tosca.strategy import TOSCA, TOSCAConfig

    tasks, test = image_tasks
    s = TOSCA(TOSCAConfig(epochs=1, batch_size=8), _ctx(backbone))
    s.learn_task(tasks[0])
    assert s.task_heads == []  # nothing repeats yet: the class scenario's shared head
    s.learn_task(tasks[1])
    assert len(s.modules_) == 2 and len(s.task_heads) == 2
    assert not torch.equal(s.task_heads[0], s.task_heads[1])  # module 0 keeps domain 0's prototypes
    all_logits = s.all_logits(test)
    assert all_logits.shape == (2, len(test), 4)
    with torch.no_grad():
        z = test.features
        own = metrics_cos(s.modules_[0](z), s.task_heads[0], s.head.sigma)
    assert torch.allclose(all_logits[0], own, atol=1e-5)
    given = s.predict_given_task(test, np.array([0, 1] * (len(test) // 2)))
    assert torch.allclose(given[0], all_logits[0, 0]) and torch.allclose(given[1], all_logits[1, 1])
    assert s.predict(test).shape == (len(test), 4)


def metrics_cos(z: torch.Tensor, w: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    from clbench.methods.shared import cosine_logits

    return cosine_logits(z, w, sigma)


@pytest.mark.parametrize("name", ["l2p", "dualprompt"])
def test_prompt_methods_train_one_head_over_every_class_across_domains(backbone, image_tasks, name):
    tasks, test = image_tasks
    cls = STRATEGIES.get(name)
    cfg = cls.Config(epochs=1, batch_size=8, eval_batch_size=4)
    s = cls(cfg, _ctx(backbone))
    s.learn_task(tasks[0])
    head0 = s.head.weight.detach().clone()
    s.learn_task(tasks[1])
    assert s.head.weight.shape[0] == 4  # sized for every class from the first domain; no row added later
    assert not torch.equal(head0, s.head.weight.detach())  # the second domain trains the rows of seen classes
    assert s.predict(test).shape == (len(test), 4)
    counts = s.param_counts()
    assert len(counts.added_per_task) == 2


# ----------------------------------------------------------------------------------------------- runs
def test_emoji_vendors_has_two_vendor_domains_over_the_same_classes_and_the_split_by_base_emoji():
    from clbench.benchmarks import build_benchmark

    spec = BENCHMARKS.get("emoji-vendors")
    assert spec.domains == ("noto", "twemoji") and spec.n_classes == 36
    bench = build_benchmark(spec, scenario="domain")
    assert bench.n_tasks == 2 and bench.task_sizes == [36, 0]
    for split, y in (("train", bench.train_y), ("test", bench.test_y)):
        d = bench.image_tasks(split)
        assert np.bincount(d).tolist() in ([1160, 1160], [471, 471])
        for k in (0, 1):  # every class in both domains
            assert set(np.unique(y[d == k]).tolist()) == set(range(36))
    with np.load(Path(__file__).parents[1] / "clbench" / "data" / "emoji.npz") as z:
        assert not set(z["train_group"].tolist()) & set(z["test_group"].tolist())  # split by base emoji
    assert bench.seen_test(0).size == 471 and bench.seen_test(1).size == 942


def test_a_domain_run_on_the_micro_vit_evaluates_every_domain_seen(tmp_path):
    from clbench.run import harness

    cfg = RunConfig(
        strategy="tosca",
        bench="emoji-vendors",
        scenario="domain",
        backbone="vit_micro",
        weights="random",
        train_per_class=2,
        overrides=(("epochs", "1"),),
        out=str(tmp_path / "run"),
    )
    record = harness.run(cfg)
    main = record.protocols[record.protocol]
    assert [len(row) for row in main.accuracy_matrix] == [1, 2]  # R[t][d], d <= t
    assert record.scenario == "domain" and record.domains == ["noto", "twemoji"]
    assert record.task_sizes == [36, 36] and record.fingerprint["scenario"] == "domain"
    assert len(main.task_aware_curve) == 2 and main.task_aware_last is not None
    assert record.metric_definitions == metrics.DOMAIN_DEFINITIONS
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["scenario"] == "domain"
    oracle = record.per_task[-1].diagnostics["oracle_acc"]  # the true domain's module: TOSCA's task-aware number
    assert main.task_aware_last == pytest.approx(oracle)


def test_class_runs_record_the_task_aware_accuracy_beside_the_task_agnostic(tmp_path):
    from clbench.run import harness

    cfg = RunConfig(
        strategy="simplecil",
        bench="emoji",
        backbone="vit_micro",
        weights="random",
        init_cls=18,
        increment=18,
        out=str(tmp_path / "c"),
    )
    record = harness.run(cfg)
    main = record.protocols[record.protocol]
    assert main.task_aware_curve[0] == pytest.approx(main.acc_curve[0])  # one task: the same number
    assert main.task_aware_curve[1] >= main.acc_curve[1]  # restricted to the right task's classes: never worse here
    assert record.scenario is None and "scenario" not in record.fingerprint


@pytest.mark.full
def test_cli_run_of_simplecil_on_emoji_vendors_in_the_domain_scenario(tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "clbench.cli", "run", "--strategy", "simplecil", "--bench", "emoji-vendors"]
    cmd += ["--scenario", "domain", "--profile", "ci", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    r = json.loads((out / "result.json").read_text())
    assert r["scenario"] == "domain" and len(r["protocols"]["per-sample"]["accuracy_matrix"]) == 2


def test_curves_of_a_domain_run_are_drawn_against_the_domains_seen():
    """A domain-incremental run's tasks all bring the same classes: its curves' x axis counts domains (1..T), not
    classes (which would read 50, 100, 150, 200 for four domains of the same 50 classes)."""
    from clbench.report.collect import collect

    root = Path(__file__).resolve().parents[1] / "reports"
    domain = collect([root / "emoji-domains/cheap-seeds/runs/slda-emoji-domains-s1993"]).runs[0]
    assert domain.seen_axis == ([1, 2, 3, 4], "number of domains seen")
    cls = collect([root / "emoji/runs/seeds/slda-emoji-s1993-o1993"]).runs[0]
    assert cls.seen_axis == ([6, 12, 18, 24, 30, 36], "number of classes seen")
