"""Baseline methods, one per file: SimpleCIL, L2P, EASE, RanPAC, APER, MOS and DualPrompt (TOSCA: ``tosca/``)."""
