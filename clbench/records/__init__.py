"""What a run writes: the run record (`results`), its per-image predictions (`predictions`), routing
diagnostics (`routing_diagnostics`), and the upgrade of records written at older schema versions (`upgrade`).
"""
