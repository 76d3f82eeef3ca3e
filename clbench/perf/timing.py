"""The timer every measurement uses (the median of repeated calls after warm-up ones), and the backbone pass the
per-image costs of routers and modules are compared with (:func:`timed_backbone`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clbench.core.precision import for_backbone


def median_seconds(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


@dataclass(frozen=True)
class TimedBackbone:
    """A frozen backbone, a random input batch for it, its precision, and the median seconds of one forward pass
    over that batch (:func:`timed_backbone`)."""

    backbone: Any
    images: Any  # (batch, 3, size, size)
    precision: Any  # clbench.core.precision's choice for this backbone
    seconds: float

    @property
    def d(self) -> int:
        return int(self.backbone.num_features)

    def forward(self):
        """(batch, d) float32 features of the batch at the chosen precision, on the CPU."""
        with self.precision.autocast("cpu"):
            return self.backbone(self.images).float()


def timed_backbone(
    backbone: str, weights: str, img_size: int, batch: int, precision: str, log: Callable[[str], None] = print
) -> TimedBackbone:
    """Load ``backbone`` (random weights time as real ones do), time its forward pass over a random batch on the CPU
    (median of 3 after 1 warm-up) and log the milliseconds per image."""
    import torch

    # deferred: loads torch, which importing this module does not
    from clbench.features.backbones import load_backbone

    bb = load_backbone(backbone, weights, img_size)
    images = torch.randn(batch, 3, bb.img_size, bb.img_size)
    prec = for_backbone(bb, torch.device("cpu"), precision)
    timed = TimedBackbone(bb, images, prec, 0.0)
    timed = dataclasses.replace(timed, seconds=median_seconds(timed.forward, repeat=3, warmup=1))
    log(f"backbone forward: {timed.seconds / batch * 1e3:.2f} ms/image ({backbone} @ {bb.img_size}, {prec.name})")
    return timed
