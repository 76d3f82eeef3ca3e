"""Files clbench creates and files it reads that others may have written (the threat model: reports/README.md).

Creating: locks are opened with ``O_NOFOLLOW`` and must be regular files (a planted symbolic link named ``.lock`` is
refused, never followed and truncated); temporary files carry the prefix :data:`TMP_PREFIX`, are made with ``O_EXCL``
(``tempfile.mkstemp``), and only files with that prefix are ever swept up; a sub-folder clbench writes into
(``figures/``, a sweep's ``runs/`` and ``report/``, a tracker's ``tensorboard/``, the cache's ``features/``,
``machine/``, ``weights/`` and ``wheels/``) must be a real folder inside its parent, not a link leading out of it; a
folder name taken from a file (a config's group, a record's run id) is one path component (:func:`folder_name_problem`).

Output folders: ``--out`` of a run, a sweep or a report is new, empty, or a folder clbench made, told by its mark
file :data:`FOLDER_MARK` (JSON naming the kind of folder, written first) or by clbench's own record of that kind;
a folder of other files is refused before anything is written (:func:`check_output_folder`).

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
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from clbench.errors import ClbenchError

TMP_PREFIX = (
    ".clbench-tmp."  # every temporary file clbench makes starts with this (clbench.files.atomic.atomic_write_bytes)
)
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


def owned_folder(parent: Path, name: str, what: str, create: bool = True) -> Path:
    """``parent/name``, made if missing (``create``; else only checked); refused when it is a symbolic link or not
    a folder, so that nothing is written (or deleted) outside ``parent`` through it."""
    path = Path(parent) / name
    if path.is_symlink():
        raise ClbenchError(
            f"{what} {parent}: {name}/ is a symbolic link (to {os.readlink(path)}); clbench writes only into "
            "real folders inside the folders it was given",
            f"delete the link {path} or choose another {what}",
        )
    if path.exists() and not path.is_dir():
        raise ClbenchError(f"{what} {parent}: {name} is a file, not a folder", f"delete it or choose another {what}")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


# A name clbench makes a folder of (a sweep group, a run id under a tracker's folder): one path component.
NAME_MAX_BYTES = 255  # the longest file name ext4, XFS, APFS and NTFS take
_NAME_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")  # clbench.files.escape


def folder_name_problem(name: object) -> str | None:
    """Why ``name`` (from a file someone else wrote: a config's group, a record's run id) cannot be the name of a
    folder clbench makes inside the folder it was given, or None: it must be one path component (not empty, not
    ``.`` or ``..``, no ``/`` or ``\\``), without control characters, at most 255 bytes."""
    if not isinstance(name, str) or not name.strip():
        return "it is empty" if isinstance(name, str) else f"it is {type(name).__name__}, not a name"
    if name in (".", ".."):
        return f"{name!r} names no folder of its own (it is the folder itself or its parent)"
    if "/" in name or "\\" in name:
        return "it holds a path separator (/ or \\): a folder name is one path component"
    if _NAME_CONTROL.search(name):
        return "it holds a control character"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
        return f"it is longer than {NAME_MAX_BYTES} bytes"
    return None


# ------------------------------------------------------------------------------------------- output folders
# An output folder (``run --out``, ``sweep --out``, ``report --out`` ...) is new, empty, or one clbench made: it holds
# the mark file below, whose content names the kind of folder, or (for folders an older clbench made) clbench's own
# record of that kind (a run's result.json, a sweep's sweep.json, a report's report.json). A file merely named like
# one of clbench's (``.lock``, ``attempt.json``) makes no folder clbench's.
FOLDER_MARK = ".clbench-folder"
MARK_FORMAT = "clbench-folder"
MARK_MAX_BYTES = 4096
FOLDER_KINDS = {"run": "run folder", "sweep": "sweep folder", "report": "report folder"}


def folder_mark(path: Path) -> str | None:
    """The kind named by the mark file in ``path`` (``run``, ``sweep``, ``report``), or None: no mark, a link or a
    special file there, or content that is not clbench's mark."""
    mark = Path(path) / FOLDER_MARK
    if mark.is_symlink() or not mark.is_file():
        return None
    try:
        data = load_json(mark, "folder mark", limit=MARK_MAX_BYTES, max_depth=2)
    except ClbenchError:
        return None
    if not isinstance(data, dict) or data.get("format") != MARK_FORMAT or data.get("kind") not in FOLDER_KINDS:
        return None
    return str(data["kind"])


def default_file_mode() -> int:
    """The permissions a file made by ``open()`` gets: 0o666 less the process's umask (``mkstemp`` gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a fresh temporary beside it, then a rename. The file gets the
    user's umask like any other file (records and reports are shared; ``mkstemp``'s 0600 broke that)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: O_EXCL, a fresh name; the prefix marks it as clbench's, the only kind clbench.files.safety sweeps up
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ClbenchError(
            f"could not write {path}: {e.strerror or e}", "free disk space or choose another folder"
        ) from None


def mark_folder(path: Path, kind: str) -> None:
    """Write ``path``'s mark file (``kind``: a key of :data:`FOLDER_KINDS`) unless it is there already: the first
    thing clbench writes in an output folder, so that a folder it made is recognised even before its record exists.
    The folder must have passed :func:`check_output_folder`."""
    if folder_mark(path) == kind:
        return
    text = json.dumps({"format": MARK_FORMAT, "kind": kind, "note": f"a clbench {FOLDER_KINDS[kind]}"}) + "\n"
    atomic_write_bytes(Path(path) / FOLDER_MARK, text.encode())


def starts_with(path: Path, prefix: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) whose content begins with ``prefix``; reads only that much."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(prefix)) == prefix
    except OSError:
        return False
    finally:
        os.close(fd)


def foreign_entries(path: Path) -> list[str] | None:
    """The names in the folder ``path`` other than clbench's own temporaries (which a killed clbench leaves); None
    where ``path`` is missing or cannot be listed (made later, or refused when written)."""
    try:
        return [e.name for e in os.scandir(path) if not is_own_tmp(e)]
    except OSError:
        return None


def is_empty_folder(path: Path) -> bool:
    """Whether ``path`` is missing, or a folder holding nothing but clbench's own temporaries."""
    return not foreign_entries(path)


def check_output_folder(
    path: Path, kind: str, flag: str, recognise: Callable[[Path], bool] | None = None, example: str = "out"
) -> None:
    """Refuse an existing folder ``path`` (given by ``flag``) that is neither empty nor a clbench folder of ``kind``
    (its mark file, or ``recognise(path)``: clbench's own record of that kind, for folders an older clbench made):
    clbench writes, replaces and deletes files in it. Writes nothing."""
    path = Path(path)
    if not foreign_entries(path):
        return
    mark = folder_mark(path)
    if mark == kind or (mark is None and recognise is not None and recognise(path)):
        return
    what = FOLDER_KINDS[kind]
    if mark is not None:
        raise ClbenchError(
            f"{flag} {path} is a clbench {FOLDER_KINDS[mark]}, not a {what}",
            f"give a new or empty folder, e.g. {flag} {path / example}",
        )
    raise ClbenchError(
        f"{flag} {path} is a folder of other files ({len(os.listdir(path))} entries), not a clbench {what}",
        f"give a new or empty folder, e.g. {flag} {path / example}",
    )


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


def npz_arrays(data: bytes, limit: int) -> dict[str, Any]:
    """The arrays of the ``.npz`` bytes ``data`` (numpy arrays, never unpickled), each member's ``.npy`` header checked
    before anything is allocated: its element count times item size must be the bytes the member holds (a header
    claiming 2^40 elements in a small file is refused, not allocated), an object dtype is refused, and the members
    together may expand to at most ``limit`` bytes. Raises ValueError saying why (the caller names the file)."""
    import io
    import math
    import zipfile

    import numpy as np

    headers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = zf.infolist()
            expanded = sum(i.file_size for i in members)
            if expanded > limit:
                raise ValueError(f"{expanded:,} bytes expanded, more than {limit:,}")
            arrays: dict[str, Any] = {}
            for info in members:
                name = info.filename[:60]
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"member {name!r} is not an .npy array")
                member = io.BytesIO(zf.read(info))  # at most `limit` bytes: checked above
                version = np.lib.format.read_magic(member)
                if version not in headers:
                    raise ValueError(f"{name}: .npy format {version}")
                shape, _, dtype = headers[version](member)
                if dtype.hasobject:
                    raise ValueError(
                        f"{name}: Object arrays cannot be loaded without unpickling, which clbench never does"
                    )
                claimed = math.prod(shape) * dtype.itemsize
                held = len(member.getbuffer()) - member.tell()
                if claimed != held:
                    raise ValueError(f"{name}: its header claims shape {shape} ({claimed:,} bytes), it holds {held:,}")
                member.seek(0)
                arrays[info.filename[: -len(".npy")]] = np.lib.format.read_array(member, allow_pickle=False)
            return arrays
    except ValueError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, TypeError, OverflowError, MemoryError) as e:
        raise ValueError(f"{type(e).__name__}: {str(e)[:120]}") from None
