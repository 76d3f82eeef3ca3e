"""Scale of ``clbench report`` (issue 39, item 6): a helper that writes many synthetic records, and the check that a
report on 1,000 of them keeps the same section structure (full tier: minutes on 2 cores).

The synthetic records (:func:`clbench.perf.report_scale.synthetic_records`) are copies of the micro-ViT fixtures
(tests/fixtures/records) with new run ids, seeds and, for TOSCA, another ``epochs`` (a budget variant): a results
folder the size of a long study, made in a second and never committed. The time and memory of the report on the
committed study and on 1,000 synthetic records are measured by ``clbench perf report-scale`` in
``reports/perf/report-scale.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clbench.perf.report_scale import synthetic_records


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
