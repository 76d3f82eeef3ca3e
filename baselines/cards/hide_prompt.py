"""HiDePrompt's card: its settings (:class:`HiDePromptConfig`, the defaults its reference uses), its named profiles,
its parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/hide_prompt.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.layers.checks import block_list as _block_list

Storage = Literal["multi-centroid", "covariance", "variance"]


@dataclass(frozen=True)
class HiDePromptConfig:
    """Defaults: ``training_scripts/train_cifar100_vit.sh`` over ``configs/cifar100_hideprompt_5e.py`` (learning
    rates already multiplied by batch / 256 where the trainer does: ``unscale_lr`` True)."""

    e_prompt_length: int = 5  # stage 2 "--length 5" (ImageNet-R: 20)
    e_prompt_layers: str = "0,1,2,3,4"  # "e_prompt_layer_idx" default [0, 1, 2, 3, 4]
    pool_size: int = 10  # "size": one slot per task (must be >= the number of tasks)
    lr: float = 0.03 * 24 / 256  # "--lr" default 0.03 (stage 2 passes none) x batch / 256: the prompt group
    head_lr_scale: float = 0.1  # "--larger_prompt_lr": the non-prompt group (the head) at 0.1 x lr
    epochs: int = 50  # stage 2 "--epochs 50" (ImageNet-R: 150)
    schedule: Literal["step", "cosine", "constant"] = "step"  # stage 2 "--sched step" (ImageNet-R: cosine)
    decay_epochs: int = 30  # "--decay-epochs" (step schedule)
    decay_rate: float = 0.1  # "--decay-rate"
    min_lr: float = 1e-5  # "--min-lr" (cosine schedule floor)
    batch_size: int = 24  # "--batch-size 24" (both stages)
    eval_batch_size: int = 24  # the test loaders reuse "--batch-size": the batches of the 'reference' protocol
    clip_grad: float = 1.0  # "--clip-grad" (both stages' training; not the alignments)
    prompt_momentum: float = 0.01  # "--prompt_momentum 0.01"
    reg: float = 0.1  # "--reg 0.1" (ImageNet-R: 0.5): weight of the contrastive regulariser
    orth_temperature: float = 0.8  # orth_loss: M M^T / 0.8 (hard-coded)
    copy_prompt: bool = True  # "shared_prompt_pool": slot t starts as a copy of slot t - 1
    ca_epochs: int = 30  # "--crct_epochs 30" (both alignments)
    ca_lr: float = 0.005  # "--ca_lr 0.005": TAP (the stage-2 trainer does not rescale it)
    ca_momentum: float = 0.9  # train_task_adaptive_prediction: SGD momentum 0.9
    # SGD(weight_decay=5e-4) is overridden by the param group's "weight_decay": args.weight_decay, which is 0.0: of the
    # config's duplicate "--weight-decay" (default 0.0) and "--weight_decay" (5e-4), argparse keeps the first default
    ca_weight_decay: float = 0.0
    ca_samples_scale: int = 5  # TAP: num_sampled_pcls = batch_size * 5 (per centroid)
    ca_storage: Storage = "multi-centroid"  # "ca_storage_efficient_method"
    n_centroids: int = 10  # "n_centroids"
    cov_eps: float = 1e-4  # + 1e-4 I on every sampled covariance
    tii_epochs: int = 20  # stage 1 "--epochs 20"
    tii_lr: float = 0.0005 * 24 / 256  # stage 1 "--lr 0.0005" x batch / 256
    tii_mlp_ratio: int = 2  # "original_model_mlp_structure" [2]
    tii_ca_lr: float = 0.005 * 24 / 256  # stage 1 rescales "--ca_lr" by batch / 256
    tii_ca_samples_scale: int = 1  # TII alignment: num_sampled_pcls = batch_size
    tii_input: Literal["augmented", "cached"] = "cached"  # "augmented": the reference's frozen pass per augmented image
    kv_layout: Literal["paired", "pilot"] = "paired"  # "pilot": EPrompt's reshape without a permute

    def __post_init__(self) -> None:
        for name in (
            "e_prompt_length",
            "pool_size",
            "batch_size",
            "eval_batch_size",
            "ca_samples_scale",
            "n_centroids",
            "tii_mlp_ratio",
            "tii_ca_samples_scale",
            "decay_epochs",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("epochs", "ca_epochs", "tii_epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.e_layers:
            raise ValueError("e_prompt_layers must name at least one block")
        for name in ("lr", "ca_lr", "tii_lr", "tii_ca_lr", "orth_temperature", "head_lr_scale"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        for name in ("clip_grad", "reg", "ca_momentum", "ca_weight_decay", "cov_eps", "min_lr", "decay_rate"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        if not 0 <= self.prompt_momentum <= 1:
            raise ValueError(f"prompt_momentum must be in [0, 1], got {self.prompt_momentum}")
        for name, allowed in (
            ("schedule", ("step", "cosine", "constant")),
            ("ca_storage", ("multi-centroid", "covariance", "variance")),
            ("tii_input", ("augmented", "cached")),
            ("kv_layout", ("paired", "pilot")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

    @property
    def e_layers(self) -> tuple[int, ...]:
        return _block_list(self.e_prompt_layers, "e_prompt_layers")

    @property
    def centroids_per_class(self) -> int:
        return self.n_centroids if self.ca_storage == "multi-centroid" else 1


# ``quick``: a CPU run on the embedded benchmark (2,320 training / 942 test images, 6 tasks) at 112 px, the first
# 32 training images per class, 3 prompt epochs, 5 TII epochs on cached features, 10 alignment epochs.
# ``ci``: the regression gate's run: 56 px, 3 tasks of 12 classes, the first 16 training images of each class,
# 2 prompt epochs, 5 TII epochs on the cached features, 5 alignment epochs.
# ``reference``: the reference's CIFAR-100 script exactly (the defaults with the TII on augmented images);
# ``reference-imr``: its ImageNet-R script (150 epochs, cosine, prompt length 20, reg 0.5).
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "reference": {"tii_input": "augmented"},
    "reference-imr": {
        "tii_input": "augmented",
        "epochs": 150,
        "schedule": "cosine",
        "e_prompt_length": 20,
        "reg": 0.5,
    },
    "quick": {
        "img_size": 112,
        "epochs": 3,
        "tii_epochs": 5,
        "ca_epochs": 10,
        "train_per_class": 32,
    },
    "ci": {
        **CI_SHAPE,
        "epochs": 2,
        "tii_epochs": 5,
        "ca_epochs": 5,
        "train_per_class": 16,
    },
}


def e_layers_in(cfg: HiDePromptConfig, depth: int) -> tuple[int, ...]:
    """The configured E-prompt blocks that exist in a ViT of ``depth`` blocks."""
    return tuple(i for i in cfg.e_layers if i < depth)


def tii_mlp_size(d: int, ratio: int) -> int:
    """The TII MLP's parameters (``TIIHead`` without its head): Linear d -> r d, Linear r d -> d, LayerNorm d."""
    return (d * ratio * d + ratio * d) + (ratio * d * d + d) + 2 * d


def param_formula(cfg: HiDePromptConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Task 0 adds the TII MLP (2 r d^2 + (r + 3) d); every task t adds its prompt slot n_e * 2 * L * d and,
    per new class, a classifier row and a TII row (d + 1 each). Stored per new class: for each of the two
    feature spaces (prompted, frozen) K centroids and variances (2 K d; K = ``n_centroids``), or mean and
    covariance (d + d^2), or mean and variance (2 d). Trained in task t: the TII MLP, slot t and the new rows
    of both heads; from task 1 on the alignments move every seen row of both heads (every seen class is sampled)."""
    layers = len(e_layers_in(cfg, depth))
    slot = layers * 2 * cfg.e_prompt_length * d
    mlp = tii_mlp_size(d, cfg.tii_mlp_ratio)
    per_class = {
        "multi-centroid": 2 * cfg.n_centroids * d,
        "covariance": d + d * d,
        "variance": 2 * d,
    }[cfg.ca_storage]
    added, stored, trainable, seen = [], [], [], 0
    for t, n in enumerate(task_sizes):
        seen += n
        added.append(slot + 2 * n * (d + 1) + (mlp if t == 0 else 0))
        stored.append(2 * n * per_class)
        rows = seen if t >= 1 and cfg.ca_epochs > 0 else n
        trainable.append(mlp + slot + 2 * rows * (d + 1))
    return ParamCounts(
        added_per_task=added,
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=seen * (d + 1),
        extra={"e_prompt_per_slot": slot, "pool_allocated": cfg.pool_size * slot, "tii_mlp": mlp},
    )


def work(cfg: HiDePromptConfig, shape: RunShape) -> Work:
    """Training: ``epochs`` prompted forward + backward passes per learnt image; with ``tii_input="augmented"``
    ``tii_epochs`` frozen passes per learnt image (the augmented image changes every epoch: not cacheable); end
    of task: one prompted pass per learnt image (statistics under slot t); evaluation: one prompted pass per
    seen test image and protocol. The frozen features of every image (the TII's input at evaluation and its
    statistics) are cacheable. Heads, MLP, k-means and alignments act on d-vectors (negligible)."""
    n_train, n_test = sum(shape.train_per_task), shape.test_seen[-1]
    n_learn = sum(shape.learnt)
    cached = n_train + n_test
    tii = cfg.tii_epochs * n_learn if cfg.tii_input == "augmented" else 0.0
    return Work(
        f=cached + tii + n_learn + shape.protocols * sum(shape.test_seen),
        b=cfg.epochs * n_learn,
        f_cacheable=cached,
    )


CARD = MethodCard(
    "hide_prompt",
    HiDePromptConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="prompts",
    trains="per-task prefix prompts, a task-identity head and the head",
    embedding="HiDe-Prompt's prompted [CLS] under the inferred task's prompt",
)
