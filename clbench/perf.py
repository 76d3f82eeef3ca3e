"""Speed benchmarks that measure and record (``clbench perf``); ratios are measured within one run so they
hold on noisy machines. Results go to a JSON file (``reports/perf/`` for the committed ones).

- ``feature-probe``: how well a backbone's frozen features separate a benchmark's classes at a given input
  size and normalisation (nearest-class-mean and logistic-regression accuracy on all classes at once); used
  to choose the embedded benchmark's input size.
- ``tosca-routing``: TOSCA's inference cost per image for T = 1, 5, 10, 20 task modules on synthetic
  features, as a share of one backbone forward pass (target: 20 modules add < 5 %), and the speed-up of
  one-backbone-pass stacked routing over the reference's loop that reruns the backbone once per module
  (target: >= 8x at T = 10).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def _time(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _tosca_parts(d: int, T: int, classes_per_task: int, seed: int = 0):
    from clbench.blocks import CosineHead
    from tosca.luca import LuCA

    g = torch.Generator().manual_seed(seed)
    mods = []
    for t in range(T):
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
def tosca_routing(backbone: str = "vit_small_patch14_dinov2", weights: str = "random", img_size: int = 112,
                  batch: int = 64, tasks: tuple[int, ...] = (1, 5, 10, 20), classes_per_task: int = 6,
                  precision: str = "auto", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure TOSCA routing cost against backbone cost (weights do not change timings; random by default)."""
    from clbench.backbones import load_backbone
    from clbench.blocks import torch_threads
    from clbench.precision import for_backbone
    from tosca.strategy import route_per_sample, stacked_forward

    dev = torch.device("cpu")
    bb = load_backbone(backbone, weights, img_size)
    d = bb.num_features
    x = torch.randn(batch, 3, bb.img_size, bb.img_size)
    prec = for_backbone(bb, dev, precision)

    def backbone_pass():
        with prec.autocast(dev.type):
            return bb(x).float()

    t_backbone = _time(backbone_pass, repeat=3)
    log(f"backbone forward: {t_backbone / batch * 1e3:.2f} ms/image ({backbone} @ {bb.img_size})")
    z = torch.randn(batch, d)
    scaling = []
    for T in tasks:
        mods, head = _tosca_parts(d, T, classes_per_task)
        def route():  # as TOSCA.all_logits runs it on the CPU: one intra-op thread for bottleneck-sized work
            with torch_threads(1):
                return route_per_sample(head(stacked_forward(mods, z)))

        t_route = _time(route, repeat=20, warmup=3)
        scaling.append({"T": T, "route_ms_per_image": t_route / batch * 1e3,
                        "share_of_backbone_pass": t_route / t_backbone})
        log(f"T={T:>2}: routing {t_route / batch * 1e3:.4f} ms/image = {100 * t_route / t_backbone:.2f}% of a backbone pass")

    T = 10
    mods, head = _tosca_parts(d, T, classes_per_task)

    def ours():
        z = backbone_pass()
        with torch_threads(1):
            return route_per_sample(head(stacked_forward(mods, z)))

    def reference_loop():  # the official code: full ViT once per module per batch
        outs = [head(m(backbone_pass())) for m in mods]
        return torch.stack(outs).softmax(-1)

    t_ours = _time(ours, repeat=3)
    t_ref = _time(reference_loop, repeat=1, warmup=0)
    log(f"T=10: one pass + stacked modules {t_ours:.2f} s vs backbone-per-module loop {t_ref:.2f} s "
        f"-> speed-up {t_ref / t_ours:.1f}x")
    return {
        "benchmark": "tosca-routing",
        "backbone": backbone, "img_size": bb.img_size, "batch": batch, "precision": prec.name,
        "precision_reason": prec.reason, "feature_dim": d,
        "threads": torch.get_num_threads(),
        "backbone_ms_per_image": t_backbone / batch * 1e3,
        "scaling": scaling,
        "added_share_at_max_T": scaling[-1]["share_of_backbone_pass"],
        "speedup_vs_reference_loop_T10": t_ref / t_ours,
        "ours_s_T10": t_ours, "reference_loop_s_T10": t_ref,
        "targets": {"added_share_at_T20": "< 0.05", "speedup_T10": ">= 8"},
    }


def feature_probe(bench: str = "emoji", backbone: str | None = None, img_size: int | None = None,
                  normalize: bool | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Nearest-class-mean (cosine) and linear-probe accuracy of frozen features, all classes at once."""
    import torch.nn.functional as F
    from sklearn.linear_model import LogisticRegression

    from clbench.harness import RunConfig, prepare

    s = prepare(RunConfig(strategy="simplecil", bench=bench, backbone=backbone, img_size=img_size,
                          normalize=normalize))
    ftr, fte = F.normalize(s.features["train"], dim=1), F.normalize(s.features["test"], dim=1)
    ytr, yte = torch.as_tensor(s.bench.train_y), torch.as_tensor(s.bench.test_y)
    protos = torch.stack([ftr[ytr == c].mean(0) for c in range(s.bench.n_classes)])
    ncm = float(((fte @ F.normalize(protos, dim=1).T).argmax(1) == yte).float().mean() * 100)
    clf = LogisticRegression(max_iter=2000).fit(ftr.numpy(), ytr.numpy())
    linear = float(clf.score(fte.numpy(), yte.numpy()) * 100)
    log(f"{bench} {s.backbone.spec.name} @ {s.backbone.img_size} ({s.eval_tf.identity()}): "
        f"nearest-class-mean {ncm:.2f} %, linear probe {linear:.2f} %")
    return {"benchmark": "feature-probe", "bench": bench, "backbone": s.backbone.spec.name,
            "weights_digest": s.backbone.digest, "img_size": s.backbone.img_size,
            "transform": s.eval_tf.identity(), "ncm_acc": ncm, "linear_probe_acc": linear}
