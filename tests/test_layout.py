"""The package layout (clbench/README.md, "Architecture"): modules live in packages by what a reader looks for, and
a module's name from before the regrouping still imports, as the same object, with a warning naming the new place."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import clbench

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_keeps_only_the_entry_points():
    top = sorted(p.stem for p in (ROOT / "clbench").glob("*.py"))
    assert top == ["__init__", "cli", "errors", "imports", "ui"]


@pytest.mark.parametrize("old", sorted(clbench.MOVED))
def test_every_moved_module_exists_under_its_new_name(old):
    new = clbench.MOVED[old]
    assert (ROOT / "clbench" / (new.replace(".", "/") + ".py")).is_file(), new
    assert not (ROOT / "clbench" / f"{old}.py").exists(), old


def test_an_old_name_imports_the_same_module_with_a_warning():
    code = (
        "import warnings, sys\n"
        "warnings.simplefilter('error')\n"
        "import clbench.methods.contract as new\n"  # the new name: no warning
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from clbench.strategy import Strategy\n"
        "    import clbench.registry\n"
        "assert Strategy is new.Strategy and sys.modules['clbench.strategy'] is new\n"
        "assert clbench.registry is sys.modules['clbench.core.registry']\n"
        "texts = [str(w.message) for w in seen if w.category is DeprecationWarning]\n"
        "assert 'clbench.strategy moved to clbench.methods.contract; import it from there' in texts, texts\n"
        "assert any('clbench.registry moved to clbench.core.registry' in t for t in texts), texts\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_name_that_never_existed_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("clbench.no_such_module")
