"""One small generic registry, used for strategies, benchmarks and backbones alike.

Unknown names raise a :class:`~clbench.errors.ClbenchError` that lists the valid names and suggests the
closest; registering a name twice raises. Entries are registered lazily by module path so that listing
names (``clbench list``, ``clbench --help``) never imports torch.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from clbench.errors import ClbenchError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects of one kind (``kind`` is used in messages, e.g. "strategy")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attribute", imported on first get

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted."""

        def add(o: T) -> T:
            if name in self._items or name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``name`` to resolve to ``module:attribute`` when first asked for."""
        if name in self._items or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._lazy[name] = target

    def names(self) -> list[str]:
        return sorted({*self._items, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def check(self, name: str) -> str:
        """Return ``name`` if registered, else raise a ClbenchError listing the options."""
        if name in self:
            return name
        close = difflib.get_close_matches(name, self.names(), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else None
        raise ClbenchError(f"unknown {self.kind} {name!r}; valid {self.kind} names: {', '.join(self.names())}", hint)

    def get(self, name: str) -> T:
        self.check(name)
        if name not in self._items:
            target = self._lazy[name]
            module, _, attr = target.partition(":")
            try:
                obj = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise ClbenchError(
                    f"{self.kind} {name!r}: cannot load {target} ({e})",
                    "is its module importable here (PYTHONPATH, installed)?",
                ) from None
            del self._lazy[name]
            self._items[name] = obj
        return self._items[name]
