"""The comparison a report presents: which records form its main table, which strategy is the baseline, which
records form secondary sections, and the leaderboard that opens the report.

A results folder holds many more records than the comparison it supports (budget points, profiles, ``--set``
ablations, repeats at another precision), so a report that tabulates every record against every other is a data
dump. :class:`Study` says what is compared:

- From a study file (``--study FILE``: the YAML that ``clbench sweep --config FILE`` runs): each group's runs are
  planned as the sweep plans them and matched to the records by their settings fingerprint. Groups that run
  strategies at their default configuration or their reference budget (no profile or the ``reference`` profile, no
  strategy setting) form the main table; every other group is a section of its own, named after the group. The
  baseline is ``--baseline`` or the first strategy of the first main group.
- Without one: one main row per (benchmark, strategy, protocol) at the strategy's default configuration, the
  records with the most seeds (then the most recent revision's order); budget variants, profiles and ``--set``
  ablations go to their own sections.

A record that belongs to no section is listed under "Not in the comparison", never silently dropped. A record joins
a study file's group only when its data digests agree with the group's (a group of two data sets is refused), and a
study file is capped (:data:`MAX_STUDY_GROUPS`, :data:`MAX_STUDY_BYTES`). The leaderboard reads its paired tests
(against the best row and against the baseline) from the study (:mod:`clbench.report.study`), whose family covers
the main rows only, so the correction for a budget sweep's pairs does not take the power out of the comparison that
matters, and the paired table, ``compare`` and the README print the same p for the same pair.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clbench.core.catalog import DEFAULT_STRATEGY
from clbench.core.config import flag_fields
from clbench.errors import ClbenchError
from clbench.evaluation.stats import Interval, fmt_p
from clbench.report.collect import AccKey, Collection, Run, data_identity
from clbench.report.labels import display_name, short_label
from clbench.report.study import _seeds_text, build_study
from clbench.report.tables import (
    INTERVAL_NOTE,
    PAIRED_NOTE,
    Section,
    fmt_float,
    fmt_int_range,
    mean_std,
    protocol_routing_warning,
    training_warning,
)
from clbench.report.uncertainty import fmt_interval, fmt_range
from clbench.run.configfile import apply, load
from clbench.sweep.plan import make_plan
from clbench.sweep.settings import SweepArgs

if TYPE_CHECKING:
    import pandas as pd

    from clbench.report.study import PairTest
    from clbench.report.study import Study as StudyModel
    from clbench.report.tables import Section
    from clbench.report.uncertainty import Predicted

# A method's card names its reference budget ``reference`` where its defaults are not that budget, or to state it
# (InfLoRA, SLCA, HiDe-Prompt), and ``reference-WHAT`` for the reference's budget of another data set or split
# (InfLoRA's ``reference-imr``, CODA-Prompt's ``reference-6tasks``): a study group run at one is a main row, like one
# at the defaults.
REFERENCE_PROFILE = "reference"


def is_reference_profile(profile: str | None) -> bool:
    """Whether a group at ``profile`` runs a reference budget (None: the defaults, which are one)."""
    return profile is None or profile == REFERENCE_PROFILE or profile.startswith(REFERENCE_PROFILE + "-")


SECTION_KINDS = ("budget", "profile", "ablation", "other", "group", "unassigned")


@dataclass
class StudySection:
    """Records outside the main table that belong together (a study group, or a kind: budget, profile, ...)."""

    title: str
    anchor: str
    kind: str
    runs: list[Run]
    why: str = ""


@dataclass
class Study:
    """The main rows (their runs), the baseline strategy, the secondary sections and where the choice came from."""

    main: dict[AccKey, list[Run]]
    baseline: str | None
    sections: list[StudySection] = field(default_factory=list)
    source: str = "chosen automatically"
    notes: list[str] = field(default_factory=list)

    def collection(self, coll: Collection) -> Collection:
        """The main rows as a collection whose rows are exactly :attr:`main` (tests and figures of the main rows)."""
        runs = list({r.run_id: r for rs in self.main.values() for r in rs}.values())
        return MainRows(runs, list(coll.skipped), list(coll.notes), rows=dict(self.main))


@dataclass
class MainRows(Collection):
    """A :class:`Collection` restricted to given rows: :meth:`acc_groups` returns those rows only (a run of a main
    row with a second protocol that is not a main row adds no row, and no pair to the Holm correction)."""

    rows: dict[AccKey, list[Run]] = field(default_factory=dict)

    def acc_groups(self) -> dict[AccKey, list[Run]]:
        return dict(self.rows)


# ------------------------------------------------------------------------------------------- choosing
def _kind(run: Run) -> str:
    """Why a run is not at its strategy's default configuration: budget, profile, ablation (or "" when it is)."""
    if ":" in run.variant.split(" ")[0] or run.record.profile:
        return "profile"
    changed = run.variant.split(" ")[1:]
    if not changed and "[" not in run.variant:
        return ""
    keys = {c.partition("=")[0] for c in changed}
    return "budget" if keys and keys <= {"epochs", "train_per_class", "steps"} else "ablation"


KIND_TITLES = {
    "budget": ("Budget variants", "records of a strategy at another training budget (epochs, images per class)"),
    "profile": ("Profiles", "records made with a strategy's named profile (e.g. quick)"),
    "ablation": ("Ablations", "records with strategy settings changed by --set"),
    "other": (
        "Other configurations",
        "default-configuration records not chosen for the main table (fewer seeds, another backbone or precision)",
    ),
}


def _pooled(coll: Collection) -> Collection:
    """The collection with class orders pooled (the study's seeds also set the class order)."""
    runs = [replace(r, pool_class_orders=True) for r in coll.runs]
    return Collection(runs, list(coll.skipped), list(coll.notes))


def automatic(coll: Collection, baseline: str | None = None) -> tuple[Collection, Study]:
    """One main row per (benchmark, strategy, protocol) at the default configuration, the one with the most seeds;
    the other records in sections by kind."""
    notes: list[str] = []
    if len({r.record.class_order_seed for r in coll.runs}) > 1 and not any(r.pool_class_orders for r in coll.runs):
        coll = _pooled(coll)
        notes.append(
            "class orders pooled: the records were made at several class orders (seeds that also set the class "
            "order); give --study FILE to choose otherwise"
        )
    groups = coll.acc_groups()
    best: dict[tuple[str, str, str], AccKey] = {}
    for key, runs in groups.items():
        if _kind(runs[0]):
            continue
        slot = (key.bench, key.strategy, key.protocol)
        if slot not in best or len(runs) > len(groups[best[slot]]):
            best[slot] = key
    main = {k: groups[k] for k in groups if k in set(best.values())}
    used = {r.run_id for rs in main.values() for r in rs}
    by_kind: dict[str, list[Run]] = defaultdict(list)
    for r in coll.runs:
        if r.run_id not in used:
            by_kind[_kind(r) or "other"].append(r)
    sections = [
        StudySection(KIND_TITLES[k][0], f"section-{k}", k, by_kind[k], KIND_TITLES[k][1])
        for k in ("budget", "profile", "ablation", "other")
        if by_kind.get(k)
    ]
    strategies = [k.strategy for k in main]
    if baseline is None:
        baseline = DEFAULT_STRATEGY if DEFAULT_STRATEGY in strategies else (strategies[0] if strategies else None)
    return coll, Study(main, _check_baseline(baseline, strategies), sections, "chosen automatically", notes)


def _check_baseline(baseline: str | None, strategies: Sequence[str]) -> str | None:
    if baseline is not None and baseline not in strategies:
        have = ", ".join(sorted(set(strategies))) or "none"
        raise ClbenchError(f"--baseline {baseline}: not a strategy of the main table", f"main-table strategies: {have}")
    return baseline


def study_groups(
    path: str | Path, make_parser: Callable[[], argparse.ArgumentParser]
) -> list[tuple[str, bool, list[str], dict[str, str]]]:
    """Each group of the sweep file ``path``: (name, main?, strategies, fingerprint digest -> planned run id), the
    runs planned as ``clbench sweep --config`` plans them (nothing is run or written). Main: the group sets no
    strategy setting and no profile but a reference budget (:func:`is_reference_profile`). ``make_parser``: the
    command line's parser (``clbench.cli.build_parser``, handed down by the command, so that the report never
    imports the command line)."""
    path = str(path)
    out = []
    for i, a in enumerate(apply(make_parser, ["sweep", "--config", path], "sweep", path)):
        fields = {name: getattr(a, name) for name in flag_fields("sweep", SweepArgs)}
        spec = SweepArgs(**fields).spec({k: getattr(a, k) for k in flag_fields("sweep")}, a.overrides)  # as `sweep`
        strategies = spec.strategies
        planned = {p.fingerprint.digest(): p.run_id for p in make_plan(spec, check=False)}
        name = getattr(a, "group_name", None) or f"group{i + 1}"
        out.append((name, is_reference_profile(a.profile) and not a.overrides, list(strategies), planned))
    return out


# A study file names its groups by hand: the committed one has 11 groups and 5 KB. Each group is planned as a sweep
# (a parser and a plan per group), so a file of thousands of groups would run for minutes: refused, one line.
MAX_STUDY_GROUPS = 256
MAX_STUDY_BYTES = 256 * 1024


def read_study_file(path: str | Path) -> dict[str, Any]:
    """The study file's mapping, read once (:func:`clbench.run.configfile.load`: YAML 1.2, no aliases), refused in
    one line beyond :data:`MAX_STUDY_BYTES` bytes (before it is parsed) or :data:`MAX_STUDY_GROUPS` groups."""

    p = Path(path)
    if p.is_file() and p.stat().st_size > MAX_STUDY_BYTES:
        raise ClbenchError(
            f"--study {path}: {p.stat().st_size:,} bytes, more than a study file's {MAX_STUDY_BYTES:,}",
            "give the sweep file of one study (a few groups of runs)",
        )
    data = load(str(path))
    groups = data.get("groups")
    if isinstance(groups, list) and len(groups) > MAX_STUDY_GROUPS:
        raise ClbenchError(
            f"--study {path}: {len(groups):,} groups, more than a study's {MAX_STUDY_GROUPS}",
            "split it into studies of at most that many groups",
        )
    return data


def _check_group_data(name: str, runs: list[Run], path: str | Path) -> None:
    """A study group's records are of one data set per benchmark: records whose data digests differ (two data
    sets with the same settings) are refused in one line naming them (records without a digest match any)."""
    by_bench: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        ident = data_identity(r.record)
        if ident is not None:
            by_bench[r.record.bench][ident].append(r.run_id)
    for bench, idents in by_bench.items():
        if len(idents) > 1:
            named = "; ".join(f"data {d}: {', '.join(sorted(ids))}" for d, ids in sorted(idents.items()))
            raise ClbenchError(
                f"--study {Path(path).name}: group {name} has records of {len(idents)} data sets on {bench} ({named})",
                "give the report the records of one data set (or run the other data set as a study of its own)",
            )


def from_study_file(
    coll: Collection,
    path: str | Path,
    make_parser: Callable[[], argparse.ArgumentParser],
    baseline: str | None = None,
) -> tuple[Collection, Study]:
    """The study of ``path`` over ``coll`` (module docstring); returns the collection the report uses (class
    orders pooled when a group varies them) and the study. A record joins a group only when its settings
    fingerprint is one the group plans and its data is the group's (:func:`_check_group_data`)."""
    data = read_study_file(path)
    groups = study_groups(path, make_parser)
    vary = _varies_class_order(data)
    if vary:
        coll = _pooled(coll)
    by_digest: dict[str, list[Run]] = defaultdict(list)
    for r in coll.runs:
        if r.record.fingerprint is not None:  # a record without one (an older clbench's) is no planned run
            by_digest[r.record.fingerprint.digest()].append(r)
    notes: list[str] = []
    main_ids: set[str] = set()
    sections: list[StudySection] = []
    placed: set[str] = set()
    for name, is_main, _, planned in groups:
        runs = [r for d in planned for r in by_digest.get(d, [])]
        _check_group_data(name, runs, path)
        missing = len(planned) - len({d for d in planned if d in by_digest})
        if missing:
            notes.append(f"study group {name}: {missing} of its {len(planned)} planned runs have no record here")
        if is_main:
            main_ids |= {r.run_id for r in runs}
        elif runs:
            sections.append(StudySection(f"Study group {name}", f"group-{name}", "group", runs, ""))
        placed |= {r.run_id for r in runs}
    main_data = [r for r in coll.runs if r.run_id in main_ids]
    _check_group_data("(the main groups together)", main_data, path)
    # A main record that repeats the seed of a record outside the study (the same settings run twice, e.g. a budget
    # point at the default epochs) is the study's: the repeat mark only holds among the main records.
    main_runs = [
        replace(r, repeat_of=None) if r.repeat_of is not None and r.repeat_of not in main_ids else r
        for r in coll.runs
        if r.run_id in main_ids
    ]
    main = Collection(main_runs).acc_groups()
    rest = [r for r in coll.runs if r.run_id not in placed]
    if rest:
        sections.append(
            StudySection(
                "Not in the comparison",
                "section-unassigned",
                "unassigned",
                rest,
                f"records given to the report that no group of {Path(path).name} plans (listed, not compared)",
            )
        )
    main_strategies = [k.strategy for k in main]
    first_main = next((s for n, m, strategies, _ in groups if m for s in strategies), None)
    chosen = baseline if baseline is not None else first_main
    if chosen not in main_strategies and baseline is None:
        chosen = main_strategies[0] if main_strategies else None
    study = Study(main, _check_baseline(chosen, main_strategies), sections, f"study file {Path(path).name}", notes)
    return coll, study


def _varies_class_order(data: dict[str, Any]) -> bool:
    values = [data.get("vary")] + [g.get("vary") for g in data.get("groups") or [] if isinstance(g, dict)]
    return any(v in ("both", "class-order") for v in values)


# ------------------------------------------------------------------------------------------- leaderboard
@dataclass
class Board:
    """The leaderboard: its display table, the row order (main keys, best first), the best row, the caption."""

    table: pd.DataFrame
    keys: list[AccKey]
    caption: str
    notes: list[str]
    versus_column: str | None
    best: AccKey | None
    finals: list[float]
    significant_vs_baseline: list[bool | None]
    study: StudyModel | None = None  # the study every column was read from


def _diff_cell(t: PairTest | None, refused: str | None) -> str:
    """``+2.44 [-0.3, +5.1]`` (a minus b, points, 95 % interval of the same procedure as its p), the seeds when
    the rows' seeds differ, or why the pair has no test."""
    if t is None:
        return f"not tested: {refused}" if refused else "-"
    cell = f"{t.diff:+.2f} {fmt_range(_interval(t))}"
    return cell + (f" (seed{'s' if len(t.seeds) > 1 else ''} {_seeds_short(t.seeds)})" if t.note else "")


def _interval(t: PairTest):
    return Interval(t.diff, t.lo, t.hi)


def _seeds_short(seeds: Sequence[int]) -> str:
    return _seeds_text(seeds)


def _p_cell(t: PairTest | None) -> str:
    return "-" if t is None else fmt_p(t.p, t.p_bound)


def _holm_cell(t: PairTest | None) -> str:
    return "-" if t is None else fmt_p(t.p_adj, t.p_adj_bound)


BEST_VERDICT = "differs from best"  # the adjusted verdict at 5 %, its own column


def leaderboard(study: Study, coll: Collection, predicted: Predicted, model: StudyModel | None = None) -> Board:
    """The main rows sorted by final accuracy (module docstring), every test read from the study ``model``
    (:func:`clbench.report.study.build_study`, built here when not given)."""
    import pandas as pd

    model = model if model is not None else build_study(study, coll, predicted)
    base_name = display_name(study.baseline) if study.baseline else None
    column = f"Δ final vs {base_name} [95 % CI]" if base_name else None
    records: list[dict[str, Any]] = []
    notes: dict[str, list[str]] = {}
    significant: list[bool | None] = []
    for rank, row in enumerate(model.rows, 1):
        runs = list(row.runs)
        key = row.key
        s = [r.summary(key.protocol) for r in runs]
        best = model.best_of(row)
        base = model.baseline_of(row)
        vs_best = model.test(row.id, best.id) if best.id != row.id else None
        vs_base = model.test(row.id, base.id) if base is not None and base.id != row.id else None
        significant.append(None if vs_base is None else vs_base.significant)
        marks = []
        for kind, texts in record_warnings(runs, key.protocol).items():
            marks.append(f"{kind} ({len(texts)} of {len(runs)} records)" if len(runs) > 1 else kind)
            for rid, w in texts:
                notes.setdefault(f"{kind}: {w}", []).append(rid)
        record: dict[str, Any] = {
            "rank": str(rank),
            "method": row.label,
            "seeds": str(len(runs)),
            "final acc % ± CI": fmt_interval(row.final, row.interval.last),
            "avg inc acc % ± CI": fmt_interval(mean_std(x.avg_acc for x in s)[0], row.interval.avg),
            "forgetting": fmt_float(mean_std(x.forgetting for x in s)[0], 2),
            "added params": fmt_int_range(r.record.params.added_total for r in runs),
            "train s": fmt_float(mean_std(r.record.time_s.train for r in runs)[0]),
        }
        if column is not None and base_name is not None:
            if base is not None and base.id == row.id:
                record[column], record[f"p vs {base_name}"], record[f"Holm p vs {base_name}"] = "baseline", "-", "-"
            else:
                refused = model.refusal(row.id, base.id) if base is not None else None
                record[column] = _diff_cell(vs_base, refused.why if refused else None)
                record[f"p vs {base_name}"] = _p_cell(vs_base)
                record[f"Holm p vs {base_name}"] = _holm_cell(vs_base)
        if best.id == row.id:
            mark = "best" if rank == 1 else f"best of the {key.protocol} protocol"
            record["Δ final vs best [95 % CI]"], record["p vs best"], record["Holm p vs best"] = mark, "-", "-"
            record[BEST_VERDICT] = "best"
        else:
            refused = model.refusal(row.id, best.id)
            record["Δ final vs best [95 % CI]"] = _diff_cell(vs_best, refused.why if refused else None)
            record["p vs best"] = _p_cell(vs_best)
            record["Holm p vs best"] = _holm_cell(vs_best)
            record[BEST_VERDICT] = "-" if vs_best is None else "yes" if vs_best.significant else "no"
        record["warnings"] = "; ".join(marks) or "-"
        records.append(record)
    table = pd.DataFrame(records)
    if len(table) and (table["warnings"] == "-").all():
        table = table.drop(columns=["warnings"])
    keys = [r.key for r in model.rows]
    best_key = model.rows[0].key if model.rows else None
    caption = _caption(study, model, best_key, bool(notes))
    lines = [f"{text} (records: {', '.join(sorted(set(ids)))})" for text, ids in notes.items()]
    return Board(table, keys, caption, lines, column, best_key, [r.final for r in model.rows], significant, model)


def record_warnings(runs: Sequence[Run], protocol: str) -> dict[str, list[tuple[str, str]]]:
    """What the records know about themselves, by kind: ``data problems`` (the run was made with
    ``--ignore-data-problems``), ``training warning`` (training barely changed the predictions), ``routing
    warning`` (the protocol's module choices collapsed): kind -> [(run id, the record's text)]. The routing warning
    is the record's own text for the per-sample protocol (:func:`clbench.report.tables.protocol_routing_warning`)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for r in runs:
        for problem in getattr(r.record, "data_problems", None) or []:
            out.setdefault("data problems", []).append((r.run_id, str(problem)))
        if w := training_warning(r.record):
            out.setdefault("training warning", []).append((r.run_id, w))
        routing = r.routing()
        if routing is not None and (w := protocol_routing_warning(r.record, routing, protocol)):
            out.setdefault("routing warning", []).append((r.run_id, w))
    return out


def _caption(study: Study, model: StudyModel, best: AccKey | None, warned: bool) -> str:
    benches = sorted({k.bench for k in study.main})
    protocols = sorted({k.protocol for k in study.main})
    parts = [
        f"Main table ({study.source}) on {', '.join(benches) or 'no benchmark'}: one row per method, sorted by final "
        "accuracy; the best in bold.",
        INTERVAL_NOTE + ".",
        "forgetting: Chaudhry / PILOT definition (max earlier R[t][j] minus final R[T][j]), mean over seeds; "
        "added params: parameters stored on top of the frozen backbone after the last task; train s: training "
        "seconds per run, mean over seeds.",
        f"Paired tests (Δ: final accuracy of the row minus the other's, points, on the same test images and the "
        f"seeds both rows have): {PAIRED_NOTE} Family: {model.family}; Holm p: adjusted over that family; "
        f"{BEST_VERDICT}: the adjusted verdict at 5 % ('no': not significantly different from the best).",
    ]
    if len(protocols) > 1 or protocols != ["per-sample"]:
        parts.append(
            "Protocols: per-sample = every test image predicted on its own; reference = the reference "
            "implementation's class-by-class test batches, shown for the gap."
        )
    if warned:
        parts.append(
            "warnings: what the records say about themselves (data problems the run was made despite, training "
            "that barely changed the predictions, collapsed routing); each text is listed once under the table."
        )
    return " ".join(parts)


# How a pair's interval and p are made: said once, in every caption that prints one.


def study_sections(study: Study) -> list[Section]:
    """One table per secondary section of the study: its records (run, configuration, protocol, seed, final and
    average incremental accuracy), so that none is silently dropped."""
    import pandas as pd

    out = []
    for sec in study.sections:
        rows = [
            {
                "run id": r.run_id,
                "configuration": r.variant,
                "backbone": r.backbone_label,
                "protocol": p,
                "seed": str(r.seed),
                "final acc %": fmt_float(r.summary(p).last_acc, 2),
                "avg inc acc %": fmt_float(r.summary(p).avg_acc, 2),
            }
            for r in sec.runs
            for p in r.protocols
        ]
        intro = f"{len(sec.runs)} records" + (f": {sec.why}" if sec.why else "") + "."
        out.append(Section(sec.title, sec.anchor, pd.DataFrame(rows), intro=intro))
    return out


__all__ = [
    "Board",
    "Study",
    "StudySection",
    "automatic",
    "display_name",
    "from_study_file",
    "leaderboard",
    "short_label",
    "study_sections",
]
