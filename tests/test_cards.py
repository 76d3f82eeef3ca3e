"""Method cards (clbench.core.catalog.MethodCard): every built-in method's name, settings class and profiles live in
a torch-free module whose card decorates its strategy class, so that reading records, reports and study files loads
no method and no torch (a plug-in's card is read from its class: tests/test_plugin_strategy.py runs one through
`report`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clbench.core.catalog import CARDS, STRATEGIES, card

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "records"


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_the_strategy_takes_its_settings_and_profiles_from_its_card(name):
    cls, c = STRATEGIES.get(name), card(name)
    assert name in CARDS and c.name == cls.name == name
    assert cls.Config is c.Config and cls.profiles is c.profiles
    assert cls.card is c  # its parameter formula and cost model too: the class states neither itself
    assert c.param_formula is not None and c.work is not None
    assert "param_formula" not in vars(cls) and "work" not in vars(cls)


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_the_class_restates_nothing_its_card_declares(name):
    """The card is the method's one declaration: its class is decorated with it (``@CARD.strategy``) and its source
    names neither its name, nor its settings class, nor its profiles, nor its card as class attributes."""
    import inspect
    import re

    source = inspect.getsource(STRATEGIES.get(name))
    assert source.startswith("@CARD.strategy\n"), source[:200]
    restated = re.findall(r"^    (name|Config|profiles|card)\s*(?::[^=\n]*)?=", source, flags=re.M)
    assert not restated, restated


# What the tools read of a method: data on its card (a field with a default), never an attribute of the method contract.
TOOL_DATA = (
    "gate_scenarios",
    "projection_profiles",
    "perf_benchmarks",
    "unit_seconds",
    "embedding",
    "min_train_per_class",
    "work",
    "split_kept",
)


def test_tool_data_is_on_the_card_not_on_the_method_contract():
    from clbench.core.catalog import MethodCard
    from clbench.methods.contract import Strategy

    fields = set(MethodCard.__dataclass_fields__)
    assert all(name in fields for name in TOOL_DATA), set(TOOL_DATA) - fields
    assert not [name for name in TOOL_DATA if hasattr(Strategy, name)]
    for name in STRATEGIES.names():
        assert not [d for d in TOOL_DATA if hasattr(STRATEGIES.get(name), d)], name


def _fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter at the repository root; it must exit 0."""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


LOADED = (  # what must not be imported: torch, a method's learning code (its card under baselines.cards is fine)
    "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'clbench.run.harness'"
    " or (m.startswith(('baselines.', 'tosca.')) and not m.startswith('baselines.cards') and m != 'tosca.card'))\n"
    "assert not loaded, loaded\n"
)


def test_every_card_and_every_profile_builds_without_torch():
    _fresh(
        "import sys\n"
        "from clbench.core.catalog import STRATEGIES, card\n"
        "from clbench.core.config import make_strategy_config\n"
        "for name in STRATEGIES.names():\n"
        "    c = card(name)\n"
        "    for profile in (None, *c.profiles):\n"
        "        make_strategy_config(c, profile, ())\n" + LOADED
    )


def test_every_parameter_formula_and_cost_model_is_read_without_torch():
    """`clbench perf params` and the projection's cost model need only the cards: ViT-B/16's width and depth, ten
    tasks of ten classes, each method's default settings."""
    _fresh(
        "import sys\n"
        "from clbench.core.catalog import STRATEGIES, card\n"
        "from clbench.core.costs import ParamCounts, RunShape, Work\n"
        "shape = RunShape.equal(50_000, 10_000, 10)\n"
        "for name in STRATEGIES.names():\n"
        "    c = card(name)\n"
        "    counts = c.param_formula(c.Config(), 768, 12, (10,) * 10)\n"
        "    assert isinstance(counts, ParamCounts) and len(counts.added_per_task) == 10, name\n"
        "    assert isinstance(c.work(c.Config(), shape), Work), name\n" + LOADED
    )


def test_a_report_and_a_study_file_are_read_without_torch(tmp_path):
    """`clbench report` over records (tables, figures, the HTML page), and the study file's planned runs."""
    _fresh(
        "import sys\n"
        "from clbench.cli import build_parser, main\n"
        "from clbench.report.leaderboard import study_groups\n"
        f"assert main(['report', {str(FIXTURES)!r}, '--out', {str(tmp_path / 'report')!r}]) == 0\n"
        "groups = study_groups('reports/emoji-table.yaml', build_parser)\n"
        "assert sum(len(planned) for *_, planned in groups) > 40\n" + LOADED
    )
