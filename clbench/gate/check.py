"""The CI regression gate: compare runs with a reference file written from real runs, in both directions.

The reference file, its type and its one reader and writer are :mod:`clbench.gate.reference`; the tolerances
:mod:`clbench.gate.tolerances`; the table and the failure lines :mod:`clbench.gate.printing`. This module holds
the calibration file the time rule divides by (:class:`CalibrationFile`, typed like the reference),
:func:`make_reference` (a reference from runs) and the rules (:func:`check`, one function per rule).

Rules, per entry:
- Accuracy is two-sided: every entry R[t][j] of the mean accuracy matrix, the final and the average accuracy must lie
  within the entry's tolerance of the reference, in either direction. A drop fails as ``FAIL``; a gain fails as
  ``changed``: an improvement is real only once the reference is rewritten on purpose (``--write-reference --why``).
  Tolerances are per metric and come from a measured spread (same seed, other CPUs; reports/gate/).
- Every other metric the records store (forgetting, first-minus-last forgetting, BWT, ECE, the accuracy, old, new
  and top-5 curves, the intervals' endpoints: ``metrics`` of an entry) must lie within what the accuracy tolerances
  allow it (a curve entry or ECE: the matrix tolerance; forgetting and BWT, differences of two entries: twice it; an
  interval endpoint: its accuracy's), either way, else ``changed``: a metric's definition or the runs changed. An
  entry written before pins none of them.
- Parameter counts equal the reference exactly; the backbone weights digest and the precision are the reference's,
  and so are the train and test data digests (``data``) where both the entry and the run's record have them.
- Every record agrees with its predictions file where the file exists (:func:`clbench.report.collect.collect`
  refuses one that does not, exit 2).
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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clbench.core.catalog import DEFAULT_STRATEGY as CONTROL
from clbench.core.catalog import STRATEGIES, card, config_defaults
from clbench.errors import ClbenchError
from clbench.evaluation.declared import BY_NAME
from clbench.files.atomic import atomic_write_json
from clbench.files.safety import load_json
from clbench.files.typedfile import Typed, json_field, one_of, problems, read, write
from clbench.gate.reference import (  # noqa: F401  (also the names the CLI, tests and reports/gate/spread.py use)
    DEFAULT_TIME_FLOOR,
    DEFAULT_TIME_SLACK,
    REFERENCE_FORMAT,
    STORED_METRICS,
    TIME_PHASES,
    TRAINING_PINS,
    EntryKey,
    Measurement,
    ParamPins,
    PhaseTimes,
    PinnedTolerance,
    Reference,
    ReferenceEntry,
    RunProvenance,
    TimeCalibration,
    TimeRule,
    WrittenBy,
    group_runs,
    load_reference,
    mean,
    mean_matrix,
    reference_changes,
    weights_identity,
    write_reference,
)
from clbench.gate.tolerances import (  # noqa: F401
    TRAINING_REL_TOLERANCE,
    Tolerance,
    ToleranceTable,
    load_tolerances,
    tolerance_for,
)
from clbench.perf.calibration import CALIBRATION_ID
from clbench.records.host import git_revision
from clbench.records.schema import out_of_bounds
from clbench.report.collect import Collection, Run, config_digest

Json = dict[str, Any]
CALIBRATION_FILE = "calibration.json"
CI_PROFILE_PREFIX = "ci"  # profiles named ci or ci-<something> are the gate's

EPS = 1e-9  # float slack on exact-boundary comparisons
OK, CHANGED, FAIL, MISSING, NOTE = "ok", "changed", "FAIL", "missing", "note"
FAILING = {FAIL, MISSING, CHANGED}


# ------------------------------------------------------------------------------------------- calibration
CALIBRATION_FORMAT = "clbench-calibration/1"
CALIBRATION_HINT = "run `clbench check --calibrate DIR` again"


def _is_measurements(v: Any) -> bool:
    return isinstance(v, list) and bool(v)  # each item is checked as a Measurement, named by its index


@dataclass(frozen=True, kw_only=True)
class CalibrationFile(Typed):
    """``calibration.json`` beside a gate job's runs: every timing of the calibration workload the job made (one
    before and one after the runs, in .ci/run), each a :class:`~clbench.gate.reference.Measurement`."""

    format: str = json_field(repr(CALIBRATION_FORMAT), one_of(CALIBRATION_FORMAT), default=CALIBRATION_FORMAT)
    measurements: list[Measurement] = json_field(
        "a non-empty list of objects", _is_measurements, required=True, part=Measurement, shape="list"
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


def write_calibration(folder: Path, measurement: Json) -> Path:
    """Add one calibration measurement (:func:`clbench.perf.calibration.calibrate`'s) to ``folder/calibration.json``
    (kept: every earlier one of the same job)."""
    problem = problems(Measurement, measurement).first()
    if problem is not None:  # the measuring code's fault: nothing is written that the gate would refuse
        raise ClbenchError(f"calibration measurement: {problem}")
    path = Path(folder) / CALIBRATION_FILE
    Path(folder).mkdir(parents=True, exist_ok=True)
    old = load_calibration(path).measurements if path.exists() else []
    atomic_write_json(path, write(CalibrationFile(measurements=[*old, read(Measurement, measurement)])))
    return path


def load_calibration(path: Path) -> CalibrationFile:
    """Read and validate a calibration file; a refusal is one ClbenchError line naming the file and the field."""
    data = load_json(path, "calibration", hint=CALIBRATION_HINT)
    problem = out_of_bounds(data) or problems(CalibrationFile, data).first()
    if problem is not None:
        raise ClbenchError(f"{path}: not a calibration file: {problem}", CALIBRATION_HINT)
    return read(CalibrationFile, data)


def find_calibration(paths: Sequence[str | Path]) -> tuple[list[Measurement], list[str]]:
    """Every calibration measurement stored in the given folders (``DIR/calibration.json``), and their files."""
    measurements: list[Measurement] = []
    files = []
    for p in paths:
        f = Path(p) / CALIBRATION_FILE
        if Path(p).is_dir() and f.is_file():
            measurements += load_calibration(f).measurements
            files.append(str(f))
    return measurements, files


def calibration_seconds(measurements: Sequence[Measurement]) -> float:
    """The median over the job's calibration measurements (one before and one after the runs, in .ci/run)."""
    return statistics.median(float(m.seconds) for m in measurements)


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


# The domain-incremental gate runs' benchmark: the embedded images as their two vendors' artwork styles (two domains).
DOMAIN_GATE_BENCH = "emoji-vendors"


def gate_plan(out: Path) -> list[list[str]]:
    """The regression gate's runs (``.ci/gate``), each as the arguments of ``clbench run``, derived from the catalog:
    every registered strategy in each of its ci profiles on the embedded benchmark, fp32, both protocols in the plain
    ``ci`` profile of a strategy that has a reference protocol; and the ``ci`` profile in the domain-incremental
    scenario on :data:`DOMAIN_GATE_BENCH` for each strategy whose ``gate_scenarios`` name it. Run folders:
    ``OUT/<strategy>-<profile>`` and ``OUT/<strategy>-domain-ci``."""
    # deferred: loads torch, which importing this module does not
    from clbench.core.catalog import STRATEGIES, card
    from clbench.methods.contract import REFERENCE

    runs = []
    for name, profiles in _registered_ci_profiles().items():
        cls = STRATEGIES.get(name)
        for profile in profiles:
            both = ["--protocol", "both"] if profile == CI_PROFILE_PREFIX and REFERENCE in cls.protocols else []
            runs.append(["--strategy", name, "--profile", profile, *both, "--out", str(out / f"{name}-{profile}")])
    for name in STRATEGIES.names():
        if "domain" in card(name).gate_scenarios:
            runs.append(
                [
                    "--strategy",
                    name,
                    "--bench",
                    DOMAIN_GATE_BENCH,
                    "--scenario",
                    "domain",
                    "--profile",
                    CI_PROFILE_PREFIX,
                    "--out",
                    str(out / f"{name}-domain-{CI_PROFILE_PREFIX}"),
                ]
            )
    runs += _control_runs(out)
    return [[*run[:-2], "--precision", "fp32", *run[-2:]] for run in runs]


# The untrained control (:data:`clbench.gate.printing.CONTROL`): its ci profile, run again at every other split a
# registered ci profile uses, so that the gate prints every method's margin over it (what its ci training learns).
CONTROL_SPLIT_KEYS = (
    ("init_cls", "--init-cls", "b"),
    ("increment", "--increment", "inc"),
    ("train_per_class", "--train-per-class", "k"),
)


def _control_runs(out: Path) -> list[list[str]]:
    """``CONTROL --profile ci`` at each split (first task, increment, training images per class) of a registered ci
    profile that differs from the control's own ci split, into ``OUT/<control>-ci-b<init>-inc<inc>-k<k>`` (a part
    the profile leaves at the benchmark's default is omitted from the name). Input size: every ci profile's is the
    control's (``CI_INPUT``); a profile with another one gets a control at it too."""
    # the untrained control, clbench.gate.printing.CONTROL (which imports this module: named here from its source)

    def split(profile: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(profile.get(key) for key, _, _ in CONTROL_SPLIT_KEYS) + (profile.get("img_size"),)

    own = split(card(CONTROL).profiles[CI_PROFILE_PREFIX])
    splits = sorted(
        {split(card(name).profiles[p]) for name, profiles in _registered_ci_profiles().items() for p in profiles}
        - {own},
        key=str,
    )
    runs = []
    for values in splits:
        flags: list[str] = []
        parts: list[str] = []
        for (_, flag, short), value in zip(CONTROL_SPLIT_KEYS, values[:-1], strict=True):
            if value is not None:
                flags += [flag, str(value)]
                parts.append(f"{short}{value}")
        if values[-1] is not None and values[-1] != own[-1]:
            flags += ["--img-size", str(values[-1])]
            parts.append(f"px{values[-1]}")
        name = f"{CONTROL}-{CI_PROFILE_PREFIX}-" + "-".join(parts)
        runs.append(["--strategy", CONTROL, "--profile", CI_PROFILE_PREFIX, *flags, "--out", str(out / name)])
    return runs


def _registered_ci_profiles() -> dict[str, list[str]]:
    return {
        name: [p for p in card(name).profiles if p == CI_PROFILE_PREFIX or p.startswith(CI_PROFILE_PREFIX + "-")]
        for name in STRATEGIES.names()
    }


def settings_differences(strategy: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Strategy settings that differ between a reference entry and a run. A setting the reference lacks counts as the
    same when the run holds the strategy's default for it: it was added after the reference was written, and its
    default keeps the measured behaviour (a new setting that changed it would have a non-default value or a new
    default, and differ)."""
    defaults = config_defaults(strategy)
    return sorted(
        k
        for k in set(want) | set(got)
        if want.get(k) != got.get(k) and not (k not in want and k in defaults and got.get(k) == defaults[k])
    )


# ------------------------------------------------------------------------------------------- writing a reference
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
    tolerances: ToleranceTable | None = None,
    time_slack: float = DEFAULT_TIME_SLACK,
    time_floor: float = DEFAULT_TIME_FLOOR,
    calibration: Sequence[Measurement] = (),
    require_ci_profiles: bool = True,
    previous: Reference | None = None,
    written_by: str | None = None,
) -> Reference:
    """A reference from complete runs: one entry per (benchmark split, strategy, profile, backbone, protocol).

    ``why`` is required: a reference is rewritten on purpose. ``previous`` (the file being replaced) keeps its
    history, and the entries that moved are listed in ``written_by.changes``, tolerance changes included.

    ``tolerances`` (a measured-spread table, :func:`~clbench.gate.tolerances.load_tolerances`) sets every entry's
    tolerance. Without it a rewrite keeps the previous reference's: an entry it pinned keeps its tolerance, a new one
    takes the previous table's (else the defaults), so tolerances change only when a file of them is given on
    purpose."""

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
    kept: dict[str, Tolerance] = {}
    if tolerances is None:
        tolerances = dict(previous.tolerances) if previous is not None else {}
        kept = {e.key.label(): e.tolerance for e in (previous.entries if previous is not None else [])}
    calib = calibration_seconds(calibration) if calibration else None
    entries = [
        _entry(key, runs, kept.get(key.label()) or tolerance_for(tolerances, key.strategy, key.profile), calib)
        for key, runs in sorted(group_runs(coll).items(), key=lambda kv: kv[0].label())
    ]
    written = WrittenBy(
        who=who or _who(),
        why=why.strip(),
        command=written_by,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git_revision=git_revision(),
    )
    ref = Reference(
        description=description,
        written_by=written,
        produced_by=[_provenance(r) for r in coll.runs],
        tolerances=tolerances,
        time=TimeRule(
            slack=time_slack,
            floor=time_floor,
            calibration=None
            if calib is None
            else TimeCalibration(workload=CALIBRATION_ID, seconds=calib, measurements=list(calibration)),
        ),
        require_ci_profiles=require_ci_profiles,
        entries=entries,
    )
    if previous is None:
        return ref
    prior = [previous.written_by] if previous.written_by is not None else []
    return replace(
        ref,
        written_by=replace(written, changes=reference_changes(previous, ref)),
        history=[*prior, *previous.history],
    )


def _entry(key: EntryKey, runs: list[Run], tolerance: Tolerance, calib: float | None) -> ReferenceEntry:
    """The entry pinning ``runs`` (one configuration; they must agree on everything but the seed)."""
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
        ("data", {str(sorted(r.record.data_fingerprint.items())) for r in runs if r.record.data_fingerprint}),
    ):
        if len(values) > 1:
            raise ClbenchError(f"{key.label()}: runs disagree on {what} ({', '.join(map(str, sorted(values)))})")
    s = [r.summary(key.protocol) for r in runs]
    first = runs[0].record
    return ReferenceEntry(
        bench=key.bench,
        task_sizes=list(key.task_sizes),
        class_order_seed=key.class_order_seed,
        strategy=key.strategy,
        profile=key.profile,
        backbone=key.backbone,
        img_size=key.img_size,
        protocol=key.protocol,
        precision=first.precision,
        weights=weights_identity(runs[0]),
        seeds=sorted(r.seed for r in runs),
        runs=[r.run_id for r in runs],
        accuracy_matrix=[[round(v, 4) for v in row] for row in mean_matrix(runs, key.protocol)],
        last_acc=round(mean([float(x.last_acc) for x in s]), 4),
        avg_acc=round(mean([float(x.avg_acc) for x in s]), 4),
        tolerance=PinnedTolerance.of(tolerance),
        params=ParamPins(
            added_total=first.params.added_total,
            stored_total=first.params.stored_total,
            trainable=first.params.trainable,
        ),
        time=None
        if calib is None
        else PhaseTimes(
            **{ph: round(mean([getattr(r.record.time_s, ph) for r in runs]) / calib, 4) for ph in TIME_PHASES}
        ),
        strategy_config=first.settings,
        data=next((dict(r.record.data_fingerprint) for r in runs if r.record.data_fingerprint), None),
        metrics=stored_metrics(runs, key.protocol),
        training=stored_training(runs),
    )


def _mean_value(values: list[Any]) -> Any:
    """The mean over runs of one stored metric: a number, an element-wise mean of lists (NaN and missing as null),
    or None where a run lacks it or the runs' lists differ in length."""
    import math

    if any(v is None for v in values):
        return None
    if all(isinstance(v, list) for v in values):
        if len({len(v) for v in values}) != 1:
            return None
        cols = list(zip(*values, strict=True))
        return [
            None if any(x is None or math.isnan(float(x)) for x in col) else round(mean([float(x) for x in col]), 4)
            for col in cols
        ]
    nums = [float(v) for v in values]
    return None if any(math.isnan(x) for x in nums) else round(mean(nums), 4)


def stored_metrics(runs: Sequence[Run], protocol: str) -> dict[str, Any]:
    """Every metric of :data:`clbench.gate.reference.STORED_METRICS` the runs' records hold for ``protocol``,
    mean over the runs (what a reference entry pins beside the accuracy matrix)."""
    s = [r.summary(protocol) for r in runs]
    return {m: _mean_value([getattr(x, m) for x in s]) for m in STORED_METRICS}


def stored_training(runs: Sequence[Run]) -> list[list[dict[str, float | None]]] | None:
    """Per task, per optimiser it stepped: :data:`TRAINING_PINS` of the records' training diagnostics, mean over the
    runs; None where a run has no diagnostics or the runs stepped different numbers of optimisers."""
    per_run = []
    for r in runs:
        tasks = [(t.diagnostics or {}).get("training") for t in r.record.per_task]
        if any(t is None and r.record.per_task[i].trained_change is not None for i, t in enumerate(tasks)):
            return None
        per_run.append([t or [] for t in tasks])
    if not per_run or len({tuple(len(t) for t in run) for run in per_run}) != 1:
        return None
    return [
        [
            {k: _mean_value([run[i][j].get(k) for run in per_run]) for k in TRAINING_PINS}
            for j in range(len(per_run[0][i]))
        ]
        for i in range(len(per_run[0]))
    ]


def _training_rows(entry: ReferenceEntry, runs: list[Run], label: str, rewrite: str) -> list[CheckRow]:
    """The entry's pinned training diagnostics against the runs' mean: each loss and parameter change within
    :data:`TRAINING_REL_TOLERANCE` of its pinned value (relative), the same optimisers in each task. One row per
    entry, naming the worst."""
    if entry.training is None:
        return []
    got = stored_training(runs)
    shown_tol = f"± {TRAINING_REL_TOLERANCE:.0%} each"
    if got is None or [len(t) for t in got] != [len(t) for t in entry.training]:
        steps = "none recorded" if got is None else f"{[len(t) for t in got]} optimisers per task"
        why = (
            f"the runs stepped other optimisers than the pinned {[len(t) for t in entry.training]} per task "
            f"({steps}): what the method trains changed; {rewrite}"
        )
        return [CheckRow(label, "training", "pinned", steps, shown_tol, CHANGED, why)]
    worst, where = 0.0, ""
    for i, (want_task, got_task) in enumerate(zip(entry.training, got, strict=True)):
        for j, (want, have) in enumerate(zip(want_task, got_task, strict=True)):
            for k in TRAINING_PINS:
                w, h = want.get(k), have.get(k)
                if w is None and h is None:
                    continue
                rel = math.inf if w is None or h is None else abs(h - w) / max(abs(w), 1e-12)
                if rel > worst:
                    worst, where = rel, f"task {i + 1} optimiser {j + 1} {k}: pinned {_short(w)}, now {_short(h)}"
    moved = worst > TRAINING_REL_TOLERANCE
    why = f"training moved beyond {TRAINING_REL_TOLERANCE:.0%} ({where}): what the method learns changed; {rewrite}"
    shown = f"max rel |Δ| {worst:.2g}" + (f" ({where})" if moved else "")
    return [
        CheckRow(
            label, "training", "losses, param change", shown, shown_tol, CHANGED if moved else OK, why if moved else ""
        )
    ]


def _metric_tolerance(entry: ReferenceEntry, metric: str) -> float:
    """Points a stored metric may move: what the entry's accuracy tolerances allow it (a curve entry or ECE moves
    with the matrix, forgetting and BWT are differences of two matrix entries, an interval endpoint moves with its
    accuracy)."""
    rule = BY_NAME[metric].gate
    if rule is None:  # a reference file's metrics are checked against STORED_METRICS when read: never here
        raise ValueError(f"the gate pins no metric {metric!r}")
    return rule.allowed(entry.tolerance)


def _metric_rows(entry: ReferenceEntry, runs: list[Run], label: str, rewrite: str) -> list[CheckRow]:
    """Every stored metric the entry pins against the runs' mean; moved beyond its tolerance either way (or present
    on one side only) is a change: a metric's definition, or the run, changed."""
    if entry.metrics is None:
        return []
    got = stored_metrics(runs, entry.protocol)
    rows = []
    for metric, want in entry.metrics.items():
        have, tol = got.get(metric), _metric_tolerance(entry, metric)
        wants = want if isinstance(want, list) else [want]
        haves = have if isinstance(have, list) else [have]
        if want is None and have is None:
            continue
        shape_ok = isinstance(want, list) == isinstance(have, list) and len(wants) == len(haves)
        pairs = list(zip(wants, haves, strict=False)) if shape_ok else []
        bad = not shape_ok or any((w is None) != (h is None) for w, h in pairs)
        deltas = [h - w for w, h in pairs if w is not None and h is not None]
        worst = max(deltas, key=abs, default=0.0)
        moved = bad or abs(worst) > tol + EPS
        shown = "-" if have is None else f"max |Δ| {abs(worst):.2f}" if deltas else "null"
        why = (
            f"{metric} moved beyond what the accuracy tolerances allow (pinned {_short(want)}, now {_short(have)}): "
            f"its definition or the runs changed; {rewrite}"
            if moved
            else ""
        )
        rows.append(CheckRow(label, metric, _short(want), shown, f"± {tol:g}", CHANGED if moved else OK, why))
    return rows


def _short(value: Any) -> str:
    if isinstance(value, list):
        head = ", ".join("null" if v is None else f"{v:.2f}" for v in value[:6])
        return f"[{head}{', ...' if len(value) > 6 else ''}]"
    return "null" if value is None else f"{value:.2f}"


def _provenance(r: Run) -> RunProvenance:
    return RunProvenance(
        run_id=r.run_id,
        strategy=r.strategy,
        profile=r.record.profile,
        bench=r.bench_label,
        seed=r.seed,
        protocols=r.protocols,
        precision=r.record.precision,
        git_revision=r.record.git_revision,
        command=r.record.command,
        weights_digest=r.record.weights_digest,
        finished=r.record.finished,
        time_s=r.record.time_s.to_dict(),
        host=r.record.host,
    )


# ------------------------------------------------------------------------------------------- the check
def check(
    coll: Collection, ref: Reference, calibration: Sequence[Measurement] = (), reference_path: str = "REFERENCE"
) -> CheckResult:
    """Every rule of every reference entry against the runs of ``coll``; ``calibration``: this job's calibration
    measurements (``calibration.json`` beside the runs)."""
    rewrite = f"rewrite the reference on purpose: clbench check --write-reference {reference_path} RUNS --why TEXT"
    groups = group_runs(coll)
    rows, calib = _calibration_rows(ref, calibration, rewrite)
    for entry in ref.entries:
        rows += _entry_rows(entry, groups.get(entry.key, []), ref, calib, rewrite)
    rows += _unpinned_rows(groups, {e.key for e in ref.entries if e.strategy in _registered()}, rewrite)
    if ref.require_ci_profiles:
        rows += _ci_profile_rows({(e.strategy, e.profile) for e in ref.entries}, rewrite)
    rows += [
        CheckRow(
            s.path,
            "record readable",
            "-",
            "skipped",
            "-",
            FAIL,
            f"{s.reason}: the gate reads every record given; remove the folder or rerun it",
        )
        for s in coll.skipped
    ]
    return CheckResult(rows, [(s.path, s.reason) for s in coll.skipped])


def _registered() -> list[str]:
    return STRATEGIES.names()


def _calibration_rows(
    ref: Reference, calibration: Sequence[Measurement], rewrite: str
) -> tuple[list[CheckRow], float | None]:
    """Whether this job's calibration can divide the runs' times (the rows saying why not), and its seconds."""
    if not any(e.time for e in ref.entries):
        return [], None
    want = ref.time.workload
    if not calibration:
        fix = (
            f"no {CALIBRATION_FILE} among the run folders given: run `clbench check --calibrate RUN_DIR` in the same "
            "job as the runs (see .ci/run)"
        )
        return [CheckRow("calibration", "calibration present", want or "-", "none", "-", MISSING, fix)], None
    got = {m.workload for m in calibration}
    if got != {want}:
        fix = f"the calibration workload differs from the reference's: times are not comparable; {rewrite}"
        return [
            CheckRow("calibration", "calibration workload", str(want), ", ".join(sorted(got)), "same", FAIL, fix)
        ], None
    threads = {m.torch_threads for m in calibration}
    ref_threads = ref.time.torch_threads
    rows = []
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
    return rows, calibration_seconds(calibration)


def _entry_rows(
    entry: ReferenceEntry, runs: list[Run], ref: Reference, calib: float | None, rewrite: str
) -> list[CheckRow]:
    """The rows of one entry: its runs present and comparable (strategy, precision, weights), then accuracy,
    parameter counts, times, seeds and settings."""
    key, label = entry.key, entry.key.label()
    if key.strategy not in STRATEGIES.names():
        why = (
            f"the reference pins strategy {key.strategy!r}, which this clbench does not register "
            f"(registered: {', '.join(STRATEGIES.names())}); {rewrite}"
        )
        return [CheckRow(label, "strategy known", key.strategy, "unknown", "-", FAIL, why)]
    if not runs:
        why = (
            "no complete run of this strategy, profile, split, backbone and protocol was given: "
            f"`{key.run_command()} --precision {entry.precision}` (see .ci/run)"
        )
        return [CheckRow(label, "run present", f"seeds {entry.seeds}", "no matching run", "-", MISSING, why)]
    precisions = sorted({r.record.precision for r in runs})
    if precisions != [entry.precision]:  # numbers at another precision are not comparable: no further rows
        why = (
            f"runs at {', '.join(precisions)}, reference at {entry.precision}: rerun with "
            f"--precision {entry.precision}, or write a reference at that precision"
        )
        return [CheckRow(label, "precision", entry.precision, ", ".join(precisions), "same", FAIL, why)]
    got_w = sorted({weights_identity(r) for r in runs})
    if got_w != [entry.weights]:
        shown = ", ".join(w[:12] for w in got_w)
        why = (
            f"backbone weights digest {shown} differs from the reference's {entry.weights[:12]}: run with the "
            f"reference's weights (`clbench weights`), or {rewrite}"
        )
        return [CheckRow(label, "backbone weights", entry.weights[:12], shown, "same digest", FAIL, why)]
    other_data = _data_differences(entry, runs)
    if other_data:  # numbers of other images are not comparable: no further rows
        why = f"{'; '.join(other_data)}: run on the data the reference was written from, or {rewrite}"
        return [CheckRow(label, "data", "the reference's", "other data", "same digests", FAIL, why)]
    return [
        *_accuracy_rows(entry, runs, label, rewrite),
        *_metric_rows(entry, runs, label, rewrite),
        *_training_rows(entry, runs, label, rewrite),
        *_param_rows(entry, runs, label),
        *(_time_rows(entry, runs, label, ref, calib) if entry.time and calib is not None else []),
        *_seed_rows(entry, runs, label),
        *_settings_rows(entry, runs, label, rewrite),
    ]


def _data_differences(entry: ReferenceEntry, runs: list[Run]) -> list[str]:
    """Where a run's train or test data digest differs from the entry's (either side unknown: no difference)."""
    out = []
    for r in runs:
        got = r.record.data_fingerprint or {}
        for split, want in sorted((entry.data or {}).items()):
            if got.get(split) and got[split] != want:
                out.append(f"run {r.run_id}: {split} data digest {got[split]}, the reference's {want}")
    return out


def _accuracy_rows(entry: ReferenceEntry, runs: list[Run], label: str, rewrite: str) -> list[CheckRow]:
    s = [r.summary(entry.protocol) for r in runs]
    tol = entry.tolerance
    return [
        _matrix_row(label, entry.accuracy_matrix, mean_matrix(runs, entry.protocol), tol.matrix, rewrite),
        *(
            _two_sided(
                label,
                name,
                float(getattr(entry, metric)),
                mean([float(getattr(x, metric)) for x in s]),
                float(getattr(tol, metric)),
                rewrite,
            )
            for metric, name in (("last_acc", "final acc %"), ("avg_acc", "avg inc acc %"))
        ),
    ]


def _param_rows(entry: ReferenceEntry, runs: list[Run], label: str) -> list[CheckRow]:
    """Exact counts; a reference written before stored statistics were counted apart pins no ``stored_total``."""
    rows = []
    for name, want in entry.params.pinned().items():
        got = sorted({int(getattr(r.record.params, name)) for r in runs})
        status = OK if got == [want] else FAIL
        rows.append(
            CheckRow(label, f"params {name}", f"{want:,}", ", ".join(f"{v:,}" for v in got), f"= {want:,}", status)
        )
    return rows


def _time_rows(entry: ReferenceEntry, runs: list[Run], label: str, ref: Reference, calib: float) -> list[CheckRow]:
    """Per phase: seconds / calibration seconds at most the reference's ratio x slack + floor; faster is a note."""
    rows = []
    slack, floor = float(ref.time.slack), float(ref.time.floor)
    for ph in TIME_PHASES:
        want = float(getattr(entry.time, ph))
        got = mean([float(getattr(r.record.time_s, ph)) for r in runs]) / calib
        limit = want * slack + floor
        if got > limit + EPS:
            ratio = got / want if want > 0 else math.inf
            detail, status = f"{ph} took {ratio:.1f}x the reference's share of the calibration workload", FAIL
        else:
            faster = got > 0 and got * slack + floor < want
            detail, status = (f"{ph} is {want / got:.1f}x faster than the reference" if faster else ""), OK
        rows.append(
            CheckRow(label, f"{ph} time / calibration", f"{want:.2f}", f"{got:.2f}", f"<= {limit:.2f}", status, detail)
        )
        if status == OK and detail:
            note = detail + ": consider rewriting the reference"
            rows.append(CheckRow(label, f"{ph} time faster", f"{want:.2f}", f"{got:.2f}", "-", NOTE, note))
    return rows


def _seed_rows(entry: ReferenceEntry, runs: list[Run], label: str) -> list[CheckRow]:
    seeds = sorted(r.seed for r in runs)
    if seeds == sorted(entry.seeds):
        return []
    why = "means over other seeds than the reference's are not comparable: run its seeds"
    return [CheckRow(label, "seeds", str(entry.seeds), str(seeds), "same", FAIL, why)]


def _settings_rows(entry: ReferenceEntry, runs: list[Run], label: str, rewrite: str) -> list[CheckRow]:
    if entry.strategy_config is None:
        return []
    diff = sorted(
        {k for r in runs for k in settings_differences(r.record.strategy, entry.strategy_config, r.record.settings)}
    )
    if not diff:
        return []
    why = (
        f"the runs' {entry.strategy} settings differ from the reference's ({', '.join(diff)}): "
        f"run the reference's profile, or {rewrite}"
    )
    return [CheckRow(label, "settings", "reference's", "differ: " + ", ".join(diff), "same", FAIL, why)]


def _unpinned_rows(groups: dict[EntryKey, list[Run]], pinned: set[EntryKey], rewrite: str) -> list[CheckRow]:
    """A run the reference does not pin fails: nothing passes by being left out of the reference."""
    why = f"the reference does not pin this run: {rewrite}, or leave the run out"
    return [
        CheckRow(key.label(), "pinned", "-", ", ".join(r.run_id for r in groups[key]), "-", FAIL, why)
        for key in sorted(set(groups) - pinned, key=lambda k: k.label())
    ]


def _ci_profile_rows(pinned: set[tuple[str, str | None]], rewrite: str) -> list[CheckRow]:
    """Every registered strategy has a ``ci`` profile and the reference pins each of them."""
    rows = []
    for strategy, profiles in _registered_ci_profiles().items():
        if not profiles:
            why = (
                f"strategy {strategy} is registered but has no `ci` profile: add one to its `profiles`, run it in "
                f".ci/run and {rewrite}"
            )
            rows.append(CheckRow(strategy, "ci profile", "-", "none", "-", FAIL, why))
        for p in profiles:
            if (strategy, p) not in pinned:
                why = (
                    f"registered profile {strategy}:{p} is not pinned: run `clbench run --strategy {strategy} "
                    f"--profile {p} --precision fp32` in .ci/run and {rewrite}"
                )
                rows.append(CheckRow(f"{strategy}:{p}", "pinned", "-", "not in the reference", "-", FAIL, why))
    return rows
