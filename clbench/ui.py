"""Terminal output with rich: progress bars and messages on stderr, the results table on stdout."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from clbench.harness import Reporter


class RichReporter(Reporter):
    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=self.console, transient=False,
        )

    def __enter__(self) -> "RichReporter":
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def log(self, message: str) -> None:
        self._progress.console.log(message)

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        task_id = self._progress.add_task(description, total=total)
        return lambda n: self._progress.advance(task_id, n)


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int) else str(x)


def print_result(record: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    p, t = record["params"], record["time_s"]
    summary = Table(title=f"{record['strategy']} on {record['bench']}: {record['backbone']} "
                          f"({record['weights_source']}), seed {record['seed']}, protocol {record['protocol']}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    rows = [
        ("final accuracy A_T (%)", _fmt(record["last_acc"])),
        ("average incremental accuracy (%)", _fmt(record["avg_acc"])),
        ("forgetting (max - last, points)", _fmt(record["forgetting"])),
        ("added parameters (total)", _fmt(p["added_total"])),
        ("trainable parameters (max per task)", _fmt(p["trainable"])),
        ("backbone parameters (frozen)", _fmt(p["backbone"])),
        ("wall-clock features / train / eval (s)", f"{t['features']:.1f} / {t['train']:.1f} / {t['eval']:.1f}"),
        ("wall-clock total (s)", _fmt(t["total"], 1)),
        ("peak memory (MB)", _fmt(record.get("peak_rss_mb"), 0)),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    console.print(summary)
    if record.get("protocol_gap"):
        g = record["protocol_gap"]
        console.print(f"reference - per-sample protocol gap: final {g['last_acc']:+.2f} points, "
                      f"average {g['avg_acc']:+.2f} points")
    matrix = Table(title="accuracy matrix R[t][j] (%): rows = after task t, columns = task j")
    n = len(record["accuracy_matrix"])
    matrix.add_column("after", justify="right")
    for j in range(n):
        matrix.add_column(f"T{j + 1}", justify="right")
    matrix.add_column("A_t", justify="right")
    for i, row in enumerate(record["accuracy_matrix"]):
        matrix.add_row(f"T{i + 1}", *[_fmt(v, 1) for v in row], *[""] * (n - len(row)), _fmt(record["acc_curve"][i], 2))
    console.print(matrix)
    console.print("forgetting = mean over old tasks of (max earlier R[t][j] - final R[T][j]) (Chaudhry/PILOT)")
