"""What this machine does with clbench: ``clbench doctor``, ``clbench perf precision`` and ``clbench perf threads``.

- :func:`precision_table` measures the default backbone's feature-extraction throughput (no grad, the benchmark's
  input size) for every precision the device offers at 1 thread and at all cores, and the choice ``--precision
  auto`` makes; ``perf precision`` records it with the ratio of auto's setting to the fastest one.
- :func:`thread_table` measures the same throughput in fresh processes (OpenMP reads its wait policy once, at start)
  at 1 and all threads, OpenMP wait policy default and passive, with the machine idle and with one core held busy by
  a spinning process; ``perf threads`` records the busy / idle ratios behind clbench's thread defaults.
- :func:`doctor` prints the device, CPU capability, thread settings, a short precision table, auto's choice, the
  cache location and size, and which weights and data are present: the text to paste into a bug report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clbench.precision import isa_limits

DEFAULT_BACKBONE = "vit_small_patch14_dinov2"
DEFAULT_IMG = 112  # the embedded benchmark's input size


def _load(backbone: str, img_size: int, device: str):
    import torch

    from clbench.backbones import load_backbone
    from clbench.harness import resolve_device

    dev = resolve_device(device)
    # Weights do not change timings; random keeps the measurement offline and cheap.
    return load_backbone(backbone, "random", img_size).to(dev), dev, torch


def precision_table(
    backbone: str = DEFAULT_BACKBONE,
    img_size: int = DEFAULT_IMG,
    device: str = "auto",
    seconds: float = 3.0,
    batch: int = 32,
    log=print,
) -> dict[str, Any]:
    """img/s for each (precision, threads) on this machine, and where auto's choice lands against the fastest."""
    from clbench.precision import CpuInfo, for_backbone, throughput

    bb, dev, torch = _load(backbone, img_size, device)
    cores = torch.get_num_threads()
    precisions = ["fp32", "bf16"] + (["fp16"] if dev.type == "cuda" else [])
    threads = sorted({1, cores}) if dev.type == "cpu" else [cores]
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        for p in precisions:
            rate = throughput(bb, dev, p, bb.img_size, batch=batch, seconds=seconds)
            rows.append({"precision": p, "threads": n, "img_per_s": rate})
            log(f"{p:>5} x {n} thread{'s' if n > 1 else ' '}: {rate:7.1f} img/s")
    torch.set_num_threads(cores)
    auto = for_backbone(bb, dev, "auto")
    fastest = max(rows, key=lambda r: r["img_per_s"])
    chosen = next(r for r in rows if r["precision"] == auto.name and r["threads"] == cores)
    ratio = chosen["img_per_s"] / fastest["img_per_s"]
    log(
        f"auto picks {auto.name} x {cores} threads ({auto.reason}): {ratio:.2f} of the fastest measured "
        f"({fastest['precision']} x {fastest['threads']})"
    )
    cpu = CpuInfo.detect()
    return {
        "benchmark": "precision",
        "backbone": backbone,
        "img_size": bb.img_size,
        "batch": batch,
        "device": dev.type,
        "cpu": cpu.model,
        "cpu_capability": cpu.capability,
        "isa_limits": isa_limits(),
        "amx": cpu.amx,
        "avx512_bf16": cpu.avx512_bf16,
        "rows": rows,
        "auto": {"precision": auto.name, "threads": cores, "reason": auto.reason},
        "fastest": fastest,
        "auto_over_fastest": ratio,
    }


# ----------------------------------------------------------------------------------------------- threads
# torch first: importing clbench before torch would set OpenMP's wait policy to passive, and the "default" rows
# must measure OpenMP's own default.
_WORKER = r"""
import json, sys
import torch
import clbench
from clbench.machine import _load
from clbench.precision import throughput
backbone, img, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
threads, seconds = int(sys.argv[4]), float(sys.argv[5])
bb, dev, torch = _load(backbone, img, "cpu")
torch.set_num_threads(threads)
print(json.dumps({"img_per_s": throughput(bb, dev, precision, bb.img_size, batch=32, seconds=seconds)}))
"""


def _measure_in_process(
    backbone: str, img_size: int, precision: str, threads: int, policy: str, seconds: float
) -> float:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, backbone, str(img_size), precision, str(threads), str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["img_per_s"])


def thread_table(
    backbone: str = DEFAULT_BACKBONE,
    img_size: int = DEFAULT_IMG,
    precision: str | None = None,
    seconds: float = 5.0,
    log=print,
) -> dict[str, Any]:
    """Feature-extraction img/s at 1 and all threads x OpenMP wait policy x (idle, one core busy), in fresh
    processes."""
    import torch

    from clbench.precision import CpuInfo

    if precision is None:
        bb, dev, _ = _load(backbone, img_size, "cpu")
        from clbench.precision import for_backbone

        precision = for_backbone(bb, dev, "auto").name
    cores = os.cpu_count() or 1
    rows = []
    for busy in (False, True):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for policy in ("default", "PASSIVE"):
                for n in sorted({1, cores}):
                    rate = _measure_in_process(backbone, img_size, precision, n, policy, seconds)
                    rows.append({"busy_core": busy, "omp_wait_policy": policy, "threads": n, "img_per_s": rate})
                    log(
                        f"{'one core busy' if busy else 'idle':>13}  {policy:>7}  {n} thread{'s' if n > 1 else ' '}: "
                        f"{rate:6.1f} img/s"
                    )
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()

    def rate(busy: bool, policy: str, n: int) -> float:
        return next(
            r["img_per_s"] for r in rows if (r["busy_core"], r["omp_wait_policy"], r["threads"]) == (busy, policy, n)
        )

    idle_best = max(r["img_per_s"] for r in rows if not r["busy_core"])
    ratios = {
        f"{policy} x {n}": {
            "busy_over_idle_best": rate(True, policy, n) / idle_best,
            "idle_over_idle_best": rate(False, policy, n) / idle_best,
        }
        for policy in ("default", "PASSIVE")
        for n in sorted({1, cores})
    }
    for k, v in ratios.items():
        log(
            f"{k:>13}: idle {v['idle_over_idle_best']:.2f}, one core busy {v['busy_over_idle_best']:.2f} "
            f"(of the best idle rate)"
        )
    cpu = CpuInfo.detect()
    return {
        "benchmark": "threads",
        "backbone": backbone,
        "img_size": img_size,
        "precision": precision,
        "cpu": cpu.model,
        "cpu_capability": cpu.capability,
        "isa_limits": isa_limits(),
        "cores": cores,
        "torch": torch.__version__,
        "rows": rows,
        "ratios": ratios,
        "clbench_default": {"threads": cores, "omp_wait_policy": "PASSIVE"},
    }


# ----------------------------------------------------------------------------------------------- doctor
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

    import clbench
    from clbench.files import cache_dir
    from clbench.precision import CpuInfo
    from clbench.results import library_versions

    con = Console()
    import torch

    cpu = CpuInfo.detect()
    con.print(f"[bold]clbench {clbench.__version__}[/] on Python {platform.python_version()}, {platform.platform()}")
    con.print("libraries: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()))
    from clbench.trackers import EXTRA, TRACKERS, installed

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
    from clbench.catalog import BACKBONES, BENCHMARKS
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

    if spec.load.startswith("clbench.benchmarks.emoji:"):
        return "embedded in the package"
    if spec.data_env and os.environ.get(spec.data_env):
        root = os.environ[spec.data_env]
        return f"${spec.data_env} = {root}" + ("" if Path(root).exists() else " (missing!)")
    for folder in re.findall(r"(/usr/share/\S+|/opt/\S+)", spec.source_info):
        if Path(folder.rstrip(".,;)")).exists():
            return f"present at {folder.rstrip('.,;)')}"
    return "not here: pass --data-root DIR (`clbench data check` validates it)"


# ----------------------------------------------------------------------------------------------- main job
def main_job(strategy: str | None = None, log=print) -> dict[str, Any]:
    """The README's main job from a cold feature cache, in a fresh process (imports included), against one
    feature-extraction pass over the same images at the fastest setting :func:`precision_table` measures.

    Cold: a temporary clbench cache holding only the converted weights (linked from the user's cache), so the run
    extracts every feature; then the same command again, warm. Both wall-clocks are those of the whole process.
    """
    import shutil
    import tempfile

    from clbench.catalog import DEFAULT_STRATEGY
    from clbench.files import cache_dir
    from clbench.results import load_record

    strategy = strategy or DEFAULT_STRATEGY

    table = precision_table(log=lambda m: None)
    fastest = table["fastest"]
    user_cache = cache_dir()
    with tempfile.TemporaryDirectory(prefix="clbench-mainjob-") as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        for part in ("weights", "wheels", "machine"):
            if (user_cache / part).exists():
                shutil.copytree(user_cache / part, cache / part)
        env = {**os.environ, "CLBENCH_CACHE": str(cache)}
        walls, records = {}, {}
        for state in ("cold", "warm"):
            out = Path(tmp) / state
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "clbench.cli", "run", "--strategy", strategy, "--out", str(out)],
                env=env,
                check=True,
                capture_output=True,
            )
            walls[state] = time.perf_counter() - t0
            records[state] = load_record(out)
            log(
                f"{state}: {walls[state]:.1f} s wall-clock (record: total {records[state].time_s.total:.1f} s, "
                f"features {records[state].time_s.features:.1f} s)"
            )
    rec = records["cold"]
    n_images = rec.n_images["train"] + rec.n_images["test"] if rec.n_images else 0
    one_pass = n_images / fastest["img_per_s"] if n_images else None
    result = {
        "benchmark": "main-job",
        "strategy": strategy,
        "cpu": table["cpu"],
        "cpu_capability": table["cpu_capability"],
        "isa_limits": isa_limits(),
        "precision": rec.precision,
        "precision_reason": rec.precision_reason,
        "wall_s": walls,
        "record_time_s": {k: r.time_s.to_dict() for k, r in records.items()},
        "fastest_setting": fastest,
        "images": n_images,
        "one_pass_at_fastest_s": one_pass,
        "cold_over_one_pass": walls["cold"] / one_pass if one_pass else None,
    }
    if one_pass:
        log(
            f"one feature pass over {n_images} images at the fastest setting ({fastest['precision']} x "
            f"{fastest['threads']}, {fastest['img_per_s']:.1f} img/s): {one_pass:.1f} s; cold main job / that = "
            f"{result['cold_over_one_pass']:.2f}"
        )
    return result
