"""The timer every measurement uses: the median of repeated calls after warm-up ones."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
