"""Import one submodule of a heavy package without running the package's ``__init__`` first.

``import avalanche.benchmarks.scenarios.supervised`` runs ``avalanche/__init__.py``, which imports all of
Avalanche (its classic benchmark catalogue, metrics through torchmetrics and scipy, training, models: about 5 s),
and ``from torchvision import transforms`` runs ``torchvision/__init__.py``, which imports ``torchvision.ops`` and
through it ``torch._dynamo`` (about 4 s). clbench's run path needs only Avalanche's scenario classes and
torchvision's PIL transforms, so :func:`submodule` registers each parent package as an *uninitialised* package
module (its search path set, its ``__init__`` not run) and imports the submodule normally beneath it.

Nothing is lost for code that wants the whole package: the first attribute of such a parent that is not there yet
(``avalanche.benchmarks.SplitMNIST``, ``torchvision.__version__``, ``torchvision.datasets``) runs the package's
``__init__`` in the same module object, so ``import avalanche`` followed by any use of it behaves as usual;
:func:`complete` does the same on purpose (``clbench.run.avalanche_api`` does it: its users drive Avalanche itself).
Nor for code that imports another submodule: ``from avalanche.training.plugins import EvaluationPlugin`` after a
clbench run in the same process runs ``avalanche/__init__`` first, as an ordinary import would (:class:`_WholeFirst`;
without it, Avalanche's training package imported before its benchmarks fails on a circular import).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

_DEFERRED: dict[str, Any] = {}  # package name -> its spec, for the packages whose __init__ has not run yet
_BUSY = [0]  # > 0 while submodule() or complete() imports: their own imports beneath deferred packages pass as they are


class _Loaded(importlib.abc.Loader):
    """Hands the import system a module that completing its package has already executed, without executing it
    again (its own spec restored)."""

    def __init__(self, module: ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: Any) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec


class _WholeFirst(importlib.abc.MetaPathFinder):
    """An import of a submodule not imported yet beneath a deferred package, by code other than clbench's own
    deferred imports, runs the deferred ``__init__`` first (:func:`complete`), as an ordinary import of the package
    would have; where that imported the submodule, the import gets it as it is."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.partition(".")[0]
        if _BUSY[0] or top == fullname or top not in _DEFERRED:
            return None
        complete(top)
        module = sys.modules.get(fullname)
        return None if module is None else importlib.util.spec_from_loader(fullname, _Loaded(module))


def _completing(name: str) -> Any:
    """The module ``__getattr__`` (PEP 562, asked only for attributes not there yet) of deferred package ``name``:
    it runs the package's ``__init__`` and answers from the whole package."""

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__") and attr != "__version__":
            raise AttributeError(attr)  # import machinery probes (__path__ is set; __file__, __spec__ too)
        complete(name)
        return getattr(sys.modules[name], attr)

    return __getattr__


def _deferred_package(name: str) -> ModuleType:
    """``sys.modules[name]``: the package if imported, else a new module of it whose ``__init__`` runs later."""
    if name in sys.modules:
        return sys.modules[name]
    parent, _, child = name.rpartition(".")
    if parent:
        _deferred_package(parent)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.loader is None:
        return importlib.import_module(name)  # not a package on disk: import it the ordinary way
    module = importlib.util.module_from_spec(spec)

    module.__dict__["__getattr__"] = _completing(name)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)
    _DEFERRED[name] = spec
    return module


def complete(name: str) -> ModuleType:
    """Run the deferred ``__init__`` of package ``name`` and of its deferred subpackages, innermost first (the order an
    ordinary import finishes them in: ``avalanche/__init__`` expects ``avalanche.benchmarks`` whole); the package."""
    _BUSY[0] += 1
    try:
        for pkg in sorted((p for p in _DEFERRED if p == name or p.startswith(name + ".")), key=len, reverse=True):
            spec = _DEFERRED.pop(pkg)
            module = sys.modules[pkg]
            module.__dict__.pop("__getattr__", None)
            try:
                spec.loader.exec_module(module)
            except BaseException:
                _DEFERRED[pkg] = spec
                module.__dict__["__getattr__"] = _completing(pkg)
                raise
        return importlib.import_module(name)
    finally:
        _BUSY[0] -= 1


def submodule(name: str, defer: tuple[str, ...]) -> ModuleType:
    """Import module ``name`` (``"avalanche.benchmarks.scenarios.supervised"``) with the packages ``defer``
    (``("avalanche", "avalanche.benchmarks")``, outermost first), where not imported yet, registered uninitialised
    (module docstring); other parents import as usual."""
    if name in sys.modules:
        return sys.modules[name]
    if not any(isinstance(f, _WholeFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _WholeFirst())
    _BUSY[0] += 1
    try:
        for package in defer:
            _deferred_package(package)
        return importlib.import_module(name)
    finally:
        _BUSY[0] -= 1


def deferred() -> list[str]:
    """The packages whose ``__init__`` has been deferred and not run yet."""
    return sorted(_DEFERRED)
