"""HiDe-Prompt: mechanics on the tiny random ViT (task prompts, momentum blend, TII, statistics, alignment), its two
protocols and its accounting.

Every test states an invariant from the paper / reference code (``thu-ml/HiDe-Prompt``) and fails if the code
breaks it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from tinytasks import ctx_for

from baselines.hide_prompt import (
    ClassStats,
    ClippedAdam,
    HiDePrompt,
    HiDePromptConfig,
    class_statistics,
    kmeans,
    sample_features,
    scheduled_lr,
)
from clbench.layers.prompts import pilot_kv_layout
from clbench.methods.contract import PER_SAMPLE, REFERENCE, RunShape

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

SMALL = HiDePromptConfig(
    epochs=2,
    batch_size=8,
    eval_batch_size=4,
    e_prompt_layers="0,1,2",
    pool_size=4,
    tii_epochs=2,
    ca_epochs=2,
    n_centroids=3,
)


@pytest.fixture(scope="module")
def trained(backbone, tasks) -> tuple[HiDePrompt, dict[str, torch.Tensor]]:
    """Two learnt tasks, with the pool before training and after task 0 (and what task 1's forwards used)."""
    s = HiDePrompt(SMALL, ctx_for(backbone))
    snaps = {"init": s.prompts.e.detach().clone()}
    s.learn_task(tasks[0])
    snaps["after0"] = s.prompts.e.detach().clone()
    seen: list[torch.Tensor] = []
    original = HiDePrompt._forward

    def spy(self, images, e, batched=True):
        if self.prompts.e.requires_grad and torch.is_grad_enabled():
            seen.append(e.detach().clone())
        return original(self, images, e, batched)

    HiDePrompt._forward = spy
    try:
        s.learn_task(tasks[1])
    finally:
        HiDePrompt._forward = original
    snaps["train1_first"], snaps["train1_last"] = seen[0], seen[-1]
    return s, snaps


def with_cfg(s: HiDePrompt, **kw):
    class _Cfg:
        def __enter__(self):
            self.saved = s.cfg
            s.cfg = replace(s.cfg, **kw)

        def __exit__(self, *exc):
            s.cfg = self.saved

    return _Cfg()


# ----------------------------------------------------------------------------------------------- training
def test_each_task_trains_its_own_slot_from_a_copy_and_blends_it_toward_earlier_slots(trained):
    s, snap = trained
    init, after0, now = snap["init"], snap["after0"], s.prompts.e.detach()
    assert not torch.equal(after0[0], init[0])  # slot 0 trained in task 0
    assert torch.equal(after0[1:], init[1:])  # no other slot moved
    assert torch.equal(now[0], after0[0])  # task 1 leaves slot 0 alone
    assert torch.equal(now[2:], init[2:])  # unseen slots never move
    m = SMALL.prompt_momentum
    # task 1's first forward: slot 1 = a copy of slot 0, blended (1 - m) slot 1 + m mean(slot 0)
    first = snap["train1_first"][0]
    assert torch.allclose(first, (1 - m) * after0[0] + m * after0[0], atol=1e-6)
    # the forward's prompt is the blend of the *current* slot 1 (it trains) with the earlier slots' mean
    assert not torch.allclose(snap["train1_last"][0], first, atol=1e-6)
    # after training: slot 1 was replaced by its blend, so slot 1 != the raw trained parameter of the last step
    last_raw = (snap["train1_last"][0] - m * after0[0]) / (1 - m)  # the slot before its last optimizer step
    assert not torch.allclose(now[1], last_raw, atol=1e-7)
    assert s.n_tasks == 2 and s.class_task == [0, 0, 1, 1, 1]


def test_statistics_of_both_spaces_have_a_centroid_slot_per_class(trained, tasks):
    s, _ = trained
    for store in (s.stats, s.tii_stats):
        assert store.mean.shape == (5, SMALL.n_centroids, s.dim)
        assert store.valid.sum(dim=1).tolist() == [3] * 5  # 6 images per class, 3 centroids each
    # the TII statistics are the frozen features': their centroids lie in the span of the class's cached features
    feats = tasks[0].train.features[tasks[0].train.labels == 0]
    mean0 = s.tii_stats.mean[0][s.tii_stats.valid[0]]
    assert torch.allclose(mean0.mean(0), feats.mean(0), atol=0.5 * float(feats.std()))


def test_kmeans_finds_separated_clusters_and_caps_the_centroids_at_the_images():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    x = torch.cat([c + 0.1 * torch.randn(20, 2, generator=g, dtype=torch.float64) for c in centres])
    labels = kmeans(x, 3, torch.Generator().manual_seed(1))
    groups = {tuple(sorted(set(labels[i * 20 : (i + 1) * 20].tolist()))) for i in range(3)}
    assert len(groups) == 3 and all(len(gr) == 1 for gr in groups)  # each true cluster is one label
    cfg = replace(SMALL, n_centroids=10)
    mean, var, valid = class_statistics(torch.randn(4, 5), cfg, seed=3)
    assert mean.shape == (10, 5) and valid.sum() == 4  # one centroid per image, 6 empty slots
    assert torch.all(var[valid] == 0)  # singletons: zero variance, never sampled


def test_sampling_skips_zero_variance_centroids_and_draws_around_each_centroid():
    stats = ClassStats(2, 2, "multi-centroid")
    stats.mean = torch.tensor([[[5.0, 5.0], [0.0, 0.0]], [[-5.0, 0.0], [9.0, 9.0]]])
    stats.spread = torch.tensor([[[1.0, 4.0], [0.0, 0.0]], [[0.25, 0.25], [1.0, 1.0]]])
    stats.valid = torch.tensor([[True, True], [True, False]])
    x, y = sample_features(stats, 4000, 1e-4, torch.Generator().manual_seed(0))
    assert x.shape == (8000, 2) and y[:4000].eq(0).all() and y[4000:].eq(1).all()  # skipped: zero var, invalid
    assert torch.allclose(x[:4000].mean(0), torch.tensor([5.0, 5.0]), atol=0.1)
    assert torch.allclose(x[:4000].var(0), torch.tensor([1.0, 4.0]) + 1e-4, rtol=0.08)
    assert torch.allclose(x[4000:].mean(0), torch.tensor([-5.0, 0.0]), atol=0.05)


def test_the_regulariser_sees_the_earlier_classes_centroids(backbone, tasks, monkeypatch):
    import baselines.hide_prompt as hp

    s = HiDePrompt(replace(SMALL, tii_epochs=0, ca_epochs=0), ctx_for(backbone))
    calls: list[int] = []
    real = hp.orth_loss

    def spy(feat, old, temperature):
        calls.append(len(old))
        assert temperature == 0.8
        return real(feat, old, temperature)

    monkeypatch.setattr(hp, "orth_loss", spy)
    s.learn_task(tasks[0])
    assert set(calls) == {0}  # task 0: the batch alone
    calls.clear()
    s.learn_task(tasks[1])
    assert set(calls) == {int(s.stats.valid[:2].sum())}  # task 1: every centroid of classes 0 and 1


# ----------------------------------------------------------------------------------------------- prediction
def test_per_sample_rows_depend_on_their_image_alone(trained, test_split):
    s, _ = trained
    full = s.predict(test_split, PER_SAMPLE)
    assert full.shape == (len(test_split), 5) and torch.isfinite(full).all()
    rows = [7, 0, 11, 3, 5, 14, 2]
    for kv in ("paired", "pilot"):  # pilot: the reference's layout at batch 1 is the paired one
        with with_cfg(s, kv_layout=kv, eval_batch_size=1):
            single = s.predict(test_split.subset(rows), PER_SAMPLE)
        assert torch.allclose(single, full[rows], atol=1e-5)
    assert torch.equal(s.predict(test_split, PER_SAMPLE), full)


def test_inference_uses_the_slot_of_the_tii_task(trained, test_split):
    s, _ = trained
    tasks = s.task_of(test_split.features)
    with torch.no_grad():
        images = torch.stack([test_split.eval_transform(test_split.source.image(i)) for i in range(len(test_split))])
        expected, _ = s._forward(images, s.prompts.e[tasks], batched=False)
        other, _ = s._forward(images, s.prompts.e[1 - tasks], batched=False)
    got = s.predict(test_split, PER_SAMPLE)
    assert torch.allclose(got, expected[:, :5], atol=1e-5)
    assert not torch.allclose(got, other[:, :5], atol=1e-4)  # the slot matters
    with torch.no_grad():
        tii_cls = s.tii(test_split.features)[:, :5].argmax(1)
    assert torch.equal(tasks, torch.tensor(s.class_task)[tii_cls])


def test_reference_protocol_is_the_per_sample_one_with_paired_prefixes(trained, test_split):
    s, _ = trained
    assert torch.allclose(s.predict(test_split, REFERENCE), s.predict(test_split, PER_SAMPLE), atol=1e-5)


def test_reference_protocol_with_the_pilot_layout_mixes_neighbouring_images_prefixes(trained, test_split):
    """Batches of ``eval_batch_size`` = 4: image b gets stacked rows 2b, 2b + 1 of [keys; values] of the batch."""
    s, _ = trained
    rows = [0, 1, 12, 13]  # two images of task 0's classes, two of task 1's
    batch = test_split.subset(rows)
    with with_cfg(s, kv_layout="pilot"):
        ref = s.predict(batch, REFERENCE)
        per = s.predict(batch, PER_SAMPLE)
        with torch.no_grad():
            images = torch.stack([test_split.eval_transform(test_split.source.image(i)) for i in rows])
            e = s.prompts.e[s.task_of(batch.features)]  # (4, n_layers, 2, L, d)
            mixed = torch.stack([pilot_kv_layout(e[:, i]) for i in range(e.shape[1])], dim=1)
            forced, _ = s._forward(images, mixed, batched=False)
        alone = s.predict(test_split.subset([rows[2]]), REFERENCE)
    assert torch.allclose(ref, forced[:, :5], atol=1e-5)
    assert not torch.allclose(ref, per, atol=1e-4)  # the batch changed what the images predict
    assert torch.allclose(alone[0], per[2], atol=1e-5)  # a batch of one is the per-sample row


# ----------------------------------------------------------------------------------------------- pieces
def test_schedules_follow_timm_stepped_with_the_finished_epochs_index():
    cfg = HiDePromptConfig()  # step: x 0.1 every 30 epochs, stepped after epoch e with index e
    lrs = [scheduled_lr(cfg, 1.0, e) for e in range(50)]
    assert lrs[:31] == [1.0] * 31 and lrs[31] == pytest.approx(0.1) and lrs[49] == pytest.approx(0.1)
    cos = replace(cfg, schedule="cosine", epochs=10, min_lr=0.0)
    assert scheduled_lr(cos, 1.0, 0) == scheduled_lr(cos, 1.0, 1) == 1.0
    assert scheduled_lr(cos, 1.0, 6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 10)))
    assert scheduled_lr(replace(cfg, schedule="constant"), 2.0, 40) == 2.0


def test_clipped_adam_clips_the_gradient_norm_before_the_step():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = ClippedAdam([p], 1.0, lr=0.1)
    (p * torch.tensor([300.0, 400.0, 0.0])).sum().backward()
    opt.step()
    assert float(p.grad.norm()) == pytest.approx(1.0, rel=1e-5)  # clipped from 500 to 1


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="e_prompt_layers"):
        HiDePromptConfig(e_prompt_layers="0,x")
    with pytest.raises(ValueError, match="ca_storage"):
        HiDePromptConfig(ca_storage="kmeans")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt_momentum"):
        HiDePromptConfig(prompt_momentum=2.0)


# ----------------------------------------------------------------------------------------------- accounting
def test_param_formula_counts_the_tensors_a_run_holds(trained, backbone, tasks):
    s, _ = trained
    d, depth = backbone.num_features, len(backbone.model.blocks)
    formula = HiDePrompt.param_formula(s.cfg, d, depth, [len(t.classes) for t in tasks])
    counts = s.param_counts()
    assert (formula.added_per_task, formula.stored_per_task) == (counts.added_per_task, counts.stored_per_task)
    assert formula.trainable_per_task == counts.trainable_per_task and formula.head == counts.head
    learned = s.prompts.e[:2].numel() + sum(p.numel() for p in (*s.head.parameters(), *s.tii.parameters()))
    assert sum(counts.added_per_task) == learned
    assert sum(counts.stored_per_task) == s.stats.numel() + s.tii_stats.numel()


def test_cost_model_counts_the_passes():
    shape = RunShape(train_per_task=(100.0, 100.0), test_seen=(10.0, 20.0), protocols=2)
    cfg = HiDePromptConfig(epochs=3, tii_epochs=4)
    w = HiDePrompt.card.cost(cfg, shape)
    assert w.b == 3 * 200  # prompted training passes
    assert w.f_cacheable == 200 + 20  # frozen features: training images and the final test set
    assert w.f == 220 + 200 + 2 * 30  # + statistics pass per training image + one pass per test image, protocol
    aug = HiDePrompt.card.cost(replace(cfg, tii_input="augmented"), shape)
    assert aug.f == w.f + 4 * 200 and aug.f_cacheable == w.f_cacheable
