"""LoRA branches in a timm ViT's attention keys and values, and InfLoRA's interference-free subspace memory.

Used by InfLoRA (``baselines/inflora.py``); its per-task heads (:class:`LinearTaskHeads`) and width check
(:func:`check_lora_width`) also by SD-LoRA. Read from the authors' code, ``liangyanshuo/InfLoRA`` @
``e08b00edd54f2f10cf2f9826eae7d44fdcb6354b``: ``models/vit_inflora.py`` (``Attention_LoRA``) and
``methods/inflora.py`` (``InfLoRA._train``, ``update_DualGPM``).

- :class:`KVLoRA`: per block, one rank-r pair (A_t, B_t) per task for the key and one for the value projection;
  the block's keys become ``k + x (sum_t B_t A_t)^T`` (values likewise) over every task learnt so far. Task
  modules are appended as tasks arrive; the backbone's own weights are never touched.
- :func:`lora_attention` / :func:`lora_block`: one pre-norm timm block with those branches (same math as timm's
  ``Attention.forward``); :func:`token_covariance` is the mean ``x^T x`` over every token the attention reads
  (the reference's ``cur_matrix``).
- :func:`design_down_projection`: A_t from the current task's covariance projected off (or onto) the memory;
  :func:`update_dual_gpm`: the DualGPM memory update after a task (threshold on the retained spectrum energy,
  switching a layer from a "remove" basis to its "retain" complement once the basis passes half the width).

All linear algebra of the memory runs in float64 (the reference: float32 torch and float64 numpy mixed).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from clbench.core.costs import lora_task_size
from clbench.errors import ClbenchError

ProjectType = Literal["remove", "retain"]
A_SCALE = 1.0 / math.sqrt(3.0)  # the reference's ``U[:, :rank].T / math.sqrt(3)``


def check_lora_width(title: str, rank: int, model: nn.Module, dim: int) -> None:
    """Refuse a LoRA ``rank`` above the ViT's width ``dim``, or a width the attention heads of the timm ViT
    ``model`` do not divide (InfLoRA, SD-LoRA); ``title``: the method's name in the message."""
    if rank > dim:
        raise ClbenchError(f"{title} rank {rank} exceeds the backbone's width {dim}", "lower --set rank")
    if dim % int(model.blocks[0].attn.num_heads):  # type: ignore[index, union-attr]  # a timm ViT's blocks
        raise ClbenchError(f"width {dim} is not divisible by the number of heads", "choose another backbone")


class LinearTaskHeads(nn.Module):
    """One linear head per task, logits concatenated in task order (InfLoRA's ``SiNet.classifier_pool``, SD-LoRA's
    ``SimpleLinear`` grown per task); a method's subclass draws a new head's weights in :meth:`initialise`."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList()

    def initialise(self, head: nn.Linear, generator: torch.Generator) -> None:
        raise NotImplementedError

    def add(
        self, dim: int, n_classes: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> nn.Linear:
        head = nn.Linear(dim, n_classes, device=device, dtype=dtype)
        with torch.no_grad():
            self.initialise(head, generator)
        self.heads.append(head)
        return head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([h(x) for h in self.heads], dim=1)


class KVLoRA(nn.Module):
    """The LoRA branches of every block: ``a_k[t][i]`` (r, d) and ``b_k[t][i]`` (d, r), the same for values.

    ``a_*`` are designed (never trained); ``b_*`` start at zero and only the current task's train."""

    def __init__(self, depth: int, dim: int, rank: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.depth, self.dim, self.rank, self.dtype = depth, dim, rank, dtype
        self.a_k = nn.ModuleList()
        self.b_k = nn.ModuleList()
        self.a_v = nn.ModuleList()
        self.b_v = nn.ModuleList()

    @property
    def n_tasks(self) -> int:
        return len(self.a_k)

    def add_task(self, a: list[torch.Tensor]) -> None:
        """Append one task's branches: ``a[i]`` (r, d) the designed down-projection of block i (keys and values
        share it, as in the reference); the up-projections are zeros."""
        if len(a) != self.depth:
            raise ValueError(f"{len(a)} down-projections for {self.depth} blocks")
        dev = a[0].device
        zeros = [torch.zeros(self.dim, self.rank, device=dev, dtype=self.dtype) for _ in range(self.depth)]
        self.a_k.append(nn.ParameterList([nn.Parameter(x.clone().to(self.dtype), requires_grad=False) for x in a]))
        self.a_v.append(nn.ParameterList([nn.Parameter(x.clone().to(self.dtype), requires_grad=False) for x in a]))
        self.b_k.append(nn.ParameterList([nn.Parameter(z.clone()) for z in zeros]))
        self.b_v.append(nn.ParameterList([nn.Parameter(z) for z in zeros]))

    def trainable(self, task: int) -> list[nn.Parameter]:
        return [*self.b_k[task], *self.b_v[task]]

    def factors(self, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(A_k, B_k, A_v, B_v) of ``block`` over every task, stacked along the rank: A (T r, d), B (d, T r), so that
        ``B @ A = sum_t B_t A_t``; None before the first task."""
        if not self.n_tasks:
            return None
        ak = torch.cat([self.a_k[t][block] for t in range(self.n_tasks)])
        bk = torch.cat([self.b_k[t][block] for t in range(self.n_tasks)], dim=1)
        av = torch.cat([self.a_v[t][block] for t in range(self.n_tasks)])
        bv = torch.cat([self.b_v[t][block] for t in range(self.n_tasks)], dim=1)
        return ak, bk, av, bv

    def size(self) -> int:
        """Numbers of one task's branches: 2 (key, value) x depth x (A: r d + B: d r)."""
        return lora_task_size(self.depth, self.dim, self.rank)


def lora_attention(
    attn: nn.Module,
    x: torch.Tensor,
    factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """timm ``Attention`` on (B, N, d) tokens with the key and value projections shifted by ``B @ A`` (the
    reference's ``k + F.linear(x, sum_t B_t A_t)``, computed low-rank as ``(x A^T) B^T``). A timm ``k_norm`` acts on
    the shifted keys (the LoRA changes the projection it follows; the reference's ViT-B has none)."""
    B, N, C = x.shape
    heads = int(attn.num_heads)
    hd = C // heads
    qkv = attn.qkv(x).reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, H, N, hd)
    if factors is not None:
        ak, bk, av, bv = (f.to(x.dtype) for f in factors)
        dk = ((x @ ak.T) @ bk.T).reshape(B, N, heads, hd).transpose(1, 2)
        dv = ((x @ av.T) @ bv.T).reshape(B, N, heads, hd).transpose(1, 2)
        k, v = k + dk, v + dv
    q, k = attn.q_norm(q), attn.k_norm(k)
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C)
    out = attn.norm(out) if hasattr(attn, "norm") else out
    return attn.proj_drop(attn.proj(out))


def lora_block(
    block: nn.Module,
    x: torch.Tensor,
    factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    covariance: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """One pre-norm timm ``Block`` with LoRA keys/values. With ``covariance`` (a one-element list holding a (d, d)
    float64 sum), the attention's input tokens' ``sum x^T x`` is added to it (no gradient)."""
    h = block.norm1(x)
    if covariance is not None:
        covariance[0] += token_covariance(h)
    x = x + block.drop_path1(block.ls1(lora_attention(block.attn, h, factors)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


@torch.no_grad()
def token_covariance(h: torch.Tensor) -> torch.Tensor:
    """``sum_b h_b^T h_b`` over a (B, N, d) batch of tokens, float64 (d, d): divided by the token count it is the
    reference's ``cur_matrix``, its running mean over ``B N`` tokens per batch."""
    flat = h.detach().reshape(-1, h.shape[-1]).double()
    return flat.T @ flat


def design_down_projection(
    covariance: torch.Tensor, basis: torch.Tensor | None, project_type: ProjectType | None, rank: int
) -> torch.Tensor:
    """A (rank, d): the top ``rank`` left singular vectors of the task's covariance projected off the memory
    (``remove``: ``C - U U^T C``) or onto it (``retain``: ``U U^T C``; no memory yet: C itself), over sqrt(3)."""
    cov = covariance.double()
    if basis is not None:
        proj = basis @ (basis.T @ cov)
        cov = cov - proj if project_type == "remove" else proj
    u, _, _ = torch.linalg.svd(cov, full_matrices=False)
    return (u[:, :rank].T * A_SCALE).float()


def update_dual_gpm(
    activation: torch.Tensor,
    basis: torch.Tensor | None,
    project_type: ProjectType | None,
    threshold: float,
) -> tuple[torch.Tensor, ProjectType]:
    """The reference's ``update_DualGPM`` for one layer: the new (d, k) orthonormal basis and its type after a task
    whose attention-input covariance is ``activation`` (d, d). ``remove``: the basis spans the protected inputs and
    grows by the directions of the projected-off residual needed to keep ``threshold`` of the energy; ``retain``: it
    spans the free complement and shrinks by the directions the task now claims. A ``remove`` basis past half the
    width turns into the ``retain`` basis of its complement."""
    act = activation.double()
    d = act.shape[0]
    if basis is None:
        u, s, _ = torch.linalg.svd(act, full_matrices=False)
        ratio = s**2 / (s**2).sum()
        r = int((torch.cumsum(ratio, 0) < threshold).sum())
        # the reference labels a first basis of r >= d/2 directions "retain" but keeps the top-r (protected)
        # directions, and then fails its own assert; here it is a "remove" basis, turned below into its complement
        basis_out: torch.Tensor = u[:, : max(r, 1)]
        kind_out: ProjectType = "remove"
    elif project_type == "remove":
        total = float((torch.linalg.svdvals(act) ** 2).sum())
        hat = act - basis @ (basis.T @ act)
        u, s, _ = torch.linalg.svd(hat, full_matrices=False)
        ratio = (s**2) / total
        acc = (total - float((s**2).sum())) / total
        r = 0
        for value in ratio.tolist():
            if acc < threshold:
                acc += value
                r += 1
            else:
                break
        basis_out, kind_out = basis, "remove"
        if r:
            grown = torch.cat([basis, u[:, :r]], dim=1)
            basis_out = grown[:, :d]
    else:
        total = float((torch.linalg.svdvals(act) ** 2).sum())
        hat = basis @ (basis.T @ act)
        u, s, _ = torch.linalg.svd(hat, full_matrices=False)
        ratio = (s**2) / total
        acc = float((s**2).sum()) / total
        r = 0
        for value in ratio.tolist():
            if acc >= 1 - threshold:
                acc -= value
                r += 1
            else:
                break
        basis_out, kind_out = basis, "retain"
        if r:
            rest = basis - u[:, :r] @ (u[:, :r].T @ basis)
            ui, _, _ = torch.linalg.svd(rest)
            basis_out = ui[:, : basis.shape[1] - r]
    if kind_out == "remove" and basis_out.shape[1] > d / 2:
        ui, _, _ = torch.linalg.svd(basis_out)
        basis_out, kind_out = ui[:, basis_out.shape[1] :], "retain"
    return basis_out, kind_out
