"""A researcher's first commands: ``clbench list`` shows what each method trains and its profiles, ``clbench list
NAME`` its settings, reference and deviations; every mistyped command is refused with a pointer to what was meant,
before torch is imported (each in a fresh process, torch's presence checked in ``sys.modules``: not a timed test; the
seconds are ``clbench perf instant-errors``' business, reports/perf/instant-errors.json)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clbench.cli import main
from clbench.core.catalog import CARDS, COMMON_PROFILES, FAMILIES, STRATEGIES, card
from clbench.perf.instant_errors import WRONG_COMMANDS, run_wrong


@pytest.mark.parametrize("what,argv,needle", WRONG_COMMANDS, ids=[w for w, _, _ in WRONG_COMMANDS])
def test_a_wrong_command_is_refused_before_torch_is_imported(what, argv, needle, tmp_path):
    code, err, torch_imported = run_wrong(argv, cwd=str(tmp_path))
    assert code == 2, err
    assert needle in err and "Traceback" not in err, err
    lines = err.strip("\n").split("\n")  # one error line, at most one hint line
    assert lines[0].startswith("clbench: error: ") and len(lines) <= 2, err
    assert len(lines) == 1 or lines[1].startswith("  hint: "), err
    assert not torch_imported, f"{what}: torch was imported before the refusal"
    assert list(tmp_path.iterdir()) == []  # nothing written (a sweep's folder included)


def _run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize(
    "argv,hint",
    [
        (["run", "--strategy", "l2p", "--pool-size=20"], "give it as --set pool_size=20 (`clbench list l2p`"),
        (["run", "--epochs", "5"], "--set epochs=5"),
        (["run", "--seeds", "1993,1994"], "clbench sweep --strategies STRATEGY --seeds 1993,1994"),
        (["run", "--strategy", "tosca", "--seed-order", "3"], "did you mean --seed"),
        (["sweep", "--strategies", "tosca", "--epochs", "3"], "--set epochs=3"),
        (["list", "--wide"], "see `clbench list --help`"),
    ],
)
def test_an_unknown_flag_points_to_what_was_meant(argv, hint, capsys):
    code, _, err = _run(argv, capsys)
    assert code == 2 and "unrecognized arguments" in err and hint in err, err


def test_every_method_has_the_common_profiles_a_family_and_what_it_trains():
    for name in STRATEGIES.names():
        c = card(name)
        assert set(COMMON_PROFILES) <= set(c.profiles), name
        assert c.profiles["default"] == {}, name  # the reference settings
        assert c.family in FAMILIES and c.trains, name
    assert set(CARDS.names()) == set(STRATEGIES.names())


def test_list_is_a_table_of_methods_uncut_when_written_to_a_file(tmp_path):
    """Piped to a file, no line is cut at 80 columns: every method's full "what it trains" text is there."""
    done = subprocess.run([sys.executable, "-m", "clbench.cli", "list"], capture_output=True, text=True, check=True)
    out = done.stdout
    for name in STRATEGIES.names():
        c = card(name)
        row = next(line for line in out.splitlines() if line.startswith(f"│ {name} "))
        for piece in (FAMILIES[c.family], c.trains, ", ".join(c.profiles)):
            assert piece in row, (name, piece, row)
    assert max(len(line) for line in out.splitlines()) > 120
    assert "vit_base_patch16_224.augreg2_in21k_ft_in1k" in out and "emoji-domains" in out


def test_list_name_shows_the_methods_card(capsys):
    code, out, _ = _run(["list", "tosca"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "arXiv 2502.14762" in text  # the reference
    assert "│ epochs │ int │ 20 │ reference config │" in text  # a setting: type, default, its comment
    assert "│ quick │ img_size=112 │" in text and "│ default │ the reference settings (no change) │" in text
    assert "deviations from the paper / reference code:" in text and 'train_mode="cached"' in out.replace("`", "")


def test_every_setting_of_every_method_has_a_one_line_meaning_and_every_method_a_reference():
    from clbench.run.describe import describe

    for name in STRATEGIES.names():
        info = describe(name)
        assert info.reference and info.deviations, name
        assert all(s.help for s in info.settings), (name, [s.name for s in info.settings if not s.help])


def test_list_of_an_unknown_name_suggests_the_closest(capsys):
    code, _, err = _run(["list", "tosa"], capsys)
    assert code == 2 and "did you mean 'tosca'" in err
    code, out, _ = _run(["list", "emoji-domains"], capsys)  # a benchmark's name: its line
    assert code == 0 and out.startswith("emoji-domains: benchmark (--bench): Embedded, domain-incremental")


def test_the_quick_profile_of_every_method_is_a_valid_config():
    from clbench.core.config import make_strategy_config

    for name in STRATEGIES.names():
        c = card(name)
        assert make_strategy_config(c, "quick", ()) is not None
        assert c.profiles["quick"].get("img_size") == 112, name  # the shared short CPU input
