"""The LuCA module of TOSCA (arXiv 2502.14762): a residual bottleneck adapter followed by a calibrator.

    A(z) = LayerNorm(z + W_up GELU(W_down z + b_down) + b_up)      adapter (residual inside the LayerNorm)
    C(h) = h * sigmoid(W_2 ReLU(W_1 h))                            calibrator (no biases, no residual)
    LuCA(z) = C(A(z))

with bottleneck r = d / ratio (ratio 16: r = 48 for ViT-B, 24 for ViT-S). For d = 768 the module has
4 d r + r + d + 2 d = 149,808 parameters. The reference code's ablation variants are kept:

- ``adapter``:    LayerNorm(W_up GELU(W_down z + b_down) + b_up)   (no residual, no calibrator)
- ``calibrator``: z * sigmoid(W_2 ReLU(W_1 z))
- ``tosca_r``:    z * sigmoid(W_2 ReLU(W_1 z)) + LayerNorm(W_up GELU(W_down z + b_down) + b_up)

Checked against the official code (root commit of ladka6/tosca-eval, a byte copy of the authors' release).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from tosca.card import VARIANTS

Variant = Literal["luca", "adapter", "calibrator", "tosca_r"]


class LuCA(nn.Module):
    """One Learn-and-Calibrate module of width ``d`` (every variant holds the same parameters)."""

    def __init__(self, d: int, ratio: int = 16, variant: Variant = "luca") -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if d % ratio:
            raise ValueError(f"feature width {d} is not divisible by ratio {ratio}")
        r = d // ratio
        self.d, self.r, self.variant = d, r, variant
        self.down = nn.Linear(d, r)  # W_down, b_down
        self.up = nn.Linear(r, d)  # W_up, b_up
        self.norm = nn.LayerNorm(d)
        self.gate_in = nn.Linear(d, r, bias=False)  # W_1
        self.gate_out = nn.Linear(r, d, bias=False)  # W_2

    def reset_like_reference(self) -> None:
        """Re-initialisation the reference applies to every module after the first: xavier-uniform weights,
        zero biases, LayerNorm weight 1 and bias 0 (the first module keeps PyTorch's default init)."""
        for lin in (self.down, self.up, self.gate_in, self.gate_out):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        nn.init.ones_(self.norm.weight)
        nn.init.zeros_(self.norm.bias)

    def gate(self, h: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, d), values in (0, 1)
        return torch.sigmoid(self.gate_out(F.relu(self.gate_in(h))))

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, d)
        mlp = self.up(F.gelu(self.down(z)))
        if self.variant == "luca":
            h = self.norm(z + mlp)
            return h * self.gate(h)
        if self.variant == "adapter":
            return self.norm(mlp)
        if self.variant == "calibrator":
            return z * self.gate(z)
        return z * self.gate(z) + self.norm(mlp)  # tosca_r


def stacked_forward(modules: list[LuCA], z: torch.Tensor) -> torch.Tensor:
    """All T modules on the same features in one batched computation: (B, d) -> (T, B, d).

    Equivalent to ``torch.stack([m(z) for m in modules])`` (tested), without a Python loop per batch.
    """

    def stack(get):
        return torch.stack([get(m) for m in modules])

    variant, eps = modules[0].variant, modules[0].norm.eps
    wd, bd = stack(lambda m: m.down.weight), stack(lambda m: m.down.bias)  # (T, r, d), (T, r)
    wu, bu = stack(lambda m: m.up.weight), stack(lambda m: m.up.bias)  # (T, d, r), (T, d)
    w1, w2 = stack(lambda m: m.gate_in.weight), stack(lambda m: m.gate_out.weight)  # (T, r, d), (T, d, r)
    gamma, beta = stack(lambda m: m.norm.weight), stack(lambda m: m.norm.bias)  # (T, d)

    def norm(x):  # (T, B, d) per-module affine LayerNorm
        return F.layer_norm(x, x.shape[-1:], eps=eps) * gamma[:, None] + beta[:, None]

    def gate(h):  # (T, B, d) -> (T, B, d)
        return torch.sigmoid(torch.einsum("tbr,tdr->tbd", F.relu(torch.einsum("tbd,trd->tbr", h, w1)), w2))

    mlp = torch.einsum("tbr,tdr->tbd", F.gelu(torch.einsum("bd,trd->tbr", z, wd) + bd[:, None]), wu) + bu[:, None]
    zt = z.expand(len(modules), *z.shape)
    if variant == "luca":
        h = norm(zt + mlp)
        return h * gate(h)
    if variant == "adapter":
        return norm(mlp)
    if variant == "calibrator":
        return zt * gate(zt)
    return zt * gate(zt) + norm(mlp)
