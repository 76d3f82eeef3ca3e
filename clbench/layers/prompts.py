"""Prompt pools: matching a query to learnable keys and choosing prompts by it.

Used by L2P (Wang et al., "Learning to Prompt for Continual Learning", CVPR 2022, arXiv 2112.08654;
``baselines/l2p.py``: a pool of M prompts, top-k chosen per image or per batch) and DualPrompt (Wang et al.,
"DualPrompt: Complementary Prompting for Rehearsal-free Continual Learning", ECCV 2022, arXiv 2204.04799;
``baselines/dualprompt.py``: one E-prompt chosen per image). Both match with the cosine similarity of the frozen
[CLS] query to each key (PILOT ``l2p.py`` / ``dual_prompt.py`` ``l2_normalize`` then a matmul). The pools
themselves differ (L2P prepends tokens, DualPrompt prefixes keys and values) and stay in their method files.

Shared by every prompt method (L2P, DualPrompt, CODA-Prompt, HiDe-Prompt): the training batch's query
(:func:`training_query`) and the evaluation batch (:func:`eval_batch`); by the prefix-prompt methods (DualPrompt,
CODA-Prompt, HiDe-Prompt): the check of their prompt layers against the backbone (:func:`check_prompt_layers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clbench.errors import ClbenchError

PER_SAMPLE_BATCH = 64  # smallest evaluation batch of the per-sample protocol (speed only)


def eval_batch(reference_batch: int, reference: bool) -> int:
    """A prompt method's evaluation batch: the reference's own under the batch-coupled ``reference`` protocol; at
    least PER_SAMPLE_BATCH under ``per-sample``, whose rows do not depend on their batch, so that it may use any
    size (larger ones are several times faster per image on a CPU)."""
    return reference_batch if reference else max(reference_batch, PER_SAMPLE_BATCH)


def check_prompt_layers(
    title: str,
    cfg: Any,
    field: str,
    model: Any,
    configured: Sequence[int],
    used: Sequence[int],
    dim: int,
    log: Callable[[str], None],
) -> None:
    """Refuse prompt layers none of which is below the timm ViT ``model``'s depth (``used``: those below it;
    ``cfg.<field>``: the setting that names them) or a width ``dim`` its attention heads do not divide; log the
    ``configured`` layers at or beyond the depth, which are not used (the reference's block loop never reaches
    them either). ``title``: the method's name in the messages."""
    depth = len(model.blocks)
    if not used:
        raise ClbenchError(
            f"{title} {field} {getattr(cfg, field)!r}: none below the backbone's {depth} blocks",
            f"set {field} to blocks below the depth",
        )
    dropped = sorted(set(configured) - set(used))
    if dropped:
        log(f"  {title}: the backbone has {depth} blocks; prompt layers {dropped} are not used")
    if dim % int(model.blocks[0].attn.num_heads):
        raise ClbenchError(f"width {dim} is not divisible by the number of heads", "choose another backbone")


def training_query(ctx, mode: str, features: torch.Tensor, positions: torch.Tensor, images: torch.Tensor):
    """(B, d) the query of a training batch: each image's cached frozen feature (``mode`` "cached": the un-augmented
    image's) or the frozen backbone's [CLS] pre-logits feature of the augmented image itself at the run's precision
    ("augmented", the references' choice; ``ctx``: the method's :class:`~clbench.methods.contract.Context`)."""
    if mode == "cached":
        return features[positions].to(ctx.device)
    with torch.no_grad(), ctx.autocast():
        return ctx.backbone(images).float()


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


# ----------------------------------------------------------------------------------------------- prefix tuning
# DualPrompt, CODA-Prompt and HiDe-Prompt prompt the ViT by prefix tuning: the shared path (DualPrompt's golden test
# pins it to PILOT's ``PreT_Attention``; CODA-Prompt's and HiDe-Prompt's to their references'), here so that no
# method imports another.


def pilot_kv_layout(prefix: torch.Tensor) -> torch.Tensor:
    """(B, 2, L, d) per-image (key, value) prefixes as PILOT's / HiDe-Prompt's ``EPrompt`` hands them to the
    attention: stacked as (2, B, L, d) (every key, then every value) and reshaped to (B, 2, L, d) without a
    permute, so image b gets stacked row 2b as its key and row 2b + 1 as its value."""
    return prefix.transpose(0, 1).reshape(prefix.shape)


def prefix_attention(attn: nn.Module, x: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """timm ``Attention`` with prefix keys/values (``PreT_Attention``): (B, N, d) tokens and (B, 2, L, d) prefixes
    -> (B, N, d). The prefixes join the image keys and values of every head; queries are the tokens'."""
    B, N, C = x.shape
    heads = attn.num_heads
    hd = C // heads
    qkv = attn.qkv(x).reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, H, N, hd)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if prefix is not None:
        pk, pv = prefix.to(x.dtype).reshape(B, 2, -1, heads, hd).permute(1, 0, 3, 2, 4)  # (B, H, L, hd) each
        k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
    w = (q * attn.scale) @ k.transpose(-2, -1)  # (B, H, N, L + N)
    out = (w.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, C)
    out = attn.norm(out) if hasattr(attn, "norm") else out
    return attn.proj_drop(attn.proj(out))


def prefix_block(block: nn.Module, x: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """One pre-norm timm ``Block`` whose attention takes prefix keys/values."""
    x = x + block.drop_path1(block.ls1(prefix_attention(block.attn, block.norm1(x), prefix)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def orth_loss(features: torch.Tensor, old_means: torch.Tensor, temperature: float) -> torch.Tensor:
    """HiDe-Prompt's contrastive regulariser ``orth_loss`` (before its ``reg`` factor; MOS's reference carries the same
    function, ``baselines/mos.py``): M = [stored class means or centroids; batch features], CE(M M^T / T, identity)."""
    m = torch.cat([old_means.to(features), features])  # (K + B, d)
    sim = m @ m.T / temperature
    return F.cross_entropy(sim, torch.arange(len(m), device=m.device))
