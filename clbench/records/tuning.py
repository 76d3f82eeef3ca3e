"""``tuning.json``: how ``clbench tune`` chose a method's settings, written beside ``chosen.yaml`` and carried into the
record of every run made with it (``clbench run --config chosen.yaml``: ``RunRecord.tuning``).

It holds the search space, the budget (trials asked for, finished, pruned, failed), the tuning benchmark and its
split (the validation fraction and split seed), the objective and the best validation accuracy with the settings
that reached it, and the search library and sampler that drew them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json

SUMMARY_FILE = "tuning.json"
REQUIRED = ("strategy", "search_space", "tuning_bench", "split", "trials", "best_validation_acc", "best_settings")


def read_summary(path: Path) -> dict[str, Any]:
    """The summary in ``path``; a ClbenchError naming the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClbenchError(
            f"--tuning {path}: no such file", "give the tuning.json that `clbench tune` wrote beside chosen.yaml"
        ) from None
    except (OSError, ValueError) as e:
        raise ClbenchError(f"--tuning {path}: not a readable tuning summary ({str(e)[:100]})") from None
    if not isinstance(data, dict) or any(k not in data for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
        raise ClbenchError(
            f"--tuning {path}: not a tuning summary (it lacks {', '.join(missing)})",
            "give the tuning.json that `clbench tune` wrote beside chosen.yaml",
        )
    return data


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write_json(path, summary)
