"""APER: the concatenated prototypes, one adapted pass per image after the first session, parameter formulas, and
refusals.

Mechanics on the tiny random ViT (``vit_micro``, 64-d) with tiny data; the profiles, the ``--set`` check and the
slow test on the embedded benchmark with the real offline ViT are tests/test_method_profiles.py's, shared with RanPAC.
The clbench cache (``CLBENCH_CACHE``) is isolated per session by ``conftest.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tinytasks import check_one_adapted_pass_per_image, check_param_formula_after_a_real_run, ctx_for

from baselines.aper import APER, APERConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tinytasks.py; `backbone`, `tasks`, `test_split` too

APER_SMALL = APERConfig(epochs=1, batch_size=8, eval_batch_size=4, bottleneck=8)


# ----------------------------------------------------------------------------------------------- fixtures
TASK_CLASSES = ([0, 1], [2, 3])  # two equal tasks: the classes of tinytasks' `tasks` and `test_split`


# ----------------------------------------------------------------------------------------------- one pass per image
@pytest.mark.parametrize("method", ["aper"])
def test_after_task_0_every_image_passes_the_adapted_vit_once(backbone, tasks, test_split, method):
    s = APER(APER_SMALL, ctx_for(backbone))
    check_one_adapted_pass_per_image(s, backbone, tasks, test_split)


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
    check_param_formula_after_a_real_run(tmp_path, strategy, overrides)


# ----------------------------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="epochs"):
        APERConfig(epochs=0)
