"""``--config FILE.yaml`` for ``clbench run`` and ``clbench sweep``: the flags, written down.

A config file is a YAML mapping whose keys are the command's flags without the dashes (``init-cls: 10``;
``init_cls`` is read the same), plus:

- the strategy's settings under its name (``tosca: {epochs: 5}``), as ``--set`` gives them (``--set`` itself is
  the key ``set``, a mapping); a sweep file may name any of its strategies, a run file only the strategy it runs;
- for ``clbench sweep`` only, ``groups:``, a list of mappings each with a ``name``: one sweep per group, in
  ``OUT/NAME``, with the group's keys on top of the file's (a table whose rows differ in more than strategy,
  benchmark and seed, e.g. one row with ``--protocol both`` and another with ``--profile quick``).

Flags given on the command line override the file (``--set`` pairs are applied after the file's). The file is
checked before anything runs: an unknown key (with a did-you-mean), a value of the wrong type, settings for a
strategy that is not run, or a file that is not a mapping is refused with one line naming the file and the key.
A setting that lowers a safety barrier (:data:`clbench.core.optins.COMMAND_LINE_ONLY`: ``trust-checkpoint``,
``ignore-data-problems``) is refused in every file, a sweep group's and a ``report --study`` file's included: it is
taken from the command line only.

The file is read as YAML 1.2 writes values (:func:`load`): ``true``/``false``, decimal numbers, everything else a
string (PyYAML's YAML 1.1 would read ``seed: 0123`` as 83, ``1:30`` as 90, ``off`` as false). Number forms the two
versions read differently (a leading zero, ``0x``/``0o``/``0b``, base 60, ``_`` separators), aliases (``*name``,
which a few hundred bytes can expand to billions of values), a key given twice and nesting deeper than
:data:`MAX_DEPTH` are refused with the line they are on.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clbench.core.catalog import STRATEGIES, card
from clbench.core.config import _convert, parse_list
from clbench.core.optins import refuse_in_file
from clbench.errors import ClbenchError
from clbench.files.escape import plain
from clbench.files.safety import folder_name_problem, read_bytes

SKIPPED = {"help", "config", "version", "autocast", "no-autocast"}  # not settings (or aliases of one)
LIST_KEYS = {"strategies", "benches", "seeds", "log"}  # a YAML list or a comma-separated string


MAX_BYTES = 2**20  # a config file of every flag and every strategy's settings is a few kilobytes
MAX_DEPTH = 16  # mappings and lists nest 3 deep (groups: [{tosca: {epochs: 1}}])


class _Refused(Exception):
    """A config file construct clbench refuses (an alias, a YAML 1.1 number form, a duplicate key), at a line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution): true/false, decimal integers, decimal
# floats; everything else a string. PyYAML implements YAML 1.1, where `0123` is octal 83, `1:30` is 90, `1_000` is
# 1000, `yes`/`off` are booleans and `2024-01-01` a date: each silently another value than most readers expect.
_NULL = r"^(?:~|null|Null|NULL|)$"
_BOOL = r"^(?:true|True|TRUE|false|False|FALSE)$"
_INT = r"^[-+]?(?:0|[1-9][0-9]*)$"
_FLOAT = (
    r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
# Number forms whose value YAML 1.1 and 1.2 disagree on (leading zeros, 0b/0o/0x, base 60, digit separators):
# refused, so that the file says what it means.
_AMBIGUOUS = (
    r"^[-+]?(?:0[0-9_]+(?:\.[0-9_]*)?|0[bBoOxX][0-9a-fA-F_]*|[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"
    r"|[0-9][0-9_]*_[0-9_]*(?:\.[0-9_]*)?)$"
)
_AMBIGUOUS_TAG = "tag:clbench.core.config,2026:ambiguous-number"
_LOADER: Any = None


def _loader() -> Any:
    """A PyYAML SafeLoader with YAML 1.2's scalar rules, no aliases, no duplicate keys and a nesting bound."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import re

    import yaml
    from yaml.events import AliasEvent

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict[str, list[tuple[str, re.Pattern[str]]]] = {}

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, AliasEvent):  # refused before it is expanded (a few bytes can name 10^9 nodes)
                raise _Refused(
                    event.start_mark.line + 1,
                    f"alias *{event.anchor}: clbench config files take no anchors and aliases; write the values out",
                )
            self._depth = getattr(self, "_depth", 0) + 1
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark.line + 1, f"nested more than {MAX_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable: PyYAML's own error follows
                    continue
                if first is not None:
                    raise _Refused(line, f"key {key!r:.60} appears twice (first at line {first}); give each once")
                seen[key] = line
            return super().construct_mapping(node, deep)

        def construct_yaml_int(self, node: Any) -> int:
            value = self.construct_scalar(node)
            if not re.match(_INT, value):  # an explicit !!int of another form
                raise _Refused(node.start_mark.line + 1, f"{value!r:.40} is not a decimal integer")
            return int(value)

        def construct_ambiguous(self, node: Any) -> Any:
            value = self.construct_scalar(node)
            raise _Refused(
                node.start_mark.line + 1,
                f"{value!r:.40} is a number form YAML versions read differently (YAML 1.1: "
                f"{yaml.safe_load(value)!r:.40}); write it in plain decimal digits, or quote it for a string",
            )

    for tag, pattern, first in (
        ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
        ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
        ("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789.")),
        (_AMBIGUOUS_TAG, _AMBIGUOUS, list("-+0123456789")),
    ):
        Loader.add_implicit_resolver(tag, re.compile(pattern), first)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor(_AMBIGUOUS_TAG, Loader.construct_ambiguous)
    _LOADER = Loader
    return Loader


def load(path: str) -> dict[str, Any]:
    """The YAML mapping in ``path``: YAML 1.2 scalars (a leading zero, base 60, ``0x``, ``_`` separators refused),
    no aliases, no key given twice, at most :data:`MAX_DEPTH` levels and :data:`MAX_BYTES` bytes; each refusal one
    line naming the file and the line."""
    import yaml

    p = Path(path).expanduser()
    if not p.exists() and not p.is_symlink():
        raise ClbenchError(f"--config {path}: no such file", "give the path of a YAML settings file")
    raw = read_bytes(p, MAX_BYTES, "YAML settings", name=f"--config {path}")  # a FIFO, a folder: said as such
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_loader())  # noqa: S506  (a SafeLoader: builds plain data only)
    except UnicodeDecodeError as e:
        raise ClbenchError(f"--config {path}: cannot read it ({e})") from None
    except _Refused as e:
        raise ClbenchError(f"--config {path}: line {e.line}: {e.message}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ClbenchError(f"--config {path}: not valid YAML{line} ({getattr(e, 'problem', None) or e})") from None
    except (ValueError, RecursionError) as e:  # an integer of more digits than Python converts
        raise ClbenchError(f"--config {path}: not a readable settings file ({str(e)[:100]})") from None
    if not isinstance(data, dict):
        raise ClbenchError(
            f"--config {path}: expected a mapping of settings (key: value), got {_kind(data)}",
            "write one setting per line, e.g. `strategy: tosca`",
        )
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "an empty file"
    names = {
        bool: "true/false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return f"{names.get(type(value), type(value).__name__)} ({value!r:.40})"


def _options(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Config key (the long flag without dashes) -> its argparse action."""
    out = {}
    for action in sub._actions:
        if isinstance(action, argparse._StoreConstAction) and not isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction)
        ):
            continue  # aliases such as --autocast
        for opt in action.option_strings:
            if opt.startswith("--") and opt[2:] not in SKIPPED:
                out[opt[2:]] = action
    return out


def _scalar(value: Any) -> str:
    """A YAML value as ``--set`` would take it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(_scalar(v) for v in value)
    return str(value)


class _File:
    def __init__(self, path: str, command: str) -> None:
        self.path, self.command = path, command

    def error(self, key: str, message: str, hint: str | None = None) -> ClbenchError:
        return ClbenchError(f"--config {self.path}: {key}: {message}", hint)

    def value(self, key: str, action: argparse.Action, value: Any) -> tuple[str, Any]:
        """(dest, value) for one flag key, type-checked like the flag."""
        opt = "--" + key
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
            if not isinstance(value, bool):
                raise self.error(key, f"expected true or false, got {_kind(value)}")
            flips = isinstance(action, argparse._StoreFalseAction) or opt.startswith("--no-")
            return action.dest, (not value) if flips else value
        if isinstance(action, argparse._AppendAction):  # --data-root (sweep): DIR, [DIR, BENCH=DIR], {BENCH: DIR}
            if isinstance(value, dict):
                return action.dest, [f"{k}={v}" for k, v in value.items()]
            items = value if isinstance(value, list) else [value]
            if not all(isinstance(v, str) for v in items):
                raise self.error(key, f"expected a folder, a list of them or a mapping, got {_kind(value)}")
            return action.dest, items
        if key in LIST_KEYS and isinstance(value, list):
            value = ",".join(_scalar(v) for v in value)
        typ = action.type
        if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.error(key, f"expected an integer, got {_kind(value)}")
        if typ is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise self.error(key, f"expected a number, got {_kind(value)}")
        if typ is None:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key in LIST_KEYS:
                value = str(value)  # seeds: 1993
            if not isinstance(value, str):
                raise self.error(key, f"expected a string, got {_kind(value)}")
        if action.choices is not None and value not in action.choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(map(str, action.choices))}")
        return action.dest, value

    def settings(self, key: str, value: Any, scoped: bool) -> list[tuple[str, str]]:
        """``set: {KEY: VALUE}`` -> [(KEY, VALUE)] as strings (a sweep's keys may be ``STRATEGY.KEY``)."""
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping of setting: value, got {_kind(value)}")
        out = []
        for k, v in value.items():
            if not isinstance(k, str) or (not scoped and "." in k):
                raise self.error(key, f"{k!r} is not a setting name")
            if isinstance(v, dict):
                raise self.error(f"{key}.{k}", f"expected a value, got {_kind(v)}")
            out.append((k, _scalar(v)))
        return out


def read(path: str, command: str, sub: argparse.ArgumentParser, data: dict[str, Any]) -> tuple[dict, dict, list]:
    """``data`` split and checked: (flag dest -> value, strategy -> [(key, value)], [(key, value)] of ``set``)."""
    f = _File(path, command)
    options = _options(sub)
    strategies = set(STRATEGIES.names())
    defaults: dict[str, Any] = {}
    sections: dict[str, list[tuple[str, str]]] = {}
    general: list[tuple[str, str]] = []
    for raw_key, value in data.items():
        if not isinstance(raw_key, str):
            raise f.error(repr(raw_key), "keys are setting names (strings)")
        key = raw_key.replace("_", "-")
        refuse_in_file(raw_key, f"--config {path}")  # a safety opt-in: the command line's alone
        if raw_key in strategies:
            sections[raw_key] = f.settings(raw_key, value, scoped=False)
        elif key == "set":
            general += f.settings(raw_key, value, scoped=command == "sweep")
        elif key in options:
            dest, v = f.value(key, options[key], value)
            defaults[dest] = v
        else:
            valid = sorted(set(options) | {"set"} | ({"groups"} if command == "sweep" else set()))
            close = difflib.get_close_matches(key, [*valid, *strategies], n=1)
            raise ClbenchError(
                f"--config {path}: unknown key {raw_key!r} for clbench {command}; valid keys: {', '.join(valid)}, "
                "or a strategy's name with its settings",
                f"did you mean {close[0]!r}?" if close else None,
            )
    return defaults, sections, general


def _check_sections(path: str, sections: dict[str, list[tuple[str, str]]], run: Sequence[str]) -> None:
    for name, pairs in sections.items():
        if name not in run:
            raise ClbenchError(
                f"--config {path}: {name}: settings for strategy {name}, which this command does not run "
                f"(it runs {', '.join(run) or 'none'})",
                f"remove the {name}: section, or add {name} to the strategies run",
            )
        config_cls = card(name).Config  # the method's card: its settings without loading it
        fields = sorted(f.name for f in dataclasses.fields(config_cls))
        hints = typing.get_type_hints(config_cls)
        for key, value in pairs:
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                raise ClbenchError(
                    f"--config {path}: {name}.{key}: {name} has no setting {key!r}; valid keys: {', '.join(fields)}",
                    f"did you mean {close[0]!r}?" if close else None,
                )
            try:  # the value's type, as --set checks it (ranges and cross-field checks come with the run's config)
                _convert(value, hints[key], key)
            except ClbenchError as e:
                why = str(e.args[0]).rsplit(": ", 1)[-1]
                raise ClbenchError(f"--config {path}: {name}.{key}: {value!r}: {why}") from None


def apply(
    make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str], command: str, path: str
) -> list[argparse.Namespace]:
    """The command's arguments with ``path``'s settings under the command-line flags: one namespace, or one per
    group of a sweep file."""
    data = load(path)
    groups = data.pop("groups", None)
    if groups is None:
        variants: list[tuple[str | None, dict[str, Any]]] = [(None, data)]
    else:
        if command != "sweep":
            raise ClbenchError(f"--config {path}: groups: only a clbench sweep file has groups")
        if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
            raise ClbenchError(f"--config {path}: groups: expected a list of mappings, each with a name")
        variants = []
        seen: set[str] = set()
        for i, g in enumerate(groups):
            name = g.get("name")
            why = folder_name_problem(name) if name is not None else None
            if name is None or why is not None:  # its sweep goes to OUT/NAME: a folder inside OUT, never OUT's parent
                given = "" if name is None else f"; {plain(repr(name))[:80]} is not one ({why})"
                raise ClbenchError(
                    f"--config {path}: groups[{i}]: expected a name (one folder name) for the group{given}",
                    "name each group with one plain folder name, e.g. `name: quick`",
                )
            if name in seen:
                raise ClbenchError(f"--config {path}: groups[{i}]: name {name!r} is the name of an earlier group")
            seen.add(name)
            merged = {**data, **{k: v for k, v in g.items() if k != "name"}}
            for key in ("set", *(k for k in data if isinstance(data.get(k), dict) and isinstance(g.get(k), dict))):
                if isinstance(data.get(key), dict) and isinstance(g.get(key), dict):
                    merged[key] = {**data[key], **g[key]}
            variants.append((name, merged))
    out = []
    for name, values in variants:
        parser = make_parser()
        sub = parser.commands[command]  # type: ignore[attr-defined]
        defaults, sections, general = read(path, command, sub, values)
        sub.set_defaults(**defaults)
        args = parser.parse_args(argv)
        if command == "run":
            run = [args.strategy] if args.strategy else []
            _check_sections(path, sections, run)
            pairs = general + [kv for n in run for kv in sections.get(n, [])]
        else:
            if args.strategies is None:
                raise ClbenchError("clbench sweep needs --strategies", "give it on the command line or in the file")
            _check_sections(path, sections, parse_list(args.strategies, "strategies"))
            pairs = general + [(f"{n}.{k}", v) for n, kv in sections.items() for k, v in kv]
            if name is not None:
                if args.out is None:
                    raise ClbenchError(f"--config {path}: a file with groups needs out (the folder of the groups)")
                args.out = str(Path(args.out) / name)
                args.group_name = name
        args.overrides = [*pairs, *args.overrides]
        out.append(args)
    return out
