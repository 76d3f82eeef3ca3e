"""SLCA's slow learner and classifier alignment, and the fine-tuned ViT copy that SLCA, CoFiMA and DUCT keep.

SLCA (``baselines/slca.py``) and CoFiMA (``baselines/cofima.py``, SLCA's stage 1 and alignment with a weight merge
between them) share the per-task head blocks, the slow learner's training, the class Gaussians and the alignment on
draws from them: :class:`SlowLearner` holds them once. DUCT (``baselines/duct.py``) shares only the tuned copy of the
run's ViT and how a checkpoint keeps it (:func:`tuned_copy`,
:func:`vit_features`, :func:`with_vit`, :func:`without_vit`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from clbench.layers.alignment import align_on_gaussians
from clbench.layers.checks import check_protocol
from clbench.methods.contract import PER_SAMPLE, Split, Task
from clbench.methods.shared import EpochLog, Float64Setting, cosine_lr

COV_RIDGE = 1e-4  # torch.eye(d) * 1e-4 added to each class covariance (_compute_class_mean)


# ----------------------------------------------------------------------------------------------- the tuned ViT
def tuned_copy(model: nn.Module, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """A trainable deep copy of the run's ViT ``model`` on ``device`` in ``dtype``, in eval mode."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.to(device, dtype).eval()


def vit_features(
    model: nn.Module, images: torch.Tensor, dtype: torch.dtype, autocast: Callable[[], AbstractContextManager[Any]]
) -> torch.Tensor:
    """(B, d) pre-logits [CLS] feature of the timm ViT ``model`` (what the frozen backbone computes), in ``dtype``."""
    vit: Any = model  # a timm ViT: forward_features / forward_head (untyped)
    with autocast():
        x: torch.Tensor = vit.forward_head(vit.forward_features(images.to(dtype)), pre_logits=True)
    return x.to(dtype)


def with_vit(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """``state`` with the tuned ViT as its named tensors under ``"model"`` (a checkpoint keeps tensors, not the
    module; :func:`without_vit` takes them out again)."""
    state["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state


def without_vit(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """(``state`` less its ``"model"`` entry, that entry or None): the tensors to load into a fresh tuned copy."""
    state = dict(state)
    return state, state.pop("model", None)


# ----------------------------------------------------------------------------------------------- SLCA's pieces
class TaskHeads(nn.Module):
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
    """The task of each seen class as the alignment's mean shrinking reads it: where it arrived (``"exact"``), or
    the reference's ``c // task_size`` with the current task's size (``"reference"``; wrong for unequal tasks)."""
    if index == "reference":
        return [c // task_size for c in range(len(class_task))]
    return list(class_task)


class SlowLearner(Float64Setting):
    """What SLCA and CoFiMA share, mixed in before :class:`~clbench.methods.contract.Strategy`: the tuned ViT
    (``self.model``), its features, the slow learner's training of a task's new head block, the class Gaussians
    (``class_mean``, ``class_cov``, ``class_task``), the alignment of a head on draws from them, prediction with
    the aligned head (``self.aligned``), and checkpoints that keep the tuned ViT as tensors. The config has SLCA's
    fields (``lr``, ``backbone_lr_scale``, ``momentum``, ``weight_decay``, ``milestone``, ``lr_decay``, ``epochs``,
    ``batch_size``, ``eval_batch_size``, ``float64``, ``ca_*``, ``logit_norm``)."""

    title: ClassVar[str]  # the method's name in log lines and errors: "SLCA"
    cfg: Any
    ctx: Any
    model: nn.Module
    dim: int
    n_seen: int
    aligned: TaskHeads
    class_mean: torch.Tensor
    class_cov: torch.Tensor
    class_task: list[int]
    protocols: ClassVar[tuple[str, ...]]
    note_steps: Callable[[int], None]  # Strategy's, after this class in the method's bases

    def _tuned_copy(self) -> nn.Module:
        return tuned_copy(self.ctx.backbone.model, self.ctx.device, self.dtype)

    # ---------------------------------------------------------------------------------------- features
    def _features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, d) pre-logits [CLS] feature of the tuned ViT (what the frozen backbone computes, tuned), in the
        strategy's dtype (float32; float64 with ``float64``)."""
        return vit_features(self.model, images, self.dtype, self.ctx.autocast)

    @torch.no_grad()
    def _split_features(self, split: Split) -> torch.Tensor:
        self.model.eval()
        out = [
            self._features(x.to(self.ctx.device)).cpu()
            for x, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out) if out else torch.zeros(0, self.dim, dtype=self.dtype)

    # ---------------------------------------------------------------------------------------- learning
    def _train_slow_learner(self, task: Task, block: nn.Linear, known: int) -> None:
        """Stage 1: the whole ViT at lr * backbone_lr_scale (frozen at 0), the new head ``block`` at lr; SGD with
        MultiStepLR per epoch; cross-entropy on the block's logits against ``y - known``."""
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
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
        log = EpochLog(ctx, f"{self.title} task {task.id}", cfg.epochs, len(loader))
        self.model.train(tune)
        for epoch in log.epochs():
            for images, labels, _ in loader:
                images, labels = images.to(dev), labels.to(dev)
                with torch.set_grad_enabled(tune):  # bcb_no_grad: the frozen-backbone variant
                    feats = self._features(images)
                loss = F.cross_entropy(block(feats), labels - known)  # logits[:, K:] against y - K
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
            schedule.step()
        self.model.eval()
        self.note_steps(cfg.epochs * len(loader))

    def _trained_params(self, task: Task, block: nn.Linear) -> int:
        """Parameters trained in ``task``: the tuned ViT (where it trains) and the larger of the new block and the
        aligned head (every seen class's row, where the alignment runs)."""
        cfg = self.cfg
        vit = sum(p.numel() for p in self.model.parameters()) if cfg.backbone_lr_scale > 0 else 0
        head_params = sum(p.numel() for p in block.parameters())
        aligned = self.n_seen * (self.dim + 1) if task.id > 0 and cfg.ca_epochs > 0 else 0
        return vit + max(head_params, aligned)

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

    def _align(self, head: TaskHeads, task: Task, task_size: int) -> None:
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
            self.ctx.log(f"  {self.title} task {task.id} alignment {epoch + 1}/{cfg.ca_epochs}: loss {loss:.4f}")

        where = f"task {task.id} alignment"
        align_on_gaussians(optimizer, schedule, cfg.ca_epochs, means, factors, cfg.ca_samples, gen, loss_of, where, log)

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, self.title)
        feats = self._split_features(split).to(self.ctx.device)
        logits: torch.Tensor = self.aligned(feats)
        return logits[:, : self.n_seen].float().cpu()

    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """The tuned ViT's features of ``split`` (the frozen ones are ``split.features``), float32."""
        return self._split_features(split).float()

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The tuned ViT as its named tensors (rebuilt on a copy of the run's backbone by :meth:`load_state_dict`),
        everything else as :meth:`Strategy.state_dict` keeps it."""
        return with_vit(super().state_dict(), self.model)  # type: ignore[misc]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state, tensors = without_vit(state)
        super().load_state_dict(state)  # type: ignore[misc]
        if tensors is not None:
            model = self._tuned_copy()
            model.load_state_dict(tensors)
            self.model = model
