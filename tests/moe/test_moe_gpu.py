"""MoE grouped GEMM and fused_moe on the GPU against the NumPy reference (float64): routing
patterns (uniform, 80% to one expert, all to one, experts with zero rows, duplicate ids in a
token, T = 0, 1, large), every tile-table row forced (TILE_M x swap_ab x TILE_N, mma.sync) and,
on sm_90a, every wgmma row (WG_TILES), and the selector's choice, plain and SwiGLU epilogues,
fp16 and bf16, CuPy and torch.

Outputs are poisoned (KERNELGEN_POISON=1: NaN bit patterns) so a row the kernel does not write
fails the bound; rows outside every expert segment must stay poisoned.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from kernelgen.kbit import reference as KR
from kernelgen.moe import reference as MR
from kernelgen.moe.config import TILES, WG_TILES, WGMMA_ARCHS

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16")
# every tile-table row (mma.sync forced), then the wgmma rows: (tile_m, swap_ab, tile_n, wgmma)
ROWS = [(tm, sw, tn, False) for (tm, sw, tn) in TILES]
WG_ROWS = [(tm, False, tn, True) for (tm, tn) in WG_TILES]
# wgmma variants outside the table (tuning sweeps), and the table's rows with cp.async copies
# (the rules give every wgmma row TMA copies):
# (tile_m, tile_n, stages, min_blocks, inflight, producer warpgroup, tma)
WG_VARIANTS = [(128, 256, 4, 1, 0, False, False), (128, 128, 3, 2, 0, False, False),
               (256, 128, 4, 1, 1, False, False), (256, 128, 4, 1, 0, False, False),
               (64, 128, 3, 2, 0, False, False), (64, 256, 4, 1, 1, False, False),
               (128, 256, 4, 1, 1, True, False), (128, 256, 4, 1, 0, True, False),
               (128, 128, 6, 1, 1, True, False), (64, 256, 4, 1, 1, True, False),
               (64, 128, 4, 2, 1, True, False), (128, 128, 2, 1, 1, True, False),
               (192, 256, 4, 1, 1, False, False), (192, 128, 4, 1, 1, True, False),
               (128, 256, 4, 1, 1, False, False), (192, 256, 4, 1, 0, False, False),
               (128, 256, 4, 1, 0, False, True), (256, 128, 4, 1, 1, False, True),
               (64, 256, 4, 1, 1, False, True), (64, 128, 3, 2, 0, False, True),
               (192, 256, 4, 1, 1, False, True), (192, 128, 4, 1, 0, False, True)]


def _rows():
    """ROWS, plus WG_ROWS on a device of WGMMA_ARCHS."""
    from kernelgen.arch import device_info

    return ROWS + (WG_ROWS if device_info().arch.name in WGMMA_ARCHS else [])


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(rng, shape, dtype, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    return KR.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


def routing(kind: str, t: int, e: int, top_k: int, rng) -> np.ndarray:
    """topk_ids [T, top_k] of a named pattern."""
    if kind == "uniform":  # distinct experts per token, like torch.topk
        return np.argsort(rng.random((t, e)), axis=1)[:, :top_k].astype(np.int32)
    if kind == "hot80":  # 80% of the tokens name expert 0 (and 1..top_k-1)
        ids = np.argsort(rng.random((t, e)), axis=1)[:, :top_k]
        hot = rng.random(t) < 0.8
        ids[hot] = np.arange(top_k)
        return ids.astype(np.int32)
    if kind == "all_one":  # every slot of every token on one expert
        return np.full((t, top_k), e - 1, np.int32)
    if kind == "zero_rows":  # only the even experts get rows
        return (2 * rng.integers(0, e // 2, (t, top_k))).astype(np.int32)
    if kind == "dup":  # ids drawn with replacement: repeats within a token
        return rng.integers(0, e, (t, top_k)).astype(np.int32)
    raise ValueError(kind)


def _check(y_dev, y_ref, dtype, ctx, bound=None):
    import cupy

    y = MR.to_float64(cupy.asnumpy(y_dev), dtype)
    inside = ~np.isnan(y_ref).any(axis=1)
    assert np.isnan(y[~inside]).all(), f"{ctx}: rows outside every segment were written"
    y, y_ref = y[inside], y_ref[inside]
    assert np.all(np.isfinite(y)), f"{ctx}: {int(np.sum(~np.isfinite(y)))} elements not written"
    err = MR.rel_error(y, y_ref)
    lim = bound if bound is not None else MR.REL_ERROR_BOUND[dtype]
    if not err <= lim:
        bad = np.abs(y - y_ref) > 0.05 * (np.abs(y_ref) + np.linalg.norm(y_ref) / np.sqrt(y_ref.size))
        ms, ns = np.nonzero(bad)
        raise AssertionError(f"{ctx}: rel error {err:.3g} > {lim}; {bad.mean():.1%} bad; rows "
                             f"{sorted(set(ms.tolist()))[:8]} cols {sorted(set(ns.tolist()))[:8]}")


def _problem(rng, kind, t, e, top_k, n, k, dtype, gap=0):
    """(x_perm, w, offsets) on the host; gap > 0 leaves `gap` unowned rows before the first
    segment and after the last."""
    ids = routing(kind, t, e, top_k, rng) if t else np.zeros((0, top_k), np.int32)
    offsets, _ = MR.layout(ids, e)
    offsets = (offsets + gap).astype(np.int32)
    m = int(offsets[-1]) + gap
    x = _host(rng, (m, k), dtype)
    w = _host(rng, (e, n, k), dtype, scale=1.0 / np.sqrt(k))
    return x, w, offsets


CASES = [("uniform", 37, 8, 2), ("hot80", 64, 16, 4), ("all_one", 40, 8, 2),
         ("zero_rows", 50, 16, 4), ("dup", 33, 8, 4), ("uniform", 1, 8, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", (None, "swiglu"))
def test_every_tile_row_matches_reference(dtype, activation):
    import cupy

    from kernelgen.moe import grouped_gemm

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    # N not a multiple of any tile; K = 3 stages + a partial one (multiple of 8, not of 64)
    n, k = (208, 200) if activation == "swiglu" else (200, 232)
    for kind, t, e, top_k in CASES:
        for gap in (0, 3):
            x, w, off = _problem(rng, kind, t, e, top_k, n, k, dtype, gap)
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), off, activation)
            xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(off)
            for row in [None, *_rows()]:
                tm, sw, tn, wg = row if row else (None, None, None, None)
                ctx = f"{kind=} {t=} {e=} {top_k=} {gap=} {n=} {k=} {dtype} {activation} {row=}"
                y = grouped_gemm(xd, wd, od, activation=activation, tile_m=tm, swap_ab=sw,
                                 tile_n=tn, wgmma=wg, dtype=hint)
                _check(y, ref, dtype, ctx)


def test_large_t_and_decode_shapes():
    """Large T (every table row sees many tiles per expert) and a decode-like wide shape."""
    import cupy

    from kernelgen.moe import grouped_gemm

    rng = np.random.default_rng()
    dtype = "bfloat16"
    for kind, t, e, top_k, n, k in (("uniform", 2048, 16, 4, 256, 512),
                                    ("hot80", 1500, 32, 8, 128, 256),
                                    ("uniform", 3, 64, 8, 1024, 1024)):
        x, w, off = _problem(rng, kind, t, e, top_k, n, k, dtype)
        for act in (None, "swiglu"):
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), off, act)
            xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(off)
            for row in [None, *_rows()]:
                tm, sw, tn, wg = row if row else (None, None, None, None)
                y = grouped_gemm(xd, wd, od, activation=act, tile_m=tm, swap_ab=sw, tile_n=tn,
                                 wgmma=wg, dtype="bfloat16")
                _check(y, ref, dtype, f"{kind=} {t=} {e=} {top_k=} {n=} {k=} {act} {row=}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_wgmma_prefill_shapes(dtype):
    """The wgmma path (sm_90a) at prefill-like sizes: many M tiles per expert, a skewed
    routing, empty experts, N and K not multiples of the tile (K several times the stage ring),
    each WG_TILES row, the variants of WG_VARIANTS and the selector's choice (wgmma at
    TILE_M 128 or 192), W13 + SwiGLU and W2."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.moe import grouped_gemm, select_grouped
    from kernelgen.moe.config import MoeGemmConfig

    info = device_info()
    if info.arch.name not in WGMMA_ARCHS:
        pytest.skip(f"wgmma path: {WGMMA_ARCHS} only, device is {info.arch.name}")
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for kind, t, e, top_k, n, k in (("hot80", 700, 16, 4, 528, 1048),
                                    ("zero_rows", 1200, 16, 2, 400, 776),
                                    ("uniform", 2048, 8, 2, 256, 520),
                                    ("dup", 900, 8, 4, 272, 136)):  # K: fewer k-tiles than stages
        x, w, off = _problem(rng, kind, t, e, top_k, n, k, dtype, gap=5)
        for act in (None, "swiglu"):
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), off, act)
            xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(off)
            plan = select_grouped(info.arch.name, info.sm_count, dtype, e, n, k, x.shape[0],
                                  "swiglu" if act else "none")
            assert plan.config.wgmma, plan.short()
            for row in [None, *WG_ROWS]:
                tm, sw, tn, wg = row if row else (None, None, None, None)
                y = grouped_gemm(xd, wd, od, activation=act, tile_m=tm, swap_ab=sw, tile_n=tn,
                                 wgmma=wg, dtype=hint)
                _check(y, ref, dtype, f"wgmma {kind=} {t=} {e=} {top_k=} {n=} {k=} {act} {row=}")
            for tm, tn, st, mb, inf, pr, tma in WG_VARIANTS:
                cfg = MoeGemmConfig(arch=info.arch.name, dtype=dtype, tile_m=tm, tile_n=tn,
                                    warps_p=tm // 16, warps_q=1, warps_k=1, stages=st,
                                    min_blocks=mb, epilogue=plan.config.epilogue, wgmma=True,
                                    inflight=inf, producer=pr, tma=tma)
                y = grouped_gemm(xd, wd, od, activation=act, config=cfg, dtype=hint)
                _check(y, ref, dtype, f"wgmma {kind=} {t=} {n=} {k=} {act} {cfg.short()}")


def test_wgmma_partial_warpgroups():
    """Segments whose last tile leaves warpgroups without tokens (those issue no wgmma): rows on
    both sides of every 64-row warpgroup bound of the 64 / 128 / 192 / 256-token wgmma tiles, an
    empty expert between them; every WG_TILES row and the WG_VARIANTS, plain and SwiGLU."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.moe import grouped_gemm
    from kernelgen.moe.config import MoeGemmConfig

    info = device_info()
    if info.arch.name not in WGMMA_ARCHS:
        pytest.skip(f"wgmma path: {WGMMA_ARCHS} only, device is {info.arch.name}")
    rng = np.random.default_rng()
    sizes = [1, 63, 64, 65, 0, 127, 128, 129, 191, 192, 193, 255, 256, 257, 320, 385]
    e, n, k = len(sizes), 272, 200
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32) + 3
    m = int(offsets[-1]) + 3
    for dtype in DTYPES:
        x = _host(rng, (m, k), dtype)
        w = _host(rng, (e, n, k), dtype, scale=1.0 / np.sqrt(k))
        xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(offsets)
        hint = "bfloat16" if dtype == "bfloat16" else None
        for act in (None, "swiglu"):
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), offsets, act)
            for tm, _, tn, _ in WG_ROWS:
                y = grouped_gemm(xd, wd, od, activation=act, tile_m=tm, tile_n=tn, wgmma=True,
                                 dtype=hint)
                _check(y, ref, dtype, f"partial warpgroups {dtype} {act} {tm}x{tn}")
            for tm, tn, st, mb, inf, pr, tma in WG_VARIANTS:
                cfg = MoeGemmConfig(arch=info.arch.name, dtype=dtype, tile_m=tm, tile_n=tn,
                                    warps_p=tm // 16, warps_q=1, warps_k=1, stages=st,
                                    min_blocks=mb, epilogue="swiglu" if act else "none",
                                    wgmma=True, inflight=inf, producer=pr, tma=tma)
                y = grouped_gemm(xd, wd, od, activation=act, config=cfg, dtype=hint)
                _check(y, ref, dtype, f"partial warpgroups {dtype} {act} {cfg.short()}")


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_tma_small_views_and_cp_async_agree(monkeypatch, pdl):
    """The TMA copies where a box is larger than the tensor (M < tile_m rows, K < 64, N <
    tile_n), K tails and partial N tiles: within the reference's bound, rows outside every
    segment left poisoned, and bit-identical to the cp.async copies of the same tile on every
    stored row (both zero-fill what lies outside; rows of a neighbouring expert inside an X box
    are computed but never stored). With KERNELGEN_PDL=0 the tensor maps go through the driver
    launch without the PDL attribute (CuPy's launch cannot pass them)."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.moe import grouped_gemm
    from kernelgen.moe.config import MoeGemmConfig

    info = device_info()
    if info.arch.name not in WGMMA_ARCHS:
        pytest.skip(f"TMA copies: the wgmma path, {WGMMA_ARCHS} only; device is {info.arch.name}")
    monkeypatch.setenv("KERNELGEN_PDL", pdl)
    rng = np.random.default_rng()
    cases = (([2, 0, 3], 48, 40), ([70, 1], 80, 72), ([5, 300, 0, 9], 272, 264))
    for sizes, n, k in cases if pdl == "1" else cases[:1]:
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32) + 1
        m = int(offsets[-1]) + 2
        for dtype in DTYPES:
            hint = "bfloat16" if dtype == "bfloat16" else None
            x = _host(rng, (m, k), dtype)
            w = _host(rng, (len(sizes), n, k), dtype, scale=1.0 / np.sqrt(k))
            xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(offsets)
            for act in (None, "swiglu"):
                ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), offsets, act)
                for tm, tn in WG_TILES:
                    ys = []
                    for tma in (True, False):
                        base = MoeGemmConfig.of(info.arch.name, dtype, tm, False, tn,
                                                "swiglu" if act else "none", wgmma=True, tma=tma)
                        ys.append(grouped_gemm(xd, wd, od, activation=act, config=base,
                                               dtype=hint))  # poisoned first (_poison)
                    what = f"tma {sizes=} {n=} {k=} {dtype} {act} {tm}x{tn}"
                    _check(ys[0], ref, dtype, what)  # rows outside every segment: still poison
                    a, b = cupy.asnumpy(ys[0]).view(np.uint16), cupy.asnumpy(ys[1]).view(np.uint16)
                    lo, hi = int(offsets[0]), int(offsets[-1])
                    assert np.array_equal(a[lo:hi], b[lo:hi]), what


def test_rows_zero_and_out_buffer():
    import cupy

    from kernelgen.moe import grouped_gemm

    w = cupy.ones((4, 64, 64), cupy.float16)
    off = cupy.zeros(5, cupy.int32)
    assert grouped_gemm(cupy.empty((0, 64), cupy.float16), w, off).shape == (0, 64)
    rng = np.random.default_rng()
    x, wh, offh = _problem(rng, "uniform", 9, 4, 2, 64, 64, "float16")
    out = cupy.full((x.shape[0], 32), np.nan, cupy.float16)
    res = grouped_gemm(cupy.asarray(x), cupy.asarray(wh), cupy.asarray(offh), activation="swiglu",
                       out=out)
    assert res is out
    _check(out, MR.grouped_gemm(x.astype(np.float64), wh.astype(np.float64), offh, "swiglu"),
           "float16", "out=")


def _layer_inputs(rng, t, e, h, i, top_k, dtype, kind="uniform"):
    x = _host(rng, (t, h), dtype)
    w13 = _host(rng, (e, 2 * i, h), dtype, scale=1.0 / np.sqrt(h))
    w2 = _host(rng, (e, h, i), dtype, scale=1.0 / np.sqrt(i))
    ids = routing(kind, t, e, top_k, rng) if t else np.zeros((0, top_k), np.int32)
    wts = rng.random((t, top_k)).astype(np.float32)
    return x, ids, wts, w13, w2


def _layer_ref(x, ids, wts, w13, w2, dtype):
    f = lambda a: MR.to_float64(a, dtype)  # noqa: E731
    return MR.fused_moe(f(x), ids, wts, f(w13), f(w2), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,t", [("uniform", 1), ("uniform", 16), ("hot80", 100),
                                    ("all_one", 24), ("dup", 40), ("zero_rows", 300),
                                    ("uniform", 0)])
def test_fused_moe_matches_reference(dtype, kind, t):
    import cupy

    from kernelgen.moe import fused_moe

    rng = np.random.default_rng()
    e, h, i, top_k = 16, 256, 192, 4
    x, ids, wts, w13, w2 = _layer_inputs(rng, t, e, h, i, top_k, dtype, kind)
    ref = _layer_ref(x, ids, wts, w13, w2, dtype)
    hint = "bfloat16" if dtype == "bfloat16" else None
    args = [cupy.asarray(a) for a in (x, ids, wts, w13, w2)]
    for tm in (None, 8, 16, 32, 64, 128, 256):
        for graph_safe in (False, True):
            out = fused_moe(*args, graph_safe=graph_safe, tile_m=tm, dtype=hint)
            assert out.shape == (t, h), f"{kind=} {t=} {tm=}"
            if t:
                _check(out, ref, dtype, f"layer {kind=} {t=} {tm=} {graph_safe=}",
                       MR.LAYER_REL_ERROR_BOUND[dtype])


def test_fused_moe_torch():
    torch = pytest.importorskip("torch")
    from kernelgen.moe import fused_moe

    rng = np.random.default_rng()
    t, e, h, i, top_k = 20, 8, 128, 64, 2
    x, ids, wts, w13, w2 = _layer_inputs(rng, t, e, h, i, top_k, "bfloat16")
    ref = _layer_ref(x, ids, wts, w13, w2, "bfloat16")

    def bf(a):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = fused_moe(bf(x), torch.from_numpy(ids).cuda(), torch.from_numpy(wts).cuda(), bf(w13),
                        bf(w2))
    s.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (t, h)
    got = MR.to_float64(out.view(torch.int16).cpu().numpy().view(np.uint16), "bfloat16")
    err = MR.rel_error(got, ref)
    assert err <= MR.LAYER_REL_ERROR_BOUND["bfloat16"], f"torch layer: rel error {err:.3g}"


def test_bad_inputs():
    import cupy

    from kernelgen.moe import grouped_gemm

    x = cupy.ones((4, 64), cupy.float16)
    w = cupy.ones((2, 32, 64), cupy.float16)
    off = cupy.asarray(np.array([0, 2, 4], np.int32))
    with pytest.raises(ValueError, match="K=32 does not match x's K=64"):
        grouped_gemm(x, cupy.ones((2, 32, 32), cupy.float16), off)
    with pytest.raises(ValueError, match="offsets: 2 entries; E=2 experts need E \\+ 1"):
        grouped_gemm(x, w, off[:2])
    with pytest.raises(ValueError, match="offsets: dtype int64"):
        grouped_gemm(x, w, off.astype(cupy.int64))
    with pytest.raises(ValueError, match="w: dtype float32"):
        grouped_gemm(x, w.astype(cupy.float32), off)
    with pytest.raises(ValueError, match="multiple of 8"):
        grouped_gemm(cupy.ones((4, 60), cupy.float16), cupy.ones((2, 32, 60), cupy.float16), off)
    with pytest.raises(ValueError, match="multiple of 16"):
        grouped_gemm(x, cupy.ones((2, 24, 64), cupy.float16), off, activation="swiglu")
    with pytest.raises(ValueError, match=r"out: shape \(4, 32\); expected \(4, 16\)"):
        grouped_gemm(x, w, off, activation="swiglu", out=cupy.empty((4, 32), cupy.float16))
    with pytest.raises(ValueError, match="no MoE tile"):
        grouped_gemm(x, w, off, tile_m=64, swap_ab=True)
    with pytest.raises(ValueError, match="no MoE wgmma tile"):
        grouped_gemm(x, w, off, tile_m=32, wgmma=True)


# -- kbit experts ---------------------------------------------------------------------------------
KBIT_CASES = [("uniform", 5, 8, 2), ("hot80", 40, 8, 4), ("dup", 17, 16, 4), ("zero_rows", 30, 8, 2),
              ("uniform", 1, 4, 2)]


def _kbit_weight(rng, e, n, k, bits, dtype, layout="flat"):
    """Experts quantized in the flat layout (the reference dequantizes its planes), then
    repacked when `layout` is "tiled" (bit-identical codes and scales)."""
    import cupy

    from kernelgen.moe import quantize_experts, tile_experts

    w = _host(rng, (e, n, k), dtype, scale=1.0 / np.sqrt(k))
    q = quantize_experts(cupy.asarray(w), bits, dtype="bfloat16" if dtype == "bfloat16" else None,
                         layout="flat")
    w64 = MR.dequantize_experts(cupy.asnumpy(q.q.packed), cupy.asnumpy(q.q.absmax),
                                cupy.asnumpy(q.q.codebook), bits, (e, n, k))
    return (tile_experts(q) if layout == "tiled" else q), w64


def _kbit_case(rng, kind, t, e, top_k, k, dtype, w64, act):
    """A routing case's device X and offsets (2 unowned rows before and after) and its
    float64 reference."""
    import cupy

    off, _ = MR.layout(routing(kind, t, e, top_k, rng), e)
    off = (off + 2).astype(np.int32)
    x = _host(rng, (int(off[-1]) + 2, k), dtype)
    ref = MR.grouped_gemm(MR.to_float64(x, dtype), w64, off, act)
    return cupy.asarray(x), cupy.asarray(off), ref


def test_many_experts_tile_map():
    """find_tile's walk (templates/moe/grouped.cuh): lanes own 1..8 consecutive experts a round
    of up to 256, a second round past E = 256; experts with zero rows anywhere, the last
    expert's rows, and empty grid slots. bf16 at every path the shapes reach (mma.sync swap
    tiles, the plain and wgmma rows), plus the tiled kbit4 kernel, which walks the same map."""
    import cupy

    from kernelgen.moe import grouped_gemm

    rng = np.random.default_rng()
    dtype = "bfloat16"
    n, k = 64, 128
    for e, kind, t, top_k in ((33, "uniform", 5, 4), (100, "zero_rows", 40, 8),
                              (256, "uniform", 3, 8), (256, "dup", 200, 8),
                              (257, "all_one", 6, 2), (300, "uniform", 9, 8),
                              (600, "zero_rows", 100, 8)):
        x, w, off = _problem(rng, kind, t, e, top_k, n, k, dtype, gap=2)
        ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), off, None)
        xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(off)
        for tm in (None, 8, 16, 64, 128):
            y = grouped_gemm(xd, wd, od, tile_m=tm, dtype=dtype)
            _check(y, ref, dtype, f"{e=} {kind=} {t=} {top_k=} {tm=}")
        q, w64 = _kbit_weight(rng, e, n, k, 4, dtype, "tiled")
        ref = MR.grouped_gemm(MR.to_float64(x, dtype), w64, off, None)
        for tm in (8, 16):
            y = grouped_gemm(xd, q, od, tile_m=tm, dtype=dtype)
            _check(y, ref, dtype, f"tiled kbit {e=} {kind=} {t=} {top_k=} {tm=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", (2, 3, 4))
def test_kbit_experts_match_reference(bits, dtype):
    from kernelgen.arch import device_info
    from kernelgen.moe import grouped_gemm
    from kernelgen.moe.config import KBIT_TILE_MS, KBIT_WARPS

    info = device_info()  # forced configs are of this device's arch
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for act in (None, "swiglu"):
        n, k = (208, 384) if act else (200, 640)  # partial row tiles; K = 3 / 5 steps of 128
        for kind, t, e, top_k in KBIT_CASES:
            q, w64 = _kbit_weight(rng, e, n, k, bits, dtype)
            xd, od, ref = _kbit_case(rng, kind, t, e, top_k, k, dtype, w64, act)
            for tm in (None, *KBIT_TILE_MS):
                for warps in (None, *KBIT_WARPS):
                    if tm is None and warps is not None:
                        continue
                    cfg = None
                    if warps is not None:
                        from kernelgen.moe import plan_kbit

                        try:
                            cfg = plan_kbit(info.arch.name, info.sm_count, dtype, bits, e, n,
                                            k, xd.shape[0], "swiglu" if act else "none", tm,
                                            warps).config
                        except ValueError:  # does not fit shared memory (CPU-tested)
                            continue
                    y = grouped_gemm(xd, q, od, activation=act, tile_m=tm, config=cfg, dtype=hint)
                    _check(y, ref, dtype, f"kbit {bits=} {dtype} {act} {kind=} {t=} {e=} {tm=} "
                                          f"{warps=}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_kbit_experts_match_reference(dtype):
    """4-bit experts in the tiled layout (the FP4 bandwidth kernel over work items): every
    m_tile and warps-along-K count, both epilogues, partial tile units a CTA, K of 3 / 5 steps
    (kw 4 and 8 leave some warps no step), the routing cases of the flat test."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.moe import grouped_gemm, plan_kbit_gemv
    from kernelgen.moe.kbit import KbitGemvPlan

    info = device_info(cupy.cuda.Device().id)
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for act in (None, "swiglu"):
        n, k = (224, 384) if act else (208, 640)  # 7 / 13 tile units: the last CTA partial
        epi = "swiglu" if act else "none"
        for kind, t, e, top_k in KBIT_CASES:
            q, w64 = _kbit_weight(rng, e, n, k, 4, dtype, "tiled")
            xd, od, ref = _kbit_case(rng, kind, t, e, top_k, k, dtype, w64, act)
            y = grouped_gemm(xd, q, od, activation=act, dtype=hint)
            _check(y, ref, dtype, f"tiled kbit {dtype} {act} {kind=} {t=} {e=} selector")
            for tm in (8, 16):
                y = grouped_gemm(xd, q, od, activation=act, tile_m=tm, dtype=hint)
                _check(y, ref, dtype, f"tiled kbit {dtype} {act} {kind=} {t=} {e=} {tm=}")
                for kw, tpw in itertools.product((1, 2, 4, 8), (2,) if act else (1, 2)):
                    plan = plan_kbit_gemv(info.arch.name, info.sm_count, dtype, e, n, k,
                                          xd.shape[0], epi, tm, kw)
                    plan = KbitGemvPlan(replace(plan.config, tpw=tpw), e, n, kw)
                    y = grouped_gemm(xd, q, od, activation=act, config=plan, dtype=hint)
                    _check(y, ref, dtype, f"tiled kbit {dtype} {act} {kind=} {t=} {e=} {tm=} "
                                          f"{kw=} {tpw=}")


def test_fused_moe_kbit_experts():
    import cupy

    from kernelgen.moe import fused_moe, quantize_experts, tile_experts

    rng = np.random.default_rng()
    dtype = "bfloat16"
    t, e, h, i, top_k = 24, 8, 256, 128, 2
    x, ids, wts, w13, w2 = _layer_inputs(rng, t, e, h, i, top_k, dtype, "dup")
    q13 = quantize_experts(cupy.asarray(w13), 4, dtype="bfloat16", layout="flat")
    q2 = quantize_experts(cupy.asarray(w2), 4, dtype="bfloat16", layout="flat")

    def deq(q):
        return MR.dequantize_experts(cupy.asnumpy(q.q.packed), cupy.asnumpy(q.q.absmax),
                                     cupy.asnumpy(q.q.codebook), 4, q.shape)

    ref = MR.fused_moe(MR.to_float64(x, dtype), ids, wts, deq(q13), deq(q2), dtype=dtype)
    args = [cupy.asarray(a) for a in (x, ids, wts)]
    t13, t2 = tile_experts(q13), tile_experts(q2)  # the same codes, tiled
    assert (t13.layout, t2.layout) == ("tiled", "tiled")
    for w13_, w2_ in ((q13, q2), (t13, t2), (t13, q2), (q13, cupy.asarray(w2)),
                      (cupy.asarray(w13), t2)):
        if not isinstance(w2_, type(q2)):  # mixed: the bf16 side uses the exact weights
            ref_m = MR.fused_moe(MR.to_float64(x, dtype), ids, wts, deq(q13),
                                 MR.to_float64(w2, dtype), dtype=dtype)
        elif not isinstance(w13_, type(q13)):
            ref_m = MR.fused_moe(MR.to_float64(x, dtype), ids, wts, MR.to_float64(w13, dtype),
                                 deq(q2), dtype=dtype)
        else:
            ref_m = ref
        for tm in (None, 8, 64):
            out = fused_moe(*args, w13_, w2_, tile_m=tm, dtype="bfloat16")
            names = "/".join(getattr(w, "layout", "bf16") for w in (w13_, w2_))
            _check(out, ref_m, dtype, f"kbit layer {tm=} {names}", MR.LAYER_REL_ERROR_BOUND[dtype])


def test_kbit_bad_inputs():
    import cupy

    from kernelgen.moe import MoeKbitConfig, grouped_gemm, quantize_experts

    with pytest.raises(ValueError, match="K a positive multiple of 128"):
        quantize_experts(cupy.ones((2, 16, 96), cupy.float16), 4)
    with pytest.raises(ValueError, match="bits=5; kbit experts support bits in"):
        quantize_experts(cupy.ones((2, 16, 128), cupy.float16), 5)
    q = quantize_experts(cupy.ones((2, 16, 128), cupy.float16), 4, layout="flat")
    off = cupy.asarray(np.array([0, 1, 2], np.int32))
    with pytest.raises(ValueError, match="swap_ab=False"):
        grouped_gemm(cupy.ones((2, 128), cupy.float16), q, off, swap_ab=False)
    with pytest.raises(ValueError, match="tile_m=64: kbit experts take tile_m"):
        grouped_gemm(cupy.ones((2, 128), cupy.float16), q, off, tile_m=64)
    with pytest.raises(ValueError, match="layout='tiled': 4-bit weights only"):
        quantize_experts(cupy.ones((2, 16, 128), cupy.float16), 3, layout="tiled")
    with pytest.raises(ValueError, match="N a positive multiple of 16"):
        quantize_experts(cupy.ones((2, 24, 128), cupy.float16), 4, layout="tiled")
    qt = quantize_experts(cupy.ones((2, 16, 128), cupy.float16), 4, layout="tiled")
    assert qt.layout == "tiled" and qt.bits == 4
    with pytest.raises(ValueError, match="tile_m=32: tiled kbit experts take 8 or 16"):
        grouped_gemm(cupy.ones((2, 128), cupy.float16), qt, off, tile_m=32)
    with pytest.raises(ValueError, match="swiglu needs 2I .* multiple of 32"):
        grouped_gemm(cupy.ones((2, 128), cupy.float16), qt, off, activation="swiglu")
    with pytest.raises(ValueError, match="tiled kbit experts take a MoeKbitGemvConfig"):
        grouped_gemm(cupy.ones((2, 128), cupy.float16), qt, off,
                     config=MoeKbitConfig(arch="sm_90a", dtype="float16"))


def test_fused_moe_bad_inputs_raise_before_the_layout(monkeypatch):
    """fused_moe checks every argument before its first launch (moe_layout, stubbed here to
    fail): topk_weights' shape, dtype and contiguity, topk_ids' type, w13's 2I rule (16; 32
    for tiled kbit experts)."""
    import cupy

    from kernelgen.moe import api, quantize_experts

    def reached(*args, **kw):
        raise AssertionError("moe_layout reached: a bad argument was not checked up front")

    t, k, e, h, i = 4, 2, 2, 128, 64
    x, ids = cupy.ones((t, h), cupy.float16), cupy.zeros((t, k), cupy.int32)
    wts = cupy.ones((t, k), cupy.float32)
    w13, w2 = cupy.ones((e, 2 * i, h), cupy.float16), cupy.ones((e, h, i), cupy.float16)
    q13 = quantize_experts(cupy.ones((e, 16, h), cupy.float16), 4, layout="tiled")
    monkeypatch.setattr(api, "moe_layout", reached)
    cases = [((ids, cupy.ones((t, 1), cupy.float32), w13, w2),
              r"topk_weights: shape \(4, 1\); expected \[4, 2\]"),
             ((ids, wts.astype(cupy.int32), w13, w2), "topk_weights: dtype int32 not supported"),
             ((ids, cupy.ones((k, t), cupy.float32).T, w13, w2), "topk_weights: must be contiguous"),
             ((ids.tolist(), wts, w13, w2), "topk_ids: expected a cupy.ndarray"),
             ((ids, wts, cupy.ones((e, 24, h), cupy.float16), cupy.ones((e, h, 12), cupy.float16)),
              r"w13: shape \[E=2, N=24, K=128\]"),
             ((ids, wts, q13, cupy.ones((e, h, 8), cupy.float16)),
              r"w13: N=16; swiglu needs 2I .* multiple of 32")]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            api.fused_moe(x, *args)


def test_fused_moe_exact_under_capture_raises_graph_capture_error():
    """fused_moe(graph_safe=False) while the stream captures raises GraphCaptureError naming
    graph_safe=True (its exact dispatch would copy to the host), and the capture ends cleanly."""
    import cupy

    from kernelgen.errors import GraphCaptureError
    from kernelgen.moe import fused_moe

    rng = np.random.default_rng(4)
    x, ids, wts, w13, w2 = (cupy.asarray(a) for a in _layer_inputs(rng, 4, 4, 64, 32, 2, "float16"))
    fused_moe(x, ids, wts, w13, w2)  # compile and warm the pool outside the capture
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(GraphCaptureError, match="graph_safe=True"):
                fused_moe(x, ids, wts, w13, w2, graph_safe=False)
        finally:
            stream.end_capture()


def test_forced_config_of_another_arch_is_refused():
    """A forced config of another arch would compile, then fail at module load: a ValueError
    naming both arches, before any build (bf16 / fp16 and flat kbit experts)."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.moe import MoeGemmConfig, MoeKbitConfig, grouped_gemm, quantize_experts

    arch = device_info().arch.name
    other = "sm_80" if arch != "sm_80" else "sm_90a"
    x = cupy.ones((2, 128), cupy.float16)
    off = cupy.asarray(np.array([0, 1, 2], np.int32))
    msg = rf"arch={other}.* does not match .*arch={arch} \(this device\)"
    with pytest.raises(ValueError, match=msg):
        grouped_gemm(x, cupy.ones((2, 32, 128), cupy.float16), off,
                     config=MoeGemmConfig.of(other, "float16", 8, True, 32))
    q = quantize_experts(cupy.ones((2, 16, 128), cupy.float16), 4, layout="flat")
    with pytest.raises(ValueError, match=msg):
        grouped_gemm(x, q, off, config=MoeKbitConfig(arch=other, dtype="float16"))


# rows that lose stages at 99 KB (tile_m, tile_n, wgmma=False: mma.sync) and the selector's
# choice, which on sm_90a is wgmma 128x256 at 4 stages with the full limit and wgmma 128x128 at
# 99 KB (3 stages of 128x256 with a group in flight do not fit)
SMEM_ROWS = [(None, None, None), (128, 128, False), (256, None, False), (128, None, False)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_on_a_part_with_99_kb(dtype, monkeypatch):
    """A device whose blocks get 99 KB (8.6 / 8.9 parts, 101376 B; here the device's limit is
    lowered to it): prefill-sized grouped GEMMs on the rows that lose stages (mma.sync 128x128
    4 -> 3, 256x128 -> 2) and the selector's choice plan within the limit, load and launch (a
    kernel over the limit raises DeviceError at load) and match the reference, W13 + SwiGLU and
    W2."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core import interop
    from kernelgen.moe import grouped_gemm, plan_grouped

    info = device_info()
    lim = 99 * 1024
    monkeypatch.setitem(interop._smem_limits, info.index, (lim, "test part of 99 KB"))
    rng = np.random.default_rng()
    reduced = set()
    for kind, t, e, top_k, n, k in (("uniform", 2048, 8, 2, 256, 520),
                                    ("hot80", 700, 16, 4, 528, 1048)):
        x, w, off = _problem(rng, kind, t, e, top_k, n, k, dtype, gap=3)
        xd, wd, od = cupy.asarray(x), cupy.asarray(w), cupy.asarray(off)
        for act in (None, "swiglu"):
            epi = "swiglu" if act else "none"
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), MR.to_float64(w, dtype), off, act)
            for tm, tn, wg in SMEM_ROWS:
                args = (info.arch.name, info.sm_count, dtype, e, n, k, x.shape[0], epi, tm, None,
                        tn, "threshold", wg)
                full, p = plan_grouped(*args), plan_grouped(*args, lim)
                ctx = f"{kind=} {t=} {e=} {n=} {k=} {act} {p.short()} (full: {full.short()})"
                assert p.smem <= lim, ctx
                if p.config.tile_n == full.config.tile_n:
                    assert p.config.stages <= full.config.stages, ctx
                    if p.config.stages < full.config.stages:
                        reduced.add((p.config.tile_m, p.config.tile_n))
                y = grouped_gemm(xd, wd, od, activation=act, tile_m=tm, tile_n=tn, wgmma=wg,
                                 dtype="bfloat16" if dtype == "bfloat16" else None)
                _check(y, ref, dtype, ctx)
    assert {(128, 128), (256, 128)} <= reduced, reduced


@pytest.mark.parametrize("bits", (2, 4))
def test_kbit_experts_on_a_part_with_99_kb(bits, monkeypatch):
    """kbit experts with the device's limit lowered to 99 KB: the planner's budget is
    min(SMEM_BUDGET[arch], 99 KB) (sm_90a: 110 KB -> 99 KB, fewer stages), every TILE_M plans
    within it and matches the reference."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core import interop
    from kernelgen.moe import grouped_gemm, plan_kbit
    from kernelgen.moe.config import KBIT_TILE_MS
    from kernelgen.moe.kbit import SMEM_BUDGET

    info = device_info()
    lim = 99 * 1024
    monkeypatch.setitem(interop._smem_limits, info.index, (lim, "test part of 99 KB"))
    rng = np.random.default_rng()
    dtype = "bfloat16"
    reduced = False
    for act in (None, "swiglu"):
        n, k = (208, 384) if act else (200, 640)
        epi = "swiglu" if act else "none"
        for kind, t, e, top_k in KBIT_CASES[:3]:
            q, w64 = _kbit_weight(rng, e, n, k, bits, dtype)
            ids = routing(kind, t, e, top_k, rng)
            off, _ = MR.layout(ids, e)
            off = off.astype(np.int32)
            x = _host(rng, (int(off[-1]), k), dtype)
            ref = MR.grouped_gemm(MR.to_float64(x, dtype), w64, off, act)
            xd, od = cupy.asarray(x), cupy.asarray(off)
            for tm in (None, *KBIT_TILE_MS):
                args = (info.arch.name, info.sm_count, dtype, bits, e, n, k, x.shape[0], epi, tm)
                full, p = plan_kbit(*args), plan_kbit(*args, smem_limit=lim)
                ctx = f"kbit {bits=} {act} {kind=} {t=} {e=} {tm=} {p.short()} (full: {full.short()})"
                # within the limit; a warp shape that still fits keeps at most its stages (a
                # shape that no longer fits gives way to another, with stages of its own)
                assert p.smem <= lim, ctx
                if (p.config.warps_p, p.config.warps_k) == (full.config.warps_p, full.config.warps_k):
                    assert p.config.stages <= full.config.stages, ctx
                reduced |= p.config != full.config
                y = grouped_gemm(xd, q, od, activation=act, tile_m=tm, dtype="bfloat16")
                _check(y, ref, dtype, ctx)
    assert reduced == (SMEM_BUDGET[info.arch.name] > lim), info.arch.name
