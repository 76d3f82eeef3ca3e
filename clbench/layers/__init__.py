"""Layers shared by two or more methods, one small module per kind (as timm's ``layers/``); no method file imports
another method file, they import from here (or from :mod:`clbench.methods.shared`) instead.

- :mod:`clbench.layers.adapters`: the AdaptFormer bottleneck adapter and one-per-block adapter sets
  (EASE, APER, RanPAC, MOS).
- :mod:`clbench.layers.first_session`: APER's first-session adaptation and the store of adapted features (APER,
  RanPAC's "Phase 1"), and the fine-tuned ViT copy of APER's ``adapt=finetune``.
- :mod:`clbench.layers.ssf`: SSF scale-and-shift factors on a frozen ViT (APER ``adapt=ssf``).
- :mod:`clbench.layers.vpt`: deep and shallow visual prompt tokens (APER ``adapt=vpt``).
- :mod:`clbench.layers.prompts`: prompt-pool key matching and prompt selection (L2P, DualPrompt).
- :mod:`clbench.layers.heads`: the growing linear classifier (L2P, DualPrompt, MOS) and the prompt methods' choice
  of head. The cosine head is :class:`clbench.methods.shared.CosineHead`.
- :mod:`clbench.layers.kan`: KAC's Kolmogorov-Arnold (radial basis) classifier, ``head=kac`` of the prompt methods.
- :mod:`clbench.layers.analytic`: the frozen random expansion with ReLU, the float64 ridge solve over accumulated
  statistics and the recursive least-squares (analytic) classifier, with their memory estimates (RanPAC, ACIL, DS-AL).
- :mod:`clbench.layers.checks`: settings checks and choices several methods' configs share (torch-free: the method
  cards in ``baselines/cards/`` import it).
- :mod:`clbench.layers.lda`: streaming linear discriminant analysis: running class means, one shared covariance
  (per-sample or per-class OAS updates), shrinkage and the solve to a linear head (SLDA, RanDumb).
"""
