"""The cost model of a paper table (``clbench perf projection`` and ``clbench perf
projection-check``), recorded as JSON.

- ``projection``: the compute a paper table needs. It measures, on this machine's device, the per-image cost of one
  frozen forward pass of the paper backbone (ViT-B/16 at 224 px, at the precision a run on that device chooses
  (:mod:`clbench.core.precision`)), of one training pass (forward and backward through the frozen ViT to input-side
  parameters, as prompt and adapter methods need) and of each method's own units (its card's ``unit_seconds``,
  :class:`clbench.core.catalog.MethodCard`), then asks every registered strategy what one run costs
  (its card's ``work``, at its default config and at each of its card's ``projection_profiles``) on
  the six benchmarks of the TOSCA paper and converts to device-hours for ``seeds`` seeds. The counting model of each
  method is the docstring of its ``work``; this module names none.
- ``projection-check``: the same model against a recorded run of any strategy.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.core.catalog import STRATEGIES, card, load_target
from clbench.core.config import make_strategy_config
from clbench.core.precision import for_backbone
from clbench.errors import ClbenchError
from clbench.features.backbones import load_backbone
from clbench.methods.contract import RunShape, Work
from clbench.methods.shared import torch_threads
from clbench.perf import arg, backbone_args, device_arg, measurement
from clbench.perf.timing import median_seconds
from clbench.records.results import load_record

if TYPE_CHECKING:
    from clbench.core.catalog import MethodCard

# The six benchmarks of the TOSCA paper (arXiv 2502.14762) with PILOT's pre-sampled splits. Provenance: test sizes are
# the exact denominators of the final accuracies in the EASE repository's logs (sun-hailong/CVPR24-Ease,
# logs/ease/<dataset>/, two runs each); CIFAR-100 train is the standard 50,000; CUB / ImageNet-R / OmniBenchmark train
# sizes are from a secondary summary table (not the papers themselves); ImageNet-A train is 7,500 images - 1,519 test;
# VTAB train (1,796) is the APER paper's figure as remembered, not re-checked here. Task counts: TOSCA's splits.
PAPER_BENCHMARKS: dict[str, dict[str, int]] = {
    "cifar100": {"classes": 100, "train": 50_000, "test": 10_000, "tasks": 20},
    "cub200": {"classes": 200, "train": 9_430, "test": 2_358, "tasks": 20},
    "imagenet-r": {"classes": 200, "train": 24_000, "test": 6_000, "tasks": 10},
    "imagenet-a": {"classes": 200, "train": 5_981, "test": 1_519, "tasks": 10},
    "omnibenchmark": {"classes": 300, "train": 89_697, "test": 5_985, "tasks": 10},
    "vtab": {"classes": 50, "train": 1_796, "test": 8_619, "tasks": 5},
}


# ----------------------------------------------------------------------------------------------- projection
def projection_rows(names: list[str] | None = None) -> list[tuple[str, MethodCard, Any]]:
    """(row name, method card, config) of every registered strategy (or of ``names``): its default config, then
    one row ``<name>-<profile>`` for each of its card's ``projection_profiles``."""
    rows = []
    for name in names if names is not None else STRATEGIES.names():
        c = card(name)
        rows.append((name, c, make_strategy_config(c, None, ())))
        for profile in c.projection_profiles:
            rows.append((f"{name}-{profile}", c, make_strategy_config(c, profile, ())))
    return rows


def work_counts(work: Work) -> dict[str, float]:
    """The units of ``work`` with their counts: ``f``, ``b`` when a method trains through the ViT, then its own."""
    counts = {"f": work.f}
    if work.b:
        counts["b"] = work.b
    counts.update(work.extra)
    return counts


def paper_shape(info: dict[str, int], tokens: int = 197) -> RunShape:
    """One run on a paper benchmark: ``tasks`` equal tasks."""
    return RunShape.equal(info["train"], info["test"], info["tasks"], tokens=tokens)


def check_against_run(run_dir: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The cost model against a measured run of any strategy: per-image costs measured now on the run's backbone,
    input size and thread count, times the work the strategy's card states (its ``work``) on the run's own split,
    config and protocols, against the run's recorded train + eval seconds. Its features came from the cache, so
    they are part of neither: the cacheable frozen passes (``Work.f_cacheable``) are left out of the prediction."""
    import numpy as np

    rec = load_record(Path(run_dir))
    try:
        cfg = card(rec.strategy).Config(**rec.strategy_config)
    except (TypeError, ValueError) as e:
        raise ClbenchError(
            f"{run_dir}: its {rec.strategy} config does not fit this version's ({e})",
            "check the run with the clbench revision that made it",
        ) from None
    bench = build_benchmark(
        BENCHMARKS.get(rec.bench),
        None,
        rec.task_sizes[0],
        rec.task_sizes[1] if len(rec.task_sizes) > 1 else rec.task_sizes[0],
        rec.class_order_seed,
    )
    task_of = bench.task_of_label()
    train_per_task = np.bincount(task_of[bench.train_y], minlength=bench.n_tasks).tolist()
    test_per_task = np.bincount(task_of[bench.test_y], minlength=bench.n_tasks)
    seen = np.cumsum(test_per_task).tolist()
    threads = int(rec.host.torch_threads or torch.get_num_threads())
    with torch_threads(threads):
        costs = measure_costs("cpu", rec.backbone, rec.img_size or 224, strategies=[rec.strategy], log=log)
    shape = RunShape(
        tuple(train_per_task),
        tuple(seen),
        tokens=costs["tokens"],
        protocols=len(rec.protocols),
        classes_per_task=tuple(bench.task_sizes),
        train_per_class=rec.train_per_class,
    )
    try:
        w = card(rec.strategy).cost(cfg, shape)
    except NotImplementedError as e:
        raise ClbenchError(f"{run_dir}: {e}", "projection-check needs a strategy with a cost model") from None
    work = work_counts(w)
    unit = costs["s_per_image"]
    predicted = sum(v * unit[k] for k, v in work.items()) - w.f_cacheable * unit["f"]
    measured = rec.time_s.train + rec.time_s.eval
    ratio = measured / predicted if predicted > 0 else None  # None: all of its work is the cached features
    log(
        f"{rec.strategy} ({run_dir}): predicted {predicted:.1f} s, recorded train + eval {measured:.1f} s "
        + (f"-> measured / predicted = {ratio:.2f}" if ratio is not None else "(the model counts cached work only)")
    )
    return {
        "run": str(run_dir),
        "strategy": rec.strategy,
        "threads": threads,
        "costs": costs,
        "work": work,
        "f_cacheable": w.f_cacheable,
        "predicted_s": predicted,
        "recorded_train_eval_s": measured,
        "ratio": ratio,
        "run_git_revision": rec.git_revision,
    }


def _tokens(bb: Any, img_size: int) -> int:
    """Tokens per image through a ViT, [CLS] and other prefix tokens included."""
    embed = getattr(bb.model, "patch_embed", None)
    if embed is not None and getattr(embed, "num_patches", None):
        return int(embed.num_patches) + int(getattr(bb.model, "num_prefix_tokens", 1))
    return 1  # no tokens (a CNN): token-count scalings do not apply


def measure_costs(
    device: str = "auto",
    backbone: str = "vit_base_patch16_224",
    img_size: int = 224,
    batch: int = 16,
    strategies: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Seconds per image for a frozen pass and a training pass, and of every unit the registered strategies (or
    ``strategies``) state (their cards' ``unit_seconds``)."""
    # looked up at call time: tests replace it on its module
    from clbench.run.harness import resolve_device

    dev = resolve_device(device)
    bb = load_backbone(backbone, "random", img_size).to(dev)  # weights do not change timings
    x = torch.randn(batch, 3, bb.img_size, bb.img_size, device=dev)
    prec = for_backbone(bb, dev)  # as a run on this device would choose it

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    @torch.inference_mode()
    def frozen() -> None:
        with prec.autocast(dev.type):
            bb(x).float()
        sync()

    shift = torch.zeros(1, 1, bb.num_features, device=dev, requires_grad=True)  # an input-side parameter
    hook = bb.model.patch_embed.register_forward_hook(lambda m, i, o: o + shift.to(o.dtype))

    def train_pass() -> None:
        with prec.autocast(dev.type):
            loss = bb.model.forward_features(x).float().mean()
        loss.backward()
        shift.grad = None
        sync()

    f = median_seconds(frozen, repeat=3) / batch
    log(f"frozen pass: {f * 1e3:.1f} ms/image ({backbone} @ {bb.img_size}, {dev.type})")
    b = median_seconds(train_pass, repeat=3) / batch
    hook.remove()
    log(f"training pass (forward + backward to input-side parameters): {b * 1e3:.1f} ms/image")
    units: dict[str, float] = {"f": f, "b": b}
    for name in strategies if strategies is not None else STRATEGIES.names():
        target = card(name).unit_seconds
        own = load_target(name, target)(bb.num_features, dev) if target else {}
        for unit, seconds in own.items():
            if unit in units:
                raise ValueError(f"strategy {name}: unit {unit!r} is stated twice; units need unique names")
            units[unit] = seconds
            log(f"{name}: {unit} {seconds * 1e6:.2f} us/image")
    return {
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "backbone": backbone,
        "img_size": bb.img_size,
        "batch": batch,
        "tokens": _tokens(bb, bb.img_size),
        "precision": prec.name,
        "precision_reason": prec.reason,
        "s_per_image": units,
    }


def projection(costs: dict[str, Any], seeds: int = 3, names: list[str] | None = None) -> dict[str, Any]:
    """Device-hours per projection row (:func:`projection_rows`) for the six paper benchmarks x ``seeds`` seeds,
    from measured per-image costs."""
    unit = costs["s_per_image"]
    tokens = costs.get("tokens", 197)
    rows, totals, configs, unmodelled = [], {}, {}, []
    cacheable: dict[str, list[float]] = {bench: [] for bench in PAPER_BENCHMARKS}  # per default row
    defaults = []
    for row, c, cfg in projection_rows(names):
        try:
            works = {bench: c.cost(cfg, paper_shape(info, tokens)) for bench, info in PAPER_BENCHMARKS.items()}
        except NotImplementedError:
            unmodelled.append(row)
            continue
        configs[row] = dataclasses.asdict(cfg)
        default = row == c.name
        if default:
            defaults.append(row)
        total_run = total_cached = 0.0
        for bench, w in works.items():
            work = work_counts(w)
            secs = {k: v * unit[k] for k, v in work.items()}
            run_s = sum(secs.values())
            # clbench's feature cache: the cacheable frozen features are computed once per benchmark for every seed
            # (and shared between strategies: the table total below counts them once).
            shared = w.f_cacheable * unit["f"]
            if default:
                cacheable[bench].append(shared)
            total_run += seeds * run_s
            total_cached += shared + seeds * (run_s - shared)
            rows.append(
                {
                    "strategy": row,
                    "bench": bench,
                    **{f"{k}_count": v for k, v in work.items()},
                    "hours_per_run": run_s / 3600,
                }
            )
        totals[row] = {"hours": total_run / 3600, "hours_with_feature_cache": total_cached / 3600}
    table = sum(totals[s]["hours_with_feature_cache"] for s in defaults)
    table -= sum(sum(v) - max(v) for v in cacheable.values() if v) / 3600  # features shared between strategies
    return {
        "seeds": seeds,
        "benchmarks": PAPER_BENCHMARKS,
        "tokens": tokens,
        "configs": configs,
        "per_run": rows,
        "per_strategy": totals,
        "table_strategies": defaults,
        "table_hours_with_cache": table,
        "unmodelled": unmodelled,
        "note": "hours on the measured device; per_strategy.hours pays every run's frozen passes, "
        "hours_with_feature_cache pays the cacheable features once per benchmark; the table total "
        "(the default config of every strategy in table_strategies) also shares them between strategies",
    }


def format_projection(proj: dict[str, Any], costs: dict[str, Any]) -> str:
    """A Markdown table of :func:`projection` (device-hours per strategy)."""
    unit = "GPU" if costs["device"] == "cuda" else f"CPU ({costs['threads']} threads)"
    lines = [
        f"| strategy | {unit}-hours, 6 benchmarks x {proj['seeds']} seeds | with the feature cache | "
        "cost per image, in frozen passes (one CIFAR-100 run) |",
        "|---|---|---|---|",
    ]
    cifar = {r["strategy"]: r for r in proj["per_run"] if r["bench"] == "cifar100"}
    for s, t in proj["per_strategy"].items():
        r = cifar[s]
        per_image = r["hours_per_run"] * 3600 / costs["s_per_image"]["f"]
        per_image /= PAPER_BENCHMARKS["cifar100"]["train"] + PAPER_BENCHMARKS["cifar100"]["test"]
        lines.append(f"| {s} | {t['hours']:,.1f} | {t['hours_with_feature_cache']:,.1f} | {per_image:,.1f} |")
    lines.append(
        f"\ntable ({', '.join(proj['table_strategies'])}), with the feature cache: "
        f"{proj['table_hours_with_cache']:,.1f} {unit}-hours"
    )
    return "\n".join(lines)


PROJECTION_BACKBONE = ("vit_base_patch16_224", 224)  # the paper backbone


@measurement(
    "projection",
    help="device-hours of a paper table for every registered strategy from measured per-image costs",
    args=(device_arg(), *backbone_args(PROJECTION_BACKBONE)),
)
def _projection(flags: argparse.Namespace) -> dict[str, Any]:
    costs = measure_costs(device=flags.device, backbone=flags.backbone, img_size=flags.img_size)
    result = {"benchmark": "projection", "costs": costs, "projection": projection(costs)}
    print(format_projection(result["projection"], costs))
    return result


@measurement(
    "projection-check",
    help="the projection's cost model against recorded runs",
    args=(
        arg(
            "--run",
            dest="run_dirs",
            action="append",
            default=[],
            metavar="RUN_DIR",
            help="a run whose recorded time the cost model should predict (repeatable)",
        ),
    ),
)
def _projection_check(flags: argparse.Namespace) -> dict[str, Any]:
    if not flags.run_dirs:
        raise ClbenchError("projection-check needs --run RUN_DIR (a run folder)")
    return {"benchmark": "projection-check", "checks": [check_against_run(d) for d in flags.run_dirs]}
