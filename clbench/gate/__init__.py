"""The regression gate: real runs of every strategy's ci profiles checked against a committed reference.

- :mod:`clbench.gate.check`: the gate's plan (``clbench check --plan``), its rules (accuracy matrices, parameters,
  backbone digest, precision, train/eval time against the calibration workload), the calibration file, and making a
  reference from runs.
- :mod:`clbench.gate.reference`: the reference file (:class:`~clbench.gate.reference.Reference`), its one reader
  and one writer; :mod:`clbench.gate.tolerances`: per-metric tolerances; :mod:`clbench.gate.printing`: the gate's
  table and failure lines.
- :mod:`clbench.gate.commands`: argparse wiring for ``clbench check``.

``.ci/gate`` runs the plan and ``.ci/run`` the check; ``reports/gate/README.md`` says what the gate pins and why.
"""
