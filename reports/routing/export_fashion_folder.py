"""Export a Fashion-MNIST subset to the train/ + test/ ImageFolder tree that clbench's `folder` benchmark reads.

The first PER_CLASS_TRAIN training and PER_CLASS_TEST test images of each class, in the official files' order
(no sampling, so the tree is the same on every machine), as 28x28 grey PNGs. Source: Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist), read with clbench's own IDX reader.

    python reports/routing/export_fashion_folder.py /tmp/fashion-folder [TRAIN_PER_CLASS TEST_PER_CLASS]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from clbench.benchmarks.fashion_mnist import CLASS_NAMES, DEBIAN_DIR, FILES, _find, read_idx


def export(out: Path, per_class: dict[str, int]) -> None:
    for split, (img_stem, lab_stem) in FILES.items():
        x, y = read_idx(_find(DEBIAN_DIR, img_stem)), read_idx(_find(DEBIAN_DIR, lab_stem))
        name = "train" if split == "train" else "test"
        for c, cname in enumerate(CLASS_NAMES):
            folder = out / name / f"{c}-{cname.replace('/', '-').replace(' ', '-')}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in np.flatnonzero(y == c)[: per_class[name]]:
                Image.fromarray(x[i]).save(folder / f"{i:05d}.png")


if __name__ == "__main__":
    n_train, n_test = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (300, 100)
    export(Path(sys.argv[1]), {"train": n_train, "test": n_test})
