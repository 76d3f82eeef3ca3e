import pytest

from clbench.benchmarks import BENCHMARKS
from clbench.core.catalog import BACKBONES, STRATEGIES
from clbench.core.registry import Registry
from clbench.errors import ClbenchError


def test_unknown_name_lists_valid_and_suggests():
    with pytest.raises(ClbenchError) as e:
        STRATEGIES.check("simplcil")
    assert "simplecil" in str(e.value) and "did you mean 'simplecil'" in str(e.value)


def test_duplicate_registration_raises():
    r: Registry[int] = Registry("thing")
    r.register("a", 1)
    with pytest.raises(ValueError):
        r.register("a", 2)
    with pytest.raises(ValueError):
        r.register_lazy("a", "x:y")


def test_lazy_registration_resolves():
    r: Registry[object] = Registry("thing")
    r.register_lazy("dumps", "json:dumps")
    import json

    assert r.get("dumps") is json.dumps


def test_catalog_contents():
    assert {"simplecil", "tosca"} <= set(STRATEGIES.names())
    assert {"emoji", "fashion-mnist"} <= set(BENCHMARKS.names())
    assert "vit_small_patch14_dinov2" in BACKBONES


def test_every_ci_profile_runs_the_one_declared_ci_shape():
    """The gate's runs share one feature cache and one split: a ci profile takes its run shape from
    clbench.core.config (CI_INPUT, or CI_SHAPE for the methods run on 3 tasks), never its own copy."""
    from clbench.core.config import CI_INPUT, CI_SHAPE, RUN_LEVEL_PROFILE_KEYS

    seen = 0
    for name in STRATEGIES.names():
        for profile, values in STRATEGIES.get(name).profiles.items():
            if profile == "ci" or profile.startswith("ci-"):
                # the shape; how many images per class each task learns from is the profile's own budget
                shape = {k: v for k, v in values.items() if k in RUN_LEVEL_PROFILE_KEYS - {"train_per_class"}}
                assert shape in (CI_INPUT, CI_SHAPE), (name, profile, shape)
                seen += 1
    assert seen >= len(STRATEGIES.names())  # every strategy has one
