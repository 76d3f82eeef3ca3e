"""The settings that lower a safety barrier: they come from the command line only, never from a file.

Each of these flags makes clbench trust content it otherwise refuses (a pickled checkpoint, data that fails `clbench
data check`). A flag typed by the user says "I made this content, or I accept it"; a key in a YAML settings file
says only that someone wrote the file, and a handed settings file plus a handed run folder or data root must never
run code or read what the checks refuse. So every reader of a settings file (``clbench run --config``, ``clbench
sweep --config`` and its groups, ``clbench report --study``) refuses these keys, naming the key and the reason.
:data:`COMMAND_LINE_ONLY` is the one list; add a future opt-in of the kind here.
"""

from __future__ import annotations

from clbench.errors import ClbenchError

# flag (without the dashes) -> what it trusts, said in the refusal
COMMAND_LINE_ONLY: dict[str, str] = {
    "trust-checkpoint": ("it unpickles the run folder's old checkpoint.pt, which executes any code the file carries"),
    "ignore-data-problems": (
        "it runs on data that `clbench data check` refuses (train/test leaks, unreadable files, links that leave "
        "the data root)"
    ),
}


def file_key_problem(key: str) -> str | None:
    """Why ``key`` (a settings file's key, ``_`` read as ``-``) may not come from a file; None for other keys."""
    why = COMMAND_LINE_ONLY.get(key.replace("_", "-"))
    return None if why is None else f"a file may not switch it on: {why}"


def refuse_in_file(key: str, where: str) -> None:
    """Raise for a command-line-only ``key`` read from the file ``where`` (the refusal names both and the reason)."""
    problem = file_key_problem(key)
    if problem is not None:
        flag = "--" + key.replace("_", "-")
        raise ClbenchError(
            f"{where}: {key}: {flag} is taken from the command line only; {problem}",
            f"remove {key} from the file, and pass {flag} yourself if you trust what it opens",
        )
