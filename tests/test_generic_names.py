"""Generic code never names a method: no identifier or string literal under ``clbench/`` equals a registered strategy
name, except in ``clbench/core/catalog.py`` (the registry lines, DEFAULT_STRATEGY). Comments and docstrings may mention
methods; a method's name inside a longer string (``--set tosca.epochs=5``) is a help example, not a dispatch."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from clbench.core.catalog import STRATEGIES

PACKAGE = Path(__file__).resolve().parents[1] / "clbench"
ALLOWED = {PACKAGE / "core" / "catalog.py"}


def named_strategies(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, token) of every identifier or string literal of ``source`` equal to one of ``names``."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in names:
            found.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string: its literal parts
                value = tok.string
                found += [(tok.start[0], tok.string) for n in names if f'"{n}"' in value or f"'{n}'" in value]
                continue
            if isinstance(value, str) and value in names:
                found.append((tok.start[0], tok.string))
        elif tok.type == getattr(tokenize, "FSTRING_MIDDLE", None) and tok.string in names:  # Python >= 3.12
            found.append((tok.start[0], tok.string))
    return found


def test_the_scan_finds_a_method_name():
    names = {"tosca", "l2p"}
    src = 'x = "tosca"\nif s == \'l2p\': pass\nfrom tosca.perf import f\n# tosca in a comment\n"""tosca docstring"""\n'
    src += 'y = "tosca-augment"\nz = f"{a}" + "l2p "\n'
    assert [line for line, _ in named_strategies(src, names)] == [1, 2, 3]


def test_no_module_under_clbench_names_a_strategy():
    names = set(STRATEGIES.names())
    assert {"simplecil", "tosca", "l2p", "ease"} <= names
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {token}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in ALLOWED
        for line, token in named_strategies(path.read_text(encoding="utf-8"), names)
    ]
    assert not offenders, (
        "generic code names a method (read its cost, profile or hook from the strategy):\n" + "\n".join(offenders)
    )
