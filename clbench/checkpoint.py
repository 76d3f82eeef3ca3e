"""Checkpoints: a run killed at any moment continues from its last finished task and ends with the record an
uninterrupted run would have written.

After every task the harness writes ``<run folder>/checkpoint.pt`` atomically (a temporary file in the same folder,
fsynced and renamed over the old one, :func:`clbench.files.atomic_write_bytes`), *before* that task's ``result.json``,
so a record never claims more tasks than the checkpoint holds. The file is ``torch.save`` of a plain dict:

- ``format``, ``version``: ``"clbench-checkpoint"``, :data:`VERSION`.
- ``config``: every :class:`~clbench.config.RunConfig` field (``clbench run --resume DIR`` reads them).
- ``fingerprint``: the fields that define the run (:data:`clbench.config.DEFINING_FIELDS`, backbone resolved to its
  name); a run with other values is refused, never continued.
- ``backbone_digest`` and ``data`` (train/test content fingerprints, class order, task sizes): checked once the
  benchmark and backbone are loaded again.
- ``tasks_done``: tasks learnt and evaluated; the run continues with task ``tasks_done``.
- ``strategy``: :meth:`Strategy.state_dict() <clbench.strategy.Strategy.state_dict>` (modules, head, lists).
- ``rng``: the global RNG states (torch CPU, CUDA where initialised, numpy, Python ``random``) after the task's
  evaluation. Strategies otherwise draw from ``ctx.generator(salt)``, fixed per task.
- ``logs``: the accuracy rows so far per protocol (the harness's ``_ProtocolLog`` fields); ``per_task``: the
  record's per-task entries so far.
- ``times`` (seconds so far: features, train, eval, checkpoint, total), ``peak_rss_mb``, ``feature_cache`` (cache
  events so far), ``resumed_from_task`` (``tasks_done`` at every earlier resume): summed over the run's segments.
- ``git_revision``: the code that wrote it (a resume under other code is logged, not refused).

The strategy state holds pickled modules, so the file is read with ``torch.load(weights_only=False)``: resume only
run folders you wrote yourself, as with any pickle.
"""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from clbench import config
from clbench.config import RunConfig
from clbench.errors import ClbenchError, setting
from clbench.files import atomic_write_bytes

if TYPE_CHECKING:
    from clbench.benchmarks.base import Benchmark


CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = "clbench-checkpoint"
VERSION = 1


# ----------------------------------------------------------------------------------------------- resume
def resume_config(run_dir: str | Path, given: dict[str, Any]) -> RunConfig:
    """The RunConfig of the run in ``run_dir`` (``clbench run --resume DIR``), from its checkpoint.

    ``given`` holds the settings the user passed explicitly (:func:`clbench.config.given_settings`); how they are
    reconciled with the checkpoint's is :func:`clbench.config.resume_config`."""
    from clbench.results import RESULT_FILE

    path = Path(run_dir)
    config.check_resume_request(path, given)
    if not (path / CHECKPOINT_FILE).is_file():
        raise ClbenchError(
            _no_checkpoint_message(path, path / RESULT_FILE),
            "a run killed before its first task finished has no checkpoint; run the same command "
            f"without {setting('resume')} to start it over",
        )
    ckpt = load(path / CHECKPOINT_FILE)
    return config.resume_config(path, dict(ckpt["config"]), ckpt["fingerprint"], given)


def _no_checkpoint_message(path: Path, result: Path) -> str:
    import json

    try:
        complete = json.loads(result.read_text()).get("complete", False)
    except (OSError, ValueError):
        complete = None
    if complete:
        return f"{setting('resume')} {path}: the run is finished; there is nothing to continue"
    return f"{setting('resume')} {path}: no {CHECKPOINT_FILE} to continue from"


# ----------------------------------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """The global RNG states a run may draw from (strategies should use ``ctx.generator``; libraries may not)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


# ----------------------------------------------------------------------------------------------- file
def save(path: Path, ckpt: dict[str, Any]) -> None:
    """Write ``ckpt`` atomically: readers (and a resume after a kill) see the previous checkpoint or this one."""
    buf = io.BytesIO()
    try:
        torch.save({"format": FORMAT, "version": VERSION, **ckpt}, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise TypeError(f"the checkpoint cannot be saved: {_unpicklable(ckpt.get('strategy', {})) or e}") from e
    atomic_write_bytes(path, buf.getbuffer())


def _unpicklable(state: dict[str, Any]) -> str | None:
    for name, value in state.items():
        try:
            torch.save(value, io.BytesIO())
        except Exception as e:
            return (
                f"strategy attribute {name!r} ({type(value).__name__}) cannot be pickled ({e}); keep state in "
                f"modules, tensors and plain containers"
            )
    return None


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint; a file that is not one (truncated, corrupted, another format) is a ClbenchError."""
    try:
        ckpt = torch.load(str(path), map_location=map_location, weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, missing class: many kinds
        raise ClbenchError(
            f"{path} cannot be read as a clbench checkpoint ({type(e).__name__}: {e})",
            f"pass {setting('overwrite')} to start the run over",
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ClbenchError(f"{path} is not a clbench checkpoint", f"pass {setting('overwrite')} to start the run over")
    if ckpt.get("version") != VERSION:
        raise ClbenchError(
            f"{path} is a version {ckpt.get('version')} checkpoint; this clbench reads version {VERSION}",
            f"pass {setting('overwrite')} to start the run over",
        )
    for settings in (ckpt.get("fingerprint") or {}, ckpt.get("config") or {}):  # before precision: autocast
        if "autocast" in settings and "precision" not in settings:
            settings["precision"] = "bf16" if settings.pop("autocast") else "fp32"
    return ckpt


def data_identity(bench: Benchmark) -> dict[str, Any]:
    """What the loaded benchmark is: content fingerprints, class order, task sizes."""
    return {
        "train": bench.train.fingerprint(),
        "test": bench.test.fingerprint(),
        "class_order": list(bench.class_order),
        "task_sizes": list(bench.task_sizes),
    }


def check_inputs(
    ckpt: dict[str, Any], path: Path, backbone_digest: str, precision: str, precision_reason: str, data: dict[str, Any]
) -> None:
    """Refuse to continue when the backbone weights (``backbone_digest``), the precision the backbone runs at or the
    data (:func:`data_identity`) differ from those the checkpoint was made with."""
    if ckpt["backbone_digest"] != backbone_digest:
        raise ClbenchError(
            f"{path} was made with other backbone weights (digest {ckpt['backbone_digest'][:12]}, "
            f"now {backbone_digest[:12]}); it cannot be continued",
            f"restore the weights file it was started with, or pass {setting('overwrite')} to start over",
        )
    saved_precision = ckpt.get("precision", ckpt["fingerprint"].get("precision"))
    if saved_precision in ("fp32", "bf16", "fp16") and saved_precision != precision:
        raise ClbenchError(
            f"{path} was made at precision {saved_precision}; here the backbone runs at "
            f"{precision} ({precision_reason})",
            f"continue it with {setting('precision')} {saved_precision}, or pass {setting('overwrite')} to start over",
        )
    changed = [k for k in data if ckpt["data"].get(k) != data[k]]
    if changed:
        raise ClbenchError(
            f"{path}: the benchmark data changed since the checkpoint ({', '.join(changed)} differ); "
            f"it cannot be continued",
            f"restore the data, or pass {setting('overwrite')} to start over",
        )
