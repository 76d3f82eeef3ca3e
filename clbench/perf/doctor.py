"""``clbench doctor``: what a bug report needs to say about this machine and installation: the device, CPU
capability, thread settings, a short precision table (:func:`clbench.perf.throughput.precision_table`), auto's
choice, the cache location and size, and which weights and data are present.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import clbench
from clbench.core.catalog import BACKBONES
from clbench.core.precision import CpuInfo
from clbench.files.atomic import cache_dir
from clbench.perf.throughput import DEFAULT_BACKBONE, DEFAULT_IMG, precision_table
from clbench.records.host import library_versions


def _size(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def doctor(seconds: float = 1.5, measure: bool = True) -> None:
    """Print what a bug report needs to say about this machine and installation."""
    import platform

    from rich.console import Console
    from rich.table import Table

    # a file or a pipe (a bug report) gets whole lines: rich would cut table cells at its 80-column default
    con = Console() if sys.stdout.isatty() else Console(width=400, no_color=True)
    import torch

    cpu = CpuInfo.detect()
    con.print(f"[bold]clbench {clbench.__version__}[/] on Python {platform.python_version()}, {platform.platform()}")
    con.print("libraries: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()))
    # deferred: loads numpy, which importing this module does not
    from clbench.run.trackers import EXTRA, TRACKERS, installed

    found = {name: installed(name) for name in TRACKERS}
    con.print(
        "trackers (--log): "
        + ", ".join(f"{n} {v}" if v else f"{n} not installed" for n, v in found.items())
        + ("" if all(found.values()) else f" (pip install 'clbench[{EXTRA}]')")
    )
    con.print(
        f"CPU: {cpu.describe()}; {os.cpu_count()} cores; torch threads {torch.get_num_threads()}; "
        f"OpenMP wait policy {clbench.OMP_WAIT_POLICY}"
    )
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            con.print(
                f"CUDA device {i}: {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]}, bf16 "
                f"{'yes' if torch.cuda.is_bf16_supported() else 'no'})"
            )
    else:
        con.print("CUDA: no device")
    if measure:
        con.print(f"\nfeature extraction, {DEFAULT_BACKBONE} @ {DEFAULT_IMG} px (random weights, batch 32):")
        precision_table(seconds=seconds, log=lambda m: con.print("  " + m))
    root = cache_dir()
    con.print(f"\ncache: {root} ({_mb(_size(root))}; features {_mb(_size(root / 'features'))})")
    # deferred: loads numpy, rich, which importing this module does not
    from clbench.benchmarks import BENCHMARKS
    from clbench.weights.info import availability

    table = Table(title="weights")
    for col in ("backbone", "available", "where / how"):
        table.add_column(col)
    for name in BACKBONES.names():
        table.add_row(name, *availability(name))
    con.print(table)
    table = Table(title="data")
    for col in ("benchmark", "data"):
        table.add_column(col)
    for name in BENCHMARKS.names():
        spec = BENCHMARKS.get(name)
        table.add_row(name, _data_hint(spec))
    con.print(table)


def _data_hint(spec) -> str:
    """Where a benchmark's data would come from here: embedded, an environment variable, a system folder its
    description names, or --data-root."""
    import re

    if is_embedded(spec):
        return "embedded in the package"
    if spec.data_env and os.environ.get(spec.data_env):
        root = os.environ[spec.data_env]
        return f"${spec.data_env} = {root}" + ("" if Path(root).exists() else " (missing!)")
    for folder in re.findall(r"(/usr/share/\S+|/opt/\S+)", spec.source_info):
        if Path(folder.rstrip(".,;)")).exists():
            return f"present at {folder.rstrip('.,;)')}"
    return "not here: pass --data-root DIR (`clbench data check` validates it)"


def is_embedded(spec) -> bool:
    """Whether a benchmark's data ships inside the package (emoji, emoji-domains, emoji-vendors): it needs no data
    root and names no environment variable to find one, so its loader reads the package's own files."""
    return not spec.needs_data_root and spec.data_env is None
