"""DualPrompt's card: its settings (:class:`DualPromptConfig`, the defaults its reference uses), its named profiles,
its parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/dualprompt.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work, prefix_prompt_work
from clbench.layers.checks import block_list as _block_list
from clbench.layers.checks import check_fields, check_prompt_fields, head_sizes


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
    # "linear": the reference's linear head. "kac": the Kolmogorov-Arnold classifier of KAC (Hu et al., CVPR 2025;
    # Ethanhuhuhu/KAC models/kac_clf.py, clbench/layers/kan.py) in its place, everything else unchanged (the
    # authors' clf_type: kac configs change nothing else)
    head: Literal["linear", "kac"] = "linear"

    def __post_init__(self) -> None:
        sizes = ("g_prompt_length", "e_prompt_length", "pool_size", "epochs", "batch_size", "eval_batch_size")
        check_prompt_fields(self, sizes, ("weight_decay", "pull_coeff"))
        g, e = self.g_layers, self.e_layers  # raise ValueError on a malformed list
        if set(g) & set(e):
            raise ValueError(f"g_prompt_layers {g} and e_prompt_layers {e} must not share a block")
        if not e:
            raise ValueError("e_prompt_layers must name at least one block")
        check_fields(self, choices={"kv_layout": ("paired", "pilot")})

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
    "default": {},
    "quick": {"img_size": 112, "epochs": 2},
    "ci": {**CI_SHAPE, "epochs": 2, "train_per_class": 16},
}


def prompt_layers(cfg: DualPromptConfig, depth: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The configured G- and E-prompt blocks that exist in a ViT of ``depth`` blocks."""
    return tuple(i for i in cfg.g_layers if i < depth), tuple(i for i in cfg.e_layers if i < depth)


def param_formula(cfg: DualPromptConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Task 0 adds the G-prompt n_g * 2 * L_g * d; every task t adds its E-prompt slot n_e * 2 * L_e * d, its key d and
    its head rows (d + 1) per new class. Trained in task t: the G-prompt, slot t, key t and the new head rows. Under
    Adam weight decay > 0 (not the reference's default, 0) every tensor in the optimizer moves: every seen head row, and
    every slot and key of the pool, which decay although only slot t and key t learn (the test that measures moved
    elements found this). The pool's unused slots are allocated up front (``extra``)."""
    g_layers, e_layers = prompt_layers(cfg, depth)
    g = len(g_layers) * 2 * cfg.g_prompt_length * d
    e = len(e_layers) * 2 * cfg.e_prompt_length * d
    row, shared = head_sizes(cfg.head, d)  # per class; the KAC head's LayerNorm (added in task 0, trained in each)
    added, trainable, n_seen = [], [], 0
    for t, n in enumerate(task_sizes):
        n_seen += n
        rows = n * row
        added.append(e + d + rows + (g + shared if t == 0 else 0))
        decayed = cfg.weight_decay > 0
        trainable.append(g + shared + (cfg.pool_size * (e + d) + n_seen * row if decayed else e + d + rows))
    return ParamCounts(
        added_per_task=added,
        trainable_per_task=trainable,
        head=n_seen * row + shared,
        extra={"g_prompt": g, "e_prompt_per_slot": e, "pool_allocated": cfg.pool_size * (e + d)},
    )


def work(cfg: DualPromptConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one prefix-prompted forward + backward with the task's own E-prompt, and
    with ``query="augmented"`` one frozen forward whose query only feeds the pull term (the augmented image changes
    every epoch, so it cannot be cached; ``query="cached"`` uses the cached feature instead). The frozen features of
    every image (queries; cacheable), one query pass per training image and epoch with ``query="augmented"``, ``epochs``
    prompted training passes per training image, and one prompted pass per seen test image, evaluation and protocol.
    Prefixes add no tokens: a prompted pass costs a plain one. With the run's ``train_per_class`` only the first k
    images of each class are trained on (all are in the feature cache)."""
    return prefix_prompt_work(cfg.epochs, cfg.query, shape)


CARD = MethodCard(
    "dualprompt",
    DualPromptConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="prompts",
    trains="a shared G-prompt, per-task E-prompts with keys, and the head",
    embedding="DualPrompt's prompted [CLS]",
)
