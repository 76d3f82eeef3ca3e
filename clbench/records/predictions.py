"""Per-image predictions (``predictions.npz``): what every evaluation of a run predicted, image by image.

The harness writes the file beside ``result.json`` after every task, atomically and *before* the record that names
it; the record holds its sha256 digest and size (:class:`PredictionsFile`). Intervals, paired tests and calibration
(:mod:`clbench.evaluation.stats`, :mod:`clbench.evaluation.metrics`) are computed from it.

Layout: an ``.npz`` (a zip of deflated ``.npy`` arrays with fixed timestamps, so the same predictions give the same
bytes), read with ``np.load(allow_pickle=False)``. One row per (task t, seen test image),
tasks in order, each task's images in the order the harness evaluated them (class by class); ``P`` protocols:

- ``version`` (1,) int16: :data:`VERSION`.
- ``protocols`` (P,) unicode: protocol names, the record's main protocol first.
- ``after_task`` (R,) int16: the task t (0-based) after which the row's image was evaluated.
- ``index`` (R,) int32: the image's position in the benchmark's test split (pairs images across runs).
- ``label`` (R,) int16 (int32 past 32,767 classes): its true class, in class-order ids.
- ``image_task`` (R,) int16: the task its class belongs to.
- ``pred`` (P, R) int16 / int32: the predicted class (argmax of the method's logits) per protocol.
- ``conf`` (P, R) float16: the softmax probability of the predicted class per protocol.

Size: 14 bytes per row and protocol before compression (10 for each further protocol).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clbench.errors import ClbenchError
from clbench.evaluation import metrics, stats
from clbench.files.atomic import atomic_write_bytes
from clbench.files.safety import npz_arrays, read_bytes
from clbench.files.typedfile import COUNT, TEXT, Typed, is_count, is_str, json_field

PREDICTIONS_FILE = "predictions.npz"
VERSION = 1
MAX_BYTES = 512 * 2**20  # refuse to read a larger file (compressed or expanded): far above any benchmark's size
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member timestamps: the same predictions give the same file
_INT16_MAX = np.iinfo(np.int16).max


@dataclass(frozen=True)
class PredictionsFile(Typed):
    """The record's reference to its predictions file: name (in the run folder), sha256 and size in bytes."""

    file: str = json_field(TEXT, is_str, required=True)
    sha256: str = json_field(TEXT, is_str, required=True)
    bytes: int = json_field(COUNT, is_count, required=True)
    rows: int = json_field(COUNT, is_count, required=True)  # (task, image) rows per protocol


@dataclass(frozen=True)
class Predictions:
    """Every evaluation of a run, image by image (see the module docstring for the arrays)."""

    protocols: tuple[str, ...]
    after_task: np.ndarray  # (R,)
    index: np.ndarray  # (R,)
    label: np.ndarray  # (R,)
    image_task: np.ndarray  # (R,)
    pred: np.ndarray  # (P, R)
    conf: np.ndarray  # (P, R)

    @property
    def n_tasks(self) -> int:
        return int(self.after_task.max()) + 1 if len(self.after_task) else 0

    def _p(self, protocol: str) -> int:
        if protocol not in self.protocols:
            raise KeyError(f"the predictions hold no protocol {protocol!r} (they hold {', '.join(self.protocols)})")
        return self.protocols.index(protocol)

    def after(self, t: int, protocol: str) -> Evaluation:
        """The evaluation after task ``t`` (0-based; -1: the last task)."""
        t = self.n_tasks - 1 if t < 0 else t
        rows = self.after_task == t
        p = self._p(protocol)
        return Evaluation(
            self.index[rows], self.label[rows], self.image_task[rows], self.pred[p, rows], self.conf[p, rows]
        )

    def final(self, protocol: str) -> Evaluation:
        """The evaluation after the last task: every test image of the benchmark."""
        return self.after(-1, protocol)

    def evaluations(self, protocol: str) -> list[Evaluation]:
        return [self.after(t, protocol) for t in range(self.n_tasks)]


@dataclass(frozen=True)
class Evaluation:
    """One evaluation (after one task, one protocol): per image, its test index, true class, task,
    prediction and confidence."""

    index: np.ndarray
    label: np.ndarray
    image_task: np.ndarray
    pred: np.ndarray
    conf: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        return np.asarray(self.pred == self.label)  # numpy types == as Any


def build(
    protocols: list[str],
    per_task: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    preds: dict[str, list[np.ndarray]],
    confs: dict[str, list[np.ndarray]],
    n_classes: int,
) -> Predictions:
    """Predictions from the evaluations after every task: ``per_task[t]`` = (test indices, labels, image tasks) of
    the images evaluated after task t; ``preds[p][t]`` / ``confs[p][t]`` their predictions / confidences."""
    label_dtype = np.int16 if n_classes <= _INT16_MAX else np.int32
    if any(len(preds[p]) != len(per_task) or len(confs[p]) != len(per_task) for p in protocols):
        raise ValueError("every protocol needs one prediction and confidence list per task")
    if not per_task:
        raise ValueError("predictions need at least one task's evaluation")
    sizes = [len(idx) for idx, _, _ in per_task]

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(x) for x in parts]).astype(dtype)

    return Predictions(
        protocols=tuple(protocols),
        after_task=np.repeat(np.arange(len(per_task), dtype=np.int16), sizes),
        index=cat([i for i, _, _ in per_task], np.int32),
        label=cat([y for _, y, _ in per_task], label_dtype),
        image_task=cat([k for _, _, k in per_task], np.int16),
        pred=np.stack([cat(preds[p], label_dtype) for p in protocols]),
        conf=np.stack([cat(confs[p], np.float16) for p in protocols]),
    )


def to_bytes(preds: Predictions) -> bytes:
    """The ``.npz`` bytes of ``preds`` (deterministic: the same arrays give the same bytes)."""
    arrays = {
        "version": np.array([VERSION], np.int16),
        "protocols": np.array(preds.protocols, dtype="U"),
        "after_task": preds.after_task,
        "index": preds.index,
        "label": preds.label,
        "image_task": preds.image_task,
        "pred": preds.pred,
        "conf": preds.conf,
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def write(run_dir: Path, preds: Predictions) -> PredictionsFile:
    """Write ``run_dir/predictions.npz`` atomically; return the record's reference to it."""
    import hashlib

    data = to_bytes(preds)
    atomic_write_bytes(Path(run_dir) / PREDICTIONS_FILE, data)
    return PredictionsFile(PREDICTIONS_FILE, hashlib.sha256(data).hexdigest(), len(data), int(preds.pred.shape[1]))


_FIX = "rerun the run (`clbench run ... --overwrite`) to write it again, or leave the run out"


def read(
    run_dir: Path | str, ref: PredictionsFile, max_bytes: int = MAX_BYTES, expect: Mapping[str, Any] | None = None
) -> Predictions:
    """The predictions a record names, checked against its digest and size, and (``expect``: the record's
    ``protocols``, protocol -> its metrics) against the accuracies the record states (:func:`disagreement`).
    Raises ClbenchError (one line naming the file) when the file is missing, larger than ``max_bytes``, changed
    since the record was written, not a predictions file, or giving other accuracies than its record."""
    import hashlib

    path = Path(run_dir) / ref.file
    if Path(ref.file).name != ref.file:
        raise ClbenchError(f"{path}: the record names predictions file {ref.file!r}, not a file of its run folder")
    try:
        size = path.stat().st_size
    except OSError:
        raise ClbenchError(f"{path}: the record names this predictions file but it is missing", _FIX) from None
    if size > max_bytes:
        raise ClbenchError(f"{path}: {size} bytes, more than the {max_bytes} a predictions file may have", _FIX)

    data = read_bytes(path, max_bytes, "predictions")  # a regular file, bounded: never a FIFO or /dev/zero
    size = len(data)
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref.sha256 or size != ref.bytes:
        raise ClbenchError(
            f"{path}: sha256 {digest[:12]}… ({size} bytes) does not match its record's {ref.sha256[:12]}… "
            f"({ref.bytes} bytes); the file was changed after the run",
            _FIX,
        )
    preds = from_bytes(data, path, max_bytes)
    if expect is not None:
        problem = disagreement(preds, expect)
        if problem is not None:
            raise ClbenchError(
                f"{path}: the record and its predictions disagree: {problem}; one of them was changed after the run",
                _FIX,
            )
    return preds


# Points: the record's accuracies are computed from the very predictions the file holds
# (clbench.evaluation.metrics.accuracy on the same arrays), so they agree to the last bit; the slack only
# absorbs a JSON round trip.
ACC_SLACK = 1e-6


def recomputed_curve(preds: Predictions, protocol: str) -> list[float]:
    """Accuracy after every task (percent of the images seen so far), recomputed from the predictions."""
    out = []
    for e in preds.evaluations(protocol):
        out.append(float(e.correct.mean() * 100.0) if len(e.index) else float("nan"))
    return out


def disagreement(preds: Predictions, summaries: Mapping[str, Any]) -> str | None:
    """The first accuracy a record states (``summaries``: protocol -> its metrics, with ``acc_curve``,
    ``last_acc`` and ``avg_acc``) that ``preds`` do not give, said in a few words; None when every one agrees.
    A protocol the predictions do not hold is not compared (they say nothing about it; reports show no interval
    for it, and the gate matches entries by protocol name)."""
    for protocol, s in summaries.items():
        if protocol not in preds.protocols:
            continue
        curve = recomputed_curve(preds, protocol)
        stated = [float(v) for v in s.acc_curve]
        if len(curve) != len(stated):
            return f"{protocol}: the predictions hold {len(curve)} evaluations, the record {len(stated)} tasks"
        checks = [(f"accuracy after task {t + 1}", stated[t], curve[t]) for t in range(len(curve))]
        if curve:
            checks[:0] = [
                ("final accuracy", s.last_acc, curve[-1]),
                ("average accuracy", s.avg_acc, float(np.mean(curve))),
            ]
        for what, said, got in checks:
            if said is None or not np.isclose(float(said), got, rtol=0.0, atol=ACC_SLACK, equal_nan=True):
                shown = "none" if said is None else f"{float(said):.2f} %"
                return f"{protocol} {what}: the record says {shown}, its predictions give {got:.2f} %"
    return None


def from_bytes(data: bytes, path: Path | str = PREDICTIONS_FILE, max_bytes: int = MAX_BYTES) -> Predictions:
    """Predictions from ``.npz`` bytes, never unpickling; ClbenchError naming ``path`` for anything else."""

    def bad(why: str) -> ClbenchError:
        return ClbenchError(f"{path}: not a clbench predictions file ({why})", _FIX)

    try:  # every header checked before its array is allocated; never unpickled
        arrays = npz_arrays(data, max_bytes)
    except ValueError as e:
        raise bad(str(e)) from None
    names = ("version", "protocols", "after_task", "index", "label", "image_task", "pred", "conf")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise bad(f"no {', '.join(missing)}")
    if arrays["version"].shape != (1,) or int(arrays["version"][0]) != VERSION:
        raise bad(f"format version {arrays['version'].tolist()}, this clbench reads {VERSION}")
    protocols = arrays["protocols"]
    if protocols.dtype.kind != "U" or protocols.ndim != 1 or not len(protocols):
        raise bad("protocols is not a list of names")
    rows = arrays["index"].shape
    for n in ("after_task", "index", "label", "image_task"):
        if arrays[n].dtype.kind not in "iu" or arrays[n].shape != rows or arrays[n].ndim != 1:
            raise bad(f"{n} is not {rows[0] if rows else '?'} integers")
    want = (len(protocols), rows[0])
    if arrays["pred"].dtype.kind not in "iu" or arrays["pred"].shape != want:
        raise bad(f"pred is {arrays['pred'].shape} {arrays['pred'].dtype}, expected {want} integers")
    if arrays["conf"].dtype.kind != "f" or arrays["conf"].shape != want:
        raise bad(f"conf is {arrays['conf'].shape} {arrays['conf'].dtype}, expected {want} floats")
    for n in ("after_task", "index", "label", "image_task", "pred"):  # positions and class ids: never negative
        if arrays[n].size and int(arrays[n].min()) < 0:
            raise bad(f"{n} holds a negative value ({int(arrays[n].min())}); it holds positions and class ids")
    conf = arrays["conf"]
    if conf.size and not (np.isfinite(conf).all() and conf.min() >= 0 and conf.max() <= 1):
        raise bad("a confidence outside [0, 1]")
    if rows[0] and (np.diff(arrays["after_task"].astype(np.int64)) < 0).any():
        raise bad("rows are not in task order")
    return Predictions(
        tuple(str(p) for p in protocols),
        arrays["after_task"],
        arrays["index"],
        arrays["label"],
        arrays["image_task"],
        arrays["pred"],
        conf,
    )


def correctness(preds: Predictions, protocol: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, T) 1/0 per test image (rows: the final evaluation's images) and task, NaN before the image's class was
    seen; with each row's test index and class (N,): what :mod:`clbench.evaluation.stats` resamples."""
    final = preds.final(protocol)
    position = np.full(int(final.index.max()) + 1 if len(final.index) else 0, -1, dtype=np.int64)
    position[final.index] = np.arange(len(final.index))
    out = np.full((len(final.index), preds.n_tasks), np.nan)
    for t, e in enumerate(preds.evaluations(protocol)):
        if len(e.index) and (e.index.max() >= len(position) or (position[e.index] < 0).any()):
            raise ClbenchError(f"{PREDICTIONS_FILE}: task {t} evaluated images the final evaluation lacks", _FIX)
        out[position[e.index], t] = e.correct
    return out, final.index, final.label


@dataclass(frozen=True)
class RunUncertainty:
    """What a run's predictions add to its record, per protocol."""

    last_acc_ci: list[float]  # [lo, hi] percent
    avg_acc_ci: list[float]
    ece: float  # points


def uncertainty(preds: Predictions, protocol: str) -> RunUncertainty:
    """Intervals of final and average accuracy (stratified image bootstrap) and the final model's ECE."""

    correct, _, label = correctness(preds, protocol)
    last, avg = stats.run_intervals(correct, label)
    final = preds.final(protocol)
    return RunUncertainty(last.to_list(), avg.to_list(), metrics.ece(final.conf, final.correct))
