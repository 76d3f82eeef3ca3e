"""MOS: per-task adapters merged toward their predecessors, self-refined adapter retrieval, classifier alignment.

Paper: Sun et al., "MOS: Model Surgery for Pre-Trained Model-Based Class-Incremental Learning", AAAI 2025,
arXiv 2412.09441.
Reference implementation checked: LAMDA-PILOT ``models/mos.py``, ``backbone/vit_mos.py``, ``utils/inc_net.py``
(``MOSNet``, the AdaptFormer ``tuning_config``) and ``exps/mos.json`` (byte-identical to sun-hailong/AAAI25-MOS
``models/mos.py`` / ``backbone/vit_mos.py``; its ``exps/mos_cifar.json`` has the same values).

Algorithm, for task t with new classes C_t (tasks counted from 0):

1. One AdaptFormer adapter set (r = 16, beside every block's MLP, as in :mod:`baselines.ease`) is trained for
   every task; it starts where the previous task's set ended (never re-initialised). Loss = cross-entropy over
   the seen classes with old-class logits at -inf (a linear head over all classes) + 0.1 * the orthogonality
   term: M = [old class means; batch [CLS] features] (unnormalised), CE(M M^T / 0.8, identity).
   SGD momentum 0.9, lr 0.03 (adapters) / 0.003 (head), weight decay 5e-4, cosine over 20 epochs, batch 48.
2. Adapter merging (t >= 1): after every optimizer step, theta <- (1 - m) theta + m * mean(theta_0..theta_{t-1})
   with m = ``adapter_momentum`` 0.1 over the stored sets of the earlier tasks.
3. End of task: the set is stored (frozen) as set t; every new class gets the mean and covariance (+ 1e-4 I) of
   its training images' features under set t (eval transform) and a prototype row = its mean feature under
   set 0 (the prototype head, cosine, scale 1, never trained).
4. Classifier alignment (t >= 1): 30 epochs of SGD (lr 0.005, momentum 0.9, weight decay 5e-4, cosine) on the
   linear head only, with 5 * batch_size = 240 features per seen class drawn from N(mean_c, cov_c) per epoch,
   run as ``n_seen`` mini-batches of 240.
5. Inference (no task id), per image: the prototype head on the set-0 feature gives an initial class, hence an
   initial task i; self-refinement: classify the feature under set i with the linear head, map the predicted
   class to its task i'; stop when i' == i or after 4 rounds, else i <- i'. The output is
   softmax(linear logits under the final set) + softmax((t + 1) * prototype cosine logits).
   The ViT runs once per stored set (t + 1 passes per image after task t).

Protocols (``predict(split, protocol)``):

- ``per-sample`` (default): stored sets are frozen and nothing changes across predict calls: a row depends on
  its image alone.
- ``reference``: PILOT evaluates stored set s >= 1 through ``reweight_adapter``, which blends ALL layers of set s
  in place toward mean(sets 0..s-1) before EACH block of EACH forward (``backbone/vit_mos.py:360-377``), so a set
  drifts a little more with every test batch and an image's prediction depends on how many batches came
  before it. This protocol keeps its own copies of the stored sets, drifts them exactly so (batches of
  ``eval_batch_size`` = 48 in class order, as PILOT's unshuffled test loader), and carries the drift over to
  the next evaluation, as the reference does. Training and the per-sample protocol never see these copies.

Deviations from the paper / reference code (sound behaviour by default, the reference's behind a switch):

- ``reference_drift=False`` (default): merging happens once per optimizer step, the stored sets are frozen,
  class statistics come from the trained set t in eval mode, and prototypes from set 0 in eval mode.
  ``reference_drift=True`` reproduces PILOT's training side: (a) every training forward blends all layers of
  the current set in place before each block (12 extra merges per forward, via ``.data`` as the reference, on
  top of the per-step merge); (b) class statistics are computed through that drifting path, one class at a time
  in batches of 3 * batch_size (``_compute_mean``); (c) prototypes of tasks >= 1 are computed with adapter
  dropout active (the reference never switches back to eval after alignment). The per-task snapshot is taken
  before (b), as in the reference, and task t + 1 starts from the drifted set.
- The linear head grows when classes arrive (new rows: trunc-normal std 0.02, bias 0, timm's init of the
  reference's ``nb_classes`` head) instead of holding every class from the start; the reference slices logits to
  the seen classes, so logits and gradients are the same. Weight decay therefore only touches seen rows (the
  reference also shrinks the unseen, random rows).
- Feature sampling for alignment draws z ~ N(0, I) from a private generator and maps it through the float64
  Cholesky factor of each class covariance (the same distribution as ``MultivariateNormal``); adapter dropout
  also draws from a private generator.
- Set-0 features are computed once per image and used for both the prototype head and the first refinement round (the
  reference runs set 0 twice: ``forward_orig`` and ``t_id = 0``; set 0 never drifts, so the numbers are the same).
- Classes with fewer than 2 training images have no covariance: the run stops with a clear error (the
  reference would sample from NaN).
- DINOv2 blocks have LayerScale; the adapter output is added outside ``ls2`` (as in :mod:`baselines.ease`).
- The [CLS] feature is ``model.forward_head(norm(x), pre_logits=True)`` (the reference's ``norm(x)[:, 0]``).
- The backbone runs at the run's precision; heads, statistics and logits are float32.
- The reference's backbone is ViT-B/16 (IN-1k fine-tuned); clbench runs the benchmark's backbone (any width;
  the reference hard-codes 768). Transforms, normalisation, class order and task split are the harness's.
- Test accuracy is not computed during training (the reference logs it; nothing is selected on it).
- The CPU ``quick`` profile (not the default) runs at 112 px on the first 32 training images per class, with 2
  epochs instead of 20 and 10 alignment epochs instead of 30; see ``MOS.profiles``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.mos import CARD, MOSConfig, head_rows_updated
from clbench.core.costs import adapter_set_size
from clbench.layers.adapter_sets import AdapterSets
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.alignment import align_on_gaussians
from clbench.layers.checks import check_protocol
from clbench.layers.heads import LinearHead
from clbench.layers.prompts import orth_loss
from clbench.methods.contract import PER_SAMPLE, REFERENCE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import (
    EpochLog,
    class_means,
    cosine_logits,
    cosine_lr,
    masked_cross_entropy,
)


# ----------------------------------------------------------------------------------------------- merging
def merge_toward(
    target: AdapterSet, previous: Sequence[AdapterSet], momentum: float, in_place_data: bool = False
) -> None:
    """theta <- (1 - m) theta + m * mean(previous), parameter by parameter (PILOT ``reweight_adapter``).

    ``in_place_data`` assigns ``.data`` as the reference does inside a forward (the autograd graph then sees the
    new values); otherwise the parameters are updated under ``no_grad``."""
    if momentum == 0 or not previous:
        return
    with torch.no_grad():
        means = [torch.stack(ps).mean(dim=0) for ps in zip(*(list(s.parameters()) for s in previous), strict=True)]
        for p, mean in zip(target.parameters(), means, strict=True):
            if in_place_data:
                p.data = (1 - momentum) * p.data + momentum * mean
            else:
                p.mul_(1 - momentum).add_(mean, alpha=momentum)


class _DriftingLayer(nn.Module):
    """Layer ``i`` of an adapter set, used as PILOT's forward does: before block i, ALL layers of the set are
    blended toward ``mean(previous)`` in place, then layer i is applied."""

    def __init__(self, adapters: AdapterSet, i: int, blend: Callable[[], None]) -> None:
        super().__init__()
        self.adapters, self.i, self.blend = [adapters], i, blend  # a list: not registered as a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.blend()
        return self.adapters[0][self.i](x)


def drifting(adapters: AdapterSet, previous: Sequence[AdapterSet], momentum: float) -> list[nn.Module]:
    """The per-block modules of one reference forward through ``adapters`` (which drift toward ``previous``)."""

    def blend() -> None:
        merge_toward(adapters, previous, momentum, in_place_data=True)

    return [_DriftingLayer(adapters, i, blend) for i in range(len(adapters))]


def self_refine(
    feats: torch.Tensor, head: nn.Module, class_task: torch.Tensor, start_task: torch.Tensor, max_rounds: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """PILOT ``_eval_cnn`` self-refinement, per row: (B, T, d) features under every set, (B,) initial tasks ->
    (B, C) linear logits under the final set and (B,) the final task. A round classifies the feature under the
    current set, maps the class to its task, and stops when the task is unchanged or after ``max_rounds``."""
    rows = torch.arange(len(feats), device=feats.device)
    cur = start_task.clone()
    active = torch.ones(len(feats), dtype=torch.bool, device=feats.device)
    logits = torch.zeros(len(feats), len(class_task), device=feats.device)
    for round_ in range(1, max_rounds + 1):
        out = head(feats[rows, cur])  # (B, C)
        logits[active] = out[active]
        nxt = class_task[out.argmax(dim=1)]
        stop = (nxt == cur) | (round_ >= max_rounds)
        active = active & ~stop
        if not bool(active.any()):
            break
        cur = torch.where(active, nxt, cur)
    return logits, cur


def mos_output(refined: torch.Tensor, proto_logits: torch.Tensor, n_tasks: int, ensemble: bool) -> torch.Tensor:
    """softmax(refined linear logits) + softmax(n_tasks * prototype cosine logits) (PILOT's ensemble)."""
    if not ensemble:
        return refined
    return F.softmax(refined, dim=1) + F.softmax(proto_logits * n_tasks, dim=1)


@CARD.strategy
class MOS(AdapterSets, Strategy):
    title = "MOS"
    # scenarios: class only: its adapters, their merging and the self-refined retrieval are built around
    # per-task class prototypes of new classes; what a later domain of the same classes should do there is undefined
    state_types = (AdapterSet, Adapter, LinearHead)
    protocols = (PER_SAMPLE, REFERENCE)
    needs_vit = True

    def __init__(self, config: MOSConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self._start_adapter_sets()  # model, dim, n_blocks, current, stored
        self.reference_sets = nn.ModuleList()  # the 'reference' protocol's drifting copies of ``stored``
        self.head = LinearHead(self.dim).to(ctx.device)  # backbone.head: Linear(d, classes)
        self.prototypes = torch.zeros(0, self.dim)  # (C, d) MOSNet.fc rows: class means under set 0
        self.class_mean = torch.zeros(0, self.dim)  # (C, d) under the class's own set
        self.class_cov: list[torch.Tensor] = []  # per class (d, d) or (d,) variance
        self.class_task: list[int] = []
        self._added: list[int] = []
        self._trainable: list[int] = []
        self._last_predict: tuple[int, np.ndarray, np.ndarray] | None = None  # (n, argmax, final task)

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        t, cfg = len(self.stored), self.cfg
        self._check_new_classes(task)
        self.head.grow(task.n_seen, self.ctx.generator(1000 + t))
        self.class_task.extend([t] * len(task.classes))

        # 1-2. train the current set and the head, merging toward the earlier sets after every step
        self._train_adapters(task)
        # 3. snapshot (frozen), class statistics, prototypes
        snapshot = self._store_current()
        self.reference_sets.append(copy.deepcopy(snapshot))
        self._class_statistics(task)
        # 4. classifier alignment on sampled features
        if t >= 1 and cfg.ca_epochs > 0:
            self._align_classifier(task)
        self._prototypes(task)

        # accounting from what was built (the formula is checked against these numbers by the tests)
        adapters = sum(p.numel() for p in snapshot.parameters())
        stats = len(task.classes) * self.dim + sum(c.numel() for c in self.class_cov[-len(task.classes) :])
        rows = len(task.classes) * (self.dim + 1)
        self._added.append(adapters + rows + len(task.classes) * self.dim + stats)
        self._trainable.append(adapters + head_rows_updated(cfg, t, len(task.classes), task.n_seen, self.dim))

    def _train_adapters(self, task: Task) -> None:
        cfg, ctx, dev, _t = self.cfg, self.ctx, self.ctx.device, len(self.stored)
        groups = [
            {"params": list(self.current.parameters()), "lr": cfg.lr, "weight_decay": cfg.weight_decay},
            {
                "params": [self.head.weight, self.head.bias],
                "lr": cfg.lr * cfg.head_lr_scale,
                "weight_decay": cfg.weight_decay,
            },
        ]
        optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
        schedule = cosine_lr(optimizer, cfg.epochs, eta_min=cfg.min_lr)
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        old_means = self.class_mean.to(dev)  # (K, d) means of every earlier class
        previous = list(self.stored)
        layers = drifting(self.current, previous, cfg.adapter_momentum) if cfg.reference_drift else list(self.current)
        self._set_dropout(self.current, 3000 + task.id)
        log = EpochLog(ctx, f"MOS task {task.id}", cfg.epochs, len(loader))
        self.current.train()
        self.current.requires_grad_(True)
        for epoch in log.epochs():
            for images, labels, _ in loader:
                images, labels = images.to(dev), labels.to(dev)
                feats = self._features(images, layers)  # (B, d)
                logits = self.head(feats)  # (B, n_seen)
                loss = masked_cross_entropy(logits, labels, task.classes)
                loss = loss + cfg.reg * orth_loss(feats, old_means, cfg.orth_temperature)
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
                merge_toward(self.current, previous, cfg.adapter_momentum)  # adapter_merge() after the step
            schedule.step()
        self.note_steps(cfg.epochs * len(loader))  # the adapters' steps; head-only alignment steps are not counted
        self.current.eval()
        self._set_dropout(self.current, None)

    @torch.no_grad()
    def _class_statistics(self, task: Task) -> None:
        cfg, t = self.cfg, len(self.stored) - 1
        means, covs = [], []
        for c in sorted(task.classes):
            part = task.train.subset(torch.nonzero(task.train.labels == c).flatten())
            if cfg.reference_drift:  # _compute_mean: one class at a time through the drifting current set
                layers = drifting(self.current, list(self.stored)[:t], cfg.adapter_momentum)
                feats = self._split_features(part, layers, 3 * cfg.batch_size)
            else:
                feats = self._split_features(part, self.stored[t], cfg.eval_batch_size)
            cov = torch.cov(feats.double().T) + cfg.cov_eps * torch.eye(self.dim, dtype=torch.float64)
            means.append(feats.mean(dim=0))
            covs.append(cov.float() if cfg.ca_storage == "covariance" else torch.diagonal(cov).float().clone())
        self.class_mean = torch.cat([self.class_mean, torch.stack(means)])
        self.class_cov.extend(covs)

    def _align_classifier(self, task: Task) -> None:
        cfg, dev = self.cfg, self.ctx.device
        params = [self.head.weight, self.head.bias]
        optimizer = torch.optim.SGD(params, lr=cfg.ca_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        schedule = cosine_lr(optimizer, cfg.ca_epochs, eta_min=0.0)
        factors = []
        for cov in self.class_cov:  # sampling N(mean, cov) = mean + z L^T
            if cov.dim() == 1:
                factors.append(cov.double().sqrt().diag())
            else:
                factors.append(torch.linalg.cholesky(cov.double()))
        factors_t = torch.stack(factors).float().to(dev)  # (C, d, d)
        per_class = cfg.batch_size * cfg.ca_samples_scale

        def log(epoch: int, loss: float) -> None:
            self.ctx.log(f"  MOS task {task.id} alignment {epoch + 1}/{cfg.ca_epochs}: loss {loss:.4f}")

        means, gen = self.class_mean.to(dev), self.ctx.generator(5000 + task.id)
        loss_of = lambda x, y: F.cross_entropy(self.head(x), y)  # noqa: E731
        where = f"task {task.id} alignment"
        align_on_gaussians(optimizer, schedule, cfg.ca_epochs, means, factors_t, per_class, gen, loss_of, where, log)

    @torch.no_grad()
    def _prototypes(self, task: Task) -> None:
        """Prototype rows of the new classes: mean set-0 feature (PILOT ``replace_fc`` via ``forward_orig``)."""
        set0 = self.stored[0]
        leak = self.cfg.reference_drift and len(self.stored) > 1  # dropout active after alignment (reference)
        if leak:
            set0.train()
            self._set_dropout(set0, 6000 + task.id)
        feats = self._split_features(task.train, set0, self.cfg.eval_batch_size)
        set0.eval()
        self._set_dropout(set0, None)
        self.prototypes = torch.cat([self.prototypes, class_means(feats, task.train.labels, sorted(task.classes))])

    # ---------------------------------------------------------------------------------------- prediction
    def outputs_from_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, d) features under every stored set -> (B, C) outputs and (B,) the final task of each row."""
        dev = feats.device
        class_task = torch.as_tensor(self.class_task, device=dev)
        proto_logits = cosine_logits(feats[:, 0], self.prototypes.to(dev))  # forward_orig: sigma 1
        start = class_task[proto_logits.argmax(dim=1)]
        refined, final = self_refine(feats, self.head, class_task, start, self.cfg.max_refine)
        return mos_output(refined, proto_logits, len(self.stored), self.cfg.ensemble), final

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "MOS")
        out, finals = [], []
        for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False):
            images = images.to(self.ctx.device)
            if protocol == REFERENCE:  # set s >= 1 drifts toward mean(sets 0..s-1) in every block of every forward
                sets, stored = list(self.reference_sets), list(self.stored)  # the mean: PILOT's prefix sums
                feats = torch.stack(
                    [
                        self._features(images, drifting(sets[s], stored[:s], self.cfg.adapter_momentum))
                        for s in range(len(sets))
                    ],
                    dim=1,
                )  # set 0: no earlier sets, no drift
            else:
                feats = torch.stack([self._features(images, s) for s in self.stored], dim=1)  # (B, T, d)
            logits, final = self.outputs_from_features(feats)
            out.append(logits.cpu())
            finals.append(final.cpu())
        logits = torch.cat(out)
        if protocol == PER_SAMPLE:
            self._last_predict = (len(split), logits.argmax(dim=1).numpy(), torch.cat(finals).numpy())
        return logits

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """Each image's [CLS] under the adapter set self-refinement settles on (per-sample): what the linear head
        scores (the prototype half of the ensemble compares set 0's feature)."""
        out = []
        for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False):
            feats = torch.stack([self._features(images.to(self.ctx.device), s) for s in self.stored], dim=1)
            _, final = self.outputs_from_features(feats)
            out.append(feats[torch.arange(len(feats), device=feats.device), final].float().cpu())
        return torch.cat(out)

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """Inference passes, and the accuracy of the initial task (prototype head) and of the adapter set chosen by
        self-refinement (per-sample protocol). No timings: a diagnostic must be the same in a resumed run."""
        out: dict[str, Any] = {"adapter_sets": len(self.stored), "backbone_passes_per_image": len(self.stored)}
        if self._last_predict is not None and self._last_predict[0] == len(split):
            true_task = np.asarray(true_task)
            out["task_id_accuracy"] = float(
                (np.asarray(self.class_task)[self._last_predict[1]] == true_task).mean() * 100
            )
            out["refined_set_accuracy"] = float((self._last_predict[2] == true_task).mean() * 100)
        with torch.no_grad():  # how far the reference protocol's copies have drifted from the stored sets
            drift = [
                float(sum((a - b).norm() ** 2 for a, b in zip(r.parameters(), s.parameters(), strict=True)) ** 0.5)
                for r, s in zip(self.reference_sets, self.stored, strict=True)
            ]
        out["reference_set_drift_l2"] = drift
        return out

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        n = len(self.stored)
        extra = {
            "adapter_params_per_task": adapter_set_size(self.n_blocks, self.dim, self.cfg.bottleneck),
            "adapter_sets": n,
            "prototype_params": self.prototypes.numel(),
            "class_statistics_params": self.class_mean.numel() + sum(c.numel() for c in self.class_cov),
            "backbone_passes_per_test_image_per_task": list(range(1, n + 1)),
        }
        sizes = [self.class_task.count(t) for t in range(n)]
        added, stored = CARD.split_kept(self._added, 0, extra, sizes)
        return ParamCounts(
            added_per_task=added,
            stored_per_task=stored,
            trainable_per_task=list(self._trainable),
            head=self.head.weight.numel() + self.head.bias.numel(),
            extra=extra,
        )
