"""DualPrompt's card: its settings (:class:`DualPromptConfig`, the defaults its reference uses) and its named profiles,
torch-free, so that reports, the gate and the CLI read them without loading the method
(``baselines/dualprompt.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from clbench.catalog import MethodCard
from clbench.config import CI_SHAPE
from clbench.layers.checks import block_list as _block_list


@dataclass(frozen=True)
class DualPromptConfig:
    """Defaults: PILOT ``exps/dualprompt.json`` (CIFAR-100 B0 Inc10)."""

    g_prompt_length: int = 5  # "g_prompt_length"
    g_prompt_layers: str = "0,1"  # "g_prompt_layer_idx": [0, 1] (comma-separated block indices)
    e_prompt_length: int = 5  # "length"
    e_prompt_layers: str = "2,3,4"  # "e_prompt_layer_idx": [2, 3, 4]
    pool_size: int = 10  # "size": E-prompt slots (one per task; must be >= the number of tasks)
    lr: float = 0.001  # "init_lr" (Adam, constant)
    weight_decay: float = 0.0  # "weight_decay": 0
    epochs: int = 5  # "tuned_epoch"
    batch_size: int = 24  # "batch_size" (training)
    eval_batch_size: int = 24  # PILOT's test loader reuses "batch_size": the batches of the 'reference' protocol
    pull_coeff: float = 0.1  # "pull_constraint_coeff" (with "pull_constraint": true)
    copy_prompt: bool = True  # "shared_prompt_pool": slot t starts as a copy of slot t - 1
    match_unseen_keys: bool = False  # True: PILOT's matching over all pool keys, untrained ones included
    kv_layout: Literal["paired", "pilot"] = "paired"  # "pilot": PILOT's E-prompt reshape without a permute
    query: Literal["augmented", "cached"] = "augmented"  # PromptVitNet: original backbone on the augmented batch

    def __post_init__(self) -> None:
        for name in ("g_prompt_length", "e_prompt_length", "pool_size", "epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        g, e = self.g_layers, self.e_layers  # raise ValueError on a malformed list
        if set(g) & set(e):
            raise ValueError(f"g_prompt_layers {g} and e_prompt_layers {e} must not share a block")
        if not e:
            raise ValueError("e_prompt_layers must name at least one block")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        for name in ("weight_decay", "pull_coeff"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        if self.query not in ("augmented", "cached"):
            raise ValueError(f"query must be 'augmented' or 'cached', got {self.query!r}")
        if self.kv_layout not in ("paired", "pilot"):
            raise ValueError(f"kv_layout must be 'paired' or 'pilot', got {self.kv_layout!r}")

    @property
    def g_layers(self) -> tuple[int, ...]:
        return _block_list(self.g_prompt_layers, "g_prompt_layers")

    @property
    def e_layers(self) -> tuple[int, ...]:
        return _block_list(self.e_prompt_layers, "e_prompt_layers")


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores within ~15 minutes: 112 px input and 2 epochs instead of 5 (prefixes add no tokens, so a prompted pass
# costs a plain ViT pass). The training query stays the reference's: a frozen pass on the augmented image. With
# L2P/EASE's unit costs at 112 px (~50 ms CPU per training step and image, ~21 ms per frozen pass): training
# ~330 s, evaluation ~70 s per protocol, ~8 CPU-min with both protocols.
# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 16
# training images of each class, 2 epochs (its two protocols give the same matrix there: reports/gate/README.md).
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"img_size": 112, "epochs": 2},
    "ci": {**CI_SHAPE, "epochs": 2, "train_per_class": 16},
}
CARD = MethodCard("dualprompt", DualPromptConfig, PROFILES)
