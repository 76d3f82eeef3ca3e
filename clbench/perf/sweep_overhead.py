"""``clbench perf sweep-overhead``: runs the same small sweep (the default strategy, several seeds, the micro ViT on
the embedded benchmark) on the local backend and on a local Ray, one run at a time, and reports each backend's
overhead from the sweep's own timestamps (:func:`clbench.sweep.runner.overhead`): scheduling and record collection
per run, and the start-up."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clbench.core.catalog import DEFAULT_STRATEGY
from clbench.errors import ClbenchError
from clbench.perf import arg, bounded, measurement
from clbench.sweep import Resources, SweepSpec, run_sweep


def sweep_overhead(
    runs: int = 6, log: Callable[[str], None] = print, backends: tuple[str, ...] = ("local", "ray")
) -> dict[str, Any]:
    """The same sweep (``runs`` seeds of the default strategy on the micro ViT) on each backend, one run at a time."""
    settings = {"backbone": "vit_micro", "weights": "random", "init_cls": 12, "increment": 12}
    out: dict[str, Any] = {"benchmark": "sweep-overhead", "runs": runs, "settings": settings, "backends": {}}
    with tempfile.TemporaryDirectory(prefix="clbench-sweep-overhead-") as tmp:
        for backend in backends:
            spec = SweepSpec(
                strategies=(DEFAULT_STRATEGY,),
                benches=("emoji",),
                seeds=tuple(range(1, runs + 1)),
                out=Path(tmp) / backend,
                settings=settings,
            )
            t0 = time.perf_counter()
            manifest = run_sweep(spec, backend, Resources(1, None, None, None))
            wall = time.perf_counter() - t0
            ov = manifest.overhead.to_dict() if manifest.overhead else {}
            ov["sweep_wall_s"] = wall
            ov["run_s_mean"] = ov["run_time_s"] / ov["runs_executed"]
            ov["backend"] = manifest.backend.to_json() if manifest.backend else None
            out["backends"][backend] = ov
            log(
                f"{backend}: start-up {ov['startup_s']:.2f} s, {ov['per_run_s'] * 1e3:.0f} ms per run "
                f"(collection {ov['collection_s_mean'] * 1e3:.0f} ms), run {ov['run_s_mean']:.2f} s, wall {wall:.1f} s"
            )
    return out


@measurement(
    "sweep-overhead",
    help="local vs Ray sweep overhead per run",
    args=(
        arg(
            "--runs",
            type=bounded("--runs", 2, 50, "each is a run on each backend"),
            default=6,
            help="runs per backend (default: 6; from 2 to 50)",
        ),
    ),
)
def _sweep_overhead(flags: argparse.Namespace) -> dict[str, Any]:
    if flags.runs < 2:
        raise ClbenchError(f"--runs must be >= 2 (got {flags.runs})")
    return sweep_overhead(runs=flags.runs)
