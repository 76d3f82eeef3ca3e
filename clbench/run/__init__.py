"""The run driver: the run loop (`harness`), its folder and checkpoint (`rundir`, `checkpoint`), the config file
reader (`configfile`), the scenario check, the checks before a run (`precheck`, `dryrun`, `validation`, `describe`),
the Avalanche entry point (`avalanche_api`) and experiment trackers (`trackers`). What every floor needs (the
registries, the run settings, precision) is in :mod:`clbench.core`; nothing below the driver imports this package.
"""
