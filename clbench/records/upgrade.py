"""``clbench records upgrade DIR``: rewrite the run records under a folder at the current schema version, once.

Readers (reports, ``compare``, the gate, sweeps) read records of schema
:data:`~clbench.records.versions.OLDEST_READABLE` and later and upgrade them on load; those upgrades are pure JSON
(:data:`clbench.records.versions.UPGRADES`). A record of schema 1 to 3 predates one parameter accounting: its
``params.added_per_task`` holds learned parameters and stored statistics together, and only the method's own rule, its
card's ``split_kept`` (the split its live runs count with), can part them. Readers refuse such a record and name this
command, so that reading records never needs a method's rule; this command reads each method's card (torch-free),
restates each old record once (:func:`upgrade_v3`) and rewrites it in place.

Nothing is lost: every field keeps its meaning, the counts as first written stay in ``params.kept_as_written``
beside ``params.restated_from_schema``, a record is replaced atomically and only after the rewrite reads back as
the upgrade, and a folder whose run is writing it (its lock held) is left alone. Records at the current version are
not touched (the command can be run again at no cost).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from clbench.core.catalog import all_learned, card
from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_bytes, atomic_write_json
from clbench.files.escape import plain
from clbench.files.safety import load_json
from clbench.records.results import RUN_HINT, _build, _checked, read_record
from clbench.records.schema import RESULT_FILE, Json, RunRecord
from clbench.records.versions import OLDEST_UPGRADABLE, SCHEMA_VERSION, UPGRADES


def upgrade_v1(data: Json) -> Json:
    """A version-1 record as version 2: ``autocast`` becomes ``precision`` (true: bf16, false: fp32, neither:
    unknown); every other field keeps its meaning, and those it predates take their defaults."""
    out = dict(data)
    autocast = out.pop("autocast", None)
    if "precision" not in out:
        out["precision"] = "unknown" if autocast is None else ("bf16" if autocast else "fp32")
    return out


def upgrade_v2(data: Json) -> Json:
    """A version-2 record as version 3: it kept no predictions."""
    return {**data, "predictions": data.get("predictions")}


def upgrade_v3(data: Json) -> Json:
    """A version-3 (or older) record as version 4: its ``params.added_per_task`` (everything kept per task; TOSCA's
    module only) split into learned parameters and stored statistics by the rule on the strategy's card
    (``split_kept``), which its live runs use too; a strategy this clbench does not
    register keeps everything as learned (the base rule). ``params.restated_from_schema`` says so, and
    ``params.kept_as_written`` keeps the counts the record was written with."""
    params = dict(data["params"])
    kept = list(params.get("added_per_task") or [params["added_total"]])
    sizes = list(data["task_sizes"])
    if len(kept) != len(sizes):  # an unfinished record: the tasks it has done
        sizes = sizes[: len(kept)]
    try:
        split_kept = card(str(data["strategy"])).split_kept
    except ClbenchError:  # not registered here: the base rule
        split_kept = all_learned
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
        kept_as_written=kept,
    )
    return {**data, "params": params}


# version -> the next version, every step from the oldest this command rewrites
ALL_UPGRADES: dict[int, Callable[[Json], Json]] = {1: upgrade_v1, 2: upgrade_v2, 3: upgrade_v3, **UPGRADES}


def upgraded(path: Path, data: Json) -> RunRecord:
    """The record ``data`` (read from ``path``) at the current schema version, every upgrade applied."""
    return _build(path, _checked(path, data, ALL_UPGRADES, OLDEST_UPGRADABLE))


@dataclass(frozen=True)
class Outcome:
    """What the command did to one record: ``upgraded`` (from ``version``), ``current`` (untouched), ``busy`` (a
    run holds its folder), or ``refused`` (``why``: not a record clbench can read or upgrade)."""

    path: Path
    status: str
    version: int | None = None
    why: str = ""


def upgrade_folders(roots: Iterable[Path], dry_run: bool = False) -> list[Outcome]:
    """Upgrade every ``result.json`` under ``roots`` (each a run folder, a folder of them, or a record file)."""
    outcomes = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise ClbenchError(f"{root}: no such file or folder", "give a folder of run records (e.g. runs/)")
        paths = [root] if root.is_file() else sorted(root.rglob(RESULT_FILE))
        outcomes.extend(upgrade_one(p, dry_run) for p in paths if not p.is_symlink())
    return outcomes


def upgrade_one(path: Path, dry_run: bool = False) -> Outcome:
    """Upgrade the record at ``path`` in place (``dry_run``: say what would be done, write nothing)."""
    try:
        original = path.read_bytes()
        data = load_json(path, "record", hint=RUN_HINT)
        if not isinstance(data, dict):
            raise ClbenchError(f"{path}: not a JSON record object (a {type(data).__name__})")
        version = data.get("schema_version")
        if version == SCHEMA_VERSION:
            return Outcome(path, "current", version)
        record = upgraded(path, data)
    except ClbenchError as e:  # its message only: the listing gives one hint for all
        return Outcome(path, "refused", None, str(e.args[0]) if e.args else "")
    if dry_run:
        return Outcome(path, "upgraded", version)
    lock = path.parent / ".lock"  # clbench.run.rundir.LOCK_FILE: a run writing this folder holds it
    if lock.is_file() and not lock.is_symlink():
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return Outcome(path, "busy", version, "a clbench process is writing this run folder")
            try:
                return _replace(path, record, original, version)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    return _replace(path, record, original, version)


def _replace(path: Path, record: RunRecord, original: bytes, version: int) -> Outcome:
    """Write ``record`` over ``path`` atomically; put ``original`` back unless the file reads back as ``record``."""

    atomic_write_json(path, record.to_dict(), standard=True)  # as RunRecord.write: null, not NaN
    try:
        same = _dumped(read_record(path)) == _dumped(record)
        why = "" if same else ": its fields differ"
    except ClbenchError as e:
        same, why = False, f": {e.args[0] if e.args else e}"
    if not same:  # never leave a record that reads otherwise
        atomic_write_bytes(path, original)
        return Outcome(path, "refused", version, f"the rewrite did not read back as the upgrade{why}; left as it was")
    return Outcome(path, "upgraded", version)


def _dumped(record: RunRecord) -> str:
    return json.dumps(record.to_dict(), sort_keys=True)  # NaN == NaN as text


def upgrade_command(args: argparse.Namespace) -> int:
    """``clbench records upgrade DIR...``: one line per record changed or refused, then the counts; exit 1 when a
    record could not be upgraded."""
    from collections import Counter

    outcomes = upgrade_folders(args.dirs, dry_run=args.dry_run)
    verb = "would upgrade" if args.dry_run else "upgraded"
    for o in outcomes:
        if o.status == "upgraded":
            print(f"{verb} {plain(str(o.path))} (schema {o.version})")
        elif o.status != "current":
            why = o.why.removeprefix(f"{o.path}: ")
            print(f"{o.status} {plain(str(o.path))}: {plain(why)}")
    counts = Counter(o.status for o in outcomes)
    print(
        f"{len(outcomes)} records: {counts['upgraded']} {verb}, {counts['current']} already current"
        + (f", {counts['busy']} busy (a run is writing them; run this again after it)" if counts["busy"] else "")
        + (f", {counts['refused']} refused" if counts["refused"] else "")
    )
    if counts["refused"]:
        print(f"  hint: a refused record cannot be read as it is: {RUN_HINT}", file=sys.stderr)
    return 1 if counts["refused"] or counts["busy"] else 0
