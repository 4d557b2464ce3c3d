"""Interop on a device: CuPy and torch in, the caller's kind out, on the caller's stream.

Marked `gpu` (skipped by tests/conftest.py without a device); torch tests also need torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.core.interop import _torch_to_cupy, context_of, device_array
from kernelgen.kbit import reference

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def cupy():
    import cupy

    return cupy


# -- stream choice ------------------------------------------------------------------------------

def test_cupy_current_stream(cupy):
    x = cupy.zeros(8, cupy.float32)
    assert context_of(x, "x").stream == cupy.cuda.get_current_stream()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        ctx = context_of(x, "x")
    assert (ctx.kind, ctx.device) == ("cupy", 0)
    assert ctx.stream.ptr == s.ptr, "a cupy call did not pick the current stream"


def test_torch_current_stream(torch):
    x = torch.zeros(8, device="cuda")
    ctx = context_of(x, "x")
    assert ctx.kind == "torch" and ctx.device == torch.cuda.current_device()
    assert ctx.stream.ptr == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        side = context_of(x, "x")
    assert side.stream.ptr == s.cuda_stream, "a torch call did not pick torch's current stream"
    assert context_of(x, "x").stream.ptr == torch.cuda.current_stream().cuda_stream


def _busy(torch, stream):
    """Keep `stream` busy for a while so a launch on another stream would overtake it."""
    with torch.cuda.stream(stream):
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(200_000_000)
        else:
            a = torch.randn(4096, 4096, device="cuda")
            for _ in range(20):
                a = a @ a / 64


@pytest.mark.parametrize("bits", [2, 4, 5])
def test_torch_side_stream_orders_launches(bits, torch, cache_env):
    """Data written on a side stream is seen by a kbit launch made under that stream."""
    from kernelgen.kbit import dequantize_kbit, quantize_kbit

    x = torch.zeros(4096, dtype=torch.bfloat16, device="cuda")
    quantize_kbit(x, bits)  # compile + load outside the timed part
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    _busy(torch, s)
    with torch.cuda.stream(s):
        x.fill_(1.5)
        q = quantize_kbit(x, bits)
        y = dequantize_kbit(q)
    s.synchronize()
    got = y.float().cpu().numpy()
    assert np.all(got != 0), f"{bits=}: the kernel read x before the side stream wrote it"


# -- torch bf16 round trip ----------------------------------------------------------------------

def _bits16(torch, t) -> np.ndarray:
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


@pytest.mark.parametrize("shape", [(4096,), (64, 96), (1000,)], ids=str)
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_torch_bf16_round_trip(bits, shape, torch, cupy, cache_env):
    from kernelgen.kbit import create_normal_float_codebook, dequantize_kbit, quantize_kbit

    g = torch.Generator(device="cuda").manual_seed(bits)
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda", generator=g)
    q = quantize_kbit(x, bits)
    y = dequantize_kbit(q)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16, f"{bits=} {shape=}: {type(y)}"
    assert tuple(y.shape) == shape and y.device == x.device, f"{bits=} {shape=}"
    assert isinstance(q.packed, torch.Tensor), f"{bits=} {shape=}: packed is {type(q.packed)}"

    cb = create_normal_float_codebook(bits)
    xb = _bits16(torch, x)
    ref_packed, ref_amax, ref_e4m4 = reference.quantize(xb, bits, cb, "bfloat16")
    packed = cupy.asnumpy(_torch_to_cupy(q.packed))
    np.testing.assert_array_equal(packed, ref_packed, err_msg=f"{bits=} {shape=}: packed")
    np.testing.assert_array_equal(cupy.asnumpy(_torch_to_cupy(q.absmax)), ref_e4m4,
                                  err_msg=f"{bits=} {shape=}: absmax")
    ref_y = reference.dequantize(ref_packed, ref_e4m4, cb, bits, int(np.prod(shape)), "bfloat16")
    np.testing.assert_array_equal(_bits16(torch, y).reshape(-1), ref_y,
                                  err_msg=f"{bits=} {shape=}: dequantized bf16 bits")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "uint8", "int32"])
def test_torch_view_is_zero_copy(dtype, torch, cupy):
    t = torch.arange(64, device="cuda").to(getattr(torch, dtype))
    v = _torch_to_cupy(t)
    assert v.data.ptr == t.data_ptr() and v.shape == tuple(t.shape), dtype
    assert v.dtype.itemsize == t.element_size(), dtype
    v[3] = v[5]  # a write through the view is seen by torch
    torch.cuda.synchronize()
    assert t[3].item() == t[5].item(), dtype


def test_torch_bf16_view_bits(torch, cupy):
    t = torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16, device="cuda")
    v = _torch_to_cupy(t)
    assert v.dtype == np.uint16
    np.testing.assert_array_equal(cupy.asnumpy(v), [0x3F80, 0xC000, 0x3F00])
    ctx = context_of(t, "x")
    arr, dt = device_array(t, "x", ctx, ("bfloat16",))
    assert dt == "bfloat16" and arr.data.ptr == t.data_ptr()
    native, view = ctx.empty((5,), "bfloat16")
    assert isinstance(native, torch.Tensor) and native.dtype == torch.bfloat16
    assert view.data.ptr == native.data_ptr() and view.dtype == np.uint16


def test_torch_refusals(torch, cupy):
    x = torch.zeros(8, 8, device="cuda")
    ctx = context_of(x, "x")
    with pytest.raises(ValueError, match="x: a torch tensor on cpu"):
        context_of(torch.zeros(4), "x")
    with pytest.raises(ValueError, match="w: must be contiguous"):
        device_array(x.t(), "w", ctx, ("float32",))
    with pytest.raises(ValueError, match="w: dtype float64 not supported"):
        device_array(torch.zeros(4, dtype=torch.float64, device="cuda"), "w", ctx, ("float32",))
    with pytest.raises(ValueError, match="w: a cupy array mixed with torch"):
        device_array(cupy.zeros(4, cupy.float32), "w", ctx, ("float32",))


def test_cupy_bf16_needs_the_hint(cupy):
    x = cupy.zeros(64, cupy.uint16)
    ctx = context_of(x, "x")
    assert device_array(x, "x", ctx, ("bfloat16",), hint="bfloat16")[1] == "bfloat16"
    with pytest.raises(ValueError, match="dtype='bfloat16'"):
        device_array(x, "x", ctx, ("bfloat16", "float16"))


@pytest.mark.multigpu
def test_second_device(cupy, torch):
    with cupy.cuda.Device(1):
        a = cupy.zeros(4, cupy.float32)
    assert context_of(a, "a").device == 1
    t = torch.zeros(4, device="cuda:1")
    ctx = context_of(t, "t")
    assert ctx.device == 1 and ctx.stream.ptr == torch.cuda.current_stream(1).cuda_stream
    with pytest.raises(ValueError, match="on device 0, other arguments are on device 1"):
        device_array(torch.zeros(4, device="cuda:0"), "b", ctx, ("float32",))


@pytest.mark.multigpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_ops_run_on_the_arrays_device_not_the_current_one(cupy, torch, kind, monkeypatch):
    """Device 0 current, data on device 1: the kernel is loaded and launched on device 1, and
    the result matches the same op on device 0 (both default streams are handle 0)."""
    import numpy as np

    import kernelgen as kg
    from kernelgen.core import jit

    monkeypatch.setenv("KERNELGEN_POISON", "1")
    jit.clear_memory_cache()
    host = np.random.default_rng().standard_normal(4096).astype(np.float16)
    results = []
    for dev in (0, 1):
        cupy.cuda.Device(0).use()
        if kind == "cupy":
            with cupy.cuda.Device(dev):
                x = cupy.asarray(host)
        else:
            torch.cuda.set_device(0)
            x = torch.from_numpy(host).to(f"cuda:{dev}")
        y = kg.dequantize_kbit(kg.quantize_kbit(x, 4))
        results.append(cupy.asnumpy(y) if kind == "cupy" else y.cpu().numpy())
    np.testing.assert_array_equal(results[0], results[1])
