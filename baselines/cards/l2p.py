"""L2P's card: its settings (:class:`L2PConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them without
loading the method (``baselines/l2p.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.layers.checks import check_fields, check_prompt_fields, head_sizes


@dataclass(frozen=True)
class L2PConfig:
    """Defaults: PILOT ``exps/l2p.json`` (CIFAR-100 B0 Inc10)."""

    pool_size: int = 10  # "size": prompts in the pool (M)
    prompt_length: int = 5  # "length": tokens per prompt (L)
    top_k: int = 5  # "top_k": prompts chosen per image (k)
    lr: float = 0.001875  # "init_lr" = 0.03 * 16 / 256 (the paper's 0.03 scaled to PILOT's batch 16)
    weight_decay: float = 0.0  # "weight_decay": 0
    epochs: int = 5  # "tuned_epoch"
    batch_size: int = 16  # "batch_size" (training)
    eval_batch_size: int = 16  # PILOT's test loader reuses "batch_size": the batches of the 'reference' protocol
    pull_coeff: float = 0.1  # "pull_constraint_coeff" (with "pull_constraint": true)
    train_selection: Literal["batchwise", "per-sample"] = "batchwise"  # "batchwise_prompt": true, also in training
    query: Literal["augmented", "cached"] = "augmented"  # PromptVitNet: original backbone on the augmented batch
    # "linear": the reference's linear head. "kac": the Kolmogorov-Arnold classifier of KAC (Hu et al., CVPR 2025;
    # Ethanhuhuhu/KAC models/kac_clf.py, clbench/layers/kan.py) in its place, everything else unchanged (the
    # authors' clf_type: kac configs change nothing else)
    head: Literal["linear", "kac"] = "linear"

    def __post_init__(self) -> None:
        sizes = ("pool_size", "prompt_length", "top_k", "epochs", "batch_size", "eval_batch_size")
        check_prompt_fields(self, sizes, ("weight_decay", "pull_coeff"))
        if self.top_k > self.pool_size:
            raise ValueError(f"top_k ({self.top_k}) must be <= pool_size ({self.pool_size})")
        check_fields(self, choices={"train_selection": ("batchwise", "per-sample")})


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores within 15 minutes: 112 px input (8x8 patches of 14 px; the emoji images are 64 px), the cached query
# (saves one backbone pass per training image) and 3 epochs instead of 5. Measured on one core at 112 px:
# ~67 ms CPU per training image, ~28 ms per test image and protocol, so ~12 CPU-minutes in all.
# ``ci``: the regression gate's run (.ci/run, reports/gate/README.md): the embedded benchmark at 56 px (4x4
# patches of 14 px) so that every CI run shares one feature cache and the whole gate fits in 8 minutes on 2 cores.
# L2P runs 3 tasks of 12 classes (evaluation after each task costs one prompted ViT pass per seen test image and
# protocol) and learns from the first 8 training images of each class for 4 epochs at lr 0.01 (the ViT backward
# dominates: the same 32 image passes per class as 2 epochs of 16 images, in 24 steps; at the reference's lr
# 0.001875 the loss ended at 0.97 of its first epoch, now ~0.5: reports/gate/README.md).
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "query": "cached", "epochs": 3},
    "ci": {
        **CI_SHAPE,
        "query": "cached",
        "epochs": 4,
        "train_per_class": 8,
        "lr": 0.01,
    },
}


def work(cfg: L2PConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one prompted forward + backward (the prompts enter the ViT), and
    with ``query="augmented"`` one frozen forward for the query, since the reference queries the augmented image,
    which changes every epoch and so cannot be cached (``query="cached"`` uses the cached feature instead).
    Training: every epoch, every image once prompted through the ViT with a backward pass (b, scaled by the
    prompt tokens: k = (tokens + top_k * prompt_length) / tokens, a linear token-count scaling), plus one frozen
    pass for the query unless ``query="cached"``. Evaluation after task t, per protocol: every seen test image
    once prompted (k f) plus its query (f; the reference recomputes it)."""
    n_train = sum(shape.learnt)
    k = (shape.tokens + cfg.top_k * cfg.prompt_length) / shape.tokens
    query = 0.0 if cfg.query == "cached" else 1.0
    return Work(
        f=query * cfg.epochs * n_train + shape.protocols * sum(shape.test_seen) * (query + k),
        b=cfg.epochs * n_train * k,
    )


def param_formula(cfg: L2PConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    pool = cfg.pool_size * cfg.prompt_length * d + cfg.pool_size * d  # prompts and their keys
    row, shared = head_sizes(cfg.head, d)  # per class; the KAC head's LayerNorm (added in task 0, trained in each)
    added, trainable, seen = [], [], 0
    for t, c in enumerate(task_sizes):
        seen += c
        new_rows = c * row
        added.append(new_rows + (pool + shared if t == 0 else 0))
        trainable.append(pool + shared + (seen * row if cfg.weight_decay > 0 else new_rows))
    return ParamCounts(added_per_task=added, trainable_per_task=trainable, head=seen * row + shared)


# `clbench tune`: the prompt learning rate on a log scale; study it at a short budget (e.g. --set epochs=1)
TUNE_SPACE: dict[str, tuple[Any, ...]] = {"lr": (1e-4, 0.05, True)}

CARD = MethodCard(
    "l2p",
    L2PConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="prompts",
    trains="a pool of prompts with keys, and the head",
    tune_space=TUNE_SPACE,
    embedding="L2P's prompted [CLS] (mean of the prompt tokens)",
)
