"""``clbench perf main-job``: the README's main job (``clbench run`` of the default strategy) from a cold feature
cache and warm, in fresh processes, against one feature-extraction pass over the same images at the fastest
setting :func:`clbench.perf.throughput.precision_table` measures."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clbench.perf import measurement
from clbench.perf.throughput import precision_table
from clbench.precision import isa_limits


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


@measurement(
    "main-job",
    help="`clbench run` of the default strategy from a cold feature cache and warm, against one feature pass",
)
def _main_job(flags: argparse.Namespace) -> dict[str, Any]:
    return main_job()
