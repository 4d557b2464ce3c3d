"""Programmatic dependent launch (core/launch.py), without a GPU: the parameter layout, the
routing in Ctx.launch, the knob, and that every entry point of every config waits first."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from kernelgen import knobs
from kernelgen.core import interop, launch
from kernelgen.core.registry import families
from kernelgen.core.render import render


def test_driver_structs_match_cuda_h():
    """CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out on 64-bit Linux."""
    import ctypes

    cfg, attr = launch._Config, launch._Attr
    assert ctypes.sizeof(cfg) == 56
    assert [getattr(cfg, f).offset for f in ("smem", "stream", "attrs", "num_attrs")] == [24, 32, 40, 48]
    assert ctypes.sizeof(attr) == 72 and attr.value.offset == 8 and ctypes.alignment(attr) == 8
    assert launch._PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_param_layout_natural_alignment():
    fmt, offsets, size = launch.param_layout("QiQqIfd")
    # pointer 0, int 8, pointer 16 (padded), long long 24, unsigned 32, float 36, double 40
    assert offsets == [0, 8, 16, 24, 32, 36, 40]
    assert size == 48 == struct.calcsize(fmt)
    fmt, offsets, size = launch.param_layout("iiQ")
    assert offsets == [0, 4, 8] and size == 16


def test_packer_writes_each_value_at_its_offset():
    p = launch._Packer("AiAfq")
    vals = (0x1122334455667788, -7, 0xDEADBEEF00, 1.5, -(1 << 40))
    p.struct.pack_into(p.buf, 0, *vals)
    raw = bytes(p.buf)
    _, offsets, _ = launch.param_layout("QiQfq")
    assert struct.unpack_from("<Q", raw, offsets[0])[0] == vals[0]
    assert struct.unpack_from("<i", raw, offsets[1])[0] == vals[1]
    assert struct.unpack_from("<Q", raw, offsets[2])[0] == vals[2]
    assert struct.unpack_from("<f", raw, offsets[3])[0] == vals[3]
    assert struct.unpack_from("<q", raw, offsets[4])[0] == vals[4]
    base = p.ptrs[0]
    assert [p.ptrs[i] - base for i in range(5)] == offsets
    assert p.arrays == (0, 2)


def test_codes_reject_plain_python_scalars():
    assert launch.arg_codes((np.int32(1), np.uint32(2), np.int64(3), np.float32(4.0))) == "iIqf"
    with pytest.raises(TypeError, match="argument 1 is a int"):
        launch.arg_codes((np.int32(1), 5))


def test_pdl_knob(monkeypatch):
    monkeypatch.delenv("KERNELGEN_PDL", raising=False)
    assert knobs.pdl()
    for off in ("0", "false", "no", "off"):
        monkeypatch.setenv("KERNELGEN_PDL", off)
        assert not knobs.pdl()
    monkeypatch.setenv("KERNELGEN_PDL", "1")
    assert knobs.pdl()


class _Fn:
    ptr = 1234

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.calls.append((grid, block, args, shared_mem))


class _Stream:
    ptr = 99


@pytest.mark.parametrize("device_has_it, knob, want_pdl", [
    (True, "1", True), (True, "0", False), (False, "1", False)])
def test_ctx_launch_routes_pdl(monkeypatch, device_has_it, knob, want_pdl):
    seen = []
    monkeypatch.setattr(interop, "_pdl_device", lambda dev: device_has_it)
    monkeypatch.setattr(launch, "launch_pdl", lambda *a: seen.append(a))
    monkeypatch.setenv("KERNELGEN_PDL", knob)
    fn = _Fn()
    ctx = interop.Ctx("cupy", 0, _Stream())
    ctx.launch(fn, (3, 1, 1), (128, 1, 1), (np.int32(1),), smem=64)
    if want_pdl:
        assert seen == [(fn, (3, 1, 1), (128, 1, 1), (np.int32(1),), 64, 99)] and not fn.calls
    else:
        assert fn.calls == [((3, 1, 1), (128, 1, 1), (np.int32(1),), 64)] and not seen


@pytest.mark.parametrize("device_has_it, knob, pdl_arg", [
    (True, "1", ()), (True, "0", (False,)), (False, "1", (False,))])
def test_ctx_launch_passes_tensor_maps_through_the_driver(monkeypatch, device_has_it, knob,
                                                          pdl_arg):
    """CuPy's own launch cannot pass a TensorMap: such a launch always goes through the driver
    call, with the PDL attribute only where PDL is on."""
    from kernelgen.core.tma import TensorMap

    seen = []
    monkeypatch.setattr(interop, "_pdl_device", lambda dev: device_has_it)
    monkeypatch.setattr(launch, "launch_pdl", lambda *a: seen.append(a))
    monkeypatch.setenv("KERNELGEN_PDL", knob)
    fn = _Fn()
    tm = TensorMap(bytes(range(128)))
    ctx = interop.Ctx("cupy", 0, _Stream())
    ctx.launch(fn, (3, 1, 1), (128, 1, 1), (tm, np.int32(1)), smem=64)
    assert seen == [(fn, (3, 1, 1), (128, 1, 1), (tm, np.int32(1)), 64, 99) + pdl_arg]
    assert not fn.calls


def test_param_layout_of_tensor_maps():
    """A tensor map is 128 bytes at a 64-byte boundary of the parameter buffer, as CUDA lays
    out a __grid_constant__ CUtensorMap."""
    import struct

    fmt, offsets, size = launch.param_layout("MMQQiiii")
    assert offsets == [0, 128, 256, 264, 272, 276, 280, 284] and size == 288
    fmt, offsets, size = launch.param_layout("iMi")
    assert offsets == [0, 64, 192] and size == 196
    raw = bytes(range(128))
    packed = struct.pack(fmt, 7, raw, 9)
    assert packed[64:192] == raw and packed[:4] == struct.pack("<i", 7)


def _prewarm_configs():
    """Every config that `kernelgen prewarm` builds, and those dispatch can launch beyond it
    (Family.matrix_spec), for every arch."""
    return list(dict.fromkeys(
        cfg for fam in families().values()
        for cfg in fam.prewarm_configs(["sm_80", "sm_90a", "sm_100a", "sm_120a"], fam.matrix_spec or {})))


PDL_CONFIGS = _prewarm_configs()


def test_the_checked_configs_cover_every_config_class():
    from kernelgen.core.registry import config_classes

    assert {type(c) for c in PDL_CONFIGS} == set(config_classes().values())


def test_every_entry_point_waits_first():
    """Ctx.launch launches every kernel with PDL, so it may start before the grid it depends on
    has finished; only a grid_dependency_wait() before any other statement keeps that invisible.
    Every prewarm config of every class (wgmma, split-K, cluster and multi-CTA variants
    included)."""
    bad = []
    for cfg in PDL_CONFIGS:
        src = render(cfg).source
        bodies = re.findall(r"__global__[^{]*\b(\w+)\s*\([^{]*\)\s*\{\s*([^;]*;)", src)
        if not {name for name, _ in bodies} >= set(cfg.symbols()):
            bad.append(f"{cfg.short()}: entry points {[n for n, _ in bodies]}")
        bad += [f"{cfg.short()} {name}: first statement {first!r}" for name, first in bodies
                if first.strip() != "kg::grid_dependency_wait();" and not _early_prefetch(cfg, first)]
    assert len(PDL_CONFIGS) > 100 and not bad, bad[:5]
    assert any(getattr(c, "pf", 0) for c in PDL_CONFIGS)  # the exception below is exercised


def _early_prefetch(cfg, first: str) -> bool:
    """The one exception: an FP4 GEMV config with pf > 0 calls gemv first, whose prologue up to
    its wait (templates/fp4_gemm/gemv.cuh: pointer arithmetic, then the PF block) reads and
    writes no memory but L2 prefetches of weight lines (a hint: nothing into registers; L2 is
    the point of coherence), and whose PF block ends with the wait, then the release."""
    if not getattr(cfg, "pf", 0):
        return False
    if not (first.strip().startswith("kg::fp4::gemv<") and f"kg::fp4::GridPlace, {cfg.pf}," in first):
        return False
    src = (Path(__file__).parents[2] / "templates" / "fp4_gemm" / "gemv.cuh").read_text()
    src = re.sub(r"//[^\n]*", "", src)  # comments say "load" and "read" freely
    code = src.split("__device__ __forceinline__ void gemv(", 1)[1]
    head, rest = code.split("if constexpr (PF > 0) {", 1)
    body, after = rest.split("grid_dependency_wait();", 1)
    forbidden = (r"\b(W|S|post|A|bias|C|ws|counters|lut)\s*\[", r"__ld", r"__st", r"atomic",
                 r"\basm\b", r"\bld_", r"\blds", r"cp_async", r"kfill", r"\bload\(", r"reinterpret_cast",
                 r"[=(,]\s*\*")  # a dereference in an expression
    prologue = head + body
    clean = not any(re.search(f, prologue) for f in forbidden)
    return (clean and body.count("prefetch_l2(") == 2 and "grid_dependency_wait" not in head
            and re.match(r"\s*grid_launch_dependents\(\);\s*\}", after) is not None)


class _FakeDriver:
    """Stands in for libcuda: records what each cuLaunchKernelEx call would have received."""

    def __init__(self, codes):
        self.attr = launch._Attr()
        self.codes = codes
        self.calls = []

    def launch(self, cfg_ref, fn, ptrs, extra):
        import ctypes

        cfg = cfg_ref._obj
        fmt, offsets, size = launch.param_layout(self.codes)
        raw = ctypes.string_at(ptrs[0], size)
        self.calls.append(((cfg.grid_x, cfg.grid_y, cfg.grid_z), (cfg.block_x, cfg.block_y,
                           cfg.block_z), cfg.smem, cfg.num_attrs, struct.unpack(fmt, raw)))
        return 0


class _FakeFn:
    ptr = 0xABC


def test_launch_pdl_packs_every_call(monkeypatch):
    """A memo hit repacks the new argument values; the config carries grid, block, smem and the
    one PDL attribute; a call with another argument count fails instead of launching."""
    drv = _FakeDriver("iIqf")
    monkeypatch.setattr(launch, "_driver", drv)
    monkeypatch.setattr(launch, "_local", __import__("threading").local())
    fn = _FakeFn()
    launch.launch_pdl(fn, (3, 2, 1), (128, 1, 1), (np.int32(-5), np.uint32(7), np.int64(1 << 40),
                                                   np.float32(2.5)), 1024, 0)
    launch.launch_pdl(fn, (3, 2, 1), (128, 1, 1), (np.int32(9), np.uint32(1), np.int64(-3),
                                                   np.float32(-0.5)), 1024, 0)
    assert drv.calls == [((3, 2, 1), (128, 1, 1), 1024, 1, (-5, 7, 1 << 40, 2.5)),
                         ((3, 2, 1), (128, 1, 1), 1024, 1, (9, 1, -3, -0.5))]
    with pytest.raises(struct.error):
        launch.launch_pdl(fn, (3, 2, 1), (128, 1, 1), (np.int32(1),), 1024, 0)
    assert len(drv.calls) == 2


def test_launch_pdl_packs_tensor_maps_without_the_attribute(monkeypatch):
    """pdl=False (a TensorMap with PDL off): no launch attribute; the map's 128 bytes at its
    64-byte boundary, the scalars around it in place; the memo keeps the two kinds apart."""
    from kernelgen.core.tma import TensorMap

    drv = _FakeDriver("iMQ")
    monkeypatch.setattr(launch, "_driver", drv)
    monkeypatch.setattr(launch, "_local", __import__("threading").local())
    fn = _FakeFn()
    raw = bytes(range(1, 129))
    launch.launch_pdl(fn, (2, 1, 1), (64, 1, 1), (np.int32(-3), TensorMap(raw), np.uint64(5)),
                      0, 0, False)
    launch.launch_pdl(fn, (2, 1, 1), (64, 1, 1), (np.int32(4), TensorMap(raw[::-1]), np.uint64(6)),
                      0, 0)
    assert drv.calls == [((2, 1, 1), (64, 1, 1), 0, 0, (-3, raw, 5)),
                         ((2, 1, 1), (64, 1, 1), 0, 1, (4, raw[::-1], 6))]


def test_launch_refuses_more_shared_memory_than_the_device_allows(monkeypatch):
    """A plan sized for the target's largest part (sm_80: 163 KB a block) on a part with less
    (8.6 / 8.9: 99 KB) is a DeviceError naming both numbers, raised before anything launches."""
    from kernelgen.core import interop
    from kernelgen.errors import DeviceError

    monkeypatch.setitem(interop._smem_limits, 7, (101376, "RTX 4090, target sm_80"))
    monkeypatch.setitem(interop._pdl_devices, 7, False)  # launch through fn itself
    ctx = interop.Ctx("cupy", 7, None)
    calls = []
    fn = lambda *a, **k: calls.append(a)  # noqa: E731
    with pytest.raises(DeviceError, match=r"needs 135168 bytes .*RTX 4090, target sm_80\) allows 101376"):
        ctx.launch(fn, (1, 1, 1), (32, 1, 1), (), smem=135168)
    assert not calls
    ctx.launch(fn, (1, 1, 1), (32, 1, 1), (), smem=101376)  # exactly the limit: launched
    assert len(calls) == 1


def test_device_info_reads_the_parts_shared_memory(monkeypatch):
    """DeviceInfo.smem_optin is the part's opt-in limit (an 8.6 part under the sm_80 target: 99
    KB, not the target's 163 KB); without the property, the target's."""
    cupy = pytest.importorskip("cupy")
    from kernelgen import arch

    props = {"name": b"NVIDIA A10", "major": 8, "minor": 6, "multiProcessorCount": 72,
             "l2CacheSize": 6 << 20, "sharedMemPerBlockOptin": 101376}
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties", lambda i: dict(props))
    monkeypatch.setattr(arch, "_DEVICES", {})
    info = arch.device_info(5)
    assert info.arch.name == "sm_80" and info.smem_optin == 101376
    del props["sharedMemPerBlockOptin"]
    monkeypatch.setattr(arch, "_DEVICES", {})
    assert arch.device_info(5).smem_optin == arch.ARCHS["sm_80"].smem_optin
