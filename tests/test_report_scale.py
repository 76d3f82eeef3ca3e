"""Scale of ``clbench report`` (issue 39, item 6): a helper that writes many synthetic records, and the check that a
report on 1,000 of them keeps the same section structure (full tier: minutes on 2 cores).

The synthetic records are copies of the micro-ViT fixtures (tests/fixtures/records) with new run ids, seeds and,
for TOSCA, another ``epochs`` (a budget variant): a results folder the size of a long study, made in a second and
never committed. The time and memory of the report on the committed 95 records are measured in
``reports/perf/report-scale.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "records"


def synthetic_records(dest: Path, n: int, variants: int = 20) -> Path:
    """``n`` complete records under ``dest``: SimpleCIL at new seeds (a tenth of them) and TOSCA at ``variants``
    budgets (epochs 20, the default, then 1, 2, ...) times new seeds; no features (``--no-tsne``)."""
    bases = {"simplecil": FIXTURES / "simplecil" / "sc-s1993", "tosca": FIXTURES / "tosca" / "tosca-s1993"}
    records = {k: json.loads((p / "result.json").read_text()) for k, p in bases.items()}
    dest.mkdir(parents=True, exist_ok=True)
    n_sc = max(1, n // 10)
    for i in range(n):
        strategy = "simplecil" if i < n_sc else "tosca"
        rec = json.loads(json.dumps(records[strategy]))
        if strategy == "simplecil":
            seed, tag = 3000 + i, ""
        else:
            j = i - n_sc
            variant, seed = j % variants, 3000 + j // variants
            if variant:
                rec["strategy_config"]["epochs"] = variant
            tag = f"-e{variant}" if variant else ""
        rec["seed"] = seed
        rec["run_id"] = f"{strategy}{tag}-s{seed}"
        folder = dest / rec["run_id"]
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps(rec))
    return dest


def test_synthetic_records_are_complete_and_distinct(tmp_path):
    from clbench.report.collect import collect

    coll = collect([synthetic_records(tmp_path / "runs", 60, variants=4)])
    assert len(coll.runs) == 60 and not coll.skipped
    assert not any(r.repeat_of for r in coll.runs)  # every record is its own seed of its own variant
    assert len({r.variant for r in coll.runs}) == 5  # simplecil + tosca at 4 budgets


@pytest.mark.full  # 1,000 records: minutes on 2 cores
def test_a_report_on_1000_records_keeps_its_section_structure(tmp_path):
    from clbench.report.build import write_report
    from clbench.report.collect import collect

    small = write_report(collect([synthetic_records(tmp_path / "a", 60)]), tmp_path / "ra", with_tsne=False)
    large = write_report(collect([synthetic_records(tmp_path / "b", 1000)]), tmp_path / "rb", with_tsne=False)

    def structure(out: Path) -> list[str]:
        manifest = json.loads((out / "report.json").read_text())
        return [s["kind"] for s in manifest["study"]["sections"]] + sorted(f["name"] for f in manifest["figures"])

    assert structure(small.out_dir) == structure(large.out_dir)
    board = json.loads((large.out_dir / "report.json").read_text())["study"]["leaderboard"]
    assert [row["method"] for row in board] and len(board) <= 4  # the main table stays the comparison
    shutil.rmtree(tmp_path / "b")
