"""The harness's check of what a strategy returns, before any of it reaches a record.

A strategy, shipped or a plug-in (``CLBENCH_PLUGINS``, a ``clbench.strategies`` entry point), answers the harness
through the methods of :class:`clbench.methods.contract.Strategy`. The harness knows what each answer must look like
(the images it asked about, the classes seen, the tasks done) and passes every answer through :func:`checked` at the
call: a malformed one is refused with one :class:`~clbench.errors.ClbenchError` line naming the strategy, the method,
what came back and what was expected, so no record is built from it. The predictions the record keeps are the argmax of
the checked logits, so their shape ``(N,)``, integer type and range (the classes seen) follow from the logits' shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from clbench.core.costs import ParamCounts
from clbench.errors import ClbenchError
from clbench.files.typedfile import is_count

A = TypeVar("A")


def _what(value: Any) -> str:
    """A short description of a returned value, for the refusal."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}" if value is not None else "None"


def _logits(answer: Any, images: int, classes: int, optional: bool = False) -> tuple[str, str] | None:
    """(what was wrong, what was expected) for scores of every image over the classes seen; None when they fit."""
    if answer is None and optional:
        return None
    expected = f"float logits of shape {(images, classes)} (one row per image, one column per class seen)"
    if (
        not isinstance(answer, torch.Tensor)
        or not answer.is_floating_point()
        or tuple(answer.shape)
        != (
            images,
            classes,
        )
    ):
        return _what(answer), expected + (", or None" if optional else "")
    bad = int((~torch.isfinite(answer)).sum())
    if bad:
        return f"{bad} NaN or infinite values", "finite logits"
    return None


def _features(answer: Any, images: int) -> tuple[str, str] | None:
    if answer is None:
        return None
    expected = f"None or finite float features of shape ({images}, width)"
    if not isinstance(answer, torch.Tensor) or not answer.is_floating_point() or answer.ndim != 2:
        return _what(answer), expected
    if len(answer) != images or answer.shape[1] == 0:
        return _what(answer), expected
    bad = int((~torch.isfinite(answer)).sum())
    return (f"{bad} NaN or infinite values", expected) if bad else None


def _param_counts(answer: Any, tasks: int) -> tuple[str, str] | None:
    if not isinstance(answer, ParamCounts):
        return _what(answer), "a ParamCounts"
    per_task = f"one non-negative integer per task done ({tasks})"
    for field in ("added_per_task", "stored_per_task", "trainable_per_task"):
        counts = getattr(answer, field)
        if not isinstance(counts, (list, tuple)) or len(counts) != tasks:
            n = f"{len(counts)} entr{'y' if len(counts) == 1 else 'ies'}" if isinstance(counts, list | tuple) else ""
            return f"{field} of {n or _what(counts)} for {tasks} tasks done", f"{field} with {per_task}"
        wrong = [c for c in counts if not is_count(c)]
        if wrong:
            return f"{field} holding {wrong[0]!r}", f"{field} with {per_task}"
    if not is_count(answer.head):
        return f"head = {answer.head!r}", "head: the final classifier's size, a non-negative integer"
    return _json_object("extra", answer.extra)


def _json_object(name: str, value: Any) -> tuple[str, str] | None:
    expected = f"{name}: a dict of string keys to JSON values (numbers, strings, lists, dicts, None)"
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return f"{name} = {_what(value)}", expected
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        return f"{name} that is not JSON ({e})", expected
    return None


CHECKS: dict[str, Callable[..., tuple[str, str] | None]] = {
    "predict": _logits,
    "predict_given_task": lambda answer, **known: _logits(answer, optional=True, **known),
    "adapted_features": _features,
    "param_counts": _param_counts,
    "diagnostics": lambda answer: _json_object("the diagnostics", answer),
}


def checked(strategy: str, method: str, answer: A, **known: int) -> A:
    """``answer``, what ``strategy``'s ``method`` returned, once it fits what the harness knows (``known``: for
    ``predict`` and ``predict_given_task`` ``images`` and ``classes`` seen, for ``adapted_features`` ``images``, for
    ``param_counts`` the ``tasks`` done). Raises :class:`ClbenchError`, one line, for one that does not."""
    problem = CHECKS[method](answer, **known)
    if problem is not None:
        wrong, expected = problem
        raise ClbenchError(f"strategy {strategy!r}: {method}() returned {wrong}; expected {expected}")
    return answer
