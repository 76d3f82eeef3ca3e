"""CodaPrompt's card: its settings (:class:`CodaPromptConfig`, the defaults its reference uses), its named profiles,
its parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and the projections read them
without loading the method (``baselines/coda_prompt.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work, prefix_prompt_work
from clbench.layers.checks import block_list, check_fields, check_prompt_fields, head_sizes


@dataclass(frozen=True)
class CodaPromptConfig:
    """Defaults: the authors' ``configs/cifar-100_prompt.yaml`` + ``experiments/cifar-100.sh``
    (= PILOT ``exps/coda_prompt.json``)."""

    components_per_task: int = 10  # prompt_param[0] / tasks: 100 components over 10 tasks
    prompt_length: int = 8  # prompt_param[1]: L / 2 prefix keys and L / 2 prefix values
    ortho_mu: float = 0.0  # prompt_param[2]: weight of the orthogonality penalty
    prompt_layers: str = "0,1,2,3,4"  # CodaPrompt.e_layers
    lr: float = 0.001  # "lr" (Adam, betas (0.9, 0.999) = "momentum" 0.9)
    weight_decay: float = 0.0  # "weight_decay"
    epochs: int = 20  # "schedule": [20]
    batch_size: int = 128  # "batch_size"
    schedule: Literal["cosine", "constant"] = "cosine"  # "schedule_type": cosine (the reference's CosineSchedule)
    query: Literal["augmented", "cached"] = "augmented"  # ViTZoo.forward: frozen pass on the augmented batch
    # "linear": the reference's linear head. "kac": the Kolmogorov-Arnold classifier of KAC (Hu et al., CVPR 2025;
    # Ethanhuhuhu/KAC models/kac_clf.py, clbench/layers/kan.py) in its place, everything else unchanged (the
    # authors' clf_type: kac configs change nothing else)
    head: Literal["linear", "kac"] = "linear"

    def __post_init__(self) -> None:
        check_prompt_fields(self, ("components_per_task", "epochs", "batch_size"), ("weight_decay", "ortho_mu"))
        if self.prompt_length < 2 or self.prompt_length % 2:
            raise ValueError(f"prompt_length must be an even number >= 2, got {self.prompt_length}")
        if not self.layers:
            raise ValueError("prompt_layers must name at least one block")
        check_fields(self, choices={"schedule": ("cosine", "constant")})

    @property
    def layers(self) -> tuple[int, ...]:
        return block_list(self.prompt_layers, "prompt_layers")


# ``quick``: the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on 2 CPU
# cores: 112 px, 2 epochs, batch 32 (the reference's 128 gives ~4 steps per epoch on a ~390-image task),
# cached training query, 16 components per task (int(100 / 6)). ``ci``: the gate's run: 56 px, 3 tasks of 12
# classes, the first 16 training images of each class, 2 epochs of batch 32 (6 steps per epoch), cached
# training query (one backbone pass less per step; the tests train with the augmented one). ``reference-6tasks``: the
# reference's budget (its defaults, stated) with its 100-component pool spread over a 6-task split, the embedded
# benchmark's (int(100 / 6) = 16 per task, as ``quick``); on a 10-task split the defaults are that budget.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 2, "batch_size": 32, "query": "cached", "components_per_task": 16},
    "ci": {
        **CI_SHAPE,
        "epochs": 2,
        "batch_size": 32,
        "train_per_class": 16,
        "components_per_task": 16,
        "query": "cached",
    },
    "reference-6tasks": {"epochs": 20, "batch_size": 128, "lr": 0.001, "components_per_task": 16},
}


def used_layers(cfg: CodaPromptConfig, depth: int) -> tuple[int, ...]:
    """The configured prompt blocks that exist in a ViT of ``depth`` blocks."""
    return tuple(i for i in cfg.layers if i < depth)


def param_formula(cfg: CodaPromptConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Every task t adds ``components_per_task`` components per prompt block, each a key d, an attention
    vector d and a prompt L * d, and its head rows (d + 1) per new class. Trained in task t: its own
    components and the head rows that move (new rows only; the earlier components too, and every seen row,
    under Adam weight decay > 0, which acts on their zero gradients)."""
    n_l = len(used_layers(cfg, depth))
    per_task = n_l * cfg.components_per_task * (2 * d + cfg.prompt_length * d)
    row, shared = head_sizes(cfg.head, d)  # per class; the KAC head's LayerNorm (added in task 0, trained in each)
    added, trainable, n_seen = [], [], 0
    for t, n in enumerate(task_sizes):
        n_seen += n
        rows = n * row
        added.append(per_task + rows + (shared if t == 0 else 0))
        trainable.append(shared + (per_task * (t + 1) + n_seen * row if cfg.weight_decay > 0 else per_task + rows))
    return ParamCounts(
        added_per_task=added,
        trainable_per_task=trainable,
        head=n_seen * row + shared,
        extra={"components_per_task": per_task},
    )


def work(cfg: CodaPromptConfig, shape: RunShape) -> Work:
    """The frozen features of every image (queries; cacheable), one query pass per training image and epoch
    with ``query="augmented"`` (the augmented image changes every epoch), ``epochs`` prompted training passes
    per learnt image and one prompted pass per seen test image and evaluation. Prefixes add no tokens: a
    prompted pass costs a plain one (the component sums are O(M d L) per image and block, negligible)."""
    return prefix_prompt_work(cfg.epochs, cfg.query, shape)


CARD = MethodCard(
    "coda_prompt",
    CodaPromptConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="prompts",
    trains="prompt components, their keys and attention, and the head",
    embedding="CODA-Prompt's prompted [CLS]",
)
