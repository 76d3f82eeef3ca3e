"""Report tables (pandas) and their Markdown / HTML rendering.

Each table is a :class:`Section`: a title, a DataFrame of display strings, and the notes printed under it. The same
sections make ``README.md``, ``index.html`` and the golden file of the tests, so the three never disagree.

Rows: one per benchmark (with split) x backbone (name, input size, weights) x strategy configuration x protocol.
Only seeds are averaged (mean ± half the 95 % interval where the runs kept predictions, the standard deviation over
seeds beside it, n shown); every row names the runs it came from.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from clbench.evaluation import metrics, stats
from clbench.evaluation.declared import SUMMARISED
from clbench.files import escape as text
from clbench.records.routing_diagnostics import RoutingDiagnostics, collapse_warning, read_routing
from clbench.report.budget import BudgetCurve, budget_table_rows
from clbench.report.collect import Collection, Run, digest_short
from clbench.report.study import _seeds_text
from clbench.report.uncertainty import Predicted, RowInterval, fmt_interval, fmt_range, row_interval

if TYPE_CHECKING:
    import pandas as pd

    from clbench.report.study import Study as StudyModel

# What each evaluation protocol means; printed under tables that show the protocol column.
PROTOCOL_NOTES: dict[str, str] = {
    "per-sample": "per-sample: every test image is predicted on its own (the sound default)",
    "reference": (
        "reference: the reference implementation's batch behaviour (class-by-class test batches, one "
        "routing decision per batch), reported to show the gap"
    ),
}
FORGETTING_NOTE = "forgetting column: Chaudhry / PILOT definition (max earlier R[t][j] minus final R[T][j])"
COST_NOTE = (
    "added params: parameters stored on top of the frozen backbone after the last task (modules, prompts, "
    "head); trainable: the most trained at once in one task. Times are seconds per run (mean over seeds): "
    "features = frozen-feature extraction (near 0 when the on-disk feature cache hit), train, eval (covers "
    "every protocol the run evaluated); peak RSS = the largest over the runs"
)


@dataclass
class Section:
    """One titled table with notes; ``definitions`` are (term, meaning) pairs printed as a list."""

    title: str
    anchor: str
    table: pd.DataFrame | None
    intro: str = ""
    notes: list[str] = field(default_factory=list)
    definitions: list[tuple[str, str]] = field(default_factory=list)
    bold_rows: list[int] = field(default_factory=list)  # rows printed in bold (the leaderboard's best)


# ------------------------------------------------------------------------------------------- number formats
def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        v = float(v)
        if not math.isnan(v):
            out.append(v)
    return out


def mean_std(values: Iterable[Any]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (NaN for n < 2) and n of the finite values."""
    vals = _finite(values)
    n = len(vals)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def fmt_mean_std(values: Iterable[Any], nd: int = 2) -> str:
    mean, std, n = mean_std(values)
    if n == 0:
        return "-"
    return f"{mean:.{nd}f}" if n == 1 else f"{mean:.{nd}f} ± {std:.{nd}f}"


def fmt_mean_sd(values: Iterable[Any], nd: int = 2) -> str:
    """``12.30 (sd 1.20)`` over seeds; ``±`` is kept for intervals."""
    mean, std, n = mean_std(values)
    if n == 0:
        return "-"
    return f"{mean:.{nd}f}" if n == 1 else f"{mean:.{nd}f} (sd {std:.{nd}f})"


def fmt_signed_mean_std(values: Iterable[Any], nd: int = 2) -> str:
    mean, std, n = mean_std(values)
    if n == 0:
        return "-"
    return f"{mean:+.{nd}f}" if n == 1 else f"{mean:+.{nd}f} ± {std:.{nd}f}"


def fmt_int_range(values: Iterable[Any]) -> str:
    vals = sorted({int(v) for v in values if v is not None})
    if not vals:
        return "-"
    return f"{vals[0]:,}" if len(vals) == 1 else f"{vals[0]:,}–{vals[-1]:,}"


def fmt_float(value: float, nd: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{nd}f}"


def seeds_cell(runs: Sequence[Run]) -> str:
    return f"{len(runs)} ({', '.join(str(s) for s in sorted(r.seed for r in runs))})"


def run_ids(runs: Sequence[Run]) -> str:
    return ", ".join(r.run_id for r in runs)


# ------------------------------------------------------------------------------------------- tables
def _bwt(run: Run, protocol: str) -> float:
    """The record's BWT, or (records before it) computed from its accuracy matrix: the same definition."""
    s = run.summary(protocol)
    return s.bwt if s.bwt is not None else metrics.bwt(s.accuracy_matrix)


def summary_frame(coll: Collection, predicted: Predicted | None = None) -> pd.DataFrame:
    """Numbers per row (means, standard deviations, n, 95 % intervals): the machine-readable summary."""
    import pandas as pd

    predicted = predicted or Predicted()
    rows = []
    for key, runs in coll.acc_groups().items():
        s = [r.summary(key.protocol) for r in runs]
        row: dict[str, Any] = dict(key._asdict())
        for metric in SUMMARISED:
            mean, std, _ = mean_std(getattr(x, metric) for x in s)
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean, std
        row["bwt_mean"] = mean_std(_bwt(r, key.protocol) for r in runs)[0]
        ri = row_interval(runs, key.protocol, predicted)
        for metric, interval in (("last_acc", ri.last), ("avg_acc", ri.avg)):
            row[f"{metric}_lo"] = interval.lo if interval else math.nan
            row[f"{metric}_hi"] = interval.hi if interval else math.nan
        row["interval"] = interval_cell(ri)
        row["n"] = len(runs)
        row["seeds"] = sorted(r.seed for r in runs)
        row["added_params"] = sorted({r.record.params.added_total for r in runs})
        row["trainable_params"] = sorted({r.record.params.trainable for r in runs})
        for phase in ("features", "train", "eval", "total"):
            row[f"time_{phase}_s"] = mean_std(getattr(r.record.time_s, phase) for r in runs)[0]
        rss = _finite(r.record.peak_rss_mb for r in runs)
        row["peak_rss_mb"] = max(rss) if rss else math.nan
        row["runs"] = [r.run_id for r in runs]
        rows.append(row)
    return pd.DataFrame(rows)


def interval_cell(ri: RowInterval) -> str:
    return ri.method if ri.why_not is None else f"none: {ri.why_not}"


def summary_table(coll: Collection, predicted: Predicted | None = None) -> pd.DataFrame:
    """Rows of mean over seeds ± half the 95 % interval (where the runs kept predictions; the interval column says
    how it was made, or why there is none), with the standard deviation over seeds beside it."""
    import pandas as pd

    predicted = predicted or Predicted()
    rows = []
    for key, runs in coll.acc_groups().items():
        s = [r.summary(key.protocol) for r in runs]
        rss = _finite(r.record.peak_rss_mb for r in runs)
        ri = row_interval(runs, key.protocol, predicted)
        rows.append(
            {
                "benchmark": key.bench,
                "strategy": key.strategy,
                "backbone": key.backbone,
                "weights": key.weights,
                "protocol": key.protocol,
                "n (seeds)": seeds_cell(runs),
                "final acc %": fmt_interval(mean_std(x.last_acc for x in s)[0], ri.last),
                "avg inc acc %": fmt_interval(mean_std(x.avg_acc for x in s)[0], ri.avg),
                "95 % interval": interval_cell(ri),
                "final acc sd over seeds": fmt_float(mean_std(x.last_acc for x in s)[1], 2),
                "final acc image se": "-" if ri.image_se is None else fmt_float(ri.image_se, 2),
                "forgetting": fmt_mean_sd(x.forgetting for x in s),
                "BWT": fmt_mean_sd(_bwt(r, key.protocol) for r in runs),
                "added params": fmt_int_range(r.record.params.added_total for r in runs),
                "trainable params": fmt_int_range(r.record.params.trainable for r in runs),
                "features s": fmt_float(mean_std(r.record.time_s.features for r in runs)[0]),
                "train s": fmt_float(mean_std(r.record.time_s.train for r in runs)[0]),
                "eval s": fmt_float(mean_std(r.record.time_s.eval for r in runs)[0]),
                "peak RSS MB": fmt_float(max(rss) if rss else math.nan, 0),
                "runs": run_ids(runs),
            }
        )
        aware = [x.task_aware_last for x in s if x.task_aware_last is not None]
        if aware:  # clbench.evaluation.metrics "task-aware": each image's task given; records before it have none
            rows[-1]["task-aware final %"] = fmt_mean_sd(aware) if len(aware) == len(s) else "-"
        warnings = sorted({w for r in runs if (w := training_warning(r.record))})
        if warnings:
            rows[-1]["training warning"] = "; ".join(warnings)
    for column in ("task-aware final %", "training warning"):  # only where some record has one
        if any(column in row for row in rows):
            for row in rows:
                row.setdefault(column, "-")
    return pd.DataFrame(rows)


def gap_table(coll: Collection) -> pd.DataFrame:
    """Reference minus per-sample protocol, for runs that evaluated both (records with ``protocol_gap``)."""
    import pandas as pd

    rows = []
    for key, runs in coll.run_groups().items():
        with_gap = [r for r in runs if r.record.protocol_gap is not None]
        if not with_gap:
            continue
        gaps = [r.record.protocol_gap for r in with_gap]
        rows.append(
            {
                "benchmark": key.bench,
                "strategy": key.strategy,
                "backbone": key.backbone,
                "weights": key.weights,
                "n (seeds)": seeds_cell(with_gap),
                "final acc gap (points)": fmt_signed_mean_std(g.last_acc for g in gaps),
                "avg inc acc gap (points)": fmt_signed_mean_std(g.avg_acc for g in gaps),
                "runs": run_ids(with_gap),
            }
        )
    return pd.DataFrame(rows)


def training_warning(record: Any) -> str | None:
    """The record's under-training warning (``training_warning``), also from a record read by a clbench that does
    not know the field (kept in ``extra``); None when it has none."""
    value = getattr(record, "training_warning", None)
    if value is None:
        value = getattr(record, "extra", {}).get("training_warning")
    return str(value) if value else None


def routing_warning(record: Any) -> str | None:
    """The routing warnings of the record's last evaluation, one per protocol that has one (joined), or None."""
    per_task = getattr(record, "per_task", None) or []
    routing = (
        read_routing(per_task[-1].diagnostics, f"run {record.run_id}: last task's diagnostics") if per_task else None
    )
    if routing is None:
        return None
    found = [w for p in record.protocol_names if (w := protocol_routing_warning(record, routing, p))]
    return "; ".join(found) or None


def protocol_routing_warning(record: Any, routing: RoutingDiagnostics, protocol: str) -> str | None:
    """The routing warning of one protocol's own module choices. Per-sample: the record's text (its router's
    collapse test, ``diagnostics.routing_warning``). Another protocol (e.g. the reference protocol's batch vote):
    the same collapse test (:func:`clbench.records.routing_diagnostics.collapse_warning`) on that protocol's
    chosen-module counts, against the test images' true tasks (the rows of the router study's confusion counts; in
    records without them, each task's share of the classes)."""
    if protocol == "per-sample":
        return routing.routing_warning or None
    hist = routing.protocols[protocol].chosen_hist if protocol in routing.protocols else None
    if not hist:
        return None
    n = len(hist)
    confusion = next((r.confusion for r in (routing.routers or {}).values() if r.confusion), None)
    if confusion is not None:
        per_task = [int(sum(row)) for row in confusion][:n]
    else:
        per_task = [int(c) for c in list(record.task_sizes)[:n]]
    choice = np.repeat(np.arange(n), hist)
    true_task = np.repeat(np.arange(n), per_task)
    return collapse_warning(choice, true_task, n, f"{protocol}-protocol")


def routing_protocols(run: Run) -> list[str]:
    """Protocols whose diagnostics report routing (a strategy that routes between per-task modules)."""
    routing = run.routing()
    return [p for p in run.protocols if routing is not None and p in routing.protocols]


def routing_table(coll: Collection) -> pd.DataFrame:
    """After the last task: how often the chosen module is the image's own task's, and the accuracy with the
    chosen module versus with the true task's module (oracle routing)."""
    import pandas as pd

    rows = []
    for key, runs in coll.acc_groups().items():
        runs = [r for r in runs if key.protocol in routing_protocols(r)]
        if not runs:
            continue
        d = [r.routing() for r in runs]
        rows.append(
            {
                "benchmark": key.bench,
                "strategy": key.strategy,
                "backbone": key.backbone,
                "protocol": key.protocol,
                "n (seeds)": seeds_cell(runs),
                "routing acc %": fmt_mean_std(x.protocols[key.protocol].routing_acc for x in d),
                "routed acc %": fmt_mean_std(x.protocols[key.protocol].acc for x in d),
                "oracle-routed acc %": fmt_mean_std(x.oracle_acc for x in d),
                "newest module share %": fmt_mean_std(x.protocols[key.protocol].newest_module_share for x in d),
                "module cosine sim.": fmt_mean_std((x.module_cosine_similarity for x in d), 3),
                "warning": "; ".join(
                    sorted(
                        {
                            w
                            for r, x in zip(runs, d, strict=True)
                            if (w := protocol_routing_warning(r.record, x, key.protocol))
                        }
                    )
                )
                or "-",
                "runs": run_ids(runs),
            }
        )
    return pd.DataFrame(rows)


def runs_table(coll: Collection) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "run id": r.run_id,
                "strategy": r.variant,
                "benchmark": r.bench_label,
                "backbone": r.backbone_label,
                "weights digest": digest_short(r.record.weights_digest)
                + (" (random init)" if r.weights_label == "random init" else ""),
                "seed": str(r.seed),
                "protocol": ", ".join(r.protocols),
                "git revision": r.git_short,
                "command": r.record.command or "",
            }
            for r in coll.runs
        ]
    )


def skipped_table(coll: Collection) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame([{"path": s.path, "reason": s.reason} for s in coll.skipped], columns=["path", "reason"])


def metric_definitions() -> list[tuple[str, str]]:
    return list(metrics.DEFINITIONS.items())


def provenance_notes(coll: Collection) -> list[str]:
    """Rows whose runs come from several git revisions, or repeat a seed: averaged, but said so."""
    notes = []
    for key, runs in coll.run_groups().items():
        what = f"{key.strategy} on {key.bench} ({key.backbone}, {key.protocols})"
        revs = sorted({r.git_short for r in runs})
        if len(revs) > 1:
            notes.append(f"{what} averages runs made at different git revisions: {', '.join(revs)}")
        seeds = [r.seed for r in runs]
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            notes.append(f"{what} averages repeated runs of seed(s) {', '.join(map(str, repeated))}")
    return notes


def budget_table(curves: Sequence[BudgetCurve]) -> pd.DataFrame:
    """The points of the budget curves (:mod:`clbench.report.budget`)."""
    import pandas as pd

    return pd.DataFrame(budget_table_rows(curves))


INTERVAL_NOTE = (
    "final / avg inc acc: mean over seeds ± half the 95 % interval, printed to one decimal (with 10,000 "
    "bootstrap resamples the half-width moves by about 0.03 points between bootstrap seeds). One seed: "
    "bootstrap over test images resampled within each class. Several seeds: seed level, a t interval over the "
    "seeds (their sd shown) combined with the test-image noise the seeds share (its se shown). A batch-coupled "
    "protocol (reference rows that route, vote or drift per test batch) is resampled by whole test batches as the "
    "protocol formed them (block bootstrap). Rows whose records kept no predictions show the value alone, and the "
    "interval column says why"
)
ECE_NOTE = (
    "ECE is not compared across methods here: methods' logit scales differ (several have mean top-1 confidence "
    "far below their accuracy), so raw ECE ranks the temperature, not calibration. It stays in every record "
    "(ece) and in the report's machine-readable summary (report.json, ece_mean)"
)


# How a pair's interval and p are made, said once (the leaderboard's and the paired table's captions).
PAIRED_NOTE = (
    "one seed shared, the paired bootstrap over test images (10,000 resamples, within classes; by whole test "
    "batches for a reference protocol), its percentile interval and the bootstrap p of the same draws; several "
    "seeds, the seed-level t (per-seed differences plus the shared test-image variance) with the p solved from "
    "the same interval. Either way the interval excludes 0 exactly when the unadjusted p < 0.05."
)


def pairs_intro(model: StudyModel) -> str:
    """The paired table's caption: what a difference is, the one procedure behind its interval and p, the family."""
    return (
        "Final accuracy of A minus B, points, on the same test images and the seeds both rows have, with its 95 % "
        f"interval and the two-sided p of the same procedure: {PAIRED_NOTE} A resampling p at its floor prints as "
        f"'< 1/B' and stays a bound after Holm. Family: {model.family}. 'differ (Holm, 5 %)': the adjusted verdict."
    )


def pairs_frame(model: StudyModel) -> pd.DataFrame:
    """The study's tests (and the pairs of its family that could not be tested), display strings."""
    import pandas as pd

    out = []
    for t in model.tests:
        out.append(
            {
                "A": t.label_a,
                "B": t.label_b,
                "seeds": _seeds_text(t.seeds) + (" (the seeds both rows have)" if t.note else ""),
                "A - B final acc (points) [95 % CI]": f"{t.diff:+.2f} {fmt_range(stats.Interval(t.diff, t.lo, t.hi))}",
                "test": t.method,
                "p": stats.fmt_p(t.p, t.p_bound),
                "p (Holm)": stats.fmt_p(t.p_adj, t.p_adj_bound),
                "differ (Holm, 5 %)": "yes" if t.significant else "no (not significantly different)",
            }
        )
    for r in model.refused:
        out.append(
            {
                "A": r.label_a,
                "B": r.label_b,
                "seeds": "-",
                "A - B final acc (points) [95 % CI]": "-",
                "test": f"not tested: {r.why}",
                "p": "-",
                "p (Holm)": "-",
                "differ (Holm, 5 %)": "-",
            }
        )
    return pd.DataFrame(out)


def pairs_section(model: StudyModel) -> Section | None:
    """The study's paired tests (None: its family has no pair)."""
    if not model.tests and not model.refused:
        return None
    return Section("Paired comparisons", "pairs", pairs_frame(model), intro=pairs_intro(model))


def sections(
    coll: Collection,
    budget: Sequence[BudgetCurve] = (),
    model: StudyModel | None = None,
    predicted: Predicted | None = None,
) -> list[Section]:
    """Every table of a report, in order; ``budget``: the budget curves whose points get a table; ``model``: the
    study (:mod:`clbench.report.study`) whose tests the paired table prints (default: none)."""
    predicted = predicted or Predicted()
    summary = summary_table(coll, predicted)
    protocols = sorted({p for r in coll.runs for p in r.protocols})
    out = [
        Section(
            "Summary",
            "summary",
            summary,
            intro="One row per benchmark x strategy x backbone x protocol; mean over seeds ± half the 95 % interval.",
            notes=[
                *(PROTOCOL_NOTES.get(p, f"{p}: a protocol named by the strategy") for p in protocols),
                INTERVAL_NOTE,
                ECE_NOTE,
                FORGETTING_NOTE,
                COST_NOTE,
                *coll.notes,
                *provenance_notes(coll),
            ],
            definitions=metric_definitions(),
        )
    ]
    pairs = pairs_section(model) if model is not None else None
    if pairs is not None:
        out.append(pairs)
    gap = gap_table(coll)
    if len(gap):
        out.append(
            Section(
                "Reference-protocol gap",
                "protocol-gap",
                gap,
                intro="Reference protocol minus per-sample protocol, in accuracy points, for runs that evaluated both.",
            )
        )
    routing = routing_table(coll)
    if len(routing):
        out.append(
            Section(
                "Routing diagnostics (after the last task)",
                "routing",
                routing,
                intro="Routing accuracy: share of test images sent to their own task's module. Oracle: "
                "accuracy when every image uses its own task's module.",
            )
        )

    if budget:
        out.append(
            Section(
                "Training budget",
                "budget",
                budget_table(budget),
                intro="Final accuracy (main protocol) against the optimizer steps of the whole run, for records "
                "that differ only in their budget (epochs, train_per_class); mean ± sample std over seeds.",
            )
        )
    out.extend(routing_study_sections(coll))
    out.append(Section("Runs", "runs", runs_table(coll), intro="Every run the numbers and figures above come from."))
    out.append(
        Section(
            "Skipped",
            "skipped",
            skipped_table(coll) if coll.skipped else None,
            intro="Folders without a complete record; none of them is averaged in."
            if coll.skipped
            else "No folder was skipped.",
        )
    )
    return out


# ------------------------------------------------------------------------------------------- rendering
def _md_cell(value: Any) -> str:
    return text.markdown(value)


def to_markdown(df: pd.DataFrame, bold: Sequence[int] = ()) -> str:
    """A GitHub Markdown table (no tabulate dependency); numbers are already display strings; rows ``bold`` in bold."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for i, row in enumerate(df.itertuples(index=False)):
        cells = [_md_cell(v) for v in row]
        lines.append("| " + " | ".join(f"**{c}**" if i in bold and c else c for c in cells) + " |")
    return "\n".join(lines)


def to_html(df: pd.DataFrame, bold: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "\n".join(
        ('<tr class="best">' if i in bold else "<tr>")
        + "".join(f"<td>{html.escape(str(v))}</td>" for v in row)
        + "</tr>"
        for i, row in enumerate(df.itertuples(index=False))
    )
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def section_markdown(sec: Section, level: int = 2) -> str:
    parts = [f"{'#' * level} {text.markdown(sec.title)}", ""]
    if sec.intro:
        parts += [text.markdown_prose(sec.intro), ""]
    if sec.table is not None and len(sec.table):
        parts += [to_markdown(sec.table, sec.bold_rows), ""]
    for note in sec.notes:
        parts.append(f"- {text.markdown_prose(note)}")
    if sec.notes:
        parts.append("")
    if sec.definitions:
        parts += ["Metric definitions:", ""]
        parts += [f"- `{term}`: {meaning}" for term, meaning in sec.definitions]  # clbench's own constants
        parts.append("")
    return "\n".join(parts)


def markdown_tables(coll: Collection) -> str:
    """Every table of the report as Markdown (the content the golden-file test compares)."""
    return "\n".join(section_markdown(s) for s in sections(coll)).rstrip() + "\n"


def routing_study_sections(coll: Collection) -> list[Section]:
    """Report sections (one table per study run), for :func:`clbench.report.tables.sections`."""
    # deferred: loads pandas, which importing this module does not
    from clbench.report.routing import study_runs, study_table

    return [
        Section(
            f"Routing study: {r.run_id} ({r.strategy} on {r.record.bench})",
            f"routing-study-{r.run_id}",
            study_table(r),
            intro="Every router evaluated on the same trained modules; accuracy in %, after the last task "
            "(final) and averaged over tasks (avg). Oracle: each image through its own task's module. "
            "Gap closed: (router - run's own router) / (oracle - run's own router), final accuracy.",
        )
        for r in study_runs(coll)
    ]
