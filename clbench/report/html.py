"""The static report page (``index.html``) and its GitHub twin (``README.md``).

The page needs no network: styles are inline and figures are PNG files in ``figures/`` beside it (each links to
its SVG). An inline script counts images that failed to load into ``<body data-broken-images>``, so a headless
browser can check the page (``chromium --headless --dump-dom``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from clbench import text
from clbench.report.figures import FigureOut
from clbench.report.tables import Section, section_markdown, to_html

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 1500px;
       padding: 0 1.5rem; color: #1f2328; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 0.3rem; margin-top: 2.2rem; }
nav a { margin-right: 1rem; }
table { border-collapse: collapse; font-size: 0.76rem; margin: 0.6rem 0; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 0.2rem 0.35rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tbody tr:nth-child(even) { background: #fbfcfd; }
th { min-width: 3.2rem; } td { white-space: normal; overflow-wrap: break-word; }
td:last-child { min-width: 12rem; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #eaeef2; }
figcaption { font-size: 0.85rem; color: #57606a; max-width: 1100px; }
.notes { font-size: 0.85rem; color: #57606a; } code { background: #f6f8fa; padding: 0 0.2rem; }
.meta { color: #57606a; font-size: 0.9rem; }
"""

# Sets data-broken-images / data-image-count on <body> once every image has loaded or failed.
IMAGE_CHECK_JS = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (img) { return !img.complete || img.naturalWidth === 0; });
  document.body.dataset.imageCount = String(imgs.length);
  document.body.dataset.brokenImages = String(broken.length);
  document.body.dataset.brokenSources = broken.map(function (img) { return img.getAttribute("src"); }).join(" ");
});
"""


def _section_html(sec: Section) -> str:
    parts = [f'<section id="{sec.anchor}">', f"<h2>{html.escape(sec.title)}</h2>"]
    if sec.intro:
        parts.append(f"<p>{html.escape(sec.intro)}</p>")
    if sec.table is not None and len(sec.table):
        parts.append(to_html(sec.table))
    if sec.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in sec.notes) + "</ul>")
    if sec.definitions:
        parts.append(
            '<p class="notes">Metric definitions:</p><ul class="notes">'
            + "".join(f"<li><code>{html.escape(t)}</code>: {html.escape(m)}</li>" for t, m in sec.definitions)
            + "</ul>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _figures_html(figures: Sequence[FigureOut], notes: Sequence[str]) -> str:
    parts = ['<section id="figures">', "<h2>Figures</h2>"]
    for f in figures:
        png, svg = f.files.get("png"), f.files.get("svg")
        img = f'<img src="{html.escape(png)}" alt="{html.escape(f.title)}">' if png else ""
        link = f' <a href="{html.escape(svg)}">SVG</a>' if svg else ""
        parts.append(
            f'<figure id="fig-{html.escape(f.name)}">'
            + (f'<a href="{html.escape(svg)}">{img}</a>' if svg else img)
            + f"<figcaption>{html.escape(f.caption)}{link}</figcaption></figure>"
        )
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def _split(sections: Sequence[Section]) -> tuple[list[Section], list[Section]]:
    """Result sections (before the figures) and provenance sections (Runs, Skipped: after them)."""
    tail = {"runs", "skipped"}
    return [s for s in sections if s.anchor not in tail], [s for s in sections if s.anchor in tail]


def render_html(
    title: str, meta: str, sections: Sequence[Section], figures: Sequence[FigureOut], figure_notes: Sequence[str]
) -> str:
    head, tail = _split(sections)
    nav = " ".join(
        f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in [*head, Section("Figures", "figures", None), *tail]
    )
    body = [_section_html(s) for s in head] + [_figures_html(figures, figure_notes)] + [_section_html(s) for s in tail]
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
            f"<nav>{nav}</nav>",
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
    parts = [f"# {text.markdown(title)}", "", text.markdown_prose(meta), ""]
    parts += [section_markdown(s) for s in head]
    parts += ["## Figures", ""]
    for i, f in enumerate(figures, 1):
        png, svg = f.files.get("png"), f.files.get("svg")
        if png:
            parts += [f"![{text.markdown(f.title)}]({png})", ""]
        parts += [f"**Figure {i}.** {text.markdown_prose(f.caption)}" + (f" ([SVG]({svg}))" if svg else ""), ""]
    parts += [f"- {text.markdown_prose(n)}" for n in figure_notes]
    if figure_notes:
        parts.append("")
    parts += [section_markdown(s) for s in tail]
    return "\n".join(parts).rstrip() + "\n"
