"""A user's own data, offline, as the documents print it: the missing-weights hint names the offline backbone,
``clbench data check`` checks the split the run would use, a tree of domains runs with ``--scenario domain``, ``run
--dry-run`` checks without training, and every ``clbench run`` / ``data check`` command of README.md,
clbench/README.md and clbench/GUIDE.md passes on a tiny folder of images."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_checks import run_cli
from datatrees import make_tree

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "clbench/README.md", "clbench/GUIDE.md")
OFFLINE = "vit_small_patch14_dinov2"


@pytest.fixture
def tree(tmp_path) -> Path:
    return make_tree(tmp_path / "flowers")  # 4 classes, 2 train and 1 test image each


@pytest.fixture
def domain_tree(tmp_path) -> Path:
    root = tmp_path / "styles"
    make_tree(root / "photo")
    make_tree(root / "sketch", start=100)
    return root


# ----------------------------------------------------------------------------------------------- missing weights
def test_the_missing_weights_hint_names_the_offline_backbone():
    from clbench.core.catalog import BACKBONES
    from clbench.weights.resolve import _ways

    hub = _ways(BACKBONES.get("vit_base_patch16_224.augreg_in21k"))
    assert f"--backbone {OFFLINE}" in hub
    assert "--backbone" not in _ways(BACKBONES.get(OFFLINE))  # already offline: nothing to switch to


def test_a_dry_run_without_the_weights_is_refused_naming_the_offline_backbone(tree, capsys, monkeypatch, tmp_path):
    from clbench.weights import info

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(info, "_hf_cached", lambda name: None)  # whatever this machine's Hugging Face cache holds
    argv = ["run", "--strategy", "simplecil", "--bench", "folder", "--data-root", str(tree), "--init-cls", "2"]
    code, out, err = run_cli([*argv, "--increment", "2", "--dry-run"], capsys)
    assert code == 2, (out, err)
    assert "clbench: error: weights for vit_base_patch16_224.augreg_in21k" in err
    assert f"--backbone {OFFLINE}" in err


# ----------------------------------------------------------------------------------------------- data check split
def test_data_check_refuses_a_split_the_folder_cannot_hold_and_names_the_flags(tree, capsys):
    code, out, _ = run_cli(["data", "check", "folder", "--data-root", str(tree)], capsys)
    assert code == 1 and "OK" not in out
    assert "the default split --init-cls 10 --increment 10 does not fit the 4 classes found" in out
    assert "--init-cls 2 --increment 2" in out
    check = ["data", "check", "folder", "--data-root", str(tree)]
    code, out, _ = run_cli([*check, "--init-cls", "2", "--increment", "3"], capsys)
    assert code == 1 and "the split --init-cls 2 --increment 3 does not fit" in out
    code, out, _ = run_cli([*check, "--init-cls", "2", "--increment", "2"], capsys)
    assert code == 0 and "OK: folder data is ready" in out


def test_split_problem_accepts_exactly_the_splits_a_run_accepts():
    from clbench.benchmarks.base import task_sizes
    from clbench.benchmarks.folder import split_problem
    from clbench.errors import ClbenchError

    for n in range(1, 7):
        for init in range(1, 8):
            for inc in range(1, 8):
                try:
                    task_sizes(n, init, inc)
                    runs = True
                except ClbenchError:
                    runs = False
                assert (split_problem(n, init, inc, defaults=False) is None) == runs, (n, init, inc)


# ----------------------------------------------------------------------------------------------- domains
def test_a_tree_of_domains_is_one_tree_whose_images_carry_their_domain(domain_tree):
    from clbench.benchmarks.folder import load_tree

    train, test, names = load_tree(domain_tree)
    assert names == ["a", "b", "c", "d"]
    assert len(train) == 16 and len(test) == 8
    assert sorted(set(train.domains.tolist())) == [0, 1]
    for i in range(len(train)):  # each image's domain is the folder it lies in
        assert train.paths[i].split("/")[0] == ("photo", "sketch")[train.domains[i]]


def test_domains_with_other_classes_are_refused(domain_tree, capsys):
    import shutil

    shutil.rmtree(domain_tree / "sketch" / "train" / "d")
    shutil.rmtree(domain_tree / "sketch" / "test" / "d")
    code, out, _ = run_cli(["data", "check", "folder", "--data-root", str(domain_tree), "--scenario", "domain"], capsys)
    assert code == 1 and "domain 'sketch' holds other classes than domain 'photo': lacks 'd'" in out


def test_data_check_of_the_domain_scenario(domain_tree, tree, capsys):
    code, out, _ = run_cli(["data", "check", "folder", "--data-root", str(domain_tree), "--scenario", "domain"], capsys)
    assert code == 0 and "domains: photo, sketch" in out
    code, out, _ = run_cli(["data", "check", "folder", "--data-root", str(tree), "--scenario", "domain"], capsys)
    assert code == 1 and "--scenario domain needs domains" in out


@pytest.mark.parametrize("strategy", ["simplecil", "ease"])
def test_a_folder_without_domains_is_refused_alike_for_every_strategy(strategy, tree, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--strategy", strategy, "--bench", "folder", "--data-root", str(tree), "--scenario", "domain"]
    code, _, err = run_cli([*argv, "--dry-run"], capsys)
    assert code == 2 and "clbench: error: benchmark folder has a single domain" in err
    assert "DIR/<domain>/{train,test}/<class>/" in err


def test_a_tree_of_domains_runs_the_domain_scenario(domain_tree, tmp_path, capsys):
    from clbench.records.results import load_record

    out = tmp_path / "run"
    argv = ["run", "--strategy", "simplecil", "--bench", "folder", "--data-root", str(domain_tree)]
    argv += ["--scenario", "domain", "--backbone", "vit_micro", "--weights", "random", "--out", str(out)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    record = load_record(out)
    assert len(record.per_task) == 2  # one task per domain folder


# ----------------------------------------------------------------------------------------------- dry run
def test_a_dry_run_checks_everything_and_writes_nothing(tree, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--strategy", "tosca", "--bench", "folder", "--data-root", str(tree), "--backbone", OFFLINE]
    code, out, err = run_cli([*argv, "--out", "runs/x", "--dry-run"], capsys)
    assert code == 2 and "--init-cls 10 is larger than the benchmark's 4 classes" in err  # the run's own message
    code, out, err = run_cli([*argv, "--init-cls", "2", "--increment", "2", "--out", "runs/x", "--dry-run"], capsys)
    assert code == 0, err
    assert "2 tasks of 2, 2 classes" in out and "nothing was trained or written" in out
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------------------------- the documents
def doc_commands() -> list[tuple[str, str]]:
    """(document, command) for every ``clbench run`` and ``clbench data check`` command the documents print whole
    (placeholders other than DIR, or a literature data set a user downloads, excepted)."""
    from clbench.benchmarks import BENCHMARKS

    found = []
    for doc in DOCS:
        path = ROOT / doc
        if not path.exists():
            continue
        text = path.read_text()
        spans = re.findall(r"`(clbench (?:run|data check) [^`]*)`", text)  # inline, perhaps wrapped over lines
        for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):  # code blocks, also after `&&`
            spans += re.findall(r"(?:^|[\s&;])(?:[\w./-]*/)?(clbench (?:run|data check) [^\n&;|]*)", block, re.M)
        for cmd in dict.fromkeys(spans):
            cmd = " ".join(cmd.split())
            words = shlex.split(cmd)
            bench = words[words.index("--bench") + 1] if "--bench" in words else "emoji"
            if any(w in ("BENCH", "FILE.yaml", "...") or w.startswith("run/") for w in words[1:]):
                continue  # a pattern, not a command
            if "data" == words[1]:
                bench = words[3]
            if bench not in BENCHMARKS.names() or BENCHMARKS.get(bench).data_env:
                continue  # a literature data set: runs where the user has it
            found.append((doc, cmd))
    return found


def test_the_documents_print_own_data_commands():
    commands = [c for _, c in doc_commands()]
    assert any("--bench folder" in c and OFFLINE in c for c in commands), commands
    assert any("--scenario domain" in c and "--bench folder" in c for c in commands), commands
    assert any(c.startswith("clbench data check folder") for c in commands), commands


@pytest.mark.parametrize("doc,command", doc_commands())
def test_each_documented_command_passes_on_a_tiny_folder(
    doc, command, tree, domain_tree, tmp_path, capsys, monkeypatch
):  # noqa: E501
    monkeypatch.chdir(tmp_path)
    words = shlex.split(command)[1:]
    root = domain_tree if "--scenario" in words and "domain" in words else tree
    words = [str(root) if w == "DIR" else w for w in words]
    if words[0] == "run":
        words.append("--dry-run")  # every check a run makes, nothing trained
    code, out, err = run_cli(words, capsys)
    assert code == 0, f"{doc}: `{command}` failed: {err or out}"


# ----------------------------------------------------------------------------------------------- doctor, offline data
def test_doctor_says_the_embedded_data_is_embedded_and_writes_whole_names_to_a_file(capsys):
    from clbench.perf.doctor import doctor

    doctor(measure=False)
    out = capsys.readouterr().out  # captured: not a terminal
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ emoji")}
    for name in ("emoji", "emoji-domains", "emoji-vendors"):
        assert "embedded in the package" in lines[name], out
    assert "vit_base_patch16_224.augreg_in21k " in out and "…" not in out  # no cell cut at 80 columns


@pytest.mark.parametrize("bench", ["cifar100", "fashion-mnist"])
def test_a_literature_set_that_is_absent_fails_at_once_without_the_network(bench, tmp_path, monkeypatch):
    """No download is tried: the loader never reaches torchvision's downloader (it would fail here anyway)."""
    import torchvision

    from clbench.benchmarks import BENCHMARKS, build_benchmark, fashion_mnist
    from clbench.errors import ClbenchError

    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "none")
    for cls in ("CIFAR100", "FashionMNIST"):
        monkeypatch.setattr(torchvision.datasets, cls, lambda *a, **k: pytest.fail("a download was tried"))
    with pytest.raises(ClbenchError, match="is not on this machine") as e:
        build_benchmark(BENCHMARKS.get(bench))
    assert "--data-root DIR" in e.value.hint
