"""Run settings: the one place each is declared and validated.

:class:`RunConfig` holds every setting of one run, each declared once with :func:`run_field`: its default, its check
and its command-line flag and help (:class:`Cli`). The ``clbench run`` and ``clbench sweep`` flags are generated from
the fields (:func:`add_run_flags`), so a new field is a new flag with no other edit (CleanRL's ``Args`` dataclass,
without a dependency). Building a RunConfig checks every field (type, range, choice) and raises
a :class:`~clbench.errors.ClbenchError` naming the flag, the value and the fix. ``clbench run``, ``clbench sweep``,
``clbench run --resume`` and the Python API (``clbench.run.harness.run(RunConfig(...))``) therefore refuse the same
values with the same message, before anything is loaded. ``None`` means "not given" (the benchmark's or strategy's
default); zero is a value like any other and is refused where it makes no sense, never replaced by a default.

The ``--set`` parsing of strategy settings (:func:`make_strategy_config`) lives here too: strings to the types of the
strategy's config dataclass, then the dataclass's own checks. Names (strategy, benchmark, backbone) and what depends on
the machine (a CUDA device, a precision) are decided once by :func:`clbench.run.harness.resolve`, which needs the
registries.

This module imports nothing from the runner (harness, sweep) and neither torch nor PIL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clbench.core.optins import COMMAND_LINE_ONLY
from clbench.errors import ClbenchError, setting
from clbench.files.typedfile import OBJECT, TEXT, JsonValue, is_bool, is_int, is_number, is_str, or_none, short

if TYPE_CHECKING:  # never imported at run time: this module stays free of torch
    from _typeshed import DataclassInstance


DEFAULT_BENCH = "emoji"  # the embedded benchmark (clbench.benchmarks registers it): offline, ships with clbench
PROTOCOL_CHOICES = ("per-sample", "reference", "both")
# class: each task brings new classes; domain: each task brings every class of the benchmark in a new domain
# (BenchmarkSpec.domains). A strategy states the ones it supports (Strategy.scenarios).
SCENARIO_CHOICES = ("class", "domain")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
PRECISION_CHOICES = (
    "auto",
    "fp32",
    "bf16",
    "fp16",
)  # = clbench.core.precision.CHOICES (that module imports torch lazily)
WEIGHT_SOURCES = ("auto", "offline", "hub", "random")  # --weights values that are not a file
# The run shape of the regression gate's ``ci`` profiles (.ci/gate, reports/gate/README.md), declared once for every
# strategy's profiles to reuse: the embedded benchmark at 56 px (4x4 patches of 14 px), so that every ci run shares
# one feature cache; the methods that pass images through the ViT per task run 3 tasks of 12 classes instead of the
# benchmark's 6 of 6 (their inference cost grows with the tasks).
CI_INPUT: dict[str, int] = {"img_size": 56}
CI_SHAPE: dict[str, int] = {**CI_INPUT, "init_cls": 12, "increment": 12}
# The gate's recipe for a method that trains adapters through the ViT in its first session (APER's loop, which
# RanPAC's Phase 1 and EASE's adapters follow): CI_SHAPE, the first 8 training images per class, 4 epochs of batches
# of 16 at lr 0.5 (24 steps for the 32 image passes per class of 2 epochs of 16 images). At the references' lr
# (0.01-0.025) and batch 48 the loss stayed at ln 12 and the gate pinned untrained adapters; with this it falls to
# about 0.8 of its first epoch (the criterion: reports/gate/README.md).
CI_FIRST_SESSION: dict[str, int | float] = {**CI_SHAPE, "epochs": 4, "train_per_class": 8, "batch_size": 16, "lr": 0.5}


class HasSettings(typing.Protocol):
    """What settings code reads of a method: a strategy class, or its torch-free card
    (clbench.core.catalog.MethodCard)."""

    @property
    def name(self) -> str: ...

    @property
    def Config(self) -> type[DataclassInstance]: ...  # noqa: N802 (the contract's attribute name)

    @property
    def profiles(self) -> Mapping[str, Mapping[str, Any]]: ...


def run_level(strategy_cls: HasSettings, profile: str | None, cfg_value: int | None, key: str) -> int | None:
    """The run setting ``key``: the explicit value when given (0 included), else the profile's, else None."""
    if cfg_value is not None:
        return cfg_value
    return strategy_cls.profiles.get(profile, {}).get(key) if profile else None


SEED_MAX = 2**32 - 1  # numpy's RandomState takes [0, 2**32); torch takes more, but one range for every RNG


def split_list(text: str, flag: str, example: str) -> list[str]:
    """A comma-separated flag value as its items, stripped; an empty item (``1993,,1994``, a trailing comma) is
    refused: a typo must not silently change what runs. Every list flag is read with this."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise ClbenchError(f"{flag} is empty", f"give a comma-separated list, e.g. {flag} {example}")
    if not all(items):
        raise ClbenchError(
            f"{flag} {text!r}: item {items.index('') + 1} is empty (two commas in a row, or a comma at an end)",
            f"give a comma-separated list without empty items, e.g. {flag} {example}",
        )
    return items


def parse_list(text: str, what: str) -> tuple[str, ...]:
    """A sweep's list flag ``--strategies``, ``--benches`` or ``--seeds`` (``what``) as its items: order kept,
    repeats dropped (a sweep's and a config file's reader both read them so)."""
    example = {"strategies": "tosca,simplecil", "benches": "emoji", "seeds": "1993,1994,1995"}[what]
    return tuple(dict.fromkeys(split_list(text, f"--{what}", example)))  # order kept, repeats dropped


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class _Setting:
    """What every kind of setting shares: its name (the :class:`RunConfig` field) and, where the command line
    spells it otherwise than ``--`` plus the name with dashes, its flag. Each kind's ``check(value: Any)`` takes
    whatever it is given: refusing the wrong types is its job."""

    name: str  # the field of RunConfig (or of another declaration, e.g. clbench.sweep.settings): filled by settings_of
    flag: str | None

    def error(self, message: str) -> ClbenchError:
        """A ClbenchError about this setting, whose name starts ``message``."""
        return ClbenchError(f"{setting(self.name)}{message}", flags={self.name: self.flag} if self.flag else None)


@dataclass(frozen=True)
class Number(_Setting):
    """A numeric setting: its name, type, inclusive range and what it means (for the message)."""

    kind: type  # int or float
    low: float | None = None
    high: float | None = None
    optional: bool = False  # None allowed, meaning "not given"
    low_open: bool = False  # low itself is excluded (e.g. > 0)
    meaning: str = ""
    default_hint: str = ""  # how to get the default, for optional settings; "{s}" stands for the setting
    flag: str | None = None
    name: str = dataclasses.field(default="", kw_only=True)

    def range_text(self) -> str:
        lo = None if self.low is None else (f"> {_num(self.low)}" if self.low_open else f">= {_num(self.low)}")
        hi = None if self.high is None else f"<= {_num(self.high)}"
        return " and ".join(x for x in (lo, hi) if x) or "any value"

    def check(self, value: Any) -> None:
        if value is None:
            if self.optional:
                return
            raise self.error(f" needs a value ({self.meaning})")
        noun = "an integer" if self.kind is int else "a number"
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or (self.kind is int and not isinstance(value, numbers.Integral))
        ):
            raise self.error(f" {value!r}: expected {noun} ({self.meaning})")
        if self.kind is float and not math.isfinite(value):
            raise self.error(f" {value}: expected a finite number ({self.meaning})")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        # `not <=` rather than `>`: numbers.Real declares only < and <= (same result, NaN was refused above)
        too_high = self.high is not None and not value <= self.high
        if too_low or too_high:
            hint = "; " + self.default_hint.replace("{s}", setting(self.name)) if self.default_hint else ""
            raise self.error(f" must be {self.range_text()} (got {value}): {self.meaning}{hint}")


@dataclass(frozen=True)
class Choice(_Setting):
    choices: tuple[str, ...]
    noun: str = "values"
    flag: str | None = None
    name: str = dataclasses.field(default="", kw_only=True)

    def check(self, value: Any) -> None:
        if value not in self.choices:
            raise self.error(f" {value!r} is unknown; valid {self.noun}: {', '.join(self.choices)}")


@dataclass(frozen=True)
class Text(_Setting):
    """A string setting (a name or a path); ``optional``: None allowed. An empty string is never "not given"."""

    optional: bool = False
    meaning: str = ""
    flag: str | None = None
    name: str = dataclasses.field(default="", kw_only=True)

    def check(self, value: Any) -> None:
        if value is None and self.optional:
            return
        if not isinstance(value, str):
            raise self.error(f": expected {self.meaning or 'a string'}, got {value!r}")
        if not value.strip():
            hint = f"; leave {setting(self.name)} out for the default" if self.optional else ""
            raise self.error(f" is empty: expected {self.meaning or 'a value'}{hint}")
        if "\0" in value:
            raise self.error(f" {value!r} contains a NUL character")


@dataclass(frozen=True)
class Flag(_Setting):
    optional: bool = False
    flag: str | None = None
    name: str = dataclasses.field(default="", kw_only=True)

    def check(self, value: Any) -> None:
        if not (isinstance(value, bool) or (value is None and self.optional)):
            raise self.error(f": expected true or false, got {value!r}")


def check_settings(values: Mapping[str, Any], table: Mapping[str, Number | Choice | Text | Flag] | None = None) -> None:
    """Check the settings in ``values`` (all or some of a table's fields; Any: values as given, not yet checked);
    the first bad one raises."""
    table = RUN_SETTINGS if table is None else table
    for name, value in values.items():
        if name in table:
            table[name].check(value)


OVERRIDES = setting("overrides")  # strategy settings: ``--set KEY=VALUE`` on the command line


def _check_overrides(overrides: Any) -> None:  # Any: as given, checked here
    if not isinstance(overrides, tuple) or not all(
        isinstance(kv, tuple) and len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in overrides
    ):
        raise ClbenchError(f"{OVERRIDES}: expected (key, value) string pairs, got {overrides!r}")
    for key, _ in overrides:
        if not key.strip():
            raise ClbenchError(f"{OVERRIDES} =VALUE has no key: expected KEY=VALUE, e.g. {OVERRIDES} epochs=5")


# ----------------------------------------------------------------------------------------------- the settings
@dataclass(frozen=True)
class Alias:
    """Another flag for one value of a setting (``--autocast`` = ``--precision bf16``)."""

    flag: str
    value: Any
    help: str


@dataclass(frozen=True)
class Cli:
    """How a :class:`RunConfig` field is spelt on the command line; :func:`add_run_flags` makes the flag from it,
    its type and its default. ``help`` may show the default as ``%(default)s``. The flag is ``--`` and the name with
    dashes, or the spelling the field's check declares (its ``flag``)."""

    help: str
    run_only: bool = False  # a `clbench run` flag only (`clbench sweep` declares its own spelling, or has none)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None  # refused by the parser itself (else by the field's check)
    off: str | None = None  # a bool on by default: its one flag, which turns it off (default: --NAME and --no-NAME)
    aliases: tuple[Alias, ...] = ()
    group: str | None = None  # the help section that lists the flag (None: the command's options)


_KEPT = object()  # run_field's ``omitted_at`` default: the field is always in a fingerprint it defines


def run_field(
    default: Any,
    check: Number | Choice | Text | Flag | None,
    cli: Cli | None,
    *,
    defining: bool = False,
    profile: bool = False,
    omitted_at: Any = _KEPT,
) -> Any:
    """A :class:`RunConfig` field with its check (type, range, choice; its name is the field's) and its flag
    (``cli=None``: none generated, the commands declare it). ``defining``: the field is in the run's fingerprint
    (:data:`DEFINING_FIELDS`: a checkpoint continues, and a sweep skips, only a run with the same ones);
    ``omitted_at``: a defining field added after records were written is left out of a fingerprint while it holds
    this value, so that an earlier run's fingerprint, which lacks it, still matches; ``profile``: a strategy's
    profile may set it (:data:`RUN_LEVEL_PROFILE_KEYS`; an explicit setting wins)."""
    marks = {"defining": defining, "profile": profile, "omitted_at": omitted_at}
    return dataclasses.field(default=default, metadata={"check": check, "cli": cli, **marks})


MAX_CLASSES = 1_000_000
ROUND_DEFAULT = "leave {s} out for the benchmark's split"


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one run, each declared once: its default, its check, its flag and help text
    (:func:`add_run_flags`). A new field is a new ``clbench run`` and ``clbench sweep`` flag with no other edit."""

    strategy: str = run_field(
        dataclasses.MISSING,
        Text(meaning="a strategy name (see `clbench list`)"),
        Cli("method to run (see `clbench list`); required unless --resume", run_only=True),
        defining=True,
    )
    bench: str = run_field(
        DEFAULT_BENCH,
        Text(meaning="a benchmark name (see `clbench list`)"),
        Cli("benchmark (default: %(default)s, embedded)", run_only=True),
        defining=True,
    )
    backbone: str | None = run_field(  # None: the benchmark's default
        None,
        Text(optional=True, meaning="a backbone name (see `clbench list`)"),
        Cli("backbone name (default: the benchmark's)"),
        defining=True,
    )
    weights: str = run_field(  # auto | offline | hub | random | PATH
        "auto",
        Text(meaning="auto, offline, hub, random or a weights file"),
        Cli(
            "auto | offline | hub | random | PATH to a safetensors/state-dict file (default: %(default)s). "
            "hub: the Hugging Face cache, else a download; the hub must answer within 10 s, and "
            "without network (or with HF_HUB_OFFLINE=1) only the cache is read"
        ),
        defining=True,
    )
    data_root: str | None = run_field(
        None,
        Text(optional=True, meaning="a data folder"),
        Cli("data folder for benchmarks that are not embedded", run_only=True),
    )
    init_cls: int | None = run_field(  # None: the benchmark's split
        None,
        Number(int, 1, MAX_CLASSES, optional=True, meaning="the classes in the first task", default_hint=ROUND_DEFAULT),
        Cli("classes in the first task (default: the benchmark's split)"),
        defining=True,
        profile=True,
    )
    increment: int | None = run_field(
        None,
        Number(int, 1, MAX_CLASSES, optional=True, meaning="the classes per later task", default_hint=ROUND_DEFAULT),
        Cli("classes per later task (default: the benchmark's split)"),
        defining=True,
        profile=True,
    )
    train_per_class: int | None = run_field(  # None: every training image (the profile's value where it sets one)
        None,
        Number(
            int,
            1,
            MAX_CLASSES,
            optional=True,
            meaning="the training images per class each task learns from",
            default_hint="leave {s} out to learn from every training image",
        ),
        Cli(
            "learn each task from the first K training images of each class only, a fixed subset that does not "
            "depend on the seed (default: every image; the ci profiles set it). The frozen features of every image "
            "are still computed and cached",
            metavar="K",
        ),
        defining=True,
        profile=True,
        omitted_at=None,
    )
    seed: int = run_field(  # PILOT's default seed; drives every RNG of the run
        1993,
        Number(int, 0, SEED_MAX, meaning="the run's seed"),
        Cli("seed of every RNG in the run (default: %(default)s)", run_only=True),
        defining=True,
    )
    class_order_seed: int = run_field(  # the literature's class order; separate from --seed on purpose
        1993,
        Number(int, 0, SEED_MAX, meaning="the class-order seed", default_hint="1993 is the literature's order"),
        Cli("seed of the class-order permutation (default: %(default)s, the literature's order)"),
        defining=True,
    )
    device: str = run_field(
        "auto",
        Choice(DEVICE_CHOICES, "devices"),
        Cli("default: %(default)s (GPU if present)", choices=DEVICE_CHOICES),
    )
    precision: str = run_field(  # for the frozen backbone (clbench.core.precision)
        "auto",
        Choice(PRECISION_CHOICES, "precisions"),
        Cli(
            "precision of the frozen backbone (default: %(default)s: bf16 only where the hardware runs it "
            "natively fast: AMX CPUs, AVX-512 BF16 CPUs where a short probe measures a gain, CUDA "
            "sm_80+; fp16 on older tensor-core GPUs; else fp32). `clbench doctor` shows the choice",
            choices=PRECISION_CHOICES,
            aliases=(
                Alias("--autocast", "bf16", "alias of --precision bf16"),
                Alias("--no-autocast", "fp32", "alias of --precision fp32"),
            ),
        ),
        defining=True,
    )
    scenario: str = run_field(
        "class",
        Choice(SCENARIO_CHOICES, "scenarios"),
        Cli(
            "class (default): each task brings new classes | domain: each task brings every class in a new domain "
            "of a benchmark with domains (`clbench list`); the tasks are then the domains"
        ),
        defining=True,
        omitted_at="class",
    )
    protocol: str = run_field(
        "per-sample",
        Choice(PROTOCOL_CHOICES, "protocols"),
        Cli("per-sample (default) | reference (a reference implementation's batch behaviour) | both"),
        defining=True,
    )
    profile: str | None = run_field(  # a strategy's named profile (e.g. "quick")
        None,
        Text(optional=True, meaning="a profile name"),
        Cli("a strategy's named profile, e.g. quick (see `clbench list`)"),
        defining=True,
    )
    # --set key=value on the strategy config (each command declares --set: a sweep's may name a strategy)
    overrides: tuple[tuple[str, str], ...] = run_field((), None, None, defining=True)
    out: str | None = run_field(  # run folder; None: runs/<strategy>-<bench>-s<seed>-<time>
        None,
        Text(optional=True, meaning="a run folder"),
        Cli("run folder (default: runs/<strategy>-<bench>-s<seed>-<time>)", run_only=True),
    )
    overwrite: bool = run_field(False, Flag(), Cli("replace a finished run in --out", run_only=True))
    img_size: int | None = run_field(  # None: the benchmark's input size
        None,
        Number(
            int,
            16,
            4096,
            optional=True,
            meaning="the network input size in pixels",
            default_hint="leave {s} out for the benchmark's size",
        ),
        Cli("network input size (default: the benchmark's)"),
        defining=True,
        profile=True,
    )
    normalize: bool | None = run_field(  # None: the benchmark's choice
        None,
        Flag(optional=True),
        Cli("apply the backbone's mean/std (default: the benchmark's choice)"),
        defining=True,
    )
    batch_size: int = run_field(  # feature-extraction / evaluation batch
        64,
        Number(int, 1, 65536, meaning="the feature-extraction batch"),
        Cli("feature-extraction batch (default: %(default)s)"),
    )
    feature_cache: bool = run_field(
        True, Flag(), Cli("recompute frozen features instead of using the on-disk cache", off="--no-feature-cache")
    )
    # Keep the first K classes of the class order only: a held-out class subset to tune on (clbench tune), whose
    # settings are then evaluated on every class. Defining: another benchmark's numbers.
    classes: int | None = run_field(
        None,
        Number(
            int,
            1,
            MAX_CLASSES,
            optional=True,
            meaning="the classes of the class order a run keeps",
            default_hint="leave {s} out for every class",
        ),
        Cli(
            "keep only the first K classes of the class order (--class-order-seed says which) and their images: a "
            "class subset to tune on. Default: every class",
            metavar="K",
        ),
        defining=True,
        omitted_at=None,
    )
    # Hold out this share of each class's training images (stratified, the same images for every method and seed:
    # clbench.run.validation), learn from the rest and evaluate on them instead of the test split, which a
    # validation run never reads. Defining: a validation run's numbers are not a test run's.
    validation: float | None = run_field(
        None,
        Number(
            float,
            0.0,
            0.9,
            optional=True,
            low_open=True,
            meaning="the share of each class's training images held out for validation",
            default_hint="leave {s} out to evaluate on the test split",
        ),
        Cli(
            "hold out this share of each class's training images (stratified, seeded from the data: the same "
            "images for every method and seed), learn from the rest and evaluate on them; the test split is never "
            "read. Default: evaluate on the test split",
            metavar="FRACTION",
        ),
        defining=True,
        omitted_at=None,
    )
    # How the strategy's settings were chosen (`clbench tune` writes it into chosen.yaml): a JSON file whose content
    # the record carries (RunRecord.tuning). Not defining: it says where the settings came from, not what they are.
    tuning: str | None = run_field(
        None,
        Text(optional=True, meaning="a tuning summary file (clbench tune writes one)"),
        Cli(
            "the tuning summary `clbench tune` wrote for these settings; the record carries it",
            run_only=True,
            metavar="FILE",
        ),
    )
    ignore_data_problems: bool = (
        run_field(  # run on data that `clbench data check` fails (the problems go in the record)
            False,
            Flag(),
            Cli(
                "run on data that `clbench data check` fails (symbolic link loops, train/test duplicates, "
                "empty or mislabelled files, ...); the problems are logged and written into the record. "
                "Default: refuse such data before anything loads"
            ),
        )
    )

    def __post_init__(self) -> None:
        check_settings({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, settings_of(type(self)))
        _check_overrides(self.overrides)


_SETTINGS: dict[type, dict[str, Number | Choice | Text | Flag]] = {}


def settings_of(cls: type) -> dict[str, Number | Choice | Text | Flag]:
    """Field name -> its check, for :class:`RunConfig` (or a subclass with more fields); computed once per class."""
    if cls not in _SETTINGS:
        _SETTINGS[cls] = {
            f.name: dataclasses.replace(f.metadata["check"], name=f.name)
            for f in dataclasses.fields(cls)
            if f.metadata.get("check") is not None
        }
    return _SETTINGS[cls]


RUN_SETTINGS = settings_of(RunConfig)


def default_of(name: str) -> Any:
    """The default of :class:`RunConfig` field ``name`` (for a flag another command spells its own way)."""
    return next(f.default for f in dataclasses.fields(RunConfig) if f.name == name)


def flag_fields(command: str, cls: type | None = None) -> list[str]:
    """The :class:`RunConfig` fields that ``clbench COMMAND`` (run or sweep) takes as generated flags, in order."""
    return [
        f.name
        for f in dataclasses.fields(cls or RunConfig)
        if (cli := _cli(f)) is not None and (command == "run" or not cli.run_only)
    ]


def _cli(f: dataclasses.Field[Any]) -> Cli | None:
    """The field's flag declaration; None: the commands declare its flag themselves."""
    if "cli" not in f.metadata:  # a field declared without metadata still gets its flag
        return Cli("")
    cli: Cli | None = f.metadata["cli"]
    return cli


def _flag_cli(f: dataclasses.Field[Any]) -> Cli:
    """The flag declaration of a field that :func:`flag_fields` lists (it has one)."""
    cli = _cli(f)
    if cli is None:
        raise ValueError(f"RunConfig field {f.name} has no generated flag")
    return cli


def add_run_flags(parser: Any, command: str, cls: type | None = None) -> None:
    """Add to the argparse ``parser`` of ``clbench COMMAND`` a flag per :class:`RunConfig` field it takes
    (:func:`flag_fields`): ``--`` and the name with dashes (or its check's ``flag``), typed from the field's
    annotation, its default the field's; a tuple field is a repeatable flag. Bad values are refused by the field's
    check when the RunConfig is built (the message names the flag). ``cls``: another declaration of the same kind
    (a subclass, or a command's own settings such as :class:`clbench.sweep.settings.Resources`)."""
    import argparse

    cls = cls or RunConfig
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = flag_fields(command, cls)
    for name in sorted(names, key=lambda n: not _flag_cli(fields[n]).run_only):  # the command's own settings first
        f, cli = fields[name], _flag_cli(fields[name])
        check = f.metadata.get("check")
        flag = (check.flag if check is not None else None) or "--" + name.replace("_", "-")
        default = None if f.default is dataclasses.MISSING else f.default
        typ = hints[name]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        base = args[0] if typing.get_origin(typ) in (typing.Union, types.UnionType) and len(args) == 1 else typ
        extra: dict[str, Any] = {"dest": name, "help": cli.help}
        if cli.metavar:
            extra["metavar"] = cli.metavar
        to = argument_group(parser, cli.group)
        if base is bool and (default is None or (default and cli.off is None)):
            to.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, **extra)
        elif base is bool and default:
            to.add_argument(cli.off or "--no-" + name.replace("_", "-"), action="store_false", **extra)
        elif base is bool:
            to.add_argument(flag, action="store_true", **extra)
        elif typing.get_origin(base) is tuple:  # repeatable: each use adds an item
            to.add_argument(flag, action="append", default=list(default or ()), **extra)
        else:
            kind = base if base in (int, float) else None
            to.add_argument(flag, type=kind, default=default, choices=cli.choices, **extra)
        for alias in cli.aliases:
            to.add_argument(alias.flag, dest=name, action="store_const", const=alias.value, help=alias.help)


def argument_group(parser: Any, title: str | None) -> Any:
    """The argparse group titled ``title`` of ``parser``, made on first use; None: the parser itself."""
    if title is None:
        return parser
    existing = [g for g in parser._action_groups if g.title == title]  # argparse lists its groups nowhere public
    return existing[0] if existing else parser.add_argument_group(title)


# ----------------------------------------------------------------------------------------------- same run?
# RunConfig fields that define what a run measures. ``precision`` is the request (auto | fp32 | bf16 | fp16); the
# precision it resolved to is checked separately (:func:`clbench.run.checkpoint.check_loaded_run`), since bf16 changes
# the frozen features. Not here: device, batch size, data root (the data itself is checked by content), output
# options.
def _marked(mark: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata.get(mark))


# What RunConfig's declaration marks (run_field): the defining settings, in declaration order; the run settings a
# profile may set; and the defining settings a fingerprint leaves out at one value (added after records were
# written: a record or checkpoint without ``scenario`` is a class-incremental run's, without ``train_per_class``
# one that learnt from every image).
DEFINING_FIELDS = _marked("defining")
RUN_LEVEL_PROFILE_KEYS = frozenset(_marked("profile"))
ADDED_LATER_DEFAULTS: dict[str, Any] = {
    f.name: f.metadata["omitted_at"]
    for f in dataclasses.fields(RunConfig)
    if f.metadata.get("omitted_at", _KEPT) is not _KEPT
}


# Defining settings of an earlier clbench that its records and sweep manifests still hold, with their JSON check:
# ``autocast`` (true/false) before ``--precision`` (bf16/fp32). A fingerprint with one reads (it differs from every
# current run's, whose ``precision`` it lacks).
RETIRED_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {"autocast": ("true or false", is_bool)}
OVERRIDES_JSON = "an object of strategy setting -> string"


def _json_check(name: str, annotation: Any) -> tuple[str, Callable[[Any], bool]]:
    """What defining field ``name`` (of type ``annotation``) is in a fingerprint's JSON, from its type alone (a
    value out of the field's range or choices still reads: a fingerprint is compared, not run)."""
    if name == "overrides":  # the --set pairs as a sorted object (the last value of a repeated key wins)
        return OVERRIDES_JSON, lambda v: isinstance(v, dict) and all(is_str(x) for x in v.values())
    kinds = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    base = next((k for k in kinds or (annotation,) if k is not type(None)), annotation)
    expected, ok = {
        str: (TEXT, is_str),
        int: ("an integer", is_int),
        bool: ("true or false", is_bool),
        float: ("a number", is_number),
    }[base]
    if type(None) in kinds:
        return f"{expected} or null", or_none(ok)
    return expected, ok


_HINTS = typing.get_type_hints(RunConfig)
# Each key a fingerprint may hold, in the order this clbench writes them, with what its JSON value must be.
FINGERPRINT_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{name: _json_check(name, _HINTS[name]) for name in DEFINING_FIELDS},
    **RETIRED_FIELDS,
}


class Fingerprint(Mapping[str, JsonValue]):
    """A run's fingerprint: the values of its defining settings (:data:`DEFINING_FIELDS`, the fields RunConfig marks
    ``defining``), the backbone resolved to its name and the ``--set`` pairs as a sorted object. Two runs with equal
    fingerprints measure the same thing: a checkpoint continues, a sweep skips, and a report groups, only a run with
    the same one. Immutable; read like a mapping (``fp["seed"]``).

    Written into records, checkpoints, sweep manifests and worker payloads as one JSON object (:meth:`to_json`), its
    keys in the order it was made or read in, so that a file read and written again is unchanged. A fingerprint of
    an earlier clbench may lack a defining setting (added since: a missing key reads as the value the field is left
    out at, :data:`ADDED_LATER_DEFAULTS`, else null, as it always did) or hold a retired one
    (:data:`RETIRED_FIELDS`). A key this clbench does not know (a newer clbench's setting) is kept, like the unknown
    keys of a record (:attr:`unknown`); it makes the fingerprint differ from every one this clbench makes."""

    __slots__ = ("_values",)
    _values: dict[str, JsonValue]

    def __init__(self, values: Mapping[str, Any]) -> None:  # Any: JSON values, checked (from_json, from_config)
        # a copy nobody else holds (a fingerprint's own read-only views as objects)
        copy = json.loads(json.dumps(dict(values), default=lambda v: dict(v) if isinstance(v, Mapping) else v))
        object.__setattr__(self, "_values", copy)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Fingerprint is immutable")

    @classmethod
    def from_config(cls, cfg: RunConfig, backbone: str) -> Fingerprint:
        """The defining settings of ``cfg`` in declaration order, ``backbone`` (its resolved name) for the backbone,
        and a field added later left out while it holds the value it is left out at (:func:`run_field`)."""
        values: dict[str, Any] = {}  # Any: a defining field's value, of that field's type
        for name in DEFINING_FIELDS:
            value = getattr(cfg, name)
            if name in ADDED_LATER_DEFAULTS and value == ADDED_LATER_DEFAULTS[name]:
                continue
            values[name] = {"backbone": backbone, "overrides": dict(sorted(dict(cfg.overrides).items()))}.get(
                name, value
            )
        return cls(values)

    @classmethod
    def json_problems(cls, data: Any) -> list[str]:  # Any: JSON as read, not yet checked
        """What keeps ``data`` from being a fingerprint's JSON, a line per key (``seed is str '7', expected an
        integer``); a key this clbench does not know is no problem (class docstring)."""
        return [
            f"{key} is {type(value).__name__} {short(value)}, expected {FINGERPRINT_KEYS[key][0]}"
            for key, value in data.items()
            if key in FINGERPRINT_KEYS and not FINGERPRINT_KEYS[key][1](value)
        ]

    @classmethod
    def from_json(cls, data: Any) -> Fingerprint:  # Any: JSON as read, checked here
        """The fingerprint a record, checkpoint, manifest or payload holds; a ClbenchError naming the first key
        with a value of the wrong type (a file's reader names it first, under the file's field:
        :func:`clbench.files.typedfile.problems`)."""
        problem: str | None = f"field fingerprint is {type(data).__name__} {short(data)}, expected {OBJECT}"
        if isinstance(data, dict) and all(isinstance(k, str) for k in data):
            problem = next((f"field fingerprint.{p}" for p in cls.json_problems(data)), None)
        if problem is not None:
            raise ClbenchError(f"a run's settings fingerprint this clbench cannot read: {problem}")
        return cls(data)

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON object, keys in this fingerprint's order (a fresh copy)."""
        out: dict[str, JsonValue] = json.loads(json.dumps(self._values))
        return out

    def digest(self) -> str:
        """A short digest (as ``clbench sweep --dry-run`` lists it): equal digests, equal fingerprints; the key order
        does not count."""
        return hashlib.sha256(json.dumps(self._values, sort_keys=True).encode()).hexdigest()[:12]

    def differences(self, current: Mapping[str, object], there: str = "in the checkpoint") -> list[str]:
        """``"seed: 1993 in the checkpoint, 1 here"`` for every defining setting that differs between this saved
        fingerprint and ``current`` (``there``: where this one comes from). Keys this clbench does not know are not
        compared here (:attr:`unknown`)."""
        return _differences(self, current, there)

    @property
    def unknown(self) -> tuple[str, ...]:
        """The keys this clbench does not know: settings of a newer clbench."""
        return tuple(key for key in self._values if key not in FINGERPRINT_KEYS)

    def __getitem__(self, key: str) -> JsonValue:
        value = self._values[key]
        return types.MappingProxyType(value) if isinstance(value, dict) else value  # read-only, as the whole

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Fingerprint):
            return self._values == other._values  # order-free, as two JSON objects compare
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return f"Fingerprint({self._values!r})"


def _show(value: object) -> str:
    if isinstance(value, Mapping):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return "default" if value is None else str(value)


def _differences(
    saved: Mapping[str, object], current: Mapping[str, object], there: str = "in the checkpoint"
) -> list[str]:
    """``"seed: 1993 in the checkpoint, 1 here"`` for every defining setting that differs (``there``: where
    ``saved`` comes from); a missing key reads as the value the field is left out at (else None)."""
    out = []
    for key in DEFINING_FIELDS:
        old, new = (d.get(key, ADDED_LATER_DEFAULTS.get(key)) for d in (saved, current))
        if old != new:
            out.append(f"{setting(key)}: {_show(old)} {there}, {_show(new)} here")
    return out


# ----------------------------------------------------------------------------------------------- resume
RESUME_AND_OVERWRITE = (
    f"{setting('resume')} continues a run and {setting('overwrite')} starts it over: pass only one of them"
)


def given_settings(values: dict[str, Any]) -> dict[str, Any]:
    """The settings in ``values`` that differ from :class:`RunConfig`'s defaults: what a user asked for when
    continuing a run (a setting left at its default counts as not given). Checked as a fresh run's would be.
    (Any: RunConfig field name -> a value of any field's type, as given.)"""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
    given = {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}
    given = {k: v for k, v in given.items() if not (k == "strategy" and v is None)}
    check_settings(given)
    return given


def check_resume_request(run_dir: Path, given: dict[str, Any]) -> None:
    """Settings that cannot go with continuing the run in ``run_dir``: overwriting it, or another run folder."""
    if given.get("overwrite"):
        raise ClbenchError(RESUME_AND_OVERWRITE)
    if given.get("out") is not None and Path(given["out"]).resolve() != Path(run_dir).resolve():
        raise ClbenchError(
            f"{setting('resume')} {run_dir} and {setting('out')} {given['out']} name different run folders",
            f"drop {setting('out')}: {setting('resume')} writes to the folder it continues",
        )


def resume_config(
    run_dir: Path, saved_config: Mapping[str, JsonValue], saved_fingerprint: Fingerprint, given: dict[str, Any]
) -> RunConfig:
    """The RunConfig that continues the run in ``run_dir``, started with ``saved_config`` and ``saved_fingerprint``
    (its checkpoint's). This is the one place a resumed run's settings are decided.

    ``given`` holds the settings the user passed explicitly (:func:`given_settings`). A defining setting given with
    another value than the checkpoint's is refused; the others (device, batch size, data root, feature cache) may
    change on resume."""
    check_resume_request(run_dir, given)
    asked = {k: v for k, v in given.items() if k in DEFINING_FIELDS}
    if "overrides" in asked:
        asked["overrides"] = dict(sorted(dict(asked["overrides"]).items()))
    diff = saved_fingerprint.differences({**saved_fingerprint, **asked})
    if diff:
        raise ClbenchError(
            f"{setting('resume')} {run_dir}: the run was started with other settings ({'; '.join(diff)})",
            f"drop those settings to continue it as it was started, or start a new run with another {setting('out')}",
        )
    names = {f.name for f in dataclasses.fields(RunConfig)}
    # Any: the checkpoint's JSON values and the given settings, checked by RunConfig (naming the setting)

    # a safety opt-in the run was started with is not taken from its checkpoint: only from this command line
    values: dict[str, Any] = {
        k: v for k, v in saved_config.items() if k in names and k.replace("_", "-") not in COMMAND_LINE_ONLY
    }
    values.update({k: v for k, v in given.items() if k in names and k not in DEFINING_FIELDS})
    pairs: Any = saved_config.get("overrides", ())  # Any: [[key, value], ...] as saved, checked by RunConfig
    values.update(out=str(run_dir), overwrite=False, overrides=tuple(tuple(kv) for kv in pairs))
    return RunConfig(**values)


# ----------------------------------------------------------------------------------------------- --set
def _convert(value: str, typ: Any, key: str) -> Any:  # Any: typ is any field annotation, the result of that type
    origin = typing.get_origin(typ)
    if typ is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ClbenchError(f"{OVERRIDES} {key}={value}: expected true or false")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value.lower() == "none" and len(args) < len(typing.get_args(typ)):
            return None
        typ = args[0]
    if typing.get_origin(typ) is typing.Literal:
        allowed = typing.get_args(typ)
        if value not in allowed:
            raise ClbenchError(f"{OVERRIDES} {key}={value}: expected one of {', '.join(map(str, allowed))}")
        return value
    try:
        converted = typ(value)
    except (TypeError, ValueError, OverflowError):
        name = getattr(typ, "__name__", typ)
        raise ClbenchError(f"{OVERRIDES} {key}={value}: expected a value of type {name}") from None
    if isinstance(converted, float) and not math.isfinite(converted):
        raise ClbenchError(f"{OVERRIDES} {key}={value}: expected a finite number")
    return converted


def make_strategy_config(
    strategy_cls: HasSettings, profile: str | None, overrides: tuple[tuple[str, str], ...]
) -> DataclassInstance:
    """The strategy's config dataclass with a named profile and ``--set`` overrides applied and validated."""
    config_cls = strategy_cls.Config
    hints = typing.get_type_hints(config_cls)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    values: dict[str, Any] = {}
    if profile is not None:
        if profile not in strategy_cls.profiles:
            valid = ", ".join(strategy_cls.profiles) or "none"
            raise ClbenchError(f"strategy {strategy_cls.name} has no profile {profile!r}; valid profiles: {valid}")
        values.update({k: v for k, v in strategy_cls.profiles[profile].items() if k not in RUN_LEVEL_PROFILE_KEYS})
    for key, value in overrides:
        if key in RUN_LEVEL_PROFILE_KEYS:  # a run setting given as a strategy setting (train_per_class was one)
            raise ClbenchError(
                f"{OVERRIDES} {key}={value}: {key} is a run setting, not a setting of {strategy_cls.name}",
                f"give {setting(key)} {value} instead",
            )
        if key not in fields:
            import difflib

            close = difflib.get_close_matches(key, sorted(fields), n=1)
            raise ClbenchError(
                f"{OVERRIDES} {key}: {strategy_cls.name} has no setting {key!r}; valid keys: "
                f"{', '.join(sorted(fields)) or 'none'}",
                f"did you mean {close[0]!r}?" if close else None,
            )
        values[key] = _convert(value, hints[key], key)
    try:
        return config_cls(**values)
    except (ValueError, TypeError, OverflowError) as e:
        raise ClbenchError(f"invalid {strategy_cls.name} setting: {e}") from None
