"""The benchmark registry. Specs are plain data; loading happens in :func:`build_benchmark`.

Each spec names the function that reads its images (``load``), so registering costs nothing and
``clbench list`` needs neither torch nor Avalanche.
"""

from __future__ import annotations

import clbench.benchmarks.literature  # noqa: F401  (registers the literature presets)
import clbench.benchmarks.literature_domains  # noqa: F401  (registers DomainNet, CORe50, CDDB, Office-Home)
from clbench.benchmarks.base import Benchmark, BenchmarkSpec, build_benchmark
from clbench.benchmarks.registry import BENCHMARKS, register
from clbench.core.config import DEFAULT_BENCH  # declared with the run settings, whose default it is

register(
    BenchmarkSpec(
        name="emoji",
        summary="Embedded: 36 Unicode emoji subcategories, Noto + Twemoji art, grouped split (ships with clbench)",
        load="clbench.benchmarks.emoji:load",
        init_cls=6,
        increment=6,
        backbone="vit_small_patch14_dinov2",
        n_classes=36,
        # The images are 64 px: 112 px (8x8 patches of 14) upsamples less than 224 and measured better with
        # the offline ViT-S/14 (nearest-class-mean 28.6 % vs 23.4 %, linear probe 44.9 % vs 39.9 %), 4x cheaper.
        img_size=112,
        licence="Noto Emoji Apache-2.0; Twemoji CC-BY-4.0 (see clbench/data/NOTICE)",
        source_info="rebuild with: python -m clbench.tools.build_emoji",
        # Three drawings shared by two base emoji of different groups (found by `clbench data check emoji`).
        known_leaks=("test[94] = train[302]", "test[95] = train[303]", "test[463] = train[1179]"),
    )
)

register(
    BenchmarkSpec(
        name="fashion-mnist",
        summary="Fashion-MNIST, official 60k/10k split, 10 classes (Debian dataset-fashion-mnist or --data-root)",
        load="clbench.benchmarks.fashion_mnist:load",
        init_cls=2,
        increment=2,
        backbone="vit_small_patch14_dinov2",
        n_classes=10,
        img_size=224,
        data_env="CLBENCH_FASHION_MNIST",
        licence="MIT (Zalando Research)",
        source_info=(
            "Fashion-MNIST is read from --data-root, $CLBENCH_FASHION_MNIST or /usr/share/datasets/fashion-mnist "
            "(Debian: apt-get install dataset-fashion-mnist); the folder must hold "
            "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; clbench downloads nothing"
        ),
    )
)

import clbench.benchmarks.emoji_domains  # noqa: E402, F401  (registers emoji-domains, four artwork styles)
import clbench.benchmarks.emoji_vendors  # noqa: E402, F401  (registers emoji-vendors, the two-vendor domain benchmark)

__all__ = ["BENCHMARKS", "DEFAULT_BENCH", "Benchmark", "BenchmarkSpec", "build_benchmark", "register"]
