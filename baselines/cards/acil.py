"""ACIL's card: its settings (:class:`ACILConfig`, the defaults its reference uses) and its named profiles, torch-free,
so that reports, the gate and the CLI read them without loading the method (``baselines/acil.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clbench.catalog import MethodCard
from clbench.config import CI_INPUT
from clbench.layers.checks import SOLVERS


@dataclass(frozen=True)
class ACILConfig:
    """Defaults: ``config.py`` of the reference (its argparse defaults, which the README's commands keep)."""

    M: int = 8192  # buffer size, --buffer-size 8192 (README: CIFAR-100; 16384 on ImageNet-1k)
    gamma: float = 0.1  # --gamma 0.1 (README: "On both CIFAR-100 and ImageNet-1k, gamma is 0.1")
    il_batch_size: int = 4096  # --IL-batch-size 4096 in every README command; memory only for ACIL
    eval_batch_size: int = 4096  # rows per prediction block (the README's IL batch size); memory only
    solver: str = "auto"  # clbench: the dual form while it is the cheaper form; "recursive": the reference's

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if self.M < 1:
            raise ValueError(f"M must be >= 1, got {self.M}")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0 (R starts at I / gamma), got {self.gamma}")
        if self.il_batch_size < 1:
            raise ValueError(f"il_batch_size must be >= 1, got {self.il_batch_size}")
        if self.eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")


# ``ci``: the regression gate's run: the embedded benchmark at 56 px (the shared CI feature cache), the
# reference's gamma and a buffer of 2048 (one 2048 x 2048 float64 R, so the run takes about a second).
PROFILES: dict[str, dict[str, Any]] = {"ci": {**CI_INPUT, "M": 2048}}
CARD = MethodCard("acil", ACILConfig, PROFILES)
