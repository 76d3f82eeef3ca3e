"""Typed JSON files: every field of every file clbench saves is declared once, and reading, writing and validation
are derived from that declaration.

A saved file, or a part of one, is a dataclass whose fields are declared with :func:`json_field`:

- ``expected`` / ``ok``: what a value must be, as a phrase for the refusal and as a check (no ``ok``: not checked);
- ``required``: a file without the field is refused, naming it (otherwise a default stands in, for files written
  before the field existed); ``since``: the schema version that added it, so that a file of an older version may
  lack it even where it is required;
- ``where_set``: written only where set (not None, not an empty list), as the files always had it;
- ``part``: the dataclass of a nested part, itself declared this way; ``shape`` says whether the value is one such
  object (``"one"``), a list of them (``"list"``) or an object of them keyed by name (``"map"``); its checks apply
  under the field's name (``time_s.train``, ``runs.aper-ci.state``).

- ``codec``: a value type that reads, checks and writes its own JSON (``from_json``, ``json_problems``, ``to_json``:
  :class:`Codec`), for a value that is not a plain dataclass (the run's settings fingerprint,
  :class:`clbench.core.config.Fingerprint`); its problems are named under the field's name (``fingerprint.seed``).

A field named ``extra`` (a dict) keeps the keys a file holds that this clbench does not know; :func:`write` puts them
back last, so a file read and written again keeps them. Fields declared with a plain :func:`dataclasses.field` (no
``json_field``) are part of the object but not of the file.

:func:`problems` lists what keeps a JSON value from being the declared file (one line per problem, naming the field
and what it must be); :func:`read` builds the dataclass from a value :func:`problems` found sound; :func:`write` is
its inverse. The checks below (:func:`is_count`, :func:`list_of`, ...) are the vocabulary every declaration uses.
Nothing here imports torch or any other part of clbench.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, TypeGuard, TypeVar

Json = dict[str, Any]  # a JSON object as read, not yet checked (Any: whatever the file holds)
# A JSON value, checked (:func:`is_json_value`): what a field holds whose layout is not clbench's to declare (a
# method's own Config, a backend's own description). Read-only views, so that a dict of any JSON values is one.
JsonValue: TypeAlias = None | bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
JsonObject: TypeAlias = Mapping[str, JsonValue]
JsonScalar: TypeAlias = None | bool | int | float | str
Check = Callable[[Any], bool]
T = TypeVar("T")

EXTRA = "extra"  # the field that keeps unknown keys
SHAPES = ("one", "list", "map")

# Bounds of what a value can mean; a file outside them was not written by clbench (or was edited) and is refused.
MAX_INT = 2**63 - 1  # counts, sizes and seeds: what a C long holds
MAX_NAME = 256  # characters of a name (strategy, benchmark, backbone, protocol, run id, profile)
MAX_TEXT = 64 * 2**10  # characters of any other string (a command line, a data problem, a diagnostic)
MAX_SECONDS = 10 * 365 * 86400.0  # a phase's wall-clock

# ------------------------------------------------------------------------------------------- the checks
NAME = f"a name (1 to {MAX_NAME} characters)"
SECONDS = "seconds (a finite number >= 0)"
COUNT = "an integer >= 0"
COUNTS = "a list of integers >= 0"
TEXT = "a string"
OBJECT = "an object"


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT <= v <= MAX_INT


def is_count(v: Any) -> bool:  # a size, a count, a seed, an index: >= 0
    return is_int(v) and v >= 0


def is_positive(v: Any) -> bool:
    return is_int(v) and v >= 1


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= 1e15


def is_real(v: Any) -> bool:  # a number, NaN allowed
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (math.isnan(v) or is_number(v))


def is_seconds(v: Any) -> bool:
    return is_number(v) and 0 <= v <= MAX_SECONDS


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def is_name(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME


def is_object(v: Any) -> bool:
    return isinstance(v, dict)


def is_json_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def is_json_value(v: Any) -> bool:
    """Whatever :func:`json.loads` makes: null, true/false, a number (NaN and infinities too: Python's reader takes
    them), a string, a list of JSON values or an object of them with string keys."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, list):
        return all(is_json_value(x) for x in v)
    return is_json_object(v)


def is_json_object(v: Any) -> TypeGuard[dict[str, JsonValue]]:
    return isinstance(v, dict) and all(isinstance(k, str) and is_json_value(x) for k, x in v.items())


def list_of(ok: Check) -> Check:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def map_of(ok: Check) -> Check:
    return lambda v: isinstance(v, dict) and all(ok(x) for x in v.values())


def or_none(ok: Check) -> Check:
    return lambda v: v is None or ok(v)


def one_of(*choices: Any) -> Check:
    return lambda v: any(v == c and type(v) is type(c) for c in choices)


# ------------------------------------------------------------------------------------------- declaring
class Codec(Protocol):
    """A value type that reads, checks and writes its own JSON (``json_field(codec=...)``)."""

    @classmethod
    def json_problems(cls, data: Any) -> list[str]:  # Any: the JSON value as read, not yet checked
        """What keeps ``data`` from being one, a line per problem starting with the key it names (``seed is ...``)."""
        ...

    @classmethod
    def from_json(cls, data: Any) -> Any: ...  # Any: data that json_problems found sound; the result is a cls

    def to_json(self) -> Any: ...  # Any: the JSON value from_json reads back


@dataclass(frozen=True)
class Spec:
    """How one field of a typed file is read, written and checked (:func:`json_field`)."""

    expected: str | None = None
    ok: Check | None = None
    required: bool = False
    since: int | None = None
    where_set: bool = False
    part: type | None = None
    shape: str = "one"
    inline: type | None = None
    codec: type[Codec] | None = None


def json_field(
    expected: str | None = None,
    ok: Check | None = None,
    *,
    required: bool = False,
    since: int | None = None,
    where_set: bool = False,
    part: type | None = None,
    shape: str = "one",
    inline: type | None = None,
    codec: type[Codec] | None = None,
    **kwargs: Any,
) -> Any:
    """A dataclass field of a typed file (module docstring). ``inline``: a typed dataclass whose fields the file
    holds at this level, right after this field (the run record repeats its main protocol's metrics so); they are
    checked there, and the declaring file reads and writes them itself. ``codec``: the value's own type, which
    checks, reads and writes it (:class:`Codec`; checked after ``ok``). Other arguments go to
    :func:`dataclasses.field` (``default``, ``default_factory``)."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {SHAPES}")
    if ok is not None and expected is None:
        raise ValueError("a checked field says what it expects")
    if part is not None and codec is not None:
        raise ValueError("a field is a part or a codec's value, not both")
    spec = Spec(expected, ok, required, since, where_set, part, shape, inline, codec)
    return field(metadata={"typedfile": spec}, **kwargs)


def spec(f: dataclasses.Field[Any]) -> Spec | None:
    """A field's declaration; None for a field that is not part of the file."""
    return f.metadata.get("typedfile")


def file_fields(cls: type) -> list[tuple[dataclasses.Field[Any], Spec]]:
    """The declared fields of ``cls`` in file order."""
    return [(f, s) for f in dataclasses.fields(cls) if (s := spec(f)) is not None]


def _has_extra(cls: type) -> bool:
    return any(f.name == EXTRA for f in dataclasses.fields(cls))


# ------------------------------------------------------------------------------------------- validating
@dataclass
class Problems:
    """What :func:`problems` found: missing required fields, then wrong values, each a dotted field name."""

    missing: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def lines(self, lacks: str = "file") -> list[str]:
        """One line for the missing fields (``record lacks a, b``), then one per wrong value (``field ...``)."""
        return ([f"{lacks} lacks {', '.join(self.missing)}"] if self.missing else []) + [
            f"field {w}" for w in self.wrong
        ]

    def first(self) -> str | None:
        """The first problem in one line (``field runs.x.path is missing``), or None."""
        lines = [f"field {m} is missing" for m in self.missing[:1]] or [f"field {w}" for w in self.wrong[:1]]
        return lines[0] if lines else None

    def __bool__(self) -> bool:
        return bool(self.missing or self.wrong)


def short(value: Any) -> str:
    """A value as a refusal quotes it: at most 40 characters, a long list or object by its length."""
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 20 else f"of {len(value)} items"
    return text[:40] + ("..." if len(text) > 40 else "")


def problems(cls: type, data: Any, *, version: int | None = None, where: str = "") -> Problems:
    """What keeps ``data`` from being a ``cls`` (module docstring), every problem named by its dotted field.
    ``version``: the file's schema version, so that a field added later (``since``) may be missing from it."""
    found = Problems()
    _collect(cls, data, version, where, found)
    return found


def _collect(cls: type, data: Any, version: int | None, where: str, found: Problems) -> None:
    if not isinstance(data, dict):
        found.wrong.append(f"{where.rstrip('.') or 'file'} is {type(data).__name__} {short(data)}, expected an object")
        return
    for f, s in file_fields(cls):
        _collect_field(f.name, s, data, version, where, found)
        if s.inline is not None:
            _collect(s.inline, data, version, where, found)


def _collect_field(name: str, s: Spec, data: Json, version: int | None, where: str, found: Problems) -> None:
    at = f"{where}{name}"
    if name not in data:
        added_later = s.since is not None and version is not None and version < s.since
        if s.required and not added_later:
            found.missing.append(at)
        return
    value = data[name]
    if s.ok is not None and not s.ok(value):
        found.wrong.append(f"{at} is {type(value).__name__} {short(value)}, expected {s.expected}")
    elif s.codec is not None and value is not None:
        found.wrong += [f"{at}.{p}" for p in s.codec.json_problems(value)]
    elif s.part is not None and value is not None:
        if s.shape == "one":
            _collect(s.part, value, version, f"{at}.", found)
        elif not isinstance(value, list if s.shape == "list" else dict):
            what = "a list of objects" if s.shape == "list" else "an object"
            found.wrong.append(f"{at} is {type(value).__name__} {short(value)}, expected {what}")
        else:
            if isinstance(value, list):
                keyed = [(f"{at}[{i}].", x) for i, x in enumerate(value)]
            else:
                keyed = [(f"{at}.{k}.", x) for k, x in value.items()]
            for where_item, item in keyed:
                _collect(s.part, item, version, where_item, found)


# ------------------------------------------------------------------------------------------- reading and writing
def read(cls: type[T], data: Json) -> T:
    """A ``cls`` from the JSON object ``data`` that :func:`problems` found sound: each declared field present in
    ``data`` (parts read likewise), the rest left at their defaults, unknown keys in ``extra`` where ``cls`` has it."""
    values: Json = {}
    for f, s in file_fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if s.codec is not None and value is not None:
            value = s.codec.from_json(value)
        elif s.part is not None and value is not None:
            part = s.part
            if s.shape == "one":
                value = read(part, value)
            elif s.shape == "list":
                value = [read(part, x) for x in value]
            else:
                value = {k: read(part, x) for k, x in value.items()}
        values[f.name] = value
    if _has_extra(cls):
        known = {f.name for f, _ in file_fields(cls)}
        values[EXTRA] = {k: v for k, v in data.items() if k not in known}
    return cls(**values)


def unset(v: Any) -> bool:
    """None or an empty list: what a ``where_set`` field leaves out (an empty object is written; an array is never
    unset: ``v != []`` on one is an element-wise comparison)."""
    return v is None or (isinstance(v, list) and not v)


def write(obj: Any) -> Json:
    """The JSON object of ``obj``, a typed-file dataclass: declared fields in order (``where_set`` ones only where
    set; parts written likewise), then ``extra``."""
    out: Json = {}
    for f, s in file_fields(type(obj)):
        value = getattr(obj, f.name)
        if not (s.where_set and unset(value)):
            out[f.name] = write_value(s, value)
    extra = getattr(obj, EXTRA, None) if _has_extra(type(obj)) else None
    return {**out, **(extra or {})}


def write_value(s: Spec, value: Any) -> Any:
    """One field's value as JSON: a codec's value by its ``to_json``, a part (one, a list or a map of them) through
    :func:`write`, else as it is."""
    if s.codec is not None and value is not None:
        return value.to_json()
    if s.part is None or value is None:
        return value
    if s.shape == "one":
        return write(value)
    if s.shape == "list":
        return [write(x) for x in value]
    return {k: write(x) for k, x in value.items()}


class Typed:
    """A typed-file dataclass's ``from_dict`` / ``to_dict`` (:func:`read` / :func:`write`), for the classes that
    other code reads and writes one part at a time."""

    @classmethod
    def from_dict(cls, data: Json) -> Any:
        return read(cls, data)

    def to_dict(self) -> Json:
        return write(self)


FieldCheck = tuple[tuple[str, ...], str, Check]


def declared_checks(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[FieldCheck, bool]]:
    """Every check ``cls`` declares, in file order, with whether its field is required: one part's (``shape``
    "one") under its field's name (``("time_s", "train")``), an inline part's at this level."""
    out: list[tuple[FieldCheck, bool]] = []
    for f, s in file_fields(cls):
        if s.ok is not None and s.expected is not None:
            out.append((((*prefix, f.name), s.expected, s.ok), s.required))
        if s.part is not None and s.shape == "one":
            out += declared_checks(s.part, (*prefix, f.name))
        if s.inline is not None:
            out += declared_checks(s.inline, prefix)
    return out
