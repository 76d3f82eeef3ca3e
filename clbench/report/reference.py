"""The gate reference: what ``reports/reference-emoji.json`` holds (:class:`Reference`), its one reader
(:func:`load_reference`) and one writer (:func:`write_reference`), and what an entry matches (:class:`EntryKey`).
The gate makes one from runs with :func:`clbench.report.check.make_reference`.

File layout (``"format": "clbench-reference/2"``; the number is :data:`SCHEMA_VERSION`)::

    {
      "format": "clbench-reference/2",
      "description": "what these runs are for",
      "written_by": {"who": "...", "why": "...", "command": "clbench check --write-reference ...",
                     "created": "...", "git_revision": "...", "changes": ["tosca:ci per-sample: final 31.2 -> 30.9"]},
      "history": [<earlier written_by blocks, newest first>],
      "produced_by": [{"run_id", "strategy", "profile", "bench", "seed", "protocols", "precision", "git_revision",
                       "command", "weights_digest", "finished", "host"}, ...],
      "tolerances": {"source": "reports/gate/tolerances.json", "default": {...}, "<strategy>:<profile>": {...}},
      "time": {"slack": 2.0, "floor": 1.0, "calibration": {<one calibration: workload, seconds, host>}},
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

Reading checks every field the gate uses and refuses a file that is not a reference with one line naming the file,
the field and the fix. Older files: an entry without ``class_order_seed`` (written before class orders were chosen)
reads as the literature's order; ``params`` without ``stored_total`` (before stored statistics were counted apart)
pins the other two counts only; an entry without ``data`` (written before records held data digests) pins no data;
an entry without ``metrics`` (written before the gate compared every stored metric) pins the accuracy matrix, final
and average accuracy only.
Format 1 (one-sided, final/average accuracy only) is refused for checking; when it
is being rewritten its provenance is kept in the new file's history. A newer format is refused: it was written by a
newer clbench.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from clbench.errors import ClbenchError
from clbench.files import atomic_write_json
from clbench.owned import load_json
from clbench.report.collect import Collection, Run, bench_label
from clbench.report.tolerances import (
    MAX_TOLERANCE,
    TOLERANCE_METRICS,
    Tolerance,
    is_number,
    is_tolerance,
)
from clbench.results import DEFAULT_CLASS_ORDER_SEED, is_count, is_matrix, is_name, is_pct, is_positive, out_of_bounds

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
PARAM_PINS = ("added_total", "stored_total", "trainable")  # file order


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

    def label(self) -> str:
        profile = f":{self.profile}" if self.profile else ""
        bench = bench_label(self.bench, list(self.task_sizes), self.class_order_seed)
        return f"{bench} | {self.strategy}{profile} | {self.backbone} {self.img_size}px | {self.protocol}"

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
        r.bench, tuple(run.task_sizes), r.class_order_seed, run.strategy, r.profile, r.backbone, r.img_size, protocol
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


# ------------------------------------------------------------------------------------------- the types
@dataclass(frozen=True)
class ParamPins:
    """Parameter counts an entry pins exactly. ``stored_total`` is None in references written before stored
    statistics were counted apart (then it is not compared)."""

    added_total: int
    trainable: int
    stored_total: int | None = None

    def to_dict(self) -> Json:
        return {name: getattr(self, name) for name in PARAM_PINS if getattr(self, name) is not None}

    def pinned(self) -> dict[str, int]:
        """The counts to compare, in file order."""
        return {k: int(v) for k, v in self.to_dict().items()}


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of a phase divided by the calibration workload's seconds (the same machine, the same job)."""

    train: float
    eval: float

    def to_dict(self) -> Json:
        return {"train": self.train, "eval": self.eval}


@dataclass(frozen=True)
class ReferenceEntry:
    """One pinned (benchmark split, strategy, profile, backbone, protocol): the mean of its runs."""

    bench: str
    task_sizes: list[int]
    class_order_seed: int
    strategy: str
    profile: str | None
    backbone: str
    img_size: int | None
    protocol: str
    precision: str
    weights: str  # "random init" or the backbone weights' sha256
    seeds: list[int]
    runs: list[str]
    accuracy_matrix: list[list[float]]  # percent, mean over the runs
    last_acc: float
    avg_acc: float
    tolerance: Tolerance  # points, either direction
    params: ParamPins
    time: PhaseTimes | None  # None: written without a calibration (times not pinned)
    # the settings the runs trained with (RunRecord.settings: the strategy's and the run's train_per_class where set;
    # None: not pinned)
    strategy_config: Json | None
    # the runs' data ({"train": digest, "test": digest}, RunRecord.data_fingerprint); None: not pinned (references
    # written before records held it, or from runs that lack it). Compared like the weights: absent on either side
    # matches
    data: dict[str, str] | None = None
    # every other metric the runs' records store (:data:`STORED_METRICS`), mean over the runs: a number, a list of
    # numbers (NaN as null) or null where a record lacks it; None: not pinned (references written before)
    metrics: dict[str, Any] | None = None

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
        )

    def to_dict(self) -> Json:
        out: Json = {}
        for name in _ENTRY_LAYOUT:
            value = getattr(self, name)
            out[name] = value.to_dict() if hasattr(value, "to_dict") else value
        if self.data is not None:  # written where pinned: a reference of runs without it reads as before
            out["data"] = dict(self.data)
        if self.metrics is not None:
            out["metrics"] = dict(self.metrics)
        return out

    @classmethod
    def from_dict(cls, e: Json) -> ReferenceEntry:
        """An entry from a JSON object :func:`entry_problem` found sound."""
        params = e["params"]
        return cls(
            **{
                name: e.get(name)
                for name in _ENTRY_LAYOUT
                if name not in ("class_order_seed", "tolerance", "params", "time")
            },
            class_order_seed=DEFAULT_CLASS_ORDER_SEED if e.get("class_order_seed") is None else e["class_order_seed"],
            tolerance=Tolerance(**{m: e["tolerance"][m] for m in TOLERANCE_METRICS}),
            params=ParamPins(params["added_total"], params["trainable"], params.get("stored_total")),
            time=PhaseTimes(e["time"]["train"], e["time"]["eval"]) if e.get("time") is not None else None,
            data=dict(e["data"]) if e.get("data") is not None else None,
            metrics=dict(e["metrics"]) if e.get("metrics") is not None else None,
        )


# The metrics of a record's protocol summary the gate pins beside the accuracy matrix, final and average accuracy
# (clbench.results.ProtocolSummary): scalars in points, per-task curves in percent, intervals as [lo, hi].
STORED_METRICS = (
    "forgetting",
    "forgetting_first_last",
    "bwt",
    "ece",
    "acc_curve",
    "old_acc",
    "new_acc",
    "top5_curve",
    "last_acc_ci",
    "avg_acc_ci",
)


def _is_metric_value(v: Any) -> bool:
    return v is None or is_number(v) or (isinstance(v, list) and all(x is None or is_number(x) for x in v))


_ENTRY_LAYOUT = (
    "bench",
    "task_sizes",
    "class_order_seed",
    "strategy",
    "profile",
    "backbone",
    "img_size",
    "protocol",
    "precision",
    "weights",
    "seeds",
    "runs",
    "accuracy_matrix",
    "last_acc",
    "avg_acc",
    "tolerance",
    "params",
    "time",
    "strategy_config",
)


@dataclass(frozen=True)
class TimeRule:
    """How much slower than the reference a phase may be: ``ratio <= reference ratio x slack + floor``."""

    slack: float
    floor: float
    calibration: Json | None  # {"workload", "seconds", "measurements"}: the calibration the entries' times divide by

    @property
    def workload(self) -> str | None:
        return (self.calibration or {}).get("workload")

    @property
    def torch_threads(self) -> set[Any]:
        """The torch thread counts of the reference's calibration measurements."""
        return {m.get("host", {}).get("torch_threads") for m in (self.calibration or {}).get("measurements", [])}

    def to_dict(self) -> Json:
        return {"slack": self.slack, "floor": self.floor, "calibration": self.calibration}


@dataclass(frozen=True)
class Reference:
    """A gate reference file. Provenance (``written_by``, ``history``, ``produced_by``) and the tolerance table are
    kept as written: the gate shows them and a rewrite carries them on, but checks nothing against them."""

    description: str
    written_by: Json  # who, why, command, created, git_revision, changes
    history: list[Json]
    produced_by: list[Json]
    tolerances: Json  # the table the entries' tolerances came from (clbench.report.tolerances)
    time: TimeRule
    require_ci_profiles: bool
    entries: list[ReferenceEntry]
    schema_version: int = SCHEMA_VERSION

    @property
    def changes(self) -> list[str]:
        """What the write that made this file changed (one line each)."""
        return list(self.written_by.get("changes") or [])

    def to_dict(self) -> Json:
        return {
            "format": f"{FORMAT_PREFIX}{self.schema_version}",
            "description": self.description,
            "written_by": self.written_by,
            "history": self.history,
            "produced_by": self.produced_by,
            "tolerances": self.tolerances,
            "time": self.time.to_dict(),
            "require_ci_profiles": self.require_ci_profiles,
            "entries": [e.to_dict() for e in self.entries],
        }


# ------------------------------------------------------------------------------------------- reading and writing
def write_reference(path: Path, reference: Reference) -> None:
    """Write ``reference`` to ``path`` atomically (a reader sees the old file or the new one)."""
    atomic_write_json(Path(path), reference.to_dict())


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
    t = raw["time"]
    return Reference(
        description=raw.get("description") or "",
        written_by=raw["written_by"],
        history=list(raw.get("history") or []),
        produced_by=list(raw.get("produced_by") or []),
        tolerances=raw["tolerances"],
        time=TimeRule(t["slack"], t["floor"], t.get("calibration")),
        require_ci_profiles=raw.get("require_ci_profiles", True),
        entries=[ReferenceEntry.from_dict(e) for e in raw["entries"]],
    )


def _format_version(fmt: Any) -> int | None:
    if isinstance(fmt, str) and fmt.startswith(FORMAT_PREFIX) and fmt[len(FORMAT_PREFIX) :].isdigit():
        return int(fmt[len(FORMAT_PREFIX) :])
    return None


def _from_format_1(raw: Json) -> Reference:
    """A format-1 file being rewritten: its provenance only (its entries cannot be compared with format 2's)."""
    prior = raw.get("written_by")
    if isinstance(prior, str):  # format 1 stored only the command
        prior = {"command": prior, "created": raw.get("created"), "format": raw.get("format")}
    history = raw.get("history")
    return Reference(
        description=str(raw.get("description") or ""),
        written_by=prior if isinstance(prior, dict) else {},
        history=[h for h in history if isinstance(h, dict)] if isinstance(history, list) else [],
        produced_by=[],
        tolerances={},
        time=TimeRule(DEFAULT_TIME_SLACK, DEFAULT_TIME_FLOOR, None),
        require_ci_profiles=True,
        entries=[],
        schema_version=1,
    )


def reference_problem(raw: Json) -> str | None:
    """The first field of a format-2 reference object the gate could not use, said in one line; None if sound."""
    huge = out_of_bounds(raw)
    if huge is not None:
        return huge
    if not isinstance(raw.get("description", ""), str):
        return f"description is {_shown(raw['description'])}, expected a string"
    for name, typ in (("entries", list), ("time", dict), ("tolerances", dict), ("written_by", dict)):
        if not isinstance(raw.get(name), typ):
            return f"field {name!r} is missing or not a {typ.__name__}"
    if not isinstance(raw.get("require_ci_profiles", True), bool):
        return f"require_ci_profiles is {raw['require_ci_profiles']!r:.40}, expected true or false"
    for name in ("history", "produced_by"):
        if not isinstance(raw.get(name, []), list) or not all(isinstance(h, dict) for h in raw.get(name, [])):
            return f"field {name!r} is not a list of objects"
    keys: dict[EntryKey, int] = {}
    for i, e in enumerate(raw["entries"]):
        problem = entry_problem(e)
        if problem is not None:
            return f"entries[{i}]{problem}"
        key = ReferenceEntry.from_dict(e).key  # two entries pinning one configuration: which would the gate use?
        if key in keys:
            return f"entries[{i}] ({key.label()}) pins the same configuration as entries[{keys[key]}]"
        keys[key] = i
    t = raw["time"]
    for knob, low in (("slack", 1.0), ("floor", 0.0)):
        if not (is_number(t.get(knob)) and low <= t[knob] <= MAX_TIME_FACTOR):
            return f"time.{knob} is {_shown(t.get(knob))}, expected a number from {low:g} to {MAX_TIME_FACTOR:g}"
    if not (t.get("calibration") is None or isinstance(t["calibration"], dict)):
        return f"time.calibration is {_shown(t['calibration'])}, expected an object or null"
    return None


def entry_problem(e: Any) -> str | None:
    """What is wrong with one entry (`` is not an object``, ``(tosca): field 'x' is ..., expected ...``)."""
    if not isinstance(e, dict):
        return " is not an object"
    for name, expected, ok in ENTRY_FIELDS:
        if not ok(e.get(name)):
            strategy = f" ({e['strategy']})" if is_name(e.get("strategy")) else ""
            return f"{strategy}: field {name!r} is {_shown(e.get(name))}, expected {expected}"
    strategy = f" ({e['strategy']})"  # the fields agree with each other, as a written reference's do
    if len(e["accuracy_matrix"]) != len(e["task_sizes"]):
        return f"{strategy}: its accuracy matrix has {len(e['accuracy_matrix'])} rows for {len(e['task_sizes'])} tasks"
    if len(e["seeds"]) != len(e["runs"]) or not e["runs"]:
        return f"{strategy}: {len(e['seeds'])} seeds for {len(e['runs'])} runs"
    return None


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 10 else f"{type(value).__name__} of "
    text += f"{len(value)} items" if text.endswith(" of ") else ""
    return text[:60] + ("..." if len(text) > 60 else "")


def _is_time(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(is_number(v.get(ph)) and v[ph] >= 0 for ph in TIME_PHASES))


def _is_list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


# Every field of a reference entry the gate reads: (name, what it must be, check).
ENTRY_FIELDS: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("bench", "a name", is_name),
    ("strategy", "a name", is_name),
    ("backbone", "a name", is_name),
    ("protocol", "a name", is_name),
    ("profile", "a name or null", lambda v: v is None or is_name(v)),
    ("task_sizes", "a list of integers >= 1", lambda v: isinstance(v, list) and bool(v) and all(map(is_positive, v))),
    ("class_order_seed", "an integer >= 0", lambda v: v is None or is_count(v)),
    ("img_size", "an integer >= 1 or null", lambda v: v is None or is_positive(v)),
    ("accuracy_matrix", "a lower-triangular matrix of percentages (0 to 100)", is_matrix),
    ("last_acc", "a percentage (0 to 100)", is_pct),
    ("avg_acc", "a percentage (0 to 100)", is_pct),
    (
        "tolerance",
        f"an object of {', '.join(TOLERANCE_METRICS)} -> points (0 to {MAX_TOLERANCE:g})",
        lambda v: isinstance(v, dict) and all(is_tolerance(v.get(m)) for m in TOLERANCE_METRICS),
    ),
    (
        "params",
        "an object of added_total and trainable (integers >= 0)",
        lambda v: (
            isinstance(v, dict)
            and all(is_count(v.get(f)) for f in ("added_total", "trainable"))
            and (v.get("stored_total") is None or is_count(v["stored_total"]))
        ),
    ),
    ("precision", "a name", is_name),
    ("time", f"null or an object of {', '.join(TIME_PHASES)} -> a number >= 0", _is_time),
    ("weights", "a string", lambda v: isinstance(v, str)),
    ("seeds", "a list of integers >= 0", _is_list_of(is_count)),
    ("runs", "a list of run ids", _is_list_of(is_name)),
    ("strategy_config", "an object or null", lambda v: v is None or isinstance(v, dict)),
    (
        "metrics",
        f"null or an object of {', '.join(STORED_METRICS)} -> a number, a list of numbers or null",
        lambda v: (
            v is None
            or (isinstance(v, dict) and all(k in STORED_METRICS and _is_metric_value(x) for k, x in v.items()))
        ),
    ),
    (
        "data",
        "null or an object of train/test -> digest",
        lambda v: v is None or (isinstance(v, dict) and bool(v) and all(map(is_name, [*v, *v.values()]))),
    ),
)


# ------------------------------------------------------------------------------------------- what a rewrite changes
def reference_changes(old: Reference, new: Reference) -> list[str]:
    """What a rewrite changes, one line per entry added, removed or moved, its tolerance included, and one for the
    tolerance table (for the file's ``written_by``)."""
    before = {e.key.label(): e for e in old.entries}
    after = {e.key.label(): e for e in new.entries}
    lines = [f"added {k} (tolerance {after[k].tolerance.text()})" for k in sorted(set(after) - set(before))]
    lines += [f"removed {k}" for k in sorted(set(before) - set(after))]
    for k in sorted(set(before) & set(after)):
        b, a = before[k].to_dict(), after[k].to_dict()
        moved = [
            f"{m} {b[m]} -> {a[m]}" for m in ("last_acc", "avg_acc", "params", "precision", "weights") if b[m] != a[m]
        ]
        if before[k].metrics is not None and after[k].metrics is not None:
            moved += [
                f"{m} {before[k].metrics.get(m)} -> {after[k].metrics.get(m)}"
                for m in ("forgetting", "bwt", "ece")
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
