"""SD-LoRA's card: its settings (:class:`SDLoRAConfig`, the defaults of its reference), its named profiles, its
parameter formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them
without loading the method (``baselines/sd_lora.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clbench.core.catalog import QUICK_INPUT, MethodCard
from clbench.core.config import CI_SHAPE
from clbench.core.costs import ParamCounts, RunShape, Work, lora_task_size

# SD-LoRA-RR, the rank reduction of the reference (``models/sdlora.py``, ``update_network``, commented out there):
# rank 10 for tasks 0-3, 8 for tasks 4-7, 6 from task 8 on
RR_SCHEDULE = "10,10,10,10,8,8,8,8,6"


def _int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{name} must hold integers >= 1, got {text!r}")
    return values


@dataclass(frozen=True)
class SDLoRAConfig:
    """Defaults: the reference's ``exps/sdlora_c100.json`` (CIFAR-100 B0 Inc10) as ``models/sdlora.py`` reads it (SGD,
    momentum 0.9, no weight decay, ``MultiStepLR``: the file's ``optimizer``/``scheduler`` keys are never read)."""

    rank: int = 10  # update_network / get_backbone: ``rank=10`` (queries and values of every block)
    # SD-LoRA-RR: per-task ranks, comma-separated, the last one repeated ("" = ``rank`` for every task)
    rank_schedule: str = ""
    magnitude_init: float = 0.8  # LoRA_ViT_timm: ``nn.Parameter(torch.Tensor([0.8]))`` for every magnitude
    # "reset": every task starts all magnitudes at magnitude_init again (the reference builds a new network per
    # task); "keep": old magnitudes carry their learnt values into the next task
    magnitudes: Literal["reset", "keep"] = "reset"
    init_lr: float = 0.008  # "init_lr" (task 0)
    lr: float = 0.008  # "lrate" (tasks 1 on)
    momentum: float = 0.9  # optim.SGD(..., momentum=0.9)
    weight_decay: float = 0.0  # _train passes none ("init_weight_decay" is commented out)
    epochs: int = 20  # "init_epoch" = "epochs"
    batch_size: int = 128  # "batch_size"
    init_milestones: str = "60,120,170"  # "init_milestones" (MultiStepLR, stepped per epoch; past 20 epochs)
    init_lr_decay: float = 0.1  # "init_lr_decay"
    milestones: str = "40,70"  # "milestones"
    lr_decay: float = 0.0  # "lrate_decay"
    float64: bool = False  # compute in float64 (the ci profile: the same numbers under every CPU's kernels)

    def __post_init__(self) -> None:
        for name in ("rank", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("init_lr", "lr"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        for name in ("weight_decay", "init_lr_decay", "lr_decay", "momentum"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        if not math.isfinite(self.magnitude_init):
            raise ValueError(f"magnitude_init must be a finite number, got {self.magnitude_init}")
        if self.magnitudes not in ("reset", "keep"):
            raise ValueError(f"magnitudes must be 'reset' or 'keep', got {self.magnitudes!r}")
        _int_list(self.rank_schedule, "rank_schedule")
        _int_list(self.init_milestones, "init_milestones")
        _int_list(self.milestones, "milestones")

    def rank_of(self, task: int) -> int:
        """The rank of task ``task``'s LoRA pair."""
        ranks = _int_list(self.rank_schedule, "rank_schedule")
        if not ranks:
            return self.rank
        return ranks[min(task, len(ranks) - 1)]

    def schedule(self, task: int) -> tuple[float, tuple[int, ...], float]:
        """(lr, milestones, decay) of task ``task``: MultiStepLR multiplies lr by decay at each milestone epoch."""
        if task == 0:
            return self.init_lr, _int_list(self.init_milestones, "init_milestones"), self.init_lr_decay
        return self.lr, _int_list(self.milestones, "milestones"), self.lr_decay


# ``ci``: the regression gate's run: the embedded benchmark at 56 px, 3 tasks of 12 classes, the first 8 training
# images of each class, 8 epochs of batch 16 (6 steps an epoch) at the reference's lr 0.008, float64 (as InfLoRA's
# ci: fp32 gate numbers drift between CPU kernels after training through the ViT). Measured (2 shared cores, Xeon
# AVX-512): loss 3.99 -> 0.47 on task 0, A_T 25.37 against 21.23 for the untrained control (SimpleCIL at the same
# split and images per class), 428 s. Tried first: 4 epochs of batch 32 (A_T 11.78), lr 0.05 or 0.02 (the loss
# climbs: 7.8 -> 19.4 at 0.05). ``quick``: a short CPU run of the embedded benchmark at 112 px: 3 epochs of batch 16
# at the reference's lr. ``reference-imr``: the reference's ImageNet-R budget (``exps/sdlora_inr.json``: lr 0.01, no
# decay); ``reference-ina``: its ImageNet-A one (``exps/sdlora_ina.json``: lr 0.01 then 0.005, x0.05 at epochs 10
# and 15); ``reference-rr``: SD-LoRA-RR (the rank schedule commented out in ``models/sdlora.py``).
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {**QUICK_INPUT, "epochs": 3, "batch_size": 16},
    "ci": {**CI_SHAPE, "epochs": 8, "train_per_class": 8, "batch_size": 16, "float64": True},
    "reference-imr": {"init_lr": 0.01, "lr": 0.01, "init_milestones": "", "milestones": ""},
    "reference-ina": {
        "init_lr": 0.01,
        "lr": 0.005,
        "init_milestones": "10,15",
        "init_lr_decay": 0.05,
        "milestones": "10,15",
        "lr_decay": 0.05,
    },
    "reference-rr": {"rank_schedule": RR_SCHEDULE},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def param_formula(cfg: SDLoRAConfig, d: int, depth: int, task_sizes: Sequence[int]) -> ParamCounts:
    """Task t adds its LoRA pair on the queries and values of every block (2 x depth x 2 d r_t), its magnitude (one
    number shared by every block) and its head rows (d + 1 per class); it trains that pair, the magnitudes of
    tasks 0..t and its head rows. Nothing else is stored."""
    added, trainable = [], []
    for t, c in enumerate(task_sizes):
        lora = lora_task_size(depth, d, cfg.rank_of(t))
        added.append(lora + 1 + c * (d + 1))
        trainable.append(lora + (t + 1) + c * (d + 1))
    return ParamCounts(
        added_per_task=added,
        trainable_per_task=trainable,
        head=sum(task_sizes) * (d + 1),
        stored_per_task=[0] * len(task_sizes),
        extra={"lora_per_task": [lora_task_size(depth, d, cfg.rank_of(t)) for t in range(len(task_sizes))]},
    )


def work(cfg: SDLoRAConfig, shape: RunShape) -> Work:
    """Per task: ``epochs`` forward + backward passes over its training images (the branches add no tokens: b
    costs a plain training pass), and one LoRA pass per seen test image after every task and protocol (the
    branches change the features, so the feature cache cannot serve them)."""
    return Work(f=shape.protocols * sum(shape.test_seen), b=cfg.epochs * sum(shape.learnt))


CARD = MethodCard(
    "sd_lora",
    SDLoRAConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="lora",
    trains="per-task LoRA on queries and values (directions frozen after their task), every task's magnitude, "
    "and the head",
    tune_space={"lr": (1e-3, 1e-1, True), "init_lr": (1e-3, 1e-1, True), "rank": (2, 32, True)},
    embedding="SD-LoRA's [CLS] through the magnitude-scaled LoRA branches",
)
