"""CoFiMA: Continual Fisher-weighted Model Averaging, SLCA's slow learner with the tuned weights averaged per task.

Paper: Marouf et al., "Weighted Ensemble Models Are Strong Continual Learners", ECCV 2024, arXiv 2312.08977.
Reference implementation followed: LAMDA-PILOT @ ``5240714d3d6071aca824f8aed4a92a46ac6f883c`` (``models/cofima.py``
``Learner`` and ``interpolate_weights``, ``utils/inc_net.py`` ``SLCANet``, ``backbone/linears.py``
``SimpleContinualLinear``, ``exps/cofima.json``, ``exps/cofima_inr.json``); read beside it: the authors'
``IemProg/CoFiMA`` @ ``dc96bf1`` (``models/cofima.py``, ``exps/cofima/*.json``), whose algorithm is the same line for
line (module globals instead of ``args``; batch 128 and 5 alignment epochs, profile ``reference-authors``). clbench
follows PILOT's defaults.

The strategy fine-tunes a copy of the run's ViT (:attr:`clbench.methods.contract.Strategy.fine_tunes_backbone`), as
SLCA does; the frozen backbone stays bit-identical.

Algorithm, for each task t with new classes C_t (known classes K before it):

1. Slow learner (SLCA's stage 1): a new linear head block for C_t (trunc-normal std 0.02, bias 0; old blocks
   frozen); SGD (momentum 0.9, weight decay 5e-4), the whole ViT at ``lr * backbone_lr_scale`` = 1e-4, the new
   block at ``lr`` = 0.01; MultiStepLR (milestone 18, x 0.1) per epoch; 20 epochs of batch 64 on augmented images;
   cross-entropy on the new block's logits only.
2. Fisher diagonal (``getFisherDiagonal``): one more pass over the task's augmented training images in train mode;
   per batch the cross-entropy of *every* seen class's logit (the whole head) against the true label, and each
   parameter's squared gradient summed; divided by the number of batches and capped at ``fisher_max`` = 1e-4.
3. Merge (t >= 1, ``interpolate_weights``): every parameter the previous model had (the ViT and the earlier head
   blocks) becomes ``((1 - a) F0 theta0 + a F1 theta1) / ((1 - a) F0 + a F1)`` with a = ``wt_lambda`` = 0.4,
   theta0 the previous task's final model (its merged ViT and its aligned head), F0 its Fisher, theta1 / F1 this
   task's. ``fisher_weighting=False``: ``(1 - a) theta0 + a theta1``. The merged ViT is the model from now on
   (the next task fine-tunes it).
4. Class statistics of C_t through the merged ViT (mean, ``torch.cov`` + 1e-4 I), and for t >= 1 SLCA's classifier
   alignment on the merged head (every block; 3 epochs of 256 draws per class from the shrunk class Gaussians,
   logits normalised by the mean per-task norm and 0.1). Evaluation uses that head; the next task trains from the
   slow learner's head of before the merge (``fc.backup()`` / ``fc.recall()``), and averages with this aligned one.

Memory (what it keeps): the reference keeps a deep copy of the whole network per task (``prev_nets``), another per
task from the second on (``init_nets``, never read) and a Fisher dictionary per task (``fisher_mat``): 3 T - 1
ViT-sized tensor sets after T tasks, of which it reads the last two. clbench keeps what the next merge reads: the
previous model is the tuned ViT itself (unchanged between the merge and the next task's training) with its aligned
head, and one Fisher diagonal (ViT-sized). Between tasks, and so in every checkpoint (safetensors, no pickle):
the tuned ViT and one Fisher, whatever the number of tasks. During a task's training it also holds a snapshot of
theta0 (one more ViT-sized set, freed after the merge) besides the optimizer's momentum and the gradients; the
record's ``peak_rss_mb`` measures the peak. Parameter accounting: added = the tuned ViT once + each task's block;
stored = the class statistics and the kept Fisher (the ViT's entries at task 0, each block's in its task); trained
per task = the whole ViT + the new block (+ every block where the alignment runs).

Protocols: ``per-sample`` only.

Deviations from the reference code:

- Reference flaw behind a switch: in the Fisher-weighted merge, the new task's head block (a key only theta1 has)
  is set to ``F_theta1`` = its Fisher times its weights (entries <= 1e-4 times the weights: nearly zero), where the
  plain interpolation copies its weights; the alignment then starts from that nearly-zero block.
  ``new_head_merge="copy"`` (default) copies it; ``"fisher_scaled"`` reproduces the product.
- The Fisher pass computes every head block's gradient. In the reference the earlier blocks are frozen
  (``requires_grad=False``) but still carry the ``.grad`` of the last step that touched them (the previous
  alignment's last step, or for block 0 the previous Fisher pass's last batch), and ``getFisherDiagonal`` adds that
  stale gradient's square on every batch: their Fisher is an artefact of torch's gradient retention. clbench
  computes the real gradient of the earlier blocks (the golden fixture pins the case where the reference does the
  same: blocks with ``requires_grad`` and no stale gradient). This only moves the merged head, which is the
  alignment's starting point; not reproduced.
- Where both Fisher entries of a parameter are 0 (a parameter no loss reaches, or every backbone entry with
  ``backbone_lr_scale=0``), the reference divides 0 by 0 and writes NaN into the model; clbench takes the plain
  interpolation there (theta0 = theta1 in those cases, so it keeps the weight).
- Only the last model and Fisher are kept (above); the reference's checkpoint saving (``save_checkpoint``) is off in
  PILOT and not reproduced. Buffers are not merged (the reference's state-dict merge would fail on a buffer, which
  has no Fisher entry; timm's ViTs have none that a state dict holds).
- SLCA's deviations, shared: ``ca_task_index="exact"`` (default) finds a class's task where it arrived, the
  reference's ``c // task_size`` (wrong for unequal tasks) behind ``"reference"``; draws from a private generator
  through the float32 Cholesky factor; no per-epoch evaluation log; benchmark backbone, transforms, class order.
- Randomness: the Fisher pass's shuffled order and augmentations from ``ctx.generator`` (the reference re-iterates
  its training loader with the global RNG).
- The ``ci`` profile (not the default) runs SLCA's ci training in float64; see ``baselines/cards/cofima.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.cofima import CARD, CoFiMAConfig, counts
from clbench.layers.alignment import align_on_gaussians
from clbench.layers.checks import check_protocol
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import EpochLog, compute_dtype, cosine_lr

COV_RIDGE = 1e-4  # torch.eye(d) * 1e-4 added to each class covariance (_compute_class_mean)


class CoFiMAHeads(nn.Module):
    """One linear block per task, logits concatenated in arrival order (``SimpleContinualLinear``)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()

    def add(
        self, dim: int, n_classes: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> nn.Linear:
        block = nn.Linear(dim, n_classes, dtype=dtype)
        with torch.no_grad():
            nn.init.trunc_normal_(block.weight, std=0.02, a=-2.0, b=2.0, generator=generator)  # timm trunc_normal_
            block.bias.zero_()
        self.blocks.append(block.to(device))
        return block

    @property
    def sizes(self) -> list[int]:
        return [int(b.out_features) for b in self.blocks if isinstance(b, nn.Linear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.blocks], dim=1)


def normalised_logits(logits: torch.Tensor, task_sizes: list[int], temperature: float) -> torch.Tensor:
    """The alignment's logit normalisation: logits / (mean over tasks of each task block's L2 norm + 1e-7) / T."""
    blocks = torch.split(logits, task_sizes, dim=1)
    norms = torch.cat([blk.norm(p=2, dim=-1, keepdim=True) + 1e-7 for blk in blocks], dim=1)
    return logits / norms.mean(dim=-1, keepdim=True) / temperature


def shrink_factors(class_task: list[int], cur_task: int) -> torch.Tensor:
    """Per class: 0.9 + 0.1 (t_c + 1) / (t + 1), the alignment's shrinking of older classes' means."""
    return torch.tensor([0.9 + (tc + 1) / (cur_task + 1) * 0.1 for tc in class_task], dtype=torch.float64)


def alignment_tasks(class_task: list[int], task_size: int, index: str) -> list[int]:
    """The task of each seen class as the alignment reads it: where it arrived (``"exact"``), or the reference's
    ``c // task_size`` with the current task's size (``"reference"``)."""
    if index == "reference":
        return [c // task_size for c in range(len(class_task))]
    return list(class_task)


def fisher_diagonal(
    params: Mapping[str, torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    cap: float,
) -> dict[str, torch.Tensor]:
    """``getFisherDiagonal``: per parameter, the squared gradient of the batch's mean cross-entropy
    (``logits_of(x)`` against ``y``) summed over ``batches``, divided by their number, capped at ``cap``.
    A parameter the loss does not reach gets 0."""
    names = list(params)
    fisher = {n: torch.zeros_like(params[n]) for n in names}
    n_batches = 0
    for x, y in batches:
        loss = F.cross_entropy(logits_of(x), y)
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        for n, g in zip(names, grads, strict=True):
            if g is not None:
                fisher[n] += g.detach().pow(2)
        n_batches += 1
    return {n: torch.clamp(f / max(n_batches, 1), max=cap) for n, f in fisher.items()}


def merge_weights(
    theta0: Mapping[str, torch.Tensor],
    theta1: Mapping[str, torch.Tensor],
    alpha: float,
    fisher0: Mapping[str, torch.Tensor] | None = None,
    fisher1: Mapping[str, torch.Tensor] | None = None,
    new_head: str = "copy",
) -> dict[str, torch.Tensor]:
    """``interpolate_weights``: every key of ``theta0`` becomes ``((1 - a) F0 theta0 + a F1 theta1) / ((1 - a) F0 +
    a F1)`` with both Fishers given, ``(1 - a) theta0 + a theta1`` without them (and where both Fisher entries are
    0, where the reference writes NaN); a key only ``theta1`` has (the new head block) is copied, or multiplied by
    its Fisher with ``new_head="fisher_scaled"`` (the reference's Fisher branch)."""
    out: dict[str, torch.Tensor] = {}
    fisher = fisher0 is not None and fisher1 is not None
    for key, t1 in theta1.items():
        if key not in theta0:
            scaled = fisher1 is not None and fisher and new_head == "fisher_scaled"
            out[key] = fisher1[key] * t1 if scaled and fisher1 is not None else t1.clone()
            continue
        t0 = theta0[key]
        plain = (1 - alpha) * t0 + alpha * t1
        if fisher0 is None or fisher1 is None:
            out[key] = plain
            continue
        f0, f1 = fisher0[key], fisher1[key]
        den = (1 - alpha) * f0 + alpha * f1
        num = (1 - alpha) * (f0 * t0) + alpha * (f1 * t1)
        out[key] = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), plain)
    return out


@CARD.strategy
class CoFiMA(Strategy[CoFiMAConfig]):
    state_types = (CoFiMAHeads,)
    needs_vit = True
    fine_tunes_backbone = True

    @property
    def dtype(self) -> torch.dtype:
        """float32, or float64 where the ``float64`` setting asks (the ci profile; needs --precision fp32)."""
        return compute_dtype(self.cfg.float64, self.ctx.precision)

    def __init__(self, config: CoFiMAConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = self._tuned_copy()  # the run's one fine-tuned (and merged) ViT
        self.dim = int(ctx.backbone.num_features)
        self.head = CoFiMAHeads()  # the slow learner's head, continued by every task (the reference's recall)
        self.aligned = CoFiMAHeads()  # the merged and aligned head: evaluation's, and the next merge's theta0
        self.fisher: dict[str, torch.Tensor] = {}  # the last task's Fisher diagonal (the next merge's F0)
        self.class_mean = torch.zeros(0, self.dim, dtype=self.dtype)
        self.class_cov = torch.zeros(0, self.dim, self.dim, dtype=self.dtype)
        self.class_task: list[int] = []  # the task each class arrived in
        self._trainable: list[int] = []
        self.n_seen = 0

    def _tuned_copy(self) -> nn.Module:
        model = copy.deepcopy(self.ctx.backbone.model)
        for p in model.parameters():
            p.requires_grad_(True)
        return model.to(self.ctx.device, self.dtype).eval()

    # ---------------------------------------------------------------------------------------- features
    def _features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, d) pre-logits [CLS] feature of the tuned ViT, in the strategy's dtype."""
        model: Any = self.model  # a timm ViT: forward_features / forward_head (untyped)
        with self.ctx.autocast():
            x: torch.Tensor = model.forward_head(model.forward_features(images.to(self.dtype)), pre_logits=True)
        return x.to(self.dtype)

    @torch.no_grad()
    def _split_features(self, split: Split) -> torch.Tensor:
        self.model.eval()
        out = [
            self._features(x.to(self.ctx.device)).cpu()
            for x, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out) if out else torch.zeros(0, self.dim, dtype=self.dtype)

    def _weights(self, head: CoFiMAHeads) -> dict[str, torch.Tensor]:
        """The network's parameters by name, ``model.*`` (the tuned ViT) and ``head.*`` (``head``'s blocks)."""
        named = {f"model.{n}": p for n, p in self.model.named_parameters()}
        named.update({f"head.{n}": p for n, p in head.named_parameters()})
        return named

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        known = self.n_seen
        # theta0: the previous task's final model (the merged ViT, unchanged since, and its aligned head)
        theta0 = {k: v.detach().clone() for k, v in self._weights(self.aligned).items()} if task.id > 0 else {}
        block = self.head.add(self.dim, len(task.classes), ctx.generator(1000 + task.id), dev, self.dtype)
        self.n_seen = task.n_seen
        self.class_task.extend([task.id] * len(task.classes))

        # 1. slow learner: the whole ViT at lr * backbone_lr_scale, the new head block at lr
        tune = cfg.backbone_lr_scale > 0
        groups: list[dict[str, Any]] = [{"params": list(block.parameters()), "lr": cfg.lr}]
        if tune:
            groups.insert(0, {"params": list(self.model.parameters()), "lr": cfg.lr * cfg.backbone_lr_scale})
        optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        milestones = [cfg.milestone] if cfg.milestone > 0 else []
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=cfg.lr_decay)
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        log = EpochLog(ctx, f"CoFiMA task {task.id}", cfg.epochs, len(loader))
        self.model.train(tune)
        for epoch in log.epochs():
            for images, labels, _ in loader:
                images, labels = images.to(dev), labels.to(dev)
                with torch.set_grad_enabled(tune):
                    feats = self._features(images)
                loss = F.cross_entropy(block(feats), labels - known)  # logits[:, K:] against y - K
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
            schedule.step()
        self.model.eval()
        self.note_steps(cfg.epochs * len(loader))
        del optimizer, schedule  # its momentum (one ViT-sized set) is not needed by the Fisher pass

        # 2. the Fisher diagonal of this task's model (before the merge), 3. the merge with the previous model
        fisher = self._fisher(task) if cfg.fisher_weighting else None
        self.aligned = copy.deepcopy(self.head)  # the reference's fc.backup(): self.head stays the slow learner's
        for p in self.aligned.parameters():
            p.requires_grad_(True)
        if task.id > 0:
            theta1 = {k: v.detach() for k, v in self._weights(self.aligned).items()}
            merged = merge_weights(
                theta0,
                theta1,
                cfg.wt_lambda,
                self.fisher if fisher is not None else None,
                fisher,
                cfg.new_head_merge,
            )
            del theta0, theta1
            with torch.no_grad():
                for name, p in self._weights(self.aligned).items():
                    p.copy_(merged.pop(name))
        self.fisher = fisher if fisher is not None else {}

        # 4. class statistics through the merged ViT, and the alignment of the merged head
        self._add_statistics(task)
        if task.id > 0 and cfg.ca_epochs > 0:
            self._align(self.aligned, task, len(task.classes))

        vit = sum(p.numel() for p in self.model.parameters()) if tune else 0
        head_params = sum(p.numel() for p in block.parameters())
        aligned = self.n_seen * (self.dim + 1) if task.id > 0 and cfg.ca_epochs > 0 else 0
        self._trainable.append(vit + max(head_params, aligned))

    def _fisher(self, task: Task) -> dict[str, torch.Tensor]:
        """The Fisher diagonal of the tuned ViT and the whole slow-learner head on the task's augmented training
        images, in train mode (``getFisherDiagonal``); the ViT's entries are 0 where it does not train."""
        cfg, dev = self.cfg, self.ctx.device
        tune = cfg.backbone_lr_scale > 0
        params = self._weights(self.head)
        if not tune:
            params = {k: v for k, v in params.items() if k.startswith("head.")}
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=self.ctx.generator(3000 + task.id)
        )

        def logits_of(images: torch.Tensor) -> torch.Tensor:
            with torch.set_grad_enabled(tune):
                feats = self._features(images)
            return self.head(feats)

        self.model.train(tune)
        batches = ((x.to(dev), y.to(dev)) for x, y, _ in loader)
        fisher = fisher_diagonal(params, batches, logits_of, cfg.fisher_max)
        self.model.eval()
        if not tune:
            fisher = {**{f"model.{n}": torch.zeros_like(p) for n, p in self.model.named_parameters()}, **fisher}
        return fisher

    @torch.no_grad()
    def _add_statistics(self, task: Task) -> None:
        feats = self._split_features(task.train).double()
        labels = task.train.labels
        means, covs = [], []
        for c in sorted(task.classes):
            x = feats[labels == c]
            means.append(x.mean(dim=0))
            covs.append((torch.cov(x.T) + torch.eye(self.dim, dtype=torch.float64) * COV_RIDGE).to(self.dtype))
        self.class_mean = torch.cat([self.class_mean, torch.stack(means).to(self.dtype)])
        self.class_cov = torch.cat([self.class_cov, torch.stack(covs)])

    def _align(self, head: CoFiMAHeads, task: Task, task_size: int) -> None:
        cfg, dev = self.cfg, self.ctx.device
        optimizer = torch.optim.SGD(
            head.parameters(), lr=cfg.ca_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        schedule = cosine_lr(optimizer, cfg.ca_epochs, eta_min=0.0)
        class_task = alignment_tasks(self.class_task, task_size, cfg.ca_task_index)
        means = (self.class_mean.double() * shrink_factors(class_task, task.id)[:, None]).to(dev, self.dtype)
        factors = torch.linalg.cholesky(self.class_cov).to(dev)  # (C, d, d): float32 as MultivariateNormal
        gen, sizes = self.ctx.generator(5000 + task.id), head.sizes

        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = head(x)
            if cfg.logit_norm > 0:
                logits = normalised_logits(logits, sizes, cfg.logit_norm)
            return F.cross_entropy(logits, y)

        def log(epoch: int, loss: float) -> None:
            self.ctx.log(f"  CoFiMA task {task.id} alignment {epoch + 1}/{cfg.ca_epochs}: loss {loss:.4f}")

        where = f"task {task.id} alignment"
        align_on_gaussians(optimizer, schedule, cfg.ca_epochs, means, factors, cfg.ca_samples, gen, loss_of, where, log)

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "CoFiMA")
        feats = self._split_features(split).to(self.ctx.device)
        logits: torch.Tensor = self.aligned(feats)
        return logits[:, : self.n_seen].float().cpu()

    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """The merged ViT's features of ``split`` (the frozen ones are ``split.features``), float32."""
        return self._split_features(split).float()

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The tuned ViT as its named tensors (rebuilt on a copy of the run's backbone by :meth:`load_state_dict`),
        everything else (the Fisher diagonal included) as :meth:`Strategy.state_dict` keeps it."""
        state = super().state_dict()
        state["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        tensors = state.pop("model", None)
        super().load_state_dict(state)
        if tensors is not None:
            model = self._tuned_copy()
            model.load_state_dict(tensors)
            self.model = model

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        vit = sum(p.numel() for p in self.model.parameters())
        return counts(self.cfg, self.dim, vit, tuple(self.head.sizes), list(self._trainable))
