"""``clbench tune``: the command's flags and what it prints (the study itself: :mod:`clbench.tune.study`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clbench.core.catalog import card
from clbench.core.config import make_strategy_config
from clbench.core.costs import RunShape
from clbench.errors import ClbenchError
from clbench.tune.parallel import Where
from clbench.tune.space import search_space

HELP = (
    "choose a strategy's settings on a validation split (Optuna TPE over the space its card declares), "
    "never looking at the test images; writes OUT/chosen.yaml for `clbench run --config`"
)


def add_args(p: argparse.ArgumentParser, parse_key_value: Callable[[str], tuple[str, str]]) -> None:
    """``clbench tune``'s flags on ``p``; ``parse_key_value``: the command line's ``--set KEY=VALUE`` reader (passed
    in: this module sits below the command line and does not import it)."""
    p.add_argument("--strategy", required=True, help="the method to tune (see `clbench list`)")
    p.add_argument("--bench", default="emoji", help="the tuning benchmark (default: %(default)s)")
    p.add_argument(
        "--validation",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="share of each class's training images held out to score the trials (default: %(default)s)",
    )
    p.add_argument("--trials", type=int, default=20, metavar="N", help="trials to finish (default: %(default)s)")
    p.add_argument("--space", metavar="FILE.yaml", help="search space on top of the card's: `lr: [1.0e-4, 0.1, log]`")
    p.add_argument("--out", metavar="DIR", help="study folder (default: tune/<strategy>-<bench>); rerun to continue")
    p.add_argument(
        "--set",
        dest="overrides",
        type=parse_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a strategy setting every trial takes (e.g. a short budget: --set epochs=2); not searched",
    )
    p.add_argument("--no-pruner", dest="pruner", action="store_false", help="run every trial to its last task")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="trials at once (local: N worker processes, as clbench sweep; ray: default as many as the cluster's "
        "CPUs hold); trials run at once are not pruned. Default: one at a time in this process",
    )
    p.add_argument(
        "--backend", choices=("local", "ray"), default="local", help="where trials run at once (default: local)"
    )
    p.add_argument("--ray-address", metavar="HOST:PORT", help="ray: an existing cluster (default: a local Ray)")
    p.add_argument("--cpus-per-run", type=int, metavar="N", help="CPUs (torch threads) per trial run at once")
    for flag, kind, what in (
        ("--backbone", str, "backbone (default: the benchmark's)"),
        ("--weights", str, "weights source (default: auto)"),
        ("--init-cls", int, "classes in the first task"),
        ("--increment", int, "classes per later task"),
        ("--train-per-class", int, "learn from the first K training images per class"),
        ("--img-size", int, "network input size"),
        ("--precision", str, "precision of the frozen backbone (default: auto)"),
        ("--scenario", str, "class or domain (default: class)"),
        ("--profile", str, "the strategy's named profile"),
        ("--seed", int, "seed of every trial's run (default: 1993)"),
        ("--classes", int, "tune on the first K classes of the class order only (a held-out class subset)"),
        ("--class-order-seed", int, "seed of the class order (default: 1993)"),
        ("--data-root", str, "data folder"),
        ("--device", str, "auto, cpu or cuda"),
    ):
        p.add_argument(flag, type=kind, help=what)


def _base(args: argparse.Namespace) -> Any:
    # looked up at call time: tests replace it on its module
    from clbench.core.config import RunConfig

    given = {
        k: getattr(args, k)
        for k in (
            "backbone",
            "weights",
            "init_cls",
            "increment",
            "train_per_class",
            "img_size",
            "precision",
            "scenario",
            "profile",
            "seed",
            "classes",
            "class_order_seed",
            "data_root",
            "device",
        )
        if getattr(args, k) is not None
    }
    return RunConfig(strategy=args.strategy, bench=args.bench, validation=args.validation, **given)


def estimate(strategy: str, base: Any) -> str:
    """The per-trial work from the card's cost model (frozen passes, served by the feature cache, and training
    passes through the ViT), on the tuning benchmark's shape; a line saying so where the card has no model."""
    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks import BENCHMARKS

    c = card(strategy)
    if c.work is None:
        return "cost: no cost model on the card; the measured time of the first trial follows it"

    spec = BENCHMARKS.get(base.bench)
    try:
        # deferred: loads numpy, which importing this module does not
        from clbench.benchmarks import build_benchmark

        bench = build_benchmark(
            spec, base.data_root, base.init_cls, base.increment, base.class_order_seed, base.scenario
        )
        if base.classes is not None:
            # deferred: loads numpy, which importing this module does not
            from clbench.run.validation import first_classes

            bench = first_classes(bench, base.classes, base.init_cls, base.increment)
        n_train = len(bench.train) * (1 - base.validation)
        n_val = len(bench.train) * base.validation
        tasks = bench.n_tasks
    except ClbenchError as e:
        return f"cost: unknown before the first trial ({e.args[0]})"
    shape = RunShape.equal(n_train, n_val, tasks)
    w = c.work(make_strategy_config(c, base.profile, ()), shape)
    train_passes = f", {w.b:,.0f} training passes through the ViT" if w.b else ""
    uncached = w.f - w.f_cacheable
    frozen = f"{uncached:,.0f} frozen passes" if uncached else "no frozen pass (features cached once for the study)"
    return f"cost per trial (the card's model at the defaults): {frozen}{train_passes}; {tasks} tasks"


def study_cost(trials: int, where: Any) -> str:
    """The study's length in trial durations: ``trials`` one after another, or in rounds of the trials run at once."""
    if where.in_process:
        return f"cost of the study: {trials} trials one after another, {where.describe()}"
    at_once = where.jobs
    if at_once is None:  # Ray without --jobs: the cluster's CPUs decide, known once it is reached
        return f"cost of the study: {trials} trials, {where.describe()}"
    rounds = -(-trials // at_once)
    return f"cost of the study: {trials} trials, {where.describe()}: wall time about {rounds} x one trial's"


def main(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # deferred: loads torch, which importing this module does not
    from clbench.tune.study import TuneRequest, run_study

    if args.trials < 1:
        raise ClbenchError(f"--trials {args.trials}: expected 1 or more")
    space = search_space(args.strategy, args.space)
    base = _base(args)
    out = Path(args.out) if args.out else Path("tune") / f"{args.strategy}-{args.bench}"
    place = Where(args.backend, args.jobs, args.ray_address, args.cpus_per_run)
    req = TuneRequest(args.strategy, space, args.trials, base, out, args.pruner, tuple(args.overrides), place)
    where = f"{args.bench} (its first {args.classes} classes)" if args.classes else args.bench
    print(f"tuning {args.strategy} on the validation split ({args.validation:g}) of {where}: {args.trials} trials")
    print("search space: " + ", ".join(f"{k} {d.to_json()}" for k, d in space.items()))
    print(estimate(args.strategy, base))
    print(study_cost(args.trials, place))
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False
    ) as bar:
        task = bar.add_task("trials", total=args.trials)

        def advance(done: int, best: float | None) -> None:
            best_text = "-" if best is None else f"{best:.2f}"
            bar.update(task, completed=done, description=f"trials (best validation {best_text})")

        outcome = run_study(req, log=bar.console.print, advance=advance)
    s = outcome.summary
    print(
        f"best validation accuracy {s['best_validation_acc']:.2f} (trial {s['best_trial']}): "
        + ", ".join(f"{k}={v}" for k, v in s["best_settings"].items())
    )
    if s["defaults_validation_acc"] is not None:
        print(f"defaults: {s['defaults_validation_acc']:.2f}")
    print(f"chosen settings: {outcome.chosen}  (clbench run --config {outcome.chosen})")
    return 0
