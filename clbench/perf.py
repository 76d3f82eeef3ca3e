"""Speed benchmarks that measure and record (``clbench perf``); ratios are measured within one run so they
hold on noisy machines. Results go to a JSON file (``reports/perf/`` for the committed ones).

- ``feature-probe``: how well a backbone's frozen features separate a benchmark's classes at a given input
  size and normalisation (nearest-class-mean and logistic-regression accuracy on all classes at once); used
  to choose the embedded benchmark's input size.
- a strategy's own benchmarks (:meth:`clbench.strategy.Strategy.perf_benchmarks`, e.g. TOSCA's routing cost in
  ``tosca/perf.py``), listed by ``clbench perf --help``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


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


def feature_probe(bench: str = "emoji", backbone: str | None = None, img_size: int | None = None,
                  normalize: bool | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Nearest-class-mean (cosine) and linear-probe accuracy of frozen features, all classes at once."""
    import torch.nn.functional as F
    from sklearn.linear_model import LogisticRegression

    from clbench.harness import RunConfig, prepare

    from clbench.catalog import DEFAULT_STRATEGY

    s = prepare(RunConfig(strategy=DEFAULT_STRATEGY, bench=bench, backbone=backbone, img_size=img_size,
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
