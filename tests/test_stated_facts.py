"""What the modules' docstrings state about their data and their rules, asserted.

- The domain benchmarks (``emoji-vendors``, ``emoji-domains`` and their build): which artwork set is which domain,
  the counts, and the measured statistics the docstrings give, on the shipped files. A swap of two domains (in the
  loader, the domain tuple or the build's package table) changes which domain shows which style and fails here.
- The under-training check (:mod:`clbench.methods.training_check`): every threshold rule with a case on each side of
  it, at the threshold itself, so that an inverted or loosened comparison fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from clbench.benchmarks.emoji import data_file as emoji_file
from clbench.benchmarks.emoji_domains import DOMAINS, N_CLASSES
from clbench.benchmarks.emoji_domains import data_file as domains_file
from clbench.benchmarks.emoji_domains import load as load_domains
from clbench.benchmarks.emoji_vendors import DOMAINS as VENDORS
from clbench.benchmarks.emoji_vendors import load as load_vendors
from clbench.methods import training_check
from clbench.methods.shared import TrainingTrace, optimizer_step
from clbench.tools.build_emoji_domains import DOMAINS as BUILD_DOMAINS


def _colours(images: np.ndarray) -> np.ndarray:
    """The number of distinct RGB colours of every image of (N, H, W, 3) uint8."""
    flat = images.reshape(len(images), -1, 3).astype(np.int64)
    codes = flat[..., 0] * 65536 + flat[..., 1] * 256 + flat[..., 2]
    return np.array([len(np.unique(c)) for c in codes])


# ----------------------------------------------------------------------------------------------- emoji-vendors
def test_emoji_vendors_pairs_noto_with_its_twemoji_twin_and_noto_has_more_colours_in_92_percent():
    """The docstring: each (label, group) run is Google's images then Twitter's, image by image the same emoji;
    1,160 train and 471 test images per vendor, every class in both; in 92 % of the pairs the Noto image has more
    distinct colours than its Twemoji twin."""
    assert VENDORS == ("noto", "twemoji")
    noto, twemoji = VENDORS.index("noto"), VENDORS.index("twemoji")
    train, test, names = load_vendors(None)
    wins = pairs = 0
    with np.load(emoji_file(), allow_pickle=False) as z:
        groups = {"train": z["train_group"], "test": z["test_group"]}
    for split, source, n in (("train", train, 1160), ("test", test, 471)):
        d, y, g = source.domains, source.labels, groups[split]
        assert np.bincount(d).tolist() == [n, n], split
        for k in (noto, twemoji):
            assert set(y[d == k].tolist()) == set(range(len(names))), (split, k)
        colours = _colours(source.images)
        runs = np.flatnonzero(np.r_[True, (y[1:] != y[:-1]) | (g[1:] != g[:-1])])
        for a, b in zip(runs, np.r_[runs[1:], len(y)], strict=True):
            first, second = np.arange(a, (a + b) // 2), np.arange((a + b) // 2, b)
            assert (d[first] == noto).all() and (d[second] == twemoji).all()  # Google's half first
            wins += int((colours[first] > colours[second]).sum())
            pairs += len(first)
    assert pairs == 1160 + 471
    assert round(100 * wins / pairs) == 92, wins / pairs


# ----------------------------------------------------------------------------------------------- emoji-domains
@pytest.fixture(scope="module")
def domains():
    train, test, names = load_domains(None)
    x = np.concatenate([train.images, test.images])
    d = np.concatenate([train.domains, test.domains])
    return train, test, names, x, d


def test_emoji_domains_each_domain_is_its_artwork_set_by_the_measured_style(domains):
    """The module docstring's measurements: mean distinct colours per image Noto 593, Twemoji 335, OpenMoji 104,
    EmojiOne 91; OpenMoji's black outlines make 7.8 % of its pixels dark (every channel below 60), 1.2 to 1.8 % in
    the other sets. Every pair of domains differs in one of these, so any swap of two domains fails."""
    _, _, _, x, d = domains
    colours = {name: float(_colours(x[d == k]).mean()) for k, name in enumerate(DOMAINS)}
    dark = {name: float((x[d == k].max(axis=3) < 60).mean()) for k, name in enumerate(DOMAINS)}
    assert {k: round(v) for k, v in colours.items()} == {"noto": 593, "twemoji": 335, "emojione": 91, "openmoji": 104}
    dark_pct = {k: round(100 * v, 1) for k, v in dark.items()}
    assert dark_pct == {"noto": 1.2, "twemoji": 1.8, "emojione": 1.5, "openmoji": 7.8}


def test_emoji_domains_file_names_each_domains_package_as_the_build_table_does():
    """The build's table (name -> npm package and version) and the shipped file's ``meta`` agree, domain by domain,
    in the loader's order."""
    with np.load(domains_file(), allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        names = tuple(str(n) for n in z["domain_names"])
    packages = {"noto": "emoji-datasource-google", "twemoji": "emoji-datasource-twitter"}
    packages |= {"emojione": "emojione", "openmoji": "openmoji"}
    assert names == DOMAINS == tuple(d.name for d in BUILD_DOMAINS)
    assert [m["name"] for m in meta["domains"]] == list(DOMAINS)
    for build, shipped in zip(BUILD_DOMAINS, meta["domains"], strict=True):
        assert shipped["package"] == f"{build.package}@{build.version}", build.name
        assert build.package == packages[build.name], build.name
    assert "Noto" in meta["domains"][0]["artwork"] and "Twemoji" in meta["domains"][1]["artwork"]
    assert "EmojiOne" in meta["domains"][2]["artwork"] and "OpenMoji" in meta["domains"][3]["artwork"]


def test_emoji_domains_counts_cap_split_and_order_are_the_builds_rules(domains):
    """build_emoji_domains' rules 2 to 6: every domain the same emoji (806 train and 339 test images each), at most
    160 images of a class over all domains, at least 48 and 4 base emoji, test at least 25 % of a class's images, a
    base emoji on one side only, each split sorted by (label, group, domain), the stored dtypes."""
    train, test, names, _, _ = domains
    assert len(names) == N_CLASSES == 50
    with np.load(domains_file(), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for split, n in (("train", 806), ("test", 339)):
        assert np.bincount(arrays[f"{split}_domain"]).tolist() == [n] * len(DOMAINS)
        keys = list(zip(*(arrays[f"{split}_{k}"].tolist() for k in ("y", "group", "domain")), strict=True))
        assert keys == sorted(keys), split
        assert arrays[f"{split}_y"].dtype == np.int16 and arrays[f"{split}_domain"].dtype == np.int8
    per_class = np.bincount(train.labels, minlength=50) + np.bincount(test.labels, minlength=50)
    assert per_class.max() == 160 and per_class.min() >= 48
    assert (np.bincount(test.labels, minlength=50) / per_class).min() >= 0.25
    groups = [
        {g for y, g in zip(arrays[f"{s}_y"].tolist(), arrays[f"{s}_group"].tolist(), strict=True) if y == c}
        for s in ("train", "test")
        for c in range(50)
    ]
    assert all(len(groups[c] | groups[50 + c]) >= 4 for c in range(50))
    assert not set(arrays["train_group"].tolist()) & set(arrays["test_group"].tolist())


# ----------------------------------------------------------------------------------------------- training check
BELOW_SHARE = math.nextafter(training_check.RESET_SHARE_MIN, 0.0)
BELOW_CHANGE = math.nextafter(training_check.CHANGE_MIN, 0.0)


def test_the_thresholds_are_the_documented_ones():
    assert training_check.RESET_SHARE_MIN == 0.02  # "fewer than 2 % of the first task's predictions"
    assert training_check.CHANGE_MIN == 1e-3  # "less than 0.1 % of their norm"


@pytest.mark.parametrize(
    "reset,changes,warns",
    [
        # the reset share decides wherever it was measured: below 2 % warns, 2 % and above does not
        (0.0, [10.0], True),
        (BELOW_SHARE, [10.0], True),
        (training_check.RESET_SHARE_MIN, [0.0], False),
        (1.0, [0.0], False),
        (0.5, [None], False),
        # without a reset share, the largest measured change decides: below 0.1 % warns, 0.1 % and above does not
        (None, [0.0], True),
        (None, [BELOW_CHANGE], True),
        (None, [None, BELOW_CHANGE, 1e-5], True),
        (None, [training_check.CHANGE_MIN], False),
        (None, [1e-5, 2e-3], False),  # one task that moved is enough: the largest, not the smallest
        (None, [2e-3, 1e-5, None], False),
        (None, [math.inf], False),  # zero-initialised parts that moved
        # nothing measured: nothing to warn about
        (None, [None, None], False),
        (None, [], False),
    ],
)
def test_warning_on_both_sides_of_each_threshold(reset, changes, warns):
    said = training_check.warning(reset, changes)
    assert (said is not None) == warns, said
    if warns and reset is not None:
        assert f"changes {100 * reset:.1f} % of its test predictions (< 2 %)" in said
    elif warns:
        assert f"largest relative change {max(c for c in changes if c is not None):.2e} < 1e-03" in said


def test_relative_change_of_zero_initialised_parts_is_zero_unmoved_and_infinite_moved():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.0)
    with TrainingTrace.active() as trace:
        optimizer_step(opt, p.sum(), "test")
    assert trace.relative_change() == 0.0
    opt = torch.optim.SGD([p], lr=1.0)
    with TrainingTrace.active() as trace:
        optimizer_step(opt, p.sum(), "test")
    assert math.isinf(trace.relative_change())


@dataclasses.dataclass(frozen=True)
class _Cfg:
    epochs: int = 3


@dataclasses.dataclass(frozen=True)
class _Ctx:
    log: object = print
    progress: object = None


class _Twin:
    """A strategy whose untrained twin (epochs 0) predicts class 0 everywhere."""

    def __init__(self, cfg: _Cfg, ctx: _Ctx) -> None:
        self.cfg, self.ctx = cfg, ctx

    def learn_task(self, task) -> None:
        pass

    def predict(self, test, protocol):
        return torch.tensor([[1.0, 0.0]] * 4)


def test_reset_share_is_the_share_of_predictions_that_differ():
    trained = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # one of four differs from the twin's
    share = training_check.reset_share(_Twin(_Cfg(), _Ctx()), None, None, "p", trained)
    assert share == 0.25
    assert training_check.reset_share(_Twin(_Cfg(), _Ctx()), None, None, "p", torch.tensor([[1.0, 0.0]] * 4)) == 0.0
