"""The benchmark registry itself, apart from the package's ``__init__`` so that modules registering presets
(:mod:`clbench.benchmarks.literature`) or reading them (:class:`clbench.benchmarks.folder.TreeLoader`) import it
without importing the package that imports them."""

from __future__ import annotations

from clbench.benchmarks.base import BenchmarkSpec
from clbench.core.registry import Registry

BENCHMARKS: Registry[BenchmarkSpec] = Registry("benchmark")


def register(spec: BenchmarkSpec) -> BenchmarkSpec:
    BENCHMARKS.register(spec.name, spec)
    return spec
