"""Literature presets, ImageFolder trees, CIFAR-100's on-disk format and ``clbench data check``, on tiny fixtures.

Every fixture is built here (8x8 PNGs, a few per class; CIFAR pickles of a few hundred rows); nothing downloads.
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.benchmarks.check import add_data_check_args, check_data, cmd_data_check
from clbench.errors import ClbenchError

TREE_PRESETS = {  # name: (classes, B0 IncK) -- TOSCA's exps/tosca_*.json, PILOT's class counts
    "cub200": (200, 10),
    "imagenet-r": (200, 20),
    "imagenet-a": (200, 20),
    "objectnet": (200, 20),
    "omnibenchmark": (300, 30),
    "vtab": (50, 10),
    "eurosat": (10, 2),
}


def png(i: int, size: int = 8) -> bytes:
    """A distinct tiny PNG for every ``i``."""
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (i % 256, (i // 256) % 256, 7)).save(buf, format="PNG")
    return buf.getvalue()


def make_tree(
    root: Path, classes, n_train: int = 2, n_test: int = 1, same_bytes: bool = False, empty_dirs: bool = False
) -> Path:
    """``root/{train,test}/<class>/<k>.png``; distinct images unless ``same_bytes`` (fast for 300 classes).
    A split with 0 images per class gets no class folders, unless ``empty_dirs``."""
    shared = png(0)
    i = 0
    for split, n in (("train", n_train), ("test", n_test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for c in classes if n or empty_dirs else ():
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                (d / f"{k}.png").write_bytes(shared if same_bytes else png(i))
                i += 1
    return root


def data_check(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_data_check_args(parser)
    code = cmd_data_check(parser.parse_args(argv))
    return code, capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- presets
def test_presets_carry_the_papers_splits_and_reference_transforms():
    expected = {**TREE_PRESETS, "cifar100": (100, 5)}
    for name, (n, k) in expected.items():
        spec = BENCHMARKS.get(name)
        assert (spec.n_classes, spec.init_cls, spec.increment) == (n, k, k), name
        assert (spec.img_size, spec.resize, spec.normalize) == (224, 256, False), name
        assert spec.backbone == "vit_base_patch16_224.augreg_in21k", name
        assert spec.source_info and spec.data_env == "CLBENCH_" + name.replace("-", "_").upper(), name
    for name in ("cub200", "imagenet-r", "imagenet-a", "objectnet", "omnibenchmark", "vtab"):
        assert "LAMDA-PILOT README" in BENCHMARKS.get(name).source_info
    folder = BENCHMARKS.get("folder")
    assert folder.n_classes is None and (folder.init_cls, folder.increment) == (10, 10) and folder.needs_data_root


def test_registering_presets_stays_torch_free():
    code = (
        "import sys, clbench.benchmarks as b; assert 'omnibenchmark' in b.BENCHMARKS;"
        "print(sorted(m for m in ('torch', 'PIL', 'avalanche', 'timm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(TREE_PRESETS))
def test_every_tree_preset_loads_a_fixture_of_its_class_count(name, tmp_path):
    n, k = TREE_PRESETS[name]
    root = make_tree(tmp_path, [f"c{i:03d}" for i in range(n)], n_train=1, n_test=1, same_bytes=True)
    b = build_benchmark(BENCHMARKS.get(name), data_root=root)
    assert b.n_classes == n and b.task_sizes == [k] * (n // k)
    assert len(b.train) == len(b.test) == n


def test_preset_rejects_the_wrong_class_count(tmp_path):
    root = make_tree(tmp_path, [f"c{i}" for i in range(49)], n_train=1, n_test=1, same_bytes=True)
    with pytest.raises(ClbenchError, match="'vtab' should have 50 classes but .* has 49") as e:
        build_benchmark(BENCHMARKS.get("vtab"), data_root=root)
    assert "LAMDA-PILOT README" in e.value.hint


def test_preset_reads_its_environment_variable(tmp_path, monkeypatch):
    root = make_tree(tmp_path, [f"c{i}" for i in range(10)], same_bytes=True)
    monkeypatch.setenv("CLBENCH_EUROSAT", str(root))
    assert build_benchmark(BENCHMARKS.get("eurosat")).task_sizes == [2] * 5


def test_preset_without_data_root_says_where_to_get_it(monkeypatch):
    monkeypatch.delenv("CLBENCH_OMNIBENCHMARK", raising=False)
    with pytest.raises(ClbenchError, match="needs its data: pass --data-root DIR or set CLBENCH_OMNIBENCHMARK") as e:
        build_benchmark(BENCHMARKS.get("omnibenchmark"))
    assert "Google Drive / OneDrive" in e.value.hint


# ----------------------------------------------------------------------------------------------- folder trees
def test_folder_discovers_sorted_classes_order_and_remainder_split(tmp_path):
    names = ["zebra", "Apple", "mango", "banana", "cherry"]  # created unsorted; "Apple" < "banana" (codepoints)
    root = make_tree(tmp_path, names, n_train=3, n_test=2)
    b = build_benchmark(BENCHMARKS.get("folder"), data_root=root, init_cls=2, increment=2)
    assert b.class_names == sorted(names) == ["Apple", "banana", "cherry", "mango", "zebra"]
    np.random.seed(1993)
    assert b.class_order == np.random.permutation(5).tolist()
    assert b.task_sizes == [2, 2, 1]
    assert len(b.train) == 15 and len(b.test) == 10
    for i, rel in enumerate(b.train.paths):  # source label = sorted position of the folder; y = arrival position
        assert b.class_names[b.train.labels[i]] == rel.split("/")[1]
        assert b.class_order[b.train_y[i]] == b.train.labels[i]
    img = b.train.image(0)
    assert img.mode == "RGB" and img.size == (8, 8)


def test_folder_default_split_needs_ten_classes(tmp_path):
    root = make_tree(tmp_path, ["a", "b", "c"])
    with pytest.raises(ClbenchError, match="--init-cls 10 is larger than the benchmark's 3 classes"):
        build_benchmark(BENCHMARKS.get("folder"), data_root=root)


def test_hidden_and_non_image_files_are_ignored_nested_images_kept(tmp_path):
    root = make_tree(tmp_path, ["a", "b"])
    (root / "train" / "a" / "notes.txt").write_text("x")
    (root / "train" / "a" / "._0.png").write_bytes(b"AppleDouble junk")
    (root / "train" / ".ipynb_checkpoints").mkdir()
    (root / "train" / "a" / "sub").mkdir()
    (root / "train" / "a" / "sub" / "deep.PNG").write_bytes(png(99))
    b = build_benchmark(BENCHMARKS.get("folder"), data_root=root, init_cls=1, increment=1)
    assert b.class_names == ["a", "b"]
    assert b.train.paths[:3] == ["train/a/0.png", "train/a/1.png", "train/a/sub/deep.PNG"]


@pytest.mark.parametrize(
    "make,needle",
    [
        (
            lambda r: make_tree(r, ["a", "b"]) and __import__("shutil").rmtree(r / "test"),
            r"has no test/ folder: expected .*/test/<class>/<image>",
        ),
        (
            lambda r: make_tree(r / "vtab-cil" / "vtab", ["a"]),
            r"has no train/ and test/ folder.*did you mean --data-root .*vtab-cil/vtab\?",
        ),
        (lambda r: (r / "cats").mkdir(), "split them into train/ and test/"),
        (lambda r: make_tree(r, ["a"]) and (r / "test").rename(r / "val"), "it has val/: rename it to test/"),
        (
            lambda r: make_tree(r, ["a", "b"]) and make_tree(r, ["ghost"], n_train=0),
            r"1 class\(es\) in .*/test have no folder in .*/train: 'ghost'",
        ),
        (
            lambda r: make_tree(r, ["a", "b"]) and make_tree(r, ["extra"], n_test=0, empty_dirs=True),
            r"1 class folder\(s\) in .*/test hold no images: 'extra'",
        ),
        (lambda r: make_tree(r, ["a", "b"], n_train=0, n_test=0, empty_dirs=True), "holds no images at all"),
        (lambda r: [(r / s).mkdir() for s in ("train", "test")], "hold no class folders"),
    ],
    ids=["no-test", "nested", "unsplit", "val", "test-only-class", "empty-class", "no-images", "no-classes"],
)
def test_structural_errors_name_the_problem(make, needle, tmp_path):
    make(tmp_path)
    with pytest.raises(ClbenchError, match=needle):
        build_benchmark(BENCHMARKS.get("folder"), data_root=tmp_path, init_cls=1, increment=1)


def test_unreadable_image_is_named(tmp_path):
    root = make_tree(tmp_path, ["a", "b"])
    (root / "train" / "b" / "0.png").write_bytes(b"this is not a png")
    (root / "train" / "b" / "1.png").write_bytes(png(5)[:40])  # truncated
    b = build_benchmark(BENCHMARKS.get("folder"), data_root=root, init_cls=1, increment=1)
    for k in (0, 1):
        i = b.train.paths.index(f"train/b/{k}.png")
        with pytest.raises(ClbenchError, match=rf"cannot decode image .*train/b/{k}\.png"):
            b.train.image(i)


@pytest.mark.parametrize("limit", [10, 40])  # 64 px: > 2x limit is PIL's error, > limit its warning
def test_decompression_bomb_is_a_clear_error(limit, tmp_path, monkeypatch):
    root = make_tree(tmp_path, ["a"])
    b = build_benchmark(BENCHMARKS.get("folder"), data_root=root, init_cls=1, increment=1)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    with pytest.raises(ClbenchError, match=r"image .*train/a/0\.png is too large to decode safely"):
        b.train.image(0)


def test_fingerprint_tracks_paths_sizes_and_mtimes(tmp_path):
    import os

    root = make_tree(tmp_path, ["a", "b"])

    def load():
        return build_benchmark(BENCHMARKS.get("folder"), data_root=root, init_cls=1, increment=1)

    fp = load().train.fingerprint()
    assert load().train.fingerprint() == fp  # stable
    f = root / "train" / "a" / "0.png"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    fp2 = load().train.fingerprint()
    assert fp2 != fp
    f.rename(root / "train" / "a" / "9.png")
    assert load().train.fingerprint() not in (fp, fp2)


# ----------------------------------------------------------------------------------------------- data check
def test_data_check_passes_a_clean_root(tmp_path, capsys):
    root = make_tree(tmp_path, [f"c{i}" for i in range(10)], n_train=3, n_test=2)
    code, out = data_check(["eurosat", "--data-root", str(root)], capsys)
    assert code == 0, out
    assert "OK: eurosat data is ready" in out
    assert "30 images; per class min 3, median 3, max 3" in out
    assert "published" in out and "phelber/EuroSAT" in out and "layout" in out


def test_data_check_lists_leak_unreadable_and_count_problems(tmp_path, capsys):
    root = make_tree(tmp_path, [f"c{i}" for i in range(9)], n_train=3, n_test=2)
    (root / "test" / "c4" / "1.png").write_bytes((root / "train" / "c2" / "0.png").read_bytes())  # leak
    (root / "train" / "c7" / "2.png").write_bytes(b"garbage")
    jpeg = io.BytesIO()
    Image.radial_gradient("L").save(jpeg, format="JPEG")
    (root / "train" / "c1" / "cut.jpg").write_bytes(jpeg.getvalue()[:1500])  # passes PIL verify(), fails to decode
    code, out = data_check(["eurosat", "--data-root", str(root)], capsys)
    assert code == 1
    assert "3 problem(s):" in out
    assert "'eurosat' should have 10 classes but" in out
    assert "2 unreadable image(s)" in out and "train/c7/2.png: not an image" in out
    assert "train/c1/cut.jpg: OSError: image file is truncated" in out
    assert "1 test image(s) are byte-identical to a training image" in out
    assert "test/c4/1.png = train/c2/0.png" in out


def test_data_check_reports_the_loaders_structural_message(tmp_path, capsys):
    make_tree(tmp_path, ["a", "b"]) and make_tree(tmp_path, ["ghost"], n_train=0)
    with pytest.raises(ClbenchError) as e:
        build_benchmark(BENCHMARKS.get("folder"), data_root=tmp_path, init_cls=1, increment=1)
    report = check_data("folder", tmp_path)
    assert not report.ok and report.problems[0] == str(e.value).split("\n")[0]
    code, out = data_check(["folder", "--data-root", str(tmp_path / "missing")], capsys)
    assert code == 1 and "does not exist" in out


# ----------------------------------------------------------------------------------------------- CIFAR-100
def write_cifar(root: Path, per_class=(2, 1), leak: bool = False) -> Path:
    """torchvision's on-disk format: cifar-100-python/{train,test,meta} pickles."""
    rng = np.random.default_rng(0)
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    for split, k in zip(("train", "test"), per_class, strict=True):
        labels = np.repeat(np.arange(100), k)
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        data[0, :1024] = 255  # image 0: red plane full,
        data[0, 1024:] = 0  # green and blue planes empty
        if split == "train":
            train_rows = data
        elif leak:
            data[0] = train_rows[5]
        with open(d / split, "wb") as f:
            pickle.dump({"data": data, "fine_labels": labels.tolist(), "coarse_labels": [0] * len(labels)}, f)
    with open(d / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"class{i:02d}" for i in range(100)]}, f)
    return root


def test_cifar100_reads_torchvisions_format_offline(tmp_path):
    root = write_cifar(tmp_path)
    spec = BENCHMARKS.get("cifar100")
    for data_root in (root, root / "cifar-100-python"):
        b = build_benchmark(spec, data_root=data_root)
        assert b.n_classes == 100 and b.task_sizes == [5] * 20
        assert len(b.train) == 200 and len(b.test) == 100
        assert b.class_names[3] == "class03"
    px = np.asarray(b.train.image(0))
    assert px.shape == (32, 32, 3) and (px[..., 0] == 255).all() and (px[..., 1:] == 0).all()  # channel-major


def test_cifar100_bad_root_and_tampered_pickle(tmp_path):
    with pytest.raises(ClbenchError, match="holds no CIFAR-100 in torchvision's format"):
        build_benchmark(BENCHMARKS.get("cifar100"), data_root=tmp_path)
    root = write_cifar(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (root / "cifar-100-python" / "meta").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ClbenchError, match="refusing to load builtins.print"):
        build_benchmark(BENCHMARKS.get("cifar100"), data_root=root)


def test_data_check_finds_a_cifar_leak(tmp_path, capsys):
    root = write_cifar(tmp_path, leak=True)
    code, out = data_check(["cifar100", "--data-root", str(root)], capsys)
    assert code == 1 and "1 test image(s) are byte-identical" in out and "test[0] = train[5]" in out


# ----------------------------------------------------------------------------------------------- end to end
def test_clbench_run_on_a_folder_tree(tmp_path, monkeypatch, capsys):
    from clbench.cli import main

    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    root = make_tree(tmp_path / "data", ["d", "a", "c", "b"], n_train=3, n_test=2)
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--strategy",
            "simplecil",
            "--bench",
            "folder",
            "--data-root",
            str(root),
            "--backbone",
            "vit_micro",
            "--weights",
            "random",
            "--init-cls",
            "2",
            "--increment",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rec = json.loads((out / "result.json").read_text())
    assert rec["complete"] and rec["bench"] == "folder" and rec["task_sizes"] == [2, 2]
    np.random.seed(1993)
    assert rec["class_order"] == np.random.permutation(4).tolist()
    assert rec["class_names"] == [["a", "b", "c", "d"][c] for c in rec["class_order"]]
    assert rec["transform"] == "eval-resize37-crop32-bicubic-none"  # 256/224 of the micro ViT's 32 px, no mean/std
