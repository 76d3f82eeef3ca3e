"""Settings checks and choices that several methods' configs share. Torch-free on purpose: the method cards
(``baselines/cards/``, ``tosca/card.py``: each method's settings class and profiles) import it, and reports, the gate
and the CLI read those cards without loading a method or torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from clbench.errors import ClbenchError

SOLVERS = ("auto", "recursive")  # the analytic heads' solver choices (clbench.layers.analytic: ACIL, DS-AL)
HEADS = ("linear", "kac")  # the prompt methods' classifiers (clbench.layers.heads.build_head: L2P, DualPrompt, CODA)
KAC_GRIDS = 16  # = clbench.layers.kan.KAC_GRIDS: RBF grid points per feature of the KAC head


def check_head(kind: str) -> None:
    if kind not in HEADS:
        raise ValueError(f"head must be one of {', '.join(repr(h) for h in HEADS)}, got {kind!r}")


def head_sizes(kind: str, d: int) -> tuple[int, int]:
    """(parameters per class, parameters shared by all classes) of a ``kind`` head on width ``d``: linear d + 1 and
    0; KAC d G (its row of the spline map) and 2 d (its LayerNorm)."""
    return (d + 1, 0) if kind == "linear" else (d * KAC_GRIDS, 2 * d)


# The largest learning rate a setting takes: 100x the largest any method's profile uses (0.1); --set lr=1e308 made
# the first SGD step overflow inside torch instead of being refused here.
LR_MAX = 10.0


def check_lr(value: Any, name: str = "lr") -> None:
    """Refuse a learning rate that is not a number in (0, :data:`LR_MAX`]: ValueError naming the field and the bound."""
    if not (isinstance(value, (int, float)) and 0 < value <= LR_MAX):  # NaN and infinities fail too
        raise ValueError(f"{name} must be a number > 0 and <= {LR_MAX:g}, got {value}")


def check_range(cfg: Any, name: str, low: float, high: float, high_open: bool = False) -> None:
    """Refuse ``cfg.<name>`` outside [low, high] (``high_open``: [low, high)): ValueError naming the field."""
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and math.isfinite(value) and low <= value
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"{name} must be in [{low:g}, {high:g}{')' if high_open else ']'}, got {value}")


def check_first_session_fields(cfg: Any, nonnegative: tuple[str, ...] = ()) -> None:
    """Cross-field checks shared by the adapter configs (APER, RanPAC, EASE); ``nonnegative``: the config's own
    further fields that must be finite numbers >= 0. Raises ``ValueError`` naming the field."""
    for name in ("bottleneck", "epochs", "batch_size", "eval_batch_size"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    check_lr(cfg.lr)
    if not 0 <= cfg.min_lr <= cfg.lr:
        raise ValueError(f"min_lr must be in [0, lr], got {cfg.min_lr}")
    if not 0 <= cfg.adapter_dropout < 1:
        raise ValueError(f"adapter_dropout must be in [0, 1), got {cfg.adapter_dropout}")
    for name in ("momentum", "weight_decay", "adapter_scale", *nonnegative):
        if not (getattr(cfg, name) >= 0 and math.isfinite(getattr(cfg, name))):
            raise ValueError(f"{name} must be a finite number >= 0, got {getattr(cfg, name)}")


def check_analytic_fields(cfg: Any) -> None:
    """The settings the analytic heads (ACIL, DS-AL) share: ``solver``, buffer size ``M``, regularisation ``gamma``
    and the two batch sizes. Raises ``ValueError`` naming the field."""
    if cfg.solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {cfg.solver!r}")
    if cfg.M < 1:
        raise ValueError(f"M must be >= 1, got {cfg.M}")
    if not cfg.gamma > 0:
        raise ValueError(f"gamma must be > 0 (R starts at I / gamma), got {cfg.gamma}")
    if cfg.il_batch_size < 1:
        raise ValueError(f"il_batch_size must be >= 1, got {cfg.il_batch_size}")
    if cfg.eval_batch_size < 1:
        raise ValueError(f"eval_batch_size must be >= 1, got {cfg.eval_batch_size}")


def check_saved_buffer(method: str, state: dict[str, Any], d: int, M: int) -> None:
    """Refuse to resume a run whose saved random buffer W_b is not this run's (d, M) (ACIL, DS-AL)."""
    saved = tuple(state["buffer"].shape)
    if saved != (d, M):
        raise ClbenchError(
            f"{method}: the saved run's buffer is {saved[0]} x {saved[1]}, this one {d} x {M}",
            "resume with the same backbone and --set M, or start over with --overwrite",
        )


def check_protocol(protocol: str, protocols: Sequence[str], method: str) -> None:
    """Refuse an evaluation protocol the method does not implement (``method``: its name as the message shows it)."""
    if protocol not in protocols:
        raise ValueError(f"unknown protocol {protocol!r}; {method} supports {', '.join(protocols)}")


def block_list(spec: str, name: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1); empty -> (); distinct indices >= 0, else ValueError naming the field (the prompt methods'
    block lists: DualPrompt, HiDe-Prompt)."""
    try:
        layers = tuple(int(part) for part in str(spec).split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated block indices, got {spec!r}") from None
    if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"{name} must be distinct block indices >= 0, got {spec!r}")
    return layers


def check_fields(
    cfg: Any,
    at_least_one: Sequence[str] = (),
    counts: Sequence[str] = (),
    positive: Sequence[str] = (),
    nonnegative: Sequence[str] = (),
    choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """The per-field checks most method configs make, each a ValueError naming the field: ``at_least_one`` >= 1
    (sizes, batches), ``counts`` >= 0 (epochs), ``positive`` finite numbers > 0 (learning rates), ``nonnegative``
    finite numbers >= 0 (momentum, decay, loss weights), ``choices`` one of the listed strings."""
    for name in at_least_one:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in counts:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in positive:
        if not (getattr(cfg, name) > 0 and math.isfinite(getattr(cfg, name))):
            raise ValueError(f"{name} must be a positive number, got {getattr(cfg, name)}")
    for name in nonnegative:
        if not (getattr(cfg, name) >= 0 and math.isfinite(getattr(cfg, name))):
            raise ValueError(f"{name} must be a finite number >= 0, got {getattr(cfg, name)}")
    for name, allowed in (choices or {}).items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {getattr(cfg, name)!r}")


# SLCA's settings, shared by the methods built on its slow learner and alignment (clbench.layers.slow_learner: SLCA,
# CoFiMA): their checks, and the quick and ci profiles' training (see baselines/cards/slca.py for why these values).
SLOW_LEARNER_QUICK: dict[str, Any] = {
    "epochs": 3,
    "batch_size": 16,
    "milestone": 0,
    "lr": 0.004,
    "backbone_lr_scale": 0.025,
    "ca_epochs": 2,
    "ca_samples": 64,
}
SLOW_LEARNER_CI: dict[str, Any] = {
    "train_per_class": 8,
    "epochs": 4,
    "batch_size": 16,
    "milestone": 0,
    "ca_epochs": 2,
    "ca_samples": 64,
    "lr": 0.004,
    "backbone_lr_scale": 0.025,
    "float64": True,
}
# SLCA's authors' budget (its ``reference`` profile, the defaults written out); CoFiMA's reference changes a few.
SLOW_LEARNER_REFERENCE: dict[str, Any] = {
    "epochs": 20,
    "batch_size": 128,
    "lr": 0.01,
    "backbone_lr_scale": 0.01,
    "milestone": 18,
    "lr_decay": 0.1,
    "ca_epochs": 5,
    "ca_samples": 256,
    "logit_norm": 0.1,
}


def check_slow_learner_fields(cfg: Any, positive: Sequence[str] = ()) -> None:
    """SLCA's field checks (``positive``: the config's own further fields that must be numbers > 0)."""
    check_fields(
        cfg,
        at_least_one=("batch_size", "ca_samples", "eval_batch_size"),
        counts=("epochs", "ca_epochs", "milestone"),
        positive=("lr", "ca_lr", *positive),
        nonnegative=("backbone_lr_scale", "momentum", "weight_decay", "lr_decay", "logit_norm"),
        choices={"ca_task_index": ("exact", "reference")},
    )


def check_adapter_sets_fields(
    cfg: Any, at_least_one: Sequence[str] = (), positive: Sequence[str] = (), nonnegative: Sequence[str] = ()
) -> None:
    """The checks of the per-task adapter-set methods' configs (clbench.layers.adapter_sets: MOS, TUNA), with each
    config's own further fields; ValueError naming the field."""
    check_fields(
        cfg,
        at_least_one=("bottleneck", "epochs", "batch_size", "eval_batch_size", "ca_samples_scale", *at_least_one),
        counts=("ca_epochs",),
        positive=("lr", "ca_lr", *positive),
    )
    if not 0 <= cfg.min_lr <= cfg.lr:
        raise ValueError(f"min_lr must be in [0, lr], got {cfg.min_lr}")
    check_range(cfg, "adapter_dropout", 0.0, 1.0, high_open=True)
    check_fields(
        cfg,
        nonnegative=("momentum", "weight_decay", "reg", "adapter_scale", "cov_eps", *nonnegative),
        choices={"ca_storage": ("covariance", "variance")},
    )


def check_prompt_fields(cfg: Any, at_least_one: Sequence[str], nonnegative: Sequence[str]) -> None:
    """The checks the prompt methods' configs share (L2P, DualPrompt, CODA-Prompt): sizes, epochs and batches >= 1
    (``at_least_one``), a positive lr, finite loss weights >= 0 (``nonnegative``), the query and the head."""
    check_fields(
        cfg,
        at_least_one=at_least_one,
        positive=("lr",),
        nonnegative=nonnegative,
        choices={"query": ("augmented", "cached")},
    )
    check_head(cfg.head)
