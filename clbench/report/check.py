"""The CI regression gate: compare runs with a reference file written from real runs.

Reference file (JSON, written by :func:`write_reference`, never by hand)::

    {
      "format": "clbench-reference/1",
      "description": "what these runs are for",
      "created": "2026-11-30T06:00:00+00:00",
      "written_by": "clbench check --write-reference reports/reference.json runs/ci",
      "produced_by": [{"run_id", "strategy", "bench", "seed", "protocols", "git_revision", "command",
                       "weights_digest", "finished"}, ...],
      "tolerance_points": 1.0,            # final / average accuracy may fall short by at most this (points)
      "time_ratio_slack": 1.5,            # a time ratio may grow by at most this factor
      "time_reference_strategy": "simplecil",
      "time_measure": "total-features",   # seconds compared: run total minus frozen-feature extraction
      "entries": [{
        "bench": "emoji", "task_sizes": [6, 6, 6, 6, 6, 6], "class_order_seed": 1993,
        "strategy": "tosca", "profile": null, "backbone": "vit_micro", "img_size": 32, "protocol": "per-sample",
        "weights": "random init" | "<sha256 of the backbone state>",
        "seeds": [1993], "runs": ["tosca-s1993"],
        "last_acc": 13.38, "avg_acc": 22.12,                 # means over the runs, percent
        "params": {"added_total": 7320, "trainable": 3525},  # compared exactly
        "time_ratio": 10.47,   # time_measure of these runs / that of the reference strategy on the same bench
        "strategy_config": {...}                             # shown when a run's settings differ
      }, ...]
    }

Rules: an entry holds when the matching runs' mean final and average accuracy are at least the reference minus
``tolerance_points`` (better is fine and reported), their parameter counts equal the reference exactly, a
pretrained backbone has the same weights digest, and their time ratio is at most the reference ratio times
``time_ratio_slack``. Wall-clock is always a ratio to the reference strategy measured in the same invocation (the
runs given), so it holds on slow or busy machines. An entry without matching runs fails as missing.

Why ``total-features``: frozen features are cached on disk across runs and strategies, so which run pays for their
extraction depends on the order runs happen in; everything else a run does is its own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from clbench.errors import ClbenchError
from clbench.io import atomic_write_json
from clbench.report.collect import DEFAULT_CLASS_ORDER_SEED, Collection, Run, config_digest

REFERENCE_FORMAT = "clbench-reference/1"
DEFAULT_TOLERANCE = 1.0  # points: above seed-to-seed noise of one run on the CI benchmark, below a real regression
DEFAULT_TIME_SLACK = 1.5  # a method may become at most 50% slower relative to the reference strategy
DEFAULT_TIME_REFERENCE = "simplecil"  # no training: its time is setup + one pass, a yardstick of machine speed
TIME_MEASURES = {
    "total-features": lambda t: t["total"] - t["features"],
    "total": lambda t: t["total"],
    "train+eval": lambda t: t["train"] + t["eval"],
}
DEFAULT_TIME_MEASURE = "total-features"
EPS = 1e-9  # float slack on exact-boundary comparisons

OK, BETTER, FAIL, MISSING, NOTE = "ok", "better", "FAIL", "missing", "note"
FAILING = {FAIL, MISSING}


class EntryKey(NamedTuple):
    """What a reference entry matches: everything that defines a row except the seed."""

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
        return f"{self.bench} | {self.strategy}{profile} | {self.backbone} | {self.protocol}"


class BenchKey(NamedTuple):
    """Runs whose times are comparable: one benchmark split on one backbone."""

    bench: str
    task_sizes: tuple[int, ...]
    class_order_seed: int
    backbone: str
    img_size: int | None


def entry_key(run: Run, protocol: str) -> EntryKey:
    r = run.record
    return EntryKey(str(r["bench"]), tuple(run.task_sizes), int(r.get("class_order_seed", DEFAULT_CLASS_ORDER_SEED)),
                    run.strategy, r.get("profile"), str(r["backbone"]), r.get("img_size"), protocol)


def _entry_key(entry: dict[str, Any]) -> EntryKey:
    try:
        return EntryKey(str(entry["bench"]), tuple(int(n) for n in entry["task_sizes"]),
                        int(entry.get("class_order_seed", DEFAULT_CLASS_ORDER_SEED)), str(entry["strategy"]),
                        entry.get("profile"), str(entry["backbone"]), entry.get("img_size"), str(entry["protocol"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ClbenchError(f"reference entry {entry!r:.120} lacks or mistypes a field ({e})") from None


def bench_key(key: EntryKey) -> BenchKey:
    return BenchKey(key.bench, key.task_sizes, key.class_order_seed, key.backbone, key.img_size)


def weights_identity(run: Run) -> str:
    """``random init`` (the init follows the seed) or the full weights digest."""
    return "random init" if run.weights_label == "random init" else str(run.record.get("weights_digest"))


def group_runs(coll: Collection) -> dict[EntryKey, list[Run]]:
    groups: dict[EntryKey, list[Run]] = defaultdict(list)
    for run in coll.runs:
        for p in run.protocols:
            groups[entry_key(run, p)].append(run)
    return dict(groups)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def run_seconds(run: Run, measure: str) -> float:
    return float(TIME_MEASURES[measure](run.record["time_s"]))


def yardsticks(coll: Collection, strategy: str, measure: str) -> dict[BenchKey, float]:
    """Mean seconds of the time-reference strategy's runs per benchmark split and backbone."""
    times: dict[BenchKey, list[float]] = defaultdict(list)
    for run in coll.runs:
        if run.strategy == strategy:
            times[bench_key(entry_key(run, run.protocols[0]))].append(run_seconds(run, measure))
    return {k: _mean(v) for k, v in times.items()}


def time_ratio(runs: Sequence[Run], key: EntryKey, sticks: dict[BenchKey, float], measure: str) -> float | None:
    stick = sticks.get(bench_key(key))
    if not stick or stick <= 0:
        return None
    return _mean([run_seconds(r, measure) for r in runs]) / stick


# ------------------------------------------------------------------------------------------- writing
def make_reference(coll: Collection, *, description: str = "", tolerance: float = DEFAULT_TOLERANCE,
                   time_slack: float = DEFAULT_TIME_SLACK, time_reference: str = DEFAULT_TIME_REFERENCE,
                   time_measure: str = DEFAULT_TIME_MEASURE, written_by: str | None = None) -> dict[str, Any]:
    """A reference from complete runs: one entry per (benchmark split, strategy, backbone, protocol)."""
    if not coll.runs:
        raise ClbenchError("no complete run record to make a reference from",
                           "; ".join(f"{s.path}: {s.reason}" for s in coll.skipped) or None)
    if time_measure not in TIME_MEASURES:
        raise ClbenchError(f"time measure {time_measure!r} is unknown; valid: {', '.join(TIME_MEASURES)}")
    if tolerance < 0 or time_slack < 1:
        raise ClbenchError(f"tolerance must be >= 0 and time slack >= 1 (got {tolerance}, {time_slack})")
    sticks = yardsticks(coll, time_reference, time_measure)
    entries = []
    for key, runs in sorted(group_runs(coll).items(), key=lambda kv: kv[0].label()):
        configs = {config_digest(r.record) for r in runs}
        if len(configs) > 1:
            raise ClbenchError(f"{key.label()}: the runs {', '.join(r.run_id for r in runs)} use different "
                               f"{key.strategy} settings; a reference entry needs one configuration",
                               "give runs of one configuration per strategy, or use --profile to tell them apart")
        for field in ("added_total", "trainable"):
            values = {int(r.record["params"][field]) for r in runs}
            if len(values) > 1:
                raise ClbenchError(f"{key.label()}: runs disagree on params.{field} ({sorted(values)})")
        weights = {weights_identity(r) for r in runs}
        if len(weights) > 1:
            raise ClbenchError(f"{key.label()}: runs used different backbone weights ({', '.join(sorted(weights))})")
        s = [r.summary(key.protocol) for r in runs]
        ratio = time_ratio(runs, key, sticks, time_measure)
        entries.append({
            "bench": key.bench, "task_sizes": list(key.task_sizes), "class_order_seed": key.class_order_seed,
            "strategy": key.strategy, "profile": key.profile, "backbone": key.backbone, "img_size": key.img_size,
            "protocol": key.protocol, "weights": weights.pop(),
            "seeds": sorted(r.seed for r in runs), "runs": [r.run_id for r in runs],
            "last_acc": round(_mean([x["last_acc"] for x in s]), 4),
            "avg_acc": round(_mean([x["avg_acc"] for x in s]), 4),
            "params": {f: int(runs[0].record["params"][f]) for f in ("added_total", "trainable")},
            "time_ratio": None if ratio is None else round(ratio, 4),
            "strategy_config": runs[0].record.get("strategy_config", {}),
        })
    return {
        "format": REFERENCE_FORMAT,
        "description": description,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "written_by": written_by,
        "produced_by": [{
            "run_id": r.run_id, "strategy": r.variant, "bench": r.bench_label, "seed": r.seed,
            "protocols": r.protocols, "git_revision": r.record.get("git_revision"), "command": r.record.get("command"),
            "weights_digest": r.record.get("weights_digest"), "finished": r.record.get("finished"),
        } for r in coll.runs],
        "skipped": [{"path": s.path, "reason": s.reason} for s in coll.skipped],
        "tolerance_points": tolerance,
        "time_ratio_slack": time_slack,
        "time_reference_strategy": time_reference,
        "time_measure": time_measure,
        "entries": entries,
    }


def write_reference(path: Path, reference: dict[str, Any]) -> None:
    atomic_write_json(Path(path), reference)


def load_reference(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        ref = json.loads(path.read_text())
    except OSError as e:
        raise ClbenchError(f"--reference {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ClbenchError(f"--reference {path}: not valid JSON ({e})") from None
    if not isinstance(ref, dict) or ref.get("format") != REFERENCE_FORMAT:
        got = ref.get("format") if isinstance(ref, dict) else type(ref).__name__
        raise ClbenchError(f"--reference {path}: format {got!r}, expected {REFERENCE_FORMAT!r}",
                           "write references with `clbench check --write-reference FILE RUN_DIRS...`")
    for field in ("tolerance_points", "time_ratio_slack", "time_reference_strategy", "entries"):
        if field not in ref:
            raise ClbenchError(f"--reference {path}: lacks {field!r}")
    if ref.get("time_measure", DEFAULT_TIME_MEASURE) not in TIME_MEASURES:
        raise ClbenchError(f"--reference {path}: unknown time_measure {ref['time_measure']!r}")
    return ref


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


def check(coll: Collection, ref: dict[str, Any]) -> CheckResult:
    """Every rule of every reference entry against the runs of ``coll``."""
    tol = float(ref["tolerance_points"])
    slack = float(ref["time_ratio_slack"])
    measure = ref.get("time_measure", DEFAULT_TIME_MEASURE)
    time_ref = str(ref["time_reference_strategy"])
    groups = group_runs(coll)
    sticks = yardsticks(coll, time_ref, measure)
    rows: list[CheckRow] = []
    matched: set[EntryKey] = set()
    for entry in ref["entries"]:
        key = _entry_key(entry)
        label = key.label()
        runs = groups.get(key, [])
        if not runs:
            rows.append(CheckRow(label, "run present", f"seeds {entry.get('seeds')}", "no matching run", "-", MISSING,
                                 "no complete run of this strategy, benchmark, backbone and protocol was given"))
            continue
        matched.add(key)
        s = [r.summary(key.protocol) for r in runs]
        seeds = sorted(r.seed for r in runs)
        for metric, name in (("last_acc", "final acc %"), ("avg_acc", "avg inc acc %")):
            want, got = float(entry[metric]), _mean([float(x[metric]) for x in s])
            status = FAIL if got < want - tol - EPS else BETTER if got > want + tol + EPS else OK
            rows.append(CheckRow(label, name, f"{want:.2f}", f"{got:.2f} ({got - want:+.2f})", f">= {want - tol:.2f}",
                                 status))
        for field in ("added_total", "trainable"):
            want_p = int(entry["params"][field])
            got_p = sorted({int(r.record["params"][field]) for r in runs})
            rows.append(CheckRow(label, f"params {field}", f"{want_p:,}", ", ".join(f"{v:,}" for v in got_p),
                                 f"= {want_p:,}", OK if got_p == [want_p] else FAIL))
        want_w = entry.get("weights")
        if want_w and want_w != "random init":
            got_w = sorted({weights_identity(r) for r in runs})
            rows.append(CheckRow(label, "backbone weights", str(want_w)[:12], ", ".join(w[:12] for w in got_w),
                                 "same digest", OK if got_w == [want_w] else FAIL))
        want_t = entry.get("time_ratio")
        if key.strategy == time_ref:
            pass  # the yardstick itself: its ratio is 1 by definition
        elif want_t is None:
            rows.append(CheckRow(label, f"time ratio to {time_ref}", "not recorded", "-", "-", NOTE))
        else:
            got_t = time_ratio(runs, key, sticks, measure)
            limit = float(want_t) * slack
            if got_t is None:
                rows.append(CheckRow(label, f"time ratio to {time_ref}", f"{want_t:.2f}", "cannot measure",
                                     f"<= {limit:.2f}", FAIL,
                                     f"no {time_ref} run on {key.bench} with {key.backbone} among the runs given"))
            else:
                rows.append(CheckRow(label, f"time ratio to {time_ref}", f"{want_t:.2f}", f"{got_t:.2f}",
                                     f"<= {limit:.2f}", FAIL if got_t > limit + EPS else OK))
        if seeds != sorted(entry.get("seeds", seeds)):
            rows.append(CheckRow(label, "seeds", str(entry.get("seeds")), str(seeds), "-", NOTE,
                                 "means over other seeds than the reference's"))
        cfg = entry.get("strategy_config")
        if cfg is not None and any(r.record.get("strategy_config", {}) != cfg for r in runs):
            diff = sorted(k for k in set(cfg) | set(runs[0].record.get("strategy_config", {}))
                          if cfg.get(k) != runs[0].record.get("strategy_config", {}).get(k))
            rows.append(CheckRow(label, "settings", "reference's", "differ: " + ", ".join(diff), "-", NOTE))
    for key in sorted(set(groups) - matched, key=lambda k: k.label()):
        rows.append(CheckRow(key.label(), "in reference", "-", ", ".join(r.run_id for r in groups[key]), "-", NOTE,
                             "not in the reference file; not checked"))
    return CheckResult(rows, [(s.path, s.reason) for s in coll.skipped])


STATUS_STYLE = {OK: "green", BETTER: "bold green", FAIL: "bold red", MISSING: "bold red", NOTE: "yellow"}
COLUMNS = (("final acc %", ("final acc %",)), ("avg inc acc %", ("avg inc acc %",)),
           ("params added / trainable", ("params added_total", "params trainable")), ("time ratio", ("time ratio",)),
           ("weights", ("backbone weights",)))


def _cell(rows: list[CheckRow]) -> str:
    if not rows:
        return "-"
    parts = []
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        text = r.measured if r.status in (OK, BETTER) else f"{r.measured}; needs {r.allowed}"
        parts.append(f"[{style}]{text}[/]")
    return " / ".join(parts)


def print_check(result: CheckResult, reference_path: str, console=None) -> None:
    """One row per reference entry (green: holds, bold green: better, red: fell short), then what fell short."""
    import sys

    from rich.console import Console
    from rich.table import Table

    if console is None:  # CI logs are not terminals: do not squeeze the table into 80 columns there
        console = Console() if sys.stdout.isatty() else Console(width=160)
    by_entry: dict[str, list[CheckRow]] = {}
    for r in result.rows:
        by_entry.setdefault(r.entry, []).append(r)
    table = Table(title=f"clbench check against {reference_path}")
    table.add_column("benchmark | strategy | backbone | protocol")
    for name, _ in COLUMNS:
        table.add_column(name, justify="right")
    table.add_column("result")
    notes = []
    for entry, rows in by_entry.items():
        statuses = {r.status for r in rows}
        verdict = MISSING if MISSING in statuses else FAIL if FAIL in statuses else BETTER if BETTER in statuses \
            else NOTE if statuses == {NOTE} else OK
        if verdict == MISSING:
            cells = ["[bold red]no matching run[/]"] + ["-"] * (len(COLUMNS) - 1)
        else:
            cells = [_cell([r for r in rows if r.check.startswith(checks)]) for _, checks in COLUMNS]
        if statuses == {NOTE}:
            verdict = "not in reference"
        table.add_row(entry, *cells, f"[{STATUS_STYLE.get(verdict, 'yellow')}]{verdict}[/]")
        notes += [r for r in rows if r.status == NOTE]
    console.print(table)
    for r in notes:
        console.print(f"[yellow]note[/] {r.entry}: {r.check}: {r.measured}" + (f" ({r.detail})" if r.detail else ""))
    for path, reason in result.skipped:
        console.print(f"[yellow]skipped[/] {path}: {reason}")
    improved = [r for r in result.rows if r.status == BETTER]
    if improved:
        console.print(f"[green]{len(improved)} result(s) beat the reference by more than the tolerance[/]: consider "
                      f"writing a new reference from these runs")
    fails = result.failures
    if fails:
        console.print(f"[bold red]check failed[/]: {len(fails)} of {len(result.rows)} checks fell short:")
        for r in fails:
            console.print(f"  {r.entry}: {r.check}: measured {r.measured}, allowed {r.allowed}"
                          + (f" ({r.detail})" if r.detail else ""))
    else:
        console.print(f"[bold green]check passed[/]: {len(result.rows)} checks hold")
