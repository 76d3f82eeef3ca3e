"""A method's search space: which settings ``clbench tune`` varies, over which ranges, on which scale.

The space is declared on the method's card (``MethodCard.tune_space``), as data beside its settings::

    tune_space={"shrinkage": (1e-6, 0.5, True), "M": (1024, 16384, True), "head": ("plain", "cosine")}

A pair or triple of numbers is a range ``(low, high[, log])``, drawn as the setting's type (an ``int`` setting gives
integers); a tuple of strings or booleans is a set of choices. A YAML file (``--space FILE.yaml``) overrides it with
the same shapes: ``shrinkage: [1.0e-6, 0.5, log]``, ``M: {low: 1024, high: 16384, log: true}``,
``head: {choices: [plain, cosine]}``; a setting the file names replaces the card's, the others stay, and
``lr: null`` leaves the card's ``lr`` out of the search (it keeps its default, or its ``--set`` value).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import card
from clbench.errors import ClbenchError
from clbench.run.configfile import load


@dataclass(frozen=True)
class Dimension:
    """One setting's range (``low``, ``high``, ``log``) or its ``choices``; ``kind``: int, float, or
    None for choices."""

    name: str
    kind: type | None
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if self.kind is None:
            return {"choices": list(self.choices)}
        return {"low": self.low, "high": self.high, "log": self.log, "type": self.kind.__name__}

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws for this setting."""
        if self.kind is None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind is int:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)  # type: ignore[arg-type]

    def contains(self, value: Any) -> bool:
        if self.kind is None:
            return value in self.choices
        return isinstance(value, (int, float)) and self.low <= value <= self.high  # type: ignore[operator]


def _dimension(strategy: str, name: str, spec: Any, hints: Mapping[str, Any], where: str) -> Dimension:
    """One entry of a space (the card's tuple or a YAML file's list or mapping) as a :class:`Dimension`."""
    if name not in hints:
        valid = ", ".join(sorted(hints))
        raise ClbenchError(f"{where}: {strategy} has no setting {name!r}", f"name one of: {valid}")
    typ = hints[name]
    base = next((a for a in typing.get_args(typ) if a is not type(None)), typ)
    if isinstance(spec, Mapping):
        if "choices" in spec:
            spec = tuple(spec["choices"])
        else:
            spec = (spec.get("low"), spec.get("high"), spec.get("log", False))
    if isinstance(spec, list):
        spec = tuple(spec)
    numeric = base in (int, float)
    if numeric and isinstance(spec, tuple) and len(spec) in (2, 3) and not isinstance(spec[0], (str, bool)):
        low, high = spec[0], spec[1]
        log = spec[2] if len(spec) == 3 else False
        log = log == "log" if isinstance(log, str) else log
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) and low < high
        if not ok or not isinstance(log, bool) or (log and low <= 0):
            raise ClbenchError(
                f"{where}: {strategy}.{name}: {spec!r} is not a range",
                "give [low, high] or [low, high, log] with low < high (and low > 0 on a log scale)",
            )
        return Dimension(name, base, low, high, log)
    if isinstance(spec, tuple) and spec:
        return Dimension(name, None, choices=spec)
    raise ClbenchError(
        f"{where}: {strategy}.{name}: {spec!r} is neither a range nor a list of choices",
        "give [low, high], [low, high, log] or {choices: [a, b]}",
    )


def search_space(strategy: str, path: str | None = None) -> dict[str, Dimension]:
    """The search space of ``strategy``: its card's ``tune_space`` with the YAML file ``path`` on top. A
    ClbenchError when neither declares one, or for a setting the method does not have."""
    c = card(strategy)
    hints = typing.get_type_hints(c.Config)
    declared = dict(getattr(c, "tune_space", None) or {})
    space = {k: _dimension(strategy, k, v, hints, f"{strategy}'s card") for k, v in declared.items()}
    if path is not None:
        data = load(path)
        data = data.get(strategy, data) if isinstance(data.get(strategy), dict) else data
        for k, v in data.items():
            if v is None:  # `KEY: null`: not searched
                if str(k) not in hints:
                    valid = ", ".join(sorted(hints))
                    raise ClbenchError(f"--space {path}: {strategy} has no setting {k!r}", f"name one of: {valid}")
                space.pop(str(k), None)
                continue
            space[str(k)] = _dimension(strategy, str(k), v, hints, f"--space {path}")
    if not space:
        raise ClbenchError(
            f"{strategy} declares no search space (its card has no tune_space)",
            "give one with --space FILE.yaml, e.g. `lr: [1.0e-4, 0.1, log]`",
        )
    return space


def defaults_in(strategy: str, space: Mapping[str, Dimension]) -> dict[str, Any] | None:
    """The method's default settings restricted to ``space``, where every one lies inside it (the study's first
    trial), else None."""
    fields = {f.name: f.default for f in dataclasses.fields(card(strategy).Config)}
    values = {k: fields.get(k) for k in space}
    return values if all(d.contains(values[k]) for k, d in space.items()) else None


def as_setting(value: Any) -> str:
    """A drawn value as ``--set`` reads it (floats at full precision, booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)
