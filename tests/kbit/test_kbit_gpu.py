"""kbit kernels on the GPU against the NumPy reference: bit-exact planes, scales and values.

Outputs are poisoned (KERNELGEN_POISON=1) so an unwritten element shows as a mismatch.
"""

import numpy as np
import pytest

from kernelgen.kbit import reference as R

pytestmark = pytest.mark.gpu

BITS = (2, 3, 4, 5)
DTYPES = ("float16", "bfloat16", "float32")


def _sizes(bits):
    """Element counts at and around every boundary: block (32), warp step (32*BPW blocks),
    CTA (8 warps), plus a large odd size."""
    bpw = 32 // bits
    step, cta = 32 * bpw, 32 * bpw * 8
    base = {1, 2, 31, 32, 33, step - 1, step, step + 1, cta - 32, cta, cta + 1, 3 * cta + 17,
            (1 << 20) + 5}
    return sorted(base)


@pytest.fixture(autouse=True)
def _poison(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(x, dtype, n, rng):
    v = (rng.standard_normal(n) * rng.uniform(0.01, 8)).astype(np.float32)
    if dtype == "bfloat16":
        return R.f32_to_bf16(v)
    return v.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_quantize_dequantize_exact(bits, dtype):
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    cb = R.create_normal_float_codebook(bits)
    for n in _sizes(bits):
        xh = _host(None, dtype, n, rng)
        q = kg.quantize_kbit(cupy.asarray(xh), bits, dtype=dtype if dtype == "bfloat16" else None)
        p_ref, a_ref, a8_ref = R.quantize(xh, bits, cb, dtype=dtype)
        ctx = f"{bits=} {dtype=} {n=}"
        np.testing.assert_array_equal(cupy.asnumpy(q.packed), p_ref, err_msg=ctx)
        np.testing.assert_array_equal(cupy.asnumpy(q.absmax_f32), a_ref, err_msg=ctx)
        np.testing.assert_array_equal(cupy.asnumpy(q.absmax), a8_ref, err_msg=ctx)
        for out_dtype in DTYPES:
            for scales, sref in ((None, a8_ref), (q.absmax_f32.astype(cupy.float16), a_ref.astype(np.float16)),
                                 (q.absmax_f32, a_ref)):
                y = kg.dequantize_kbit(q, out_dtype, absmax=scales)
                y_ref = R.dequantize(p_ref, sref, cb, bits, n, out_dtype)
                np.testing.assert_array_equal(cupy.asnumpy(y).reshape(-1), y_ref,
                                              err_msg=f"{ctx} {out_dtype=} scales={sref.dtype}")


@pytest.mark.parametrize("bits", BITS)
def test_error_bound_and_sqnr(bits):
    import cupy

    import kernelgen as kg

    x = cupy.random.standard_normal(1 << 20, dtype=cupy.float32)
    q = kg.quantize_kbit(x, bits)
    y = cupy.asnumpy(kg.dequantize_kbit(q, "float32"))
    xh = cupy.asnumpy(x)
    cb = R.create_normal_float_codebook(bits)
    err = np.abs(y - xh).reshape(-1, 32).max(axis=1)
    assert np.all(err <= R.error_bound(cb, cupy.asnumpy(q.absmax_f32))), f"{bits=}"
    assert R.sqnr_db(xh, y) >= {2: 5, 3: 10, 4: 15, 5: 20}[bits]


def test_e4m4_codec_exact():
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    x = np.concatenate([
        np.exp(rng.uniform(-12, 4, 100_003)).astype(np.float32),
        np.array([0, -1, np.nan, np.inf, 31, 30.99, 2.0**-14, 2.0**-15, 1e-30], np.float32),
        R.e4m4_decode(np.arange(256, dtype=np.uint8)),
    ])
    enc = kg.encode_e4m4(cupy.asarray(x))
    np.testing.assert_array_equal(cupy.asnumpy(enc), R.e4m4_encode(x))
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(cupy.asnumpy(kg.decode_e4m4(cupy.asarray(codes))), R.e4m4_decode(codes))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("shape", [(128, 64), (256, 4096), (4096, 128)])
def test_repack_exact(bits, shape):
    import cupy

    import kernelgen as kg

    w = cupy.random.standard_normal(shape, dtype=cupy.float32).astype(cupy.float16)
    q = kg.quantize_kbit(w, bits)
    t = kg.repack_kbit(q)
    p_ref, a_ref = R.repack(cupy.asnumpy(q.packed), cupy.asnumpy(q.absmax), *shape, bits, 128, 64)
    np.testing.assert_array_equal(cupy.asnumpy(t.packed), p_ref, err_msg=f"{bits=} {shape=}")
    np.testing.assert_array_equal(cupy.asnumpy(t.absmax), a_ref, err_msg=f"{bits=} {shape=}")


def test_torch_roundtrip_and_stream():
    torch = pytest.importorskip("torch")
    import kernelgen as kg

    x = torch.randn(1000, 96, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        q = kg.quantize_kbit(x, 4)
        y = kg.dequantize_kbit(q)
    s.synchronize()
    assert isinstance(q.packed, torch.Tensor) and isinstance(y, torch.Tensor)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    cb = R.create_normal_float_codebook(4)
    xh = x.view(torch.int16).cpu().numpy().view(np.uint16)
    p_ref, _, a8 = R.quantize(xh, 4, cb, dtype="bfloat16")
    y_ref = R.dequantize(p_ref, a8, cb, 4, x.numel(), "bfloat16")
    np.testing.assert_array_equal(y.view(torch.int16).cpu().numpy().view(np.uint16).reshape(-1), y_ref)


def test_bad_inputs():
    import cupy

    import kernelgen as kg

    x = cupy.ones((64, 64), cupy.float16)
    with pytest.raises(ValueError, match="bits"):
        kg.quantize_kbit(x, 6)
    with pytest.raises(ValueError, match="x: dtype int32"):
        kg.quantize_kbit(cupy.ones(64, cupy.int32), 4)
    with pytest.raises(ValueError, match="must be contiguous"):
        kg.quantize_kbit(x[:, ::2], 4)
    with pytest.raises(ValueError, match="no elements"):
        kg.quantize_kbit(cupy.ones(0, cupy.float16), 4)
    with pytest.raises(ValueError, match="x: dtype='float32' given for an array of float16"):
        kg.quantize_kbit(x, 4, dtype="float32")
    assert kg.quantize_kbit(x, 4, dtype=np.dtype("float16")).dtype == "float16"
    with pytest.raises(ValueError, match="cupy.asarray"):
        kg.quantize_kbit(np.ones(64, np.float16), 4)
    q = kg.quantize_kbit(x, 4)
    with pytest.raises(ValueError, match="absmax: 3 scales"):
        kg.dequantize_kbit(q, absmax=cupy.ones(3, cupy.float32))
    with pytest.raises(ValueError, match="dtype='float64'"):
        kg.dequantize_kbit(q, "float64")
    with pytest.raises(ValueError, match="out: has"):
        kg.dequantize_kbit(q, "float16", out=cupy.empty(5, cupy.float16))
    with pytest.raises(ValueError, match="codebook: has 4 entries"):
        kg.quantize_kbit(x, 4, codebook=cupy.ones(4, cupy.float32))
    with pytest.raises(ValueError, match="multiple of tile_n"):
        kg.repack_kbit(kg.quantize_kbit(cupy.ones((100, 64), cupy.float16), 4))
    with pytest.raises(ValueError, match="2-D"):
        kg.repack_kbit(kg.quantize_kbit(cupy.ones(4096, cupy.float16), 4))
