"""What a run writes: the run record's layout (`schema`), its reader (`results`), its schema versions (`versions`),
what it says about the host and command (`host`, `command`), the per-image predictions (`predictions`), routing
diagnostics (`routing_diagnostics`), and the upgrade of records written at older schema versions (`upgrade`).
"""
