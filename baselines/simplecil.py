"""SimpleCIL: prototype classifier on a frozen pre-trained model.

Paper: Zhou et al., "Revisiting Class-Incremental Learning with Pre-Trained Models: Generalizability and
Adaptivity are All You Need", arXiv 2303.07338 (IJCV 2024).
Reference implementation checked: LAMDA-PILOT ``models/simplecil.py`` (``replace_fc``) with
``backbone/linears.py`` ``CosineLinear``.

Algorithm: no training. For each new class c, the head row w_c is the mean of the raw (unnormalised)
frozen [CLS] features of c's training images under the test transform; prediction is
argmax_c sigma * cos(f, w_c) with sigma = 1 (PILOT's learnable scale is never trained here, so it stays 1).

Deviations from the paper / reference code:
- Features come from clbench's feature cache (computed once per image); PILOT recomputes them each task.
  Same numbers, fewer forward passes.
- The reference runs ViT-B/16 IN-1k; clbench runs whatever backbone the benchmark names (the embedded
  benchmark uses the offline DINOv2 ViT-S/14). The backbone is recorded in every result.
"""

from __future__ import annotations

import torch

from baselines.cards.simplecil import CARD, SimpleCILConfig
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import CosineHead, class_means


@CARD.strategy
class SimpleCIL(Strategy):
    # domain scenario: a class's prototype is its mean over every domain seen so far (a running mean)
    scenarios = ("class", "domain")

    def __init__(self, config: SimpleCILConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.head = CosineHead(ctx.backbone.num_features, learn_sigma=False)
        self._added: list[int] = []
        self._counts = torch.zeros(0)  # training images behind each class's prototype so far

    def learn_task(self, task: Task) -> None:
        old = self.head.n_classes
        self.head.grow(task.n_seen)
        counts = torch.cat([self._counts, torch.zeros(task.n_seen - len(self._counts))])
        prototypes = class_means(task.train.features, task.train.labels, task.classes)  # (C_t, d)
        n = torch.stack([(task.train.labels == c).sum() for c in task.classes]).float()
        before = counts[task.classes]  # 0 for a new class; a class seen in an earlier domain keeps its images' share
        w = (before / (before + n))[:, None]
        rows = w * self.head.weight.detach()[task.classes] + (1 - w) * prototypes
        self.head.set_rows(task.classes, rows)
        counts[task.classes] = before + n
        self._counts = counts
        self._added.append((task.n_seen - old) * prototypes.shape[1])  # rows this task added

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        return self.head(split.features)  # (N, n_seen); each row uses only its own feature

    def param_counts(self) -> ParamCounts:
        return ParamCounts(
            added_per_task=[0] * len(self._added),
            stored_per_task=list(self._added),
            trainable_per_task=[0] * len(self._added),
            head=self.head.weight.numel(),
        )
