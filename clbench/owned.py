"""Files clbench creates and files it reads that others may have written (the threat model: reports/README.md).

Creating: locks are opened with ``O_NOFOLLOW`` and must be regular files (a planted symbolic link named ``.lock`` is
refused, never followed and truncated); temporary files carry the prefix :data:`TMP_PREFIX`, are made with
``O_EXCL`` (``tempfile.mkstemp``), and only files with that prefix are ever swept up; a sub-folder clbench writes
into (``figures/``) must be a real folder inside its parent, not a link leading out of it.

Reading: :func:`read_bytes` opens without blocking, refuses anything that is not a regular file (a FIFO, a device
such as ``/dev/zero``, a socket), and reads at most a size limit; :func:`load_json` adds a nesting limit and maps
every failure to one :class:`~clbench.errors.ClbenchError` line naming the file. Every loader of a record, a gate
reference, a sweep manifest or a calibration file goes through :func:`load_json`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import IO, Any

from clbench.errors import ClbenchError

TMP_PREFIX = ".clbench-tmp."  # every temporary file clbench makes starts with this (clbench.files.atomic_write_bytes)
TMP_SUFFIX = ".tmp"
JSON_MAX_BYTES = 64 * 2**20  # a record with per-task routing diagnostics of a 100-task run stays far below
JSON_MAX_DEPTH = 64  # records nest 5 deep; references 4


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def special_file_problem(path: Path | str) -> str | None:
    """None for a regular file (after following links), else what it is (``a FIFO (named pipe)``, ...)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None if stat.S_ISREG(mode) else _kind(mode)


# ------------------------------------------------------------------------------------------- creating
def open_lock(path: Path) -> IO[str]:
    """Open (creating) the lock file ``path`` for ``fcntl.flock``, refusing a symbolic link or anything but a regular
    file there. Raises ClbenchError naming the path; OSError for an unwritable folder (the caller decides)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError:
        if path.is_symlink():
            raise ClbenchError(
                f"{path} is a symbolic link; clbench refuses to open a lock through a link",
                "delete the link (someone else made it) and run again",
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ClbenchError(f"{path} is {_kind(st.st_mode)}, not a lock file clbench made", "delete it and run again")
    return os.fdopen(fd, "w")


def open_append(path: Path) -> IO[str]:
    """Open the text file ``path`` for appending (a log clbench writes), creating it; a symbolic link or a special
    file there is refused (ClbenchError), so that nothing is appended to a file elsewhere."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if path.is_symlink():
            raise ClbenchError(f"{path} is a symbolic link; clbench writes its logs only to files it made") from None
        raise ClbenchError(f"{path}: cannot write it ({e.strerror or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ClbenchError(f"{path} is {_kind(st.st_mode)}, not a log file clbench made", "delete it and run again")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", buffering=1)


def owned_folder(parent: Path, name: str, what: str) -> Path:
    """``parent/name``, made if missing; refused when it is a symbolic link or not a folder, so that nothing is
    written (or deleted) outside ``parent`` through it."""
    path = Path(parent) / name
    if path.is_symlink():
        raise ClbenchError(
            f"{what} {parent}: {name}/ is a symbolic link (to {os.readlink(path)}); clbench writes only into "
            "folders inside the output folder",
            f"delete the link {path} or choose another {what}",
        )
    if path.exists() and not path.is_dir():
        raise ClbenchError(f"{what} {parent}: {name} is a file, not a folder", f"delete it or choose another {what}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_own_tmp(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a temporary file clbench made (its prefix and suffix; a regular file, not a link)."""
    return (
        entry.name.startswith(TMP_PREFIX) and entry.name.endswith(TMP_SUFFIX) and entry.is_file(follow_symlinks=False)
    )


def remove_own_tmp(folder: Path) -> None:
    """Delete the temporary files a killed clbench left in ``folder``; nothing else."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if is_own_tmp(entry):
            try:
                os.unlink(entry.path)
            except OSError:
                pass


# ------------------------------------------------------------------------------------------- reading
def read_bytes(path: Path | str, limit: int, what: str, name: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``; a FIFO, device, socket or folder, a file over the
    limit, or one that cannot be read is refused with one line ``NAME: why`` (``name``: how the message names the
    file, e.g. ``--reference PATH``; default the path). ``what``: the kind of file (``run record``)."""
    path = Path(path)
    name = name or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO does not hang the open
    except OSError as e:
        raise ClbenchError(f"{name}: cannot read it ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ClbenchError(f"{name}: it is {_kind(st.st_mode)}, not a regular file", f"give a {what} file")
        too_big = ClbenchError(
            f"{name}: it is larger than the {limit / 2**20:g} MB a {what} may be", f"give the {what} file clbench wrote"
        )
        if st.st_size > limit:
            raise too_big
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while being read
                raise too_big
        return b"".join(chunks)
    except OSError as e:
        raise ClbenchError(f"{name}: cannot read it ({e.strerror or e})") from None
    finally:
        os.close(fd)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: linear on a multi-megabyte string
_BRACKETS = re.compile(rb"[\[\]{}]")


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON text (brackets inside strings not counted)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRING.sub(b'""', data)):
        if m.group(0) in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def load_json(
    path: Path | str,
    what: str,
    *,
    name: str | None = None,
    hint: str | None = None,
    limit: int = JSON_MAX_BYTES,
    max_depth: int = JSON_MAX_DEPTH,
) -> Any:
    """The JSON value in ``path``, read with :func:`read_bytes` and refused (one ClbenchError line ``NAME: why``)
    when nested deeper than ``max_depth``, not UTF-8, not JSON, or holding an integer of more digits than Python
    converts. ``what`` names the kind of file (``run record``, ``reference``), ``name`` the file (default: the path)."""
    name = name or str(path)
    data = read_bytes(path, limit, what, name)
    if nesting_depth(data) > max_depth:  # before json.loads, whose recursion a deep file would exhaust
        raise ClbenchError(f"{name}: JSON nested more than {max_depth} levels deep, not a {what}", hint)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, bad UTF-8, an int of > 4300 digits
        raise ClbenchError(f"{name}: not a readable JSON {what} ({str(e)[:120]})", hint) from None
