"""LAE: a parameter-efficient module learned online, its moving average offline, and their ensemble.

Paper: Gao et al., "A Unified Continual Learning Framework with General Parameter-Efficient Tuning", ICCV 2023,
arXiv 2303.10070.
Reference implementation checked: LAMDA-PILOT (commit 5240714) ``models/lae.py``, ``backbone/vit_lae.py``
(``Prefix``, ``Prompt``, ``Adapter``, ``KVLoRA``, ``Attention``, ``Block``), ``utils/inc_net.py`` (``LAE``) and
``exps/lae.json``; and the authors' ``gqk/LAE`` (commit 1680e49) ``main.py`` (``MyModule``), ``libml/model/pet`` and
``config/vit_{prefix,adapter,lora}.yaml``.

Algorithm (one PET module, shared by all tasks; tasks counted from 0):

1. The PET module sits in blocks 0-4 of the frozen ViT: ``prefix`` (the default, PILOT's ``pet_cls``): L = 10
   learnable key and value tokens per block (uniform(0, 0.01), each set times a learnable scalar, 1 at the start)
   joined to the keys and values of every head; after the softmax the prefix's attention weights are divided by their
   sum (``Prefix.compensate``: the prefix contributes a normalised average of its values on top of the image tokens'
   original share). ``adapter``: a bottleneck d -> 5 -> d with GELU and a learnable output scalar, beside the
   attention (x + attn(norm1 x) + adapter(norm1 x)). ``lora``: rank-5 updates B A of the key and value projections,
   each times a learnable scalar.
2. Task t: the head grows rows for the new classes (kaiming-uniform, PILOT ``SimpleLinear``); Adam (lr 0.0028125,
   constant, re-created per task) trains the head and the online module on cross-entropy over the new classes only
   (old logits set to -inf). For the first 3 of 5 epochs of a task t >= 1 the module is frozen and only the head
   learns (the authors' "calibration" of the new head); after every step the offline module moves toward the online
   one: offline <- 0.9999 offline + 0.0001 online. The offline module is a copy of the online one after task 0.
3. Inference: the ViT runs with the online and with the offline module; each class scores the larger of its two
   softmax probabilities, per image.

Deviations from the paper / reference code:

- PILOT's Adapter and LoRA variants do not run: ``LAE.attach_pets_vit`` attaches the adapter to ``Attention`` under
  the name ``attn``, which only the ``Block``'s forward looks up, so it is never applied, and its LoRA branch reads
  ``self.cfg``, which ``LAE`` has not. ``pet=adapter`` / ``pet=lora`` follow the authors' attachment (the adapter on
  the block, beside the attention; LoRA on ``qkv``) with PILOT's classes and defaults (bottleneck / rank 5).
- PILOT makes the offline module a copy of the untrained module at the start, averages it from task 0's first step,
  and freezes the module in task 0 too. At decay 0.9999 and its batch of 128 (~200 steps per CIFAR task) the offline
  module then stays ~98% its random start after 10 tasks, and the ensemble pairs the trained model with a nearly
  untuned one. The default follows the paper and the authors' code (offline = online after task 0, averaged from task
  1; task 0 unfrozen; task 0 predicts with the online module alone); ``rules=pilot`` reproduces PILOT.
- Scores are max(log softmax online, log softmax offline) per class: the log of the reference's max of the two
  softmaxes (same prediction, finite where a probability underflows).
- The ViT is the benchmark's timm ViT; PILOT's own ViT has no LayerScale. The adapter's output is added outside
  DINOv2's ``ls1`` (as EASE's adapter outside ``ls2``), so it keeps the reference's form; the prefix and LoRA act
  inside the attention and are unaffected. The prefix tokens are joined before the image keys instead of after the
  [CLS] key (PILOT ``position=1``): attention does not depend on the order of its keys.
- The [CLS] read-out is ``model.forward_head(norm(x), pre_logits=True)``, every clbench method's (PILOT's ``x[:, 0]``
  after ``norm`` for these ViTs). The backbone runs at the run's precision (bf16 autocast where ``--precision``
  resolves to it); the head, the scores and the offline average are float32.
- Initialisations draw from private generators (``ctx.generator``), not the global RNG. Transforms, class order and
  task split are the harness's, shared by every method.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.lae import CARD, LAEConfig
from clbench.errors import ClbenchError
from clbench.layers.checks import check_protocol
from clbench.layers.heads import LinearHead
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import EpochLog, check_vit_blocks, masked_cross_entropy, vit_tokens


# ----------------------------------------------------------------------------------------------- the PET modules
class PrefixPET(nn.Module):
    """PILOT ``Prefix`` (``compensatory=True``, learnable scales): L key and L value tokens (L, d)."""

    def __init__(self, length: int, dim: int, generator: torch.Generator) -> None:
        super().__init__()
        self.key = nn.Parameter(torch.empty(length, dim).uniform_(0, 0.01, generator=generator))
        self.val = nn.Parameter(torch.empty(length, dim).uniform_(0, 0.01, generator=generator))
        self.key_scale = nn.Parameter(torch.tensor(1.0))  # Scaler(None): a learnable scalar, 1 at the start
        self.val_scale = nn.Parameter(torch.tensor(1.0))


class AdapterPET(nn.Module):
    """PILOT ``Adapter`` (``mode="parallel"``, ``scale=None``): scale * W_up GELU(W_down x + b_down) + scale * b_up."""

    def __init__(self, dim: int, bottleneck: int, generator: torch.Generator) -> None:
        super().__init__()
        self.down_weight = nn.Parameter(torch.empty(bottleneck, dim))
        nn.init.kaiming_uniform_(self.down_weight, a=math.sqrt(5), generator=generator)
        self.down_bias = nn.Parameter(torch.zeros(bottleneck))
        self.up_weight = nn.Parameter(torch.zeros(dim, bottleneck))
        self.up_bias = nn.Parameter(torch.zeros(dim))
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.down_weight.to(x.dtype), self.down_bias.to(x.dtype)))
        return F.linear(h, self.up_weight.to(x.dtype), self.up_bias.to(x.dtype)) * self.scale.to(x.dtype)


class LoRAPET(nn.Module):
    """PILOT ``KVLoRA``: rank-r updates scale_k B_k A_k and scale_v B_v A_v of the key and value rows of ``qkv``."""

    def __init__(self, dim: int, rank: int, generator: torch.Generator) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(2, rank, dim))
        for i in range(2):
            nn.init.kaiming_uniform_(self.A[i], a=math.sqrt(5), generator=generator)
        self.B = nn.Parameter(torch.zeros(2, dim, rank))
        self.scale = nn.Parameter(torch.ones(2))

    def delta(self) -> torch.Tensor:
        """(2 d, d): the update of the key and value rows of the qkv weight."""
        return torch.cat([self.scale[i] * (self.B[i] @ self.A[i]) for i in range(2)])


def build_pet(cfg: LAEConfig, n_blocks: int, dim: int, generator: torch.Generator) -> nn.ModuleList:
    """One PET per adapted block, freshly initialised."""
    if cfg.pet == "prefix":
        return nn.ModuleList(PrefixPET(cfg.prefix_length, dim, generator) for _ in range(n_blocks))
    if cfg.pet == "adapter":
        return nn.ModuleList(AdapterPET(dim, cfg.bottleneck, generator) for _ in range(n_blocks))
    return nn.ModuleList(LoRAPET(dim, cfg.bottleneck, generator) for _ in range(n_blocks))


# ----------------------------------------------------------------------------------------------- the forward
def pet_attention(attn: nn.Module, x: torch.Tensor, pet: nn.Module | None) -> torch.Tensor:
    """timm ``Attention`` with a prefix (PILOT ``Attention.forward`` with ``Prefix``: keys/values joined, prefix weights
    renormalised after the softmax) or a LoRA update of the key and value projections: (B, N, d) -> (B, N, d)."""
    B, N, C = x.shape
    heads = attn.num_heads
    hd = C // heads
    weight = attn.qkv.weight
    if isinstance(pet, LoRAPET):  # KVLoRA.forward: the query rows unchanged
        weight = weight + torch.cat([torch.zeros_like(weight[:C]), pet.delta().to(weight)])
    bias = attn.qkv.bias
    qkv = F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    qkv = qkv.reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, H, N, hd)
    q, k = attn.q_norm(q), attn.k_norm(k)
    L = 0
    if isinstance(pet, PrefixPET):
        L = pet.key.shape[0]
        pk = (pet.key * pet.key_scale).to(x.dtype).reshape(L, heads, hd).permute(1, 0, 2)  # (H, L, hd)
        pv = (pet.val * pet.val_scale).to(x.dtype).reshape(L, heads, hd).permute(1, 0, 2)
        k = torch.cat([pk.unsqueeze(0).expand(B, -1, -1, -1), k], dim=2)
        v = torch.cat([pv.unsqueeze(0).expand(B, -1, -1, -1), v], dim=2)
    w = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, N, L + N)
    if L:  # Prefix.compensate: the prefix's weights sum to 1 among themselves
        share = w[..., :L].sum(dim=-1, keepdim=True).clamp(min=1e-12)
        w = torch.cat([w[..., :L] / share, w[..., L:]], dim=-1)
    out = (w @ v).transpose(1, 2).reshape(B, N, C)
    out = attn.norm(out) if hasattr(attn, "norm") else out
    return attn.proj_drop(attn.proj(out))


def pet_block(block: nn.Module, x: torch.Tensor, pet: nn.Module | None) -> torch.Tensor:
    """One pre-norm timm ``Block`` with its PET (or none): the adapter beside the attention, on norm1(x)."""
    h = block.norm1(x)
    y = block.drop_path1(block.ls1(pet_attention(block.attn, h, pet)))
    if isinstance(pet, AdapterPET):
        y = y + pet(h)
    x = x + y
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


# ----------------------------------------------------------------------------------------------- the strategy
@CARD.strategy
class LAE(Strategy):
    state_types = (PrefixPET, AdapterPET, LoRAPET, LinearHead)
    needs_vit = True

    def __init__(self, config: LAEConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        check_vit_blocks(self.model)
        depth = len(self.model.blocks)
        self.blocks = [b for b in config.block_ids if b < depth]
        if not self.blocks:
            raise ClbenchError(
                f"LAE blocks {config.blocks!r}: none below the backbone's {depth} blocks",
                "set blocks to indices below the depth, e.g. --set blocks=0,1",
            )
        dim = ctx.backbone.num_features
        if dim % int(self.model.blocks[0].attn.num_heads):
            raise ClbenchError(f"width {dim} is not divisible by the number of heads", "choose another backbone")
        self.online = build_pet(config, len(self.blocks), dim, ctx.generator(1)).to(ctx.device)
        # PILOT: a copy of the untrained module from the start; the authors': a copy after task 0 (learn_task)
        self.offline: nn.ModuleList | None = self._copy(self.online) if config.rules == "pilot" else None
        self.head = LinearHead(dim).to(ctx.device)
        self.n_seen = 0
        self.n_tasks = 0
        self.task_sizes: list[int] = []
        self._added: list[int] = []
        self._stored: list[int] = []
        self._trainable: list[int] = []

    @staticmethod
    def _copy(pet: nn.ModuleList) -> nn.ModuleList:
        out = copy.deepcopy(pet)
        out.requires_grad_(False)
        return out

    # ---------------------------------------------------------------------------------------- forward
    def _forward(self, images: torch.Tensor, pet: nn.ModuleList) -> torch.Tensor:
        """Logits (B, head rows) float32 of the ViT with ``pet`` in the adapted blocks."""
        at = {b: i for i, b in enumerate(self.blocks)}
        with self.ctx.autocast():
            x = vit_tokens(self.model, images)
            for i, block in enumerate(self.model.blocks):
                x = pet_block(block, x, pet[at[i]] if i in at else None)
            feat = self.model.forward_head(self.model.norm(x), pre_logits=True)  # (B, d): the [CLS] token
        return self.head(feat.float())

    @torch.no_grad()
    def ema_update(self) -> None:
        """offline <- decay * offline + (1 - decay) * online, every parameter (PILOT ``_init_train``; timm
        ``ModelEmaV2.update`` in the authors' code)."""
        assert self.offline is not None
        d = self.cfg.ema_decay
        for p, q in zip(self.online.parameters(), self.offline.parameters(), strict=True):
            q.copy_(q * d + p * (1.0 - d))

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev, t = self.cfg, self.ctx, self.ctx.device, self.n_tasks
        if sorted(task.classes) != list(range(self.n_seen, task.n_seen)):
            raise ClbenchError(
                f"LAE task {task.id}: classes {task.classes} are not the next arrival-order labels",
                "LAE runs the class-incremental scenario only",
            )
        old = self.head.n_classes
        self.head.grow(task.n_seen, ctx.generator(1000 + t))
        with torch.no_grad():  # SimpleLinear.reset_parameters: kaiming_uniform(nonlinearity="linear"), bias 0
            bound = math.sqrt(3.0 / self.head.weight.shape[1])
            rows = torch.empty(task.n_seen - old, self.head.weight.shape[1])
            self.head.weight[old:] = rows.uniform_(-bound, bound, generator=ctx.generator(1500 + t)).to(dev)
        self.n_seen = task.n_seen
        params = [*self.head.parameters(), *self.online.parameters()]
        optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)  # re-created per task
        frozen = cfg.num_freeze_epochs if (t > 0 or cfg.rules == "pilot") else 0
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        log = EpochLog(ctx, f"LAE task {task.id}", cfg.epochs, len(loader))
        self.online.train()
        for epoch in log.epochs():
            self.online.requires_grad_(epoch >= frozen)  # pre_train_epoch: freeze, then unfreeze at num_freeze
            for images, labels, _ in loader:
                images, labels = images.to(dev), labels.to(dev)
                logits = self._forward(images, self.online)
                loss = masked_cross_entropy(logits, labels, task.classes)  # old classes' logits at -inf
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
                if self.offline is not None:
                    self.ema_update()
        self.online.requires_grad_(False)
        self.online.eval()
        if self.offline is None:  # the authors' ModelEmaV2(self.pets) at task 1's setup: the module after task 0
            self.offline = self._copy(self.online)
        pet = sum(p.numel() for p in self.online.parameters())
        row = self.head.per_class
        rows = task.n_seen if cfg.weight_decay > 0 else len(task.classes)  # Adam decays every seen row
        self._added.append(len(task.classes) * row + (pet if t == 0 else 0))
        self._stored.append(sum(p.numel() for p in self.offline.parameters()) if t == 0 else 0)
        self._trainable.append(rows * row + (pet if frozen < cfg.epochs else 0))
        self.note_steps(cfg.epochs * len(loader))
        self.n_tasks += 1
        self.task_sizes.append(len(task.classes))

    # ---------------------------------------------------------------------------------------- prediction
    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """(B, n_seen) per-image scores: the larger of the online and offline log-softmax of each class (the online
        one alone while no offline module exists: task 0 under the authors' rules)."""
        out = F.log_softmax(self._forward(images, self.online)[:, : self.n_seen], dim=1)
        if self.offline is not None and not (self.cfg.rules == "authors" and self.n_tasks <= 1):
            off = F.log_softmax(self._forward(images, self.offline)[:, : self.n_seen], dim=1)
            out = torch.maximum(out, off)
        return out

    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "LAE")
        self.online.eval()
        out = [
            self.scores(images.to(self.ctx.device)).cpu()
            for images, _, _ in split.image_loader(self.cfg.eval_batch_size, augment=False)
        ]
        return torch.cat(out)

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        pet = sum(p.numel() for p in self.online.parameters())
        return ParamCounts(
            added_per_task=list(self._added),
            stored_per_task=list(self._stored),
            trainable_per_task=list(self._trainable),
            head=self.head.weight.numel() + self.head.bias.numel(),
            extra={"pet_params": pet, "offline_params": pet, "pet": self.cfg.pet, "rules": self.cfg.rules},
        )
