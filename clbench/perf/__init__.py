"""Measurements that time or count and record (``clbench perf NAME``), one module per measurement, in one registry.

Each measurement declares, next to the code it runs, its name, its help text, its command-line flags and a function from
those flags to a JSON-able dict (:class:`Measurement`, registered with :func:`measurement`). ``clbench perf`` dispatches
through :func:`measurements`; ``clbench perf --help`` lists them; an unknown name gets "did you mean". Ratios are
measured within one run so that they hold on noisy machines; the committed results are in ``reports/perf/``.

- :mod:`clbench.perf.throughput`: ``precision`` and ``threads``, feature-extraction img/s per precision, thread
  count and OpenMP wait policy.
- :mod:`clbench.perf.main_job`: ``main-job``, the README's main job cold and warm against one feature pass.
- :mod:`clbench.perf.decoded_cache`: ``decoded-cache``, a trained method's loader epoch decoded every read vs cached.
- :mod:`clbench.perf.probe`: ``feature-probe``, how well frozen features separate a benchmark's classes.
- :mod:`clbench.perf.sweep_overhead`: ``sweep-overhead``, local vs Ray sweep overhead per run.
- :mod:`clbench.perf.projection`: ``projection`` and ``projection-check``, the cost model of a paper table.
- :mod:`clbench.perf.params`: ``params``, parameters per task of every strategy, from its formula.
- :mod:`clbench.perf.routers`: ``routers``, the per-image cost of every router.
- :mod:`clbench.perf.train_step`: ``train-step``, a strategy's training step against a bare forward + backward.
- :mod:`clbench.perf.calibration`: ``calibrate``, the regression gate's calibration workload.
- :mod:`clbench.perf.report_scale`: ``report-scale``, ``clbench report`` on the committed study and 1,000 records.
- :mod:`clbench.perf.instant_errors`: ``instant-errors``, the seconds ``clbench`` takes to refuse a mistyped command.
- a method's own measurements (its card's ``perf_benchmarks``, :class:`clbench.core.catalog.MethodCard`, e.g.
  ``tosca-routing`` in ``tosca/perf.py``), registered when the registry is first asked for.

Importing this package is cheap (no torch): :mod:`clbench.report` reads the calibration's identity from here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clbench.core.catalog import load_target
from clbench.core.registry import Registry
from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json
from clbench.records.host import git_revision, library_versions

if TYPE_CHECKING:
    from clbench.core.catalog import MethodCard

# The generic measurements: each module registers its own on import (:func:`measurement`).
MODULES = (
    "clbench.perf.throughput",
    "clbench.perf.main_job",
    "clbench.perf.decoded_cache",
    "clbench.perf.probe",
    "clbench.perf.sweep_overhead",
    "clbench.perf.projection",
    "clbench.perf.params",
    "clbench.perf.routers",
    "clbench.perf.train_step",
    "clbench.perf.calibration",
    "clbench.perf.report_scale",
    "clbench.perf.instant_errors",
)
PERF_BACKBONE = ("vit_small_patch14_dinov2", 112)  # the offline ViT-S/14 at the embedded benchmark's input size


@dataclass(frozen=True)
class Arg:
    """One command-line flag of a measurement: ``parser.add_argument(*flags, **options)``."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


def bounded(flag: str, low: int, high: int, why: str) -> Callable[[str], int]:
    """An argparse ``type`` reading a whole number of ``flag`` in ``[low, high]``; outside, a ClbenchError naming the
    bound and ``why`` it is there, which passes through argparse to the CLI's one-line refusal (every number that sizes
    a measurement's work, memory or disk is bounded where it is read: a mistyped ``--records 1000000000`` would fill
    the disk, a ``--steps`` of millions run for days)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: not a whole number") from None
        if not low <= value <= high:
            raise ClbenchError(f"{flag} must be >= {low} and <= {high} (got {value}; {why})")
        return value

    parse.__name__ = "whole number"  # argparse names the type in some refusals
    return parse


IMG_SIZE_MAX = 1024  # pixels: a ViT-S/14 at 1,024 already holds 5,329 tokens; attention memory grows as their square


def backbone_args(default: tuple[str, int] = PERF_BACKBONE) -> tuple[Arg, Arg]:
    """``--backbone`` and ``--img-size`` with the measurement's defaults."""
    return (
        arg("--backbone", default=default[0], help=f"backbone (default: {default[0]})"),
        arg(
            "--img-size",
            type=bounded("--img-size", 16, IMG_SIZE_MAX, "attention memory grows with the fourth power of the size"),
            default=default[1],
            help=f"input size (default: {default[1]}; at most {IMG_SIZE_MAX})",
        ),
    )


def device_arg() -> Arg:
    return arg(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="the device to measure on (default: auto)"
    )


@dataclass(frozen=True)
class Measurement:
    """A ``clbench perf`` measurement: ``run(flags)`` measures and returns the JSON-able result (with a
    ``benchmark`` key naming what it is); ``args`` are its flags (``--out`` is added to every one)."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], dict[str, Any]]
    args: tuple[Arg, ...] = ()
    owner: str | None = None  # the strategy that contributes it, None for the generic ones

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for a in self.args:
            parser.add_argument(*a.flags, **a.options)
        parser.add_argument("--out", help="write the measurements to this JSON file")


MEASUREMENTS: Registry[Measurement] = Registry("measurement")


def measurement(
    name: str, help: str, args: tuple[Arg, ...] = ()
) -> Callable[[Callable[[argparse.Namespace], dict[str, Any]]], Callable[[argparse.Namespace], dict[str, Any]]]:
    """Decorator: register ``fn(flags) -> dict`` as the generic measurement ``name``."""

    def add(fn: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[[argparse.Namespace], dict[str, Any]]:
        MEASUREMENTS.register(name, Measurement(name, help, fn, tuple(args)))
        return fn

    return add


def from_strategy(strategy: str, name: str, item: Measurement | Callable[..., dict[str, Any]]) -> Measurement:
    """A strategy's contribution as a :class:`Measurement`: one already declared, or a bare ``fn(backbone=...,
    img_size=...)`` (the plug-in form), given ``--backbone`` and ``--img-size``."""
    if isinstance(item, Measurement):
        if item.name != name:
            raise ValueError(f"strategy {strategy}: perf benchmark {name!r} is declared as {item.name!r}")
        return Measurement(item.name, item.help, item.run, item.args, owner=strategy)

    def run(flags: argparse.Namespace) -> dict[str, Any]:
        return item(backbone=flags.backbone, img_size=flags.img_size)

    doc = (getattr(item, "__doc__", None) or "").strip().split("\n\n")[0]
    return Measurement(name, doc or f"{strategy}'s own measurement", run, backbone_args(), owner=strategy)


def load(registry: Registry[Measurement], modules: tuple[str, ...], cards: Iterable[MethodCard]) -> None:
    """Import the generic measurement ``modules`` (each registers its own into :data:`MEASUREMENTS`), then register
    each method's own (its card's ``perf_benchmarks``, imported now) into ``registry``; a name given twice raises."""
    for module in modules:
        importlib.import_module(module)
    for card in cards:
        for name, target in card.perf_benchmarks.items():
            if name in registry:
                raise ValueError(f"strategy {card.name}: perf benchmark {name!r} is named twice")
            registry.register(name, from_strategy(card.name, name, load_target(card.name, target)))


_loaded = False


def measurements() -> Registry[Measurement]:
    """Every measurement: the generic ones and the registered strategies' (imported on the first call)."""
    global _loaded
    if not _loaded:
        # deferred: the strategies are read on the first call, not when clbench.perf is imported
        from clbench.core.catalog import STRATEGIES, card

        load(MEASUREMENTS, MODULES, [card(name) for name in STRATEGIES.names()])
        _loaded = True
    return MEASUREMENTS


@contextlib.contextmanager
def stopped_cleanly() -> Iterator[None]:
    """While measuring, SIGTERM (a scheduler's stop, ``kill``) ends the process as Ctrl-C does: by an exception, so
    that every ``finally`` and ``with`` on the way out runs and the temporary folders a measurement made are removed
    (Python's default for SIGTERM ends the process at once, leaving them). Exit status 143, as for the signal."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_measurement(m: Measurement, flags: argparse.Namespace) -> dict[str, Any]:
    """``m.run(flags)``, its temporary files removed on SIGTERM as on success (:func:`stopped_cleanly`)."""
    with stopped_cleanly():
        return m.run(flags)


def listing() -> str:
    """``NAME: help`` of every measurement, for ``clbench perf --help``."""
    reg = measurements()
    return "; ".join(f"{name}: {reg.get(name).help.rstrip('.')}" for name in reg.names())


def write(result: dict[str, Any], out: str | None, partial: bool = False) -> None:
    """Stamp ``result`` with the code revision, library versions and command line, and write it to ``out`` (a
    ``partial`` one: a long measurement keeping what it has measured so far)."""

    if partial:
        if out:
            atomic_write_json(Path(out), {**result, "partial": True, "command": " ".join(sys.argv)})
        return
    result.update(git_revision=git_revision(), versions=library_versions(), command=" ".join(sys.argv))
    if out:
        atomic_write_json(Path(out), result)
        print(f"wrote {out}")
