"""Saved state that cannot carry code: plain data as a JSON tree, tensors by name (for a safetensors file).

:func:`encode` turns a value made of plain data, tensors, numpy arrays and instances of *allowed* classes into a
:class:`SavedState`; :func:`decode` turns it back. Reading runs no code from the file: the tree is JSON, tensors are
raw bytes with a dtype and shape, and an object is rebuilt only as an instance of a class the *reader* passes in
(``types``, looked up by name in that mapping; nothing is imported). An object's ``__init__`` is not called: it is
made with ``cls.__new__`` and given back its saved attributes (a module also its parameters, buffers and
sub-modules), as :mod:`pickle` does, but from data alone.

The tree (JSON values are themselves; a JSON object is a ``str``-keyed dict unless it holds a key starting with
``$``, its tag)::

    {"$float": "nan" | "inf" | "-inf"}                   a non-finite float
    {"$tuple": [...]}                                    a tuple
    {"$items": [[key, value], ...]}                      a dict with keys that are not plain strings
    {"$tensor": name, "device": "cpu" | "run", "grad": bool, "param": bool[, "stride": [...]]}
    {"$ndarray": name, "dtype": "<f4", "shape": [...]}   bytes in a uint8 tensor
    {"$npscalar": "<f8", "value": v}                     a numpy scalar
    {"$generator": name, "device": "cpu" | "run"}        a torch.Generator, its state a uint8 tensor
    {"$dtype": "float32"}  {"$size": [...]}              a torch.dtype, a torch.Size
    {"$module": class name, "id": k, "training": bool, "params": {...}, "buffers": {...}, "persistent": [...],
     "modules": {...}, "attrs": {...}}                   an nn.Module of an allowed class
    {"$object": class name, "id": k, "attrs": {...}}     an instance of an allowed class (a dataclass, say)
    {"$ref": k}                                          the object (module) saved earlier with id k
    {"$context": name}                                   an object of the reader's own (``shared``): the frozen
                                                         backbone, never copied into the file

Tensors on the CPU come back on the CPU; tensors that were elsewhere (``"run"``) come back on the reader's device.
A tensor referenced twice (the same object) is saved once and comes back as one object; so do modules and objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

TAG = "$"
MAX_DEPTH = 200  # nesting of a saved value; far beyond any strategy's (module in list in module ...)
_DTYPE_KINDS = "biufc"  # numpy dtypes a file may name: bool, integers, floats, complex (never object or void)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # training, _parameters, _buffers, _modules, hook dicts, ...
_HOOKS = frozenset(k for k in _MODULE_INTERNALS if "hook" in k)
# torch.nn classes any state may hold besides those a strategy declares: containers and parameter-free layers
# (their state is data; rebuilding them runs no __init__).
TORCH_TYPES: tuple[type, ...] = (
    nn.ModuleList,
    nn.ModuleDict,
    nn.Sequential,
    nn.ParameterList,
    nn.ParameterDict,
    nn.Linear,
    nn.LayerNorm,
    nn.Embedding,
    nn.Dropout,
    nn.Identity,
    nn.GELU,
    nn.ReLU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
)


# Classes that moved: {the qualified name an earlier clbench wrote into checkpoints: the name of the class now}.
# A saved state naming an old name is read as the new one (the reader still decides whether it allows the class).
# Entries stay for good: a checkpoint written before the move must keep loading. (An old pickle checkpoint, converted
# with --trust-checkpoint, finds these classes through the method modules, which import them under the old names.)
MOVED_TYPES: dict[str, str] = {
    "baselines.ease.Adapter": "clbench.layers.adapters.Adapter",  # shared layers, issue #22
    "baselines.ease.AdapterSet": "clbench.layers.adapters.AdapterSet",
    "baselines.l2p.LinearHead": "clbench.layers.heads.LinearHead",
    "baselines.aper.AdaptedFeatures": "clbench.layers.first_session.AdaptedFeatures",
    "baselines.slca.TaskHeads": "clbench.layers.slow_learner.TaskHeads",  # SLCA's and CoFiMA's heads, held once
    "baselines.cofima.CoFiMAHeads": "clbench.layers.slow_learner.TaskHeads",
}


def current_name(name: Any) -> Any:
    """The class name to look up for ``name`` read from a file: its new name if it moved (:data:`MOVED_TYPES`)."""
    return MOVED_TYPES.get(name, name) if type(name) is str else name


class StateError(ValueError):
    """A saved state that cannot be decoded (tampered, truncated, or naming a class the reader does not allow)."""


@dataclass(frozen=True)
class ContextRef:
    """In a saved state: "this value is the reader's ``shared[name]``" (e.g. the frozen backbone)."""

    name: str


@dataclass
class SavedState:
    """A value as JSON (``tree``) plus the tensors it names."""

    tree: Any
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def allowed(types: Iterable[type]) -> dict[str, type]:
    """``{qualified name: class}`` for :data:`TORCH_TYPES` and ``types``: what :func:`decode` may rebuild."""
    return {type_name(t): t for t in (*TORCH_TYPES, *types)}


# ----------------------------------------------------------------------------------------------- encode
def encode(
    value: Any, types: Mapping[str, type], shared: Mapping[int, str] | None = None, prefix: str = ""
) -> SavedState:
    """``value`` as a :class:`SavedState`. ``types``: classes whose instances may be saved (:func:`allowed`);
    ``shared``: ``id(object) -> name`` of objects saved as a reference only. Tensor names start with ``prefix``.
    Raises TypeError naming the first value that cannot be saved and where it sits."""
    enc = _Encoder(types, shared or {}, prefix)
    tree = enc.encode(value, "self", 0)
    return SavedState(tree, enc.tensors)


class _Encoder:
    def __init__(self, types: Mapping[str, type], shared: Mapping[int, str], prefix: str) -> None:
        self.names = {cls: name for name, cls in types.items()}
        self.shared, self.prefix = shared, prefix
        self.tensors: dict[str, torch.Tensor] = {}
        self.tensor_names: dict[int, str] = {}  # id(tensor) -> its name: saved once
        self.objects: dict[int, int] = {}  # id(object) -> its id in the tree
        self.alive: list[Any] = []  # every object given a name, so that no id is reused while encoding

    def encode(self, value: Any, where: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise TypeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
        if id(value) in self.shared:
            return {"$context": self.shared[id(value)]}
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if kind is list:
            return [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if kind is tuple:
            return {"$tuple": [self.encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]}
        if kind is dict:
            if all(type(k) is str and not k.startswith(TAG) for k in value):
                return {k: self.encode(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
            return {
                "$items": [
                    [self.encode(k, f"{where} key", depth + 1), self.encode(v, f"{where}[{k!r}]", depth + 1)]
                    for k, v in value.items()
                ]
            }
        if kind is ContextRef:
            return {"$context": value.name}
        if kind in (torch.Tensor, nn.Parameter):
            return self.tensor(value, where)
        if kind is np.ndarray:
            return self.ndarray(value, where)
        if isinstance(value, np.generic) and value.dtype.kind in _DTYPE_KINDS:
            return {"$npscalar": value.dtype.str, "value": self.encode(value.item(), where, depth + 1)}
        if kind is torch.Generator:
            name = self.name_for(value, value.get_state())
            return {"$generator": name, "device": _device_tag(value.device)}
        if kind is torch.dtype:
            return {"$dtype": str(value).removeprefix("torch.")}
        if kind is torch.Size:
            return {"$size": list(value)}
        if kind not in self.names:
            raise TypeError(
                f"{where} is a {type_name(kind)}, which a checkpoint cannot hold: keep state in tensors, modules, "
                "plain data (numbers, strings, lists, dicts) and classes the strategy lists in state_types"
            )
        if id(value) in self.objects:
            return {"$ref": self.objects[id(value)]}
        self.objects[id(value)] = len(self.objects)
        self.alive.append(value)
        if isinstance(value, nn.Module):
            return self.module(value, where, depth)
        try:
            attrs = vars(value)
        except TypeError:
            raise TypeError(f"{where} is a {type_name(kind)} without a __dict__ (slots); it cannot be saved") from None
        return {
            "$object": self.names[kind],
            "id": self.objects[id(value)],
            "attrs": {k: self.encode(v, f"{where}.{k}", depth + 1) for k, v in attrs.items()},
        }

    def module(self, m: nn.Module, where: str, depth: int) -> dict[str, Any]:
        hooks = [k for k in _HOOKS if getattr(m, k, None)]
        if hooks:
            raise TypeError(f"{where} ({type_name(type(m))}) has hooks registered ({', '.join(hooks)}); remove them")
        d = depth + 1
        return {
            "$module": self.names[type(m)],
            "id": self.objects[id(m)],
            "training": m.training,
            "params": {k: self.encode(p, f"{where}.{k}", d) for k, p in m._parameters.items()},
            "buffers": {k: self.encode(b, f"{where}.{k}", d) for k, b in m._buffers.items()},
            "persistent": [k for k in m._buffers if k not in m._non_persistent_buffers_set],
            "modules": {k: self.encode(c, f"{where}.{k}", d) for k, c in m._modules.items()},
            "attrs": {k: self.encode(v, f"{where}.{k}", d) for k, v in vars(m).items() if k not in _MODULE_INTERNALS},
        }

    def name_for(self, owner: Any, data: torch.Tensor) -> str:
        if id(owner) not in self.tensor_names:
            name = f"{self.prefix}{len(self.tensor_names)}"
            self.tensor_names[id(owner)] = name
            self.alive.append(owner)
            self.tensors[name] = data.detach().to("cpu", copy=True).contiguous()
        return self.tensor_names[id(owner)]

    def tensor(self, t: torch.Tensor, where: str) -> dict[str, Any]:
        if t.layout != torch.strided or t.is_quantized or t.is_complex():
            raise TypeError(f"{where} is a {t.layout} / {t.dtype} tensor; only dense real tensors can be saved")
        node: dict[str, Any] = {
            "$tensor": self.name_for(t, t),
            "device": _device_tag(t.device),
            "grad": bool(t.requires_grad),
            "param": type(t) is nn.Parameter,
        }
        if not t.is_contiguous() and _dense(list(t.shape), list(t.stride())):
            node["stride"] = list(t.stride())  # a transposed weight stays transposed: the same kernels, bit for bit
        return node

    def ndarray(self, a: np.ndarray, where: str) -> dict[str, Any]:
        if a.dtype.kind not in _DTYPE_KINDS:
            raise TypeError(f"{where} is a numpy array of {a.dtype}; only numeric arrays can be saved")
        raw = torch.frombuffer(bytearray(np.ascontiguousarray(a).tobytes()), dtype=torch.uint8)
        return {"$ndarray": self.name_for(a, raw), "dtype": a.dtype.str, "shape": list(a.shape)}


def _device_tag(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else "run"


def _dense(shape: list[int], stride: list[int]) -> bool:
    """Whether ``stride`` lays ``shape`` out over exactly its elements (a permutation of a contiguous layout)."""
    if len(shape) != len(stride) or any(type(s) is not int or s < 0 for s in (*shape, *stride)):
        return False
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda p: p[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True


# ----------------------------------------------------------------------------------------------- decode
def unknown_classes(saved: SavedState, types: Mapping[str, type]) -> list[str]:
    """The class names ``saved`` asks to rebuild that are not in ``types``: a quick check before :func:`decode`,
    which would refuse them as well."""
    names, stack = set(), [saved.tree]
    while stack:
        node = stack.pop()
        if type(node) is list:
            stack.extend(node)
        elif type(node) is dict:
            for tag in ("$module", "$object"):
                if tag in node and current_name(node[tag]) not in types:
                    names.add(str(node[tag])[:200])
            stack.extend(node.values())
    return sorted(names)


def decode(
    saved: SavedState,
    types: Mapping[str, type],
    shared: Mapping[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> Any:
    """The value ``saved`` holds. ``types``: the classes it may name (:func:`allowed`); ``shared``: the objects
    ``{"$context": name}`` stands for; ``device``: where tensors saved off the CPU go. Raises :class:`StateError`."""
    try:
        return _Decoder(saved.tensors, types, shared or {}, torch.device(device)).decode(saved.tree, 0)
    except RecursionError:
        raise StateError("the saved state is nested too deeply") from None


class _Decoder:
    def __init__(
        self, tensors: Mapping[str, torch.Tensor], types: Mapping[str, type], shared: Mapping[str, Any], device
    ) -> None:
        self.tensors, self.types, self.shared, self.device = tensors, types, shared, device
        self.memo: dict[tuple[str, Any], Any] = {}  # ("tensor", name) / ("object", id) -> the value made

    def decode(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateError(f"the saved state is nested more than {MAX_DEPTH} levels deep")
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [self.decode(v, depth + 1) for v in node]
        if type(node) is not dict:
            raise StateError(f"a {type(node).__name__} is not a saved value")
        tags = [k for k in node if k.startswith(TAG)]
        if not tags:
            return {k: self.decode(v, depth + 1) for k, v in node.items()}
        if len(tags) != 1:
            raise StateError(f"a saved value has several tags ({', '.join(tags)})")
        tag = tags[0]
        arg = node[tag]
        if tag == "$float":
            if arg not in ("nan", "inf", "-inf"):
                raise StateError(f"{arg!r} is not a non-finite float")
            return float(arg)
        if tag == "$tuple":
            return tuple(self.decode(v, depth + 1) for v in _typed(arg, list, tag))
        if tag == "$items":
            out = {}
            for pair in _typed(arg, list, tag):
                if type(pair) is not list or len(pair) != 2:
                    raise StateError("a dict item is not a [key, value] pair")
                key = self.decode(pair[0], depth + 1)
                try:
                    out[key] = self.decode(pair[1], depth + 1)
                except TypeError:
                    raise StateError(f"a dict key of type {type(key).__name__} cannot be hashed") from None
            return out
        if tag == "$tensor":
            return self.tensor(node)
        if tag == "$ndarray":
            return self.ndarray(node)
        if tag == "$npscalar":
            value = self.decode(node.get("value"), depth + 1)
            try:
                return _np_dtype(arg).type(value)
            except (TypeError, ValueError, OverflowError) as e:
                raise StateError(f"{value!r:.50} is not a {arg}: {e}") from None
        if tag == "$generator":
            return self.generator(node)
        if tag == "$dtype":
            dtype = getattr(torch, _typed(arg, str, tag), None)
            if not isinstance(dtype, torch.dtype):
                raise StateError(f"{arg!r} is not a torch dtype")
            return dtype
        if tag == "$size":
            return torch.Size([_typed(s, int, tag) for s in _typed(arg, list, tag)])
        if tag == "$context":
            if arg not in self.shared:
                raise StateError(f"the saved state refers to {arg!r}, which this run does not have")
            return self.shared[arg]
        if tag == "$ref":
            if ("object", arg) not in self.memo:
                raise StateError(f"a reference to object {arg!r}, which is not saved before it")
            return self.memo["object", arg]
        if tag in ("$module", "$object"):
            return self.instance(node, tag, depth)
        raise StateError(f"unknown tag {tag!r}")

    def _tensor_data(self, name: Any) -> torch.Tensor:
        if type(name) is not str or name not in self.tensors:
            raise StateError(f"the saved state names a tensor {name!r} that the file does not hold")
        return self.tensors[name]

    def tensor(self, node: dict[str, Any]) -> torch.Tensor:
        name = node["$tensor"]
        if ("tensor", name) in self.memo:
            return self.memo["tensor", name]
        data = self._tensor_data(name)
        stride = node.get("stride")
        if stride is not None:
            if not _dense(list(data.shape), stride if type(stride) is list else []):
                raise StateError(f"tensor {name}: stride {stride!r} does not lay out shape {list(data.shape)}")
            data = torch.empty_strided(data.shape, stride, dtype=data.dtype).copy_(data)
        if node.get("device") != "cpu":
            data = data.to(self.device)
        grad = bool(node.get("grad"))
        if grad and not (data.is_floating_point() or data.is_complex()):
            raise StateError(f"tensor {name}: a {data.dtype} tensor cannot require gradients")
        t = nn.Parameter(data, requires_grad=grad) if node.get("param") else data.requires_grad_(grad)
        self.memo["tensor", name] = t
        return t

    def ndarray(self, node: dict[str, Any]) -> np.ndarray:
        name = node["$ndarray"]
        if ("tensor", name) in self.memo:
            return self.memo["tensor", name]
        raw, dtype = self._tensor_data(name), _np_dtype(node.get("dtype"))
        shape = node.get("shape")
        if type(shape) is not list or any(type(s) is not int or s < 0 for s in shape):
            raise StateError(f"array {name}: {shape!r} is not a shape")
        if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != dtype.itemsize * math.prod(shape):
            raise StateError(f"array {name}: {raw.numel()} bytes do not make a {dtype} array of shape {shape}")
        a = np.frombuffer(raw.numpy().tobytes(), dtype=dtype).reshape(shape).copy()
        self.memo["tensor", name] = a
        return a

    def generator(self, node: dict[str, Any]) -> torch.Generator:
        name = node["$generator"]
        if ("tensor", name) in self.memo:
            return self.memo["tensor", name]
        g = torch.Generator(device="cpu" if node.get("device") == "cpu" else self.device)
        try:
            g.set_state(self._tensor_data(name))
        except (RuntimeError, TypeError) as e:
            raise StateError(f"generator {name}: {e}") from None
        self.memo["tensor", name] = g
        return g

    def instance(self, node: dict[str, Any], tag: str, depth: int) -> Any:
        name, key = current_name(node[tag]), node.get("id")
        cls = self.types.get(name) if type(name) is str else None
        if cls is None:
            raise StateError(f"the saved state holds a {name!r}, a class this reader does not rebuild")
        is_module = isinstance(cls, type) and issubclass(cls, nn.Module)
        if is_module != (tag == "$module"):
            raise StateError(f"{name} is saved as {'an object' if is_module else 'a module'}; it is not one")
        if type(key) is not int or ("object", key) in self.memo:
            raise StateError(f"{name}: object id {key!r} is missing or used twice")
        obj = cls.__new__(cls)
        self.memo["object", key] = obj
        d = depth + 1
        attrs = {k: self.decode(v, d) for k, v in _names(node.get("attrs", {}), name).items()}
        if not is_module:
            obj.__dict__.update(attrs)
            return obj
        nn.Module.__init__(obj)
        obj.training = bool(node.get("training"))
        for k, v in _names(node.get("params", {}), name).items():
            p = self.decode(v, d)
            if p is not None and type(p) is not nn.Parameter:
                raise StateError(f"{name}.{k} is saved as a parameter but is not one")
            obj._parameters[k] = p
        persistent = node.get("persistent", [])
        for k, v in _names(node.get("buffers", {}), name).items():
            b = self.decode(v, d)
            if b is not None and not isinstance(b, torch.Tensor):
                raise StateError(f"{name}.{k} is saved as a buffer but is not a tensor")
            obj._buffers[k] = b
            if type(persistent) is not list or k not in persistent:
                obj._non_persistent_buffers_set.add(k)
        for k, v in _names(node.get("modules", {}), name).items():
            m = self.decode(v, d)
            if m is not None and not isinstance(m, nn.Module):
                raise StateError(f"{name}.{k} is saved as a sub-module but is not one")
            obj._modules[k] = m
        for k in attrs:
            if k in _MODULE_INTERNALS:
                raise StateError(f"{name}: attribute {k!r} is torch's own")
        obj.__dict__.update(attrs)
        return obj


def _typed(value: Any, kind: type, tag: str) -> Any:
    if type(value) is not kind:
        raise StateError(f"{tag}: expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _names(mapping: Any, owner: str) -> dict[str, Any]:
    """A saved ``{attribute: value}`` of ``owner``: plain identifiers only (never ``__class__`` and the like)."""
    if type(mapping) is not dict:
        raise StateError(f"{owner}: the attributes are not a JSON object")
    for k in mapping:
        if not (k.isidentifier() or k.isdigit()) or k.startswith("__"):
            raise StateError(f"{owner}: {k!r} is not an attribute name")
    return mapping


def _np_dtype(name: Any) -> np.dtype:
    try:
        dtype = np.dtype(name) if type(name) is str else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise StateError(f"{name!r} is not a numeric numpy dtype")
    return dtype
