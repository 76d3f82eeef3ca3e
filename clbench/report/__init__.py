"""Results to tables, figures and regression checks, from run records alone.

- :mod:`clbench.report.collect`: find run folders, load complete records, list the rest as skipped.
- :mod:`clbench.report.tables`: pandas tables (summary per benchmark x strategy x backbone x protocol, runs,
  protocol gap, routing diagnostics, skipped) and their Markdown / HTML rendering.
- :mod:`clbench.report.figures`: matplotlib figures (accuracy curves, accuracy matrices, accuracy vs parameters,
  wall-clock, routing, t-SNE).
- :mod:`clbench.report.html`: the static ``index.html`` and ``README.md`` of a report folder.
- :mod:`clbench.report.build`: writes a report folder (``report``) or a one-benchmark comparison (``compare``).
- :mod:`clbench.report.check`: the CI regression gate against a reference file written from real runs: its rules,
  its calibration workload, and making a reference from runs.
- :mod:`clbench.report.reference`: the gate reference file (:class:`~clbench.report.reference.Reference`), its one
  reader and one writer; :mod:`clbench.report.tolerances`: per-metric tolerances; :mod:`clbench.report.check_print`:
  the gate's table and failure lines.
- :mod:`clbench.report.commands`: argparse wiring for ``clbench report``, ``compare`` and ``check``.

Importing this package is cheap: pandas, matplotlib, seaborn and scikit-learn are imported by the functions
that need them.
"""
