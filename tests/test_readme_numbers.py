"""The results tables of README.md and reports/README.md are read from committed records, not typed in.

README.md's results block is generated (``clbench report reports/emoji/runs --study reports/emoji-table.yaml --out
reports/emoji --readme README.md``, :mod:`clbench.report.front`) from the main study of the committed records: this
test builds that study from the records (the same functions, the same resampling seeds) and fails when one
character of the block differs. The tables of reports/README.md name their records here, and each cell (precision,
seeds, final and average incremental accuracy with their 95 % intervals, forgetting, the paired test against
SimpleCIL, added parameters, stored statistics, trainable parameters) must equal what ``clbench compare`` computes
from those records (its study: the main rows of those records and the default family), rounded as printed.

Tables of reports/README.md: ``| strategy, five seeds`` (seeds 1993-1997, class order varied with the seed; class
orders pooled) and the domain-incremental ones (the ``emoji-vendors`` sweep and the ``emoji-domains`` one, seeds
pooled; ``emoji-domains`` at seed 1993 with every method that ran it), in its "Findings" with the prose whose stated
differences are tested below. README.md itself is a front door: at most ``README_MAX_LINES`` lines, with the two
commands of its "Two commands" section exactly as ``.ci/run`` runs them, and every relative link of the three
READMEs resolves."""

from __future__ import annotations

import math
import re
from functools import cache
from pathlib import Path

import pytest

from clbench.records.results import load_record
from clbench.report.build import _versus
from clbench.report.collect import collect
from clbench.report.leaderboard import automatic
from clbench.report.study import build_study
from clbench.report.tables import summary_table
from clbench.report.uncertainty import Predicted

ROOT = Path(__file__).resolve().parent.parent
RUNS = "reports/emoji/runs"
SEEDS = range(1993, 1998)
BASELINE = "simplecil"

# the seed-1993 records of reports/emoji-table.yaml's groups (tests/test_configfile.py checks that the study file
# plans exactly these and the five-seed ones): name -> (record folder, protocol or "router:NAME")
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
    "InfLoRA (reference": (f"{RUNS}/bf16/inflora-reference", "per-sample"),
    "SLCA (reference": (f"{RUNS}/bf16/slca-reference", "per-sample"),
    "CODA-Prompt (reference": (f"{RUNS}/reference/coda_prompt", "per-sample"),
    "HiDe-Prompt (reference": (f"{RUNS}/reference/hide_prompt", "per-sample"),
    "HiDe-Prompt, `reference` protocol": (f"{RUNS}/reference/hide_prompt", "reference"),
    "APER, SSF first session": (f"{RUNS}/reference/aper-ssf", "per-sample"),
    "APER, deep VPT first session": (f"{RUNS}/reference/aper-vpt", "per-sample"),
    "LAE (reference": (f"{RUNS}/reference/lae", "per-sample"),
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
# first words of the row label -> strategy; records: each domain-incremental sweep's, every seed of SEEDS
DOMAIN = {"ACIL": "acil", "SLDA": "slda", "TOSCA (one module": "tosca", "SimpleCIL": "simplecil"}
# table -> (benchmark, the sweep's record folder)
DOMAIN_SWEEPS = {"domain": ("emoji-vendors", "reports/emoji-vendors/runs/runs")}
HEADERS = {
    "five": "| strategy, five seeds",
    "domain": "| strategy | final % | avg inc % | forgetting | task-aware final %",
}
# the file (from the repository root) that holds each table; the prose's stated differences live in PROSE_FILE
TABLE_FILE = {"five": "reports/README.md", "domain": "reports/README.md"}
PROSE_FILE = "reports/README.md"


def table_text(which: str) -> str:
    return (ROOT / TABLE_FILE[which]).read_text()


# seed 1993 of RanPAC's and APER's five is their reference-budget record: the same settings as the sweep's first run,
# made again with this code (which the report's study, choosing the most recent of two such records, uses too)
REMADE_SEED_1993 = {"ranpac": f"{RUNS}/reference/ranpac", "aper": f"{RUNS}/reference/aper"}


def five_seed_folders(strategy: str) -> list[str]:
    folders = [f"{RUNS}/seeds/{strategy}-emoji-s{s}-o{s}" for s in SEEDS]
    return [REMADE_SEED_1993[strategy], *folders[1:]] if strategy in REMADE_SEED_1993 else folders


def table_rows(which: str, text: str | None = None) -> list[list[str]]:
    """The cells of the table whose header starts with ``HEADERS[which]``, in ``text`` (default: its file)."""
    lines = (text if text is not None else table_text(which)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADERS[which]))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def row_key(label: str, rows: dict) -> str:
    keys = [k for k in rows if label.startswith(k)]
    assert len(keys) == 1, f"table row {label!r} matches {keys or 'no entry'}: name its records in this test"
    return keys[0]


@cache
def compare_table(folders: tuple[str, ...], pool: bool, bench: str = "emoji", main: bool = False):
    """``clbench compare``'s summary table with its ``vs simplecil`` column, for these record folders (of ``bench``),
    and each folder's (variant label, backbone label): the columns that name its row. ``main``: the column reads the
    main study's tests (:func:`main_study`, the README's), so that a pair prints one p in both files."""
    coll, selection = automatic(collect([ROOT / f for f in folders], pool).select(bench), BASELINE)
    predicted = Predicted()
    model = main_study() if main else build_study(selection, coll, predicted)
    table = summary_table(coll, predicted)
    table.insert(0, "vs", _versus(table, model))
    names = {str(r.path.resolve()): (r.variant, r.backbone_label) for r in coll.runs}
    return table, names


def table_row(
    folders: tuple[str, ...], pool: bool, folder: str, protocol: str, bench: str = "emoji", main: bool = False
):
    table, names = compare_table(folders, pool, bench, main)
    variant, backbone = names[str((ROOT / folder).resolve())]
    row = table[(table["strategy"] == variant) & (table["backbone"] == backbone) & (table["protocol"] == protocol)]
    assert len(row) == 1, f"{folder}: {len(row)} rows of {variant} / {protocol} in the compare table"
    return row.iloc[0]


def versus_cell(text: str) -> str:
    """The README's short form of the paired-test cell (the reason of a refusal lives in compare.md)."""
    return "n/p" if text.startswith("not tested") else text


def _params(rec) -> list[str]:
    return [f"{rec.params.added_total:,}", f"{rec.params.stored_total:,}", f"{rec.params.trainable:,}"]


def expected_five(label: str) -> list[str]:
    """The row's cells after the label (five-seed table)."""
    strategy, protocol = FIVE_SEEDS[label]
    folders = tuple(f for s in sorted({s for s, _ in FIVE_SEEDS.values()}) for f in five_seed_folders(s))
    r = table_row(folders, True, five_seed_folders(strategy)[0], protocol, main=True)
    recs = [load_record(ROOT / f) for f in five_seed_folders(strategy)]
    return [
        recs[0].precision,
        r["n (seeds)"],
        r["final acc %"],
        r["avg inc acc %"],
        r["final acc sd over seeds"],
        r["final acc image se"],
        versus_cell(r["vs"]),
        *_params(recs[0]),
    ]


def domain_folders(strategy: str, which: str = "domain") -> list[str]:
    bench, runs = DOMAIN_SWEEPS[which]
    return [f"{runs}/{strategy}-{bench}-s{s}" for s in SEEDS]


def expected_domain(label: str, which: str = "domain") -> list[str]:
    """The row's cells after the label (a domain-incremental table: ``clbench sweep``'s summary, seeds pooled)."""
    folders = tuple(f for s in sorted(DOMAIN.values()) for f in domain_folders(s, which))
    coll = collect([ROOT / f for f in folders], True).select(DOMAIN_SWEEPS[which][0])
    table = summary_table(coll, Predicted())
    row = table[table["strategy"] == DOMAIN[label]]
    assert len(row) == 1, f"{label}: {len(row)} rows in the summary table"
    r = row.iloc[0]
    return [
        r["final acc %"],
        r["avg inc acc %"],
        r["forgetting"].split(" (sd")[0],
        r["task-aware final %"].split(" (sd")[0],
    ]


TABLES = {
    "five": (FIVE_SEEDS, expected_five),
    "domain": (DOMAIN, expected_domain),
}


@pytest.mark.parametrize("which", list(TABLES))
def test_every_row_names_its_records_and_every_record_has_a_row(which):
    rows = TABLES[which][0]
    assert sorted(row_key(r[0], rows) for r in table_rows(which)) == sorted(rows)


STUDY = "reports/emoji-table.yaml"


@cache
def main_study():
    """The main study of the committed records, as ``clbench report --study`` builds it."""
    from clbench.cli import build_parser
    from clbench.report.leaderboard import from_study_file

    coll, selection = from_study_file(collect([ROOT / RUNS]), ROOT / STUDY, build_parser)
    return build_study(selection, coll, Predicted())


def test_readme_results_block_is_the_study():
    """README.md's results block is what the generator writes from the committed records: ranked, the winner's
    sentence, every Δ, interval, p and Holm p of the study's one family."""
    from clbench.report.front import readme_block, results_block

    assert readme_block((ROOT / "README.md").read_text(), "emoji-table") == results_block(main_study())


def test_readme_block_check_can_fail():
    """A final accuracy moved by 0.01 in the block, or two rows swapped, is no longer the study's block."""
    from clbench.report.front import BEGIN, END, readme_block, results_block

    block = results_block(main_study())
    first = next(line for line in block.splitlines() if line.startswith("| 2 "))
    value = first.split(" | ")[3].split(" ± ")[0]
    moved = block.replace(first, first.replace(value, f"{float(value) + 0.01:.2f}", 1))
    assert moved != block and readme_block(f"x\n{BEGIN}\n{moved}\n{END}\n") != block


def test_readme_block_is_ranked_and_answers():
    """Ranked best first, one line per method with its seeds, the winner's sentence names its margin over the
    runner-up and over the baseline with their intervals and tests."""
    from clbench.report.front import front_rows

    model = main_study()
    rows = front_rows(model)
    assert [r.final for r in rows] == sorted((r.final for r in rows), reverse=True)
    assert len({r.key.strategy.split(" ")[0] for r in rows}) == len(rows)
    assert all(r.key.protocol == "per-sample" for r in rows)
    block = readme_block_text()
    sentence = block.splitlines()[0]
    assert sentence.startswith(f"**{rows[0].label}** ranks first")
    assert f"runner-up {rows[1].label} is " in sentence and "over the baseline SimpleCIL" in sentence
    assert sentence.count("[") == 2 and sentence.count(", p ") == 2 and sentence.count("Holm") >= 2
    five = [r for r in rows if len(r.seeds) == 5]
    assert {r.key.strategy for r in five} >= {"simplecil", "ranpac", "acil", "dsal", "slda", "fecam", "randumb"}


def readme_block_text() -> str:
    from clbench.report.front import readme_block

    return readme_block((ROOT / "README.md").read_text(), "emoji-table")


@pytest.mark.parametrize("label", list(FIVE_SEEDS))
def test_five_seed_row_equals_its_records(label):
    row = next(r for r in table_rows("five") if row_key(r[0], FIVE_SEEDS) == label)
    assert row[1:] == expected_five(label), f"five-seed row {row[0]!r} differs from its five records"


DOMAIN_STUDY = "reports/emoji-domains.yaml"
DOMAIN_RUNS = ("reports/emoji-domains/cheap-seeds/runs", "reports/emoji-domains/reference-trained/runs")


@cache
def domain_study():
    """The emoji-domains study: both groups of its sweep file in one table, one baseline."""
    from clbench.cli import build_parser
    from clbench.report.leaderboard import from_study_file

    coll, selection = from_study_file(collect([ROOT / f for f in DOMAIN_RUNS]), ROOT / DOMAIN_STUDY, build_parser)
    return build_study(selection, coll, Predicted())


def test_the_domain_incremental_study_is_one_table_with_every_method():
    """reports/README.md's emoji-domains block is the study's (one report, one table, one baseline): every method
    that ran it, the five-seed and the seed-1993 ones, RanPAC and SLDA tested against each other."""
    from clbench.report.front import readme_block, results_block

    model = domain_study()
    assert readme_block((ROOT / PROSE_FILE).read_text(), "emoji-domains") == results_block(model)
    strategies = {r.key.strategy for r in model.rows}
    assert strategies == {"simplecil", "acil", "slda", "tosca", "l2p", "dualprompt", "ranpac"}
    assert model.baseline_strategy == "simplecil" and not model.refused
    assert all(r.key.bench.startswith("emoji-domains 4 domains x 50 classes") for r in model.rows)
    ranpac, slda = (next(r for r in model.rows if r.key.strategy == s) for s in ("ranpac", "slda"))
    t = model.test(ranpac.id, slda.id)
    assert t is not None and t.seeds == (1993,)


@pytest.mark.parametrize("which", list(DOMAIN_SWEEPS))
@pytest.mark.parametrize("label", list(DOMAIN))
def test_domain_row_equals_its_records(which, label):
    row = next(r for r in table_rows(which) if row_key(r[0], DOMAIN) == label)
    got = TABLES[which][1](label)
    assert row[1:] == got, f"domain-incremental row {row[0]!r} ({which}) differs from its five records"


@pytest.mark.parametrize(("which", "label"), [("five", "RanPAC"), ("domain", "TOSCA (one module")])
def test_a_changed_number_is_caught(which, label):
    """The check can fail, in each table: a final accuracy moved by 0.01 in its file's text (RanPAC's five-seed one
    and TOSCA's domain-incremental one in reports/README.md) no longer equals its records."""
    rows, expected = TABLES[which]
    text = table_text(which)
    header = next(line for line in text.splitlines() if line.startswith(HEADERS[which]))
    col = [c.strip() for c in header.strip().strip("|").split("|")].index("final %")
    row = next(r for r in table_rows(which, text) if row_key(r[0], rows) == label)
    line = next(line for line in text.splitlines() if line.startswith(f"| {row[0]} |"))
    value, _, half = row[col].partition(" ± ")
    moved = f"{float(value) + 0.01:.2f} ± {half}"
    changed = text.replace(line, line.replace(f"| {row[col]} |", f"| {moved} |", 1))
    assert changed != text
    moved_row = next(r for r in table_rows(which, changed) if row_key(r[0], rows) == label)
    assert moved_row[1:] != expected(label) and row[1:] == expected(label)


VERSUS = re.compile(
    r"^[+-]\d+\.\d\d \[[+-]\d+\.\d+, [+-]\d+\.\d+\] \((paired (block )?bootstrap over test (images|batches)[^;]*"
    r"|seed-level t over \d seeds \+ shared test-image noise)(; on the \d seeds? both rows have \([\d, -]+\))?; "
    r"p (< )?[\d.e-]+, Holm (< )?[\d.e-]+: (differs|not significantly different)\)$"
)
NO_TEST = {"baseline", "-", "n/p"}


@pytest.mark.parametrize("which", ["five"])
def test_every_versus_cell_has_an_interval_and_a_p(which):
    """Every difference the tables state: value, 95 % interval, its test (which made the interval too), the
    unadjusted and the Holm-corrected p and the verdict."""
    header = next(line for line in table_text(which).splitlines() if line.startswith(HEADERS[which]))
    col = [c.strip() for c in header.strip().strip("|").split("|")].index(VERSUS_HEADER[which])
    cells = [r[col] for r in table_rows(which)]
    assert any(c not in NO_TEST for c in cells)
    for cell in cells:
        assert cell in NO_TEST or VERSUS.match(cell), f"{which}-seed table: {cell!r} lacks its interval or p"
    assert not VERSUS.match("+2.44 (p 0.46, not significantly different)")  # the old form fails
    old = "+2.44 [-0.3, +5.1] (exact McNemar p 0.46 Holm, not significantly different)"  # a test beside another's CI
    assert not VERSUS.match(old)


VERSUS_HEADER = {
    "five": "vs SimpleCIL (final, points, 95 % interval; its test, p, Holm)",
}


def rewrite(text: str, tables: tuple[str, ...] = tuple(TABLES)) -> str:
    """``text`` with every cell after the label of the named tables recomputed from the records: how the tables are
    written. A new row is added by naming its records above and writing its label with any cells."""
    lines = text.splitlines(keepends=True)
    for which in tables:
        rows, expected = TABLES[which]
        start = next(i for i, line in enumerate(lines) if line.startswith(HEADERS[which]))
        i = start + 2
        while i < len(lines) and lines[i].startswith("|"):
            label = lines[i].strip().strip("|").split("|")[0].strip()
            lines[i] = "| " + " | ".join([label, *expected(row_key(label, rows))]) + " |\n"
            i += 1
    return "".join(lines)


if __name__ == "__main__":  # python tests/test_readme_numbers.py: rewrite reports/README.md's tables from the records
    for name in sorted(set(TABLE_FILE.values())):
        path = ROOT / name
        path.write_text(rewrite(path.read_text(), tuple(w for w, f in TABLE_FILE.items() if f == name)))


# ------------------------------------------------------------------------------------------- the prose's tests
# Each difference the prose states beyond the tables, with its test: (A folders, A protocol, B folders, B protocol,
# metric). Same runs and images on both sides; several folders: one per seed of SEEDS, in order.
PROSE = {
    "TOSCA vs SimpleCIL, seed 1993": (
        [f"{RUNS}/seeds/tosca-emoji-s1993-o1993"],
        "per-sample",
        [f"{RUNS}/seeds/simplecil-emoji-s1993-o1993"],
        "per-sample",
        "final",
    ),
    "APER vs SimpleCIL, seed 1993": (
        [f"{RUNS}/reference/aper"],
        "per-sample",
        [f"{RUNS}/seeds/simplecil-emoji-s1993-o1993"],
        "per-sample",
        "final",
    ),
    "TOSCA reference vs per-sample, seed 1993": (
        [f"{RUNS}/seeds/tosca-emoji-s1993-o1993"],
        "reference",
        [f"{RUNS}/seeds/tosca-emoji-s1993-o1993"],
        "per-sample",
        "final",
    ),
    "TOSCA reference vs per-sample, five seeds": (
        five_seed_folders("tosca"),
        "reference",
        five_seed_folders("tosca"),
        "per-sample",
        "final",
    ),
    "RanPAC 2,100 steps vs 140": (
        [f"{RUNS}/budget/ranpac-e300"],
        "per-sample",
        [f"{RUNS}/reference/ranpac"],
        "per-sample",
        "final",
    ),
    "MOS reference vs per-sample": (
        [f"{RUNS}/reference/mos"],
        "reference",
        [f"{RUNS}/reference/mos"],
        "per-sample",
        "final",
    ),
    "DualPrompt reference vs per-sample": (
        [f"{RUNS}/reference/dualprompt"],
        "reference",
        [f"{RUNS}/reference/dualprompt"],
        "per-sample",
        "final",
    ),
    "EASE vs SimpleCIL, average incremental accuracy": (
        [f"{RUNS}/reference/ease"],
        "per-sample",
        [f"{RUNS}/seeds/simplecil-emoji-s1993-o1993"],
        "per-sample",
        "avg",
    ),
    "DualPrompt 5 vs 1 epochs per task (EPYC)": (
        [f"{RUNS}/budget/dualprompt-e5"],
        "per-sample",
        [f"{RUNS}/budget/dualprompt-e1"],
        "per-sample",
        "final",
    ),
    "InfLoRA bf16 vs fp32 (same Xeon)": (
        [f"{RUNS}/bf16/inflora-reference"],
        "per-sample",
        [f"{RUNS}/reference/inflora"],
        "per-sample",
        "final",
    ),
    "SLCA bf16 vs fp32 (same Xeon)": (
        [f"{RUNS}/bf16/slca-reference"],
        "per-sample",
        [f"{RUNS}/reference/slca"],
        "per-sample",
        "final",
    ),
    "L2P 10 vs 5 epochs per task (EPYC)": (
        [f"{RUNS}/budget/l2p-e10"],
        "per-sample",
        [f"{RUNS}/budget/l2p-e5"],
        "per-sample",
        "final",
    ),
}


def prose_test(name: str) -> str:
    """``+6.39 [-x, +y] (test p z)``: the difference A - B in points, its 95 % interval and p, as the prose prints
    it. One seed, final accuracy: exact McNemar (a batch-coupled side: paired block bootstrap over test batches);
    average incremental accuracy: paired bootstrap over images; several seeds: the seed-level test."""
    import numpy as np

    from clbench.evaluation import stats
    from clbench.report.uncertainty import batch_blocks, batch_size, fmt_range, p_cell

    a_folders, a_protocol, b_folders, b_protocol, metric = PROSE[name]
    coll_a = collect([ROOT / f for f in a_folders], True)
    coll_b = collect([ROOT / f for f in b_folders], True)
    predicted = Predicted()
    runs_a = sorted(coll_a.seeded(), key=lambda r: r.seed)
    runs_b = sorted(coll_b.seeded(), key=lambda r: r.seed)
    a, b, blocks = [], [], []
    strata = None
    for ra, rb in zip(runs_a, runs_b, strict=True):
        da, db = predicted.aligned(ra, a_protocol), predicted.aligned(rb, b_protocol)
        assert da is not None and db is not None and np.array_equal(da[1], db[1])
        col = -1 if metric == "final" else slice(None)
        a.append(stats.with_average(da[0])[:, -1] if metric == "avg" else da[0][:, col])
        b.append(stats.with_average(db[0])[:, -1] if metric == "avg" else db[0][:, col])
        sizes = [x for x in (batch_size(ra, a_protocol), batch_size(rb, b_protocol)) if x is not None]
        blocks.append(batch_blocks(da[1], da[2], math.lcm(*sizes)) if sizes else None)
        strata = da[2] if strata is None else strata
    assert strata is not None
    if len(a) > 1:
        ids = [x for x in blocks if x is not None]
        t = stats.paired_seed_test(np.stack(a), np.stack(b), strata, ids or None)
    elif metric == "avg":  # per image: its share of avg_acc (stats.with_average); no McNemar for a mean of tasks
        d = (np.stack(a) - np.stack(b))[0]
        draws = stats.bootstrap_means(d, strata, blocks=blocks[0])[:, 0]
        p = float(stats.bootstrap_p(np.array(d.mean()), draws[:, None])[0])
        diff = stats.percentile_interval(float(d.mean()), draws).scaled(100)
        t = stats.PairedTest(diff, p, "paired bootstrap over images", p <= stats.p_floor(stats.N_RESAMPLES))
    else:
        t = stats.paired_test(np.stack(a), np.stack(b), strata, blocks=blocks[0])
    return f"{t.diff.value:+.2f} {fmt_range(t.diff)} ({t.test} p {p_cell(t.p, t.at_floor)})"


@pytest.mark.parametrize("name", list(PROSE))
def test_the_prose_states_each_difference_with_its_test(name):
    assert prose_test(name) in (ROOT / PROSE_FILE).read_text().replace("\n  ", " "), name


# ------------------------------------------------------------------------------------------- README.md: the front door
README_MAX_LINES = 160
# the "Two commands" section's two commands, exactly: set-up and the main job, then the tests (.ci/run runs both)
TWO_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/clbench run --strategy simplecil",
    ".venv/bin/python -m pytest",
)


def two_commands(text: str) -> list[str]:
    """The contents of the fenced blocks of ``text``'s one "## Two commands" section, up to the next ``## ``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "## Two commands"]
    assert len(starts) == 1, f"{len(starts)} '## Two commands' sections"
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks, block = [], None
    for line in lines[starts[0] + 1 : end]:
        if line.startswith("```"):
            if block is None:
                block = []
            else:
                blocks.append("\n".join(block))
                block = None
        elif block is not None:
            block.append(line)
    assert block is None, "a fenced block of the section is not closed"
    return blocks


def test_readme_is_a_front_door():
    """README.md has at most README_MAX_LINES lines, its "Two commands" section holds exactly the two commands, the
    study's generated results block is in it and the findings' table and prose are not (they live in
    reports/README.md)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md: {len(text.splitlines())} lines"
    assert two_commands(text) == list(TWO_COMMANDS)
    assert readme_block_text() and not any(line.startswith(HEADERS["five"]) for line in text.splitlines())
    assert "reports/emoji/index.html" in text and "(reports/README.md)" in text
    ci = (ROOT / ".ci/run").read_text()
    assert all(part in ci for part in (".venv/bin/pip install -q -e '.[test]'", ".venv/bin/python -m pytest"))


def test_the_two_commands_check_can_fail():
    text = (ROOT / "README.md").read_text()
    assert two_commands(text.replace(TWO_COMMANDS[1], f"{TWO_COMMANDS[1]} -n 0")) != list(TWO_COMMANDS)
    extra = text.replace("Run the tests:", "Lint:\n\n```bash\n.venv/bin/ruff check .\n```\n\nRun the tests:", 1)
    assert two_commands(extra) != list(TWO_COMMANDS)


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("name", ["README.md", "reports/README.md", "clbench/README.md"])
def test_relative_links_resolve(name):
    """Every relative link of the READMEs (images included) names a file or folder that exists."""
    path = ROOT / name
    targets = [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:|#", t)]
    assert targets
    missing = [t for t in targets if not (path.parent / t.split("#")[0]).exists()]
    assert not missing, f"{name}: links to {missing}"


@pytest.mark.full  # compare over the 119 committed records, with its figures: about a minute on 2 cores
def test_compare_with_the_study_file_prints_the_studys_tests(tmp_path):
    """`clbench compare --study` reads the same study as the report and the README: the same tests, bit for bit."""
    import json

    from clbench.cli import main

    argv = ["compare", str(ROOT / RUNS), "--bench", "emoji", "--study", str(ROOT / STUDY), "--out", str(tmp_path)]
    assert main(argv) == 0
    got = json.loads((tmp_path / "compare.json").read_text())
    want = main_study().to_dict()
    assert got["family"] == want["family"] and len(got["tests"]) == len(want["tests"]) > 0
    for a, b in zip(got["tests"], want["tests"], strict=True):
        assert a == json.loads(json.dumps(b)), a["label_a"]
