"""What a run record says about where and with what it ran: the library versions, clbench's git revision and the
process's peak memory (:class:`clbench.records.schema.Host` holds the machine's CPU facts, probed by the harness)."""

from __future__ import annotations

import platform
import resource
import subprocess
from importlib import metadata
from pathlib import Path


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
    here = Path(__file__).resolve().parents[2]
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
