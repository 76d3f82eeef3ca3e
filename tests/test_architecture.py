"""The package's shape: no two modules import each other, directly or through others, and no method imports
another method (what two methods share lives in ``clbench/layers/`` or ``clbench/methods/shared.py``).

The import graph is read from the source (the AST), not by importing anything: every ``import`` and ``from ...
import`` of ``clbench/``, ``baselines/`` and ``tosca/``, at module level and inside functions (a function-level import
is how a cycle hides), and those under ``if TYPE_CHECKING:``: they never run, but one that closes a circle hides
that two modules depend on each other as surely as a run-time import does. An import of a package's
module (``from clbench.sweep import plan``, ``import clbench.sweep.plan``) is an edge to that module, and one of a
name from a package (``from clbench.sweep import run_sweep``) an edge to the package's ``__init__``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("clbench", "baselines", "tosca")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, int]]:
    """Every import statement, with its line: those under ``if TYPE_CHECKING:`` only with ``type_checking``."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test) and not type_checking:
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, node.lineno))
        visit(node)

    visit(tree)
    return found


def import_graph(root: Path = ROOT, type_checking: bool = True) -> dict[str, dict[str, int]]:
    """module -> {imported module of the packages: line of the first such import}; imports for type checkers only
    are edges too unless ``type_checking`` is false."""
    files = module_files(root)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, line in _imports(tree, type_checking):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}"
                    targets.append(sub if sub in files else prefix)
            for target in targets:
                while target and target not in files and "." in target:  # a name inside a module
                    target = target.rsplit(".", 1)[0]
                if target in files and target != module:
                    graph[module].setdefault(target, line)
    return graph


def write_tree(root: Path, files: dict[str, str]) -> None:
    """A little source tree for the checks' own tests: path -> text."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a path ``a -> b -> ... -> a``) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    out = []
    for component in components:  # a shortest cycle through the component's first module, for the message
        members, start = set(component), component[0]
        paths = {start: [start]}
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        cycle = [*paths[v], start]
                        break
                    if w in members and w not in paths:
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        out.append(cycle or component)
    return out


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in pairwise(cycle)]
    return "cycle: " + "; ".join(steps)


def test_the_import_graph_has_no_cycle_not_even_through_type_checking_imports():
    graph = import_graph(type_checking=True)
    assert len(graph) > 40 and "clbench.run.harness" in graph and "tosca.strategy" in graph  # it read the tree
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def method_of(files: dict[str, Path]) -> dict[str, str]:
    """Module -> the method it belongs to, read from the files: every module of ``baselines/`` but its ``__init__``
    is one method, and ``baselines/cards/NAME.py`` (its card) belongs to ``baselines/NAME.py``; a method package (a
    top-level package other than ``clbench`` and ``baselines``, e.g. ``tosca``) is one method with all its
    modules."""
    out = {}
    for module in files:
        package, _, rest = module.partition(".")
        if package == "baselines" and rest.startswith("cards."):
            out[module] = "baselines." + rest.removeprefix("cards.")
        elif package == "baselines" and rest and rest != "cards":
            out[module] = module
        elif package not in ("clbench", "baselines"):
            out[module] = package
    return out


def cross_method_imports(graph: dict[str, dict[str, int]], method: dict[str, str]) -> list[str]:
    """``"a (line n) -> b"`` for every import of a module of one method by a module of another."""
    return [
        f"{a} (line {line}) -> {b}"
        for a, targets in sorted(graph.items())
        for b, line in sorted(targets.items())
        if a in method and b in method and method[a] != method[b]
    ]


def test_no_method_imports_another_method():
    from clbench.core.catalog import STRATEGIES

    files = module_files()
    method = method_of(files)
    # every registered strategy lives in a module the rule covers (a method added elsewhere would escape it)
    homes = {name: STRATEGIES.get(name).__module__ for name in STRATEGIES.names()}
    assert len(homes) >= 8 and {"tosca.strategy", "baselines.ease", "baselines.l2p"} <= set(homes.values())
    assert not {n: m for n, m in homes.items() if m not in method}, homes
    assert len(set(method.values())) >= len(homes)  # one method per registered strategy, at least
    found = cross_method_imports(import_graph(), method)
    assert not found, "methods importing methods (move the shared part to clbench/layers/):\n" + "\n".join(found)


def test_the_method_import_check_finds_one(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/layers.py": "",
        "baselines/__init__.py": "",
        "baselines/a.py": "from clbench import layers\nimport torch\n",
        "baselines/b.py": "def f():\n    from baselines.a import g\n",
        "baselines/cards/__init__.py": "",
        "baselines/cards/a.py": "",
        "baselines/cards/b.py": "from baselines.cards.a import ACONFIG\n",
        "tosca/__init__.py": "",
        "tosca/luca.py": "",
        "tosca/strategy.py": "from tosca.luca import LuCA\nfrom baselines import a\n",
    }
    write_tree(tmp_path, source)
    graph = import_graph(tmp_path)
    assert cross_method_imports(graph, method_of(module_files(tmp_path))) == [
        "baselines.b (line 2) -> baselines.a",
        "baselines.cards.b (line 1) -> baselines.cards.a",  # a card is its method's: another method's card is not
        "tosca.strategy (line 2) -> baselines.a",
    ]


def test_config_and_checkpoint_import_nothing_from_the_runner():
    graph = import_graph()
    runner = {"clbench.run.harness", "clbench.cli", "clbench.sweep", "clbench.sweep.runner"}
    assert not runner & set(graph["clbench.core.config"]), graph["clbench.core.config"]
    assert not runner & set(graph["clbench.run.checkpoint"]), graph["clbench.run.checkpoint"]


@pytest.mark.parametrize(
    "source, expected",
    [
        # a function-level import closes the cycle: found and named
        (
            {
                "clbench/__init__.py": "",
                "clbench/a.py": "import clbench.b\n",
                "clbench/b.py": "def f():\n    from clbench import a\n",
            },
            [["clbench.a", "clbench.b", "clbench.a"]],
        ),
        # a relative import, through three modules
        (
            {
                "clbench/__init__.py": "",
                "clbench/a.py": "from .b import x\n",
                "clbench/b.py": "from clbench.c import y\n",
                "clbench/c.py": "from . import a\n",
            },
            [["clbench.a", "clbench.b", "clbench.c", "clbench.a"]],
        ),
        # a package whose __init__ imports a module that imports a name back from the package
        (
            {
                "clbench/__init__.py": "",
                "clbench/p/__init__.py": "from clbench.p.m import f\nREG = {}\n",
                "clbench/p/m.py": "from clbench.p import REG\n",
            },
            [["clbench.p", "clbench.p.m", "clbench.p"]],
        ),
        # an import for type checkers closes a cycle too
        (
            {
                "clbench/__init__.py": "",
                "clbench/a.py": "import clbench.b\n",
                "clbench/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clbench import a\n",
            },
            [["clbench.a", "clbench.b", "clbench.a"]],
        ),
    ],
)
def test_the_cycle_finder_finds_cycles(tmp_path, source, expected):
    write_tree(tmp_path, source)
    assert cycles(import_graph(tmp_path)) == expected


def test_the_run_time_graph_leaves_type_checking_imports_out(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/a.py": "import clbench.b\n",
        "clbench/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clbench import a\n",
    }
    write_tree(tmp_path, source)
    assert import_graph(tmp_path, type_checking=False)["clbench.b"] == {}
    assert import_graph(tmp_path)["clbench.b"] == {"clbench.a": 3}


# The foundations: files and their safety, and the pure evaluation functions, sit below everything that runs,
# reports or measures; they may import only these (and their own package).
FOUNDATIONS = {
    "clbench.files": ("clbench.errors",),
    "clbench.evaluation": ("clbench.errors", "clbench.files"),
    "clbench.core": ("clbench.errors", "clbench.files"),  # registries, catalog, run settings: under every floor
}


def foundation_breaches(graph: dict[str, dict[str, int]]) -> list[str]:
    found = []
    for package, allowed in FOUNDATIONS.items():
        for module, targets in sorted(graph.items()):
            if module != package and not module.startswith(package + "."):
                continue
            for target, line in sorted(targets.items()):
                ok = (package, *allowed)
                if not any(target == p or target.startswith(p + ".") for p in ok) and target.startswith("clbench"):
                    found.append(f"{module} (line {line}) -> {target}")
    return found


def test_the_foundations_import_nothing_above_them():
    graph = import_graph()
    assert {"clbench.files.typedfile", "clbench.evaluation.stats"} <= set(graph)  # it read the packages
    found = foundation_breaches(graph)
    assert not found, "a foundation module importing above it:\n" + "\n".join(found)


def test_the_foundation_check_finds_a_breach(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/errors.py": "",
        "clbench/files/__init__.py": "",
        "clbench/files/atomic.py": "from clbench.errors import E\n",
        "clbench/files/escape.py": "def f():\n    from clbench.run.harness import run\n",
        "clbench/run/__init__.py": "",
        "clbench/run/harness.py": "from clbench.files import atomic\n",
    }
    write_tree(tmp_path, source)
    assert foundation_breaches(import_graph(tmp_path)) == ["clbench.files.escape (line 2) -> clbench.run.harness"]


REPORT_MAY_NOT_IMPORT = ("torch", "timm", "avalanche", "clbench.run.harness", "clbench.features.backbones")


RECORD_READERS = ("clbench.report", "clbench.gate")  # tables and figures; the regression gate's check


def test_the_report_and_gate_packages_read_records_only():
    """clbench.report builds tables and figures, clbench.gate the gate's check, from records: no module of either
    imports torch, timm, Avalanche, the harness or a backbone, at module level or inside a function (measuring,
    the gate's calibration included, is clbench.perf's job)."""
    found = []
    for module, path in module_files().items():
        if not any(module == p or module.startswith(p + ".") for p in RECORD_READERS):
            continue
        for node, line in _imports(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if any(name == bad or name.startswith(bad + ".") for bad in REPORT_MAY_NOT_IMPORT):
                    found.append(f"{module} (line {line}) imports {name}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package, at_least", [("clbench.report", 10), ("clbench.gate", 4)])
def test_importing_the_report_and_gate_packages_loads_no_torch_nor_harness(package, at_least):
    code = (
        "import importlib, pkgutil, sys\n"
        f"import {package} as r\n"
        "for m in pkgutil.iter_modules(r.__path__):\n"
        f"    importlib.import_module('{package}.' + m.name)\n"
        "print(len(list(pkgutil.iter_modules(r.__path__))))\n"
        "heavy = ('torch', 'timm', 'clbench.run.harness', 'clbench.features.backbones')\n"
        "print(' '.join(k for k in heavy if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    count, loaded = (out.splitlines() + ["", ""])[:2]
    assert int(count) >= at_least  # it imported every submodule
    assert loaded == "", f"importing {package} loaded {loaded}"


TOOLS = "clbench.tools"  # maintenance commands that rebuild the embedded data by hand (python -m clbench.tools.NAME)


def tool_importers(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a maintenance tool by a module outside :data:`TOOLS` (function-level imports included)."""
    inside = lambda name: name == TOOLS or name.startswith(TOOLS + ".")  # noqa: E731
    return sorted(
        f"{m} (line {line}) -> {t}"
        for m, deps in graph.items()
        if not inside(m)
        for t, line in deps.items()
        if inside(t)
    )


def test_no_library_module_imports_the_maintenance_tools():
    """The data-set builders (clbench.tools) only rebuild clbench/data/: a run, a benchmark's loader, a report or the
    CLI imports none of them, so none of their code (PIL, npm tarballs, resvg) is on the path of ``clbench run``."""
    graph = import_graph()
    assert "clbench.tools.build_emoji_domains" in graph  # it read the tools
    found = tool_importers(graph)
    assert not found, "a library module importing a maintenance tool:\n" + "\n".join(found)


def test_the_maintenance_tool_check_finds_an_importer(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/tools/__init__.py": "",
        "clbench/tools/build.py": "from clbench.benchmarks import data\n",
        "clbench/benchmarks/__init__.py": "",
        "clbench/benchmarks/data.py": "def f():\n    from clbench.tools.build import digest\n",
    }
    write_tree(tmp_path, source)
    assert tool_importers(import_graph(tmp_path)) == ["clbench.benchmarks.data (line 2) -> clbench.tools.build"]


# The floors of the house, bottom to top. A module may import modules of its own floor and of those below it, never
# one above: at module level, inside a function, or for type checkers. A name covers that module and every module
# under it, the most specific name decides, and a name ending in ``$`` covers that module alone (a package's
# ``__init__``). Read from the import graph: the driver (``clbench.run``) sits on the methods, which sit on the
# method contract and the data, which sit on the foundation (``clbench.core``); the tools and the front door sit on
# the driver.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("clbench$", "clbench.errors", "clbench.files", "clbench.imports")),
    ("core", ("clbench.core",)),  # what every floor needs: registries, catalog, run settings, precision, RNG
    (
        "data",
        (
            "clbench.evaluation",
            "clbench.weights",
            "clbench.benchmarks",
            "clbench.features",
            "clbench.records",
            "clbench.published",
        ),
    ),
    # where a method declares a measurement of ``clbench perf`` (Measurement, arg, the timers): the tool's plug-in
    # point, below the methods that declare one; the rest of clbench.perf is a tool
    ("tool plug-in points", ("clbench.perf$", "clbench.perf.timing")),
    ("method contract", ("clbench.methods",)),
    ("layers", ("clbench.layers",)),  # blocks two or more methods share, built on the contract
    ("methods", ("baselines", "tosca")),
    ("driver", ("clbench.run",)),
    # ``clbench records upgrade`` restates old records with each strategy's own rule: a tool that imports methods
    (
        "tools",
        (
            "clbench.gate",
            "clbench.perf",
            "clbench.report",
            "clbench.sweep",
            "clbench.tune",
            "clbench.records.upgrade",
            "clbench.tools",  # the embedded data's builders (python -m clbench.tools.NAME), imported by nothing else
        ),
    ),
    # the CLI and the command bodies it dispatches to (a command draws with the terminal view, clbench.ui)
    ("front", ("clbench.cli", "clbench.ui", "clbench.examples", "clbench.run.commands", "clbench.sweep.commands")),
)


def floor_of(module: str, floors: tuple[tuple[str, tuple[str, ...]], ...] = FLOORS) -> int | None:
    """The index in ``floors`` of ``module``'s floor (the most specific name that covers it); None for none."""
    best: tuple[int, int] | None = None
    for i, (_, names) in enumerate(floors):
        for name in names:
            alone, name = name.endswith("$"), name.removesuffix("$")
            if module == name or (not alone and module.startswith(name + ".")):
                if best is None or len(name) > best[0]:
                    best = (len(name), i)
    return None if best is None else best[1]


def floor_breaches(
    graph: dict[str, dict[str, int]], floors: tuple[tuple[str, tuple[str, ...]], ...] = FLOORS
) -> list[str]:
    """``"a (floor, line n) -> b (higher floor)"`` for every import from a lower floor to a higher one."""
    found = []
    for a, targets in sorted(graph.items()):
        fa = floor_of(a, floors)
        for b, line in sorted(targets.items()):
            fb = floor_of(b, floors)
            if fa is not None and fb is not None and fb > fa:
                found.append(f"{a} ({floors[fa][0]}, line {line}) -> {b} ({floors[fb][0]})")
    return found


def function_level_imports(root: Path = ROOT) -> list[str]:
    """``"module (line n): statement"`` for every import of the packages made inside a function."""
    found = []
    for module, path in module_files(root).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for stmt in node.body:  # nested functions are walked on their own
                for sub in [stmt, *(s for s in ast.walk(stmt) if s is not stmt)]:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                        continue
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and _is_internal(sub):
                        found.append(f"{module} (line {sub.lineno}): {ast.unparse(sub)}")
    return sorted(set(found))


def _is_internal(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] in PACKAGES
    return any(alias.name.split(".")[0] in PACKAGES for alias in node.names)


def import_counts(root: Path = ROOT) -> dict[str, int]:
    """The house in numbers: import statements of the packages that name the packages (module- and
    function-level, type checkers' included), those made inside a function, and imports from a lower floor to a
    higher one."""
    total = 0
    for path in module_files(root).values():
        total += sum(_is_internal(n) for n, _ in _imports(ast.parse(path.read_text(), filename=str(path)), True))
    return {
        "internal imports": total,
        "function-level imports": len(function_level_imports(root)),
        "back-arrows": len(floor_breaches(import_graph(root))),
    }


def test_no_module_imports_a_floor_above_its_own():
    graph = import_graph()
    unplaced = sorted(m for m in graph if floor_of(m) is None)
    assert not unplaced, f"modules on no floor (add their package to FLOORS): {unplaced}"
    found = floor_breaches(graph)
    counts = ", ".join(f"{k} {v}" for k, v in import_counts().items())
    assert not found, (
        "imports from a lower floor to a higher one (move what is imported down, into clbench/core/ or the "
        "importer's floor, or pass it in from above):\n" + "\n".join(found) + f"\n({counts})"
    )


def test_every_clbench_package_is_declared_on_a_floor():
    """A new package of clbench/ is placed on purpose, not by falling under a broader name."""
    declared = {name.removesuffix("$") for _, names in FLOORS for name in names}
    tops = {".".join(m.split(".")[:2]) for m in module_files() if m.startswith("clbench.")}
    assert tops <= declared, sorted(tops - declared)


def test_the_floor_check_finds_a_breach(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/core/__init__.py": "",
        "clbench/core/catalog.py": "def f():\n    from clbench.run import harness\n",  # inside a function
        "clbench/perf/__init__.py": "from clbench.core import catalog\n",
        "clbench/perf/gpu.py": "from clbench.run.harness import run\n",  # a tool on the driver: allowed
        "clbench/run/__init__.py": "",
        "clbench/run/harness.py": "from clbench.perf import Measurement\nfrom clbench.perf.gpu import g\n",
        "baselines/__init__.py": "",
        "baselines/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clbench.run import harness\n",
    }
    write_tree(tmp_path, source)
    assert floor_breaches(import_graph(tmp_path)) == [
        "baselines.a (methods, line 3) -> clbench.run.harness (driver)",
        "clbench.core.catalog (core, line 2) -> clbench.run.harness (driver)",
        "clbench.run.harness (driver, line 2) -> clbench.perf.gpu (tools)",  # the package's __init__ is not the tool
    ]
    assert function_level_imports(tmp_path) == ["clbench.core.catalog (line 2): from clbench.run import harness"]


def unexplained_function_level_imports(root: Path = ROOT) -> list[str]:
    """The function-level imports of :func:`function_level_imports` with no ``# reason`` comment on their own line
    or on the line above them (above the first of a run of adjacent imports, which the one comment covers)."""
    found = []
    for module, path in module_files(root).items():
        lines = path.read_text().splitlines()
        for entry in function_level_imports_of(module, path):
            start, end, text = entry
            if any("#" in line for line in lines[start - 1 : end]):
                continue
            above = start - 2
            while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                above -= 1
            if above >= 0 and lines[above].strip().startswith("#"):
                continue
            found.append(f"{module} (line {start}): {text}")
    return sorted(set(found))


def function_level_imports_of(module: str, path: Path) -> list[tuple[int, int, str]]:
    """``(first line, last line, statement)`` of each import of the packages made inside a function of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for stmt in node.body:  # nested functions are walked on their own
            for sub in [stmt, *(s for s in ast.walk(stmt) if s is not stmt)]:
                if isinstance(sub, (ast.Import, ast.ImportFrom)) and _is_internal(sub):
                    found.append((sub.lineno, sub.end_lineno or sub.lineno, ast.unparse(sub)))
    return found


def test_every_function_level_import_says_why():
    """An import inside a function is the exception (a third-party library not loaded at import, a command's own
    loading, a name the tests replace on its module): a one-line ``# reason`` above it (or on its line) says which."""
    found = unexplained_function_level_imports()
    assert not found, (
        "function-level imports without a reason (move them to module level, or put a one-line # reason on the line "
        "above):\n" + "\n".join(found)
    )


def test_the_reason_check_finds_an_unexplained_import(tmp_path):
    source = {
        "clbench/__init__.py": "",
        "clbench/a.py": "def g():\n    pass\n",
        "clbench/b.py": (
            "def f():\n    from clbench.a import g\n"
            "def h():\n    # deferred: loads torch, which importing this module does not\n"
            "    from clbench.a import g\n    from clbench import a\n"
            "def k():\n    from clbench.a import g  # looked up at call time\n"
        ),
    }
    write_tree(tmp_path, source)
    assert unexplained_function_level_imports(tmp_path) == ["clbench.b (line 2): from clbench.a import g"]


if __name__ == "__main__":  # the house in numbers: python tests/test_architecture.py [--list]
    for key, value in import_counts().items():
        print(f"{key}: {value}")
    if "--list" in sys.argv:
        print("\n".join(floor_breaches(import_graph())))
        print("\n".join(function_level_imports()))
