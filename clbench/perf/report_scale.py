"""``clbench perf report-scale``: the time and peak memory of ``clbench report`` on the committed study and on a
results folder of synthetic records (1,000 by default), each in a fresh process.

The synthetic records (:func:`synthetic_records`) are copies of the micro-ViT fixture records
(``tests/fixtures/records``) with new run ids, seeds and, for TOSCA, other ``epochs`` (budget variants): a results
folder the size of a long study, written in a second into a temporary folder and never committed. The test
``tests/test_report_scale.py`` uses the same helper to check that a report on 1,000 of them keeps the section
structure of a report on 60.

Wall-clock, user and system CPU seconds and the peak resident set size come from the report process's own resource
usage (``os.wait4``); the machine's load average is written before and after, since the wall-clock of a shared
machine is only as good as its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from clbench.core.precision import CpuInfo
from clbench.errors import ClbenchError
from clbench.perf import arg, bounded, measurement
from clbench.records.host import git_revision

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "records"
STUDY = (REPO / "reports" / "emoji" / "runs", REPO / "reports" / "emoji-table.yaml")  # the committed study
RECORDS_MAX = 10_000  # synthetic records of ~15 KB each: 150 MB in the temporary folder at most
TARGETS = {"study_s": 60, "study_mb": 2048, "synthetic_s": 300}  # issue 39: < 60 s and < 2 GB; 1,000 in < 5 min


# The records the synthetic ones are copied from: one repeated at new seeds, one at new seeds and budgets (its
# strategy setting BUDGET_SETTING set to 1, 2, ...); their strategies are read from the records themselves
SEED_BASE = FIXTURES / "simplecil/sc-s1993"
BUDGET_BASE = FIXTURES / "tosca/tosca-s1993"
BUDGET_SETTING = "epochs"


def synthetic_records(dest: Path, n: int, variants: int = 20) -> Path:
    """``n`` complete records under ``dest``: SEED_BASE's strategy at new seeds (a tenth of them) and BUDGET_BASE's at
    ``variants`` budgets (its own, then BUDGET_SETTING = 1, 2, ...) times new seeds; no features (``--no-tsne``)."""
    missing = [str(p) for p in (SEED_BASE, BUDGET_BASE) if not (p / "result.json").is_file()]
    if missing:
        raise ClbenchError(
            f"the fixture records synthetic records are copied from are missing: {', '.join(missing)}",
            "run this from a clbench checkout (the fixtures are in tests/fixtures/records, not in the installed "
            "package)",
        )
    seeded, budgeted = (json.loads((p / "result.json").read_text()) for p in (SEED_BASE, BUDGET_BASE))
    dest.mkdir(parents=True, exist_ok=True)
    n_seeded = max(1, n // 10)
    for i in range(n):
        rec = json.loads(json.dumps(seeded if i < n_seeded else budgeted))
        if i < n_seeded:
            seed, tag = 3000 + i, ""
        else:
            j = i - n_seeded
            variant, seed = j % variants, 3000 + j // variants
            if variant:
                rec["strategy_config"][BUDGET_SETTING] = variant
            tag = f"-e{variant}" if variant else ""
        rec["seed"] = seed
        rec["run_id"] = f"{rec['strategy']}{tag}-s{seed}"
        folder = dest / rec["run_id"]
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps(rec))
    return dest


class _TreePeak(threading.Thread):
    """The largest summed RSS of process ``pid`` and its descendants, sampled until :attr:`stop` is set."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self.stop.wait(0.05):
            try:
                procs = [root, *root.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
            except psutil.Error:
                continue


def timed_report(args: list[str]) -> dict[str, Any]:
    """``clbench report ARGS`` in a fresh process: exit code, wall-clock, CPU seconds, peak RSS (its own) and the
    peak RSS of it and its t-SNE workers together."""
    argv = [sys.executable, "-c", "import sys; from clbench.cli import entry; sys.argv[0] = 'clbench'; entry()"]
    start = time.perf_counter()
    proc = subprocess.Popen([*argv, "report", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree = _TreePeak(proc.pid)
    tree.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # SIGTERM (clbench.perf.stopped_cleanly), Ctrl-C: no report left writing into the folder
        tree.stop.set()
        proc.kill()
        proc.wait()
        raise
    wall = time.perf_counter() - start
    tree.stop.set()
    tree.join()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit_code": proc.returncode,
        "wall_s": round(wall, 2),
        "cpu_user_s": round(usage.ru_utime, 2),
        "cpu_system_s": round(usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        # the report and its t-SNE worker processes together, sampled every 50 ms
        "peak_tree_rss_mb": round(tree.peak / 2**20),
        **({"stderr_tail": err[-2000:]} if proc.returncode else {}),
    }


def report_scale(n_synthetic: int = 1000, log=print) -> dict[str, Any]:

    if not 1 <= n_synthetic <= RECORDS_MAX:
        raise ClbenchError(f"{n_synthetic:,} synthetic records: the bound is 1 to {RECORDS_MAX:,}", "e.g. 1000")
    rows = []
    with tempfile.TemporaryDirectory(prefix="clbench-report-scale-") as tmp:
        runs, study = STUDY
        n_study = sum(1 for _ in runs.rglob("result.json"))
        cases = [
            (
                f"the committed study ({n_study} records)",
                n_study,
                [str(runs), "--study", str(study), "--out", f"{tmp}/study"],
            ),
            (
                f"{n_synthetic} synthetic records",
                n_synthetic,
                [str(synthetic_records(Path(tmp) / "synthetic", n_synthetic)), "--no-tsne", "--out", f"{tmp}/synth"],
            ),
        ]
        for what, n, args in cases:
            log(f"clbench report: {what} ...")
            before = os.getloadavg()
            row = {"what": what, "records": n, "command": "clbench report " + " ".join(_shown(a, tmp) for a in args)}
            row |= timed_report(args)
            row["load_average_before"] = [round(x, 2) for x in before]
            row["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            log(f"  {row['wall_s']} s, {row['peak_rss_mb']} MB peak, exit {row['exit_code']}")
            rows.append(row)
    cpu = CpuInfo.detect()
    return {
        "benchmark": "report-scale",
        "targets": TARGETS,
        "cpu": cpu.model,
        "cpu_capability": cpu.capability,
        "cpus": os.cpu_count(),
        "git_revision": git_revision(),
        "memory": "peak_rss_mb: peak resident set size (ru_maxrss) of the report process; peak_tree_rss_mb: the report "
        "and its t-SNE worker processes, summed, sampled every 50 ms",
        "rows": rows,
    }


def _shown(arg: str, tmp: str) -> str:
    """A path as the command line shows it: the repository's relative, the temporary folder as TMP."""
    if arg.startswith(tmp):
        return "TMP" + arg[len(tmp) :]
    return os.path.relpath(arg, REPO) if arg.startswith(str(REPO)) else arg


@measurement(
    "report-scale",
    help="`clbench report` on the committed study and on synthetic records (1,000 by default): wall-clock, CPU and "
    "peak memory of each, in fresh processes",
    args=(
        arg(
            "--records",
            type=bounded("--records", 1, RECORDS_MAX, "each is a record folder written to the temporary folder"),
            default=1000,
            help=f"synthetic records (default: 1000, at most {RECORDS_MAX:,})",
        ),
    ),
)
def _report_scale(flags: argparse.Namespace) -> dict[str, Any]:
    return report_scale(int(flags.records))
