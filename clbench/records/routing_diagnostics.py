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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from clbench.errors import ClbenchError
from clbench.files.typedfile import (
    Problems,
    file_fields,
    is_count,
    is_object,
    is_positive,
    is_str,
    json_field,
    list_of,
    map_of,
    or_none,
    problems,
    read,
    write,
)

Json = dict[str, Any]
SCHEMA_VERSION = 1
VERSION_KEY = "routing_schema"
_FIX = "rerun it with this clbench, or leave the run out"
COLLAPSE_RATIO, COLLAPSE_POINTS = 2.0, 25.0  # a module is flagged above 2x its task's share and 25 points over it


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (math.isfinite(v) or math.isnan(v))


_NUMBERS = list_of(_number)
PCT, PCT_OR_NULL = "a percentage", "a percentage or null"
NUMBER_OR_NULL, TEXT_OR_NULL = "a number or null", "a string or null"


@dataclass(frozen=True)
class ModuleChoices:
    """How one rule (an evaluation protocol, or one router of the routing study) chose modules on the test images."""

    routing_acc: float = json_field(PCT, _number, required=True)  # % of images routed to their own task's module
    routing_acc_per_task: list[float] = json_field(  # the same per true task
        "a list of percentages", _NUMBERS, required=True
    )
    # routing study only: true task x chosen module counts (clbench.methods.routers)
    confusion: list[list[int]] | None = json_field("a matrix of counts", list_of(list_of(is_count)), default=None)
    chosen_hist: list[int] = json_field("a list of counts", list_of(is_count), default_factory=list)  # per module
    # % of images routed to the newest module (None: a record before it)
    newest_module_share: float | None = json_field(PCT, _number, default=None)
    acc: float | None = json_field(PCT_OR_NULL, or_none(_number), default=None)  # % accuracy with the chosen modules
    # routing study only: the collapse warning (clbench.records.routing_diagnostics.collapse_warning)
    collapse_warning: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    study: bool = False  # a router of the routing study (writes confusion and collapse_warning, null or not)

    def to_dict(self) -> Json:
        """Its keys as TOSCA has always written them: a protocol's without the study's two."""
        out = write(self)
        return out if self.study else {k: v for k, v in out.items() if k not in ("confusion", "collapse_warning")}


@dataclass(frozen=True)
class RoutingDiagnostics:
    """A routing strategy's diagnostics after one task (see the module docstring for the layout). The protocols'
    choices sit at the top level of ``diagnostics`` under their protocol's name; the rest is declared here."""

    protocols: dict[str, ModuleChoices] = dataclasses.field(default_factory=dict)  # evaluation protocol -> choices
    # the routing study (None: a record from before it)
    routers: dict[str, ModuleChoices] | None = json_field(
        "an object of router -> choices", map_of(is_object), part=ModuleChoices, shape="map", default=None
    )
    # the run's own router collapsed onto one module
    routing_warning: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    # % accuracy with every image routed to its own task's module
    oracle_acc: float | None = json_field(PCT_OR_NULL, or_none(_number), default=None)
    # mean pairwise cosine of the modules' weights
    module_cosine_similarity: float | None = json_field(NUMBER_OR_NULL, or_none(_number), default=None)
    # mean pairwise cosine of the modules' outputs on the same images, and the same after removing each one's mean
    module_output_cosine: float | None = json_field(NUMBER_OR_NULL, or_none(_number), default=None)
    module_output_cosine_centred: float | None = json_field(NUMBER_OR_NULL, or_none(_number), default=None)
    router_temperatures: list[float] | None = json_field("a list of numbers or null", or_none(_NUMBERS), default=None)
    schema_version: int = SCHEMA_VERSION

    def to_diagnostics(self) -> Json:
        """The keys this writes into ``per_task[t].diagnostics`` (in the order TOSCA has always written them)."""
        out: Json = {p: c.to_dict() for p, c in self.protocols.items()}
        if self.routers is not None:
            out["routers"] = {name: c.to_dict() for name, c in self.routers.items()}
        if self.routing_warning:
            out["routing_warning"] = self.routing_warning
        top = write(self)
        out.update({k: top[k] for k in _TOP if k != "routing_warning"})
        out[VERSION_KEY] = self.schema_version
        return out


_TOP = [f.name for f, _ in file_fields(RoutingDiagnostics) if f.name != "routers"]


def _refuse(found: Problems, where: str) -> None:
    if found.missing:
        raise ClbenchError(f"{where}.{found.missing[0]} is missing", _FIX)
    if found.wrong:
        raise ClbenchError(f"{where}.{found.wrong[0]}", _FIX)


def read_routing(diagnostics: Json, where: str = "diagnostics") -> RoutingDiagnostics | None:
    """The routing diagnostics in one task's ``diagnostics`` (None: the strategy records no routing). A mistyped
    or newer-version one is a ClbenchError naming ``where`` (the record and task) and the field."""
    version = diagnostics.get(VERSION_KEY, 1)  # records before the field: version 1
    if not is_positive(version):
        raise ClbenchError(f"{where}: {VERSION_KEY} is {version!r:.40}, expected an integer >= 1", _FIX)
    if version > SCHEMA_VERSION:
        raise ClbenchError(
            f"{where}: routing diagnostics of version {version} were written by a newer clbench (this one reads up "
            f"to {SCHEMA_VERSION})",
            "update clbench to read them",
        )
    protocols = {p: v for p, v in diagnostics.items() if isinstance(v, dict) and "routing_acc" in v}
    if not protocols and diagnostics.get("routers") is None:
        return None
    for p, value in protocols.items():
        _refuse(problems(ModuleChoices, value, where=f"{p}."), where)
    _refuse(problems(RoutingDiagnostics, diagnostics), where)
    top = read(RoutingDiagnostics, diagnostics)
    routers = None if top.routers is None else {n: dataclasses.replace(c, study=True) for n, c in top.routers.items()}
    return dataclasses.replace(
        top,
        protocols={p: read(ModuleChoices, v) for p, v in protocols.items()},
        routers=routers,
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
