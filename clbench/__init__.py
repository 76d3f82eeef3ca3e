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
