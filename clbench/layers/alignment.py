"""Classifier alignment on features sampled from per-class Gaussians (MOS, SLCA, HiDe-Prompt): the sampling and
the shuffled mini-batch loop they share; each method keeps how it stores class statistics and what it trains."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from clbench.methods.shared import optimizer_step


def gaussian_samples(means: torch.Tensor, factors: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(C, n, d) features drawn from N(mean_c, L_c L_c^T) for each class row: mean + z L^T with z ~ N(0, I) drawn
    from ``generator`` (the same distribution as ``MultivariateNormal``), in ``factors``' dtype on ``means``' device."""
    z = torch.randn(len(means), n, means.shape[-1], generator=generator).to(means.device, factors.dtype)
    return means[:, None, :] + torch.einsum("cnd,ced->cne", z, factors)


def align_on_samples(
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    epochs: int,
    sample: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    per: int,
    n_batches: int,
    generator: torch.Generator,
    device: torch.device | str,
    where: str,
    log: Callable[[int, float], None],
) -> None:
    """Classifier alignment on sampled features (MOS, SLCA, HiDe-Prompt): each epoch draws ``sample()`` (features,
    labels), shuffles them with ``generator``, takes up to ``n_batches`` mini-batches of ``per`` (stopping early when
    the samples run out), steps the schedule after an epoch that stepped and calls ``log(epoch, mean loss)``."""
    for epoch in range(epochs):
        x, y = sample()
        order = torch.randperm(len(x), generator=generator)
        x, y = x[order.to(x.device)].to(device), y[order.to(y.device)].to(device)
        total, n = 0.0, 0
        for it in range(n_batches):
            xb, yb = x[it * per : (it + 1) * per], y[it * per : (it + 1) * per]
            if len(yb) == 0:  # ran out of samples
                break
            total += optimizer_step(optimizer, loss_of(xb, yb), f"{where} epoch {epoch}")
            n += 1
        if n:  # an epoch with no sample took no step: nothing to schedule (torch warns of a schedule stepped first)
            schedule.step()
        log(epoch, total / max(n, 1))


def align_on_gaussians(
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    epochs: int,
    means: torch.Tensor,
    factors: torch.Tensor,
    per_class: int,
    generator: torch.Generator,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    where: str,
    log: Callable[[int, float], None],
) -> None:
    """MOS's and SLCA's alignment: every epoch ``per_class`` fresh samples of each class (row c of ``means``, its
    Cholesky factor ``factors[c]``), shuffled, in one mini-batch of ``per_class`` per class, on ``means``' device."""
    n = len(means)
    labels = torch.arange(n).repeat_interleave(per_class).to(means.device)
    align_on_samples(
        optimizer,
        schedule,
        epochs,
        lambda: (gaussian_samples(means, factors, per_class, generator).flatten(0, 1), labels),  # (C * n, d)
        loss_of,
        per_class,
        n,
        generator,
        means.device,
        where,
        log,
    )
