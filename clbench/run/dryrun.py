"""``clbench run --dry-run``: every check a run makes before it learns, then the plan, and nothing trained.

A dry run resolves the settings (names, profile, ``--set``, scenario, backbone, device, precision), makes the data
checks a run makes before loading (``clbench data check`` without the full decode), loads the benchmark's labels to cut
it into tasks, checks that the backbone's weights can be had without a network where the run would need them, and checks
the output folder. It prints what the run would do and writes nothing: no run folder, no features, no weights converted.
"""

from __future__ import annotations

from pathlib import Path

from clbench.core.catalog import BACKBONES
from clbench.core.config import RunConfig
from clbench.errors import ClbenchError
from clbench.files.escape import plain


def plan(cfg: RunConfig) -> list[tuple[str, str]]:
    """(what, value) rows of the run ``cfg`` describes, after every check that needs no training; raises
    ClbenchError for the first problem, with the message the run would stop with."""
    # deferred: loads numpy, torch, which importing this module does not
    from clbench.benchmarks import build_benchmark
    from clbench.benchmarks.check import check_before_run
    from clbench.run.harness import resolve
    from clbench.run.rundir import check_folder, default_run_dir
    from clbench.weights.resolve import check_weights_file

    resolved = resolve(cfg)
    out = Path(cfg.out) if cfg.out is not None else default_run_dir(cfg)
    check_folder(out, "out")
    check_weights_file(cfg.weights)
    problems = check_before_run(cfg.bench, cfg.data_root, cfg.ignore_data_problems)
    bench = build_benchmark(
        resolved.spec, cfg.data_root, resolved.init_cls, resolved.increment, cfg.class_order_seed, cfg.scenario
    )
    weights = _weights(resolved.backbone_name, cfg.weights)
    tasks = (
        f"{bench.n_tasks} tasks of {', '.join(map(str, bench.task_sizes))} classes"
        if cfg.scenario == "class"
        else f"{bench.n_tasks} domains ({', '.join(resolved.spec.domains)}), all {bench.n_classes} classes in each"
    )
    rows = [
        ("strategy", f"{cfg.strategy} (profile {cfg.profile or 'default'})"),
        ("settings", ", ".join(f"{k}={v}" for k, v in cfg.overrides) or "the profile's"),
        (
            "benchmark",
            f"{resolved.spec.name}: {bench.n_classes} classes, {len(bench.train):,} train and "
            f"{len(bench.test):,} test images",
        ),
        ("data root", str(cfg.data_root) if cfg.data_root else "none needed (embedded or cached)"),
        ("scenario", f"{cfg.scenario}: {tasks}"),
        ("backbone", f"{resolved.backbone_name} at {resolved.img_size} px; weights {cfg.weights}: {weights}"),
        ("device", f"{resolved.device} (precision {cfg.precision}, batch {cfg.batch_size})"),
        ("protocols", ", ".join(resolved.protocols)),
        ("seed", f"{cfg.seed} (class order seed {cfg.class_order_seed})"),
        ("out", f"{out} (not created by a dry run)"),
    ]
    rows += [("data problem", f"{p} (run anyway: --ignore-data-problems)") for p in problems]
    return rows


def _weights(backbone: str, weights: str) -> str:
    """Where the weights would come from; a ClbenchError (the run's own hint) where they cannot be had."""
    # deferred: loads rich, torch, which importing this module does not
    from clbench.weights.info import availability
    from clbench.weights.resolve import _ways

    spec = BACKBONES.get(backbone)
    if weights == "random":
        return "random initialisation (an untrained control)"
    if weights not in ("auto", "offline", "hub"):
        return f"the file {weights}"
    status, where = availability(backbone)
    if status.startswith("offline") and weights != "hub":
        return f"{status} ({where})"
    if status.startswith("hub"):
        return f"{status} ({where})"
    if weights != "offline":
        # deferred: loads torch, which importing this module does not
        from clbench.weights.resolve import hub_reachable

        online, endpoint = hub_reachable()
        if online:
            return f"not here: the run downloads them from {endpoint}"
    raise ClbenchError(
        f"weights for {backbone} are not on this machine and the Hugging Face hub cannot be reached",
        "provide them with " + _ways(spec),
    )


def print_plan(cfg: RunConfig) -> None:
    rows = plan(cfg)
    print("clbench run --dry-run: every check passed; the run would be:")
    for what, value in rows:
        print(f"  {what:<12} {plain(value)}")
    print("nothing was trained or written; drop --dry-run to run it")
