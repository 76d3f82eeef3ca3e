"""The literature's domain-incremental presets (DomainNet, CORe50, CDDB, Office-Home) on tiny fixture trees.

Each fixture is made here in the release's own layout (one or two 8x8 PNGs per domain and class); nothing
downloads. The tests check what a run depends on: every image's class and domain, the split the reference uses,
``clbench data check`` on the tree, and that a broken tree is refused with the missing file named.
"""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.benchmarks.check import check_data
from clbench.benchmarks.literature_domains import (
    CDDB_TASKS,
    CORE50_TEST,
    CORE50_TRAIN,
    DOMAINNET_DOMAINS,
    OFFICE_HOME_DOMAINS,
    load_cddb,
    load_core50,
    load_domainnet,
    load_office_home,
    office_home_split,
)
from clbench.errors import ClbenchError

_made = itertools.count(1)


def distinct_image(suffix: str = ".png") -> bytes:
    """An 8x8 image in the format ``suffix`` names, with bytes no other call gives (a colour and, for a JPEG, a
    comment of its own): no two fixture images are equal, so that a clean fixture passes the duplicate checks."""
    from PIL import Image

    i = next(_made)
    buf = io.BytesIO()
    im = Image.new("RGB", (8, 8), (i % 256, (i >> 8) % 256, (i >> 16) % 256))
    if suffix.lower() in (".jpg", ".jpeg"):
        im.save(buf, format="JPEG", comment=f"fixture image {i}".encode())
    else:
        im.save(buf, format="PNG")
    return buf.getvalue()


def put(path: Path, data: bytes | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(distinct_image(path.suffix) if data is None else data)


def domainnet_tree(root: Path, n_classes: int = 345) -> Path:
    """Every domain: one train and one test image per class, and the release's split lists."""
    for domain in DOMAINNET_DOMAINS:
        for split in ("train", "test"):
            lines = []
            for c in range(n_classes):
                rel = f"{domain}/class_{c:03d}/{domain}_{c:03d}_{split}.jpg"
                put(root / rel)
                lines.append(f"{rel} {c}")
            (root / f"{domain}_{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def core50_tree(root: Path) -> Path:
    for s in range(1, 12):
        for o in range(1, 51):
            put(root / "core50_128x128" / f"s{s}" / f"o{o}" / f"C_{s:02d}_{o:02d}_000.png")
    return root


def cddb_tree(root: Path, multiclass: str = "biggan") -> Path:
    """Every task flat (``0_real``/``1_fake``), except ``multiclass``, which has two object folders."""
    for task in CDDB_TASKS:
        for split in ("train", "val"):
            for obj in ("cat", "dog") if task == multiclass else ("",):
                for k, cls in enumerate(("0_real", "1_fake")):
                    base = root / task / split / obj / cls if obj else root / task / split / cls
                    put(base / f"{k}.png")
    return root


def office_home_tree(root: Path, n_images: int = 5) -> Path:
    for domain in OFFICE_HOME_DOMAINS:
        for c in range(65):
            for k in range(n_images):
                put(root / domain / f"Class{c:02d}" / f"{k:05d}.jpg")
    return root


@pytest.fixture(scope="module")
def domainnet_root(tmp_path_factory) -> Path:
    """The full-size DomainNet fixture (6 x 345 x 2 files), made once for the tests that only read it."""
    return domainnet_tree(tmp_path_factory.mktemp("domainnet"))


# ----------------------------------------------------------------------------------------------- specs
def test_specs_name_domains_sources_and_licences():
    expected = {
        "domainnet": (345, DOMAINNET_DOMAINS),
        "core50": (50, CORE50_TRAIN),
        "cddb": (2, CDDB_TASKS),
        "office-home": (65, OFFICE_HOME_DOMAINS),
    }
    for name, (n, domains) in expected.items():
        spec = BENCHMARKS.get(name)
        assert spec.n_classes == n and spec.domains == domains, name
        assert spec.needs_data_root and spec.data_env == "CLBENCH_" + name.replace("-", "_").upper(), name
        assert spec.source_info and spec.licence, name
    assert DOMAINNET_DOMAINS == ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
    assert CORE50_TEST == ("s3", "s7", "s10") and not set(CORE50_TEST) & set(CORE50_TRAIN)
    assert len(CORE50_TRAIN) + len(CORE50_TEST) == 11
    assert CDDB_TASKS == ("gaugan", "biggan", "wild", "whichfaceisreal", "san")  # S-Prompts' cddb_slip.json


def test_registering_them_stays_torch_and_pil_free():
    code = (
        "import sys, clbench.benchmarks as b; assert 'office-home' in b.BENCHMARKS;"
        "print(sorted(m for m in ('torch', 'PIL', 'avalanche', 'timm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_data_root_the_error_names_flag_and_variable(monkeypatch):
    monkeypatch.delenv("CLBENCH_CDDB", raising=False)
    with pytest.raises(ClbenchError, match="pass --data-root DIR or set CLBENCH_CDDB") as e:
        build_benchmark(BENCHMARKS.get("cddb"), scenario="domain")
    assert "Coral79/CDDB" in (e.value.hint or "")


# ----------------------------------------------------------------------------------------------- DomainNet
def test_domainnet_reads_the_split_lists_with_classes_and_domains(domainnet_root):
    root = domainnet_root
    b = build_benchmark(BENCHMARKS.get("domainnet"), data_root=root, scenario="domain")
    assert b.n_classes == 345 and b.class_names[7] == "class_007"
    assert len(b.train) == len(b.test) == 6 * 345
    for source in (b.train, b.test):
        assert np.bincount(source.domains).tolist() == [345] * 6
        i = int(np.flatnonzero((source.domains == 3) & (source.labels == 12))[0])
        assert source.paths[i].startswith("quickdraw/class_012/")
    assert b.seen_test(0).shape == (345,) and b.seen_test(5).shape == (6 * 345,)
    pooled = build_benchmark(BENCHMARKS.get("domainnet"), data_root=root)  # class scenario: every domain at once
    assert pooled.task_sizes == [345] and len(pooled.train) == 6 * 345


def test_domainnet_names_a_missing_list_and_a_missing_image(tmp_path):
    root = domainnet_tree(tmp_path, n_classes=3)
    (root / "sketch_test.txt").unlink()
    with pytest.raises(ClbenchError, match="sketch_test.txt is missing") as e:
        load_domainnet(root)
    assert "ai.bu.edu/M3SDA" in (e.value.hint or "")
    domainnet_tree(root, n_classes=3)
    (root / "painting/class_001/painting_001_train.jpg").unlink()
    with pytest.raises(ClbenchError, match=r"1 image\(s\) listed in painting_train.txt .*painting_001_train.jpg"):
        load_domainnet(root)


def test_domainnet_refuses_a_label_that_disagrees_with_its_folder(tmp_path):
    root = domainnet_tree(tmp_path, n_classes=3)
    lines = (root / "real_train.txt").read_text().splitlines()
    lines[1] = lines[1].rsplit(" ", 1)[0] + " 2"
    (root / "real_train.txt").write_text("\n".join(lines))
    with pytest.raises(ClbenchError, match="real_train.txt line 2: label 2 is class 'class_001' here"):
        load_domainnet(root)


def test_domainnet_points_at_the_folder_below(tmp_path):
    domainnet_tree(tmp_path / "domainnet", n_classes=2)
    with pytest.raises(ClbenchError) as e:
        load_domainnet(tmp_path)
    assert f"did you mean --data-root {tmp_path / 'domainnet'}" in (e.value.hint or "")


# ----------------------------------------------------------------------------------------------- CORe50
def test_core50_ni_trains_on_eight_sessions_and_tests_on_s3_s7_s10(tmp_path):
    root = core50_tree(tmp_path)
    train, test, names = load_core50(root)  # DIR or DIR/core50_128x128
    assert names[0] == "o1" and len(names) == 50
    assert np.bincount(train.domains).tolist() == [50] * 8
    sessions = {p.split("/")[0] for p in test.paths}
    assert sessions == {"s3", "s7", "s10"} and not (test.domains != 0).any()  # one held-out test set
    assert {p.split("/")[0] for p in train.paths} == set(CORE50_TRAIN)
    i = int(np.flatnonzero(train.domains == 2)[0])  # the third training session is s4
    assert train.paths[i].startswith("s4/") and train.labels[i] == int(train.paths[i].split("/")[1][1:]) - 1
    again = load_core50(root / "core50_128x128")[0]
    assert again.paths == train.paths
    b = build_benchmark(BENCHMARKS.get("core50"), data_root=root)  # class scenario: sessions pooled
    assert b.n_classes == 50 and len(b.train) == 400 and len(b.test) == 150


def test_core50_names_the_missing_session_and_object(tmp_path):
    root = core50_tree(tmp_path)
    (root / "core50_128x128/s9/o17/C_09_17_000.png").unlink()
    with pytest.raises(ClbenchError, match="s9/o17 is missing or holds no images"):
        load_core50(root)
    with pytest.raises(ClbenchError, match="holds no CORe50 session folders") as e:
        load_core50(tmp_path / "core50_128x128" / "s1")
    assert "core50_128x128.zip" in (e.value.hint or "")


# ----------------------------------------------------------------------------------------------- CDDB
def test_cddb_reads_real_and_fake_per_task_flat_and_by_object(tmp_path):
    root = cddb_tree(tmp_path)
    b = build_benchmark(BENCHMARKS.get("cddb"), data_root=root, scenario="domain")
    assert b.class_names == ["real", "fake"] and b.n_tasks == 5
    # biggan (domain 1) has two object folders: twice the images
    assert np.bincount(b.train.domains).tolist() == [2, 4, 2, 2, 2]
    assert all(p.split("/")[1] == "val" for p in b.test.paths)
    for source in (b.train, b.test):
        for path, label in zip(source.paths, source.labels.tolist(), strict=True):
            assert path.split("/")[-2] == ("0_real", "1_fake")[label]
    assert "biggan/train/dog/1_fake/1.png" in b.train.paths


def test_cddb_names_the_missing_folder_and_the_wrong_root(tmp_path):
    root = cddb_tree(tmp_path / "CDDB")
    with pytest.raises(ClbenchError, match="holds CDDB/, not the task folders") as e:
        load_cddb(tmp_path)
    assert e.value.hint == f"pass --data-root {root}"
    for f in (root / "san/val/1_fake").iterdir():
        f.unlink()
    with pytest.raises(ClbenchError, match="san/val/1_fake is missing or holds no images"):
        load_cddb(root)


# ----------------------------------------------------------------------------------------------- Office-Home
def test_office_home_split_is_seeded_disjoint_and_per_folder():
    train, test = office_home_split(10)
    assert len(test) == 2 and len(train) == 8 and not set(train.tolist()) & set(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(10))
    assert [a.tolist() for a in office_home_split(10)] == [train.tolist(), test.tolist()]
    assert any(office_home_split(n, seed=0)[1].tolist() != office_home_split(n)[1].tolist() for n in (10, 20, 30))
    assert len(office_home_split(2)[1]) == 1 and len(office_home_split(99)[1]) == 20


def test_office_home_loads_four_domains_of_65_classes(tmp_path):
    root = office_home_tree(tmp_path)
    b = build_benchmark(BENCHMARKS.get("office-home"), data_root=root, scenario="domain")
    assert b.n_classes == 65 and b.n_tasks == 4
    assert np.bincount(b.train.domains).tolist() == [4 * 65] * 4 and np.bincount(b.test.domains).tolist() == [65] * 4
    assert not set(b.train.paths) & set(b.test.paths)
    assert any(p.startswith("Real World/Class00/") for p in b.test.paths)


def test_office_home_names_a_missing_domain_and_a_mismatched_class(tmp_path):
    root = office_home_tree(tmp_path / "OfficeHomeDataset_10072016", n_images=2)
    with pytest.raises(ClbenchError, match="has no Art/ folder") as e:
        load_office_home(tmp_path)
    assert e.value.hint == f"did you mean --data-root {root}?"
    (root / "Product" / "Class64").rename(root / "Product" / "Extra")
    with pytest.raises(ClbenchError, match="'Product' has other class folders than 'Art', e.g. 'Class64'"):
        load_office_home(root)


# ----------------------------------------------------------------------------------------------- data check
def test_data_check_passes_each_fixture_and_lists_a_broken_one(tmp_path, domainnet_root):
    trees = {
        "domainnet": domainnet_root,
        "core50": core50_tree(tmp_path / "core"),
        "cddb": cddb_tree(tmp_path / "cddb"),
        "office-home": office_home_tree(tmp_path / "oh", n_images=2),
    }
    for name, root in trees.items():
        report = check_data(name, root)
        assert report.problems == [], (name, report.problems)
        assert report.classes_found == BENCHMARKS.get(name).n_classes, name
    (trees["core50"] / "core50_128x128/s7").rename(trees["core50"] / "core50_128x128/s7-moved")
    report = check_data("core50", trees["core50"])
    assert len(report.problems) == 1 and "s7 is missing" in report.problems[0]
