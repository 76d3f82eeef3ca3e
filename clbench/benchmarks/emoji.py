"""The embedded default benchmark: 36 Unicode emoji subcategories drawn by two vendors.

Built by :mod:`clbench.tools.build_emoji` from the npm packages emoji-datasource-google and
emoji-datasource-twitter 16.0.0 and shipped as ``clbench/data/emoji.npz`` (licences in
``clbench/data/NOTICE``). The train/test split is grouped by base emoji: every skin-tone variant and both
vendors' drawings of one emoji fall on the same side, so near-duplicates never straddle the split.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource, NpzArraySource
from clbench.errors import ClbenchError


def data_file() -> Path:
    return Path(str(resources.files("clbench") / "data" / "emoji.npz"))


def load(data_root: Path | None) -> tuple[ArraySource, ArraySource, list[str]]:
    path = (data_root / "emoji.npz") if data_root is not None else data_file()
    if not path.is_file():
        raise ClbenchError(
            f"the embedded emoji benchmark file {path} is missing",
            "reinstall clbench, or rebuild it with: python -m clbench.tools.build_emoji",
        )
    with np.load(path, allow_pickle=False) as z:  # the labels now, the images when a pixel is read
        names = [str(n) for n in z["class_names"]]
        train = NpzArraySource(path, "train_x", z["train_y"], "emoji/train")
        test = NpzArraySource(path, "test_x", z["test_y"], "emoji/test")
        train.groups = z["train_group"]  # the split is grouped by base emoji: a validation split holds out groups
    return train, test, names
