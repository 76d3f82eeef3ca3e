"""Tiny image-folder trees for tests: ``root/{train,test}/<class>/<k>.png``, every image distinct."""

from __future__ import annotations

import io
from pathlib import Path


def png_bytes(i: int, size: int = 8) -> bytes:
    """A ``size`` x ``size`` PNG whose colour is fixed by ``i`` (distinct for distinct ``i`` below 256)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (i % 256, (7 * i) % 256, (13 * i) % 256)).save(buf, format="PNG")
    return buf.getvalue()


def make_tree(root: Path, classes=("a", "b", "c", "d"), n_train: int = 2, n_test: int = 1, start: int = 0) -> Path:
    i = start
    for split, n in (("train", n_train), ("test", n_test)):
        for c in classes:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for k in range(n):
                (root / split / c / f"{k}.png").write_bytes(png_bytes(i))
                i += 1
    return root
