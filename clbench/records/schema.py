"""The run record's layout (``result.json``): the typed :class:`RunRecord` and its parts, each field declared once
(:func:`~clbench.files.typedfile.json_field`: what it must be, whether a record may lack it, where it is written), and
the field checks derived from them. Reading and writing the file: :mod:`clbench.records.results`; its versions:
:mod:`clbench.records.versions`.

Code reads fields (``record.params.added_total``, ``record.summary("per-sample").last_acc``), never string keys; only
the method-specific ``per_task[t].diagnostics`` stays a free dict (its routing part is typed:
:mod:`clbench.records.routing_diagnostics`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.core.config import Fingerprint
from clbench.files.atomic import atomic_write_json
from clbench.files.typedfile import (
    COUNT,
    COUNTS,
    MAX_INT,
    MAX_NAME,
    MAX_TEXT,
    NAME,
    SECONDS,
    TEXT,
    FieldCheck,
    JsonObject,
    JsonValue,
    Typed,
    declared_checks,
    file_fields,
    is_bool,
    is_count,
    is_json_object,
    is_name,
    is_number,
    is_object,
    is_positive,
    is_real,
    is_seconds,
    is_str,
    json_field,
    list_of,
    map_of,
    or_none,
    read,
    short,
    unset,
    write_value,
)
from clbench.files.typedfile import problems as typed_problems
from clbench.records.predictions import PredictionsFile
from clbench.records.versions import SCHEMA_VERSION

RESULT_FILE = "result.json"
Json = dict[str, Any]
DEFAULT_CLASS_ORDER_SEED = 1993  # the literature's class order (the harness's default)


# ------------------------------------------------------------------------------------------- field checks
# The checks every typed file shares (clbench.files.typedfile), and the record's own: percentages, points, the matrix.
def _is_pct(v: Any) -> bool:  # an accuracy in percent
    return is_number(v) and 0 <= v <= 100


def _is_pct_or_nan(v: Any) -> bool:  # null: how a record written since schema 6 stores the NaN (standard JSON)
    return v is None or _is_pct(v) or (isinstance(v, float) and math.isnan(v))


def _is_points(v: Any) -> bool:  # a difference of two accuracies (forgetting, a protocol gap); NaN: undefined
    return (is_number(v) and -100 <= v <= 100) or (isinstance(v, float) and math.isnan(v))


def _is_matrix(v: Any) -> bool:
    """The accuracy matrix: lower triangular (row t holds tasks 0..t), percentages."""
    return isinstance(v, list) and all(
        isinstance(row, list) and len(row) == t + 1 and all(_is_pct(x) for x in row) for t, row in enumerate(v)
    )


def _is_pair(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(is_number(x) for x in v) and v[0] <= v[1]


# The same checks for other files that carry record values (the gate's reference).
is_pct, is_matrix = _is_pct, _is_matrix

PCTS = "a list of percentages (0 to 100)"
PCTS_OR_NULL = "a list of percentages (0 to 100) or null"
POINTS = "points (-100 to 100) or null"
INTERVAL = "a [low, high] pair of numbers or null"


# ------------------------------------------------------------------------------------------- the record's parts
@dataclass
class ProtocolSummary(Typed):
    """The metrics of one evaluation protocol after every task (definitions:
    :data:`clbench.evaluation.metrics.DEFINITIONS`)."""

    # R[t][j] in percent: after task t, on the test images of task j <= t
    accuracy_matrix: list[list[float]] = json_field(
        "a lower-triangular matrix of percentages (row t: t + 1 entries, 0 to 100)", _is_matrix, required=True
    )
    # A_t in percent: every seen class's test images after task t
    acc_curve: list[float] = json_field(PCTS, list_of(_is_pct), required=True)
    last_acc: float | None = json_field("a percentage (0 to 100)", _is_pct, required=True)  # A_T
    avg_acc: float | None = json_field("a percentage (0 to 100)", _is_pct, required=True)  # mean of the A_t
    # Chaudhry / PILOT: max earlier R[t][j] minus final R[T][j], mean over j < T
    forgetting: float | None = json_field(POINTS, or_none(_is_points), default=None)
    # R[j][j] minus final R[T][j], mean over j < T
    forgetting_first_last: float | None = json_field(POINTS, or_none(_is_points), default=None)
    # per task: earlier tasks' test images (NaN after task 1: null in the file)
    old_acc: list[float] = json_field(PCTS_OR_NULL, list_of(_is_pct_or_nan), default_factory=list)
    new_acc: list[float] = json_field(PCTS_OR_NULL, list_of(_is_pct_or_nan), default_factory=list)  # this task's
    # per task: top-5 accuracy over every seen class
    top5_curve: list[float] = json_field(PCTS_OR_NULL, list_of(_is_pct_or_nan), default_factory=list)
    # backward transfer (Lopez-Paz and Ranzato): mean over j < T of R[T][j] - R[j][j]
    bwt: float | None = json_field("a number or null", or_none(is_real), where_set=True, default=None)
    # final model's expected calibration error, 15 bins, points (None: no predictions)
    ece: float | None = json_field("a number or null", or_none(is_real), where_set=True, default=None)
    # [lo, hi] 95 % stratified image bootstrap (None: no predictions); likewise for avg_acc
    last_acc_ci: list[float] | None = json_field(INTERVAL, or_none(_is_pair), where_set=True, default=None)
    avg_acc_ci: list[float] | None = json_field(INTERVAL, or_none(_is_pair), where_set=True, default=None)
    # per task: the task-aware accuracy (clbench.evaluation.metrics.task_aware_prediction), beside A_t; records before
    # it: none
    task_aware_curve: list[float] = json_field(
        PCTS_OR_NULL, list_of(_is_pct_or_nan), where_set=True, default_factory=list
    )
    task_aware_last: float | None = json_field(  # its value after the last task
        "a percentage or null", or_none(_is_pct_or_nan), where_set=True, default=None
    )

    def __post_init__(self) -> None:
        for name in _NAN_LISTS:  # the file says null where the value is undefined (standard JSON): NaN in memory
            values = getattr(self, name)
            if any(v is None for v in values):
                setattr(self, name, [math.nan if v is None else v for v in values])


# per-task lists with undefined entries (old_acc after the first task): NaN in memory, null in the file
_NAN_LISTS = ("old_acc", "new_acc", "top5_curve")
SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(ProtocolSummary))


@dataclass(kw_only=True)
class Params(Typed):
    """Parameter counts (:class:`clbench.methods.contract.ParamCounts`): the frozen backbone, and what the strategy
    adds."""

    backbone: int = json_field(COUNT, is_count)  # parameters of the frozen backbone
    trainable: int = json_field(COUNT, is_count, required=True)  # the most the optimiser updated in one task
    trainable_per_task: list[int] = json_field(COUNTS, list_of(is_count), default_factory=list)
    added_per_task: list[int] = json_field(COUNTS, list_of(is_count), default_factory=list)
    # learned parameters kept after the last task (modules, prompts, adapters, head rows)
    added_total: int = json_field(COUNT, is_count, required=True)
    # statistics kept after the last task (prototypes, means, covariances, Gram matrices)
    stored_per_task: list[int] = json_field(COUNTS, list_of(is_count), default_factory=list)
    stored_total: int = json_field(COUNT, is_count, default=0)
    head: int = json_field(COUNT, is_count, default=0)
    extra: Json = field(default_factory=dict)  # the strategy's own counts (ParamCounts.extra), written beside these


TIME_PHASES = ("features", "train", "eval", "checkpoint", "total")


@dataclass(kw_only=True)
class Times(Typed):
    """Wall-clock seconds per phase, summed over every segment of a resumed run."""

    # frozen-feature extraction (near 0 when the feature cache hit)
    features: float = json_field(SECONDS, is_seconds, required=True)
    train: float = json_field(SECONDS, is_seconds, required=True)
    eval: float = json_field(SECONDS, is_seconds, required=True)  # covers every protocol the run evaluated
    # writing checkpoints (None: a record from before checkpoints)
    checkpoint: float | None = json_field(SECONDS, is_seconds, where_set=True, default=None)
    total: float = json_field(SECONDS, is_seconds, required=True)  # the whole run, loading included


@dataclass
class Host(Typed):
    """The machine a run's times come from. Fields a record predates are None and not written."""

    cpus: int | None = json_field(COUNT, is_count, where_set=True, default=None)
    torch_threads: int | None = json_field(COUNT, is_count, where_set=True, default=None)
    omp_wait_policy: str | None = json_field(TEXT, is_str, where_set=True, default=None)
    cpu: str | None = json_field(TEXT, is_str, where_set=True, default=None)  # model name
    # torch.backends.cpu.get_cpu_capability()
    cpu_capability: str | None = json_field(TEXT, is_str, where_set=True, default=None)
    amx: bool | None = json_field("true or false", is_bool, where_set=True, default=None)
    avx512_bf16: bool | None = json_field("true or false", is_bool, where_set=True, default=None)
    # ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA where set
    isa_limits: dict[str, str] | None = json_field(
        "an object of variable -> value", map_of(is_str), where_set=True, default=None
    )
    extra: Json = field(default_factory=dict)  # keys this clbench does not know, kept as read


@dataclass
class TaskEntry(Typed):
    """One task of the run: its classes, its times and the strategy's diagnostics after it."""

    task: int = json_field(COUNT, is_count)  # the record's per_task list gives it where an entry lacks it
    # class ids (after the class order) learnt in this task
    classes: list[int] = json_field(COUNTS, list_of(is_count), default_factory=list)
    train_s: float | None = json_field(f"{SECONDS} or null", or_none(is_seconds), default=None)  # None: not measured
    # method-specific (Strategy.diagnostics): a free dict (its routing part: clbench.records.routing_diagnostics)
    diagnostics: Json = json_field("an object or null", or_none(is_object), default_factory=dict)
    eval_s: float | None = json_field(f"{SECONDS} or null", or_none(is_seconds), default=None)
    # clbench.methods.training_check: ||after - before|| / ||before|| of what the optimizers stepped in this task (None:
    # nothing trained; absent in records before the detector) and, first task only, the share of its test
    # predictions that change when its trained parts keep their initial values; written where measured
    trained_change: float | None = json_field("a number or null", or_none(is_real), where_set=True, default=None)
    reset_share: float | None = json_field("a number or null", or_none(is_real), where_set=True, default=None)

    def __post_init__(self) -> None:
        if self.diagnostics is None:
            self.diagnostics = {}


@dataclass
class ProtocolGap(Typed):
    last_acc: float = json_field("points (-100 to 100)", _is_points, required=True)  # reference minus per-sample
    avg_acc: float = json_field("points (-100 to 100)", _is_points, required=True)
    note: str = json_field(TEXT, is_str, default="reference minus per-sample, in points")


@dataclass(kw_only=True)
class RunRecord:
    """One run of one (strategy, benchmark, backbone, seed): what ``result.json`` holds.

    Read with :func:`load_record` (complete runs) or :func:`read_record` (any state), write with :meth:`write`. This
    declaration is the file's layout, said once: the JSON keys are the fields in this order (after
    ``schema_version``), the main protocol's metrics repeated at the top level after ``protocol`` (as every record
    since version 1 has them), fields marked ``where_set`` written only where set, and fields this clbench does not
    know (``extra``) last. Each field's :func:`json_field` says what it must be and whether a record may lack it;
    :data:`REQUIRED_FIELDS`, :data:`OPTIONAL_FIELDS` and :data:`LAYOUT` are derived from them."""

    run_id: str = json_field(NAME, is_name)  # older records lack it: the folder names the run
    complete: bool = json_field("true or false", is_bool, required=True)
    created: str | None = json_field("a string or null", or_none(is_str), default=None)  # ISO time of this write
    command: str | None = json_field("a string or null", or_none(is_str), default=None)
    # the run's defining settings (clbench.core.config.Fingerprint)
    fingerprint: Fingerprint | None = json_field(
        "an object or null", or_none(is_object), codec=Fingerprint, default=None
    )
    strategy: str = json_field(NAME, is_name, required=True)
    # the strategy's settings dataclass, as written: each method declares its own Config (plug-ins too), so its
    # fields are not the record's to declare (the strategy's Config checks them where a run builds one)
    strategy_config: JsonObject = json_field("an object", is_json_object, default_factory=dict)
    # the run's train_per_class (clbench.core.config.RunConfig): each task learnt from its first k images per class
    train_per_class: int | None = json_field(
        "an integer >= 1 or null", or_none(is_positive), where_set=True, default=None
    )
    profile: str | None = json_field(f"{NAME} or null", or_none(is_name), default=None)
    bench: str = json_field(NAME, is_name, required=True)
    n_classes: int | None = json_field("an integer >= 1 or null", or_none(is_positive), default=None)
    n_images: dict[str, int] | None = json_field(  # {"train": N, "test": N}
        "an object of split -> count or null",
        or_none(lambda v: isinstance(v, dict) and all(is_count(n) for n in v.values())),
        default=None,
    )
    # what data the run learnt from and was tested on: {"train": digest, "test": digest} of the splits' contents
    # (ImageSource.data_id); two records of other data never share a row, a pairing or a gate entry. Older records
    # lack it: unknown, which matches any data
    data_fingerprint: dict[str, str] | None = json_field(
        "an object of split -> digest or null",
        or_none(lambda v: isinstance(v, dict) and bool(v) and all(is_name(k) and is_name(d) for k, d in v.items())),
        where_set=True,
        default=None,
    )
    # the split the accuracies are on where it is not the test split: "validation" (--validation); records without
    # it were evaluated on the test split
    evaluated_on: str | None = json_field(f"{NAME} or null", or_none(is_name), where_set=True, default=None)
    # a validation run's split: fraction, split_seed, learnt_from, held_out, train_digest (clbench.run.validation)
    validation: JsonObject | None = json_field(
        "an object or null", or_none(is_json_object), where_set=True, default=None
    )
    # how the strategy's settings were chosen (`clbench tune`: search space, budget, tuning benchmark and split,
    # trials, best validation accuracy), as its summary file said (clbench.records.tuning)
    tuning: JsonObject | None = json_field("an object or null", or_none(is_json_object), where_set=True, default=None)
    task_sizes: list[int] = json_field(  # classes per task
        "a list of integers >= 1",
        lambda v: isinstance(v, list) and bool(v) and all(is_positive(n) for n in v),
        required=True,
    )
    # the run's scenario where it is not "class" (clbench.core.config.SCENARIO_CHOICES); records without it are
    # class-incremental runs (read them with ``record.scenario or "class"``)
    scenario: str | None = json_field(f"{NAME} or null", or_none(is_name), where_set=True, default=None)
    # the domain scenario: the benchmark's domain names in task order (task t = domain t)
    domains: list[str] | None = json_field(
        "a list of names or null", or_none(list_of(is_name)), where_set=True, default=None
    )
    class_order: list[int] = json_field("a list of integers >= 0", list_of(is_count), default_factory=list)
    class_order_seed: int = json_field("an integer >= 0", is_count, default=DEFAULT_CLASS_ORDER_SEED)
    class_names: list[str] | None = json_field(  # in class order
        "a list of names or null", or_none(list_of(is_name)), default=None
    )
    backbone: str = json_field(NAME, is_name, required=True)
    # "random-init(seed=...)", a file, a package ...
    weights_source: str | None = json_field("a string or null", or_none(is_str), default=None)
    weights_digest: str | None = json_field("a string or null", or_none(is_str), default=None)
    img_size: int | None = json_field("an integer >= 1 or null", or_none(is_positive), default=None)
    # the eval transform's identity (TransformSpec.identity)
    transform: str | None = json_field("a string or null", or_none(is_str), default=None)
    seed: int = json_field("an integer >= 0", is_count, required=True)
    device: str | None = json_field(f"{NAME} or null", or_none(is_name), default=None)
    # fp32 / bf16 / fp16 (records before --precision: from their autocast flag)
    precision: str = json_field(NAME, is_name, default="unknown")
    precision_reason: str | None = json_field("a string or null", or_none(is_str), default=None)
    # the main evaluation protocol (the first of ``protocols``); its metrics follow at the top level
    protocol: str = json_field(NAME, is_name, required=True, inline=ProtocolSummary)
    protocols: dict[str, ProtocolSummary] = json_field(  # every protocol evaluated, the main one included
        "an object of protocol -> metrics", is_object, part=ProtocolSummary, shape="map", default_factory=dict
    )
    params: Params = json_field(part=Params, required=True)
    time_s: Times = json_field(part=Times, required=True)
    per_task: list[TaskEntry] = json_field(
        "a list of task objects", list_of(is_object), part=TaskEntry, shape="list", default_factory=list
    )
    # "hit" / "miss" per split and segment
    feature_cache: list[str] = json_field("a list of names", list_of(is_name), default_factory=list)
    # `clbench data check` problems run anyway
    data_problems: list[str] = json_field("a list of strings", list_of(is_str), default_factory=list)
    # tasks done at each resume from a checkpoint
    resumed_from_task: list[int] = json_field("a list of integers >= 0", list_of(is_count), default_factory=list)
    # set when a resume found every task done already (its checkpoint said so): that segment trained nothing
    resume_warning: str | None = json_field("a string or null", or_none(is_str), where_set=True, default=None)
    peak_rss_mb: float | None = json_field(  # over every segment of the run
        "a number >= 0 or null", or_none(lambda v: is_real(v) and not v < 0), default=None
    )
    versions: dict[str, str] = json_field("an object", is_object, default_factory=dict)  # library versions
    git_revision: str | None = json_field("a string or null", or_none(is_str), default=None)
    # clbench.evaluation.metrics.DEFINITIONS when the run was made
    metric_definitions: dict[str, str] | None = json_field("an object or null", or_none(is_object), default=None)
    # predictions.npz beside the record (None: the run kept none)
    predictions: PredictionsFile | None = json_field(
        "an object with file, sha256, bytes and rows, or null", or_none(is_object), part=PredictionsFile, default=None
    )
    host: Host = json_field("an object", is_object, part=Host, default_factory=Host)
    protocol_gap: ProtocolGap | None = json_field(  # runs of both protocols
        "an object with last_acc and avg_acc (points, -100 to 100) or null",
        or_none(is_object),
        part=ProtocolGap,
        where_set=True,
        default=None,
    )
    # ISO time of the complete write
    finished: str | None = json_field("a string or null", or_none(is_str), where_set=True, default=None)
    # clbench.methods.training_check: set when training barely moved the trained parts (the run measures the backbone)
    training_warning: str | None = json_field("a string or null", or_none(is_str), where_set=True, default=None)
    # experiment trackers that failed (clbench.run.trackers)
    tracker_events: list[str] = json_field("a list of strings", list_of(is_str), where_set=True, default_factory=list)
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
        :mod:`clbench.methods.training_check`); None where not measured."""
        return self.per_task[0].reset_share if self.per_task else None

    @property
    def tasks_done(self) -> int:
        return len(self.per_task)

    @property
    def empty_resume(self) -> str | None:
        """Why a resume of this run added no task (its checkpoint had every task done), or None: the record's
        ``resume_warning``, or for a record written before it, a resume counted at the last task."""
        if self.resume_warning:
            return self.resume_warning
        if self.task_sizes and len(self.task_sizes) in self.resumed_from_task:
            n = len(self.task_sizes)
            return f"resumed from a checkpoint with every task ({n} of {n}) done: a segment trained nothing"
        return None

    # ------------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> Json:
        """The JSON object of ``result.json``, in its field order (:func:`clbench.files.typedfile.write`, with the main
        protocol's metrics after ``protocol``)."""
        out: Json = {"schema_version": SCHEMA_VERSION}
        for f, s in file_fields(RunRecord):
            value = getattr(self, f.name)
            if not (s.where_set and unset(value)):
                out[f.name] = write_value(s, value)
            if s.inline is not None:
                out.update(self.main.to_dict())
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: Json) -> RunRecord:
        """A record from a current-version JSON object whose fields :func:`field_problems` found sound."""
        protocols = data.get("protocols") or {}
        if data["protocol"] not in protocols:  # records that kept the main protocol at the top level only
            protocols = {data["protocol"]: {k: data[k] for k in SUMMARY_FIELDS if k in data}, **protocols}
        body = {k: v for k, v in data.items() if k not in SUMMARY_FIELDS and k != "schema_version"}
        per_task = [{"task": i, **t} for i, t in enumerate(data.get("per_task") or [])]
        return read(cls, {**body, "protocols": protocols, "per_task": per_task})

    @property
    def settings(self) -> dict[str, JsonValue]:
        """What the run trained with: its strategy's settings and the run-level ``train_per_class`` where set."""
        return trained_settings(self.strategy_config, self.train_per_class)

    def write(self, run_dir: Path | str) -> Path:
        """Write ``run_dir/result.json`` atomically (a reader sees the old record or the new one, never a torn
        file); return its path."""
        path = Path(run_dir) / RESULT_FILE
        atomic_write_json(path, self.to_dict(), standard=True)  # no NaN in the file: null (old_acc after task 1)
        return path


def trained_settings(strategy_config: JsonObject, train_per_class: int | None) -> dict[str, JsonValue]:
    """The settings a run trains with: the strategy's, and the run-level ``train_per_class`` where set (the one
    view of both that the gate's reference pins and the budget curves compare)."""
    return {**strategy_config, **({"train_per_class": train_per_class} if train_per_class is not None else {})}


# The top-level fields of result.json in the order written (the main summary after ``protocol``; where-set fields
# only where set; ``extra`` last), derived from RunRecord.
LAYOUT = tuple(f.name for f in dataclasses.fields(RunRecord) if f.name != "extra")
# Fields every record must have for the tables, figures and the gate (a record without one is refused, naming it),
# and fields a record may lack (older records do; a default stands in; one of another type is refused, naming it):
# both read from the declarations above.
REQUIRED_FIELDS: tuple[FieldCheck, ...] = tuple(check for check, required in declared_checks(RunRecord) if required)
OPTIONAL_FIELDS: tuple[FieldCheck, ...] = tuple(check for check, required in declared_checks(RunRecord) if not required)
V1_FIELDS: tuple[FieldCheck, ...] = (  # version 1 only, upgraded away
    (("autocast",), "true or false", lambda v: isinstance(v, bool)),
)


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
    found = typed_problems(RunRecord, data, version=version)
    if version == 1:
        found.wrong += [
            f"{'.'.join(path)} is {type(data[path[0]]).__name__} {short(data[path[0]])}, expected {expected}"
            for path, expected, ok in V1_FIELDS
            if path[0] in data and not ok(data[path[0]])
        ]
    return found.lines("record")
