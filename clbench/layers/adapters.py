"""AdaptFormer bottleneck adapters beside the MLP of every ViT block: :class:`Adapter`, :class:`AdapterSet` (one
adapter per block); its parameter count is :func:`clbench.core.costs.adapter_set_size`.

The adapter is AdaptFormer's (Chen et al., "AdaptFormer: Adapting Vision Transformers for Scalable Visual Recognition",
NeurIPS 2022, arXiv 2205.13535) as LAMDA-PILOT's ``backbone/vit_adapter.py`` / ``vit_ease.py`` initialise it
(``init_option="lora"``). Used by EASE (one set per task, ``baselines/ease.py``), APER and RanPAC (one set tuned on the
first task, ``baselines/aper.py``, ``baselines/ranpac.py`` via :mod:`clbench.layers.first_session`) and MOS (one set per
task, merged, ``baselines/mos.py``). The block forward that applies a
set is :func:`clbench.methods.shared.vit_forward_tokens`.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class AdapterConfig(Protocol):
    """The config fields an adapter set is built from (every adapter method's config has them)."""

    bottleneck: int  # r
    adapter_scale: float  # the constant scale of the adapter output (PILOT's ffn_adapter_scalar)
    adapter_dropout: float  # dropout on the bottleneck activations while training


class Adapter(nn.Module):
    """AdaptFormer bottleneck: scale * W_up(dropout(ReLU(W_down x + b_down))) + scale * b_up, (..., d) -> (..., d).

    PILOT ``Adapter(init_option="lora")``: W_down kaiming-uniform(a=sqrt(5)), W_up and both biases zero, so a
    new adapter starts as the identity of the block.
    """

    def __init__(self, dim: int, bottleneck: int, scale: float, dropout: float, generator: torch.Generator) -> None:
        super().__init__()
        self.down_weight = nn.Parameter(torch.empty(bottleneck, dim))
        nn.init.kaiming_uniform_(self.down_weight, a=math.sqrt(5), generator=generator)
        self.down_bias = nn.Parameter(torch.zeros(bottleneck))
        self.up_weight = nn.Parameter(torch.zeros(dim, bottleneck))
        self.up_bias = nn.Parameter(torch.zeros(dim))
        self.scale, self.p = scale, dropout
        self.dropout_generator: torch.Generator | None = None  # set while training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(F.linear(x, self.down_weight, self.down_bias))  # (B, N, r)
        if self.training and self.p > 0:
            keep = torch.empty_like(h).bernoulli_(1 - self.p, generator=self.dropout_generator)
            h = h * keep / (1 - self.p)
        return F.linear(h, self.up_weight, self.up_bias) * self.scale


class AdapterSet(nn.ModuleList):
    """One adapter per block: the parameters added by one task."""

    def __init__(self, n_blocks: int, dim: int, cfg: AdapterConfig, generator: torch.Generator) -> None:
        super().__init__(
            Adapter(dim, cfg.bottleneck, cfg.adapter_scale, cfg.adapter_dropout, generator) for _ in range(n_blocks)
        )

    def set_dropout_generator(self, generator: torch.Generator | None) -> None:
        for adapter in self:
            adapter.dropout_generator = generator
