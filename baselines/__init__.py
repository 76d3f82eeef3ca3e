"""Baseline methods: SimpleCIL, L2P and EASE, one method per file."""
