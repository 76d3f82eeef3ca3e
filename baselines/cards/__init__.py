"""The baselines' method cards, one module per method: its settings class and named profiles, torch-free
(:class:`clbench.core.catalog.MethodCard`). The method's file (``baselines/NAME.py``) takes ``Config`` and ``profiles``
from here; reports, the gate's labels and the CLI read them here without loading the method."""
