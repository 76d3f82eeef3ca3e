"""TUNA: task-specific adapters with an orthogonality term, a merged universal adapter, entropy-based selection.

Paper: Wang, Zhou and Ye, "Integrating Task-Specific and Universal Adapters for Pre-Trained Model-based
Class-Incremental Learning", ICCV 2025, arXiv 2508.08165.
Reference implementation checked: the authors' LAMDA-CL/ICCV2025-TUNA at its last authors' commit
``77d4f10ec92368d28d97664a26fb2b36f2e54fdd`` (as kept in the fork Ngahoang2005/ICCV2025-TUNA, whose later commits
are the fork owner's and were not used): ``models/tuna.py`` (``Learner``, ``AngularPenaltySMLoss``),
``backbone/vit_tuna.py`` (``Adapter``, ``emr_merge``, ``VisionTransformer.merge`` / ``forward_features``),
``backbone/linears.py`` (``SimpleContinualLinear``), ``utils/inc_net.py`` (``TUNANet``, the AdaptFormer
``tuning_config``) and ``exps/tuna_*.json`` (defaults: ``exps/tuna_imgr.json``; ``exps/tuna_cifar.json`` is the
``reference-cifar`` profile).

Algorithm, for task t with new classes C_t (tasks counted from 0):

1. One AdaptFormer adapter set (r = 16, scale 0.1, dropout 0.1, beside every block's MLP as in
   :mod:`baselines.ease`) is trained per task; it starts where the previous task's set ended (the reference builds
   ``cur_adapter`` once and never re-initialises it). The head is a cosine classifier without bias or scale, one
   block of rows per task (``SimpleContinualLinear``: trunc-normal std 0.02, every block trainable).
   Loss: CosFace on the task's own classes, CE(s (cos - m 1_y)) over the columns of C_t (s = 20, m = 0), plus,
   for t >= 1 with ``use_orth``, reg * exp(-(t + 1)) * sum_{i<t} (1/L) sum_l |mean(N(W_up^{t,l}) N(W_up^{i,l})^T)|
   with N = row-wise L2 normalisation (d x r rows) and L blocks (``orth_loss``). SGD momentum 0.9, lr 0.02 for
   the adapters and the head, weight decay 5e-4, cosine to 0 over 10 epochs (per epoch), batch 32.
2. End of task: the set is stored (frozen) as set t; every new class gets the mean and covariance (+ 1e-4 I) of
   its training images' features under set t (eval transform, dropout off). For t >= 1 the universal set is
   rebuilt from all stored sets by ``emr_merge``: per parameter entry, the sign of the mean over sets is elected
   (+1 where the mean is > 0, else -1) and the entry is that sign times the largest magnitude among the sets
   whose entry has that sign (the rescalers and masks ``emr_merge`` also returns are unused).
3. Classifier alignment (t >= 1): ``ca_epochs`` = 30 epochs of SGD (lr 0.005, momentum 0.9, weight decay 5e-4,
   CosineAnnealingLR with T_max = 5, hard-coded, so the rate rises again after epoch 5) on every head row, with
   5 * batch_size = 160 features per seen class drawn from N(mu_c, cov_c) per epoch, shuffled, run as ``n_seen``
   mini-batches of 160, loss CE(s cos). With ``decay``, mu_c = (0.9 + 0.1 (k + 1) / (t + 1)) mean_c for a class
   of task k: older tasks' means shrink more.
4. Inference (no task id), per image: after task 0, the cosine logits under set 0. After task t >= 1: the
   ViT runs once per stored set i (logits_i = s cos under set i); the set whose softmax has the least entropy
   -sum p log(p + 1e-10) is selected for that image (first one on ties); the universal set gives logits_u; the
   output is softmax(logits_u) + softmax(logits_selected). t + 2 ViT passes per image.

Every step depends on the image alone (the reference's selection is per sample too), so there is only
the ``per-sample`` protocol.

Reference flaws (a setting reproduces each; the defaults follow the paper; profile ``reference-code`` sets all three):

- ``universal="last"``: the code never evaluates the merged set. ``_eval_cnn`` asks for ``adapter_id = t + 1``,
  and ``forward_features`` maps ``adapter_id == len(adapter_list)`` (= t + 1 after ``adapter_update``) to
  ``cur_adapter``, the last task's set; the merged set is only reached by ids above that. The paper's universal
  adapter is the merge (default ``"merged"``); ``"last"`` scores the universal branch with set t, as the code does.
- ``decay_rule="reference"``: ``classifer_align`` counts a class in task ``class_idx // task_size`` with
  ``task_size = _known_classes - _total_classes``, minus the current task's size, so the floor division gives
  0 for class 0, -1 for classes 1..n, -2 for the next n, ...: the decay factor is 0.9 + 0.1 / (t + 1) for class 0,
  0.9 for the next n classes and below 0.9 for the rest (0.8 and less for later ones at large t), the reverse of
  the intended "older tasks shrink more". Default ``"task"``: the class's own task.
- ``orth_updates_old=True``: the orthogonality term does not detach the stored sets' W_up and ``get_optimizer``
  puts every parameter whose name holds "adapter" (stored sets included) in the optimizer, so from task 1 on the
  term and weight decay (with momentum) move the stored sets' W_up: earlier tasks' adapters drift away from the
  sets their class statistics were computed under. Default: stored sets are frozen.

Deviations from the paper / reference code:

- The orthogonality term averages over the backbone's L blocks; the reference hard-codes 12 (ViT-B).
- Feature sampling for alignment draws z ~ N(0, I) from a private generator and maps it through the float64
  Cholesky factor of each class covariance (the same distribution as ``MultivariateNormal``, which the reference
  calls on the float32 covariance); covariances are accumulated in float64. Adapter dropout, the head's init and
  the shuffles draw from private generators.
- The reference's CosFace loss sums exp() without the log-sum-exp shift; here it is a cross-entropy on the shifted
  logits (the same value where the reference's is finite).
- With ``universal="last"`` the universal branch reuses set t's features instead of a second identical pass.
- The head grows when classes arrive; the reference's ``SimpleContinualLinear`` grows one block per task too.
- Classes with fewer than 2 training images have no covariance: the run stops with a clear error (the reference
  would sample from NaN).
- DINOv2 blocks have LayerScale; the adapter output is added outside ``ls2`` (as in :mod:`baselines.ease`).
- The [CLS] feature is ``model.forward_head(norm(x), pre_logits=True)`` (the reference's ``norm(x)[:, 0]``).
- The backbone runs at the run's precision; the head, statistics and logits are float32.
- The reference's backbone is ViT-B/16 (IN-21k); clbench runs the benchmark's backbone (any width; the reference
  hard-codes 768). Transforms, normalisation, class order and task split are the harness's.
- Test accuracy is not computed during training (the reference logs it; nothing is selected on it).
- The CPU ``quick`` profile (not the default) runs at 112 px on the first 32 training images per class, with 2
  epochs instead of 10 and 10 alignment epochs instead of 30; ``ci`` is the gate's smaller run (see the card).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.tuna import CARD, TUNAConfig, head_rows_updated, old_up_weights_updated
from clbench.core.costs import adapter_set_size
from clbench.layers.adapter_sets import AdapterSets
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.alignment import align_on_gaussians
from clbench.layers.checks import check_protocol
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import EpochLog, cosine_lr, vit_forward_tokens, vit_tokens


# ----------------------------------------------------------------------------------------------- pieces
class TaskCosineHead(nn.Module):
    """``SimpleContinualLinear``: cosine logits cos(x, w_c), no bias, no scale; rows added per task (trunc-normal
    std 0.02, timm's ``trunc_normal_`` cut at +-2)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(0, dim))

    def grow(self, n_total: int, generator: torch.Generator) -> None:
        n_new = n_total - self.weight.shape[0]
        if n_new < 0:
            raise ValueError("the head never shrinks")
        rows = torch.empty(n_new, self.weight.shape[1])
        nn.init.trunc_normal_(rows, std=0.02, a=-2.0, b=2.0, generator=generator)
        self.weight = nn.Parameter(torch.cat([self.weight.data, rows.to(self.weight.device)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(x, dim=-1), F.normalize(self.weight, dim=-1))


def cosface_loss(cos: torch.Tensor, target: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """``AngularPenaltySMLoss(loss_type="cosface")``: mean of -log(e^{s(cos_y - m)} / (e^{s(cos_y - m)} +
    sum_{j != y} e^{s cos_j}))."""
    shifted = cos - margin * F.one_hot(target, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(scale * shifted, target)


def orth_loss(current: AdapterSet, previous: Sequence[AdapterSet], detach_previous: bool = True) -> torch.Tensor:
    """``Learner.orth_loss``: sum over stored sets i of (1/L) sum_l |mean(N(W_up^cur_l) N(W_up^i_l)^T)|, N the L2
    normalisation of each of the d rows of W_up (d x r)."""
    total = current[0].up_weight.new_zeros(())
    for prev in previous:
        for cur_a, prev_a in zip(current, prev, strict=True):
            other = prev_a.up_weight.detach() if detach_previous else prev_a.up_weight
            dot = (F.normalize(cur_a.up_weight, dim=1) @ F.normalize(other, dim=1).T).mean()
            total = total + dot.abs() / len(current)
    return total


def emr_merge(sets: Sequence[AdapterSet]) -> AdapterSet:
    """``emr_merge`` + ``VisionTransformer.merge``: per entry, the elected sign (+1 where the mean over sets is > 0,
    else -1) times the largest magnitude among the sets whose entry has that sign (0 where none has)."""
    merged = copy.deepcopy(sets[-1])
    with torch.no_grad():
        for name, p in merged.named_parameters():
            stacked = torch.stack([dict(s.named_parameters())[name] for s in sets])  # (T, ...)
            flag = torch.where(stacked.mean(dim=0) > 0, 1.0, -1.0).to(stacked.dtype)
            agree = (stacked * flag) > 0
            p.copy_((stacked.abs() * agree).amax(dim=0) * flag)
    return merged.requires_grad_(False).eval()


def decay_factors(class_task: Sequence[int], t: int, n_new: int, rule: str) -> torch.Tensor:
    """(C,) factors of the alignment means with ``decay``: 0.9 + 0.1 (k + 1) / (t + 1), k the class's task
    (``rule="task"``) or the reference's ``class_idx // (known - total)`` = class // -n_new (``"reference"``)."""
    if rule == "task":
        ks = list(class_task)
    else:
        ks = [c // -n_new for c in range(len(class_task))]  # python floor division, as the reference's ints
    return torch.tensor([0.9 + (k + 1) / (t + 1) * 0.1 for k in ks], dtype=torch.float64)


def entropy_select(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, C) scaled logits under each set -> (B, C) logits of the set whose softmax has the least entropy and
    (B,) its index (the first on ties, as ``torch.argmin``)."""
    probs = F.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + eps)).sum(dim=-1)  # (B, T)
    chosen = entropy.argmin(dim=1)
    return logits[torch.arange(len(logits), device=logits.device), chosen], chosen


def tuna_output(specific: torch.Tensor, universal: torch.Tensor) -> torch.Tensor:
    """softmax(universal logits) + softmax(selected task-specific logits)."""
    return F.softmax(universal, dim=1) + F.softmax(specific, dim=1)


# ----------------------------------------------------------------------------------------------- the strategy
@CARD.strategy
class TUNA(AdapterSets, Strategy):
    title = "TUNA"
    # scenarios: class only: its loss is CosFace over each task's NEW classes with a head block per task, and the
    # entropy selection picks among task heads; a later domain of the same classes has no new classes to train
    state_types = (AdapterSet, Adapter, TaskCosineHead)
    needs_vit = True

    def __init__(self, config: TUNAConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self._start_adapter_sets()  # model, dim, n_blocks, current, stored
        self.merged = nn.ModuleList()  # the universal set (emr_merge of ``stored``), from task 1 on
        self.head = TaskCosineHead(self.dim).to(ctx.device)
        self.class_mean = torch.zeros(0, self.dim)  # (C, d) under the class's own set
        self.class_cov: list[torch.Tensor] = []  # per class (d, d) or (d,) variance
        self.class_task: list[int] = []
        self._added: list[int] = []
        self._stored: list[int] = []
        self._trainable: list[int] = []
        self._last_predict: tuple[int, np.ndarray, np.ndarray] | None = None  # (n, argmax, selected set)

    # ---------------------------------------------------------------------------------------- features
    def _all_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, T [+ 1], d): features under every stored set, then under the merged set where it is used."""
        sets = list(self.stored) + (list(self.merged) if self.cfg.universal == "merged" else [])
        with self.ctx.autocast():
            tokens = vit_tokens(self.model, images)  # shared by all sets
            feats = [self.model.forward_head(vit_forward_tokens(self.model, tokens, s), pre_logits=True) for s in sets]
        return torch.stack(feats, dim=1).float()

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        t, cfg = len(self.stored), self.cfg
        self._check_new_classes(task)
        self.head.grow(task.n_seen, self.ctx.generator(1000 + t))
        self.class_task.extend([t] * len(task.classes))

        self._train_adapters(task)  # 1. the current set and the head
        snapshot = self._store_current()  # 2. adapter_update
        if t >= 1 and cfg.universal == "merged":
            self.merged = nn.ModuleList([emr_merge(list(self.stored))])
        self._class_statistics(task)
        if t >= 1 and cfg.ca_epochs > 0:  # 3. classifier alignment
            self._align_classifier(task)

        adapters = sum(p.numel() for p in snapshot.parameters())
        n = len(task.classes)
        stats = n * self.dim + sum(c.numel() for c in self.class_cov[-n:])
        merged = sum(p.numel() for p in self.merged.parameters()) if t == 1 else 0
        self._added.append(adapters + n * self.dim)
        self._stored.append(stats + merged)
        self._trainable.append(
            adapters
            + self.dim * head_rows_updated(cfg, t, n, task.n_seen)
            + old_up_weights_updated(cfg, t, self.n_blocks, self.dim)
        )

    def _train_adapters(self, task: Task) -> None:
        cfg, ctx, dev, t = self.cfg, self.ctx, self.ctx.device, len(self.stored)
        adapter_params = list(self.current.parameters())
        orth_on = cfg.use_orth and t >= 1
        if cfg.orth_updates_old and orth_on:  # the reference's optimizer holds the stored sets' W_up too
            for s in self.stored:
                for a in s:
                    a.up_weight.requires_grad_(True)
                    adapter_params.append(a.up_weight)
        groups = [
            {"params": adapter_params, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
            {"params": [self.head.weight], "lr": cfg.lr, "weight_decay": cfg.weight_decay},
        ]
        optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
        schedule = cosine_lr(optimizer, cfg.epochs, eta_min=cfg.min_lr)
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        local = torch.full((task.n_seen,), -1, dtype=torch.long)
        local[torch.as_tensor(task.classes)] = torch.arange(len(task.classes))
        first = min(task.classes)
        orth_weight = cfg.reg * math.exp(-(t + 1))
        self._set_dropout(self.current, 3000 + task.id)
        log = EpochLog(ctx, f"TUNA task {task.id}", cfg.epochs, len(loader))
        self.current.train()
        self.current.requires_grad_(True)
        for epoch in log.epochs():
            for images, labels, _ in loader:
                images, target = images.to(dev), local[labels].to(dev)
                cos = self.head(self._features(images, self.current))  # (B, n_seen): old rows get zero gradient
                loss = cosface_loss(cos[:, first:], target, cfg.scale, cfg.margin)
                if orth_on:
                    loss = loss + orth_weight * orth_loss(self.current, self.stored, not cfg.orth_updates_old)
                log.step(optimizer, loss, len(target), f"task {task.id} epoch {epoch}")
            schedule.step()
        self.note_steps(cfg.epochs * len(loader))  # the adapters' steps; head-only alignment steps are not counted
        self.current.eval()
        self._set_dropout(self.current, None)
        self.stored.requires_grad_(False)

    @torch.no_grad()
    def _class_statistics(self, task: Task) -> None:
        cfg = self.cfg
        feats = self._split_features(task.train, self.stored[-1])  # _compute_mean: set t, eval mode
        means, covs = [], []
        for c in sorted(task.classes):
            own = feats[task.train.labels == c].double()
            cov = torch.cov(own.T) + cfg.cov_eps * torch.eye(self.dim, dtype=torch.float64)
            means.append(own.mean(dim=0).float())
            covs.append(cov.float() if cfg.ca_storage == "covariance" else torch.diagonal(cov).float().clone())
        self.class_mean = torch.cat([self.class_mean, torch.stack(means)])
        self.class_cov.extend(covs)

    def _align_classifier(self, task: Task) -> None:
        cfg, dev, t = self.cfg, self.ctx.device, len(self.stored) - 1
        optimizer = torch.optim.SGD(
            [self.head.weight], lr=cfg.ca_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.ca_tmax)
        factors = []
        for cov in self.class_cov:  # sampling N(mean, cov) = mean + z L^T
            factors.append(cov.double().sqrt().diag() if cov.dim() == 1 else torch.linalg.cholesky(cov.double()))
        factors_t = torch.stack(factors).float().to(dev)  # (C, d, d)
        means = self.class_mean.double()
        if cfg.decay:
            means = means * decay_factors(self.class_task, t, len(task.classes), cfg.decay_rule)[:, None]
        per_class = cfg.batch_size * cfg.ca_samples_scale

        def log(epoch: int, loss: float) -> None:
            self.ctx.log(f"  TUNA task {task.id} alignment {epoch + 1}/{cfg.ca_epochs}: loss {loss:.4f}")

        gen = self.ctx.generator(5000 + task.id)
        loss_of = lambda x, y: F.cross_entropy(cfg.scale * self.head(x), y)  # noqa: E731
        where = f"task {task.id} alignment"
        align_on_gaussians(
            optimizer, schedule, cfg.ca_epochs, means.float().to(dev), factors_t, per_class, gen, loss_of, where, log
        )

    # ---------------------------------------------------------------------------------------- prediction
    def outputs_from_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T [+ 1], d) features under every stored set [and the merged one] -> (B, C) outputs and (B,) the
        selected set of each row."""
        n = len(self.stored)
        if n == 1:  # _eval_cnn1: the cosine logits under set 0
            return self.head(feats[:, 0]), torch.zeros(len(feats), dtype=torch.long, device=feats.device)
        scaled = self.cfg.scale * self.head(feats)  # (B, T [+ 1], C)
        specific, chosen = entropy_select(scaled[:, :n], self.cfg.entropy_eps)
        universal = scaled[:, n] if self.cfg.universal == "merged" else scaled[:, n - 1]
        return tuna_output(specific, universal), chosen

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "TUNA")
        out, chosen = [], []
        for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False):
            logits, sel = self.outputs_from_features(self._all_features(images.to(self.ctx.device)))
            out.append(logits.cpu())
            chosen.append(sel.cpu())
        logits = torch.cat(out)
        self._last_predict = (len(split), logits.argmax(dim=1).numpy(), torch.cat(chosen).numpy())
        return logits

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """Each image's [CLS] under the task-specific set the entropy rule selects (per sample)."""
        out = []
        for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False):
            feats = self._all_features(images.to(self.ctx.device))
            _, sel = self.outputs_from_features(feats)
            out.append(feats[torch.arange(len(feats), device=feats.device), sel].cpu())
        return torch.cat(out)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """Inference passes, the accuracy of the task implied by the predicted class and of the set the entropy rule
        selected (the last predict's)."""
        n = len(self.stored)
        passes = n + (1 if n >= 2 and self.cfg.universal == "merged" else 0)
        out: dict[str, Any] = {"adapter_sets": n, "backbone_passes_per_image": passes}
        if self._last_predict is not None and self._last_predict[0] == len(split):
            true_task = np.asarray(true_task)
            pred_task = np.asarray(self.class_task)[self._last_predict[1]]
            out["task_id_accuracy"] = float((pred_task == true_task).mean() * 100)
            out["selected_set_accuracy"] = float((self._last_predict[2] == true_task).mean() * 100)
        return out

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        n = len(self.stored)
        return ParamCounts(
            added_per_task=list(self._added),
            stored_per_task=list(self._stored),
            trainable_per_task=list(self._trainable),
            head=self.head.weight.numel(),
            extra={
                "adapter_params_per_task": adapter_set_size(self.n_blocks, self.dim, self.cfg.bottleneck),
                "adapter_sets": n,
                "merged_sets": len(self.merged),
                "class_statistics_params": self.class_mean.numel() + sum(c.numel() for c in self.class_cov),
                "backbone_passes_per_test_image_per_task": [
                    i + 1 + (1 if i >= 1 and self.cfg.universal == "merged" else 0) for i in range(n)
                ],
            },
        )
