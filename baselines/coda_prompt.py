"""CODA-Prompt: per-image prompts assembled from a growing set of components by attention over a frozen query.

Paper: Smith et al., "CODA-Prompt: COntinual Decomposed Attention-based Prompting for Rehearsal-Free Continual
Learning", CVPR 2023, arXiv 2211.13218.
Reference implementations checked: the authors' ``GT-RIPL/CODA-Prompt`` @ ``6417d4f`` (``models/zoo.py``
``CodaPrompt`` / ``ViTZoo``, ``models/vit.py`` ``Attention``, ``learners/prompt.py`` ``Prompt.update_model``,
``learners/default.py`` ``learn_batch``, ``utils/schedulers.py`` ``CosineSchedule``, ``trainer.py``,
``configs/cifar-100_prompt.yaml``, ``experiments/cifar-100.sh``) and LAMDA-PILOT
@ ``264745534fc2233f5a50b020e50a3472c47eb756`` (``models/coda_prompt.py``, ``backbone/prompt.py`` ``CodaPrompt``,
``utils/inc_net.py`` ``CodaPromptVitNet``, ``exps/coda_prompt.json``). The two agree: PILOT's ``CodaPrompt`` is the
authors' class (the ortho penalty's identity built on the CPU instead of ``.cuda()``, no ``task_id`` argument),
its learner the authors' loss, optimizer and schedule, and its config the authors' CIFAR-100 one (20 epochs, batch
128, Adam 0.001, cosine, ``prompt_param`` [100, 8, 0.0]). This file follows both; the golden test runs PILOT's class.

Algorithm, in every prompt block l (blocks 0-4, the reference's ``e_layers = [0, 1, 2, 3, 4]``), for image x:

1. query q(x) = the frozen backbone's [CLS] feature of x (no prompts, after the final norm);
2. M components per block, each a key K_m (d), an attention vector A_m (d) and a prompt P_m (L = 8 vectors of d);
   weights alpha_m(x) = cos(q(x) * A_m, K_m) (elementwise product, then cosine), prompt = sum_m alpha_m P_m (L, d);
3. prefix tuning: its first L / 2 vectors join the block's attention keys, the last L / 2 its values, in every head
   (no tokens are added; the linear head reads the [CLS] token);
4. task t brings its own ``components_per_task`` components per block (10: the reference's 100 components over 10
   tasks), initialised by Gram-Schmidt against every earlier component (``process_task_count`` ->
   ``gram_schmidt``: a standard normal draw per new component, minus its projections on all components before it,
   normalised); in training the earlier tasks' components enter the sum detached (frozen), the task's own are
   trained; at evaluation every component learnt so far is used;
5. loss = cross-entropy on the seen classes' logits with the earlier tasks' classes set to -inf (the current task's
   classes only) + ``ortho_mu`` * sum over blocks of mean((T T^T - I)^2) for T = K, A and P (flattened) of the
   components in use (``ortho_mu`` = 0 in the reference's scripts: "with updated code, now can be 0");
6. Adam (lr 0.001, betas (0.9, 0.999), no weight decay) over components and head, re-created per task; the
   reference's ``CosineSchedule`` per epoch, lr_e = lr * cos(99 pi e / (200 (epochs - 1))); 20 epochs, batch 128.

There is no batch-level step at evaluation (every image's prompt is its own), so the only protocol is per-sample.

Deviations from the reference code:

- The pool grows by ``components_per_task`` per task instead of being allocated as ``pool_size`` components split evenly
  over a number of tasks fixed in advance (``n_tasks``; ``pt = int(pool_size / n_tasks)``): clbench does not tell a
  strategy how many tasks will come. Same numbers where ``pool_size = components_per_task * tasks`` (the reference's
  unused components are zero and never enter a sum). The reference's protocol on a 10-task benchmark: the default 10; on
  the embedded benchmark's 6 tasks ``--set components_per_task=16`` is its int(100 / 6).
- Gram-Schmidt skips an earlier component of (near) zero norm (squared norm < 1e-8); the reference then redraws
  the new vector forever (``redo``: the same zero component fails again). Draws come from ``ctx.generator``, per
  block in the reference's order (K, A, P), not from the global RNG; the first task's components are drawn
  directly (the reference draws a uniform init first and then replaces it by Gram-Schmidt in the order P, K, A).
  The orthogonalisation is the reference's classical Gram-Schmidt, so a new component is exactly orthogonal to
  earlier ones only where those are orthogonal to each other (trained components drift; as the reference).
- One epoch: constant lr (the reference's cosine divides by epochs - 1 and fails with ``ZeroDivisionError``).
- The last, smaller batch of an epoch is trained on (the reference's loader has ``drop_last=True``).
- The query comes from the same frozen backbone rather than a second pass of a copy (same weights, same numbers).
  At evaluation it is the cached [CLS] feature (eval transform: what the reference computes). In training,
  ``query="augmented"`` (default) recomputes it on the augmented batch as the reference does; ``query="cached"``
  uses the cached eval-transform feature of the same image (one backbone pass less per training image).
- The head grows per task (``nn.Linear``'s default init, U(+-1/sqrt(d)), as the reference's fixed
  ``nn.Linear(768, nb_classes)``, whose unseen rows are sliced off).
- Prompt blocks at or beyond the backbone's depth are not used (logged). Prefix attention is float32 math outside
  timm's fused kernel (``baselines/dualprompt.py`` ``prefix_block``: softmax(q k^T / sqrt(d_h)) v over [prefix,
  tokens], the reference's ``Attention``); timm models with LayerScale (DINOv2) scale the attention output as
  timm does. The backbone is the benchmark's (the reference: ViT-B/16 IN-21k/1k).
- Transforms, normalisation, class order and task split are the harness's. Test accuracy is not
  computed during training.
- ``head="kac"``: KAC's Kolmogorov-Arnold classifier (Hu et al., CVPR 2025; the authors' ``Ethanhuhuhu/KAC`` @
  d2494cb ``models/kac_clf.py``, ``clbench/layers/kan.py``, whose docstring lists its own deviations) replaces the
  linear head, everything else unchanged, as the authors' ``clf_type: kac`` configs do (their code is CODA-Prompt's
  framework with this layer as ``ViTZoo.last``); its zero rows grow per task, its LayerNorm trains in every task.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from baselines.cards.coda_prompt import CARD, CodaPromptConfig, used_layers
from clbench.layers.checks import check_protocol
from clbench.layers.heads import LinearHead, build_head, head_inputs, head_size
from clbench.layers.kan import KACHead
from clbench.layers.prompts import check_prompt_layers, prefix_block, training_query
from clbench.methods.contract import PER_SAMPLE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import EpochLog, check_vit_blocks, masked_cross_entropy, vit_tokens

EVAL_BATCH = 64  # evaluation batch (speed only: every image's logits depend on it alone)
GS_EPS = 1e-8  # the reference's ``projection`` threshold on an earlier component's squared norm


def gram_schmidt(existing: torch.Tensor, n_new: int, generator: torch.Generator) -> torch.Tensor:
    """(n_new, D) new components for a block whose earlier components are ``existing`` (s, D): the reference's
    ``CodaPrompt.gram_schmidt`` for rows s..s + n_new - 1. Each new row is a standard normal draw (D,) minus its
    projections (v.u / u.u) u on every row before it (earlier components, then the new rows already made), and
    the new rows are normalised at the end. Rows of squared norm < 1e-8 are skipped (the reference redraws
    forever there). Float32, as the reference."""
    D = existing.shape[1]
    rows = [r for r in existing.detach().float().cpu()]
    new = []
    for _ in range(n_new):
        v = torch.randn(D, generator=generator)
        u = v.clone()
        for prev in rows:
            den = (prev * prev).sum()
            if den < GS_EPS:
                continue
            u = u - (v * prev).sum() / den * prev
        rows.append(u)
        new.append(u)
    out = torch.stack(new)
    return out / out.norm(dim=1, keepdim=True)


def ortho_penalty(t: torch.Tensor) -> torch.Tensor:
    """mean((T T^T - I)^2) of the (M, D) rows (the reference's ``ortho_penalty``)."""
    return ((t @ t.T - torch.eye(t.shape[0], device=t.device, dtype=t.dtype)) ** 2).mean()


def component_weights(query: torch.Tensor, keys: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """alpha (B, M) = cos(q * A_m, K_m) for (B, d) queries, (M, d) keys and attention vectors, float32."""
    aq = query.float().unsqueeze(1) * attn.unsqueeze(0)  # (B, M, d)
    return (F.normalize(aq, dim=2) * F.normalize(keys, dim=1).unsqueeze(0)).sum(-1)


def coda_prefix(query: torch.Tensor, keys: torch.Tensor, attn: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """One block's (B, 2, L/2, d) prefixes (keys, values) from (B, d) queries and the block's (M, d) keys,
    (M, d) attention vectors and (M, L, d) prompts: sum_m alpha_m P_m, first L/2 vectors the prefix keys, the
    rest the values (the reference's ``CodaPrompt.forward``: ``Ek = P_[:, :i]``, ``Ev = P_[:, i:]``)."""
    prompt = torch.einsum("bk,kld->bld", component_weights(query, keys, attn), prompts)  # (B, L, d)
    half = prompts.shape[1] // 2
    return torch.stack([prompt[:, :half], prompt[:, half:]], dim=1)


def coda_ortho(keys: torch.Tensor, attn: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """One block's orthogonality penalty (before ``ortho_mu``): over its keys, attention vectors
    and flattened prompts."""
    return ortho_penalty(keys) + ortho_penalty(attn) + ortho_penalty(prompts.reshape(prompts.shape[0], -1))


def coda_cosine_lr(lr: float, epoch: int, epochs: int) -> float:
    """The reference's ``CosineSchedule``: lr * cos(99 pi e / (200 (epochs - 1))) in epoch e; constant if one epoch."""
    if epochs <= 1:
        return lr
    return lr * math.cos(99 * math.pi * epoch / (200 * (epochs - 1)))


class Components(nn.Module):
    """Keys (n_l, M, d), attention vectors (n_l, M, d) and prompts (n_l, M, L, d); M grows per task."""

    def __init__(self, n_layers: int, length: int, dim: int) -> None:
        super().__init__()
        self.keys = nn.Parameter(torch.zeros(n_layers, 0, dim))
        self.attn = nn.Parameter(torch.zeros(n_layers, 0, dim))
        self.prompts = nn.Parameter(torch.zeros(n_layers, 0, length, dim))

    @property
    def size(self) -> int:
        return int(self.keys.shape[1])

    def grow(self, n_new: int, generator: torch.Generator) -> None:
        """Append ``n_new`` Gram-Schmidt components per block (per block in the order K, A, P)."""
        n_l, s, d = self.keys.shape
        L = self.prompts.shape[2]
        keys, attn, prompts = [], [], []
        for i in range(n_l):
            keys.append(gram_schmidt(self.keys[i], n_new, generator))
            attn.append(gram_schmidt(self.attn[i], n_new, generator))
            prompts.append(gram_schmidt(self.prompts[i].reshape(s, L * d), n_new, generator).reshape(n_new, L, d))
        dev = self.keys.device
        self.keys = nn.Parameter(torch.cat([self.keys.data, torch.stack(keys).to(dev)], 1))
        self.attn = nn.Parameter(torch.cat([self.attn.data, torch.stack(attn).to(dev)], 1))
        self.prompts = nn.Parameter(torch.cat([self.prompts.data, torch.stack(prompts).to(dev)], 1))

    def in_use(self, frozen: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K, A, P) with the first ``frozen`` components detached (earlier tasks'), the rest trainable."""

        def split(p: torch.Tensor) -> torch.Tensor:
            return torch.cat([p[:, :frozen].detach(), p[:, frozen:]], 1) if frozen else p

        return split(self.keys), split(self.attn), split(self.prompts)


@CARD.strategy
class CodaPrompt(Strategy[CodaPromptConfig]):
    state_types = (Components, LinearHead, KACHead)
    protocols = (PER_SAMPLE,)
    needs_vit = True

    def __init__(self, config: CodaPromptConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        check_vit_blocks(self.model)
        self.layers = used_layers(config, len(self.model.blocks))
        dim = ctx.backbone.num_features
        check_prompt_layers(
            "CODA-Prompt", config, "prompt_layers", self.model, config.layers, self.layers, dim, ctx.log
        )
        self.components = Components(len(self.layers), config.prompt_length, dim).to(ctx.device)
        self.head = build_head(config.head, dim).to(ctx.device)  # linear, or KAC's (clbench.layers.kan)
        self.n_seen = 0
        self.n_tasks = 0
        self.task_sizes: list[int] = []
        self._added: list[int] = []
        self._trainable: list[int] = []

    # ---------------------------------------------------------------------------------------- forward
    def prefixes(self, query: torch.Tensor, frozen: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Per prompt block the (B, 2, L/2, d) prefixes from (B, d) queries, and the orthogonality penalty
        (0 unless ``ortho_mu`` > 0 and gradients are on); components before ``frozen`` are detached."""
        K, A, P = self.components.in_use(frozen)
        out, penalty = [], torch.zeros((), device=query.device)
        for i in range(len(self.layers)):
            out.append(coda_prefix(query, K[i], A[i], P[i]))
            if self.cfg.ortho_mu > 0 and torch.is_grad_enabled():  # a training term: not at evaluation
                penalty = penalty + self.cfg.ortho_mu * coda_ortho(K[i], A[i], P[i])
        return out, penalty

    def _forward(self, images: torch.Tensor, query: torch.Tensor, frozen: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, n_seen) float32 and the orthogonality penalty."""
        prefixes, penalty = self.prefixes(query, frozen)
        at = {layer: i for i, layer in enumerate(self.layers)}
        with self.ctx.autocast():
            x = vit_tokens(self.model, images)
            for i, block in enumerate(self.model.blocks):
                x = prefix_block(block, x, prefixes[at[i]] if i in at else None)
            x = self.model.norm(x)
            feat = self.model.forward_head(x, pre_logits=True)  # (B, d): the [CLS] token
        return self.head(feat.float()), penalty

    # ---------------------------------------------------------------------------------------- learning
    def _grow_head(self, n_seen: int, generator: torch.Generator) -> None:
        """New rows with ``nn.Linear``'s default init: weight and bias U(-1/sqrt(d), 1/sqrt(d)); the KAC head's
        own (zero rows, ``SplineLinear(init_scale=0)``)."""
        old = self.head.n_classes
        self.head.grow(n_seen, generator)
        if not isinstance(self.head, LinearHead):
            return
        bound = 1.0 / math.sqrt(self.head.weight.shape[1])
        with torch.no_grad():
            w = torch.empty_like(self.head.weight[old:], device="cpu").uniform_(-bound, bound, generator=generator)
            b = torch.empty_like(self.head.bias[old:], device="cpu").uniform_(-bound, bound, generator=generator)
            self.head.weight[old:] = w.to(self.head.weight.device)
            self.head.bias[old:] = b.to(self.head.bias.device)

    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev, t = self.cfg, self.ctx, self.ctx.device, self.n_tasks
        self._grow_head(task.n_seen, ctx.generator(1000 + t))
        self.n_seen = task.n_seen
        frozen = self.components.size  # earlier tasks' components
        self.components.grow(cfg.components_per_task, ctx.generator(3000 + t))
        params = [self.components.keys, self.components.attn, self.components.prompts, *self.head.parameters()]
        optimizer = torch.optim.Adam(params, lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        log = EpochLog(ctx, f"CODA-Prompt task {task.id}", cfg.epochs, len(loader))
        for epoch in log.epochs():
            lr = coda_cosine_lr(cfg.lr, epoch, cfg.epochs) if cfg.schedule == "cosine" else cfg.lr
            for group in optimizer.param_groups:
                group["lr"] = lr
            for images, labels, positions in loader:
                images, labels = images.to(dev), labels.to(dev)
                query = training_query(ctx, cfg.query, task.train.features, positions, images)
                logits, penalty = self._forward(images, query, frozen)
                loss = masked_cross_entropy(logits, labels, task.classes) + penalty
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
        self.note_steps(cfg.epochs * len(loader))
        self.n_tasks += 1
        self.task_sizes.append(len(task.classes))
        counts = self.param_formula(cfg, ctx.backbone.num_features, len(self.model.blocks), tuple(self.task_sizes))
        self._added.append(counts.added_per_task[t])
        self._trainable.append(counts.trainable_per_task[t])

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "CODA-Prompt")
        out = []
        for images, _, positions in split.image_loader(EVAL_BATCH, augment=False):
            query = split.features[positions].to(self.ctx.device)  # cached frozen [CLS]: the eval-transform query
            logits, _ = self._forward(images.to(self.ctx.device), query)
            out.append(logits[:, : self.n_seen].float().cpu())
        return torch.cat(out)

    def adapted_features(self, split: Split) -> torch.Tensor:
        """What the classifier scores, per-sample: the head's input during :meth:`predict`."""
        return head_inputs(self.head, lambda: self.predict(split))

    # ---------------------------------------------------------------------------------------- accounting
    def param_counts(self) -> ParamCounts:
        c = self.components
        return ParamCounts(
            added_per_task=list(self._added),
            trainable_per_task=list(self._trainable),
            head=head_size(self.head),
            extra={
                "components": c.size,
                "component_params": c.keys.numel() + c.attn.numel() + c.prompts.numel(),
                "backbone_passes_per_train_image": 2 if self.cfg.query == "augmented" else 1,
                "backbone_passes_per_test_image": 1,  # plus the cached query feature
            },
        )
