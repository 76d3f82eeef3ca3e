"""Frozen timm backbones: the wrapper every strategy sees, and :func:`load_backbone`.

The feature every method uses is the final [CLS] token after the last LayerNorm (timm's
``forward_head(forward_features(x), pre_logits=True)``); for a CNN it is the pooled feature. Where the weights come
from (``--weights``) is :mod:`clbench.weights.resolve`. The digest recorded in results is the SHA-256 of the loaded
backbone's state (keys, shapes and bytes), so it identifies what actually ran whatever the source.

Built on first use (:class:`LazyBackbone`): a run whose features are all cached and whose strategy never enters the
backbone (SimpleCIL, the closed-form heads, TOSCA's frozen path) needs of it only what it is (digest, width, input
size, mean/std, parameter count), not the ViT itself, whose import (timm, torchvision's models) and build take
seconds. What a backbone is, is kept in ``<cache>/machine/backbone-facts.json`` under the identity of its weights
file (the offline source's SHA-256, or a file's path, size and mtime) and the timm/torch versions; the first
attribute a strategy or the harness needs beyond those facts builds it, and the build checks that its state digest
is the one the facts gave (a mismatch is an error, never a run on features of other weights). Sources without a
file (``random``, ``hub``) are built at once, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clbench.core.catalog import BACKBONES, BackboneSpec
from clbench.core.config import WEIGHT_SOURCES
from clbench.errors import ClbenchError
from clbench.files.atomic import cache_subdir
from clbench.weights.sources import WeightsUnavailable, file_identity, offline_weights

FACTS_FILE = "backbone-facts.json"


def state_digest(module: nn.Module) -> str:
    """SHA-256 over (key, shape, bytes) of every tensor of ``module``'s state dict."""
    h = hashlib.sha256()
    for key, t in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class FrozenBackbone(nn.Module):
    """A timm model in eval mode with all parameters frozen; ``forward`` returns pre-logits features (B, d)."""

    def __init__(self, model: nn.Module, spec: BackboneSpec, weights_source: str, img_size: int) -> None:
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.spec = spec
        self.weights_source = weights_source
        self.img_size = img_size
        self.num_features: int = int(model.num_features)
        cfg = model.pretrained_cfg
        self.mean: tuple[float, ...] = tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
        self.std: tuple[float, ...] = tuple(cfg.get("std", (0.229, 0.224, 0.225)))
        self.digest = state_digest(self.model)

    @property
    def is_vit(self) -> bool:
        return self.spec.family == "vit"

    def train(self, mode: bool = True) -> FrozenBackbone:
        # Frozen means frozen: dropout/drop-path/BN statistics never switch to training behaviour.
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, d)
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


@dataclass(frozen=True)
class BackboneFacts:
    """What a run needs of a backbone without building it; :meth:`of` reads them off a built one."""

    digest: str
    weights_source: str
    img_size: int
    num_features: int
    n_params: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    vit_geometry: tuple[int, int, int, int] | None  # (patch h, patch w, heads, prefix tokens) for batch_bytes

    @classmethod
    def of(cls, backbone: FrozenBackbone) -> BackboneFacts:
        return cls(
            backbone.digest,
            backbone.weights_source,
            int(backbone.img_size),
            int(backbone.num_features),
            int(backbone.n_params()),
            tuple(float(m) for m in backbone.mean),
            tuple(float(s) for s in backbone.std),
            vit_geometry(backbone.model),
        )

    @classmethod
    def from_json(cls, obj: Any) -> BackboneFacts | None:
        """The facts in ``obj`` (as :func:`dataclasses.asdict` wrote them), or None where they are not."""
        try:
            geometry = obj["vit_geometry"]
            return cls(
                str(obj["digest"]),
                str(obj["weights_source"]),
                int(obj["img_size"]),
                int(obj["num_features"]),
                int(obj["n_params"]),
                tuple(float(m) for m in obj["mean"]),
                tuple(float(s) for s in obj["std"]),
                None if geometry is None else (int(geometry[0]), int(geometry[1]), int(geometry[2]), int(geometry[3])),
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None


def vit_geometry(model: Any) -> tuple[int, int, int, int] | None:
    """(patch height, patch width, attention heads, prefix tokens) of a timm ViT, else None."""
    try:
        patch, heads = model.patch_embed.patch_size, model.blocks[0].attn.num_heads
        return int(patch[0]), int(patch[1]), int(heads), int(getattr(model, "num_prefix_tokens", 1))
    except (AttributeError, TypeError, IndexError, ValueError):
        return None


class LazyBackbone(FrozenBackbone):
    """A :class:`FrozenBackbone` built on first use: its facts (:class:`BackboneFacts`), ``spec`` and ``built``
    answer without building; any other attribute (``model``, ``forward``, ``parameters``, ``to``, calling it)
    builds it first, on the device it was given, and checks its state digest against the facts'."""

    _FACTS = frozenset(
        {"spec", "weights_source", "img_size", "num_features", "mean", "std", "digest", "is_vit", "n_params"}
        | {"built", "vit_geometry"}
    )

    def __init__(self, facts: BackboneFacts, spec: BackboneSpec, build: Callable[[], FrozenBackbone], device: Any):
        nn.Module.__init__(self)
        d = self.__dict__
        d.update(spec=spec, weights_source=facts.weights_source, img_size=facts.img_size, digest=facts.digest)
        d.update(num_features=facts.num_features, mean=facts.mean, std=facts.std, vit_geometry=facts.vit_geometry)
        d.update(_lazy_facts=facts, _lazy_build=build, _lazy_device=device, _lazy_built=False)

    @property
    def built(self) -> bool:
        return bool(self.__dict__["_lazy_built"])

    def n_params(self) -> int:
        return self.__dict__["_lazy_facts"].n_params if not self.built else super().n_params()

    def _build_now(self) -> None:
        d = self.__dict__
        d["_lazy_built"] = True  # from here every attribute is the plain module's
        try:
            # A build mid-run (timm's initialisation before the weights load) must draw nothing from the run's
            # global RNG: a run whose ViT was built at the start and one that built it on first use stay identical.
            # The first use is often the feature extraction, under torch.inference_mode(): weights built there would
            # be inference tensors, which no later training through the ViT (a first session, adapters, prompts,
            # fine-tuning) may save for backward. They are built as ordinary tensors wherever the first use is.
            with torch.random.fork_rng(devices=[]), torch.inference_mode(False):
                real = d["_lazy_build"]()
                model = real.model.to(d["_lazy_device"]) if d["_lazy_device"] is not None else real.model
        except BaseException:
            d["_lazy_built"] = False
            raise
        if real.digest != self.digest:
            d["_lazy_built"] = False
            raise ClbenchError(
                f"backbone {self.spec.name}: its weights give state digest {real.digest[:12]}, but the cached facts "
                f"of this weights file say {self.digest[:12]} (the file changed without changing its size and time, "
                "or the facts were edited)",
                f"delete {d['_lazy_where']} and run again" if "_lazy_where" in d else "run again",
            )
        self.model = model
        self.num_features, self.mean, self.std = real.num_features, real.mean, real.std

    def __getattribute__(self, name: str) -> Any:
        if name in LazyBackbone._FACTS or name.startswith("_lazy") or name in ("__dict__", "__class__", "_build_now"):
            return object.__getattribute__(self, name)
        d = object.__getattribute__(self, "__dict__")
        if not d.get("_lazy_built", True):  # (True while nn.Module.__init__ runs)
            object.__getattribute__(self, "_build_now")()
        return super().__getattribute__(name)

    def __repr__(self) -> str:
        return super().__repr__() if self.built else f"LazyBackbone({self.spec.name}, not built yet)"


def _facts_key(name: str, weights: str, img_size: int | None) -> str | None:
    """The facts-cache key of a backbone from a weights file (what the weights file is, and what builds the
    model), or None for sources without one (random, hub), which are built at once."""
    from importlib import metadata

    spec = BACKBONES.get(name)
    if weights == "random" or (spec.random_only and weights == "auto"):
        return None
    if weights in ("auto", "offline") and spec.offline:
        try:
            path, sha = offline_weights(spec.offline)
        except (WeightsUnavailable, ClbenchError):
            return None  # the build reports why, in its own words
        file: dict[str, Any] = {"offline": spec.offline, "sha256": sha}
    elif weights in WEIGHT_SOURCES:  # hub (or auto without an offline source): no file of ours to identify
        return None
    else:
        try:
            file = file_identity(Path(os.path.expanduser(weights)))
        except OSError:
            return None
    versions = {}
    for dist in ("timm", "torch"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "?"
    fields = {"backbone": name, "timm_name": spec.timm_name, "timm_kwargs": repr(sorted(spec.timm_kwargs.items()))}
    fields.update(weights=weights, img_size=img_size, file=file, versions=versions)
    return json.dumps(fields, sort_keys=True)


def load_backbone(
    name: str,
    weights: str = "auto",
    img_size: int | None = None,
    seed: int = 0,
    device: Any = None,
    lazy: bool = False,
    cache_root: Path | None = None,
) -> FrozenBackbone:
    """Build backbone ``name`` with weights from ``weights`` (:mod:`clbench.weights.resolve`), frozen, on
    ``device`` (None: where it is made). ``lazy`` with ``cache_root`` (the clbench cache): a :class:`LazyBackbone`
    where the facts of these weights are cached, else built now and its facts cached for the next run."""
    # deferred: loads numpy, which importing this module does not
    from clbench.features.cache import read_private_json, write_private_json

    def build() -> FrozenBackbone:
        # looked up at call time: tests replace it on its module
        from clbench.weights.resolve import load_model

        model, spec, source, size = load_model(name, weights, img_size, seed)
        backbone = FrozenBackbone(model, spec, source, size)
        return backbone.to(device) if device is not None else backbone

    key = _facts_key(name, weights, img_size) if lazy and cache_root is not None else None
    if key is None or cache_root is None:
        return build()

    path = cache_subdir("machine", create=False, root=cache_root) / FACTS_FILE  # a link there: refused
    known = read_private_json(path)
    facts = BackboneFacts.from_json(known.get(key))
    if facts is not None:
        lazy_backbone = LazyBackbone(facts, BACKBONES.get(name), build, device)
        lazy_backbone.__dict__["_lazy_where"] = str(path)
        return lazy_backbone
    backbone = build()
    write_private_json(path, {**known, key: asdict(BackboneFacts.of(backbone))})
    return backbone
