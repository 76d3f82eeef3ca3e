"""``clbench perf instant-errors``: the seconds a user waits for clbench to refuse a mistyped command.

Each wrong command of :data:`WRONG_COMMANDS` (a misspelt strategy, benchmark, backbone, profile, ``--set`` key or
scenario, a strategy setting given as a flag, a sweep's flag given to ``run``) runs as a fresh ``clbench`` process,
``--repeat`` times; the record keeps every wall-clock time, the median, the exit code, the error line and whether
torch was imported (it must not be: these are refused from the catalog and the methods' cards, before anything
loads). The CPU is named after the timings, by a separate process that imports torch
(``torch.backends.cpu.get_cpu_capability()``), so that the timed processes never pay for it.
``tests/test_cli_instant.py`` runs the same commands and checks the refusal and that torch stayed out; this
measurement says how long they take.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import clbench
from clbench.core.catalog import STRATEGIES, card
from clbench.perf import arg, measurement
from clbench.run.scenario import declared_scenarios


def _examples() -> tuple[str, str, str]:
    """From the catalog (no method is named here): a strategy with an ``epochs`` setting, a misspelling of it one
    letter off, and a strategy without the domain scenario."""
    import dataclasses

    names = STRATEGIES.names()
    trained = next(n for n in names if "epochs" in {f.name for f in dataclasses.fields(card(n).Config)})
    typo = trained[:-1] + ("x" if trained[-1] != "x" else "y")
    class_only = next(n for n in names if n != trained and "domain" not in declared_scenarios(n))
    return trained, typo, class_only


S, TYPO, CLASS_ONLY = _examples()
# (what is wrong, the command's arguments, a piece of the error or hint the user must see)
WRONG_COMMANDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("strategy", ("run", "--strategy", TYPO), f"did you mean '{S}'"),
    ("benchmark", ("run", "--strategy", S, "--bench", "emojis"), "unknown benchmark 'emojis'"),
    ("backbone", ("run", "--strategy", S, "--backbone", "vit_tiny"), "unknown backbone 'vit_tiny'"),
    ("profile", ("run", "--strategy", S, "--profile", "quik"), "did you mean 'quick'"),
    ("--set key", ("run", "--strategy", S, "--set", "epochz=3"), "did you mean 'epochs'"),
    ("--set value", ("run", "--strategy", S, "--set", "epochs=many"), "expected a value of type int"),
    ("scenario", ("run", "--strategy", S, "--scenario", "domian"), "valid scenarios: class, domain"),
    (
        "unsupported scenario",
        ("run", "--strategy", CLASS_ONLY, "--bench", "emoji-domains", "--scenario", "domain"),
        f"{CLASS_ONLY} does not support",
    ),
    ("setting as a flag", ("run", "--strategy", S, "--epochs", "5"), "--set epochs=5"),
    ("sweep flag", ("run", "--strategy", S, "--seeds", "1993,1994"), "clbench sweep"),
    # a sweep refuses before it makes its folder: OUT is never created
    ("sweep strategy", ("sweep", "--strategies", f"{S},{TYPO}", "--out", "never-made"), f"did you mean '{S}'"),
    ("sweep --set key", ("sweep", "--strategies", f"{S},{CLASS_ONLY}", "--set", "epochz=3", "--out", "never-made"),
     "epochs"),
)  # fmt: skip
# Run in the child: clbench's main, then whether torch was imported, on stderr's last line.
PROBE = (
    "import sys\n"
    "from clbench.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('torch imported: ' + str('torch' in sys.modules), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def run_wrong(argv: tuple[str, ...] | list[str], cwd: str | None = None) -> tuple[int, str, bool]:
    """Run ``clbench ARGV`` in a fresh interpreter, in ``cwd``, with this clbench: (exit code, stderr without the
    probe's line, torch imported)."""
    root = str(Path(clbench.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )
    lines = done.stderr.rstrip("\n").split("\n")
    imported = lines[-1] == "torch imported: True"
    return done.returncode, "\n".join(lines[:-1]), imported


def _cpu_capability() -> str:
    """``torch.backends.cpu.get_cpu_capability()``, asked by a process of its own after every timing."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return done.stdout.strip() or f"unknown ({done.stderr.strip()[-200:]})"


@measurement(
    "instant-errors",
    "the seconds clbench takes to refuse each mistyped command (strategy, benchmark, profile, --set, scenario, flags)",
    args=(arg("--repeat", type=int, default=5, help="runs of each command (default: 5)"),),
)
def instant_errors(flags: argparse.Namespace) -> dict[str, Any]:
    repeat = max(1, flags.repeat)
    rows = []
    for what, argv, needle in WRONG_COMMANDS:
        seconds, code, err, imported = [], 0, "", False
        for _ in range(repeat):
            start = time.perf_counter()
            code, err, torch_now = run_wrong(argv)
            seconds.append(round(time.perf_counter() - start, 3))
            imported = imported or torch_now
        rows.append(
            {
                "what": what,
                "command": "clbench " + " ".join(argv),
                "exit_code": code,
                "refused_as_expected": code == 2 and needle in err,
                "torch_imported": imported,
                "seconds": seconds,
                "median_s": round(statistics.median(seconds), 3),
                "error": err.strip().split("\n")[0][:300],
            }
        )
        print(f"{rows[-1]['median_s']:6.2f} s  {rows[-1]['command']}", file=sys.stderr)
    return {
        "benchmark": "instant-errors",
        "what": "wall-clock seconds from starting `clbench ARGS` to its exit with the refusal, each command in a fresh "
        "Python process (the interpreter's start included)",
        "goal_s": 1.5,
        "repeat": repeat,
        "commands": rows,
        "max_median_s": max(r["median_s"] for r in rows),
        "cpu_count": os.cpu_count(),
        "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "cpu_capability": _cpu_capability(),  # last: the only process that imports torch
    }
