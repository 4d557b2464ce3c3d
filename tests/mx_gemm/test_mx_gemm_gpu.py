"""mx_gemm on the GPU (Hopper paths: MXFP8 x MXFP8 on the fp8 mma.sync) against the float64
reference of the dequantized operands: E4M3 / E5M2 in every pairing, M across the 64 / 128 row
tiles and not a multiple of them, N a multiple of 8 but not of the tile, K a multiple of 32
but not of the 128-wide k-tile, both output dtypes, bias, alpha, every tile forced, the
unrolled and the (opt-in) wgmma variants, sm_89's fp8 mma.sync and sm_80's integer fp8
decoding run here, row-major scales, out=, torch tensors. Outputs are poisoned (0xFF = NaN)."""

import functools

import numpy as np
import pytest

from kernelgen.mx_gemm import reference as GR
from kernelgen.mx_gemm.config import FP8_TILES, WG_TILES, MxFp8GemmConfig
from kernelgen.mx_gemm.select import FP8_PLAN_TILES

pytestmark = pytest.mark.gpu

FP8 = ("mxfp8_e4m3", "mxfp8_e5m2")
PAIRS = [(a, b) for a in FP8 for b in FP8]
SHAPES = [(1, 128, 128), (17, 264, 96), (64, 256, 256), (65, 136, 1056), (300, 1032, 4128),
          (1024, 1024, 1024)]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


@functools.cache
def _host(fmt, rows, k, seed, layout="swizzled"):
    rng = np.random.default_rng(seed)
    # rows and k-blocks of very different magnitudes, so a wrong scale shows; |D| stays
    # well inside fp16's range (65504)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 4.0, (rows, 1))
         * np.repeat(2.0 ** rng.integers(-6, 2, (1, k // 32)), 32, axis=1)).astype(np.float32)
    return GR.quantize(x, fmt, layout)


def _bias(n, dtype, seed):
    v = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return GR.round_output(v, dtype)


def _run(a_fmt, b_fmt, m, n, k, dtype, *, bias=True, alpha=1.0, config=None, layout="swizzled"):
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    ha, hb = _host(a_fmt, m, k, 1 + m + k, layout), _host(b_fmt, n, k, 2 + n + k, layout)
    hbias = _bias(n, dtype, n) if bias else None
    d = mx_gemm(GR.upload(ha, cupy), GR.upload(hb, cupy),
                None if hbias is None else cupy.asarray(hbias), alpha=alpha, out_dtype=dtype,
                config=config)
    got = GR.to_float64(cupy.asnumpy(d), dtype)
    ref = GR.mx_gemm(ha, hb, hbias, alpha, dtype)
    err = GR.rel_error(got, ref)
    assert err < GR.REL_ERROR_BOUND[dtype], f"{a_fmt} x {b_fmt} {m=} {n=} {k=} {dtype} {config} {err=}"
    return d


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("a_fmt,b_fmt", PAIRS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_selector_choice(a_fmt, b_fmt, m, n, k, dtype):
    _run(a_fmt, b_fmt, m, n, k, dtype, bias=(m + n) % 2 == 0, alpha=0.75)


# sm_89's fp8 mma.sync (hbufs 0, no wgmma) runs here too: ptxas lowers its fp8 mma.sync for sm_90
MMA8_TILES = sorted({t for _, ts in FP8_PLAN_TILES["sm_89"] for t in ts})
VARIANTS = [((*t, 1), False, False) for t in FP8_TILES] + [((*t, 0), False, False) for t in MMA8_TILES] + \
           [((*t, 1), True, False) for t in FP8_TILES] + [(t, False, True) for t in WG_TILES] + \
           [(t, False, "prescale") for t in WG_TILES if t[5] == 0]


def _variant_id(v):
    (bm, bn, _, _, st, hb), unroll, wgmma = v
    return (f"{bm}x{bn}" + ("" if wgmma else f"-s{st}") + ("-fp8mma" if hb == 0 and not wgmma else "") +
            ("-unroll" if unroll else "") +
            (f"-wgmma-s{st}-h{hb}" if wgmma else "") + ("-prescale" if wgmma == "prescale" else ""))


@pytest.mark.parametrize("tile,unroll,wgmma", VARIANTS, ids=[_variant_id(v) for v in VARIANTS])
@pytest.mark.parametrize("m,n,k", [(1, 136, 160), (200, 520, 416)])
def test_every_tile_forced(tile, unroll, wgmma, m, n, k):
    bm, bn, wm, wn, st, hb = tile
    cfg = MxFp8GemmConfig(arch="sm_90a", a_elem="e4m3", b_elem="e4m3", out_dtype="bfloat16",
                          tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st, unroll_kb=unroll,
                          wgmma=bool(wgmma), hbufs=hb, prescale=wgmma == "prescale")
    _run("mxfp8_e4m3", "mxfp8_e4m3", m, n, k, "bfloat16", alpha=-2.0, config=cfg)


def test_row_major_scales():
    _run("mxfp8_e4m3", "mxfp8_e5m2", 100, 264, 320, "bfloat16", layout="row_major")


def test_out_buffer_written_everywhere():
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    m, n, k = 70, 200, 192
    ha, hb = _host("mxfp8_e4m3", m, k, 5), _host("mxfp8_e4m3", n, k, 6)
    out = cupy.full((m, n), np.nan, cupy.float16)
    r = mx_gemm(GR.upload(ha, cupy), GR.upload(hb, cupy), out=out, out_dtype="float16")
    assert r is out
    err = GR.rel_error(cupy.asnumpy(out).astype(np.float64), GR.mx_gemm(ha, hb))
    assert err < GR.REL_ERROR_BOUND["float16"]


def test_torch_operands():
    torch = pytest.importorskip("torch")
    from kernelgen.mx_gemm import mx_gemm

    m, n, k = 200, 256, 512  # M > 128: on sm_90a the prescale path, its scratch torch memory
    ha, hb = _host("mxfp8_e4m3", m, k, 7), _host("mxfp8_e5m2", n, k, 8)
    put = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    d = mx_gemm(GR.upload(ha, put), GR.upload(hb, put), bias, alpha=1.5)
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.shape == (m, n)
    hbias = bias.view(torch.int16).cpu().numpy().view(np.uint16)
    ref = GR.mx_gemm(ha, hb, hbias, 1.5, "bfloat16")
    assert GR.rel_error(d.float().cpu().numpy(), ref) < GR.REL_ERROR_BOUND["bfloat16"]


def test_fp4_pair_rejected_on_hopper():
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    a = GR.upload(_host("mxfp4", 16, 128, 9), cupy)
    with pytest.raises(ValueError, match="cannot run on sm_90a.*mxfp8_e4m3 x mxfp8_e4m3"):
        mx_gemm(a, a)


def test_mismatched_k_rejected():
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    a = GR.upload(_host("mxfp8_e4m3", 16, 128, 10), cupy)
    b = GR.upload(_host("mxfp8_e4m3", 16, 256, 11), cupy)
    with pytest.raises(ValueError, match="K=256 does not match"):
        mx_gemm(a, b)


def test_m0_gives_empty_d():
    """M = 0 (A from quantize_mx of a zero-row x): an empty [0, N] D, out= returned as is."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.mx_gemm import mx_gemm

    a = mx.quantize_mx(cupy.zeros((0, 256), cupy.float16), "mxfp8_e4m3")
    b = GR.upload(_host("mxfp8_e4m3", 64, 256, 12), cupy)
    d = mx_gemm(a, b, out_dtype="float16")
    assert d.shape == (0, 64) and d.dtype == cupy.float16
    out = cupy.empty((0, 64), cupy.uint16)
    assert mx_gemm(a, b, out=out) is out


def test_alignment_rules():
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    m, n, k = 16, 64, 128
    a = GR.upload(_host("mxfp8_e4m3", m, k, 13), cupy)
    b = GR.upload(_host("mxfp8_e4m3", n, k, 14), cupy)
    out = cupy.empty(m * n + 1, cupy.float16)[1:].reshape(m, n)  # 2 bytes past the allocation
    with pytest.raises(ValueError, match="out: data pointer must be 4-byte aligned"):
        mx_gemm(a, b, out=out, out_dtype="float16")
    shifted = cupy.empty(a.data.size + 8, cupy.uint8)[8:].reshape(a.data.shape)
    shifted[...] = a.data
    with pytest.raises(ValueError, match="A.data: data pointer must be 16-byte aligned"):
        mx_gemm(type(a)(a.fmt, a.shape, shifted, a.scales, a.scale_layout, None), b)


@pytest.mark.parametrize("a_fmt,b_fmt", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3")])
@pytest.mark.parametrize("prescale", [False, True])
@pytest.mark.parametrize("tile", [t for t in WG_TILES if t[5] == 0] + [(*t, 0) for t in MMA8_TILES])
def test_fp8_wgmma_random_codes(tile, a_fmt, b_fmt, prescale):
    """The fp8 wgmma's and sm_89's fp8 mma.sync's rescale (in place, or once per row with
    prescale) on uniformly random
    finite codes (every exponent field,
    subnormals included) and scales 2^-15 .. 2^0: both of its paths (integer exponent shift,
    f16 rounding to the subnormal grid) run in most chunks."""
    import cupy

    from kernelgen.mx.reference import swizzle_scales
    from kernelgen.mx_gemm import mx_gemm

    m, n, k = 200, 264, 1056
    rng = np.random.default_rng(11)

    def host(fmt, rows):
        codes = rng.integers(0, 256, (rows, k), dtype=np.uint8)
        special = 0x7F if fmt.endswith("e4m3") else 0x7C
        codes[(codes & 0x7F) >= special] = 0x30  # finite
        sc = rng.integers(112, 128, (rows, k // 32)).astype(np.uint8)
        return GR.HostMx(fmt, (rows, k), codes, swizzle_scales(sc))

    ha, hb = host(a_fmt, m), host(b_fmt, n)
    bm, bn, wm, wn, st, hb_ = tile
    wg = wm * wn == 8 and wn == 1  # else sm_89's fp8 mma.sync (which has no prescale variant)
    if prescale and not wg:
        pytest.skip("prescale: the wgmma variant only")
    cfg = MxFp8GemmConfig(arch="sm_90a", a_elem=a_fmt[-4:], b_elem=b_fmt[-4:], tile_m=bm,
                          tile_n=bn, warps_m=wm, warps_n=wn, stages=st, wgmma=wg, hbufs=hb_,
                          prescale=prescale)
    d = mx_gemm(GR.upload(ha, cupy), GR.upload(hb, cupy), config=cfg)  # bf16: |D| passes 65504
    got = GR.to_float64(cupy.asnumpy(d), "bfloat16")
    err = GR.rel_error(got, GR.mx_gemm(ha, hb, None, 1.0, "bfloat16"))
    assert err < GR.REL_ERROR_BOUND["bfloat16"], err


# -- the integer fp8 conversion of the sm_80 kernels (soft_fp8), run on this GPU ---------------
def _codes(fmt, rows, k, rng, nan_rows=()):
    """Uniformly random codes (every exponent field, subnormals and -0 included; finite) and
    E8M0 scales 2^-15 .. 2^0 (blocks far below their row's largest too); NaN codes in nan_rows."""
    from kernelgen.mx.reference import swizzle_scales

    codes = rng.integers(0, 256, (rows, k), dtype=np.uint8)
    special = 0x7F if fmt.endswith("e4m3") else 0x7C
    codes[(codes & 0x7F) >= special] = 0x30
    for r in nan_rows:
        codes[r, rng.integers(0, k)] = special | 0x80 if fmt.endswith("e4m3") else 0xFE
    sc = rng.integers(112, 128, (rows, k // 32)).astype(np.uint8)
    return GR.HostMx(fmt, (rows, k), codes, swizzle_scales(sc))


@pytest.mark.parametrize("a_fmt,b_fmt", [("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e4m3")])
@pytest.mark.parametrize("tile", FP8_TILES, ids=["x".join(map(str, t)) for t in FP8_TILES])
def test_soft_fp8_matches_cvt_bit_for_bit(tile, a_fmt, b_fmt):
    """Every tile of the fp8 table (sm_80's among them) with the fp8 -> f16 conversion by
    integer ops, as sm_80 runs it: D bit-identical to the same tile with the cvt instruction,
    and within the reference's bound; NaN codes in A row 3 and B row 5 make exactly that row /
    column of D NaN in both."""
    import cupy

    from kernelgen.mx_gemm import mx_gemm

    m, n, k = 200, 264, 1056
    rng = np.random.default_rng(sum(tile))
    ha, hb = _codes(a_fmt, m, k, rng, nan_rows=(3,)), _codes(b_fmt, n, k, rng, nan_rows=(5,))
    bm, bn, wm, wn, st = tile
    got = {}
    for soft in (False, True):
        cfg = MxFp8GemmConfig(arch="sm_90a", a_elem=a_fmt[-4:], b_elem=b_fmt[-4:], tile_m=bm,
                              tile_n=bn, warps_m=wm, warps_n=wn, stages=st, soft_fp8=soft)
        got[soft] = cupy.asnumpy(mx_gemm(GR.upload(ha, cupy), GR.upload(hb, cupy), config=cfg))
    d = GR.to_float64(got[True], "bfloat16")
    nan = np.zeros((m, n), bool)
    nan[3, :] = nan[:, 5] = True
    assert np.array_equal(np.isnan(d), nan)
    assert np.array_equal(got[True][~nan], got[False][~nan])
    strip = lambda x: np.delete(np.delete(x, 3, 0), 5, 1)  # noqa: E731
    ref = GR.mx_gemm(ha, hb, None, 1.0, "bfloat16")
    assert GR.rel_error(strip(d), strip(ref)) < GR.REL_ERROR_BOUND["bfloat16"]
