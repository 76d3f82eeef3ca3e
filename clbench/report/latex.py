"""Report tables as LaTeX for a paper: booktabs rules, ``$\\pm$`` for intervals, the leaderboard's best row in
bold and a marker on the rows that differ significantly from the baseline (Holm-adjusted p < 0.05).

No jinja2 (pandas' ``Styler.to_latex`` needs it): the tables are display strings already, escaped here once
(:func:`clbench.files.escape.latex`). The output needs ``\\usepackage{booktabs}`` (Debian: texlive-latex-base ships it,
in texlive-latex-recommended's ``booktabs.sty``); a wide table is wrapped in ``\\resizebox`` (graphicx).
"""

from __future__ import annotations

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


LEADERBOARD_COLUMNS = ("rank", "method", "seeds", "final acc % ± CI", "avg inc acc % ± CI", "forgetting")


def leaderboard_latex(board: Board) -> str:
    """The leaderboard: rank, method, final and average incremental accuracy with $\\pm$ half the 95 % interval,
    forgetting, added parameters, training time and the difference to the baseline; the best row in bold; the
    marker :data:`SIGNIFICANT` on methods that differ from the baseline (Holm-adjusted over the main rows)."""
    df = board.table
    cols = [c for c in df.columns if c not in ("differs from best", "warnings")]
    out = df[cols]
    rows = []
    for i, row in enumerate(out.itertuples(index=False)):
        cells = [cell(v) for v in row]
        if board.significant_vs_baseline[i]:
            cells[cols.index("method")] += SIGNIFICANT
        if i == 0:
            cells = [r"\textbf{" + c + "}" if c else c for c in cells]
        rows.append(cells)
    caption = (
        board.caption.split(". ")[0]
        + ". Mean over seeds $\\pm$ half the 95 \\% interval; best in bold; "
        + SIGNIFICANT
        + ": differs from the baseline (Holm-adjusted p $<$ 0.05, main rows only)."
    )
    lines = _tabular(out, rows, "CAPTION", "tab:leaderboard").replace(
        r"\caption{CAPTION}", r"\caption{" + caption + "}"
    )
    return lines


__all__ = ["SIGNIFICANT", "cell", "leaderboard_latex", "table_latex"]
