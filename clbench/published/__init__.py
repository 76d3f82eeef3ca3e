"""Published results beside clbench's: one row per (method, benchmark, split, backbone, source) in
``published.csv``, for every method clbench carries.

Each row names the paper and its table (or the run log) and a ``status``:

- ``verified``: the value was read from the cited file at the cited commit (the authors' run logs or result tables);
- ``secondary``: quoted from a comparison table of another paper (or a toolbox's reproduction notes) and not yet
  checked against the paper's own text;
- ``approximate``: read off a figure;
- ``missing``: no published value on a benchmark and backbone clbench carries was found; the row names the cell a
  user would measure, with empty values.

``average`` is the average incremental accuracy (the mean of the accuracy after each task), ``final`` the accuracy
after the last task, both top-1 in percent on all classes seen, as in :mod:`clbench.evaluation.metrics`. Backbones
are clbench's names: ``vit_base_patch16_224.augreg_in21k`` for the papers' ViT-B/16-IN21K;
``vit_base_patch16_224`` for their ViT-B/16-IN1K (timm 0.6's ``vit_base_patch16_224``, IN-21k pre-training fine-tuned
on IN-1k; today's timm resolves the name to the ``augreg2`` fine-tune: close to, not the same as, the papers' weights).

:func:`published_for` finds the rows for one measured cell; :func:`command` is the ``clbench run`` that measures a
row's cell (with the method's default settings: a paper's own hyperparameters may differ, see the method's card).
Nothing here imports torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources

from clbench.core.catalog import BACKBONES, STRATEGIES
from clbench.errors import ClbenchError

STATUSES = ("verified", "secondary", "approximate", "missing")
FILE = "published.csv"


@dataclass(frozen=True)
class Published:
    """One published cell: a method's accuracy on a benchmark, split and backbone, with its source."""

    method: str  # clbench's strategy name
    benchmark: str  # clbench's benchmark name
    init_cls: int  # classes in the first task
    increment: int  # classes per later task
    backbone: str  # clbench's backbone name
    average: float | None  # average incremental accuracy, percent; None where the source gives none
    final: float | None  # accuracy after the last task, percent
    paper: str
    table: str
    source: str
    status: str

    @property
    def split(self) -> str:
        """The split as the literature writes it: B0 Inc10 when every task has the same classes."""
        return f"B0 Inc{self.increment}" if self.init_cls == self.increment else f"B{self.init_cls} Inc{self.increment}"


def _number(text: str, where: str) -> float | None:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ClbenchError(f"{where}: {text!r} is not a number") from None
    if not 0 <= value <= 100:
        raise ClbenchError(f"{where}: {value} is not an accuracy in percent")
    return value


def read(text: str, name: str = FILE) -> list[Published]:
    """The rows of a published table's CSV text, each checked: known method, benchmark and backbone, a split, a
    known status, accuracies in [0, 100] (empty exactly for a ``missing`` row)."""
    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks import BENCHMARKS

    rows = []
    for i, r in enumerate(csv.DictReader(text.splitlines()), start=2):
        where = f"{name} line {i}"
        try:
            STRATEGIES.check(r["method"])
            BENCHMARKS.get(r["benchmark"])
            BACKBONES.check(r["backbone"])
            row = Published(
                r["method"],
                r["benchmark"],
                int(r["init_cls"]),
                int(r["increment"]),
                r["backbone"],
                _number(r["average"], where),
                _number(r["final"], where),
                r["paper"],
                r["table"],
                r["source"],
                r["status"],
            )
        except (KeyError, ValueError) as e:
            raise ClbenchError(f"{where}: {type(e).__name__}: {e}") from None
        except ClbenchError as e:
            raise ClbenchError(f"{where}: {e}") from None
        if row.status not in STATUSES:
            raise ClbenchError(f"{where}: status {row.status!r} is not one of {', '.join(STATUSES)}")
        if (row.status == "missing") != (row.average is None and row.final is None):
            raise ClbenchError(f"{where}: a row has values exactly when its status is not 'missing'")
        rows.append(row)
    return rows


def load() -> list[Published]:
    """Every published row clbench carries."""
    return read((resources.files(__name__) / FILE).read_text(encoding="utf-8"))


def published_for(
    strategy: str, bench: str, split: tuple[int, int], backbone: str, rows: list[Published] | None = None
) -> list[Published]:
    """The published rows with values for ``strategy`` on ``bench`` with ``split`` = (init_cls, increment) and
    ``backbone``: what a measured row of that cell can be held against (several sources may report one cell)."""
    init_cls, increment = split
    return [
        r
        for r in (load() if rows is None else rows)
        if (r.method, r.benchmark, r.init_cls, r.increment, r.backbone)
        == (strategy, bench, init_cls, increment, backbone)
        and r.status != "missing"
    ]


def split_of(task_sizes: list[int]) -> tuple[int, int]:
    """(init_cls, increment) of a class-incremental run's task sizes (the last task may be smaller)."""
    return task_sizes[0], task_sizes[1] if len(task_sizes) > 1 else task_sizes[0]


def beside(records, rows: list[Published] | None = None) -> list[dict[str, object]]:
    """One row per measured cell that has a published value: the cell, the mean measured average and final
    accuracy over its records (percent; the main protocol's), the number of seeds, and each published value with its
    source. ``records``: :class:`~clbench.records.schema.RunRecord` objects (or objects with a ``record``), such as a
    report's runs. Domain-incremental records are left out (no published row is domain-incremental)."""
    rows = load() if rows is None else rows
    cells: dict[tuple[str, str, tuple[int, int], str], list] = {}
    for r in records:
        rec = getattr(r, "record", r)
        if (rec.scenario or "class") != "class" or not rec.task_sizes:
            continue
        cells.setdefault((rec.strategy, rec.bench, split_of(list(rec.task_sizes)), rec.backbone), []).append(rec)
    out: list[dict[str, object]] = []
    for (strategy, bench, split, backbone), recs in sorted(cells.items()):
        avg = [x.avg_acc for x in recs if x.avg_acc is not None]
        final = [x.last_acc for x in recs if x.last_acc is not None]
        for p in published_for(strategy, bench, split, backbone, rows):
            out.append(
                {
                    "method": strategy,
                    "benchmark": bench,
                    "split": p.split,
                    "backbone": backbone,
                    "seeds": len(recs),
                    "measured average": round(sum(avg) / len(avg), 2) if avg else None,
                    "published average": p.average,
                    "measured final": round(sum(final) / len(final), 2) if final else None,
                    "published final": p.final,
                    "published in": f"{p.paper}, {p.table} ({p.status})",
                }
            )
    return out


def command(row: Published) -> str:
    """The ``clbench run`` that measures ``row``'s cell (on a machine with the data at DIR, the weights and a GPU)."""
    out = f"runs/published/{row.method}-{row.benchmark}-b{row.init_cls}-inc{row.increment}"
    return (
        f"clbench run --strategy {row.method} --bench {row.benchmark} --data-root DIR --init-cls {row.init_cls} "
        f"--increment {row.increment} --backbone {row.backbone} --device cuda --out {out}"
    )


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(rows: list[Published], commands: bool = False) -> str:
    """The rows as a plain-text table (Markdown pipes, so that it pastes into a report), with the command that
    measures each cell where ``commands``."""
    head = ["method", "benchmark", "split", "backbone", "average", "final", "status", "paper, table"]
    lines = [head]
    for r in rows:
        lines.append(
            [
                r.method,
                r.benchmark,
                r.split,
                r.backbone,
                _cell(r.average),
                _cell(r.final),
                r.status,
                f"{r.paper}, {r.table}" if r.table else r.paper,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if commands:
        measured = sorted({command(r) for r in rows}, key=lambda c: c.split())
        text += ["", f"the clbench commands that measure these {len(measured)} cells:"] + measured
    text += ["", "sources:"] + [f"  {r.method} {r.benchmark} {r.split}: {r.source}" for r in rows]
    return "\n".join(text)


def cmd_published(args) -> int:
    """``clbench published [--method M] [--bench B] [--commands]``."""
    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks import BENCHMARKS

    if args.method:
        STRATEGIES.check(args.method)
    if args.bench:
        BENCHMARKS.get(args.bench)
    rows = [r for r in load() if args.method in (None, r.method) and args.bench in (None, r.benchmark)]
    print(format_table(rows, commands=args.commands))
    return 0


def add_published_args(p) -> None:
    p.add_argument("--method", help="only this strategy's rows")
    p.add_argument("--bench", help="only this benchmark's rows")
    p.add_argument(
        "--commands", action="store_true", help="also print the clbench command that measures each published cell"
    )
