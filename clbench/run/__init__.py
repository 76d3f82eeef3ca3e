"""Running one run: its settings (`config`, `configfile`), what clbench knows by name (`catalog`, `registry`),
the run loop (`harness`), its folder and checkpoint (`rundir`, `checkpoint`), the scenario and precision, the
Avalanche entry point (`avalanche_api`) and experiment trackers (`trackers`).
"""
