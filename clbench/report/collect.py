"""Find run folders, load their complete records, and say why the others cannot be used.

A path given by the user is a run folder (it holds ``result.json``), a record file, or a parent folder whose run
folders lie up to two levels below. Every folder that cannot be used (no record, ``complete: false``, another schema,
unreadable JSON, missing fields) becomes a :class:`Skipped` entry with the reason; it is never averaged in.

Grouping keys keep apart what must not be averaged together: benchmark and split, backbone (name, input size and
weights), strategy configuration and evaluation protocol are all part of a row's key, and so is the data where runs
of one benchmark were made on different data (their records' ``data_fingerprint``); only seeds are averaged.
Two records of one row with the same seed (and class order) are repeats, not two seeds: a row counts a seed once,
from the record that keeps per-image predictions (then the newest); the repeat stays in the list of runs and the
report's notes name it (:attr:`Run.repeat_of`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from clbench.core.catalog import card
from clbench.core.config import make_strategy_config, run_level
from clbench.errors import ClbenchError
from clbench.evaluation import metrics
from clbench.records.predictions import read
from clbench.records.results import load_record
from clbench.records.routing_diagnostics import RoutingDiagnostics, read_routing
from clbench.records.schema import DEFAULT_CLASS_ORDER_SEED, RESULT_FILE, ProtocolSummary, RunRecord

SEARCH_DEPTH = 2  # a parent folder is searched for run folders this many levels down
RUN_MARKERS = (".lock", "features.npz")  # files the harness writes in a run folder before its first record


DOMAINS_SEEN = "number of domains seen"  # the x axis of a domain-incremental run's curves


@dataclass(frozen=True)
class Skipped:
    """A path that holds no usable record, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Run:
    """One complete run record. ``run_id`` is unique within its collection; ``variant`` names the strategy
    configuration (the strategy name, plus the profile and a config digest when runs of one strategy differ)."""

    path: Path  # the run folder
    record: RunRecord
    run_id: str
    variant: str
    pool_class_orders: bool = False  # rows average runs of different class orders (a sweep with --vary both)
    repeat_of: str | None = None  # the run whose seed this one repeats (the rows use that one; module docstring)
    data_tag: str = ""  # " data 1a2b3c4d" where runs of its benchmark were made on other data (_data_tags)

    # --------------------------------------------------------------------------------------- record fields
    @property
    def strategy(self) -> str:
        return self.record.strategy

    @property
    def seed(self) -> int:
        return self.record.seed

    @property
    def task_sizes(self) -> list[int]:
        return list(self.record.task_sizes)

    @property
    def protocols(self) -> list[str]:
        """Evaluation protocols of this run, the main one (``record.protocol``) first."""
        return self.record.protocol_names

    def summary(self, protocol: str) -> ProtocolSummary:
        """Metrics of one protocol: ``accuracy_matrix``, ``acc_curve``, ``last_acc``, ``avg_acc``, ``forgetting``..."""
        return self.record.summary(protocol)

    def routing(self, task: int = -1) -> RoutingDiagnostics | None:
        """The routing diagnostics after ``task`` (default: the last), None where the strategy records none; a
        mistyped one is a ClbenchError naming the run folder, the task and the field."""
        per_task = self.record.per_task
        if not per_task:
            return None
        return read_routing(per_task[task].diagnostics, f"{self.path}: per_task[{task % len(per_task)}].diagnostics")

    @property
    def classes_seen(self) -> list[int]:
        """Cumulative number of classes after each task (the x axis of accuracy curves)."""
        out, n = [], 0
        for size in self.task_sizes:
            n += size
            out.append(n)
        return out

    @property
    def seen_axis(self) -> tuple[list[int], str]:
        """The x axis of the curves after each task, with its label: the classes seen so far, or in the domain
        scenario (every task brings the same classes) the domains seen so far."""
        if (self.record.scenario or "class") == "domain":
            return list(range(1, len(self.task_sizes) + 1)), DOMAINS_SEEN
        return self.classes_seen, "number of classes seen"

    # --------------------------------------------------------------------------------------- labels
    @property
    def bench_label(self) -> str:
        scenario = self.record.scenario or "class"
        if self.pool_class_orders:
            label = bench_label(self.record.bench, self.record.task_sizes, scenario=scenario)
            label += self.data_tag + " (class orders pooled)"
        else:
            label = bench_label(self.record.bench, self.record.task_sizes, self.record.class_order_seed, scenario)
            label += self.data_tag
        return label + self.split_tag

    @property
    def split_tag(self) -> str:
        """`` validation 0.2`` for a run evaluated on held-out training images (``--validation``): never a row, a
        pairing or a repeat with test-split runs; empty for the test split."""
        if self.record.evaluated_on != "validation":
            return ""
        fraction = (self.record.validation or {}).get("fraction")
        return f" validation {fraction:g}" if isinstance(fraction, (int, float)) else " validation"

    @property
    def backbone_label(self) -> str:
        """Backbone, input size and precision: runs at another precision are another configuration (bf16 moves
        the frozen features), never averaged with fp32 ones."""
        img = self.record.img_size
        name = f"{self.record.backbone} {img}px" if img else self.record.backbone
        return f"{name} {self.record.precision}"

    @property
    def weights_label(self) -> str:
        """``random init`` for randomly initialised backbones (the init follows the seed, so seeds still average),
        else the short weights digest: two different pretrained weights are two backbones."""
        if (self.record.weights_source or "").startswith("random"):
            return "random init"
        return digest_short(self.record.weights_digest)

    @property
    def git_short(self) -> str:
        return git_short(self.record.git_revision)

    @property
    def time_protocols(self) -> str:
        """The protocols evaluated in the run (its eval time covers all of them)."""
        return "+".join(self.protocols)

    def has_features(self) -> bool:
        return (self.path / "features.npz").is_file()


class AccKey(NamedTuple):
    """What may be averaged over seeds for accuracy: everything but the seed."""

    bench: str
    backbone: str
    weights: str
    strategy: str  # the variant label
    protocol: str


class RunKey(NamedTuple):
    """What may be averaged over seeds for cost (time, memory, parameters): the run's configuration."""

    bench: str
    backbone: str
    weights: str
    strategy: str
    protocols: str  # "+"-joined: eval time covers every protocol evaluated


def acc_key(run: Run, protocol: str) -> AccKey:
    return AccKey(run.bench_label, run.backbone_label, run.weights_label, run.variant, protocol)


def run_key(run: Run) -> RunKey:
    return RunKey(run.bench_label, run.backbone_label, run.weights_label, run.variant, run.time_protocols)


@dataclass
class Collection:
    runs: list[Run] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings shown in reports (e.g. changed metric definitions)

    def acc_groups(self) -> dict[AccKey, list[Run]]:
        """Runs per accuracy row, in display order (benchmark, backbone, strategy, protocol)."""
        groups: dict[AccKey, list[Run]] = defaultdict(list)
        for run in self.seeded():
            for p in run.protocols:
                groups[acc_key(run, p)].append(run)
        return {k: groups[k] for k in sorted(groups, key=_acc_sort_key)}

    def run_groups(self) -> dict[RunKey, list[Run]]:
        groups: dict[RunKey, list[Run]] = defaultdict(list)
        for run in self.seeded():
            groups[run_key(run)].append(run)
        return {k: groups[k] for k in sorted(groups)}

    def seeded(self) -> list[Run]:
        """The runs rows average: every run but the repeats of a seed (module docstring)."""
        return [r for r in self.runs if r.repeat_of is None]

    def benches(self) -> list[str]:
        return sorted({r.bench_label for r in self.runs})

    def select(self, bench: str) -> Collection:
        """The runs on benchmark ``bench`` (its name, or a label such as ``emoji B6 Inc6``)."""
        runs = [r for r in self.runs if bench in (r.record.bench, r.bench_label)]
        return Collection(runs, list(self.skipped), list(self.notes))


def _acc_sort_key(key: AccKey) -> tuple[str, str, str, str, int, str]:
    protocol_rank = {"per-sample": 0, "reference": 1}.get(key.protocol, 2)
    return (key.bench, key.backbone, key.weights, key.strategy, protocol_rank, key.protocol)


# ------------------------------------------------------------------------------------------- labels
def bench_label(
    bench: str, task_sizes: list[int], class_order_seed: int = DEFAULT_CLASS_ORDER_SEED, scenario: str = "class"
) -> str:
    """``emoji B6 Inc6``: the benchmark and its split (and class order when it is not the literature's). In the
    domain scenario every task brings every class in one more domain: ``emoji-domains 4 domains x 50 classes``
    (a class split such as "B0 Inc50" would misname it: ``clbench list`` shows the class-incremental split)."""
    sizes = [int(n) for n in task_sizes]
    label = bench
    if sizes and scenario == "domain":
        label += f" {len(sizes)} domains x {sizes[0]} classes"
    elif sizes:
        inc = sizes[1] if len(sizes) > 1 else sizes[0]
        label += f" B{sizes[0]} Inc{inc}" if sizes[0] != inc else f" B0 Inc{inc}"
        if len(sizes) > 2 and sizes[-1] != inc:
            label += f"+{sizes[-1]}"
    if class_order_seed != DEFAULT_CLASS_ORDER_SEED:
        label += f" order{class_order_seed}"
    return label


def digest_short(digest: str | None) -> str:
    return str(digest)[:12] if digest else "unknown"


def git_short(rev: str | None) -> str:
    base, _, dirty = (rev or "unknown").partition("+")
    return base[:12] + (f"+{dirty}" if dirty else "")


def config_digest(record: RunRecord) -> str:
    text = json.dumps(record.settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:6]


# ------------------------------------------------------------------------------------------- loading
def find_run_dirs(paths: list[str | Path]) -> tuple[list[Path], list[Skipped]]:
    """Record files (``.../result.json``) under ``paths``, and the run-like folders that have none."""
    found: list[Path] = []
    skipped: list[Skipped] = []
    for given in paths:
        p = Path(given)
        if not p.exists():
            raise ClbenchError(f"{p}: no such file or folder", "give run folders (holding result.json) or their parent")
        if p.is_file():
            found.append(p)
            continue
        if (p / RESULT_FILE).exists():
            found.append(p / RESULT_FILE)
            continue
        below = _search(p, SEARCH_DEPTH)
        if not below[0] and not below[1]:
            skipped.append(Skipped(str(p), f"no {RESULT_FILE} here or up to {SEARCH_DEPTH} levels below"))
        found.extend(below[0])
        skipped.extend(below[1])
    return found, skipped


def _search(folder: Path, depth: int) -> tuple[list[Path], list[Skipped]]:
    found: list[Path] = []
    skipped: list[Skipped] = []
    try:
        children = sorted(c for c in folder.iterdir() if c.is_dir() and not c.name.startswith("."))
    except OSError as e:
        return [], [Skipped(str(folder), f"cannot list the folder ({e.strerror or e})")]
    for child in children:
        if (child / RESULT_FILE).exists():
            found.append(child / RESULT_FILE)
        elif any((child / m).exists() for m in RUN_MARKERS):
            skipped.append(Skipped(str(child), f"no {RESULT_FILE} (the run stopped before its first task ended)"))
        elif depth > 1:
            sub = _search(child, depth - 1)
            found.extend(sub[0])
            skipped.extend(sub[1])
    return found, skipped


def _load(path: Path) -> RunRecord | str:
    """The complete record at ``path``, or the reason it cannot be used."""
    try:
        return load_record(path)
    except ClbenchError as e:
        reason = str(e.args[0])  # the message without its hint: one table cell
        return reason.split(": ", 1)[1] if reason.startswith(str(path)) else reason


def collect(paths: list[str | Path], pool_class_orders: bool = False) -> Collection:
    """Load every record under ``paths``. Raises ClbenchError for paths that do not exist and for a record that its
    predictions file contradicts (:func:`verify_predictions`: as a changed predictions file, it stops every command
    that reads records, the gate included). ``pool_class_orders``:
    runs of one benchmark and split but different class orders share rows (seeds that also set the class order)."""
    files, skipped = find_run_dirs(paths)
    loaded: list[tuple[Path, RunRecord]] = []
    seen: set[Path] = set()
    for f in files:
        key = f.resolve()
        if key in seen:
            continue
        seen.add(key)
        record = _load(f)
        if isinstance(record, str):
            skipped.append(Skipped(str(f.parent if f.name == RESULT_FILE else f), record))
        else:
            loaded.append((f.parent, record))

    ids = Counter(rec.run_id for _, rec in loaded)
    variants = _variant_labels([rec for _, rec in loaded])
    runs: list[Run] = []
    taken: set[str] = set()
    for folder, rec in loaded:
        rid = rec.run_id
        if ids[rid] > 1:  # two folders with one name: add the parent folder's name
            rid = f"{folder.parent.name}/{rid}"
        base, i = rid, 2
        while rid in taken:
            rid, i = f"{base}#{i}", i + 1
        taken.add(rid)
        runs.append(Run(folder, rec, rid, variants[id(rec)], pool_class_orders))
    verify_predictions(runs)
    runs = _data_tags(runs)
    runs.sort(key=lambda r: (r.bench_label, r.backbone_label, r.variant, r.seed, r.run_id))
    runs, notes = _mark_repeats(runs)

    notes += [f"{r.run_id}: {r.record.empty_resume}" for r in runs if r.record.empty_resume]
    changed = [r.run_id for r in runs if _redefined(r.record.metric_definitions, metrics.DEFINITIONS)]
    if changed:
        notes.append("metric definitions in these records differ from this clbench's: " + ", ".join(changed))
    return Collection(runs, sorted(skipped, key=lambda s: s.path), notes)


def data_identity(record: RunRecord) -> str | None:
    """A short digest of the train and test data a record names (``data_fingerprint``); None: unknown (a record
    written before clbench recorded it)."""
    fp = record.data_fingerprint
    if not fp:
        return None
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:8]


def _data_tags(runs: list[Run]) -> list[Run]:
    """Runs of a benchmark made on different data (two folder trees, two copies of a benchmark that differ) get
    their data's digest in the benchmark label, so that no row, pairing or repeat mixes them: ``folder B2 Inc2
    data 1a2b3c4d``. Where a benchmark's runs agree on their data, or only one data digest is known among them, the
    label stays as it was (records without a digest are of unknown data, which matches any)."""
    known: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        ident = data_identity(r.record)
        if ident is not None:
            known[r.record.bench].add(ident)
    return [
        replace(r, data_tag=f" data {data_identity(r.record) or 'unknown'}") if len(known[r.record.bench]) > 1 else r
        for r in runs
    ]


def verify_predictions(runs: list[Run]) -> None:
    """Every record against its predictions file where the file exists (records committed without theirs, as the
    gate's, are read as they are): a ClbenchError (one line naming the file) for the first file that changed since
    its run or that gives other accuracies than its record states, so that an edited record or file is neither
    shown, nor averaged, nor passed by the gate."""
    for run in runs:
        ref = run.record.predictions
        if ref is not None and (run.path / ref.file).exists():
            read(run.path, ref, expect=run.record.protocols)


def _mark_repeats(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """Runs with ``repeat_of`` set where another run of the same row has the same seed and class order, and a note
    per repeat. The run kept is the one with per-image predictions, then the newest, then the first by id."""
    same: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for r in runs:
        same[(r.bench_label, r.backbone_label, r.weights_label, r.variant, r.seed, r.record.class_order_seed)].append(r)
    kept: dict[str, str] = {}
    notes: list[str] = []
    for group in same.values():
        if len(group) < 2:
            continue
        by_id = sorted(group, key=lambda r: r.run_id)  # a stable sort keeps this order among equals
        best = sorted(by_id, key=lambda r: (r.record.predictions is not None, r.record.created), reverse=True)[0]
        others = sorted(r.run_id for r in group if r is not best)
        kept.update({rid: best.run_id for rid in others})
        notes.append(
            f"{', '.join(others)} {'repeats' if len(others) == 1 else 'repeat'} seed {best.seed} of {best.variant} "
            f"({best.bench_label}): the rows count that seed once, from {best.run_id}"
        )
    marked = [replace(r, repeat_of=kept.get(r.run_id)) for r in runs]
    return marked, notes


def _redefined(theirs: dict[str, str] | None, ours: dict[str, str]) -> bool:
    """Whether a record's metric definitions give a metric another meaning than ours (metrics added since
    are not a change)."""
    return theirs is not None and any(ours.get(k) != v for k, v in theirs.items())


def changed_settings(record: RunRecord) -> list[str] | None:
    """``key=value`` for every strategy setting of ``record`` that differs from its strategy's defaults (with its
    profile applied); None when the strategy is not registered here."""
    from dataclasses import asdict

    try:
        cls = card(record.strategy)  # the method's card: its settings without loading it (or torch)
        defaults = asdict(make_strategy_config(cls, record.profile, ()))
        defaults["train_per_class"] = run_level(cls, record.profile, None, "train_per_class")
    except Exception:  # an unknown strategy or profile, or a settings class that changed since the record
        return None

    def same(a: Any, b: Any) -> bool:  # two settings' JSON values
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)

    return [f"{k}={v}" for k, v in record.settings.items() if not same(v, defaults.get(k))]


def _variant_labels(records: list[RunRecord]) -> dict[int, str]:
    """``tosca``; ``tosca:quick`` for a profile; when runs of one strategy and profile have different settings, the
    settings that differ from the strategy's defaults (``tosca l1=0``; ``tosca[1a2b3c]``, a digest of the settings,
    only where those cannot be read), so that different configurations are never averaged together."""
    digests: dict[tuple[str, str | None], set[str]] = defaultdict(set)  # (strategy, profile) -> config digests
    for r in records:
        digests[(r.strategy, r.profile)].add(config_digest(r))
    out = {}
    for r in records:
        label = r.strategy + (f":{r.profile}" if r.profile else "")
        if len(digests[(r.strategy, r.profile)]) > 1:
            changed = changed_settings(r)
            label += f"[{config_digest(r)}]" if changed is None else "".join(f" {c}" for c in changed)
        out[id(r)] = label
    return out
