"""One adapter set per task, stored frozen after its task: what MOS (``baselines/mos.py``) and TUNA
(``baselines/tuna.py``) share around it. :class:`AdapterSets`, mixed in before
:class:`~clbench.methods.contract.Strategy`: the frozen ViT and the set being trained, the [CLS] feature under a
set, the check of a task's new classes (arrival order, 2 images each for a class covariance), the dropout
generator of a set while it trains, and the frozen snapshot kept after a task."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from clbench.errors import ClbenchError
from clbench.layers.adapters import AdapterSet
from clbench.methods.contract import Split, Task
from clbench.methods.shared import check_vit_blocks, vit_forward_tokens, vit_tokens


class AdapterSets:
    title: ClassVar[str]  # the method's name in messages: "MOS"
    cfg: Any
    ctx: Any
    class_task: list[int]

    def _start_adapter_sets(self) -> None:
        """The run's frozen ViT (``model``, refused unless a timm ViT), its width ``dim`` and depth ``n_blocks``,
        the set being trained (``current``, from generator salt 1) and the stored ones (``stored``)."""
        ctx = self.ctx
        self.model: Any = ctx.backbone.model  # a timm ViT: forward_head (untyped)
        check_vit_blocks(self.model)
        self.dim = ctx.backbone.num_features
        self.n_blocks = len(self.model.blocks)
        self.current = AdapterSet(self.n_blocks, self.dim, self.cfg, ctx.generator(1)).to(ctx.device)
        self.stored = nn.ModuleList()  # set t: a frozen snapshot of ``current`` after task t

    # ---------------------------------------------------------------------------------------- features
    def _features(self, images: torch.Tensor, layers: Sequence[nn.Module]) -> torch.Tensor:
        """(B, d) float32 [CLS] feature of the ViT with one adapter module per block."""
        with self.ctx.autocast():
            x = vit_forward_tokens(self.model, vit_tokens(self.model, images), layers)
            return self.model.forward_head(x, pre_logits=True).float()

    @torch.no_grad()
    def _split_features(self, split: Split, adapters: Sequence[nn.Module], batch: int | None = None) -> torch.Tensor:
        """(N, d) features of ``split`` under ``adapters``, in batches of ``batch`` (the eval batch where None)."""
        out = [
            self._features(images.to(self.ctx.device), adapters).cpu()
            for images, _, _ in split.image_loader(batch or self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out)

    def _set_dropout(self, adapters: AdapterSet, salt: int | None) -> None:
        """``adapters``' dropout draws from a generator seeded from ``ctx.generator(salt)``; None: the global one."""
        if salt is None:
            adapters.set_dropout_generator(None)
            return
        seed = int(torch.randint(0, 2**62, (1,), generator=self.ctx.generator(salt)))
        adapters.set_dropout_generator(torch.Generator(device=self.ctx.device).manual_seed(seed))

    # ---------------------------------------------------------------------------------------- learning
    def _check_new_classes(self, task: Task) -> None:
        """Refuse a task whose classes are not the next arrival-order labels, or with a class of < 2 images."""
        if sorted(task.classes) != list(range(len(self.class_task), task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")
        counts = torch.bincount(task.train.labels, minlength=task.n_seen)[task.classes]
        if int(counts.min()) < 2:
            raise ClbenchError(
                f"task {task.id}: {self.title} needs >= 2 training images per class for the class covariance "
                f"(class {task.classes[int(counts.argmin())]} has {int(counts.min())})",
                "use more training images per class",
            )

    def _store_current(self) -> AdapterSet:
        """Append a frozen, eval-mode copy of ``current`` (no dropout generator) to ``stored``; returns it."""
        snapshot = copy.deepcopy(self.current).requires_grad_(False).eval()
        snapshot.set_dropout_generator(None)
        self.stored.append(snapshot)
        return snapshot
