"""The forest plot of a study's paired tests: each main row's difference in final accuracy to the best row and to the
baseline, with its interval, sorted, the verdict of the adjusted test marked.

It reads tests duck-typed (:class:`PairTestLike`: the fields of the study model's paired test), so any source of
tests with those attributes draws it; :func:`tests_from_collection` builds them from a collection's paired rows
(:func:`clbench.report.uncertainty.paired_rows`) for a report that has no study model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clbench.report.figure_base import _final
from clbench.report.labels import needs_backbone, short_label

if TYPE_CHECKING:
    from clbench.report.collect import Collection
    from clbench.report.figure_base import FigureOut

SIGNIFICANT_COLOR = "#0072B2"  # Okabe-Ito blue: the adjusted test rejects at 5 %
PLAIN_COLOR = "#7f7f7f"  # grey, open marker: it does not


class PairTestLike(Protocol):
    """A minus B in final accuracy (points), its interval, the test's p and the family-adjusted p and verdict."""

    a: str
    b: str
    label_a: str
    label_b: str
    diff: float
    lo: float
    hi: float
    p: float
    p_adj: float | None
    significant: bool | None
    seeds: Any
    method: str


@dataclass(frozen=True)
class Difference:
    """One row of the forest: ``row`` minus ``versus`` (points) and its interval, oriented from a test."""

    row: str
    label: str
    diff: float
    lo: float
    hi: float
    p_adj: float | None
    significant: bool | None
    method: str


def differences(tests: Sequence[PairTestLike], versus: str) -> dict[str, Difference]:
    """Row id -> its difference to row ``versus`` (each test that involves ``versus``, turned to read row minus it)."""
    out: dict[str, Difference] = {}
    for t in tests:
        if t.b == versus and t.a != versus:
            out[t.a] = Difference(t.a, t.label_a, t.diff, t.lo, t.hi, t.p_adj, t.significant, t.method)
        elif t.a == versus and t.b != versus:
            out[t.b] = Difference(t.b, t.label_b, -t.diff, -t.hi, -t.lo, t.p_adj, t.significant, t.method)
    return out


def forest_plot(
    tests: Sequence[PairTestLike],
    best: str,
    baseline: str | None,
    labels: dict[str, str],
    out_dir: Path,
    *,
    runs: Sequence[Any] = (),
    family: str = "",
    name: str = "paired_differences",
    title: str = "Differences to the best and to the baseline",
) -> FigureOut | None:
    """Two panels sharing their rows (``labels``: row id -> label, ranked best first): each row minus the ``best``
    row, and minus the ``baseline`` row, in points with the test's interval; filled blue where the adjusted test
    rejects at 5 %, open grey where not. ``family``: the correction, named once in the caption. None without a test."""
    import matplotlib

    # looked up at call time: tests replace it on its module
    from clbench.report.figure_base import RC, _save, provenance

    sides = [(best, "best")] + ([(baseline, "baseline")] if baseline is not None and baseline != best else [])
    diffs = [(versus, what, differences(tests, versus)) for versus, what in sides]
    diffs = [d for d in diffs if d[2]]
    if not diffs:
        return None
    order = [r for r in labels if any(r in d or r == versus for versus, _, d in diffs)]
    y = {r: i for i, r in enumerate(order)}
    with matplotlib.rc_context({**RC, "font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 9}):
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D

        fig = Figure(figsize=(10.0, 1.2 + 0.3 * len(order)), layout="constrained")
        # a margin round the canvas: the longest row label (a method with its profile) otherwise touches its edge
        fig.get_layout_engine().set(w_pad=0.15, h_pad=0.1)
        axes = fig.subplots(1, len(diffs), sharey=True, squeeze=False)[0]
        for ax, (versus, what, d) in zip(axes, diffs, strict=True):
            ax.axvline(0, color="black", lw=0.8)
            for r, row in d.items():
                if r not in y:
                    continue
                sig = bool(row.significant)
                color = SIGNIFICANT_COLOR if sig else PLAIN_COLOR
                ax.plot([row.lo, row.hi], [y[r], y[r]], color=color, lw=1.8, solid_capstyle="butt")
                ax.plot([row.diff], [y[r]], "o", ms=6, color=color, mfc=color if sig else "white", mew=1.5)
            ax.plot([0], [y[versus]], "D", ms=6, color="black")  # the reference row itself
            ax.set_title(f"minus {labels[versus]} ({what})", loc="left")
            ax.set_xlabel("difference in final accuracy (points)")
            ax.grid(axis="y", visible=False)
            lo = min(min(x.lo for x in d.values()), 0.0)
            hi = max(max(x.hi for x in d.values()), 0.0)
            pad = 0.05 * (hi - lo or 1.0)
            ax.set_xlim(lo - pad, hi + pad)
        axes[0].set_yticks(range(len(order)), [labels[r] for r in order])
        axes[0].invert_yaxis()  # best first, at the top
        fig.legend(
            handles=[
                Line2D([], [], color=SIGNIFICANT_COLOR, marker="o", lw=1.8, label="differs (adjusted p < 0.05)"),
                Line2D([], [], color=PLAIN_COLOR, marker="o", mfc="white", lw=1.8, label="no difference shown"),
                Line2D([], [], color="black", marker="D", lw=0, label="the row compared against"),
            ],
            loc="outside lower center",
            ncol=3,
            frameon=False,
        )
        untested = [labels[r] for r in labels if r not in y]
        methods = sorted({x.method for _, _, d in diffs for x in d.values() if x.method})
        caption = (
            f"{title}: final accuracy of each main row minus the best row's and minus the baseline's, in points, with "
            f"the interval of the test ({'; '.join(methods) or 'paired'}); rows ranked by final accuracy; filled = "
            "the adjusted test rejects at 5 %"
            + (f" ({family})" if family else "")
            + ". "
            + (f"Without a paired test (other seeds or protocol): {', '.join(untested)}. " if untested else "")
            + provenance(list(runs))
        )
        return _save(fig, out_dir, name, title, caption, list(runs))


def forest_of_study(
    study: Any,
    out_dir: Path,
    *,
    runs: Sequence[Any] = (),
    name: str = "paired_differences",
    title: str = "Differences to the best and to the baseline",
) -> FigureOut | None:
    """:func:`forest_plot` of a study's own tests (:class:`clbench.report.study.Study`): the rows of its best row's
    benchmark and protocol, ranked, each against the best and the baseline, with the p and verdict of the study's
    family, so that the figure and every table print one test per pair."""
    if study.best is None:
        return None
    best = study.row(study.best)
    labels = {r.id: r.label for r in study.rows if r.setting == best.setting}
    tests = [t for t in study.tests if t.a in labels and t.b in labels]
    baseline = study.baseline if study.baseline in labels else None
    return forest_plot(
        tests, study.best, baseline, labels, out_dir, runs=runs, family=study.family, name=name, title=title
    )


# ------------------------------------------------------------------------------------------- from paired rows
@dataclass(frozen=True)
class _Pair:
    """A paired test with the fields of :class:`PairTestLike`, built from a paired row."""

    a: str
    b: str
    label_a: str
    label_b: str
    diff: float
    lo: float
    hi: float
    p: float
    p_adj: float | None
    significant: bool | None
    seeds: tuple[int, ...]
    method: str


def pairs_of(rows: Sequence[Any], several: bool) -> list[_Pair]:
    """Paired rows (:class:`clbench.report.uncertainty.PairRow`) with a test, as :class:`PairTestLike` tests whose ids
    and labels are the rows' short labels; the adjusted p and verdict are the rows' own (Holm)."""
    # deferred: loads numpy, which importing this module does not
    from clbench.report.uncertainty import ALPHA

    return [
        _Pair(
            short_label(r.key_a, several),
            short_label(r.key_b, several),
            short_label(r.key_a, several),
            short_label(r.key_b, several),
            r.test.diff.value,
            r.test.diff.lo,
            r.test.diff.hi,
            r.test.p,
            r.p_holm,
            None if r.p_holm is None else bool(r.p_holm < ALPHA),
            tuple(r.seeds),
            r.test.test,
        )
        for r in rows
        if r.test is not None and r.key_a is not None and r.key_b is not None
    ]


def forest_of_pairs(
    rows: Sequence[Any], coll: Collection, out_dir: Path, name: str, title: str, baseline: str | None = None
) -> FigureOut | None:
    """:func:`forest_plot` of paired rows already tested (``clbench compare``: every pair, or each against
    ``baseline``), with their own Holm-adjusted p: each row against the best row of ``coll`` and the baseline."""
    groups = coll.acc_groups()
    several = needs_backbone(list(groups))
    ranked = sorted(groups, key=lambda k: -_final(groups[k], k.protocol))
    tests = pairs_of(rows, several)
    if not ranked or not tests:
        return None
    labels = {short_label(k, several): short_label(k, several) for k in ranked}
    base = next((short_label(k, several) for k in ranked if k.strategy == baseline), None)
    family = "Holm over the tested pairs of each benchmark and protocol, as in the pairs table"
    return forest_plot(
        tests, short_label(ranked[0], several), base, labels, out_dir, runs=coll.runs, family=family, name=name,
        title=title,
    )  # fmt: skip


def tests_from_collection(
    coll: Collection, predicted: Any, baseline: str | None
) -> tuple[list[_Pair], str, str | None, dict[str, str], str]:
    """The tests of every row of ``coll`` against its best row and against the ``baseline`` row, as the leaderboard
    makes them (:func:`clbench.report.uncertainty.paired_rows` against one strategy, Holm over each of the two families,
    per benchmark and protocol); returns (tests, best id, baseline id, labels ranked best first,
    the families' description)."""
    # deferred: loads numpy, which importing this module does not
    from clbench.report.uncertainty import paired_rows

    groups = coll.acc_groups()
    several = needs_backbone(list(groups))
    ranked = sorted(groups, key=lambda k: -_final(groups[k], k.protocol))
    if not ranked:
        return [], "", None, {}, ""
    labels = {short_label(k, several): short_label(k, several) for k in ranked}
    best = ranked[0]
    has_baseline = baseline is not None and any(k.strategy == baseline for k in ranked)
    rows = [r for r in paired_rows(coll, predicted, best.strategy) if r.key_b == best]
    if has_baseline and baseline != best.strategy:
        rows += [r for r in paired_rows(coll, predicted, baseline) if r.key_a != best]  # best vs baseline: above
    tests = pairs_of(rows, several)
    base = next((k for k in ranked if k.strategy == baseline), None) if has_baseline else None
    family = (
        "Holm over each row's tests against the best row, and separately against the baseline, per benchmark and "
        "protocol, as in the leaderboard"
    )
    return tests, labels[short_label(best, several)], short_label(base, several) if base else None, labels, family


def forest_from_collection(coll: Collection, out_dir: Path, predicted: Any, baseline: str | None) -> FigureOut | None:
    """:func:`forest_plot` of :func:`tests_from_collection`."""
    tests, best, base, labels, family = tests_from_collection(coll, predicted, baseline)
    if not tests:
        return None
    return forest_plot(tests, best, base, labels, out_dir, runs=coll.runs, family=family)
