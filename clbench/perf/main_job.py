"""``clbench perf main-job``: the README's main job (``clbench run`` of the default strategy) from a cold feature
cache and warm, in fresh processes, against one feature-extraction pass over the same images at the fastest
setting :func:`clbench.perf.throughput.precision_table` measures.

Each run is split into phases, timed inside its process (:data:`_DRIVER`): ``imports`` (``clbench.cli`` and every
module of the run path: torch, the Avalanche streams, the transforms), ``benchmark`` (loading the images and
labels), ``backbone`` (the frozen inputs: the backbone, built or only described by its cached facts, the transforms
and the precision), ``features`` (computing or reading the frozen features, with their spot check), ``learning`` and
``evaluation`` (the record's train and eval seconds), ``record`` (checkpoints, records, predictions and the final
features file), and ``other`` (the rest of the process: the command line, the Avalanche stream, the summary
printed). ``backbone_built`` says whether the run built the ViT at all (a warm SimpleCIL run must not). The machine's
load average is written beside every run: the times of a shared machine are only as good as its load."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clbench.core.precision import CpuInfo, isa_limits
from clbench.files.atomic import cache_dir
from clbench.perf import arg, bounded, measurement
from clbench.perf.throughput import precision_table

PHASES = ("imports", "benchmark", "backbone", "features", "learning", "evaluation", "record", "other")

# Run in the measured process: time the imports, wrap the harness's phases with timers, run the CLI, write the
# phase seconds to argv[1]. The wrapped functions are looked up at call time by the harness, so wrapping their
# module attributes times every call.
_DRIVER = r"""
import json, sys, time
t0 = time.perf_counter()
import clbench.cli as cli
import clbench.run.harness as harness, clbench.benchmarks as benchmarks, clbench.features.backbones as backbones
import clbench.benchmarks.streams, clbench.methods.contract, clbench.features.transforms, clbench.ui
import clbench.features.cache
phases = {"imports": time.perf_counter() - t0}
built = []
def timed(module, name, phase):
    f = getattr(module, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - t
    setattr(module, name, wrapper)
timed(benchmarks, "build_benchmark", "benchmark")
timed(harness, "load_inputs", "backbone")
timed(harness, "_save_progress", "record")
timed(harness, "_finish", "record")
real_build = backbones.LazyBackbone._build_now
def build_now(self):
    t = time.perf_counter()
    real_build(self)
    built.append(time.perf_counter() - t)
backbones.LazyBackbone._build_now = build_now
real_init = backbones.FrozenBackbone.__init__
def init(self, *a, **k):
    built.append(0.0)
    real_init(self, *a, **k)
backbones.FrozenBackbone.__init__ = init
code = cli.main(sys.argv[2:])
phases["process"] = time.perf_counter() - t0
phases["backbone_built"] = bool(built)
phases["lazy_build_s"] = sum(built)
with open(sys.argv[1], "w") as f:
    json.dump(phases, f)
sys.exit(code)  # as the clbench console script ends
"""


def _one_run(argv: list[str], env: dict[str, str], phases_file: Path, out: Path) -> dict[str, Any]:
    """One ``clbench run`` in a fresh process: wall-clock and CPU seconds of the process, its phases, the load."""
    # deferred: loads numpy, which importing this module does not
    from clbench.records.results import load_record

    load_before = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _DRIVER, str(phases_file), *argv, "--out", str(out)],
        env=env,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    inner = json.loads(phases_file.read_text())
    record = load_record(out)
    times = record.time_s
    split = {
        "imports": inner["imports"],
        "benchmark": inner.get("benchmark", 0.0),
        "backbone": inner.get("backbone", 0.0),
        "features": times.features,
        "learning": times.train,
        "evaluation": times.eval,
        "record": inner.get("record", 0.0),
    }
    split["other"] = max(0.0, wall - sum(split.values()))
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "split_s": {k: round(v, 3) for k, v in split.items()},
        "backbone_built": inner["backbone_built"],
        "lazy_backbone_build_s": inner["lazy_build_s"],
        "record_time_s": times.to_dict(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "n_images": record.n_images,
        "precision": record.precision,
        "precision_reason": record.precision_reason,
    }


RUNS_MAX = 20  # whole `clbench run` processes per measurement (each a minute or more on a laptop)


def main_job(strategy: str | None = None, warm_runs: int = 3, log=print) -> dict[str, Any]:
    """The README's main job from a cold feature cache, then ``warm_runs`` times warm, each in a fresh process (imports
    included), against one feature-extraction pass over the same images at the fastest
    setting :func:`precision_table` measures.

    Cold: a temporary clbench cache holding only the converted weights (copied from the user's cache), so the run
    extracts every feature and builds the backbone; warm: the same command again on that cache. Wall-clocks are
    those of the whole process; the warm figure is the median of the warm runs (each is written)."""
    import shutil
    import tempfile

    # deferred: the strategies are read when the job runs, not when clbench.perf is imported
    from clbench.core.catalog import DEFAULT_STRATEGY

    strategy = strategy or DEFAULT_STRATEGY
    table = precision_table(log=lambda m: None)
    fastest = table["fastest"]
    user_cache = cache_dir()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="clbench-mainjob-") as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        for part in ("weights", "wheels"):
            if (user_cache / part).exists():
                shutil.copytree(user_cache / part, cache / part)
        if (user_cache / "machine").exists():  # the precision probe, never the backbone facts: cold is cold
            shutil.copytree(user_cache / "machine", cache / "machine", ignore=shutil.ignore_patterns("backbone-*"))
        env = {**os.environ, "CLBENCH_CACHE": str(cache)}
        argv = ["run", "--strategy", strategy]
        for state in ["cold"] + [f"warm{i + 1}" for i in range(warm_runs)]:
            runs[state] = _one_run(argv, env, Path(tmp) / f"{state}.phases.json", Path(tmp) / state)
            r = runs[state]
            log(
                f"{state}: {r['wall_s']:.2f} s wall-clock, {r['cpu_s']:.2f} s CPU, load {r['load_average_before'][0]}"
                f" (backbone built: {r['backbone_built']}); "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["split_s"].items())
            )
    cold = runs["cold"]
    warm = [runs[k] for k in runs if k != "cold"]
    n_images = cold["n_images"]["train"] + cold["n_images"]["test"] if cold["n_images"] else 0
    one_pass = n_images / fastest["img_per_s"] if n_images else None
    result: dict[str, Any] = {
        "benchmark": "main-job",
        "strategy": strategy,
        "cpu": table["cpu"],
        "cpu_capability": table["cpu_capability"],
        "cpus": os.cpu_count(),
        "isa_limits": isa_limits(),
        "precision": cold["precision"],
        "precision_reason": cold["precision_reason"],
        "phases": list(PHASES),
        "runs": runs,
        "cold_wall_s": cold["wall_s"],
        "warm_wall_s_median": statistics.median(r["wall_s"] for r in warm) if warm else None,
        "warm_cpu_s_median": statistics.median(r["cpu_s"] for r in warm) if warm else None,
        "warm_backbone_built": any(r["backbone_built"] for r in warm),
        "fastest_setting": fastest,
        "images": n_images,
        "one_pass_at_fastest_s": one_pass,
        "cold_over_one_pass": cold["wall_s"] / one_pass if one_pass else None,
    }
    if one_pass:
        log(
            f"one feature pass over {n_images} images at the fastest setting ({fastest['precision']} x "
            f"{fastest['threads']}, {fastest['img_per_s']:.1f} img/s): {one_pass:.1f} s; cold main job / that = "
            f"{result['cold_over_one_pass']:.2f}; warm median {result['warm_wall_s_median']:.2f} s"
        )
    return result


@measurement(
    "main-job",
    help="`clbench run` of the default strategy from a cold feature cache and warm, against one feature pass",
    args=(
        arg(
            "--warm-runs",
            type=bounded("--warm-runs", 1, RUNS_MAX, "each is a whole `clbench run` process"),
            default=3,
            help=f"warm runs after the cold one (default: 3, at most {RUNS_MAX}; median kept)",
        ),
    ),
)
def _main_job(flags: argparse.Namespace) -> dict[str, Any]:
    return main_job(warm_runs=int(flags.warm_runs))


def cached_feature_heads() -> tuple[str, ...]:
    """The registered strategies whose cost model at their defaults is the frozen features alone, every image served
    by the feature cache (:meth:`Work.cached_features <clbench.methods.contract.Work.cached_features>`: nothing trained
    through the ViT, no method-specific unit): the heads fitted on cached features."""
    # deferred: loads torch, which importing this module does not
    from clbench.core.catalog import STRATEGIES, card
    from clbench.methods.contract import RunShape, Work

    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(50.0, 100.0))
    heads = []
    for name in STRATEGIES.names():
        c = card(name)
        if c.cost(c.Config(), shape) == Work.cached_features(shape):
            heads.append(name)
    return tuple(heads)


def warm_runs(strategies: tuple[str, ...] | None = None, runs: int = 3, log=print) -> dict[str, Any]:
    """Whole ``clbench run`` processes of each strategy at its defaults on the embedded benchmark with its frozen
    features already cached (the user's clbench cache; a first run fills it and is not counted): ``runs`` times
    each, in fresh processes, with the same phase split as :func:`main_job`. Per strategy the median wall-clock of
    the process and of the record's own ``time_s.total`` (the run from its start to its record: the process minus
    the imports, the command line and the summary printed)."""
    import tempfile

    strategies = strategies or cached_feature_heads()
    env = dict(os.environ)
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="clbench-warm-") as tmp:
        for strategy in strategies:
            argv = ["run", "--strategy", strategy, "--precision", "fp32"]
            _one_run(argv, env, Path(tmp) / "fill.phases.json", Path(tmp) / f"{strategy}-fill")  # the cache filled
            rows = [
                _one_run(argv, env, Path(tmp) / f"{strategy}{i}.phases.json", Path(tmp) / f"{strategy}{i}")
                for i in range(runs)
            ]
            table[strategy] = {
                "runs": rows,
                "wall_s_median": statistics.median(r["wall_s"] for r in rows),
                "record_total_s_median": statistics.median(r["record_time_s"]["total"] for r in rows),
                "checkpoint_s": [r["record_time_s"]["checkpoint"] for r in rows],
            }
            log(
                f"{strategy}: whole process {table[strategy]['wall_s_median']:.2f} s (median of {runs}), record "
                f"total {table[strategy]['record_total_s_median']:.2f} s, load {rows[-1]['load_average_before'][0]}"
            )

    cpu = CpuInfo.detect()
    return {
        "benchmark": "warm-runs",
        "bench": "emoji",
        "precision": "fp32",
        "cpu": cpu.model,
        "cpu_capability": cpu.capability,
        "cpus": os.cpu_count(),
        "phases": list(PHASES),
        "strategies": table,
    }


@measurement(
    "warm-runs",
    help="whole `clbench run` processes of the heads fitted on cached frozen features (every strategy whose cost "
    "model is the cached features alone) at their defaults on the embedded benchmark, features cached",
    args=(
        arg("--strategies", default="", help="comma-separated strategy names (default: those heads)"),
        arg(
            "--runs",
            type=bounded("--runs", 1, RUNS_MAX, "each is a whole `clbench run` process"),
            default=3,
            help=f"runs per strategy (default: 3, at most {RUNS_MAX}; median kept)",
        ),
    ),
)
def _warm_runs(flags: argparse.Namespace) -> dict[str, Any]:
    names = tuple(s.strip() for s in str(flags.strategies).split(",") if s.strip())
    return warm_runs(names or None, runs=int(flags.runs))
