"""TOSCA's own speed measurements, contributed to ``clbench perf`` by its card (:mod:`tosca.card`: ``perf_benchmarks``
names the :data:`ROUTING` measurement, ``unit_seconds`` the function below).

- ``tosca-routing``: TOSCA's inference cost per image for T = 1, 5, 10, 20 task modules on synthetic features, as a
  share of one backbone forward pass (target: 20 modules add < 5 %), and the speed-up of one-backbone-pass stacked
  routing over the reference's loop that reruns the backbone once per module (target: >= 8x at T = 10).
- :func:`unit_seconds`: the units of TOSCA's cost model (``work`` in :mod:`tosca.card`) for ``clbench perf
  projection``: one module step on a cached feature and the routing of one image through one module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from clbench.methods.shared import CosineHead, torch_threads
from clbench.perf import Measurement, backbone_args
from clbench.perf.timing import median_seconds, timed_backbone
from tosca.luca import LuCA, stacked_forward


def tosca_parts(d: int, T: int, classes_per_task: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mods = []
    for _t in range(T):
        m = LuCA(d)
        for p in m.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        mods.append(m.eval())
    head = CosineHead(d)
    head.grow(T * classes_per_task)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g))
    return mods, head


@torch.inference_mode()
def tosca_routing(
    backbone: str = "vit_small_patch14_dinov2",
    weights: str = "random",
    img_size: int = 112,
    batch: int = 64,
    tasks: tuple[int, ...] = (1, 5, 10, 20),
    classes_per_task: int = 6,
    precision: str = "auto",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure TOSCA routing cost against backbone cost (weights do not change timings; random by default)."""
    # deferred: loads numpy, which importing this module does not
    from clbench.methods.routers import RouteInputs
    from clbench.methods.routers import route as apply_router

    def route_per_sample(all_logits):  # the entropy router, as TOSCA routes per sample
        return apply_router("entropy", RouteInputs(all_logits))

    timed = timed_backbone(backbone, weights, img_size, batch, precision, log)
    bb, d, prec, t_backbone, backbone_pass = timed.backbone, timed.d, timed.precision, timed.seconds, timed.forward
    z = torch.randn(batch, d)
    scaling = []
    for T in tasks:
        mods, head = tosca_parts(d, T, classes_per_task)

        def route():  # as TOSCA.all_logits runs it on the CPU: one intra-op thread for bottleneck-sized work
            with torch_threads(1):
                return route_per_sample(head(stacked_forward(mods, z)))  # noqa: B023 (called in this iteration)

        t_route = median_seconds(route, repeat=20, warmup=3)
        scaling.append(
            {"T": T, "route_ms_per_image": t_route / batch * 1e3, "share_of_backbone_pass": t_route / t_backbone}
        )
        log(
            f"T={T:>2}: routing {t_route / batch * 1e3:.4f} ms/image = {100 * t_route / t_backbone:.2f}% "
            "of a backbone pass"
        )

    T = 10
    mods, head = tosca_parts(d, T, classes_per_task)

    def ours():
        z = backbone_pass()
        with torch_threads(1):
            return route_per_sample(head(stacked_forward(mods, z)))

    def reference_loop():  # the official code: full ViT once per module per batch
        outs = [head(m(backbone_pass())) for m in mods]
        return torch.stack(outs).softmax(-1)

    t_ours = median_seconds(ours, repeat=3)
    t_ref = median_seconds(reference_loop, repeat=1, warmup=0)
    log(
        f"T=10: one pass + stacked modules {t_ours:.2f} s vs backbone-per-module loop {t_ref:.2f} s "
        f"-> speed-up {t_ref / t_ours:.1f}x"
    )
    return {
        "benchmark": "tosca-routing",
        "backbone": backbone,
        "img_size": bb.img_size,
        "batch": batch,
        "precision": prec.name,
        "precision_reason": prec.reason,
        "feature_dim": d,
        "threads": torch.get_num_threads(),
        "backbone_ms_per_image": t_backbone / batch * 1e3,
        "scaling": scaling,
        "added_share_at_max_T": scaling[-1]["share_of_backbone_pass"],
        "speedup_vs_reference_loop_T10": t_ref / t_ours,
        "ours_s_T10": t_ours,
        "reference_loop_s_T10": t_ref,
        "targets": {"added_share_at_T20": "< 0.05", "speedup_T10": ">= 8"},
    }


def _routing(flags: argparse.Namespace) -> dict[str, Any]:
    return tosca_routing(backbone=flags.backbone, img_size=flags.img_size)


ROUTING = Measurement(
    "tosca-routing",
    help="TOSCA's routing cost per image at T = 1, 5, 10, 20 modules as a share of one backbone pass, and the "
    "speed-up of one-pass stacked routing over the reference's backbone-per-module loop at T = 10",
    run=_routing,
    args=backbone_args(),
)


def unit_seconds(d: int, device: torch.device) -> dict[str, float]:
    """Seconds per image of a module step (SGD on a cached feature, batch 48) and of routing per module (T = 10
    modules of 20 classes, 256 images), on ``device`` at width ``d``."""
    # deferred: loads numpy, which importing this module does not
    from clbench.methods.routers import RouteInputs
    from clbench.methods.routers import route as apply_router

    def route_per_sample(all_logits):  # the entropy router, as TOSCA routes per sample
        return apply_router("entropy", RouteInputs(all_logits))

    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    luca, z = LuCA(d).to(dev), torch.randn(48, d, device=dev)
    head = torch.nn.Linear(d, 100).to(dev)
    opt = torch.optim.SGD([*luca.parameters(), *head.parameters()], lr=0.01, momentum=0.9)

    def luca_step() -> None:
        with torch_threads(1) if dev.type == "cpu" else torch.enable_grad():
            loss = torch.nn.functional.cross_entropy(head(luca(z)), torch.zeros(48, dtype=torch.long, device=dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
        sync()

    step = median_seconds(luca_step, repeat=20, warmup=3) / 48
    T = 10
    mods, rhead = tosca_parts(d, T, 20)
    mods, rhead, zz = [m.to(dev) for m in mods], rhead.to(dev), torch.randn(256, d, device=dev)

    @torch.inference_mode()
    def route() -> None:
        with torch_threads(1) if dev.type == "cpu" else torch.inference_mode():
            route_per_sample(rhead(stacked_forward(mods, zz)))
        sync()

    route_per_module = median_seconds(route, repeat=10, warmup=2) / 256 / T
    return {"luca_steps": step, "route_module_images": route_per_module}
