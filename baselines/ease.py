"""EASE: one adapter subspace per task, prototypes in every subspace, old prototypes synthesised.

Paper: Zhou et al., "Expandable Subspace Ensemble for Pre-Trained Model-Based Class-Incremental Learning",
CVPR 2024, arXiv 2403.12030.
Reference implementation checked: LAMDA-PILOT ``models/ease.py``, ``backbone/vit_ease.py``,
``backbone/linears.py`` (``EaseCosineLinear.forward_reweight``), ``utils/inc_net.py`` (``EaseNet``, the
AdaptFormer ``tuning_config``) and ``exps/ease.json``.

Algorithm, for task t with new classes C_t (tasks counted from 0):

1. Add adapter set t: in every block b, an AdaptFormer adapter parallel to the MLP, x = x + ls1(attn(norm1(x))); x = x +
   ls2(mlp(norm2(x))) + 0.1 * W_up(dropout_0.1(ReLU(W_down x))), where the adapter reads the residual stream x after
   attention (not norm2(x): PILOT's ``adapt(x)`` with ``ffn_adapter_layernorm_option="none"``). Bottleneck r = 64,
   W_down kaiming-uniform, W_up and biases zero. Sets 0..t-1 stay frozen.
2. Train set t with a task-local cosine head over C_t only (cross-entropy on labels local to the task):
   SGD lr 0.025, momentum 0.9, weight decay 5e-4, cosine schedule to 0 over 20 epochs, batch 48.
3. Prototypes: for the new classes, the mean [CLS] feature of their training images (test transform) in every
   subspace 0..t. For an old task i and a later subspace j (i < j <= t), its classes' prototypes in subspace j
   are synthesised (``solve_sim_reset``, ``recalc_sim=true``): with R = the classes of tasks j..t (real
   prototypes in both subspaces i and j), S = softmax_rows(cos(P[C_i, i], P[R, i])) (no temperature) and
   P[C_i, j] = S @ P[R, j]. Recomputed for every (i, j) after each task.
4. Inference: the ViT runs once per adapter set (t + 1 passes per image); for class c of task i,
   logit_c = sum_j w_ij cos(f_j(x), P[c, j]) with w_ii = 1 and w_ij = alpha / t for j != i (alpha 0.1,
   ``forward_reweight``; scale sigma = 1, as the reference's final head is never trained).

The per-task adapter set holds n_blocks * (2 d r + r + d) parameters (1,189,632 for ViT-B).

Deviations from the paper / reference code:

- DINOv2 blocks have LayerScale (``ls1``/``ls2``; the reference's ViT-B has none). The adapter output is added
  outside ``ls2``, so it keeps exactly the reference's form and its own 0.1 scale. Inside ``ls2`` it would be
  multiplied by DINOv2's learned per-channel MLP scales, which in the offline ViT-S/14 range from ~0.02 (block 0)
  to ~11 (block 11): a block- and channel-dependent rescaling of the adapter by a factor of up to ~500.
- The [CLS] feature of a subspace is ``model.forward_head(norm(x), pre_logits=True)``, the same read-out as the
  frozen feature of every clbench method (for ViTs with ``global_pool="token"``, as all in the catalog, this
  is the reference's ``norm(x)[:, 0]``).
- The task-local head is ``clbench.methods.shared.CosineHead`` with PILOT's ``EaseCosineLinear`` init
(uniform(-1/sqrt(d),
  1/sqrt(d)) rows, learnable sigma = 1); it is discarded after the task (the reference keeps but never uses it).
- Adapter dropout draws from a private generator (``ctx.generator``), not the global RNG; dropout in the frozen
  ViT is 0 in both.
- The reference's ``forward_reweight`` slices subspaces with a default ``out_dim=768``; here the width is the
  backbone's ``num_features``. Class ranges come from the tasks' class lists, not ``init_cls``/``increment``.
- The backbone runs at the run's precision (bf16 autocast where `--precision` resolves to it); heads, prototypes
  and logits are float32.
- The reference's backbone is ViT-B/16 (timm ``vit_base_patch16_224``); clbench runs the benchmark's
  backbone (any width).
- Transforms, normalisation, class order and task split are the harness's, shared by every method.
- The CPU ``quick`` profile (not the default) runs at 112 px with 3 epochs instead of 20; see ``EASE.profiles``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.ease import CARD, EASEConfig
from clbench.core.costs import adapter_set_size
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.checks import check_protocol
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import (
    CosineHead,
    EpochLog,
    check_vit_blocks,
    class_means,
    cosine_lr,
    vit_forward_tokens,
    vit_tokens,
)


def synthesize_prototypes(protos: torch.Tensor, task_classes: Sequence[Sequence[int]]) -> torch.Tensor:
    """PILOT ``solve_sim_reset``: prototypes of old task i in each later subspace j, from the tasks j..t.

    ``protos`` (C, T, d): row c = class c, column j = subspace j; entries (c, j) with j <= task(c) are real.
    Returns a copy where every (c, j) with j > task(c) is sum_r softmax_r(cos(P[c, i], P[r, i])) P[r, j] over the
    classes r of tasks j..T-1 (real in both subspaces).
    """
    out = protos.clone()
    n_tasks = len(task_classes)
    for i in range(n_tasks - 1):
        old = list(task_classes[i])
        for j in range(i + 1, n_tasks):
            ref = [c for k in range(j, n_tasks) for c in task_classes[k]]
            a_hat = F.normalize(protos[old, i], dim=-1)  # (|C_i|, d)
            a = F.normalize(protos[ref, i], dim=-1)  # (|R|, d)
            weights = torch.softmax(a_hat @ a.T, dim=1)  # (|C_i|, |R|), rows sum to 1
            out[old, j] = weights @ protos[ref, j]
    return out


def subspace_weights(class_task: Sequence[int], n_sets: int, alpha: float) -> torch.Tensor:
    """(C, T) logit weights of ``forward_reweight``: 1 in a class's own subspace, alpha / (T - 1) elsewhere."""
    t = n_sets - 1
    w = torch.full((len(class_task), n_sets), alpha / t if t > 0 else 1.0)
    w[torch.arange(len(class_task)), torch.as_tensor(list(class_task))] = 1.0
    return w


@CARD.strategy
class EASE(Strategy):
    # scenarios: class only: the semantic-guided prototype complement builds old classes' prototypes in a new
    # adapter from their similarity to the task's NEW classes; a later domain has none, so it is undefined there
    state_types = (AdapterSet, Adapter)
    needs_vit = True

    def __init__(self, config: EASEConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        check_vit_blocks(self.model)
        self.dim = ctx.backbone.num_features
        self.n_blocks = len(self.model.blocks)
        self.adapter_sets = nn.ModuleList()  # set t belongs to task t; frozen after it
        self.task_classes: list[list[int]] = []
        self.class_task: list[int] = []  # task of each class, indexed by arrival-order label
        self.protos = torch.zeros(0, 0, self.dim)  # (C, T, d) prototypes of every class in every subspace
        self._added: list[int] = []
        self._trainable: list[int] = []
        self._eval_s_per_image: dict[int, float] = {}  # task -> seconds per test image (first predict after it)
        self._last_predict: tuple[int, np.ndarray] | None = None  # (n rows, argmax) for diagnostics

    # ---------------------------------------------------------------------------------------- features
    def _features(self, images: torch.Tensor, sets: Sequence[AdapterSet]) -> torch.Tensor:
        """(B, len(sets), d) float32: the [CLS] feature of the frozen ViT with each adapter set."""
        with self.ctx.autocast():
            tokens = vit_tokens(self.model, images)  # shared by all sets
            feats = [self.model.forward_head(vit_forward_tokens(self.model, tokens, s), pre_logits=True) for s in sets]
        return torch.stack(feats, dim=1).float()

    @torch.no_grad()
    def _split_features(self, split: Split) -> torch.Tensor:
        """(N, T, d) features of ``split`` (eval transform) in every subspace, on the CPU."""
        out = [
            self._features(images.to(self.ctx.device), list(self.adapter_sets)).cpu()
            for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out)

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        t, cfg, ctx, dev = len(self.adapter_sets), self.cfg, self.ctx, self.ctx.device
        if sorted(task.classes) != list(range(len(self.class_task), task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")

        # 1. a new adapter set, trained with a task-local cosine head
        new = AdapterSet(self.n_blocks, self.dim, cfg, ctx.generator(1000 + t)).to(dev)
        head = CosineHead(self.dim)
        head.grow(len(task.classes))
        with torch.no_grad():
            bound = 1.0 / math.sqrt(self.dim)  # EaseCosineLinear.reset_parameters
            head.weight.uniform_(-bound, bound, generator=ctx.generator(2000 + t))
        head.to(dev)
        self._train_set(task, new, head)
        new.requires_grad_(False)
        new.eval()
        self.adapter_sets.append(new)

        # 2. prototypes of the new classes in every subspace; old classes get a synthesised column t
        self.task_classes.append(list(task.classes))
        self.class_task.extend([t] * len(task.classes))
        feats = self._split_features(task.train)  # (N_t, t + 1, d)
        new_protos = torch.stack(
            [class_means(feats[:, j], task.train.labels, sorted(task.classes)) for j in range(t + 1)], dim=1
        )  # (C_t, t + 1, d), rows in label order
        old = torch.cat([self.protos, torch.zeros(self.protos.shape[0], 1, self.dim)], dim=1)
        self.protos = synthesize_prototypes(torch.cat([old, new_protos]), self.task_classes)

        adapters = adapter_set_size(self.n_blocks, self.dim, cfg.bottleneck)
        self._added.append(adapters + new_protos.numel() + old.shape[0] * self.dim)
        self._trainable.append(adapters + head.weight.numel() + head.sigma.numel())

    def _train_set(self, task: Task, adapters: AdapterSet, head: CosineHead) -> None:
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        local = torch.full((task.n_seen,), -1, dtype=torch.long)
        local[torch.as_tensor(task.classes)] = torch.arange(len(task.classes))  # label -> index in the task head
        params = list(adapters.parameters()) + list(head.parameters())
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        schedule = cosine_lr(optimizer, cfg.epochs, eta_min=cfg.min_lr)
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(3000 + task.id)
        )
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator(4000 + task.id)))
        adapters.set_dropout_generator(torch.Generator(device=dev).manual_seed(seed))
        log = EpochLog(ctx, f"EASE task {task.id}", cfg.epochs, len(loader))
        adapters.train()
        for epoch in log.epochs():
            for images, labels, _ in loader:
                images, target = images.to(dev), local[labels].to(dev)
                logits = head(self._features(images, [adapters])[:, 0])  # (B, |C_t|)
                loss = F.cross_entropy(logits, target)
                log.step(optimizer, loss, len(target), f"task {task.id} epoch {epoch}")
            schedule.step()
        adapters.set_dropout_generator(None)
        self.note_steps(cfg.epochs * len(loader))

    # ---------------------------------------------------------------------------------------- prediction
    def logits_from_features(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, d) subspace features -> (B, C) logits over the seen classes."""
        protos = self.protos.to(feats.device)
        if not self.cfg.use_reweight:  # EaseCosineLinear.forward: cosine on the concatenation
            return F.normalize(feats.flatten(1), dim=-1) @ F.normalize(protos.flatten(1), dim=-1).T
        cos = torch.einsum("btd,ctd->bct", F.normalize(feats, dim=-1), F.normalize(protos, dim=-1))  # (B, C, T)
        w = subspace_weights(self.class_task, len(self.adapter_sets), self.cfg.alpha).to(feats.device)
        return (cos * w).sum(dim=-1)

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "EASE")
        start = time.perf_counter()
        for s in self.adapter_sets:
            s.eval()
        out = []
        for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False):
            feats = self._features(images.to(self.ctx.device), list(self.adapter_sets))  # T backbone passes
            out.append(self.logits_from_features(feats).cpu())
        logits = torch.cat(out)
        task = len(self.adapter_sets) - 1
        self._eval_s_per_image.setdefault(task, (time.perf_counter() - start) / max(len(split), 1))
        self._last_predict = (len(split), logits.argmax(dim=1).numpy())
        return logits

    def adapted_features(self, split: Split) -> torch.Tensor:
        """Every adapter subspace's [CLS], concatenated (N, T d): the features the prototypes are compared in."""
        feats = self._split_features(split)
        return feats.reshape(len(feats), -1)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """Inference cost (backbone passes and measured seconds per test image) and the accuracy of the task
        implied by the predicted class."""
        out: dict[str, Any] = {
            "adapter_sets": len(self.adapter_sets),
            "backbone_passes_per_image": len(self.adapter_sets),
        }
        task = len(self.adapter_sets) - 1
        if task in self._eval_s_per_image:
            out["eval_s_per_image"] = self._eval_s_per_image[task]
        if self._last_predict is not None and self._last_predict[0] == len(split):
            pred_task = np.asarray(self.class_task)[self._last_predict[1]]
            out["task_id_accuracy"] = float((pred_task == np.asarray(true_task)).mean() * 100)
        return out

    def param_counts(self) -> ParamCounts:
        n_sets = len(self.adapter_sets)
        adapters = adapter_set_size(self.n_blocks, self.dim, self.cfg.bottleneck)
        added, stored = CARD.split_kept(self._added, 0, {"adapter_params_per_task": adapters}, [])
        return ParamCounts(
            added_per_task=added,
            stored_per_task=stored,
            trainable_per_task=list(self._trainable),
            head=self.protos.numel(),
            extra={
                "adapter_params_per_task": adapters,
                "adapter_sets": n_sets,
                "prototype_params": self.protos.numel(),
                "backbone_passes_per_test_image_per_task": list(range(1, n_sets + 1)),  # measured s: diagnostics
            },
        )
