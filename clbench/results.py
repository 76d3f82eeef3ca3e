"""The run record (``result.json``): the typed :class:`RunRecord`, the one place that reads and writes it, and
the environment capture it holds.

A record is written atomically after every task with ``complete: false`` and once more at the end with
``complete: true``; readers (reports, checks) use only complete records (:func:`load_record`), the sweep also
unfinished ones (:func:`read_record`). Code reads fields (``record.params.added_total``,
``record.summary("per-sample").last_acc``), never string keys; only the method-specific ``per_task[t].diagnostics``
stays a free dict. ``SCHEMA_VERSION`` changes when a field changes meaning; older readable versions are upgraded on
load, others refused with a message.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeGuard

from clbench.errors import ClbenchError
from clbench.owned import load_json
from clbench.predictions import PredictionsFile

SCHEMA_VERSION = 4  # see the version history above RunRecord
RESULT_FILE = "result.json"
Json = dict[str, Any]  # a JSON object as read or written: its values are arbitrary JSON (Any)


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("clbench", "torch", "torchvision", "timm", "avalanche-lib", "numpy", "pandas"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def git_revision() -> str:
    """The clbench source tree's git revision (with ``+dirty`` when modified), or ``unknown``."""
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def reset_peak_rss() -> None:
    """Start a new peak-memory window for this process (Linux: ``echo 5 > /proc/self/clear_refs`` resets VmHWM).

    A sweep worker runs many runs one after another; without the reset each record would report the largest run
    the worker ever ran. Where the reset is not possible the peak covers the whole process (as ``ru_maxrss``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """Peak resident memory of this process since :func:`reset_peak_rss` (or its start), in MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


# ------------------------------------------------------------------------------------------- the typed record
# Version history. A record of an older readable version is upgraded on load (:func:`_upgrade_v1`); one older than
# OLDEST_READABLE, or newer than SCHEMA_VERSION, is refused with a message.
#   1: fields were added without a version change (fingerprint, n_images, class_names, resumed_from_task,
#      time_s.checkpoint, host details, precision_reason); records before ``--precision`` say ``autocast: true/false``
#      (bf16 / fp32) instead of ``precision``.
#   2: written through :class:`RunRecord`: ``precision`` always named; every top-level field present (null where
#      unknown) but ``protocol_gap``, ``finished``, ``training_warning`` and ``tracker_events``, written where set
#      (the last two added later; a record without them means none). The JSON layout is version 1's.
#   3: ``predictions`` names the run's per-image predictions file (clbench.predictions) with its sha256 and size, or
#      is null where the run kept none; every protocol's metrics add ``bwt``, ``ece``, ``last_acc_ci`` and
#      ``avg_acc_ci``, written where known (the last three need predictions). Version-2 records lack them all.
#   4: one parameter accounting for every method (:class:`clbench.strategy.ParamCounts`): ``params.added_*`` counts
#      learned parameters only (heads included: TOSCA's head rows are in it now), ``params.stored_*`` the statistics
#      kept (prototypes, means, covariances, Gram matrices, random projections), which versions 2 and 3 counted as
#      added for SimpleCIL, EASE, APER, RanPAC (its W) and MOS. :func:`_upgrade_v3` restates an older record through
#      the strategy's :meth:`~clbench.strategy.Strategy.split_kept` (the split its live runs use).
OLDEST_READABLE = 1
DEFAULT_CLASS_ORDER_SEED = 1993  # the literature's class order (the harness's default)
RUN_HINT = "rerun it with this clbench (`clbench run ...` with the record's command) or leave the folder out"


@dataclass
class ProtocolSummary:
    """The metrics of one evaluation protocol after every task (definitions: :data:`clbench.metrics.DEFINITIONS`)."""

    accuracy_matrix: list[list[float]]  # R[t][j] in percent: after task t, on the test images of task j <= t
    acc_curve: list[float]  # A_t in percent: every seen class's test images after task t
    last_acc: float | None  # A_T (None before the first task ended)
    avg_acc: float | None  # mean of the A_t
    forgetting: float | None = None  # Chaudhry / PILOT: max earlier R[t][j] minus final R[T][j], mean over j < T
    forgetting_first_last: float | None = None  # R[j][j] minus final R[T][j], mean over j < T
    old_acc: list[float] = field(default_factory=list)  # per task: earlier tasks' test images (NaN after task 1)
    new_acc: list[float] = field(default_factory=list)  # per task: this task's test images
    top5_curve: list[float] = field(default_factory=list)  # per task: top-5 accuracy over every seen class
    bwt: float | None = None  # backward transfer (Lopez-Paz and Ranzato): mean over j < T of R[T][j] - R[j][j]
    ece: float | None = None  # final model's expected calibration error, 15 bins, points (None: no predictions)
    last_acc_ci: list[float] | None = None  # [lo, hi] 95 % stratified image bootstrap (None: no predictions)
    avg_acc_ci: list[float] | None = None  # [lo, hi] likewise for avg_acc

    @classmethod
    def from_dict(cls, d: Json) -> ProtocolSummary:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def to_dict(self) -> Json:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None or k not in _WHERE_SET}


_WHERE_SET = ("bwt", "ece", "last_acc_ci", "avg_acc_ci")  # written only where known (older records lack them)
SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(ProtocolSummary))


@dataclass
class Params:
    """Parameter counts (:class:`clbench.strategy.ParamCounts`): the frozen backbone, and what the strategy adds."""

    backbone: int  # parameters of the frozen backbone
    trainable: int  # the most the optimiser updated in one task
    added_total: int  # learned parameters kept after the last task (modules, prompts, adapters, head rows)
    trainable_per_task: list[int] = field(default_factory=list)
    added_per_task: list[int] = field(default_factory=list)
    head: int = 0
    extra: Json = field(default_factory=dict)  # the strategy's own counts (ParamCounts.extra), written beside these
    stored_total: int = 0  # statistics kept after the last task (prototypes, means, covariances, Gram matrices)
    stored_per_task: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Json) -> Params:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: d[k] for k in known if k in d}, extra={k: v for k, v in d.items() if k not in known})

    def to_dict(self) -> Json:
        return {
            "backbone": self.backbone,
            "trainable": self.trainable,
            "trainable_per_task": self.trainable_per_task,
            "added_per_task": self.added_per_task,
            "added_total": self.added_total,
            "stored_per_task": self.stored_per_task,
            "stored_total": self.stored_total,
            "head": self.head,
            **self.extra,
        }


TIME_PHASES = ("features", "train", "eval", "checkpoint", "total")


@dataclass
class Times:
    """Wall-clock seconds per phase, summed over every segment of a resumed run."""

    features: float  # frozen-feature extraction (near 0 when the feature cache hit)
    train: float
    eval: float  # covers every protocol the run evaluated
    total: float  # the whole run, loading included
    checkpoint: float | None = None  # writing checkpoints (None: a record from before checkpoints)

    @classmethod
    def from_dict(cls, d: Json) -> Times:
        return cls(**{k: d[k] for k in TIME_PHASES if k in d})

    def to_dict(self) -> Json:
        return {k: getattr(self, k) for k in TIME_PHASES if getattr(self, k) is not None}


@dataclass
class Host:
    """The machine a run's times come from. Fields a record predates are None and not written."""

    cpus: int | None = None
    torch_threads: int | None = None
    omp_wait_policy: str | None = None
    cpu: str | None = None  # model name
    cpu_capability: str | None = None  # torch.backends.cpu.get_cpu_capability()
    amx: bool | None = None
    avx512_bf16: bool | None = None
    isa_limits: dict[str, str] | None = None  # ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA where set
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read

    @classmethod
    def from_dict(cls, d: Json) -> Host:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: d[k] for k in known if k in d}, extra={k: v for k, v in d.items() if k not in known})

    def to_dict(self) -> Json:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}


@dataclass
class TaskEntry:
    """One task of the run: its classes, its times and the strategy's diagnostics after it."""

    task: int
    classes: list[int]  # class ids (after the class order) learnt in this task
    train_s: float | None  # None: not measured (the field checks let a record hold null)
    diagnostics: Json = field(default_factory=dict)  # method-specific (Strategy.diagnostics): a free dict
    eval_s: float | None = None
    # clbench.training_check: ||after - before|| / ||before|| of what the optimizers stepped in this task (None:
    # nothing trained; absent in records before the detector) and, first task only, the share of its test
    # predictions that change when its trained parts keep their initial values
    trained_change: float | None = None
    reset_share: float | None = None

    @classmethod
    def from_dict(cls, d: Json) -> TaskEntry:
        return cls(
            d["task"],
            list(d.get("classes") or []),
            d.get("train_s"),
            d.get("diagnostics") or {},
            d.get("eval_s"),
            d.get("trained_change"),
            d.get("reset_share"),
        )

    def to_dict(self) -> Json:
        out = {
            "task": self.task,
            "classes": self.classes,
            "train_s": self.train_s,
            "diagnostics": self.diagnostics,
            "eval_s": self.eval_s,
        }
        for name in ("trained_change", "reset_share"):  # written where measured: older records stay as they were
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass
class ProtocolGap:
    last_acc: float  # reference minus per-sample, points
    avg_acc: float
    note: str = "reference minus per-sample, in points"

    @classmethod
    def from_dict(cls, d: Json) -> ProtocolGap:
        return cls(d["last_acc"], d["avg_acc"], d.get("note", cls.note))

    def to_dict(self) -> Json:
        return {"last_acc": self.last_acc, "avg_acc": self.avg_acc, "note": self.note}


@dataclass
class RunRecord:
    """One run of one (strategy, benchmark, backbone, seed): what ``result.json`` holds.

    Read with :func:`load_record` (complete runs) or :func:`read_record` (any state), write with :meth:`write`. The
    JSON layout is the field order below, with the main protocol's metrics repeated at the top level after
    ``protocol`` (as every record since version 1 has them) and ``protocol_gap`` / ``finished`` only where set."""

    run_id: str
    complete: bool
    strategy: str
    bench: str
    backbone: str
    seed: int
    protocol: str  # the main evaluation protocol (the first of ``protocols``)
    task_sizes: list[int]  # classes per task
    protocols: dict[str, ProtocolSummary]  # every protocol evaluated, the main one included
    params: Params
    time_s: Times
    created: str | None = None  # ISO time of this write
    command: str | None = None
    fingerprint: Json | None = None  # the run's defining settings (clbench.config.DEFINING_FIELDS)
    strategy_config: Json = field(default_factory=dict)  # the strategy's settings dataclass, as written
    profile: str | None = None
    n_classes: int | None = None
    n_images: dict[str, int] | None = None  # {"train": N, "test": N}
    class_order: list[int] = field(default_factory=list)
    class_order_seed: int = DEFAULT_CLASS_ORDER_SEED
    class_names: list[str] | None = None  # in class order
    weights_source: str | None = None  # "random-init(seed=...)", a file, a package ...
    weights_digest: str | None = None
    img_size: int | None = None
    transform: str | None = None  # the eval transform's identity (TransformSpec.identity)
    device: str | None = None
    precision: str = "unknown"  # fp32 / bf16 / fp16 (records before --precision: from their autocast flag)
    precision_reason: str | None = None
    per_task: list[TaskEntry] = field(default_factory=list)
    feature_cache: list[str] = field(default_factory=list)  # "hit" / "miss" per split and segment
    data_problems: list[str] = field(default_factory=list)  # `clbench data check` problems run anyway
    resumed_from_task: list[int] = field(default_factory=list)  # tasks done at each resume from a checkpoint
    peak_rss_mb: float | None = None  # over every segment of the run
    versions: dict[str, str] = field(default_factory=dict)  # library versions
    git_revision: str | None = None
    metric_definitions: dict[str, str] | None = None  # clbench.metrics.DEFINITIONS when the run was made
    predictions: PredictionsFile | None = None  # predictions.npz beside the record (None: the run kept none)
    host: Host = field(default_factory=Host)
    protocol_gap: ProtocolGap | None = None  # runs of both protocols
    finished: str | None = None  # ISO time of the complete write
    # clbench.training_check: set when training barely moved the trained parts (the run measures the backbone)
    training_warning: str | None = None
    tracker_events: list[str] = field(default_factory=list)  # experiment trackers that failed (clbench.trackers)
    extra: Json = field(default_factory=dict)  # fields this clbench does not know, kept as read (and written)

    # ------------------------------------------------------------------------------------------- derived
    @property
    def main(self) -> ProtocolSummary:
        """The main protocol's metrics."""
        return self.protocols[self.protocol]

    @property
    def last_acc(self) -> float | None:
        return self.main.last_acc

    @property
    def avg_acc(self) -> float | None:
        return self.main.avg_acc

    @property
    def accuracy_matrix(self) -> list[list[float]]:
        return self.main.accuracy_matrix

    @property
    def acc_curve(self) -> list[float]:
        return self.main.acc_curve

    @property
    def protocol_names(self) -> list[str]:
        """Evaluation protocols of this run, the main one first."""
        return [self.protocol, *(p for p in self.protocols if p != self.protocol)]

    def summary(self, protocol: str) -> ProtocolSummary:
        """The metrics of one protocol; KeyError naming the run when it was not evaluated."""
        if protocol not in self.protocols:
            raise KeyError(f"run {self.run_id} has no protocol {protocol!r}")
        return self.protocols[protocol]

    @property
    def training_movement(self) -> list[float | None]:
        """Per task: the relative change of what the optimizers stepped (None: nothing trained or not measured)."""
        return [t.trained_change for t in self.per_task]

    @property
    def reset_share(self) -> float | None:
        """Share of the first task's test predictions that change when its trained parts are reset (see
        :mod:`clbench.training_check`); None where not measured."""
        return self.per_task[0].reset_share if self.per_task else None

    @property
    def tasks_done(self) -> int:
        return len(self.per_task)

    # ------------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> Json:
        """The JSON object of ``result.json``, in its field order."""
        out: Json = {"schema_version": SCHEMA_VERSION}
        for name in _LAYOUT:
            value = getattr(self, name)
            if name == "protocols":
                value = {p: s.to_dict() for p, s in value.items()}
            elif name == "per_task":
                value = [t.to_dict() for t in value]
            elif hasattr(value, "to_dict"):
                value = value.to_dict()
            out[name] = value
            if name == "protocol":  # the main protocol's metrics at the top level, as every record has them
                out.update(self.main.to_dict())
        if self.protocol_gap is not None:
            out["protocol_gap"] = self.protocol_gap.to_dict()
        if self.finished is not None:
            out["finished"] = self.finished
        if self.training_warning is not None:
            out["training_warning"] = self.training_warning
        if self.tracker_events:
            out["tracker_events"] = self.tracker_events
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: Json) -> RunRecord:
        """A record from a current-version JSON object whose fields :func:`field_problems` found sound."""
        known = {f.name for f in dataclasses.fields(cls)} | set(SUMMARY_FIELDS) | {"schema_version"}
        protocols = {p: ProtocolSummary.from_dict(s) for p, s in (data.get("protocols") or {}).items()}
        if data["protocol"] not in protocols:  # records that kept the main protocol at the top level only
            protocols = {data["protocol"]: ProtocolSummary.from_dict(data), **protocols}
        simple = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data and f.name not in _NESTED}
        return cls(
            **simple,
            protocols=protocols,
            params=Params.from_dict(data["params"]),
            time_s=Times.from_dict(data["time_s"]),
            per_task=[TaskEntry.from_dict({"task": i, **t}) for i, t in enumerate(data.get("per_task") or [])],
            host=Host.from_dict(data.get("host") or {}),
            protocol_gap=ProtocolGap.from_dict(data["protocol_gap"]) if data.get("protocol_gap") else None,
            predictions=PredictionsFile.from_dict(data["predictions"]) if data.get("predictions") else None,
            extra={k: v for k, v in data.items() if k not in known},
        )

    def write(self, run_dir: Path | str) -> Path:
        """Write ``run_dir/result.json`` atomically (a reader sees the old record or the new one, never a torn
        file); return its path."""
        from clbench.files import atomic_write_json

        path = Path(run_dir) / RESULT_FILE
        atomic_write_json(path, self.to_dict())
        return path


_NESTED = {"protocols", "params", "time_s", "per_task", "host", "protocol_gap", "predictions", "extra"}
_LAYOUT = (
    "run_id",
    "complete",
    "created",
    "command",
    "fingerprint",
    "strategy",
    "strategy_config",
    "profile",
    "bench",
    "n_classes",
    "n_images",
    "task_sizes",
    "class_order",
    "class_order_seed",
    "class_names",
    "backbone",
    "weights_source",
    "weights_digest",
    "img_size",
    "transform",
    "seed",
    "device",
    "precision",
    "precision_reason",
    "protocol",
    "protocols",
    "params",
    "time_s",
    "per_task",
    "feature_cache",
    "data_problems",
    "resumed_from_task",
    "peak_rss_mb",
    "versions",
    "git_revision",
    "metric_definitions",
    "predictions",
    "host",
)


# ------------------------------------------------------------------------------------------- field checks
# Bounds of what a field can mean; a record outside them was not written by clbench (or was edited) and is refused.
MAX_INT = 2**63 - 1  # counts, sizes and seeds: what a C long holds
MAX_NAME = 256  # characters of a name (strategy, benchmark, backbone, protocol, run id, profile)
MAX_TEXT = 64 * 2**10  # characters of any other string (a command line, a data problem, a diagnostic)
MAX_SECONDS = 10 * 365 * 86400.0  # a phase's wall-clock


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT <= v <= MAX_INT


def _is_count(v: Any) -> bool:  # a size, a count, a seed, an index: >= 0
    return _is_int(v) and v >= 0


def _is_positive(v: Any) -> bool:
    return _is_int(v) and v >= 1


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= 1e15


def _is_real(v: Any) -> bool:  # a number, NaN allowed (old_acc after the first task)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (math.isnan(v) or _is_number(v))


def _is_pct(v: Any) -> bool:  # an accuracy in percent
    return _is_number(v) and 0 <= v <= 100


def _is_pct_or_nan(v: Any) -> bool:
    return _is_pct(v) or (isinstance(v, float) and math.isnan(v))


def _is_points(v: Any) -> bool:  # a difference of two accuracies (forgetting, a protocol gap); NaN: undefined
    return (_is_number(v) and -100 <= v <= 100) or (isinstance(v, float) and math.isnan(v))


def _is_seconds(v: Any) -> bool:
    return _is_number(v) and 0 <= v <= MAX_SECONDS


def _is_matrix(v: Any) -> bool:
    """The accuracy matrix: lower triangular (row t holds tasks 0..t), percentages."""
    return isinstance(v, list) and all(
        isinstance(row, list) and len(row) == t + 1 and all(_is_pct(x) for x in row) for t, row in enumerate(v)
    )


def _is_summary(m: Any) -> bool:
    return (
        isinstance(m, dict)
        and _is_matrix(m.get("accuracy_matrix"))
        and _is_pct(m.get("last_acc"))
        and _is_pct(m.get("avg_acc"))
        and _list_of(_is_pct)(m.get("acc_curve", []))
        and all(_list_of(_is_pct_or_nan)(m.get(k, [])) for k in ("old_acc", "new_acc", "top5_curve"))
        and all(_or_none(_is_points)(m.get(k)) for k in ("forgetting", "forgetting_first_last"))
        and all(_or_none(_is_real)(m.get(k)) for k in ("bwt", "ece"))
        and all(_or_none(_is_pair)(m.get(k)) for k in ("last_acc_ci", "avg_acc_ci"))
    )


def _is_pair(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v) and v[0] <= v[1]


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _or_none(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME


def _is_task(t: Any) -> bool:
    return (
        isinstance(t, dict)
        and _is_count(t.get("task", 0))
        and isinstance(t.get("diagnostics") or {}, dict)
        and _list_of(_is_count)(t.get("classes", []))
        and _or_none(_is_seconds)(t.get("train_s"))
        and _or_none(_is_seconds)(t.get("eval_s"))
        and _or_none(_is_real)(t.get("trained_change"))
        and _or_none(_is_real)(t.get("reset_share"))
    )


def _is_predictions_ref(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _is_str(v.get("file"))
        and _is_str(v.get("sha256"))
        and _is_count(v.get("bytes"))
        and _is_count(v.get("rows"))
    )


# The same checks for other files that carry record values (the gate's reference).
is_count, is_positive, is_pct, is_matrix, is_name = _is_count, _is_positive, _is_pct, _is_matrix, _is_name

FieldCheck = tuple[tuple[str, ...], str, Callable[[Any], bool]]
NAME = f"a name (1 to {MAX_NAME} characters)"
SECONDS = "seconds (a finite number >= 0)"
# Fields every record must have for the tables, figures and the gate; a record without one is refused, naming it.
REQUIRED_FIELDS: tuple[FieldCheck, ...] = (
    (("strategy",), NAME, _is_name),
    (("bench",), NAME, _is_name),
    (("backbone",), NAME, _is_name),
    (("seed",), "an integer >= 0", _is_count),
    (("protocol",), NAME, _is_name),
    (
        ("task_sizes",),
        "a list of integers >= 1",
        lambda v: isinstance(v, list) and bool(v) and all(_is_positive(n) for n in v),
    ),
    (("acc_curve",), "a list of percentages (0 to 100)", _list_of(_is_pct)),
    (("accuracy_matrix",), "a lower-triangular matrix of percentages (row t: t + 1 entries, 0 to 100)", _is_matrix),
    (("last_acc",), "a percentage (0 to 100)", _is_pct),
    (("avg_acc",), "a percentage (0 to 100)", _is_pct),
    (("params", "added_total"), "an integer >= 0", _is_count),
    (("params", "trainable"), "an integer >= 0", _is_count),
    (("time_s", "features"), SECONDS, _is_seconds),
    (("time_s", "train"), SECONDS, _is_seconds),
    (("time_s", "eval"), SECONDS, _is_seconds),
    (("time_s", "total"), SECONDS, _is_seconds),
)
# Fields a record may lack (older records do; a default stands in); one of another type is refused, naming it.
OPTIONAL_FIELDS: tuple[FieldCheck, ...] = (
    (("run_id",), NAME, _is_name),
    (("profile",), f"{NAME} or null", _or_none(_is_name)),
    (("img_size",), "an integer >= 1 or null", _or_none(_is_positive)),
    (("class_order_seed",), "an integer >= 0", _is_count),
    (("precision",), NAME, _is_name),
    (("weights_digest",), "a string or null", _or_none(_is_str)),
    (("weights_source",), "a string or null", _or_none(_is_str)),
    (("strategy_config",), "an object", lambda v: isinstance(v, dict)),
    (
        ("protocols",),
        "an object of protocol -> metrics",
        lambda v: isinstance(v, dict) and all(_is_summary(m) for m in v.values()),
    ),
    (("fingerprint",), "an object or null", _or_none(lambda v: isinstance(v, dict))),
    (("n_classes",), "an integer >= 1 or null", _or_none(_is_positive)),
    (
        ("n_images",),
        "an object of split -> count or null",
        _or_none(lambda v: isinstance(v, dict) and all(_is_count(n) for n in v.values())),
    ),
    (("class_order",), "a list of integers >= 0", _list_of(_is_count)),
    (("class_names",), "a list of names or null", _or_none(_list_of(_is_name))),
    (("params", "backbone"), "an integer >= 0", _is_count),
    (("params", "head"), "an integer >= 0", _is_count),
    (("params", "added_per_task"), "a list of integers >= 0", _list_of(_is_count)),
    (("params", "trainable_per_task"), "a list of integers >= 0", _list_of(_is_count)),
    (("params", "stored_total"), "an integer >= 0", _is_count),
    (("params", "stored_per_task"), "a list of integers >= 0", _list_of(_is_count)),
    (("time_s", "checkpoint"), SECONDS, _is_seconds),
    (("per_task",), "a list of task objects", _list_of(_is_task)),
    (("host",), "an object", lambda v: isinstance(v, dict)),
    (("peak_rss_mb",), "a number >= 0 or null", _or_none(lambda v: _is_real(v) and not v < 0)),
    (("resumed_from_task",), "a list of integers >= 0", _list_of(_is_count)),
    (
        ("protocol_gap",),
        "an object with last_acc and avg_acc (points, -100 to 100) or null",
        _or_none(lambda v: isinstance(v, dict) and _is_points(v.get("last_acc")) and _is_points(v.get("avg_acc"))),
    ),
    (("forgetting",), "points (-100 to 100) or null", _or_none(_is_points)),
    (("forgetting_first_last",), "points (-100 to 100) or null", _or_none(_is_points)),
    (("data_problems",), "a list of strings", _list_of(_is_str)),
    (("feature_cache",), "a list of names", _list_of(_is_name)),
    (("git_revision",), "a string or null", _or_none(_is_str)),
    (("command",), "a string or null", _or_none(_is_str)),
    (("finished",), "a string or null", _or_none(_is_str)),
    (("training_warning",), "a string or null", _or_none(_is_str)),
    (("tracker_events",), "a list of strings", _list_of(_is_str)),
    (("predictions",), "an object with file, sha256, bytes and rows, or null", _or_none(_is_predictions_ref)),
)
V1_FIELDS: tuple[FieldCheck, ...] = (  # version 1 only, upgraded away
    (("autocast",), "true or false", lambda v: isinstance(v, bool)),
)
_ABSENT = object()


def out_of_bounds(node: Any, where: str = "") -> str | None:
    """The first value anywhere in the record that no field can mean: a string over :data:`MAX_TEXT` characters or an
    integer beyond :data:`MAX_INT` (also in fields this clbench does not know, which it keeps and writes back)."""
    stack = [(node, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if len(v) > MAX_TEXT:
                return f"field {at or 'record'} is a string of {len(v):,} characters (at most {MAX_TEXT:,})"
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -MAX_INT <= v <= MAX_INT:
                return f"field {at or 'record'} is an integer of {len(str(abs(v)))} digits (at most 2**63 - 1)"
        elif isinstance(v, dict):
            for k, x in v.items():
                if len(k) > MAX_NAME:
                    return f"a key in {at or 'record'} is {len(k):,} characters long (at most {MAX_NAME})"
                stack.append((x, f"{at}.{k}" if at else k))
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
    return None


def field_problems(data: Json, version: int = SCHEMA_VERSION) -> list[str]:
    """Missing required fields, then fields of the wrong type or outside what they mean, each named
    (``time_s.train is str ...``); first any value no field can mean (:func:`out_of_bounds`)."""
    huge = out_of_bounds(data)
    if huge is not None:
        return [huge]
    missing, wrong = [], []
    checks = ((REQUIRED_FIELDS, True), (OPTIONAL_FIELDS + (V1_FIELDS if version == 1 else ()), False))
    for fields, required in checks:
        for path, expected, ok in fields:
            node: Any = data
            for part in path:
                if not isinstance(node, dict) or part not in node:
                    node = _ABSENT
                    break
                node = node[part]
            name = ".".join(path)
            if node is _ABSENT:
                if required:
                    missing.append(name)
            elif not ok(node):
                wrong.append(f"{name} is {type(node).__name__} {_short(node)}, expected {expected}")
    return ([f"record lacks {', '.join(missing)}"] if missing else []) + [f"field {w}" for w in wrong]


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 20 else f"of {len(value)} items"
    return text[:40] + ("..." if len(text) > 40 else "")


def _upgrade_v1(data: Json) -> Json:
    """A version-1 record as version 2: ``autocast`` becomes ``precision`` (true: bf16, false: fp32, neither:
    unknown); every other field keeps its meaning, and those it predates take their defaults."""
    out = dict(data)
    autocast = out.pop("autocast", None)
    if "precision" not in out:
        out["precision"] = "unknown" if autocast is None else ("bf16" if autocast else "fp32")
    return out


def _upgrade_v2(data: Json) -> Json:
    """A version-2 record as version 3: it kept no predictions."""
    return {**data, "predictions": data.get("predictions")}


def _upgrade_v3(data: Json) -> Json:
    """A version-3 (or older) record as version 4: its ``params.added_per_task`` (everything kept per task; TOSCA's
    module only) split into learned parameters and stored statistics by the strategy's own
    :meth:`~clbench.strategy.Strategy.split_kept`, which its live runs use too; a strategy this clbench does not
    register keeps everything as learned (the base rule). ``params.restated_from_schema`` says so."""
    from clbench.catalog import STRATEGIES
    from clbench.strategy import Strategy

    params = dict(data["params"])
    kept = list(params.get("added_per_task") or [params["added_total"]])
    sizes = list(data["task_sizes"])
    if len(kept) != len(sizes):  # an unfinished record: the tasks it has done
        sizes = sizes[: len(kept)]
    try:
        split_kept = STRATEGIES.get(str(data["strategy"])).split_kept
    except ClbenchError:  # not registered here: the base rule (the abstract class itself, so its method, not it)
        split_kept = Strategy.split_kept
    try:
        added, stored = split_kept(kept, int(params.get("head", 0)), params, sizes)
    except (KeyError, ValueError, ZeroDivisionError, TypeError) as e:
        raise ClbenchError(
            f"record of {data['strategy']} (schema {data.get('schema_version', 3)}): "
            f"its parameter counts cannot be restated ({e!r})",
            RUN_HINT,
        ) from None
    params.update(
        added_per_task=added,
        added_total=sum(added),
        stored_per_task=stored,
        stored_total=sum(stored),
        restated_from_schema=int(data.get("schema_version", 3)),
    )
    return {**data, "params": params}


UPGRADES: dict[int, Callable[[Json], Json]] = {
    1: _upgrade_v1,
    2: _upgrade_v2,
    3: _upgrade_v3,
}  # version -> the next version


# ------------------------------------------------------------------------------------------- reading
def record_path(path: Path | str) -> Path:
    """The record file of a run folder (or the file itself)."""
    path = Path(path)
    return path / RESULT_FILE if path.is_dir() else path


def read_record(path: Path | str) -> RunRecord:
    """The record at ``path`` (a run folder or its ``result.json``), complete or not, upgraded to the current
    schema. Raises ClbenchError (``PATH: why``) for a missing or unreadable file, a non-record, a schema version this
    clbench cannot read, or a missing or mistyped field."""
    path = record_path(path)
    data = _read_json(path)
    return _build(path, _checked(path, data))


def load_record(path: Path | str) -> RunRecord:
    """Like :func:`read_record`, for a *complete* run (reports and the gate use only these): also refuses a record
    whose ``complete`` is not true, and one whose matrix or curve has another length than its tasks."""
    path = record_path(path)
    data = _read_json(path)
    _check_version(path, data)
    if not data.get("complete"):
        raise ClbenchError(
            f"{path}: the run is not complete (finished {_len(data.get('acc_curve'))} "
            f"of {_len(data.get('task_sizes'))} tasks)",
            f"finish it with `clbench run --resume {path.parent}`, or leave the folder out",
        )
    if data["complete"] is not True:  # "yes" or 1 is not complete either
        raise ClbenchError(f"{path}: field complete is {data['complete']!r}, expected the boolean true")
    data = _checked(path, data)
    tasks = len(data["task_sizes"])
    if len(data["accuracy_matrix"]) != tasks:
        raise ClbenchError(f"{path}: accuracy matrix has {len(data['accuracy_matrix'])} rows for {tasks} tasks")
    if len(data["acc_curve"]) != tasks:
        raise ClbenchError(f"{path}: accuracy curve has {len(data['acc_curve'])} points for {tasks} tasks")
    return _build(path, data)


def record_says_complete(path: Path | str) -> bool:
    """Whether ``path`` holds a record that says ``complete: true`` (of any schema version): a finished run a
    new run must not overwrite unasked. False for no file or a torn one."""
    path = record_path(path)
    if not path.is_file():
        return False
    try:
        data = load_json(path, "record")
    except ClbenchError:
        return False
    return isinstance(data, dict) and bool(data.get("complete", False))


def _len(v: Any) -> int | str:
    return len(v) if isinstance(v, list) else "?"


def _read_json(path: Path) -> Json:
    if not path.exists():
        raise ClbenchError(f"{path.parent if path.name == RESULT_FILE else path}: no {RESULT_FILE}")
    data = load_json(path, "record", hint=RUN_HINT)  # bounded: size, nesting, special files
    if not isinstance(data, dict):
        raise ClbenchError(f"{path}: not a JSON record object (a {type(data).__name__})")
    return data


def _check_version(path: Path, data: Json) -> int:
    version = data.get("schema_version")
    if not _is_int(version):
        raise ClbenchError(
            f"{path}: not a clbench run record (schema_version is {version!r})",
            "give the result.json that `clbench run` writes",
        )
    if version > SCHEMA_VERSION:
        raise ClbenchError(
            f"{path}: schema version {version} is newer than this clbench reads "
            f"({OLDEST_READABLE} to {SCHEMA_VERSION})",
            "update clbench to read it",
        )
    if version < OLDEST_READABLE:
        raise ClbenchError(
            f"{path}: schema version {version} (this clbench reads {OLDEST_READABLE} to {SCHEMA_VERSION})", RUN_HINT
        )
    return version


def _checked(path: Path, data: Json) -> Json:
    """``data`` checked field by field and upgraded to the current schema version."""
    version = _check_version(path, data)
    problems = field_problems(data, version)
    if problems:
        raise ClbenchError(f"{path}: {'; '.join(problems)}", RUN_HINT)
    while version < SCHEMA_VERSION:
        data, version = UPGRADES[version](data), version + 1
    if "run_id" not in data:  # the folder names the run
        data = {**data, "run_id": path.parent.name}
    return data


def _build(path: Path, data: Json) -> RunRecord:
    try:
        return RunRecord.from_dict(data)
    except (KeyError, TypeError, ValueError) as e:  # a field the checks above let through in a shape from_dict lacks
        raise ClbenchError(f"{path}: a field has an unexpected shape ({type(e).__name__}: {e})", RUN_HINT) from None


def command_line() -> str:
    return " ".join(["clbench", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("clbench") else " ".join(sys.argv)
