"""The precision policy (clbench.core.precision): chosen from what the hardware reports, injected here, never
assumed."""

from __future__ import annotations

import json

import pytest
import torch
from datatrees import make_tree

from clbench.core.precision import CpuInfo, choose
from clbench.errors import ClbenchError

AVX2 = CpuInfo("AVX2", amx=False, avx512_bf16=False, model="AMD EPYC (AVX2 only)")
AVX512 = CpuInfo("AVX512", amx=False, avx512_bf16=False, model="Skylake-SP")
AVX512_BF16 = CpuInfo("AVX512", amx=False, avx512_bf16=True, model="AMD EPYC (Zen 4)")
AMX = CpuInfo("AVX512", amx=True, avx512_bf16=True, model="Sapphire Rapids")


def _no_probe():
    raise AssertionError("the probe must not run where the hardware decides")


@pytest.mark.parametrize("cpu", [AVX2, AVX512])
def test_auto_is_fp32_without_native_bf16(cpu):
    p = choose("auto", "cpu", cpu=cpu, probe=_no_probe)
    assert (p.name, p.forced) == ("fp32", False)
    assert cpu.capability in p.reason and "no native bf16" in p.reason


def test_auto_is_bf16_with_amx():
    p = choose("auto", "cpu", cpu=AMX, probe=_no_probe)
    assert (p.name, p.forced) == ("bf16", False) and "AMX" in p.reason


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ({"fp32": 30.0, "bf16": 54.0}, "bf16"),
        ({"fp32": 30.0, "bf16": 31.0}, "fp32"),
        ({"fp32": 30.0, "bf16": 4.0}, "fp32"),
    ],
)
def test_auto_measures_where_hardware_leaves_it_open(rates, expected):
    p = choose("auto", "cpu", cpu=AVX512_BF16, probe=lambda: rates)
    assert p.name == expected
    assert f"{rates['fp32']:.1f} img/s fp32" in p.reason  # the record says what was measured


def test_forced_bf16_on_avx2_runs_and_is_recorded_as_forced():
    p = choose("bf16", "cpu", cpu=AVX2, probe=_no_probe)
    assert (p.name, p.forced) == ("bf16", True)
    assert "forced" in p.reason and "emulated" in p.reason


def test_forced_fp32_on_amx():
    p = choose("fp32", "cpu", cpu=AMX)
    assert (p.name, p.forced) == ("fp32", True)


def test_bad_requests_are_refused_with_a_message():
    with pytest.raises(ClbenchError, match="fp16 is not supported on the CPU"):
        choose("fp16", "cpu", cpu=AMX)
    with pytest.raises(ClbenchError, match="valid precisions: auto, fp32, bf16, fp16"):
        choose("int8", "cpu", cpu=AMX)
    with pytest.raises(ClbenchError, match=r"Tesla V100 \(sm_70\) has no bf16"):
        choose("bf16", "cuda", cuda=("Tesla V100", (7, 0), False))


@pytest.mark.parametrize(
    ("cuda", "expected"),
    [
        (("H200", (9, 0), True), "bf16"),
        (("A100", (8, 0), True), "bf16"),
        (("Tesla V100", (7, 0), False), "fp16"),
        (("Tesla P100", (6, 0), False), "fp32"),
    ],
)
def test_auto_on_cuda(cuda, expected):
    assert choose("auto", "cuda", cuda=cuda).name == expected


def test_autocast_context_matches_the_precision():
    from clbench.core.precision import autocast

    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    with autocast("fp32", "cpu"):
        assert (x @ w).dtype == torch.float32
    with autocast("bf16", "cpu"):
        assert (x @ w).dtype == torch.bfloat16


def test_probe_is_cached_per_machine_and_backbone(tmp_path, monkeypatch):
    from clbench.core import precision

    calls = []

    def fake_throughput(backbone, device, p, img_size, **kw):
        calls.append(p)
        return {"fp32": 10.0, "bf16": 20.0}[p]

    monkeypatch.setattr(precision, "throughput", fake_throughput)

    class Backbone:
        class spec:
            name = "vit_micro"

        digest, img_size = "ab" * 32, 32

    probe = precision.cached_probe(Backbone(), torch.device("cpu"), AVX512_BF16, tmp_path)
    assert choose("auto", "cpu", cpu=AVX512_BF16, probe=probe).name == "bf16"
    assert choose("auto", "cpu", cpu=AVX512_BF16, probe=probe).name == "bf16"
    assert calls == ["fp32", "bf16"]  # measured once, then read from the cache
    saved = json.loads((tmp_path / "machine" / precision.PROBE_FILE).read_text())
    assert list(saved.values()) == [{"fp32": 10.0, "bf16": 20.0}]


def test_feature_cache_never_serves_one_precision_to_another(micro_session_factory, tmp_path):
    """A run forced to bf16 and one in fp32 compute separate feature entries, and their features differ. On a tiny
    image folder: bf16 runs on emulated kernels on an AVX2 CPU, where the embedded benchmark's pass took 37 s."""
    root = make_tree(tmp_path / "data", n_train=3, n_test=2)
    data = dict(bench="folder", data_root=str(root), init_cls=2, increment=2)
    s32 = micro_session_factory(precision="fp32", **data)
    s16 = micro_session_factory(precision="bf16", **data)
    assert s32.precision.name == "fp32" and s16.precision.name == "bf16"
    assert len(s32.features["test"]) == 8
    assert not torch.equal(s32.features["test"], s16.features["test"])
    again = micro_session_factory(precision="fp32", **data)
    assert torch.equal(again.features["test"], s32.features["test"]) and again.cache_events == ["hit", "hit"]


def test_isa_limits_are_honoured(monkeypatch):
    """An AVX-512 BF16 CPU told to use AVX2 kernels only (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA) is an AVX2 CPU
    for the policy: its bf16 would run on emulated kernels."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    cpu = CpuInfo.detect()
    assert (cpu.capability, cpu.avx512_bf16, cpu.amx) == ("AVX2", False, False)
    assert choose("auto", "cpu", cpu=cpu, probe=_no_probe).name == "fp32"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    cpu = CpuInfo.detect()
    assert (cpu.avx512_bf16, cpu.amx) == (True, False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert CpuInfo.detect().amx is True


def test_record_states_precision_and_threads(tmp_path):
    from clbench.run.harness import RunConfig, run

    rec = run(
        RunConfig(
            strategy="simplecil",
            bench="emoji",
            backbone="vit_micro",
            weights="random",
            precision="fp32",
            out=str(tmp_path / "run"),
        )
    )
    assert (rec.precision, rec.precision_reason) == ("fp32", "forced (--precision fp32)")
    assert rec.host.torch_threads == torch.get_num_threads()
    assert rec.host.omp_wait_policy == "PASSIVE"  # clbench sets it before torch loads (tests/conftest.py)
    assert rec.n_images == {"train": 2320, "test": 942}
