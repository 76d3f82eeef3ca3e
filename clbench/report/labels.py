"""How a report names a row: a strategy's display name, a row's short label, and whether labels must name the
backbone. Below every report module that prints rows (the study model, the leaderboard, the figures)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clbench.core.catalog import STRATEGY_LOOKS

if TYPE_CHECKING:
    from clbench.report.collect import AccKey


def display_name(strategy: str) -> str:
    """The strategy's name as a reader knows it (``clbench.core.catalog.STRATEGY_LOOKS``); a plug-in's as registered."""
    return STRATEGY_LOOKS[strategy][0] if strategy in STRATEGY_LOOKS else strategy


def short_label(key: AccKey, several_backbones: bool = False) -> str:
    """``TOSCA``, ``TOSCA, reference protocol``, ``RanPAC epochs=300``: what a legend or a table row names."""
    base, _, rest = key.strategy.partition(" ")
    name, colon, profile = base.partition(":")
    label = display_name(name) + (f":{profile}" if colon else "") + (f" {rest}" if rest else "")
    if key.protocol != "per-sample":
        label += f", {key.protocol} protocol"
    if several_backbones:
        label += f" ({key.backbone})"
    return label


def needs_backbone(keys: Sequence[AccKey]) -> bool:
    """Whether short labels must name the backbone: two rows of one benchmark, strategy and protocol differ in it."""
    slots = [(k.bench, k.strategy, k.protocol) for k in keys]
    return len(set(slots)) < len(slots)
