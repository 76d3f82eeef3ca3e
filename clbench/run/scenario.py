"""The scenario of a run (``--scenario class|domain``) and which strategies support it, read without importing them.

A strategy states the scenarios it is defined for in its class attribute ``scenarios``
(:attr:`clbench.methods.contract.Strategy.scenarios`, default ``("class",)``). A run of a strategy in a scenario it does
not support is refused by :func:`check_scenario` in one line, before anything loads, naming the strategies that
support it. To name them without importing every strategy (and torch with them), the attribute is read from each
registered module's source (:func:`declared_scenarios`: the ``scenarios = (...)`` literal in the class body, or the
default where a class derived from ``Strategy`` itself assigns none); only a strategy whose class inherits it from
another base, or builds it, is imported to ask.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from clbench.core.catalog import STRATEGIES
from clbench.errors import ClbenchError, setting

DEFAULT_SCENARIOS: tuple[str, ...] = ("class",)  # = Strategy.scenarios (clbench.methods.contract imports torch)


def _from_source(target: str) -> tuple[str, ...] | None:
    """The ``scenarios`` literal of the class ``target`` (``module:Class``) read from its source; None when the
    class body does not assign it a tuple of strings (or the source cannot be read)."""
    module, _, attr = target.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == attr):
            continue
        for stmt in node.body:
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == "scenarios" for t in targets):
                try:
                    value = ast.literal_eval(stmt.value)  # type: ignore[union-attr,arg-type]  # an assignment's value
                except ValueError:
                    return None
                if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                    return value
                return None
        # no assignment: the contract's default where the class derives from Strategy itself, alone or after mixins
        # of shared layers (clbench.layers.slow_learner.SlowLearner: they declare no scenarios); else its base decides
        bases = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
        if bases and isinstance(bases[-1], ast.Name) and bases[-1].id == "Strategy":
            return DEFAULT_SCENARIOS
        return None
    return None


def declared_scenarios(name: str) -> tuple[str, ...]:
    """The scenarios strategy ``name`` (registered in :data:`clbench.core.catalog.STRATEGIES`) supports."""
    STRATEGIES.check(name)
    target = STRATEGIES._lazy.get(name)  # not imported yet: read its source
    if target is not None:
        found = _from_source(target)
        if found is not None:
            return found
    cls = STRATEGIES.get(name)
    return tuple(getattr(cls, "scenarios", DEFAULT_SCENARIOS))


def supporting(scenario: str) -> list[str]:
    """The registered strategies that support ``scenario``, by name; one that cannot be read is left out."""
    out = []
    for name in STRATEGIES.names():
        try:
            if scenario in declared_scenarios(name):
                out.append(name)
        except ClbenchError:  # a plug-in that does not import here: not a supporter we can name
            continue
    return out


def check_scenario(strategy: str, scenario: str, domains: tuple[str, ...], bench: str) -> None:
    """Refuse, in one line, a strategy that does not support ``scenario``, or the domain scenario on a benchmark
    without domains (``domains``: its :attr:`~clbench.benchmarks.base.BenchmarkSpec.domains`)."""
    if scenario == "domain" and not domains:  # the data's problem first, whichever the strategy
        # deferred: loads numpy, which importing this module does not
        from clbench.benchmarks import BENCHMARKS

        with_domains = [n for n in BENCHMARKS.names() if BENCHMARKS.get(n).domains]
        raise ClbenchError(
            f"benchmark {bench} has a single domain: {setting('scenario')} domain needs one with domains "
            f"({', '.join(with_domains) or 'none registered'}, or folder with --data-root DIR holding "
            "DIR/<domain>/{train,test}/<class>/)"
        )
    if scenario not in declared_scenarios(strategy):
        others = supporting(scenario)
        raise ClbenchError(
            f"{strategy} does not support {setting('scenario')} {scenario}; strategies that do: "
            f"{', '.join(others) or 'none'}"
        )
