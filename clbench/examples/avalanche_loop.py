"""A plain Avalanche training loop around a clbench strategy (README: "Use a strategy from your own Avalanche loop").

    python -m clbench.examples.avalanche_loop                        # embedded emoji benchmark, offline
    python -m clbench.examples.avalanche_loop --strategy simplecil   # any registered method (clbench list)
    python -m clbench.examples.avalanche_loop --cifar100 DIR         # SplitCIFAR100 when DIR/cifar-100-python exists

The benchmark is built with Avalanche's own generators (``nc_benchmark`` over two ordinary torch datasets, or
``SplitCIFAR100``), in the literature's class order with arrival-order class ids, and evaluated with an
``EvaluationPlugin`` (accuracy and forgetting per experience and stream; InteractiveLogger, and CSV + TensorBoard
logs with ``--log-dir``). With the same seed and settings, the accuracy matrix equals ``clbench run``'s record
(tests/test_avalanche_api.py checks it entry by entry). ``--json FILE`` writes the matrix, curve and wall-clock.

``--perf-out FILE`` measures this script against ``clbench run`` for the same run instead (see :func:`measure`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

# Avalanche imports qpsolvers (for its GEM plugin), which warns at import time when no QP solver is installed. No
# clbench strategy calls a QP solver, so that warning, and only it, is silenced while Avalanche is first imported
# here: importing this module (or running it) prints nothing of it, and any other warning still shows.
QP_WARNING = "no QP solver found"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=QP_WARNING, category=UserWarning)
    from avalanche.benchmarks import SplitCIFAR100, nc_benchmark
    from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
    from avalanche.logging import CSVLogger, InteractiveLogger, TensorboardLogger
    from avalanche.training.plugins import EvaluationPlugin


class ImageDataset(Dataset):
    """(PIL image, class id) pairs from a clbench image source: an ordinary dataset with a ``targets`` list."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.targets = [int(t) for t in source.labels]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.source.image(i), self.targets[i]


def embedded_datasets() -> tuple[ImageDataset, ImageDataset, list[int]]:
    """The embedded emoji benchmark as plain (train, test) datasets and the literature's class order."""
    # looked up at call time: tests replace it on its module
    from clbench.benchmarks.base import literature_class_order
    from clbench.benchmarks.emoji import load

    train, test, names = load(None)
    return ImageDataset(train), ImageDataset(test), literature_class_order(len(names))


def build_benchmark(strategy: Any, cifar100: str | None, n_experiences: int):
    """An Avalanche benchmark, built the way an Avalanche user builds one; transforms are the strategy's."""
    # an example read as a user's script: each function imports the clbench pieces it uses
    from clbench.benchmarks.base import literature_class_order

    if cifar100:
        return SplitCIFAR100(
            n_experiences=n_experiences,
            return_task_id=False,
            fixed_class_order=literature_class_order(100),
            class_ids_from_zero_from_first_exp=True,
            train_transform=None,
            eval_transform=strategy.eval_transform,
            dataset_root=cifar100,
        )
    train, test, order = embedded_datasets()
    return nc_benchmark(
        train,
        test,
        n_experiences=n_experiences,
        task_labels=False,
        fixed_class_order=order,
        class_ids_from_zero_from_first_exp=True,
        eval_transform=strategy.eval_transform,
    )


def make_evaluator(log_dir: str | None, verbose: bool):
    loggers: list = [InteractiveLogger()] if verbose else []
    if log_dir:
        loggers += [
            CSVLogger(log_folder=str(Path(log_dir) / "csv")),
            TensorboardLogger(tb_log_dir=str(Path(log_dir) / "tb")),
        ]
    with warnings.catch_warnings():  # under --quiet Avalanche warns that no logger is given: the metrics are
        warnings.filterwarnings("ignore", message="No loggers specified")  # still returned, and that is the point
        return EvaluationPlugin(
            accuracy_metrics(experience=True, stream=True),
            forgetting_metrics(experience=True, stream=True),
            loggers=loggers,
        )


def reuse_cli_features(strategy: Any, benchmark: Any, sources: dict[str, Any]) -> dict[str, bool]:
    """Serve every experience's frozen features from the entries ``clbench run`` writes for the whole train and test
    splits, so that the example passes no image through the backbone when the CLI ran the same benchmark, backbone
    and transform before (and the CLI reuses what the example computes).

    ``sources``: split -> the benchmark's :class:`~clbench.benchmarks.base.ImageSource`, in the order the Avalanche
    datasets were built from. A split's key is the harness's (:func:`clbench.run.harness.feature_key` over the
    source's content fingerprint, with the strategy's backbone, weights, transform, precision and device: exactly
    ``clbench run``'s); a split the cache lacks is computed once, with a progress bar, and cached. Each experience's
    rows (``benchmark.*_exps_patterns_assignment``) are then filed under the key the strategy reads for that
    experience. Returns split -> whether the CLI's entry was found. Without the feature cache it does nothing."""
    import torch

    # looked up at call time: tests replace it on its module
    from clbench.features.cache import extract
    from clbench.run.avalanche_api import ExperienceImages
    from clbench.run.harness import feature_key

    if not strategy.config.feature_cache:
        return {}
    streams = {"train": benchmark.train_stream, "test": benchmark.test_stream}
    rows = {"train": benchmark.train_exps_patterns_assignment, "test": benchmark.test_exps_patterns_assignment}
    found = {}
    for split, source in sources.items():
        key = feature_key(strategy.resolved, strategy.inputs, split, source.fingerprint())

        def compute(source: Any = source, split: str = split) -> torch.Tensor:
            with _bar(f"features {split} ({len(source):,} images)", len(source)) as advance:
                return extract(
                    strategy.backbone,
                    source,
                    strategy.eval_transform,
                    strategy.resolved.device,
                    strategy.precision.name,
                    strategy.config.batch_size,
                    progress=advance,
                )

        whole, found[split] = strategy.cache.get_or_compute(key, compute, precision=strategy.precision.name)
        for experience, picked in zip(streams[split], rows[split], strict=True):
            images = ExperienceImages(experience.dataset, f"experience {experience.current_experience}")
            exp_key = feature_key(strategy.resolved, strategy.inputs, "avalanche-experience", images.fingerprint())
            index = torch.as_tensor(list(picked), dtype=torch.long)
            rows_of = lambda index=index, whole=whole: whole[index]  # noqa: E731 (bound now, read once)
            strategy.cache.get_or_compute(exp_key, rows_of, precision=strategy.precision.name)
    return found


class _bar:
    """A rich progress bar on stderr while features are extracted (the report stays on stdout)."""

    def __init__(self, description: str, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task(description, total=total)

    def __enter__(self):
        self.bar.__enter__()
        return lambda n: self.bar.advance(self.task, n)

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clbench.examples.avalanche_loop", description=__doc__.split("\n")[0])
    # an example read as a user's script: each function imports the clbench pieces it uses
    from clbench.core.catalog import FEATURED_STRATEGY
    from clbench.core.config import PRECISION_CHOICES

    p.add_argument(
        "--strategy",
        "--method",  # its earlier name
        dest="strategy",
        default=FEATURED_STRATEGY,
        help=f"registered clbench method (default: {FEATURED_STRATEGY})",
    )
    p.add_argument(
        "--cifar100",
        metavar="DIR",
        default=os.environ.get("CLBENCH_CIFAR100"),
        help="folder holding cifar-100-python/ (default: $CLBENCH_CIFAR100); absent: the embedded data",
    )
    # The strategy's own settings, spelt as `clbench run` spells them; a flag left out is left to ClbenchStrategy,
    # whose defaults are RunConfig's (so none is restated here).
    unset = dict(default=argparse.SUPPRESS)
    p.add_argument("--backbone", **unset, help="backbone (default: the benchmark setting's)")
    p.add_argument("--weights", **unset, help="auto | offline | hub | random | PATH (default: clbench run's, auto)")
    p.add_argument("--precision", **unset, choices=PRECISION_CHOICES, help="default: clbench run's, auto")
    p.add_argument("--seed", type=int, **unset, help="default: clbench run's")
    p.add_argument(
        "--no-feature-cache",
        dest="feature_cache",
        action="store_false",
        **unset,
        help="compute frozen features in memory only (one backbone pass per image)",
    )
    p.add_argument("--log-dir", help="also write Avalanche CSV and TensorBoard logs here")
    p.add_argument("--json", help="write the accuracy matrix, curve and wall-clock to this file")
    p.add_argument("--quiet", action="store_true", help="no InteractiveLogger output")
    p.add_argument("--perf-out", metavar="FILE", help="measure this script against `clbench run` (see measure())")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.perf_out:
        return measure(args.strategy, Path(args.perf_out))
    t0 = time.perf_counter()
    # looked up at call time: tests replace it on its module
    from clbench.benchmarks import BENCHMARKS
    from clbench.run.avalanche_api import ClbenchStrategy, accuracy_rows, run_fields

    cifar = args.cifar100 if args.cifar100 and (Path(args.cifar100) / "cifar-100-python").is_dir() else None
    bench = "cifar100" if cifar else "emoji"
    spec = BENCHMARKS.get(bench)
    run = {f.name: getattr(args, f.name) for f in run_fields() if f.name in args}  # the RunConfig flags given
    strategy = ClbenchStrategy(bench=bench, evaluator=make_evaluator(args.log_dir, not args.quiet), **run)
    benchmark = build_benchmark(strategy, cifar, spec.n_classes // spec.increment)
    reused = reuse_cli_features(strategy, benchmark, _sources(cifar))
    if reused and not args.quiet:
        print("features: " + ", ".join(f"{s} {'from the cache' if hit else 'computed'}" for s, hit in reused.items()))

    results = []
    for t, experience in enumerate(benchmark.train_stream):
        strategy.train(experience)
        results.append(strategy.eval(benchmark.test_stream[: t + 1]))
    out = {
        "method": strategy.config.strategy,
        "bench": bench,
        "backbone": strategy.backbone_name,
        "seed": strategy.config.seed,
        "precision": strategy.precision.name,
        "transform": strategy.eval_tf.identity(),
        **accuracy_rows(results),
        "time_s": time.perf_counter() - t0,
    }
    print("R[t][j] (%): " + "; ".join(" ".join(f"{v:.1f}" for v in row) for row in out["accuracy_matrix"]))
    print(f"final {out['acc_curve'][-1]:.2f}  average {float(np.mean(out['acc_curve'])):.2f}  ({out['time_s']:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def _sources(cifar100: str | None) -> dict[str, Any]:
    """The benchmark's train and test sources as ``clbench run`` loads them (the datasets above are built from
    these, or, for CIFAR-100, from torchvision's reading of the same files, in the same order)."""
    if cifar100:
        # an example read as a user's script: each function imports the clbench pieces it uses
        from clbench.benchmarks.cifar import load as load_cifar

        train, test, _ = load_cifar(Path(cifar100))
    else:
        # an example read as a user's script: each function imports the clbench pieces it uses
        from clbench.benchmarks.emoji import load

        train, test, _ = load(None)
    return {"train": train, "test": test}


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(method: str, out: Path, workdir: Path | None = None) -> dict[str, Any]:
    """Wall-clock of this script vs ``clbench run`` for the same run (embedded benchmark, default backbone, seed
    1993), each as its own process on this machine, in two cache states: ``cold`` (``--no-feature-cache``: each
    computes the frozen features, one backbone pass per image) and ``warm`` (the feature cache holds them; each
    side ran once before). Also checks that both give the same accuracy matrix. Writes ``out`` (JSON)."""
    import tempfile

    # an example read as a user's script: each function imports the clbench pieces it uses
    from clbench.records.host import git_revision, library_versions
    from clbench.records.results import load_record
    from clbench.run.harness import host_info

    work = Path(workdir or tempfile.mkdtemp(prefix="clbench-perf-"))
    py = sys.executable

    def cli(tag: str, *extra: str) -> list[str]:
        return [py, "-m", "clbench.cli", "run", "--strategy", method, "--out", str(work / tag), "--overwrite", *extra]

    def example(tag: str, *extra: str) -> list[str]:
        return [
            py,
            "-m",
            "clbench.examples.avalanche_loop",
            "--strategy",
            method,
            "--quiet",
            "--json",
            str(work / f"{tag}.json"),
            *extra,
        ]

    times: dict[str, dict[str, float]] = {}
    times["cold"] = {
        "cli": _timed(cli("cli-cold", "--no-feature-cache")),
        "avalanche": _timed(example("av-cold", "--no-feature-cache")),
    }
    _timed(cli("cli-warmup"))  # fill the cache for both sides, then time one run of each
    _timed(example("av-warmup"))
    times["warm"] = {"cli": _timed(cli("cli-warm")), "avalanche": _timed(example("av-warm"))}
    record = load_record(work / "cli-warm")
    mine = json.loads((work / "av-warm.json").read_text())
    same = all(
        np.allclose(a, b, rtol=0, atol=1e-9)  # lengths compared below
        for a, b in zip(record.accuracy_matrix, mine["accuracy_matrix"], strict=False)
    )
    result = {
        "benchmark": "avalanche-vs-cli",
        "method": method,
        "bench": "emoji",
        "backbone": record.backbone,
        "precision": record.precision,
        "seed": record.seed,
        "what": "wall-clock of `python -m clbench.examples.avalanche_loop` vs `clbench run` for the same run, each a "
        "fresh process (imports, weights, features, learning, evaluation); cold: --no-feature-cache on both",
        "seconds": times,
        "ratio": {k: v["avalanche"] / v["cli"] for k, v in times.items()},
        "same_accuracy_matrix": bool(same and len(record.accuracy_matrix) == len(mine["accuracy_matrix"])),
        "final_acc": {"cli": record.last_acc, "avalanche": mine["acc_curve"][-1]},
        "host": host_info().to_dict(),
        "git_revision": git_revision(),
        "versions": library_versions(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"ratio": result["ratio"], "seconds": times, "same": result["same_accuracy_matrix"]}))
    return result


if __name__ == "__main__":
    from clbench.errors import ClbenchError

    try:
        main()
    except ClbenchError as e:
        print(f"clbench: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
