"""The decoded-image cache of trained methods (issue 41, item 2; :mod:`clbench.features.decoded`): a training image is
decoded
once, not once per epoch; the augmentation still runs every epoch; results are bit-identical with and without the
cache; over its memory budget it streams."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from datatrees import make_tree

from clbench.cli import main

EPOCHS = 2
ARGV = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "2", "--increment", "2", "--precision", "fp32"]


def _l2p(data: Path, out: Path) -> dict:
    argv = ["run", "--strategy", "l2p", "--bench", "folder", "--data-root", str(data), *ARGV, "--out", str(out)]
    argv += ["--set", f"epochs={EPOCHS}", "--set", "batch_size=4"]
    assert main(argv) == 0
    return json.loads((out / "result.json").read_text())


def _noise_tree(root: Path) -> Path:
    """A folder benchmark of random-pixel PNGs (two classes, three training images each, one test image each)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("test", 1)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for k in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / split / c / f"{k}.png")
    return root


def test_the_augmented_batches_are_bit_identical_with_and_without_the_cache(tmp_path):
    """Two epochs of a training loader (shuffled, RandomResizedCrop + flip drawn per epoch) over a folder of PNGs
    give the same tensors from the decoded cache as from the files, and the second epoch reads no file."""
    import torch

    from clbench.benchmarks.folder import load_tree
    from clbench.features.decoded import DecodedImages
    from clbench.features.transforms import TransformSpec
    from clbench.methods.contract import Split

    source = load_tree(_noise_tree(tmp_path / "data"))[0]
    cached = DecodedImages(source, budget=1 << 30)
    train = TransformSpec(16, None, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), train=True).build()
    eval_tf = TransformSpec(16, None, None, None).build()
    idx = np.arange(len(source))
    batches = {}
    for name, src in (("files", source), ("cached", cached)):
        split = Split(src, idx, torch.as_tensor(source.labels), torch.zeros(len(idx), 1), eval_tf, train)
        torch.manual_seed(5)
        out = []
        loader = split.image_loader(4, augment=True, shuffle=True, generator=torch.Generator().manual_seed(1))
        for _ in range(2):  # two passes of one loader: its generator draws each pass's order and crops
            for x, y, _pos in loader:
                out.append((x, y))
        batches[name] = out
    assert len(batches["files"]) == len(batches["cached"]) > 0
    for (a, ya), (b, yb) in zip(batches["files"], batches["cached"], strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)
    assert cached.misses == len(idx) and cached.hits == len(idx)  # decoded in epoch 1 only
    first, second = batches["files"][0][0], batches["files"][len(batches["files"]) // 2][0]
    assert not torch.equal(first, second)  # the augmentation is drawn again each epoch


@pytest.mark.full
def test_a_trained_method_decodes_each_training_image_once_and_gets_the_same_results(tmp_path, monkeypatch):
    """L2P on a folder of PNGs for two epochs: with the cache each training image is decoded once less per extra
    epoch than without it, and the records (accuracy matrices, predictions) and saved features are bit-identical.
    The full-tier repeat, through a whole run, of
    :func:`test_the_augmented_batches_are_bit_identical_with_and_without_the_cache`."""
    import clbench.benchmarks.folder as folder

    data = make_tree(tmp_path / "data", n_train=3, n_test=1)
    n_train = 4 * 3
    decodes: list[Path] = []
    real = folder.decode_image

    def counted(path: Path, *rest, **options):
        if not rest and not options:  # FileSource.image's read (the data check verifies with the bytes given)
            decodes.append(path)
        return real(path, *rest, **options)

    monkeypatch.setattr(folder, "decode_image", counted)
    counts, records = {}, {}
    for name, budget in (("streamed", "0"), ("cached", None)):
        if budget is None:
            monkeypatch.delenv("CLBENCH_DECODED_CACHE_MB", raising=False)
        else:
            monkeypatch.setenv("CLBENCH_DECODED_CACHE_MB", budget)
        monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / f"cache-{name}"))  # each computes its features
        decodes.clear()
        records[name] = _l2p(data, tmp_path / name)
        counts[name] = len(decodes)
    assert counts["streamed"] - counts["cached"] == (EPOCHS - 1) * n_train, counts
    for field in ("accuracy_matrix", "acc_curve", "protocols", "params"):
        assert records["cached"][field] == records["streamed"][field], field
    for file in ("predictions.npz", "features.pt"):
        a, b = tmp_path / "cached" / file, tmp_path / "streamed" / file
        if a.exists() or b.exists():
            assert a.read_bytes() == b.read_bytes(), file


def test_over_its_budget_the_cache_streams_and_says_so_once():
    """Images that do not fit the budget are decoded on every read, the same pixels either way; one warning."""
    from clbench.benchmarks.base import ArraySource
    from clbench.features.decoded import DecodedImages

    rng = np.random.default_rng(0)
    source = ArraySource(rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8), np.arange(5), "tiny")
    warnings: list[str] = []
    cache = DecodedImages(source, budget=2 * 8 * 8 * 3, warn=warnings.append)  # room for two images
    for _ in range(3):
        for i in range(5):
            assert np.array_equal(np.asarray(cache.image(i)), np.asarray(source.image(i)))
    assert sorted(cache.kept) == [0, 1] and cache.bytes == 2 * 192 and len(warnings) == 1
    assert cache.hits == 2 * 2 and cache.misses == 5 + 2 * 3
    assert cache.fingerprint() == source.fingerprint() and len(cache) == 5


def test_a_budget_that_is_not_a_number_is_refused(monkeypatch):
    from clbench.errors import ClbenchError
    from clbench.features.decoded import budget_bytes

    monkeypatch.setenv("CLBENCH_DECODED_CACHE_MB", "lots")
    with pytest.raises(ClbenchError, match="not a number of megabytes"):
        budget_bytes()
    monkeypatch.setenv("CLBENCH_DECODED_CACHE_MB", "1.5")
    assert budget_bytes() == int(1.5 * 2**20)
