"""APER: the concatenated prototypes, one adapted pass per image after the first session, parameter formulas, and
refusals.

Mechanics on the tiny random ViT (``vit_micro``, 64-d) with tiny data; one slow test on the embedded benchmark with
the real offline ViT. The clbench cache (``CLBENCH_CACHE``) is isolated per session by ``conftest.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tinytasks import make_split

from baselines.aper import APER, APERConfig
from clbench.cli import main
from clbench.harness import RunConfig, make_strategy_config, run
from clbench.strategy import Context, Split, Task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone` is from there too

APER_SMALL = APERConfig(epochs=1, batch_size=8, eval_batch_size=4, bottleneck=8)
MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "12", "--increment", "12"]


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tasks(backbone) -> list[Task]:
    return [
        Task(0, [0, 1], 2, make_split(backbone, [0, 1], 6, seed=1)),
        Task(1, [2, 3], 4, make_split(backbone, [2, 3], 6, seed=2)),
    ]


@pytest.fixture(scope="module")
def test_split(backbone) -> Split:
    return make_split(backbone, [0, 1, 2, 3], 3, seed=3)


def ctx_for(backbone, seed: int = 7) -> Context:
    return Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=seed, log=lambda s: None)


class PassCounter:
    """Counts images entering the ViT (a forward hook on the patch embedding), split by grad mode."""

    def __init__(self, model) -> None:
        self.grad = self.nograd = 0
        self.handle = model.patch_embed.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        if torch.is_grad_enabled():
            self.grad += inputs[0].shape[0]
        else:
            self.nograd += inputs[0].shape[0]

    def reset(self) -> None:
        self.grad = self.nograd = 0

    def close(self) -> None:
        self.handle.remove()


# ----------------------------------------------------------------------------------------------- one pass per image
@pytest.mark.parametrize("method", ["aper"])
def test_after_task_0_every_image_passes_the_adapted_vit_once(backbone, tasks, test_split, method):
    s = APER(APER_SMALL, ctx_for(backbone))
    count = PassCounter(backbone.model)
    try:
        s.learn_task(tasks[0])
        assert all(float(a.up_weight.abs().sum()) > 0 for a in s.adapters)  # every block's adapter was trained
        assert not any(p.requires_grad for p in s.adapters.parameters())  # and frozen afterwards
        assert count.grad == len(tasks[0].train) * 1  # 1 epoch of training passes
        assert count.nograd == len(tasks[0].train)  # then one eval-transform pass per task-0 image
        count.reset()
        s.predict(test_split)
        s.predict(test_split)
        s.predict(test_split.subset([5, 0, 7]))
        assert (count.grad, count.nograd) == (0, len(test_split))  # each test image once, however often asked
        count.reset()
        s.learn_task(tasks[1])
        s.predict(test_split)
        assert count.grad == 0  # no training after task 0
        assert count.nograd == len(tasks[1].train)  # only the new training images, once each
    finally:
        count.close()
    assert s.store.passes == len(tasks[0].train) + len(test_split) + len(tasks[1].train)


def test_aper_prototypes_are_class_means_of_the_concatenated_features(backbone, tasks):
    s = APER(APER_SMALL, ctx_for(backbone))
    d = backbone.num_features
    for task in tasks:
        s.learn_task(task)
    assert s.head.weight.shape == (4, 2 * d)
    feats = s.features(tasks[1].train)
    assert feats.shape == (len(tasks[1].train), 2 * d)
    assert torch.equal(feats[:, :d], tasks[1].train.features)  # first half: the frozen cached feature
    assert not torch.allclose(feats[:, d:], feats[:, :d], atol=1e-4)  # second half: the adapted one
    labels = tasks[1].train.labels
    for c in (2, 3):
        torch.testing.assert_close(s.head.weight[c], feats[labels == c].mean(0))
    x = s.features(tasks[0].train.subset([0, 1, 2]))
    want = F.normalize(x, dim=1) @ F.normalize(s.head.weight, dim=1).T  # cosine on the whole concatenation
    torch.testing.assert_close(s.predict(tasks[0].train.subset([0, 1, 2])), want)


# ----------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("strategy,overrides", [("aper", ())])
def test_param_formula_equals_the_counts_after_a_real_run(tmp_path, strategy, overrides):
    record = run(
        RunConfig(
            strategy=strategy,
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            init_cls=12,
            increment=6,
            overrides=(("epochs", "1"), *overrides),
            train_per_class=4,  # the counts depend on the classes, not on the images
            precision="fp32",
            out=str(tmp_path / strategy),
        )
    )
    from clbench.catalog import STRATEGIES

    cls = STRATEGIES.get(strategy)
    cfg = make_strategy_config(cls, None, (("epochs", "1"), *overrides))
    want = cls.param_formula(cfg, 64, 4, tuple(record.task_sizes))
    params = record.params
    assert params.added_per_task == want.added_per_task
    assert params.trainable_per_task == want.trainable_per_task
    assert params.head == want.head
    assert {k: params.extra[k] for k in want.extra} == want.extra
    assert record.task_sizes == [12, 6, 6, 6, 6]


# ----------------------------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="epochs"):
        APERConfig(epochs=0)


@pytest.mark.parametrize("cls", [APER])
def test_profiles_are_valid_configs(cls):
    for profile in ("quick", "ci"):
        cfg = make_strategy_config(cls, profile, ())
        assert cfg != cls.Config()
    assert cls.profiles["quick"]["img_size"] == 112 and cls.profiles["ci"]["img_size"] == 56


@pytest.mark.parametrize("strategy", ["aper"])
def test_unknown_set_key_lists_the_valid_ones(strategy, tmp_path, capsys):
    code = main(["run", "--strategy", strategy, *MICRO, "--set", "bottlenek=8", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "valid keys:" in err and "bottleneck" in err and "did you mean 'bottleneck'" in err


# ----------------------------------------------------------------------------------------------- real data
@pytest.mark.slow
@pytest.mark.veryslow  # two trained real-backbone runs (3-4 min): the default tier carries both halves of the proof
@pytest.mark.parametrize("strategy", ["aper"])
def test_ci_profile_beats_a_random_weights_copy_of_the_backbone(tmp_path, strategy):
    """A slower repeat (``veryslow``, not in CI; two real-backbone runs) of what the default tier shows apart:
    pretrained weights matter (tests/test_real.py::test_pretrained_weights_matter) and the ci profile's accuracy on
    them (the regression gate, .ci/gate, pins its aper-ci run)."""
    from clbench.weights import sources as ow

    try:
        ow.offline_weights("vit_small_patch14_dinov2")
    except ow.WeightsUnavailable as e:
        pytest.skip(f"offline DINOv2 ViT-S/14 weights unavailable: {e}")
    acc = {}
    for weights in ("offline", "random"):
        record = run(
            RunConfig(
                strategy=strategy,
                profile="ci",
                weights=weights,
                precision="fp32",
                out=str(tmp_path / weights),
            )
        )
        assert record.complete and record.task_sizes == [12, 12, 12]
        acc[weights] = record.last_acc
    assert acc["offline"] > acc["random"] + 8 and acc["offline"] > 1.5 * acc["random"], acc
