"""The figures of one run that experiment trackers upload next to its record (``--log``): its accuracy curve and
accuracy matrices. The trackers (:mod:`clbench.run.trackers`) import nothing of the report: the commands that make
a :class:`~clbench.run.trackers.TrackerHub` (``clbench run``, ``clbench export``, a sweep's worker) hand it
:func:`run_figures`.
"""

from __future__ import annotations

from pathlib import Path

from clbench.records.schema import RunRecord
from clbench.report.collect import Collection, Run
from clbench.report.figures.curves import accuracy_curves
from clbench.report.figures.matrices import accuracy_matrices


def run_figures(record: RunRecord, run_dir: Path, out: Path) -> list[Path]:
    """The PNG files of ``record``'s accuracy curve and matrices (the run in ``run_dir``), written under ``out``."""
    coll = Collection(runs=[Run(run_dir, record, record.run_id, record.strategy)])
    figs = [accuracy_curves(coll, out), *accuracy_matrices(coll, out)]
    return [out / f.files["png"] for f in figs if f is not None and "png" in f.files]
