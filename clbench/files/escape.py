"""Escaping of text that came from files: every string clbench did not write itself (record fields, run and file
names, reference entries, ``--title``) passes through one of these before it reaches a terminal, a Markdown page or
a LaTeX table (the threat model: reports/README.md, "What clbench trusts").

- :func:`plain`: control characters (terminal escape sequences, carriage returns, newlines, bidi overrides) shown as
  ``\\xNN`` / ``\\uNNNN``, so a name cannot clear the screen, retitle the window or hide a line. For plain ``print``.
- :func:`rich`: :func:`plain`, then rich's markup escaping, so ``[/]`` or ``[red]`` in a name prints as written.
- :func:`markdown`: one line, HTML entity-encoded and the Markdown characters that open code, emphasis, links or
  table cells backslash-escaped (``_`` is left: GitHub does not emphasise inside words like ``vit_small``).
- :func:`latex`: every LaTeX special character escaped exactly once.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls, DEL, and the Unicode format characters that reorder or hide text (bidi overrides, isolates,
# zero-width joiners, line and paragraph separators).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _show(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def plain(value: Any, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control character shown as an escape (``keep_newlines``: ``\\n`` kept)."""
    text = str(value)
    if keep_newlines:
        return "\n".join(_CONTROL.sub(_show, line) for line in text.split("\n"))
    return _CONTROL.sub(_show, text)


def rich(value: Any, keep_newlines: bool = False) -> str:
    """:func:`plain`, safe to embed in a string rich renders as markup."""
    from rich.markup import escape

    return escape(plain(value, keep_newlines))


_MD_SPECIAL = re.compile(r"([\\`*\[\]|])")  # code spans, emphasis, links and images, table cells


def markdown(value: Any) -> str:
    """One Markdown line: controls and newlines made visible, HTML entity-encoded, Markdown specials escaped."""
    import html

    text = plain(value).replace("\\x0a", " ").replace("\\x0d", " ")
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def markdown_prose(value: Any) -> str:
    """One line of Markdown prose clbench wrote around names (a note, a caption): controls and newlines made visible
    and HTML entity-encoded, so that no name can start a new block or inject a tag; clbench's own code spans stay."""
    import html

    return html.escape(plain(value).replace("\\x0a", " ").replace("\\x0d", " "), quote=False)


_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "±": r"$\pm$",
    "–": "--",
}
_LATEX_SPECIAL = re.compile("|".join(re.escape(k) for k in _LATEX))


def latex(value: Any) -> str:
    """Every LaTeX special character escaped once (one pass: ``\\`` never becomes ``\\textbackslash\\{\\}``)."""
    text = plain(value).replace("\\x0a", " ")
    return _LATEX_SPECIAL.sub(lambda m: _LATEX[m.group(0)], text)
