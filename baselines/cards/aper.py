"""APER's card: its settings (:class:`APERConfig`, the defaults its reference uses), its named profiles, its parameter
formula and its cost model, torch-free, so that reports, the gate, the CLI and ``clbench perf`` read them without
loading the method (``baselines/aper.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clbench.core.catalog import MethodCard, rest_stored
from clbench.core.config import CI_FIRST_SESSION
from clbench.core.costs import ParamCounts, RunShape, Work, adapter_set_size, plain_vit_params
from clbench.layers.checks import check_first_session_fields


@dataclass(frozen=True)
class APERConfig:
    """Defaults: PILOT ``exps/aper_aperpter.json`` (CIFAR-100 B0 Inc10) and ``utils/inc_net.py`` ``tuning_config``. The
    other adaptations' reference settings are the profiles ``reference-ssf``, ``reference-vpt``,
    ``reference-vpt-shallow`` and ``reference-finetune`` (PILOT ``exps/aper_ssf.json``,
    ``aper_vpt_deep.json``, ``aper_vpt_shallow.json``, ``aper_finetune.json``)."""

    adapt: str = "adapter"  # the first-session adaptation: PILOT's models aper_adapter / _finetune / _ssf / _vpt

    bottleneck: int = 64  # "ffn_num": adapter bottleneck r
    adapter_scale: float = 0.1  # tuning_config ffn_adapter_scalar "0.1"
    adapter_dropout: float = 0.1  # backbone/vit_adapter.py: Adapter(dropout=0.1)
    lr: float = 0.01  # "init_lr"
    momentum: float = 0.9  # models/aper_adapter.py: optim.SGD(momentum=0.9) ("optimizer": "sgd")
    weight_decay: float = 5e-4  # "weight_decay"
    min_lr: float = 0.0  # "min_lr": eta_min of CosineAnnealingLR, stepped once per epoch
    epochs: int = 20  # "tuned_epoch": first session only; later tasks train nothing
    batch_size: int = 48  # "batch_size" (training)
    eval_batch_size: int = 48  # the reference's prototype/test loaders reuse "batch_size"; speed only
    vpt_type: str = "deep"  # adapt=vpt: "vpt_type" (exps/aper_vpt_deep.json; aper_vpt_shallow.json: "shallow")
    prompt_tokens: int = 5  # adapt=vpt: "prompt_token_num", P prompts per block (deep) or in all (shallow)

    def __post_init__(self) -> None:
        check_first_session_fields(self)
        if self.adapt not in ADAPT_CHOICES:
            raise ValueError(f"adapt must be one of {', '.join(ADAPT_CHOICES)}, got {self.adapt!r}")
        if self.vpt_type not in ("deep", "shallow"):
            raise ValueError(f"vpt_type must be deep or shallow, got {self.vpt_type!r}")
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")


# PILOT's four first-session adaptations (models/aper_adapter.py, aper_finetune.py, aper_ssf.py, aper_vpt.py)
ADAPT_CHOICES = ("adapter", "finetune", "ssf", "vpt")


# CPU profile for the embedded benchmark (2,320 training / 942 test images, 6 tasks) with DINOv2 ViT-S/14 on
# 2 cores: 112 px input (8x8 patches of 14 px) and 3 first-session epochs instead of 20 (the only backward
# passes of the run); afterwards one adapted pass per image.
# ``ci``: the regression gate's first-session recipe (clbench.core.config.CI_FIRST_SESSION).
# ``reference-*``: the other adaptations with their PILOT exps JSON (CIFAR-100 B0 Inc10, ViT-B/16 IN-1k);
# ssf and vpt keep the adapter's epochs, lr, batch and weight decay (their JSONs repeat them), finetune differs.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"img_size": 112, "epochs": 3},
    "ci": {**CI_FIRST_SESSION},
    "reference-ssf": {"adapt": "ssf"},  # exps/aper_ssf.json: 20 epochs, lr 0.01, batch 48, wd 5e-4, sgd
    "reference-vpt": {"adapt": "vpt", "vpt_type": "deep", "prompt_tokens": 5},  # exps/aper_vpt_deep.json
    "reference-vpt-shallow": {"adapt": "vpt", "vpt_type": "shallow", "prompt_tokens": 5},  # aper_vpt_shallow.json
    # exps/aper_finetune.json: "tuned_epoch" 6, "batch_size" 128, "weight_decay" 0.05, "init_lr" 0.01, sgd
    "reference-finetune": {"adapt": "finetune", "epochs": 6, "batch_size": 128, "weight_decay": 0.05},
}


# ------------------------------------------------------------------------------------ parameters and cost model
def first_session_size(cfg: APERConfig, d: int, depth: int, backbone_params: int | None = None) -> int:
    """Parameters the first session tunes and keeps: adapters (depth * (2 d r + r + d)); SSF factors (a scale and
    a shift per channel of every site, ``clbench.layers.ssf``: 2 (depth (7 d + 4 d) + 2 d) on a plain ViT with MLP
    ratio 4); prompts ((depth or 1) * P * d); or the whole ViT copy (``backbone_params``; where not given, a plain
    timm ViT with 16 px patches at 224 px, ``plain_vit_params``)."""
    if cfg.adapt == "adapter":
        return adapter_set_size(depth, d, cfg.bottleneck)
    if cfg.adapt == "ssf":
        return 2 * (depth * (7 * d + 4 * d) + 2 * d)
    if cfg.adapt == "vpt":
        return (depth if cfg.vpt_type == "deep" else 1) * cfg.prompt_tokens * d
    return plain_vit_params(d, depth) if backbone_params is None else backbone_params


def param_formula(
    cfg: APERConfig, d: int, depth: int, task_sizes: Sequence[int], backbone_params: int | None = None
) -> ParamCounts:
    """Task 0 adds the first session's tuned module (:func:`first_session_size`: adapters, SSF factors, prompts or
    the fine-tuned ViT copy, whichever ``adapt`` names); trained in it: that module, the task-0 cosine head (d per
    class, thrown away) and its sigma. Every task stores a 2d prototype per new class; later tasks train nothing."""
    tuned = first_session_size(cfg, d, depth, backbone_params)
    added = [tuned if t == 0 else 0 for t in range(len(task_sizes))]
    trainable = [tuned + d * n + 1 if t == 0 else 0 for t, n in enumerate(task_sizes)]
    extra = {"first_session_params": tuned, "prototype_width": 2 * d}
    if cfg.adapt == "adapter":
        extra["adapter_params"] = tuned
    return ParamCounts(
        added_per_task=added,
        stored_per_task=[2 * d * n for n in task_sizes],
        trainable_per_task=trainable,
        head=2 * d * sum(task_sizes),
        extra=extra,
    )


def work(cfg: APERConfig, shape: RunShape) -> Work:
    """Passes per training image and epoch: one forward + backward with the adapters in the first task, none later
    (the adapted ViT is then fixed, so each image's adapted feature is computed once and kept).
    Frozen features of every image (clbench's cache), task-0 training passes, then one adapted pass per
    training and test image (kept by the strategy)."""
    learnt = shape.learnt  # the images tuning and prototypes use
    n_test = max(shape.test_seen, default=0)
    frozen = sum(shape.train_per_task) + n_test
    return Work(f=frozen + sum(learnt) + n_test, b=cfg.epochs * learnt[0], f_cacheable=frozen)


def split_kept(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """Learned: the first session's tuned module (adapters, SSF factors, prompts or the ViT copy); stored: the
    2d prototypes (class means) of every class. Records before ``adapt`` name it ``adapter_params``."""
    tuned = int(extra["first_session_params"] if "first_session_params" in extra else extra["adapter_params"])
    return rest_stored(kept_per_task, [tuned if t == 0 else 0 for t in range(len(kept_per_task))])


CARD = MethodCard(
    "aper",
    APERConfig,
    PROFILES,
    param_formula=param_formula,
    work=work,
    family="adapters",
    trains="adapters on the first task only; then prototypes",
    embedding="APER's concatenated frozen and adapted [CLS]",
    split_kept=split_kept,
)
