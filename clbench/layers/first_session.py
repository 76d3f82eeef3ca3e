"""APER's first-session adaptation, shared with RanPAC's "Phase 1": tune one adapter set and a cosine head on the
first task (:func:`tune_first_session`), then keep each image's adapted [CLS] feature (:class:`AdaptedFeatures`).

APER: Zhou et al., "Revisiting Class-Incremental Learning with Pre-Trained Models: Generalizability and Adaptivity
are All You Need", IJCV 2024, arXiv 2303.07338 (LAMDA-PILOT ``models/aper_adapter.py`` ``_train``). RanPAC: McDonnell
et al., "RanPAC: Random Projections and Pre-trained Models for Continual Learning", NeurIPS 2023, arXiv 2307.02251,
which adopted APER's first session as its Phase 1 (PILOT ``models/ranpac.py`` ``_train``). Used by
``baselines/aper.py`` and ``baselines/ranpac.py``; the adapters are :mod:`clbench.layers.adapters`.

APER's other first-session adaptations (PILOT ``models/aper_ssf.py``, ``aper_vpt.py``, ``aper_finetune.py``) go
through the same loop with another tuned module: :class:`clbench.layers.ssf.SSF`,
:class:`clbench.layers.vpt.VisualPrompts` or :class:`TunedViT` (a trainable copy of the whole ViT); each has a
``cls(model, images)`` giving the adapted [CLS] feature (:func:`first_session_cls`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clbench.errors import ClbenchError
from clbench.layers.adapters import AdapterSet
from clbench.methods.contract import Context, Split, Task
from clbench.methods.shared import CosineHead, EpochLog, cosine_lr, vit_forward_tokens, vit_tokens


def adapted_cls(model: nn.Module, images: torch.Tensor, adapters: AdapterSet, ctx: Context) -> torch.Tensor:
    """(B, d) float32 [CLS] pre-logits feature of the frozen ViT with one adapter per block."""
    with ctx.autocast():
        x = vit_forward_tokens(model, vit_tokens(model, images), adapters)  # (B, N, d)
        return model.forward_head(x, pre_logits=True).float()


class TunedViT(nn.Module):
    """A trainable copy of the run's whole ViT (APER ``adapt=finetune``, PILOT ``models/aper_finetune.py``: every
    backbone parameter trained in the first session); the run's frozen backbone is left as it is."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.vit = copy.deepcopy(model)
        self.vit.requires_grad_(True)

    def cls(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """(B, d) [CLS] pre-logits feature of the tuned copy (``model``, the frozen one, is not used)."""
        x = vit_forward_tokens(self.vit, vit_tokens(self.vit, images))  # (B, N, d)
        return self.vit.forward_head(x, pre_logits=True)


def first_session_cls(model: nn.Module, images: torch.Tensor, tuned: nn.Module, ctx: Context) -> torch.Tensor:
    """(B, d) float32 adapted [CLS] feature: ``model`` with the first session's ``tuned`` module (an
    :class:`AdapterSet`, or any module with ``cls(model, images)``: SSF factors, prompts, a tuned ViT copy)."""
    if isinstance(tuned, AdapterSet):
        return adapted_cls(model, images, tuned, ctx)
    with ctx.autocast():
        return tuned.cls(model, images).float()


def tune_first_session(
    model: nn.Module,
    task: Task,
    cfg: Any,
    ctx: Context,
    label: str,
    tuned: nn.Module | None = None,
    head_init: torch.Tensor | None = None,
) -> tuple[Any, CosineHead]:
    """Phase 1 of APER / RanPAC: a fresh adapter set (or the given ``tuned`` module) and a cosine head over
    ``task.classes``, trained with cross-entropy on the augmented training images (SGD with momentum and weight
    decay over the tuned module, head and sigma, as the reference's ``optim.SGD(self._network.parameters(), ...)``
    where only those have gradients; cosine schedule stepped per epoch). Returns the tuned module frozen in eval
    mode and the trained head. ``head_init``: the head's initial rows (|C_0|, d) instead of ``CosineLinear``'s
    uniform draw (the golden tests start from the reference's)."""
    dev, dim, n_blocks = ctx.device, ctx.backbone.num_features, len(model.blocks)
    adapters = (AdapterSet(n_blocks, dim, cfg, ctx.generator(1000)) if tuned is None else tuned).to(dev)
    head = CosineHead(dim)
    head.grow(len(task.classes))
    with torch.no_grad():
        bound = 1.0 / math.sqrt(dim)  # CosineLinear.reset_parameters
        head.weight.uniform_(-bound, bound, generator=ctx.generator(2000))
        if head_init is not None:
            head.weight.copy_(head_init)
    head.to(dev)
    local = torch.full((task.n_seen,), -1, dtype=torch.long)
    local[torch.as_tensor(task.classes)] = torch.arange(len(task.classes))  # label -> row of the task-0 head
    optimizer = torch.optim.SGD(
        [*adapters.parameters(), *head.parameters()], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    schedule = cosine_lr(optimizer, cfg.epochs, eta_min=cfg.min_lr)
    loader = task.train.image_loader(cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(3000))
    seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator(4000)))
    if isinstance(adapters, AdapterSet):
        adapters.set_dropout_generator(torch.Generator(device=dev).manual_seed(seed))
    log = EpochLog(ctx, f"{label} first session", cfg.epochs, len(loader))
    adapters.train()
    for epoch in log.epochs():
        for images, labels, _ in loader:
            target = local[labels].to(dev)
            logits = head(first_session_cls(model, images.to(dev), adapters, ctx))  # (B, |C_0|)
            log.step(optimizer, F.cross_entropy(logits, target), len(target), f"first session epoch {epoch}")
        schedule.step()
    if isinstance(adapters, AdapterSet):
        adapters.set_dropout_generator(None)
    adapters.requires_grad_(False)
    adapters.eval()
    return adapters, head


class AdaptedFeatures:
    """Adapted [CLS] features computed once per image and kept, keyed by image identity (the source's content
    fingerprint and the image's index in it). Valid because the adapted ViT never changes after task 0; saved with
    the strategy, so a resumed run does not pass an image again. Only computed rows are stored (a row index per
    image of the source, -1 where not computed). ``passes`` counts images sent through the ViT."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # fingerprint -> ((len,) int32 row, (K, d))
        self.passes = 0

    def get(
        self, split: Split, compute: Callable[[torch.Tensor], torch.Tensor], batch_size: int, device: torch.device
    ) -> torch.Tensor:
        """(len(split), d) float32 features of ``split``'s images (eval transform), computing only the missing."""
        key = split.source.fingerprint()
        if key not in self.tables:
            self.tables[key] = (torch.full((len(split.source),), -1, dtype=torch.int32), torch.zeros(0, self.dim))
        row, feats = self.tables[key]
        need = np.flatnonzero(row.numpy()[split.indices] < 0)
        if need.size:
            _, first = np.unique(split.indices[need], return_index=True)  # an image listed twice passes once
            missing = split.subset(need[np.sort(first)])
            new = []
            with torch.no_grad():
                for images, _, _ in missing.image_loader(batch_size, augment=False):
                    new.append(compute(images.to(device)).cpu())
                    self.passes += len(images)
            row[torch.as_tensor(missing.indices)] = torch.arange(
                len(feats), len(feats) + len(missing), dtype=torch.int32
            )
            feats = torch.cat([feats, *new])
            self.tables[key] = (row, feats)
        return feats[row[torch.as_tensor(split.indices)].long()]


def check_width(name: str, saved: int, dim: int) -> None:
    """A resumed state must come from a backbone of the current width."""
    if saved != dim:
        raise ClbenchError(
            f"{name}: the saved run was made on {saved}-d backbone features, but this backbone gives {dim}-d features",
            "resume with the backbone the run started with, or start over with --overwrite",
        )


def n_head_params(head: CosineHead) -> int:
    return head.weight.numel() + head.sigma.numel()
