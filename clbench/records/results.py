"""Reading the run record (``result.json``): the one place that reads it, checks it field by field and upgrades it
to the current schema version on load (its layout: :mod:`clbench.records.schema`; its versions:
:mod:`clbench.records.versions`).

A record is written atomically after every task with ``complete: false`` and once more at the end with
``complete: true`` (:meth:`~clbench.records.schema.RunRecord.write`); readers (reports, checks) use only complete
records (:func:`load_record`), the sweep also unfinished ones (:func:`read_record`). ``SCHEMA_VERSION`` changes
when a field changes meaning; older readable versions are upgraded on load, others refused with a message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files.safety import load_json
from clbench.files.typedfile import is_int
from clbench.records.schema import RESULT_FILE, Json, RunRecord, field_problems
from clbench.records.versions import OLDEST_READABLE, OLDEST_UPGRADABLE, SCHEMA_VERSION, UPGRADE_COMMAND, UPGRADES

RUN_HINT = "rerun it with this clbench (`clbench run ...` with the record's command) or leave the folder out"


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
    if len(data.get("per_task") or []) > tasks:
        raise ClbenchError(f"{path}: {len(data['per_task'])} per-task entries for {tasks} tasks")
    if any(r > tasks for r in data.get("resumed_from_task") or []):
        raise ClbenchError(
            f"{path}: resumed_from_task {data['resumed_from_task'][:8]} counts more than its {tasks} tasks"
        )
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


def _check_version(path: Path, data: Json, oldest: int = OLDEST_READABLE) -> int:
    """``data``'s schema version, refused (naming the fix) outside ``oldest`` to :data:`SCHEMA_VERSION`."""
    version = data.get("schema_version")
    if not is_int(version):
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
    if OLDEST_UPGRADABLE <= version < oldest:
        folder = path.parent if path.name == RESULT_FILE else path
        raise ClbenchError(
            f"{path}: schema version {version} predates one parameter accounting (schema 4); only its method's code "
            f"can restate its parameter counts, and reading records runs none",
            f"upgrade it once: `{UPGRADE_COMMAND} {folder}` (rewrites every old record under the folder in place, "
            "numbers unchanged)",
        )
    if version < oldest:
        raise ClbenchError(
            f"{path}: schema version {version} (this clbench reads {OLDEST_READABLE} to {SCHEMA_VERSION}, and "
            f"`{UPGRADE_COMMAND}` rewrites {OLDEST_UPGRADABLE} to {OLDEST_READABLE - 1})",
            RUN_HINT,
        )
    return version


def _checked(
    path: Path, data: Json, upgrades: Mapping[int, Callable[[Json], Json]] = UPGRADES, oldest: int = OLDEST_READABLE
) -> Json:
    """``data`` checked field by field and upgraded to the current schema version (``upgrades`` from ``oldest``:
    the readers' pure-JSON ones; :mod:`clbench.records.upgrade` passes the older ones too)."""
    version = _check_version(path, data, oldest)
    problems = field_problems(data, version)
    if problems:
        raise ClbenchError(f"{path}: {'; '.join(problems)}", RUN_HINT)
    while version < SCHEMA_VERSION:
        data, version = upgrades[version](data), version + 1
    if "run_id" not in data:  # the folder names the run
        data = {**data, "run_id": path.parent.name}
    return data


def _build(path: Path, data: Json) -> RunRecord:
    try:
        return RunRecord.from_dict(data)
    except (KeyError, TypeError, ValueError) as e:  # a field the checks above let through in a shape from_dict lacks
        raise ClbenchError(f"{path}: a field has an unexpected shape ({type(e).__name__}: {e})", RUN_HINT) from None
