"""The sweep's plan: every (strategy, benchmark, seed) as a checked :class:`~clbench.run.harness.RunConfig`, and what
each run folder under ``DIR/runs/`` already holds (nothing, a run to continue, a complete run to skip, or a run with
other settings, which is refused)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.benchmarks import BENCHMARKS
from clbench.core.catalog import BACKBONES, card
from clbench.core.config import RUN_SETTINGS, Fingerprint, RunConfig, parse_list
from clbench.errors import ClbenchError
from clbench.files.safety import is_empty_folder, load_json
from clbench.records.results import read_record
from clbench.records.schema import RESULT_FILE, RunRecord
from clbench.run.rundir import is_run_folder

SWEEP_FILE = "sweep.json"
ATTEMPT_FILE = "attempt.json"
LOG_FILE = "run.log"


@dataclass(frozen=True)
class SweepSpec:
    strategies: tuple[str, ...]
    benches: tuple[str, ...]
    seeds: tuple[int, ...]
    out: Path
    settings: dict[str, Any] = field(default_factory=dict)  # RunConfig fields shared by every run
    data_roots: dict[str | None, str] = field(default_factory=dict)  # bench (None: every bench) -> folder
    profile: str | None = None  # applied to the strategies that define it
    overrides: tuple[tuple[str | None, str, str], ...] = ()  # (strategy or None for all, key, value)
    vary: str = "seed"  # which seed --seeds sets: "seed" (init), "class-order", or "both" (the same value)
    seed: int = 1993  # the initialisation seed of every run when only the class order varies


@dataclass
class PlannedRun:
    run_id: str
    cfg: RunConfig
    fingerprint: Fingerprint
    state: str = "new"  # new | partial (continues from its checkpoint) | complete (skipped)
    tasks_done: int = 0

    @property
    def path(self) -> Path:
        return Path(self.cfg.out)


VARY = ("seed", "class-order", "both")  # SweepSpec.vary: what each value of --seeds is the seed of
MAX_SEEDS = 1000
SEEDS_EXAMPLE = "e.g. --seeds 1993,1994,1995 or --seeds 1993..1997"


def parse_seeds(text: str) -> tuple[int, ...]:
    """``1993,1994`` and ranges ``1993..1997`` (both ends included), mixed freely; order kept, repeats dropped."""
    check = dataclasses.replace(RUN_SETTINGS["seed"], flag="--seeds").check
    seeds: list[int] = []
    for item in parse_list(text, "seeds"):
        lo_text, dots, hi_text = item.partition("..")
        try:
            lo, hi = int(lo_text), int(hi_text) if dots else int(lo_text)
        except ValueError:
            raise ClbenchError(f"--seeds: {item!r} is not an integer or a range A..B", SEEDS_EXAMPLE) from None
        if hi < lo:
            raise ClbenchError(f"--seeds: the range {item!r} runs backwards", f"write {hi}..{lo}")
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:
            raise ClbenchError(f"--seeds: {item!r} asks for more than {MAX_SEEDS} seeds", SEEDS_EXAMPLE)
        for seed in (lo, hi):
            check(seed)
        seeds.extend(range(lo, hi + 1))
    return tuple(dict.fromkeys(seeds))


def seeds_of(spec: SweepSpec, value: int) -> tuple[int, int, str]:
    """(init seed, class-order seed, run-id suffix) of the sweep's seed ``value`` under ``spec.vary``."""
    if spec.vary == "seed":
        return value, int(spec.settings.get("class_order_seed", 1993)), f"s{value}"
    if spec.vary == "class-order":
        return spec.seed, value, f"s{spec.seed}-o{value}"
    if spec.vary == "both":
        return value, value, f"s{value}-o{value}"
    raise ClbenchError(f"--vary {spec.vary!r} is unknown", f"choose one of: {', '.join(VARY)}")


def parse_scoped_override(key: str, value: str) -> tuple[str | None, str, str]:
    """``tosca.epochs=5`` -> ("tosca", "epochs", "5"); ``epochs=5`` -> (None, "epochs", "5")."""
    scope, dot, name = key.partition(".")
    return (scope, name, value) if dot else (None, key, value)


def parse_data_roots(values: Sequence[str], benches: Sequence[str]) -> dict[str | None, str]:
    """``--data-root DIR`` (every benchmark) or ``--data-root BENCH=DIR`` (one), repeatable."""
    roots: dict[str | None, str] = {}
    for v in values:  # absolute: a run may execute in another working directory (a Ray worker, another node)
        name, eq, path = v.partition("=")
        if eq and name in benches:
            roots[name] = str(Path(path).expanduser().resolve())
        else:
            roots[None] = str(Path(v).expanduser().resolve())
    return roots


def make_plan(spec: SweepSpec, check: bool = True) -> list[PlannedRun]:
    """Every run of the sweep, each checked (names, settings) before anything is loaded. ``check=False``: the runs
    and their fingerprints only, from the methods' cards (what a report reads of a study file: no method, no torch)."""
    for scope, key, _ in spec.overrides:
        if scope is not None and scope not in spec.strategies:
            raise ClbenchError(
                f"--set {scope}.{key}: {scope!r} is not one of the sweep's strategies ({', '.join(spec.strategies)})"
            )
    if spec.profile is not None and not any(spec.profile in card(s).profiles for s in spec.strategies):
        raise ClbenchError(f"--profile {spec.profile}: none of {', '.join(spec.strategies)} has that profile")
    plan = []
    for bench in spec.benches:
        for strategy in spec.strategies:
            cls = card(strategy)
            overrides = tuple((k, v) for scope, k, v in spec.overrides if scope in (None, strategy))
            profile = spec.profile if spec.profile in cls.profiles else None
            for value in spec.seeds:
                seed, order_seed, suffix = seeds_of(spec, value)
                run_id = f"{strategy}-{bench}-{suffix}"
                settings = {**spec.settings, "class_order_seed": order_seed}
                cfg = RunConfig(
                    strategy=strategy,
                    bench=bench,
                    seed=seed,
                    profile=profile,
                    overrides=overrides,
                    data_root=spec.data_roots.get(bench, spec.data_roots.get(None)),
                    out=str(spec.out / "runs" / run_id),
                    **settings,
                )
                if not check:
                    spec_bench = BENCHMARKS.get(bench)
                    backbone = BACKBONES.check(spec_bench.backbone if cfg.backbone is None else cfg.backbone)
                    plan.append(PlannedRun(run_id, cfg, Fingerprint.from_config(cfg, backbone)))
                    continue
                # deferred: loads torch, which importing this module does not
                from clbench.run.harness import resolve

                try:
                    resolved = resolve(cfg)
                except ClbenchError as e:
                    if any(s is None for s, _, _ in spec.overrides) and "has no setting" in str(e):
                        raise ClbenchError(
                            e.args[0],
                            "scope a setting to one strategy with --set STRATEGY.KEY=VALUE, e.g. --set tosca.epochs=5",
                            e.flags,
                        ) from None
                    raise
                plan.append(PlannedRun(run_id, cfg, resolved.fingerprint))
    return plan


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object clbench wrote in a sweep folder (``sweep.json``, a run's record or attempt file), read with the
    bounded loader; None for a missing, torn, oversized, too deeply nested or special file, or one that
    is not an object."""
    if not path.exists():
        return None
    try:
        data = load_json(path, "sweep file")
    except ClbenchError:
        return None
    return data if isinstance(data, dict) else None


def read_run_record(run_dir: Path) -> RunRecord | None:
    """The run's record, finished or not; None where it has none yet, or a torn one (a write killed midway leaves
    the run to its checkpoint). Raises ClbenchError for a record this clbench refuses (another schema version, a
    mistyped field)."""

    if read_json(run_dir / RESULT_FILE) is None:
        return None
    return read_record(run_dir)


def inspect(run: PlannedRun) -> str | None:
    """Set ``run.state`` from its folder; return why the folder cannot be used (other settings), or None."""
    # deferred: loads torch, which importing this module does not
    from clbench.run.checkpoint import CHECKPOINT_FILE, LEGACY_FILE

    if run.path.is_symlink():
        return "it is a symbolic link; a sweep writes only into run folders inside its own folder"
    if run.path.exists() and not run.path.is_dir():
        return "it is a file, not a run folder"
    if not is_empty_folder(run.path) and not is_run_folder(run.path):
        return "it is a folder of other files, not a clbench run folder"
    if (run.path / LEGACY_FILE).exists():
        return (
            f"it holds {LEGACY_FILE}, a checkpoint in the old pickle format, which clbench no longer reads "
            "(unpickling runs any code the file holds)"
        )
    try:
        record = read_run_record(run.path)
    except ClbenchError as e:
        return f"its record cannot be used ({str(e.args[0]).split(': ', 1)[-1]})"
    if record is None:
        run.state = "partial" if (run.path / CHECKPOINT_FILE).exists() else "new"
        return None
    saved = record.fingerprint
    if saved is None:
        return "its record has no settings fingerprint (written by an older clbench)"
    if saved != run.fingerprint:
        newer = f"settings this clbench does not know ({', '.join(saved.unknown)}): written by a newer clbench"
        return "; ".join(saved.differences(run.fingerprint, there="there") or [newer if saved.unknown else "other"])
    run.tasks_done = record.tasks_done
    if record.complete:
        run.state = "complete"
    elif (run.path / CHECKPOINT_FILE).exists():
        run.state = "partial"
    else:
        return "it holds an unfinished record without a checkpoint to continue from"
    return None


def check_folders(plan: list[PlannedRun]) -> None:
    conflicts = [f"{r.path}: {why}" for r in plan if (why := inspect(r)) is not None]
    if len(conflicts) == 1:  # one line
        raise ClbenchError(
            f"a run folder of this sweep cannot be skipped or continued: {conflicts[0]}",
            "choose another --out, or delete that run folder to run it again",
        )
    if conflicts:
        # one line (the terminal shows a newline from a message as \x0a): the first ten, then the count
        shown = "; ".join(conflicts[:10]) + (f"; ... and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise ClbenchError(
            f"{len(conflicts)} run folder(s) of this sweep hold runs it cannot skip or continue "
            f"(other settings, or nothing to continue from): {shown}",
            "choose another --out, or delete those run folders to run them again",
        )
