"""predictions.npz: one writer and one reader; the file is deterministic, read without unpickling, refused with one
line when it does not match its record, and a run's file agrees with its record's accuracies."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from clbench.errors import ClbenchError
from clbench.records import predictions as P


def _tiny(protocols=("per-sample",), seed=0, n_tasks=3, per_task=10) -> P.Predictions:
    rng = np.random.default_rng(seed)
    parts, preds, confs = [], {p: [] for p in protocols}, {p: [] for p in protocols}
    for t in range(n_tasks):
        n = per_task * (t + 1)
        idx = np.arange(n)
        y = idx // per_task  # one class per task, for the test
        parts.append((idx, y, y))
        for p in protocols:
            preds[p].append(rng.integers(0, t + 1, n))
            confs[p].append(rng.uniform(0.2, 1, n))
    return P.build(list(protocols), parts, preds, confs, n_classes=n_tasks)


def test_round_trip_is_exact_compact_and_deterministic(tmp_path):
    preds = _tiny(("per-sample", "reference"))
    ref = P.write(tmp_path, preds)
    assert ref.rows == 10 + 20 + 30 and ref.bytes == (tmp_path / P.PREDICTIONS_FILE).stat().st_size
    again = P.read(tmp_path, ref)
    for name in ("after_task", "index", "label", "image_task", "pred", "conf"):
        assert np.array_equal(getattr(again, name), getattr(preds, name)), name
    assert again.pred.dtype == np.int16 and again.conf.dtype == np.float16 and again.index.dtype == np.int32
    assert again.protocols == ("per-sample", "reference")
    final = again.final("reference")
    assert len(final.index) == 30 and np.array_equal(final.pred, preds.pred[1, 30:])
    assert P.to_bytes(preds) == P.to_bytes(again)  # the same predictions give the same bytes (and digest)
    with np.load(tmp_path / P.PREDICTIONS_FILE, allow_pickle=False) as npz:  # a plain npz for any reader
        assert set(npz.files) == {"version", "protocols", "after_task", "index", "label", "image_task", "pred", "conf"}


def test_a_changed_file_is_refused_on_one_line(tmp_path):
    ref = P.write(tmp_path, _tiny())
    other = _tiny(seed=1)
    (tmp_path / P.PREDICTIONS_FILE).write_bytes(P.to_bytes(other))  # a valid file, but not the record's
    with pytest.raises(ClbenchError, match="does not match its record's") as e:
        P.read(tmp_path, ref)
    assert "\n" not in e.value.args[0]  # one line (and a hint)
    (tmp_path / P.PREDICTIONS_FILE).unlink()
    with pytest.raises(ClbenchError, match="names this predictions file but it is missing"):
        P.read(tmp_path, ref)


def test_hostile_files_are_refused_without_unpickling(tmp_path):
    def npz(**arrays) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    good = {k: v for k, v in np.load(io.BytesIO(P.to_bytes(_tiny()))).items()}
    cases = {
        "pickled": (npz(**{**good, "pred": np.array([{"x": 1}], dtype=object)}), "Object arrays cannot be loaded"),
        "not a zip": (b"not a zip at all", "BadZipFile"),
        "no conf": (npz(**{k: v for k, v in good.items() if k != "conf"}), "no conf"),
        "bad conf": (npz(**{**good, "conf": good["conf"] + 2}), "confidence outside"),
        "shape": (npz(**{**good, "label": good["label"][:-1]}), "label is not"),
        "version": (npz(**{**good, "version": np.array([9], np.int16)}), "format version [9]"),
    }
    for name, (data, needle) in cases.items():
        with pytest.raises(ClbenchError, match="not a clbench predictions file") as e:
            P.from_bytes(data, name)
        assert needle in str(e.value), (name, str(e.value))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pred.npy", b"\0" * (2 * 2**20))
    with pytest.raises(ClbenchError, match="expanded, more than"):
        P.from_bytes(bomb.getvalue(), "bomb", max_bytes=2**20)
    ref = P.write(tmp_path, _tiny())
    with pytest.raises(ClbenchError, match="more than the 100 a predictions file may have"):
        P.read(tmp_path, ref, max_bytes=100)
    with pytest.raises(ClbenchError, match="not a file of its run folder"):
        P.read(tmp_path, P.PredictionsFile("../elsewhere.npz", ref.sha256, ref.bytes, ref.rows))


def test_a_run_writes_predictions_that_agree_with_its_record(tmp_path, capsys):
    from clbench.cli import main
    from clbench.records.results import load_record

    out = tmp_path / "run"
    argv = ["run", "--strategy", "simplecil", "--backbone", "vit_micro", "--weights", "random"]
    assert main([*argv, "--init-cls", "12", "--increment", "12", "--out", str(out)]) == 0, capsys.readouterr().err
    rec = load_record(out)
    preds = P.read(out, rec.predictions)
    assert preds.n_tasks == len(rec.task_sizes) == 3
    for t, evaluation in enumerate(preds.evaluations(rec.protocol)):
        assert 100 * evaluation.correct.mean() == pytest.approx(rec.acc_curve[t], abs=1e-9)
        assert set(evaluation.label.tolist()) == set(range(12 * (t + 1)))  # every seen class, and no other
    final = preds.final(rec.protocol)
    assert np.array_equal(np.sort(final.index), np.arange(rec.n_images["test"]))  # every test image once
    assert ((final.conf > 0) & (final.conf <= 1)).all()
