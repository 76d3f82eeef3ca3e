"""The run folder a run owns: its exclusive lock, the checks on ``out`` (a writable folder that is new, empty or a
clbench run folder), the free space a run needs, the temporaries a killed process left, and the checkpoint of an
unfinished run to continue from. :mod:`clbench.files.safety` holds the low-level owned-file helpers used here.

Imports neither torch nor the runner: the CLI, sweeps and trackers check folders with it before anything loads.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clbench.core.catalog import STRATEGIES
from clbench.core.config import Fingerprint, RunConfig
from clbench.errors import ClbenchError, setting
from clbench.files.safety import (
    FOLDER_MARK,
    check_output_folder,
    folder_mark,
    is_empty_folder,
    load_json,
    mark_folder,
    open_lock,
    remove_own_tmp,
)
from clbench.records.predictions import PREDICTIONS_FILE
from clbench.records.results import record_says_complete
from clbench.records.schema import RESULT_FILE

if TYPE_CHECKING:
    from clbench.run.checkpoint import Checkpoint

# Settings named in this module's messages: their Python names in str(error), their flags on the command line.
OUT, OVERWRITE, RESUME = setting("out"), setting("overwrite"), setting("resume")


class RunDir:
    """The run folder: holds an exclusive lock while running, refuses a finished run unless overwriting, and finds
    the checkpoint of an unfinished one (:mod:`clbench.run.checkpoint`) so that the run continues from it."""

    def __init__(self, path: Path, overwrite: bool) -> None:
        self.path = path
        check_folder(path, "out")
        check_run_folder(path)
        fresh = is_empty_folder(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            if fresh:  # the mark first: a run killed before its record is still recognised as clbench's
                mark_folder(path, "run")
            self._lock = open_lock(path / LOCK_FILE)
        except OSError as e:
            raise ClbenchError(
                f"{OUT} {path}: cannot write the run folder ({e.strerror or e})", "choose a folder you can write to"
            ) from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ClbenchError(
                f"another clbench process is writing to {path}", f"wait for it to finish or choose another {OUT}"
            ) from None
        try:
            self._check(overwrite)
            mark_folder(path, "run")  # a run folder an older clbench made (told by its record): marked as it is used
        except BaseException:
            self.release()
            raise

    @property
    def checkpoint_path(self) -> Path:
        # deferred: loads torch, which importing this module does not
        from clbench.run.checkpoint import CHECKPOINT_FILE

        return self.path / CHECKPOINT_FILE

    def _check(self, overwrite: bool) -> None:
        remove_own_tmp(self.path)  # left by a process killed mid-write (clbench.files.atomic.atomic_write_bytes)
        # deferred: loads torch, which importing this module does not
        from clbench.run.checkpoint import LEGACY_FILE, refuse_legacy

        result = self.path / RESULT_FILE
        if overwrite:  # the checkpoint first: a kill in between leaves a record that cannot be continued
            self.checkpoint_path.unlink(missing_ok=True)
            (self.path / LEGACY_FILE).unlink(missing_ok=True)
            result.unlink(missing_ok=True)
            return
        refuse_legacy(self.path)  # never unpickled
        if not result.exists():
            return
        if record_says_complete(result):
            raise ClbenchError(
                f"{OUT} {self.path} already holds a finished run",
                f"pass {OVERWRITE} to replace it, or choose another {OUT}",
            )
        if not self.checkpoint_path.exists():
            raise ClbenchError(
                f"{OUT} {self.path} already holds an unfinished run without a checkpoint to continue from",
                f"pass {OVERWRITE} to replace it, or choose another {OUT}",
            )

    def resumable(self, fingerprint: Fingerprint, required: bool) -> Checkpoint | None:
        """The checkpoint to continue from (None: start afresh). Refuses one made with other settings."""
        # deferred: loads torch, which importing this module does not
        from clbench.run import checkpoint

        if not self.checkpoint_path.exists():
            if required:
                raise ClbenchError(
                    f"{RESUME} {self.path}: no {self.checkpoint_path.name} to continue from",
                    f"run the same command without {RESUME} to start it over",
                )
            return None
        ckpt = checkpoint.load(self.checkpoint_path)
        diff = ckpt.fingerprint.differences(fingerprint)
        if diff:
            raise ClbenchError(
                f"{OUT} {self.path} holds an unfinished run with other settings ({'; '.join(diff)})",
                f"continue it with {RESUME} {self.path}, pass {OVERWRITE} to start over, or choose another {OUT}",
            )
        checkpoint.check_strategy(
            ckpt, self.checkpoint_path, STRATEGIES.get(str(fingerprint["strategy"])).saved_types()
        )
        return ckpt

    def start_afresh(self) -> None:
        """No checkpoint to continue from: drop the record and predictions an earlier attempt left."""
        (self.path / RESULT_FILE).unlink(missing_ok=True)
        (self.path / PREDICTIONS_FILE).unlink(missing_ok=True)

    def release(self) -> None:
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def check_folder(path: Path, name: str) -> None:
    """Refuse a folder that cannot hold files: one under a regular file, a file itself, inside a pseudo file system
    (/proc, /sys, /dev), or whose nearest existing parent is not writable. Creates nothing. ``name``: the setting
    that gave the folder (``out``, ``cache``), as the messages call it."""
    flag = setting(name)
    path = Path(path).expanduser()
    absolute = Path(os.path.abspath(path))
    if absolute.parts[1:2] and absolute.parts[1] in ("proc", "sys", "dev"):
        raise ClbenchError(
            f"{flag} {path} is inside /{absolute.parts[1]}, a pseudo file system that holds no ordinary files",
            f"choose another {flag}",
        )
    if path.exists() and not path.is_dir():
        raise ClbenchError(f"{flag} {path} is a file, not a folder", f"choose another {flag}")
    parent = absolute
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ClbenchError(
            f"{flag} {path}: {parent} is a file, so no folder can be made under it", f"choose another {flag}"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        why = "it is on a read-only file system" if _read_only(parent) else "it is not writable by this user"
        raise ClbenchError(f"{flag} {path}: cannot write in {parent} ({why})", f"choose another {flag}")


LOCK_FILE = ".lock"
ATTEMPT_FILE = "attempt.json"  # clbench.sweep.plan.ATTEMPT_FILE (that module imports the harness)
# The files that make a folder a run folder clbench made, each only by its content: the folder's mark file (written
# before anything else), the record, or the attempt file a sweep worker writes before the run starts. A file merely
# named like them (a `.lock` of another program, an `attempt.json` of a grading script) makes nothing a run folder.
RUN_FOLDER_MARKS = (FOLDER_MARK, RESULT_FILE, ATTEMPT_FILE)
_ATTEMPT_KEYS = ("sweep", "run_id", "started_at", "host", "pid")  # what clbench.sweep.worker writes


def _clbench_json(path: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a regular file, not a link) when it holds every one of ``keys``, else None."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = load_json(path, "run folder file")
    except ClbenchError:
        return None
    return data if isinstance(data, dict) and all(k in data for k in keys) else None


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is a run folder clbench made: its mark file says so, or it holds a clbench record (a JSON
    object with an integer ``schema_version`` and ``complete``, as every schema version has) or a sweep worker's
    attempt file. Committed run folders (``reports/**/runs/*``) are recognised by their records."""
    path = Path(path)
    mark = folder_mark(path)
    if mark is not None:
        return mark == "run"
    record = _clbench_json(path / RESULT_FILE, ("schema_version", "complete"))
    if record is not None and type(record["schema_version"]) is int:
        return True
    return _clbench_json(path / ATTEMPT_FILE, _ATTEMPT_KEYS) is not None


def check_run_folder(path: Path) -> None:
    """Refuse an existing folder that is neither empty nor a clbench run folder (:func:`is_run_folder`): ``out``
    names the run's own folder, and clbench writes, replaces and deletes files in it. Writes nothing."""
    check_output_folder(path, "run", setting("out"), is_run_folder, example="run")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_free_space(path: Path, need: int, name: str, what: str) -> None:
    """Refuse to start when the file system of ``path`` (given by setting ``name``) has less than
    ``need`` bytes free."""
    flag = setting(name)
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return
    if free < need:
        raise ClbenchError(
            f"{flag} {path}: {free / 2**20:.1f} MB free, but {what} need about {need / 2**20:.1f} MB",
            f"free disk space or choose another {flag}",
        )


def estimate_run_bytes(d: int, n_test: int, n_classes: int, n_tasks: int) -> int:
    """A generous estimate of what a run folder will hold, for a backbone of ``d`` features and a benchmark of
    ``n_test`` test images, ``n_classes`` classes and ``n_tasks`` tasks: the record, the checkpoint (class statistics
    and the strategy's modules, twice while it is replaced) and features.npz (fp16, frozen and adapted)."""
    record = 256 * 2**10 + 16 * 2**10 * n_tasks
    checkpoint = 2 * (16 * d * n_classes + 8 * 2**20)
    features = 2 * 2 * d * n_test + 8 * n_test
    return record + checkpoint + features


def default_run_dir(cfg: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.strategy}-{cfg.bench}-s{cfg.seed}-{stamp}"
