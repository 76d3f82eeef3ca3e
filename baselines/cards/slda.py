"""SLDA's card: its settings (:class:`SLDAConfig`, the defaults its reference uses) and its named profiles, torch-free,
so that reports, the gate and the CLI read them without loading the method (``baselines/slda.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from clbench.catalog import MethodCard
from clbench.config import CI_INPUT


@dataclass(frozen=True)
class SLDAConfig:
    """Defaults: Avalanche ``StreamingLDA.__init__``."""

    shrinkage: float = 1e-4  # shrinkage_param=1e-4: Sigma -> (1 - eps) Sigma + eps I before the inverse
    streaming_update_sigma: bool = True  # streaming_update_sigma=True: the covariance keeps learning (plastic)
    sigma_update: Literal["exact", "reference"] = "exact"  # "reference": fit()'s update (see the deviations)

    def __post_init__(self) -> None:
        if not 0.0 <= self.shrinkage <= 1.0:
            raise ValueError(f"shrinkage must be in [0, 1], got {self.shrinkage}")
        if self.sigma_update not in ("exact", "reference"):
            raise ValueError(f"sigma_update must be 'exact' or 'reference', got {self.sigma_update!r}")


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the whole embedded benchmark at 56 px (the
# shared CI feature cache), the reference's defaults; it runs in about a second on cached features.
PROFILES: dict[str, dict[str, Any]] = {"ci": {**CI_INPUT}}
CARD = MethodCard("slda", SLDAConfig, PROFILES)
