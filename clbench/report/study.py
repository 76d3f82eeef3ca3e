"""The study a report presents, built once: its main rows ranked, their seeds and intervals, the declared family of
paired tests with their p-values, Holm-adjusted p-values and verdicts. Every output of a report (the leaderboard, the
paired table, ``clbench compare``, ``report.json``, the README's results block) reads this one object, so a pair of
rows has one p, one adjusted p and one verdict wherever it is printed.

- Rows: the main rows of the selection (:mod:`clbench.report.leaderboard`: a study file's main groups, or one row per
  strategy and protocol at its default configuration), ranked by mean final accuracy, best first.
- Family (:data:`FAMILIES`): ``default``, every main row against the best row and against the baseline's row of its
  benchmark and protocol; ``all``, every pair of main rows of one benchmark and protocol. Holm corrects over the
  whole family at once; :attr:`Study.family` says so in one line.
- A pair: final accuracy of A minus B in points on the seeds both rows share (a row of five seeds against a row of
  one is compared on that one seed, and the test says so), with one procedure for the interval and the p-value
  (:mod:`clbench.evaluation.stats`: the paired bootstrap over test images for one seed, the seed-level t for
  several): the interval excludes 0 exactly when the unadjusted p is below 0.05. Pairs that cannot be compared
  (no shared seed, other class orders or data, no predictions) are listed in :attr:`Study.refused` with why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from clbench.evaluation import stats
from clbench.report.collect import AccKey, Collection, Run
from clbench.report.labels import display_name, needs_backbone, short_label
from clbench.report.uncertainty import (
    ALPHA,
    Predicted,
    RowInterval,
    pair_size,
    paired_finals,
    pairing_problem,
    row_interval,
)

if TYPE_CHECKING:
    from typing import Any as Selection  # clbench.report.leaderboard.Study, which reads this module

FAMILIES = ("default", "all")


@dataclass(frozen=True)
class StudyRow:
    """One main row: its identity, display label, runs (one per seed), mean final and average incremental accuracy
    (percent) and their interval."""

    id: str
    key: AccKey
    label: str
    runs: tuple[Run, ...]
    final: float
    avg: float
    interval: RowInterval

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(sorted(r.seed for r in self.runs))

    @property
    def setting(self) -> tuple[str, str]:
        """What two rows must share to be compared: benchmark and protocol."""
        return (self.key.bench, self.key.protocol)


@dataclass(frozen=True)
class PairTest:
    """Row ``a`` against row ``b`` (row ids; labels for display): final accuracy of a minus b in points, its 95 %
    interval [lo, hi], the unadjusted two-sided p and the Holm-adjusted one over the study's family, the verdict at
    5 % after adjustment, the seeds it was computed on and the procedure (which made both the interval and p, so
    that the interval excludes 0 exactly when ``p < 0.05``). ``p_bound``/``p_adj_bound``: the value is an upper
    bound (a resampling floor). ``note``: how the seeds were chosen where the rows' seeds differ."""

    a: str
    b: str
    label_a: str
    label_b: str
    diff: float
    lo: float
    hi: float
    p: float
    p_adj: float
    significant: bool
    seeds: tuple[int, ...]
    method: str
    bench: str = ""
    protocol: str = ""
    p_bound: bool = False
    p_adj_bound: bool = False
    note: str = ""

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def flipped(self) -> PairTest:
        """The same test read as b minus a."""
        return replace(
            self, a=self.b, b=self.a, label_a=self.label_b, label_b=self.label_a, diff=-self.diff, lo=-self.hi,
            hi=-self.lo,
        )  # fmt: skip

    def as_dict(self) -> dict[str, object]:
        return {
            "a": self.a,
            "b": self.b,
            "label_a": self.label_a,
            "label_b": self.label_b,
            "bench": self.bench,
            "protocol": self.protocol,
            "diff": self.diff,
            "lo": self.lo,
            "hi": self.hi,
            "p": self.p,
            "p_bound": self.p_bound,
            "p_adj": self.p_adj,
            "p_adj_bound": self.p_adj_bound,
            "significant": self.significant,
            "seeds": list(self.seeds),
            "method": self.method,
            "note": self.note,
        }


@dataclass(frozen=True)
class Refused:
    """A pair of the family that could not be tested, and why."""

    a: str
    b: str
    label_a: str
    label_b: str
    why: str


@dataclass(frozen=True)
class Study:
    """The study (module docstring): ``rows`` ranked best first, ``tests`` the family computed once, ``family`` its
    one-line description, ``best`` and ``baseline`` row ids (the baseline's row on the best row's benchmark and
    protocol), ``selection`` the choice of rows it came from."""

    rows: tuple[StudyRow, ...]
    tests: tuple[PairTest, ...]
    family: str
    best: str | None
    baseline: str | None
    refused: tuple[Refused, ...] = ()
    family_kind: str = "default"
    baseline_strategy: str | None = None
    selection: Selection | None = field(default=None, compare=False)

    def row(self, row_id: str) -> StudyRow:
        return next(r for r in self.rows if r.id == row_id)

    def row_of(self, key: AccKey) -> StudyRow | None:
        return next((r for r in self.rows if r.key == key), None)

    def test(self, a: str, b: str) -> PairTest | None:
        """The family's test of rows ``a`` and ``b`` read as a minus b (None: not in the family or refused)."""
        for t in self.tests:
            if (t.a, t.b) == (a, b):
                return t
            if (t.a, t.b) == (b, a):
                return t.flipped()
        return None

    def refusal(self, a: str, b: str) -> Refused | None:
        return next((r for r in self.refused if {r.a, r.b} == {a, b}), None)

    def best_of(self, row: StudyRow) -> StudyRow:
        """The best row of ``row``'s benchmark and protocol."""
        return next(r for r in self.rows if r.setting == row.setting)

    def baseline_of(self, row: StudyRow) -> StudyRow | None:
        """The baseline's row of ``row``'s benchmark and protocol (None: the baseline has none)."""
        if self.baseline_strategy is None:
            return None
        return next(
            (r for r in self.rows if r.setting == row.setting and _strategy(r.key) == self.baseline_strategy), None
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "family": self.family,
            "best_row": self.best,
            "baseline_row": self.baseline,
            "rows": [
                {"id": r.id, "label": r.label, "seeds": list(r.seeds), "final": r.final, "avg": r.avg}
                for r in self.rows
            ],
            "tests": [t.as_dict() for t in self.tests],
            "refused": [{"a": r.a, "b": r.b, "why": r.why} for r in self.refused],
        }


def _strategy(key: AccKey) -> str:
    """The strategy a row runs (its variant label's first word, without a profile)."""
    return key.strategy.split(" ")[0].partition(":")[0]


def row_id(key: AccKey, several_benches: bool) -> str:
    """A row's id: its variant, protocol, backbone (and benchmark where the study has several)."""
    parts = [key.strategy, key.protocol, key.backbone, key.weights]
    if several_benches:
        parts.insert(0, key.bench)
    return " | ".join(parts)


def _mean(values: Sequence[float]) -> float:
    finite = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(finite) / len(finite) if finite else math.nan


def build_study(
    selection: Selection, coll: Collection, predicted: Predicted | None = None, family: str = "default"
) -> Study:
    """The study of ``selection`` (its main rows and baseline) over ``coll``, with the tests of ``family``."""
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    predicted = predicted or Predicted()
    groups = selection.collection(coll).acc_groups()
    several_benches = len({k.bench for k in groups}) > 1
    several_backbones = needs_backbone(list(groups))
    rows = []
    for key, runs in groups.items():
        label = short_label(key, several_backbones) + (f" ({key.bench})" if several_benches else "")
        rows.append(
            StudyRow(
                row_id(key, several_benches),
                key,
                label,
                tuple(sorted(runs, key=lambda r: r.seed)),
                _mean([r.summary(key.protocol).last_acc for r in runs]),
                _mean([r.summary(key.protocol).avg_acc for r in runs]),
                row_interval(runs, key.protocol, predicted),
            )
        )
    rows.sort(key=lambda r: (-(r.final if not math.isnan(r.final) else -math.inf), r.key.strategy, r.key.protocol))
    base = selection.baseline
    pairs = _family(rows, base, family)
    tests: list[PairTest] = []
    refused: list[Refused] = []
    for ra, rb in pairs:
        result = pair_test(ra, rb, predicted)
        (refused if isinstance(result, Refused) else tests).append(result)
    adjusted, bound = stats.holm_bounds([t.p for t in tests], [t.p_bound for t in tests])
    tests = [
        replace(t, p_adj=float(p), p_adj_bound=bool(b), significant=bool(p < ALPHA))
        for t, p, b in zip(tests, adjusted, bound, strict=True)
    ]
    best = rows[0] if rows else None
    baseline_row = (
        next((r for r in rows if r.setting == best.setting and _strategy(r.key) == base), None)
        if best is not None and base is not None
        else None
    )
    what = (
        "every pair of main rows of one benchmark and protocol"
        if family == "all"
        else "each main row vs the best row"
        + (f" and vs the baseline ({display(base)})" if base else "")
        + " of its benchmark and protocol"
    )
    described = f"{what}; Holm over {len(tests)} tests" + (
        f" ({len(refused)} more pairs not testable, listed)" if refused else ""
    )
    return Study(
        tuple(rows),
        tuple(tests),
        described,
        best.id if best else None,
        baseline_row.id if baseline_row else None,
        tuple(refused),
        family,
        base,
        selection,
    )


def display(strategy: str) -> str:
    return display_name(strategy)


def _family(rows: list[StudyRow], baseline: str | None, family: str) -> list[tuple[StudyRow, StudyRow]]:
    """The pairs of ``family`` as (a, b), a the row tested against b (the best or the baseline), in rank order."""
    out: list[tuple[StudyRow, StudyRow]] = []
    seen: set[frozenset[str]] = set()

    def add(a: StudyRow, b: StudyRow) -> None:
        if a.id != b.id and frozenset((a.id, b.id)) not in seen:
            seen.add(frozenset((a.id, b.id)))
            out.append((a, b))

    settings: dict[tuple[str, str], list[StudyRow]] = {}
    for r in rows:
        settings.setdefault(r.setting, []).append(r)
    for members in settings.values():
        if family == "all":
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    add(b, a)  # the lower-ranked minus the higher-ranked
            continue
        best = members[0]
        base = next((r for r in members if baseline is not None and _strategy(r.key) == baseline), None)
        for r in members:
            add(r, best)
        if base is not None:
            for r in members:
                add(r, base)
    return out


def _seeds_text(seeds: Sequence[int]) -> str:
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def pair_test(ra: StudyRow, rb: StudyRow, predicted: Predicted) -> PairTest | Refused:
    """Row ``ra`` minus row ``rb`` on the seeds they share (unadjusted: ``p_adj`` is ``p`` until the family's
    correction). One shared seed: the paired (block) bootstrap; several: the seed-level t."""
    shared = sorted(set(ra.seeds) & set(rb.seeds))
    if not shared:
        return Refused(
            ra.id, rb.id, ra.label, rb.label, f"no seed in common ({_seeds_text(ra.seeds)} vs {_seeds_text(rb.seeds)})"
        )
    runs_a = [r for r in ra.runs if r.seed in shared]
    runs_b = [r for r in rb.runs if r.seed in shared]
    why = pairing_problem(runs_a, runs_b)
    if why is not None:
        return Refused(ra.id, rb.id, ra.label, rb.label, why)
    protocol = ra.key.protocol
    paired = paired_finals(runs_a, runs_b, protocol, predicted)
    if isinstance(paired, str):
        return Refused(ra.id, rb.id, ra.label, rb.label, paired)
    a, b, strata, blocks = paired.a, paired.b, paired.strata, paired.blocks
    if len(a) == 1:
        t = stats.paired_test(a, b, strata, blocks=blocks[0])
        size = pair_size(runs_a[0], runs_b[0], protocol)
        method = t.test + (f" of {size}" if size is not None else "") + f", seed {shared[0]}"
    else:
        ids = [x for x in blocks if x is not None]
        common = None if not ids else ids[0] if all(np.array_equal(ids[0], x) for x in ids[1:]) else None
        t = stats.paired_seed_test(a, b, strata, None if not ids else (common if common is not None else ids))
        method = f"seed-level t over {len(shared)} seeds + shared test-image noise"
    note = ""
    if len(shared) < max(len(ra.seeds), len(rb.seeds)):
        note = f"on the {len(shared)} seed{'s' if len(shared) > 1 else ''} both rows have ({_seeds_text(shared)})"
    d = t.diff
    return PairTest(
        ra.id, rb.id, ra.label, rb.label, d.value, d.lo, d.hi, t.p, t.p, t.p < ALPHA, tuple(shared), method,
        ra.key.bench, protocol, t.at_floor, t.at_floor, note,
    )  # fmt: skip


def verdict(t: PairTest) -> str:
    """The adjusted verdict as printed."""
    return "differs" if t.significant else "not significantly different"


def p_text(t: PairTest) -> str:
    """``p 0.003, Holm 0.03``: the unadjusted and the adjusted p as printed."""
    return f"p {stats.fmt_p(t.p, t.p_bound)}, Holm {stats.fmt_p(t.p_adj, t.p_adj_bound)}"
