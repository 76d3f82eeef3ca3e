"""The run record (``result.json``): schema, environment capture and loading.

A record is written atomically after every task with ``complete: false`` and once more at the end with
``complete: true``; readers (reports, checks) use only complete records. ``SCHEMA_VERSION`` changes when a
field changes meaning.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"


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
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
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


@dataclass
class LoadedRecord:
    path: Path
    data: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.data.get("run_id", self.path.parent.name))


def load_record(run_dir: Path) -> LoadedRecord:
    """Load ``run_dir/result.json``; raise ClbenchError saying why it cannot be used."""
    path = Path(run_dir) / RESULT_FILE if Path(run_dir).is_dir() else Path(run_dir)
    if not path.is_file():
        raise ClbenchError(f"{run_dir}: no {RESULT_FILE}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ClbenchError(f"{path}: not a readable JSON record ({e})") from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ClbenchError(f"{path}: schema version {data.get('schema_version')} (this clbench reads {SCHEMA_VERSION})")
    if not data.get("complete"):
        raise ClbenchError(f"{path}: the run is not complete (finished {len(data.get('acc_curve', []))} "
                           f"of {len(data.get('task_sizes', []))} tasks)")
    return LoadedRecord(path, data)


def command_line() -> str:
    return " ".join(["clbench", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("clbench") else " ".join(sys.argv)
