"""Pieces used by two or more methods: class means, the cosine head, masked cross-entropy, schedules,
mini-batching over cached features, and parameter counting."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clbench.errors import ClbenchError


def class_means(features: torch.Tensor, labels: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
    """(len(classes), d) mean feature of each class; raises if a class has no sample."""
    rows = []
    for c in classes:
        mask = labels == c
        if not bool(mask.any()):
            raise ClbenchError(f"class {c} has no training samples in this task")
        rows.append(features[mask].mean(dim=0))
    return torch.stack(rows)


def first_per_class(labels: torch.Tensor, k: int | None) -> torch.Tensor:
    """Positions of the first ``k`` samples of each class in the given order (all positions when ``k`` is None): a
    fixed, seed-independent training subset for profiles that must stay small (e.g. the CI profiles)."""
    if k is None:
        return torch.arange(len(labels))
    keep = torch.zeros(len(labels), dtype=torch.bool)
    for c in labels.unique():
        keep[torch.nonzero(labels == c).flatten()[:k]] = True
    return torch.nonzero(keep).flatten()


def cosine_logits(features: torch.Tensor, weight: torch.Tensor, sigma: torch.Tensor | float = 1.0) -> torch.Tensor:
    """sigma * cos(f, w_c) for every class row of ``weight``: (B, d) x (C, d) -> (B, C)."""
    return sigma * F.linear(F.normalize(features, dim=-1), F.normalize(weight, dim=-1))


class CosineHead(nn.Module):
    """PILOT's CosineLinear: logits = sigma * cos(f, w_c), one learnable scale, rows added per task.

    New rows start at zero (as in the reference code); ``grow`` keeps the old rows.
    """

    def __init__(self, in_features: int, learn_sigma: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.zeros(0, in_features))
        self.sigma = nn.Parameter(torch.ones(1), requires_grad=learn_sigma)

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    def grow(self, n_total: int) -> None:
        if n_total < self.n_classes:
            raise ValueError("a cosine head never shrinks")
        new = torch.zeros(
            n_total - self.n_classes, self.in_features, dtype=self.weight.dtype, device=self.weight.device
        )
        self.weight = nn.Parameter(torch.cat([self.weight.data, new]))

    def set_rows(self, classes: Sequence[int], rows: torch.Tensor) -> None:
        with torch.no_grad():
            self.weight[list(classes)] = rows.to(self.weight)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cosine_logits(features, self.weight, self.sigma)


def masked_cross_entropy(logits: torch.Tensor, target: torch.Tensor, allowed: Sequence[int]) -> torch.Tensor:
    """Cross-entropy where logits of classes outside ``allowed`` are set to -inf (L2P's current-task mask)."""
    mask = torch.full((logits.shape[-1],), float("-inf"), device=logits.device, dtype=logits.dtype)
    mask[list(allowed)] = 0.0
    return F.cross_entropy(logits + mask, target)


def cosine_lr(optimizer: torch.optim.Optimizer, total_steps: int, eta_min: float = 1e-8):
    """Cosine annealing from the optimizer's lr to ``eta_min`` over ``total_steps`` steps (PILOT's schedule
    is per epoch; we step once per epoch too, so ``total_steps`` is the number of epochs)."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps), eta_min=eta_min)


def minibatches(
    n: int, batch_size: int, generator: torch.Generator | None = None, shuffle: bool = True
) -> Iterator[torch.Tensor]:
    """Index batches over ``range(n)``: shuffled with a private generator, or in order."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def n_params(*modules: nn.Module | nn.Parameter | torch.Tensor, trainable_only: bool = False) -> int:
    total = 0
    for m in modules:
        params = [m] if isinstance(m, torch.Tensor) else list(m.parameters())
        total += sum(p.numel() for p in params if p.requires_grad or not trainable_only)
    return total


def compute_dtype(float64: bool, precision: str) -> torch.dtype:
    """The dtype a backbone-training method computes in: float32, or float64 where its ``float64`` setting asks.

    float64 exists for the regression gate: a few epochs of training through the ViT amplify float32 rounding,
    so the same fp32 run gave accuracy-matrix entries up to 5 points apart under AVX2 and AVX-512 kernels (SLCA's
    ``ci`` profile, reports/gate/README.md); in float64 the kernels' differences stay far below any prediction's
    margin. It needs ``--precision fp32``: autocast would cast the float64 passes down again."""
    if not float64:
        return torch.float32
    if precision != "fp32":
        raise ClbenchError(
            f"the float64 setting computes in float64 and cannot run at --precision {precision}",
            "run it with --precision fp32, or leave float64 off (--set float64=false)",
        )
    return torch.float64


class Float64Setting:
    """Mixed in before :class:`~clbench.methods.contract.Strategy` by a method whose config has a ``float64``
    setting (SLCA, CoFiMA, DUCT, InfLoRA, SD-LoRA, CL-LoRA): :attr:`dtype`, what it computes in."""

    cfg: Any
    ctx: Any

    @property
    def dtype(self) -> torch.dtype:
        """float32, or float64 where the ``float64`` setting asks (the ci profile; needs --precision fp32)."""
        return compute_dtype(self.cfg.float64, self.ctx.precision)


class Float64FrozenViT(Float64Setting):
    """:class:`Float64Setting` for a method that keeps the run's frozen ViT as ``self.model`` (:func:`frozen_vit`;
    InfLoRA, SD-LoRA, CL-LoRA): a float64 copy of it is not saved in a checkpoint (it is remade from the run's
    backbone when the state is loaded)."""

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`Strategy.state_dict`; a float64 copy of the frozen ViT is not kept (it is remade from the run's
        backbone when the state is loaded)."""
        state: dict[str, Any] = super().state_dict()  # type: ignore[misc]  # Strategy's, after this class
        if self.dtype != torch.float32:
            del state["model"]
        return state


def frozen_vit(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The run's frozen ViT ``model`` in ``dtype``: itself in float32, a float64 copy of it (frozen too) in float64;
    refused unless it is a timm ViT (:func:`check_vit_blocks`)."""
    model = model if dtype == torch.float32 else copy.deepcopy(model)
    model.to(dtype=dtype)
    check_vit_blocks(model)
    return model


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` intra-op threads. Steps on cached features are tiny (a 48 x 384 batch through a
    bottleneck): with 2 threads OpenMP's hand-offs cost more than the arithmetic, measured 8x slower on these
    2-core machines and far worse when the other core is busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, where: str) -> float:
    """One training step shared by the trained methods: refuse a non-finite loss (naming ``where``), then
    zero the gradients, backpropagate and step. Returns the loss value, read from the device once per step (the
    one host sync a step needs), and tells an active :class:`TrainingTrace`."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise _non_finite(value, where)
    trace = TrainingTrace.current()
    if trace is not None:
        trace.before_step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if trace is not None:
        trace.after_step(optimizer, value, where)
    return value


class EpochLog:
    """The bookkeeping every trained method's training loop repeats, around its own batches and losses: a progress
    bar over all ``epochs x steps_per_epoch`` steps (``ctx.progress``), each epoch's mean loss per image logged as
    ``  LABEL epoch e/E: loss x`` (``ctx.log``), and the steps taken::

        log = EpochLog(ctx, f"L2P task {task.id}", cfg.epochs, len(loader))
        for epoch in log.epochs():
            for images, labels, _ in loader:
                ...
                log.step(optimizer, loss, len(labels), f"task {task.id} epoch {epoch}")
            schedule.step()  # before the epoch's line, as the loop's own code after its batches
    """

    def __init__(self, ctx: Any, label: str, epochs: int, steps_per_epoch: int) -> None:  # ctx: a strategy Context
        self.ctx, self.label, self.n_epochs = ctx, label, epochs
        self.advance = ctx.progress(label, epochs * steps_per_epoch) if ctx.progress else None
        self.steps = 0
        self._total, self._n = 0.0, 0

    def epochs(self) -> Iterator[int]:
        """0, 1, ... ``epochs - 1``; after each epoch's body, its mean loss is logged."""
        for epoch in range(self.n_epochs):
            self._total, self._n = 0.0, 0
            yield epoch
            mean = self._total / max(self._n, 1)
            self.ctx.log(f"  {self.label} epoch {epoch + 1}/{self.n_epochs}: loss {mean:.4f}")

    def step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, n: int, where: str) -> float:
        """One :func:`optimizer_step` on a batch of ``n`` images; returns the loss value."""
        value = optimizer_step(optimizer, loss, where)
        self._total, self._n = self._total + value * n, self._n + n
        self.steps += 1
        if self.advance:
            self.advance(1)
        return value


class TrainingTrace:
    """What one ``learn_task`` did with each optimiser it stepped through :func:`optimizer_step`: the mean loss of
    its first and last epoch (an epoch: the consecutive steps that share a ``where`` label) and how far its
    parameters moved, ``||after - init|| / ||init||`` over all of them together (a zero-initialised part, such as an
    adapter's up-projection, counts in the whole). The harness activates one around every ``learn_task`` and stores
    :meth:`summary` in the task's diagnostics as ``training``; the gate's README states the criterion it must meet."""

    _active: list[TrainingTrace] = []  # the innermost active trace is the last

    def __init__(self) -> None:
        self._init: dict[int, list[torch.Tensor]] = {}  # optimiser id -> its parameters before its first step
        self._params: dict[int, list[torch.Tensor]] = {}
        self._epochs: dict[int, list[tuple[str, list[float]]]] = {}  # optimiser id -> [(where, losses)]
        # The optimisers themselves, held for the task: a freed optimiser's id can be reused by the next one (MOS's
        # alignment optimiser after its adapter optimiser), which merged two optimisers' entries into one.
        self._optimizers: dict[int, torch.optim.Optimizer] = {}

    @classmethod
    def current(cls) -> TrainingTrace | None:
        return cls._active[-1] if cls._active else None

    @classmethod
    @contextlib.contextmanager
    def active(cls) -> Iterator[TrainingTrace]:
        trace = cls()
        cls._active.append(trace)
        try:
            yield trace
        finally:
            cls._active.remove(trace)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        key = id(optimizer)
        if key not in self._init:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._params[key] = params
            self._init[key] = [p.detach().clone() for p in params]
            self._epochs[key] = []
            self._optimizers[key] = optimizer

    def after_step(self, optimizer: torch.optim.Optimizer, loss: float, where: str) -> None:
        epochs = self._epochs[id(optimizer)]
        if not epochs or epochs[-1][0] != where:
            epochs.append((where, []))
        epochs[-1][1].append(loss)

    def relative_change(self) -> float | None:
        """``||after - init|| / ||init||`` over every parameter any optimiser stepped (each counted once; infinite
        where only zero-initialised parts moved); None when nothing was stepped. The under-training detector's
        per-task measure (:mod:`clbench.methods.training_check`)."""
        init = {id(p): (p, q) for key in self._init for p, q in zip(self._params[key], self._init[key], strict=True)}
        if not init:
            return None
        moved = sum(float((p.detach() - q).double().pow(2).sum()) for p, q in init.values())
        start = sum(float(q.double().pow(2).sum()) for _, q in init.values())
        if start == 0.0:
            return math.inf if moved > 0.0 else 0.0
        return math.sqrt(moved / start)

    def summary(self) -> list[dict[str, float | int | None]]:
        """One entry per optimiser, in the order of their first steps."""
        out = []
        for key, epochs in self._epochs.items():
            init, now = self._init[key], self._params[key]
            moved = math.sqrt(sum(float((p.detach() - q).pow(2).sum()) for p, q in zip(now, init, strict=True)))
            start = math.sqrt(sum(float(q.pow(2).sum()) for q in init))
            first, last = epochs[0][1], epochs[-1][1]
            out.append(
                {
                    "steps": sum(len(losses) for _, losses in epochs),
                    "epochs": len(epochs),
                    "params": sum(q.numel() for q in init),
                    "loss_first_epoch": sum(first) / len(first),
                    "loss_last_epoch": sum(last) / len(last),
                    "param_change": moved / start if start > 0 else None,  # ||after - init|| / ||init||
                    "param_change_abs": moved,
                }
            )
        return out


def _non_finite(value: float, where: str) -> ClbenchError:
    return ClbenchError(f"loss became {value} in {where}", "lower the learning rate (--set lr=...) or check the data")


# ----------------------------------------------------------------------------------------------- a timm ViT by hand
# L2P inserts prompt tokens after the prefix tokens and EASE adds an adapter beside every block's MLP. Both call
# the frozen timm modules one by one as plain functions (no hooks, no patched ``forward``, nothing assigned to the
# model), so the backbone stays bit-identical and shared with the feature cache. With nothing inserted and no
# adapter, ``vit_forward_tokens`` + ``model.forward_head(..., pre_logits=True)`` equals ``FrozenBackbone.forward``.

_BLOCK_PARTS = ("norm1", "attn", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")


def check_vit_blocks(model: nn.Module) -> None:
    """Raise :class:`ClbenchError` unless ``model`` is a timm VisionTransformer with pre-norm ``Block``s."""
    blocks = getattr(model, "blocks", None)
    missing = [
        a
        for a in ("patch_embed", "_pos_embed", "patch_drop", "norm_pre", "norm", "num_prefix_tokens")
        if not hasattr(model, a)
    ]
    if blocks is None or missing or len(blocks) == 0:
        raise ClbenchError(
            f"{type(model).__name__} is not a timm VisionTransformer (missing {missing or ['blocks']})",
            "choose a ViT backbone",
        )
    for i, block in enumerate(blocks):
        absent = [p for p in _BLOCK_PARTS if not hasattr(block, p)]
        if absent:
            raise ClbenchError(
                f"block {i} ({type(block).__name__}) is not a pre-norm timm Block (no {', '.join(absent)})",
                "prompt/adapter methods support timm VisionTransformer models built from Block",
            )


def vit_inserted_position(model: nn.Module) -> torch.Tensor:
    """(1, 1, d) position embedding for tokens inserted after the prefix tokens.

    PILOT's L2P ViT grows its position table by repeating the [CLS] entry for every prompt slot
    (``resize_pos_embed`` in ``backbone/vit_l2p.py``), so a prompt token gets the [CLS] position. Models whose
    table has no [CLS] entry (``no_embed_class``) or no table give zeros.
    """
    pos = getattr(model, "pos_embed", None)
    d = int(model.num_features)
    if pos is None or getattr(model, "no_embed_class", False) or getattr(model, "cls_token", None) is None:
        return torch.zeros(1, 1, d, device=model.patch_embed.proj.weight.device)
    return pos[:, :1].detach()


def vit_tokens(model: nn.Module, images: torch.Tensor, inserted: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N, d) tokens entering the first block, as timm's ``forward_features`` builds them; ``inserted``
    (B, P, d) tokens (position already added) go right after the prefix tokens ([CLS], registers), before
    ``norm_pre``: the sequence is [prefix, inserted, patches]."""
    x = model.patch_embed(images)
    x = model._pos_embed(x)  # prefix tokens + position table (timm handles dynamic sizes and no_embed_class)
    x = model.patch_drop(x)
    if inserted is not None:
        n = int(model.num_prefix_tokens)
        x = torch.cat([x[:, :n], inserted.to(x.dtype), x[:, n:]], dim=1)
    return model.norm_pre(x)


def vit_block(block: nn.Module, x: torch.Tensor, beside_mlp: nn.Module | None = None) -> torch.Tensor:
    """One timm ``Block``: x += ls1(attn(norm1(x))); x += ls2(mlp(norm2(x))) [+ beside_mlp(x)].

    ``beside_mlp`` (an adapter) reads the residual stream after attention, before ``norm2``, and its output
    is added outside ``ls2`` (PILOT's ``vit_ease.py``: ``adapt(x)`` on the pre-norm x, summed with the MLP output).
    """
    x = x + block.drop_path1(block.ls1(block.attn(block.norm1(x))))
    out = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
    return out if beside_mlp is None else out + beside_mlp(x)


def vit_forward_tokens(
    model: nn.Module, x: torch.Tensor, beside_mlp: Sequence[nn.Module] | None = None
) -> torch.Tensor:
    """All blocks (optionally with one ``beside_mlp`` module per block), then the final norm: (B, N, d)."""
    if beside_mlp is not None and len(beside_mlp) != len(model.blocks):
        raise ValueError(f"{len(beside_mlp)} adapters for {len(model.blocks)} blocks")
    for i, block in enumerate(model.blocks):
        x = vit_block(block, x, None if beside_mlp is None else beside_mlp[i])
    return model.norm(x)
