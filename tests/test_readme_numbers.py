"""The README's results table is read from committed records, not typed in: every row names its record here, and
each number (precision, final and average incremental accuracy, forgetting, added and trainable parameters) must
equal what the record says, rounded as printed. A re-run record that moves a number fails this test until the
README follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from clbench.results import load_record

ROOT = Path(__file__).resolve().parent.parent
RUNS = "reports/emoji/runs/fp32"

# first words of the row label -> (record folder, protocol or "router:NAME")
ROWS = {
    "SimpleCIL": (f"{RUNS}/simplecil", "per-sample"),
    "TOSCA (per-sample": (f"{RUNS}/tosca", "per-sample"),
    "TOSCA, `reference` protocol": (f"{RUNS}/tosca", "reference"),
    "TOSCA, `--set router=mahalanobis-task`": ("reports/routing/emoji/tosca-l1-5e-4", "router:mahalanobis-task"),
    "RanPAC (`quick`": (f"{RUNS}/ranpac-quick", "per-sample"),
    "RanPAC, no first-session": (f"{RUNS}/ranpac-quick-no-phase1", "per-sample"),
    "APER": (f"{RUNS}/aper-quick", "per-sample"),
    "MOS": (f"{RUNS}/mos-quick", "per-sample"),
    "EASE": (f"{RUNS}/ease-quick", "per-sample"),
    "L2P": (f"{RUNS}/l2p-quick", "per-sample"),
    "DualPrompt": (f"{RUNS}/dualprompt-quick", "per-sample"),
}


def table_rows(text: str | None = None) -> list[list[str]]:
    """The cells of the README table whose header starts with ``strategy (profile)``."""
    lines = (text if text is not None else (ROOT / "README.md").read_text()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| strategy (profile)"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def row_key(label: str) -> str:
    keys = [k for k in ROWS if label.startswith(k)]
    assert len(keys) == 1, f"README row {label!r} matches {keys or 'no entry'} of ROWS: name its record there"
    return keys[0]


def expected(folder: str, what: str) -> list[str]:
    """The row's cells after the label, as the README prints them, from the record."""
    rec = load_record(ROOT / folder)
    if what.startswith("router:"):
        curve = [float(t.diagnostics["routers"][what[7:]]["acc"]) for t in rec.per_task]
        final, avg, forgetting = curve[-1], sum(curve) / len(curve), None
    else:
        s = rec.summary(what)
        final, avg, forgetting = s.last_acc, s.avg_acc, s.forgetting
    return [
        rec.precision,
        f"{final:.2f}",
        f"{avg:.2f}",
        "" if forgetting is None else f"{forgetting:.2f}",
        f"{rec.params.added_total:,}",
        f"{rec.params.trainable:,}",
    ]


def test_every_row_names_a_record_and_every_record_has_a_row():
    keys = [row_key(r[0]) for r in table_rows()]
    assert sorted(keys) == sorted(ROWS)


@pytest.mark.parametrize("label", list(ROWS))
def test_row_equals_its_record(label):
    row = next(r for r in table_rows() if row_key(r[0]) == label)
    assert row[1:] == expected(*ROWS[label]), f"README row {row[0]!r} differs from {ROWS[label][0]}"


def test_a_changed_number_is_caught():
    """The check can fail: the MOS row's final accuracy moved by 0.01 in the README text no longer equals its record."""
    text = (ROOT / "README.md").read_text()
    row = next(r for r in table_rows(text) if row_key(r[0]) == "MOS")
    line = next(line for line in text.splitlines() if line.startswith(f"| {row[0]} |"))
    changed = text.replace(line, line.replace(f"| {row[2]} |", f"| {float(row[2]) + 0.01:.2f} |", 1))
    mos = next(r for r in table_rows(changed) if row_key(r[0]) == "MOS")
    assert mos[1:] != expected(*ROWS["MOS"]) and row[1:] == expected(*ROWS["MOS"])
