"""The foundation every floor of clbench stands on, and nothing of the run driver: what clbench knows by name
(``registry``, ``catalog``), a run's settings and fingerprint (``config``, ``optins``), the parameter and cost
formulas a method card states (``costs``), the precision probe (``precision``), the global RNG states (``rng``) and
the arrival-order class labels (``labels``). It imports only ``clbench.errors`` and ``clbench.files``
(``tests/test_architecture.py``).
"""
