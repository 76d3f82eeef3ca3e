"""``sweep.json``: the sweep manifest (:class:`SweepManifest`), with its one reader (:func:`load_manifest`) and one
writer (:func:`write_manifest`).

It holds the plan (the command, strategies, benchmarks, seeds and settings), one :class:`PlannedEntry` per run (its
folder, its state when the sweep started, and the outcome the worker reported, as reported), the backend, the
measured overhead (:func:`clbench.sweep.runner.overhead`) and the earlier invocations of the same sweep
(``history``). The runner rewrites it atomically whenever a run ends.

Versions (``version``, :data:`SCHEMA_VERSION`): 1 is the only one so far. A manifest without ``version`` or
without ``vary`` (written before ``--vary``) reads as version 1 with ``vary`` ``"seed"``, what those sweeps did; a
newer version is refused. Fields this clbench does not know are kept and written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files import atomic_write_json
from clbench.owned import load_json

Json = dict[str, Any]
FORMAT = "clbench-sweep"
SCHEMA_VERSION = 1
STATES = ("new", "partial", "complete", "failed")  # a run's state: at the start, and as the sweep ends it
HISTORY_FIELDS = ("command", "started", "finished", "interrupted", "complete", "backend", "overhead")
_FIX = "delete or move sweep.json (the runs' folders keep their records) and run the sweep again"


@dataclass
class PlannedEntry:
    """One run of the plan (``sweep.json`` -> ``runs`` -> run id)."""

    path: str  # the run folder, relative to the sweep folder
    state_at_start: str  # new | partial | complete
    tasks_done_at_start: int
    fingerprint: Json  # the run's defining settings (clbench.config.fingerprint)
    state: str | None = None  # as the sweep left it (None: not started yet)
    # what the worker and the sweep reported, in the order reported: status (done | failed | skipped), queued_at,
    # started_at, finished_at, collected_at (epoch seconds), host, pid, attempts, error, last_acc, avg_acc, ...
    outcome: Json = field(default_factory=dict)

    @property
    def status(self) -> str | None:
        return self.outcome.get("status")

    def to_dict(self) -> Json:
        head = {
            "path": self.path,
            "state_at_start": self.state_at_start,
            "tasks_done_at_start": self.tasks_done_at_start,
            "fingerprint": self.fingerprint,
        }
        return {**head, **({"state": self.state} if self.state is not None else {}), **self.outcome}


@dataclass
class SweepManifest:
    """A sweep's ``sweep.json``. The plan's fields come first, then what running it added."""

    command: str | None
    strategies: list[str]
    benches: list[str]
    seeds: list[int]
    vary: str  # which seed the values of ``seeds`` set (clbench.sweep.plan.VARY)
    settings: Json  # the run settings every run shares
    profile: str | None
    overrides: list[list[str]]  # [scope, key, value] per --set
    started: str  # ISO time
    git_revision: str | None
    complete: bool
    runs: dict[str, PlannedEntry]
    history: list[Json] = field(default_factory=list)  # earlier invocations: HISTORY_FIELDS of each
    cache: str | None = None  # the feature cache the runs shared
    backend: Json | None = None  # the backend's own description (clbench.sweep.backends)
    overhead: Json | None = None  # clbench.sweep.runner.overhead
    interrupted: str | None = None  # ISO time, where the sweep was stopped
    finished: str | None = None  # ISO time
    dry_run: bool = False  # `clbench sweep --dry-run`: the plan only (never written)
    extra: Json = field(default_factory=dict)  # fields this clbench does not know, kept as read
    schema_version: int = SCHEMA_VERSION

    def summary(self) -> Json:
        """This invocation, as a later one keeps it in ``history``."""
        return {k: getattr(self, k) for k in HISTORY_FIELDS}

    def to_dict(self) -> Json:
        out: Json = {"format": FORMAT, "version": self.schema_version}
        for f in fields(self):
            if f.name in ("extra", "schema_version"):
                continue
            value = getattr(self, f.name)
            if f.name in _WHERE_SET and value in (None, False):
                continue
            out[f.name] = {k: r.to_dict() for k, r in value.items()} if f.name == "runs" else value
        return {**out, **self.extra}


_WHERE_SET = ("cache", "backend", "overhead", "interrupted", "finished", "dry_run")  # written only once set
_KNOWN = {f.name for f in fields(SweepManifest)} | {"format", "version"}
_ENTRY_KNOWN = {f.name for f in fields(PlannedEntry)} - {"outcome"}


def write_manifest(path: Path, manifest: SweepManifest) -> None:
    """Write ``manifest`` to ``path`` atomically (a reader sees the old file or the new one)."""
    atomic_write_json(Path(path), manifest.to_dict())


def load_manifest(path: Path) -> SweepManifest:
    """Read ``sweep.json``; a file that is not a manifest this clbench reads is one ClbenchError line naming the
    file, the field and the fix."""
    raw = load_json(path, "sweep manifest", hint=_FIX)
    problem = manifest_problem(raw)
    if problem is not None:
        raise ClbenchError(f"{path}: {problem}", _FIX)
    raw = upgrade(raw)
    runs = {
        run_id: PlannedEntry(
            **{k: e[k] for k in ("path", "state_at_start", "tasks_done_at_start", "fingerprint")},
            state=e.get("state"),
            outcome={k: v for k, v in e.items() if k not in _ENTRY_KNOWN},
        )
        for run_id, e in raw["runs"].items()
    }
    plain = {f.name: raw[f.name] for f in fields(SweepManifest) if f.name in raw and f.name != "runs"}
    return SweepManifest(**plain, runs=runs, extra={k: v for k, v in raw.items() if k not in _KNOWN})


def upgrade(raw: Json) -> Json:
    """A manifest of an older clbench as this one writes it: ``version`` 1 where missing, ``vary`` ``"seed"`` (the
    only seeds a sweep varied before ``--vary``)."""
    return {**raw, "version": raw.get("version", 1), "vary": raw.get("vary", "seed")}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _list_of(kind: type) -> Any:
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v)


def _or_none(kind: type | tuple[type, ...]) -> Any:
    return lambda v: v is None or isinstance(v, kind)


# Fields of the manifest: (name, required, what it must be, check).
_FIELDS: tuple[tuple[str, bool, str, Any], ...] = (
    ("command", False, "a string or null", _or_none(str)),
    ("strategies", True, "a list of names", _list_of(str)),
    ("benches", True, "a list of names", _list_of(str)),
    ("seeds", True, "a list of integers", _list_of(int)),
    ("vary", False, "a name", lambda v: isinstance(v, str)),
    ("settings", True, "an object", lambda v: isinstance(v, dict)),
    ("profile", False, "a name or null", _or_none(str)),
    ("overrides", True, "a list of [scope, key, value] lists", _list_of(list)),
    ("started", True, "an ISO time", lambda v: isinstance(v, str)),
    ("git_revision", False, "a string or null", _or_none(str)),
    ("complete", True, "true or false", lambda v: isinstance(v, bool)),
    ("runs", True, "an object of run id -> run", lambda v: isinstance(v, dict)),
    ("history", False, "a list of objects", _list_of(dict)),
    ("cache", False, "a string or null", _or_none(str)),
    ("backend", False, "an object or null", _or_none(dict)),
    ("overhead", False, "an object or null", _or_none(dict)),
    ("interrupted", False, "a string or null", _or_none(str)),
    ("finished", False, "a string or null", _or_none(str)),
    ("dry_run", False, "true or false", lambda v: isinstance(v, bool)),
)
_RUN_FIELDS: tuple[tuple[str, bool, str, Any], ...] = (
    ("path", True, "a folder relative to the sweep folder", lambda v: isinstance(v, str) and bool(v)),
    ("state_at_start", True, f"one of {', '.join(STATES[:3])}", lambda v: v in STATES[:3]),
    ("tasks_done_at_start", True, "an integer >= 0", lambda v: _is_int(v) and v >= 0),
    ("fingerprint", True, "an object", lambda v: isinstance(v, dict)),
    ("state", False, f"one of {', '.join(STATES)}", lambda v: v in STATES),
)


def manifest_problem(raw: Any) -> str | None:
    """What keeps ``raw`` from being a sweep manifest this clbench reads, in one line; None if nothing."""
    if not isinstance(raw, dict):
        return f"it holds a JSON {type(raw).__name__}, not a sweep manifest object"
    if raw.get("format", FORMAT) != FORMAT:
        return f"format {raw['format']!r:.40} is not {FORMAT!r}"
    version = raw.get("version", 1)
    if not _is_int(version) or version < 1:
        return f"field 'version' is {version!r:.40}, expected an integer >= 1"
    if version > SCHEMA_VERSION:
        return f"version {version} was written by a newer clbench (this one reads up to {SCHEMA_VERSION})"
    problem = _field_problem(raw, _FIELDS, "")
    if problem is not None:
        return problem
    for run_id, e in raw["runs"].items():
        if not isinstance(e, dict):
            return f"field runs.{run_id} is not an object"
        problem = _field_problem(e, _RUN_FIELDS, f"runs.{run_id}.")
        if problem is not None:
            return problem
    return None


def _field_problem(raw: Json, checks: tuple[tuple[str, bool, str, Any], ...], where: str) -> str | None:
    for name, required, expected, ok in checks:
        if name not in raw:
            if required:
                return f"field {where}{name} is missing"
        elif not ok(raw[name]):
            return f"field {where}{name} is {type(raw[name]).__name__} {raw[name]!r:.40}, expected {expected}"
    return None
