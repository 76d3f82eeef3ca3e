"""Report tables as LaTeX for a paper: booktabs rules, ``$\\pm$`` for intervals, the leaderboard's best row in
bold and a marker on the rows that differ significantly from the baseline (Holm-adjusted p < 0.05).

No jinja2 (pandas' ``Styler.to_latex`` needs it): the tables are display strings already, escaped here once
(:func:`clbench.files.escape.latex`). The output needs ``\\usepackage{booktabs}`` (Debian: texlive-latex-base ships it,
in texlive-latex-recommended's ``booktabs.sty``); a wide table is wrapped in ``\\resizebox`` (graphicx).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from clbench.files import escape as text

if TYPE_CHECKING:
    import pandas as pd

    from clbench.report.leaderboard import Board

SIGNIFICANT = r"$^{\dagger}$"  # the leaderboard's marker: differs from the baseline (Holm-adjusted p < 0.05)


def cell(value: object) -> str:
    """One cell: escaped, with ``±`` and ``Δ`` as math."""
    out = text.latex(value)
    return out.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("≈", r"$\approx$")


def _numeric(col: pd.Series) -> bool:
    import re

    vals = [str(v) for v in col if str(v) not in ("-", "")]
    return bool(vals) and all(re.match(r"^[-+]?[0-9][0-9,.]*( ± [0-9.]+)?$", v) for v in vals)


def _tabular(df: pd.DataFrame, rows: list[list[str]], caption: str, label: str) -> str:
    align = "".join("r" if _numeric(df[c]) else "l" for c in df.columns)
    wide = len(df.columns) > 7
    lines = [r"\begin{table}[t]", r"\centering", r"\caption{" + cell(caption) + "}", r"\label{" + label + "}"]
    if wide:
        lines.append(r"\resizebox{\textwidth}{!}{%")
    lines += [
        r"\begin{tabular}{" + align + "}",
        r"\toprule",
        " & ".join(cell(c) for c in df.columns) + r" \\",
        r"\midrule",
        *(" & ".join(r) + r" \\" for r in rows),
        r"\bottomrule",
        r"\end{tabular}" + ("}" if wide else ""),
        r"\end{table}",
        "",
    ]
    return "\n".join(lines)


def table_latex(df: pd.DataFrame, caption: str, label: str | None = None) -> str:
    """Any report table (every column) as a booktabs table."""
    rows = [[cell(v) for v in row] for row in df.itertuples(index=False)]
    import re

    return _tabular(df, rows, caption, label or "tab:" + re.sub(r"[^a-z0-9]+", "-", caption.lower()).strip("-")[:40])


PACKAGES = "% Needs \\usepackage{booktabs} (its top, middle and bottom rules); nothing else.\n"
REFERENCE_PROTOCOL = ", reference protocol"  # a method cell's suffix, abbreviated in the paper table
# The leaderboard's columns for a paper, by the start of their display name: (start, header, wide table only)
PAPER_COLUMNS = (
    ("rank", "Rank", False),
    ("method", "Method", False),
    ("seeds", "Seeds", False),
    ("final acc", "Final acc.", False),
    ("avg inc acc", "Avg.\\ inc.\\ acc.", True),
    ("forgetting", "Forg.", True),
    ("added params", "Added", True),
    ("train s", "Train s", True),
)
_INTERVAL = re.compile(r"^\s*([-+]?[0-9.]+)\s*\[([-+]?[0-9.]+),\s*([-+]?[0-9.]+)\]")


def _paper_cell(column: str, value: object) -> str:
    """A leaderboard cell for the paper: ``(ref.)`` for the reference protocol, counts as ``955k`` / ``21.6M``,
    seconds without decimals."""
    raw = str(value)
    if column == "method":
        return cell(raw.replace(REFERENCE_PROTOCOL, " (ref.)").replace(":reference", ":ref."))
    interval = re.fullmatch(r"([-+]?[0-9]+\.[0-9]+) ± ([0-9.]+)", raw)
    if interval:  # one decimal: the interval's half-width moves by about 0.03 points between bootstrap seeds
        return f"{float(interval.group(1)):.1f} $\\pm$ {interval.group(2)}"
    if column.startswith("forgetting") and re.fullmatch(r"[0-9]+\.[0-9]+", raw):
        return f"{float(raw):.1f}"
    number = raw.replace(",", "")
    if column.startswith(("added", "train")) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):
        x = float(number)
        if column.startswith("train"):
            return f"{x:.2g}" if x < 10 else f"{x:,.0f}"
        for div, suffix in ((1e6, "M"), (1e3, "k")):
            if x >= div:
                return f"{x / div:.3g}{suffix}"
        return f"{x:.0f}"
    return cell(raw)


def _versus_cell(value: object, wide: bool) -> str:
    """``+30.21 [+27.4, +33.0], p 1e-07`` as ``+30.2`` (narrow) or ``+30.2 [+27.4, +33.0]`` (wide); other cells
    (``baseline``, ``not paired``) as they are."""
    m = _INTERVAL.match(str(value))
    if m is None:
        return "n/p" if str(value) == "not paired" else cell(value)
    diff, lo, hi = (float(g) for g in m.groups())
    return f"{diff:+.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if wide else "")


def leaderboard_latex(board: Board, wide: bool = False) -> str:
    """The leaderboard for a paper, ranked best first with display names: rank, method, seeds, final and average
    incremental accuracy with $\\pm$ half the 95 % interval and the difference to the baseline; ``wide`` (a
    full-width ``table*``) adds forgetting, added parameters, training time and the difference's interval. The best
    row in bold; :data:`SIGNIFICANT` on methods that differ from the baseline (Holm-adjusted over the main rows).
    Sized to fit ``\\textwidth`` at 9 pt (``\\small`` in a 10 pt document; ``wide``: a two-column page) without
    ``\\resizebox``; the packages it needs are named in its first line."""
    df = board.table
    cols, headers = [], []
    for start, header, only_wide in PAPER_COLUMNS:
        col = next((c for c in df.columns if str(c).startswith(start)), None)
        if col is not None and (wide or not only_wide):
            cols.append(col)
            headers.append(header)
    versus = board.versus_column if board.versus_column in df.columns else None
    baseline = ""
    if versus is not None:
        baseline = str(versus).split(" vs ", 1)[-1].split(" [", 1)[0].split(",", 1)[0].strip()
        headers.append(r"$\Delta$ " + text.latex(baseline))
    rows = []
    for i, row in enumerate(df.itertuples(index=False)):
        values = dict(zip(df.columns, row, strict=True))
        cells = [_paper_cell(c, values[c]) for c in cols]
        if versus is not None:
            cells.append(_versus_cell(values[versus], wide))
        if "method" in cols and board.significant_vs_baseline[i]:
            cells[cols.index("method")] += SIGNIFICANT
        if i == 0:
            cells = [r"\textbf{" + c + "}" if c else c for c in cells]
        rows.append(cells)
    first = board.caption.split(". ")[0].split(": one row per method")[0]
    caption = (
        cell(first)
        + ". Ranked by final accuracy (\\%), mean over seeds $\\pm$ half the 95 \\% interval; best in bold; (ref.): "
        "the reference protocol; :ref.: the reference profile; n/p: not paired with the baseline (other seeds or "
        "protocol)"
        + (
            f"; $\\Delta$ {text.latex(baseline)}: final accuracy minus the baseline's (points"
            + (", 95 \\% interval" if wide else "")
            + f"); {SIGNIFICANT}: differs from the baseline (Holm-adjusted p $<$ 0.05, main rows only)"
            if versus is not None
            else ""
        )
        + (
            "; Forg.: forgetting; Added: parameters added to the backbone (k, M); Train s: training seconds per run"
            if wide
            else ""
        )
        + "."
    )
    align = "".join("l" if c == "method" else "r" for c in cols) + ("r" if versus is not None else "")
    env = "table*" if wide else "table"
    lines = [
        PACKAGES.rstrip(),
        f"\\begin{{{env}}}[t]",
        r"\centering",
        r"\small",
        r"\setlength{\tabcolsep}{" + ("3pt" if wide else "4pt") + "}",
        r"\caption{" + caption + "}",
        r"\label{tab:leaderboard" + ("-wide" if wide else "") + "}",
        r"\begin{tabular}{" + align + "}",
        r"\toprule",
        " & ".join(headers) + r" \\",
        r"\midrule",
        *(" & ".join(r) + r" \\" for r in rows),
        r"\bottomrule",
        r"\end{tabular}",
        f"\\end{{{env}}}",
        "",
    ]
    return "\n".join(lines)


__all__ = ["PACKAGES", "SIGNIFICANT", "cell", "leaderboard_latex", "table_latex"]
