"""What every report figure shares: the output folder and formats, the paper style, the saved-figure record, file
names, provenance captions and saving. Below :mod:`clbench.report.figures` and :mod:`clbench.report.forest`, which
both draw with it."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from clbench.report.collect import Run

FIG_DIR = "figures"
FORMATS = ("png", "svg", "pdf")  # the page shows the PNG; SVG and PDF for papers
PNG_DPI = 110  # the page's PNGs; paper exports (--latex-only) are written at PAPER_DPI
PAPER_DPI = 300
RC = {  # a quiet paper style; set per figure through rc_context, never globally
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
    "svg.hashsalt": "clbench-report",
    "svg.fonttype": "none",
}


@dataclass
class FigureOut:
    """A saved figure: files relative to the report folder, its caption and the runs it shows."""

    name: str
    title: str
    caption: str
    runs: list[str]
    files: dict[str, str] = field(default_factory=dict)  # format -> path relative to the report folder
    key: list[dict[str, str]] = field(default_factory=list)  # the full identity of each labelled series


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "x"


def provenance(runs: Sequence[Run]) -> str:
    """``Runs: a, b. Git: 1234abcd. Backbone weights: 4d4897b0fc05.``: what a figure or number came from."""
    ids = ", ".join(r.run_id for r in runs)
    revs = ", ".join(sorted({r.git_short for r in runs}))
    digests = ", ".join(sorted({(r.record.weights_digest or "unknown")[:12] for r in runs}))
    return f"Runs: {ids}. Git: {revs}. Backbone weights: {digests}."


def _save(
    fig: Figure, out_dir: Path, name: str, title: str, caption: str, runs: Sequence[Run], dpi: int | None = None
) -> FigureOut:
    """Save ``fig`` in every format of :data:`FORMATS` under ``out_dir/figures``; PNG at
    ``dpi`` (default :data:`PNG_DPI`)."""
    dpi = dpi or PNG_DPI
    (out_dir / FIG_DIR).mkdir(parents=True, exist_ok=True)
    files = {}
    for fmt in FORMATS:
        rel = f"{FIG_DIR}/{name}.{fmt}"
        meta: dict[str, Any] = {"Title": title, "Description": caption}
        if fmt == "svg":
            meta["Date"] = None  # reproducible SVG
        if fmt == "pdf":
            meta = {"Title": title, "Subject": caption, "CreationDate": None}  # reproducible PDF
        fig.savefig(out_dir / rel, format=fmt, dpi=dpi, metadata=meta)
        files[fmt] = rel
        if fig.get_layout_engine() is not None:
            # the first save laid the figure out; the other formats reuse its positions instead of laying it out
            # again (a report's figures took a fifth less time). None drops the engine where neither rc default
            # names one; "none" would keep a placeholder engine that still costs a layout draw per save
            import matplotlib

            with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
                fig.set_layout_engine(None)
    return FigureOut(name, title, caption, [r.run_id for r in runs], files)


def _final(runs: Sequence[Run], protocol: str) -> float:
    vals = [r.summary(protocol).last_acc for r in runs]
    vals = [float(v) for v in vals if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else -math.inf
