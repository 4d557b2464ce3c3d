"""4-bit kbit weights in the tiled layout (kernelgen/kbit_gemm/tiled.py) on the GPU: every path
(gemv, tile, dequant; wgmma on sm_90a) against the NumPy reference of the same quantized weight (dequantize with
the E4M4 scales, matmul in float64), both dtypes, M from 1 to 4097, several (N, K) (N not a
multiple of 16 or 128 included), K splits off / auto / forced, bias, out=, torch, graphs; the
tiled dequantize against the flat one bit for bit; flat 2..4-bit weights on the wgmma kernel
(gemm(..., path="wgmma")).

Outputs are poisoned (KERNELGEN_POISON=1: NaN) or pre-filled with NaN through out=, so an element
the kernel does not write fails.
"""

import functools

import numpy as np
import pytest

from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import reference as GR

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16")
MS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 127, 128, 255, 1024, 4097)
# N: 13 tiles of 16 with a partial one, 3 x 128, 1152 (9 tile CTAs); K: 3, 8, 33 steps of 128
SHAPES = ((200, 384), (384, 1024), (1152, 4224))
SPLITS = (None, 1, 3)


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(rng, shape, dtype, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    return R.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


@functools.cache
def _weights(dtype, n, k):
    """(tiled KbitLinear, flat KbitLinear of the same codes, W float64 as the kernels see it)."""
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng(7 * n + k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 3.0, (n, 1))).astype(np.float32)
    w_host = R.f32_to_bf16(w) if dtype == "bfloat16" else w.astype(np.float16)
    flat = kg.quantize_weight(cupy.asarray(w_host), 4, layout="flat",
                              dtype="bfloat16" if dtype == "bfloat16" else None)
    tiled = kg.KbitLinear.from_kbit(flat.q)
    assert tiled.layout == "tiled" and tiled.q is None and tiled.bits == 4
    w64 = GR.dequantize_weight(cupy.asnumpy(flat.q.packed), cupy.asnumpy(flat.q.absmax),
                               cupy.asnumpy(flat.q.codebook), 4, n, k)
    return tiled, flat, w64


def _check(c_dev, c_ref, dtype, ctx):
    import cupy

    c = GR.to_float64(cupy.asnumpy(c_dev), dtype)
    assert np.all(np.isfinite(c)), f"{ctx}: {int(np.sum(~np.isfinite(c)))} elements not written / not finite"
    err = GR.rel_error(c, c_ref)
    assert err <= GR.REL_ERROR_BOUND[dtype], f"{ctx}: rel error {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_path_matches_reference(shape, dtype):
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.kbit_gemm.tiled import plan_tiled

    n, k = shape
    lin, _, w64 = _weights(dtype, n, k)
    info = device_info()
    rng = np.random.default_rng(n + k)
    hint = "bfloat16" if dtype == "bfloat16" else None
    bias = _host(rng, (n,), dtype)
    for m in MS:
        a = _host(rng, (m, k), dtype)
        c_ref = GR.gemm(a, w64, bias, dtype)
        a_d, b_d = cupy.asarray(a), cupy.asarray(bias)
        auto = plan_tiled(info.arch.name, m, n, k, dtype, info.sm_count).path
        paths = ["gemv"] if m <= 128 else []
        paths += ["tile"] if m <= 1024 else []
        paths += ["dequant"] if m >= 16 else []
        paths += ["wgmma"] if info.arch.name == "sm_90a" and m <= 1024 else []
        for path in [None, *paths]:
            for split in SPLITS if path in ("gemv", "tile", "wgmma") else (None,):
                ctx = f"{dtype=} {m=} {n=} {k=} path={path or auto} {split=}"
                c = kg.gemm(a_d, lin, b_d, dtype=hint, path=path, split_k=split)
                _check(c, c_ref, dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_block_scales_over_the_e4m4_range(dtype):
    """Rows scaled from 2^-17 to 2^4, so the E4M4 block scales run from subnormals (below 2^-10)
    to the largest ones, plus all-zero blocks: the bandwidth path at M = 1, 5, 8 (scales applied
    in fp32 after the mma, fp4.cuh KbitPost) and 16 (in T before it) matches the reference row
    by row, each output's error relative to its row's sum of |w| |a| (a global norm would hide
    the small rows)."""
    import cupy

    import kernelgen as kg

    n, k = 256, 1024
    rng = np.random.default_rng()
    w = rng.standard_normal((n, k)) * 2.0 ** rng.uniform(-17, 4, (n, 1))
    w[::5, 96:160] = 0.0  # zero blocks (scale byte 0) beside live ones
    w_host = R.f32_to_bf16(w.astype(np.float32)) if dtype == "bfloat16" else w.astype(np.float16)
    flat = kg.quantize_weight(cupy.asarray(w_host), 4, layout="flat",
                              dtype="bfloat16" if dtype == "bfloat16" else None)
    absmax = cupy.asnumpy(flat.q.absmax)
    assert np.any((absmax >> 4 == 0) & (absmax != 0)), "no subnormal E4M4 scale in the test"
    assert np.any(absmax == 0) and np.any(absmax >> 4 >= 14)
    lin = kg.KbitLinear.from_kbit(flat.q)
    w64 = GR.dequantize_weight(cupy.asnumpy(flat.q.packed), absmax, cupy.asnumpy(flat.q.codebook),
                               4, n, k)
    bound = GR.REL_ERROR_BOUND[dtype]
    for m in (1, 5, 8, 16):
        a = _host(rng, (m, k), dtype)
        ref = GR.gemm(a, w64, None, dtype)
        mag = np.abs(R.to_f32(a, dtype).astype(np.float64)) @ np.abs(w64).T  # [m, n]
        c = GR.to_float64(cupy.asnumpy(kg.gemm(cupy.asarray(a), lin, path="gemv",
                                               dtype="bfloat16" if dtype == "bfloat16" else None)),
                          dtype)
        live = mag > 0
        assert np.all(c[~live] == 0), f"{m=}: an all-zero row gave nonzero outputs"
        err = np.abs(c - ref)[live] / mag[live]
        worst = int(np.argmax(err))
        assert err.max() <= bound, (f"{dtype} {m=}: error {err.max():.3g} of the row's |w| |a| "
                                    f"(output {np.nonzero(live)[1][worst]}) > {bound}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_shape_splits_and_determinism(dtype):
    """A decode shape's plans (K warps, K splits across CTAs), twice: bit-identical."""
    import cupy

    import kernelgen as kg

    n, k = 2048, 14336
    lin, _, w64 = _weights(dtype, n, k)
    rng = np.random.default_rng(3)
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m in (1, 7, 16, 32):
        a = _host(rng, (m, k), dtype)
        a_d = cupy.asarray(a)
        for split in (None, 1, 5):
            first = kg.gemm(a_d, lin, dtype=hint, split_k=split)
            _check(first, GR.gemm(a, w64, None, dtype), dtype, f"{m=} {split=}")
            again = kg.gemm(a_d, lin, dtype=hint, split_k=split)
            assert cupy.array_equal(first, again), f"{m=} {split=}: not deterministic"


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_equals_the_flat_layout(dtype):
    """KbitLinear.dequantize of the tiled layout = dequantize_kbit of the flat one, bit for bit
    (out = T(RN(cb[code] * scale)) both ways), also for N not a multiple of 16."""
    import cupy

    for n, k in ((200, 384), (1152, 4224)):
        tiled, flat, _ = _weights(dtype, n, k)
        got = tiled.dequantize(dtype)
        want = flat.dequantize(dtype)
        assert got.shape == (n, k)
        assert cupy.array_equal(cupy.asarray(got).view(cupy.uint16), cupy.asarray(want).view(cupy.uint16)), \
            f"{n}x{k} {dtype}"
        # default dtype: the one quantized (as dequantize_kbit's); fp32 too
        assert cupy.array_equal(tiled.dequantize().view(cupy.uint16), flat.dequantize().view(cupy.uint16))
        assert cupy.array_equal(tiled.dequantize("float32"), flat.dequantize("float32"))


def test_out_buffer_leading_dims_and_rules():
    import cupy

    import kernelgen as kg

    n, k = 384, 1024
    lin, _, w64 = _weights("float16", n, k)
    rng = np.random.default_rng(5)
    a = _host(rng, (2, 3, k), "float16")
    bias = _host(rng, (n,), "float16")
    c_ref = GR.gemm(a, w64, bias)
    for path in ("gemv", "tile", "dequant"):
        out = cupy.full((2, 3, n), cupy.nan, cupy.float16)
        res = kg.gemm(cupy.asarray(a), lin, cupy.asarray(bias), out=out, path=path)
        assert res is out
        _check(out, c_ref, "float16", f"{path=} out=")
    a_d = cupy.asarray(a.reshape(6, k))
    with pytest.raises(ValueError, match="path='mma': a tiled 4-bit weight runs on"):
        kg.gemm(a_d, lin, path="mma")
    for knob in ({"kw": 2}, {"tile": (32, 128)}):
        with pytest.raises(ValueError, match="a knob of the flat layout's kernels"):
            kg.gemm(a_d, lin, **knob)
    with pytest.raises(ValueError, match="the dequant path .* has no K split"):
        kg.gemm(a_d, lin, path="dequant", split_k=2)
    with pytest.raises(ValueError, match="layout='tiled': 4-bit weights only"):
        kg.quantize_weight(cupy.ones((16, 128), cupy.float16), 3, layout="tiled")
    with pytest.raises(ValueError, match="layout='packed': expected one of"):
        kg.quantize_weight(cupy.ones((16, 128), cupy.float16), 4, layout="packed")


def test_torch_inputs_and_graph_capture():
    """torch weights and activations: the tiled copy is made from the torch KbitTensor, the
    reference from its flat bit planes (not from the tiled copy)."""
    torch = pytest.importorskip("torch")
    import cupy

    import kernelgen as kg

    n, k = 384, 1024
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    q = kg.quantize_kbit(w, 4)
    lin = kg.KbitLinear.from_kbit(q)
    assert lin.layout == "tiled"
    w64 = GR.dequantize_weight(cupy.asnumpy(cupy.asarray(q.packed)), cupy.asnumpy(cupy.asarray(q.absmax)),
                               cupy.asnumpy(cupy.asarray(q.codebook)), 4, n, k)
    # dequantize: the quantized dtype and the caller's kind by default, bit for bit the flat values
    d = lin.dequantize()
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and tuple(d.shape) == (n, k)
    assert torch.equal(d.view(torch.int16), kg.dequantize_kbit(q).view(torch.int16))
    d32 = lin.dequantize("float32")
    assert d32.dtype == torch.float32 and torch.equal(d32, kg.dequantize_kbit(q, "float32"))
    with pytest.raises(ValueError, match="dtype='int8'"):
        lin.dequantize("int8")
    s = torch.cuda.Stream()
    for m in (1, 16, 100, 300):  # gemv, gemv, tile or dequant, dequant
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        a_np = a.view(torch.int16).cpu().numpy().view(np.uint16)
        c_ref = GR.gemm(a_np, w64, None, "bfloat16")
        with torch.cuda.stream(s):
            c = kg.gemm(a, lin)
            assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            kg.gemm(a, lin, out=out)  # warm (compiles, scratch) before the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                kg.gemm(a, lin, out=out)
            out.fill_(float("nan"))
            g.replay()
        s.synchronize()
        c_np = c.view(torch.int16).cpu().numpy().view(np.uint16)
        _check(c_np, c_ref, "bfloat16", f"torch {m=}")
        o_np = out.view(torch.int16).cpu().numpy().view(np.uint16)
        _check(o_np, c_ref, "bfloat16", f"torch graph {m=}")


def test_tile_path_falls_back_where_the_part_has_less_shared_memory(monkeypatch):
    """On a part whose blocks get less shared memory than the target's plans assume: at 99 KB
    (8.6 parts under sm_80, 8.9 under sm_89: 101376 B) the selector's tile path (on sm_90a: the wgmma path,
    which does not fit there) keeps fewer stages (BM 64 at 2 beside the 32 KB table) and
    matches the reference; where not even 2 stages fit (50 KB) it becomes the GEMV, and a
    forced tile path raises naming the rule."""
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.core import interop
    from kernelgen.errors import UnsupportedConfigError
    from kernelgen.fp4_gemm.config import WGMMA_ARCHS
    from kernelgen.kbit_gemm.tiled import TILE_MIN_M, plan_tiled, select_tiled

    info = device_info()
    n, k = 128 * info.sm_count, 4096  # tile CTAs fill the SMs; a large weight
    m = TILE_MIN_M
    full = plan_tiled(info.arch.name, m, n, k, "float16", info.sm_count)
    if info.arch.name in WGMMA_ARCHS:
        assert full.path == "wgmma", full.short()
    else:
        assert full.path == "tile" and full.plan.config.stages > 2, full.short()
    lin, _, w64 = _weights("float16", n, k)
    a = _host(np.random.default_rng(9), (m, k), "float16")
    want = GR.gemm(a, w64)
    monkeypatch.setitem(interop._smem_limits, info.index, (99 * 1024, "test part of 99 KB"))
    ch = select_tiled(info.arch.name, m, n, k, "float16", info.sm_count, 99 * 1024)
    assert ch.path == "tile" and ch.plan.smem <= 99 * 1024 and ch.plan.config.stages == 2, ch.short()
    _check(kg.gemm(cupy.asarray(a), lin), want, "float16", f"99 KB {ch.short()}")
    # 50 KB: the GEMV's 32 KB table and its 16 KB of K-slice sums (m_tile 16) fit, no tile
    # pipeline of 2 stages does (BM 16: 57 KB)
    monkeypatch.setitem(interop._smem_limits, info.index, (50 * 1024, "test part"))
    ch = select_tiled(info.arch.name, m, n, k, "float16", info.sm_count, 50 * 1024)
    assert ch.path == "gemv" and not ch.plan.config.lut_wide, ch.short()
    c = kg.gemm(cupy.asarray(a), lin)
    _check(c, want, "float16", "fallback")
    with pytest.raises(UnsupportedConfigError, match="2 stages need .* allows 51200 B"):
        kg.gemm(cupy.asarray(a), lin, path="tile")


# (N, K) whose balanced runs take different shapes on a GPU of ~100-170 SMs: one block a run
# with a partial last tile (13 tiles, 3 steps), one a run over units of 8 steps, runs of several
# blocks across units of 2 steps (a unit's tail, whole units, the next one's head)
BAL_SHAPES = ((200, 384), (384, 1024), (160000, 256))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BAL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_balanced_gemv_matches_reference(shape, dtype, monkeypatch):
    """The balanced GEMV (gemv.cuh BAL, forced through the selector's rule) at M = 1, 5, 8
    (m_tile 8) and 9, 16 (m_tile 16) with bias: the reference, bit-identical on a second call,
    and the unit counters left at zero for the next launch."""
    import cupy

    import kernelgen as kg
    import kernelgen.fp4_gemm.select as fsel
    from kernelgen.arch import device_info
    from kernelgen.core.interop import context_of, scratch
    from kernelgen.kbit_gemm.tiled import plan_tiled

    monkeypatch.setattr(fsel, "balanced_takes", lambda *a: True)
    n, k = shape
    lin, _, w64 = _weights(dtype, n, k)
    info = device_info()
    rng = np.random.default_rng(n + 3 * k)
    hint = "bfloat16" if dtype == "bfloat16" else None
    bias = _host(rng, (n,), dtype)
    for m in (1, 5, 8, 9, 16):
        p = plan_tiled(info.arch.name, m, n, k, dtype, info.sm_count).plan
        assert p.balanced, p.short()
        a = _host(rng, (m, k), dtype)
        a_d, b_d = cupy.asarray(a), cupy.asarray(bias)
        first = kg.gemm(a_d, lin, b_d, dtype=hint)
        _check(first, GR.gemm(a, w64, bias, dtype), dtype, f"{m=} {n=} {k=} {p.short()}")
        again = kg.gemm(a_d, lin, b_d, dtype=hint)
        assert cupy.array_equal(first, again), f"{m=}: not deterministic"
        counters = scratch(context_of(a_d, "A"), "fp4_gemm", 0, 0)[1]
        assert int(cupy.count_nonzero(counters)) == 0, f"{m=}: counters left nonzero"


@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_and_narrow_code_tables_agree(dtype, monkeypatch):
    """The GEMV with the 64 KB code table (kbit4_word_wide) and with the 32 KB one (parts of 100
    KB an SM) give the same bits at M = 1, 8 (scales after the mma) and 16 (before it)."""
    import cupy

    import kernelgen as kg
    import kernelgen.fp4_gemm.select as fsel
    from kernelgen.arch import device_info
    from kernelgen.kbit_gemm.tiled import plan_tiled

    n, k = 1152, 4224
    lin, _, w64 = _weights(dtype, n, k)
    info = device_info()
    rng = np.random.default_rng(11)
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m in (1, 8, 16):
        a = _host(rng, (m, k), dtype)
        a_d = cupy.asarray(a)
        got = {}
        for wide in (True, False):
            monkeypatch.setattr(fsel, "kbit4_lut_wide", lambda *x, w=wide, **y: w)
            p = plan_tiled(info.arch.name, m, n, k, dtype, info.sm_count, path="gemv").plan
            assert p.config.lut_wide is wide and p.smem == (64 if wide else 32) * 1024, p.short()
            got[wide] = kg.gemm(a_d, lin, dtype=hint, path="gemv")
        _check(got[True], GR.gemm(a, w64, None, dtype), dtype, f"{m=}")
        assert cupy.array_equal(got[True], got[False]), f"{m=}: the tables disagree"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", (2, 3, 4))
def test_flat_weights_on_the_wgmma_kernel(bits, dtype):
    """gemm(..., path="wgmma") of a flat 2..4-bit weight (sm_90a): the FP4 wgmma kernel decoding
    the bit planes itself (Fp4WgmmaConfig.flat) matches the reference at M across the wgmma
    buckets (N not a multiple of 16 or 128 included: clamped rows), K splits off / forced, with
    bias and out=; 5 bits raise."""
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info

    if device_info().arch.name != "sm_90a":
        pytest.skip("warpgroup MMA: sm_90a")
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((200, 384), (1152, 4224)):
        rng = np.random.default_rng(bits * n + k)
        w = _host(rng, (n, k), dtype, 0.5)
        lin = kg.quantize_weight(cupy.asarray(w), bits, layout="flat", dtype=hint)
        q = lin.q
        w64 = GR.dequantize_weight(cupy.asnumpy(q.packed), cupy.asnumpy(q.absmax),
                                   cupy.asnumpy(q.codebook), bits, n, k)
        bias = _host(rng, (n,), dtype)
        for m in (1, 33, 64, 65, 128, 129, 256):
            a = _host(rng, (m, k), dtype)
            c_ref = GR.gemm(a, w64, bias, dtype)
            for split in (None, 3):
                c = kg.gemm(cupy.asarray(a), lin, cupy.asarray(bias), dtype=hint, path="wgmma",
                            split_k=split)
                _check(c, c_ref, dtype, f"{bits=} {dtype=} {m=} {n=} {k=} {split=}")
        out = cupy.full((5, n), np.nan, cupy.float16 if hint is None else cupy.uint16)
        a = _host(rng, (5, k), dtype)
        assert kg.gemm(cupy.asarray(a), lin, dtype=hint, path="wgmma", out=out) is out
        _check(out, GR.gemm(a, w64, None, dtype), dtype, f"{bits=} {dtype=} out=")
    w5 = kg.quantize_weight(cupy.asarray(_host(rng, (128, 256), dtype)), 5, dtype=hint)
    with pytest.raises(ValueError, match=r"path='wgmma': flat weights of \(2, 3, 4\) bits"):
        kg.gemm(cupy.zeros((4, 256), cupy.float16 if hint is None else cupy.uint16), w5, dtype=hint,
                path="wgmma")
