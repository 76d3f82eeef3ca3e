"""Classifier heads shared by methods: :class:`LinearHead`, the linear classifier that grows a row per arriving class,
and :func:`build_head`, the prompt methods' choice between it and KAC's (:mod:`clbench.layers.kan`).

Used by L2P (``baselines/l2p.py``), DualPrompt (``baselines/dualprompt.py``) and MOS (``baselines/mos.py``), each the
``head`` of PILOT's ViT (``nn.Linear(d, classes)``, timm init). The cosine head of SimpleCIL, EASE, APER and
TOSCA is :class:`clbench.methods.shared.CosineHead`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from clbench.layers.checks import HEADS
from clbench.layers.kan import KACHead


class LinearHead(nn.Module):
    """A linear classifier whose rows are added when classes arrive (new rows: trunc-normal std 0.02, bias 0)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(0, dim))
        self.bias = nn.Parameter(torch.zeros(0))

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def per_class(self) -> int:
        """Parameters each class adds (its weight row and bias)."""
        return int(self.weight.shape[1]) + 1

    @property
    def shared(self) -> int:
        """Parameters no class owns: none."""
        return 0

    def grow(self, n_total: int, generator: torch.Generator) -> None:
        n_new = n_total - self.weight.shape[0]
        if n_new < 0:
            raise ValueError("the head never shrinks")
        rows = torch.empty(n_new, self.weight.shape[1])
        nn.init.trunc_normal_(rows, std=0.02, a=-2.0, b=2.0, generator=generator)  # timm's init_weights_vit_timm
        dev = self.weight.device
        self.weight = nn.Parameter(torch.cat([self.weight.data, rows.to(dev)]))
        self.bias = nn.Parameter(torch.cat([self.bias.data, torch.zeros(n_new, device=dev)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def build_head(kind: str, dim: int) -> nn.Module:
    """The prompt methods' classifier (``head`` setting): ``"linear"`` (:class:`LinearHead`) or ``"kac"``
    (:class:`clbench.layers.kan.KACHead`). Both grow rows with ``grow(n_total, generator)`` and report
    ``n_classes``, ``per_class`` and ``shared`` parameter counts."""
    if kind == "linear":
        return LinearHead(dim)
    if kind == "kac":
        return KACHead(dim)
    raise ValueError(f"unknown head {kind!r}; choose one of {', '.join(HEADS)}")


def head_size(head: nn.Module) -> int:
    """The parameters a head holds (its rows and any shared part)."""
    return sum(p.numel() for p in head.parameters())


def head_inputs(head: nn.Module, predict: Callable[[], object]) -> torch.Tensor:
    """What ``head`` is given while ``predict()`` runs, its rows in call order, float32 on the CPU: the features a
    prompt or LoRA method's classifier scores, read where they meet the classifier (one call per test
    batch), for :meth:`clbench.methods.contract.Strategy.adapted_features`."""
    seen: list[torch.Tensor] = []

    def keep(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0].detach().float().cpu())

    handle = head.register_forward_pre_hook(keep)
    try:
        predict()
    finally:
        handle.remove()
    return torch.cat(seen) if seen else torch.zeros(0, 0)
