"""User-facing errors.

A :class:`ClbenchError` carries a message that names the problem and the fix. The CLI prints it on one
line (plus an optional hint) and exits non-zero, never with a traceback. Library code raises it for every
condition a user can cause (bad names, bad paths, bad files); programming errors stay ordinary exceptions.

An error about a run setting names the setting, not a command-line flag: the message is written with :func:`setting`
markers, ``str(error)`` shows the setting's Python name (``increment must be >= 1``, as a user of
``RunConfig(increment=0)`` wrote it) and the CLI shows the flag (``--increment must be >=
1``) with :meth:`ClbenchError.render`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from clbench.files.escape import plain

# Settings whose command-line flag is not ``--`` plus the name with dashes.
FLAG_SPELLINGS = {"overrides": "--set"}  # RunConfig.overrides: --set KEY=VALUE
_MARK = "\x1f"  # unit separator: never typed by a user, so a marked name cannot come from a value
_MARKED = re.compile(_MARK + r"([A-Za-z_][A-Za-z0-9_]*)" + _MARK)


def setting(name: str) -> str:
    """``name`` (a :class:`~clbench.core.config.RunConfig` field or another setting) marked for rendering: its Python
    name in ``str(error)``, its flag on the command line."""
    return f"{_MARK}{name}{_MARK}"


class ClbenchError(Exception):
    """An error caused by the user's input or environment, with a message saying how to fix it.

    ``flags``: the command-line spelling of settings marked in the message where, for this error, it is not ``--``
    plus the name with dashes nor :data:`FLAG_SPELLINGS` (e.g. ``seed`` given as ``--seeds`` to ``clbench sweep``)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, flags: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        self.flags = dict(flags or {})

    @property
    def settings(self) -> list[str]:
        """The settings the message is about (marked with :func:`setting`), in order of mention."""
        return list(dict.fromkeys(_MARKED.findall(f"{self.args[0] if self.args else ''} {self.hint or ''}")))

    def _named(self, text: str, as_flags: bool) -> str:
        def name(m: re.Match[str]) -> str:
            key = m.group(1)
            if not as_flags:
                return key
            return self.flags.get(key) or FLAG_SPELLINGS.get(key) or "--" + key.replace("_", "-")

        return _MARKED.sub(name, text)

    def render(self, as_flags: bool = False) -> str:
        """The message and hint, settings named as in Python (default) or as command-line flags."""
        msg = self._named(str(self.args[0]) if self.args else "", as_flags)
        return f"{msg}\n  hint: {self._named(self.hint, as_flags)}" if self.hint else msg

    def for_terminal(self) -> str:
        """:meth:`render` with flags, every control character in the message and the hint made visible (a file
        name can neither break the line nor send escape sequences): one line, plus the hint's."""
        msg = plain(self._named(str(self.args[0]) if self.args else "", True))
        return f"{msg}\n  hint: {plain(self._named(self.hint, True))}" if self.hint else msg

    def __str__(self) -> str:
        return self.render()
