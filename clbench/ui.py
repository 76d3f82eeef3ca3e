"""Terminal output with rich: progress bars and messages on stderr, the results table on stdout.

Every string that came from a file or a name (a record's fields, run ids, paths, log lines) is escaped with
:func:`clbench.files.escape.rich` before rich renders it: markup in a name prints as written, control
characters as escapes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from clbench.evaluation import metrics
from clbench.files.escape import rich as esc
from clbench.records.schema import RunRecord
from clbench.report.tables import routing_warning, training_warning
from clbench.run.harness import Reporter, RunStart

if TYPE_CHECKING:
    from clbench.sweep.manifest import SweepManifest


def _bars(console: Console, *, remaining: bool) -> Progress:
    """Progress bars on ``console`` that stay when done: description, bar, done of all, time elapsed and
    (``remaining``) time remaining."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, transient=False)


class RichReporter(Reporter):
    def __init__(self) -> None:
        self.console = Console(stderr=True, log_path=False)
        self._progress = _bars(self.console, remaining=True)
        self.run_dir: Path | None = None  # the run's folder, once the run has started

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def log(self, message: str) -> None:
        self._progress.console.log(esc(message))

    def progress(self, description: str, total: int) -> Callable[[int], None]:
        task_id = self._progress.add_task(esc(description), total=total)
        return lambda n: self._progress.advance(task_id, n)

    def run_started(self, start: RunStart) -> None:
        self.run_dir = start.run_dir

    def run_finished(self, record: RunRecord, run_dir: Path) -> None:
        self.run_dir = run_dir


def print_where(run_dir: Path | None, trackers: dict[str, str], console: Console | None = None) -> None:
    """The last lines of ``clbench run``: the record's folder and where each ``--log`` tracker wrote."""
    console = console or Console(soft_wrap=True)  # a path is never cut or wrapped
    if run_dir is not None:
        console.print(f"record: {esc(str(Path(run_dir).resolve()))}", highlight=False)
    for name, where in trackers.items():
        console.print(f"{esc(name)}: {esc(where)}", highlight=False)


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int) else str(x)


def print_result(record: RunRecord, console: Console | None = None) -> None:
    console = console or Console()
    p, t, main = record.params, record.time_s, record.main
    summary = Table(
        title=esc(
            f"{record.strategy} on {record.bench}: {record.backbone} "
            f"({record.weights_source}), seed {record.seed}, protocol {record.protocol}"
        )
    )
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    rows = [
        ("final accuracy A_T (%)", _fmt(main.last_acc)),
        ("average incremental accuracy (%)", _fmt(main.avg_acc)),
        ("forgetting (max - last, points)", _fmt(main.forgetting)),
        ("added parameters, learned (total)", _fmt(p.added_total)),
        ("stored statistics (total)", _fmt(p.stored_total)),
        ("trainable parameters (max per task)", _fmt(p.trainable)),
        ("backbone parameters (frozen)", _fmt(p.backbone)),
        ("wall-clock features / train / eval (s)", f"{t.features:.1f} / {t.train:.1f} / {t.eval:.1f}"),
        ("wall-clock total (s)", _fmt(t.total, 1)),
        ("peak memory (MB)", _fmt(record.peak_rss_mb, 0)),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    console.print(summary)
    if record.protocol_gap is not None:
        g = record.protocol_gap
        console.print(
            f"reference - per-sample protocol gap: final {g.last_acc:+.2f} points, average {g.avg_acc:+.2f} points"
        )
    domains = record.domains if record.scenario == "domain" and record.domains else None
    unit = "domain" if domains else "task"  # the domain scenario's tasks are its domains, in arrival order
    matrix = Table(title=f"accuracy matrix R[t][j] (%): rows = after task t, columns = {unit} j")
    n = len(main.accuracy_matrix)
    matrix.add_column("after", justify="right")
    for j in range(n):
        matrix.add_column(esc(domains[j]) if domains and j < len(domains) else f"T{j + 1}", justify="right")
    matrix.add_column("A_t", justify="right")
    if main.task_aware_curve and len(main.task_aware_curve) == n:
        matrix.add_column("task-aware", justify="right")
    for i, row in enumerate(main.accuracy_matrix):
        aware = [_fmt(main.task_aware_curve[i], 2)] if main.task_aware_curve and len(main.task_aware_curve) == n else []
        matrix.add_row(
            f"T{i + 1}", *[_fmt(v, 1) for v in row], *[""] * (n - len(row)), _fmt(main.acc_curve[i], 2), *aware
        )
    console.print(matrix)
    glossary = metrics.definitions(record.scenario or "class")  # the metrics' declared definitions
    console.print(f"forgetting = {esc(glossary['forgetting'])}")
    if main.task_aware_curve:
        console.print(f"task-aware = {esc(glossary['task-aware'])}")
    for warning in run_warnings(record):
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


def run_warnings(record: RunRecord) -> list[str]:
    """What a finished run warns about, for the end of ``clbench run``: the routing warning of its last evaluation
    (one module takes far more than its task's share of the test images) and the under-training warning (the trained
    parts barely moved), each where the record has it."""
    return [w for w in (routing_warning(record), training_warning(record)) if w]


# ----------------------------------------------------------------------------------------------- sweeps
class RichSweepView:
    """One progress view over a whole sweep: a bar for the sweep (runs finished or skipped of all), one line per
    running run (tasks done, its latest message), and a line for every run that ends."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, log_path=False)
        self._progress = _bars(self.console, remaining=False)
        self._overall = None
        self._rows: dict[str, Any] = {}

    def __enter__(self) -> RichSweepView:
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def start(self, plan: list, todo: list) -> None:
        states = [r.state for r in plan]
        self.log(
            f"sweep: {len(plan)} runs; {states.count('complete')} complete (skipped), "
            f"{states.count('partial')} to continue from their checkpoint, {states.count('new')} new"
        )
        self._overall = self._progress.add_task("[bold]sweep[/bold]", total=len(plan), completed=len(plan) - len(todo))

    def running(self, run: Any, tasks_done: int, n_tasks: int | None, last_line: str) -> None:
        text = f"  {esc(run.run_id)}  [dim]{esc(last_line[:60])}[/dim]"
        if run.run_id not in self._rows:
            self._rows[run.run_id] = self._progress.add_task(text, total=n_tasks, completed=tasks_done)
        self._progress.update(self._rows[run.run_id], description=text, total=n_tasks, completed=tasks_done)

    def ended(self, run: Any, ok: bool, message: str) -> None:
        row = self._rows.pop(run.run_id, None)
        if row is not None:
            self._progress.remove_task(row)
        mark = "[green]done[/green]" if ok else "[red]FAILED[/red]"
        self._progress.console.log(f"{mark} {esc(run.run_id)}: {esc(message)}")
        if self._overall is not None:
            self._progress.advance(self._overall)

    def log(self, message: str) -> None:
        self._progress.console.log(esc(message))


def print_plan(manifest: SweepManifest, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"sweep plan: {len(manifest.runs)} runs (dry run; nothing was started)")
    table.add_column("run", no_wrap=True)  # run ids are what a user copies: never cut
    for col in ("state", "tasks done"):
        table.add_column(col)
    table.add_column("folder", overflow="fold")
    table.add_column("settings", no_wrap=True)  # a digest of the run's fingerprint: equal digests, same settings
    for run_id, entry in manifest.runs.items():
        state = {"complete": "complete: skipped", "partial": "continues from its checkpoint", "new": "new"}[
            entry.state_at_start
        ]
        table.add_row(
            esc(run_id),
            state,
            str(entry.tasks_done_at_start),
            esc(entry.path),
            entry.fingerprint.digest(),
        )
    console.print(table)


def print_sweep_end(manifest: SweepManifest, out: Any, written: list, console: Console | None = None) -> None:
    console = console or Console()
    runs = manifest.runs.values()
    failed = {k: v for k, v in manifest.runs.items() if v.state != "complete"}
    ran = sum(1 for r in runs if r.status == "done")
    skipped = sum(1 for r in runs if r.status == "skipped")
    console.print(f"sweep {esc(out)}: {ran} runs executed, {skipped} skipped (complete), {len(failed)} not complete")
    ov = manifest.overhead
    if ov is not None and ov.startup_s is not None and ov.per_run_s is not None:  # runs were executed
        console.print(
            f"overhead: startup {ov.startup_s:.1f} s, {ov.per_run_s:.2f} s per run "
            f"(scheduling + record collection, {ov.max_concurrent_runs} at once)"
        )
    summary = next((p for p in written if str(p).endswith("summary.csv")), None)
    if summary is not None:
        import pandas as pd

        df = pd.read_csv(summary)
        table = Table(title="mean ± std over seeds (summary.md has every column)")
        for col in ("benchmark", "strategy", "protocol", "n", "final acc %", "avg inc acc %", "forgetting"):
            table.add_column(col, justify="left" if col in ("benchmark", "strategy", "protocol") else "right")
        for row in df.itertuples(index=False):
            table.add_row(
                esc(row.bench),
                esc(row.strategy),
                esc(row.protocol),
                str(row.n),
                *(
                    f"{getattr(row, m + '_mean'):.2f} ± {getattr(row, m + '_std'):.2f}"
                    for m in ("last_acc", "avg_acc", "forgetting")
                ),
            )
        console.print(table)
    for path in written:
        console.print(f"wrote {esc(path)}")
    for run_id, info in failed.items():
        console.print(f"[red]not complete[/red] {esc(run_id)}: {esc(info.outcome.error or info.state)}")
    if failed:
        console.print(
            "re-run the same command to finish them: complete runs are skipped, unfinished ones continue "
            "from their checkpoint"
        )
