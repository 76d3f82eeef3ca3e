"""``clbench perf decoded-cache``: what the decoded-image cache (:mod:`clbench.features.decoded`) saves a trained method
per epoch: the seconds of one epoch of a task's training loader (decode, RandomResizedCrop + flip, to tensor, normalise,
batches of the method's size, shuffled) with every image decoded on every read, against the same epoch from the cache
after its first epoch filled it. Measured on the embedded benchmark's first task of the L2P quick profile (the run's own
transforms, through the harness), from two kinds of source: the embedded arrays (already decoded, so the cache saves
only the array-to-image step) and the same images written as PNG files of a folder benchmark (where a read decodes a
file, as for ImageNet-R or any ``--bench folder``). The training step itself (forward and backward through the ViT) is
the same with and without the cache; ``clbench perf train-step`` measures it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from clbench.core.catalog import PROMPT_STRATEGY
from clbench.core.precision import CpuInfo
from clbench.perf import arg, bounded, measurement


def _epoch_seconds(split: Any, batch_size: int, epochs: int) -> list[float]:
    """Seconds of each of ``epochs`` epochs of ``split``'s augmenting, shuffled training loader."""
    import torch

    out = []
    for e in range(epochs):
        t0 = time.perf_counter()
        for _ in split.image_loader(batch_size, augment=True, shuffle=True, generator=torch.Generator().manual_seed(e)):
            pass
        out.append(time.perf_counter() - t0)
    return out


def decoded_cache(strategy: str | None = None, epochs: int = 3, log=print) -> dict[str, Any]:
    """Loader seconds per epoch, streamed vs cached, for the first task of ``strategy``'s quick profile on the embedded
    benchmark, from its arrays and from PNG files of the same images (module
    docstring); ``None``: :data:`clbench.core.catalog.PROMPT_STRATEGY`."""
    import dataclasses

    import numpy as np
    import torch

    # deferred: loads numpy, torch, which importing this module does not
    from clbench.benchmarks.folder import FileSource
    from clbench.features.decoded import DecodedImages
    from clbench.run.harness import RunConfig, prepare

    strategy = strategy or PROMPT_STRATEGY
    with tempfile.TemporaryDirectory(prefix="clbench-decoded-") as tmp:
        cfg = RunConfig(strategy=strategy, profile="quick", device="cpu", out=str(Path(tmp) / "run"))
        session = prepare(cfg)
        task = next(session.tasks()).task
        batch_size = int(getattr(session.strategy.cfg, "batch_size", 16))
        train = task.train
        root = Path(tmp) / "png"
        paths = []
        for k, i in enumerate(train.indices.tolist()):
            rel = f"train/c{int(train.labels[k])}/{i}.png"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            session.bench.train.image(i).save(root / rel)
            paths.append(rel)
        files = FileSource(root, paths, np.asarray(train.labels), "emoji-as-png/train")
        positions = np.arange(len(paths))
        rows: dict[str, Any] = {}
        for kind, source, idx in (("arrays", session.bench.train, train.indices), ("png-files", files, positions)):
            streamed = dataclasses.replace(train, source=source, indices=idx)
            cache = DecodedImages(source, budget=1 << 40)
            cached = dataclasses.replace(train, source=cache, indices=idx)
            torch.manual_seed(0)
            s = _epoch_seconds(streamed, batch_size, epochs)
            torch.manual_seed(0)
            c = _epoch_seconds(cached, batch_size, epochs)
            rows[kind] = {
                "decode_per_epoch_s": s,
                "decode_once_s": c,  # epoch 1 decodes and fills the cache, the others read it
                "per_epoch_streamed_median_s": float(np.median(s)),
                "per_epoch_cached_after_first_s": float(np.median(c[1:])) if len(c) > 1 else None,
                "cache_mb": cache.bytes / 2**20,
            }
            r = rows[kind]
            log(
                f"{kind}: one epoch of {len(idx)} images, decoded every read {r['per_epoch_streamed_median_s']:.2f} s,"
                f" from the cache {r['per_epoch_cached_after_first_s']:.2f} s ({r['cache_mb']:.1f} MB kept)"
            )
    return {
        "benchmark": "decoded-cache",
        "strategy": strategy,
        "profile": "quick",
        "bench": session.spec.name,
        "task": 0,
        "images": len(train),
        "batch_size": batch_size,
        "train_transform": session.train_tf.identity(),
        "epochs": epochs,
        "cpu": CpuInfo.detect().model,
        "cpu_capability": CpuInfo.detect().capability,
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "sources": rows,
    }


@measurement(
    "decoded-cache",
    help="a trained method's loader epoch with images decoded on every read vs from the decoded-image cache",
    args=(
        arg("--strategy", default=None, help="the trained method whose quick profile sets the loader (default: L2P)"),
        arg(
            "--epochs",
            type=bounded("--epochs", 2, 50, "the first epoch fills the cache, and each epoch decodes every image"),
            default=3,
            help="epochs measured per source and mode (default: 3; from 2 to 50)",
        ),
    ),
)
def _decoded_cache(flags: argparse.Namespace) -> dict[str, Any]:
    return decoded_cache(flags.strategy, int(flags.epochs))
