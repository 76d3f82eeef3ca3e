"""The early check of a fresh run: every name and strategy setting read from the catalog and the method's card,
before torch or the method is imported, so that a mistake costs no import (``clbench run`` and ``clbench sweep``).

Kept apart from :mod:`clbench.core.catalog`, which :mod:`clbench.run.scenario` reads: the check needs both."""

from __future__ import annotations

from typing import Any

from clbench.benchmarks import BENCHMARKS
from clbench.benchmarks.folder import with_data_domains
from clbench.core.catalog import BACKBONES, STRATEGIES, card, check_profile
from clbench.core.config import make_strategy_config
from clbench.run.scenario import check_scenario


def check_run(cfg: Any) -> None:
    """Every name and strategy setting of a fresh run (``cfg``: a :class:`clbench.core.config.RunConfig`) checked from
    the catalog and the method's card, without importing torch or the method: the strategy, the benchmark, the
    backbone, the scenario, the profile and the ``--set`` keys and values. ``clbench run`` calls it before it loads
    anything, so that a mistake is refused at once; :func:`clbench.run.harness.resolve` checks the same again."""
    STRATEGIES.check(cfg.strategy)
    spec = with_data_domains(BENCHMARKS.get(cfg.bench), cfg.data_root)  # a folder of domains declares them
    if cfg.backbone is not None:
        BACKBONES.check(cfg.backbone)
    check_scenario(cfg.strategy, cfg.scenario, spec.domains, spec.name)
    method = card(cfg.strategy)
    check_profile(method, cfg.profile)
    make_strategy_config(method, cfg.profile, cfg.overrides)
