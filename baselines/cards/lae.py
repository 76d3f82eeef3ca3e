"""LAE's card: its settings (:class:`LAEConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them without
loading the method (``baselines/lae.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work
from clbench.layers.checks import block_list, check_lr

PETS = ("prefix", "adapter", "lora")
RULES = ("authors", "pilot")


@dataclass(frozen=True)
class LAEConfig:
    """Defaults: PILOT ``exps/lae.json`` (CIFAR-100 B0 Inc10) and ``utils/inc_net.py`` ``LAE``; the offline module's
    start and the first task's freeze follow the authors' ``gqk/LAE`` ``main.py`` (``rules``)."""

    pet: Literal["prefix", "adapter", "lora"] = "prefix"  # "pet_cls": "Prefix"
    blocks: str = "0,1,2,3,4"  # inc_net.py LAE.adapt_blocks = [0, 1, 2, 3, 4] (the authors' adapt_blocks too)
    prefix_length: int = 10  # "pet_length": 10 key and 10 value tokens per block
    bottleneck: int = 5  # "down_sample_dim": 5 (adapter); the authors' vit_lora.yaml rank 5 (LoRA)
    lr: float = 0.0028125  # "init_lr" (Adam, "scheduler": "constant")
    weight_decay: float = 0.0  # "weight_decay": 0
    epochs: int = 5  # "tuned_epoch"
    batch_size: int = 128  # "batch_size" (training; the authors' cifar100 config: 24)
    eval_batch_size: int = 128  # the reference's test loader reuses "batch_size"; speed only (per-sample rows)
    ema_decay: float = 0.9999  # "ema_decay": offline <- decay * offline + (1 - decay) * online, every step
    num_freeze_epochs: int = 3  # "num_freeze_epochs": the online module is frozen (head only) for these epochs
    # "authors": the offline module is a copy of the online one after task 0, and task 0 trains the module from its
    # first epoch (gqk/LAE main.py: ModelEmaV2 made in task 1's setup_model; pre_train_epoch skips task 0).
    # "pilot": PILOT's models/lae.py: the offline copy is made of the untrained module at the start and averaged from
    # the first step of task 0, and every task, task 0 included, freezes the module for num_freeze_epochs.
    rules: Literal["authors", "pilot"] = "authors"

    def __post_init__(self) -> None:
        if self.pet not in PETS:
            raise ValueError(f"pet must be one of {', '.join(repr(p) for p in PETS)}, got {self.pet!r}")
        if self.rules not in RULES:
            raise ValueError(f"rules must be one of {', '.join(repr(r) for r in RULES)}, got {self.rules!r}")
        if not self.block_ids:
            raise ValueError("blocks must name at least one block")
        for name in ("prefix_length", "bottleneck", "epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_lr(self.lr)
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not (isinstance(self.ema_decay, (int, float)) and 0 <= self.ema_decay < 1):
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.num_freeze_epochs < 0:
            raise ValueError(f"num_freeze_epochs must be >= 0, got {self.num_freeze_epochs}")

    @property
    def block_ids(self) -> tuple[int, ...]:
        return block_list(self.blocks, "blocks")


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on 2 cores:
# 112 px input, 2 epochs of which 1 frozen instead of 5 and 3, batches of 32 (at 128 a task of ~390 images is 3 steps
# an epoch). Prefixes add 10 keys to 5 blocks, so a step costs about a plain one (~50 ms CPU per image at 112 px);
# evaluation is two passes (online and offline) per test image: ~8 CPU-min in all.
# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 16 training
# images of each class, 4 epochs (1 frozen) of batches of 16 at lr 0.01, and an offline decay of 0.99 so that a task's
# 48 steps move the offline module part way (0.9999 keeps it at its start). Measured (seed 1993, 2 loaded cores):
# A_3 22.2 % (SimpleCIL on the same split 21.2 %, chance 2.8 %); the reference's lr 0.0028125 over 3 epochs gave 15.5.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {**QUICK_INPUT, "epochs": 2, "num_freeze_epochs": 1, "batch_size": 32},
    "ci": {
        **CI_SHAPE,
        "epochs": 4,
        "num_freeze_epochs": 1,
        "batch_size": 16,
        "lr": 0.01,
        "train_per_class": 16,
        "ema_decay": 0.99,
    },
}

TUNE_SPACE: dict[str, tuple[Any, ...]] = {
    "lr": (1e-4, 0.02, True),
    "ema_decay": (0.99, 0.9999),
    "num_freeze_epochs": (0, 4),
    "pet": PETS,
}


def pet_size(cfg: LAEConfig, d: int, depth: int) -> int:
    """One PET module (the online one; the offline copy has as many numbers), over the configured blocks that exist:
    prefix 2 L d + 2 per block (key and value tokens and their learnable scales), adapter 2 d r + r + d + 1 (down,
    up, biases, scale), LoRA 4 d r + 2 (A and B for key and value, two scales)."""
    n = sum(1 for b in cfg.block_ids if b < depth)
    r = cfg.bottleneck
    per_block = {
        "prefix": 2 * cfg.prefix_length * d + 2,
        "adapter": 2 * d * r + r + d + 1,
        "lora": 4 * d * r + 2,
    }[cfg.pet]
    return n * per_block


def module_trains(cfg: LAEConfig, task: int) -> bool:
    """Whether the online module learns in ``task``: frozen for the first ``num_freeze_epochs`` of every task (only
    of tasks >= 1 under the authors' rules)."""
    frozen = cfg.num_freeze_epochs if (task > 0 or cfg.rules == "pilot") else 0
    return cfg.epochs > frozen


def param_formula(cfg: LAEConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Task 0 adds the online module (learned) and stores its offline copy (an average, learned by no optimiser);
    every task adds its head rows (d + 1 per new class). Trained in task t: the new head rows (the old ones are masked
    out of the loss and, with weight decay 0, never move; with weight decay > 0 Adam decays every seen row) and the
    online module unless it stays frozen the whole task."""
    pet = pet_size(cfg, d, depth)
    added, stored, trainable, seen = [], [], [], 0
    for t, n in enumerate(task_sizes):
        seen += n
        added.append(n * (d + 1) + (pet if t == 0 else 0))
        stored.append(pet if t == 0 else 0)
        rows = seen if cfg.weight_decay > 0 else n
        trainable.append(rows * (d + 1) + (pet if module_trains(cfg, t) else 0))
    return ParamCounts(
        added_per_task=added,
        stored_per_task=stored,
        trainable_per_task=trainable,
        head=seen * (d + 1),
        extra={"pet_params": pet, "offline_params": pet},
    )


def work(cfg: LAEConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward through the ViT with the online module (b; the
    frozen epochs too, whose loss still runs through the ViT to train the head). Prefixes add 2 L keys and values to
    a few blocks, no tokens: a pass costs a plain one. Each seen test image, per evaluation and protocol, goes through
    the ViT twice, with the online and with the offline module (once after task 0 under the authors' rules, where no
    offline module exists yet)."""
    passes = [1 if (t == 0 and cfg.rules == "authors") else 2 for t in range(shape.tasks)]
    test = sum(n * p for n, p in zip(shape.test_seen, passes, strict=True))
    return Work(f=shape.protocols * test, b=cfg.epochs * sum(shape.learnt))


CARD = MethodCard(
    "lae",
    LAEConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="prompts",
    trains="one prefix (or adapter, LoRA) module online, its moving average offline, and the head",
    tune_space=TUNE_SPACE,
)
