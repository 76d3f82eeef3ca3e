"""``clbench perf train-step``: images per second of one real training step of a strategy, beside a bare timm
forward + backward of the same ViT at the same input size, batch and precision (the limit for a method that must
backpropagate through the ViT).

How a step is timed, without naming a method: the strategy's own ``learn_task`` runs on the first task of the
benchmark, and a global optimizer step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) stamps the
end of every step of the task's first optimizer that steps after a gradient-carrying pass through the ViT (the one
that trains through it; a head trained before on features computed without gradients, HiDe-Prompt's task-identity
MLP, is passed over; MOS's later head-only alignment optimizer is never reached). The time between two consecutive
stamps is one whole iteration of the method's loop: its forward passes, loss, backward, optimizer step and whatever
it does per batch. Training stops (the hook raises) after ``warmup + steps`` steps, so a method with 20 epochs costs
only a few steps. The task's loaders replay batches made once before the first step (augmentation included), so the
data pipeline is timed apart (``data_images_per_s``) and the ratio isolates the method's compute. Images per step
are the images the loader handed out between two stamps.

The limit: ``model.forward_features`` of the same timm model on a random batch of the same shape, under the same
autocast, with a zero (1, 1, d) parameter added to the patch embeddings so that the backward pass runs through
every block (the frozen weights get no gradient, as in the methods), loss = mean of the features. It is measured
before and after the strategy's steps; its median is the divisor, so a ratio holds on a noisy machine. A method
that fine-tunes the ViT's weights (SLCA) is compared with a bare full fine-tuning step instead: the same pass on a
trainable copy, with the weights' gradients and an SGD step (``limit`` in each row says which).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

from clbench.core.catalog import STRATEGIES
from clbench.core.precision import CpuInfo, autocast, check_request
from clbench.errors import ClbenchError
from clbench.methods.contract import Split, Strategy, Task
from clbench.perf import arg, backbone_args, bounded, device_arg, measurement, write

PERF_STRATEGY_SEED = 1993


class _StopTraining(Exception):
    """Raised by the step hook once enough steps are timed; caught around ``learn_task``."""


class _Replay:
    """A finished list of batches handed out again and again, counting the images it hands out."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], counter: list[int]) -> None:
        self.batches, self.counter = batches, counter

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for batch in self.batches:
            self.counter[0] += int(batch[0].shape[0])
            yield batch


class ReplayedSplit(Split):
    """A :class:`Split` whose ``image_loader`` makes its batches once (through the real loader, augmentation
    included, in order) and replays them: the data pipeline stays out of a step's time and is timed apart."""

    def __init__(self, split: Split, counter: list[int] | None = None) -> None:
        super().__init__(
            split.source, split.indices, split.labels, split.features, split.eval_transform, split.train_transform
        )
        self.counter = counter if counter is not None else [0]
        self.data_seconds = 0.0
        self.data_images = 0
        self._made: dict[tuple[int, bool], list] = {}

    def subset(self, positions) -> ReplayedSplit:
        return ReplayedSplit(super().subset(positions), self.counter)

    def image_loader(  # type: ignore[override]
        self, batch_size: int, augment: bool, shuffle: bool = False, generator: torch.Generator | None = None
    ) -> _Replay:
        key = (batch_size, augment)
        if key not in self._made:
            t0 = time.perf_counter()
            self._made[key] = list(super().image_loader(batch_size, augment, shuffle=shuffle, generator=generator))
            self.data_seconds += time.perf_counter() - t0
            self.data_images += len(self)
        return _Replay(self._made[key], self.counter)


@dataclass
class _StepClock:
    """At the end of each step of the first optimizer that steps after a gradient-carrying pass through a ViT (a patch
    embedding ran with autograd on since the last step; an optimizer of a head trained on features computed without
    gradients, as HiDe-Prompt's task-identity MLP before its prompts, is passed over): stamps (time, images handed out
    so far), then runs ``between(batch)`` (one limit pass at the step's batch, timed) outside the
    next step's interval."""

    stop_after: int
    counter: list[int]
    sync: Callable[[], None]
    between: Callable[[int], float] | None = None
    ends: list[tuple[float, int]] = field(default_factory=list)
    starts: list[tuple[float, int]] = field(default_factory=list)  # after the between-pass: the next step starts
    between_s: list[tuple[int, float]] = field(default_factory=list)  # (batch, seconds) of each between-pass
    optimizer_id: int | None = None
    vit_grad_pass: bool = False  # a patch embedding ran with autograd on since the last optimizer step

    def saw_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """A global forward hook: notes a gradient-carrying pass through any ViT's patch embedding (the run's
        frozen model or a method's own copy of it)."""
        if torch.is_grad_enabled() and type(module).__name__ == "PatchEmbed":
            self.vit_grad_pass = True

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        through_vit, self.vit_grad_pass = self.vit_grad_pass, False
        if self.optimizer_id is None and through_vit:
            self.optimizer_id = id(optimizer)
        # a step with no ViT pass since the last one is not another iteration: an optimizer subclass whose step
        # calls its parent's (HiDe-Prompt's gradient-clipping Adam) fires the hook twice per step
        if id(optimizer) != self.optimizer_id or not through_vit:
            return
        self.sync()
        self.ends.append((time.perf_counter(), self.counter[0]))
        if len(self.ends) >= self.stop_after:
            raise _StopTraining
        if self.between is not None:
            batch = self.ends[-1][1] - (self.ends[-2][1] if len(self.ends) > 1 else 0)
            self.between_s.append((batch, self.between(batch)))
            self.vit_grad_pass = False  # the limit's own pass is not the method's
        self.starts.append((time.perf_counter(), self.counter[0]))


def _sync_for(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@dataclass(frozen=True)
class StepTiming:
    """What :func:`time_steps` measured: per timed step, its seconds and images, and the limit passes between."""

    seconds: tuple[float, ...]
    images: tuple[int, ...]
    data_images_per_s: float | None
    between: tuple[tuple[int, float], ...] = ()  # (batch, seconds) of the timed between-passes

    @property
    def images_per_s(self) -> float:
        """Median over the timed steps of images / seconds."""
        return statistics.median(n / s for n, s in zip(self.images, self.seconds, strict=True))

    @property
    def batch(self) -> int:
        return int(statistics.median(self.images))


def time_steps(
    strategy: Strategy,
    task: Task,
    steps: int = 4,
    warmup: int = 2,
    between: Callable[[int], float] | None = None,
) -> StepTiming:
    """Run ``strategy.learn_task(task)`` until ``warmup + steps`` optimizer steps are done; the last ``steps`` steps
    are timed, each from the end of the one before (the first ``warmup`` include set-up, making the batches,
    first-call costs). ``between(batch)``, if given, runs after every step but the last, outside the timed
    intervals, and returns its own seconds (the limit, interleaved with the steps so that both see the same machine
    load). Raises :class:`ClbenchError` if the task ends first (too few batches, or no optimizer steps)."""
    if steps < 1 or warmup < 1:
        raise ValueError(f"steps and warmup must be >= 1, got {steps}, {warmup}")
    split = task.train if isinstance(task.train, ReplayedSplit) else ReplayedSplit(task.train)
    clock = _StepClock(warmup + steps, split.counter, _sync_for(strategy.ctx.device), between)
    handle = register_optimizer_step_post_hook(clock)
    forward = register_module_forward_hook(clock.saw_forward)
    try:
        strategy.learn_task(replace(task, train=split))
    except _StopTraining:
        pass
    finally:
        handle.remove()
        forward.remove()
    if len(clock.ends) < warmup + steps:
        raise ClbenchError(
            f"strategy {strategy.name} made {len(clock.ends)} optimizer steps on a task of {len(split)} images; "
            f"{warmup + steps} are needed",
            "a strategy that trains nothing has no training step to time; for one that does, use a larger task",
        )
    pairs = list(zip(clock.starts[warmup - 1 :], clock.ends[warmup:], strict=False))
    seconds = tuple(end[0] - start[0] for start, end in pairs)
    images = tuple(end[1] - start[1] for start, end in pairs)
    data = split.data_images / split.data_seconds if split.data_seconds > 0 else None
    return StepTiming(seconds, images, data, tuple(clock.between_s[warmup - 1 :]))


class LimitPass:
    """The limit: a bare timm forward + backward of ``backbone``'s model on a random (batch, 3, H, W) input at the
    backbone's input size, under ``precision``'s autocast (module docstring); ``__call__(batch)`` -> seconds.

    ``fine_tuning``: the limit of a method that trains the ViT's own weights (``Strategy.fine_tunes_backbone``):
    the same pass on a trainable copy of the model, its weights' gradients computed and one SGD step (momentum 0.9)
    taken, a bare full fine-tuning step."""

    def __init__(self, backbone: Any, precision: str, device: torch.device, fine_tuning: bool = False) -> None:
        self.backbone, self.precision, self.device = backbone, precision, device
        self.sync = _sync_for(device)
        self._inputs: dict[int, torch.Tensor] = {}
        self.tuned: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        if fine_tuning:
            import copy

            self.tuned = copy.deepcopy(backbone.model).requires_grad_(True).train()
            self.optimizer = torch.optim.SGD(self.tuned.parameters(), lr=1e-6, momentum=0.9)

    def __call__(self, batch: int) -> float:
        model, size = self.tuned or self.backbone.model, self.backbone.img_size
        if batch not in self._inputs:
            g = torch.Generator().manual_seed(0)
            self._inputs[batch] = torch.randn(batch, 3, size, size, generator=g).to(self.device)
        x = self._inputs[batch]
        shift = torch.zeros(1, 1, self.backbone.num_features, device=self.device, requires_grad=True)
        hook = model.patch_embed.register_forward_hook(lambda m, i, o: o + shift.to(o.dtype))
        try:
            t0 = time.perf_counter()
            with autocast(self.precision, self.device.type):
                loss = model.forward_features(x).float().mean()
            loss.backward()
            if self.optimizer is not None:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.sync()
            return time.perf_counter() - t0
        finally:
            hook.remove()


def step_ratio(strategy: Strategy, task: Task, steps: int = 4, warmup: int = 2) -> dict[str, Any]:
    """One strategy's training step against the bare forward + backward limit, in one process: one limit pass at
    the step's batch runs between consecutive steps, so both are measured under the same load; the ratio is the
    median step rate over the median limit rate."""
    ctx = strategy.ctx
    fine_tuning = bool(getattr(strategy, "fine_tunes_backbone", False))
    limit = LimitPass(ctx.backbone, ctx.precision, ctx.device, fine_tuning=fine_tuning)
    timing = time_steps(strategy, task, steps, warmup, between=limit)
    batch = timing.batch
    limit_rate = statistics.median(n / s for n, s in timing.between)
    return {
        "batch": batch,
        "precision": ctx.precision,
        "steps_timed": len(timing.seconds),
        "step_s": list(timing.seconds),
        "limit_s": [s for _, s in timing.between],
        "step_images_per_s": timing.images_per_s,
        "limit_images_per_s": limit_rate,
        "ratio": timing.images_per_s / limit_rate,
        "data_images_per_s": timing.data_images_per_s,
        "limit": "full fine-tuning step" if fine_tuning else "forward + backward through frozen weights",
    }


def train_step_table(
    names: list[str],
    precisions: list[str],
    backbone: str | None = None,
    img_size: int | None = None,
    bench: str = "emoji",
    device: str = "auto",
    steps: int = 4,
    log: Callable[[str], None] = print,
    partial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """:func:`step_ratio` of every strategy in ``names`` (default configs) at every requested precision, on the
    first task of ``bench``, with the CPU, thread count and machine load the numbers were measured under.
    ``partial(table)`` is called after every measurement (to save what is done on a long run)."""
    # looked up at call time: tests replace it on its module
    from clbench.run.harness import RunConfig, prepare

    for name in names:
        if not STRATEGIES.get(name).needs_vit:
            raise ClbenchError(
                f"strategy {name} trains nothing through the ViT: it has no training step to compare with the limit",
                "choose one of: " + ", ".join(n for n in STRATEGIES.names() if STRATEGIES.get(n).needs_vit),
            )
    cpu = CpuInfo.detect()
    out: dict[str, Any] = {
        "benchmark": "train-step",
        "bench": bench,
        "cpu": cpu.model,
        "cpu_capability": cpu.capability,
        "amx": cpu.amx,
        "avx512_bf16": cpu.avx512_bf16,
        "threads": torch.get_num_threads(),
        "load_before": list(os.getloadavg()),
        "steps": steps,
        "strategies": {},
    }
    for name in names:
        rows = {}
        for requested in precisions:
            cfg = RunConfig(
                strategy=name, bench=bench, backbone=backbone, img_size=img_size, precision=requested, device=device
            )
            session = prepare(cfg)  # the default reporter is silent
            task = next(session.tasks()).task
            session.strategy.ctx.log = lambda _m: None  # the method's per-epoch lines are not wanted here
            session.strategy.ctx.progress = None
            row = step_ratio(session.strategy, task, steps=steps)
            row.update(requested=requested, backbone=session.backbone.spec.name, img_size=session.backbone.img_size)
            out.setdefault("backbone", row["backbone"])
            out.setdefault("img_size", row["img_size"])
            out["device"] = session.strategy.ctx.device.type
            rows[requested] = row
            out["strategies"][name] = rows
            if partial is not None:
                partial(out)
            log(
                f"{name} ({requested} -> {row['precision']}, batch {row['batch']}): "
                f"{row['step_images_per_s']:.1f} img/s, limit {row['limit_images_per_s']:.1f} img/s, "
                f"ratio {row['ratio']:.2f}"
            )
        out["strategies"][name] = rows
    out["load_after"] = list(os.getloadavg())
    return out


@measurement(
    "train-step",
    help="images/s of one real training step of each --strategy (default config) against a bare forward + backward "
    "of the same ViT at the same batch and precision",
    args=(
        arg(
            "--strategy",
            dest="strategies",
            action="append",
            default=[],
            metavar="NAME",
            help="a strategy to measure (repeatable; default: every strategy that trains through the ViT)",
        ),
        arg(
            "--precision",
            dest="precisions",
            action="append",
            default=[],
            metavar="auto|fp32|bf16|fp16",
            help="a precision to measure at (repeatable; default: auto)",
        ),
        arg(
            "--steps",
            type=bounded("--steps", 1, 1000, "timed steps of every strategy at every precision"),
            default=4,
            help="timed steps per strategy (default: 4; at most 1000)",
        ),
        *backbone_args(),
        arg("--bench", default="emoji", help="benchmark whose first task is trained on (default: emoji)"),
        device_arg(),
    ),
)
def _train_step(flags: argparse.Namespace) -> dict[str, Any]:
    for requested in flags.precisions:
        check_request(requested)
    if flags.steps < 1:
        raise ClbenchError(f"--steps must be >= 1 (got {flags.steps})")
    names = flags.strategies or [n for n in STRATEGIES.names() if STRATEGIES.get(n).needs_vit]
    return train_step_table(
        names,
        flags.precisions or ["auto"],
        flags.backbone,
        flags.img_size,
        flags.bench,
        flags.device,
        flags.steps,
        partial=lambda table: write(table, flags.out, partial=True),  # a long measurement keeps what it measured
    )
