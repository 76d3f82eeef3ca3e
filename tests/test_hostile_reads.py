"""Every file clbench reads is checked before use, every size it is given is bounded, and every folder it writes into
is its own (issue 55, items 4, 5 and 8): each hostile case of round five kept as a regression test.

Fixtures are built under ``tmp_path``; runs use the micro ViT with random weights, a four-class image folder made
here and this module's own feature cache. No test reads the wall-clock.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from clbench.run import checkpoint


def _small(step):
    """4 training images per class, a sixteenth of the test images: seconds for the methods that train on images."""
    y = step.task.train.labels.numpy()
    keep = np.concatenate([np.flatnonzero(y == c)[:4] for c in step.task.classes])
    task = dataclasses.replace(step.task, train=step.task.train.subset(keep))
    return dataclasses.replace(step, task=task, test=step.test.subset(np.arange(0, len(step.test), 16)))


def test_every_strategys_state_after_a_task_passes_the_restore_checks(micro_session_factory):
    """No false refusal: what every registered strategy saves after a task is finite and agrees with its settings."""
    from clbench.run.catalog import STRATEGIES

    for name in STRATEGIES.names():
        fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).Config)}
        overrides = tuple((k, v) for k, v in (("epochs", "1"), ("M", "128")) if k in fields)
        a = micro_session_factory(name, init_cls=12, increment=12, overrides=overrides)
        b = micro_session_factory(name, init_cls=12, increment=12, overrides=overrides)
        a.strategy.learn_task(_small(next(iter(a.tasks()))).task)
        saved = a.strategy.save_state()
        assert checkpoint.nonfinite_state(saved) is None, name
        checkpoint.restore_strategy(b.strategy, saved, Path("checkpoint.safetensors"))
        assert torch.is_tensor(b.strategy.predict(_small(next(iter(b.tasks()))).test)), name
