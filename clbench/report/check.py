"""The CI regression gate: compare runs with a reference file written from real runs, in both directions.

Reference file (JSON, written by :func:`make_reference` via ``clbench check --write-reference``, never by hand)::

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
        "strategy_config": {...}
      }, ...]
    }

Rules, per entry:
- Accuracy is two-sided: every entry R[t][j] of the mean accuracy matrix, the final and the average accuracy must lie
  within the entry's tolerance of the reference, in either direction. A drop fails as ``FAIL``; a gain fails as
  ``changed``: an improvement is real only once the reference is rewritten on purpose (``--write-reference --why``).
  Tolerances are per metric and come from a measured spread (same seed, other CPUs; reports/gate/).
- Parameter counts equal the reference exactly; the backbone weights digest and the precision are the reference's.
- Train and eval seconds, each divided by the calibration workload (a fixed frozen-ViT forward pass, timed by
  :mod:`clbench.perf.calibration` in the same CI job and stored beside the runs as ``calibration.json``), may
  exceed the reference's ratio by at most ``time.slack`` times plus ``time.floor`` calibration units. Faster
  is reported, never failed.
- Nothing passes by being skipped: an entry without runs, a run the reference does not pin, an unreadable or
  incomplete record among the runs, a strategy the reference names but this clbench lacks, and (with
  ``require_ci_profiles``) a registered strategy's ``ci`` profile that the reference does not pin all fail, each with
  one line saying what differs and how to fix it.
"""

from __future__ import annotations

import getpass
import math
import os
import statistics
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from clbench.errors import ClbenchError
from clbench.files import atomic_write_json
from clbench.owned import load_json
from clbench.perf.calibration import CALIBRATION_ID
from clbench.report.collect import Collection, Run, bench_label, config_digest
from clbench.results import DEFAULT_CLASS_ORDER_SEED, is_count, is_matrix, is_name, is_pct, is_positive, out_of_bounds
from clbench.text import rich as esc

REFERENCE_FORMAT = "clbench-reference/2"
OLD_FORMATS = {"clbench-reference/1": "one-sided, final/average accuracy only, time as total minus features"}
CALIBRATION_FILE = "calibration.json"
CI_PROFILE_PREFIX = "ci"  # profiles named ci or ci-<something> are the gate's

# Tolerances in points when no measured spread is given for an entry (the same-seed spread is measured per strategy
# and profile by reports/gate/spread.py; see reports/gate/README.md for the figures behind each).
DEFAULT_TOLERANCE = {"matrix": 1.5, "last_acc": 0.5, "avg_acc": 0.5}
TOLERANCE_METRICS = tuple(DEFAULT_TOLERANCE)
# A time ratio may grow by this factor plus FLOOR calibration units before it fails (reasons: reports/gate/README.md).
DEFAULT_TIME_SLACK = 2.0
DEFAULT_TIME_FLOOR = 1.0
TIME_PHASES = ("train", "eval")
MAX_TOLERANCE = 100.0  # points: a tolerance beyond the whole accuracy range would let every result pass
MAX_TIME_FACTOR = 1e6  # time.slack and time.floor: beyond this the time check can never fail

EPS = 1e-9  # float slack on exact-boundary comparisons
OK, CHANGED, FAIL, MISSING, NOTE = "ok", "changed", "FAIL", "missing", "note"
FAILING = {FAIL, MISSING, CHANGED}


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


def _entry_key(entry: dict[str, Any], where: str) -> EntryKey:
    try:
        return EntryKey(
            str(entry["bench"]),
            tuple(int(n) for n in entry["task_sizes"]),
            int(entry.get("class_order_seed", DEFAULT_CLASS_ORDER_SEED)),
            str(entry["strategy"]),
            entry.get("profile"),
            str(entry["backbone"]),
            entry.get("img_size"),
            str(entry["protocol"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ClbenchError(
            f"{where}: a reference entry lacks or mistypes a field ({e})",
            "rewrite the reference with `clbench check --write-reference`",
        ) from None


def weights_identity(run: Run) -> str:
    """``random init`` (the init follows the seed) or the full weights digest."""
    return "random init" if run.weights_label == "random init" else str(run.record.weights_digest)


def group_runs(coll: Collection) -> dict[EntryKey, list[Run]]:
    groups: dict[EntryKey, list[Run]] = defaultdict(list)
    for run in coll.runs:
        for p in run.protocols:
            groups[entry_key(run, p)].append(run)
    return dict(groups)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def mean_matrix(runs: Sequence[Run], protocol: str) -> list[list[float]]:
    """Entry-by-entry mean of the runs' lower-triangular accuracy matrices (rows: after task t)."""
    mats = [r.summary(protocol).accuracy_matrix for r in runs]
    return [[_mean([float(m[t][j]) for m in mats]) for j in range(len(mats[0][t]))] for t in range(len(mats[0]))]


# ------------------------------------------------------------------------------------------- calibration
def write_calibration(folder: Path, measurement: dict[str, Any]) -> Path:
    """Add one calibration measurement to ``folder/calibration.json`` (kept: every earlier one of the same job)."""
    path = Path(folder) / CALIBRATION_FILE
    Path(folder).mkdir(parents=True, exist_ok=True)
    old = load_calibration(path)["measurements"] if path.exists() else []
    atomic_write_json(path, {"format": "clbench-calibration/1", "measurements": [*old, measurement]})
    return path


def load_calibration(path: Path) -> dict[str, Any]:
    data = load_json(path, "calibration", hint="run `clbench check --calibrate DIR` again")
    ms = data.get("measurements") if isinstance(data, dict) else None
    if (
        not isinstance(ms, list)
        or not ms
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("seconds"), (int, float))
            and not isinstance(m["seconds"], bool)
            and 0 < m["seconds"] < 1e6
            and isinstance(m.get("workload"), str)
            for m in ms
        )
    ):
        raise ClbenchError(
            f"{path}: not a calibration file (needs measurements with workload and seconds > 0)",
            "run `clbench check --calibrate DIR` again",
        )
    return data


def find_calibration(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every calibration measurement stored in the given folders (``DIR/calibration.json``), and their files."""
    measurements, files = [], []
    for p in paths:
        f = Path(p) / CALIBRATION_FILE
        if Path(p).is_dir() and f.is_file():
            measurements += load_calibration(f)["measurements"]
            files.append(str(f))
    return measurements, files


def calibration_seconds(measurements: Sequence[dict[str, Any]]) -> float:
    """The median over the job's calibration measurements (one before and one after the runs, in .ci/run)."""
    return statistics.median(float(m["seconds"]) for m in measurements)


# ------------------------------------------------------------------------------------------- tolerances
def load_tolerances(path: Path) -> dict[str, Any]:
    """Per-metric tolerances (points) per ``strategy:profile``, with a ``default``, from a measured-spread summary
    (reports/gate/tolerances.json). Each value must be a number >= 0."""
    data = load_json(path, "tolerances", name=f"--tolerances {path}")
    table = data.get("tolerances") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ClbenchError(f"--tolerances {path}: needs a 'tolerances' object of strategy:profile -> metric -> points")
    for name, tol in table.items():
        if not isinstance(tol, dict):
            raise ClbenchError(f"--tolerances {path}: {name} is not an object of metric -> points")
        for metric, value in tol.items():
            if metric not in TOLERANCE_METRICS:
                raise ClbenchError(
                    f"--tolerances {path}: {name}.{metric} is not a metric; valid: {', '.join(TOLERANCE_METRICS)}"
                )
            if not _is_tolerance(value):
                raise ClbenchError(
                    f"--tolerances {path}: {name}.{metric} must be a number from 0 to {MAX_TOLERANCE:g} points "
                    f"(got {value!r:.40})"
                )
    return {"source": str(path), **table}


def tolerance_for(tolerances: dict[str, Any], strategy: str, profile: str | None) -> dict[str, float]:
    name = f"{strategy}:{profile}" if profile else strategy
    tol = dict(DEFAULT_TOLERANCE)
    tol.update(tolerances.get("default", {}))
    tol.update(tolerances.get(name, {}))
    return {m: float(tol[m]) for m in TOLERANCE_METRICS}


# ------------------------------------------------------------------------------------------- writing
def _who() -> str:
    try:
        name = subprocess.run(["git", "config", "user.name"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or os.environ.get("USER") or getpass.getuser()


def make_reference(
    coll: Collection,
    *,
    why: str,
    description: str = "",
    who: str | None = None,
    tolerances: dict[str, Any] | None = None,
    time_slack: float = DEFAULT_TIME_SLACK,
    time_floor: float = DEFAULT_TIME_FLOOR,
    calibration: Sequence[dict[str, Any]] = (),
    require_ci_profiles: bool = True,
    previous: dict[str, Any] | None = None,
    written_by: str | None = None,
) -> dict[str, Any]:
    """A reference from complete runs: one entry per (benchmark split, strategy, profile, backbone, protocol).

    ``why`` is required: a reference is rewritten on purpose. ``previous`` (the file being replaced) keeps its
    history, and the entries that moved are listed in ``written_by.changes``, tolerance changes included.

    ``tolerances`` (a measured-spread table, :func:`load_tolerances`) sets every entry's tolerance. Without it a
    rewrite keeps the previous reference's: an entry it pinned keeps its tolerance, a new one takes the previous
    table's (else the defaults), so tolerances change only when a file of them is given on purpose."""
    from clbench.results import git_revision

    if not why or not why.strip():
        raise ClbenchError("--write-reference needs --why TEXT: say why the reference changes (it is recorded)")
    if not coll.runs:
        raise ClbenchError(
            "no complete run record to make a reference from",
            "; ".join(f"{s.path}: {s.reason}" for s in coll.skipped) or None,
        )
    if coll.skipped:
        s = coll.skipped[0]
        raise ClbenchError(
            f"{s.path}: {s.reason}; a reference is made from complete records only",
            "leave the folder out or finish the run",
        )
    if not (time_slack >= 1 and math.isfinite(time_slack)) or not (time_floor >= 0 and math.isfinite(time_floor)):
        raise ClbenchError(f"--time-slack must be >= 1 and --time-floor >= 0 (got {time_slack}, {time_floor})")
    kept: dict[str, dict[str, float]] = {}
    if tolerances is None:
        tolerances = dict(previous.get("tolerances") or {}) if previous is not None else {}
        kept = {label: e["tolerance"] for label, e in _entries_by_label(previous or {}).items() if e.get("tolerance")}
    calib = calibration_seconds(calibration) if calibration else None
    entries = []
    for key, runs in sorted(group_runs(coll).items(), key=lambda kv: kv[0].label()):
        if len({config_digest(r.record) for r in runs}) > 1:
            raise ClbenchError(
                f"{key.label()}: the runs {', '.join(r.run_id for r in runs)} use different "
                f"{key.strategy} settings; a reference entry needs one configuration",
                "give runs of one configuration per strategy, or use --profile to tell them apart",
            )
        for what, values in (
            ("params.added_total", {r.record.params.added_total for r in runs}),
            ("params.trainable", {r.record.params.trainable for r in runs}),
            ("params.stored_total", {r.record.params.stored_total for r in runs}),
            ("backbone weights", {weights_identity(r) for r in runs}),
            ("precision", {r.record.precision for r in runs}),
        ):
            if len(values) > 1:
                raise ClbenchError(f"{key.label()}: runs disagree on {what} ({', '.join(map(str, sorted(values)))})")
        s = [r.summary(key.protocol) for r in runs]
        entries.append(
            {
                "bench": key.bench,
                "task_sizes": list(key.task_sizes),
                "class_order_seed": key.class_order_seed,
                "strategy": key.strategy,
                "profile": key.profile,
                "backbone": key.backbone,
                "img_size": key.img_size,
                "protocol": key.protocol,
                "precision": runs[0].record.precision,
                "weights": weights_identity(runs[0]),
                "seeds": sorted(r.seed for r in runs),
                "runs": [r.run_id for r in runs],
                "accuracy_matrix": [[round(v, 4) for v in row] for row in mean_matrix(runs, key.protocol)],
                "last_acc": round(_mean([float(x.last_acc) for x in s]), 4),
                "avg_acc": round(_mean([float(x.avg_acc) for x in s]), 4),
                "tolerance": dict(kept.get(key.label()) or tolerance_for(tolerances, key.strategy, key.profile)),
                "params": {
                    "added_total": runs[0].record.params.added_total,
                    "stored_total": runs[0].record.params.stored_total,
                    "trainable": runs[0].record.params.trainable,
                },
                "time": None
                if calib is None
                else {ph: round(_mean([getattr(r.record.time_s, ph) for r in runs]) / calib, 4) for ph in TIME_PHASES},
                "strategy_config": runs[0].record.strategy_config,
            }
        )
    ref = {
        "format": REFERENCE_FORMAT,
        "description": description,
        "written_by": {
            "who": who or _who(),
            "why": why.strip(),
            "command": written_by,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "git_revision": git_revision(),
        },
        "history": [],
        "produced_by": [
            {
                "run_id": r.run_id,
                "strategy": r.strategy,
                "profile": r.record.profile,
                "bench": r.bench_label,
                "seed": r.seed,
                "protocols": r.protocols,
                "precision": r.record.precision,
                "git_revision": r.record.git_revision,
                "command": r.record.command,
                "weights_digest": r.record.weights_digest,
                "finished": r.record.finished,
                "time_s": r.record.time_s.to_dict(),
                "host": r.record.host.to_dict(),
            }
            for r in coll.runs
        ],
        "tolerances": tolerances,
        "time": {
            "slack": time_slack,
            "floor": time_floor,
            "calibration": None
            if calib is None
            else {"workload": CALIBRATION_ID, "seconds": calib, "measurements": list(calibration)},
        },
        "require_ci_profiles": require_ci_profiles,
        "entries": entries,
    }
    if previous is not None:
        ref["written_by"]["changes"] = reference_changes(previous, ref)
        prior = previous.get("written_by")
        if isinstance(prior, str):  # format 1 stored only the command
            prior = {"command": prior, "created": previous.get("created"), "format": previous.get("format")}
        ref["history"] = [prior, *previous.get("history", [])] if prior else list(previous.get("history", []))
    return ref


def _entries_by_label(ref: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for e in ref.get("entries", []) if isinstance(ref.get("entries"), list) else []:
        try:
            out[_entry_key(e, "previous reference").label()] = e
        except ClbenchError:
            continue
    return out


def _tolerance_text(tol: Any) -> str:
    if not isinstance(tol, dict):
        return str(tol)
    return " / ".join(f"{m} {tol.get(m)}" for m in TOLERANCE_METRICS)


def reference_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What a rewrite changes, one line per entry added, removed or moved, its tolerance included, and one for the
    tolerance table (for the file's ``written_by``)."""
    before, after = _entries_by_label(old), _entries_by_label(new)
    lines = [
        f"added {k} (tolerance {_tolerance_text(after[k].get('tolerance'))})" for k in sorted(set(after) - set(before))
    ]
    lines += [f"removed {k}" for k in sorted(set(before) - set(after))]
    for k in sorted(set(before) & set(after)):
        moved = [
            f"{m} {before[k].get(m)} -> {after[k].get(m)}"
            for m in ("last_acc", "avg_acc", "params", "precision", "weights")
            if before[k].get(m) != after[k].get(m)
        ]
        if before[k].get("tolerance") != after[k].get("tolerance"):
            moved.append(
                f"tolerance {_tolerance_text(before[k].get('tolerance'))} -> "
                f"{_tolerance_text(after[k].get('tolerance'))}"
            )
        if moved:
            lines.append(f"{k}: " + "; ".join(moved))
    old_table, new_table = old.get("tolerances") or {}, new.get("tolerances") or {}
    if old_table != new_table:
        names = sorted(n for n in set(old_table) | set(new_table) if old_table.get(n) != new_table.get(n))
        lines.append(
            f"tolerance table: {old_table.get('source', 'built-in defaults')} -> "
            f"{new_table.get('source', 'built-in defaults')} (differs in: {', '.join(names)})"
        )
    return lines


def write_reference(path: Path, reference: dict[str, Any]) -> None:
    atomic_write_json(Path(path), reference)


def load_reference(path: Path, *, for_writing: bool = False) -> dict[str, Any]:
    """Read and validate a reference file; an older format gets one line saying how to rewrite it."""
    path = Path(path)
    flag = "--write-reference" if for_writing else "--reference"
    ref = load_json(
        path,
        "reference",
        name=f"{flag} {path}",
        hint="move it away to write a new reference" if for_writing else None,
    )
    got = ref.get("format") if isinstance(ref, dict) else type(ref).__name__
    if for_writing and got in OLD_FORMATS:
        return ref
    fix = (
        f"rewrite it from fresh runs: `clbench check --write-reference {path} RUN_DIRS --why TEXT` "
        "(.ci/run shows the runs)"
    )
    if got in OLD_FORMATS:  # one line: what differs and how to fix it
        raise ClbenchError(
            f"--reference {path}: older format {got!r} ({OLD_FORMATS[got]}), this clbench reads "
            f"{REFERENCE_FORMAT!r}: {fix}"
        )
    if got != REFERENCE_FORMAT:
        raise ClbenchError(f"--reference {path}: format {got!r:.40}, expected {REFERENCE_FORMAT!r}: {fix}")
    huge = out_of_bounds(ref)
    if huge is not None:
        raise ClbenchError(f"--reference {path}: {huge}", fix)
    for field, typ in (("entries", list), ("time", dict), ("tolerances", dict), ("written_by", dict)):
        if not isinstance(ref.get(field), typ):
            raise ClbenchError(f"--reference {path}: field {field!r} is missing or not a {typ.__name__}", fix)
    if not isinstance(ref.get("require_ci_profiles", True), bool):
        raise ClbenchError(
            f"--reference {path}: require_ci_profiles is {ref['require_ci_profiles']!r:.40}, expected true or false",
            fix,
        )
    for i, e in enumerate(ref["entries"]):
        where = f"--reference {path}: entries[{i}]"
        if not isinstance(e, dict):
            raise ClbenchError(f"{where} is not an object", fix)
        for field, expected, ok in ENTRY_FIELDS:
            if not ok(e.get(field)):
                strategy = f" ({e['strategy']})" if is_name(e.get("strategy")) else ""
                raise ClbenchError(
                    f"{where}{strategy}: field {field!r} is {_shown(e.get(field))}, expected {expected}", fix
                )
        _entry_key(e, where)
    t = ref["time"]
    for knob, low in (("slack", 1.0), ("floor", 0.0)):
        if not (_is_number(t.get(knob)) and low <= t[knob] <= MAX_TIME_FACTOR):
            raise ClbenchError(
                f"--reference {path}: time.{knob} is {_shown(t.get(knob))}, expected a number from {low:g} to "
                f"{MAX_TIME_FACTOR:g}",
                fix,
            )
    return ref


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 10 else f"{type(value).__name__} of "
    text += f"{len(value)} items" if text.endswith(" of ") else ""
    return text[:60] + ("..." if len(text) > 60 else "")


def _is_tolerance(v: Any) -> bool:
    return _is_number(v) and 0 <= v <= MAX_TOLERANCE


def _is_time(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(_is_number(v.get(ph)) and v[ph] >= 0 for ph in TIME_PHASES))


# Every field of a reference entry the gate reads: (name, what it must be, check).
ENTRY_FIELDS: tuple[tuple[str, str, Any], ...] = (
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
        lambda v: isinstance(v, dict) and all(_is_tolerance(v.get(m)) for m in TOLERANCE_METRICS),
    ),
    (
        "params",
        "an object of added_total and trainable (integers >= 0)",
        lambda v: isinstance(v, dict) and all(is_count(v.get(f)) for f in ("added_total", "trainable")),
    ),
    ("precision", "a name", is_name),
    ("time", f"null or an object of {', '.join(TIME_PHASES)} -> a number >= 0", _is_time),
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ------------------------------------------------------------------------------------------- checking
@dataclass(frozen=True)
class CheckRow:
    entry: str
    check: str
    reference: str
    measured: str
    allowed: str
    status: str
    detail: str = ""


@dataclass
class CheckResult:
    rows: list[CheckRow]
    skipped: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return not any(r.status in FAILING for r in self.rows)

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status in FAILING]


def _two_sided(label: str, name: str, want: float, got: float, tol: float, rewrite: str) -> CheckRow:
    delta = got - want
    status = FAIL if delta < -tol - EPS else CHANGED if delta > tol + EPS else OK
    detail = (
        ""
        if status == OK
        else (
            f"fell {-delta:.2f} points"
            if status == FAIL
            else f"rose {delta:.2f} points: a gain is a change too; {rewrite}"
        )
    )
    return CheckRow(label, name, f"{want:.2f}", f"{got:.2f} ({delta:+.2f})", f"{want:.2f} ± {tol:g}", status, detail)


def _matrix_row(label: str, want: list[list[float]], got: list[list[float]], tol: float, rewrite: str) -> CheckRow:
    if [len(r) for r in want] != [len(r) for r in got]:
        return CheckRow(
            label,
            "accuracy matrix",
            f"{len(want)} rows",
            f"{len(got)} rows",
            "same shape",
            FAIL,
            "the runs' accuracy matrix has another shape than the reference's",
        )
    deltas = [(got[t][j] - want[t][j], t, j) for t in range(len(want)) for j in range(len(want[t]))]
    low = [d for d in deltas if d[0] < -tol - EPS]
    high = [d for d in deltas if d[0] > tol + EPS]
    worst = max(deltas, key=lambda d: abs(d[0]))
    measured = f"max |Δ| {abs(worst[0]):.2f} at R[{worst[1] + 1}][{worst[2] + 1}]"
    if not low and not high:
        return CheckRow(label, "accuracy matrix", f"{len(deltas)} entries", measured, f"each ± {tol:g}", OK)
    shown = "; ".join(f"R[{t + 1}][{j + 1}] {want[t][j]:.2f} -> {got[t][j]:.2f}" for _, t, j in (low or high)[:4])
    more = f" (+{len(low or high) - 4} more)" if len(low or high) > 4 else ""
    status = FAIL if low else CHANGED
    why = "" if low else f"; a gain is a change too: {rewrite}"
    return CheckRow(
        label,
        "accuracy matrix",
        f"{len(deltas)} entries",
        measured,
        f"each ± {tol:g}",
        status,
        f"{len(low or high)} entries {'fell' if low else 'rose'} beyond tolerance: {shown}{more}{why}",
    )


def _registered_ci_profiles() -> dict[str, list[str]]:
    from clbench.catalog import STRATEGIES

    return {
        name: [
            p for p in STRATEGIES.get(name).profiles if p == CI_PROFILE_PREFIX or p.startswith(CI_PROFILE_PREFIX + "-")
        ]
        for name in STRATEGIES.names()
    }


def settings_differences(strategy: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Strategy settings that differ between a reference entry and a run. A setting the reference lacks counts as the
    same when the run holds the strategy's default for it: it was added after the reference was written, and its
    default keeps the measured behaviour (a new setting that changed it would have a non-default value or a new
    default, and differ)."""
    import dataclasses

    from clbench.catalog import STRATEGIES

    try:
        defaults = {
            f.name: f.default
            for f in dataclasses.fields(STRATEGIES.get(strategy).Config)
            if f.default is not dataclasses.MISSING
        }
    except ClbenchError:
        defaults = {}
    return sorted(
        k
        for k in set(want) | set(got)
        if want.get(k) != got.get(k) and not (k not in want and k in defaults and got.get(k) == defaults[k])
    )


def check(
    coll: Collection, ref: dict[str, Any], calibration: Sequence[dict[str, Any]] = (), reference_path: str = "REFERENCE"
) -> CheckResult:
    """Every rule of every reference entry against the runs of ``coll``; ``calibration``: this job's calibration
    measurements (``calibration.json`` beside the runs)."""
    from clbench.catalog import STRATEGIES

    rewrite = f"rewrite the reference on purpose: clbench check --write-reference {reference_path} RUNS --why TEXT"
    groups = group_runs(coll)
    t_cfg = ref["time"]
    slack, floor = float(t_cfg["slack"]), float(t_cfg["floor"])
    ref_calib = t_cfg.get("calibration") or {}
    rows: list[CheckRow] = []
    calib: float | None = None
    if any(e.get("time") for e in ref["entries"]):
        if not calibration:
            rows.append(
                CheckRow(
                    "calibration",
                    "calibration present",
                    ref_calib.get("workload", "-"),
                    "none",
                    "-",
                    MISSING,
                    f"no {CALIBRATION_FILE} among the run folders given: run `clbench check "
                    "--calibrate RUN_DIR` in the same job as the runs (see .ci/run)",
                )
            )
        elif {m["workload"] for m in calibration} != {ref_calib.get("workload")}:
            got = ", ".join(sorted({m["workload"] for m in calibration}))
            rows.append(
                CheckRow(
                    "calibration",
                    "calibration workload",
                    str(ref_calib.get("workload")),
                    got,
                    "same",
                    FAIL,
                    f"the calibration workload differs from the reference's: times are not comparable; {rewrite}",
                )
            )
        else:
            calib = calibration_seconds(calibration)
            threads = {m.get("host", {}).get("torch_threads") for m in calibration}
            ref_threads = {m.get("host", {}).get("torch_threads") for m in ref_calib.get("measurements", [])}
            if ref_threads and threads != ref_threads:
                rows.append(
                    CheckRow(
                        "calibration",
                        "torch threads",
                        str(sorted(ref_threads, key=str)),
                        str(sorted(threads, key=str)),
                        "-",
                        NOTE,
                        "time ratios compare machines with other thread counts",
                    )
                )
    matched: set[EntryKey] = set()
    pinned: set[tuple[str, str | None]] = set()
    for i, entry in enumerate(ref["entries"]):
        key = _entry_key(entry, f"entries[{i}]")
        label = key.label()
        pinned.add((key.strategy, key.profile))
        if key.strategy not in STRATEGIES.names():
            rows.append(
                CheckRow(
                    label,
                    "strategy known",
                    key.strategy,
                    "unknown",
                    "-",
                    FAIL,
                    f"the reference pins strategy {key.strategy!r}, which this clbench does not register "
                    f"(registered: {', '.join(STRATEGIES.names())}); {rewrite}",
                )
            )
            continue
        runs = groups.get(key, [])
        if not runs:
            rows.append(
                CheckRow(
                    label,
                    "run present",
                    f"seeds {entry.get('seeds')}",
                    "no matching run",
                    "-",
                    MISSING,
                    f"no complete run of this strategy, profile, split, backbone and protocol was given: "
                    f"`{key.run_command()} --precision {entry['precision']}` (see .ci/run)",
                )
            )
            continue
        matched.add(key)
        tol = entry["tolerance"]
        precisions = sorted({r.record.precision for r in runs})
        if precisions != [entry["precision"]]:
            rows.append(
                CheckRow(
                    label,
                    "precision",
                    entry["precision"],
                    ", ".join(precisions),
                    "same",
                    FAIL,
                    f"runs at {', '.join(precisions)}, reference at {entry['precision']}: rerun with "
                    f"--precision {entry['precision']}, or write a reference at that precision",
                )
            )
            continue  # numbers at another precision are not comparable: no further rows for this entry
        want_w = entry.get("weights")
        got_w = sorted({weights_identity(r) for r in runs})
        if got_w != [want_w]:
            rows.append(
                CheckRow(
                    label,
                    "backbone weights",
                    str(want_w)[:12],
                    ", ".join(w[:12] for w in got_w),
                    "same digest",
                    FAIL,
                    f"backbone weights digest {', '.join(w[:12] for w in got_w)} differs from the "
                    f"reference's {str(want_w)[:12]}: run with the reference's weights (`clbench weights`), "
                    f"or {rewrite}",
                )
            )
            continue
        s = [r.summary(key.protocol) for r in runs]
        rows.append(
            _matrix_row(label, entry["accuracy_matrix"], mean_matrix(runs, key.protocol), tol["matrix"], rewrite)
        )
        for metric, name in (("last_acc", "final acc %"), ("avg_acc", "avg inc acc %")):
            rows.append(
                _two_sided(
                    label,
                    name,
                    float(entry[metric]),
                    _mean([float(getattr(x, metric)) for x in s]),
                    float(tol[metric]),
                    rewrite,
                )
            )
        for field in ("added_total", "stored_total", "trainable"):
            if field not in entry["params"]:  # references written before stored statistics were counted apart
                continue
            want_p = int(entry["params"][field])
            got_p = sorted({int(getattr(r.record.params, field)) for r in runs})
            rows.append(
                CheckRow(
                    label,
                    f"params {field}",
                    f"{want_p:,}",
                    ", ".join(f"{v:,}" for v in got_p),
                    f"= {want_p:,}",
                    OK if got_p == [want_p] else FAIL,
                )
            )
        if entry.get("time") and calib is not None:
            for ph in TIME_PHASES:
                want_t = float(entry["time"][ph])
                got_t = _mean([float(getattr(r.record.time_s, ph)) for r in runs]) / calib
                limit = want_t * slack + floor
                status = FAIL if got_t > limit + EPS else OK
                detail = (
                    (
                        f"{ph} took {got_t / want_t if want_t > 0 else math.inf:.1f}x the reference's share of the "
                        f"calibration workload"
                    )
                    if status == FAIL
                    else (
                        f"{ph} is {want_t / got_t:.1f}x faster than the reference"
                        if got_t > 0 and got_t * slack + floor < want_t
                        else ""
                    )
                )
                rows.append(
                    CheckRow(
                        label,
                        f"{ph} time / calibration",
                        f"{want_t:.2f}",
                        f"{got_t:.2f}",
                        f"<= {limit:.2f}",
                        status,
                        detail,
                    )
                )
                if status == OK and detail:
                    rows.append(
                        CheckRow(
                            label,
                            f"{ph} time faster",
                            f"{want_t:.2f}",
                            f"{got_t:.2f}",
                            "-",
                            NOTE,
                            detail + ": consider rewriting the reference",
                        )
                    )
        seeds = sorted(r.seed for r in runs)
        if seeds != sorted(entry.get("seeds", seeds)):
            rows.append(
                CheckRow(
                    label,
                    "seeds",
                    str(entry.get("seeds")),
                    str(seeds),
                    "same",
                    FAIL,
                    "means over other seeds than the reference's are not comparable: run its seeds",
                )
            )
        cfg = entry.get("strategy_config")
        diff = (
            sorted({k for r in runs for k in settings_differences(r.record.strategy, cfg, r.record.strategy_config)})
            if cfg is not None
            else []
        )
        if diff:
            rows.append(
                CheckRow(
                    label,
                    "settings",
                    "reference's",
                    "differ: " + ", ".join(diff),
                    "same",
                    FAIL,
                    f"the runs' {key.strategy} settings differ from the reference's ({', '.join(diff)}): "
                    f"run the reference's profile, or {rewrite}",
                )
            )
    for key in sorted(set(groups) - matched, key=lambda k: k.label()):
        rows.append(
            CheckRow(
                key.label(),
                "pinned",
                "-",
                ", ".join(r.run_id for r in groups[key]),
                "-",
                FAIL,
                f"the reference does not pin this run: {rewrite}, or leave the run out",
            )
        )
    if ref.get("require_ci_profiles"):
        for strategy, profiles in _registered_ci_profiles().items():
            if not profiles:
                rows.append(
                    CheckRow(
                        strategy,
                        "ci profile",
                        "-",
                        "none",
                        "-",
                        FAIL,
                        f"strategy {strategy} is registered but has no `ci` profile: add one to its "
                        f"`profiles`, run it in .ci/run and {rewrite}",
                    )
                )
            for p in profiles:
                if (strategy, p) not in pinned:
                    rows.append(
                        CheckRow(
                            f"{strategy}:{p}",
                            "pinned",
                            "-",
                            "not in the reference",
                            "-",
                            FAIL,
                            f"registered profile {strategy}:{p} is not pinned: run `clbench run "
                            f"--strategy {strategy} --profile {p} --precision fp32` in .ci/run and "
                            f"{rewrite}",
                        )
                    )
    for s in coll.skipped:
        rows.append(
            CheckRow(
                s.path,
                "record readable",
                "-",
                "skipped",
                "-",
                FAIL,
                f"{s.reason}: the gate reads every record given; remove the folder or rerun it",
            )
        )
    return CheckResult(rows, [(s.path, s.reason) for s in coll.skipped])


STATUS_STYLE = {OK: "green", CHANGED: "bold magenta", FAIL: "bold red", MISSING: "bold red", NOTE: "yellow"}
COLUMNS = (
    ("matrix", ("accuracy matrix",)),
    ("final acc %", ("final acc %",)),
    ("avg inc acc %", ("avg inc acc %",)),
    ("params added / stored / trainable", ("params added_total", "params stored_total", "params trainable")),
    ("train / eval time", ("train time / calibration", "eval time / calibration")),
)


def _cell(rows: list[CheckRow]) -> str:
    if not rows:
        return "-"
    parts = []
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        shown = r.measured if r.status == OK else f"{r.measured}; needs {r.allowed}"
        parts.append(f"[{style}]{esc(shown)}[/]")
    return " / ".join(parts)


def print_check(result: CheckResult, reference_path: str, console=None) -> None:
    """One row per reference entry (green: holds; red: fell short or missing; magenta: changed upwards), then one
    line per failed check saying what differs and how to fix it."""
    import sys

    from rich.console import Console
    from rich.table import Table

    if console is None:  # CI logs are not terminals: do not squeeze the table into 80 columns there
        console = Console() if sys.stdout.isatty() else Console(width=180)
    by_entry: dict[str, list[CheckRow]] = {}
    for r in result.rows:
        by_entry.setdefault(r.entry, []).append(r)
    table = Table(title=f"clbench check against {esc(reference_path)}")
    table.add_column("benchmark | strategy | backbone | protocol")
    for name, _ in COLUMNS:
        table.add_column(name, justify="right")
    table.add_column("result")
    for entry, rows in by_entry.items():
        statuses = {r.status for r in rows}
        verdict = next((s for s in (MISSING, FAIL, CHANGED) if s in statuses), OK)
        cells = [_cell([r for r in rows if r.check in checks]) for _, checks in COLUMNS]
        table.add_row(esc(entry), *cells, f"[{STATUS_STYLE.get(verdict, 'yellow')}]{verdict}[/]")
    console.print(table)
    for r in result.rows:
        if r.status == NOTE:
            console.print(
                f"[yellow]note[/] {esc(r.entry)}: {esc(r.check)}: {esc(r.measured)}"
                + (f" ({esc(r.detail)})" if r.detail else "")
            )
    fails = result.failures
    if fails:
        console.print(f"[bold red]check failed[/]: {len(fails)} of {len(result.rows)} checks do not hold:")
        for r in fails:
            console.print(
                f"  [{STATUS_STYLE[r.status]}]{r.status}[/] {esc(r.entry)}: {esc(r.check)}: measured "
                f"{esc(r.measured)}, allowed {esc(r.allowed)}" + (f" ({esc(r.detail)})" if r.detail else ""),
                soft_wrap=True,
            )
    else:
        console.print(f"[bold green]check passed[/]: {len(result.rows)} checks hold")
