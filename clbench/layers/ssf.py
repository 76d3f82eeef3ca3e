"""SSF: scale-and-shift of the frozen ViT's features, one learned (scale, shift) pair per site: :class:`SSF`.

Lian et al., "Scaling & Shifting Your Features: A New Baseline for Efficient Model Tuning", NeurIPS 2022,
arXiv 2210.08823, as LAMDA-PILOT's ``backbone/vit_ssf.py`` (``tuning_mode="ssf"``) applies it: ``ssf_ada(x, scale,
shift) = x * scale + shift`` over the channel axis, on the output of

- the patch projection (``PatchEmbed.ssf_*_1``; and after the patch norm where the ViT has one, ``ssf_*_2``),
- in every block: ``norm1`` and ``norm2`` (``Block.ssf_*_1/2``), the ``qkv`` and ``proj`` linears
  (``Attention.ssf_*_1/2``), the MLP's ``fc1`` (before the activation) and ``fc2`` (``Mlp.ssf_*_1/2``),
- the final norm (``VisionTransformer.ssf_*_1``).

Initialisation as ``init_ssf_scale_shift``: scale ~ N(1, 0.02), shift ~ N(0, 0.02) (so the network does not start
exactly as the pre-trained one). clbench applies the factors to the run's frozen timm ViT with forward hooks held
only while :meth:`SSF.cls` runs, so the frozen backbone is never modified and its cached features stay valid.
Used by APER (``baselines/aper.py``, ``adapt=ssf``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from clbench.methods.shared import vit_forward_tokens, vit_tokens


class ScaleShift(nn.Module):
    """x * scale + shift over one channel axis (-1: tokens (B, N, C); 1: feature maps (B, C, H, W))."""

    def __init__(self, dim: int, axis: int, generator: torch.Generator) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(dim).normal_(1.0, 0.02, generator=generator))
        self.shift = nn.Parameter(torch.empty(dim).normal_(0.0, 0.02, generator=generator))
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self.scale.to(x.dtype), self.shift.to(x.dtype)
        if self.axis == 1:
            return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
        return x * scale + shift


def ssf_sites(model: nn.Module) -> list[tuple[str, int, int]]:
    """(module path, channels, axis) of every SSF site of a timm ViT, in PILOT's order (patch embedding, then per
    block norm1, qkv, proj, norm2, fc1, fc2, then the final norm)."""
    pe = model.patch_embed
    sites = [("patch_embed.proj", pe.proj.out_channels, 1)]
    if not isinstance(pe.norm, nn.Identity):
        sites.append(("patch_embed.norm", pe.proj.out_channels, -1))
    for i, block in enumerate(model.blocks):
        d = block.norm1.normalized_shape[0]
        sites += [
            (f"blocks.{i}.norm1", d, -1),
            (f"blocks.{i}.attn.qkv", block.attn.qkv.out_features, -1),
            (f"blocks.{i}.attn.proj", block.attn.proj.out_features, -1),
            (f"blocks.{i}.norm2", d, -1),
            (f"blocks.{i}.mlp.fc1", block.mlp.fc1.out_features, -1),
            (f"blocks.{i}.mlp.fc2", block.mlp.fc2.out_features, -1),
        ]
    sites.append(("norm", model.norm.normalized_shape[0], -1))
    return sites


def ssf_size(d: int, depth: int, hidden: int, patch_norm: bool = False) -> int:
    """Parameters of SSF on a ViT of width ``d``, ``depth`` blocks, MLP width ``hidden``: a scale and a shift per
    channel of every site: 2 * (depth * (d + 3d + d + d + hidden + d) + d [+ d] + d)."""
    return 2 * (depth * (7 * d + hidden) + (3 if patch_norm else 2) * d)


class SSF(nn.Module):
    """The scale-and-shift factors of one ViT (a :class:`ScaleShift` per site of :func:`ssf_sites`)."""

    def __init__(self, model: nn.Module, generator: torch.Generator) -> None:
        super().__init__()
        sites = ssf_sites(model)
        self.sites = [path for path, _, _ in sites]
        self.factors = nn.ModuleList(ScaleShift(n, axis, generator) for _, n, axis in sites)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """While inside: every site's output of ``model`` is scaled and shifted (forward hooks, removed on exit)."""
        handles = [
            model.get_submodule(path).register_forward_hook(lambda _m, _i, out, f=factor: f(out))
            for path, factor in zip(self.sites, self.factors, strict=True)
        ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def cls(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """(B, d) [CLS] pre-logits feature of ``model`` with the factors applied."""
        with self.applied(model):
            x = vit_forward_tokens(model, vit_tokens(model, images))  # (B, N, d), the final norm's SSF included
            return model.forward_head(x, pre_logits=True)
