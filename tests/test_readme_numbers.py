"""The README's results tables are read from committed records, not typed in: every row names its records here, and
each cell (precision, seeds, final and average incremental accuracy with their 95 % intervals, forgetting, the
paired test against SimpleCIL, added parameters, stored statistics, trainable parameters) must equal what
``clbench compare`` computes from those records (the same functions, the same resampling seeds), rounded as printed.
A re-run record that moves a number fails this test until the README follows.

Two tables: ``| strategy (budget)`` (seed 1993, every method; one compare over all its records, so the Holm
correction covers all its pairs) and ``| strategy, five seeds`` (seeds 1993-1997, class order varied with the
seed; class orders pooled)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from clbench.report.build import _versus
from clbench.report.collect import collect
from clbench.report.tables import summary_table
from clbench.report.uncertainty import Predicted, paired_rows
from clbench.results import load_record

ROOT = Path(__file__).resolve().parent.parent
RUNS = "reports/emoji/runs"
SEEDS = range(1993, 1998)
BASELINE = "simplecil"

# first words of the row label -> (record folder, protocol or "router:NAME")
ONE_SEED = {
    "SimpleCIL": (f"{RUNS}/seeds/simplecil-emoji-s1993-o1993", "per-sample"),
    "TOSCA (per-sample": (f"{RUNS}/seeds/tosca-emoji-s1993-o1993", "per-sample"),
    "TOSCA, `reference` protocol": (f"{RUNS}/seeds/tosca-emoji-s1993-o1993", "reference"),
    "TOSCA, `--set router=mahalanobis-task`": ("reports/routing/emoji/tosca-l1-5e-4", "router:mahalanobis-task"),
    "RanPAC (reference": (f"{RUNS}/reference/ranpac", "per-sample"),
    "RanPAC at the reference's step count": (f"{RUNS}/budget/ranpac-e300", "per-sample"),
    "RanPAC, no first-session": (f"{RUNS}/fp32/ranpac-quick-no-phase1", "per-sample"),
    "APER (reference": (f"{RUNS}/reference/aper", "per-sample"),
    "APER at the reference's step count": (f"{RUNS}/budget/aper-e300", "per-sample"),
    "MOS (reference": (f"{RUNS}/reference/mos", "per-sample"),
    "MOS, `reference` protocol": (f"{RUNS}/reference/mos", "reference"),
    "EASE (reference": (f"{RUNS}/reference/ease", "per-sample"),
    "L2P (reference": (f"{RUNS}/reference/l2p", "per-sample"),
    "DualPrompt (reference": (f"{RUNS}/reference/dualprompt", "per-sample"),
    "DualPrompt, `reference` protocol": (f"{RUNS}/reference/dualprompt", "reference"),
    "FeCAM": (f"{RUNS}/seeds/fecam-emoji-s1993-o1993", "per-sample"),
    "SLDA": (f"{RUNS}/seeds/slda-emoji-s1993-o1993", "per-sample"),
    "RanDumb": (f"{RUNS}/seeds/randumb-emoji-s1993-o1993", "per-sample"),
    "ACIL": (f"{RUNS}/seeds/acil-emoji-s1993-o1993", "per-sample"),
    "DS-AL": (f"{RUNS}/seeds/dsal-emoji-s1993-o1993", "per-sample"),
}
# first words of the row label -> (strategy, protocol); records: every seed of SEEDS
FIVE_SEEDS = {
    "SimpleCIL": ("simplecil", "per-sample"),
    "TOSCA (per-sample": ("tosca", "per-sample"),
    "TOSCA, `reference` protocol": ("tosca", "reference"),
    "RanPAC": ("ranpac", "per-sample"),
    "APER": ("aper", "per-sample"),
    "FeCAM": ("fecam", "per-sample"),
    "SLDA": ("slda", "per-sample"),
    "RanDumb": ("randumb", "per-sample"),
    "ACIL": ("acil", "per-sample"),
    "DS-AL": ("dsal", "per-sample"),
}
HEADERS = {"one": "| strategy (budget)", "five": "| strategy, five seeds"}


def five_seed_folders(strategy: str) -> list[str]:
    return [f"{RUNS}/seeds/{strategy}-emoji-s{s}-o{s}" for s in SEEDS]


def table_rows(which: str, text: str | None = None) -> list[list[str]]:
    """The cells of the README table whose header starts with ``HEADERS[which]``."""
    lines = (text if text is not None else (ROOT / "README.md").read_text()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADERS[which]))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def row_key(label: str, rows: dict) -> str:
    keys = [k for k in rows if label.startswith(k)]
    assert len(keys) == 1, f"README row {label!r} matches {keys or 'no entry'}: name its records in this test"
    return keys[0]


@cache
def compare_table(folders: tuple[str, ...], pool: bool):
    """``clbench compare``'s summary table with its ``vs simplecil`` column, for these record folders, and each
    folder's (variant label, backbone label): the columns that name its row."""
    coll = collect([ROOT / f for f in folders], pool).select("emoji")
    predicted = Predicted()
    pairs = paired_rows(coll, predicted, BASELINE)
    table = summary_table(coll, predicted)
    table.insert(0, "vs", _versus(table, pairs))
    names = {str(r.path.resolve()): (r.variant, r.backbone_label) for r in coll.runs}
    return table, names


def table_row(folders: tuple[str, ...], pool: bool, folder: str, protocol: str):
    table, names = compare_table(folders, pool)
    variant, backbone = names[str((ROOT / folder).resolve())]
    row = table[(table["strategy"] == variant) & (table["backbone"] == backbone) & (table["protocol"] == protocol)]
    assert len(row) == 1, f"{folder}: {len(row)} rows of {variant} / {protocol} in the compare table"
    return row.iloc[0]


def versus_cell(text: str) -> str:
    """The README's short form of the paired-test cell (the reason of a refusal lives in compare.md)."""
    return "n/p" if text.startswith("not paired") else text


def _params(rec) -> list[str]:
    return [f"{rec.params.added_total:,}", f"{rec.params.stored_total:,}", f"{rec.params.trainable:,}"]


def expected_one(label: str) -> list[str]:
    """The row's cells after the label, as the README prints them (seed-1993 table)."""
    folder, what = ONE_SEED[label]
    rec = load_record(ROOT / folder)
    if what.startswith("router:"):  # one trained run evaluated by every router: no separate record to pair
        curve = [float(t.diagnostics["routers"][what[7:]]["acc"]) for t in rec.per_task]
        final, avg = f"{curve[-1]:.2f}", f"{sum(curve) / len(curve):.2f}"
        return [rec.precision, final, avg, "", "n/p", *_params(rec)]
    folders = tuple(sorted({f for f, w in ONE_SEED.values() if not w.startswith("router:")}))
    r = table_row(folders, False, folder, what)
    forgetting = rec.summary(what).forgetting
    return [
        rec.precision,
        r["final acc %"],
        r["avg inc acc %"],
        "" if forgetting is None else f"{forgetting:.2f}",
        versus_cell(r["vs"]),
        *_params(rec),
    ]


def expected_five(label: str) -> list[str]:
    """The row's cells after the label (five-seed table)."""
    strategy, protocol = FIVE_SEEDS[label]
    folders = tuple(f for s in sorted({s for s, _ in FIVE_SEEDS.values()}) for f in five_seed_folders(s))
    r = table_row(folders, True, five_seed_folders(strategy)[0], protocol)
    recs = [load_record(ROOT / f) for f in five_seed_folders(strategy)]
    return [
        recs[0].precision,
        r["n (seeds)"],
        r["final acc %"],
        r["avg inc acc %"],
        r["final acc sd over seeds"],
        versus_cell(r["vs"]),
        *_params(recs[0]),
    ]


def test_every_row_names_its_records_and_every_record_has_a_row():
    assert sorted(row_key(r[0], ONE_SEED) for r in table_rows("one")) == sorted(ONE_SEED)
    assert sorted(row_key(r[0], FIVE_SEEDS) for r in table_rows("five")) == sorted(FIVE_SEEDS)


@pytest.mark.parametrize("label", list(ONE_SEED))
def test_one_seed_row_equals_its_record(label):
    row = next(r for r in table_rows("one") if row_key(r[0], ONE_SEED) == label)
    assert row[1:] == expected_one(label), f"README row {row[0]!r} differs from {ONE_SEED[label][0]}"


@pytest.mark.parametrize("label", list(FIVE_SEEDS))
def test_five_seed_row_equals_its_records(label):
    row = next(r for r in table_rows("five") if row_key(r[0], FIVE_SEEDS) == label)
    assert row[1:] == expected_five(label), f"README row {row[0]!r} differs from its five records"


def test_a_changed_number_is_caught():
    """The check can fail: APER's final accuracy moved by 0.01 in the README text no longer equals its record."""
    text = (ROOT / "README.md").read_text()
    row = next(r for r in table_rows("one", text) if row_key(r[0], ONE_SEED) == "APER (reference")
    line = next(line for line in text.splitlines() if line.startswith(f"| {row[0]} |"))
    value, _, half = row[2].partition(" ± ")
    moved = f"{float(value) + 0.01:.2f} ± {half}"
    changed = text.replace(line, line.replace(f"| {row[2]} |", f"| {moved} |", 1))
    aper = next(r for r in table_rows("one", changed) if row_key(r[0], ONE_SEED) == "APER (reference")
    assert aper[1:] != expected_one("APER (reference") and row[1:] == expected_one("APER (reference")


def rewrite(text: str) -> str:
    """``text`` (the README) with every cell after the label of both tables recomputed from the records: how the
    tables are written. A new row is added by naming its records above and writing its label with any cells."""
    lines = text.splitlines(keepends=True)
    for which, rows, expected in (("one", ONE_SEED, expected_one), ("five", FIVE_SEEDS, expected_five)):
        start = next(i for i, line in enumerate(lines) if line.startswith(HEADERS[which]))
        i = start + 2
        while i < len(lines) and lines[i].startswith("|"):
            label = lines[i].strip().strip("|").split("|")[0].strip()
            lines[i] = "| " + " | ".join([label, *expected(row_key(label, rows))]) + " |\n"
            i += 1
    return "".join(lines)


if __name__ == "__main__":  # python tests/test_readme_numbers.py: rewrite the README's tables from their records
    readme = ROOT / "README.md"
    readme.write_text(rewrite(readme.read_text()))
