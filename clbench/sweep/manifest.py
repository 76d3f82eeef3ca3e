"""``sweep.json``: the sweep manifest (:class:`SweepManifest`), with its one reader (:func:`load_manifest`) and
one writer (:func:`write_manifest`).

It holds the plan (the command, strategies, benchmarks, seeds and settings), one :class:`PlannedEntry` per run (its
folder, its state when the sweep started, and the :class:`RunOutcome` the worker and the sweep reported, written
flat into the run's entry), the backend, the measured overhead (:func:`clbench.sweep.runner.overhead`) and the
earlier invocations of the same sweep (``history``). The runner rewrites it atomically whenever a run ends.

Every field is declared once (:func:`clbench.files.typedfile.json_field`): the checks of :func:`manifest_problem`, the
reader and the writer all come from the declarations.

Versions (``version``, :data:`SCHEMA_VERSION`): 1 is the only one so far. A manifest without ``version`` or
without ``vary`` (written before ``--vary``) reads as version 1 with ``vary`` ``"seed"``, what those sweeps did; a
newer version is refused. Fields this clbench does not know are kept and written back, a run's in their place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.core.config import Fingerprint
from clbench.errors import ClbenchError
from clbench.files import typedfile
from clbench.files.atomic import atomic_write_json
from clbench.files.safety import load_json
from clbench.files.typedfile import (
    COUNT,
    COUNTS,
    NAME,
    OBJECT,
    TEXT,
    JsonScalar,
    Typed,
    is_bool,
    is_count,
    is_int,
    is_json_scalar,
    is_name,
    is_number,
    is_object,
    is_positive,
    is_str,
    json_field,
    list_of,
    map_of,
    one_of,
    or_none,
)

Json = dict[str, Any]
FORMAT = "clbench-sweep"
SCHEMA_VERSION = 1
STATES = ("new", "partial", "complete", "failed")  # a run's state: at the start, and as the sweep ends it
STATUSES = ("done", "failed", "skipped")  # a run's outcome
HISTORY_FIELDS = ("command", "started", "finished", "interrupted", "complete", "backend", "overhead")
HEAD = ("format", "version")  # the keys every manifest starts with, written by the manifest itself
_FIX = "delete or move sweep.json (the runs' folders keep their records) and run the sweep again"

TIME = "a time (epoch seconds, a finite number >= 0)"
PCT = "a percentage (0 to 100)"


def _is_time(v: Any) -> bool:
    return is_number(v) and v >= 0


def _is_pct(v: Any) -> bool:
    return is_number(v) and 0 <= v <= 100


def _is_folder(v: Any) -> bool:
    return is_str(v) and v != ""


def _is_override(v: Any) -> bool:  # [strategy or null for every strategy, key, value], one per --set
    return isinstance(v, list) and len(v) == 3 and (v[0] is None or is_name(v[0])) and is_str(v[1]) and is_str(v[2])


@dataclass
class RunOutcome:
    """What the worker and the sweep reported of one run, written flat into its entry (``sweep.json`` -> ``runs``
    -> run id, after ``state``), in this order. Each field is optional and none admits null: None is "not
    reported", and only the reported fields are written (an empty ``resumed_from_task`` is reported: the run was
    not continued). Keys this clbench does not know are kept in ``extra``."""

    queued_at: float | None = json_field(TIME, _is_time, default=None)  # first submitted
    run_id: str | None = json_field(NAME, is_name, default=None)  # from here to resumed_from_task: the worker's
    started_at: float | None = json_field(TIME, _is_time, default=None)
    host: str | None = json_field(TEXT, is_str, default=None)
    pid: int | None = json_field("an integer >= 1", is_positive, default=None)
    status: str | None = json_field(f"one of {', '.join(STATUSES)}", one_of(*STATUSES), default=None)
    note: str | None = json_field(TEXT, is_str, default=None)  # why a run was skipped
    error: str | None = json_field(TEXT, is_str, default=None)  # why a run failed (the message and its hint)
    finished_at: float | None = json_field(TIME, _is_time, default=None)
    resumed_from_task: list[int] | None = json_field(COUNTS, list_of(is_count), default=None)
    collected_at: float | None = json_field(TIME, _is_time, default=None)  # by the sweep, as the run ended
    attempts: int | None = json_field("an integer >= 1", is_positive, default=None)
    last_acc: float | None = json_field(PCT, _is_pct, default=None)  # the record's, where the run is done
    avg_acc: float | None = json_field(PCT, _is_pct, default=None)
    extra: Json = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Json) -> RunOutcome:
        """An outcome from the JSON object ``data`` that :func:`clbench.files.typedfile.problems` found sound."""
        return typedfile.read(cls, data)

    def to_dict(self) -> Json:
        """The reported fields in declaration order, then ``extra``."""
        return {k: v for k, v in typedfile.write(self).items() if v is not None or k in self.extra}

    def span(self) -> tuple[float, float, float] | None:
        """(started_at, finished_at, collected_at) of a run that was executed and collected; None otherwise."""
        if self.started_at is None or self.finished_at is None or self.collected_at is None:
            return None
        return self.started_at, self.finished_at, self.collected_at


@dataclass(kw_only=True)
class PlannedEntry:
    """One run of the plan (``sweep.json`` -> ``runs`` -> run id): these fields, then its :class:`RunOutcome`."""

    path: str = json_field("a folder relative to the sweep folder", _is_folder, required=True)  # the run folder
    state_at_start: str = json_field(f"one of {', '.join(STATES[:3])}", one_of(*STATES[:3]), required=True)
    tasks_done_at_start: int = json_field(COUNT, is_count, required=True)
    fingerprint: Fingerprint = json_field(OBJECT, is_object, codec=Fingerprint, required=True)  # defining settings
    # as the sweep left it (None: not started yet); the outcome's fields follow it in the file
    state: str | None = json_field(
        f"one of {', '.join(STATES)}", one_of(*STATES), where_set=True, default=None, inline=RunOutcome
    )
    outcome: RunOutcome = field(default_factory=RunOutcome)
    # the entry's keys in the order the file held them, written back so (a manifest of an earlier clbench wrote a
    # failed run's attempts before its collected_at); empty for a new entry: declaration order
    keys: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def status(self) -> str | None:
        return self.outcome.status

    @classmethod
    def from_dict(cls, data: Json) -> PlannedEntry:
        """An entry from the JSON object ``data`` that :func:`clbench.files.typedfile.problems` found sound."""
        own = {f.name for f, _ in typedfile.file_fields(cls)}
        outcome = RunOutcome.from_dict({k: v for k, v in data.items() if k not in own})
        return dataclasses.replace(typedfile.read(cls, data), outcome=outcome, keys=list(data))

    def to_dict(self) -> Json:
        """The entry as ``sweep.json`` holds it: its fields, then its outcome's (as read, where it was read)."""
        out = {**typedfile.write(self), **self.outcome.to_dict()}
        return {**{k: out[k] for k in self.keys if k in out}, **out}


def _is_seconds_any(v: Any) -> bool:  # a difference of clock readings: may be negative where clocks disagree
    return is_number(v)


@dataclass(kw_only=True)
class Overhead(Typed):
    """The sweep's overhead, measured from its runs' timestamps (:func:`clbench.sweep.runner.overhead`, which
    defines each field); every field is absent (``{}``) where no run was executed."""

    runs_executed: int | None = json_field(COUNT, is_count, where_set=True, default=None)
    startup_s: float | None = json_field("seconds", _is_seconds_any, where_set=True, default=None)
    max_concurrent_runs: int | None = json_field(COUNT, is_count, where_set=True, default=None)
    active_window_s: float | None = json_field("seconds", _is_seconds_any, where_set=True, default=None)
    run_time_s: float | None = json_field("seconds", _is_seconds_any, where_set=True, default=None)
    per_run_s: float | None = json_field("seconds", _is_seconds_any, where_set=True, default=None)
    collection_s_mean: float | None = json_field("seconds", _is_seconds_any, where_set=True, default=None)
    definition: str | None = json_field(TEXT, is_str, where_set=True, default=None)  # of per_run_s and startup_s
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


def _is_resources(v: Any) -> bool:  # Ray's cluster_resources(): resource name -> amount
    return isinstance(v, dict) and all(is_number(x) for x in v.values())


@dataclass(kw_only=True)
class BackendInfo(Typed):
    """What ran the sweep (:meth:`clbench.sweep.backends.LocalBackend.describe`, ``RayBackend.describe``): the
    backend's name, then its own fields, written as the backend described itself (a field it did not give is not
    written; one it gave as null is)."""

    backend: str = json_field(NAME, is_name, required=True)  # local | ray
    note: str | None = json_field(TEXT, is_str, default=None)  # "nothing to run": no backend was started
    # local
    jobs: int | None = json_field("an integer >= 1", is_positive, default=None)
    threads_per_run: int | None = json_field("an integer >= 1 or null", or_none(is_positive), default=None)
    retries: int | None = json_field(COUNT, is_count, default=None)
    # ray
    address: str | None = json_field(TEXT, is_str, default=None)
    ray_version: str | None = json_field(TEXT, is_str, default=None)
    cluster: dict[str, float] | None = json_field("an object of resource -> amount", _is_resources, default=None)
    cpus_per_run: float | None = json_field("a number or null", or_none(is_number), default=None)
    gpus_per_run: float | None = json_field("a number or null", or_none(is_number), default=None)
    memory_per_run_gb: float | None = json_field("a number or null", or_none(is_number), default=None)
    max_retries: int | None = json_field(COUNT, is_count, default=None)
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read
    keys: list[str] = field(default_factory=list, compare=False, repr=False)  # the fields given, in their order

    # read and written as a codec (clbench.files.typedfile.Codec), not a plain part: the keys given
    # are part of the value
    @classmethod
    def json_problems(cls, data: Any) -> list[str]:  # Any: JSON as read, checked here
        found = typedfile.problems(cls, data)
        return [f"{m} is missing" for m in found.missing] + found.wrong

    @classmethod
    def from_json(cls, data: Json) -> BackendInfo:
        """From a backend's description, or the JSON object a manifest holds (found sound)."""
        return dataclasses.replace(typedfile.read(cls, data), keys=list(data))

    def to_json(self) -> Json:
        """The fields given (:meth:`from_json`), in their order, then ``extra``."""
        out = typedfile.write(self)
        return {k: out[k] for k in self.keys if k in out} | self.extra


@dataclass(kw_only=True)
class Invocation(Typed):
    """One earlier invocation of the sweep (``history``): :data:`HISTORY_FIELDS` of its manifest."""

    command: str | None = json_field("a string or null", or_none(is_str), default=None)
    started: str | None = json_field("an ISO time or null", or_none(is_str), default=None)
    finished: str | None = json_field("an ISO time or null", or_none(is_str), default=None)
    interrupted: str | None = json_field("an ISO time or null", or_none(is_str), default=None)
    complete: bool | None = json_field("true, false or null", or_none(is_bool), default=None)
    backend: BackendInfo | None = json_field("an object or null", or_none(is_object), codec=BackendInfo, default=None)
    overhead: Overhead | None = json_field("an object or null", or_none(is_object), part=Overhead, default=None)
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


@dataclass(kw_only=True)
class SweepManifest:
    """A sweep's ``sweep.json``: ``format`` and ``version``, then these fields in this order (the plan's first, then
    what running it added), then the fields this clbench does not know (``extra``)."""

    command: str | None = json_field("a string or null", or_none(is_str), default=None)
    strategies: list[str] = json_field("a list of names", list_of(is_name), required=True)
    benches: list[str] = json_field("a list of names", list_of(is_name), required=True)
    seeds: list[int] = json_field("a list of integers", list_of(is_int), required=True)
    # which seed the values of ``seeds`` set (clbench.sweep.plan.VARY); a manifest without it is upgraded
    vary: str = json_field(NAME, is_name)
    # the run settings every run shares (RunConfig field -> value; an earlier clbench's may hold retired ones)
    settings: dict[str, JsonScalar] = json_field(
        "an object of setting -> string, number, true/false or null", map_of(is_json_scalar), required=True
    )
    profile: str | None = json_field("a name or null", or_none(is_name), default=None)
    overrides: list[list[str | None]] = json_field(
        "a list of [scope, key, value] lists", list_of(_is_override), required=True
    )  # [strategy or null, key, value] per --set
    started: str = json_field("an ISO time", is_str, required=True)
    git_revision: str | None = json_field("a string or null", or_none(is_str), default=None)
    complete: bool = json_field("true or false", is_bool, required=True)
    runs: dict[str, PlannedEntry] = json_field(
        "an object of run id -> run", is_object, required=True, part=PlannedEntry, shape="map"
    )
    # earlier invocations: HISTORY_FIELDS of each
    history: list[Invocation] = json_field(
        "a list of objects", list_of(is_object), part=Invocation, shape="list", default_factory=list
    )
    # written once set: the feature cache the runs shared, the backend's own description (clbench.sweep.backends),
    # clbench.sweep.runner.overhead ({} where no run was executed), and when the sweep was stopped or finished
    cache: str | None = json_field("a string or null", or_none(is_str), where_set=True, default=None)
    backend: BackendInfo | None = json_field(
        "an object or null", or_none(is_object), codec=BackendInfo, where_set=True, default=None
    )
    overhead: Overhead | None = json_field(
        "an object or null", or_none(is_object), part=Overhead, where_set=True, default=None
    )
    interrupted: str | None = json_field("an ISO time or null", or_none(is_str), where_set=True, default=None)
    finished: str | None = json_field("an ISO time or null", or_none(is_str), where_set=True, default=None)
    dry_run: bool = False  # `clbench sweep --dry-run`: the plan only, never written (so not part of the file)
    extra: Json = field(default_factory=dict)  # fields this clbench does not know, kept as read
    schema_version: int = SCHEMA_VERSION  # the file's ``version``

    def summary(self) -> Invocation:
        """This invocation, as a later one keeps it in ``history``."""
        return Invocation(**{k: getattr(self, k) for k in HISTORY_FIELDS})

    @classmethod
    def from_dict(cls, raw: Json) -> SweepManifest:
        """A manifest from a current-version JSON object (:func:`upgrade`) that :func:`manifest_problem` found sound."""
        manifest = typedfile.read(cls, {k: v for k, v in raw.items() if k not in HEAD})
        runs = {run_id: PlannedEntry.from_dict(e) for run_id, e in raw["runs"].items()}
        return dataclasses.replace(manifest, runs=runs, schema_version=raw["version"])

    def to_dict(self) -> Json:
        """The JSON object of ``sweep.json`` (:func:`write_manifest`)."""
        out = typedfile.write(self)
        out["runs"] = {run_id: entry.to_dict() for run_id, entry in self.runs.items()}
        return {"format": FORMAT, "version": self.schema_version, **out}


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
    return SweepManifest.from_dict(upgrade(raw))


def upgrade(raw: Json) -> Json:
    """A manifest of an older clbench as this one writes it: ``version`` 1 where missing, ``vary`` ``"seed"`` (the
    only seeds a sweep varied before ``--vary``)."""
    return {**raw, "version": raw.get("version", 1), "vary": raw.get("vary", "seed")}


def manifest_problem(raw: Any) -> str | None:
    """What keeps ``raw`` from being a sweep manifest this clbench reads, in one line; None if nothing."""
    if not isinstance(raw, dict):
        return f"it holds a JSON {type(raw).__name__}, not a sweep manifest object"
    if raw.get("format", FORMAT) != FORMAT:
        return f"format {raw['format']!r:.40} is not {FORMAT!r}"
    version = raw.get("version", 1)
    if not is_int(version) or version < 1:
        return f"field 'version' is {version!r:.40}, expected an integer >= 1"
    if version > SCHEMA_VERSION:
        return f"version {version} was written by a newer clbench (this one reads up to {SCHEMA_VERSION})"
    return typedfile.problems(SweepManifest, raw, version=version).first()
