"""``clbench sweep``'s own settings, each declared once, as :class:`clbench.core.config.RunConfig` declares a run's: its
default, its check, its flag and help, in one :func:`~clbench.core.config.run_field`. The flags are generated from the
fields (:func:`add_sweep_flags`, with :func:`clbench.core.config.add_run_flags`), so a new field is a new flag with no
other edit, and ``clbench sweep`` builds each declaration from its arguments by field name.

- :class:`SweepArgs`: what to run, where, and what to write; :meth:`SweepArgs.spec` parses its lists into the
  :class:`~clbench.sweep.plan.SweepSpec` (their checks, and messages, are :mod:`clbench.sweep.plan`'s).
- :class:`Resources`: what each run gets and how often it is started again; building it checks every field
  (``--jobs must be >= 1``), from the command line and from Python alike.

The settings every run of the sweep shares are RunConfig's (its flags that are not ``run_only``). ``--set`` is
declared by the command, as for ``clbench run``. Torch-free: ``clbench sweep --help`` imports this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clbench.core.catalog import DEFAULT_BENCH, EXAMPLE_STRATEGIES
from clbench.core.config import (
    Choice,
    Cli,
    Flag,
    Number,
    add_run_flags,
    check_settings,
    default_of,
    parse_list,
    run_field,
    settings_of,
)
from clbench.errors import ClbenchError, setting
from clbench.sweep.plan import VARY, SweepSpec, parse_data_roots, parse_scoped_override, parse_seeds

if TYPE_CHECKING:
    from clbench.sweep.plan import SweepSpec

BACKENDS = ("local", "ray")
WHAT, WHERE, OUTPUT = "what to run", "where to run", "output"  # the sections of `clbench sweep --help`
LEAVE_OUT = "leave {s} out for the default"


def _checked(obj: Any) -> None:  # Any: a declaration of this module, its values as given
    check_settings({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, settings_of(type(obj)))


@dataclass(frozen=True, kw_only=True)
class SweepArgs:
    """What a sweep runs, where, and what it writes: every flag of ``clbench sweep`` that is neither a run setting
    (RunConfig) nor a resource (:class:`Resources`). ``strategies`` and ``out`` have no default: the command line
    or a ``--config`` file gives them."""

    strategies: str = run_field(
        dataclasses.MISSING,
        None,  # parse_list checks it
        Cli(f"comma-separated strategies, e.g. {','.join(EXAMPLE_STRATEGIES)}", metavar="S1,S2", group=WHAT),
    )
    benches: str = run_field(
        DEFAULT_BENCH, None, Cli("comma-separated benchmarks (default: %(default)s)", metavar="B1,B2", group=WHAT)
    )
    seeds: str = run_field(  # one run per seed: by default the one run of `clbench run`
        str(default_of("seed")),
        None,  # parse_seeds checks it, with the run's seed check
        Cli(
            "seeds, comma-separated and/or ranges A..B (default: %(default)s); --vary says which seed they set",
            metavar="1993..1997",
            group=WHAT,
        ),
    )
    vary: str = run_field(
        VARY[0],
        Choice(VARY),
        Cli(
            "what --seeds varies: seed (initialisation; class order from --class-order-seed, the default), "
            "class-order (class-order seed; initialisation from --seed), or both (each run sets both to the value)",
            choices=VARY,
            group=WHAT,
        ),
    )
    seed: int = run_field(  # used only with --vary class-order: checked by RunConfig there, as a run's seed
        default_of("seed"),
        None,
        Cli("initialisation seed of every run with --vary class-order (default %(default)s)", group=WHAT),
    )
    out: str = run_field(
        dataclasses.MISSING,
        None,  # checked by run_sweep, as a folder clbench may write
        Cli(
            "sweep folder: runs/, sweep.json, summary.md|csv, report/. Re-running the same command skips complete "
            "runs and continues unfinished ones",
            metavar="DIR",
            group=WHAT,
        ),
    )
    data_root: tuple[str, ...] = run_field(
        (),
        None,  # parse_data_roots
        Cli("data folder for every benchmark, or BENCH=DIR for one (repeatable)", metavar="[BENCH=]DIR", group=WHAT),
    )
    backend: str = run_field(
        BACKENDS[0],
        Choice(BACKENDS, "backends"),
        Cli(
            "local: worker processes on this machine (default); ray: one Ray task per run",
            choices=BACKENDS,
            group=WHERE,
        ),
    )
    ray_address: str | None = run_field(
        None,
        None,  # checked when the Ray backend starts
        Cli("ray: an existing cluster (default: start a local Ray for the sweep)", metavar="HOST:PORT", group=WHERE),
    )
    cache: str | None = run_field(
        None,
        None,  # checked by run_sweep, as a folder clbench may write
        Cli(
            "clbench cache (weights, features) for every run; on shared storage for a cluster "
            "(default: $CLBENCH_CACHE or ~/.cache/clbench)",
            metavar="DIR",
            group=WHERE,
        ),
    )
    report: bool = run_field(
        True,
        Flag(),
        Cli("write DIR/report/ (clbench report of every complete run) at the end (default: on)", group=OUTPUT),
    )
    tsne: bool = run_field(
        True,
        Flag(),
        Cli("t-SNE figures in the report (default: on; about 10 s per configuration on a CPU)", group=OUTPUT),
    )
    dry_run: bool = run_field(False, Flag(), Cli("print the plan (and what is done already) and stop", group=OUTPUT))

    def __post_init__(self) -> None:
        for name in ("strategies", "out"):
            if getattr(self, name) is None:
                raise ClbenchError(
                    f"clbench sweep needs {setting(name)}", "give it on the command line or in a --config file"
                )
        object.__setattr__(self, "data_root", tuple(self.data_root))  # the parser gives a list
        _checked(self)

    def spec(self, run: dict[str, Any], overrides: Sequence[tuple[str, str]] = ()) -> SweepSpec:
        """The sweep's plan request: the lists parsed and checked; ``run``: the RunConfig settings every run shares
        (its ``profile`` applies to the strategies that define it); ``overrides``: ``--set [STRATEGY.]KEY=VALUE``.
        (Any: RunConfig field name -> a value of that field's type, as given.)"""
        from pathlib import Path

        benches = parse_list(self.benches, "benches")
        return SweepSpec(
            strategies=parse_list(self.strategies, "strategies"),
            benches=benches,
            seeds=parse_seeds(self.seeds),
            out=Path(self.out),
            settings={k: v for k, v in run.items() if k != "profile"},  # profile: per strategy
            data_roots=parse_data_roots(self.data_root, benches),
            profile=run.get("profile"),
            overrides=tuple(parse_scoped_override(k, v) for k, v in overrides),
            vary=self.vary,
            seed=self.seed,
        )


@dataclass(frozen=True)
class Resources:
    """What each run of a sweep gets and how often a crashed one is started again (the resource flags of ``clbench
    sweep``). None: the backend's default, which depends on the machine or the cluster."""

    jobs: int | None = run_field(  # local: pool size; ray: cap on the CPUs of the local Ray started for the sweep
        None,
        Number(int, 1, 4096, optional=True, meaning="runs at once", default_hint=LEAVE_OUT),
        Cli(
            "runs at once (local: worker processes, default 1; ray: CPUs of the local Ray started for the sweep, "
            "in runs; default: all)",
            group=WHERE,
        ),
    )
    cpus_per_run: int | None = run_field(
        None,
        Number(int, 1, 4096, optional=True, meaning="CPUs per run", default_hint=LEAVE_OUT),
        Cli("CPUs (torch threads) per run (default: local, cores / jobs; ray, 1)", group=WHERE),
    )
    gpus_per_run: float | None = run_field(  # None: 1 where the cluster has GPUs, else 0
        None,
        Number(float, 0, 64, optional=True, meaning="GPUs per run"),
        Cli("ray: GPUs per run (default: 1 if the cluster has GPUs, else 0)", group=WHERE),
    )
    memory_per_run_gb: float | None = run_field(
        None,
        Number(
            float,
            0,
            1 << 20,
            optional=True,
            low_open=True,
            meaning="the memory reserved per run, in GB",
            flag="--memory-per-run",
            default_hint="leave {s} out to reserve none",
        ),
        Cli("ray: memory to reserve per run (default: none)", metavar="GB", group=WHERE),
    )
    retries: int = run_field(
        2,
        Number(int, 0, 100, meaning="the times a crashed run is started again"),
        Cli(
            "times a crashed or pre-empted run is started again from its checkpoint (default: %(default)s)",
            group=WHERE,
        ),
    )
    ray_timeout: float = run_field(  # --ray-address: a cluster that does not answer is one line, not a hang
        30.0,
        Number(float, 0, 3600, low_open=True, meaning="the seconds to wait for a Ray cluster"),
        Cli(
            "ray: seconds to wait for the cluster at --ray-address to answer before giving up (default: %(default)g)",
            metavar="SECONDS",
            group=WHERE,
        ),
    )

    def __post_init__(self) -> None:
        _checked(self)


def add_sweep_flags(parser: Any) -> None:  # Any: an argparse parser
    """The flags of :class:`SweepArgs` and :class:`Resources` (their sections: what to run, where, output)."""
    add_run_flags(parser, "sweep", SweepArgs)
    add_run_flags(parser, "sweep", Resources)
