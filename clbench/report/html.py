"""The static report page (``index.html``) and its GitHub twin (``README.md``).

The page needs no network: styles are inline and figures are PNG files in ``figures/`` beside it (each links to
its SVG). An inline script counts images that failed to load into ``<body data-broken-images>``, so a headless
browser can check the page (``chromium --headless --dump-dom``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from clbench.files import escape as text
from clbench.report.figure_base import FigureOut
from clbench.report.tables import Section, section_markdown, to_html

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 1340px;
       padding: 0 1.5rem; color: #1f2328; line-height: 1.45; box-sizing: border-box; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 0.3rem; margin-top: 2.2rem; }
nav ol { columns: 3; font-size: 0.9rem; } nav li { break-inside: avoid; }
.scroll { overflow-x: auto; max-width: 100%; border: 1px solid #eaeef2; }
.scroll > table { width: max-content; } /* columns at their own width: a wide table scrolls, it is not squeezed */
table { border-collapse: collapse; font-size: 0.76rem; margin: 0; }
th, td { border: 1px solid #d0d7de; padding: 0.2rem 0.35rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tbody tr:nth-child(even) { background: #fbfcfd; }
td { white-space: normal; overflow-wrap: break-word; max-width: 28rem; }
td.num { white-space: nowrap; max-width: none; } /* a number never wraps: a wide table scrolls in its box */
tr.best td { font-weight: bold; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { font-size: 0.85rem; color: #57606a; max-width: 1100px; }
.notes { font-size: 0.85rem; color: #57606a; } code { background: #f6f8fa; padding: 0 0.2rem; }
.meta { color: #57606a; font-size: 0.9rem; overflow-wrap: anywhere; }
details > summary { cursor: pointer; color: #0969da; margin: 0.4rem 0; }
details.provenance { font-size: 0.8rem; color: #57606a; } details.provenance td { max-width: 60rem; }
"""
FOLD_ROWS = 30  # a table longer than this folds into <details> (its first rows stay out of the way of the page)

# Sets data-broken-images / data-image-count on <body> once every image has loaded or failed: a lazily loaded image
# the window has not reached yet is fetched by a probe image (not counted broken because it is not loaded yet); and
# data-wrapped-numbers (numeric cells whose text takes more than one line) / data-tallest-row (px), measured in the
# window's width with every folded table opened for the measurement.
IMAGE_CHECK_JS = """
function clbenchLoads(img) {
  if (img.complete && img.naturalWidth > 0) { return Promise.resolve(true); }
  return new Promise(function (resolve) {
    var probe = new Image();
    probe.onload = function () { resolve(probe.naturalWidth > 0); };
    probe.onerror = function () { resolve(false); };
    probe.src = img.currentSrc || img.src;
  });
}
function clbenchLines(cell) {
  var range = document.createRange();
  range.selectNodeContents(cell);
  var tops = {};
  Array.prototype.forEach.call(range.getClientRects(), function (r) {
    if (r.width > 0) { tops[Math.round(r.top)] = 1; }
  });
  return Object.keys(tops).length;
}
window.addEventListener("load", function () {
  var body = document.body;
  body.dataset.scrollWidth = String(document.documentElement.scrollWidth);
  var first = document.querySelector("table");
  var home = first ? first.closest("section") : null;
  body.dataset.firstTable = home ? home.id : "";
  var folded = Array.prototype.filter.call(document.querySelectorAll("details"), function (d) { return !d.open; });
  folded.forEach(function (d) { d.open = true; });
  var wrapped = Array.prototype.filter.call(document.querySelectorAll("td.num"), function (td) {
    return clbenchLines(td) > 1;
  });
  var tallest = 0;
  Array.prototype.forEach.call(document.querySelectorAll("tbody tr"), function (tr) {
    tallest = Math.max(tallest, tr.getBoundingClientRect().height);
  });
  folded.forEach(function (d) { d.open = false; });
  body.dataset.wrappedNumbers = String(wrapped.length);
  body.dataset.wrappedSamples = wrapped.slice(0, 5).map(function (td) { return td.textContent; }).join(" | ");
  body.dataset.tallestRow = String(Math.round(tallest));
  var imgs = Array.prototype.slice.call(document.images);
  Promise.all(imgs.map(clbenchLoads)).then(function (ok) {
    var broken = imgs.filter(function (img, i) { return !ok[i]; });
    body.dataset.imageCount = String(imgs.length);
    body.dataset.brokenSources = broken.map(function (img) { return img.getAttribute("src"); }).join(" ");
    body.dataset.brokenImages = String(broken.length);
  });
});
"""
# A cell of a number, an interval, a count with its unit, a p-value: never wrapped (td.num)
NUMERIC = re.compile(r"[+\-−~<>≈]?\.?[0-9][0-9\s.,±+\-−%/\[\]()eE<>≈~×xkMGTBsminh*†]*")
PROVENANCE = re.compile(r"\s*Runs: (?P<runs>.*?)\. Git: (?P<git>.*?)\. Backbone weights: (?P<weights>.*?)\.\s*$", re.S)


def split_provenance(caption: str) -> tuple[str, dict[str, str] | None]:
    """A caption without its trailing ``Runs: ... Git: ... Backbone weights: ...`` (:func:`clbench.report.figure_base.
    provenance`), and those three as a dict (None where the caption has none)."""
    m = PROVENANCE.search(caption)
    if m is None:
        return caption, None
    return caption[: m.start()].rstrip(), {
        "runs": m.group("runs"),
        "git revisions": m.group("git"),
        "backbone weights": m.group("weights"),
    }


def provenance_html(prov: dict[str, str] | None) -> str:
    """The provenance of a figure or table folded in a key table: run ids, revisions and weights, one row each."""
    if not prov:
        return ""
    n = len([r for r in prov["runs"].split(", ") if r])
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in prov.items())
    return (
        f'<details class="provenance"><summary>Provenance: {n} runs, git {html.escape(prov["git revisions"])}'
        f"</summary><table><tbody>{rows}</tbody></table></details>"
    )


def provenance_markdown(prov: dict[str, str] | None) -> list[str]:
    """Lines of a folded provenance block for GitHub's Markdown (``<details>`` is rendered there)."""
    if not prov:
        return []
    rows = [f"- {k}: {text.markdown_prose(v)}" for k, v in prov.items()]
    return ["<details><summary>Provenance</summary>", "", *rows, "", "</details>", ""]


def mark_numbers(table: str) -> str:
    """``<td class="num">`` for every cell of ``table`` (HTML) that holds a number (:data:`NUMERIC`)."""

    def mark(m: re.Match[str]) -> str:
        value = html.unescape(m.group(1)).strip()
        return f'<td class="num">{m.group(1)}</td>' if value and NUMERIC.fullmatch(value) else m.group(0)

    return re.sub(r"<td>(.*?)</td>", mark, table, flags=re.S)


def _table_html(sec: Section) -> str:
    """The table in its own scrolling box (a wide table never widens the page); a long one folded."""
    assert sec.table is not None
    box = f'<div class="scroll">{mark_numbers(to_html(sec.table, sec.bold_rows))}</div>'
    if len(sec.table) > FOLD_ROWS:
        return f"<details><summary>{len(sec.table)} rows: show the table</summary>{box}</details>"
    return box


def _section_html(sec: Section, after: str = "") -> str:
    parts = [f'<section id="{html.escape(sec.anchor)}">', f"<h2>{html.escape(sec.title)}</h2>"]
    if sec.intro:
        parts.append(f"<p>{html.escape(sec.intro)}</p>")
    if sec.table is not None and len(sec.table):
        parts.append(_table_html(sec))
    if sec.notes:
        notes = [split_provenance(n) for n in sec.notes]
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n, _ in notes if n) + "</ul>")
        parts += [provenance_html(p) for _, p in notes if p]
    if sec.definitions:
        parts.append(
            '<p class="notes">Metric definitions:</p><ul class="notes">'
            + "".join(f"<li><code>{html.escape(t)}</code>: {html.escape(m)}</li>" for t, m in sec.definitions)
            + "</ul>"
        )
    parts.append(after)
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _figure_html(f: FigureOut) -> str:
    """One figure: the PNG, a link to each of its files and to its data (report.json), its key table folded."""
    png = f.files.get("png")
    img = f'<img src="{html.escape(png)}" alt="{html.escape(f.title)}" loading="lazy">' if png else ""
    links = " ".join(f'<a href="{html.escape(rel)}">{fmt.upper()}</a>' for fmt, rel in f.files.items())
    data = f' <a href="report.json">data (report.json, figure {html.escape(f.name)})</a>'
    key = ""
    if f.key:
        import pandas as pd

        key = (
            f"<details><summary>Key: the {len(f.key)} series of this figure</summary>"
            f'<div class="scroll">{to_html(pd.DataFrame(f.key))}</div></details>'
        )
    caption, prov = split_provenance(f.caption)
    return (
        f'<figure id="fig-{html.escape(f.name)}">'
        + (f'<a href="{html.escape(f.files["svg"])}">{img}</a>' if "svg" in f.files else img)
        + f"<figcaption>{html.escape(caption)} {links}{data}</figcaption>{key}{provenance_html(prov)}</figure>"
    )


def _figures_html(figures: Sequence[FigureOut], notes: Sequence[str]) -> str:
    parts = ['<section id="figures">', "<h2>Figures</h2>"]
    parts += [_figure_html(f) for f in figures]
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


MAIN_FIGURE = "accuracy_curves"  # follows the leaderboard


def _lead(sections: Sequence[Section], figures: Sequence[FigureOut]) -> tuple[FigureOut | None, list[FigureOut]]:
    """The main figure (shown right after the leaderboard when the report has one) and the other figures."""
    if not sections or sections[0].anchor != "leaderboard":
        return None, list(figures)
    main = next((f for f in figures if f.name == MAIN_FIGURE), None)
    return main, [f for f in figures if f is not main]


def _split(sections: Sequence[Section]) -> tuple[list[Section], list[Section]]:
    """Result sections (before the figures) and provenance sections (Runs, Skipped: after them)."""
    tail = {"runs", "skipped"}
    return [s for s in sections if s.anchor not in tail], [s for s in sections if s.anchor in tail]


def render_html(
    title: str, meta: str, sections: Sequence[Section], figures: Sequence[FigureOut], figure_notes: Sequence[str]
) -> str:
    head, tail = _split(sections)
    main, rest = _lead(head, figures)
    toc = "".join(
        f'<li><a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a></li>'
        for s in [*head, Section("Figures", "figures", None), *tail]
    )
    body = [_section_html(s, _figure_html(main) if main is not None and i == 0 else "") for i, s in enumerate(head)]
    body += [_figures_html(rest, figure_notes)] + [_section_html(s) for s in tail]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{CSS}</style>",
            "</head>",
            '<body data-broken-images="pending">',
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="meta">{html.escape(meta)}</p>',
            f'<nav id="contents"><strong>Contents</strong><ol>{toc}</ol></nav>',
            *body,
            f"<script>{IMAGE_CHECK_JS}</script>",
            "</body>",
            "</html>",
            "",
        ]
    )


def render_markdown(
    title: str, meta: str, sections: Sequence[Section], figures: Sequence[FigureOut], figure_notes: Sequence[str]
) -> str:
    head, tail = _split(sections)
    main, rest = _lead(head, figures)
    parts = [f"# {text.markdown(title)}", "", text.markdown_prose(meta), ""]
    for i, s in enumerate(head):
        parts.append(section_markdown(s))
        if i == 0 and main is not None and "png" in main.files:
            caption, prov = split_provenance(main.caption)
            parts += [f"![{text.markdown(main.title)}]({main.files['png']})", ""]
            parts += [f"**Figure.** {text.markdown_prose(caption)}", "", *provenance_markdown(prov)]
    parts += ["## Figures", ""]
    for i, f in enumerate(rest, 1):
        png, svg = f.files.get("png"), f.files.get("svg")
        if png:
            parts += [f"![{text.markdown(f.title)}]({png})", ""]
        caption, prov = split_provenance(f.caption)
        parts += [f"**Figure {i}.** {text.markdown_prose(caption)}" + (f" ([SVG]({svg}))" if svg else ""), ""]
        parts += provenance_markdown(prov)
    parts += [f"- {text.markdown_prose(n)}" for n in figure_notes]
    if figure_notes:
        parts.append("")
    parts += [section_markdown(s) for s in tail]
    return "\n".join(parts).rstrip() + "\n"
