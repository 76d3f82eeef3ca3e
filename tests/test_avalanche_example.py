"""The Avalanche example (clbench/examples/avalanche_loop.py) reuses the features ``clbench run`` cached for the same
images, backbone and transform, computes a split once where the cache lacks it, and imports without warnings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MICRO = ["--strategy", "simplecil", "--backbone", "vit_micro", "--weights", "random"]


@pytest.fixture
def backbone_passes(monkeypatch, tmp_path):
    """A fresh feature cache, and the number of extract() calls (backbone passes over a set of images) made."""
    from clbench.features import cache

    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    calls: list[int] = []
    real = cache.extract

    def counted(backbone, source, *args, **kwargs):
        calls.append(len(source))
        return real(backbone, source, *args, **kwargs)

    monkeypatch.setattr(cache, "extract", counted)
    return calls


def test_after_clbench_run_the_example_passes_no_image_through_the_backbone(backbone_passes, tmp_path, capsys):
    from clbench.cli import main as clbench
    from clbench.examples.avalanche_loop import main as example
    from clbench.records.results import load_record

    assert clbench(["run", *MICRO, "--out", str(tmp_path / "run")]) == 0
    assert len(backbone_passes) == 2  # the CLI: train and test, once each
    out = example([*MICRO, "--quiet"])
    assert len(backbone_passes) == 2  # the example: none
    cli = load_record(tmp_path / "run").accuracy_matrix
    assert [len(row) for row in out["accuracy_matrix"]] == [len(row) for row in cli]
    for mine, theirs in zip(out["accuracy_matrix"], cli, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-9)  # the same features, in the same order


def test_without_the_cli_the_example_computes_each_split_once(backbone_passes):
    from clbench.examples.avalanche_loop import main as example

    example([*MICRO, "--quiet"])
    assert backbone_passes == [2320, 942]  # the embedded benchmark's train and test splits, not each experience


def test_the_readme_snippet_imports_without_a_warning():
    """The README's snippet, imports only, in a fresh interpreter with every warning shown."""
    text = (ROOT / "clbench/examples/README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    imports = "\n".join(line for line in snippet.splitlines() if line.startswith(("from ", "import ")))
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", imports], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
