"""The command a run record names: what the user typed (``clbench ...``), every absolute path relative to the
working directory or ``<abs>/NAME`` outside it, so that a record names no folder of the machine it was made on."""

from __future__ import annotations

import sys
from pathlib import Path

_INVOKED: list[str] | None = None  # the arguments clbench.cli.main was given, where a run came through the CLI


def set_invocation(args: list[str] | None) -> None:
    """Remember the arguments ``clbench`` was given (clbench.cli.main) for the records its runs write."""
    global _INVOKED
    _INVOKED = None if args is None else list(args)


def command_line(cwd: Path | None = None) -> str:
    """The run's command as the user typed it: ``clbench`` and its arguments (whichever interpreter, worktree or
    entry point started it), every absolute path relative to the working directory, or ``<abs>/NAME`` where it lies
    outside (a record names no folder of the machine it was made on). Outside the CLI (``clbench.run.harness.run`` from
    Python) the process's own command, likewise."""
    words = ["clbench", *_INVOKED] if _INVOKED is not None else list(sys.argv)
    return as_typed(words, Path.cwd() if cwd is None else cwd)


# the entry points a clbench command runs through: the console script, ``python -m clbench``, ``clbench/cli.py``
_CLBENCH_PROGRAMS = ("bin/clbench", "clbench/__main__.py", "clbench/cli.py")


def as_typed(words: list[str], cwd: Path | None) -> str:
    """``words`` as a command line a user would type: the program ``clbench`` where it is one of clbench's entry
    points (``pytest`` for pytest's), absolute paths made relative to ``cwd`` where inside it and ``<abs>/NAME``
    elsewhere (``cwd`` None: every absolute path, as for a record read on another machine), in the ``--flag=PATH``
    form too."""
    if not words:
        return ""
    program = words[0].replace("\\", "/")
    if program == "clbench" or program.endswith(_CLBENCH_PROGRAMS):
        program = "clbench"
    elif program.endswith(("pytest/__main__.py", "bin/pytest")):
        program = "pytest"
    else:
        program = _relative(program, cwd)
    return " ".join([program, *(_word(w, cwd) for w in words[1:])])


def _word(word: str, cwd: Path | None) -> str:
    flag, eq, value = word.partition("=")
    if eq and flag.startswith("-") and value.startswith("/"):
        return f"{flag}={_relative(value, cwd)}"
    return _relative(word, cwd) if word.startswith("/") else word


def _relative(path: str, cwd: Path | None) -> str:
    if not path.startswith("/"):
        return path
    p = Path(path)
    if cwd is not None:
        try:
            return str(p.relative_to(cwd)) or "."
        except ValueError:
            pass
    return f"<abs>/{p.name}" if p.name else "<abs>"
