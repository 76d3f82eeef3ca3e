"""User-facing errors.

A :class:`ClbenchError` carries a message that names the problem and the fix. The CLI prints it on one
line (plus an optional hint) and exits non-zero, never with a traceback. Library code raises it for every
condition a user can cause (bad names, bad paths, bad files); programming errors stay ordinary exceptions.
"""

from __future__ import annotations


class ClbenchError(Exception):
    """An error caused by the user's input or environment, with a message saying how to fix it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg}\n  hint: {self.hint}" if self.hint else msg
