"""``clbench perf params``: parameters added, stored and trained per task by every registered strategy's default
config, from its :meth:`~clbench.methods.contract.Strategy.param_formula` (no network is built)."""

from __future__ import annotations

import argparse
from typing import Any

from clbench.core.catalog import FEATURED_STRATEGY, STRATEGIES
from clbench.core.config import make_strategy_config
from clbench.errors import ClbenchError
from clbench.perf import arg, bounded, measurement

TASKS_MAX = 1000  # tasks of a --tasks plan (the literature's longest streams have 100 or fewer)
CLASSES_MAX = 100_000  # classes in one task (ImageNet-21k has 21,843 in all)


def parse_tasks(text: str) -> tuple[int, ...]:
    """``10x10`` -> ten tasks of 10 classes; ``50,10,10`` -> the classes of each task."""
    if len(text) > 20 * TASKS_MAX:  # longer than TASKS_MAX numbers of any sensible size: not parsed at all
        raise ClbenchError(f"--tasks: {len(text):,} characters, more than {TASKS_MAX:,} tasks can take", "e.g. 10x10")
    try:
        if "x" in text:
            tasks, classes = (int(v) for v in text.split("x"))
            if not (0 < tasks <= TASKS_MAX):  # checked before (classes,) * tasks is built
                raise ClbenchError(f"--tasks {text!r}: {tasks:,} tasks; the bound is 1 to {TASKS_MAX:,}", "e.g. 10x10")
            sizes = (classes,) * tasks
        else:
            sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) > TASKS_MAX or (sizes and max(sizes) > CLASSES_MAX):
        raise ClbenchError(
            f"--tasks {text[:40]!r}: at most {TASKS_MAX:,} tasks of at most {CLASSES_MAX:,} classes each",
            "e.g. --tasks 10x10 or --tasks 50,10,10",
        )
    if not sizes or min(sizes) < 1:
        raise ClbenchError(
            f"--tasks {text!r}: expected TxC (T tasks of C classes) or C1,C2,.. (positive integers)",
            "e.g. --tasks 10x10 or --tasks 50,10,10",
        )
    return sizes


def param_table(d: int, depth: int, task_sizes: tuple[int, ...], names: list[str] | None = None) -> dict[str, Any]:
    """Parameters added and trained per task by every registered strategy's default config (or ``names``'), from
    its :meth:`~clbench.methods.contract.Strategy.param_formula`, for a ViT of width ``d`` and ``depth`` blocks."""
    import dataclasses

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


@measurement(
    "params",
    help="parameters per task of every registered strategy, from its formula",
    args=(
        arg(
            "--d",
            type=bounded("--d", 1, 16384, "the width of a ViT"),
            default=768,
            help="the ViT's width (default: 768, ViT-B/16)",
        ),
        arg(
            "--depth",
            type=bounded("--depth", 1, 256, "the blocks of a ViT"),
            default=12,
            help="the ViT's blocks (default: 12)",
        ),
        arg(
            "--tasks",
            default="10x10",
            metavar="TxC|C1,C2,..",
            help="T tasks of C classes, or the classes of each task (default: 10x10)",
        ),
    ),
)
def _params(flags: argparse.Namespace) -> dict[str, Any]:
    result = param_table(flags.d, flags.depth, parse_tasks(flags.tasks))
    print(format_params(result))
    return result
