"""Decoded training images kept in memory, so that a trained method does not decode every image again each epoch.

A trained method (EASE, L2P, DualPrompt, APER, MOS, TOSCA's training) reads its task's training images once per
epoch through :meth:`clbench.methods.contract.Split.image_loader`, and each read decodes the file (a JPEG or PNG of a
folder benchmark) before the augmentation. :class:`DecodedImages` wraps the run's training :class:`ImageSource`: the
first read of an image decodes it and keeps its RGB pixels as a uint8 array; later reads rebuild the same PIL image from
them. The augmentation (RandomResizedCrop, flip, ...) is still drawn and applied per epoch, as the reference does.

The pixels kept are the decoded image itself, not a resized copy: a resize before RandomResizedCrop would change
every crop's pixels (and is not what the reference does), and the results with and without the cache are
bit-identical (``tests/test_decoded_cache.py``). Memory is bounded by a budget (:data:`DEFAULT_BUDGET_MB`, or
``$CLBENCH_DECODED_CACHE_MB``; 0 turns the cache off): once the images kept reach it, further images are decoded on
every read (streaming), as without the cache, and the run says so once. For a source that already holds decoded
arrays (the embedded benchmark, CIFAR) the cache only saves the array-to-image step; ``clbench perf decoded-cache``
measures both kinds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np

from clbench.benchmarks.base import ImageSource
from clbench.errors import ClbenchError

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 2048
BUDGET_ENV = "CLBENCH_DECODED_CACHE_MB"


def budget_bytes() -> int:
    """The memory budget of the decoded-image cache: ``$CLBENCH_DECODED_CACHE_MB`` megabytes, else the default."""
    raw = os.environ.get(BUDGET_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_BUDGET_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb >= 0:  # also NaN
        raise ClbenchError(
            f"${BUDGET_ENV} is {raw!r}, not a number of megabytes",
            f"set it to a number such as {DEFAULT_BUDGET_MB} (0 turns the decoded-image cache off), or unset it",
        )
    return int(mb * 2**20)


class DecodedImages(ImageSource):
    """``source`` with each image's decoded pixels kept after its first read, up to ``budget`` bytes (module
    docstring). Everything else (labels, name, fingerprint, data id) is ``source``'s."""

    def __init__(self, source: ImageSource, budget: int, warn: Callable[[str], None] | None = log.warning) -> None:
        self.source = source
        self.labels = source.labels
        self.name = getattr(source, "name", "images")
        self.budget = int(budget)
        self.kept: dict[int, np.ndarray] = {}
        self.bytes = 0
        self.full = self.budget <= 0  # over budget: streaming from here on
        self._warn = warn
        self.hits = 0
        self.misses = 0

    def image(self, i: int):
        from PIL import Image

        i = int(i)
        pixels = self.kept.get(i)
        if pixels is not None:
            self.hits += 1
            return Image.fromarray(pixels)  # (H, W, 3) uint8: the RGB image it was
        self.misses += 1
        img = self.source.image(i)
        if not self.full:
            if img.mode != "RGB":  # sources give RGB; anything else is streamed as it is, never altered
                return img
            pixels = np.asarray(img, dtype=np.uint8).copy()
            if self.bytes + pixels.nbytes > self.budget:
                self.full = True
                if self._warn is not None:
                    self._warn(
                        f"decoded-image cache: {len(self.kept)} images ({self.bytes / 2**20:.0f} MB) fill its budget "
                        f"of {self.budget / 2**20:.0f} MB; the other training images are decoded on every read "
                        f"(raise ${BUDGET_ENV} to keep more)"
                    )
                return img
            self.kept[i] = pixels
            self.bytes += pixels.nbytes
        return img

    def fingerprint(self) -> str:
        return self.source.fingerprint()

    def data_id(self) -> str:
        return self.source.data_id()

    def __getattr__(self, name: str):  # the wrapped source's own attributes (a folder's root and paths, ...)
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)
