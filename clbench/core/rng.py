"""The global RNG states a run draws from (torch's, numpy's, Python's, CUDA's): captured, restored, and read back
from a checkpoint's JSON and tensors, so that a continued run draws what an uninterrupted one would have."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor  # the annotations of RngState, whose field ``torch`` hides the module there


@dataclass(frozen=True)
class RngState:
    """The global RNG states a run may draw from (strategies should use ``ctx.generator``; libraries may not)."""

    torch: Tensor  # torch.get_rng_state(): uint8 bytes
    numpy: tuple[str, np.ndarray, int, int, float]  # np.random.get_state(): (MT19937, (624,) uint32 keys, pos, ...)
    python: tuple[Any, ...]  # random.getstate(): (version, 625 ints, gauss_next)
    cuda: tuple[Tensor, ...] = ()  # torch.cuda.get_rng_state_all(), where CUDA was initialised

    def to_json(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        algorithm, keys, pos, has_gauss, cached = self.numpy
        version, state, gauss_next = self.python
        doc = {
            "numpy": [str(algorithm), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
            "python": [int(version), [int(s) for s in state], gauss_next],
            "cuda": len(self.cuda),
        }
        tensors = {"rng.torch": self.torch.cpu()} | {f"rng.cuda.{i}": s.cpu() for i, s in enumerate(self.cuda)}
        return doc, tensors

    @classmethod
    def from_json(cls, doc: Any, tensors: dict[str, Tensor]) -> RngState:
        """The state ``doc`` and ``tensors`` hold, tried on private generators first; ValueError when it is not one."""
        try:
            algorithm, keys, pos, has_gauss, cached = doc["numpy"]
            version, state, gauss_next = doc["python"]
            n_cuda = doc["cuda"]
            if type(n_cuda) is not int or not all(type(k) is int for k in [*keys, *state]):
                raise TypeError("not integers")
            rng = cls(
                tensors["rng.torch"],
                (algorithm, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
                (version, tuple(state), gauss_next),
                tuple(tensors[f"rng.cuda.{i}"] for i in range(n_cuda)),
            )
            torch.Generator().set_state(rng.torch)
            np.random.RandomState().set_state(rng.numpy)
            random.Random().setstate(rng.python)
            for s in rng.cuda:
                if s.dtype != torch.uint8 or s.dim() != 1:
                    raise TypeError("a CUDA RNG state is a uint8 vector")
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise ValueError(f"its RNG state is not one ({type(e).__name__}: {e})") from None
        return rng


def capture_rng() -> RngState:
    """The global RNG states now: torch's CPU (and CUDA where initialised), numpy's and Python's."""
    initialised = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    cuda = tuple(torch.cuda.get_rng_state_all()) if initialised else ()
    numpy_state = np.random.get_state(legacy=True)
    if not isinstance(numpy_state, tuple):  # legacy=True gives the tuple form; the stubs allow a dict too
        raise TypeError(f"numpy's RNG state is a {type(numpy_state).__name__}, not the legacy tuple")
    return RngState(torch.get_rng_state(), numpy_state, random.getstate(), cuda)


def restore_rng(state: RngState) -> None:
    torch.set_rng_state(state.torch.cpu())
    np.random.set_state(state.numpy)
    random.setstate(state.python)
    if state.cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state.cuda])
