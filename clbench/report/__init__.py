"""Results to tables and figures, from run records alone (the regression gate that checks them: :mod:`clbench.gate`).

- :mod:`clbench.report.collect`: find run folders, load complete records, list the rest as skipped.
- :mod:`clbench.report.tables`: pandas tables (summary per benchmark x strategy x backbone x protocol, runs,
  protocol gap, routing diagnostics, skipped) and their Markdown / HTML rendering.
- :mod:`clbench.report.figures`: matplotlib figures, the registry (``REPORT_FIGURES``) and one module per family:
  ``curves`` (accuracy and budget curves), ``matrices``, ``costs`` (accuracy vs parameters, wall-clock),
  ``routing_plots``, ``tsne_maps``; their shared look in ``style`` (saving and captions:
  :mod:`clbench.report.figure_base`).
- :mod:`clbench.report.html`: the static ``index.html`` and ``README.md`` of a report folder.
- :mod:`clbench.report.build`: writes a report folder (``report``) or a one-benchmark comparison (``compare``).
- :mod:`clbench.report.leaderboard`, :mod:`clbench.report.budget`, :mod:`clbench.report.uncertainty`: the study's
  main table and sections, budget curves, intervals and paired tests.
- :mod:`clbench.report.commands`: argparse wiring for ``clbench report``, ``compare`` and ``routing-study``.

Importing this package is cheap: pandas, matplotlib, seaborn and scikit-learn are imported by the functions
that need them.
"""
