"""APER: adapt the pre-trained ViT on the first task only (adapters, SSF, VPT or full fine-tuning), then prototypes
on the concatenation of the frozen and the adapted features.

Paper: Zhou et al., "Revisiting Class-Incremental Learning with Pre-Trained Models: Generalizability and
Adaptivity are All You Need", IJCV 2024, arXiv 2303.07338 (APER, first published as ADAM).
Reference implementation checked: LAMDA-PILOT ``models/aper_adapter.py`` (``_train``, ``replace_fc``),
``utils/inc_net.py`` (``SimpleVitNet``, ``MultiBranchCosineIncrementalNet.construct_dual_branch_network``, the
AdaptFormer ``tuning_config``), ``backbone/vit_adapter.py``, ``backbone/linears.py`` (``CosineLinear``) and
``exps/aper_aperpter.json``; the original ``zhoudw-zdw/RevisitingCIL`` configs (same defaults). The other three
adaptations: LAMDA-PILOT @ 5240714 ``models/aper_ssf.py``, ``aper_vpt.py``, ``aper_finetune.py``,
``backbone/vit_ssf.py``, ``backbone/vpt.py``, ``utils/inc_net.py`` (``get_backbone``, ``construct_dual_branch_network``)
and ``exps/aper_ssf.json``, ``aper_vpt_deep.json``, ``aper_vpt_shallow.json``, ``aper_finetune.json``.

Algorithm, for task t with new classes C_t:

1. Task 0 only ("first-session adaptation"): insert one AdaptFormer adapter beside the MLP of every block
   (bottleneck r = 64, scale 0.1, dropout 0.1, W_down kaiming-uniform, W_up and biases zero, so training starts from
   the pre-trained network) and train it with a cosine head over the task-0 classes (cross-entropy, train
   transform): SGD lr 0.01, momentum 0.9, weight decay 5e-4, cosine schedule to 0 over 20 epochs, batch 48. The
   head is then discarded; the adapted ViT is frozen for good.
2. Every task (0 included): for each new class, its prototype is the mean of concat(f_ptm(x), f_adapted(x)) over its
   training images (test transform), a 2d-dimensional vector (1,536 for ViT-B).
3. Inference: argmax_c cos(concat(f_ptm(x), f_adapted(x)), P_c); the concatenation is normalised as a whole; the
   head's sigma is 1 and never trained.

The first-session adaptation is the setting ``adapt`` (PILOT's four models; step 1 above is ``adapter``, the
default). The loop, head, loss and schedule are the same for all four; what is tuned differs:

- ``ssf``: a (scale, shift) pair per channel on the outputs of the patch projection, every block's norm1, qkv,
  proj, norm2, fc1 (before the GELU) and fc2, and the final norm (``clbench.layers.ssf``), scale ~ N(1, 0.02),
  shift ~ N(0, 0.02); 2 (depth (7 d + h) + 2 d) parameters (h: MLP width).
- ``vpt``: P = 5 zero-initialised prompt tokens appended after the image tokens, a fresh set before every block
  (``vpt_type=deep``, PILOT's ``aper_vpt_deep.json``) or one set through all blocks (``shallow``)
  (``clbench.layers.vpt``); (depth or 1) P d parameters.
- ``finetune``: every parameter of a copy of the ViT (PILOT's ``optim.SGD(self._network.parameters())`` over the
  whole ``SimpleVitNet``); the copy is the adapted branch, the run's frozen backbone the pre-trained one, so a run
  keeps two whole ViTs (the accounting's added/stored count includes the copy).

Reference settings per adaptation are the profiles ``reference-ssf``, ``reference-vpt``, ``reference-vpt-shallow``
and ``reference-finetune`` (only finetune's differ from the adapter's: 6 epochs, batch 128, weight decay 0.05);
``--set adapt=V`` alone keeps the adapter's defaults.

Cost: from task 1 on nothing is trained. The pre-trained branch is clbench's cached frozen feature
(``Split.features``); the adapted branch is computed once per image and kept in the strategy
(:class:`AdaptedFeatures`, keyed by image identity), so every later training image and every test image passes
the adapted ViT exactly once, however many evaluations follow.

The first-session tuning and the adapted-feature store live in ``clbench/layers/first_session.py``, shared with
RanPAC (``baselines/ranpac.py``), which adopted APER's first session as its "Phase 1".

Deviations from the paper / reference code:

- The pre-trained branch is the frozen backbone itself (its cached [CLS] feature), not a second copy of the
  weights: same numbers, half the memory.
- Adapted features are cached per image after task 0 (the reference recomputes both branches for every
  evaluation and every prototype pass); the adapted ViT is frozen then, so the numbers are the same.
- The reference computes test accuracy after every first-session epoch for its log; nothing is selected on it and
  clbench skips it.
- DINOv2 blocks have LayerScale; the adapter output is added outside ``ls2``, exactly as in EASE
  (``clbench.methods.shared.vit_block``): see ``baselines/ease.py`` for why.
- The task-0 head is ``clbench.methods.shared.CosineHead`` with ``CosineLinear``'s init (uniform(-1/sqrt(d), 1/sqrt(d))
  rows, learnable sigma 1), over the task's classes in arrival order.
- Adapter dropout and the first-session shuffling draw from private generators (``ctx.generator``), not the global RNG.
- The reference hard-codes width 768; here the width is the backbone's ``num_features`` (any d; prototypes 2d).
- SSF is applied with forward hooks on the run's frozen timm ViT, held only while the adapted feature is computed
  (the reference builds a separate SSF ViT class; the golden fixture ``aper_ssf`` checks the numbers agree). On
  DINOv2 the factors sit on the same sites; LayerScale (absent in the reference's ViT-B) stays untouched.
- ``finetune``'s adapted branch is a deep copy of the backbone trained in float32 under the run's autocast; the
  reference builds the pre-trained branch anew from the hub (here: the frozen backbone's cached features).
- The backbone runs at the run's precision (bf16 autocast where ``--precision`` resolves to it); heads and
  prototypes are float32.
- The run setting ``train_per_class`` (``--train-per-class``; the ``ci`` profile sets 8) restricts both the tuning and
  the prototypes to the first k training images of each class: the harness cuts each task before ``learn_task``.
- The CPU ``quick`` profile (not the default) runs at 112 px with 3 first-session epochs instead of 20; see
  ``APER.profiles``. Transforms, class order and task split are the harness's, shared by every method.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from baselines.cards.aper import CARD, APERConfig
from clbench.core.costs import adapter_set_size
from clbench.layers.adapters import Adapter, AdapterSet
from clbench.layers.checks import check_protocol
from clbench.layers.first_session import (
    AdaptedFeatures,
    TunedViT,
    check_width,
    first_session_cls,
    n_head_params,
    tune_first_session,
)
from clbench.layers.ssf import SSF, ScaleShift
from clbench.layers.vpt import VisualPrompts
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import CosineHead, check_vit_blocks, class_means


# ----------------------------------------------------------------------------------------------- the strategy
@CARD.strategy
class APER(Strategy):
    # scenarios: class only for now: its prototype rows are set once per task (a later domain would overwrite them);
    # a running mean over domains as SimpleCIL's is the natural extension, not made yet
    state_types = (AdapterSet, Adapter, AdaptedFeatures, SSF, ScaleShift, VisualPrompts)
    needs_vit = True

    def __init__(self, config: APERConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        check_vit_blocks(self.model)
        self.dim = ctx.backbone.num_features
        # the first session's tuned module, trained in task 0 and frozen afterwards: an AdapterSet, SSF factors,
        # visual prompts or a fine-tuned copy of the ViT (``adapt``)
        self.adapters: nn.Module | None = None
        self.head = CosineHead(2 * self.dim, learn_sigma=False)  # rows: prototypes on concat(frozen, adapted)
        self.store = AdaptedFeatures(self.dim)
        self.n_classes = 0
        self._added: list[int] = []
        self._trainable: list[int] = []

    # ---------------------------------------------------------------------------------------- features
    def features(self, split: Split) -> torch.Tensor:
        """(N, 2d) concat(frozen [CLS] from clbench's cache, adapted [CLS] from the strategy's store)."""
        if self.adapters is None:
            raise RuntimeError("APER has no adapted backbone before task 0")
        adapted = self.store.get(
            split,
            lambda x: first_session_cls(self.model, x, self.adapters, self.ctx),
            self.cfg.eval_batch_size,
            self.ctx.device,
        )
        return torch.cat([split.features.float(), adapted], dim=1)

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg = self.cfg
        if sorted(task.classes) != list(range(self.n_classes, task.n_seen)):
            raise ValueError(f"task {task.id}: classes {task.classes} are not the next arrival-order labels")
        adapters = trainable = steps = 0
        if self.adapters is None:  # first session: tune, keep the tuned module, discard the head
            self.adapters, head = tune_first_session(self.model, task, cfg, self.ctx, "APER", self._new_tuned())
            steps = cfg.epochs * math.ceil(len(task.train) / cfg.batch_size)  # batches per epoch x epochs
            adapters = self.first_session_params()
            trainable = adapters + n_head_params(head)
        feats = self.features(task.train)  # (N_t, 2d)
        protos = class_means(feats, task.train.labels, sorted(task.classes))  # (C_t, 2d), label order
        self.head.grow(task.n_seen)
        self.head.set_rows(sorted(task.classes), protos)
        self.n_classes = task.n_seen
        self._added.append(protos.numel() + adapters)
        self._trainable.append(trainable)
        self.note_steps(steps)

    def _new_tuned(self) -> nn.Module | None:
        """The module the first session tunes (None: tune_first_session's fresh adapter set)."""
        cfg = self.cfg
        if cfg.adapt == "ssf":
            return SSF(self.model, self.ctx.generator(1000))
        if cfg.adapt == "vpt":
            return VisualPrompts(len(self.model.blocks), cfg.prompt_tokens, self.dim, cfg.vpt_type == "deep")
        if cfg.adapt == "finetune":
            return TunedViT(self.model)
        return None

    def first_session_params(self) -> int:
        """Parameters of the first session's tuned module (after task 0; by the formula before)."""
        if self.adapters is None or isinstance(self.adapters, AdapterSet):
            return adapter_set_size(len(self.model.blocks), self.dim, self.cfg.bottleneck)
        return sum(p.numel() for p in self.adapters.parameters())

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "APER")
        return self.head(self.features(split))  # (N, n_seen): cosine to each prototype, sigma 1

    @torch.no_grad()
    def adapted_features(self, split: Split) -> torch.Tensor:
        """concat(frozen, adapted) [CLS]: what the prototypes are compared with."""
        return self.features(split).float()

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        return {"adapted_passes_total": self.store.passes, "backbone_passes_per_test_image": 1}

    def state_dict(self) -> dict[str, Any]:
        """A fine-tuned ViT copy is kept as its named tensors (rebuilt on a copy of the run's backbone by
        :meth:`load_state_dict`); everything else as :meth:`Strategy.state_dict` keeps it."""
        state = super().state_dict()
        if isinstance(self.adapters, TunedViT):
            state["adapters"] = None
            state["tuned_vit"] = {k: v.detach().clone() for k, v in self.adapters.vit.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_width("aper", int(state["dim"]), self.dim)
        state = dict(state)
        tensors = state.pop("tuned_vit", None)
        super().load_state_dict(state)
        if tensors is not None:
            tuned = TunedViT(self.model)
            tuned.vit.load_state_dict(tensors)
            self.adapters = tuned.requires_grad_(False).eval()

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        tuned = self.first_session_params()
        extra = {"first_session_params": tuned, "prototype_width": 2 * self.dim}
        if self.cfg.adapt == "adapter":
            extra["adapter_params"] = tuned
        added, stored = CARD.split_kept(self._added, 0, extra, [])
        return ParamCounts(
            added_per_task=added,
            stored_per_task=stored,
            trainable_per_task=list(self._trainable),
            head=self.head.weight.numel(),
            extra=extra,
        )
