"""Runnable examples (``python -m clbench.examples.<name>``), executed by the tests."""
