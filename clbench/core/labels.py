"""Class labels as a stream brings them: which of a task's classes are new to a method."""

from __future__ import annotations


def new_class_count(classes: list[int], n_seen: int, known: int, task_id: int) -> int:
    """The classes a task adds to a method that knows ``known`` classes (arrival-order labels ``0..known-1``):
    ``n_seen - known`` when ``classes`` are the next labels (the class scenario), 0 when the task brings classes
    already known only (a later domain of the domain scenario). Anything else is a ValueError (a stream out of
    order), as the class-incremental methods have always refused it."""
    if sorted(classes) == list(range(known, n_seen)):
        return n_seen - known
    if n_seen == known and all(0 <= c < known for c in classes):
        return 0
    raise ValueError(f"task {task_id}: classes {classes} are not the next arrival-order labels")
