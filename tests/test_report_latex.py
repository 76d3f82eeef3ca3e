"""The leaderboard as LaTeX for a paper (issue 56): ranked, display names, the best in bold, the packages it needs
named, and it fits ``\\textwidth`` at 9 pt without ``\\resizebox``: compiled with pdflatex in an ``article`` (the
``table*`` variant in a two-column one), the log holds no overfull box.

The board mirrors the committed study's leaderboard (reports/emoji/tables/leaderboard.csv): its columns and its
widest cells (the longest method names, five-digit seconds, eight-digit parameter counts, intervals of differences).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from clbench.report.latex import PACKAGES, leaderboard_latex
from clbench.report.leaderboard import Board

PDFLATEX = shutil.which("pdflatex")
needs_pdflatex = pytest.mark.skipif(
    PDFLATEX is None, reason="pdflatex is not installed (Debian: apt-get install texlive-latex-recommended)"
)
VERSUS = "Δ final vs SimpleCIL [95 % CI], Holm p"
ROWS = [  # method, seeds, final, avg, forgetting, added, train s, versus, significant
    ("RanPAC", 5, "58.98 ± 2.0", "64.99 ± 4.5", "9.34", "955,200", "292.6", "+30.21 [+27.4, +33.0], p 1e-07", True),
    ("DS-AL", 5, "57.30 ± 2.0", "64.18 ± 4.4", "11.18", "589,824", "80.0", "+28.54 [+25.7, +31.3], p 3.3e-07", True),
    ("MOS, reference protocol", 1, "55.31 ± 11.4", "60.06 ± 10.8", "15.79", "927,396", "1,445.4", "-", None),
    ("HiDe-Prompt:reference, reference protocol", 1, "51.38 ± 9.4", "59.76 ± 9.7", "17.42", "734,664", "5,074.9", "-",
     None),
    ("SimpleCIL", 5, "28.77 ± 2.5", "40.16 ± 5.9", "11.55", "0", "0.1", "baseline", None),
    ("TOSCA", 5, "28.66 ± 4.1", "44.18 ± 4.1", "19.59", "242,065", "20.3", "-0.11 [-4.5, +4.3], p 1", False),
    ("SLCA:reference", 1, "22.19 ± 2.1", "42.96 ± 1.6", "62.85", "21,568,932", "2,072.0", "not paired", None),
    ("CODA-Prompt:reference-6tasks", 1, "14.33 ± 1.8", "34.18 ± 2.1", "27.18", "1,857,060", "2,548.8", "not paired",
     None),
]  # fmt: skip


def board() -> Board:
    table = pd.DataFrame(
        {
            "rank": [str(i + 1) for i in range(len(ROWS))],
            "method": [r[0] for r in ROWS],
            "seeds": [str(r[1]) for r in ROWS],
            "final acc % ± CI": [r[2] for r in ROWS],
            "avg inc acc % ± CI": [r[3] for r in ROWS],
            "forgetting": [r[4] for r in ROWS],
            "added params": [r[5] for r in ROWS],
            "train s": [r[6] for r in ROWS],
            VERSUS: [r[7] for r in ROWS],
            "differs from best": ["best"] + ["yes"] * (len(ROWS) - 1),
            "warnings": ["training warning (3 of 5 records)"] + ["-"] * (len(ROWS) - 1),
        }
    )
    caption = "Main table (study file emoji-table.yaml) on emoji B0 Inc6 (class orders pooled): one row per method."
    return Board(table, [], caption, [], VERSUS, None, [float(r[2].split()[0]) for r in ROWS], [r[8] for r in ROWS])


def overfull(tex: str, tmp: Path, options: str = "10pt") -> list[str]:
    """Compile ``tex`` in an ``article`` (``options``) with booktabs; the log's overfull and underfull hbox lines."""
    assert PDFLATEX is not None
    (tmp / "table.tex").write_text(tex)
    doc = tmp / "doc.tex"
    doc.write_text(
        f"\\documentclass[{options}]{{article}}\n\\usepackage{{booktabs}}\n\\begin{{document}}\n"
        "\\input{table.tex}\nSome text.\n\\end{document}\n"
    )
    res = subprocess.run(
        [PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", doc.name],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (tmp / "doc.log").read_text(errors="replace")
    assert res.returncode == 0, log[-3000:]
    return [line for line in log.splitlines() if line.startswith("Overfull \\hbox")]


def test_paper_table_is_ranked_with_display_names_the_best_in_bold_and_names_its_packages():
    tex = leaderboard_latex(board())
    assert tex.splitlines()[0] == PACKAGES.rstrip() and "booktabs" in tex.splitlines()[0]
    assert "\\resizebox" not in tex and "±" not in tex
    body = tex.split("\\midrule")[1].split("\\bottomrule")[0].strip().splitlines()
    assert body[0].startswith("\\textbf{1} & \\textbf{RanPAC$^{\\dagger}$}")
    assert [line.split(" & ")[0] for line in body[1:]] == [str(i + 2) for i in range(len(ROWS) - 1)]
    assert "MOS (ref.)" in tex and "HiDe-Prompt:ref. (ref.)" in tex  # abbreviated, the caption says so
    assert "(ref.): the reference protocol" in tex


def test_wide_variant_is_a_table_star_with_the_cost_columns():
    tex = leaderboard_latex(board(), wide=True)
    assert "\\begin{table*}" in tex and "\\end{table*}" in tex
    assert "Forg." in tex and "21.6M" in tex and "5,075" in tex and "+30.2 [27.4, 33.0]" in tex
    assert "+30.2 [" not in leaderboard_latex(board())  # the narrow table keeps the difference only


@needs_pdflatex
def test_paper_table_fits_the_text_width_of_an_article(tmp_path):
    assert not overfull(leaderboard_latex(board()), tmp_path)


@needs_pdflatex
def test_wide_paper_table_fits_a_two_column_pages_text_width(tmp_path):
    assert not overfull(leaderboard_latex(board(), wide=True), tmp_path, "10pt,twocolumn")


@needs_pdflatex
def test_the_overfull_check_sees_a_table_too_wide(tmp_path):
    """Every column of the board as the report prints it (display strings, no abbreviations): too wide."""
    from clbench.report.latex import table_latex

    tex = table_latex(board().table, "Leaderboard").replace("\\resizebox{\\textwidth}{!}{%", "")
    tex = tex.replace("\\end{tabular}}", "\\end{tabular}")
    assert overfull(tex, tmp_path)
