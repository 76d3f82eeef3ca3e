"""The report page (issue 56): numbers never wrap (a wide table scrolls in its own box), provenance folds into a key
table instead of filling captions, and the page's own image check does not call a lazily loaded figure broken.

The browser checks open a page in headless Chromium at 1,400 px and read what the page's script measured
(``<body data-wrapped-numbers data-tallest-row data-broken-images>``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_report_leaderboard import study_report as study_report  # the full-tier fixture, shared

from clbench.report.figure_base import FigureOut
from clbench.report.html import mark_numbers, render_html, render_markdown, split_provenance
from clbench.report.tables import Section

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); the headless-browser checks need it",
)
PROV = "Runs: ranpac-s1993, ranpac-s1994, fecam-s1993. Git: 1234abcd, 99887766. Backbone weights: 4d4897b0fc05."


def body_facts(index: Path, tmp: Path, width: int = 1400) -> dict[str, str]:
    """What the page's script wrote on ``<body>``, at a ``width`` px wide window."""
    assert CHROMIUM is not None
    res = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            f"--window-size={width},900",
            "--virtual-time-budget=5000",
            "--dump-dom",
            index.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body([^>]*)>", res.stdout)
    assert body, res.stderr[-2000:]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))


def wide_table(rows: int = 6) -> pd.DataFrame:
    """A leaderboard-like table wider than the page: intervals, counts with units, p-values, a long text column."""
    return pd.DataFrame(
        {
            "method": [f"Method {i}" for i in range(rows)],
            **{f"final acc % ± CI, setting {j}": [f"{42.57 + i:.2f} ± 1.9{j}" for i in range(rows)] for j in range(9)},
            "added / stored": [f"2,60{i} / 1 MB" for i in range(rows)],
            "vs best": [f"{-1.68 - i:+.2f} [{-2.8 - i:+.1f}, {-0.5 - i:+.1f}]" for i in range(rows)],
            "Holm p": ["6.4e-49"] * rows,
            "records": [", ".join(f"reports/emoji/runs/bf16/method-{i}-s{s}" for s in range(5)) for i in range(rows)],
        }
    )


def _png(path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    fig.subplots().plot([0, 1], [0, 1])
    fig.savefig(path, format="png", dpi=60)


def page(folder: Path, figures: int = 0, missing: int = 0) -> Path:
    """A report page with :func:`wide_table` first and ``figures`` figures after it (``missing`` of them absent)."""
    (folder / "figures").mkdir(parents=True, exist_ok=True)
    figs = []
    for i in range(figures):
        rel = f"figures/fig{i}.png"
        if i >= missing:
            _png(folder / rel)
        figs.append(FigureOut(f"fig{i}", f"Figure {i}", f"Figure {i}: a line. {PROV}", [], {"png": rel}))
    secs = [Section("Leaderboard", "leaderboard", wide_table(), notes=[f"The caption. {PROV}"])]
    index = folder / "index.html"
    index.write_text(render_html("t", "meta", secs, figs, []))
    return index


# ------------------------------------------------------------------------------------------- without a browser
def test_numeric_cells_are_marked_and_text_cells_are_not():
    table = (
        "<table><tbody><tr><td>42.5 ± 1.9</td><td>2,601 / 1 MB</td><td>+1.68 [+0.5, +2.8]</td><td>6.4e-49</td>"
        "<td>12 min</td><td>RanPAC</td><td>reports/emoji/runs/x</td><td>not paired</td></tr></tbody></table>"
    )
    marked = mark_numbers(table)
    assert marked.count('<td class="num">') == 5
    assert "<td>RanPAC</td>" in marked and "<td>not paired</td>" in marked


def test_provenance_leaves_captions_for_a_folded_key_table(tmp_path):
    caption, prov = split_provenance(f"Accuracy after each task: lines are means. {PROV}")
    assert caption == "Accuracy after each task: lines are means."
    assert prov == {
        "runs": "ranpac-s1993, ranpac-s1994, fecam-s1993",
        "git revisions": "1234abcd, 99887766",
        "backbone weights": "4d4897b0fc05",
    }
    text = page(tmp_path, figures=1).read_text()
    figcaption = re.search(r"<figcaption>(.*?)</figcaption>", text, re.S)
    assert figcaption and "Runs:" not in figcaption.group(1) and "ranpac-s1993" not in figcaption.group(1)
    assert re.search(r'<details class="provenance"><summary>Provenance: 3 runs.*?ranpac-s1994', text, re.S)
    notes = re.search(r'<ul class="notes">(.*?)</ul>', text, re.S)
    assert notes and "Git:" not in notes.group(1)
    fig = FigureOut("f", "F", f"F: a line. {PROV}", [], {"png": "figures/f.png"})
    md = render_markdown("t", "meta", [], [fig], [])
    assert "**Figure 1.** F: a line.\n" in md and "<details><summary>Provenance</summary>" in md


# ------------------------------------------------------------------------------------------- in a browser
@needs_chromium
def test_numbers_never_wrap_at_1400_px_and_the_wide_table_scrolls_in_its_box(tmp_path):
    facts = body_facts(page(tmp_path), tmp_path)
    assert facts["wrapped-numbers"] == "0", facts
    assert int(facts["tallest-row"]) < 120, facts  # the records cell may wrap; a row is never ~450 px tall
    assert int(facts["scroll-width"]) <= 1400, facts  # the page keeps its width: the table scrolls in its box


@needs_chromium
def test_the_wrap_measurement_sees_a_number_squeezed_into_two_lines(tmp_path):
    """The page's measurement itself: in a 380 px window the nowrap cells still hold; forced to wrap (the old
    ``overflow-wrap: anywhere`` without ``nowrap``), they are counted."""
    index = page(tmp_path)
    squeezed = index.read_text().replace("td.num { white-space: nowrap;", "td.num { overflow-wrap: anywhere;")
    squeezed = squeezed.replace('<div class="scroll">', '<div style="width: 380px">')
    index.write_text(squeezed)
    facts = body_facts(index, tmp_path)
    assert int(facts["wrapped-numbers"]) > 0, facts


@needs_chromium
def test_lazily_loaded_figures_below_the_fold_are_not_reported_broken(tmp_path):
    facts = body_facts(page(tmp_path, figures=10), tmp_path)
    assert facts["image-count"] == "10", facts
    assert facts["broken-images"] == "0", facts


@needs_chromium
def test_a_missing_figure_below_the_fold_is_still_reported_broken(tmp_path):
    facts = body_facts(page(tmp_path, figures=10, missing=1), tmp_path)
    assert facts["broken-images"] == "1" and facts["broken-sources"] == "figures/fig0.png", facts


@pytest.fixture(scope="module")
def crowded_report(tmp_path_factory) -> Path:
    """The whole report of tests/test_report_figures.py's crowded fixture study (eleven methods, long tables)."""
    from test_report_figures import crowded_runs

    from clbench.report.build import write_report
    from clbench.report.collect import collect

    base = tmp_path_factory.mktemp("crowded-page")
    write_report(collect([crowded_runs(base / "runs")]), base / "report", with_tsne=False)
    return base / "report"


@needs_chromium
def test_a_reports_page_has_no_wrapped_number_at_1400_px(crowded_report, tmp_path):
    facts = body_facts(crowded_report / "index.html", tmp_path)
    assert facts["wrapped-numbers"] == "0", facts
    assert int(facts["tallest-row"]) < 150, facts
    assert facts["broken-images"] == "0" and int(facts["image-count"]) >= 5, facts
    assert int(facts["scroll-width"]) <= 1400, facts


@pytest.mark.full  # the committed study's report: minutes
@needs_chromium
def test_the_committed_studys_page_has_no_wrapped_number_at_1400_px(study_report, tmp_path):  # noqa: F811
    facts = body_facts(study_report[0] / "index.html", tmp_path)
    assert facts["wrapped-numbers"] == "0", facts
    assert facts["broken-images"] == "0", facts
