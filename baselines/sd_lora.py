"""SD-LoRA: scalable decoupled low-rank adaptation, per-task LoRA directions frozen after their task and learnt
magnitudes for all of them.

Paper: Wu et al., "SD-LoRA: Scalable Decoupled Low-Rank Adaptation for Class Incremental Learning", ICLR 2025,
arXiv 2501.13198.
Reference implementation checked: the authors' ``WuYichen-97/SD-Lora-CL`` @ ``8bacded`` (commit "lora.py"):
``models/sdlora.py`` (``Learner``), ``backbone/lora.py`` (``LoRA_ViT_timm``, ``_LoRA_qkv_timm_train``,
``ParameterWrapper``), ``utils/inc_net.py`` (``IncrementalNet``, ``get_backbone``), ``backbone/linears.py``
(``SimpleLinear``), ``models/base.py`` (``_eval_cnn``) and ``exps/sdlora_c100.json`` / ``sdlora_inr.json`` /
``sdlora_ina.json``. LibContinual's ``core/model/sd_lora.py`` is a port (not read line by line for this module).

Algorithm (class-incremental), for each task t with new classes C_t:

1. every block's attention queries and values carry one rank-r LoRA pair (A_i, B_i) per task i <= t (keys
   untouched); for task t the shift of the query projection is
   ``sum_{i<t} alpha_i B_i A_i / (||B_i||_F ||A_i||_F) + alpha_t B_t A_t`` (values likewise): old tasks' directions
   normalised and frozen, the current one trained as is. The magnitudes alpha_0..alpha_t are scalars shared by
   every block and by queries and values;
2. at the start of every task the reference builds a new network: A_t kaiming-uniform (``nn.Linear``'s init),
   B_t zero, and every magnitude (old ones included) back at 0.8; a new linear head block for C_t
   (``SimpleLinear``: kaiming-uniform weights for a linear gain, zero bias), old head rows copied;
3. training: A_t, B_t, alpha_0..alpha_t and the head by SGD (momentum 0.9, no weight decay), MultiStepLR stepped
   per epoch (lr 0.008, milestones past the 20 epochs on CIFAR-100), cross-entropy over the current task's head
   columns (targets minus the known classes; old rows get no gradient), 20 epochs, batch 128, r = 10;
4. inference: the same network (every task's branches, the learnt magnitudes), [CLS] after the final norm through
   the whole head. No task identity and no component selection: each image's logits depend on it alone.

SD-LoRA-RR (rank reduction) is in the reference as a commented-out rank schedule (10 for tasks 0-3, 8 for 4-7, 6
from 8 on): ``--set rank_schedule=...`` / ``--profile reference-rr``. SD-LoRA-KD is not in the reference code;
it is not implemented. The reference's orthogonality loss (``compute_ortho_loss``) is computed and dropped
(``loss = loss_clf``; ``10 * ortho`` commented out): not implemented.

Reference behaviours kept on purpose: the current task's pair is not normalised while it trains and is normalised
once it becomes old, so its contribution changes at the task boundary (from alpha_t B_t A_t to
0.8 B_t A_t / (||B_t|| ||A_t||)); every magnitude restarts at 0.8 at each task (``magnitudes=keep`` carries them
instead); the normalisation is by ``||B||_F ||A||_F`` (not ``||B A||_F``).

Deviations from the reference code:

- Per-task head blocks, concatenated (the reference grows one ``SimpleLinear`` and copies old rows: the same
  numbers, since only the current rows get gradient); head init drawn from the run's generator.
- LoRA shifts are computed low-rank with the tasks' factors stacked and the magnitudes folded into B (the reference
  loops over tasks, loading saved pairs from disk in every forward); attention through torch's
  ``scaled_dot_product_attention`` (same formula). Nothing is written to disk.
- The reference keeps 20 slots of old magnitudes (a 21st task fails); here there is one per task.
- An old pair with a zero norm (a task that took no step) contributes nothing (the reference divides 0 by 0).
- The ``ci`` profile computes in float64 (``float64``), so that its numbers do not depend on the CPU's kernels.
- The reference's ViT is ViT-B/16 (IN-21k, timm's ``vit_base_patch16_224``); clbench runs the benchmark's
  backbone. Timm models whose attention has ``q_norm`` apply it to the shifted queries. Transforms, normalisation,
  class order and task split are the harness's. Test accuracy is not computed during training.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.sd_lora import CARD, SDLoRAConfig
from clbench.errors import ClbenchError
from clbench.layers.checks import check_protocol
from clbench.layers.heads import head_inputs
from clbench.layers.lora import LinearTaskHeads, check_lora_width
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import EpochLog, Float64FrozenViT, frozen_vit, vit_tokens

EVAL_BATCH = 64  # evaluation batch (speed only: rows do not depend on it)

Factors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def lr_at(lr: float, milestones: tuple[int, ...], decay: float, epoch: int) -> float:
    """torch's MultiStepLR stepped once per epoch: lr x decay^(milestones passed by ``epoch``)."""
    return lr * decay ** sum(1 for m in milestones if m <= epoch)


class QVLoRA(nn.Module):
    """The LoRA pairs of every block and task: ``a_q[t][i]`` (r_t, d), ``b_q[t][i]`` (d, r_t), the same for
    values, and one magnitude per task (``alpha[t]``, shared by every block, queries and values)."""

    def __init__(self, depth: int, dim: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.depth, self.dim, self.dtype = depth, dim, dtype
        self.a_q = nn.ModuleList()
        self.b_q = nn.ModuleList()
        self.a_v = nn.ModuleList()
        self.b_v = nn.ModuleList()
        self.alpha = nn.ParameterList()

    @property
    def n_tasks(self) -> int:
        return len(self.a_q)

    def add_task(self, rank: int, generator: torch.Generator, device: torch.device, magnitude: float) -> None:
        """Append one task's pairs: A kaiming-uniform (``nn.Linear(d, r)``'s init, U(+-1/sqrt(d))), B zero,
        its magnitude ``magnitude``."""
        bound = 1.0 / math.sqrt(self.dim)

        def a() -> nn.Parameter:
            w = torch.empty(rank, self.dim, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
            return nn.Parameter(w.to(device=device, dtype=self.dtype))

        def b() -> nn.Parameter:
            return nn.Parameter(torch.zeros(self.dim, rank, device=device, dtype=self.dtype))

        # per block: query A, value A (drawn in this order, block by block, as the reference's surgery)
        aq, av = [], []
        for _ in range(self.depth):
            aq.append(a())
            av.append(a())
        self.a_q.append(nn.ParameterList(aq))
        self.a_v.append(nn.ParameterList(av))
        self.b_q.append(nn.ParameterList([b() for _ in range(self.depth)]))
        self.b_v.append(nn.ParameterList([b() for _ in range(self.depth)]))
        self.alpha.append(nn.Parameter(torch.tensor(float(magnitude), device=device, dtype=self.dtype)))

    def current(self) -> list[nn.Parameter]:
        """The current (last) task's pairs."""
        t = self.n_tasks - 1
        return [*self.a_q[t], *self.b_q[t], *self.a_v[t], *self.b_v[t]]

    def freeze_directions(self) -> None:
        for p in self.current():
            p.requires_grad_(False)

    def factors(self, block: int) -> Factors | None:
        """(A_q, B_q, A_v, B_v) of ``block`` over every task, stacked along the rank with the scale folded into B, so
        that ``B @ A = sum_{i<t} alpha_i B_i A_i / (||B_i|| ||A_i||) + alpha_t B_t A_t``; None before the first task."""
        if not self.n_tasks:
            return None
        last = self.n_tasks - 1
        out = []
        for a_list, b_list in ((self.a_q, self.b_q), (self.a_v, self.b_v)):
            bs = []
            for t in range(self.n_tasks):
                a, b = a_list[t][block], b_list[t][block]
                if t == last:
                    scale = self.alpha[t]
                else:
                    norm = torch.linalg.vector_norm(b) * torch.linalg.vector_norm(a)
                    scale = self.alpha[t] / torch.where(norm > 0, norm, torch.full_like(norm, math.inf))
                bs.append(b * scale)
            out.append(torch.cat([a_list[t][block] for t in range(self.n_tasks)]))
            out.append(torch.cat(bs, dim=1))
        return out[0], out[1], out[2], out[3]

    def task_size(self, task: int) -> int:
        """Numbers of one task's pairs: 2 (query, value) x depth x (A: r d + B: d r)."""
        return sum(p.numel() for p in (*self.a_q[task], *self.b_q[task], *self.a_v[task], *self.b_v[task]))


def qv_lora_attention(attn: nn.Module, x: torch.Tensor, factors: Factors | None) -> torch.Tensor:
    """timm ``Attention`` on (B, N, d) tokens with the query and value projections shifted by ``B @ A`` (the
    reference's ``qkv[:, :, :dim] += new_q; qkv[:, :, -dim:] += new_v``, computed low-rank as ``(x A^T) B^T``)."""
    B, N, C = x.shape
    heads = int(attn.num_heads)
    hd = C // heads
    qkv = attn.qkv(x)
    if factors is not None:
        aq, bq, av, bv = (f.to(x.dtype) for f in factors)
        shift = torch.cat([(x @ aq.T) @ bq.T, torch.zeros_like(x), (x @ av.T) @ bv.T], dim=-1)
        qkv = qkv + shift
    q, k, v = qkv.reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C)
    out = attn.norm(out) if hasattr(attn, "norm") else out
    return attn.proj_drop(attn.proj(out))


def qv_lora_block(block: nn.Module, x: torch.Tensor, factors: Factors | None) -> torch.Tensor:
    """One pre-norm timm ``Block`` with LoRA queries and values."""
    x = x + block.drop_path1(block.ls1(qv_lora_attention(block.attn, block.norm1(x), factors)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def lora_features(model: nn.Module, lora: QVLoRA, images: torch.Tensor) -> torch.Tensor:
    """(B, d) [CLS] features of a timm ViT after the final norm, every block's queries and values shifted by
    ``lora`` (the reference's ``LoRA_ViT_timm.forward``: timm's ``forward`` with ``head = Identity``)."""
    x = vit_tokens(model, images)
    for i, block in enumerate(model.blocks):
        x = qv_lora_block(block, x, lora.factors(i))
    return model.forward_head(model.norm(x), pre_logits=True)


def task_optimizer(cfg: SDLoRAConfig, lora: QVLoRA, head: nn.Linear, lr: float) -> torch.optim.SGD:
    """The reference's ``optim.SGD(self._network.parameters(), lr, momentum=0.9)`` over what has a gradient: the
    current pair, every task's magnitude and the current head rows."""
    params = [*lora.current(), *lora.alpha, head.weight, head.bias]
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


class TaskHeads(LinearTaskHeads):
    """The linear head, one block of rows per task (``SimpleLinear`` grown per task), logits concatenated."""

    def initialise(self, head: nn.Linear, generator: torch.Generator) -> None:
        n_classes, dim = head.weight.shape
        bound = math.sqrt(3.0 / dim)  # kaiming_uniform_(nonlinearity="linear"): gain 1, sqrt(3 / fan_in)
        head.weight.copy_(torch.empty(n_classes, dim).uniform_(-bound, bound, generator=generator))
        head.bias.zero_()


@CARD.strategy
class SDLoRA(Float64FrozenViT, Strategy[SDLoRAConfig]):
    state_types = (QVLoRA, TaskHeads)
    needs_vit = True

    def __init__(self, config: SDLoRAConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = frozen_vit(ctx.backbone.model, self.dtype)  # with float64 a float64 copy (frozen too)
        dim = int(ctx.backbone.num_features)
        check_lora_width("SD-LoRA", max(config.rank, config.rank_of(0)), self.model, dim)
        self.depth = len(self.model.blocks)
        self.lora = QVLoRA(self.depth, dim, self.dtype).to(ctx.device)
        self.heads = TaskHeads().to(ctx.device)
        self.n_seen = 0
        self._added: list[int] = []
        self._trainable: list[int] = []

    # ---------------------------------------------------------------------------------------- forward
    def _features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, d) [CLS] features after the final norm with every task's branches."""
        with self.ctx.autocast():
            return lora_features(self.model, self.lora, images.to(self.dtype)).to(self.dtype)

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        t = self.lora.n_tasks
        offset = self.n_seen
        rank = cfg.rank_of(t)
        if rank > self.lora.dim:
            raise ClbenchError(f"SD-LoRA rank {rank} exceeds the backbone's width {self.lora.dim}", "lower the rank")
        # 1. a new pair for this task; the magnitudes of old tasks restart (reset) or carry on (keep)
        if cfg.magnitudes == "reset":
            with torch.no_grad():
                for alpha in self.lora.alpha:
                    alpha.fill_(cfg.magnitude_init)
        self.lora.add_task(rank, ctx.generator(1000 + t), dev, cfg.magnitude_init)
        head = self.heads.add(self.lora.dim, len(task.classes), ctx.generator(2000 + t), dev, self.dtype)
        self.n_seen = task.n_seen
        # 2. train the pair, every magnitude and the task's head rows
        for alpha in self.lora.alpha:
            alpha.requires_grad_(True)
        lr, milestones, decay = cfg.schedule(t)
        optimizer = task_optimizer(cfg, self.lora, head, lr)
        loader = task.train.image_loader(cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(3000 + t))
        log = EpochLog(ctx, f"SD-LoRA task {t}", cfg.epochs, len(loader))
        for epoch in log.epochs():
            for group in optimizer.param_groups:
                group["lr"] = lr_at(lr, milestones, decay, epoch)
            for images, labels, _ in loader:
                images, labels = images.to(dev), labels.to(dev)
                logits = head(self._features(images))
                loss = F.cross_entropy(logits, labels - offset)
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
        self.note_steps(cfg.epochs * len(loader))
        # 3. the direction is frozen from now on; its head rows too
        self.lora.freeze_directions()
        for alpha in self.lora.alpha:
            alpha.requires_grad_(False)
        head.requires_grad_(False)
        ctx.log(f"  SD-LoRA task {t}: magnitudes {[round(float(a), 4) for a in self.lora.alpha]}")
        rows = len(task.classes) * (self.lora.dim + 1)
        self._added.append(self.lora.task_size(t) + 1 + rows)
        self._trainable.append(self.lora.task_size(t) + (t + 1) + rows)

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "SD-LoRA")
        out = []
        for images, _, _ in split.image_loader(max(self.cfg.batch_size, EVAL_BATCH), augment=False):
            out.append(self.heads(self._features(images.to(self.ctx.device))).float().cpu())
        return torch.cat(out)

    def adapted_features(self, split: Split) -> torch.Tensor:
        """What the classifier scores, per-sample: the head's input during :meth:`predict`."""
        return head_inputs(self.heads, lambda: self.predict(split))

    def diagnostics(self, split: Split, true_task: Any) -> dict[str, Any]:
        """The learnt magnitudes after the last task."""
        return {"magnitudes": [float(a) for a in self.lora.alpha]}

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        return ParamCounts(
            added_per_task=list(self._added),
            trainable_per_task=list(self._trainable),
            head=sum(h.weight.numel() + h.bias.numel() for h in self.heads.heads),
            stored_per_task=[0] * len(self._added),
            extra={
                "lora_per_task": [self.lora.task_size(t) for t in range(self.lora.n_tasks)],
                "backbone_passes_per_train_image": 0,
                "backbone_passes_per_test_image": 1,
            },
        )
