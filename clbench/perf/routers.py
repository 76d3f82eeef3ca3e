"""``clbench perf routers``: seconds per image of every router's rule (:mod:`clbench.methods.routers`) at T modules,
against one backbone forward pass per image, and the cost of fitting one task's routing statistics."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from clbench.methods.routers import ROUTERS, RouteInputs, RoutingMemory, route
from clbench.methods.shared import torch_threads
from clbench.perf import backbone_args, measurement
from clbench.perf.timing import median_seconds, timed_backbone


def synthetic_memory(d: int, T: int, per_task: int, classes_per_task: int, seed: int = 0) -> RoutingMemory:
    """A memory fitted on random Gaussian tasks (timings do not depend on the values)."""
    g = torch.Generator().manual_seed(seed)
    mem = RoutingMemory()
    for t in range(T):
        z = torch.randn(per_task, d, generator=g) + torch.randn(d, generator=g)
        y = torch.randint(0, classes_per_task, (per_task,), generator=g)
        mem.fit_task(t, z, y, torch.randn(per_task, classes_per_task * (t + 1), generator=g) * 5)
    return mem


@torch.inference_mode()
def router_costs(
    backbone: str = "vit_small_patch14_dinov2",
    weights: str = "random",
    img_size: int = 112,
    batch: int = 64,
    tasks: tuple[int, ...] = (1, 5, 10, 20),
    classes_per_task: int = 6,
    precision: str = "auto",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Seconds per image of every router's rule at T modules, against one backbone forward pass per image, on the
    CPU with one intra-op thread (as strategies run per-task work). The rule's inputs (every module's logits, the
    frozen features, the fitted statistics) are given; a strategy's modules cost extra (its own benchmark), and
    rules with ``needs_all_modules = False`` need only the chosen module to run. Also the fit cost per task."""
    timed = timed_backbone(backbone, weights, img_size, batch, precision, log)
    bb, d, prec, t_backbone = timed.backbone, timed.d, timed.precision, timed.seconds
    g = torch.Generator().manual_seed(1)
    rows = []
    for T in tasks:
        mem = synthetic_memory(d, T, per_task=200, classes_per_task=classes_per_task)
        inp = RouteInputs(
            torch.randn(T, batch, T * classes_per_task, generator=g) * 5,
            torch.randn(batch, d, generator=g),
            mem,
            np.zeros(batch, dtype=np.int64),
        )
        for name in ROUTERS.names():
            with torch_threads(1):
                t = median_seconds(lambda name=name, inp=inp: route(name, inp), repeat=20, warmup=2)
            rows.append(
                {
                    "router": name,
                    "T": T,
                    "ms_per_image": t / batch * 1e3,
                    "share_of_backbone_pass": t / t_backbone,
                    "needs_all_modules": ROUTERS.get(name).needs_all_modules,
                }
            )
            log(f"T={T:>2} {name:>18}: {t / batch * 1e3:.4f} ms/image = {100 * t / t_backbone:.3f}% of a backbone pass")
    n_fit = 200
    z, y = torch.randn(n_fit, d, generator=g), torch.randint(0, classes_per_task, (n_fit,), generator=g)
    logits = torch.randn(n_fit, classes_per_task * 10, generator=g)
    base = synthetic_memory(d, 9, 50, classes_per_task)
    with torch_threads(1):
        t_fit = median_seconds(
            lambda: RoutingMemory(list(base.tasks), base.scatter_sum, base.shared_precision).fit_task(9, z, y, logits),
            repeat=5,
            warmup=1,
        )
    log(f"fit one task's statistics ({n_fit} training images, d={d}): {t_fit * 1e3:.1f} ms")
    return {
        "benchmark": "routers",
        "backbone": backbone,
        "img_size": bb.img_size,
        "batch": batch,
        "precision": prec.name,
        "precision_reason": prec.reason,
        "feature_dim": d,
        "classes_per_task": classes_per_task,
        "threads_rule": 1,
        "threads_backbone": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "backbone_ms_per_image": t_backbone / batch * 1e3,
        "rules": rows,
        "fit_ms_per_task": t_fit * 1e3,
        "fit_images": n_fit,
        "target": "rule + modules at T = 20 < 5 % of a backbone pass",
    }


@measurement(
    "routers",
    help="per-image cost of every router at T = 1, 5, 10, 20 modules",
    args=backbone_args(),
)
def _routers(flags: argparse.Namespace) -> dict[str, Any]:
    return router_costs(backbone=flags.backbone, img_size=flags.img_size)
