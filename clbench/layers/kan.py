"""KAC: the Kolmogorov-Arnold classifier, a head option of the prompt methods (``--set head=kac``).

Paper: Hu et al., "KAC: Kolmogorov-Arnold Classifier for Continual Learning", CVPR 2025, arXiv 2503.21076.
Reference implementation checked: the authors' ``Ethanhuhuhu/KAC`` @ d2494cbf4b27d35cd0ba53f57230efd9312e277c,
``models/kac_clf.py`` (``KACLayer``, ``RadialBasisFunction``, ``SplineLinear``; after Fast-KAN), used as the ``last``
layer of ``models/zoo.py`` ``ViTZoo`` in place of ``nn.Linear(768, num_classes)`` for L2P, DualPrompt and
CODA-Prompt (``clf_type: kac``; the configs change nothing else).

The head (d = backbone width, G = 16 grid points): z = LayerNorm(x) (learnable affine, weight 1, bias 0 at first);
every coordinate expanded in G Gaussian radial basis functions b_g(z_i) = exp(-((z_i - g) / h)^2) centred on
grid = linspace(-2, 2, G) with width h = 4 / (G - 1); logits = W vec(b) with W (C, d G), no bias. W starts at zero
(``SplineLinear(..., init_scale=0)``), so every logit is 0 before training. Trained with the method's own loss and
optimizer (the authors' learners optimise ``last.parameters()`` with the prompts), so the LayerNorm is shared by
all classes and keeps training in every task, while a class's row of W only moves while its class is trained
(the earlier classes' logits are masked out of the loss).

Deviations from the reference code:

- The head grows a zero row block per arriving class instead of holding ``num_classes`` rows from the start; the
  reference slices its logits to the seen classes and zero-initialises every row, so the numbers are the same.
- ``KACLayer`` also builds ``basis_linear`` (d, G) and, with ``use_base_update`` (its default), ``base_linear``
  (``nn.Linear(d, C)``), which its ``forward`` never reads: they get no gradient and never change. clbench does
  not build them, so the parameter counts are the head's real ones (the reference's ``count_parameter`` would
  add d G + d C + C).
- The grid is a buffer, not a ``Parameter`` with ``requires_grad=False`` (the same numbers; nothing to optimise).
- ``forward(x, time_benchmark=True)`` (the basis without the LayerNorm, a timing switch) is not offered.
- The authors' released learners never pass ``clf_type`` to the model factory (``learners/prompt.py``
  ``create_model``) and ``vit_pt_imnet`` names an undefined ``prompt_para``: the released code does not run as it
  stands. clbench follows the evident intent (the ``clf_type: kac`` configs): the KAC layer replaces the linear
  head and nothing else changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clbench.layers.checks import KAC_GRIDS  # num_grids=16 (RadialBasisFunction's own 8 is overridden by KACLayer)

# models/kac_clf.py KACLayer's defaults, as ViTZoo builds it (KACLayer(768, num_classes)):
KAC_GRID_MIN, KAC_GRID_MAX = -2.0, 2.0  # grid_min=-2., grid_max=2.


class KACHead(nn.Module):
    """The Kolmogorov-Arnold classifier: LayerNorm, G Gaussian RBFs per coordinate, a bias-free linear map of the
    d G basis values to the classes; a zero row block is added per arriving class (:meth:`grow`)."""

    def __init__(self, dim: int, grids: int = KAC_GRIDS) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)  # nn.LayerNorm(input_dim): eps 1e-5, weight 1, bias 0
        self.register_buffer("grid", torch.linspace(KAC_GRID_MIN, KAC_GRID_MAX, grids))  # (G,)
        self.width = (KAC_GRID_MAX - KAC_GRID_MIN) / (grids - 1)  # denominator=None: the grid spacing
        self.weight = nn.Parameter(torch.zeros(0, dim * grids))  # (C, d G): SplineLinear, no bias

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def per_class(self) -> int:
        """Parameters each class adds (its row of W)."""
        return int(self.weight.shape[1])

    @property
    def shared(self) -> int:
        """Parameters no class owns (the LayerNorm's weight and bias), trained in every task."""
        return sum(p.numel() for p in self.norm.parameters())

    def grow(self, n_total: int, generator: torch.Generator | None = None) -> None:
        """Rows for classes up to ``n_total``, zero (``SplineLinear(init_scale=0)``; ``generator`` unused: the
        signature of :class:`~clbench.layers.heads.LinearHead`'s)."""
        n_new = n_total - self.n_classes
        if n_new < 0:
            raise ValueError("the head never shrinks")
        rows = torch.zeros(n_new, self.per_class, device=self.weight.device)
        self.weight = nn.Parameter(torch.cat([self.weight.data, rows]))

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B, d G): exp(-((LayerNorm(x) - grid) / h)^2) per coordinate and grid point."""
        z = self.norm(x)[..., None]  # (B, d, 1)
        return torch.exp(-(((z - self.grid) / self.width) ** 2)).flatten(-2)  # (B, d G)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.basis(x), self.weight)  # (B, C)
