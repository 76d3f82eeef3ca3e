"""clbench: class-incremental learning on frozen pre-trained Vision Transformers.

Importing the package is cheap on purpose (``clbench --help`` must answer in about a second): torch,
timm and Avalanche are imported only by the modules that need them.

It sets one thing before torch loads: OpenMP's wait policy to passive (unless ``OMP_WAIT_POLICY`` is set already).
OpenMP's default keeps idle threads spinning, which makes two threads collapse when another process holds a core:
ViT-S/14 feature extraction on a 2-core CPU with one core busy ran at 0.37-0.39x of the best idle throughput with
the default policy and 0.48-0.61x with passive (``clbench perf threads``, ``reports/perf/threads-*.json``), for
0-13 % less when idle. OpenMP reads the variable once, when torch is first imported, so :data:`OMP_WAIT_POLICY`
records what is in force.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The policy OpenMP runs with in this process ("default" when torch was imported first with the variable unset).
OMP_WAIT_POLICY: str = (
    _os.environ.get("OMP_WAIT_POLICY", "default")
    if "torch" not in _sys.modules
    else _os.environ.get("OMP_WAIT_POLICY", "default (torch imported before clbench)")
)
# Modules that moved into the packages (clbench/README.md, "Where the code lives"): the old dotted names still import,
# as the same module object, with a DeprecationWarning naming the new one, so plug-ins written against them keep
# working. Names only: nothing is imported until an old name is.
MOVED: dict[str, str] = {
    "harness": "run.harness",
    "config": "core.config",
    "configfile": "run.configfile",
    "checkpoint": "run.checkpoint",
    "rundir": "run.rundir",
    "scenario": "run.scenario",
    "precision": "core.precision",
    "catalog": "core.catalog",
    "registry": "core.registry",
    "avalanche_api": "run.avalanche_api",
    "trackers": "run.trackers",
    "strategy": "methods.contract",
    "blocks": "methods.shared",
    "routers": "methods.routers",
    "training_check": "methods.training_check",
    "backbones": "features.backbones",
    "embeddings": "features.embeddings",
    "transforms": "features.transforms",
    "decoded": "features.decoded",
    "datacheck": "benchmarks.check",
    "metrics": "evaluation.metrics",
    "stats": "evaluation.stats",
    "results": "records.results",
    "predictions": "records.predictions",
    "routing_diagnostics": "records.routing_diagnostics",
    "upgrade": "records.upgrade",
    "owned": "files.safety",
    "text": "files.escape",
    "safestate": "files.safestate",
    "typedfile": "files.typedfile",
    "machine": "perf.doctor",
}  # clbench.features and clbench.files are packages now: their old functions are in .cache and .atomic


class _MovedFinder:
    """Imports ``clbench.<old>`` as the module it moved to (the same object: classes and registries are shared)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> object:
        import importlib.util

        old = name.removeprefix("clbench.")
        if not name.startswith("clbench.") or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, _MovedLoader(f"clbench.{MOVED[old]}"))


class _MovedLoader:
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: object) -> object:
        import importlib
        import warnings

        old = getattr(spec, "name", "")
        warnings.warn(f"{old} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: object) -> None:  # the module ran when it was imported under its new name
        return None


_sys.meta_path.insert(0, _MovedFinder())  # before an editable install's finder, which may know the old files
