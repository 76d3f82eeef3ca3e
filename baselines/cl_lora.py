"""CL-LoRA: a task-shared LoRA in the early blocks (distilled) and task-specific LoRA in the later ones.

Paper: He, Duan and Zhu, "CL-LoRA: Continual Low-Rank Adaptation for Rehearsal-Free Class-Incremental Learning",
CVPR 2025. Reference implementation checked: the authors' ``JiangpengHe/CL-LoRA`` @
``df4e74efe589ca1aa872d3843315ab6851192cf3``: ``models/cllora.py`` (``Learner``: ``_init_train``, ``replace_fc``,
``_KD_loss``, ``compute_orthogonality_loss``), ``backbone/vit_cllora.py`` (``Adapter_lora``, ``Attention_lora``,
``VisionTransformer``: ``forward_train``, ``forward_test``, ``forward_proto``, ``forward_general_cls``,
``add_adapter_to_list``), ``utils/inc_net.py`` (``OurNet``), ``backbone/linears.py`` (``CosineLinearFeature``:
``forward_diagonal``) and ``exps/*.json``. LibContinual carries a port (not read line by line for this module).

Algorithm (the reference's settings: ``msa`` [1, 0, 1], ``general_pos`` the first half of the blocks,
``specfic_pos`` the second half, ``use_distillation``, ``use_block_weight``, ``use_init_ptm`` false), per task t:

1. every block's attention gets a rank-r LoRA on its queries and values: ``q += w_q up_q(down_q(h))`` (values alike),
   h the block's normed input. ``down`` (the reference's ``lora_B``) starts as the transposed Q of a QR of a
   uniform random (d, r) matrix (orthonormal rows); ``up`` (its ``lora_A``) starts at zero;
2. the first S blocks carry one task-shared LoRA: its down-projections stay frozen from the start, its
   up-projections train on every task (w = 1). The other blocks carry a new task-specific LoRA per task (both
   projections train) scaled by the task's block weights w (a (3, P) matrix, uniform(0.5, 1.5), rows q, k, v;
   keys carry no LoRA, so the k row is read only by the orthogonality loss below);
3. a new training head per task: PILOT's ``CosineLinearFeature`` over the task's classes (uniform(+-1/sqrt(d))
   rows, a learnable scale starting at 1). SGD (momentum 0.9, weight decay), cosine schedule per epoch. Each batch:
   cross-entropy of the head on the [CLS] feature through all blocks (shared LoRA, the task's LoRA and block
   weights); from the second task on, first a knowledge-distillation step: the [CLS] after the shared blocks alone
   (then the final norm), with the current shared LoRA and with the teacher's (the shared LoRA as it was after the
   previous task), both through the current head, ``kd_weight x soft cross-entropy at temperature T`` (no T^2;
   the teacher's logits are not detached, so the head learns from both sides); its gradient on each shared
   up-projection is rescaled row by row by ``d ||u_i|| / sum_j ||u_j||`` of the teacher's up-projection rows
   (gradient reassignment) and the optimiser steps on it; then the cross-entropy plus ``orth_weight x`` the mean
   |cosine| between the flattened block weights and every earlier task's, and a second step;
4. after training: the prototypes of the task's classes, means of the [CLS] features of its training images (test
   transform) through the shared LoRA and the task's LoRA and block weights; the training head is dropped; the
   shared LoRA is copied as the next task's teacher;
5. inference: for every task i learnt, the [CLS] feature through the current shared LoRA and task i's LoRA and
   block weights; the logits of task i's classes are the cosines between it and their prototypes (the final
   head's scale stays 1). Each image's logits depend on it alone: one protocol.

Scenarios: class-incremental only. The authors evaluate no domain-incremental benchmark, and the method would need a
change there: each task's prototypes fill its own classes' logits, and a later domain of the same classes would have
to choose between the paths.

Deviations from the reference code:

- The step from the second task on. The reference builds the cross-entropy's graph, then steps on the distillation's
  gradient, then backpropagates the cross-entropy through the graph built before that step. Under torch >= 2.1 (and
  torch 2.0's CPU optimisers) this stops with "a variable needed for gradient computation has been modified by an
  inplace operation"; the reference's torch 2.0.1 CUDA foreach optimiser did not mark its in-place updates, so the
  backward silently read the updated weights with the activations of the old ones. Here both gradients are taken
  at the same parameters (those the two forward passes ran with) and applied in the reference's order: the
  reassigned distillation step, then the cross-entropy step (the same SGD state, momentum included).
- The prototypes are computed for the task's own LoRA only. The reference also fills every older task's feature block of
  the new classes' prototype rows (``replace_fc`` over every adapter index), which ``forward_diagonal`` never reads.
- Only the last teacher is kept (the reference keeps a copy of the shared LoRA after every task in
  ``old_adapter_list`` and reads only the last one); training heads are dropped after their task (the reference
  keeps them in ``fc_list`` and never reads them).
- Gradient reassignment when the teacher's up-projection is all zeros (only after a first task that did not train):
  the reference divides by zero; here the gradient is left as it is.
- The shared blocks are a number, ``shared_blocks`` (-1: the first half, the reference's 6 of 12), so that narrower
  backbones (the micro ViT's 4 blocks) run the same split; the reference lists block indices.
- The evaluation runs the shared blocks once per image and branches for the task-specific blocks (the reference runs
  every task's path from the patch embedding; same numbers). Attention runs through torch's
  ``scaled_dot_product_attention`` on timm's fused qkv projection (the reference splits it into q, k, v
  projections; same formula). The [CLS] feature is read through the backbone's ``forward_head`` (its pooling and
  ``fc_norm``), the final norm first, as for every clbench method.
- The ``ci`` profile (the regression gate, not the default) computes in float64 (``float64``: a float64 copy of the
  frozen ViT, the LoRA, the heads), so that its numbers do not depend on the CPU's kernels; it trains at lr 0.3
  (4 epochs of 3 steps).
- The reference's ViT is ViT-B/16; clbench runs the benchmark's backbone. Timm models whose attention has
  ``q_norm``/``k_norm`` apply them to the shifted queries. DINOv2's LayerScale scales the attention output as usual.
  Transforms, normalisation, class order and task split are the harness's. Test accuracy is not computed during
  training, nor the reference's task-identity diagnostics.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.cl_lora import CARD, CLLoRAConfig
from clbench.errors import ClbenchError
from clbench.layers.checks import check_protocol
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import (
    EpochLog,
    Float64FrozenViT,
    TrainingTrace,
    class_means,
    cosine_logits,
    frozen_vit,
    vit_tokens,
)


# ------------------------------------------------------------------------------------------------ the LoRA layer
def orthogonal_down(dim: int, rank: int, generator: torch.Generator) -> torch.Tensor:
    """(rank, dim) rows orthonormal: the transposed Q of a QR of a uniform random (dim, rank) matrix (the reference's
    ``Adapter_lora`` with ``random_orth``)."""
    q, _ = torch.linalg.qr(torch.rand(dim, rank, generator=generator))
    return q.T.contiguous()


class QVLoRA(nn.Module):
    """One block's LoRA on the attention's queries and values: ``delta_q = up_q(down_q(h))``, values alike.
    ``down`` (r, d) is the reference's ``lora_B``, ``up`` (d, r) its ``lora_A`` (zero at the start)."""

    def __init__(self, dim: int, rank: int, generator: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.down_q = nn.Parameter(orthogonal_down(dim, rank, generator).to(dtype))
        self.up_q = nn.Parameter(torch.zeros(dim, rank, dtype=dtype))
        self.down_v = nn.Parameter(orthogonal_down(dim, rank, generator).to(dtype))
        self.up_v = nn.Parameter(torch.zeros(dim, rank, dtype=dtype))

    def ups(self) -> list[nn.Parameter]:
        return [self.up_q, self.up_v]

    def deltas(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N, d) each: the query and value shifts for normed tokens ``h``."""
        return (h @ self.down_q.T) @ self.up_q.T, (h @ self.down_v.T) @ self.up_v.T


def qv_lora_attention(
    attn: nn.Module, h: torch.Tensor, lora: QVLoRA, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """timm ``Attention`` on normed tokens ``h`` (B, N, d) with ``q += w_q delta_q`` and ``v += w_v delta_v``
    (``weights``: the (3,) block weights q, k, v, or None for 1; the reference's ``Attention_lora``)."""
    B, N, C = h.shape
    heads = int(attn.num_heads)
    hd = C // heads
    dq, dv = lora.deltas(h)
    if weights is not None:
        dq, dv = weights[0] * dq, weights[2] * dv
    qkv = attn.qkv(h)  # (B, N, 3 d): q, k, v
    q, k, v = qkv[..., :C] + dq, qkv[..., C : 2 * C], qkv[..., 2 * C :] + dv
    q, k, v = (z.reshape(B, N, heads, hd).transpose(1, 2) for z in (q, k, v))  # (B, H, N, hd)
    q, k = attn.q_norm(q), attn.k_norm(k)
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C)
    out = attn.norm(out) if hasattr(attn, "norm") else out
    return attn.proj_drop(attn.proj(out))


def qv_lora_block(block: nn.Module, x: torch.Tensor, lora: QVLoRA, weights: torch.Tensor | None = None) -> torch.Tensor:
    """One pre-norm timm ``Block`` with the query/value LoRA in its attention."""
    x = x + block.drop_path1(block.ls1(qv_lora_attention(block.attn, block.norm1(x), lora, weights)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


# ------------------------------------------------------------------------------------------------ the losses
def kd_loss(pred: torch.Tensor, soft: torch.Tensor, temperature: float) -> torch.Tensor:
    """The reference's ``_KD_loss``: -sum softmax(soft / T) log_softmax(pred / T) / B (no T^2 factor)."""
    log_p = torch.log_softmax(pred / temperature, dim=1)
    return -(torch.softmax(soft / temperature, dim=1) * log_p).sum() / pred.shape[0]


def orthogonality_loss(previous: list[torch.Tensor], current: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The reference's ``compute_orthogonality_loss``: mean over earlier block weights of the absolute cosine between
    the flattened matrices (each divided by its norm + eps); zero without earlier ones."""
    cur = current.flatten() / (current.flatten().norm() + eps)
    total = current.new_zeros(())
    for prev in previous:
        total = total + (prev.flatten() / (prev.flatten().norm() + eps) * cur).sum().abs()
    return total / len(previous) if previous else total


def reassignment_weights(teacher_up: torch.Tensor) -> torch.Tensor:
    """(d, 1) factors of the gradient reassignment: ``d ||u_i|| / sum_j ||u_j||`` over the rows of the teacher's
    (d, r) up-projection; ones where the rows are all zero (the reference divides by zero there)."""
    norms = teacher_up.norm(dim=1)
    total = norms.sum()
    if float(total) == 0.0:
        return torch.ones_like(norms).unsqueeze(1)
    return (len(norms) * norms / total).unsqueeze(1)


class TrainingHead(nn.Module):
    """PILOT's ``CosineLinearFeature`` over one task's classes: ``sigma cos(f, w_c)``, rows uniform(+-1/sqrt(d)), sigma
    learnable from 1."""

    def __init__(self, dim: int, n_classes: int, generator: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        bound = 1.0 / dim**0.5
        self.weight = nn.Parameter(torch.empty(n_classes, dim).uniform_(-bound, bound, generator=generator).to(dtype))
        self.sigma = nn.Parameter(torch.ones(1, dtype=dtype))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cosine_logits(features, self.weight, self.sigma)


# ------------------------------------------------------------------------------------------------ the strategy
@CARD.strategy
class CLLoRA(Float64FrozenViT, Strategy[CLLoRAConfig]):
    state_types = (QVLoRA,)
    needs_vit = True

    def __init__(self, config: CLLoRAConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = frozen_vit(ctx.backbone.model, self.dtype)  # with float64 a float64 copy (frozen too)
        self.dim = int(ctx.backbone.num_features)
        self.depth = len(self.model.blocks)
        self.n_shared = config.n_shared(self.depth)
        if not 0 <= self.n_shared < self.depth:
            raise ClbenchError(
                f"CL-LoRA needs at least one task-specific block: shared_blocks {self.n_shared} of {self.depth} blocks",
                f"set --set shared_blocks to a number below {self.depth} (-1: half the blocks)",
            )
        if config.rank > self.dim:
            raise ClbenchError(
                f"CL-LoRA rank {config.rank} exceeds the backbone's width {self.dim}", "lower --set rank"
            )
        gen = ctx.generator(100)
        self.shared = nn.ModuleList([QVLoRA(self.dim, config.rank, gen, self.dtype) for _ in range(self.n_shared)]).to(
            ctx.device
        )
        for lora in self.shared:  # the shared down-projections never train (the reference freezes them at once)
            lora.down_q.requires_grad_(False)
            lora.down_v.requires_grad_(False)
        self.teacher: nn.ModuleList | None = None  # the shared LoRA after the previous task
        self.specific = nn.ModuleList()  # per task: a ModuleList of its QVLoRA, one per specific block
        self.block_weights = nn.ParameterList()  # per task: (3, P) weights of q, k, v in the specific blocks
        self.prototypes: list[torch.Tensor] = []  # per task: (c_t, d) class means of its path's features
        self.task_classes: list[list[int]] = []
        self.n_seen = 0
        self._trainable: list[int] = []

    # ---------------------------------------------------------------------------------------- forward
    def _shared_blocks(self, x: torch.Tensor, loras: nn.ModuleList) -> torch.Tensor:
        for i in range(self.n_shared):
            x = qv_lora_block(self.model.blocks[i], x, loras[i])
        return x

    def _specific_blocks(self, x: torch.Tensor, task: int) -> torch.Tensor:
        loras, weights = self.specific[task], self.block_weights[task]
        for j, i in enumerate(range(self.n_shared, self.depth)):
            x = qv_lora_block(self.model.blocks[i], x, loras[j], weights[:, j])
        return x

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, d): the final norm, then the backbone's pooling ([CLS] for the reference's ViT)."""
        return self.model.forward_head(self.model.norm(x), pre_logits=True)

    def _tokens(self, images: torch.Tensor) -> torch.Tensor:
        return vit_tokens(self.model, images.to(self.ctx.device, self.dtype))

    def _features(self, images: torch.Tensor, task: int) -> torch.Tensor:
        """(B, d) through the shared LoRA and task ``task``'s LoRA and block
        weights (``forward_train``, ``forward_proto``)."""
        with self.ctx.autocast():
            h = self._shared_blocks(self._tokens(images), self.shared)
            return self._pool(self._specific_blocks(h, task)).to(self.dtype)

    def _all_task_features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Per task learnt, (B, d) features through its path (``forward_test``): the shared blocks run once."""
        with self.ctx.autocast():
            h = self._shared_blocks(self._tokens(images), self.shared)
            return [self._pool(self._specific_blocks(h, t)).to(self.dtype) for t in range(len(self.specific))]

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        t = len(self.specific)
        offset = self.n_seen
        gen = ctx.generator(1000 + t)
        n_specific = self.depth - self.n_shared
        self.specific.append(
            nn.ModuleList([QVLoRA(self.dim, cfg.rank, gen, self.dtype) for _ in range(n_specific)]).to(dev)
        )
        weights = torch.empty(3, n_specific).uniform_(0.5, 1.5, generator=gen).to(self.dtype)
        self.block_weights.append(nn.Parameter(weights.to(dev)))
        head = TrainingHead(self.dim, len(task.classes), gen, self.dtype).to(dev)
        self.n_seen = task.n_seen

        shared_ups = [p for lora in self.shared for p in lora.ups()]
        params = [*shared_ups, *self.specific[t].parameters(), self.block_weights[t], head.weight, head.sigma]
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs, eta_min=cfg.min_lr)
        loader = task.train.image_loader(cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + t))
        log = EpochLog(ctx, f"CL-LoRA task {t}", cfg.epochs, len(loader))
        for epoch in log.epochs():
            for images, labels, _ in loader:
                labels = labels.to(dev) - offset
                loss = F.cross_entropy(head(self._features(images, t)), labels)
                if t > 0:
                    loss = loss + cfg.orth_weight * orthogonality_loss(
                        list(self.block_weights[:t]), self.block_weights[t]
                    )
                    loss = self._distillation_step(optimizer, images, head, params, loss)
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
            schedule.step()
        self.note_steps(cfg.epochs * len(loader))
        for p in params:
            p.requires_grad_(False)

        # prototypes: class means of the task's training images (test transform) through its path
        feats, labels_all = [], []
        with torch.no_grad():
            for images, labels, _ in task.train.image_loader(cfg.eval_batch_size, augment=False):
                feats.append(self._features(images, t))
                labels_all.append(labels.to(dev))
        self.prototypes.append(class_means(torch.cat(feats), torch.cat(labels_all), task.classes))
        self.task_classes.append(list(task.classes))
        # the next task's teacher; the shared up-projections train again then
        self.teacher = copy.deepcopy(self.shared)
        for p in shared_ups:
            p.requires_grad_(True)
        self._trainable.append(sum(p.numel() for p in params))

    def _distillation_step(
        self,
        optimizer: torch.optim.Optimizer,
        images: torch.Tensor,
        head: TrainingHead,
        params: list,
        loss: torch.Tensor,
    ) -> torch.Tensor:
        """The distillation step taken before each cross-entropy step from the second task on, its gradient
        reassigned; returns a stand-in for ``loss`` whose gradient is the cross-entropy's at the parameters before
        this step (value unchanged), for the caller's step."""
        cfg = self.cfg
        assert self.teacher is not None
        with self.ctx.autocast():
            tokens = self._tokens(images)
            student = head(self._pool(self._shared_blocks(tokens, self.shared)))
            teacher = head(self._pool(self._shared_blocks(tokens, self.teacher)))
        kd = cfg.kd_weight * kd_loss(student, teacher, cfg.kd_temperature)
        # both gradients at the same parameters (module docstring): the cross-entropy's first, then the distillation's
        g_loss = torch.autograd.grad(loss, params, allow_unused=True)
        g_kd = torch.autograd.grad(kd, params, allow_unused=True)
        trace = TrainingTrace.current()
        if trace is not None:
            trace.before_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        rows = {id(p): None for p in params}
        if cfg.gradient_reassignment:
            for lora, old in zip(self.shared, self.teacher, strict=True):
                rows[id(lora.up_q)] = reassignment_weights(old.up_q)
                rows[id(lora.up_v)] = reassignment_weights(old.up_v)
        for p, g in zip(params, g_kd, strict=True):
            if g is not None:  # unused (the task's LoRA, its block weights): no step, as set_to_none in the reference
                scale = rows[id(p)]
                p.grad = g if scale is None else scale * g
        optimizer.step()
        # loss.detach() + sum <p, g> - its value: the value of ``loss``, the gradient g of the old parameters
        linear = sum((p * g).sum() for p, g in zip(params, g_loss, strict=True) if g is not None)
        return loss.detach() + linear - linear.detach()

    # ---------------------------------------------------------------------------------------- prediction
    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        feats = self._all_task_features(images)
        out = torch.zeros(images.shape[0], self.n_seen, dtype=self.dtype, device=feats[0].device)
        for f, protos, classes in zip(feats, self.prototypes, self.task_classes, strict=True):
            out[:, classes] = cosine_logits(f, protos)  # ``forward_diagonal``: task i's classes on task i's path
        return out

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "CL-LoRA")
        out = [
            self._logits(images).float().cpu()
            for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out)

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """The last task's path's features: what its prototypes score (the other tasks' paths differ per task)."""
        out = [
            self._features(images, len(self.specific) - 1).float().cpu()
            for images, _, _ in split.image_loader(64, augment=False)
        ]
        return torch.cat(out)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """The mean |block weight| of each task's query and value rows (how strongly its LoRA enters)."""
        return {"block_weight_mean_abs": [[float(w[r].abs().mean()) for r in (0, 2)] for w in self.block_weights]}

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        half = sum(lora.up_q.numel() + lora.up_v.numel() for lora in self.shared)
        per_task = [
            sum(p.numel() for p in s.parameters()) + w.numel()
            for s, w in zip(self.specific, self.block_weights, strict=True)
        ]
        added = [n + (half if t == 0 else 0) for t, n in enumerate(per_task)]
        teacher = 0 if self.teacher is None else sum(lora.up_q.numel() + lora.up_v.numel() for lora in self.teacher)
        downs = sum(lora.down_q.numel() + lora.down_v.numel() for lora in self.shared)
        stored = [p.numel() + (downs + teacher if t == 0 else 0) for t, p in enumerate(self.prototypes)]
        return ParamCounts(
            added_per_task=added,
            trainable_per_task=list(self._trainable),
            head=sum(p.numel() for p in self.prototypes),
            stored_per_task=stored,
            extra={"shared_blocks": self.n_shared, "specific_blocks": self.depth - self.n_shared},
        )
