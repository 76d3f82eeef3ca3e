"""Checkpoints: a run killed at any moment continues from its last finished task and ends with the record an
uninterrupted run would have written; and reading one never runs code from the file.

After a task the harness writes ``<run folder>/checkpoint.safetensors`` atomically (a temporary file in the same
folder, fsynced and renamed over the old one, :func:`clbench.files.atomic.atomic_write_bytes`), *before* that task's
``result.json``, so a record never claims more tasks than the checkpoint holds. Not after every task
(:class:`Cadence`): once the learning and evaluation since the last checkpoint took at least
``$CLBENCH_CHECKPOINT_S`` seconds (default :data:`DEFAULT_INTERVAL_S`) and at least as long as the last checkpoint
took to write, so that a run killed loses at most that much work, and a run whose tasks take milliseconds (a
closed-form head on cached features, whose checkpoints took longer than its learning) writes none. A finished run
deletes its checkpoint; ``CLBENCH_CHECKPOINT_S=0`` writes one after every task.

Format (version :data:`VERSION`): one `safetensors <https://huggingface.co/docs/safetensors>`_ file. Its tensors are the
strategy's (named ``strategy.<n>``) and the RNG states (``rng.torch``, ``rng.cuda.<i>``); its metadata holds ``format``
(``"clbench-checkpoint"``), ``version`` and ``checkpoint``, a JSON document with every other
field of :class:`Checkpoint`:

- ``config``: every :class:`~clbench.core.config.RunConfig` field (``clbench run --resume DIR`` reads them).
- ``fingerprint``: the fields that define the run (:data:`clbench.core.config.DEFINING_FIELDS`, backbone resolved to its
  name); a run with other values is refused, never continued.
- ``backbone_digest``, ``precision``, ``precision_reason`` and ``data`` (:class:`DataIdentity`: train/test content
  fingerprints, class order, task sizes): checked once the benchmark and backbone are loaded again.
- ``tasks_done``: tasks learnt and evaluated; the run continues with task ``tasks_done``.
- ``strategy``: :meth:`Strategy.save_state() <clbench.methods.contract.Strategy.save_state>`, the strategy's attributes
  as a JSON tree naming the tensors (:mod:`clbench.files.safestate`).
- ``rng``: the global RNG states (numpy's and Python's as numbers; torch's as tensors) after the task's evaluation.
  Strategies otherwise draw from ``ctx.generator(salt)``, fixed per task.
- ``logs``: per protocol, the accuracy rows and per-image predictions so far (:class:`ProtocolLogState`, which the
  harness's ``_ProtocolLog`` fills); ``per_task``: the record's per-task entries so far
  (:class:`~clbench.records.schema.TaskEntry`).
- ``times`` (:class:`~clbench.records.schema.Times`: seconds so far per phase), ``peak_rss_mb``, ``feature_cache``
(cache
  events so far), ``resumed_from_task`` (``tasks_done`` at every earlier resume): summed over the run's segments.
- ``git_revision``: the code that wrote it (a resume under other code is logged, not refused).

What reading trusts: nothing in the file. safetensors holds raw tensor bytes with a dtype and shape; the rest is JSON,
checked field by field against :class:`Checkpoint`'s declaration (:mod:`clbench.files.typedfile`), a refusal naming the
field; the strategy's state is rebuilt by the strategy class the run names (clbench's own code or a plug-in the user
chose), which makes only the classes it declares (``Strategy.state_types``) and torch's plain layers, without calling
their constructors, and imports nothing the file names. A tampered file can make a run learn or report wrong numbers (as
a tampered record can); it cannot run code. A file that is not a checkpoint, or is torn, is refused with one line.

Checkpoints of clbench before this format (``checkpoint.pt``, a pickle read with ``torch.load(weights_only=False)``)
are refused: unpickling runs whatever code the file carries. ``clbench run --trust-checkpoint`` converts one that the
user wrote themselves (:func:`convert_legacy`), after saying that it executes code from the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clbench.core import config
from clbench.core.catalog import STRATEGIES
from clbench.core.config import Fingerprint, RunConfig
from clbench.core.rng import RngState
from clbench.errors import ClbenchError, setting
from clbench.files import typedfile
from clbench.files.atomic import atomic_write_bytes
from clbench.files.escape import plain
from clbench.files.safestate import SavedState, encode, unknown_classes
from clbench.files.safety import special_file_problem
from clbench.files.typedfile import (
    COUNT,
    COUNTS,
    OBJECT,
    TEXT,
    JsonObject,
    is_count,
    is_int,
    is_json_object,
    is_name,
    is_number,
    is_object,
    is_positive,
    is_real,
    is_str,
    json_field,
    list_of,
    or_none,
)
from clbench.records.schema import RESULT_FILE, TaskEntry, Times

if TYPE_CHECKING:
    from clbench.benchmarks.base import Benchmark


CHECKPOINT_FILE = "checkpoint.safetensors"
LEGACY_FILE = "checkpoint.pt"  # the pickle format of clbench before version 2: refused (see the module docstring)
FORMAT = "clbench-checkpoint"
VERSION = 2
STRATEGY_PREFIX = "strategy."
_START_OVER = f"pass {setting('overwrite')} to start the run over"


# ----------------------------------------------------------------------------------------------- the checkpoint
def _is_any_number(v: Any) -> bool:  # NaN and infinities too: the harness checks what a value means
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_NUMBERS = "a list of numbers"
_NUMBER_LISTS = "a list of lists of numbers"
_INTEGER_LISTS = "a list of lists of integers"


@dataclass
class ProtocolLogState:
    """One protocol's evaluations so far, as the checkpoint holds them (``logs.<protocol>``); the harness's
    ``_ProtocolLog`` adds what fills them. The rows are the metrics logged per task
    (:data:`clbench.evaluation.declared.LOGGED`), named as the record names them. Every checkpoint holds the first
    five; ``task_aware_curve`` and the images (``index``, ``pred``, ``conf``) came later: a checkpoint without them
    reads as empty lists (not kept). Values are checked as JSON types here, their meanings by the harness on resume.
    Checkpoints written before the rows took the record's names read with their old names mapped
    (:data:`OLD_LOG_NAMES`)."""

    # R[t][j] in percent
    accuracy_matrix: list[list[float]] = json_field(
        _NUMBER_LISTS, list_of(list_of(_is_any_number)), required=True, default_factory=list
    )
    acc_curve: list[float] = json_field(_NUMBERS, list_of(_is_any_number), required=True, default_factory=list)
    # NaN after the first task (no old classes yet)
    old_acc: list[float] = json_field(_NUMBERS, list_of(_is_any_number), required=True, default_factory=list)
    new_acc: list[float] = json_field(_NUMBERS, list_of(_is_any_number), required=True, default_factory=list)
    top5_curve: list[float] = json_field(_NUMBERS, list_of(_is_any_number), required=True, default_factory=list)
    task_aware_curve: list[float] = json_field(_NUMBERS, list_of(_is_any_number), default_factory=list)
    # per image, per task: positions in the benchmark's test split, argmax of the logits, its softmax probability
    index: list[list[int]] = json_field(_INTEGER_LISTS, list_of(list_of(is_int)), default_factory=list)
    pred: list[list[int]] = json_field(_INTEGER_LISTS, list_of(list_of(is_int)), default_factory=list)
    conf: list[list[float]] = json_field(_NUMBER_LISTS, list_of(list_of(_is_any_number)), default_factory=list)


# The log rows' names in checkpoints written before they took the record's names -> their names now.
OLD_LOG_NAMES = {
    "matrix": "accuracy_matrix",
    "curve": "acc_curve",
    "old": "old_acc",
    "new": "new_acc",
    "top5": "top5_curve",
    "task_aware": "task_aware_curve",
}


def _renamed_logs(doc: Any) -> None:
    """Map the old row names of a checkpoint document's logs (:data:`OLD_LOG_NAMES`) to today's, in place; a name
    already present is left to the reader's checks."""
    logs = doc.get("logs") if isinstance(doc, dict) else None
    if not isinstance(logs, dict):
        return
    for log in logs.values():
        if isinstance(log, dict):
            for old, new in OLD_LOG_NAMES.items():
                if old in log and new not in log:
                    log[new] = log.pop(old)


@dataclass
class DataIdentity:
    """What a benchmark was when loaded (:func:`data_identity`): a resume on other data is refused."""

    train: str = json_field(TEXT, is_str, required=True)  # content fingerprints (ImageSource.fingerprint)
    test: str = json_field(TEXT, is_str, required=True)
    class_order: list[int] = json_field(COUNTS, list_of(is_count), required=True)
    task_sizes: list[int] = json_field(COUNTS, list_of(is_count), required=True)  # domain scenario: [n, 0, ...]
    extra: dict[str, Any] = field(default_factory=dict)  # keys this clbench does not know, kept as read


def _is_change(v: Any) -> bool:
    return is_real(v) or v == math.inf


@dataclass
class _SavedTaskEntry(TaskEntry):
    """What a per-task entry must be in a checkpoint (read as the :class:`~clbench.records.schema.TaskEntry` it is):
    its number is required (the record's position gives it; here nothing does), and ``trained_change`` may be infinite
    (only zero-initialised parts moved), which the record writes as null and the checkpoint keeps, so that a resumed run
    ends with the record an uninterrupted one writes."""

    task: int = json_field(COUNT, is_count, required=True)
    trained_change: float | None = json_field(
        "a number, Infinity or null", or_none(_is_change), where_set=True, default=None
    )


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A run between two tasks: everything :func:`clbench.run.harness.run` needs to continue it (see the module
    docstring for each field). Built and read only here and in the harness; :func:`save` / :func:`load` are the one
    writer and reader. The JSON fields are declared with :func:`~clbench.files.typedfile.json_field` (every one
    required); ``strategy`` and ``rng`` hold tensors, which the file keeps beside the JSON."""

    # every RunConfig field, as JSON: as the run's clbench wrote them (an earlier one lacks later fields, or holds
    # retired ones), so not a typed part; checked field by field where a resume builds the RunConfig
    # from it (clbench.core.config.resume_config)
    config: JsonObject = json_field("an object of run settings", is_json_object, required=True)
    fingerprint: Fingerprint = json_field(OBJECT, is_object, codec=Fingerprint, required=True)  # the defining fields
    backbone_digest: str = json_field(TEXT, is_str, required=True)
    # the precision the backbone ran at (fp32 | bf16 | fp16)
    precision: str | None = json_field("a string or null", or_none(is_str), required=True)
    precision_reason: str | None = json_field("a string or null", or_none(is_str), required=True)
    data: DataIdentity = json_field(part=DataIdentity, required=True)
    tasks_done: int = json_field("an integer >= 1", is_positive, required=True)
    strategy: SavedState  # Strategy.save_state(): JSON tree + named tensors
    rng: RngState
    logs: dict[str, ProtocolLogState] = json_field(
        "an object of protocol -> log", is_object, part=ProtocolLogState, shape="map", required=True
    )
    per_task: list[TaskEntry] = json_field(  # every task done
        "a list of task objects", list_of(is_object), part=_SavedTaskEntry, shape="list", required=True
    )
    times: Times = json_field(part=Times, required=True)  # seconds so far per phase
    peak_rss_mb: float = json_field("a number >= 0", lambda v: is_number(v) and v >= 0, required=True)
    resumed_from_task: list[int] = json_field(COUNTS, list_of(is_count), required=True)
    feature_cache: list[str] = json_field("a list of names", list_of(is_name), required=True)
    git_revision: str | None = json_field("a string or null", or_none(is_str), required=True)


def _problem(doc: Any) -> str | None:
    """What keeps the JSON document ``doc`` from being a checkpoint's, in one line naming the field; None if nothing."""
    if type(doc) is not dict:
        return "the checkpoint document is not a JSON object"
    return typedfile.problems(Checkpoint, doc).first()


def _from_doc(doc: dict[str, Any], strategy: SavedState, rng: RngState) -> Checkpoint:
    """The checkpoint of a document :func:`_problem` found sound, with the parts that live beside the JSON."""
    read = typedfile.read
    return Checkpoint(
        **{f.name: doc[f.name] for f, s in typedfile.file_fields(Checkpoint) if s.part is None and s.codec is None},
        fingerprint=Fingerprint.from_json(doc["fingerprint"]),
        data=read(DataIdentity, doc["data"]),
        logs={p: read(ProtocolLogState, log) for p, log in doc["logs"].items()},
        per_task=[read(TaskEntry, entry) for entry in doc["per_task"]],  # checked as _SavedTaskEntry
        times=read(Times, doc["times"]),
        strategy=strategy,
        rng=rng,
    )


def _plain(value: Any) -> Any:
    """``value`` as the JSON it will be read back as (numpy numbers to Python's, tuples to lists)."""

    def default(v: Any) -> Any:
        if isinstance(v, np.generic):
            return v.item()
        raise TypeError(f"a {type(v).__name__} cannot go in a checkpoint's JSON")

    return json.loads(json.dumps(value, default=default, allow_nan=True))


DEFAULT_INTERVAL_S = 10.0
INTERVAL_ENV = "CLBENCH_CHECKPOINT_S"


class Cadence:
    """When the harness writes a checkpoint (module docstring): after a task once the work since the last one
    (learning and evaluation seconds) reaches ``max(interval, seconds the last checkpoint took)``: a rent-or-buy
    rule, so the checkpoints never cost more than the work they protect, and a kill loses at most that much."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = float(interval_s)
        self.unsaved_s = 0.0  # learning and evaluation since the last checkpoint
        self.last_write_s = 0.0

    @classmethod
    def from_env(cls) -> Cadence:
        import os

        raw = os.environ.get(INTERVAL_ENV)
        if raw is None or raw.strip() == "":
            return cls(DEFAULT_INTERVAL_S)
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 <= value < float("inf"):  # also NaN
            raise ClbenchError(
                f"${INTERVAL_ENV} is {raw!r}, not a number of seconds",
                f"set it to seconds of work between checkpoints, e.g. {DEFAULT_INTERVAL_S:g} (0: after every "
                "task), or unset it",
            )
        return cls(value)

    def due(self, work_s: float) -> bool:
        """Count ``work_s`` seconds of a task just done; whether a checkpoint should be written now."""
        self.unsaved_s += max(0.0, work_s)
        return self.interval_s == 0 or self.unsaved_s >= max(self.interval_s, self.last_write_s)

    def written(self, seconds: float) -> None:
        self.unsaved_s, self.last_write_s = 0.0, float(seconds)


def save(path: Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` atomically: readers (and a resume after a kill) see the previous checkpoint or this one."""
    from safetensors.torch import save as save_tensors

    rng, rng_tensors = ckpt.rng.to_json()
    doc = _plain(typedfile.write(ckpt))
    doc.update(strategy=ckpt.strategy.tree, rng=rng)
    strategy_tensors = {n: t.detach().cpu().contiguous() for n, t in ckpt.strategy.tensors.items()}
    if any(not n.startswith(STRATEGY_PREFIX) for n in strategy_tensors):
        raise ValueError(f"strategy tensor names must start with {STRATEGY_PREFIX!r}")
    meta = {"format": FORMAT, "version": str(VERSION), "checkpoint": json.dumps(doc, allow_nan=True)}
    atomic_write_bytes(path, save_tensors({**strategy_tensors, **rng_tensors}, metadata=meta))


def load(path: Path) -> Checkpoint:
    """Read a checkpoint; a file that is not one (truncated, corrupted, tampered, another format) is a ClbenchError.
    Tensors come back on the CPU (the strategy moves its own to the run's device when it restores them)."""
    from safetensors import safe_open

    path = Path(path)
    special = special_file_problem(path)
    if special is not None:  # a FIFO would block the open; a device would be read forever
        raise ClbenchError(f"{path} is {special}, not a checkpoint clbench wrote", _START_OVER)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError("no clbench checkpoint metadata")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  (safe_open is not a dict)
    except Exception as e:  # not safetensors, truncated, unreadable: many kinds
        raise ClbenchError(
            f"{path} cannot be read as a clbench checkpoint ({type(e).__name__}: {str(e)[:200]})", _START_OVER
        ) from None
    if meta.get("version") != str(VERSION):
        raise ClbenchError(
            f"{path} is a version {str(meta.get('version'))[:20]} checkpoint; this clbench reads version {VERSION}",
            _START_OVER,
        )
    try:
        doc = json.loads(meta.get("checkpoint", ""))
        _renamed_logs(doc)
        problem = _problem(doc)
        if problem is not None:
            raise ValueError(problem)
        rng = RngState.from_json(doc.get("rng"), tensors)
    except (ValueError, RecursionError) as e:
        raise ClbenchError(f"{path} cannot be read as a clbench checkpoint ({str(e)[:200]})", _START_OVER) from None
    strategy = SavedState(doc.get("strategy"), {n: t for n, t in tensors.items() if n.startswith(STRATEGY_PREFIX)})
    problem = nonfinite_state(strategy)
    if problem is not None:  # found here, not by the first solve after it ("increase gamma" blamed the settings)
        raise ClbenchError(f"{path} cannot be continued: {problem}; no run writes that", _START_OVER)
    return _from_doc(doc, strategy, rng)


def nonfinite_state(state: SavedState) -> str | None:
    """Where the strategy state ``state`` holds a NaN or an infinity in a floating-point tensor or array (what a
    finished task leaves is finite: training stops on a non-finite loss, the solvers refuse non-finite weights), in
    a few words; None when every value is finite."""
    for name, t in state.tensors.items():
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                return f"its strategy tensor {name[len(STRATEGY_PREFIX) :]} holds {bad:,} NaN or infinite value(s)"
    for node in _nodes(state.tree):
        if "$ndarray" in node and isinstance(node.get("dtype"), str) and node["$ndarray"] in state.tensors:
            try:
                dtype = np.dtype(node["dtype"])
                if dtype.kind not in "fc":
                    continue
                values = np.frombuffer(state.tensors[node["$ndarray"]].numpy().tobytes(), dtype=dtype)
            except (TypeError, ValueError):
                continue  # not an array the decoder accepts either: refused there, naming it
            if not np.isfinite(values).all():
                return f"its strategy array {node['$ndarray'][len(STRATEGY_PREFIX) :]} holds NaN or infinite values"
    return None


def _nodes(tree: Any, limit: int = 1_000_000) -> list[dict[str, Any]]:
    """Every JSON object in ``tree`` (iteratively: a deep tree is refused by the decoder, not here)."""
    out: list[dict[str, Any]] = []
    stack = [tree]
    while stack and len(out) < limit:
        node = stack.pop()
        if isinstance(node, dict):
            out.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def restore_strategy(strategy: Any, saved: SavedState, path: Path) -> None:
    """``strategy.restore_state(saved)`` on a strategy just built from the run's settings, then refused (ClbenchError
    naming the file) where the restored state contradicts those settings: every value of the fresh state that is a
    setting's (an attribute named like a field of the strategy's config, holding that field's value, such as the
    analytic head's ``gamma``) must be the same after the restore, since learning never changes a setting. Settings
    of 0, "" or "auto" are left out: they ask the method to derive a value from the data."""
    cfg = strategy.cfg
    fields = {f: getattr(cfg, f) for f in getattr(cfg, "__dataclass_fields__", {})}
    # a setting of 0, "" or "auto" asks the method to derive the value from the data (RanDumb's gamma 0: 'scale')
    fields = {f: v for f, v in fields.items() if isinstance(v, (int, float, str)) and v not in (0, "", "auto")}
    before = {p: v for p, v in _setting_leaves(strategy.state_dict(), fields).items() if v == fields[p[-1]]}
    strategy.restore_state(saved)
    after = _setting_leaves(strategy.state_dict(), fields)
    for where, value in before.items():
        if where in after and after[where] != value:
            name = ".".join(where)
            raise ClbenchError(
                f"{path} cannot be continued: its strategy state sets {name} = {after[where]!r}, but this run's "
                f"settings give {where[-1]} = {value!r}; no run with these settings writes that",
                _START_OVER,
            )


def _setting_leaves(state: dict[str, Any], fields: dict[str, Any], limit: int = 100_000) -> dict[tuple[str, ...], Any]:
    """The numbers, strings and booleans in ``state`` (attributes, dict entries, sub-modules, followed to a bounded
    depth) held under the name of a config field, by their path of names."""
    out: dict[tuple[str, ...], Any] = {}
    seen: set[int] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [((k,), v) for k, v in state.items()]
    while stack and len(seen) < limit:
        where, value = stack.pop()
        if isinstance(value, (bool, int, float, str)):
            if where[-1] in fields:
                out[where] = value
            continue
        if id(value) in seen or len(where) > 12 or isinstance(value, (torch.Tensor, np.ndarray)):
            continue
        seen.add(id(value))
        if isinstance(value, torch.nn.Module):
            items = [(k, v) for k, v in vars(value).items() if not k.startswith("_")]
            items += list(value._modules.items())
        elif isinstance(value, dict):
            items = [(str(k), v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(value)]
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            items = list(vars(value).items())
        else:
            continue
        stack.extend(((*where, k), v) for k, v in items)
    return out


def check_strategy(ckpt: Checkpoint, path: Path, saved_types: dict[str, type]) -> None:
    """Refuse, before the run loads anything, a checkpoint whose strategy state names classes the run's strategy does
    not rebuild (:meth:`Strategy.saved_types <clbench.methods.contract.Strategy.saved_types>`)."""
    unknown = unknown_classes(ckpt.strategy, saved_types)
    if unknown:
        raise ClbenchError(
            f"{path} does not hold a {ckpt.config.get('strategy')} state: it names {', '.join(unknown[:3])}, a class "
            "this reader does not rebuild",
            _START_OVER,
        )


# ----------------------------------------------------------------------------------------------- old checkpoints
def refuse_legacy(folder: Path) -> None:
    """Refuse a run folder holding a checkpoint in the old pickle format (:data:`LEGACY_FILE`): reading it could run
    code. It is never opened here."""
    legacy = Path(folder) / LEGACY_FILE
    if legacy.exists() or legacy.is_symlink():
        raise ClbenchError(
            f"{legacy} cannot be read as a clbench checkpoint: it is in the old pickle format, which clbench no longer "
            "reads (unpickling runs any code the file holds)",
            f"{_START_OVER}; or, only for a run you made yourself, convert it with {setting('trust_checkpoint')}",
        )


def convert_legacy(folder: Path, say: Callable[[str], None]) -> bool:
    """``clbench run --trust-checkpoint``: rewrite ``folder``'s old pickle checkpoint in this format and delete it.
    This unpickles the file, which runs any code it carries: only for files the user wrote. Returns whether there
    was one to convert."""
    legacy = Path(folder) / LEGACY_FILE
    if not legacy.is_file():
        say(f"{folder} holds no {LEGACY_FILE}; nothing to convert")
        return False
    say(f"unpickling {legacy}: this executes any code the file carries")
    try:
        old = torch.load(str(legacy), map_location="cpu", weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, missing class: many kinds
        raise ClbenchError(f"{legacy} cannot be read as a clbench checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(old, dict) or old.get("format") != FORMAT or old.get("version") != 1:
        raise ClbenchError(f"{legacy} is not a version 1 clbench checkpoint", _START_OVER)
    try:
        for settings in (old["fingerprint"], old["config"]):  # before --precision: autocast true/false
            if "autocast" in settings and "precision" not in settings:
                settings["precision"] = "bf16" if settings.pop("autocast") else "fp32"
        strategy_cls = STRATEGIES.get(old["config"]["strategy"])
        strategy = encode(old["strategy"], strategy_cls.saved_types(), prefix=STRATEGY_PREFIX)
        rng = old["rng"]
        doc = {f.name: _plain(old[f.name]) for f, _ in typedfile.file_fields(Checkpoint) if f.name in old}
        _renamed_logs(doc)
        problem = _problem(doc)
        if problem is not None:
            raise ValueError(problem)
        ckpt = _from_doc(doc, strategy, RngState(rng["torch"], rng["numpy"], rng["python"], tuple(rng.get("cuda", ()))))
    except (KeyError, TypeError, ValueError) as e:
        raise ClbenchError(f"{legacy} cannot be converted ({type(e).__name__}: {e})", _START_OVER) from None
    save(Path(folder) / CHECKPOINT_FILE, ckpt)
    legacy.unlink()
    say(f"converted to {Path(folder) / CHECKPOINT_FILE}; {LEGACY_FILE} deleted")
    return True


# ----------------------------------------------------------------------------------------------- resume
def resume_config(run_dir: str | Path, given: dict[str, Any]) -> RunConfig:
    """The RunConfig of the run in ``run_dir`` (``clbench run --resume DIR``), from its checkpoint.

    ``given`` holds the settings the user passed explicitly (:func:`clbench.core.config.given_settings`); how they are
    reconciled with the checkpoint's is :func:`clbench.core.config.resume_config`."""
    path = Path(run_dir)
    config.check_resume_request(path, given)
    refuse_legacy(path)
    if not (path / CHECKPOINT_FILE).is_file():
        raise ClbenchError(
            _no_checkpoint_message(path, path / RESULT_FILE),
            "a run killed before its first task finished has no checkpoint; run the same command "
            f"without {setting('resume')} to start it over",
        )
    ckpt = load(path / CHECKPOINT_FILE)
    return config.resume_config(
        path, _without_paths(path / CHECKPOINT_FILE, ckpt.config, given), ckpt.fingerprint, given
    )


# Settings a checkpoint may hold that name a file or folder to open: a resume takes them only from the command line.
PATH_SETTINGS = {"data_root": "a data folder", "weights": "a weights file"}
# Settings that lower a barrier (run on data that fails its checks): never taken from a file, only from the command
# line of this resume.
TRUSTING_SETTINGS = ("ignore_data_problems",)


def _without_paths(ckpt_path: Path, saved: JsonObject, given: dict[str, Any]) -> JsonObject:
    """The checkpoint's settings ``saved`` with every path replaced by the one given on the command line (``given``):
    a checkpoint is a file someone may have handed over, so ``--resume`` opens no file or folder it names (a FIFO, a
    device, someone else's folder) unless the user names the same one again. Refused in one line, naming the setting
    and the path, when a path setting is not given. The settings that trust content (:data:`TRUSTING_SETTINGS`) are
    the command line's alone."""
    out = {k: v for k, v in saved.items() if k not in TRUSTING_SETTINGS}
    for name, what in PATH_SETTINGS.items():
        value = saved.get(name)
        if not isinstance(value, str) or (name == "weights" and value in config.WEIGHT_SOURCES):
            continue  # no path: nothing opened by name
        if given.get(name) is None:
            raise ClbenchError(
                f"{ckpt_path} names {what} ({plain(value)[:200]}); clbench opens no path a checkpoint names",
                f"to continue the run, give it again: {setting(name)} PATH (the one it was started with)",
            )
        out[name] = given[name]
    return out


def _no_checkpoint_message(path: Path, result: Path) -> str:
    try:
        complete = json.loads(result.read_text()).get("complete", False)
    except (OSError, ValueError, AttributeError):
        complete = None
    if complete:
        return f"{setting('resume')} {path}: the run is finished; there is nothing to continue"
    return f"{setting('resume')} {path}: no {CHECKPOINT_FILE} to continue from"


# ----------------------------------------------------------------------------------------------- inputs
def data_identity(bench: Benchmark) -> DataIdentity:
    """What the loaded benchmark is: content fingerprints, class order, task sizes."""
    return DataIdentity(
        train=bench.train.fingerprint(),
        test=bench.test.fingerprint(),
        class_order=[int(c) for c in bench.class_order],
        task_sizes=[int(n) for n in bench.task_sizes],
    )


CACHE_EVENTS = ("hit", "miss", "corrupt", "unsaved")  # clbench.features.cache.FeatureCache.events


def impossible_values(ckpt: Checkpoint, bench: Benchmark) -> str | None:
    """What in a checkpoint's values (of the right JSON types) no run of ``bench`` writes, in a few words; None when
    they fit. Beside the counts the harness checks: each task's classes must be the ones that task brings (class
    scenario; in the domain scenario, class ids of the benchmark), the feature-cache events must be cache events,
    and each task's training diagnostics in their ranges (a share in [0, 1], a relative change >= 0): a tampered
    value would otherwise pass into the record as the run's."""
    for t, entry in enumerate(ckpt.per_task):
        classes = list(entry.classes)
        if bench.scenario == "class" and t < bench.n_tasks and sorted(classes) != bench.classes_of_task(t):
            return f"its task {t + 1} entry names classes {classes[:6]}, not the {bench.task_sizes[t]} that task brings"
        if any(c >= bench.n_classes for c in classes):
            return f"its task {t + 1} entry names a class outside the benchmark's {bench.n_classes}"
        share, change = entry.reset_share, entry.trained_change
        if share is not None and not (share != share or 0 <= share <= 1):  # share != share: NaN, not measured
            return f"its task {t + 1} reset_share is {share}, not a share in [0, 1]"
        if change is not None and change < 0:
            return f"its task {t + 1} trained_change is {change}, not a relative change (>= 0)"
    odd = sorted(set(ckpt.feature_cache) - set(CACHE_EVENTS))
    if odd:
        return f"its feature-cache events include {odd[0][:40]!r}, not one of {', '.join(CACHE_EVENTS)}"
    return None


def check_inputs(
    ckpt: Checkpoint, path: Path, backbone_digest: str, precision: str, precision_reason: str, data: DataIdentity
) -> None:
    """Refuse to continue when the backbone weights (``backbone_digest``), the precision the backbone runs at or the
    data (:func:`data_identity`) differ from those the checkpoint was made with."""
    if ckpt.backbone_digest != backbone_digest:
        raise ClbenchError(
            f"{path} was made with other backbone weights (digest {ckpt.backbone_digest[:12]}, "
            f"now {backbone_digest[:12]}); it cannot be continued",
            f"restore the weights file it was started with, or pass {setting('overwrite')} to start over",
        )
    saved_precision = ckpt.precision or ckpt.fingerprint.get("precision")
    if saved_precision in ("fp32", "bf16", "fp16") and saved_precision != precision:
        raise ClbenchError(
            f"{path} was made at precision {saved_precision}; here the backbone runs at "
            f"{precision} ({precision_reason})",
            f"continue it with {setting('precision')} {saved_precision}, or pass {setting('overwrite')} to start over",
        )
    changed = [
        f.name for f, _ in typedfile.file_fields(DataIdentity) if getattr(ckpt.data, f.name) != getattr(data, f.name)
    ]
    if changed:
        raise ClbenchError(
            f"{path}: the benchmark data changed since the checkpoint ({', '.join(changed)} differ); "
            f"it cannot be continued",
            f"restore the data, or pass {setting('overwrite')} to start over",
        )
