"""``clbench perf precision`` and ``clbench perf threads``: what this machine does with clbench's feature extraction.

- :func:`precision_table` measures the default backbone's feature-extraction throughput (no grad, the benchmark's
  input size) for every precision the device offers at 1 thread and at all cores, and the choice ``--precision
  auto`` makes; ``perf precision`` records it with the ratio of auto's setting to the fastest one.
- :func:`thread_table` measures the same throughput in fresh processes (OpenMP reads its wait policy once, at start)
  at 1 and all threads, OpenMP wait policy default and passive, with the machine idle and with one core held busy by
  a spinning process; ``perf threads`` records the busy / idle ratios behind clbench's thread defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from clbench.core.precision import CpuInfo, for_backbone, isa_limits
from clbench.perf import backbone_args, device_arg, measurement

DEFAULT_BACKBONE = "vit_small_patch14_dinov2"
DEFAULT_IMG = 112  # the embedded benchmark's input size


def _load(backbone: str, img_size: int, device: str):
    import torch

    # deferred: loads torch, which importing this module does not
    from clbench.features.backbones import load_backbone
    from clbench.run.harness import resolve_device

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
    # looked up at call time: tests replace it on its module
    from clbench.core.precision import CpuInfo, for_backbone, throughput

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


# ----------------------------------------------------------------------------------------------- threads torch first:
# importing clbench before torch would set OpenMP's wait policy to passive, and the "default" rows must measure
# OpenMP's own default.
_WORKER = r"""
import json, sys
import torch
import clbench
from clbench.perf.throughput import _load
from clbench.core.precision import throughput
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
    """Feature-extraction img/s at 1 and all threads x OpenMP wait policy x (idle, one core busy),
    in fresh processes."""
    import torch

    if precision is None:
        bb, dev, _ = _load(backbone, img_size, "cpu")

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


@measurement(
    "precision",
    help="feature-extraction img/s per precision and thread count, and what --precision auto picks",
    args=(
        device_arg(),
        *backbone_args((DEFAULT_BACKBONE, DEFAULT_IMG)),
    ),
)
def _precision(flags: argparse.Namespace) -> dict[str, Any]:
    return precision_table(flags.backbone, flags.img_size, flags.device)


@measurement(
    "threads",
    help="feature-extraction img/s at 1 and all threads, OpenMP wait policy default and passive, idle and with one "
    "core busy",
    args=backbone_args((DEFAULT_BACKBONE, DEFAULT_IMG)),
)
def _threads(flags: argparse.Namespace) -> dict[str, Any]:
    return thread_table(flags.backbone, flags.img_size)
