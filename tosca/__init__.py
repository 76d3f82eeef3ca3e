"""TOSCA: one sparse Learn-and-Calibrate (LuCA) module per task on the final [CLS] token (arXiv 2502.14762)."""
