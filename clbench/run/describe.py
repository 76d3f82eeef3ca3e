"""What ``clbench list`` shows of a method, read without importing it or torch.

- its settings, each with its type, default and the one-line comment its settings class gives the field (the house
  style: one comment per field saying where the value comes from), read from the class's source;
- its reference (the ``Paper:`` and ``Reference implementation checked:`` lines) and its deviations (the
  ``Deviations from the paper / reference code:`` list) from the docstring of the strategy's module, read from the
  file, as :mod:`clbench.run.scenario` reads a strategy's scenarios;
- its family, what it trains and its profiles from its card (:class:`clbench.core.catalog.MethodCard`).

A plug-in's card comes from its class (imported); its docstring then from the imported module.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import io
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clbench.core.catalog import BACKBONES, FAMILIES, STRATEGIES, MethodCard, card
from clbench.errors import ClbenchError
from clbench.files.escape import rich as esc
from clbench.run.scenario import declared_scenarios


@dataclass(frozen=True)
class SettingInfo:
    name: str
    type: str  # the annotation as written (``int``, ``Literal['cached', 'augment']``)
    default: str  # repr of the default, "required" where there is none
    help: str  # the field's comment, "" where it has none


@dataclass(frozen=True)
class MethodInfo:
    name: str
    card: MethodCard
    title: str  # the first line of the strategy module's docstring
    reference: list[str]  # "Paper: ...", "Reference implementation checked: ..."
    deviations: list[str]  # one item per deviation, its lines joined
    scenarios: tuple[str, ...]
    settings: list[SettingInfo]


def _comments(source: str) -> dict[int, str]:
    """Line number (1-based) -> the text of the comment on that line."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def settings(config: type) -> list[SettingInfo]:
    """Every field of the settings dataclass ``config``, with its one-line comment: the comment on the field's
    line(s), else the comment lines just above it."""
    try:
        source = textwrap.dedent(inspect.getsource(config))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        source, tree = "", None
    comments = _comments(source)
    annotations: dict[str, str] = {}
    helps: dict[str, str] = {}
    if tree is not None and tree.body and isinstance(tree.body[0], ast.ClassDef):
        for stmt in tree.body[0].body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            annotations[name] = ast.unparse(stmt.annotation)
            end = stmt.end_lineno or stmt.lineno
            text = " ".join(comments[n] for n in range(stmt.lineno, end + 1) if n in comments)
            if not text:  # the comment lines just above the field
                above, n = [], stmt.lineno - 1
                while n in comments and source.splitlines()[n - 1].lstrip().startswith("#"):
                    above.insert(0, comments[n])
                    n -= 1
                text = " ".join(above)
            helps[name] = text
    out = []
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        typ = annotations.get(f.name) or getattr(f.type, "__name__", str(f.type))
        out.append(SettingInfo(f.name, typ, default, helps.get(f.name, "")))
    return out


def _module_doc(name: str) -> str:
    """The docstring of strategy ``name``'s module, read from its file while it is not imported."""
    target = STRATEGIES._lazy.get(name)  # noqa: SLF001 (the registry's not-yet-imported entries)
    module = (target or "").partition(":")[0]
    if target is None:  # imported already (a plug-in whose card was read from its class)
        cls = STRATEGIES.get(name)
        return inspect.getdoc(sys.modules.get(cls.__module__)) or ""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return ""
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ""
    try:
        return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""


def _paragraphs(doc: str) -> list[str]:
    return [p.strip() for p in doc.split("\n\n") if p.strip()]


def reference(doc: str) -> list[str]:
    """The ``Paper:`` and ``Reference implementation ...:`` statements of a method docstring, each on one line."""
    out = []
    for para in _paragraphs(doc):
        item: list[str] = []
        for line in para.splitlines():
            if line.startswith(("Paper:", "Reference implementation", "Reference:", "Papers:")):
                if item:
                    out.append(" ".join(item))
                item = [line.strip()]
            elif item:
                item.append(line.strip())
        if item:
            out.append(" ".join(item))
    return out


def deviations(doc: str) -> list[str]:
    """The items of the docstring's ``Deviations ...:`` list, each on one line."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().lower().startswith("deviations")), None)
    if start is None:
        return []
    items: list[list[str]] = []
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if stripped.startswith("- "):
            items.append([stripped[2:]])
        elif stripped and items and line.startswith((" ", "\t")):
            items[-1].append(stripped)
        elif stripped and items:  # a paragraph after the list ends it
            break
    return [" ".join(i) for i in items]


def describe(name: str) -> MethodInfo:
    """Everything ``clbench list NAME`` shows of strategy ``name`` (ClbenchError with did-you-mean if unknown)."""
    method = card(name)
    doc = _module_doc(name)
    title = doc.splitlines()[0].strip() if doc else ""
    return MethodInfo(
        name, method, title, reference(doc), deviations(doc), declared_scenarios(name), settings(method.Config)
    )


def profile_text(values: dict[str, Any]) -> str:
    """A profile's settings as ``key=value`` pairs, or what an empty one means."""
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "the reference settings (no change)"


# ----------------------------------------------------------------------------------------------- printing
def _console() -> Any:
    """rich's console on stdout; written to a file or a pipe, lines are never cut at 80 columns. A reader that stops
    reading (``clbench list | head``) raises BrokenPipeError, which the CLI ends quietly (rich would exit 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console() if sys.stdout.isatty() else _Console(width=100_000, no_color=True)


def print_catalog(console: Any = None) -> None:
    """``clbench list``: every method (family, what it trains, scenarios, profiles), then benchmarks and backbones."""
    from rich.table import Table

    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks import BENCHMARKS

    console = console or _console()
    methods = Table(title="strategies (`clbench list NAME`: settings, profiles, reference, deviations)")
    for column in ("method", "family", "what it trains", "scenarios", "profiles"):
        methods.add_column(column)
    for name in STRATEGIES.names():
        try:
            method = card(name)
            family = FAMILIES.get(method.family, method.family or "-")
            row = [family, method.trains or "-", ", ".join(declared_scenarios(name))]
            row.append(", ".join(method.profiles) or "-")
        except ClbenchError as e:  # a plug-in that cannot be loaded here
            row = ["-", f"cannot be loaded: {e}", "-", "-"]
        methods.add_row(esc(name), *map(esc, row))
    console.print(methods)
    benches = Table(title="benchmarks (--bench)")
    for column in ("benchmark", "split", "domains", "summary"):
        benches.add_column(column)
    for name in BENCHMARKS.names():
        s = BENCHMARKS.get(name)
        split = f"B0 Inc{s.increment}" if s.init_cls == s.increment else f"B{s.init_cls} Inc{s.increment}"
        benches.add_row(esc(name), split, str(len(s.domains)) if s.domains else "-", esc(s.summary))
    console.print(benches)
    backbones = Table(title="backbones (--backbone)")
    backbones.add_column("backbone")
    backbones.add_column("summary")
    for name in BACKBONES.names():
        backbones.add_row(esc(name), esc(BACKBONES.get(name).summary))
    console.print(backbones)


def print_method(name: str, console: Any = None) -> None:
    """``clbench list NAME``: one method's card."""
    from rich.table import Table

    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks import BENCHMARKS

    console = console or _console()
    if name not in STRATEGIES and (name in BENCHMARKS or name in BACKBONES):  # `clbench list emoji`: its line
        spec = BENCHMARKS.get(name) if name in BENCHMARKS else BACKBONES.get(name)
        kind = "benchmark (--bench)" if name in BENCHMARKS else "backbone (--backbone)"
        console.print(f"{esc(name)}: {kind}: {esc(spec.summary)}", highlight=False)
        return
    info = describe(name)
    console.print(f"[bold]{esc(name)}[/bold]: {esc(info.title)}" if info.title else f"[bold]{esc(name)}[/bold]")
    console.print(f"family: {esc(FAMILIES.get(info.card.family, info.card.family or '-'))}")
    console.print(f"trains: {esc(info.card.trains or '-')}")
    console.print(f"scenarios: {esc(', '.join(info.scenarios))} (--scenario)")
    if info.reference:
        console.print("reference:")
        for line in info.reference:
            console.print(f"  {esc(line)}")
    table = Table(title=f"settings (--set KEY=VALUE, e.g. clbench run --strategy {esc(name)} --set KEY=VALUE)")
    for column in ("setting", "type", "default", "meaning"):
        table.add_column(column)
    for s in info.settings:
        table.add_row(esc(s.name), esc(s.type), esc(s.default), esc(s.help or "-"))
    console.print(table if info.settings else "settings: none (nothing to --set)")
    profiles = Table(title="profiles (--profile NAME)")
    profiles.add_column("profile")
    profiles.add_column("sets")
    for profile, values in info.card.profiles.items():
        profiles.add_row(esc(profile), esc(profile_text(dict(values))))
    console.print(profiles)
    if info.deviations:
        console.print("deviations from the paper / reference code:")
        for item in info.deviations:
            console.print(f"- {esc(item)}")
