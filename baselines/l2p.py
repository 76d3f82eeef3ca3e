"""L2P: a pool of prompts with learnable keys, chosen per image by its frozen [CLS] feature.

Paper: Wang et al., "Learning to Prompt for Continual Learning", CVPR 2022, arXiv 2112.08654.
Reference implementation checked: LAMDA-PILOT ``models/l2p.py``, ``backbone/prompt.py`` (``Prompt``),
``backbone/vit_l2p.py``, ``utils/inc_net.py`` (``PromptVitNet``) and ``exps/l2p.json``.

Algorithm, for each task t with new classes C_t:

1. query q(x) = the frozen backbone's [CLS] pre-logits feature of x (no prompts).
2. pick the top-k keys by cosine similarity cos(q(x), key_m) (k = 5 of a pool of M = 10);
3. prepend the k selected prompts (each L = 5 tokens) to the patch tokens of the frozen ViT: the sequence is
   [CLS, prompts, patches] and every prompt token gets the [CLS] position embedding (PILOT's resized table);
4. the classifier is a linear head on the mean of the k * L prompt-token outputs after the final norm;
5. loss = cross-entropy with the logits of classes outside C_t set to -inf, minus 0.1 * the pull constraint
   (the cosine of each selected key to the query, summed over the k keys and averaged over the batch);
6. Adam (lr 0.001875, constant, no weight decay), 5 epochs, batch 16, optimizer re-created per task.
   Trainable: prompts, keys, head. The ViT never changes.

Protocols (``predict(split, protocol)``):

- ``per-sample`` (default): each test image picks its own top-k prompts, so its logits depend on it alone.
- ``reference``: PILOT's ``batchwise_prompt=True``: within an evaluation batch, the k prompt ids chosen most
  often by the batch's images are used for every image of the batch. The harness passes test splits sorted
  class by class and we cut batches of ``eval_batch_size`` (16, PILOT's unshuffled test loader with
  ``batch_size``), so a batch mostly holds one class: the batch votes for the prompts.

Deviations from the paper / reference code:

- Training uses PILOT's batch-wise prompt selection (``batchwise_prompt`` applies to training batches in the
  reference too); ``train_selection="per-sample"`` trains with per-image selection instead. The protocol only
  changes evaluation, so the protocol gap isolates the test-time batch effect.
- Batch-wise ties (equal vote counts) go to the lower prompt id; the reference's ``torch.topk`` leaves ties
  to the implementation. Prompt order inside the sequence does not matter here: every prompt token has the
  same position embedding and the head averages them.
- The query comes from the same frozen backbone rather than a second copy of it (same weights, same
  numbers). At evaluation the query is the cached [CLS] feature (eval transform: what the reference
  computes). In training, ``query="augmented"`` (default) recomputes it on the augmented batch as the reference
  does; ``query="cached"`` (the CPU ``quick`` profile) uses the cached eval-transform feature of the same image,
  which saves one backbone pass per training image.
- The pull constraint is ``sum(cos) / B`` over the k selected keys, as in ``backbone/prompt.py``
  (``reduce_sim``); this is k times the "mean cosine" of the methods note.
- The head grows when classes arrive (new rows: truncated normal std 0.02, bias 0, timm's init of the
  reference's head) instead of holding all ``nb_classes`` rows from the start; the reference slices the
  logits to the seen classes, so logits and gradients are the same, only the random draws differ.
- Per-sample evaluation runs in batches of max(``eval_batch_size``, 64): its rows do not depend on the batch, and
  batches of 16 are several times slower per image on CPU. The reference protocol keeps ``eval_batch_size``.
- Prompt and key similarities are computed in float32 outside autocast (the ViT itself runs at the run's
  precision, bf16 where `--precision` resolves to it); the reference runs fp32 throughout.
- The reference uses ViT-B/16 (augreg IN-21k -> IN-1k); clbench runs the benchmark's backbone (any width;
  the embedded benchmark uses DINOv2 ViT-S/14, whose blocks have LayerScale, which does not touch prompts).
  Timm models with register tokens get the prompts after all prefix tokens.
- Transforms, normalisation, class order and task split are the harness's, shared by every method.
- ``head="kac"``: KAC's Kolmogorov-Arnold classifier (Hu et al., CVPR 2025; the authors' ``Ethanhuhuhu/KAC`` @
  d2494cb ``models/kac_clf.py``, ``clbench/layers/kan.py``, whose docstring lists its own deviations) replaces the
  linear head, everything else unchanged, as the authors' ``clf_type: kac`` configs do; its zero rows grow per task,
  its LayerNorm trains in every task. The authors run it in CODA-Prompt's framework (their L2P is L2P++ with
  prefix prompts; Adam 1e-3, cosine, batch 128, 20-50 epochs); clbench keeps this method's own defaults.
- The CPU ``quick`` profile (not the default) runs at 112 px, with the cached query and 3 epochs instead of
  5; see ``L2P.profiles``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from baselines.cards.l2p import CARD, L2PConfig
from clbench.layers.checks import check_protocol
from clbench.layers.heads import LinearHead, build_head, head_inputs, head_size
from clbench.layers.kan import KACHead
from clbench.layers.prompts import eval_batch, key_similarity, select_prompts, training_query
from clbench.methods.contract import PER_SAMPLE, REFERENCE, Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import (
    EpochLog,
    check_vit_blocks,
    masked_cross_entropy,
    vit_forward_tokens,
    vit_inserted_position,
    vit_tokens,
)


class PromptPool(nn.Module):
    """M prompts of L tokens and M keys, uniform(-1, 1) init (``prompt_init`` / ``prompt_key_init`` "uniform")."""

    def __init__(self, pool_size: int, length: int, dim: int, generator: torch.Generator) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.empty(pool_size, length, dim).uniform_(-1, 1, generator=generator))
        self.keys = nn.Parameter(torch.empty(pool_size, dim).uniform_(-1, 1, generator=generator))

    def similarity(self, query: torch.Tensor) -> torch.Tensor:
        """(B, d) queries -> (B, M) cosine similarities, float32."""
        return key_similarity(query, self.keys)


@CARD.strategy
class L2P(Strategy):
    # domain scenario (the paper's CORe50 setting): one prompt pool and one head over every class, every domain
    # trains the whole head (its classes are all of them); key matching picks prompts per image as before
    scenarios = ("class", "domain")
    state_types = (PromptPool, LinearHead, KACHead)
    protocols = (PER_SAMPLE, REFERENCE)
    needs_vit = True

    def __init__(self, config: L2PConfig, ctx: Context) -> None:
        super().__init__(config, ctx)
        self.model = ctx.backbone.model
        check_vit_blocks(self.model)
        dim = ctx.backbone.num_features
        self.pool = PromptPool(config.pool_size, config.prompt_length, dim, ctx.generator(1)).to(ctx.device)
        self.head = build_head(config.head, dim).to(ctx.device)  # linear, or KAC's (clbench.layers.kan)
        self._added: list[int] = []
        self._trainable: list[int] = []
        self.n_seen = 0

    # ---------------------------------------------------------------------------------------- forward
    def _forward(self, images: torch.Tensor, query: torch.Tensor, batchwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, n_seen) float32 and the pull term sum_k cos(key, q) / B."""
        sim = self.pool.similarity(query)  # (B, M)
        idx = select_prompts(sim, self.cfg.top_k, batchwise)  # (B, k)
        pull = sim.gather(1, idx).sum() / sim.shape[0]
        prompts = self.pool.prompts[idx].flatten(1, 2)  # (B, k * L, d)
        prompts = prompts + vit_inserted_position(self.model)  # every prompt token at the [CLS] position
        n_prefix, n_prompt = int(self.model.num_prefix_tokens), prompts.shape[1]
        with self.ctx.autocast():
            x = vit_forward_tokens(self.model, vit_tokens(self.model, images, prompts))  # (B, n_prefix + kL + N, d)
            feat = self.model.fc_norm(x[:, n_prefix : n_prefix + n_prompt].mean(dim=1))  # (B, d): head_type "prompt"
        return self.head(feat.float()), pull

    # ---------------------------------------------------------------------------------------- learning
    def learn_task(self, task: Task) -> None:
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        new = task.n_seen - self.head.n_classes  # head rows this task adds (a later domain: 0)
        self.head.grow(task.n_seen, ctx.generator(1000 + task.id))
        self.n_seen = task.n_seen
        params = [self.pool.prompts, self.pool.keys, *self.head.parameters()]
        optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)  # re-created per task
        loader = task.train.image_loader(
            cfg.batch_size, augment=True, shuffle=True, generator=ctx.generator(2000 + task.id)
        )
        log = EpochLog(ctx, f"L2P task {task.id}", cfg.epochs, len(loader))
        batchwise = cfg.train_selection == "batchwise"
        self.pool.train()
        for epoch in log.epochs():
            for images, labels, positions in loader:
                images, labels = images.to(dev), labels.to(dev)
                query = training_query(ctx, cfg.query, task.train.features, positions, images)
                logits, pull = self._forward(images, query, batchwise)
                loss = masked_cross_entropy(logits, labels, task.classes) - cfg.pull_coeff * pull
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
        self.pool.eval()
        self.note_steps(cfg.epochs * len(loader))

        pool_params = self.pool.prompts.numel() + self.pool.keys.numel()
        new_rows = new * self.head.per_class
        self._added.append(new_rows + (pool_params + self.head.shared if task.id == 0 else 0))
        # Old head rows get zero gradient (masked logits) and so stay put unless weight decay moves them.
        # (a later domain trains every row: its classes are all of them); KAC's LayerNorm trains in every task
        whole = cfg.weight_decay > 0 or new < len(task.classes)
        head_updated = head_size(self.head) if whole else new_rows + self.head.shared
        self._trainable.append(pool_params + head_updated)

    # ---------------------------------------------------------------------------------------- prediction
    @torch.no_grad()
    def predict(self, split: Split, protocol: str = PER_SAMPLE) -> torch.Tensor:
        check_protocol(protocol, self.protocols, "L2P")
        # A per-sample row does not depend on its batch, so that protocol may use any batch size: larger ones are
        # several times faster per image on CPU. The reference protocol keeps the reference's batches.
        batch = eval_batch(self.cfg.eval_batch_size, protocol == REFERENCE)
        out = []
        for images, _, positions in split.image_loader(batch, augment=False):
            query = split.features[positions].to(self.ctx.device)  # cached frozen [CLS]: the eval-transform query
            logits, _ = self._forward(images.to(self.ctx.device), query, batchwise=protocol == REFERENCE)
            out.append(logits[:, : self.n_seen].float().cpu())
        return torch.cat(out)

    def adapted_features(self, split: Split) -> torch.Tensor:
        """What the classifier scores, per-sample: the head's input during :meth:`predict`."""
        return head_inputs(self.head, lambda: self.predict(split))

    def diagnostics(self, split: Split, true_task: np.ndarray) -> dict[str, Any]:
        """Prompt usage under per-sample selection, and how often the reference's batch vote replaces an image's
        own top-k (computed from the cached queries: no backbone pass)."""
        with torch.no_grad():
            sim = self.pool.similarity(split.features.to(self.ctx.device))
            own = select_prompts(sim, self.cfg.top_k, batchwise=False)
            b = self.cfg.eval_batch_size
            voted = torch.cat(
                [select_prompts(sim[s : s + b], self.cfg.top_k, batchwise=True) for s in range(0, len(sim), b)]
            )
            same = (own.sort(dim=1).values == voted.sort(dim=1).values).all(dim=1)
            usage = torch.bincount(own.flatten(), minlength=self.cfg.pool_size)
        return {
            "prompt_usage_per_sample": usage.cpu().tolist(),
            "reference_eval_batch_size": b,
            "reference_vote_equals_own_topk": float(same.float().mean()),
        }

    def param_counts(self) -> ParamCounts:
        return ParamCounts(
            added_per_task=list(self._added),
            trainable_per_task=list(self._trainable),
            head=head_size(self.head),
            extra={
                "prompt_pool": self.pool.prompts.numel(),
                "prompt_keys": self.pool.keys.numel(),
                "backbone_passes_per_train_image": 2 if self.cfg.query == "augmented" else 1,
                "backbone_passes_per_test_image": 1,  # plus the cached query feature
                "reference_eval_batch_size": self.cfg.eval_batch_size,
            },
        )
