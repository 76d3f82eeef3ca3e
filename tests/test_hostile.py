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
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from datatrees import make_tree, png_bytes

from clbench.cli import main

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
    return ["run", "--resume", str(t / "run")], "no checkpoint.pt to continue from"


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


def test_python_api_validates_as_the_cli(tmp_path):
    from clbench.config import RunConfig
    from clbench.errors import ClbenchError
    from clbench.harness import RunConfig as FromHarness

    assert FromHarness is RunConfig
    for bad, needle in (
        (dict(increment=0), r"^increment must be >= 1 .*\(got 0\)"),
        (dict(seed=2**64), "^seed"),
        (dict(img_size=0), r"^img_size must be .*\(got 0\)"),
        (dict(batch_size=True), "expected an integer"),
        (dict(seed="7"), "expected an integer"),
        (dict(device="tpu"), "valid devices"),
    ):
        with pytest.raises(ClbenchError, match=needle) as e:
            RunConfig(strategy="simplecil", **bad)
        # the Python API names the setting as written in Python; the CLI renders it as the flag, same wording
        name = next(iter(bad))
        assert str(e.value).startswith(name) and e.value.settings == [name], str(e.value)
        assert e.value.render(as_flags=True).startswith("--" + name.replace("_", "-"))
    cfg = RunConfig(strategy="simplecil", init_cls=None, increment=None)  # None: not given
    assert cfg.increment is None


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
