"""One tuning study: Optuna's TPE sampler draws a method's settings from its search space, each trial is a normal
``clbench run`` on the validation split of the tuning benchmark (a record under ``OUT/trials/``), and the best
trial's settings become ``OUT/chosen.yaml``, which ``clbench run --config OUT/chosen.yaml`` runs on the test split.

Why Optuna: its TPE sampler is the standard model-based search for a few dozen trials of mixed integer, float and
categorical settings; its median pruner stops a trial whose validation accuracy after a task falls below the median
of earlier trials at that task (each task is one report); and its journal storage is one append-only file that a
crashed study continues from. Ray Tune adds a cluster scheduler this study does not need.

By default the trials run one after another, in this process: a closed-form head on cached features is seconds per
trial, and the frozen features are computed once for the whole study (the feature cache). Trials run through
:func:`clbench.run.harness.run`, as ``clbench run`` does. With ``--jobs N`` or ``--backend ray`` they run at once
through the sweep's backends (:mod:`clbench.tune.parallel`, which says what stays deterministic then).

Resuming: the study lives in ``OUT/study.journal``. Running the same command again continues it up to ``--trials``
finished trials; a trial the crash cut off is marked failed and its settings are tried again first. The request
(strategy, benchmark, split, space, run shape) is kept in ``OUT/study.json`` and a rerun with another one is refused.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.core.config import RunConfig
from clbench.errors import ClbenchError, setting
from clbench.files.atomic import atomic_write_json
from clbench.records.tuning import SUMMARY_FILE, write_summary
from clbench.run.checkpoint import CHECKPOINT_FILE
from clbench.run.harness import Reporter
from clbench.run.validation import SPLIT_SEED
from clbench.tune.parallel import StudyHooks, Where, run_trials
from clbench.tune.space import Dimension, as_setting, defaults_in

STUDY_FILE = "study.json"
JOURNAL_FILE = "study.journal"
CHOSEN_FILE = "chosen.yaml"
OBJECTIVE = "last_acc"  # the trial's value: accuracy on the validation images of every class after the last task
SAMPLER_SEED = 1993  # TPE's own draws; fixed so that a study is repeatable
# The run settings a study passes to every trial and writes into chosen.yaml (the run's shape, not its split)
SHAPE_FIELDS = (
    "backbone",
    "weights",
    "init_cls",
    "increment",
    "train_per_class",
    "class_order_seed",
    "precision",
    "scenario",
    "protocol",
    "profile",
    "img_size",
    "normalize",
    "data_root",
)


@dataclass(frozen=True)
class TuneRequest:
    """What a study searches: the method, its space, the trials, and the run every trial makes (``base``: its
    benchmark, validation fraction and shape; ``overrides`` fixed for every trial)."""

    strategy: str
    space: dict[str, Dimension]
    trials: int
    base: RunConfig  # validation set; strategy settings of the space left to the trials
    out: Path
    pruner: bool = True
    fixed: tuple[tuple[str, str], ...] = ()  # --set pairs every trial takes (e.g. a short epoch budget)
    where: Where = Where()  # where the trials run (not part of the study's identity: a rerun may run them elsewhere)

    def identity(self) -> dict[str, Any]:
        """What must match for a rerun to continue the study in ``out``."""
        shape = {k: getattr(self.base, k) for k in ("bench", "classes", "seed", "validation", *SHAPE_FIELDS)}
        return {
            "strategy": self.strategy,
            "space": {k: d.to_json() for k, d in self.space.items()},
            "fixed": dict(self.fixed),
            "run": shape,
            "objective": f"validation {OBJECTIVE}",
            "pruner": self.pruner,
        }


class _TrialReporter(Reporter):
    """Reports each task's validation accuracy to the trial; the pruner may stop it there."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial

    def task_done(self, t: int, summary: Any, entry: Any, peak_rss_mb: float) -> None:
        import optuna

        self.trial.report(summary.acc_curve[-1], t)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"validation accuracy {summary.acc_curve[-1]:.2f} after task {t + 1}")


@dataclass
class StudyOutcome:
    summary: dict[str, Any]
    chosen: Path
    trial_seconds: list[float] = field(default_factory=list)


def _storage(out: Path) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(out / JOURNAL_FILE)))


def _check_identity(req: TuneRequest) -> None:
    path = req.out / STUDY_FILE
    ident = json.loads(json.dumps(req.identity()))
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != ident:
            flat = {**{k: v for k, v in ident.items() if k != "run"}, **ident["run"]}
            was = {**{k: v for k, v in saved.items() if k != "run"}, **saved.get("run", {})}
            diff = [f"{k}: {was.get(k)} there, {flat.get(k)} here" for k in flat if was.get(k) != flat.get(k)]
            raise ClbenchError(
                f"--out {req.out} holds a study of other settings ({'; '.join(diff)})",
                "give the study's own settings to continue it, or another --out for a new study",
            )
    else:
        req.out.mkdir(parents=True, exist_ok=True)

        atomic_write_json(path, ident)


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"))
        for t in study.get_trials(deepcopy=False)
    )


def _retry_interrupted(study: Any, log: Callable[[str], None]) -> None:
    """Trials an interruption cut off run again first: one a Ctrl-C stopped (failed, marked ``interrupted``) or one
    a killed process left running (marked so here). Each is queued once: not where a later trial has its settings."""
    from optuna.trial import TrialState

    storage = study._storage  # Optuna's public API has no call to fail a stale trial of a journal study
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.state == TrialState.RUNNING:
            storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        elif not (t.state == TrialState.FAIL and t.user_attrs.get("interrupted")):
            continue
        if t.params and not any(later.params == t.params for later in trials if later.number > t.number):
            study.enqueue_trial(t.params, skip_if_exists=False)
            log(f"trial {t.number} was cut off by an interruption: its settings run again")


def trial_config(req: TuneRequest, number: int, params: dict[str, Any]) -> RunConfig:
    """The RunConfig of trial ``number`` with the drawn ``params``: the study's run on the validation split."""
    pairs = (*req.fixed, *((k, as_setting(v)) for k, v in params.items()))
    out = req.out / "trials" / f"trial-{number:04d}"
    return dataclasses.replace(req.base, overrides=tuple(pairs), out=str(out), overwrite=True)


def run_study(
    req: TuneRequest,
    log: Callable[[str], None] = print,
    advance: Callable[[int, float | None], None] | None = None,
) -> StudyOutcome:
    """Run (or continue) the study until ``req.trials`` trials have finished; write ``tuning.json`` and
    ``chosen.yaml``. ``advance(finished, best)`` is called after each trial (the progress bar)."""
    import optuna

    # looked up at call time: tests replace it on its module
    from clbench.run.harness import run

    if req.base.validation is None:
        raise ClbenchError(
            f"clbench tune evaluates on a validation split: give {setting('validation')} FRACTION",
            f"e.g. {setting('validation')} 0.2",
        )
    _check_identity(req)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0) if req.pruner else None
    study = optuna.create_study(
        study_name=f"{req.strategy}-{req.base.bench}",
        storage=_storage(req.out),
        sampler=optuna.samplers.TPESampler(seed=SAMPLER_SEED),
        pruner=pruner or optuna.pruners.NopPruner(),
        direction="maximize",
        load_if_exists=True,
    )
    _retry_interrupted(study, log)
    if not study.get_trials(deepcopy=False) and (first := defaults_in(req.strategy, req.space)) is not None:
        study.enqueue_trial(first)  # trial 0: the method's defaults, so that a study never ends below them
    seconds: list[float] = []

    def objective(trial: Any) -> float:
        params = {k: d.suggest(trial) for k, d in req.space.items()}
        t0 = time.perf_counter()
        try:
            cfg = trial_config(req, trial.number, params)
            record = run(cfg, _TrialReporter(trial))
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)  # a rerun tries these settings again (_retry_interrupted)
            raise
        except optuna.TrialPruned:
            _drop_checkpoint(Path(cfg.out or ""))  # a pruned trial is never continued: its record is what stays
            raise
        finally:
            seconds.append(time.perf_counter() - t0)
        value = record.summary(record.protocol).last_acc
        trial.set_user_attr("run", record.run_id)
        if value is None:
            raise ClbenchError(f"trial {trial.number} finished without a validation accuracy")
        return float(value)

    done = _finished(study)
    if done:
        log(f"continuing the study in {req.out}: {done} of {req.trials} trials finished")
    if not req.where.in_process:
        run_trials(study, req, StudyHooks(trial_config, OBJECTIVE, _finished, _best_value), log, advance, seconds)
        return _write_outcome(study, req, seconds)
    while (done := _finished(study)) < req.trials:
        study.optimize(objective, n_trials=1, catch=(ClbenchError,))
        best = _best_value(study)
        if advance is not None:
            advance(_finished(study), best)
        if len(seconds) == 1 and _finished(study) < req.trials:
            left = req.trials - _finished(study)
            minutes = left * seconds[0] / 60
            log(f"measured: {seconds[0]:.1f} s for the first trial; about {minutes:.1f} min for the {left} left")
    return _write_outcome(study, req, seconds)


def _drop_checkpoint(run_dir: Path) -> None:
    (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)


def _best_value(study: Any) -> float | None:
    from optuna.trial import TrialState

    return study.best_value if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) else None


def _write_outcome(study: Any, req: TuneRequest, seconds: list[float]) -> StudyOutcome:
    import optuna
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        raise ClbenchError(
            f"no trial of the study in {req.out} finished (see the trials' messages above)",
            "widen or fix the search space, or check that one `clbench run` of these settings works",
        )
    best = study.best_trial
    default_trial = next(
        (t for t in complete if t.number == 0 and t.system_attrs.get("fixed_params") is not None), None
    )
    summary = {
        "strategy": req.strategy,
        "search_space": {k: d.to_json() for k, d in req.space.items()},
        "fixed_settings": dict(req.fixed),
        "tuning_bench": req.base.bench,
        "tuning_classes": req.base.classes,  # the first K classes of the class order only; None: every class
        "class_order_seed": req.base.class_order_seed,
        "scenario": req.base.scenario,
        "split": {"name": "validation", "fraction": req.base.validation, **_split_seed()},
        "seed": req.base.seed,
        "objective": f"validation {OBJECTIVE} (accuracy after the last task, %)",
        "trials": {
            "asked": req.trials,
            "complete": len(complete),
            "pruned": sum(t.state == TrialState.PRUNED for t in trials),
            "failed": sum(t.state == TrialState.FAIL and not t.user_attrs.get("interrupted") for t in trials),
        },
        "best_trial": best.number,
        "best_run": best.user_attrs.get("run"),
        "best_validation_acc": best.value,
        "best_settings": dict(best.params),
        "defaults_validation_acc": None if default_trial is None else default_trial.value,
        "search": {
            "library": f"optuna {optuna.__version__}",
            "sampler": f"TPESampler(seed={SAMPLER_SEED})",
            "pruner": _pruner_text(req),
            "trials_at_once_this_session": req.where.describe(),
        },
        "trial_seconds_this_session": round(sum(seconds), 1),
    }
    write_summary(req.out / SUMMARY_FILE, summary)
    chosen = req.out / CHOSEN_FILE
    chosen.write_text(chosen_yaml(req, summary))
    return StudyOutcome(summary, chosen, seconds)


def _pruner_text(req: TuneRequest) -> str | None:
    if not req.pruner:
        return None
    pruner = "MedianPruner(n_startup_trials=5) on each task's validation accuracy"
    return pruner if req.where.in_process else f"{pruner}; not applied to trials run at once"


def _split_seed() -> dict[str, int]:
    return {"split_seed": SPLIT_SEED}


def chosen_yaml(req: TuneRequest, summary: dict[str, Any]) -> str:
    """The config file of the chosen settings: the study's run shape, on the test split (no validation), the best
    trial's settings under the strategy's name, and ``tuning:`` naming the summary the record will carry."""
    base = req.base
    where = f"{base.bench}'s first {base.classes} classes" if base.classes else base.bench
    lines = [
        f"# chosen by clbench tune: {summary['trials']['complete']} trials of {req.strategy} on the validation split "
        f"({base.validation:g}) of {where}; best validation accuracy {summary['best_validation_acc']:.2f}",
        "# run it as is on the test split: clbench run --config THIS_FILE (add --bench NAME to evaluate elsewhere)",
        f"strategy: {req.strategy}",
        f"bench: {base.bench}",
    ]
    for name in SHAPE_FIELDS:
        value = getattr(base, name)
        if value is not None and value != RunConfig.__dataclass_fields__[name].default:
            lines.append(f"{name.replace('_', '-')}: {json.dumps(value)}")
    lines.append(f"seed: {base.seed}")
    lines.append(f"tuning: {json.dumps(str(req.out / SUMMARY_FILE))}")  # as --out was given: relative or not
    settings = {**dict(req.fixed), **{k: as_setting(v) for k, v in summary["best_settings"].items()}}
    lines.append(f"{req.strategy}:")
    lines += [f"  {k}: {json.dumps(v) if not _plain_number(v) else v}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def _plain_number(text: str) -> bool:
    """A value YAML 1.2 reads back as the same number (clbench's config reader refuses ambiguous forms)."""
    import re

    return bool(re.fullmatch(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?", text)) and "e" not in text
