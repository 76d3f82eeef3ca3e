"""`.ci/gpu`'s mechanics (.ci/gpu.py), fast: the plan, the driver's budget, skips and outputs on stand-in
steps, and the CUDA-against-CPU comparison on made-up run summaries. The dry run itself (every real step on the CPU
at toy sizes) is a step of .ci/run."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clbench.core.catalog import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    """``.ci/gpu.py``, a script outside the package, as a module (registered, so that its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location("ci_gpu", ROOT / ".ci" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpu = _load_script()


def test_the_plan_runs_every_ci_profile_and_fits_its_budget():
    runs = gpu.ci_runs(gpu.GPU)
    assert {s for _, s, _ in runs} == set(STRATEGIES.names())  # every strategy, also one without a ci profile
    assert ("tosca-ci-augment", "tosca", "ci-augment") in runs
    for sizes in (gpu.GPU, gpu.DRY):
        steps = gpu.plan(sizes)
        assert [s.name for s in steps] == ["ci-cpu", "tests", "ci-device", "projection", "speed", "compare"]
        assert all(s.estimate_s > 0 for s in steps)
        assert sum(s.estimate_s for s in steps if not s.background) < sizes.budget_s
        assert all("{out}" in " ".join(s.argv) for s in steps if s.name != "tests" or sizes is gpu.GPU)
        text = gpu.format_plan(steps, sizes)
        assert all(s.name in text for s in steps) and "total" in text
    assert gpu.GPU.budget_s < 480  # stops itself before 8 minutes
    first = STRATEGIES.names()[:2]  # the dry run: the first two registered strategies' ci profiles
    assert gpu.ci_runs(gpu.DRY) == [(f"{n}-ci", n, "ci") for n in first]


def test_gpu_folder_name():
    assert gpu.gpu_folder_name("NVIDIA H200") == "nvidia-h200"
    assert gpu.gpu_folder_name("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    assert gpu.gpu_folder_name("") == "unknown"


def _step(name: str, code: str, **kw) -> gpu.Step:
    return gpu.Step(name, name, [sys.executable, "-c", code], 1.0, **kw)


def test_drive_keeps_going_stops_at_the_budget_and_says_what_it_skipped(tmp_path):
    sizes = dataclasses.replace(gpu.DRY, budget_s=12.0)
    steps = [
        _step("bg", "open(r'{out}/bg', 'w').write('x')", background=True),
        _step("fails", "raise SystemExit(3)"),
        _step("slow", "import time; time.sleep(30)"),
        _step("late", "pass"),
        _step("needs-bg", "pass", needs=("bg",)),
        _step("always", "pass", always=True),  # reads JSON only: runs after the budget, its seconds kept back
    ]
    rc = gpu.drive(tmp_path, sizes, steps, log=lambda _m: None)
    assert rc == 1
    status = {s.name: s.status for s in steps}
    assert status == {
        "bg": "ok",
        "fails": "failed",
        "slow": "timed out",
        "late": "skipped",
        "needs-bg": "skipped",
        "always": "ok",
    }
    assert (tmp_path / "bg").read_text() == "x"  # {out} is the output folder
    record = json.loads((tmp_path / "gpu.json").read_text())
    assert record["skipped"] == ["late", "needs-bg"] and record["mode"] == "dry-run"
    assert record["elapsed_s"] < 20
    summary = (tmp_path / "summary.txt").read_text()
    assert "SKIPPED: late, needs-bg" in summary and "slow timed out" in summary
    assert (tmp_path / "logs" / "fails.log").exists()


def _runs(path: Path, device: str, runs: dict) -> None:
    path.mkdir(parents=True)
    (path / "runs.json").write_text(json.dumps({"device": device, "runs": runs}))


def _run(matrix, last, params=None) -> dict:
    return {"matrices": {"per-sample": matrix}, "last_acc": last, "params": params or {"trainable": 5}}


def test_compare_cuda_against_cpu(tmp_path):
    ci = tmp_path / "ci"
    _runs(
        ci / "reference-cpu-fp32",
        "cpu",
        {"a": _run([[50.0], [40.0, 30.0]], 35.0), "b": _run([[50.0]], 50.0), "c": _run([[50.0]], 50.0)},
    )
    tol = gpu.MATRIX_TOL
    _runs(
        ci / "device-fp32",
        "cuda",
        {
            "a": _run([[50.0], [40.0 + tol, 30.0]], 35.0),  # at the tolerance: agrees
            "b": _run([[50.0 + tol + 0.1]], 50.0),  # beyond it
            "c": _run([[50.0]], 50.0, {"trainable": 6}),  # parameters must be exact
            "d": {"error": "RuntimeError: CUDA error"},
        },
    )
    _runs(ci / "device-bf16", "cuda", {"a": _run([[49.0], [40.0, 29.0]], 34.5)})
    r = gpu.compare(tmp_path)
    assert r["compared"] == 4 and r["passed"] == 1 and r["failed"] == ["b", "c", "d"]
    assert r["max_abs_diff"] == pytest.approx(tol + 0.1)
    assert r["runs"]["c"]["params_equal"] is False and "CUDA error" in r["runs"]["d"]["why"]
    assert r["bf16"]["a"]["last_acc_diff"] == pytest.approx(-0.5)
    assert json.loads((tmp_path / "correctness.json").read_text()) == r


def test_the_script_parses_and_prints_its_plan():
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "gpu")], check=True)
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "gpu.py"), "drive", "--plan", "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out.startswith("plan (dry-run") and "ci-device" in out
