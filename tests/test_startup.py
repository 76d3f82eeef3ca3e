"""A warm run starts fast because it does only what it uses (issue 41, item 3): the run path imports Avalanche's
scenario classes without its classic catalogue and torchvision's transforms without ``torch._dynamo``
(:mod:`clbench.imports`); a run whose features are cached and whose strategy never enters the backbone never builds
it (:class:`clbench.features.backbones.LazyBackbone`), while a strategy that needs it gets it transparently, checked
against
the cached facts; a cache entry is spot-checked once, not on every use, and a rewritten one still is; the weights'
digest is kept by file identity. Behaviour only, never timings (``clbench perf main-job`` measures those)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datatrees import make_tree

from clbench.cli import main

MICRO = ["--backbone", "vit_micro", "--init-cls", "2", "--increment", "2"]


@pytest.fixture
def micro_weights(tmp_path: Path) -> Path:
    """A file of vit_micro weights: a file-backed source, whose facts can be cached (random weights cannot)."""
    from safetensors.torch import save_file

    from clbench.features.backbones import load_backbone

    drawn = load_backbone("vit_micro", "random", seed=3)
    path = tmp_path / "micro.safetensors"
    save_file({k: v.contiguous() for k, v in drawn.model.state_dict().items()}, str(path))
    return path


def _argv(data: Path, strategy: str = "simplecil") -> list[str]:
    return ["run", "--strategy", strategy, "--bench", "folder", "--data-root", str(data), *MICRO]


def _run(data: Path, weights: Path, out: Path, strategy: str = "simplecil") -> dict:
    argv = [*_argv(data, strategy), "--weights", str(weights), "--out", str(out)]
    assert main(argv) == 0
    return json.loads((out / "result.json").read_text())


def test_a_run_whose_features_are_cached_never_builds_the_backbone(tmp_path, micro_weights, monkeypatch):
    """SimpleCIL with every feature cached reads the backbone's facts and never calls timm; its record is the cold
    run's (accuracy, digest, parameter count, device)."""
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    data = make_tree(tmp_path / "data")
    cold = _run(data, micro_weights, tmp_path / "cold")
    import clbench.weights.resolve as resolve

    def refuse(*a, **k):
        raise AssertionError("the backbone was built")

    monkeypatch.setattr(resolve, "load_model", refuse)
    warm = _run(data, micro_weights, tmp_path / "warm")
    assert warm["feature_cache"] == ["hit", "hit"]
    for field in ("accuracy_matrix", "weights_digest", "weights_source", "img_size", "device", "params"):
        assert warm[field] == cold[field], field


def test_a_strategy_that_needs_the_backbone_gets_it_built_and_checked(tmp_path, micro_weights, monkeypatch):
    """The lazy backbone builds on its first real use (here a forward pass) with the weights the facts describe;
    facts that name another digest are an error, never a run on features of other weights."""
    from clbench.errors import ClbenchError
    from clbench.features.backbones import FACTS_FILE, LazyBackbone, load_backbone

    root = tmp_path / "cache"
    eager = load_backbone("vit_micro", str(micro_weights), lazy=True, cache_root=root)  # writes the facts
    assert not isinstance(eager, LazyBackbone)
    lazy = load_backbone("vit_micro", str(micro_weights), lazy=True, cache_root=root)
    assert isinstance(lazy, LazyBackbone) and not lazy.built
    assert (lazy.digest, lazy.num_features, lazy.n_params()) == (eager.digest, eager.num_features, eager.n_params())
    x = torch.rand(2, 3, eager.img_size, eager.img_size)
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    _ = lazy.model  # the first use builds it
    assert lazy.built and torch.equal(torch.rand(4), expected)  # the build drew nothing from the run's RNG
    assert torch.equal(lazy(x), eager(x))
    # first used inside inference mode (the feature extraction), it still builds ordinary tensors: a method that
    # then trains through the ViT can save them for backward
    inside = load_backbone("vit_micro", str(micro_weights), lazy=True, cache_root=root)
    with torch.inference_mode():
        inside(x)
    assert inside.built and not any(t.is_inference() for t in [*inside.parameters(), *inside.buffers()])
    facts = root / "machine" / FACTS_FILE
    known = json.loads(facts.read_text())
    for entry in known.values():
        entry["digest"] = "0" * 64
    facts.write_text(json.dumps(known))
    os.chmod(facts, 0o600)
    forged = load_backbone("vit_micro", str(micro_weights), lazy=True, cache_root=root)
    assert isinstance(forged, LazyBackbone)
    with pytest.raises(ClbenchError, match="cached facts"):
        forged(x)
    os.chmod(facts, 0o664)  # writable by the group: not trusted, so the backbone is built at once
    assert not isinstance(load_backbone("vit_micro", str(micro_weights), lazy=True, cache_root=root), LazyBackbone)


def test_a_cache_entry_is_spot_checked_once_and_a_rewritten_one_again(tmp_path):
    """An entry that passed (or was computed here) is not recomputed with the backbone on its next use; one
    rewritten with other features and a matching digest is, and is caught; a memory others could write is not
    trusted."""
    from clbench.features.cache import CHECKED_FILE, FeatureCache

    cache = FeatureCache(tmp_path / "features")
    feats = torch.randn(20, 4)
    calls: list[list[int]] = []

    def spot(rows: list[int]) -> torch.Tensor:
        calls.append(rows)
        return feats[rows]

    cache.save("k", feats)  # computed here: remembered as checked
    assert torch.equal(cache.load("k", spot), feats) and calls == []
    memo = tmp_path / "features" / CHECKED_FILE.format(uid=os.getuid())
    memo.unlink()
    assert torch.equal(cache.load("k", spot), feats) and len(calls) == 1  # checked once more, then remembered
    assert torch.equal(cache.load("k", spot), feats) and len(calls) == 1
    from safetensors.torch import save

    from clbench.features.cache import _digest

    other = feats * 1.5
    cache.path("k").write_bytes(save({"features": other}, metadata={"key": "k", "sha256": _digest(other)}))
    assert cache.load("k", spot) is None and len(calls) == 2  # other bytes: checked, caught, deleted
    cache.save("k", feats)
    os.chmod(memo, 0o666)
    assert torch.equal(cache.load("k", spot), feats) and len(calls) == 3  # a memory others can write: ignored


def test_the_weights_digest_is_kept_by_file_identity(tmp_path, monkeypatch):
    """The SHA-256 of a weights file is read from its memo while the file's path, size and mtime are unchanged,
    and computed again once any of them changes."""
    import clbench.weights.sources as sources

    path = tmp_path / "w.safetensors"
    path.write_bytes(b"x" * 1000)
    hashed: list[Path] = []
    real = sources.sha256_file
    monkeypatch.setattr(sources, "sha256_file", lambda p: (hashed.append(p), real(p))[1])
    first = sources.verified_digest(path)
    assert sources.verified_digest(path) == first and len(hashed) == 1
    path.write_bytes(b"y" * 1000)
    os.utime(path, ns=(1, 1))  # another content and time, same size
    assert sources.verified_digest(path) != first and len(hashed) == 2


_HEAVY = ("timm", "torch._dynamo", "avalanche.benchmarks.classic", "avalanche.training", "torchvision.ops")
_REPORT = f"import sys; print('IMPORTED', sorted(m for m in sys.modules if m.startswith({_HEAVY!r})))"


def _python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_run_path_imports_no_avalanche_catalogue_and_no_dynamo():
    """In a fresh process, ``clbench.cli`` and the run path's modules (harness, Avalanche streams, transforms,
    strategy API) import neither ``avalanche.benchmarks.classic`` nor ``torch._dynamo`` (nor timm, Avalanche's
    training, torchvision's ops). The warm run itself, and the whole of Avalanche and torchvision still there on
    first use: :func:`test_a_warm_run_in_a_fresh_process_imports_none_of_them` (full tier)."""
    imports = (
        "import clbench.cli, clbench.run.harness, clbench.benchmarks.streams, clbench.features.transforms, "
        "clbench.methods.contract"
    )
    out = _python(f"{imports}; {_REPORT}", dict(os.environ))
    assert "IMPORTED []" in out, out


def test_avalanches_training_api_imports_after_the_run_path():
    """A user's ``from avalanche.training.plugins import ...`` after clbench's run path (Avalanche's scenarios
    imported, its package ``__init__`` deferred) gets the whole package, as without clbench: Avalanche's training
    package imported before its benchmarks fails on a circular import, so the deferred ``__init__`` runs first."""
    code = (
        "import clbench.run.harness, clbench.benchmarks.streams, sys; "
        "from avalanche.training.plugins import EvaluationPlugin; "
        "from avalanche.training.templates import SupervisedTemplate; "
        "from avalanche.training.supervised.deep_slda import StreamingLDA; "
        "import avalanche.benchmarks; print('WHOLE', avalanche.__version__, avalanche.benchmarks.SplitMNIST.__name__)"
    )
    out = _python(code, dict(os.environ))
    assert "WHOLE 0.6" in out and "SplitMNIST" in out, out


@pytest.mark.full
def test_a_warm_run_in_a_fresh_process_imports_none_of_them(tmp_path, micro_weights, monkeypatch):
    """``import clbench.cli`` plus a warm run (features cached, SimpleCIL) in a fresh process imports none of
    :data:`_HEAVY`: the full-tier repeat of :func:`test_the_run_path_imports_no_avalanche_catalogue_and_no_dynamo`
    through a whole run (seconds of torch import per process); after it, ``import avalanche`` and ``torchvision``
    are the whole packages (their deferred ``__init__`` runs on first use: :mod:`clbench.imports`)."""
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    argv = [*_argv(make_tree(tmp_path / "data")), "--weights", str(micro_weights)]
    assert main([*argv, "--out", str(tmp_path / "cold")]) == 0  # here: computes the features, builds the backbone
    warm = f"from clbench.cli import main; assert main({argv!r} + ['--out', {str(tmp_path / 'warm')!r}]) == 0"
    whole = (
        "import avalanche, torchvision; from avalanche.benchmarks import SplitMNIST; from avalanche.training import "
        "Naive; print('WHOLE', avalanche.__version__, torchvision.ops.nms.__name__)"
    )
    out = _python(f"{warm}; {_REPORT}; {whole}", dict(os.environ))
    assert "IMPORTED []" in out and "WHOLE 0.6" in out, out


_ENTRY = """
import atexit, sys, threading
import clbench.cli as cli
returned, real_main = threading.Event(), cli.main
def main():
    code = real_main()
    returned.set()
    return code
cli.main = main
def late():  # a non-daemon thread that works on after main returns: joined, not killed
    returned.wait()
    print("thread finished", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("handler ran"))  # unflushed: the entry flushes it
sys.argv = ["clbench", *sys.argv[1:]]
cli.entry()
"""


@pytest.mark.parametrize(("argv", "code"), [(["list"], 0), (["run", "--strategy", "no-such-method"], 2)])
def test_the_console_entry_exits_with_mains_code_after_threads_handlers_and_output(argv, code):
    """``clbench`` ends as the interpreter's ordinary exit does what an exit must do: other threads are joined,
    ``atexit`` handlers run, the output is flushed, and the exit code is main's."""
    done = subprocess.run([sys.executable, "-c", _ENTRY, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stdout.rstrip().endswith("thread finished\nhandler ran")
    assert ("simplecil" in done.stdout) == (code == 0)
    assert code == 0 or "clbench: error:" in done.stderr


def test_a_command_builds_its_own_flags_only_and_help_still_lists_every_command():
    from clbench.cli import build_parser

    run_only = build_parser(only="run")
    assert {a.dest for a in run_only.commands["run"]._actions} >= {"strategy", "seed", "out"}
    assert [a.dest for a in run_only.commands["check"]._actions] == ["help"]  # named, with its help, no flags
    full = build_parser()
    assert {"reference", "write_reference", "calibrate"} <= {a.dest for a in full.commands["check"]._actions}
    assert set(run_only.commands) == set(full.commands)


def _npz(path: Path, leak: bool = False) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    train_x = rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8)
    test_x = rng.integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    if leak:
        test_x[0] = train_x[2]
    y = np.array([0, 0, 1, 1, 2, 2])
    np.savez_compressed(path, train_x=train_x, train_y=y, test_x=test_x, test_y=np.array([0, 1, 2]))
    return path


def test_npz_images_stay_unread_once_their_fingerprint_is_known_and_a_new_file_is_hashed_again(tmp_path):
    """A warm run of the embedded benchmark never decompresses its images: the content fingerprint is recorded under
    the file's identity; the same fingerprint as hashing the arrays, and a rewritten file is hashed again."""
    import numpy as np

    from clbench.benchmarks.base import ArraySource, NpzArraySource

    path = _npz(tmp_path / "data.npz")
    with np.load(path) as z:
        eager = ArraySource(z["train_x"], z["train_y"], "x").fingerprint()
        y = z["train_y"]
    first = NpzArraySource(path, "train_x", y, "x")
    assert first.fingerprint() == eager and first._images is not None  # hashed: read
    second = NpzArraySource(path, "train_x", y, "x")
    assert second.fingerprint() == eager and second._images is None  # recorded: never read
    assert second.images.shape == (6, 4, 4, 3)  # a pixel asked for: read then
    _npz(path, leak=True)  # another version of the file (new mtime)
    os.utime(path, ns=(1, 1))
    third = NpzArraySource(path, "train_x", y, "x")
    assert third._fp is None and third.fingerprint() == eager  # train_x unchanged: same content, hashed again


def test_the_data_check_of_array_images_is_recorded_under_their_content_and_still_refuses_a_leak(tmp_path):
    import dataclasses

    import numpy as np

    from clbench.benchmarks import BENCHMARKS
    from clbench.benchmarks.base import Benchmark, NpzArraySource
    from clbench.benchmarks.check import check_loaded
    from clbench.benchmarks.emoji import load
    from clbench.errors import ClbenchError

    spec = dataclasses.replace(BENCHMARKS.get("emoji"), n_classes=None)

    def bench(path: Path) -> Benchmark:
        with np.load(path) as z:
            train, test = (NpzArraySource(path, f"{s}_x", z[f"{s}_y"], s) for s in ("train", "test"))
        return Benchmark(spec, ["a", "b", "c"], [0, 1, 2], [3], train, test)

    clean = bench(_npz(tmp_path / "clean.npz"))
    assert check_loaded(clean, ignore=False) == []
    again = bench(tmp_path / "clean.npz")
    assert check_loaded(again, ignore=False) == [] and again.train._images is None  # recorded: no pixel read
    _npz(tmp_path / "leak.npz", leak=True)
    for _ in range(2):  # computed, then read back: refused both times
        leaky = bench(tmp_path / "leak.npz")
        with pytest.raises(ClbenchError, match="byte-identical to a training image"):
            check_loaded(leaky, ignore=False)
        assert leaky.train._images is None or _ == 0
    train, test, names = load(None)  # the embedded benchmark itself passes
    emoji = Benchmark(BENCHMARKS.get("emoji"), names, list(range(len(names))), [len(names)], train, test)
    assert check_loaded(emoji, False) == []
