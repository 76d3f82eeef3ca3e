"""Prompt pools: matching a query to learnable keys and choosing prompts by it.

Used by L2P (Wang et al., "Learning to Prompt for Continual Learning", CVPR 2022, arXiv 2112.08654;
``baselines/l2p.py``: a pool of M prompts, top-k chosen per image or per batch) and DualPrompt (Wang et al.,
"DualPrompt: Complementary Prompting for Rehearsal-free Continual Learning", ECCV 2022, arXiv 2204.04799;
``baselines/dualprompt.py``: one E-prompt chosen per image). Both match with the cosine similarity of the frozen
[CLS] query to each key (PILOT ``l2p.py`` / ``dual_prompt.py`` ``l2_normalize`` then a matmul). The pools
themselves differ (L2P prepends tokens, DualPrompt prefixes keys and values) and stay in their method files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def key_similarity(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(B, d) queries and (M, d) keys -> (B, M) cosine similarities, float32."""
    return F.normalize(query.float(), dim=-1) @ F.normalize(keys, dim=-1).T


def select_prompts(similarity: torch.Tensor, top_k: int, batchwise: bool) -> torch.Tensor:
    """Prompt ids (B, k) from query-key similarities (B, M).

    Per sample: each row's k most similar keys. Batch-wise (PILOT ``batchwise_prompt``): the k ids chosen most
    often among the rows' own top-k, the same for every row; equal counts go to the lower id.
    """
    idx = similarity.topk(top_k, dim=1).indices  # (B, k)
    if not batchwise:
        return idx
    counts = torch.bincount(idx.flatten(), minlength=similarity.shape[1])  # (M,)
    major = torch.sort(-counts, stable=True).indices[:top_k]  # (k,) most frequent first, ties by id
    return major.unsqueeze(0).expand(similarity.shape[0], -1)
