"""The gate reference: what ``reports/reference-emoji.json`` holds (:class:`Reference`), its one reader
(:func:`load_reference`) and one writer (:func:`write_reference`), and what an entry matches (:class:`EntryKey`).
The gate makes one from runs with :func:`clbench.gate.check.make_reference`.

File layout (``"format": "clbench-reference/2"``; the number is :data:`SCHEMA_VERSION`)::

    {
      "format": "clbench-reference/2",
      "description": "what these runs are for",
      "written_by": {"who": "...", "why": "...", "command": "clbench check --write-reference ...",
                     "created": "...", "git_revision": "...", "changes": ["tosca:ci per-sample: final 31.2 -> 30.9"]},
      "history": [<earlier written_by blocks, newest first>],
      "produced_by": [{"run_id", "strategy", "profile", "bench", "seed", "protocols", "precision", "git_revision",
                       "command", "weights_digest", "finished", "time_s", "host"}, ...],
      "tolerances": {"source": "reports/gate/tolerances.json", "default": {...}, "<strategy>:<profile>": {...}},
      "time": {"slack": 2.0, "floor": 1.0,
               "calibration": {"workload": "...", "seconds": 1.66, "measurements": [<calibration.json's>]}},
      "require_ci_profiles": true,          # every registered strategy's ci profiles must be pinned
      "entries": [{
        "bench": "emoji", "task_sizes": [6, 6, 6, 6, 6, 6], "class_order_seed": 1993,
        "strategy": "tosca", "profile": "ci", "backbone": "vit_small_patch14_dinov2", "img_size": 56,
        "protocol": "per-sample", "precision": "fp32", "weights": "<sha256 of the backbone state>" | "random init",
        "seeds": [1993], "runs": ["tosca-ci"],
        "accuracy_matrix": [[...], ...], "last_acc": 27.18, "avg_acc": 38.0,   # means over the runs, percent
        "tolerance": {"matrix": 1.5, "last_acc": 0.5, "avg_acc": 0.5},         # points, either direction
        "params": {"added_total": 228240, "stored_total": 0, "trainable": 51865},  # compared exactly
        "time": {"train": 4.1, "eval": 0.6},   # seconds / calibration seconds (the same machine, the same job)
        "strategy_config": {...},
        "data": {"train": "<digest>", "test": "<digest>"},  # where the runs' records hold them (else absent)
        "metrics": {"forgetting": 9.1, "bwt": -9.1, "acc_curve": [...], "last_acc_ci": [lo, hi], ...}
                                # every other metric the records store, means over the runs (null: not stored)
      }, ...]
    }

Every field, and every field of each part (an entry, its tolerance, parameter counts and times, the time rule and
its calibration measurements, a written_by block, a run of produced_by), is declared once on its dataclass with
:func:`clbench.files.typedfile.json_field`; reading (:func:`clbench.files.typedfile.problems`, then
:func:`~clbench.files.typedfile.read`) and writing (:func:`~clbench.files.typedfile.write`) follow from the
declarations, and keys this clbench does not know are kept in ``extra`` and written back. A file that is not a reference
is refused with one line naming the file, the dotted field (``entries[3].img_size``), what it must be and the fix. Older
files: an entry without ``class_order_seed`` (written before class orders were chosen) reads as the literature's order;
``params`` without ``stored_total`` (before stored statistics were counted apart) pins the other two counts only; an
entry without ``data`` (written before records held data digests) pins no data; an entry without ``metrics`` (written
before the gate compared every stored metric) pins the accuracy matrix, final and average accuracy only. Format 1
(one-sided, final/average accuracy only) is refused for checking; when it is being rewritten its provenance is kept in
the new file's history. A newer format is refused: it was written by a newer clbench.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

from clbench.errors import ClbenchError
from clbench.evaluation.declared import GATE_LISTED, GATE_STORED
from clbench.files.atomic import atomic_write_json
from clbench.files.safety import load_json
from clbench.files.typedfile import (
    COUNT,
    COUNTS,
    NAME,
    OBJECT,
    TEXT,
    JsonObject,
    JsonScalar,
    Typed,
    is_bool,
    is_count,
    is_json_object,
    is_json_scalar,
    is_name,
    is_number,
    is_object,
    is_positive,
    is_seconds,
    is_str,
    json_field,
    list_of,
    map_of,
    or_none,
    problems,
    read,
    write,
)
from clbench.gate.tolerances import (
    MAX_TOLERANCE,
    TOLERANCE_METRICS,
    Tolerance,
    ToleranceTable,
    is_tolerance,
    is_tolerance_table,
)
from clbench.records.schema import DEFAULT_CLASS_ORDER_SEED, Host, is_matrix, is_pct, out_of_bounds
from clbench.report.collect import Collection, Run, bench_label

Json = dict[str, Any]
SCHEMA_VERSION = 2
FORMAT_PREFIX = "clbench-reference/"
REFERENCE_FORMAT = f"{FORMAT_PREFIX}{SCHEMA_VERSION}"
OLD_FORMATS = {"clbench-reference/1": "one-sided, final/average accuracy only, time as total minus features"}
TIME_PHASES = ("train", "eval")
# A time ratio may grow by this factor plus FLOOR calibration units before it fails (reasons: reports/gate/README.md).
DEFAULT_TIME_SLACK = 2.0
DEFAULT_TIME_FLOOR = 1.0
MAX_TIME_FACTOR = 1e6  # time.slack and time.floor: beyond this the time check can never fail


# ------------------------------------------------------------------------------------------- what an entry matches
class EntryKey(NamedTuple):
    """What a reference entry matches: everything that defines a row except the seed (precision and weights are
    compared explicitly, so that a mismatch says what differs instead of showing as a missing run)."""

    bench: str
    task_sizes: tuple[int, ...]
    class_order_seed: int
    strategy: str
    profile: str | None
    backbone: str
    img_size: int | None
    protocol: str
    # the first k training images per class (the run's train_per_class; None: all): the untrained control runs at
    # one split with 8 and with 16, one profile
    train_per_class: int | None = None

    def label(self) -> str:
        profile = f":{self.profile}" if self.profile else ""
        bench = bench_label(self.bench, list(self.task_sizes), self.class_order_seed)
        per_class = f" | {self.train_per_class} per class" if self.train_per_class else ""
        return f"{bench} | {self.strategy}{profile} | {self.backbone} {self.img_size}px | {self.protocol}{per_class}"

    def run_command(self) -> str:
        """The ``clbench run`` flags that make a run matching this key (for one-line fixes)."""
        parts = [f"--strategy {self.strategy}", f"--bench {self.bench}"]
        if self.profile:
            parts.append(f"--profile {self.profile}")
        if self.protocol != "per-sample":
            parts.append("--protocol both")
        return "clbench run " + " ".join(parts)


def entry_key(run: Run, protocol: str) -> EntryKey:
    r = run.record
    return EntryKey(
        r.bench,
        tuple(run.task_sizes),
        r.class_order_seed,
        run.strategy,
        r.profile,
        r.backbone,
        r.img_size,
        protocol,
        r.train_per_class,
    )


def weights_identity(run: Run) -> str:
    """``random init`` (the init follows the seed) or the full weights digest."""
    return "random init" if run.weights_label == "random init" else str(run.record.weights_digest)


def group_runs(coll: Collection) -> dict[EntryKey, list[Run]]:
    groups: dict[EntryKey, list[Run]] = defaultdict(list)
    for run in coll.runs:
        for p in run.protocols:
            groups[entry_key(run, p)].append(run)
    return dict(groups)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def mean_matrix(runs: Sequence[Run], protocol: str) -> list[list[float]]:
    """Entry-by-entry mean of the runs' lower-triangular accuracy matrices (rows: after task t)."""
    mats = [r.summary(protocol).accuracy_matrix for r in runs]
    return [[mean([float(m[t][j]) for m in mats]) for j in range(len(mats[0][t]))] for t in range(len(mats[0]))]


# ------------------------------------------------------------------------------------------- the types What a value
# must be, as the refusals say it (and the checks the declarations below use that clbench.files.typedfile lacks).
NAME_OR_NULL = "a name or null"
TEXT_OR_NULL = "a string or null"
OBJECTS = "a list of objects"
RATIO = "a number >= 0"
CALIBRATION_SECONDS = "seconds > 0 (a number below 1e6)"
POINTS = f"points (0 to {MAX_TOLERANCE:g})"


def _between(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: is_number(v) and low <= v <= high


def _is_list(v: Any) -> bool:  # of parts: each item is checked as its part, named by its index
    return isinstance(v, list)


def _is_task_sizes(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(map(is_positive, v))


def _is_calibration_seconds(v: Any) -> bool:
    return is_number(v) and 0 < v < 1e6


def _is_digests(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and bool(v) and all(map(is_name, [*v, *v.values()])))


# A stored metric's value in an entry: a number (points), a per-task curve (None where a task has none) or an
# interval [lo, hi]; None where a record lacks it.
MetricValue: TypeAlias = float | list[float | None] | None


def _is_metric_value(v: Any) -> bool:
    return v is None or is_number(v) or (isinstance(v, list) and all(x is None or is_number(x) for x in v))


def _is_metrics(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(k in STORED_METRICS and _is_metric_value(x) for k, x in v.items()))


# What a gate entry pins of each optimiser's training in each task (clbench.methods.shared.TrainingTrace.summary):
# the mean loss of its first and last epoch and how far its parameters moved (||after - init|| / ||init||).
TRAINING_PINS = ("loss_first_epoch", "loss_last_epoch", "param_change")


def _is_training(v: Any) -> bool:
    return v is None or (
        isinstance(v, list)
        and all(
            isinstance(task, list)
            and all(
                isinstance(o, dict) and all(k in TRAINING_PINS and (x is None or is_number(x)) for k, x in o.items())
                for o in task
            )
            for task in v
        )
    )


# The metrics of a record's protocol summary the gate pins beside the accuracy matrix, final and average accuracy
# (clbench.records.schema.ProtocolSummary): scalars in points, per-task curves in percent, intervals as [lo, hi].
# Declared with each metric (clbench.evaluation.declared: its gate rule).
STORED_METRICS = GATE_STORED


@dataclass(frozen=True, kw_only=True)
class ParamPins(Typed):
    """Parameter counts an entry pins exactly. ``stored_total`` is None in references written before stored
    statistics were counted apart (then it is neither compared nor written)."""

    added_total: int = json_field(COUNT, is_count, required=True)
    stored_total: int | None = json_field(f"{COUNT} or null", or_none(is_count), where_set=True, default=None)
    trainable: int = json_field(COUNT, is_count, required=True)

    def pinned(self) -> dict[str, int]:
        """The counts to compare, in file order."""
        return {k: int(v) for k, v in self.to_dict().items()}


@dataclass(frozen=True)
class PhaseTimes(Typed):
    """Seconds of a phase divided by the calibration workload's seconds (the same machine, the same job)."""

    train: float = json_field(RATIO, _between(0.0, math.inf), required=True)
    eval: float = json_field(RATIO, _between(0.0, math.inf), required=True)


@dataclass(frozen=True)
class PinnedTolerance(Tolerance):
    """An entry's :class:`Tolerance` as the reference file holds it."""

    matrix: float = json_field(POINTS, is_tolerance, required=True)
    last_acc: float = json_field(POINTS, is_tolerance, required=True)
    avg_acc: float = json_field(POINTS, is_tolerance, required=True)

    @classmethod
    def of(cls, tolerance: Tolerance) -> PinnedTolerance:
        """``tolerance`` (from a tolerance table) as an entry pins it."""
        return cls(**tolerance.to_dict())


@dataclass(frozen=True, kw_only=True)
class ReferenceEntry(Typed):
    """One pinned (benchmark split, strategy, profile, backbone, protocol): the mean of its runs. Fields an older
    reference lacks read as the module docstring says; ``data`` and ``metrics`` are written only where pinned, so
    that a reference of runs without them reads as before."""

    bench: str = json_field(NAME, is_name, required=True)
    task_sizes: list[int] = json_field("a list of integers >= 1", _is_task_sizes, required=True)
    # absent: written before class orders were chosen (the literature's order)
    class_order_seed: int = json_field(COUNT, is_count, default=DEFAULT_CLASS_ORDER_SEED)
    strategy: str = json_field(NAME, is_name, required=True)
    profile: str | None = json_field(NAME_OR_NULL, or_none(is_name), default=None)
    backbone: str = json_field(NAME, is_name, required=True)
    img_size: int | None = json_field("an integer >= 1 or null", or_none(is_positive), default=None)
    protocol: str = json_field(NAME, is_name, required=True)
    precision: str = json_field(NAME, is_name, required=True)
    weights: str = json_field(TEXT, is_str, required=True)  # "random init" or the backbone weights' sha256
    seeds: list[int] = json_field(COUNTS, list_of(is_count), required=True)
    runs: list[str] = json_field("a list of run ids", list_of(is_name), required=True)
    accuracy_matrix: list[list[float]] = json_field(  # percent, mean over the runs
        "a lower-triangular matrix of percentages (0 to 100)", is_matrix, required=True
    )
    last_acc: float = json_field("a percentage (0 to 100)", is_pct, required=True)
    avg_acc: float = json_field("a percentage (0 to 100)", is_pct, required=True)
    tolerance: PinnedTolerance = json_field(  # points, either direction
        f"an object of {', '.join(TOLERANCE_METRICS)} -> {POINTS}", is_object, required=True, part=PinnedTolerance
    )
    params: ParamPins = json_field(
        "an object of added_total and trainable (integers >= 0)", is_object, required=True, part=ParamPins
    )
    # None: written without a calibration (times not pinned)
    time: PhaseTimes | None = json_field(
        f"null or an object of {', '.join(TIME_PHASES)} -> {RATIO}", or_none(is_object), part=PhaseTimes, default=None
    )
    # the settings the runs trained with (RunRecord.settings: the strategy's and the run's train_per_class where set;
    # None: not pinned)
    # (a method's own Config as JSON: each method declares its own fields, so they are not the reference's to declare)
    strategy_config: JsonObject | None = json_field("an object or null", or_none(is_json_object), default=None)
    # the runs' data ({"train": digest, "test": digest}, RunRecord.data_fingerprint); None: not pinned (references
    # written before records held it, or from runs that lack it). Compared like the weights: absent
    # on either side matches
    data: dict[str, str] | None = json_field(
        "null or an object of train/test -> digest", _is_digests, where_set=True, default=None
    )
    # every other metric the runs' records store (:data:`STORED_METRICS`), mean over the runs: a number, a list of
    # numbers (NaN as null) or null where a record lacks it; None: not pinned (references written before)
    metrics: dict[str, MetricValue] | None = json_field(
        f"null or an object of {', '.join(STORED_METRICS)} -> a number, a list of numbers or null",
        _is_metrics,
        where_set=True,
        default=None,
    )
    # what training did, per task and per optimiser the task stepped (:data:`TRAINING_PINS` of the record's
    # ``diagnostics.training``, mean over the runs; [] for a task that trains nothing); None: not pinned (references
    # written before). A bug in what a method learns moves its losses even where its ci accuracy sits near
    # the untrained control's.
    training: list[list[dict[str, float | None]]] | None = json_field(
        f"null or a list (per task) of lists (per optimiser) of objects of {', '.join(TRAINING_PINS)} -> a number",
        _is_training,
        where_set=True,
        default=None,
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read

    @property
    def key(self) -> EntryKey:
        return EntryKey(
            self.bench,
            tuple(self.task_sizes),
            self.class_order_seed,
            self.strategy,
            self.profile,
            self.backbone,
            self.img_size,
            self.protocol,
            (self.strategy_config or {}).get("train_per_class"),
        )


@dataclass(frozen=True, kw_only=True)
class Measurement(Typed):
    """One timing of the gate's calibration workload (:func:`clbench.perf.calibration.calibrate`), as
    ``calibration.json`` holds it and a reference's ``time.calibration`` keeps it. The gate reads its workload, its
    seconds and its torch threads; the rest is kept as written."""

    workload: str = json_field(NAME, is_name, required=True)  # CALIBRATION_ID: what was timed
    # CALIBRATION_WORKLOAD: what was timed, setting -> value
    definition: dict[str, JsonScalar] | None = json_field(
        "an object of setting -> string, number, true/false or null",
        map_of(is_json_scalar),
        where_set=True,
        default=None,
    )
    seconds: float = json_field(CALIBRATION_SECONDS, _is_calibration_seconds, required=True)  # median of the passes
    all_seconds: list[float] | None = json_field("a list of seconds", list_of(is_seconds), where_set=True, default=None)
    torch: str | None = json_field(TEXT, is_str, where_set=True, default=None)  # torch.__version__
    host: Host | None = json_field(OBJECT, is_object, part=Host, where_set=True, default=None)  # a record's host
    created: str | None = json_field(TEXT, is_str, where_set=True, default=None)
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read

    @property
    def torch_threads(self) -> int | None:  # None where the host block lacks it
        return self.host.torch_threads if self.host else None


@dataclass(frozen=True, kw_only=True)
class TimeCalibration(Typed):
    """The calibration a reference's entry times were divided by: its workload, the median seconds and the
    measurements it is the median of."""

    workload: str = json_field(NAME, is_name, required=True)
    seconds: float = json_field(CALIBRATION_SECONDS, _is_calibration_seconds, required=True)
    measurements: list[Measurement] = json_field(
        OBJECTS, _is_list, part=Measurement, shape="list", default_factory=list
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


@dataclass(frozen=True)
class TimeRule(Typed):
    """How much slower than the reference a phase may be: ``ratio <= reference ratio x slack + floor``."""

    slack: float = json_field(f"a number from 1 to {MAX_TIME_FACTOR:g}", _between(1.0, MAX_TIME_FACTOR), required=True)
    floor: float = json_field(f"a number from 0 to {MAX_TIME_FACTOR:g}", _between(0.0, MAX_TIME_FACTOR), required=True)
    # the calibration the entries' times divide by; None: written without one (times not pinned)
    calibration: TimeCalibration | None = json_field(
        "an object or null", or_none(is_object), part=TimeCalibration, default=None
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read

    @property
    def workload(self) -> str | None:
        return self.calibration.workload if self.calibration is not None else None

    @property
    def torch_threads(self) -> set[Any]:
        """The torch thread counts of the reference's calibration measurements."""
        return {m.torch_threads for m in (self.calibration.measurements if self.calibration is not None else [])}


@dataclass(frozen=True, kw_only=True)
class WrittenBy(Typed):
    """Who wrote a reference, why, with which command, when, at which revision, and what that write changed (one line
    per entry). A field not recorded is not written: a block carried over from a format-1 file holds only the command,
    when, and its format (kept in ``extra``)."""

    who: str | None = json_field(TEXT_OR_NULL, or_none(is_str), where_set=True, default=None)
    why: str | None = json_field(TEXT_OR_NULL, or_none(is_str), where_set=True, default=None)
    command: str | None = json_field(TEXT_OR_NULL, or_none(is_str), where_set=True, default=None)
    created: str | None = json_field(TEXT_OR_NULL, or_none(is_str), where_set=True, default=None)
    git_revision: str | None = json_field(TEXT_OR_NULL, or_none(is_str), where_set=True, default=None)
    changes: list[str] | None = json_field(
        "a list of strings or null", or_none(list_of(is_str)), where_set=True, default=None
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


@dataclass(frozen=True, kw_only=True)
class RunProvenance(Typed):
    """One run a reference was written from, as its record had it (``produced_by``): shown and kept, never compared."""

    run_id: str = json_field(NAME, is_name, required=True)
    strategy: str = json_field(NAME, is_name, required=True)
    profile: str | None = json_field(NAME_OR_NULL, or_none(is_name), default=None)
    bench: str = json_field(NAME, is_name, required=True)  # its label: "emoji B0 Inc6"
    seed: int = json_field(COUNT, is_count, required=True)
    protocols: list[str] = json_field("a list of names", list_of(is_name), required=True)
    precision: str | None = json_field(NAME_OR_NULL, or_none(is_name), default=None)
    git_revision: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    command: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    weights_digest: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    finished: str | None = json_field(TEXT_OR_NULL, or_none(is_str), default=None)
    time_s: dict[str, float] | None = json_field(
        "an object of phase -> seconds, or null", or_none(map_of(is_seconds)), default=None
    )
    host: Host | None = json_field("an object or null", or_none(is_object), part=Host, default=None)  # record's
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


@dataclass(frozen=True, kw_only=True)
class Reference(Typed):
    """A gate reference file. Provenance (``written_by``, ``history``, ``produced_by``) and the tolerance table are
    kept as written: the gate shows them and a rewrite carries them on, but checks nothing against them."""

    format: str = json_field("a reference format", is_str, required=True, default=REFERENCE_FORMAT)
    description: str = json_field(TEXT, is_str, default="")
    # None only for a format-1 file being rewritten that recorded none
    written_by: WrittenBy | None = json_field(OBJECT, is_object, required=True, part=WrittenBy)
    history: list[WrittenBy] = json_field(  # earlier written_by blocks, newest first
        OBJECTS, _is_list, part=WrittenBy, shape="list", default_factory=list
    )
    produced_by: list[RunProvenance] = json_field(
        OBJECTS, _is_list, part=RunProvenance, shape="list", default_factory=list
    )
    # the table the entries' tolerances came from (clbench.gate.tolerances)
    tolerances: ToleranceTable = json_field(
        "an object of source -> file, and strategy:profile -> metric -> points", is_tolerance_table, required=True
    )
    time: TimeRule = json_field(OBJECT, is_object, required=True, part=TimeRule)
    require_ci_profiles: bool = json_field("true or false", is_bool, default=True)
    entries: list[ReferenceEntry] = json_field(OBJECTS, _is_list, required=True, part=ReferenceEntry, shape="list")
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read

    @property
    def schema_version(self) -> int | None:
        return _format_version(self.format)

    @property
    def changes(self) -> list[str]:
        """What the write that made this file changed (one line each)."""
        return list(self.written_by.changes or []) if self.written_by is not None else []


# ------------------------------------------------------------------------------------------- reading and writing
def write_reference(path: Path, reference: Reference) -> None:
    """Write ``reference`` to ``path`` atomically (a reader sees the old file or the new one)."""
    atomic_write_json(Path(path), write(reference))


def _rewrite_fix(path: Path) -> str:
    return (
        f"rewrite it from fresh runs: `clbench check --write-reference {path} RUN_DIRS --why TEXT` "
        "(.ci/run shows the runs)"
    )


def load_reference(path: Path, *, for_writing: bool = False) -> Reference:
    """Read and validate a reference file (``for_writing``: the file ``--write-reference`` replaces, whose format 1
    is read for its provenance). Every refusal is one ClbenchError line naming the file, the field and the fix."""
    path = Path(path)
    flag = "--write-reference" if for_writing else "--reference"
    raw = load_json(
        path, "reference", name=f"{flag} {path}", hint="move it away to write a new reference" if for_writing else None
    )
    got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
    if for_writing and got in OLD_FORMATS:
        return _from_format_1(raw)
    fix = _rewrite_fix(path)
    if got in OLD_FORMATS:  # one line: what differs and how to fix it
        raise ClbenchError(
            f"--reference {path}: older format {got!r} ({OLD_FORMATS[got]}), this clbench reads "
            f"{REFERENCE_FORMAT!r}: {fix}"
        )
    version = _format_version(got)
    if version is not None and version > SCHEMA_VERSION:
        raise ClbenchError(
            f"{flag} {path}: format {got!r:.40} was written by a newer clbench; this one reads {REFERENCE_FORMAT!r}",
            "upgrade clbench to check against it, or rewrite it with this clbench",
        )
    if got != REFERENCE_FORMAT:
        raise ClbenchError(f"--reference {path}: format {got!r:.40}, expected {REFERENCE_FORMAT!r}: {fix}")
    problem = reference_problem(raw)
    if problem is not None:
        raise ClbenchError(f"--reference {path}: {problem}", fix)
    return read(Reference, raw)


def _format_version(fmt: Any) -> int | None:
    if isinstance(fmt, str) and fmt.startswith(FORMAT_PREFIX) and fmt[len(FORMAT_PREFIX) :].isdigit():
        return int(fmt[len(FORMAT_PREFIX) :])
    return None


def _from_format_1(raw: Json) -> Reference:
    """A format-1 file being rewritten: its provenance only (its entries cannot be compared with format 2's), the
    blocks of it that are sound written_by blocks."""
    prior = raw.get("written_by")
    if isinstance(prior, str):  # format 1 stored only the command
        prior = {"command": prior, "created": raw.get("created"), "format": raw.get("format")}
    history = raw.get("history")
    blocks = [h for h in (history if isinstance(history, list) else []) if isinstance(h, dict)]
    return Reference(
        format=raw["format"],
        description=str(raw.get("description") or ""),
        written_by=read(WrittenBy, prior) if isinstance(prior, dict) and prior and not _unsound(prior) else None,
        history=[read(WrittenBy, h) for h in blocks if not _unsound(h)],
        tolerances={},
        time=TimeRule(slack=DEFAULT_TIME_SLACK, floor=DEFAULT_TIME_FLOOR),
        entries=[],
    )


def _unsound(block: Json) -> bool:
    return bool(problems(WrittenBy, block))


def reference_problem(raw: Json) -> str | None:
    """The first field of a format-2 reference object the gate could not use, said in one line (its dotted name and
    what it must be); None if sound."""
    found = out_of_bounds(raw) or problems(Reference, raw, version=SCHEMA_VERSION).first()
    if found is not None:
        return found + _which_entry(found, raw)
    return _disagreement(read(Reference, raw))


def _which_entry(problem: str, raw: Json) -> str:
    """`` (entries[3]: tosca)`` where ``problem`` lies in an entry whose strategy is a name: which one, at a glance."""
    at = re.match(r"field entries\[(\d+)\]", problem)
    entry = raw["entries"][int(at[1])] if at is not None else None
    if at is None or not isinstance(entry, dict) or not is_name(entry.get("strategy")):
        return ""
    return f" (entries[{at[1]}]: {entry['strategy']})"


def _disagreement(ref: Reference) -> str | None:
    """Where well-typed entries disagree with themselves or with each other, as a written reference's never do."""
    keys: dict[EntryKey, int] = {}
    for i, e in enumerate(ref.entries):
        if len(e.accuracy_matrix) != len(e.task_sizes):
            rows, tasks = len(e.accuracy_matrix), len(e.task_sizes)
            return f"entries[{i}] ({e.strategy}): its accuracy matrix has {rows} rows for {tasks} tasks"
        if len(e.seeds) != len(e.runs) or not e.runs:
            return f"entries[{i}] ({e.strategy}): {len(e.seeds)} seeds for {len(e.runs)} runs"
        if e.key in keys:  # two entries pinning one configuration: which would the gate use?
            return f"entries[{i}] ({e.key.label()}) pins the same configuration as entries[{keys[e.key]}]"
        keys[e.key] = i
    return None


# ------------------------------------------------------------------------------------------- what a rewrite changes
def reference_changes(old: Reference, new: Reference) -> list[str]:
    """What a rewrite changes, one line per entry added, removed or moved, its tolerance included, and one for the
    tolerance table (for the file's ``written_by``)."""
    before = {e.key.label(): e for e in old.entries}
    after = {e.key.label(): e for e in new.entries}
    lines = [f"added {k} (tolerance {after[k].tolerance.text()})" for k in sorted(set(after) - set(before))]
    lines += [f"removed {k}" for k in sorted(set(before) - set(after))]
    for k in sorted(set(before) & set(after)):
        b, a = _movable(before[k]), _movable(after[k])
        moved = [f"{m} {b[m]} -> {a[m]}" for m in b if b[m] != a[m]]
        if before[k].metrics is not None and after[k].metrics is not None:
            moved += [
                f"{m} {before[k].metrics.get(m)} -> {after[k].metrics.get(m)}"
                for m in GATE_LISTED
                if before[k].metrics.get(m) != after[k].metrics.get(m)
            ]
        elif after[k].metrics is not None:
            moved.append("metrics pinned (forgetting, BWT, ECE, curves, intervals)")
        if before[k].tolerance != after[k].tolerance:
            moved.append(f"tolerance {before[k].tolerance.text()} -> {after[k].tolerance.text()}")
        if moved:
            lines.append(f"{k}: " + "; ".join(moved))
    old_table, new_table = old.tolerances, new.tolerances
    if old_table != new_table:
        names = sorted(n for n in set(old_table) | set(new_table) if old_table.get(n) != new_table.get(n))
        lines.append(
            f"tolerance table: {old_table.get('source', 'built-in defaults')} -> "
            f"{new_table.get('source', 'built-in defaults')} (differs in: {', '.join(names)})"
        )
    return lines


def _movable(e: ReferenceEntry) -> dict[str, Any]:
    """What a rewrite lists as moved when it differs, by name (parameter counts as the file holds them)."""
    return {
        "last_acc": e.last_acc,
        "avg_acc": e.avg_acc,
        "params": e.params.to_dict(),
        "precision": e.precision,
        "weights": e.weights,
    }
