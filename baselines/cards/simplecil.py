"""SimpleCIL's card: its settings (:class:`SimpleCILConfig`, the defaults its reference uses) and its named profiles,
torch-free, so that reports, the gate and the CLI read them without loading the method (``baselines/simplecil.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clbench.catalog import MethodCard
from clbench.config import CI_INPUT


@dataclass(frozen=True)
class SimpleCILConfig:
    """SimpleCIL has no hyperparameters beyond the backbone; kept for the uniform --set interface."""


# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the embedded benchmark at 56 px (4x4
# patches of 14 px) so that every CI run shares one feature cache and the whole gate fits in 8 minutes on 2 cores.
PROFILES: dict[str, dict[str, Any]] = {"ci": dict(CI_INPUT)}
CARD = MethodCard("simplecil", SimpleCILConfig, PROFILES)
