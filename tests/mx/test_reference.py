"""CPU tests of the NumPy references of NVFP4 / MXFP4 / MXFP6 / MXFP8 (kernelgen.mx.reference)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest

from kernelgen.kbit.reference import f32_to_bf16
from kernelgen.mx import reference as R

FMTS = list(R.ELEM_FORMATS)
MX = list(R.MX_FORMATS)
# Largest |dequant - x| / amax of a group, by format. MX: the scale 2**(floor(log2 amax) - emax)
# puts amax / X in [2**emax, 2**(emax+1)); the error is at most X times the larger of half an ulp of
# the top binade (2**(emax - m - 1)) and the clamp excess (2**(emax+1) - max) -> relative
# max(2**(-m-1), 2 - max / 2**emax). NVFP4: the E4M3 scale is within 2**-4 of amax/6 and an E2M1
# half ulp is at most 1, so (1 + 2**-4) / 6.
GROUP_BOUND = {"mxfp4": 0.5, "mxfp6_e2m3": 0.125, "mxfp6_e3m2": 0.25, "mxfp8_e4m3": 0.25,
               "mxfp8_e5m2": 0.25, "nvfp4": (1 + 2**-4) / 6}


def _f(name: str) -> R.ElemFormat:
    return R.ELEM_FORMATS[name]


def _data(m: int, k: int, seed: int = 0, spread: int = 30) -> np.ndarray:
    """Normal data, each row with its own power-of-two scale in [2**-spread, 2**spread)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.ldexp(1.0, rng.integers(-spread, spread, (m, 1)))
    return x.astype(np.float32)


# -- element codecs ------------------------------------------------------------------------------
CODECS = {name: (partial(R.decode, fmt=f), partial(R.encode, fmt=f, saturate=False), f.bits)
          for name, f in R.ELEM_FORMATS.items()}
CODECS["e8m0"] = (R.e8m0_decode, R.e8m0_encode, 8)
CANONICAL_NAN = {"e4m3": 0x7F, "e5m2": 0x7F, "e8m0": 0xFF}


@pytest.mark.parametrize("name", [*FMTS, "e8m0"])
def test_every_code_round_trips(name):
    dec, enc, bits = CODECS[name]
    codes = np.arange(1 << bits, dtype=np.uint8)
    vals = dec(codes)
    assert vals.dtype == np.float32
    back = enc(vals)
    nan = np.isnan(vals)
    assert np.array_equal(back[~nan], codes[~nan])
    assert np.all(back[nan] == CANONICAL_NAN.get(name, -1))
    assert nan.sum() == {"e4m3": 2, "e5m2": 6, "e8m0": 1}.get(name, 0)


@pytest.mark.parametrize("name, code, value", [
    ("e2m1", 0x1, 0.5), ("e2m1", 0x2, 1.0), ("e2m1", 0x5, 3.0), ("e2m1", 0x7, 6.0),
    ("e2m1", 0xF, -6.0), ("e2m1", 0x9, -0.5),
    ("e2m3", 0x01, 0.125), ("e2m3", 0x08, 1.0), ("e2m3", 0x1F, 7.5), ("e2m3", 0x3F, -7.5),
    ("e3m2", 0x01, 0.0625), ("e3m2", 0x04, 0.25), ("e3m2", 0x0C, 1.0), ("e3m2", 0x1F, 28.0),
    ("e4m3", 0x01, 2.0**-9), ("e4m3", 0x08, 2.0**-6), ("e4m3", 0x38, 1.0), ("e4m3", 0x7E, 448.0),
    ("e4m3", 0xFE, -448.0), ("e4m3", 0x7F, math.nan), ("e4m3", 0xFF, math.nan),
    ("e5m2", 0x01, 2.0**-16), ("e5m2", 0x04, 2.0**-14), ("e5m2", 0x3C, 1.0),
    ("e5m2", 0x7B, 57344.0), ("e5m2", 0x7C, math.inf), ("e5m2", 0xFC, -math.inf),
    ("e5m2", 0x7D, math.nan),
    ("e8m0", 0x00, 2.0**-127), ("e8m0", 0x7F, 1.0), ("e8m0", 0xFE, 2.0**127), ("e8m0", 0xFF, math.nan),
])
def test_decode_known_values(name, code, value):
    got = float(CODECS[name][0](np.array([code], np.uint8))[0])
    assert (math.isnan(got) and math.isnan(value)) or got == value


# (format, lower code): the value halfway to lower + 1 must encode to the even one of the two, and
# the fp64 neighbours of the tie to the nearer code. Covers subnormals, the subnormal/normal edge,
# a carry into the next binade and the top of the range.
@pytest.mark.parametrize("name, lo", [
    ("e2m1", 0x0), ("e2m1", 0x1), ("e2m1", 0x2), ("e2m1", 0x3), ("e2m1", 0x5), ("e2m1", 0x6),
    ("e2m3", 0x00), ("e2m3", 0x07), ("e2m3", 0x08), ("e2m3", 0x1E),
    ("e3m2", 0x00), ("e3m2", 0x03), ("e3m2", 0x0D), ("e3m2", 0x1E),
    ("e4m3", 0x00), ("e4m3", 0x01), ("e4m3", 0x07), ("e4m3", 0x38), ("e4m3", 0x3F), ("e4m3", 0x7D),
    ("e5m2", 0x00), ("e5m2", 0x03), ("e5m2", 0x3C), ("e5m2", 0x3F), ("e5m2", 0x7A),
])
def test_round_to_nearest_even_ties(name, lo):
    f = _f(name)
    a, b = (float(v) for v in R.decode(np.array([lo, lo + 1]), f))
    tie = (a + b) / 2
    even = lo if lo % 2 == 0 else lo + 1
    sign = 1 << (f.bits - 1)
    assert R.encode(np.array([tie, -tie]), f).tolist() == [even, even | sign]
    below, above = np.nextafter(tie, 0.0), np.nextafter(tie, np.inf)
    assert R.encode(np.array([below, above]), f).tolist() == [lo, lo + 1]


@pytest.mark.parametrize("name", FMTS)
def test_saturation(name):
    f = _f(name)
    sign = 1 << (f.bits - 1)
    tie = f.max_normal + 2.0 ** (f.emax - f.mbits - 1)  # halfway to the next (virtual) step
    big = np.array([np.nextafter(tie, np.inf), 1e30, np.inf])
    assert np.all(R.encode(big, f) == f.max_code)
    assert np.all(R.encode(-big, f) == f.max_code | sign)
    overflow = {"e4m3": 0x7F, "e5m2": 0x7C}.get(name, f.max_code)  # NaN / Inf / no specials
    assert np.all(R.encode(big, f, saturate=False) == overflow)
    # The tie itself goes to the even neighbour: max when its mantissa is even (E4M3 only).
    assert R.encode(np.array([tie]), f)[0] == f.max_code
    assert R.encode(np.array([tie]), f, saturate=False)[0] == (
        f.max_code if f.max_code % 2 == 0 else overflow)
    assert R.encode(np.array([f.max_normal]), f, saturate=False)[0] == f.max_code


@pytest.mark.parametrize("name, min_sub", [
    ("e2m1", 0.5), ("e2m3", 0.125), ("e3m2", 0.0625), ("e4m3", 2.0**-9), ("e5m2", 2.0**-16),
])
def test_subnormals(name, min_sub):
    f = _f(name)
    n_sub = 1 << f.mbits
    codes = np.arange(n_sub, dtype=np.uint8)  # exponent field 0
    assert np.array_equal(R.decode(codes, f), (np.arange(n_sub) * min_sub).astype(np.float32))
    assert R.decode(np.array([n_sub]), f)[0] == n_sub * min_sub  # first normal continues the grid
    assert R.encode(np.array([min_sub / 2, np.nextafter(min_sub / 2, 1.0), min_sub * 0.75]),
                    f).tolist() == [0, 1, 1]


@pytest.mark.parametrize("name", FMTS)
def test_zero_keeps_sign(name):
    f = _f(name)
    sign = 1 << (f.bits - 1)
    tiny = 2.0 ** (f.emin - f.mbits - 2)  # rounds to zero
    assert R.encode(np.array([0.0, -0.0, tiny, -tiny]), f).tolist() == [0, sign, 0, sign]
    assert np.signbit(R.decode(np.array([sign]), f)[0])


@pytest.mark.parametrize("name", FMTS)
def test_nan_input(name):
    f = _f(name)
    expect = f.nan_code if f.nan_code is not None else f.max_code
    assert R.encode(np.array([np.nan, -np.nan]), f).tolist() == [expect, expect]


def test_e8m0_powers_and_floor():
    e = np.arange(-127, 128)
    assert np.array_equal(R.e8m0_encode(np.ldexp(1.0, e)), (e + 127).astype(np.uint8))
    assert np.array_equal(R.e8m0_encode(np.ldexp(1.99, e)), (e + 127).astype(np.uint8))
    assert np.array_equal(R.e8m0_decode((e + 127).astype(np.uint8)), np.ldexp(np.float32(1), e))
    edge = R.e8m0_encode(np.array([0.0, 2.0**-140, 2.0**130, np.inf, -np.inf, np.nan, -4.0]))
    assert edge.tolist() == [0, 0, 254, 255, 255, 255, 129]


# -- packing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits, codes, packed", [
    (4, [0x1, 0x2], [0x21]), (4, [0xF, 0x0, 0x0, 0x8], [0x0F, 0x80]),
    (6, [0x3F, 0, 0, 0], [0x3F, 0, 0]), (6, [0, 1, 0, 0], [0x40, 0, 0]),
    (6, [0, 0, 0x3F, 0], [0, 0xF0, 0x03]), (6, [0, 0, 0, 0x3F], [0, 0, 0xFC]),
    (6, [1, 2, 3, 4, 5, 6, 7, 8], [0x81, 0x30, 0x10, 0x85, 0x71, 0x20]),
    (8, [0x7E, 0x81], [0x7E, 0x81]),
])
def test_packing_bit_order(bits, codes, packed):
    c = np.array([codes], np.uint8)
    assert R.pack_codes(c, bits).tolist() == [packed]
    assert R.unpack_codes(R.pack_codes(c, bits), bits).tolist() == [codes]


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_packing_round_trip(bits):
    codes = np.random.default_rng(bits).integers(0, 1 << bits, (5, 64)).astype(np.uint8)
    packed = R.pack_codes(codes, bits)
    assert packed.shape == (5, 64 * bits // 8) and packed.dtype == np.uint8
    assert np.array_equal(R.unpack_codes(packed, bits), codes)


# -- scale layouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("m, s", [(1, 1), (128, 4), (129, 5), (300, 17), (256, 64)])
def test_swizzle_round_trip_and_padding(m, s):
    sc = np.random.default_rng(m * s).integers(1, 255, (m, s)).astype(np.uint8)
    sw = R.swizzle_scales(sc)
    mt, kt = -(-m // 128), -(-s // 4)
    assert sw.shape == (mt, kt, 32, 4, 4) and sw.dtype == np.uint8
    assert np.array_equal(R.unswizzle_scales(sw, m, s), sc)
    flat = sw.reshape(-1)
    r, c = np.meshgrid(np.arange(m), np.arange(s), indexing="ij")
    offs = np.vectorize(R.swizzled_offset)(r, c, s)
    assert np.array_equal(flat[offs], sc)
    pad = np.ones(flat.size, bool)
    pad[offs.reshape(-1)] = False
    assert pad.sum() == mt * kt * 512 - m * s and np.all(flat[pad] == R.SCALE_PAD_BYTE)


@pytest.mark.parametrize("r, c, s, offset", [
    (0, 0, 4, 0), (0, 1, 4, 1), (0, 3, 4, 3), (1, 0, 4, 16), (31, 0, 4, 496), (32, 0, 4, 4),
    (96, 2, 4, 14), (0, 4, 8, 512), (33, 5, 8, 533), (128, 0, 8, 1024), (200, 9, 12, 2560 + 128 + 8 + 1),
])
def test_swizzled_offset_formula(r, c, s, offset):
    assert R.swizzled_offset(r, c, s) == offset
    sc = np.zeros((r + 1, s), np.uint8)
    sc[r, c] = 7
    assert np.flatnonzero(R.swizzle_scales(sc).reshape(-1)).tolist() == [offset]


# -- MX ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", MX)
def test_mx_shared_exponent(fmt):
    f = R.MX_FORMATS[fmt]
    x = _data(8, 128, seed=1)
    x[0, :32] = 0.0
    x[0, 32:64] *= np.float32(2.0**-100)  # clamps at -127 for every format
    x[1, 3], x[2, 40], x[3, 70] = np.nan, np.inf, -np.inf
    packed, sc = R.quantize_mx(x, fmt, scale_layout="row_major")
    assert sc.shape == (8, 4) and sc.dtype == np.uint8
    codes = R.unpack_codes(packed, f.bits).reshape(8, 4, 32)
    for i in range(8):
        for j in range(4):
            amax = float(np.max(np.abs(x[i, 32 * j: 32 * j + 32])))
            if not math.isfinite(amax):
                assert sc[i, j] == 0xFF and np.all(codes[i, j] == 0)
            elif amax == 0:
                assert sc[i, j] == 0
            else:
                expect = max(math.frexp(amax)[1] - 1 - f.emax, -127) + 127
                assert sc[i, j] == expect, (i, j, amax)


@pytest.mark.parametrize("fmt", MX)
def test_mx_error_within_half_ulp(fmt):
    f = R.MX_FORMATS[fmt]
    x = _data(16, 256, seed=2)
    packed, sc = R.quantize_mx(x, fmt, scale_layout="row_major")
    y = R.dequantize_mx(packed, sc, fmt).astype(np.float64)
    xs = x.astype(np.float64).reshape(16, 8, 32)
    err = np.abs(y.reshape(16, 8, 32) - xs)
    scale = np.ldexp(1.0, sc.astype(np.int64) - 127)[..., None]
    v = np.abs(xs) / scale
    ex = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), f.emin)
    elem = np.where(v > f.max_normal, v - f.max_normal, 2.0 ** (ex - f.mbits - 1))
    assert np.all(err <= elem * scale)
    rel = err.max(axis=-1) / np.abs(xs).max(axis=-1)
    assert rel.max() <= GROUP_BOUND[fmt]


def test_mx_hand_example():
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [6.0, -3.0, 0.5, 0.25, 7.0]  # amax 7: floor(log2 7) - 2 = 0 -> scale 2**0 = 0x7F
    packed, sc = R.quantize_mx(x, "mxfp4", scale_layout="row_major")
    assert sc.tolist() == [[0x7F]]
    assert packed[0, :3].tolist() == [0xD7, 0x01, 0x07]  # 6|-3, 0.5|0.25->0, 7->6|0
    x[0, :5] = [1.0, 0.0, 0.0, 0.0, 0.0]  # e3m2: shared exp 0 - 4 -> 123, 1.0 / 2**-4 = 16 -> 0x1C
    packed, sc = R.quantize_mx(x, "mxfp6_e3m2", scale_layout="row_major")
    assert sc.tolist() == [[123]] and packed[0, :3].tolist() == [0x1C, 0, 0]


# -- NVFP4 ---------------------------------------------------------------------------------------
def test_nvfp4_global_scale_rule():
    x = _data(64, 128, seed=3, spread=6)
    x[5, 7] = 1000.0  # the tensor amax
    packed, sc, gs = R.quantize_nvfp4(x, scale_layout="row_major")
    assert gs == np.float32(2688.0) / np.float32(1000.0) and gs.dtype == np.float32
    assert sc[5, 0] == 0x7E  # the group holding the tensor amax gets scale 448
    amax_g = np.abs(x.astype(np.float64)).reshape(64, 8, 16).max(axis=-1)
    target = amax_g / 6 * float(gs)
    sf = R.decode(sc, R.E4M3).astype(np.float64)
    normal = target >= 2.0**-6
    assert 300 < normal.sum() < 512  # both branches exercised
    assert np.all(np.abs(sf - target)[normal] <= target[normal] * 2.0**-4 * (1 + 1e-6))
    assert np.all(sf[~normal] == R.decode(R.encode(target[~normal], R.E4M3), R.E4M3))


def test_nvfp4_error_bound():
    x = np.random.default_rng(4).standard_normal((32, 256)).astype(np.float32)
    packed, sc, gs = R.quantize_nvfp4(x)
    assert packed.shape == (32, 128) and sc.shape == (1, 4, 32, 4, 4)
    y = R.dequantize_nvfp4(packed, sc, gs).astype(np.float64).reshape(32, 16, 16)
    xs = x.astype(np.float64).reshape(32, 16, 16)
    rel = np.abs(y - xs).max(axis=-1) / np.abs(xs).max(axis=-1)
    assert rel.max() <= GROUP_BOUND["nvfp4"] * (1 + 1e-6)


def test_nvfp4_hand_example_and_saturation():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [6.0, 3.0, -1.5, 0.5]  # gs = 1: scale 6 / 6 = 1.0 -> 0x38, values exact
    x[0, 16:18] = [4000.0, -1000.0]  # scale 666.7 saturates to 448; 4000 / 448 = 8.9 -> 6
    packed, sc, gs = R.quantize_nvfp4(x, global_scale=1.0, scale_layout="row_major")
    assert gs == 1.0 and sc.tolist() == [[0x38, 0x7E]]
    assert packed[0, :2].tolist() == [0x57, 0x1B] and packed[0, 8] == 0xC7  # -1000/448 -> -2


def test_nvfp4_nonfinite_and_zero():
    x = _data(4, 64, seed=5)
    x[1, 3], x[2, 20] = np.nan, -np.inf
    packed, sc, gs = R.quantize_nvfp4(x, scale_layout="row_major")
    finite_amax = np.abs(x[np.isfinite(x)]).max()
    assert gs == np.float32(2688.0) / finite_amax
    assert sc[1, 0] == 0x7F and sc[2, 1] == 0x7F and np.sum(sc == 0x7F) == 2
    assert np.all(packed[1, :8] == 0) and np.all(packed[2, 8:16] == 0)
    y = R.dequantize_nvfp4(packed, sc, gs)
    assert np.isnan(y[1, :16]).all() and np.isnan(y[2, 16:32]).all() and np.isnan(y).sum() == 32
    packed, sc, gs = R.quantize_nvfp4(np.zeros((3, 16), np.float32))
    assert gs == 1.0 and not packed.any() and not sc.any()


# -- inputs, outputs, layouts --------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [*MX, "nvfp4"])
def test_input_dtypes_layouts_and_outputs(fmt):
    """fp16 / bf16 inputs quantize like their exact fp32 copies; row-major scales are the
    unswizzled swizzled ones; fp16 / bf16 outputs are the fp32 result rounded to nearest even."""
    def q(a, **kw):
        return R.quantize_nvfp4(a, **kw) if fmt == "nvfp4" else R.quantize_mx(a, fmt, **kw)

    def deq(res, out_dtype):
        if fmt == "nvfp4":
            return R.dequantize_nvfp4(*res, out_dtype=out_dtype)
        return R.dequantize_mx(*res, fmt, out_dtype=out_dtype)

    x16 = _data(130, 64, seed=6, spread=8).astype(np.float16)
    bf = f32_to_bf16(_data(130, 64, seed=7))
    for a, exact, kw in ((x16, x16.astype(np.float32), {}),
                         (bf, (bf.astype(np.uint32) << 16).view(np.float32), {"dtype": "bfloat16"})):
        sw = q(a, **kw)
        assert all(np.array_equal(g, w) for g, w in zip(sw, q(exact), strict=True))
        rm = q(a, scale_layout="row_major", **kw)
        assert np.array_equal(R.unswizzle_scales(sw[1], 130, rm[1].shape[1]), rm[1])
        f32 = deq(sw, "float32")
        assert f32.dtype == np.float32 and np.array_equal(deq(rm, "float32"), f32)
        with np.errstate(over="ignore"):  # bf16-range values overflow fp16 to +-inf
            assert np.array_equal(deq(sw, "float16"), f32.astype(np.float16))
        assert np.array_equal(deq(sw, "bfloat16"), f32_to_bf16(f32))


@pytest.mark.parametrize("call, err, match", [
    (lambda: R.quantize_mx(np.zeros((4, 48), np.float32), "mxfp4"), ValueError, "multiple of"),
    (lambda: R.quantize_mx(np.zeros((4, 0), np.float32), "mxfp8_e4m3"), ValueError, "multiple"),
    (lambda: R.quantize_nvfp4(np.zeros((4, 24), np.float32)), ValueError, "group size 16"),
    (lambda: R.quantize_nvfp4(np.zeros(64, np.float32)), ValueError, "2-D"),
    (lambda: R.quantize_mx(np.zeros((4, 32), np.float32), "mxfp5"), ValueError, "fmt"),
    (lambda: R.quantize_mx(np.zeros((4, 32)), "mxfp4"), TypeError, "float16, float32"),
    (lambda: R.quantize_mx(np.zeros((4, 32), np.float32), "mxfp4", dtype="bfloat16"),
     TypeError, "uint16"),
    (lambda: R.quantize_nvfp4(np.ones((4, 16), np.float32), global_scale=0.0), ValueError,
     "global_scale"),
    (lambda: R.quantize_nvfp4(np.ones((4, 16), np.float32), scale_layout="col"), ValueError,
     "scale_layout"),
    (lambda: R.pack_fp6(np.zeros((2, 6), np.uint8)), ValueError, "multiple of 4"),
    (lambda: R.pack_fp4(np.zeros((2, 3), np.uint8)), ValueError, "multiple of 2"),
    (lambda: R.unswizzle_scales(np.zeros((1, 1, 32, 4, 4), np.uint8), 129, 4), ValueError,
     "expected"),
    (lambda: R.dequantize_mx(np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8), "mxfp4"),
     ValueError, "row-major"),
])
def test_bad_arguments_rejected(call, err, match):
    with pytest.raises(err, match=match):
        call()
