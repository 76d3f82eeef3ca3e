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
from datatrees import make_tree, png_bytes

from clbench.cli import main
from clbench.owned import TMP_PREFIX
from clbench.precision import PROBE_FILE

MICRO = ["--backbone", "vit_micro", "--weights", "random"]
RAY_TIMEOUT = 3.0


# ----------------------------------------------------------------------------------------------- fixtures
def folder_argv(root: Path, *extra: str) -> list[str]:
    return [
        "run",
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
    (t / "run").mkdir()
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
    return argv, f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there"


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
    t0 = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals (a flag without its value, KEY=VALUE without a key)
        code = e.code
    elapsed = time.monotonic() - t0
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
    if name == "ray-closed-port":
        assert elapsed < RAY_TIMEOUT + 5, elapsed


# ----------------------------------------------------------------------------------------------- not exit 2
def test_a_full_cache_disk_degrades_to_no_caching(earlier, tmp_path, monkeypatch, capsys):
    """ENOSPC while writing a feature-cache entry: the run finishes with the features it computed, says so once,
    records the unsaved entry, and the cache holds no partial file."""
    from clbench import features

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
    from clbench.datacheck import check_before_run, check_data
    from clbench.errors import ClbenchError

    for make in (_symlink_loop, _symlink_leaving, _dangling, _leak, _empty_file, _wrong_extension, _multi_frame):
        root = make_tree(tmp_path / make.__name__)
        make(root)
        assert not check_data("folder", root).ok, make.__name__
        with pytest.raises(ClbenchError):
            check_before_run("folder", str(root), ignore=False)
    clean = make_tree(tmp_path / "clean")
    assert check_data("folder", clean).ok and check_before_run("folder", str(clean), ignore=False) == []


def test_hub_without_network_fails_at_once(tmp_path, monkeypatch):
    """No hub reachable (an endpoint nothing listens on, offline mode off): one message within seconds, not a
    minute of retries."""
    from huggingface_hub import constants

    from clbench.backbones import load_backbone
    from clbench.errors import ClbenchError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    t0 = time.monotonic()
    with pytest.raises(ClbenchError) as e:
        load_backbone("vit_base_patch16_224", "hub")
    assert time.monotonic() - t0 < 10
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
    max_s: float | None = None  # seconds: refused quickly, not after minutes of work


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
    v = victim(t)
    (t / "sweep").mkdir()
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
    folder = t / "run"
    folder.mkdir()
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
    (out / "report.json").write_text(json.dumps({"figures": [{"files": {str(i): p for i, p in enumerate(listed)}}]}))
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
    "reference-tolerance-1e308": (check_ref(_entry("tolerance", "matrix", value=1e308)), "field 'tolerance' is"),
    "reference-tolerance-negative": (check_ref(_entry("tolerance", "last_acc", value=-1)), "field 'tolerance'"),
    "reference-require-ci-profiles-string": (
        check_ref(_set("require_ci_profiles", value="no")),
        "require_ci_profiles is 'no', expected true or false",
    ),
    "reference-accuracy-1e308": (check_ref(_entry("last_acc", value=1e308)), "field 'last_acc' is 1e+308"),
    "reference-accuracy-string": (check_ref(_entry("avg_acc", value="31.2")), "field 'avg_acc' is '31.2'"),
    "reference-huge-int": (check_ref(_entry("params", "added_total", value=10**30)), "an integer of 31 digits"),
    "reference-5000-digit-int": (
        check_ref(raw='{"format": "clbench-reference/2", "x": ' + "9" * 5000 + "}"),
        "not a readable JSON reference",
    ),
    "reference-ragged-matrix": (check_ref(_entry("accuracy_matrix", value=[[50.0, 1.0], [40.0]])), "lower-triangular"),
    "reference-time-slack-1e308": (check_ref(_set("time", "slack", value=1e308)), "time.slack is 1e+308"),
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
    t0 = time.monotonic()
    try:
        code = main(case.argv)
    except SystemExit as e:
        code = e.code
    elapsed = time.monotonic() - t0
    cap = capsys.readouterr()
    out, err = cap.out, cap.err
    assert code == case.code, (code, err, out[-2000:])
    assert "Traceback" not in err + out, err
    assert "\x1b" not in err + out and "\x07" not in err + out, (err, out)  # no escape sequence reaches the terminal
    if case.code == 2:  # progress lines may come first (a refusal found mid-run); the error ends the output
        assert err.count("clbench: error: ") == 1, err
        lines = err[err.index("clbench: error: ") :].strip("\n").split("\n")
        assert needle in lines[0], err
        assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), err
    else:
        assert needle in (out if case.stream == "out" else err), (out, err)
    assert _digests(case.victims) == before, name  # files outside clbench's folders are untouched
    assert snapshot(earlier["out"], earlier["cache"]) == earlier["files"]  # earlier results and caches untouched
    if case.max_s is not None:
        assert elapsed < case.max_s, elapsed


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
    from clbench.text import latex

    assert latex("a\\b{c}_%$#&~^") == r"a\textbackslash{}b\{c\}\_\%\$\#\&\textasciitilde{}\textasciicircum{}"
    assert latex("±") == r"$\pm$"


def test_locks_refuse_links_and_special_files(tmp_path):
    from clbench.errors import ClbenchError
    from clbench.owned import open_lock

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

    from clbench import precision
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
    from clbench.files import atomic_write_json
    from clbench.owned import remove_own_tmp

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
    from clbench.owned import load_json

    (tmp_path / "ok.json").write_text(json.dumps({"name": "[" * 500, "v": [[1]]}))
    assert load_json(tmp_path / "ok.json", "record")["v"] == [[1]]
    (tmp_path / "deep.json").write_text('{"a":' * 65 + "1" + "}" * 65)
    with pytest.raises(ClbenchError, match="nested more than 64 levels"):
        load_json(tmp_path / "deep.json", "record")
