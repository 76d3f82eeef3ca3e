"""VPT: learned prompt tokens appended to the frozen ViT's token sequence: :class:`VisualPrompts`.

Jia et al., "Visual Prompt Tuning", ECCV 2022, arXiv 2203.12119, as LAMDA-PILOT's ``backbone/vpt.py``
(``VPT_ViT.forward_features``) applies it:

- ``deep``: before every block i, P tokens ``Prompt_Tokens[i]`` are appended after the image tokens; the block's
  outputs at those P positions are dropped (a fresh set enters the next block);
- ``shallow``: P tokens are appended once, after the position embedding, pass through every block, and are dropped
  before the final norm.

The prompts carry no position embedding and start at zero (``nn.Parameter(torch.zeros(...))``); the feature is the
[CLS] token after the final norm. Used by APER (``baselines/aper.py``, ``adapt=vpt``).
"""

from __future__ import annotations

import torch
from torch import nn

from clbench.methods.shared import vit_block, vit_tokens

VPT_TYPES = ("deep", "shallow")


def vpt_size(d: int, depth: int, n_tokens: int, deep: bool) -> int:
    """Parameters of the prompts: (depth if deep else 1) * P * d."""
    return (depth if deep else 1) * n_tokens * d


class VisualPrompts(nn.Module):
    """``prompts``: (depth, P, d) for deep VPT, (1, P, d) for shallow, zero-initialised."""

    def __init__(self, depth: int, n_tokens: int, dim: int, deep: bool) -> None:
        super().__init__()
        self.deep = deep
        self.prompts = nn.Parameter(torch.zeros(depth if deep else 1, n_tokens, dim))

    def cls(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """(B, d) [CLS] pre-logits feature of ``model`` with the prompts."""
        x = vit_tokens(model, images)  # (B, N, d)
        b, n = x.shape[0], x.shape[1]
        prompts = self.prompts.to(x.dtype)
        if self.deep:
            for i, block in enumerate(model.blocks):
                x = vit_block(block, torch.cat([x, prompts[i].expand(b, -1, -1)], dim=1))[:, :n]  # (B, N, d)
        else:
            x = torch.cat([x, prompts[0].expand(b, -1, -1)], dim=1)  # (B, N + P, d)
            for block in model.blocks:
                x = vit_block(block, x)
            x = x[:, :n]
        return model.forward_head(model.norm(x), pre_logits=True)
