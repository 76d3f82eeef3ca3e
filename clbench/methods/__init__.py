"""The method contract (`contract`), what a method costs (`costs`: parameter counts, run shapes, work), and what
several methods share: training-loop pieces (`shared`), routers (`routers`) and the under-training detector
(`training_check`). The methods themselves live in `baselines/` and
`tosca/`; their neural building blocks in `clbench.layers`.
"""
