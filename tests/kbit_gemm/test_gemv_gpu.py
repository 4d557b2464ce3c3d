"""kbit GEMM bandwidth path on the GPU against the NumPy reference (dequantize with the E4M4
scales, then matmul in float64): relative error bounds per dtype, every bit-width, M across the
m-tile boundaries, partial row tiles and K quads, split-K off / auto / forced.

Outputs are poisoned (KERNELGEN_POISON=1: NaN for fp16/bf16) or pre-filled with NaN through
out=, so an element the kernel does not write fails the bound.
"""

import functools

import numpy as np
import pytest

from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import quantize_weight
from kernelgen.kbit_gemm import reference as GR

pytestmark = pytest.mark.gpu

# these tests check the flat layout's kernels (4-bit weights default to the tiled layout:
# test_tiled_gpu.py)
quantize_flat = functools.partial(quantize_weight, layout="flat")

BITS = (2, 3, 4, 5)
DTYPES = ("float16", "bfloat16")
MS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33)
# N not a multiple of 16 (partial warp tiles) and not a power of 2; K = 3, 8 and 33 groups of
# 128 (partial quad steps; uneven splits)
SHAPES = ((200, 384), (96, 1024), (1000, 4224))
SPLITS = (None, 1, 3)  # selector's choice, split-K off, forced on


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(rng, shape, dtype, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    return R.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


@functools.cache
def _weight(bits, dtype, n, k, seed=0):
    """(KbitLinear, W float64 as the kernel sees it) for one shape, built once per module."""
    import cupy

    rng = np.random.default_rng(1000 * bits + n + k + seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 3.0, (n, 1))).astype(np.float32)
    lin = quantize_flat(cupy.asarray(_host_w(w, dtype)), bits,
                             dtype="bfloat16" if dtype == "bfloat16" else None)
    w64 = GR.dequantize_weight(cupy.asnumpy(lin.q.packed), cupy.asnumpy(lin.q.absmax),
                               cupy.asnumpy(lin.q.codebook), bits, n, k)
    return lin, w64


def _host_w(w, dtype):
    return R.f32_to_bf16(w) if dtype == "bfloat16" else w.astype(np.float16)


def _split_fits(split, m, n, k, bits, dtype):
    """Whether a forced split_k is allowed: a CTA's A slice must fit its shared memory."""
    from kernelgen.kbit_gemm.select import plan_gemv

    if split is None:
        return True
    try:
        plan_gemv("sm_90a", m, n, k, bits, dtype, 132, split=split)
    except ValueError as e:
        assert "does not fit shared memory" in str(e)
        return False
    return True


def _check(c_dev, c_ref, dtype, ctx):
    import cupy

    c = GR.to_float64(cupy.asnumpy(c_dev), dtype)
    assert np.all(np.isfinite(c)), f"{ctx}: {int(np.sum(~np.isfinite(c)))} elements not written / not finite"
    err = GR.rel_error(c, c_ref)
    if not err <= GR.REL_ERROR_BOUND[dtype]:  # say where: which tokens / rows are off
        c2, r2 = c.reshape(-1, c.shape[-1]), c_ref.reshape(-1, c_ref.shape[-1])
        bad = np.abs(c2 - r2) > 0.05 * (np.abs(r2) + np.linalg.norm(r2) / np.sqrt(r2.size))
        ms, ns = np.nonzero(bad)
        where = (f"{bad.mean():.1%} bad; tokens {sorted(set(ms.tolist()))[:8]}, rows mod 16 "
                 f"{sorted(set((ns % 16).tolist()))}, rows {ns[:8].tolist()}")
        raise AssertionError(f"{ctx}: rel error {err:.3g}; {where}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_gemm_matches_reference(bits, dtype):
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        lin, w64 = _weight(bits, dtype, n, k)
        for m in MS:
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            c_ref = GR.gemm(a, w64, bias, dtype)
            a_d = cupy.asarray(a)
            b_d = None if bias is None else cupy.asarray(bias)
            for split in SPLITS:
                ctx = f"{bits=} {dtype=} {m=} {n=} {k=} {split=} bias={bias is not None}"
                if not _split_fits(split, m, n, k, bits, dtype):
                    with pytest.raises(ValueError, match="does not fit shared memory"):
                        kg.gemm(a_d, lin, b_d, dtype=hint, split_k=split)
                    continue
                c = kg.gemm(a_d, lin, b_d, dtype=hint, split_k=split)
                assert c.shape == (m, n) and c.dtype == a_d.dtype, ctx
                _check(c, c_ref, dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_block_scales(dtype):
    """Blocks whose absmax is below 2^-10 get E4M4 subnormal scales, which the kernel turns into
    T subnormals (ScaleBits): every weight tiny, so a flushed or misplaced scale fails the bound."""
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    n, k = 96, 1024
    w = (rng.standard_normal((n, k)) * rng.uniform(2e-5, 1e-4, (n, 1))).astype(np.float32)
    lin = quantize_flat(cupy.asarray(_host_w(w, dtype)), 4, dtype=hint)
    amax = cupy.asnumpy(lin.q.absmax)
    assert np.all((amax >> 4) == 0), "the test needs E4M4 subnormal scales"
    w64 = GR.dequantize_weight(cupy.asnumpy(lin.q.packed), amax, cupy.asnumpy(lin.q.codebook), 4, n, k)
    a = _host(rng, (3, k), dtype, scale=100.0)
    c_ref = GR.gemm(a, w64, None, dtype)
    for split in (None, 3):
        c = kg.gemm(cupy.asarray(a), lin, dtype=hint, split_k=split)
        _check(c, c_ref, dtype, f"{dtype=} tiny scales {split=}")


@pytest.mark.parametrize("bits", (2, 4))
def test_out_buffer_and_leading_dims(bits):
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    n, k = 1000, 4224
    lin, w64 = _weight(bits, "float16", n, k)
    a = _host(rng, (3, 5, k), "float16")
    c_ref = GR.gemm(a, w64)
    for split in SPLITS:
        if not _split_fits(split, 15, n, k, bits, "float16"):
            continue  # 15 rows x 4224 k of A exceed a CTA's shared memory unsplit
        out = cupy.full((3, 5, n), np.nan, cupy.float16)
        res = kg.gemm(cupy.asarray(a), lin, out=out, split_k=split)
        assert res is out
        _check(out, c_ref, "float16", f"{bits=} {split=} out=")
    out = cupy.full((3, 5, n), np.nan, cupy.float16)
    assert lin(cupy.asarray(a), out=out) is out  # the layer form
    _check(out, c_ref, "float16", f"{bits=} lin(A, out=)")


@pytest.mark.parametrize("bits", BITS)
def test_gemv_many_passes_one_cta_an_sm(bits):
    """The GEMV past 64 tokens (N % 128 != 0 keeps it up to dequant_min_m; forced here): 5-10
    passes of 16 tokens, one CTA an SM (select.py ONE_CTA_MIN_M), on a weight above
    GEMV_SMALL_WEIGHT; the last pass partial."""
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.core.interop import smem_limit
    from kernelgen.kbit_gemm.select import ONE_CTA_WARPS, select_gemv

    info = device_info()
    n, k = 4100, 4224
    lin, w64 = _weight(bits, "float16", n, k)
    rng = np.random.default_rng()
    for m in (65, 100, 159):
        p = select_gemv(info.arch.name, m, n, k, bits, "float16", info.sm_count, smem_limit(info.index))
        assert (p.config.warps, p.config.min_blocks) == (ONE_CTA_WARPS, 1), p.short()
        a = _host(rng, (m, k), "float16")
        bias = _host(rng, (n,), "float16")
        c = kg.gemm(cupy.asarray(a), lin, cupy.asarray(bias), path="gemv")  # poisoned output
        _check(c, GR.gemm(a, w64, bias, "float16"), "float16", f"{bits=} {m=}")


@pytest.mark.parametrize("bits", (2, 5))
def test_gemv_one_cta_on_a_part_with_99_kb(bits, monkeypatch):
    """A device whose blocks get 99 KB (8.6 / 8.9 parts; here the limit is lowered to it): the
    one-CTA configs opt in to that, not to the arch's 227 KB (a DeviceError at load before), and
    their plans keep the A slice within it."""
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.core import interop, jit
    from kernelgen.kbit_gemm.select import select_gemv

    info = device_info()
    lim = 99 * 1024
    n, k = 4096, 4224
    lin, w64 = _weight(bits, "float16", n, k)
    monkeypatch.setitem(interop._smem_limits, info.index, (lim, "test part of 99 KB"))
    # modules loaded here opt in to 99 KB only: keep them from the other tests
    monkeypatch.setattr(jit, "_loaded", {})
    rng = np.random.default_rng()
    for m in (1, 8, 16):
        p = select_gemv(info.arch.name, m, n, k, bits, "float16", info.sm_count, lim)
        assert p.smem <= lim and (m < 4 and bits == 2 or p.config.min_blocks == 1), p.short()
        a = _host(rng, (m, k), "float16")
        c = kg.gemm(cupy.asarray(a), lin, path="gemv")
        _check(c, GR.gemm(a, w64, None, "float16"), "float16", f"{bits=} {m=} {p.short()}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_path_with_n_not_a_multiple_of_8(dtype):
    """dequantize + cuBLAS where N % 8 != 0: the GEMM runs over N rounded up (core/dense.py
    ROW_ALIGN: garbage rows past N, C in a padded scratch) and only C [M, N] is written (the
    output is poisoned; a bias, and without one)."""
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((1001, 4224), (4100, 1024)):
        for bits in (2, 5):
            lin, w64 = _weight(bits, dtype, n, k)
            for m in (3, 200):
                a = _host(rng, (m, k), dtype)
                bias = _host(rng, (n,), dtype) if m == 3 else None
                c = kg.gemm(cupy.asarray(a), lin, None if bias is None else cupy.asarray(bias),
                            dtype=hint, path="dequant")
                assert c.shape == (m, n)
                _check(c, GR.gemm(a, w64, bias, dtype), dtype, f"{n=} {k=} {bits=} {m=}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_shape_and_determinism(dtype):
    """A shape where the selector splits K over many CTAs: same bits twice (ordered reduction)."""
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    n, k = 2048, 8192
    lin, w64 = _weight(4, dtype, n, k)
    for m in (1, 16):
        a = _host(rng, (m, k), dtype)
        a_d = cupy.asarray(a)
        c1 = kg.gemm(a_d, lin, dtype=hint)
        c2 = kg.gemm(a_d, lin, dtype=hint)
        _check(c1, GR.gemm(a, w64, None, dtype), dtype, f"{m=} {n=} {k=}")
        assert bool((c1.view(cupy.uint16) == c2.view(cupy.uint16)).all()), f"{m=}: not deterministic"


def test_m_zero_and_codebook():
    import cupy

    import kernelgen as kg

    lin, _ = _weight(3, "float16", 96, 1024)
    assert kg.gemm(cupy.empty((0, 1024), cupy.float16), lin).shape == (0, 96)
    # a custom codebook goes through the same table
    rng = np.random.default_rng()
    cb = np.sort(rng.uniform(-1, 1, 8)).astype(np.float32)
    w = rng.standard_normal((96, 1024)).astype(np.float16)
    lin2 = quantize_flat(cupy.asarray(w), 3, codebook=cupy.asarray(cb))
    w64 = GR.dequantize_weight(cupy.asnumpy(lin2.q.packed), cupy.asnumpy(lin2.q.absmax), cb, 3, 96, 1024)
    a = _host(rng, (4, 1024), "float16")
    _check(kg.gemm(cupy.asarray(a), lin2), GR.gemm(a, w64), "float16", "custom codebook")


def test_torch_inputs_and_stream():
    torch = pytest.importorskip("torch")
    import kernelgen as kg

    n, k = 200, 384
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    lin = quantize_flat(w, 4)
    w64 = GR.dequantize_weight(lin.q.packed.view(torch.int32).cpu().numpy().view(np.uint32),
                               lin.q.absmax.cpu().numpy(), lin.q.codebook.cpu().numpy(), 4, n, k)
    s = torch.cuda.Stream()
    for m in (1, 5, 16, 33):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        with torch.cuda.stream(s):
            c = kg.gemm(a, lin, bias)
            kg.gemm(a, lin, bias, out=out, split_k=3)
        s.synchronize()
        assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16 and c.shape == (m, n)
        a_h = a.view(torch.int16).cpu().numpy().view(np.uint16)
        b_h = bias.view(torch.int16).cpu().numpy().view(np.uint16)
        c_ref = GR.gemm(a_h, w64, b_h, "bfloat16")
        for res in (c, out):
            _check(res.view(torch.int16).cpu().numpy().view(np.uint16), c_ref, "bfloat16", f"torch {m=}")


def test_bad_inputs():
    import cupy

    import kernelgen as kg

    lin, _ = _weight(4, "float16", 96, 1024)
    a = cupy.ones((2, 1024), cupy.float16)
    with pytest.raises(ValueError, match="A: K=512 does not match the weight's K=1024"):
        kg.gemm(cupy.ones((2, 512), cupy.float16), lin)
    with pytest.raises(ValueError, match="A: dtype float32 not supported"):
        kg.gemm(cupy.ones((2, 1024), cupy.float32), lin)
    with pytest.raises(ValueError, match="A: must be contiguous"):
        kg.gemm(cupy.ones((2, 2048), cupy.float16)[:, ::2], lin)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kg.gemm(cupy.ones(2 * 1024 + 1, cupy.float16)[1:].reshape(2, 1024), lin)
    with pytest.raises(ValueError, match=r"A: expected \[M, K\]"):
        kg.gemm(cupy.ones(1024, cupy.float16), lin)
    with pytest.raises(ValueError, match="bias: has 95 elements, W has N=96"):
        kg.gemm(a, lin, cupy.ones(95, cupy.float16))
    with pytest.raises(ValueError, match="bias: dtype bfloat16 not supported|bias: dtype uint16"):
        kg.gemm(a, lin, cupy.ones(96, cupy.uint16))
    with pytest.raises(ValueError, match=r"out: shape \(2, 95\); expected \(2, 96\)"):
        kg.gemm(a, lin, out=cupy.empty((2, 95), cupy.float16))
    with pytest.raises(ValueError, match="out: dtype float32"):
        kg.gemm(a, lin, out=cupy.empty((2, 96), cupy.float32))
    with pytest.raises(ValueError, match=r"split_k=9: must be in 1\.\.8"):
        kg.gemm(a, lin, split_k=9)
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_flat(cupy.ones((96, 1000), cupy.float16), 4)
    with pytest.raises(ValueError, match="W: expected a KbitLinear"):
        kg.gemm(a, lin.q)
    assert kg.KbitLinear.from_kbit(lin.q).shape == (96, 1024)
    with pytest.raises(ValueError, match="2-D weight"):
        kg.KbitLinear.from_kbit(kg.quantize_kbit(cupy.ones(4096, cupy.float16), 4))


# K warps (kw): the tile's quad steps dealt over kw warps of a CTA, sums reduced in shared memory.
# (kw, launch): the table's CTA shape, and forced shapes the tuning sweep times (4 warps x 4
# CTAs, 4 warps x 3). Quad-step counts 1, 2, 3 and 9 (K = 384, 1024, 4224 unsplit / split 3)
# leave K warps with only zero-scale steps and uneven shares.
KW_VARIANTS = ((2, None), (4, None), (2, (4, 4)), (4, (4, 3)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_gemm_k_warps_match_reference(bits, dtype):
    import cupy

    from kernelgen.kbit_gemm.api import gemm_with_plan
    from kernelgen.kbit_gemm.select import plan_gemv

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        lin, w64 = _weight(bits, dtype, n, k)
        for m in (1, 3, 8, 9, 16, 17, 33):
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            c_ref = GR.gemm(a, w64, bias, dtype)
            a_d = cupy.asarray(a)
            b_d = None if bias is None else cupy.asarray(bias)
            for kw, launch in KW_VARIANTS:
                if launch is not None and bits == 5 and launch[1] == 4:
                    continue  # 5 bits: a 64 KB table, 4 CTAs an SM do not fit
                for split in (None, 1, 3):
                    ctx = f"{bits=} {dtype=} {m=} {n=} {k=} {kw=} {launch=} {split=}"
                    try:
                        plan = plan_gemv("sm_90a", m, n, k, bits, dtype, 132, split, kw, launch)
                    except ValueError as e:
                        assert "does not fit shared memory" in str(e) or "no shared memory" in str(e), ctx
                        continue
                    assert plan.config.kw == kw, ctx
                    # NaN in the output's storage (bf16 is uint16 here: 0xFFFF, not a cast NaN)
                    out = cupy.full((m, n), 0xFFFF if a_d.dtype == cupy.uint16 else np.nan, a_d.dtype)
                    c = gemm_with_plan(a_d, lin, plan, b_d, out=out, dtype=hint)
                    assert c is out, ctx
                    _check(c, c_ref, dtype, f"{ctx} {plan.short()}")
                    c2 = gemm_with_plan(a_d, lin, plan, b_d, dtype=hint)  # poisoned output
                    assert bool((c.view(cupy.uint16) == c2.view(cupy.uint16)).all()), \
                        f"{ctx}: not deterministic"


def test_gemm_kw_argument():
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    n, k = 1000, 4224
    lin, w64 = _weight(4, "float16", n, k)
    a = _host(rng, (2, k), "float16")
    for kw in (1, 2, 4):
        _check(kg.gemm(cupy.asarray(a), lin, kw=kw), GR.gemm(a, w64), "float16", f"{kw=}")
    with pytest.raises(ValueError, match="kw=3: expected one of"):
        kg.gemm(cupy.asarray(a), lin, kw=3)
    with pytest.raises(ValueError, match="kw=2: only the gemv path"):
        kg.gemm(cupy.asarray(a), lin, kw=2, path="mma")
    # kw implies the gemv path where the selector would take the mma path
    a64 = _host(rng, (64, k), "float16")
    _check(kg.gemm(cupy.asarray(a64), lin, kw=2), GR.gemm(a64, w64), "float16", "kw=2 M=64")
