"""Pieces used by two or more methods: class means, the cosine head, masked cross-entropy, schedules,
mini-batching over cached features, and parameter counting."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clbench.errors import ClbenchError


def class_means(features: torch.Tensor, labels: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
    """(len(classes), d) mean feature of each class; raises if a class has no sample."""
    rows = []
    for c in classes:
        mask = labels == c
        if not bool(mask.any()):
            raise ClbenchError(f"class {c} has no training samples in this task")
        rows.append(features[mask].mean(dim=0))
    return torch.stack(rows)


def cosine_logits(features: torch.Tensor, weight: torch.Tensor, sigma: torch.Tensor | float = 1.0) -> torch.Tensor:
    """sigma * cos(f, w_c) for every class row of ``weight``: (B, d) x (C, d) -> (B, C)."""
    return sigma * F.linear(F.normalize(features, dim=-1), F.normalize(weight, dim=-1))


class CosineHead(nn.Module):
    """PILOT's CosineLinear: logits = sigma * cos(f, w_c), one learnable scale, rows added per task.

    New rows start at zero (as in the reference code); ``grow`` keeps the old rows.
    """

    def __init__(self, in_features: int, learn_sigma: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.zeros(0, in_features))
        self.sigma = nn.Parameter(torch.ones(1), requires_grad=learn_sigma)

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    def grow(self, n_total: int) -> None:
        if n_total < self.n_classes:
            raise ValueError("a cosine head never shrinks")
        new = torch.zeros(n_total - self.n_classes, self.in_features, dtype=self.weight.dtype, device=self.weight.device)
        self.weight = nn.Parameter(torch.cat([self.weight.data, new]))

    def set_rows(self, classes: Sequence[int], rows: torch.Tensor) -> None:
        with torch.no_grad():
            self.weight[list(classes)] = rows.to(self.weight)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cosine_logits(features, self.weight, self.sigma)


def masked_cross_entropy(logits: torch.Tensor, target: torch.Tensor, allowed: Sequence[int]) -> torch.Tensor:
    """Cross-entropy where logits of classes outside ``allowed`` are set to -inf (L2P's current-task mask)."""
    mask = torch.full((logits.shape[-1],), float("-inf"), device=logits.device, dtype=logits.dtype)
    mask[list(allowed)] = 0.0
    return F.cross_entropy(logits + mask, target)


def cosine_lr(optimizer: torch.optim.Optimizer, total_steps: int, eta_min: float = 1e-8):
    """Cosine annealing from the optimizer's lr to ``eta_min`` over ``total_steps`` steps (PILOT's schedule
    is per epoch; we step once per epoch too, so ``total_steps`` is the number of epochs)."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps), eta_min=eta_min)


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None, shuffle: bool = True) -> Iterator[torch.Tensor]:
    """Index batches over ``range(n)``: shuffled with a private generator, or in order."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def n_params(*modules: nn.Module | nn.Parameter | torch.Tensor, trainable_only: bool = False) -> int:
    total = 0
    for m in modules:
        params = [m] if isinstance(m, torch.Tensor) else list(m.parameters())
        total += sum(p.numel() for p in params if p.requires_grad or not trainable_only)
    return total


def check_finite(loss: torch.Tensor, where: str) -> None:
    if not math.isfinite(float(loss)):
        raise ClbenchError(f"loss became {float(loss)} in {where}", "lower the learning rate (--set lr=...) or check the data")
