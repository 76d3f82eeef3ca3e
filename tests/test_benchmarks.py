import gzip
import struct

import numpy as np
import pytest

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.benchmarks.base import literature_class_order, task_sizes
from clbench.errors import ClbenchError


def test_class_order_is_the_literature_permutation():
    for n in (10, 36, 100, 200):
        np.random.seed(1993)
        expected = np.random.permutation(n).tolist()
        assert literature_class_order(n) == expected


def test_class_order_leaves_global_rng_alone():
    np.random.seed(5)
    a = np.random.rand()
    np.random.seed(5)
    literature_class_order(50)
    assert np.random.rand() == a


@pytest.mark.parametrize(
    "n,init,inc,expected",
    [
        (36, 6, 6, [6] * 6),
        (100, 10, 10, [10] * 10),
        (37, 6, 6, [6] * 6 + [1]),
        (50, 20, 15, [20, 15, 15]),
        (10, 10, 5, [10]),
    ],
)
def test_task_sizes(n, init, inc, expected):
    assert task_sizes(n, init, inc) == expected


@pytest.mark.parametrize("init,inc", [(0, 5), (37, 5), (6, 40)])
def test_task_sizes_errors(init, inc):
    with pytest.raises(ClbenchError):
        task_sizes(36, init, inc)


def test_emoji_benchmark_real_data():
    b = build_benchmark(BENCHMARKS.get("emoji"))
    assert b.n_classes == 36 and b.task_sizes == [6] * 6
    assert len(b.train) == 2320 and len(b.test) == 942
    assert b.train.images.shape[1:] == (64, 64, 3)
    # labels are arrival positions: class_order[label] is the source class
    assert np.array_equal(np.asarray(b.class_order)[b.train_y], b.train.labels)
    assert set(np.unique(b.test_y)) == set(range(36))


def test_emoji_split_is_grouped_by_base_emoji():
    from clbench.benchmarks.emoji import data_file

    with np.load(data_file()) as z:
        train_groups, test_groups = set(z["train_group"].tolist()), set(z["test_group"].tolist())
    assert train_groups and test_groups and not train_groups & test_groups


def test_avalanche_stream_matches_split():
    from clbench.benchmarks.streams import avalanche_benchmark, experience_classes, experience_indices

    b = build_benchmark(BENCHMARKS.get("emoji"), init_cls=10, increment=8)
    stream = avalanche_benchmark(b)
    sizes, seen = [], []
    for exp in stream.train_stream:
        classes = experience_classes(exp)
        sizes.append(len(classes))
        idx = experience_indices(exp)
        assert set(np.unique(b.train_y[idx])) == set(classes)
        assert len(idx) == int(np.isin(b.train_y, classes).sum())
        seen += classes
    assert sizes == [10, 8, 8, 8, 2]  # remainder task kept, not dropped
    assert seen == list(range(36))


def _write_idx(path, arr):
    header = struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_fashion_mnist_reads_idx_fixture(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("t10k", 20)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    b = build_benchmark(BENCHMARKS.get("fashion-mnist"), data_root=tmp_path)
    assert b.n_classes == 10 and len(b.train) == 40 and len(b.test) == 20
    assert b.train.image(0).mode == "RGB" and b.train.image(0).size == (28, 28)


def test_fashion_mnist_bad_root(tmp_path):
    with pytest.raises(ClbenchError, match="IDX files"):
        build_benchmark(BENCHMARKS.get("fashion-mnist"), data_root=tmp_path)
    with pytest.raises(ClbenchError, match="does not exist"):
        build_benchmark(BENCHMARKS.get("fashion-mnist"), data_root=tmp_path / "nope")


def test_truncated_idx(tmp_path):
    from clbench.benchmarks.fashion_mnist import read_idx

    p = tmp_path / "x-ubyte"
    p.write_bytes(struct.pack(">BBBB", 0, 0, 8, 1) + struct.pack(">I", 10) + b"\0" * 5)
    with pytest.raises(ClbenchError, match="truncated"):
        read_idx(p)
