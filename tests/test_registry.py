import pytest

from clbench.catalog import BACKBONES, BENCHMARKS, STRATEGIES
from clbench.errors import ClbenchError
from clbench.registry import Registry


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
