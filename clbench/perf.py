"""Speed benchmarks that measure and record (``clbench perf``); ratios are measured within one run so they
hold on noisy machines. Results go to a JSON file (``reports/perf/`` for the committed ones).

- ``feature-probe``: how well a backbone's frozen features separate a benchmark's classes at a given input
  size and normalisation (nearest-class-mean and logistic-regression accuracy on all classes at once); used
  to choose the embedded benchmark's input size.
- a strategy's own benchmarks (:meth:`clbench.strategy.Strategy.perf_benchmarks`, e.g. TOSCA's routing cost in
  ``tosca/perf.py``), listed by ``clbench perf --help``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def median_seconds(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def feature_probe(
    bench: str = "emoji",
    backbone: str | None = None,
    img_size: int | None = None,
    normalize: bool | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Nearest-class-mean (cosine) and linear-probe accuracy of frozen features, all classes at once."""
    import torch.nn.functional as F
    from sklearn.linear_model import LogisticRegression

    from clbench.catalog import DEFAULT_STRATEGY
    from clbench.harness import RunConfig, prepare

    s = prepare(
        RunConfig(strategy=DEFAULT_STRATEGY, bench=bench, backbone=backbone, img_size=img_size, normalize=normalize)
    )
    ftr, fte = F.normalize(s.features["train"], dim=1), F.normalize(s.features["test"], dim=1)
    ytr, yte = torch.as_tensor(s.bench.train_y), torch.as_tensor(s.bench.test_y)
    protos = torch.stack([ftr[ytr == c].mean(0) for c in range(s.bench.n_classes)])
    ncm = float(((fte @ F.normalize(protos, dim=1).T).argmax(1) == yte).float().mean() * 100)
    clf = LogisticRegression(max_iter=2000).fit(ftr.numpy(), ytr.numpy())
    linear = float(clf.score(fte.numpy(), yte.numpy()) * 100)
    log(
        f"{bench} {s.backbone.spec.name} @ {s.backbone.img_size} ({s.eval_tf.identity()}): "
        f"nearest-class-mean {ncm:.2f} %, linear probe {linear:.2f} %"
    )
    return {
        "benchmark": "feature-probe",
        "bench": bench,
        "backbone": s.backbone.spec.name,
        "weights_digest": s.backbone.digest,
        "img_size": s.backbone.img_size,
        "transform": s.eval_tf.identity(),
        "ncm_acc": ncm,
        "linear_probe_acc": linear,
    }


# ----------------------------------------------------------------------------------------------- parameters
def parse_tasks(text: str) -> tuple[int, ...]:
    """``10x10`` -> ten tasks of 10 classes; ``50,10,10`` -> the classes of each task."""
    from clbench.errors import ClbenchError

    try:
        if "x" in text:
            tasks, classes = (int(v) for v in text.split("x"))
            sizes = (classes,) * tasks
        else:
            sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ClbenchError(
            f"--tasks {text!r}: expected TxC (T tasks of C classes) or C1,C2,.. (positive integers)",
            "e.g. --tasks 10x10 or --tasks 50,10,10",
        )
    return sizes


def param_table(d: int, depth: int, task_sizes: tuple[int, ...], names: list[str] | None = None) -> dict[str, Any]:
    """Parameters added and trained per task by every registered strategy's default config (or ``names``'), from
    its :meth:`~clbench.strategy.Strategy.param_formula`, for a ViT of width ``d`` and ``depth`` blocks."""
    import dataclasses

    from clbench.catalog import FEATURED_STRATEGY, STRATEGIES
    from clbench.config import make_strategy_config
    from clbench.errors import ClbenchError

    if d < 1 or depth < 1:
        raise ClbenchError(f"--d {d} --depth {depth}: both must be >= 1")
    out: dict[str, Any] = {
        "benchmark": "params",
        "d": d,
        "depth": depth,
        "task_sizes": list(task_sizes),
        "strategies": {},
        "unstated": [],
    }
    for name in names if names is not None else STRATEGIES.names():
        cls = STRATEGIES.get(name)
        cfg = make_strategy_config(cls, None, ())
        try:
            pc = cls.param_formula(cfg, d, depth, task_sizes)
        except NotImplementedError:
            out["unstated"].append(name)
            continue
        except ValueError as e:  # e.g. a width the method's bottleneck ratio does not divide
            raise ClbenchError(f"{name} at d={d}: {e}") from None
        out["strategies"][name] = {
            "added_per_task": list(pc.added_per_task),
            "stored_per_task": list(pc.stored_per_task),
            "trainable_per_task": list(pc.trainable_per_task),
            "head": pc.head,
            "added_total": sum(pc.added_per_task),
            "stored_total": sum(pc.stored_per_task),
            "config": dataclasses.asdict(cfg),
        }
    base = out["strategies"].get(FEATURED_STRATEGY)
    for row in out["strategies"].values():  # ratios to the featured method's (TOSCA), from the same counts
        row["added_over_tosca"] = row["added_total"] / base["added_total"] if base and base["added_total"] else None
        row["added_and_stored_over_tosca"] = (
            (row["added_total"] + row["stored_total"]) / (base["added_total"] + base["stored_total"])
            if base and base["added_total"] + base["stored_total"]
            else None
        )
    return out


def format_params(table: dict[str, Any]) -> str:
    """A Markdown table of :func:`param_table`: per strategy, learned parameters added (first task, last task, in
    all), statistics stored in all, parameters trained (first and last task), and the ratios to TOSCA's."""
    sizes = table["task_sizes"]
    lines = [
        (
            f"parameters per task, ViT of width {table['d']} and {table['depth']} blocks, {len(sizes)} tasks "
            f"({'+'.join(map(str, sizes))} classes)"
        ),
        "",
        "| strategy | added, task 1 | added, last task | added in all | stored statistics in all | trainable, task 1 "
        "| trainable, last task | added / TOSCA's | added + stored / TOSCA's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    for name, row in table["strategies"].items():
        a, t = row["added_per_task"], row["trainable_per_task"]
        lines.append(
            f"| {name} | {a[0]:,} | {a[-1]:,} | {row['added_total']:,} | {row['stored_total']:,} | {t[0]:,} "
            f"| {t[-1]:,} | {ratio(row.get('added_over_tosca'))} | {ratio(row.get('added_and_stored_over_tosca'))} |"
        )
    if table["unstated"]:
        lines.append(f"\nno parameter formula: {', '.join(table['unstated'])}")
    return "\n".join(lines)
