"""Routing diagnostics: what a strategy that chooses one per-task module per test image (TOSCA) records about its
choices after every task, in ``result.json`` -> ``per_task[t].diagnostics`` (:class:`RoutingDiagnostics`).

One writer, :meth:`RoutingDiagnostics.to_diagnostics` (TOSCA's ``diagnostics``); one reader,
:func:`read_routing` (the reports, the routing study). The layout inside ``diagnostics``::

    "per-sample": {"routing_acc", "routing_acc_per_task", "chosen_hist", "newest_module_share", "acc"},  # per protocol
    "routers": {"<router>": {... the same, "confusion", "collapse_warning"}},  # the routing study, one per rule
    "routing_warning": "...",           # only where the run's own router collapsed onto one module
    "oracle_acc", "module_cosine_similarity", "module_output_cosine", "module_output_cosine_centred",
    "router_temperatures", "routing_schema": 1

Versions (``routing_schema``, :data:`SCHEMA_VERSION`): 1. Records written before the field (every committed one)
read as version 1; what they predate (the routing study, output similarities, temperatures, the confusion counts)
reads as absent. A newer version is refused: a newer clbench wrote it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from clbench.errors import ClbenchError

Json = dict[str, Any]
SCHEMA_VERSION = 1
VERSION_KEY = "routing_schema"
_FIX = "rerun it with this clbench, or leave the run out"
COLLAPSE_RATIO, COLLAPSE_POINTS = 2.0, 25.0  # a module is flagged above 2x its task's share and 25 points over it


@dataclass(frozen=True)
class ModuleChoices:
    """How one rule (an evaluation protocol, or one router of the routing study) chose modules on the test images."""

    routing_acc: float  # % of images routed to their own task's module
    routing_acc_per_task: list[float]  # the same per true task
    chosen_hist: list[int]  # images per chosen module
    newest_module_share: float | None  # % of images routed to the newest module (None: a record before it)
    acc: float | None = None  # % accuracy with the chosen modules
    # routing study only: true task x chosen module counts, and the collapse warning (clbench.routers)
    confusion: list[list[int]] | None = None
    collapse_warning: str | None = None
    study: bool = False  # a router of the routing study (writes confusion and collapse_warning)

    def to_dict(self) -> Json:
        out: Json = {
            "routing_acc": self.routing_acc,
            "routing_acc_per_task": self.routing_acc_per_task,
        }
        if self.study:
            out["confusion"] = self.confusion
        out.update(chosen_hist=self.chosen_hist, newest_module_share=self.newest_module_share, acc=self.acc)
        if self.study:
            out["collapse_warning"] = self.collapse_warning
        return out


@dataclass(frozen=True)
class RoutingDiagnostics:
    """A routing strategy's diagnostics after one task (see the module docstring for the layout)."""

    protocols: dict[str, ModuleChoices]  # evaluation protocol -> its choices
    routers: dict[str, ModuleChoices] | None = None  # the routing study (None: a record from before it)
    routing_warning: str | None = None  # the run's own router collapsed onto one module
    oracle_acc: float | None = None  # % accuracy with every image routed to its own task's module
    module_cosine_similarity: float | None = None  # mean pairwise cosine of the modules' weights
    module_output_cosine: float | None = None  # mean pairwise cosine of the modules' outputs on the same images
    module_output_cosine_centred: float | None = None  # the same after removing each module's mean output
    router_temperatures: list[float] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_diagnostics(self) -> Json:
        """The keys this writes into ``per_task[t].diagnostics`` (in the order TOSCA has always written them)."""
        out: Json = {p: c.to_dict() for p, c in self.protocols.items()}
        if self.routers is not None:
            out["routers"] = {name: c.to_dict() for name, c in self.routers.items()}
        if self.routing_warning:
            out["routing_warning"] = self.routing_warning
        out.update(
            oracle_acc=self.oracle_acc,
            module_cosine_similarity=self.module_cosine_similarity,
            module_output_cosine=self.module_output_cosine,
            module_output_cosine_centred=self.module_output_cosine_centred,
            router_temperatures=self.router_temperatures,
        )
        out[VERSION_KEY] = self.schema_version
        return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (math.isfinite(v) or math.isnan(v))


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and all(_number(x) for x in v)


def _counts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


# What each field of a rule's choices must be: (name, required, expected, check).
_CHOICE_FIELDS: tuple[tuple[str, bool, str, Any], ...] = (
    ("routing_acc", True, "a percentage", _number),
    ("routing_acc_per_task", True, "a list of percentages", _numbers),
    ("chosen_hist", False, "a list of counts", _counts),
    ("newest_module_share", False, "a percentage", _number),
    ("acc", False, "a percentage or null", lambda v: v is None or _number(v)),
    ("confusion", False, "a matrix of counts", lambda v: isinstance(v, list) and all(_counts(r) for r in v)),
    ("collapse_warning", False, "a string or null", lambda v: v is None or isinstance(v, str)),
)
_TOP_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("routing_warning", "a string or null", lambda v: v is None or isinstance(v, str)),
    ("oracle_acc", "a percentage or null", lambda v: v is None or _number(v)),
    ("module_cosine_similarity", "a number or null", lambda v: v is None or _number(v)),
    ("module_output_cosine", "a number or null", lambda v: v is None or _number(v)),
    ("module_output_cosine_centred", "a number or null", lambda v: v is None or _number(v)),
    ("router_temperatures", "a list of numbers or null", lambda v: v is None or _numbers(v)),
)


def _problem(value: Any, checks: Any, where: str) -> str | None:
    for name, required, expected, ok in checks:
        if name not in value:
            if required:
                return f"{where}.{name} is missing"
        elif not ok(value[name]):
            return f"{where}.{name} is {type(value[name]).__name__} {value[name]!r:.40}, expected {expected}"
    return None


def _choices(value: Json, study: bool) -> ModuleChoices:
    return ModuleChoices(
        routing_acc=value["routing_acc"],
        routing_acc_per_task=list(value["routing_acc_per_task"]),
        chosen_hist=list(value.get("chosen_hist") or []),
        newest_module_share=value.get("newest_module_share"),
        acc=value.get("acc"),
        confusion=value.get("confusion"),
        collapse_warning=value.get("collapse_warning"),
        study=study,
    )


def read_routing(diagnostics: Json, where: str = "diagnostics") -> RoutingDiagnostics | None:
    """The routing diagnostics in one task's ``diagnostics`` (None: the strategy records no routing). A mistyped
    or newer-version one is a ClbenchError naming ``where`` (the record and task) and the field."""
    version = diagnostics.get(VERSION_KEY, 1)  # records before the field: version 1
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ClbenchError(f"{where}: {VERSION_KEY} is {version!r:.40}, expected an integer >= 1", _FIX)
    if version > SCHEMA_VERSION:
        raise ClbenchError(
            f"{where}: routing diagnostics of version {version} were written by a newer clbench (this one reads up "
            f"to {SCHEMA_VERSION})",
            "update clbench to read them",
        )
    protocols = {p: v for p, v in diagnostics.items() if isinstance(v, dict) and "routing_acc" in v}
    routers = diagnostics.get("routers")
    if not protocols and routers is None:
        return None
    if routers is not None and not (isinstance(routers, dict) and all(isinstance(v, dict) for v in routers.values())):
        raise ClbenchError(f"{where}.routers is not an object of router -> choices", _FIX)
    for name, value in [
        *((p, v) for p, v in protocols.items()),
        *((f"routers.{n}", v) for n, v in (routers or {}).items()),
    ]:
        problem = _problem(value, _CHOICE_FIELDS, f"{where}.{name}")
        if problem is not None:
            raise ClbenchError(problem, _FIX)
    problem = _problem(diagnostics, [(n, False, e, ok) for n, e, ok in _TOP_FIELDS], where)
    if problem is not None:
        raise ClbenchError(problem, _FIX)
    return RoutingDiagnostics(
        protocols={p: _choices(v, study=False) for p, v in protocols.items()},
        routers=None if routers is None else {n: _choices(v, study=True) for n, v in routers.items()},
        **{n: diagnostics.get(n) for n, _, _ in _TOP_FIELDS},
        schema_version=version,
    )


def routing_or_none(diagnostics: Json) -> RoutingDiagnostics | None:
    """:func:`read_routing` for readers that show what they can (trackers, figures): None where the strategy records
    no routing, and where a record's is mistyped (the report's warnings name that record)."""
    try:
        return read_routing(diagnostics)
    except ClbenchError:
        return None


def collapse_warning(choice: np.ndarray, task_id: np.ndarray, n_modules: int, router: str) -> str | None:
    """A message when one module receives far more than its task's share of the images (whichever module it is):
    above ``COLLAPSE_RATIO`` times its task's share and ``COLLAPSE_POINTS`` points over it. None otherwise."""
    if n_modules < 2 or len(choice) == 0:
        return None
    share = np.bincount(choice, minlength=n_modules) / len(choice) * 100
    expected = np.bincount(task_id, minlength=n_modules)[:n_modules] / len(task_id) * 100
    excess = share - expected
    j = int(np.argmax(excess))
    if share[j] >= COLLAPSE_RATIO * expected[j] and excess[j] >= COLLAPSE_POINTS:
        which = "the newest module" if j == n_modules - 1 else f"module {j + 1} of {n_modules}"
        return (
            f"{router} routing sends {share[j]:.0f}% of test images to {which} "
            f"(its task holds {expected[j]:.0f}% of them)"
        )
    return None
