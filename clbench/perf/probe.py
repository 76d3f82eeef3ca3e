"""``clbench perf feature-probe``: how well a backbone's frozen features separate a benchmark's classes at a given
input size and normalisation (nearest-class-mean and logistic-regression accuracy on all classes at once); used to
choose the embedded benchmark's input size."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from clbench.core.catalog import DEFAULT_STRATEGY
from clbench.perf import arg, backbone_args, measurement


def feature_probe(
    bench: str = "emoji",
    backbone: str | None = None,
    img_size: int | None = None,
    normalize: bool | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Nearest-class-mean (cosine) and linear-probe accuracy of frozen features, all classes at once."""
    import torch.nn.functional as F
    from sklearn.linear_model import LogisticRegression

    # deferred: loads numpy, which importing this module does not
    from clbench.run.harness import RunConfig, prepare

    s = prepare(
        RunConfig(strategy=DEFAULT_STRATEGY, bench=bench, backbone=backbone, img_size=img_size, normalize=normalize)
    )
    ftr, fte = F.normalize(s.features["train"], dim=1), F.normalize(s.features["test"], dim=1)
    ytr, yte = torch.as_tensor(s.bench.train_y), torch.as_tensor(s.bench.test_y)
    protos = torch.stack([ftr[ytr == c].mean(0) for c in range(s.bench.n_classes)])
    ncm = float(((fte @ F.normalize(protos, dim=1).T).argmax(1) == yte).float().mean() * 100)
    clf = LogisticRegression(max_iter=2000).fit(ftr.numpy(), ytr.numpy())
    linear = float(clf.score(fte.numpy(), yte.numpy()) * 100)
    log(
        f"{bench} {s.backbone.spec.name} @ {s.backbone.img_size} ({s.eval_tf.identity()}): "
        f"nearest-class-mean {ncm:.2f} %, linear probe {linear:.2f} %"
    )
    return {
        "benchmark": "feature-probe",
        "bench": bench,
        "backbone": s.backbone.spec.name,
        "weights_digest": s.backbone.digest,
        "img_size": s.backbone.img_size,
        "transform": s.eval_tf.identity(),
        "ncm_acc": ncm,
        "linear_probe_acc": linear,
    }


@measurement(
    "feature-probe",
    help="nearest-class-mean and linear-probe accuracy of a backbone's frozen features on all of a benchmark's "
    "classes at once, at an input size and normalisation",
    args=(
        *backbone_args(),
        arg("--bench", default="emoji", help="benchmark (default: emoji)"),
        arg(
            "--normalize",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="apply the backbone's mean/std (default: the benchmark's choice)",
        ),
    ),
)
def _feature_probe(flags: argparse.Namespace) -> dict[str, Any]:
    return feature_probe(flags.bench, flags.backbone, flags.img_size, flags.normalize)
