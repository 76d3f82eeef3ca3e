"""Checkpoints and caches that carry code: clbench never runs it.

A planted ``checkpoint.pt`` (the old pickle format) whose unpickling would create a marker file is put where a shared
run folder, a sweep folder or a feature cache would hold it. Every command refuses it on one line (exit 2) or, for the
cache, recomputes the entry with a warning; the marker never appears and the files that were there are unchanged.
A checkpoint in the current format that names a class to build is refused too, and ``--trust-checkpoint`` converts a
genuine old checkpoint after saying that it executes code from the file.

Everything runs on the micro ViT with random weights and a four-class image folder made here.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import shlex
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from datatrees import make_tree
from torch import nn

from baselines.simplecil import SimpleCIL
from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.files import typedfile
from clbench.files.safestate import SavedState
from clbench.files.safety import mark_folder
from clbench.methods.contract import Strategy
from clbench.run import checkpoint
from clbench.run.checkpoint import CHECKPOINT_FILE, LEGACY_FILE

MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "2", "--increment", "2"]
REPO = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickled, it runs a shell command that creates ``marker``: what an attacker's file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def plant(path: Path, marker: Path) -> None:
    """A file shaped like an old clbench checkpoint (``torch.save`` of a dict) whose strategy state is the payload."""
    torch.save(
        {
            "format": "clbench-checkpoint",
            "version": 1,
            "config": {"strategy": "simplecil"},
            "strategy": Payload(marker),
        },
        path,
    )


def run_argv(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--strategy",
        "simplecil",
        "--bench",
        "folder",
        "--data-root",
        str(data),
        *MICRO,
        "--out",
        str(out),
        *extra,
    ]


def digests(*folders: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for f in folders for p in sorted(f.rglob("*")) if p.is_file()
    }


def cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def one_line(err: str) -> list[str]:
    """The error line and its hint, asserting there is nothing else (no traceback, no second error)."""
    lines = err.strip("\n").split("\n")
    assert "Traceback" not in err and "weights_only" not in err, err
    assert lines[0].startswith("clbench: error: "), err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), err
    return lines


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A complete run (the reference) and the same run stopped after its first task (record + checkpoint of task 1),
    with the live strategy state that checkpoint was made from (to write an old-format file from it). Their feature
    cache is this module's own (``cache``): the tests compare it byte for byte before and after a command, and the
    shared test cache is written meanwhile by the other xdist worker (its temporaries, its new entries)."""
    base = tmp_path_factory.mktemp("runs")
    cache = base / "cache"
    os.environ["CLBENCH_CACHE"] = str(cache)
    data = make_tree(base / "data")
    assert main(run_argv(data, base / "complete")) == 0
    states: list[dict] = []

    class Stop(Exception):
        pass

    learn, save_state = SimpleCIL.learn_task, Strategy.save_state

    def stop_at(self, task):
        if task.id == 1:
            raise Stop
        learn(self, task)

    def keep_state(self):
        states.append(copy.deepcopy(self.state_dict()))
        return save_state(self)

    with pytest.MonkeyPatch.context() as m, pytest.raises(Stop):
        m.setattr(SimpleCIL, "learn_task", stop_at)
        m.setattr(Strategy, "save_state", keep_state)
        main(run_argv(data, base / "stopped"))
    assert checkpoint.load(base / "stopped" / CHECKPOINT_FILE).tasks_done == 1
    assert not json.loads((base / "stopped" / "result.json").read_text())["complete"]
    return {
        "data": data,
        "complete": base / "complete",
        "stopped": base / "stopped",
        "state": states[-1],
        "cache": cache,
    }


def test_the_payload_runs_when_unpickled(tmp_path):
    """The planted file is live: ``torch.load(weights_only=False)``, what clbench used to do, runs it."""
    plant(tmp_path / LEGACY_FILE, tmp_path / "marker")
    torch.load(tmp_path / LEGACY_FILE, weights_only=False)
    assert (tmp_path / "marker").exists()


# ----------------------------------------------------------------------------------------------- run folders
def _legacy_only(run: Path, marker: Path) -> None:
    (run / CHECKPOINT_FILE).unlink()
    plant(run / LEGACY_FILE, marker)


def _legacy_beside_current(run: Path, marker: Path) -> None:
    plant(run / LEGACY_FILE, marker)  # the current checkpoint is valid; the planted one is still refused, not skipped


def _pickle_under_the_new_name(run: Path, marker: Path) -> None:
    plant(run / CHECKPOINT_FILE, marker)


def _state_naming_a_class(run: Path, marker: Path) -> None:
    """A checkpoint in the current format whose strategy state asks to build a subprocess.Popen."""
    ckpt = checkpoint.load(run / CHECKPOINT_FILE)
    tree = {
        **ckpt.strategy.tree,
        "head": {"$object": "subprocess.Popen", "id": 0, "attrs": {"args": ["touch", str(marker)]}},
    }
    checkpoint.save(run / CHECKPOINT_FILE, dataclasses.replace(ckpt, strategy=SavedState(tree, ckpt.strategy.tensors)))


def _state_naming_a_torch_module(run: Path, marker: Path) -> None:
    """The same with a torch.nn class clbench does not allow (its own __init__ never runs either)."""
    ckpt = checkpoint.load(run / CHECKPOINT_FILE)
    tree = {**ckpt.strategy.tree, "head": {"$module": "torch.nn.modules.conv.Conv2d", "id": 0}}
    checkpoint.save(run / CHECKPOINT_FILE, dataclasses.replace(ckpt, strategy=SavedState(tree, ckpt.strategy.tensors)))


PLANTS = {
    "legacy-only": (_legacy_only, "old pickle format"),
    "legacy-beside-current": (_legacy_beside_current, "old pickle format"),
    "pickle-named-safetensors": (_pickle_under_the_new_name, "cannot be read as a clbench checkpoint"),
    "state-naming-popen": (_state_naming_a_class, "a class this reader does not rebuild"),
    "state-naming-conv2d": (_state_naming_a_torch_module, "a class this reader does not rebuild"),
}


@pytest.mark.parametrize("how", ["resume", "out"])
@pytest.mark.parametrize("name", list(PLANTS))
def test_a_planted_checkpoint_in_a_run_folder_is_refused(name, how, runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(runs["cache"]))  # this module's own cache: no other worker writes it
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(runs["stopped"], run)
    make, needle = PLANTS[name]
    make(run, marker)
    before = digests(run, runs["complete"], runs["cache"])
    argv = (
        ["run", "--resume", str(run), "--data-root", str(runs["data"])]
        if how == "resume"
        else run_argv(runs["data"], run)
    )
    code, err = cli(argv, capsys)
    assert code == 2, err
    lines = one_line(err)
    assert needle in lines[0], err
    assert not marker.exists()
    assert digests(run, runs["complete"], runs["cache"]) == before  # nothing deleted, rewritten or converted
    if "legacy" in name:
        assert "--overwrite" in err and "--trust-checkpoint" in err, err


def _edit_doc(path: Path, edit) -> None:
    """The checkpoint at ``path`` with its JSON document passed through ``edit`` (tensors unchanged)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    doc = json.loads(meta["checkpoint"])
    edit(doc)
    save_file(tensors, str(path), metadata={**meta, "checkpoint": json.dumps(doc)})


EDITS = {  # a field of the wrong type: refused as the file is read, naming it
    "pred-holds-a-string": (
        lambda doc: doc["logs"]["per-sample"]["pred"][0].__setitem__(0, "0"),
        "field logs.per-sample.pred is list [['0', ",
    ),
    "train-time-negative": (
        lambda doc: doc["times"].update(train=-1.0),
        "field times.train is float -1.0, expected seconds (a finite number >= 0)",
    ),
    "data-lacks-test": (lambda doc: doc["data"].pop("test"), "field data.test is missing"),
    # the right types, an impossible count: refused once the benchmark is loaded
    "images-kept-in-part": (
        lambda doc: doc["logs"]["per-sample"].update(pred=[], conf=[]),
        "cannot be continued: its per-sample pred has 0 entries for 1 tasks done",
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_checkpoint_field_of_the_wrong_kind_is_one_line_naming_it(name, runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(runs["cache"]))  # this module's own cache: no other worker writes it
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    edit, needle = EDITS[name]
    _edit_doc(run / CHECKPOINT_FILE, edit)
    before = digests(run)
    code, err = cli(["run", "--resume", str(run), "--data-root", str(runs["data"])], capsys)
    assert code == 2, err
    error, hint = err.strip("\n").split("\n")[-2:]  # after the loading messages of a refusal made once loaded
    assert "Traceback" not in err and err.count("clbench: error: ") == 1 and error.startswith("clbench: error: "), err
    assert str(run / CHECKPOINT_FILE) in error and needle in error, err
    assert hint.startswith("  hint: ") and "--overwrite" in hint, err
    assert digests(run) == before  # refused, nothing rewritten


def test_overwrite_deletes_a_planted_checkpoint_unread(runs, tmp_path, capsys):
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(runs["stopped"], run)
    _legacy_only(run, marker)
    code, err = cli(run_argv(runs["data"], run, "--overwrite"), capsys)
    assert code == 0, err
    assert not marker.exists() and not (run / LEGACY_FILE).exists()
    assert json.loads((run / "result.json").read_text())["resumed_from_task"] == []


# ----------------------------------------------------------------------------------------------- sweep folders
def test_a_planted_checkpoint_in_a_sweep_folder_is_refused_before_anything_runs(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(runs["cache"]))  # this module's own cache: no other worker writes it
    sweep, marker = tmp_path / "sweep", tmp_path / "marker"
    run = sweep / "runs" / "simplecil-folder-s1993"
    shutil.copytree(runs["stopped"], run)
    mark_folder(sweep, "sweep")  # a sweep folder clbench made (its mark file: a folder of other files is refused)
    _legacy_only(run, marker)
    before = digests(sweep, runs["cache"])
    argv = ["sweep", "--strategies", "simplecil", "--benches", "folder", "--data-root", str(runs["data"])]
    code, err = cli([*argv, "--seeds", "1993", *MICRO, "--out", str(sweep), "--no-tsne"], capsys)
    assert code == 2, err
    assert "Traceback" not in err and f"{LEGACY_FILE}, a checkpoint in the old pickle format" in err, err
    assert not marker.exists()
    after = digests(sweep, runs["cache"])
    assert {k: after.get(k) for k in before} == before  # every file that was there is unchanged
    assert [Path(k).name for k in set(after) - set(before)] in ([], [".sweep.lock"])  # only the sweep's lock is new


# ----------------------------------------------------------------------------------------------- feature cache
def test_a_planted_feature_cache_entry_is_recomputed_never_unpickled(runs, tmp_path, monkeypatch, capsys, caplog):
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    monkeypatch.setenv("CLBENCH_CACHE", str(cache))
    code, err = cli(run_argv(runs["data"], tmp_path / "a"), capsys)
    assert code == 0, err
    first_record = (tmp_path / "a" / "result.json").read_bytes()
    entries = sorted((cache / "features").glob("*.safetensors"))
    assert len(entries) == 2
    for p in entries:
        plant(p, marker)
    code, err = cli(run_argv(runs["data"], tmp_path / "b"), capsys)
    assert code == 0, err
    assert not marker.exists()
    warned = [r.getMessage() for r in caplog.records if "is corrupt" in r.getMessage()]
    assert len(warned) == 2 and all("recomputing it" in w for w in warned), warned
    assert not any(_is_pickle(p) for p in entries)  # the planted files are replaced by recomputed entries
    first, second = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("a", "b"))
    assert (tmp_path / "a" / "result.json").read_bytes() == first_record
    assert second["feature_cache"] == ["corrupt", "miss", "corrupt", "miss"]
    assert json.dumps(second["accuracy_matrix"]) == json.dumps(first["accuracy_matrix"])
    code, err = cli(run_argv(runs["data"], tmp_path / "c"), capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "c" / "result.json").read_text())["feature_cache"] == ["hit", "hit"]  # valid again


# ----------------------------------------------------------------------------------------------- --trust-checkpoint
def _old_checkpoint(run: Path, state: dict) -> None:
    """``run``'s checkpoint rewritten as clbench wrote it before this format: ``torch.save`` of a plain dict."""
    ckpt = checkpoint.load(run / CHECKPOINT_FILE)
    old = typedfile.write(ckpt)  # its JSON fields, as plain values
    rng = ckpt.rng
    old.update(
        format=checkpoint.FORMAT,
        version=1,
        strategy=state,
        rng={"torch": rng.torch, "numpy": rng.numpy, "python": rng.python},
    )
    torch.save(old, run / LEGACY_FILE)
    (run / CHECKPOINT_FILE).unlink()


def test_trust_checkpoint_converts_an_old_checkpoint_and_the_run_ends_as_uninterrupted(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    _old_checkpoint(run, runs["state"])
    code, err = cli(["run", "--resume", str(run)], capsys)
    assert code == 2 and "old pickle format" in one_line(err)[0], err
    code, err = cli(["run", "--resume", str(run), "--data-root", str(runs["data"]), "--trust-checkpoint"], capsys)
    assert code == 0, err
    assert "executes any code the file carries" in err and f"converted to {run / CHECKPOINT_FILE}" in err, err
    assert not (run / LEGACY_FILE).exists() and not (run / CHECKPOINT_FILE).exists()  # converted, then finished
    resumed, ref = (json.loads((p / "result.json").read_text()) for p in (run, runs["complete"]))
    assert resumed["complete"] and resumed["resumed_from_task"] == [1]
    for key in ("accuracy_matrix", "acc_curve", "params", "class_order"):
        assert json.dumps(resumed[key]) == json.dumps(ref[key]), key


def test_trust_checkpoint_without_a_run_folder_is_one_line(capsys):
    code, err = cli(["run", "--strategy", "simplecil", "--trust-checkpoint"], capsys)
    assert code == 2 and "name it with --resume DIR" in one_line(err)[0], err


# ----------------------------------------------------------------------------------------------- committed files
def _is_pickle(path: Path) -> bool:
    """A pickle (protocol 2 or later), or a torch.save zip, which holds one."""
    head = path.read_bytes()[:4]
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    if head == b"PK\x03\x04":
        with zipfile.ZipFile(path) as z:
            return any(n.endswith(".pkl") for n in z.namelist())
    return False


def test_no_committed_file_needs_unpickling():
    """Every binary file shipped (fixtures, golden tensors, the embedded data) loads with pickle off; every committed
    checkpoint loads in the current format or, in the old one, is refused unread."""
    files = [
        p
        for top in ("clbench", "tests", "reports", "baselines", "tosca")
        for p in (REPO / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert len(files) > 50
    assert [p for p in files if _is_pickle(p)] == []
    npz = [p for p in files if p.suffix == ".npz"]
    assert npz  # the embedded data set and the fixtures' features
    for p in npz:
        with np.load(p, allow_pickle=False) as z:
            assert all(z[k].dtype != object for k in z.files), p
    for p in files:
        if p.name == CHECKPOINT_FILE:
            assert checkpoint.load(p).tasks_done >= 1
        elif p.name == LEGACY_FILE:
            with pytest.raises(ClbenchError, match="old pickle format"):
                checkpoint.refuse_legacy(p.parent)


# ----------------------------------------------------------------------------------------------- the state codec
def test_the_codec_gives_back_what_it_saved():
    """Every kind of value a strategy keeps comes back equal, with its type, aliasing and tensor layout."""
    from clbench.files.safestate import allowed, decode, encode
    from clbench.methods.shared import CosineHead

    head = CosineHead(4)
    head.grow(3)
    w = torch.randn(3, 5)
    g = torch.Generator().manual_seed(7)
    value = {
        "head": head,
        "same_head": head,
        "w": w,
        "w_again": w,
        "wt": w.T,  # a transposed view keeps its strides
        "p": nn.Parameter(torch.ones(2)),
        "frozen": nn.Parameter(torch.ones(2), requires_grad=False),
        "pair": (1, 2.5, "x", None, float("nan"), float("-inf")),
        "by_task": {0: [1, 2], 3: {"a": True}},
        "$odd": 1,
        "keys": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "scalar": np.float32(0.25),
        "gen": g,
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
        "empty": torch.zeros(0, 4),
    }
    saved = encode(value, allowed([CosineHead]))
    text = json.dumps(saved.tree, allow_nan=False)  # standard JSON: non-finite floats are tagged
    back = decode(SavedState(json.loads(text), dict(saved.tensors)), allowed([CosineHead]))
    assert type(back["head"]) is CosineHead and back["same_head"] is back["head"]
    assert torch.equal(back["head"].weight, head.weight) and back["head"].weight is not head.weight
    assert back["w_again"] is back["w"] and torch.equal(back["w"], w)
    assert back["wt"].stride() == w.T.stride() and torch.equal(back["wt"], w.T)
    assert type(back["p"]) is nn.Parameter and back["p"].requires_grad and not back["frozen"].requires_grad
    assert back["pair"][:4] == (1, 2.5, "x", None) and math.isnan(back["pair"][4]) and back["pair"][5] == -math.inf
    assert back["by_task"] == {0: [1, 2], 3: {"a": True}} and back["$odd"] == 1
    assert back["keys"].dtype == np.uint32 and np.array_equal(back["keys"], value["keys"])
    assert type(back["scalar"]) is np.float32 and back["scalar"] == 0.25
    assert torch.equal(back["gen"].get_state(), g.get_state())
    assert back["dtype"] is torch.bfloat16 and back["size"] == torch.Size([2, 3]) and back["empty"].shape == (0, 4)


def test_the_codec_refuses_what_it_cannot_save():
    from clbench.files.safestate import allowed, encode

    for bad, needle in [
        ({"f": print}, "self.f is a builtins.builtin_function_or_method"),
        ({"m": nn.Conv2d(1, 1, 1)}, "torch.nn.modules.conv.Conv2d, which a checkpoint cannot hold"),
        ({"s": {1, 2}}, "self.s is a builtins.set"),
        ({"a": np.array([object()])}, "numpy array of object"),
    ]:
        with pytest.raises(TypeError, match=needle):
            encode(bad, allowed(()))


W = {"$tensor": "w", "device": "cpu", "grad": False, "param": False}


@pytest.mark.parametrize(
    "tree, needle",
    [
        ({"x": {"$object": "os.system", "id": 0}}, "'os.system', a class this reader does not rebuild"),
        ({"x": {"$module": "builtins.eval", "id": 0}}, "a class this reader does not rebuild"),
        ({"x": {"$object": "torch.nn.modules.linear.Linear", "id": 0}}, "saved as an object"),
        ({"x": {"$module": "torch.nn.modules.linear.Linear", "id": 0, "attrs": {"__class__": 1}}}, "attribute name"),
        ({"x": {"$module": "torch.nn.modules.linear.Linear", "id": 0, "attrs": {"_parameters": {}}}}, "torch's own"),
        ({"x": {"$module": "torch.nn.modules.linear.Linear", "id": 0, "params": {"weight": W}}}, "not one"),
        ({"x": {"$ref": 3}}, "not saved before it"),
        ({"x": {"$context": "backbone"}}, "which this run does not have"),
        ({"x": {"$tensor": "nope"}}, "does not hold"),
        ({"x": {**W, "stride": [1, 10**12]}}, "does not lay out"),
        ({"x": {**W, "grad": True, "$tensor": "i"}}, "cannot require gradients"),
        ({"x": {"$ndarray": "w", "dtype": "O", "shape": [1]}}, "not a numeric numpy dtype"),
        ({"x": {"$ndarray": "b", "dtype": "<f8", "shape": [10**9]}}, "do not make"),
        ({"x": {"$npscalar": "<i1", "value": 10**30}}, "is not a <i1"),
        ({"x": {"$dtype": "nn"}}, "not a torch dtype"),
        ({"x": {"$float": "1e999"}}, "not a non-finite float"),
        ({"x": {"$items": [[[1], 2]]}}, "cannot be hashed"),
        ({"x": {"$tuple": [], "$items": []}}, "several tags"),
        ({"x": {"$generator": "b", "device": "cpu"}}, "generator b"),
        ({"x": {"$eval": "1"}}, "unknown tag"),
        (json.loads("[" * 500 + "]" * 500), "nested more than"),
    ],
)
def test_a_crafted_state_is_refused(tree, needle):
    from clbench.files.safestate import StateError, decode

    tensors = {"w": torch.ones(2, 3), "i": torch.ones(2, dtype=torch.long), "b": torch.zeros(3, dtype=torch.uint8)}
    with pytest.raises(StateError, match=needle):
        decode(SavedState(tree, tensors), SimpleCIL.saved_types())


def test_a_state_sets_attributes_never_methods_or_the_config(micro_session_factory):
    from clbench.files.safestate import StateError, encode

    s = micro_session_factory("simplecil", init_cls=12, increment=12)
    for name in ("learn_task", "cfg", "ctx", "name", "Config", "__class__"):
        with pytest.raises(StateError, match="not a simplecil attribute"):
            s.strategy.restore_state(encode({name: 1}, SimpleCIL.saved_types()))
