"""``emoji-vendors``: the embedded emoji benchmark as two domains, Noto then Twemoji, over the same 36 classes.

The cheap domain-incremental benchmark (``--scenario domain``): the images, labels and grouped train/test split of
``clbench/data/emoji.npz`` (:mod:`clbench.benchmarks.emoji`) unchanged, each image's domain its vendor. The file
stores no vendor column, but its build (:mod:`clbench.tools.build_emoji`) fixes it: each split is sorted by
(label, group, vendor, image name), and every base emoji's group holds each of its images once per vendor (every
(label, group) run of the file has an even length, checked on load). So in each run the first half is Google's
(``google`` sorts before ``twitter``) and the second half Twitter's, image by image the same emoji: 1,160 train and
471 test images per vendor, every class in both. (Measured on the shipped file: in 92 % of these pairs the Noto
image has more distinct colours than its Twemoji twin, as the gradient and the flat styles would.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource, BenchmarkSpec
from clbench.benchmarks.emoji import data_file
from clbench.benchmarks.emoji import load as load_emoji
from clbench.benchmarks.registry import register
from clbench.errors import ClbenchError

DOMAINS = ("noto", "twemoji")  # google's artwork first: the order the file sorts them in


def vendor_index(labels: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The domain (0 Noto, 1 Twemoji) of every image of a split sorted by (label, group, vendor, image name):
    the second half of each (label, group) run is Twemoji's. Raises ClbenchError on a run of odd length."""
    n = len(labels)
    starts = np.flatnonzero(np.r_[True, (labels[1:] != labels[:-1]) | (groups[1:] != groups[:-1])])
    ends = np.r_[starts[1:], n]
    out = np.zeros(n, dtype=np.int64)
    for a, b in zip(starts, ends, strict=True):
        if (b - a) % 2:
            raise ClbenchError(
                f"emoji-vendors: group {groups[a]!r} has {b - a} images, not one per vendor of each emoji",
                "rebuild the embedded benchmark with: python -m clbench.tools.build_emoji",
            )
        out[a + (b - a) // 2 : b] = 1
    return out


def load(data_root: Path | None) -> tuple[ArraySource, ArraySource, list[str]]:
    train, test, names = load_emoji(data_root)

    path = (data_root / "emoji.npz") if data_root is not None else data_file()
    with np.load(path, allow_pickle=False) as z:
        train.domains = vendor_index(train.labels, z["train_group"])
        test.domains = vendor_index(test.labels, z["test_group"])
    return train, test, names


SPEC = register(
    BenchmarkSpec(
        name="emoji-vendors",
        summary="Embedded emoji, domain-incremental: 36 subcategories drawn by Noto, then Twemoji (--scenario domain)",
        load="clbench.benchmarks.emoji_vendors:load",
        init_cls=36,  # the class scenario: one task of every class (the domain scenario's tasks are the vendors)
        increment=36,
        backbone="vit_small_patch14_dinov2",
        n_classes=36,
        img_size=112,  # as emoji's
        licence="Noto Emoji Apache-2.0; Twemoji CC-BY-4.0 (see clbench/data/NOTICE)",
        source_info="the embedded emoji benchmark; rebuild with: python -m clbench.tools.build_emoji",
        known_leaks=("test[94] = train[302]", "test[95] = train[303]", "test[463] = train[1179]"),  # emoji's
        domains=DOMAINS,
        features_as="emoji",  # the same images: one feature extraction for both
    )
)
