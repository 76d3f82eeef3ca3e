"""Budget curves: final accuracy against training budget in optimizer steps, from records that differ
only in their budget.

A record's budget is its strategy settings that say how much it trains: ``epochs`` and every other setting ending in
``epochs`` (the cosine schedules step per epoch, so this is also the schedule's length), ``train_per_class``, and
``milestone``, the epoch of a step schedule's decay, which a budget point scales with its epochs (SLCA's curve sets
it to 0.9 x epochs, as the reference's 18 of 20).
Its optimizer steps are the sum of ``params.extra["optimizer_steps_per_task"]``, which the methods that train
through the ViT note per task (:meth:`clbench.methods.contract.Strategy.note_steps`; records made before carry none).
Everything else (benchmark and split, backbone, weights, input size, transform, precision, every other strategy
setting) must be equal along a curve; seeds are averaged per point. A bf16 record's kernels are part of its settings
too (``bf16 kernels``: torch's CPU capability, and AMX where the record says so): bf16 numbers move with the CPU's
kernels (L2P's reference config, seed 1993: 23.35 on an Intel Xeon with AMX, 25.37 on an AMD EPYC with AVX-512 BF16
and no AMX), so a curve never mixes them. fp32 records of any CPU share a curve: the gate's fp32 runs of the
methods that train heads or prompts are bit-identical under AVX512 and AVX2. That does not hold for the two that
train through the ViT's weights (SLCA's and InfLoRA's fp32 ci runs differed by up to 5.06 and 1.69 points per
entry, reports/gate/README.md): points of theirs made on different CPUs carry differences of that size.

On a curve, the point whose budget equals the strategy's ``quick`` profile is marked ``quick`` and the one whose
budget equals its default config (the reference's epochs) ``reference epochs``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from clbench.core.catalog import MethodCard, card, config_defaults
from clbench.core.config import make_strategy_config, run_level
from clbench.errors import ClbenchError
from clbench.records.schema import RunRecord, trained_settings
from clbench.report.collect import Collection, Run

STEPS_KEY = "optimizer_steps_per_task"
QUICK, REFERENCE = "quick", "reference epochs"
RECORD_SETTINGS = (  # record fields a budget curve holds fixed (the strategy settings are compared besides)
    "strategy",
    "bench",
    "task_sizes",
    "class_order_seed",
    "backbone",
    "weights_digest",
    "img_size",
    "transform",
    "precision",
    "protocol",
)


def is_budget_setting(name: str) -> bool:
    """Strategy settings that set how much a run trains (module docstring)."""
    return name in ("train_per_class", "milestone") or name.endswith("epochs")


def budget_of(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sorted(settings.items()) if is_budget_setting(k)}


def record_budget(record: RunRecord) -> dict[str, Any]:
    """The budget settings of ``record`` (module docstring)."""
    return budget_of(record.settings)


def steps_problem(record: RunRecord) -> str | None:
    """What makes the step counts ``record`` carries no run's (a negative count, a count that is not a whole number),
    or None: fine, or carrying none (older records)."""
    steps = record.params.extra.get(STEPS_KEY)
    if steps is None:
        return None
    if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        return f"params.{STEPS_KEY} is not a list of whole numbers"
    if any(s < 0 for s in steps):
        return f"params.{STEPS_KEY} holds a negative step count ({min(steps)})"
    return None


def optimizer_steps(record: RunRecord) -> int | None:
    """Optimizer steps of the whole run (every task), or None where the record does not carry them or carries counts
    no run makes (:func:`steps_problem`)."""
    steps = record.params.extra.get(STEPS_KEY)
    if not isinstance(steps, list) or steps_problem(record) is not None:
        return None
    return int(sum(steps))


def bf16_kernels(record: RunRecord) -> str | None:
    """The CPU kernels a bf16 record's numbers depend on (module docstring); None for other precisions."""
    if record.precision != "bf16" or (record.device or "cpu") != "cpu":
        return None
    host = record.host
    return f"{host.cpu_capability or 'unknown CPU'}{' AMX' if host.amx else ''}"


def fixed_settings(record: RunRecord) -> dict[str, Any]:
    """What must be equal along a budget curve: the record's defining fields and its non-budget strategy settings."""
    out = {name: getattr(record, name) for name in RECORD_SETTINGS}
    if (kernels := bf16_kernels(record)) is not None:
        out["bf16 kernels"] = kernels
    if (record.weights_source or "").startswith("random"):  # a random init follows the seed: seeds still average
        out["weights_digest"] = "random init"

    # a setting added since the record (InfLoRA's ``float64``): the record trained at its default
    settings = {**config_defaults(record.strategy), **record.settings}
    out.update({k: v for k, v in settings.items() if not is_budget_setting(k)})
    return out


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_settings(records: Sequence[RunRecord]) -> dict[str, list[str]]:
    """Setting name -> its distinct values, for every non-budget setting that is not the same in all ``records``."""
    values: dict[str, set[str]] = defaultdict(set)
    names: set[str] = set()
    for r in records:
        names |= fixed_settings(r).keys()
    for r in records:
        s = fixed_settings(r)
        for name in names:
            values[name].add(_text(s.get(name)))
    return {name: sorted(v) for name, v in sorted(values.items()) if len(v) > 1}


def _marks(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Budget of the strategy's ``quick`` profile and of its default config, where the strategy is registered."""

    def budget(cls: MethodCard, profile: str | None) -> dict[str, Any]:
        k = run_level(cls, profile, None, "train_per_class")
        return budget_of(trained_settings(asdict(make_strategy_config(cls, profile, ())), k))

    try:
        cls = card(record.strategy)  # the method's settings without loading it (or torch)
        out = {REFERENCE: budget(cls, None)}
        if QUICK in cls.profiles:
            out[QUICK] = budget(cls, QUICK)
    except (ClbenchError, ValueError, TypeError):  # an unknown strategy or a settings class that changed since
        return {}
    return out


@dataclass(frozen=True)
class BudgetPoint:
    steps: int  # optimizer steps of the run
    budget: dict[str, Any]  # the budget settings
    acc: list[float]  # final accuracy (main protocol) of each seed
    runs: list[str]  # run ids
    marks: tuple[str, ...]  # QUICK and/or REFERENCE

    @property
    def mean(self) -> float:
        return float(np.mean(self.acc))

    @property
    def std(self) -> float:
        return float(np.std(self.acc, ddof=1)) if len(self.acc) > 1 else 0.0


@dataclass(frozen=True)
class BudgetCurve:
    strategy: str
    bench: str  # the benchmark label
    settings: dict[str, Any]  # the fixed settings
    points: list[BudgetPoint]  # by steps


def _final_acc(run: Run) -> float:
    acc = run.summary(run.record.protocol).last_acc
    if acc is None:  # a complete record has it; collect() reads complete records only
        raise ClbenchError(f"{run.run_id}: the record has no final accuracy", "report complete runs only")
    return float(acc)


def _curve(runs: list[Run]) -> BudgetCurve:
    by_budget: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_budget[_text(record_budget(run.record))].append(run)
    marks = _marks(runs[0].record)
    points = []
    for group in by_budget.values():
        budget = record_budget(group[0].record)
        steps = sorted({optimizer_steps(r.record) or 0 for r in group})  # every group's records carry steps
        if len(steps) > 1:  # same settings, same budget: the step count is the same unless the data differ
            raise ClbenchError(
                f"{group[0].strategy}: runs {', '.join(r.run_id for r in group)} have the same budget but "
                f"{', '.join(map(str, steps))} optimizer steps",
                "report runs made on the same data",
            )
        points.append(
            BudgetPoint(
                steps=steps[0],
                budget=budget,
                acc=[_final_acc(r) for r in group],
                runs=[r.run_id for r in group],
                marks=tuple(name for name, b in marks.items() if _text(b) == _text(budget)),
            )
        )
    return BudgetCurve(
        runs[0].strategy, runs[0].bench_label, fixed_settings(runs[0].record), sorted(points, key=lambda p: p.steps)
    )


def budget_curves(coll: Collection, strict: bool = False) -> tuple[list[BudgetCurve], list[str]]:
    """Curves of every strategy and benchmark whose records differ only in their budget, and notes on the rest.

    ``strict`` (``clbench report --budget-curves``): all records of a strategy on a benchmark must form one curve;
    records that differ in more than their budget, or that carry no step count, raise :class:`ClbenchError`
    naming the differing settings. Otherwise the records are split into groups of equal settings and every group
    with at least two budgets becomes a curve; the others are named in the notes.
    """
    by_strategy: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in coll.seeded():
        by_strategy[(run.bench_label, run.strategy)].append(run)
    curves: list[BudgetCurve] = []
    notes: list[str] = []
    for (bench, strategy), runs in sorted(by_strategy.items()):
        wrong = {r.run_id: p for r in runs if (p := steps_problem(r.record)) is not None}
        uncounted = [r.run_id for r in runs if optimizer_steps(r.record) is None and r.run_id not in wrong]
        if wrong:  # never drawn: a negative step count would put a point left of zero
            rid, problem = next(iter(wrong.items()))
            if strict:
                raise ClbenchError(
                    f"budget curve of {strategy} on {bench}: run {rid}'s record is not one clbench wrote ({problem})",
                    "leave that record out, or re-run it",
                )
            notes.append(f"budget curve of {strategy} on {bench} leaves out {', '.join(wrong)}: {problem}")
        if strict:
            differ = differing_settings([r.record for r in runs])
            if differ:
                detail = "; ".join(f"{name}: {' vs '.join(values)}" for name, values in differ.items())
                raise ClbenchError(
                    f"budget curve of {strategy} on {bench}: the records differ in more than their budget ({detail})",
                    "give only records that differ in their budget (epochs, train_per_class, milestone)",
                )
            if uncounted:
                raise ClbenchError(
                    f"budget curve of {strategy} on {bench}: no optimizer step count in {', '.join(uncounted)}",
                    "re-run them with this clbench (records carry params.optimizer_steps_per_task)",
                )
        groups: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            if optimizer_steps(run.record) is not None:
                groups[_text(fixed_settings(run.record))].append(run)
        for group in groups.values():
            budgets = {_text(record_budget(r.record)) for r in group}
            if len(budgets) >= 2 or (strict and budgets):
                curves.append(_curve(group))
        if not strict and len({_text(record_budget(r.record)) for r in runs}) > 1:
            drawn = {
                rid for c in curves if c.strategy == strategy and c.bench == bench for p in c.points for rid in p.runs
            }
            left = [r.run_id for r in runs if r.run_id not in drawn and r.run_id not in wrong]
            if left:
                notes.append(
                    f"budget curve of {strategy} on {bench} leaves out {', '.join(left)}: "
                    + ("no optimizer step count" if set(left) <= set(uncounted) else "other settings than the rest")
                )
    return curves, notes


def curve_label(curve: BudgetCurve) -> str:
    kernels = curve.settings.get("bf16 kernels")
    return f"{curve.strategy} ({curve.settings.get('precision')}{f', {kernels}' if kernels else ''})"


def steps_label(steps: float) -> str:
    return f"{steps:,.0f}" if steps < 10_000 else f"{steps / 1000:,.0f}k"


def budget_table_rows(curves: Sequence[BudgetCurve]) -> list[dict[str, Any]]:
    """One row per point: the numbers behind the figure."""
    rows = []
    for c in curves:
        for p in c.points:
            rows.append(
                {
                    "benchmark": c.bench,
                    "strategy": curve_label(c),
                    "budget": ", ".join(f"{k}={v}" for k, v in p.budget.items()),
                    "optimizer steps": steps_label(p.steps),
                    "final acc %": f"{p.mean:.2f}" + (f" ± {p.std:.2f}" if len(p.acc) > 1 else ""),
                    "n (seeds)": str(len(p.acc)),
                    "marks": ", ".join(p.marks) or "-",
                    "runs": ", ".join(p.runs),
                }
            )
    return rows


__all__ = [
    "QUICK",
    "REFERENCE",
    "BudgetCurve",
    "BudgetPoint",
    "budget_curves",
    "budget_table_rows",
    "differing_settings",
    "is_budget_setting",
    "optimizer_steps",
]
