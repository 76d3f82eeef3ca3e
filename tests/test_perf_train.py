"""``clbench perf train-step``: the step clock and the ratio to the bare forward + backward limit, with test
strategies on the micro ViT. The ratio test runs on a clock that moves only with the ViT's passes (PassClock), so
it checks the measurement's bookkeeping and never the machine's speed or load."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from tinytasks import make_split

from clbench.errors import ClbenchError
from clbench.methods.contract import Context, ParamCounts, Split, Strategy, Task
from clbench.methods.shared import optimizer_step
from clbench.perf.train_step import ReplayedSplit, step_ratio, time_steps


@dataclass(frozen=True)
class StepConfig:
    batch_size: int = 32
    epochs: int = 50
    extra_forward: bool = False  # a second, frozen forward pass per step (as a recomputed query)
    nested_step: bool = False  # an optimizer whose step calls its parent's (the step hook fires twice)


class ClippedSGD(torch.optim.SGD):
    """An optimizer whose step calls its parent's (as HiDe-Prompt's ClippedAdam): the step hook fires twice."""

    def step(self, closure=None):
        return super().step(closure)


class BareStep(Strategy):
    """A step that is the limit itself: the ViT's forward + backward to an input-side shift, then SGD."""

    name = "bare-step"
    Config = StepConfig
    needs_vit = True

    def learn_task(self, task: Task) -> None:
        model = self.ctx.backbone.model
        shift = torch.zeros(1, 1, self.ctx.backbone.num_features, requires_grad=True)
        optimizer = (ClippedSGD if self.cfg.nested_step else torch.optim.SGD)([shift], lr=0.01)
        hook = model.patch_embed.register_forward_hook(lambda m, i, o: o + shift.to(o.dtype))
        loader = task.train.image_loader(self.cfg.batch_size, augment=True)
        try:
            for _ in range(self.cfg.epochs):
                for images, _, _ in loader:
                    if self.cfg.extra_forward:
                        with torch.no_grad():
                            model.forward_features(images)
                    loss = model.forward_features(images).float().mean()
                    optimizer_step(optimizer, loss, "test")
        finally:
            hook.remove()

    def predict(self, split: Split, protocol: str = "per-sample") -> torch.Tensor:
        return F.normalize(split.features, dim=1)

    def param_counts(self) -> ParamCounts:
        return ParamCounts()


class PassClock:
    """A deterministic clock for clbench.perf.train_step: time moves only when the ViT runs, by its batch's images
    x 3 for a forward that is backpropagated (a forward and a backward) and x 1 for a no-grad forward, so that the
    step clock, the interleaved limit passes and the medians are checked without any wall-clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __call__(self, module, inputs, output) -> None:  # a forward hook on the ViT's patch embedding
        self.now += len(output) * (3.0 if torch.is_grad_enabled() else 1.0)


def _ratio(backbone, extra_forward: bool, split: Split, monkeypatch) -> float:
    from types import SimpleNamespace

    import clbench.perf.train_step as train_step

    clock = PassClock()
    monkeypatch.setattr(train_step, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    handle = backbone.model.patch_embed.register_forward_hook(clock)
    try:
        ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0)
        task = Task(0, [0, 1], 2, ReplayedSplit(split))
        return step_ratio(BareStep(StepConfig(extra_forward=extra_forward), ctx), task, steps=5)["ratio"]
    finally:
        handle.remove()


def test_a_bare_step_runs_at_the_limit_and_a_second_forward_costs(backbone, monkeypatch):
    split = make_split(backbone, [0, 1], 32, seed=0)  # 64 images: two batches of 32
    assert _ratio(backbone, False, split, monkeypatch) == pytest.approx(1.0)  # the step is the limit pass
    assert _ratio(backbone, True, split, monkeypatch) == pytest.approx(3 / 4)  # plus one no-grad forward per step


def test_images_per_step_are_counted_from_the_loader(backbone):
    split = make_split(backbone, [0, 1], 20, seed=1)  # 40 images in batches of 16: 16, 16, 8 per epoch
    ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0)
    timing = time_steps(BareStep(StepConfig(batch_size=16), ctx), Task(0, [0, 1], 2, split), steps=5, warmup=1)
    assert timing.images == (16, 8, 16, 16, 8)
    assert timing.batch == 16
    assert timing.data_images_per_s is not None and timing.data_images_per_s > 0


def test_a_task_too_small_for_the_steps_is_refused(backbone):
    split = make_split(backbone, [0, 1], 4, seed=2)
    ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0)
    with pytest.raises(ClbenchError, match="made 1 optimizer steps"):
        time_steps(BareStep(StepConfig(batch_size=16, epochs=1), ctx), Task(0, [0, 1], 2, split), steps=3)


def test_the_cli_refuses_a_strategy_without_a_vit_step_and_bad_flags(capsys):
    from clbench.cli import main

    assert main(["perf", "train-step", "--strategy", "simplecil"]) == 2
    err = capsys.readouterr().err
    assert "simplecil trains nothing through the ViT" in err and "l2p" in err
    assert main(["perf", "train-step", "--strategy", "ease", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    assert main(["perf", "train-step", "--strategy", "ease", "--precision", "fp8"]) == 2
    assert "fp8" in capsys.readouterr().err


def test_the_cli_measures_a_micro_run_and_writes_json(tmp_path):
    import json

    from clbench.cli import main

    out = tmp_path / "ts.json"
    argv = ["perf", "train-step", "--strategy", "ease", "--backbone", "vit_micro", "--img-size", "32"]
    assert main([*argv, "--precision", "fp32", "--steps", "2", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    row = table["strategies"]["ease"]["fp32"]
    assert row["batch"] == 48 and row["steps_timed"] == 2 and row["ratio"] > 0
    assert table["cpu_capability"] and "amx" in table and len(table["load_before"]) == 3
    assert "partial" not in table  # the final write replaces the partial ones


def test_a_fine_tuning_method_is_compared_with_a_full_fine_tuning_step(backbone):
    """Strategies that train the ViT's own weights (``fine_tunes_backbone``) get a limit that does as much: the
    weights' gradients and an SGD step, on a copy, the run's frozen ViT untouched."""
    from clbench.features.backbones import state_digest
    from clbench.perf.train_step import LimitPass

    digest = state_digest(backbone.model)
    limit = LimitPass(backbone, "fp32", torch.device("cpu"), fine_tuning=True)
    assert limit.tuned is not None
    assert limit(4) > 0
    assert limit.optimizer is not None
    stepped = {id(p) for p in limit.optimizer.state}  # a momentum buffer: the parameter had a gradient and a step
    blocks = list(limit.tuned.blocks.parameters())  # type: ignore[union-attr]
    assert blocks and all(id(p) in stepped for p in blocks)
    assert state_digest(backbone.model) == digest

    class FineTuningStep(BareStep):
        fine_tunes_backbone = True

    split = make_split(backbone, [0, 1], 32, seed=0)
    ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0)
    task = Task(0, [0, 1], 2, ReplayedSplit(split))
    assert step_ratio(FineTuningStep(StepConfig(), ctx), task, steps=2)["limit"] == "full fine-tuning step"
    assert step_ratio(BareStep(StepConfig(), ctx), task, steps=2)["limit"].startswith("forward + backward")
    assert state_digest(backbone.model) == digest


class HeadThenStep(BareStep):
    """HiDe-Prompt's order: a head first trained on features computed without gradients (its own optimizer), then
    the steps through the ViT."""

    name = "head-then-step"

    def learn_task(self, task: Task) -> None:
        head = torch.nn.Linear(self.ctx.backbone.num_features, 2)
        optimizer = ClippedSGD(head.parameters(), lr=0.01)
        for images, labels, _ in task.train.image_loader(self.cfg.batch_size, augment=True):
            with torch.no_grad():
                feats = self.ctx.backbone.model.forward_features(images)[:, 0]
            for _ in range(3):
                optimizer_step(optimizer, F.cross_entropy(head(feats), labels % 2), "test head")
        super().learn_task(task)


def test_the_clock_times_each_step_through_the_vit_once_and_not_a_head_trained_before(backbone, monkeypatch):
    from types import SimpleNamespace

    import clbench.perf.train_step as train_step

    clock = PassClock()
    monkeypatch.setattr(train_step, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    handle = backbone.model.patch_embed.register_forward_hook(clock)
    try:
        split = make_split(backbone, [0, 1], 32, seed=0)
        ctx = Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0)
        strategy = HeadThenStep(StepConfig(nested_step=True), ctx)
        row = step_ratio(strategy, Task(0, [0, 1], 2, ReplayedSplit(split)), steps=5)
    finally:
        handle.remove()
    assert row["batch"] == 32 and row["ratio"] == pytest.approx(1.0)  # the bare steps, not the head's
