"""``.ci/gpu``: everything CUDA-specific, checked and measured in one prepared command on one GPU, and its
``--dry-run`` (the same steps on the CPU at toy sizes, run by ``.ci/run`` so that the script cannot rot).

It lives beside ``.ci/gpu`` and outside the library: nothing a user imports needs it. The steps (:func:`plan`), each
a subprocess of ``python .ci/gpu.py STEP`` (or pytest) with the time left as its timeout, so that one CUDA failure or
overrun costs one step and the rest still report:

- ``tests``: the contract tests (``tests/test_contract.py``: their runs take ``--device auto``, i.e. CUDA where
  present) and the golden tests (``tests/test_reference_golden.py``; its ``ctx_for`` builds a CPU context, so on
  a GPU machine they show the fixtures still load and hold there, not the CUDA kernels: the per-strategy comparison
  below is the CUDA check).
- ``ci-cpu`` (started first, in the background, on half the cores) and ``ci-device``: every registered strategy
  in each of its ``ci`` profiles on the micro ViT (random weights, seed 1993, both protocols where the strategy has
  two), fp32 on the CPU; fp32, then bf16 autocast, on CUDA. ``compare`` (last; it reads JSON only, so it runs even
  when the budget is spent) checks CUDA fp32 against the CPU (:data:`MATRIX_TOL` points per accuracy-matrix cell,
  parameter counts exact) and records the bf16 - fp32 accuracy difference on CUDA (recorded, not checked).
- ``projection`` (before ``speed``, so that an overrun of the longest step cannot cost it):
  :func:`clbench.perf.projection.measure_costs` on the device at the extraction batch, and the paper table priced
  from it (:func:`clbench.perf.projection.projection`).
- ``speed``: feature extraction img/s through :func:`clbench.features.cache.extract` (clbench's loader, eval transform,
  ``num_workers=0`` as a run uses it) against the limit, a bare forward of the same model at the same batch on a
  resident random batch (:func:`clbench.core.precision.throughput`); :func:`clbench.perf.train_step.step_ratio` of every
  strategy that trains through the ViT against a bare forward + backward; both at ViT-B/16 @ 224 (the paper's
  backbone) and ViT-S/14 @ 112 (clbench's default), random weights, fp32 and bf16; the data pipeline's
  decode + augment img/s of the embedded benchmark's training images at 224 px, in the main process (as runs load
  today) and with one DataLoader worker per core.

The plan printed first prices each step with the projection's cost model (its card's ``work``
of each run's shape) at assumed per-image costs of a current data-centre GPU (:class:`GpuCosts`), plus a fixed
overhead per process and per run; the results keep each step's estimate beside its measured seconds, so the next
plan can be recalibrated from a real one. Everything is written as JSON under the output folder, with
``summary.txt`` (the one-screen summary, also printed) and ``gpu.json`` (steps, seconds, skipped).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clbench.core.catalog import STRATEGIES
from clbench.files.atomic import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a script's path starts at .ci/: the tree's clbench first, whatever else is installed
    sys.path.insert(0, str(ROOT))

from clbench.core.catalog import DEFAULT_STRATEGY  # noqa: E402
from clbench.errors import ClbenchError  # noqa: E402  (after the tree is on the path)

SEED = 1993
MATRIX_TOL = 2.0  # accuracy points per matrix cell, CUDA fp32 against CPU fp32: float32 kernels differ in summation
# order, and SGD on a random micro ViT amplifies last-digit differences into a few flipped test images (one test image
# of the ci split is 0.09-0.28 points, so 2.0 is 7-22 images); a wrong CUDA path moves cells by tens of points.
GPU_BUDGET_S = 440.0  # the steps' budget: with the wheel install and the driver's imports before it, under 8 minutes
DRY_BUDGET_S = 300.0  # the dry run in .ci/run: 1.5-3.5 minutes on the 2-core CI machine (idle to load 16)
PAPER_BACKBONE = ("vit_base_patch16_224", 224)
DEFAULT_BACKBONE = ("vit_small_patch14_dinov2", 112)
MICRO = ("vit_micro", 32)


@dataclass(frozen=True)
class GpuCosts:
    """Assumed costs on a current data-centre GPU (H100/H200 class), for the plan only; the run measures the real
    ones. ViT-B/16 @ 224 is about 17.6 GMAC per image: at ~40 TFLOP/s sustained in true fp32 (torch leaves TF32 off
    for matmuls) ~0.9 ms, at ~250 TFLOP/s in bf16 ~0.15 ms plus overheads; a training pass ~3 forward passes (the
    backward costs about two). Other backbones scale by depth x tokens x width^2, but never below ``floor_s`` per
    image (small models are launch-bound at these batches)."""

    f_fp32_s: float = 1.0e-3  # ViT-B/16 @ 224, frozen forward, per image (estimate above)
    f_bf16_s: float = 0.25e-3  # the same in bf16 autocast (estimate above)
    b_over_f: float = 3.0  # forward + backward over forward (the usual 1 + 2 of a ViT)
    floor_s: float = 2.0e-5  # per image: kernel-launch bound micro ViT at batch 16-64 (estimate)
    process_s: float = 6.0  # one python process: imports of torch, timm, Avalanche, CUDA context
    run_s: float = 1.5  # one harness run beyond its passes: benchmark load, backbone build, evaluation loop, record
    decode_img_s: float = 2.0e-4  # decode + resize + augment one emoji image at 224 px on one core (PIL, measured
    # on a 2-core EPYC at 0.5-1 ms/image under load; a data-centre core is faster)

    def per_image(self, backbone: tuple[str, int], precision: str = "fp32") -> float:
        """Frozen forward seconds per image of ``backbone`` at its input size, from the ViT-B/16 reference."""
        depth, width, patch = _SHAPES.get(backbone[0], (12, 768, 16))
        tokens = (backbone[1] // patch) ** 2 + 1
        scale = depth * tokens * width**2 / (12 * 197 * 768**2)
        base = self.f_bf16_s if precision == "bf16" else self.f_fp32_s
        return max(self.floor_s, base * scale)


_SHAPES = {  # depth, width, patch of the backbones the plan prices
    "vit_base_patch16_224": (12, 768, 16),
    "vit_small_patch14_dinov2": (12, 384, 14),
    "vit_micro": (4, 64, 4),
}


@dataclass(frozen=True)
class Sizes:
    """What one mode runs: the real GPU check (:data:`GPU`) or the dry run (:data:`DRY`)."""

    name: str
    device: str  # the device the CUDA steps use: cuda, or cpu in the dry run
    budget_s: float  # the whole command stops itself before this
    test_args: tuple[str, ...]  # pytest arguments of the tests step
    ci_strategies: tuple[str, ...] | None  # None: every registered strategy
    ci_profiles: tuple[str, ...] | None = None  # None: every profile named ci or ci-*
    ci_backbone: tuple[str, int] = MICRO
    speed_backbones: tuple[tuple[str, int], ...] = (PAPER_BACKBONE, DEFAULT_BACKBONE)
    step_strategies: tuple[str, ...] | None = None  # train-step; None: every strategy that trains through the ViT
    precisions: tuple[str, ...] = ("fp32", "bf16")  # feature extraction
    ci_precisions: tuple[str, ...] = ("fp32", "bf16")  # the ci runs on the device
    step_precisions: tuple[str, ...] = ("fp32", "bf16")  # train-step
    extract_images: int = 2048  # random images through clbench's extraction per (backbone, precision)
    batch: int = 64  # extraction and projection batch (clbench's --batch-size default)
    data_images: int = 1024  # emoji training images decoded and augmented per pipeline setting
    data_img_size: int = 224
    limit_seconds: float = 2.0  # the bare forward limit runs this long
    steps: int = 4  # timed train steps per strategy and setting
    projection_backbone: tuple[str, int] = PAPER_BACKBONE
    projection_strategies: tuple[str, ...] | None = None  # None: every registered strategy
    # the dry run's lists: the first N registered strategies of each list above (generic code names no method)
    ci_limit: int | None = None
    step_limit: int | None = None
    projection_limit: int | None = None


GPU = Sizes(
    "gpu",
    "cuda",
    GPU_BUDGET_S,
    ("tests/test_contract.py", "tests/test_reference_golden.py"),
    None,
)
DRY = Sizes(
    "dry-run",
    "cpu",
    DRY_BUDGET_S,
    ("tests/test_contract.py", "-k", f"test_session_contract and {DEFAULT_STRATEGY}"),
    None,
    ci_limit=2,
    ci_profiles=("ci",),
    # bf16 on this CPU would compute the benchmark's features anew (minutes on AVX2): the dry run's bf16 is the
    # extraction's, on random images; the comparison's bf16 part is tests/test_gpu_script.py's
    ci_precisions=("fp32",),
    step_precisions=("fp32",),
    speed_backbones=(MICRO,),
    step_limit=1,
    extract_images=128,
    batch=32,
    data_images=64,
    data_img_size=32,
    limit_seconds=0.3,
    steps=1,
    projection_backbone=MICRO,
    projection_limit=2,
)


# ----------------------------------------------------------------------------------------------- the plan
@dataclass
class Step:
    """One step of the command: ``argv`` run as a subprocess (``{out}`` replaced by the output folder)."""

    name: str
    what: str
    argv: list[str]
    estimate_s: float
    background: bool = False  # started at once, waited for before the steps that need it
    needs: tuple[str, ...] = ()
    always: bool = False  # runs even when the budget is spent (reads JSON only: seconds); its estimate is reserved
    measured_s: float | None = None
    status: str = "planned"  # planned | ok | failed | timed out | skipped
    detail: str = ""


def ci_runs(sizes: Sizes) -> list[tuple[str, str, str | None]]:
    """(folder name, strategy, profile) of every ci-profile run of :func:`run_ci`."""
    out = []
    for name in (sizes.ci_strategies or tuple(STRATEGIES.names()))[: sizes.ci_limit]:
        profiles = [
            p
            for p in STRATEGIES.get(name).profiles
            if (p == "ci" or p.startswith("ci-")) and (sizes.ci_profiles is None or p in sizes.ci_profiles)
        ]
        for profile in profiles or [None]:
            out.append((f"{name}-{profile or 'default'}", name, profile))
    return out


def _ci_estimate(sizes: Sizes, costs: GpuCosts, precision: str, on_cpu: bool = False) -> float:
    """Seconds of every ci run of ``sizes`` on the micro ViT from each strategy's work on the ci split."""
    # deferred: loads torch, which importing this module does not
    from clbench.core.catalog import STRATEGIES, card
    from clbench.core.config import make_strategy_config
    from clbench.methods.contract import RunShape

    # the embedded benchmark's ci split: 36 classes in 3 tasks of 12, ~90 train and ~30 test images a class
    shape = RunShape.equal(3262, 1090, 3, tokens=197, classes_per_task=(12, 12, 12), train_per_class=8)
    f = costs.per_image(sizes.ci_backbone, precision) * (20 if on_cpu else 1)  # a CPU core is ~20x a GPU here
    total = 0.0
    for _, name, profile in ci_runs(sizes):
        cls = STRATEGIES.get(name)
        try:
            w = card(name).cost(make_strategy_config(cls, profile, ()), shape)
            passes = w.f + costs.b_over_f * w.b
        except NotImplementedError:
            passes = shape.train_per_task[0] * 3 + sum(shape.test_seen)
        total += costs.run_s + passes * f * (len(cls.protocols) if len(cls.protocols) > 1 else 1)
    return costs.process_s + total


def step_strategies(sizes: Sizes) -> tuple[str, ...]:
    """The strategies whose train step the speed step times: every one that trains through the ViT (or the list
    given), the first ``step_limit`` of them in a dry run."""
    names = sizes.step_strategies or tuple(n for n in STRATEGIES.names() if STRATEGIES.get(n).needs_vit)
    return names[: sizes.step_limit]


def _speed_estimate(sizes: Sizes, costs: GpuCosts) -> float:

    names = step_strategies(sizes)
    total = costs.process_s + sizes.data_images * costs.decode_img_s * 3  # main process + workers start
    emoji_images = 3262 + 1090
    for bb in sizes.speed_backbones:
        for p in sizes.precisions:
            total += sizes.extract_images * costs.per_image(bb, p) + sizes.limit_seconds + 2.0  # + model build
        for p in sizes.step_precisions:
            f = costs.per_image(bb, p)
            total += emoji_images * (f + costs.decode_img_s)  # the benchmark's features, once per setting
            # every strategy: its session, warm-up and timed steps (each with one limit pass), batch ~32-48
            total += len(names) * (costs.run_s + (2 + 2 * sizes.steps) * 48 * costs.b_over_f * f)
    return total


def plan(sizes: Sizes, costs: GpuCosts = GpuCosts()) -> list[Step]:
    """The steps of ``sizes``, priced at ``costs`` (the GPU estimate even in the dry run: the plan a GPU will
    see is what the dry run checks)."""
    py = [sys.executable, str(Path(__file__).resolve())]
    mode = ["--mode", sizes.name]
    cpu_ci = _ci_estimate(sizes, costs, "fp32", on_cpu=True)
    proj = costs.process_s + 2 * 8 * sizes.batch * costs.per_image(sizes.projection_backbone) * (1 + costs.b_over_f)
    n_tests = 2 * 13 + 30 if sizes is GPU else 2
    return [
        Step(
            "ci-cpu",
            "every ci profile on the micro ViT, fp32, CPU (the reference the CUDA runs are checked against)",
            [*py, "ci", "--device", "cpu", "--precision", "fp32", "--reference", "--out", "{out}/ci", *mode],
            cpu_ci,
            background=True,
        ),
        Step(
            "tests",
            "contract tests (their runs on --device auto) and golden tests (fp32)",
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",  # pyproject's addopts ask for pytest-xdist (its wheel travels with the others): one process
                "0",
                *sizes.test_args,
                "--junitxml",
                "{out}/tests.xml",
            ],
            costs.process_s + n_tests * (costs.run_s + 0.5),
        ),
        Step(
            "ci-device",
            f"every ci profile on the micro ViT on {sizes.device}: {', '.join(sizes.ci_precisions)}",
            [
                *py,
                "ci",
                "--device",
                sizes.device,
                *[a for p in sizes.ci_precisions for a in ("--precision", p)],
                "--out",
                "{out}/ci",
                *mode,
            ],
            sum(_ci_estimate(sizes, costs, p) - costs.process_s for p in sizes.ci_precisions) + costs.process_s,
        ),
        Step(
            "projection",
            f"the paper table priced from per-image costs measured on {sizes.device}",
            [*py, "projection", "--device", sizes.device, "--out", "{out}/projection.json", *mode],
            proj,
        ),
        Step(
            "speed",
            "feature extraction and train-step img/s against their limits, data pipeline img/s: "
            + ", ".join(f"{b} @ {s}" for b, s in sizes.speed_backbones),
            [*py, "speed", "--device", sizes.device, "--out", "{out}/speed.json", *mode],
            _speed_estimate(sizes, costs),
        ),
        Step(
            "compare",
            f"CUDA fp32 against CPU fp32 (matrix cells within {MATRIX_TOL} points, parameters exact); bf16 - fp32",
            [*py, "compare", "--out", "{out}", *mode],
            1.0,
            needs=("ci-cpu", "ci-device"),
            always=True,
        ),
    ]


def format_plan(steps: list[Step], sizes: Sizes) -> str:
    lines = [f"plan ({sizes.name}; estimated seconds on a current data-centre GPU, GpuCosts in .ci/gpu.py):"]
    for s in steps:
        lines.append(f"  {s.name:<10} ~{s.estimate_s:6.0f} s{'  (background)' if s.background else ''}  {s.what}")
    serial = sum(s.estimate_s for s in steps if not s.background)
    lines.append(
        f"  total      ~{max(serial, max(s.estimate_s for s in steps)):6.0f} s (budget {sizes.budget_s:.0f} s)"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- the driver
def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, data)


def drive(out: Path, sizes: Sizes, steps: list[Step] | None = None, log: Callable[[str], None] = print) -> int:
    """Run ``steps`` (default :func:`plan`) under ``sizes.budget_s`` from now; a step that would start with under
    5 s left is skipped, one that overruns what is left is stopped. Writes ``gpu.json`` and ``summary.txt``;
    returns 0 when every step passed."""
    start = time.monotonic()
    steps = plan(sizes) if steps is None else steps
    if sizes is not GPU:
        log(format_plan(plan(GPU), GPU) + "\n(what a GPU runs; this dry run runs instead:)")
    log(format_plan(steps, sizes))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.setdefault("CLBENCH_CACHE", str(Path(tempfile.gettempdir()) / "clbench-gpu-cache"))  # not in the tree
    running: dict[str, tuple[subprocess.Popen[bytes], float, Any]] = {}

    def argv(s: Step) -> list[str]:
        return [a.replace("{out}", str(out)) for a in s.argv]

    def left(s: Step | None = None) -> float:
        """Seconds of the budget left for ``s``: what the ``always`` steps after it need is kept back."""
        after = steps[steps.index(s) + 1 :] if s is not None else []
        reserve = sum(x.estimate_s + 2.0 for x in after if x.always)
        return sizes.budget_s - (time.monotonic() - start) - reserve

    def finish(s: Step, proc: subprocess.Popen[bytes], t0: float, logf: Any) -> None:
        try:
            rc = proc.wait(timeout=max(1.0, left(s)) if not s.always else 60.0 + 10.0 * s.estimate_s)
            s.status = "ok" if rc == 0 else "failed"
            s.detail = "" if rc == 0 else f"exit {rc}: see logs/{s.name}.log"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and what it started (pytest, loader workers)
            proc.wait()
            s.status, s.detail = "timed out", f"stopped at the budget: see logs/{s.name}.log"
        s.measured_s = time.monotonic() - t0
        logf.close()
        log(f"[{time.monotonic() - start:5.0f} s] {s.name}: {s.status} in {s.measured_s:.0f} s {s.detail}")

    def launch(s: Step) -> tuple[subprocess.Popen[bytes], float, Any]:
        (out / "logs").mkdir(exist_ok=True)
        logf = open(out / "logs" / f"{s.name}.log", "wb")  # noqa: SIM115  (closed by finish)
        sub_env = env
        if s.background:  # the CPU reference leaves half the cores to the steps that feed the GPU
            sub_env = dict(env, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // 2)))
        log(f"[{time.monotonic() - start:5.0f} s] {s.name}: {s.what}")
        proc = subprocess.Popen(argv(s), stdout=logf, stderr=subprocess.STDOUT, env=sub_env, start_new_session=True)
        return proc, time.monotonic(), logf

    for s in steps:
        if s.background:
            running[s.name] = launch(s)
    for s in steps:
        if s.background:
            continue
        for need in s.needs:
            if need in running:
                finish(next(x for x in steps if x.name == need), *running.pop(need))
        if any(x.status not in ("ok", "planned") for x in steps if x.name in s.needs):
            s.status, s.detail = "skipped", "a step it needs did not pass"
            log(f"{s.name}: skipped ({s.detail})")
            continue
        if left(s) < 5.0 and not s.always:
            s.status, s.detail = "skipped", f"{left(s):.0f} s of the budget left"
            log(f"{s.name}: skipped ({s.detail})")
            continue
        t = launch(s)
        finish(s, *t)
    for name, t in running.items():
        finish(next(x for x in steps if x.name == name), *t)
    elapsed = time.monotonic() - start
    summary = summarise(out, steps, sizes, elapsed)
    (out / "summary.txt").write_text(summary + "\n")
    log(summary)
    _write_json(
        out / "gpu.json",
        {
            "mode": sizes.name,
            "sizes": dataclasses.asdict(sizes),
            "elapsed_s": elapsed,
            "steps": [{k: v for k, v in dataclasses.asdict(s).items() if k != "argv"} for s in steps],
            "skipped": [s.name for s in steps if s.status == "skipped"],
            "device": _device_info(),
            "matrix_tolerance_points": MATRIX_TOL,
        },
    )
    return 0 if all(s.status == "ok" for s in steps) else 1


def _device_info() -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
    return info


def gpu_folder_name(name: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: the folder under reports/gpu/ that a GPU's results go to."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split()) or "unknown"


# ----------------------------------------------------------------------------------------------- the summary
def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summarise(out: Path, steps: list[Step], sizes: Sizes, elapsed: float) -> str:
    """The one-screen summary of what ``out`` holds."""
    dev = _device_info()
    lines = [
        f".ci/gpu ({sizes.name}) on {dev.get('gpu', 'CPU only')}, torch {dev['torch']}, {dev['cpu_cores']} cores: "
        f"{elapsed:.0f} s of {sizes.budget_s:.0f}",
        "steps: "
        + ", ".join(f"{s.name} {s.status} ({(s.measured_s or 0):.0f} s, est. {s.estimate_s:.0f})" for s in steps),
    ]
    skipped = [s.name for s in steps if s.status == "skipped"]
    if skipped:
        lines.append("SKIPPED: " + ", ".join(skipped))
    cmp = _read(out / "correctness.json")
    if cmp:
        lines.append(
            f"correctness: {cmp['passed']}/{cmp['compared']} runs agree with the CPU (cells within {MATRIX_TOL} "
            f"points, params exact); worst cell {cmp['max_abs_diff']:.2f} points"
            + (f"; FAILED: {', '.join(cmp['failed'])}" if cmp["failed"] else "")
        )
        if cmp.get("bf16"):
            diffs = ", ".join(f"{k} {v['last_acc_diff']:+.2f}" for k, v in cmp["bf16"].items())
            lines.append(f"bf16 - fp32 final accuracy on {sizes.device}: {diffs}")
    speed = _read(out / "speed.json")
    if speed:
        for r in speed.get("extraction", []):
            lines.append(
                f"extract {r['backbone']}@{r['img_size']} {r['precision']}: {r['img_per_s']:.0f} img/s "
                f"(bare forward {r['limit_img_per_s']:.0f}, {r['ratio']:.2f})"
            )
        for r in speed.get("train_step", []):
            what = f"train-step {r['strategy']} {r['backbone']}@{r['img_size']} {r['precision']}"
            if "error" in r:
                lines.append(f"{what}: FAILED {r['error']}")
                continue
            lines.append(
                f"{what}: {r['step_images_per_s']:.0f} img/s, fwd+bwd limit {r['limit_images_per_s']:.0f}, "
                f"ratio {r['ratio']:.2f}"
            )
        for r in speed.get("data_pipeline", []):
            lines.append(
                f"data decode+augment @ {r['img_size']} px, {r['workers']} workers: {r['img_per_s']:.0f} img/s"
            )
    proj = _read(out / "projection.json")
    if proj:
        lines.append(
            f"paper table on this device: {proj['projection']['table_hours_with_cache']:,.1f} device-hours with the "
            f"feature cache ({proj['costs']['backbone']} @ {proj['costs']['img_size']}, {proj['costs']['precision']})"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- step: ci runs
def run_ci(sizes: Sizes, device: str, precision: str, out: Path, log: Callable[[str], None] = print) -> dict:
    """Every ci run of ``sizes`` on ``device`` at ``precision``, in this process; ``out/runs.json`` keeps each
    run's accuracy matrices, parameter counts and seconds (rewritten after every run)."""
    import torch

    # deferred: loads torch, which importing this module does not
    from clbench.run.harness import RunConfig, run

    results: dict[str, Any] = {"device": device, "precision": precision, "runs": {}}
    for folder, name, profile in ci_runs(sizes):
        cls = STRATEGIES.get(name)
        cfg = RunConfig(
            strategy=name,
            profile=profile,
            backbone=sizes.ci_backbone[0],
            weights="random",
            seed=SEED,
            device=device,
            precision=precision,
            protocol="both" if len(cls.protocols) > 1 else "per-sample",
            out=str(out / folder),
            overwrite=True,
        )
        t0 = time.perf_counter()
        try:
            rec = run(cfg)
        except Exception as e:  # one strategy's failure on a device is a finding, not the end of the step
            results["runs"][folder] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{folder}: FAILED {type(e).__name__}: {e}")
        else:
            results["runs"][folder] = {
                "matrices": {p: s.accuracy_matrix for p, s in rec.protocols.items()},
                "last_acc": rec.last_acc,
                "params": rec.params.to_dict(),
                "precision": rec.precision,
                "time_s": rec.time_s.to_dict(),
                "wall_s": time.perf_counter() - t0,
            }
            log(f"{folder}: final {rec.last_acc:.2f} in {time.perf_counter() - t0:.1f} s")
        for bulky in ("features.npz", "predictions.npz", "checkpoint.safetensors", "checkpoint.pt"):
            (out / folder / bulky).unlink(missing_ok=True)  # the record stays; runs.json has what compare reads
        results["cuda_available"] = torch.cuda.is_available()
        _write_json(out / "runs.json", results)
    return results


def compare(out: Path) -> dict[str, Any]:
    """CUDA fp32 against CPU fp32 (every matrix cell within :data:`MATRIX_TOL`, parameter counts equal), and the
    bf16 - fp32 final-accuracy difference on the device; written to ``out/correctness.json``."""
    cpu = _read(out / "ci" / "reference-cpu-fp32" / "runs.json") or {"runs": {}}
    dev = _read(out / "ci" / "device-fp32" / "runs.json") or {"runs": {}}
    bf16 = _read(out / "ci" / "device-bf16" / "runs.json") or {"runs": {}}
    rows, failed, worst = {}, [], 0.0
    for name, d in dev["runs"].items():
        c = cpu["runs"].get(name)
        if c is None or "error" in c or "error" in d:
            rows[name] = {"ok": False, "why": (d.get("error") or (c or {}).get("error") or "no CPU run")}
            failed.append(name)
            continue
        diff = max(
            (
                abs(a - b)
                for p in d["matrices"]
                for ra, rb in zip(d["matrices"][p], c["matrices"][p], strict=True)
                for a, b in zip(ra, rb, strict=True)
            ),
            default=0.0,
        )
        same_params = d["params"] == c["params"]
        ok = diff <= MATRIX_TOL and same_params and d["matrices"].keys() == c["matrices"].keys()
        worst = max(worst, diff)
        rows[name] = {
            "ok": ok,
            "max_abs_diff": diff,
            "params_equal": same_params,
            "last_acc": [d["last_acc"], c["last_acc"]],
        }
        if not ok:
            failed.append(name)
    bf = {
        name: {
            "last_acc_fp32": d["last_acc"],
            "last_acc_bf16": b["last_acc"],
            "last_acc_diff": b["last_acc"] - d["last_acc"],
        }
        for name, b in bf16["runs"].items()
        if "error" not in b and "error" not in (d := dev["runs"].get(name, {"error": "missing"}))
    }
    result = {
        "tolerance_points": MATRIX_TOL,
        "devices": [dev.get("device"), cpu.get("device")],
        "compared": len(rows),
        "passed": sum(r["ok"] for r in rows.values()),
        "failed": failed,
        "max_abs_diff": worst,
        "runs": rows,
        "bf16": bf,
        "bf16_errors": {k: v["error"] for k, v in bf16["runs"].items() if "error" in v},
    }
    _write_json(out / "correctness.json", result)
    return result


# ----------------------------------------------------------------------------------------------- step: speed
def _random_source(n: int, size: int) -> Any:
    import numpy as np

    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks.base import ArraySource

    rng = np.random.default_rng(0)
    return ArraySource(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), np.zeros(n, dtype=np.int64), "random")


def extraction_rates(sizes: Sizes, device: str, log: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """Per backbone and precision: clbench's extraction of ``extract_images`` random images against a bare forward
    at the same batch (the limit)."""
    import torch

    # deferred: loads torch, torchvision, which importing this module does not; tests replace some
    from clbench.core.precision import throughput
    from clbench.features.backbones import load_backbone
    from clbench.features.cache import extract
    from clbench.features.transforms import TransformSpec
    from clbench.run.harness import resolve_device

    dev = resolve_device(device)
    for name, img in sizes.speed_backbones:
        bb = load_backbone(name, "random", img).to(dev)
        source = _random_source(sizes.extract_images, bb.img_size)
        tf = TransformSpec(bb.img_size, None, bb.mean, bb.std).build()
        for p in sizes.precisions:
            extract(bb, _random_source(sizes.batch, bb.img_size), tf, dev, p, sizes.batch)  # warm-up
            t0 = time.perf_counter()
            extract(bb, source, tf, dev, p, sizes.batch)
            rate = sizes.extract_images / (time.perf_counter() - t0)
            limit = throughput(bb, dev, p, bb.img_size, batch=sizes.batch, seconds=sizes.limit_seconds)
            row = {
                "backbone": name,
                "img_size": bb.img_size,
                "precision": p,
                "batch": sizes.batch,
                "img_per_s": rate,
                "limit_img_per_s": limit,
                "ratio": rate / limit,
            }
            log(f"extract {name}@{bb.img_size} {p}: {rate:.0f} img/s, bare forward {limit:.0f} img/s")
            yield row
        del bb
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def train_step_rates(sizes: Sizes, device: str, log: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """:func:`clbench.perf.train_step.step_ratio` of each strategy (default config, random weights) on the first
    task of the embedded benchmark, per backbone and precision."""
    # deferred: loads torch, which importing this module does not
    from clbench.perf.train_step import step_ratio
    from clbench.run.harness import RunConfig, prepare

    names = step_strategies(sizes)
    for name, img in sizes.speed_backbones:
        for p in sizes.step_precisions:
            for strategy in names:
                cfg = RunConfig(
                    strategy=strategy,
                    backbone=name,
                    weights="random",
                    img_size=img,
                    precision=p,
                    device=device,
                    seed=SEED,
                )
                try:
                    session = prepare(cfg)
                    task = next(session.tasks()).task
                    session.strategy.ctx.log = lambda _m: None
                    session.strategy.ctx.progress = None
                    row = step_ratio(session.strategy, task, steps=sizes.steps)
                except Exception as e:  # recorded; the other settings still run
                    log(f"train-step {strategy} {name} {p}: FAILED {type(e).__name__}: {e}")
                    yield {
                        "strategy": strategy,
                        "backbone": name,
                        "img_size": img,
                        "precision": p,
                        "error": f"{type(e).__name__}: {e}",
                    }
                    continue
                row.update(strategy=strategy, backbone=name, img_size=session.backbone.img_size, requested=p)
                log(
                    f"train-step {strategy} {name}@{img} {p}: {row['step_images_per_s']:.0f} img/s, "
                    f"limit {row['limit_images_per_s']:.0f}, ratio {row['ratio']:.2f}"
                )
                yield row


def data_pipeline_rates(sizes: Sizes, log: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """Decode + augment img/s of the embedded benchmark's training images at ``data_img_size`` (the train
    transform, no model): in the main process, as a run loads its batches today, and with one worker per core."""
    import torch
    from torch.utils.data import DataLoader

    # deferred: loads numpy, torch, torchvision, which importing this module does not
    from clbench.benchmarks import BENCHMARKS, build_benchmark
    from clbench.features.cache import TransformedImages
    from clbench.features.transforms import TransformSpec

    spec = BENCHMARKS.get("emoji")
    bench = build_benchmark(spec, None, spec.init_cls, spec.increment, SEED)
    n = min(sizes.data_images, len(bench.train))
    tf = TransformSpec(sizes.data_img_size, None, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), train=True).build()
    for workers in sorted({0, os.cpu_count() or 1}):
        ds = TransformedImages(bench.train, tf, list(range(n)))
        loader = DataLoader(ds, batch_size=32, num_workers=workers, generator=torch.Generator().manual_seed(0))
        t0 = time.perf_counter()
        seen = sum(int(x.shape[0]) for x, _ in loader)
        rate = seen / (time.perf_counter() - t0)
        log(f"data pipeline @ {sizes.data_img_size} px, {workers} workers: {rate:.0f} img/s")
        yield {
            "img_size": sizes.data_img_size,
            "workers": workers,
            "images": seen,
            "img_per_s": rate,
            "note": "workers 0 is how clbench's runs load today (Split.image_loader, extract)",
        }


def run_speed(sizes: Sizes, device: str, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The speed step: every measurement, ``out`` rewritten after each row (a stopped step keeps what it has)."""
    import torch

    result: dict[str, Any] = {
        "benchmark": "gpu-speed",
        "device": device,
        "extraction": [],
        "train_step": [],
        "data_pipeline": [],
        "threads": torch.get_num_threads(),
    }
    for key, rows in (
        ("data_pipeline", data_pipeline_rates(sizes, log)),
        ("extraction", extraction_rates(sizes, device, log)),
        ("train_step", train_step_rates(sizes, device, log)),
    ):
        for row in rows:
            result[key].append(row)
            _write_json(out, result)
    rates = [r["step_images_per_s"] for r in result["train_step"] if "error" not in r]
    best_data = max((r["img_per_s"] for r in result["data_pipeline"]), default=None)
    in_process = next((r["img_per_s"] for r in result["data_pipeline"] if r["workers"] == 0), None)
    if rates and best_data:
        result["gpu_waits_for_data"] = {
            "fastest_train_step_img_per_s": max(rates),
            "data_img_per_s_main_process": in_process,
            "data_img_per_s_all_cores": best_data,
            "waits_in_main_process": bool(in_process is not None and in_process < max(rates)),
            "waits_with_all_cores": bool(best_data < max(rates)),
        }
    _write_json(out, result)
    return result


def run_projection(sizes: Sizes, device: str, out: Path) -> dict[str, Any]:
    # deferred: loads torch, which importing this module does not
    from clbench.perf.projection import format_projection, measure_costs, projection

    name, img = sizes.projection_backbone
    names = list(sizes.projection_strategies) if sizes.projection_strategies else None
    if sizes.projection_limit is not None:
        from clbench.core.catalog import STRATEGIES

        names = (names or STRATEGIES.names())[: sizes.projection_limit]
    costs = measure_costs(device=device, backbone=name, img_size=img, batch=sizes.batch, strategies=names)
    result = {"benchmark": "projection", "costs": costs, "projection": projection(costs, names=names)}
    print(format_projection(result["projection"], costs))
    _write_json(out, result)
    return result


# ----------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python .ci/gpu.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    d = sub.add_parser("drive", help="the whole check (what .ci/gpu runs)")
    d.add_argument(
        "parent",
        type=Path,
        nargs="?",
        default=Path("reports/gpu"),
        help="results go to PARENT/<gpu-name>/ (default: reports/gpu; the dry run's <gpu-name> is cpu-dry-run)",
    )
    d.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at toy sizes")
    d.add_argument("--plan", action="store_true", help="print the plan and stop")
    for name in ("ci", "speed", "projection", "compare"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True)
        s.add_argument("--mode", choices=["gpu", "dry-run"], default="gpu")
        if name != "compare":
            s.add_argument("--device", default="cuda")
        if name == "ci":
            s.add_argument("--precision", dest="precisions", action="append", default=[])
            s.add_argument("--reference", action="store_true", help="the CPU reference (folder reference-cpu-P)")
    a = p.parse_args(argv)
    if a.step == "drive":
        sizes = DRY if a.dry_run else GPU
        if a.plan:
            print(format_plan(plan(sizes), sizes))
            return 0
        import torch

        if not a.dry_run and not torch.cuda.is_available():
            raise ClbenchError(
                "no CUDA device is visible to torch", "run it on a machine with a CUDA GPU, or pass --dry-run"
            )
        gpu = torch.cuda.get_device_name(0) if not a.dry_run else "cpu-dry-run"
        out = a.parent / gpu_folder_name(gpu)
        return drive(out, sizes)
    sizes = DRY if a.mode == "dry-run" else GPU
    if a.step == "ci":
        ok = True
        for precision in a.precisions or ["fp32"]:
            label = f"reference-{a.device}" if a.reference else "device"
            r = run_ci(sizes, a.device, precision, a.out / f"{label}-{precision}")
            ok = ok and all("error" not in v for v in r["runs"].values())
        return 0 if ok else 1
    if a.step == "speed":
        r = run_speed(sizes, a.device, a.out)
        return 0 if all("error" not in v for v in r["train_step"]) else 1
    if a.step == "projection":
        run_projection(sizes, a.device, a.out)
        return 0
    r = compare(a.out)
    print(json.dumps({k: r[k] for k in ("compared", "passed", "failed", "max_abs_diff")}))
    return 0 if not r["failed"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ClbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
