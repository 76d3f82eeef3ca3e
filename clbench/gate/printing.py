"""The gate's output: one table row per reference entry (green: holds; red: fell short or missing; magenta: changed
upwards), then one line per note and per failed check saying what differs and how to fix it."""

from __future__ import annotations

from clbench.core.catalog import DEFAULT_STRATEGY
from clbench.files.escape import rich as esc
from clbench.gate.check import CHANGED, FAIL, MISSING, NOTE, OK, CheckResult, CheckRow

STATUS_STYLE = {OK: "green", CHANGED: "bold magenta", FAIL: "bold red", MISSING: "bold red", NOTE: "yellow"}
COLUMNS = (
    ("matrix", ("accuracy matrix",)),
    ("final acc %", ("final acc %",)),
    ("avg inc acc %", ("avg inc acc %",)),
    ("params added / stored / trainable", ("params added_total", "params stored_total", "params trainable")),
    ("train / eval time", ("train time / calibration", "eval time / calibration")),
)


def _cell(rows: list[CheckRow]) -> str:
    if not rows:
        return "-"
    parts = []
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        shown = r.measured if r.status == OK else f"{r.measured}; needs {r.allowed}"
        parts.append(f"[{style}]{esc(shown)}[/]")
    return " / ".join(parts)


def print_check(result: CheckResult, reference_path: str, console=None) -> None:
    """One row per reference entry (green: holds; red: fell short or missing; magenta: changed upwards), then one
    line per failed check saying what differs and how to fix it."""
    import sys

    from rich.console import Console
    from rich.table import Table

    if console is None:  # CI logs are not terminals: do not squeeze the table into 80 columns there
        console = Console() if sys.stdout.isatty() else Console(width=180)
    by_entry: dict[str, list[CheckRow]] = {}
    for r in result.rows:
        by_entry.setdefault(r.entry, []).append(r)
    table = Table(title=f"clbench check against {esc(reference_path)}")
    table.add_column("benchmark | strategy | backbone | protocol")
    for name, _ in COLUMNS:
        table.add_column(name, justify="right")
    table.add_column("result")
    for entry, rows in by_entry.items():
        statuses = {r.status for r in rows}
        verdict = next((s for s in (MISSING, FAIL, CHANGED) if s in statuses), OK)
        cells = [_cell([r for r in rows if r.check in checks]) for _, checks in COLUMNS]
        table.add_row(esc(entry), *cells, f"[{STATUS_STYLE.get(verdict, 'yellow')}]{verdict}[/]")
    console.print(table)
    for r in result.rows:
        if r.status == NOTE:
            console.print(
                f"[yellow]note[/] {esc(r.entry)}: {esc(r.check)}: {esc(r.measured)}"
                + (f" ({esc(r.detail)})" if r.detail else "")
            )
    fails = result.failures
    if fails:
        console.print(f"[bold red]check failed[/]: {len(fails)} of {len(result.rows)} checks do not hold:")
        for r in fails:
            console.print(
                f"  [{STATUS_STYLE[r.status]}]{r.status}[/] {esc(r.entry)}: {esc(r.check)}: measured "
                f"{esc(r.measured)}, allowed {esc(r.allowed)}" + (f" ({esc(r.detail)})" if r.detail else ""),
                soft_wrap=True,
            )
    else:
        console.print(f"[bold green]check passed[/]: {len(result.rows)} checks hold")


CONTROL = DEFAULT_STRATEGY  # the untrained control: the frozen backbone's features and class means, nothing trained


def margin_lines(runs: list) -> list[str]:
    """Per gate run configuration (``runs``: :class:`clbench.report.collect.Run`), the margin in points between its
    final accuracy and the untrained control's (:data:`CONTROL` in its ``ci`` profile on the same benchmark split,
    training images per class, backbone, scenario and protocol): a method whose ``ci`` profile trains so little that
    it sits near or below the control cannot show a bug in what it learns. Mean over seeds. A configuration without
    such a control among the runs is named, with what the control would need."""
    from statistics import mean

    def key(r) -> tuple:
        rec = r.record
        return (r.bench_label, rec.train_per_class, r.backbone_label, rec.scenario or "class", rec.protocol)

    controls: dict[tuple, list[float]] = {}
    for r in runs:
        if r.strategy == CONTROL and r.record.profile == "ci":
            controls.setdefault(key(r), []).append(float(r.record.last_acc))
    groups: dict[tuple, list[float]] = {}
    for r in runs:
        if r.strategy != CONTROL:
            groups.setdefault((r.strategy, r.record.profile or "defaults", *key(r)), []).append(
                float(r.record.last_acc)
            )
    lines = []
    for (strategy, profile, *k), accs in sorted(groups.items(), key=lambda item: str(item[0])):
        bench, per_class, _, scenario, _ = k
        where = (
            bench
            + (f", {per_class} images per class" if per_class else "")
            + ("" if scenario == "class" else f", {scenario}")
        )
        acc = mean(accs)
        if tuple(k) not in controls:
            lines.append(f"{strategy} {profile} ({where}): final {acc:.2f} %, no untrained control in these runs")
            continue
        control = mean(controls[tuple(k)])
        lines.append(
            f"{strategy} {profile} ({where}): final {acc:.2f} %, untrained control {control:.2f} %, "
            f"margin {acc - control:+.2f} points"
        )
    return lines


def print_margins(runs: list, console=None) -> None:
    """:func:`margin_lines` under a heading (nothing when no run has a control)."""
    lines = margin_lines(runs)
    if not lines:
        return
    if console is None:
        import sys

        from rich.console import Console

        console = Console() if sys.stdout.isatty() else Console(width=180)
    console.print(
        f"margin over the untrained control ({CONTROL} ci: frozen features and class means, nothing trained):"
    )
    for line in lines:
        console.print(f"  {esc(line)}", soft_wrap=True)
