"""Hostile data roots for the literature's domain benchmarks, kept as regression tests: every file-listed loader
(DomainNet, CORe50, CDDB, Office-Home) gets the tree checks the folder benchmark gets (no path out of the root by
``..`` or a link, decodable images, train/test duplicates, labels within the class count, each message naming the
file and line), and CORe50's domain scenario runs on a valid root. Every tree is built under ``tmp_path``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_literature_domains import cddb_tree, core50_tree, office_home_tree, put

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.benchmarks.check import check_before_run, check_data, format_report
from clbench.benchmarks.literature_domains import CORE50_TRAIN, load_cddb, load_core50, load_domainnet
from clbench.errors import ClbenchError

ARRAYS_NOTE = "images are stored as arrays"


def _core50(tmp_path: Path) -> Path:
    return core50_tree(tmp_path / "data") / "core50_128x128"


def _problems(name: str, root: Path) -> str:
    report = check_data(name, root, workers=1)
    assert ARRAYS_NOTE not in format_report(report)
    return "\n".join(report.problems)


# ----------------------------------------------------------------------------------------------- CORe50 domains
def test_core50_domain_scenario_builds_on_a_valid_root_and_evaluates_every_test_image_after_each_task(tmp_path):
    root = _core50(tmp_path)
    b = build_benchmark(BENCHMARKS.get("core50"), data_root=root, scenario="domain")
    assert b.n_tasks == len(CORE50_TRAIN) == 8 and b.task_sizes == [50] + [0] * 7
    assert np.bincount(b.image_tasks("train")).tolist() == [50] * 8
    for t in (0, 7):  # the held-out sessions s3, s7, s10, whole, after every task (as the reference)
        assert b.seen_test(t).size == 150


def test_clbench_run_of_core50_in_the_domain_scenario(tmp_path, monkeypatch, capsys):
    from clbench.cli import main

    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = ["run", "--strategy", "simplecil", "--bench", "core50", "--scenario", "domain"]
    argv += ["--data-root", str(_core50(tmp_path)), "--backbone", "vit_micro", "--weights", "random"]
    code = main([*argv, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rec = json.loads((out / "result.json").read_text())
    assert rec["complete"] and rec["scenario"] == "domain" and len(rec["accuracy_matrix"]) == 8
    assert [row[0] for row in rec["accuracy_matrix"]] == rec["acc_curve"]  # column s1: the whole test set


# ----------------------------------------------------------------------------------------------- links, '..'
def test_a_session_linked_to_another_is_listed(tmp_path):
    root = _core50(tmp_path)
    os.rename(root / "s2", tmp_path / "s2-moved")
    os.symlink("s1", root / "s2")  # inside the root, but s2's images are s1's
    said = _problems("core50", root)
    assert "are a file listed already, through a symbolic link" in said
    assert "train/s2/o1/C_01_01_000.png = train/s1/o1/C_01_01_000.png" in said
    with pytest.raises(ClbenchError, match="fails `clbench data check`: 50 listed image"):
        check_before_run("core50", str(root), ignore=False)
    assert any("listed already" in p for p in check_before_run("core50", str(root), ignore=True))


@pytest.mark.parametrize("what", ["object folder", "session folder", "image file"])
def test_a_link_out_of_the_root_is_refused_also_when_ignoring_problems(tmp_path, what):
    root = _core50(tmp_path)
    outside = tmp_path / "outside"
    if what == "object folder":
        put(outside / "x.png")
        os.rename(root / "s3" / "o1", tmp_path / "o1-moved")
        os.symlink(outside, root / "s3" / "o1")
    elif what == "session folder":
        os.rename(root / "s10", outside)
        os.symlink(outside, root / "s10")
    else:
        put(outside / "secret.png")
        os.symlink(outside / "secret.png", root / "s1" / "o2" / "C_01_02_001.png")
    with pytest.raises(ClbenchError, match="leaves the data root") as e:
        load_core50(root)
    assert str(outside) in str(e.value)
    said = _problems("core50", root)
    assert "leaves the data root" in said and "nothing outside the root is read" in said


def test_cddb_and_office_home_refuse_a_class_folder_linked_out_of_the_root(tmp_path):
    cddb = cddb_tree(tmp_path / "cddb")
    put(tmp_path / "elsewhere" / "z.png")
    os.rename(cddb / "san/val/1_fake", tmp_path / "moved")
    os.symlink(tmp_path / "elsewhere", cddb / "san/val/1_fake")
    with pytest.raises(ClbenchError, match=r"cddb/test: .*san/val/1_fake/z.png leaves the data root"):
        load_cddb(cddb)
    oh = office_home_tree(tmp_path / "oh", n_images=2)
    os.rename(oh / "Art/Class07", tmp_path / "moved-art")
    os.symlink(tmp_path / "moved-art", oh / "Art/Class07")
    assert "Art/Class07/" in _problems("office-home", oh) and "leaves the data root" in _problems("office-home", oh)


# ----------------------------------------------------------------------------------------------- file content
def test_an_undecodable_30_mb_png_is_listed(tmp_path):
    root = _core50(tmp_path)
    (root / "s1/o1/C_01_01_000.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(30 * 2**20))
    said = _problems("core50", root)
    assert "1 unreadable image(s)" in said and "s1/o1/C_01_01_000.png" in said


def test_a_test_image_copied_from_training_is_a_leak_and_a_run_refuses_it(tmp_path, monkeypatch, capsys):
    from clbench.cli import main

    root = _core50(tmp_path)
    (root / "s7/o9/C_07_09_000.png").write_bytes((root / "s5/o9/C_05_09_000.png").read_bytes())
    said = _problems("core50", root)
    assert "1 test image(s) are byte-identical to a training image" in said
    assert "s7/o9/C_07_09_000.png = s5/o9/C_05_09_000.png" in said
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    argv = ["run", "--strategy", "simplecil", "--bench", "core50", "--data-root", str(root), "--backbone", "vit_micro"]
    code = main([*argv, "--weights", "random", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "fails `clbench data check`: 1 test image(s) are byte-identical" in err, err
    assert not (tmp_path / "cache" / "features").exists()  # refused before any image was decoded


def test_a_clean_core50_root_is_decoded_and_hashed(tmp_path):
    report = check_data("core50", _core50(tmp_path), workers=1)
    assert report.ok, report.problems
    assert report.n_decoded == report.n_hashed == 550
    assert ARRAYS_NOTE not in format_report(report)


# ----------------------------------------------------------------------------------------------- DomainNet lists
def _domainnet_list(tmp_path: Path, line: str) -> Path:
    root = tmp_path / "dn"
    put(root / "clipart/cat/a.jpg")
    (root / "clipart_train.txt").write_text(f"clipart/cat/a.jpg 0\n{line}\n")
    return root


@pytest.mark.parametrize(
    "line,said",
    [
        ("clipart/../../outside/x.jpg 0", "has an empty, '.' or '..' part"),
        ("clipart/cat/a.jpg 1000000000000", "label 1000000000000 is not a class of DomainNet (labels 0 ... 344)"),
        ("clipart/cat/a.jpg " + "9" * 5000, "is not a class of DomainNet"),  # more digits than int() converts
        ("clipart/cat/a.jpg 345", "label 345 is not a class of DomainNet"),
        ("clipart/cat/a.jpg --1", "expected '<domain>/<class>/<file> <label>' (a label in decimal digits)"),
        ("clipart/cat/a.jpg -1", "(a label in decimal digits)"),
    ],
)
def test_a_bad_domainnet_line_is_refused_with_its_file_and_line(tmp_path, line, said):
    root = _domainnet_list(tmp_path, line)
    with pytest.raises(ClbenchError) as e:
        load_domainnet(root)
    text = str(e.value)
    assert f"{root / 'clipart_train.txt'} line 2: " in text and said in text, text
    assert "Traceback" not in text and len(text.split("\n")[0]) < 400
    assert said in _problems("domainnet", root)


def test_a_domainnet_list_linked_out_of_the_root_is_not_read(tmp_path):
    root = tmp_path / "dn"
    put(root / "clipart/cat/a.jpg")
    (tmp_path / "list.txt").write_text("clipart/cat/a.jpg 0\n")
    os.symlink(tmp_path / "list.txt", root / "clipart_train.txt")
    with pytest.raises(ClbenchError, match="DomainNet split list: .*clipart_train.txt leaves the data root"):
        load_domainnet(root)


def test_a_domainnet_image_linked_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "dn"
    put(tmp_path / "secret.jpg")
    (root / "clipart/cat").mkdir(parents=True)
    os.symlink(tmp_path / "secret.jpg", root / "clipart/cat/a.jpg")
    for domain in ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"):
        for split in ("train", "test"):
            if domain != "clipart":
                put(root / f"{domain}/cat/{split}.jpg")
            rel = "clipart/cat/a.jpg" if domain == "clipart" else f"{domain}/cat/{split}.jpg"
            (root / f"{domain}_{split}.txt").write_text(f"{rel} 0\n")
    with pytest.raises(ClbenchError, match="domainnet/train: .*clipart/cat/a.jpg leaves the data root"):
        load_domainnet(root)


# ----------------------------------------------------------------------------------------------- cache memo
def test_a_data_check_memo_is_verified_before_it_is_trusted(tmp_path, monkeypatch):
    """A memo in the cache that says "no problems" for a leaking benchmark (a bare list, one copied from other data,
    one edited) is not trusted: the check is made again and refuses the leak."""
    import dataclasses

    from clbench.benchmarks.base import ArraySource, Benchmark
    from clbench.benchmarks.check import MEMO_FORMAT, check_loaded

    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    train_x = rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8)
    test_x = rng.integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    clean_test = test_x.copy()
    test_x[0] = train_x[2]  # a leak
    y, ty = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 2])
    spec = dataclasses.replace(BENCHMARKS.get("emoji"), n_classes=None)

    def bench(test_images: np.ndarray) -> Benchmark:
        train, test = ArraySource(train_x, y, "train"), ArraySource(test_images, ty, "test")
        return Benchmark(spec, ["a", "b", "c"], [0, 1, 2], [3], train, test)

    with pytest.raises(ClbenchError, match="byte-identical to a training image"):
        check_loaded(bench(test_x), ignore=False)
    (memo,) = (tmp_path / "cache" / "data").glob("check-*.json")
    doc = json.loads(memo.read_text())
    assert doc["format"] == MEMO_FORMAT and doc["problems"]
    assert doc["vouches"]["test"] == bench(test_x).test.fingerprint()
    assert check_loaded(bench(clean_test), ignore=False) == []
    (other,) = set((tmp_path / "cache" / "data").glob("check-*.json")) - {memo}
    forged = [
        "[]",  # the bare list of problems a memo used to be
        json.dumps({**doc, "problems": []}),  # edited: its digest no longer matches
        other.read_text(),  # the clean data's memo, copied under the leaking data's name
        json.dumps({**json.loads(other.read_text()), "vouches": doc["vouches"]}),  # ... and relabelled
    ]
    for text in forged:
        memo.write_text(text)
        with pytest.raises(ClbenchError, match="byte-identical to a training image"):
            check_loaded(bench(test_x), ignore=False)
    assert json.loads(memo.read_text()) == doc  # recomputed and written again
