"""The regression gate's calibration workload (``clbench perf calibrate``; ``clbench check --calibrate DIR`` stores
it beside the gate's runs as ``calibration.json``): a fixed forward pass timed on the machine that makes the runs,
so that the gate compares run times as multiples of it (:mod:`clbench.gate.check` reads the file, never times)."""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timezone
from typing import Any

from clbench.errors import ClbenchError
from clbench.perf import arg, bounded, measurement

# A fixed forward pass of a randomly initialised ViT-S/14 (the gate's backbone architecture, so no weights are
# needed) over a fixed batch at the gate's input size, fp32, on all torch threads. Change it and change the id: a
# reference's times are comparable only with calibrations of the same workload.
CALIBRATION_WORKLOAD = {
    "backbone": "vit_small_patch14_dinov2",
    "weights": "random",
    "img_size": 56,
    "batch": 64,
    "precision": "fp32",
    "pass": "forward",
    "repeats": 5,
    "statistic": "median",
}
CALIBRATION_ID = "vit-s14-random-56px-b64-fp32-forward/1"


def calibrate(repeats: int | None = None) -> dict[str, Any]:
    """Time :data:`CALIBRATION_WORKLOAD` on this machine: a warm-up pass, then the median of ``repeats`` passes."""
    import torch

    # deferred: loads torch, which importing this module does not
    from clbench.features.backbones import load_backbone
    from clbench.run.harness import host_info

    w = CALIBRATION_WORKLOAD
    repeats = repeats or int(w["repeats"])
    backbone = load_backbone(str(w["backbone"]), "random", int(w["img_size"]), seed=0)
    x = torch.randn(
        int(w["batch"]), 3, int(w["img_size"]), int(w["img_size"]), generator=torch.Generator().manual_seed(0)
    )
    times = []
    with torch.no_grad():
        backbone(x)  # warm-up: allocator, oneDNN primitive cache
        for _ in range(repeats):
            t0 = time.perf_counter()
            backbone(x)
            times.append(time.perf_counter() - t0)
    return {
        "workload": CALIBRATION_ID,
        "definition": dict(w),
        "seconds": statistics.median(times),
        "all_seconds": [round(t, 6) for t in times],
        "torch": torch.__version__,
        "host": host_info().to_dict(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@measurement(
    "calibrate",
    help="seconds of the regression gate's calibration workload on this machine (`clbench check --calibrate DIR` "
    "stores it beside the gate's runs)",
    args=(
        arg(
            "--repeats",
            type=bounded("--repeats", 1, 100, "each pass is the whole calibration workload"),
            default=None,
            help=f"timed passes (default: {CALIBRATION_WORKLOAD['repeats']}; at most 100)",
        ),
    ),
)
def _calibrate(flags: argparse.Namespace) -> dict[str, Any]:
    if flags.repeats is not None and flags.repeats < 1:
        raise ClbenchError(f"--repeats must be >= 1 (got {flags.repeats})")
    m = calibrate(flags.repeats)
    print(
        f"calibration: {m['seconds']:.3f} s per pass ({m['workload']}, {m['host']['torch_threads']} threads, "
        f"{m['host']['cpu_capability']})"
    )
    return {"benchmark": "calibrate", **m}
