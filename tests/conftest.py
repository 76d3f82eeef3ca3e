"""Shared fixtures: an isolated clbench cache, and a prepared session on the tiny random ViT.

Tests run offline on the CPU. ``vit_micro`` (4 blocks, 64-d, 32 px, random weights) exercises the mechanics
in seconds; tests marked ``slow`` use the real offline DINOv2 ViT-S/14 and the real embedded data.
Set ``CLBENCH_TEST_CACHE`` to share converted weights and feature caches between test sessions (CI does).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import clbench  # noqa: F401  (first: sets OpenMP's wait policy before any test module imports torch)

pytest_plugins = ["tinytasks"]  # fixtures of the method tests: backbone, one_thread


def _share_the_cores() -> None:
    """Under pytest-xdist each worker takes its share of the cores for torch's threads, and so do the processes
    its tests start (``OMP_NUM_THREADS``): two workers each running two threads on two cores lose time to switching.
    A test that sets its own thread count (``one_thread``, ``clbench.methods.shared.torch_threads``) still does."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(threads)


_share_the_cores()

# A checkpoint after every task (clbench.run.checkpoint.Cadence): the resume, kill and tampering tests stop and inspect
# runs whose tasks take milliseconds, which the default cadence would never checkpoint. The processes tests start
# inherit it; tests of the cadence itself set their own.
os.environ.setdefault("CLBENCH_CHECKPOINT_S", "0")

MICRO = dict(bench="emoji", backbone="vit_micro", weights="random")

# The files that take longest in the default tier, longest first (seconds on 2 cores with a cold cache): xdist hands
# whole files to the two workers in collection order (``--dist loadfile --no-loadscope-reorder``), so starting with
# these leaves the many short files to even out the end instead of one long file running alone on one worker. Only
# the order changes; a file missing here runs after them in the usual order.
LONGEST_FIRST = (
    "test_contract.py",  # 185 s
    "test_real.py",  # 179 s, the real ViT's 56 px features
    "test_sweep.py",  # 104 s
    "test_report.py",  # 98 s
    "test_reliability.py",  # 92 s
    "test_hostile.py",  # 55 s
    "test_precision.py",  # 40 s
    "test_training_check.py",  # 36 s
    "test_avalanche_api.py",  # 34 s
    "test_cost_model.py",  # 31 s
    "test_trackers.py",  # 28 s
    "test_hostile_writes.py",  # 27 s
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the usual order within each rank


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    shared = os.environ.get("CLBENCH_TEST_CACHE")
    if shared:
        return Path(shared)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist workers share one cache: weights converted, features made once
        base = base.parent
    path = base / "clbench-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def _isolated_cache(cache_root, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(cache_root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def micro_session_factory(cache_root):
    """Build prepared sessions on the micro ViT (features computed once per session via the cache)."""
    from clbench.run.harness import RunConfig, prepare

    def make(strategy: str = "simplecil", **kw):
        os.environ["CLBENCH_CACHE"] = str(cache_root)
        cfg = RunConfig(strategy=strategy, **{**MICRO, **kw})
        return prepare(cfg)

    return make
