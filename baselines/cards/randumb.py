"""RanDumb's card: its settings (:class:`RanDumbConfig`, the defaults its reference uses) and its named profiles,
torch-free, so that reports, the gate and the CLI read them without loading the method (``baselines/randumb.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from clbench.catalog import MethodCard
from clbench.config import CI_INPUT


@dataclass(frozen=True)
class RanDumbConfig:
    """Defaults: ``src/main.py`` ``parse_args`` and ``scripts/runall.sh``'s runs on pre-trained ViT features."""

    embed: bool = True  # main.py embeds in every run (its branch tests --embed_mode 'RanDumb' only, never --embed)
    M: int = 10000  # --embed_dim default: the random Fourier features' width
    gamma: float = 0.0  # RBFSampler(gamma='scale'), written 0: 1 / (d Var(x)); > 0: that RBF gamma

    def __post_init__(self) -> None:
        if self.M < 1:
            raise ValueError(f"M must be >= 1, got {self.M}")
        if not self.gamma >= 0.0 or math.isinf(self.gamma):
            raise ValueError(f"gamma must be a finite number >= 0 (0 = 'scale'), got {self.gamma}")


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the whole embedded benchmark at 56 px (the
# shared CI feature cache) with M = 1,000 random Fourier features (runall.sh's smallest width) instead of
# 10,000: a few seconds on 2 cores instead of minutes.
PROFILES: dict[str, dict[str, Any]] = {"ci": {**CI_INPUT, "M": 1000}}
CARD = MethodCard("randumb", RanDumbConfig, PROFILES)
