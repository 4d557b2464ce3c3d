"""FP4-weight GEMM on the GPU against the NumPy reference (W dequantized by
kernelgen/mx/reference.py, float64 matmul): both formats x fp16/bf16 x M across both paths and
their boundaries x shapes with partial tiles, bias, alpha, out=, split-K forced on/off, scale
layouts, torch. Outputs are poisoned (KERNELGEN_POISON=1) or pre-filled with NaN through out=,
so an element the kernel does not write fails the bound."""

import functools
import gc

import numpy as np
import pytest

from kernelgen.fp4_gemm import reference as GR
from kernelgen.kbit import reference as KR

from ._weights import device_weight

pytestmark = pytest.mark.gpu

FMTS = ("nvfp4", "mxfp4")
DTYPES = ("float16", "bfloat16")
MS = (1, 2, 3, 5, 8, 15, 16, 17, 33, 64, 127, 256, 1024)
# N not a multiple of 16 / 128 (partial warp and CTA tiles); K = 3, 8 and 33 steps of 128
SHAPES = ((200, 384), (96, 1024), (1000, 4224))


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(rng, shape, dtype, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    return KR.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


@functools.cache
def _weight(fmt, n, k, layout="row_major"):
    return device_weight(fmt, n, k, layout)


def _skip_unless_wgmma(path):
    """The wgmma path runs on sm_90a only (Fp4WgmmaConfig)."""
    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm.config import WGMMA_ARCHS

    if path == "wgmma" and device_info().arch.name not in WGMMA_ARCHS:
        pytest.skip(f"path='wgmma' needs one of {WGMMA_ARCHS}")


def _check(d_dev, d_ref, dtype, ctx):
    import cupy

    d = GR.to_float64(cupy.asnumpy(d_dev), dtype)
    assert np.all(np.isfinite(d)), f"{ctx}: {int(np.sum(~np.isfinite(d)))} elements not written / not finite"
    err = GR.rel_error(d, d_ref)
    if not err <= GR.REL_ERROR_BOUND[dtype]:
        d2, r2 = d.reshape(-1, d.shape[-1]), d_ref.reshape(-1, d_ref.shape[-1])
        bad = np.abs(d2 - r2) > 0.05 * (np.abs(r2) + np.linalg.norm(r2) / np.sqrt(r2.size))
        ms, ns = np.nonzero(bad)
        raise AssertionError(f"{ctx}: rel error {err:.3g}; {bad.mean():.1%} bad; tokens "
                             f"{sorted(set(ms.tolist()))[:8]}, rows {ns[:8].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_matches_reference(fmt, dtype):
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        t, w64 = _weight(fmt, n, k)
        for m in MS:
            if m >= 256 and n * k > 10**6:
                continue  # the big-M cases run on the smaller shapes (reference time)
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            alpha = float(rng.uniform(0.25, 2.0)) if m % 3 == 0 else 1.0
            d_ref = GR.gemm(a, w64, bias, alpha, dtype)
            d = fp4_gemm(cupy.asarray(a), t, None if bias is None else cupy.asarray(bias),
                         alpha=alpha, dtype=hint)
            ctx = f"{fmt=} {dtype=} {m=} {n=} {k=} {alpha=} bias={bias is not None}"
            assert d.shape == (m, n) and d.dtype == (cupy.uint16 if hint else cupy.float16), ctx
            _check(d, d_ref, dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_weight_encoded_for_either_activation_type(fmt, dtype):
    """prepare_weight(act_dtype=...) for fp16 and for bf16 activations: with A of either dtype,
    both paths (GEMV at M = 1 / 16, tiles at M = 40), split 1 and 2, give the reference's result
    and the same bits from both weights (the decoded raw values are equal, so are the sums); an
    MxTensor passed directly is prepared for A's dtype."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight
    from kernelgen.fp4_gemm.api import _as_weight

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    n, k = 1000, 4224
    t, w64 = _weight(fmt, n, k)
    ws = {enc: prepare_weight(t, act_dtype=enc) for enc in DTYPES}
    assert {enc: w.encoding for enc, w in ws.items()} == {enc: enc for enc in DTYPES}
    assert _as_weight(t, dtype).encoding == dtype
    for m, path in ((1, "gemv"), (16, "gemv"), (40, "tile")):
        for split in (1, 2):
            a = cupy.asarray(_host(rng, (m, k), dtype))
            bias = cupy.asarray(_host(rng, (n,), dtype))
            want = GR.gemm(cupy.asnumpy(a), w64, cupy.asnumpy(bias), 0.5, dtype)
            outs = []
            for enc, w in ws.items():
                out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                fp4_gemm(a, w, bias, alpha=0.5, out=out, dtype=hint, path=path, split_k=split)
                ctx = f"{fmt=} {dtype=} weight for {enc} {m=} {path=} {split=}"
                _check(out, want, dtype, ctx)
                outs.append(out.view(cupy.uint16))
            assert bool((outs[0] == outs[1]).all()), f"{fmt=} {dtype=} {m=} {path=} {split=}"


@pytest.mark.parametrize("fmt", FMTS)
def test_dispatch_over_m(fmt):
    """Dispatch at the path rule's edges (select.path_for): N = 1000 has 8 row CTAs, so the
    bandwidth path runs ceil(M / 16) passes up to M = 128 and dequantize + cuBLAS from 129
    (the tile path's range, M = 17..128 on weights of many row CTAs, runs in
    test_tile_path_on_a_part_with_99_kb and test_matches_reference)."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core.interop import smem_limit
    from kernelgen.fp4_gemm import fp4_gemm, select_fp4
    from kernelgen.fp4_gemm.select import path_for

    info = device_info()
    rng = np.random.default_rng()
    n, k = 1000, 1024
    t, w64 = _weight(fmt, n, k)
    for m in (17, 33, 64, 65, 128, 129):
        a = _host(rng, (m, k), "float16")
        out = cupy.full((m, n), np.nan, cupy.float16)
        fp4_gemm(cupy.asarray(a), t, alpha=0.5, out=out)
        path = select_fp4(info.arch.name, m, n, k, fmt, "float16", info.sm_count, "float16",
                          smem_limit(info.index)).path
        assert path == path_for(m, n, info.sm_count), m
        if info.sm_count >= 32:  # 8 row CTAs: at most a quarter of the SMs
            assert path == ("gemv" if m <= 128 else "dequant"), m
        _check(out, GR.gemm(a, w64, None, 0.5), "float16", f"{fmt=} {m=} {path=}")


@pytest.mark.parametrize("fmt", FMTS)
def test_short_k_dispatch_takes_wgmma(fmt):
    """Dispatch's own choice on a short K whose 128-row CTAs cover the SMs (select.py
    WGMMA_SHORT_K_M): 64..128 tokens run the wgmma path unsplit over 8 steps, and agree with
    the reference."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, select_fp4

    _skip_unless_wgmma("wgmma")
    info = device_info()
    n, k = 128 * info.sm_count, 1024
    t, w64 = _weight(fmt, n, k)
    rng = np.random.default_rng()
    for m in (64, 96):
        p = select_fp4(info.arch.name, m, n, k, fmt, "float16", info.sm_count)
        assert p.path == "wgmma" and p.split == 1, p.short()
        a = _host(rng, (m, k), "float16")
        out = fp4_gemm(cupy.asarray(a), t)  # poisoned: an element not written fails
        _check(out, GR.gemm(a, w64, None, 1.0, "float16"), "float16", f"{fmt=} {m=} [{p.short()}]")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_wgmma_path(fmt, dtype):
    """The warpgroup-MMA tile path (sm_90a, templates/fp4_gemm/wgmma.cuh), forced: M across its
    token tiles (BM 64 / 128 / 256, partial and several), N with partial 16-row and 128-row
    tiles, K of 3 / 8 / 33 steps, K splits (the planner's, 1, 2, and 5: the finish's second
    round of 4 with a tail), bias and alpha, weights encoded for either activation type (their
    results equal bit for bit); outputs pre-filled with NaN."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan, prepare_weight

    _skip_unless_wgmma("wgmma")
    info = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        t, w64 = _weight(fmt, n, k)
        ws = [prepare_weight(t, act_dtype=enc) for enc in DTYPES]
        for m in (1, 17, 64, 65, 128, 129, 256, 300):
            if m >= 256 and n * k > 10**6:
                continue  # reference time
            for split in (None, 1, 2, 5):
                if split is not None and split > k // 128:
                    continue
                p = plan(info.arch.name, m, n, k, fmt, dtype, info.sm_count, path="wgmma", split=split)
                assert p.path == "wgmma" and p.config.bm >= min(m, 256), p.short()
                a = _host(rng, (m, k), dtype)
                bias = _host(rng, (n,), dtype) if m % 2 else None
                alpha = 0.75 if m % 3 else 1.0
                want = GR.gemm(a, w64, bias, alpha, dtype)
                outs = []
                for w in ws:
                    out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                    fp4_gemm(cupy.asarray(a), w, None if bias is None else cupy.asarray(bias), alpha=alpha,
                             out=out, dtype=hint, path="wgmma", split_k=split)
                    _check(out, want, dtype, f"wgmma {fmt=} {dtype=} enc={w.encoding} {m=} {n=} {k=} {split=} "
                                             f"[{p.short()}]")
                    outs.append(out.view(cupy.uint16))
                assert bool((outs[0] == outs[1]).all()), f"wgmma {fmt=} {dtype=} {m=} {n=} {k=} {split=}"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("stages,inflight", [(2, 0), (3, 0), (3, 1), (4, 0), (4, 1)])
def test_wgmma_pipeline_variants(fmt, stages, inflight):
    """Every A-stage count x wgmma groups in flight x weight ring depth the config allows, at BM
    64 and 128 (BM 64, 2 stages: also two CTAs an SM), on K = 33 steps (splits 1 and 2: 33 / 17
    steps a CTA, a multiple of no ring depth, more steps than any pipeline), through fp4_gemm's
    _plan."""
    import dataclasses

    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    _skip_unless_wgmma("wgmma")
    info = device_info()
    rng = np.random.default_rng()
    n, k = 1000, 4224
    t, w64 = _weight(fmt, n, k)
    for m in (40, 100):
        a = _host(rng, (m, k), "float16")
        want = GR.gemm(a, w64, None, 1.0)
        for split in (1, 2):
            p = plan(info.arch.name, m, n, k, fmt, "float16", info.sm_count, path="wgmma", split=split)
            two = (stages, inflight) == (2, 0) and p.config.bm == 64  # also 2 CTAs an SM
            for ring, ctas in [(r, 1) for r in (1, 2, 3)] + ([(3, 2)] if two else []):
                cfg = p.config.replace(stages=stages, inflight=inflight, ring=ring, ctas_per_sm=ctas)
                q = dataclasses.replace(p, config=cfg, smem=cfg.smem_bytes())
                out = cupy.full((m, n), np.nan, cupy.float16)
                fp4_gemm(cupy.asarray(a), t, out=out, _plan=q)
                _check(out, want, "float16", f"wgmma {fmt=} {m=} {split=} [{q.short()}]")
                if ctas == 2:  # the driver really fits two CTAs an SM (registers, shared memory)
                    from kernelgen.core.jit import get_kernel

                    fn = get_kernel(cfg, info.index).fn("fp4_wgmma")
                    drv = cupy.cuda.driver
                    assert drv.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, 256, cfg.smem_bytes()) == 2


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("path,split", [("gemv", 1), ("gemv", 3), ("gemv", 5), ("tile", 1), ("tile", 2),
                                        ("tile", 6)])
def test_forced_paths_and_splits(fmt, path, split):
    """Both paths at M each would not be picked for (multi-pass GEMV, tile at M=1), split on/off
    (GEMV: split 3 over K slices of KW = 2 warps, split 1 over KW = 8 on K = 4224). Splits 5
    and 6 (the finish's second round of 4 splits, with a tail) run on K = 4224 only: K = 384 has
    3 steps of 128, and a split past that is refused (test_fp4_gemm_cpu.test_forced_path_and_split)."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    rng = np.random.default_rng()
    for n, k in ((200, 384), (1000, 4224)):
        if split > k // 128:
            continue
        t, w64 = _weight(fmt, n, k)
        for m in (1, 7, 16, 40):
            a = _host(rng, (m, k), "float16")
            bias = _host(rng, (n,), "float16")
            d = fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=0.75, path=path, split_k=split)
            _check(d, GR.gemm(a, w64, bias, 0.75), "float16", f"{fmt=} {path=} {split=} {m=} {n=} {k=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("tpw", [1, 2])
def test_gemv_tiles_a_warp(fmt, dtype, tpw):
    """The bandwidth kernel with 1 and 2 tiles a warp (whichever the selector does not pick) at
    M = 1 / 7 (m_tile 8), 16 / 40 (m_tile 16, 40 in 3 passes), N of 3 / 13 / 63 tiles (a second
    tile past N), 3 / 8 / 33 steps, split 1 and 2."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    dev = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((40, 384), (200, 1024), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        for m in (1, 7, 16, 40):
            for split in (1, 2):
                p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv", split=split, tpw=tpw)
                a = _host(rng, (m, k), dtype)
                bias = _host(rng, (n,), dtype)
                out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=1.25, out=out, dtype=hint, _plan=p)
                _check(out, GR.gemm(a, w64, bias, 1.25, dtype), dtype, f"{p.short()} {m=} {n=} {k=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_32_warps_an_sm(fmt, dtype):
    """The bandwidth kernel at 32 resident warps an SM (<= 64 registers, TPW 1, KW doubled
    where the grid allows), M = 1 / 5 (m_tile 8) and 12 / 16 (m_tile 16: one accumulator chain a
    token half), split 1 and 2, against the reference and bit for bit (same sums in the same
    order) against, at m_tile 8, the 16-warp launch of the same K slices (forced to the same KW)
    and depth 3, at m_tile 16 the same launch with A loaded a word at a time."""
    import dataclasses

    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    dev = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((200, 1024), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        for m in (1, 5, 12, 16):
            for split in (1, 2):
                p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv", split=split, wps=32)
                if m <= 8:  # the same K slices at 16 warps an SM; 3 steps in flight
                    other = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv",
                                 split=split, tpw=1, wps=16)
                    others = [dataclasses.replace(other, config=other.config.replace(warps=p.config.warps),
                                                  kw=p.kw, grid=p.grid, block=p.block),
                              dataclasses.replace(p, config=p.config.replace(depth=3))]
                else:
                    others = [dataclasses.replace(p, config=p.config.replace(a_by_word=True))]
                a = cupy.asarray(_host(rng, (m, k), dtype))
                bias = cupy.asarray(_host(rng, (n,), dtype))
                outs = []
                for q in [p, *others]:
                    out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                    fp4_gemm(a, t, bias, alpha=1.25, out=out, dtype=hint, _plan=q)
                    outs.append(out.view(cupy.uint16))
                ctx = f"{p.short()} {m=} {n=} {k=}"
                assert all(bool((outs[0] == o).all()) for o in outs[1:]), ctx
                _check(outs[0] if hint else outs[0].view(cupy.float16), GR.gemm(
                    cupy.asnumpy(a), w64, cupy.asnumpy(bias), 1.25, dtype), dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_16_warps_a_tile_along_k(fmt, dtype):
    """KW 16 (16-warp CTAs, 2 an SM at 32 warps an SM; dispatch takes it at m_tile 16 on long K,
    e.g. 4096x14336): M = 9 and 16 on partial CTA tiles, split 1 and, on a longer K, 2, against
    the reference with bias and alpha (outputs pre-filled with NaN)."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    dev = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k, split in ((1000, 8320, 1), (1000, 16640, 2)):
        t, w64 = _weight(fmt, n, k)
        for m in (9, 16):
            p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv", split=split, wps=32)
            ctx = f"{p.short()} {m=} {n=} {k=}"
            assert (p.kw, p.config.warps, p.split) == (16, 16, split), ctx
            a = cupy.asarray(_host(rng, (m, k), dtype))
            bias = cupy.asarray(_host(rng, (n,), dtype))
            out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
            fp4_gemm(a, t, bias, alpha=1.25, out=out, dtype=hint, _plan=p)
            _check(out if hint else out.view(cupy.float16), GR.gemm(
                cupy.asnumpy(a), w64, cupy.asnumpy(bias), 1.25, dtype), dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_a_ring(fmt, dtype):
    """A staged by cp.async in a shared-memory ring a warp (a_ring): bit for bit the launch that
    reads A from global memory (same mma sequence), and within the reference bound; m_tile 8 and
    16, TPW 1 / 2, 4- and 8-warp CTAs, M = 1 / 5 / 12 / 16 / 40 (3 passes), split 1 and 2, short
    and uneven K slices."""
    import dataclasses

    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    dev = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((200, 1024), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        for m in (1, 5, 12, 16, 40):
            for split, tpw in ((1, None), (2, 1), (1, 2)):
                p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv", split=split,
                         tpw=tpw, wps=16)
                cfg = p.config.replace(a_ring=True)
                r = dataclasses.replace(p, config=cfg, smem=cfg.smem_bytes())
                a = cupy.asarray(_host(rng, (m, k), dtype))
                bias = cupy.asarray(_host(rng, (n,), dtype))
                outs = []
                for q in (r, p):
                    out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                    fp4_gemm(a, t, bias, alpha=1.25, out=out, dtype=hint, _plan=q)
                    outs.append(out.view(cupy.uint16))
                ctx = f"{r.short()} {m=} {n=} {k=}"
                assert bool((outs[0] == outs[1]).all()), ctx
                _check(outs[0] if hint else outs[0].view(cupy.float16), GR.gemm(
                    cupy.asnumpy(a), w64, cupy.asnumpy(bias), 1.25, dtype), dtype, ctx)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("arrangement", ["step_major", "tile_major_inline", "step_major_inline"])
def test_arrangements_equal_tile_major(fmt, arrangement):
    """Every block arrangement (layout.py) gives the tile-major result bit for bit (same sums in
    the same order), on both paths, TPW 1 / 2, split 1 / 2, bf16 and fp16, and matches the
    reference; the weight is built by prepare_weight(arrangement=...)."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan, prepare_weight

    dev = device_info()
    rng = np.random.default_rng()
    for n, k in ((200, 384), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        base, arr = prepare_weight(t, "tile_major", act_dtype="float16"), prepare_weight(
            t, arrangement, act_dtype="float16")
        assert arr.arrangement == arrangement and arr.strides() != base.strides()
        for dtype in DTYPES:
            hint = "bfloat16" if dtype == "bfloat16" else None
            for m, path, split, tpw in ((1, "gemv", 1, None), (16, "gemv", 1, 2), (16, "gemv", 2, 1),
                                        (5, "gemv", 3, None), (40, "tile", 1, None), (40, "tile", 2, None)):
                p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path=path, split=split, tpw=tpw)
                a = cupy.asarray(_host(rng, (m, k), dtype))
                bias = cupy.asarray(_host(rng, (n,), dtype))
                outs = []
                for w in (base, arr):
                    out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                    fp4_gemm(a, w, bias, alpha=0.75, out=out, dtype=hint, _plan=p)
                    outs.append(out.view(cupy.uint16))
                ctx = f"{arrangement} {p.short()} {m=} {n=} {k=} {dtype}"
                assert all(bool((outs[0] == o).all()) for o in outs[1:]), ctx
                _check(outs[1].view(cupy.float16) if not hint else outs[1], GR.gemm(
                    cupy.asnumpy(a), w64, cupy.asnumpy(bias), 0.75, dtype), dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_wide_scale_range(dtype):
    """Groups 2^-24 .. 2^4 apart within a row (fp16: the scale goes into the decode table)."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm
    from kernelgen.fp4_gemm.reference import dequantize
    from kernelgen.mx import reference as MR

    from ._weights import mx_tensor_class

    rng = np.random.default_rng()
    n, k = 96, 1024
    w = rng.standard_normal((n, k)) * np.exp2(rng.integers(-24, 5, (n, k // 32))).repeat(32, axis=1)
    packed, scales = MR.quantize_mx(w.astype(np.float32), "mxfp4", scale_layout="row_major")
    t = mx_tensor_class()(fmt="mxfp4", shape=(n, k), data=cupy.asarray(packed),
                          scales=cupy.asarray(scales), scale_layout="row_major", global_scale=None)
    w64 = dequantize("mxfp4", packed, scales)
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m in (1, 40):
        a = _host(rng, (m, k), dtype)
        d = fp4_gemm(cupy.asarray(a), t, dtype=hint)
        _check(d, GR.gemm(a, w64, None, 1.0, dtype), dtype, f"wide mxfp4 {dtype=} {m=}")


@pytest.mark.parametrize("fmt", FMTS)
def test_swizzled_scales_equal_row_major(fmt):
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    rng = np.random.default_rng()
    n, k = 200, 1024
    t_rm, w64 = _weight(fmt, n, k)
    t_sw, w64_sw = _weight(fmt, n, k, "swizzled")
    assert np.array_equal(w64, w64_sw)
    for m in (1, 5, 64):
        a = cupy.asarray(_host(rng, (m, k), "bfloat16"))
        d_rm = fp4_gemm(a, t_rm, dtype="bfloat16")
        d_sw = fp4_gemm(a, t_sw, dtype="bfloat16")
        assert cupy.array_equal(d_rm, d_sw), f"{fmt=} {m=}"


def test_out_buffer_leading_dims_and_prepared():
    import cupy

    from kernelgen.fp4_gemm import Fp4Weight, fp4_gemm, prepare_weight

    rng = np.random.default_rng()
    n, k = 96, 1024
    t, w64 = _weight("mxfp4", n, k)
    w = prepare_weight(t, act_dtype="float16")
    assert isinstance(w, Fp4Weight) and w.shape == (n, k)
    for lead in ((2, 3), (4, 10)):
        a = _host(rng, (*lead, k), "float16")
        out = cupy.full((*lead, n), np.nan, cupy.float16)
        r = fp4_gemm(cupy.asarray(a), w, out=out, alpha=2.0)
        assert r is out
        _check(out, GR.gemm(a, w64, None, 2.0), "float16", f"{lead=}")
    with pytest.raises(ValueError, match=r"out: shape \(3, 96\); expected \(2, 96\)"):
        fp4_gemm(cupy.asarray(_host(rng, (2, k), "float16")), w, out=cupy.empty((3, n), cupy.float16))
    with pytest.raises(ValueError, match="K=512 does not match the weight's K=1024"):
        fp4_gemm(cupy.zeros((2, 512), cupy.float16), w)
    with pytest.raises(ValueError, match="dtype float32 not supported"):
        fp4_gemm(cupy.zeros((2, k), cupy.float32), w)
    with pytest.raises(ValueError, match="bias: has 95 elements"):
        fp4_gemm(cupy.zeros((2, k), cupy.float16), w, cupy.zeros(95, cupy.float16))


@pytest.mark.parametrize("fmt", FMTS)
def test_torch_tensors_on_a_side_stream(fmt):
    torch = pytest.importorskip("torch")

    from kernelgen.fp4_gemm import fp4_gemm

    n, k = 200, 384
    t, w64 = device_weight(fmt, n, k, xp=lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda())
    rng = np.random.default_rng()
    s = torch.cuda.Stream()
    for m in (3, 40, 300):  # gemv, gemv, dequant + cuBLAS (device scalars, torch scratch)
        a = _host(rng, (m, k), "bfloat16")
        a_t = torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
        want = GR.gemm(a, w64, None, 1.5, "bfloat16")
        with torch.cuda.stream(s):
            d = fp4_gemm(a_t, t, alpha=1.5)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                fp4_gemm(a_t, t, alpha=1.5, out=out)
            out.fill_(float("nan"))
            g.replay()
        s.synchronize()
        assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.shape == (m, n)
        _check(d.view(torch.int16).cpu().numpy().view(np.uint16), want, "bfloat16", f"torch {fmt=} {m=}")
        _check(out.view(torch.int16).cpu().numpy().view(np.uint16), want, "bfloat16",
               f"torch graph {fmt=} {m=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path,split", [("gemv", 1), ("gemv", 2), ("tile", 1), ("tile", 2), ("wgmma", 1),
                                        ("wgmma", 2)])
def test_mxfp4_extreme_row_scales(dtype, path, split):
    """Review B1: an all-zero group (scale 0x00) beside one of scale 128, and a within-row scale
    spread of 129 (0x01 beside 130): no NaN / wrapped scale, the result matches float64."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    from ._weights import extreme_mx_weight, mx_tensor_class

    _skip_unless_wgmma(path)
    rng = np.random.default_rng()
    n, k = 200, 1024
    packed, scales, w64 = extreme_mx_weight(n, k)
    t = mx_tensor_class()(fmt="mxfp4", shape=(n, k), data=cupy.asarray(packed),
                          scales=cupy.asarray(scales), scale_layout="row_major", global_scale=None)
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m in (1, 7, 40):
        a = _host(rng, (m, k), dtype)
        d = fp4_gemm(cupy.asarray(a), t, dtype=hint, path=path, split_k=split)
        _check(d, GR.gemm(a, w64, None, 1.0, dtype), dtype, f"extreme mxfp4 {dtype=} {path=} {split=} {m=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("path,split", [("gemv", 1), ("gemv", 2), ("tile", 1), ("wgmma", 1)])
def test_nan_scale_groups(fmt, path, split, dtype):
    """A NaN scale byte (NVFP4 e4m3 0x7F, MXFP4 E8M0 0xFF) in one group of some rows: every
    output of those rows is NaN (MXFP4 through the row factor), the other rows match float64."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    from ._weights import host_weight, mx_tensor_class

    _skip_unless_wgmma(path)
    n, k = 72, 1024
    packed, scales, gs, _ = host_weight(fmt, n, k)
    scales = scales.copy()
    rows = [0, 17, 40, 71]
    for i, r in enumerate(rows):  # groups in different words / steps / lanes
        scales[r, (5 * i + 3) % scales.shape[1]] = 0x7F if fmt == "nvfp4" else 0xFF
    w64 = GR.dequantize(fmt, packed, scales, gs)
    assert np.isnan(w64[rows]).any(axis=1).all()
    t = mx_tensor_class()(fmt=fmt, shape=(n, k), data=cupy.asarray(packed), scales=cupy.asarray(scales),
                          scale_layout="row_major",
                          global_scale=None if gs is None else cupy.asarray(np.array([gs], np.float32)))
    keep = np.setdiff1d(np.arange(n), rows)
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m in (1, 12, 40):
        a = _host(rng, (m, k), dtype)
        d_dev = fp4_gemm(cupy.asarray(a), t, dtype=hint, path=path, split_k=split)
        d = GR.to_float64(cupy.asnumpy(d_dev), dtype)
        assert np.isnan(d[:, rows]).all(), f"{fmt=} {dtype=} {path=} {m=}: NaN rows not all NaN"
        _check(d_dev[:, keep], GR.gemm(a, w64[keep], None, 1.0, dtype), dtype,
               f"nan groups {fmt=} {dtype=} {path=} {split=} {m=}")


@pytest.mark.parametrize("dtype,scale", [("float16", 2.0 ** -8), ("bfloat16", 2.0 ** -24)])
@pytest.mark.parametrize("fmt", FMTS)
def test_small_activations(fmt, dtype, scale):
    """Activations far below 1 (bf16: 2^-24) keep the relative error bound on every path: a
    raw bf16 fragment is e2m1 * 2^-126, so scaling MXFP4 after the mma (as fp16 m_tile 8 does)
    would put a word's sums into fp32's subnormals (review of bbdfb13: 0.13 relative error)."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    n, k = 200, 1024
    t, w64 = _weight(fmt, n, k)
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for m, path in ((1, "gemv"), (5, "gemv"), (12, "gemv"), (40, "tile")):
        a = _host(rng, (m, k), dtype, scale=scale)
        d = fp4_gemm(cupy.asarray(a), t, dtype=hint, path=path)
        _check(d, GR.gemm(a, w64, None, 1.0, dtype), dtype, f"small A {fmt=} {dtype=} {m=} {path=}")


def test_static_plus_dynamic_smem_over_48k():
    """A launch whose dynamic shared memory is at most 48 KB but whose static + dynamic is more
    (a_ring at depth 3: 48 KB of slots beside 8 KB of K-slice sums) opts in (core/jit.py) and
    gives the default plan's result bit for bit."""
    import dataclasses

    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan, prepare_weight

    n, k, m = 256, 2560, 16  # 20 steps: past select.SHORT_K_STEPS, so KW stays 4 (4-warp CTAs)
    t, w64 = _weight("nvfp4", n, k)
    w = prepare_weight(t, act_dtype="float16")
    a = cupy.asarray(_host(np.random.default_rng(), (m, k), "float16"))
    dev = device_info()
    base = plan(dev.arch.name, m, n, k, "nvfp4", "float16", dev.sm_count, wps=16, tpw=2)
    assert base.config.warps == 4  # the same grid and block serve the a_ring config
    cfg = base.config.replace(a_ring=True, depth=3)
    assert cfg.smem_bytes() == 48 * 1024
    p = dataclasses.replace(base, config=cfg, smem=cfg.smem_bytes())
    got = fp4_gemm(a, w, _plan=p)
    want = fp4_gemm(a, w, _plan=base)
    assert cupy.array_equal(got, want), p.short()
    _check(got, GR.gemm(cupy.asnumpy(a), w64), "float16", p.short())


@pytest.mark.parametrize("fmt", FMTS)
def test_prepared_weight_outlives_torch_inputs(fmt):
    """Review B2: the Fp4Weight owns its buffers (K = 128, N % 16 == 0: the tiled layout is a
    plain reshape there); the MxTensor's tensors are freed and their memory overwritten."""
    torch = pytest.importorskip("torch")
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight

    n, k = 32, 128
    t, w64 = device_weight(fmt, n, k, xp=lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda())
    inputs = [x for x in (t.data, t.scales, t.global_scale) if x is not None]
    spans = [(x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()) for x in inputs]
    w = prepare_weight(t, act_dtype="float16")
    for x in (w.data, w.scales, w.post):
        lo, hi = x.data.ptr, x.data.ptr + x.nbytes
        assert all(hi <= a or b <= lo for a, b in spans), fmt
    del t, inputs
    gc.collect()  # the cached cupy views of the tensors hold them in a cycle
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    junk = [torch.full((1 << 16,), 0x7F, dtype=torch.uint8, device="cuda") for _ in range(8)]
    a = _host(np.random.default_rng(), (3, k), "float16")
    d = fp4_gemm(cupy.asarray(a), w)
    _check(d, GR.gemm(a, w64), "float16", f"{fmt=} after the inputs are freed")
    del junk


def test_alignment_rules():
    """Review H5: A 16-byte aligned (16-byte loads), out / bias element-aligned (2-byte stores)."""
    import cupy

    from kernelgen.fp4_gemm import fp4_gemm

    n, k = 96, 1024
    t, _ = _weight("mxfp4", n, k)
    base = cupy.zeros(2 * k + 8, cupy.float16)
    a = base[4:4 + 2 * k].reshape(2, k)  # 8 bytes past an aligned address, contiguous
    with pytest.raises(ValueError, match="A: data pointer must be 16-byte aligned"):
        fp4_gemm(a, t)
    a = cupy.zeros((2, k), cupy.float16)
    raw = cupy.zeros(2 * n * 2 + 2, cupy.uint8)
    out = cupy.ndarray((2, n), cupy.float16, raw.data + 1)
    with pytest.raises(ValueError, match="out: data pointer must be 2-byte aligned"):
        fp4_gemm(a, t, out=out)
    bias = cupy.ndarray((n,), cupy.float16, raw.data + 1)
    with pytest.raises(ValueError, match="bias: data pointer must be 2-byte aligned"):
        fp4_gemm(a, t, bias)
    out = cupy.zeros(2 * n + 1, cupy.float16)[1:].reshape(2, n)  # 2 bytes past: allowed
    fp4_gemm(a, t, out=out)
    assert not cupy.isnan(out).any()
    # a hand-built Fp4Weight: blocks 16-byte aligned, scale words 8-byte aligned
    from kernelgen.fp4_gemm import Fp4Weight, prepare_weight

    w = prepare_weight(t, arrangement="step_major", act_dtype="float16")
    for name, off, need in (("data", 8, 16), ("scales", 4, 8)):
        x = getattr(w, name)
        moved = cupy.zeros(x.nbytes + 16, cupy.uint8)
        view = cupy.ndarray(x.shape, cupy.uint8, moved.data + off)
        parts = {"data": w.data, "scales": w.scales, name: view}
        with pytest.raises(ValueError, match=f"Fp4Weight.{name}: data pointer must be {need}-byte aligned"):
            Fp4Weight(w.fmt, w.n, w.k, parts["data"], parts["scales"], w.post, w.device, w.arrangement)


@pytest.mark.parametrize("fmt", FMTS)
def test_tile_path_on_a_part_with_99_kb(fmt, monkeypatch):
    """A device whose blocks get 99 KB (8.6 / 8.9 parts, 101376 B; here the device's limit is
    lowered to it): the tile path at M = 64 (BM 64) and 256 (BM 128) plans the stages that fit
    (BM 128: 2, fewer than the target's), loads and launches (a kernel over the limit raises
    DeviceError at load) and matches the reference, forced with and without split 2; dispatch
    (the GEMV at 64, dequantize + cuBLAS at 256: no shared memory to plan) matches too, and
    dispatch runs a reduced-stage tile itself at M = 100 on 8192 rows."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core import interop
    from kernelgen.fp4_gemm import fp4_gemm, plan, select_fp4
    from kernelgen.fp4_gemm.select import DENSE_MIN_M

    info = device_info()
    lim = 99 * 1024
    n, k = 1000, 4224
    t, w64 = _weight(fmt, n, k)
    # (N = 1000 has 8 row CTAs: dispatch takes the GEMV up to M = 128, so M = 64 forces the tile)
    full = {m: plan(info.arch.name, m, n, k, fmt, "float16", info.sm_count, path="tile") for m in (64, 256)}
    monkeypatch.setitem(interop._smem_limits, info.index, (lim, "test part of 99 KB"))
    assert interop.smem_limit(info.index) == lim
    rng = np.random.default_rng()
    for m in (64, 256):
        p = plan(info.arch.name, m, n, k, fmt, "float16", info.sm_count, path="tile", smem_limit=lim)
        sel = select_fp4(info.arch.name, m, n, k, fmt, "float16", info.sm_count, "float16", lim)
        assert sel.path == ("dequant" if m >= DENSE_MIN_M else "gemv"), sel.short()
        ctx = f"{fmt=} {m=} {p.short()} (without the limit: {full[m].short()})"
        assert p.path == "tile" and p.smem <= lim, ctx
        assert p.config.replace(stages=full[m].config.stages) == full[m].config, ctx
        if m == 256:
            assert p.config.bm == 128 and p.config.stages == 2 < full[m].config.stages, ctx
        a = _host(rng, (m, k), "float16")
        bias = _host(rng, (n,), "float16")
        want = GR.gemm(a, w64, bias, 0.5)
        _check(fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=0.5), want, "float16", ctx)
        _check(fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=0.5, path="tile"), want, "float16",
               f"{ctx} forced tile")
        d = fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=0.5, path="tile", split_k=2)
        _check(d, want, "float16", f"{ctx} forced tile split 2")
    # dispatch itself takes a reduced-stage tile: M = 100 on 8192 rows (64 row CTAs, more than a
    # quarter of the SMs: the tile path, BM 64), which at 99 KB keeps fewer stages (nvfp4 3)
    n, k, m = 8192, 1024, 100
    t, w64 = _weight(fmt, n, k)
    p = select_fp4(info.arch.name, m, n, k, fmt, "float16", info.sm_count, "float16", lim)
    full = plan(info.arch.name, m, n, k, fmt, "float16", info.sm_count)
    assert p.path == "tile" and p.config.bm == 64 and p.smem <= lim, p.short()
    assert p.config.stages <= full.config.stages and (fmt == "mxfp4" or p.config.stages < full.config.stages)
    a = _host(rng, (m, k), "float16")
    _check(fp4_gemm(cupy.asarray(a), t, alpha=0.5), GR.gemm(a, w64, None, 0.5), "float16",
           f"{fmt=} dispatched {p.short()}")


@pytest.mark.parametrize("enc", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_dequant_dense_weight(fmt, dtype, enc):
    """The dequant path's dense W' bit for bit, from every block arrangement and both word
    encodings: NVFP4 e2m1 e4m3 2^-u (u = 14 fp16, 7 bf16; the reference's dequantize with gs =
    2^u), device alpha = alpha 2^u / gs; MXFP4 the format's values in dtype, alpha as given;
    beta = 1 with a bias. The output is poisoned (NaN) first."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core.dense import device_scalars
    from kernelgen.core.interop import context_of
    from kernelgen.fp4_gemm import plan, prepare_weight
    from kernelgen.fp4_gemm.api import dequantize_dense
    from kernelgen.fp4_gemm.layout import ARRANGEMENTS
    from kernelgen.mx import reference as MR

    from ._weights import host_weight

    dev = device_info()
    u = 14 if dtype == "float16" else 7
    for n, k in ((200, 384), (1000, 4224)):
        packed, scales, gs, _ = host_weight(fmt, n, k)
        if fmt == "nvfp4":
            want = MR.dequantize_nvfp4(packed, scales, 2.0 ** u, out_dtype=dtype)
        else:
            want = MR.dequantize_mx(packed, scales, "mxfp4", out_dtype=dtype)
        want = want.view(np.uint16)
        t, _ = _weight(fmt, n, k)
        p = plan(dev.arch.name, 512, n, k, fmt, dtype, dev.sm_count, path="dequant", enc=enc)
        assert p.path == "dequant" and p.config.enc == enc
        for arr in ARRANGEMENTS:
            W = prepare_weight(t, arr, act_dtype=enc)
            out = cupy.full((n, k), 0xFFFF, cupy.uint16)
            ctx = context_of(out, "out")
            scalars = device_scalars(ctx)
            for alpha, has_bias in ((0.75, True), (1.5, False)):
                out.fill(0xFFFF)
                dequantize_dense(ctx, p, W.data, W.scales, W.post, W.strides(), out, n, k, alpha,
                                 has_bias, scalars)
                got = cupy.asnumpy(out)
                bad = np.nonzero(got != want)
                assert bad[0].size == 0, (f"{fmt=} {dtype=} {enc=} {arr=} {n}x{k}: {bad[0].size} "
                                          f"of {got.size} differ, first at {bad[0][0]}, {bad[1][0]}: "
                                          f"{got[bad][0]:#06x} vs {want[bad][0]:#06x}")
                sc = cupy.asnumpy(scalars)
                a_want = np.float32(alpha * 2.0 ** u) / np.float32(gs) if fmt == "nvfp4" else np.float32(alpha)
                assert sc[0] == a_want and sc[1] == (1.0 if has_bias else 0.0), (fmt, dtype, sc, a_want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_dequant_path(fmt, dtype):
    """D through dequantize + cuBLAS against the reference: forced at small M (1, 7: one token
    row of cuBLAS) and where dispatch takes it (select.DENSE_MIN_M and above), bias / alpha / out=,
    a weight prepared for the other activation type, and a CUDA graph replayed with new A that
    matches the eager call bit for bit."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core.interop import smem_limit
    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight, select_fp4
    from kernelgen.fp4_gemm.select import DENSE_MIN_M

    info = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    st = np.uint16 if dtype == "bfloat16" else np.float16
    other = "float16" if dtype == "bfloat16" else "bfloat16"
    for n, k in ((200, 384), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        for m in (1, 7, DENSE_MIN_M, DENSE_MIN_M + 45):
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            alpha = 0.625 if m % 3 else 1.0
            path = "dequant" if m < DENSE_MIN_M else None
            if path is None:
                assert select_fp4(info.arch.name, m, n, k, fmt, dtype, info.sm_count, dtype,
                                  smem_limit(info.index)).path == "dequant", m
            out = cupy.full((m, n), 0xFFFF, cupy.uint16).view(st)
            d = fp4_gemm(cupy.asarray(a), t, None if bias is None else cupy.asarray(bias),
                         alpha=alpha, out=out, dtype=hint, path=path)
            assert d is out
            _check(d, GR.gemm(a, w64, bias, alpha, dtype), dtype, f"{fmt=} {dtype=} {m=} {n}x{k}")
        m = DENSE_MIN_M + 3  # the weight's words encoded for the other activation type
        a = _host(rng, (m, k), dtype)
        d = fp4_gemm(cupy.asarray(a), prepare_weight(t, act_dtype=other), dtype=hint)
        _check(d, GR.gemm(a, w64, None, 1.0, dtype), dtype, f"{fmt=} {dtype=} enc={other} {m=}")

    # CUDA graph: scratch W', device scalars and cuBLAS captured; replays with new A
    n, k = 1000, 4224
    t, w64 = _weight(fmt, n, k)
    m = DENSE_MIN_M + 1
    prev = cupy.cuda.get_current_stream()
    s = cupy.cuda.Stream(non_blocking=True)
    s.use()
    try:
        a_buf = cupy.empty((m, k), st)
        b_buf = cupy.asarray(_host(rng, (n,), dtype))
        c_buf = cupy.empty((m, n), st)
        a_buf.set(_host(rng, (m, k), dtype), stream=s)
        fp4_gemm(a_buf, t, b_buf, alpha=1.25, out=c_buf, dtype=hint)  # warm-up outside capture
        s.begin_capture()
        try:
            fp4_gemm(a_buf, t, b_buf, alpha=1.25, out=c_buf, dtype=hint)
        finally:
            g = s.end_capture()
        for _ in range(2):
            a = _host(rng, (m, k), dtype)
            a_buf.set(a, stream=s)
            c_buf.fill(0xFFFF if dtype == "bfloat16" else np.nan)
            g.launch(s)
            s.synchronize()
            got = cupy.asnumpy(c_buf).view(np.uint16)
            eager = cupy.asnumpy(fp4_gemm(a_buf, t, b_buf, alpha=1.25, dtype=hint)).view(np.uint16)
            s.synchronize()
            assert np.array_equal(got, eager), f"{fmt=} {dtype=}: graph replay != eager call"
            _check(c_buf, GR.gemm(a, w64, cupy.asnumpy(b_buf), 1.25, dtype), dtype, f"graph {fmt=} {dtype=}")
    finally:
        prev.use()


@pytest.mark.parametrize("enc", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_dense_weight_extreme_mxfp4(dtype, enc):
    """MXFP4 W' where the scales span 42 binades in a row (fp16: values that overflow to inf,
    subnormals 2^24 and more below the row's largest, which must not be flushed), the rows of
    _weights.extreme_mx_weight (groups prepare_weight flushes, s more than 127 below the row's
    largest: 0 in W'), and a row with a NaN group (0xFF: the whole row NaN). Expected: the
    reference dequantize in dtype (one rounding of e2m1 * 2^(s - 127)), flushed groups 0."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.core.dense import device_scalars
    from kernelgen.core.interop import context_of
    from kernelgen.fp4_gemm import plan, prepare_weight
    from kernelgen.fp4_gemm.api import dequantize_dense
    from kernelgen.mx import reference as MR

    from ._weights import extreme_mx_weight, mx_tensor_class

    dev = device_info()
    n, k = 96, 1024
    rng = np.random.default_rng(5)
    packed, scales, _ = extreme_mx_weight(n, k, seed=3)
    scales = scales.copy()
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    wide = np.arange(n) % 3 == 2  # the ordinary rows of extreme_mx_weight get wide scales
    scales[wide] = rng.integers(100, 142, (int(wide.sum()), k // 32), dtype=np.uint8)
    full_codes = MR.unpack_fp4(packed)
    full_codes[wide] = codes[wide]
    scales[5, 7] = 0xFF  # row 5 (3i+2): a NaN group
    packed = MR.pack_fp4(full_codes)
    want = GR.to_float64(MR.dequantize_mx(packed, scales, "mxfp4", out_dtype=dtype), dtype)
    s = scales.astype(np.int32)
    rowmax = np.where(s == 0xFF, 0, s).max(axis=1, keepdims=True)
    flushed = np.repeat((s - rowmax + 127 <= 0) & (s != 0xFF), 32, axis=1)
    assert flushed.any() and (want[flushed] != 0).any() == (dtype == "bfloat16")  # bf16 holds 2^-126
    want[flushed] = 0.0
    want[5] = np.nan
    if dtype == "float16":  # the case a relative fp16 fragment would flush: subnormal but non-zero
        tiny = (np.abs(want) < 2.0 ** -14) & (want != 0)
        assert tiny.sum() > 100 and np.isinf(want).sum() > 10
    cls = mx_tensor_class()
    t = cls(fmt="mxfp4", shape=(n, k), data=cupy.asarray(packed), scales=cupy.asarray(scales),
            scale_layout="row_major", global_scale=None)
    W = prepare_weight(t, act_dtype=enc)
    p = plan(dev.arch.name, 512, n, k, "mxfp4", dtype, dev.sm_count, path="dequant", enc=enc)
    out = cupy.full((n, k), 0x1234, cupy.uint16)
    ctx = context_of(out, "out")
    dequantize_dense(ctx, p, W.data, W.scales, W.post, W.strides(), out, n, k, 1.0, False,
                     device_scalars(ctx))
    got = GR.to_float64(cupy.asnumpy(out).view(np.float16 if dtype == "float16" else np.uint16), dtype)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), (f"{dtype=} {enc=}: {int(bad.sum())} differ, first {np.argwhere(bad)[:4].tolist()}: "
                           f"{got[bad][:4]} vs {want[bad][:4]}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_balanced(fmt, dtype):
    """The balanced GEMV (forced for the FP4 formats: dispatch takes it for kbit4 only) at M = 1,
    7 (m_tile 8) and 16 (m_tile 16), bias and alpha, N of 3 / 13 / 63 tiles, 3 / 8 / 33 steps:
    the reference, and the same bits on a second call."""
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.fp4_gemm import fp4_gemm, plan

    dev = device_info()
    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in ((40, 384), (200, 1024), (1000, 4224)):
        t, w64 = _weight(fmt, n, k)
        for m in (1, 7, 16):
            p = plan(dev.arch.name, m, n, k, fmt, dtype, dev.sm_count, path="gemv", balanced=True)
            assert p.balanced and p.grid[1:] == (1, 1), p.short()
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype)
            outs = []
            for _ in range(2):
                out = cupy.full((m, n), 0xFFFF, cupy.uint16) if hint else cupy.full((m, n), np.nan, cupy.float16)
                fp4_gemm(cupy.asarray(a), t, cupy.asarray(bias), alpha=1.25, out=out, dtype=hint, _plan=p)
                outs.append(out)
            _check(outs[0], GR.gemm(a, w64, bias, 1.25, dtype), dtype, f"{p.short()} {m=} {n=} {k=}")
            assert cupy.array_equal(outs[0], outs[1]), f"{m=} {n=} {k=}: not deterministic"
