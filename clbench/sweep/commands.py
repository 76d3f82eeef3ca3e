"""The body of ``clbench sweep``, from the flags :mod:`clbench.cli` parsed: the sweep's settings and resources, every
run checked from the catalog and the cards before torch is imported, then the sweep run (or its plan printed) and its
summary written.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from clbench.core.config import flag_fields
from clbench.errors import ClbenchError
from clbench.records.command import command_line
from clbench.run.commands import log_spec


def _fields(args: argparse.Namespace, command: str, cls: type | None = None) -> dict[str, Any]:
    """The parsed flags of ``clbench COMMAND`` that are fields of the declaration ``cls`` (default: RunConfig)."""
    return {name: getattr(args, name) for name in flag_fields(command, cls)}


def sweep_command(args: argparse.Namespace) -> int:
    """``clbench sweep``: every run of the parsed sweep checked, run (or planned), then its summary; 0 when complete."""
    # deferred: loads numpy, which importing this module does not
    from clbench.sweep.settings import Resources, SweepArgs

    sweep = SweepArgs(**_fields(args, "sweep", SweepArgs))  # first: a sweep without --strategies or --out
    log = log_spec(args, group=Path(sweep.out).resolve().name, out=sweep.out)
    res = Resources(**_fields(args, "sweep", Resources))
    spec = sweep.spec(_fields(args, "sweep"), args.overrides)
    check_sweep(spec)
    # deferred: loads rich, torch (the sweep's worker runs the harness), which importing this module does not: a
    # mistyped sweep is refused above before either is imported
    from clbench.sweep import run_sweep, write_summary
    from clbench.ui import RichSweepView, print_plan, print_sweep_end

    if sweep.dry_run:
        print_plan(run_sweep(spec, sweep.backend, res, sweep.ray_address, dry_run=True))
        return 0

    command = command_line()
    with RichSweepView() as view:
        manifest = run_sweep(
            spec,
            sweep.backend,
            res,
            sweep.ray_address,
            view=view,
            cache=sweep.cache,
            command=command,
            log=dataclasses.asdict(log) if log else None,
        )
    written = write_summary(spec.out, manifest, sweep.report, sweep.tsne, command)
    print_sweep_end(manifest, spec.out, written)
    return 0 if manifest.complete else 1


def check_sweep(spec: Any) -> None:
    """Every run of the sweep ``spec`` checked from the catalog and the cards (:func:`clbench.run.precheck.check_run`)
    before torch is imported: a misspelt name, profile or ``--set`` key is refused at once."""
    # deferred: loads numpy, which importing this module does not
    from clbench.run.precheck import check_run
    from clbench.sweep.plan import make_plan

    checked = set()
    for planned in make_plan(spec, check=False):
        c = planned.cfg
        key = (c.strategy, c.bench, c.backbone, c.scenario, c.profile, c.overrides)  # what check_run reads
        if key in checked:  # the same checks again for another seed
            continue
        checked.add(key)
        try:
            check_run(c)
        except ClbenchError as e:
            if any(scope is None for scope, _, _ in spec.overrides) and "has no setting" in str(e):
                hint = "scope a setting to one strategy with --set STRATEGY.KEY=VALUE, e.g. --set tosca.epochs=5"
                raise ClbenchError(e.args[0], e.hint or hint, e.flags) from None
            raise
