"""Numeric precision of the frozen backbone, chosen per device from what the hardware reports, never assumed.

``--precision auto`` (the default) uses reduced precision only where it is natively fast:

- CUDA: bf16 on devices with native bf16 (compute capability 8.0 and up); fp16 on older devices with tensor
  cores (7.x), where it is the fast path; fp32 below that.
- CPU with AMX tiles: bf16. CPU with neither AMX nor AVX-512 BF16 (the AVX2 class): fp32, because bf16 autocast
  there is emulated and measured about 8x slower than fp32 (ViT-S/14 at 112 px on a 2-core AVX2 EPYC: 21.6 img/s
  fp32 against 3.0 bf16 on one thread).
- CPU with AVX-512 BF16 but no AMX: the gain varies by core, so a short measured probe decides (a few batches of
  the run's own backbone in fp32 and bf16; bf16 only if it is at least :data:`PROBE_MIN_GAIN` x faster). The probe
  result is cached per machine, backbone and input size in ``<clbench cache>/machine/precision-probe.json``.

``fp32``, ``bf16`` and ``fp16`` force a precision; a forced choice is recorded as forced. fp16 on the CPU and bf16 on
a GPU without bf16 are refused with a message. The run record states ``precision`` and ``precision_reason``, and
the feature cache keys on the precision, so features computed at one precision never serve a run at another.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json, cache_dir, cache_subdir
from clbench.files.safety import load_json, open_lock

PRECISIONS = ("fp32", "bf16", "fp16")
CHOICES = ("auto", *PRECISIONS)
PROBE_MIN_GAIN = 1.10  # bf16 must beat fp32 by 10 % to be worth numbers that differ from fp32's
PROBE_FILE = "precision-probe.json"


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU reports: torch's capability string and the two bf16 instruction sets that matter."""

    capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...
    amx: bool  # AMX tiles (Sapphire Rapids and later): bf16 matrix units
    avx512_bf16: bool  # AVX-512 BF16 dot products (Cooper Lake, Zen 4 and later)
    model: str = ""  # /proc/cpuinfo "model name"

    @classmethod
    def detect(cls) -> CpuInfo:
        """The CPU as torch will use it: the hardware flags, limited by what ``ATEN_CPU_CAPABILITY`` and
        ``ONEDNN_MAX_CPU_ISA`` let torch's kernels use (set both to AVX2 and an AVX-512 machine runs, and is
        treated, like an AVX2 one)."""
        import torch

        def flag(name: str) -> bool:
            fn = getattr(torch.cpu, name, None)
            return bool(fn()) if fn is not None else False

        capability = torch.backends.cpu.get_cpu_capability()
        isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
        unlimited = isa in ("", "ALL", "DEFAULT")
        avx512 = capability.startswith("AVX512")
        amx = flag("_is_amx_tile_supported") and avx512 and (unlimited or "AMX" in isa)
        bf16 = (
            flag("_is_avx512_bf16_supported")
            and avx512
            and (unlimited or any(k in isa for k in ("BF16", "AMX", "FP16", "AVX10")))
        )
        return cls(capability, amx, bf16, cpu_model())

    def describe(self) -> str:
        extra = [n for n, on in (("AMX", self.amx), ("AVX-512 BF16", self.avx512_bf16)) if on]
        return f"{self.model or 'CPU'} (capability {self.capability}{', ' + ', '.join(extra) if extra else ''})"


def isa_limits() -> dict[str, str]:
    """The environment variables that restrict torch's kernels, where set (see :meth:`CpuInfo.detect`)."""
    return {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Precision:
    """The precision a run uses, and why."""

    name: str  # fp32 | bf16 | fp16
    reason: str
    forced: bool = False

    @property
    def reduced(self) -> bool:
        return self.name != "fp32"

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager[object]:
        """Autocast context for the backbone (a no-op in fp32)."""
        import torch

        if not self.reduced:
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.name == "bf16" else torch.float16
        return torch.autocast(device_type=device_type, dtype=dtype)


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[object]:
    """Autocast context for a precision name (fp32: none)."""
    return Precision(precision, "").autocast(device_type)


def check_request(requested: str) -> None:
    if requested not in CHOICES:
        raise ClbenchError(f"--precision {requested!r} is unknown; valid precisions: {', '.join(CHOICES)}")


def choose(
    requested: str,
    device_type: str,
    *,
    cpu: CpuInfo | None = None,
    cuda: tuple[str, tuple[int, int], bool] | None = None,
    probe: Callable[[], dict[str, float]] | None = None,
) -> Precision:
    """The precision for ``requested`` (auto | fp32 | bf16 | fp16) on ``device_type`` (cpu | cuda).

    ``cpu`` and ``cuda`` (device name, compute capability, bf16 supported) describe the hardware; detected when
    None (tests inject them). ``probe`` measures ``{"fp32": img/s, "bf16": img/s}`` where the hardware leaves the
    choice open (AVX-512 BF16 without AMX); without one, such a CPU gets fp32.
    """
    check_request(requested)
    if device_type == "cuda":
        return _choose_cuda(requested, cuda or _detect_cuda())
    cpu = cpu or CpuInfo.detect()
    native = cpu.amx or cpu.avx512_bf16
    if requested == "fp16":
        raise ClbenchError(
            "--precision fp16 is not supported on the CPU (no fast fp16 matrix path there)",
            "use --precision auto, fp32 or bf16, or --device cuda",
        )
    if requested == "fp32":
        return Precision("fp32", "forced (--precision fp32)", forced=True)
    if requested == "bf16":
        note = "" if native else f"; this CPU has no native bf16 ({cpu.describe()}), so it is emulated and slow"
        return Precision("bf16", f"forced (--precision bf16){note}", forced=True)
    if cpu.amx:
        return Precision("bf16", f"auto: {cpu.describe()} has AMX bf16 matrix units")
    if not cpu.avx512_bf16:
        return Precision(
            "fp32",
            f"auto: {cpu.describe()} has no native bf16 (no AMX, no AVX-512 BF16); "
            "emulated bf16 would be several times slower than fp32",
        )
    if probe is None:
        return Precision("fp32", f"auto: {cpu.describe()} has AVX-512 BF16 but no AMX and no probe was run")
    rates = probe()
    gain = rates["bf16"] / rates["fp32"]
    measured = f"measured {rates['fp32']:.1f} img/s fp32, {rates['bf16']:.1f} bf16 ({gain:.2f}x)"
    if gain >= PROBE_MIN_GAIN:
        return Precision("bf16", f"auto: {cpu.describe()}: {measured}")
    return Precision("fp32", f"auto: {cpu.describe()}: {measured}, under the {PROBE_MIN_GAIN:.2f}x needed for bf16")


def _detect_cuda() -> tuple[str, tuple[int, int], bool]:
    import torch

    return torch.cuda.get_device_name(), torch.cuda.get_device_capability(), bool(torch.cuda.is_bf16_supported())


def _choose_cuda(requested: str, cuda: tuple[str, tuple[int, int], bool]) -> Precision:
    name, (major, minor), bf16 = cuda
    dev = f"{name} (sm_{major}{minor})"
    if requested == "fp32":
        return Precision("fp32", "forced (--precision fp32)", forced=True)
    if requested == "bf16":
        if not bf16:
            raise ClbenchError(
                f"--precision bf16: the CUDA device {dev} has no bf16 support",
                "use --precision auto (fp16 on this device), fp16 or fp32",
            )
        return Precision("bf16", "forced (--precision bf16)", forced=True)
    if requested == "fp16":
        return Precision("fp16", "forced (--precision fp16)", forced=True)
    if bf16 and major >= 8:
        return Precision("bf16", f"auto: {dev} has native bf16")
    if major >= 7:
        return Precision("fp16", f"auto: {dev} has fp16 tensor cores but no native bf16")
    return Precision("fp32", f"auto: {dev} has no fast reduced-precision path")


# ----------------------------------------------------------------------------------------------- measurement
def throughput(
    backbone, device, precision: str, img_size: int, batch: int = 16, batches: int = 2, seconds: float | None = None
) -> float:
    """Images per second of ``backbone`` (no grad) at ``precision`` on random input: one warm-up batch, then
    ``batches`` timed batches (or as many as fit in ``seconds``)."""
    import torch

    x = torch.randn(batch, 3, img_size, img_size, generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode(), autocast(precision, device.type):
        backbone(x)
        _sync(device)
        t0, n = time.perf_counter(), 0
        while (n < batches) if seconds is None else (time.perf_counter() - t0 < seconds or n == 0):
            backbone(x)
            n += 1
        _sync(device)
    return n * batch / (time.perf_counter() - t0)


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def probe_key(cpu: CpuInfo, backbone_name: str, img_size: int) -> str:
    """What the probe's answer depends on: the CPU, torch, the architecture and input size. Not the weights (timing
    does not depend on them) and not the thread count, so that every run of a machine and backbone (a sweep's
    workers run with fewer threads) makes the same choice."""
    import torch

    return json.dumps(
        {"cpu": asdict(cpu), "torch": torch.__version__, "backbone": backbone_name, "img_size": img_size},
        sort_keys=True,
    )


def cached_probe(backbone, device, cpu: CpuInfo, cache_root: Path | None) -> Callable[[], dict[str, float]]:
    """A probe for :func:`choose` that measures ``backbone`` in fp32 and bf16 once per machine and backbone and
    keeps the result in ``<cache>/machine/precision-probe.json`` (no cache: measured every time). It measures under
    a file lock, so runs started together (a sweep) wait for one measurement and all make the same choice."""

    def measure() -> dict[str, float]:
        return {p: throughput(backbone, device, p, backbone.img_size) for p in ("fp32", "bf16")}

    def probe() -> dict[str, float]:
        if cache_root is None:
            return measure()
        key = probe_key(cpu, backbone.spec.name, backbone.img_size)

        path = cache_subdir("machine", create=False, root=cache_root) / PROBE_FILE  # a link there: refused
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open_lock(path.with_suffix(".lock"))  # a planted symbolic link is refused, never followed
        except OSError:  # an unwritable cache only means measuring every time
            return _read_json(path).get(key) or measure()
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = _read_json(path)
            if key in known:
                return known[key]
            rates = measure()

            try:
                atomic_write_json(path, {**known, key: rates})
            except OSError:
                pass
            return rates

    return probe


def _read_json(path: Path) -> dict[str, Any]:
    """The probe cache (a dict of key -> rates), or {} for a missing, unreadable or odd one: it is measured again."""
    if not path.exists():
        return {}
    try:
        data = load_json(path, "precision probe cache", limit=2**20)
    except ClbenchError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v
        for k, v in data.items()
        if isinstance(v, dict) and all(isinstance(r, (int, float)) and 0 < r < 1e9 for r in v.values())
    }


def for_backbone(backbone, device, requested: str = "auto", use_cache: bool = True) -> Precision:
    """:func:`choose` for a loaded backbone on ``device``, with the cached probe where the hardware leaves it open."""
    cpu = CpuInfo.detect() if device.type == "cpu" else None
    probe = cached_probe(backbone, device, cpu, cache_dir() if use_cache else None) if cpu is not None else None
    return choose(requested, device.type, cpu=cpu, probe=probe)
