"""The packed 16-bit MX element encoders of templates/mx/mx.cuh (encode_h2, quantize_slot_h2),
replayed bit for bit in NumPy over every fp16 / bf16 value and every scale exponent k a group
can get, against reference.encode(x * 2^k). CPU only: this is the exactness proof the kernel's
comment points to; the GPU tests compare the kernel itself with the reference."""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.kbit.reference import f32_to_bf16
from kernelgen.mx import reference as R

LANES2 = np.uint32(0x00010001)
H16 = {"float16": (10, 15), "bfloat16": (7, 127)}  # (MANT, BIAS)
FMTS = {"mxfp4": R.E2M1, "mxfp6_e2m3": R.E2M3, "mxfp6_e3m2": R.E3M2}
EMAX = {"mxfp4": 2, "mxfp6_e2m3": 2, "mxfp6_e3m2": 4}


def _f32(bits16: np.ndarray, dtype: str) -> np.ndarray:
    """16-bit patterns -> float32 values (exact)."""
    b = bits16.astype(np.uint16)
    if dtype == "float16":
        return b.view(np.float16).astype(np.float32)
    return (b.astype(np.uint32) << 16).view(np.float32)


def _round16(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> 16-bit patterns, RNE. A single fp16 / bf16 add or multiply computed in fp32
    and rounded once more is the correctly rounded result (24 >= 2 p + 2)."""
    if dtype == "float16":
        return v.astype(np.float16).view(np.uint16).astype(np.uint32)
    return f32_to_bf16(v.astype(np.float32)).astype(np.uint32)


def _lanes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return w & 0xFFFF, w >> 16


def _op2(a: np.ndarray, b: np.ndarray, dtype: str, op) -> np.ndarray:
    """Lane-wise RN op of two pair words (uint32)."""
    out = np.zeros_like(a)
    for sh in (0, 16):
        x = _f32((a >> sh) & 0xFFFF, dtype)
        y = _f32((b >> sh) & 0xFFFF, dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            out |= _round16(op(x, y), dtype) << sh
    return out


def _hmin_abs(a: np.ndarray, m: int, dtype: str) -> np.ndarray:
    out = np.zeros_like(a)
    for sh in (0, 16):
        x = np.abs(_f32((a >> sh) & 0xFFFF, dtype))
        out |= _round16(np.minimum(x, _f32(np.uint32(m), dtype)), dtype) << sh
    return out


def _hmax(a: np.ndarray, m: int, dtype: str) -> np.ndarray:
    out = np.zeros_like(a)
    for sh in (0, 16):
        x = _f32((a >> sh) & 0xFFFF, dtype)
        out |= _round16(np.maximum(x, _f32(np.uint32(m), dtype)), dtype) << sh
    return out


def max_bits(f: R.ElemFormat, dtype: str) -> int:
    mant, bias = H16[dtype]
    return (((f.max_code >> f.mbits) - f.bias + bias) << mant) | \
        ((f.max_code & ((1 << f.mbits) - 1)) << (mant - f.mbits))


def encode_h2(y: np.ndarray, f: R.ElemFormat, dtype: str) -> np.ndarray:
    """mx.cuh encode_h2, step for step (uint32 pair words -> pair code words)."""
    mant, bias = H16[dtype]
    sh = mant - f.mbits
    exp = np.uint32((((1 << (15 - mant)) - 1) << mant) * 0x10001)
    emin = bias + 1 - f.bias
    t = _hmin_abs(y, max_bits(f, dtype), dtype)
    eb = _hmax(t, emin << mant, dtype) & exp
    magic_c = np.uint32((sh << mant) * 0x10001)
    c = np.uint32((emin << f.mbits) * 0x10001)
    s = _op2(t, (eb + magic_c).astype(np.uint32), dtype, np.add)
    code = (s - eb - np.uint32(magic_c + c) + (eb >> sh)).astype(np.uint32)
    sign = (y >> (16 - f.bits)) & np.uint32(((1 << (f.bits - 1)) * 0x10001) & 0xFFFFFFFF)
    return (code | sign).astype(np.uint32)


def scale_pairs(x: np.ndarray, k: int, dtype: str) -> np.ndarray:
    """quantize_slot_h2's x * 2^k on pair words (fp16: times 2^min(k, 15), then 2^max(k - 15,
    0), for every k: no branch in the kernel)."""
    if dtype == "float16":
        x = _op2(x, np.uint32(((min(k, 15) + 15) << 10) * 0x10001), dtype, np.multiply)
        return _op2(x, np.uint32(((max(k - 15, 0) + 15) << 10) * 0x10001), dtype, np.multiply)
    return _op2(x, np.uint32(((k + 127) << 7) * 0x10001), dtype, np.multiply)


def _all_finite(dtype: str) -> np.ndarray:
    b = np.arange(1 << 16, dtype=np.uint32)
    v = _f32(b, dtype)
    return b[np.isfinite(v)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", list(FMTS))
def test_encode_h2_matches_reference_for_every_value_and_scale(fmt, dtype):
    """Every finite 16-bit x, every k whose groups can hold it (|x| 2^k < 2^(emax+1), k from
    the floor rule: 127 - code for codes 0..254), in both lanes: the code and sign agree with
    reference.encode of the exact x * 2^k."""
    f, emax = FMTS[fmt], EMAX[fmt]
    bits = _all_finite(dtype)
    v = _f32(bits, dtype).astype(np.float64)
    checked = 0
    # k = 127 - scale code; fp16 groups have amax in [2^-24, 65504] (or are zero, k clamped)
    ks = range(emax - 15, emax + 25) if dtype == "float16" else range(-125, 128)
    for k in ks:
        ok = np.abs(v) * 2.0 ** k < 2.0 ** (emax + 1)
        xb = bits[ok]
        if xb.size == 0:
            continue
        # both lanes: (x, reversed x)
        other = xb[::-1]
        w = (xb | (other << 16)).astype(np.uint32)
        p = encode_h2(scale_pairs(w, k, dtype), f, dtype)
        want_lo = R.encode(v[ok] * 2.0 ** k, f)
        want_hi = R.encode(v[ok][::-1] * 2.0 ** k, f)
        assert np.array_equal(p & 0xFFFF, want_lo.astype(np.uint32)), (fmt, dtype, k)
        assert np.array_equal(p >> 16, want_hi.astype(np.uint32)), (fmt, dtype, k)
        checked += xb.size
    assert checked > 1_000_000


def test_encode_h2_saturates_and_keeps_signed_zero():
    """Spot checks that would fail on a wrong clamp or a lost sign (values already scaled)."""
    f = R.E2M1
    for dtype in ("float16", "bfloat16"):
        vals = np.array([7.9, -7.9, 6.0, 5.0, -5.0, 0.25, 0.2500001, -0.0, 0.0, 1.25, 1.75],
                        np.float32)
        b = _round16(vals, dtype)
        p = encode_h2((b | (b << 16)).astype(np.uint32), f, dtype)
        want = R.encode(_f32(b, dtype).astype(np.float64), f)
        assert np.array_equal(p & 0xFFFF, want.astype(np.uint32))
        assert list(want[:2]) == [0x7, 0xF] and want[7] == 0x8


def _f16_rz(v: np.ndarray) -> np.ndarray:
    """float32 -> fp16 bit patterns rounded toward zero (cvt.rz.f16x2.f32; Inf stays Inf)."""
    with np.errstate(over="ignore"):
        r = v.astype(np.float16)
    over = np.abs(r.astype(np.float64)) > np.abs(v.astype(np.float64))
    r = np.where(over & ~np.isinf(v), np.nextafter(r, np.float16(0)), r)
    return r.view(np.uint16).astype(np.uint32)


def nv_pairs(y: np.ndarray) -> np.ndarray:
    """mx.cuh quantize_slot_nv_h2 from the fp32 products y (even / odd elements in the lanes):
    f32x2_to_f16x2_odd, then encode_h2<E2M1, half>."""
    u = y.astype(np.float32).view(np.uint32)
    u = u | (((u + np.uint32(0x1FFF)) ^ u) & np.uint32(0x2000))
    h = _f16_rz(u.view(np.float32))
    w = (h[0::2] | (h[1::2] << 16)).astype(np.uint32)
    return encode_h2(w, R.E2M1, "float16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nvfp4_round_to_odd_path_matches_reference(dtype):
    """Every finite 16-bit x times fp32 multipliers of every kind (random over a wide range, ones
    that put x * mult on or next to an E2M1 midpoint, FLT_MAX for overflow, tiny ones): the codes
    agree with reference.encode(RN32(x * mult)), as quantize_nvfp4 defines the elements."""
    rng = np.random.default_rng(7)
    bits = _all_finite(dtype)
    x = _f32(bits, dtype)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 6.0], np.float32)
    mults = list(np.exp2(rng.uniform(-30, 30, 150)).astype(np.float32))
    mults += [np.float32(3.4028235e38), np.float32(1e-30), np.float32(1.0), np.float32(597.33)]
    # multipliers making x * mult land on a midpoint for some x, and one ulp either side
    for xv in rng.choice(x[(np.abs(x) > 1e-3) & (np.abs(x) < 1e3)], 60):
        m = np.float32(rng.choice(mids) / abs(xv))
        mults += [m, np.nextafter(m, np.float32(0)), np.nextafter(m, np.float32(np.inf))]
    n = x.size - x.size % 2
    for m in mults:
        with np.errstate(over="ignore"):
            y = (x[:n] * np.float32(m)).astype(np.float32)
        p = nv_pairs(y)
        got = np.stack([p & 0xFFFF, p >> 16], axis=-1).ravel()
        want = R.encode(y.astype(np.float64), R.E2M1)
        assert np.array_equal(got, want.astype(np.uint32)), (dtype, float(m))
