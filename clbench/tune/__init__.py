"""``clbench tune``: settings chosen on a validation split, never on the test images (:mod:`clbench.tune.study`),
over the search space a method's card declares (:mod:`clbench.tune.space`), with the provenance a chosen config's
record carries (:mod:`clbench.records.tuning`)."""
