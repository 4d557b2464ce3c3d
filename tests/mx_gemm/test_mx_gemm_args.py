"""mx_gemm argument checks on the CPU: alignment of operands / scales / out, an NVFP4 operand
without global_scale, and M = 0 (an empty D, nothing planned past the rules, nothing launched).
Device arrays are CuPy arrays over made-up addresses (no GPU needed: nothing dereferences them)."""

from types import SimpleNamespace

import numpy as np
import pytest

from kernelgen.core.interop import Ctx
from kernelgen.mx.tensor import data_shape, scale_shape
from kernelgen.mx_gemm import api

cupy = pytest.importorskip("cupy")

BASE = 1 << 30  # a made-up device address, 16-byte aligned
CTX = Ctx("cupy", 0, None)


def _dev(shape, dtype, offset=0):
    """A cupy array at BASE + offset on device 0 (never read)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    mem = cupy.cuda.UnownedMemory(BASE + offset, max(nbytes, 1), None, 0)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0))


def _operand(fmt="mxfp8_e4m3", rows=3, k=64, layout="swizzled", data_off=0, sc_off=0,
             global_scale="default"):
    gs = _dev((1,), np.float32, 4096) if global_scale == "default" and fmt == "nvfp4" else None
    return SimpleNamespace(fmt=fmt, shape=(rows, k), scale_layout=layout,
                           data=_dev(data_shape(fmt, rows, k), np.uint8, data_off),
                           scales=_dev(scale_shape(fmt, rows, k, layout), np.uint8, sc_off),
                           global_scale=gs)


def test_aligned_operands_pass():
    """Control for the failures below: the same fake operands, aligned, are accepted."""
    for fmt in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        _, got_fmt, rows, k, *_ = api._operand(_operand(fmt), "A", CTX)
        assert (got_fmt, rows, k) == (fmt, 3, 64)
    assert api._out_view(_dev((3, 8), np.float16), CTX, 3, 8, "float16").shape == (3, 8)


@pytest.mark.parametrize("off", [1, 4, 8])
def test_operand_data_must_be_16_byte_aligned(off):
    with pytest.raises(ValueError, match=r"A\.data: data pointer must be 16-byte aligned .*cp\.async"):
        api._operand(_operand(data_off=off), "A", CTX)


def test_swizzled_scales_must_be_16_byte_aligned():
    with pytest.raises(ValueError, match=r"B\.scales: data pointer must be 16-byte aligned"):
        api._operand(_operand(sc_off=8), "B", CTX)


def test_out_must_be_4_byte_aligned():
    with pytest.raises(ValueError, match=r"out: data pointer must be 4-byte aligned .*two elements"):
        api._out_view(_dev((3, 8), np.float16, 2), CTX, 3, 8, "float16")


def test_empty_arrays_need_no_alignment():
    api.check_aligned(_dev((0, 64), np.uint8, 3), "A.data", 16, "x")
    with pytest.raises(ValueError, match="16-byte"):
        api.check_aligned(_dev((1, 64), np.uint8, 3), "A.data", 16, "x")


def test_operand_of_other_rank_names_the_rule():
    op = _operand()
    op.shape = (1, 3, 64)
    with pytest.raises(ValueError, match=r"A: shape \(1, 3, 64\); mx_gemm takes 2-D operands"):
        api._operand(op, "A", CTX)


def test_nvfp4_operand_without_global_scale_names_the_rule():
    with pytest.raises(ValueError, match="nvfp4 operand needs global_scale") as exc:
        api._operand(_operand("nvfp4", global_scale=None), "B", CTX)
    assert "NoneType" not in str(exc.value)


class _HostCtx(Ctx):
    """A Ctx whose new arrays are host arrays (the M = 0 path allocates only D)."""

    def empty(self, shape, dtype):
        a = np.empty(shape, np.uint16 if dtype == "bfloat16" else dtype)
        return a, a


@pytest.fixture
def no_device(monkeypatch):
    """mx_gemm without a GPU: a fixed sm_90a device; any kernel fetch fails the test."""
    monkeypatch.setattr(api, "context_of", lambda x, name: _HostCtx("cupy", 0, None))
    monkeypatch.setattr(api, "device_info",
                        lambda dev: SimpleNamespace(arch=SimpleNamespace(name="sm_90a"), sm_count=132,
                                                    smem_optin=227 * 1024))

    def no_kernel(*a, **k):
        raise AssertionError("M = 0 must not fetch or launch a kernel")

    monkeypatch.setattr(api, "get_kernel", no_kernel)


def test_m0_returns_empty_d_without_launch(no_device):
    a, b = _operand(rows=0), _operand(rows=16)
    d = api.mx_gemm(a, b, out_dtype="float16")
    assert d.shape == (0, 16) and d.dtype == np.float16
    out = _dev((0, 16), np.uint16)
    assert api.mx_gemm(a, b, out=out) is out
    with pytest.raises(AssertionError, match="must not fetch"):  # control: M = 1 launches
        api.mx_gemm(_operand(rows=1), b, out_dtype="float16")


def test_m0_keeps_the_other_rules(no_device):
    with pytest.raises(ValueError, match="N a positive multiple of 8"):
        api.mx_gemm(_operand(rows=0), _operand(rows=12))
    with pytest.raises(ValueError, match="cannot run on sm_90a"):
        api.mx_gemm(_operand(rows=0), _operand("mxfp4", rows=16))
    with pytest.raises(ValueError, match=r"out: shape \(1, 16\); expected \(0, 16\)"):
        api.mx_gemm(_operand(rows=0), _operand(rows=16), out=_dev((1, 16), np.uint16))
