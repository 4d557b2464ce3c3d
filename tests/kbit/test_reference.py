"""The NumPy reference of the kbit format (no GPU): codebooks, E4M4, quantize/dequantize, repack."""

import numpy as np
import pytest

from kernelgen.kbit import reference as R

BITS = (2, 3, 4, 5)
SQNR_MIN_DB = {2: 5.0, 3: 10.0, 4: 15.0, 5: 20.0}  # seed 002 §12.2, 1M normal samples


@pytest.mark.parametrize("bits", BITS)
def test_codebook_shape(bits):
    cb = R.create_normal_float_codebook(bits)
    assert cb.dtype == np.float32 and cb.shape == (1 << bits,)
    assert np.all(np.diff(cb) > 0), f"{bits=} not strictly ascending: {cb}"
    assert np.max(np.abs(cb)) == 1.0
    np.testing.assert_allclose(cb, -cb[::-1], atol=1e-6, err_msg=f"{bits=} not symmetric")


def test_codebook_rejects_bits():
    with pytest.raises(ValueError, match="bits=6"):
        R.create_normal_float_codebook(6)


def test_e4m4_roundtrip_every_code():
    codes = np.arange(256, dtype=np.uint8)
    vals = R.e4m4_decode(codes)
    assert np.all(np.diff(vals) > 0), "decode must be strictly increasing"
    assert vals[0] == 0 and vals[-1] == 31.0 and vals[1] == 2.0**-14 and vals[16] == 2.0**-10
    np.testing.assert_array_equal(R.e4m4_encode(vals), codes)


def test_e4m4_rounding_and_specials():
    x = np.array([0, -1, np.nan, np.inf, 31, 40, 1e-9, 1.03125, 1.09375], np.float32)
    # 1.03125 is halfway between codes 1.0 (m=0) and 1.0625 (m=1): ties to even -> m=0;
    # 1.09375 is halfway between m=1 and m=2: ties to even -> m=2.
    assert list(R.e4m4_encode(x)) == [0, 0, 0, 255, 255, 255, 0, 0xB0, 0xB2]


def test_e4m4_nearest():
    rng = np.random.default_rng()
    x = np.exp(rng.uniform(np.log(2.0**-14), np.log(31.0), 100_000)).astype(np.float32)
    enc = R.e4m4_encode(x)
    dec = R.e4m4_decode(enc).astype(np.float64)
    grid = R.e4m4_decode(np.arange(256, dtype=np.uint8)).astype(np.float64)
    best = np.min(np.abs(grid[None, :] - x[:2000, None].astype(np.float64)), axis=1)
    np.testing.assert_allclose(np.abs(dec[:2000] - x[:2000]), best, rtol=0, atol=0)
    normal = x >= 2.0**-10  # relative error 1/32 in the normal range, 2^-15 absolute below
    assert np.max((np.abs(dec - x) / x)[normal]) <= 1 / 32 + 1e-7
    assert np.max(np.abs(dec - x)[~normal]) <= 2.0**-15


@pytest.mark.parametrize("bits", BITS)
def test_sqnr_and_bound(bits):
    rng = np.random.default_rng()
    x = rng.standard_normal(1 << 20).astype(np.float32)
    cb = R.create_normal_float_codebook(bits)
    packed, amax, amax8 = R.quantize(x, bits, cb)
    assert packed.shape == (x.size // 32 * bits,) and amax8.dtype == np.uint8
    y = R.dequantize(packed, amax8, cb, bits, x.size)
    err = np.abs(y - x).reshape(-1, 32).max(axis=1)
    assert np.all(err <= R.error_bound(cb, amax)), f"{bits=} error above the §12 bound"
    assert R.sqnr_db(x, y) >= SQNR_MIN_DB[bits], f"{bits=} SQNR {R.sqnr_db(x, y):.2f} dB"
    # E4M4 costs < 1.5 dB against exact fp32 scales
    y32 = R.dequantize(packed, amax, cb, bits, x.size)
    assert R.sqnr_db(x, y32) - R.sqnr_db(x, y) < 1.5


@pytest.mark.parametrize("bits", BITS)
def test_indices_are_nearest(bits):
    rng = np.random.default_rng()
    x = rng.standard_normal(32 * 64).astype(np.float32)
    cb = R.create_normal_float_codebook(bits)
    packed, amax, _ = R.quantize(x, bits, cb)
    idx = R.unpack_indices(packed, bits).reshape(-1)
    # The format's normalized value: RN(x * RN(1 / amax)) (within 1 ulp of x / amax).
    q = (x.reshape(-1, 32) * (np.float32(1) / amax)[:, None]).reshape(-1)
    brute = np.argmin(np.abs(q[:, None] - cb[None, :]), axis=1)
    # Midpoint search and brute force agree except on exact ties (none for random data).
    np.testing.assert_array_equal(idx, brute)


def test_partial_block_and_bf16():
    x = np.linspace(-3, 3, 45, dtype=np.float32)
    bf = R.f32_to_bf16(x)
    cb = R.create_normal_float_codebook(3)
    p1, a1, _ = R.quantize(bf, 3, cb, dtype="bfloat16")
    p2, a2, _ = R.quantize(R.bf16_to_f32(bf), 3, cb)
    np.testing.assert_array_equal(p1, p2)
    assert p1.shape == (2 * 3,)
    y = R.dequantize(p1, a1, cb, 3, 45, dtype="bfloat16")
    assert y.dtype == np.uint16 and y.shape == (45,)


def test_bf16_rounding():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf], np.float32)
    # 1+2^-8 is a tie between 1.0 and 1+2^-7 -> even (1.0); 1+3*2^-8 ties -> 1+2^-6.
    np.testing.assert_array_equal(R.bf16_to_f32(R.f32_to_bf16(x)),
                                  np.array([1.0, 1.0, 1.015625, -2.5, np.inf], np.float32))
    assert np.isnan(R.bf16_to_f32(R.f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_repack_moves_every_block():
    n, k, bits, tn, tk = 256, 128, 3, 128, 64
    nb = n * k // 32
    packed = np.arange(nb * bits, dtype=np.uint32)
    absmax = (np.arange(nb) % 251).astype(np.uint8)
    pt, at = R.repack(packed, absmax, n, k, bits, tn, tk)
    assert sorted(pt.tolist()) == packed.tolist()
    # element (row r, k-block kb) lands at [kb // 2][r // tn][r % tn][kb % 2]
    r, kb = 200, 3
    src = r * (k // 32) + kb
    dst = (((kb // 2) * (n // tn) + r // tn) * tn + r % tn) * 2 + kb % 2
    assert at[dst] == absmax[src]
    assert list(pt[dst * bits:(dst + 1) * bits]) == list(packed[src * bits:(src + 1) * bits])
