"""DUCT: dual consolidation, the ViT merged across tasks by task arithmetic and the classifier transported onto old
classes by optimal transport.

Paper: Zhou, Cai, Ye, Zhang, Zhan, "Dual Consolidation for Pre-Trained Model-Based Domain-Incremental Learning",
CVPR 2025, arXiv 2410.00911. Reference implementations read: LAMDA-PILOT @
``5240714d3d6071aca824f8aed4a92a46ac6f883c`` (``models/duct.py``, whose header says it adapts the method to
class-incremental learning; ``models/base.py`` ``_compute_class_mean``; ``utils/inc_net.py`` ``SimpleVitNet``;
``backbone/linears.py`` ``CosineLinear``; ``utils/toolkit.py`` ``state_dict_to_vector``; ``exps/duct.json``) and the
authors' ``Estrella-fugaz/CVPR25-DUCT`` @ ``ecfb579f418b555b029a6ae11e74e5dd47ee6b59`` (``methods/duct.py``,
``methods/base.py``, ``models/vit_inc.py`` ``IncViTCosine``, ``configs/Template_*_duct.json``). clbench follows
PILOT's algorithm; where the two differ, a setting gives the authors' choice.

Like SLCA (:attr:`clbench.methods.contract.Strategy.fine_tunes_backbone`), the strategy keeps its own ViT: the merged
one. While a task trains it holds a second, the copy being fine-tuned from the pre-trained weights, dropped after the
merge; the run's frozen ViT stays bit-identical.

Algorithm, for each task t with classes C_t (the class scenario: new classes; the domain scenario: the classes of
domain t, every one already known after the first domain):

1. Head rows: the cosine head (``CosineLinear``: sigma * cos(f, w), one learnable sigma) gets one row per class of
   C_t, a block of its own, also in the domain scenario (the authors' domain-incremental code gives every domain its
   own copy of the label space, ``init_cls = increment`` = the class count).
2. Fine-tuning: a fresh copy of the *pre-trained* ViT (every task starts from it, ``load_state_dict(
   model_init_state)``) and the head, SGD (momentum 0.9, weight decay 5e-4) with the ViT at ``lr *
   backbone_lr_scale`` = 1e-3 and the whole head (every row and sigma) at ``lr`` = 0.1, ``ConstantLR`` with torch's
   defaults (the first 5 epochs at a third of the rate), 10 epochs of batch 128 on augmented images; loss:
   cross-entropy on the task's block of logits.
3. Representation consolidation: the task vector tau_t = (tuned - pre-trained) is added to the merged ViT scaled by
   ``merge_scalar`` (0.25) and by the mean, over C_t, of the cosine between each class's mean pre-trained feature
   and its mean feature through the tuned ViT (``_calculate_adjust_ratio``; the paper's Sim_{0,t}): merged = pre-trained
   + sum_t 0.25 Sim_t tau_t.
4. Classifier retraining: 5 epochs of the same SGD on the head only, features from the merged ViT, the
   task's block of logits.
5. Classifier transport (t >= 1): per earlier task o, the cost between C_t and C_o is the Euclidean distance of their
   pre-trained class means (the means of the frozen features, kept per row); ``ot.sinkhorn`` (the POT package) with
   uniform marginals and ``ot_reg`` = 0.02 gives the plan T (|C_t| x |C_o|) (log-domain by default, see below); the
   old block becomes
   (1 - 0.25) W_o + 0.25 T^T W_t.

Prediction: sigma * cos(f, w) of the merged ViT's [CLS] feature against every row; where several rows name one class
(the domain scenario), the class's logit is their maximum, which gives the reference's ``argmax % class_num``.

Protocols: ``per-sample`` only (nothing depends on the test batch).

Deviations from the reference code, and its flaws:

- PILOT @ 5240714 does not run as committed: ``BaseLearner._compute_class_mean`` is defined inside
  ``_construct_exemplar_unified`` (its indentation), and it stores a covariance ``class_cov`` it no longer computes.
  clbench takes the class means as the authors' ``methods/base.py`` computes them: the plain mean of the pre-trained
  [CLS] features of the task's training images at the eval transform, which are the harness's cached frozen features.
- The retraining's learning rate: the reference sets ``lr_re`` = 1e-3 as the optimizer's default, but the head's
  parameter group carries ``lr = lrate`` (0.1), which wins; the retraining runs at 0.1. ``retrain_lr`` = 0.1 (default)
  does what the reference does; ``--set retrain_lr=0.001`` what its configuration says.
- New head rows: PILOT's ``update_fc`` appends rows of zeros for every task after the first. ``F.normalize``'s gradient
  at a zero row is 1/eps (1e12): the first step throws the row to a norm near 1e10, where later gradients (which scale
  as 1/|w|) no longer move it, so a task's rows are its first batch's gradient. The authors' ``IncViTCosine`` draws
  them U(-1/sqrt(d), 1/sqrt(d)) as a new ``CosineLinear`` does; ``head_init="uniform"`` (default) does that,
  ``"zeros"`` reproduces PILOT. sigma carries over from task to task as in PILOT (the authors' code starts each task
  with a new head whose sigma is 1; sigma scales every logit alike, so it changes training, never an argmax).
- Reference flaw: the plain Sinkhorn iterations (``ot.sinkhorn``'s default method, the reference's) compute
  exp(-cost / reg), which underflows to 0 for class means more than about 700 * ``ot_reg`` apart (14 at 0.02: ViT
  features' class means are often that far apart); POT then stops at iteration 0 and returns a plan of zeros (or of
  1e-66-sized entries), and the "transport" merely shrinks the old rows, which a cosine head ignores.
  ``ot_method="sinkhorn_log"`` (default) runs the same iterations in the log domain and reaches the entropic plan;
  ``"sinkhorn"`` reproduces the reference. Where the plain iterations do not underflow both give the same plan. Each
  transport logs the plan's mass (1 when solved).
- ``similarity_weight`` (default True, PILOT and the paper) weights each task vector by Sim_t; the authors' code adds
  ``merge_scalar * tau_t`` unweighted (False). The tuned class means of Sim_t are taken on augmented images, as PILOT's
  ``_cal_means_cur`` reads the training set in ``mode='train'``; their augmentation is drawn from a private generator.
- Task ranges: the reference finds a task's rows as ``[t * increment, (t + 1) * increment)``, wrong where the first
  task has another size than the later ones (clbench's ``ci`` shape is equal; B0-style splits with a larger base are
  not); clbench keeps each task's rows. On equal tasks they agree. The transport's marginals are uniform over each
  block (1/|C_t|, 1/|C_o|), the reference's 1/increment where the blocks are equal; its float32 marginals are float64
  here (the cost and plan are float64 in both).
- The schedule is ``LambdaLR`` giving ``warmup_factor`` for the first ``warmup_epochs`` epochs (torch's ``ConstantLR``
  multiplies by 3 at epoch 5, a rounding away from the same rates).
- The reference evaluates the network after each stage for its log; clbench does not (no effect on training). The
  retraining's forward passes through the merged ViT run without gradient (the reference builds the graph and
  discards the ViT's gradients: the same numbers).
- The literature profiles (``domainnet``, ``office-home``, ``cddb``, ``core50``) carry the authors' per-benchmark
  settings; the domain order is the clbench preset's (Office-Home alphabetical: Art, Clipart, Product, Real World; the
  authors' configuration: Product, Clipart, Real World, Art).
- The paper's cost is the squared distance ``||c_i - c_j||^2``; both codes use ``torch.cdist(p=2)``, as clbench.
- The ViT is the benchmark's backbone (the reference: ViT-B/16 IN-1k in PILOT, IN-21k in the authors' code); its
  feature is the backbone's pre-logits [CLS] feature as the frozen backbone computes it. Transforms, class order and
  task split are the harness's, shared by every method.
- The ``ci`` profile (the regression gate, not the default) runs 56 px, 8 images per class, 4 epochs of batch 16
  without warm-up and 2 retraining epochs, in float64 (``float64``: the copies, head and means), so that its numbers
  do not depend on the CPU's kernels; see ``baselines/cards/duct.py``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.duct import CARD, DUCTConfig, counts
from clbench.errors import ClbenchError
from clbench.layers.checks import check_protocol
from clbench.layers.slow_learner import tuned_copy, vit_features, with_vit, without_vit
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import CosineHead, EpochLog, Float64Setting


def new_rows(n: int, d: int, init: str, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """(n, d) new head rows: ``CosineLinear.reset_parameters``' U(-1/sqrt(d), 1/sqrt(d)), or zeros."""
    if init == "zeros":
        return torch.zeros(n, d, dtype=dtype)
    bound = 1.0 / math.sqrt(d)
    return (torch.rand(n, d, generator=generator, dtype=torch.float64) * 2 - 1).mul(bound).to(dtype)


def similarity_weight(pretrained_means: torch.Tensor, tuned_means: torch.Tensor) -> float:
    """Sim_t: the mean over classes of cos(pre-trained class mean, tuned class mean) (``_calculate_adjust_ratio``)."""
    sims = F.cosine_similarity(pretrained_means.double(), tuned_means.double(), dim=1)
    return float(sims.mean())


@torch.no_grad()
def merge_task_vector(merged: nn.Module, tuned: nn.Module, pretrained: nn.Module, scale: float) -> None:
    """merged += scale * (tuned - pretrained), every floating tensor of the state (``_stage1_merge_backbone``)."""
    tuned_state, pre_state = tuned.state_dict(), pretrained.state_dict()
    for name, value in merged.state_dict().items():
        if value.is_floating_point():
            delta = tuned_state[name].to(value.dtype) - pre_state[name].to(value.dtype)
            value.add_(delta * scale)


def transport_plan(cur_means: torch.Tensor, old_means: torch.Tensor, reg: float, method: str) -> torch.Tensor:
    """The entropic optimal-transport plan (|C_t|, |C_o|) between the current and an old task's classes: cost the
    Euclidean distance of their pre-trained class means, uniform marginals, ``ot.sinkhorn`` (POT) in float64 with
    ``method`` ("sinkhorn": the reference's; "sinkhorn_log": the same plan without its underflow)."""
    import ot

    cost = torch.cdist(cur_means.double(), old_means.double(), p=2)
    a = torch.full((cost.shape[0],), 1.0 / cost.shape[0], dtype=torch.float64)
    b = torch.full((cost.shape[1],), 1.0 / cost.shape[1], dtype=torch.float64)
    with warnings.catch_warnings():  # "did not converge", "numerical errors": the plan it stopped at, as the reference
        warnings.simplefilter("ignore", UserWarning)
        plan: torch.Tensor = ot.sinkhorn(a, b, cost, reg, method=method)
    if not bool(torch.isfinite(plan).all()):
        raise ClbenchError(
            f"DUCT's classifier transport: ot.sinkhorn ({method}) gave a non-finite plan at ot_reg {reg}",
            "raise the regularisation, e.g. --set ot_reg=0.1",
        )
    return plan


def transported_block(old_w: torch.Tensor, cur_w: torch.Tensor, plan: torch.Tensor, ratio: float) -> torch.Tensor:
    """(1 - ratio) W_o + ratio T^T W_t (``_stage2_transport_classifier``), in ``old_w``'s dtype."""
    moved = (plan.T @ cur_w.double()).to(old_w.dtype)
    return (1 - ratio) * old_w + ratio * moved


def train_stage(
    cfg: DUCTConfig,
    head: nn.Module,
    vit_params: list[nn.Parameter] | None,
    epochs: int,
    block: tuple[int, int],
    batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    n_batches: int,
    features: Callable[[torch.Tensor], torch.Tensor],
    log: EpochLog,
    where: str,
) -> int:
    """One stage of ``Learner._train``: SGD (momentum, weight decay on every group) over ``epochs`` of ``batches()``
    (inputs, targets within the block), cross-entropy on the logits of rows ``block``. ``vit_params`` given: the
    fine-tuning stage, the ViT at ``lr * backbone_lr_scale`` and the whole head at ``lr``; None: the retraining, the
    head alone at ``retrain_lr``. The rate is ``warmup_factor`` times that for the first ``warmup_epochs`` epochs
    (``ConstantLR``, stepped per epoch). Returns the steps taken."""
    head_lr = cfg.lr if vit_params is not None else cfg.retrain_lr
    groups: list[dict[str, Any]] = [{"params": list(head.parameters()), "lr": head_lr}]
    if vit_params is not None:
        groups.insert(0, {"params": vit_params, "lr": cfg.lr * cfg.backbone_lr_scale})
    optimizer = torch.optim.SGD(groups, lr=head_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    warm, factor = cfg.warmup_epochs, cfg.warmup_factor
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: factor if e < warm else 1.0)
    start, end = block
    for epoch in log.epochs():
        for inputs, target in batches():
            loss = F.cross_entropy(head(features(inputs))[:, start:end], target)
            log.step(optimizer, loss, len(target), f"{where} epoch {epoch}")
        schedule.step()
    return epochs * n_batches


@CARD.strategy
class DUCT(Float64Setting, Strategy[DUCTConfig]):
    needs_vit = True
    fine_tunes_backbone = True
    # domain scenario: the authors' setting; every domain gets its own block of rows over the classes it brings, the
    # ViT merges every domain's task vector, and the transport calibrates old domains' rows
    scenarios = ("class", "domain")

    def __init__(self, config: DUCTConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.dim = int(ctx.backbone.num_features)
        self.model = self._copy_of_pretrained()  # the merged ViT: pre-trained + sum of weighted task vectors
        self.model.requires_grad_(False)
        self.head = CosineHead(self.dim).to(ctx.device, self.dtype)
        self.row_class: list[int] = []  # the class of each head row
        self.blocks: list[list[int]] = []  # [start, end) of each task's rows
        self.row_means = torch.zeros(0, self.dim, dtype=torch.float64)  # each row's pre-trained class mean
        self.task_weights: list[float] = []  # Sim_t of each task vector
        self._trainable: list[int] = []
        self.n_seen = 0

    def _copy_of_pretrained(self) -> nn.Module:
        return tuned_copy(self.ctx.backbone.model, self.ctx.device, self.dtype)

    # ---------------------------------------------------------------------------------------- features
    def _features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """(B, d) pre-logits [CLS] feature of ``model`` in the strategy's dtype."""
        return vit_features(model, images, self.dtype, self.ctx.autocast)

    @torch.no_grad()
    def _split_features(self, model: nn.Module, split: Split, augment: bool = False, salt: int = 0) -> torch.Tensor:
        model.eval()
        gen = self.ctx.generator(salt) if augment else None
        out = [
            self._features(model, x.to(self.ctx.device)).cpu()
            for x, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=augment, generator=gen)
        ]
        return torch.cat(out) if out else torch.zeros(0, self.dim, dtype=self.dtype)

    # ---------------------------------------------------------------------------------------- learning
    def _train(self, task: Task, model: nn.Module, tune_vit: bool, epochs: int, start: int, end: int, salt: int) -> int:
        """``epochs`` of SGD on the block [start, end) of logits: the ViT ``model`` and the head (``tune_vit``), or
        the head alone on ``model``'s features. Returns the steps taken."""
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        local = {c: i for i, c in enumerate(self.row_class[start:end])}
        loader = task.train.image_loader(cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(salt))

        def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for images, labels, _ in loader:
                yield images.to(dev), torch.tensor([local[int(y)] for y in labels], device=dev)

        def features(images: torch.Tensor) -> torch.Tensor:
            if tune_vit:
                return self._features(model, images)
            with torch.no_grad():
                return self._features(model, images)

        stage = "fine-tuning" if tune_vit else "retraining"
        model.train(tune_vit)
        steps = train_stage(
            cfg,
            self.head,
            list(model.parameters()) if tune_vit else None,
            epochs,
            (start, end),
            batches,
            len(loader),
            features,
            EpochLog(ctx, f"DUCT task {task.id} {stage}", epochs, len(loader)),
            f"task {task.id} {stage}",
        )
        model.eval()
        return steps

    def learn_task(self, task: Task) -> None:
        cfg, ctx = self.cfg, self.ctx
        classes = sorted(task.classes)
        start = len(self.row_class)
        end = start + len(classes)
        # 1. the task's block of rows, and its classes' pre-trained means (the cached frozen features)
        rows = new_rows(len(classes), self.dim, cfg.head_init, ctx.generator(1000 + task.id), self.dtype)
        self.head.grow(end)
        self.head.set_rows(range(start, end), rows)
        self.row_class.extend(classes)
        self.blocks.append([start, end])
        feats, labels = task.train.features.double(), task.train.labels
        pre_means = torch.stack([feats[labels == c].mean(0) for c in classes])
        self.row_means = torch.cat([self.row_means, pre_means])
        self.n_seen = task.n_seen

        # 2. fine-tune a fresh copy of the pre-trained ViT with the head
        tuned = self._copy_of_pretrained()
        steps = self._train(task, tuned, True, cfg.epochs, start, end, 2000 + task.id)

        # 3. add its weighted task vector to the merged ViT
        weight = 1.0
        if cfg.similarity_weight:
            aug = self._split_features(tuned, task.train, augment=True, salt=3000 + task.id).double()
            tuned_means = torch.stack([aug[labels == c].mean(0) for c in classes])
            weight = similarity_weight(pre_means, tuned_means)
        self.task_weights.append(weight)
        merge_task_vector(self.model, tuned, ctx.backbone.model, cfg.merge_scalar * weight)
        vit = sum(p.numel() for p in tuned.parameters())
        del tuned

        # 4. retrain the head on the merged ViT's features
        steps += self._train(task, self.model, False, cfg.retrain_epochs, start, end, 4000 + task.id)
        self.note_steps(steps)

        # 5. transport the current block onto every earlier task's block
        if task.id > 0:
            self._transport(start, end)
        self._trainable.append(vit + sum(p.numel() for p in self.head.parameters()))

    @torch.no_grad()
    def _transport(self, start: int, end: int) -> None:
        cfg, w = self.cfg, self.head.weight
        cur_w, cur_means = w[start:end].detach().clone(), self.row_means[start:end]
        for o_start, o_end in self.blocks[:-1]:
            plan = transport_plan(cur_means, self.row_means[o_start:o_end], cfg.ot_reg, cfg.ot_method)
            cost = torch.cdist(cur_means, self.row_means[o_start:o_end])
            self.ctx.log(
                f"  DUCT transport onto rows {o_start}-{o_end}: plan mass {float(plan.sum()):.4f} (1 when solved), "
                f"OT cost {float((plan * cost).sum()):.4f}"
            )
            w[o_start:o_end] = transported_block(w[o_start:o_end], cur_w, plan.to(w.device), cfg.head_merge_ratio)

    # ---------------------------------------------------------------------------------------- prediction
    def class_logits(self, row_logits: torch.Tensor) -> torch.Tensor:
        """(N, n_seen) logits from (N, rows): each class's maximum over its rows (one row per class in the class
        scenario, one per domain in the domain scenario)."""
        index = torch.tensor(self.row_class, device=row_logits.device).expand_as(row_logits)
        out = torch.full((row_logits.shape[0], self.n_seen), float("-inf"), dtype=row_logits.dtype)
        return out.to(row_logits.device).scatter_reduce(1, index, row_logits, reduce="amax")

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "DUCT")
        feats = self._split_features(self.model, split).to(self.ctx.device)
        return self.class_logits(self.head(feats)).float().cpu()

    def adapted_features(self, split: Split) -> torch.Tensor | None:
        """The merged ViT's features of ``split`` (the frozen ones are ``split.features``), float32."""
        return self._split_features(self.model, split).float()

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The merged ViT as its named tensors (rebuilt on a copy of the run's backbone by :meth:`load_state_dict`),
        everything else as :meth:`Strategy.state_dict` keeps it."""
        return with_vit(super().state_dict(), self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state, tensors = without_vit(state)
        super().load_state_dict(state)
        if tensors is not None:
            model = self._copy_of_pretrained()
            model.load_state_dict(tensors)
            model.requires_grad_(False)
            self.model = model

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        vit = sum(p.numel() for p in self.model.parameters())
        return counts(self.cfg, self.dim, vit, [e - s for s, e in self.blocks], list(self._trainable))
