"""NumPy emulation of the bandwidth kernel (templates/fp4_gemm/gemv.cuh) lane by lane: the
tiled-layout reads, the scale decode and its units (fp4.cuh chunk_scales, NVFP4_UNIT, MX_UNIT),
the A staging swizzle, the mma fragment layout (each m16n8k16 assembled from the 32 lanes'
registers), split-K and the epilogue, checked against the float64 reference. The address
expressions are the kernel's; what it cannot see is a typo in the CUDA spelling of them."""

import numpy as np
import pytest

from kernelgen.fp4_gemm import reference as GR
from kernelgen.fp4_gemm.layout import tile_data, tile_scales
from kernelgen.fp4_gemm.select import plan
from kernelgen.mx import reference as MR

from ._weights import host_weight

E2M1 = MR.decode(np.arange(16, dtype=np.uint8), MR.E2M1).astype(np.float64)


def swz(c, row):
    return c ^ ((c >> 2) & 3) ^ ((row & 1) << 2)


def chunk_scales(raw, fmt, dtype):
    """fp4.cuh chunk_scales -> (scale of words 0-1, scale of words 2-3) as float64."""
    if fmt == "nvfp4":  # e4m3 * 2^-8 (fp16 bit pattern), NaN for 0x7F / 0xFF
        out = []
        for b in (raw & 0xFF, (raw >> 8) & 0xFF):
            h = np.array([((b & 0x7F) << 7) | ((b & 0x80) << 8)], np.uint16).view(np.float16)[0]
            out.append(np.nan if (b & 0x7F) == 0x7F else float(h))
        return out
    s = raw & 0xFF
    if dtype == "float16":  # scale in the table: 2^(s' - 127 + 13), flushed below 2^-13
        d = s - 127 + 13
        v = np.nan if s == 0xFF else (0.0 if d < -13 else 2.0 ** d)
    else:
        v = np.nan if s == 0xFF else 2.0 ** (s - 127) if s else 0.0
    return [v, v]


def unit(fmt, dtype):
    if fmt == "nvfp4":
        return 256.0  # NVFP4_UNIT
    return 1.0 / 8192.0 if dtype == "float16" else 1.0  # MX_UNIT


def emulate_gemv(p, td, ts, post, a, bias, alpha, fmt, dtype, m, n, k):
    cfg = p.config
    M_TILE, WARPS, NT = cfg.m_tile, cfg.warps, cfg.m_tile // 8
    SB = 8 if fmt == "nvfp4" else 4
    Q = k // 128
    c_out = np.full((m, n), np.nan)
    ws = np.zeros((p.split, m, n))
    gx, gy, gz = p.grid
    for bz in range(gz):
        m0 = bz * M_TILE
        rows = min(M_TILE, m - m0)
        for by in range(gy):
            q0 = by * p.sps
            n_it = min(Q, q0 + p.sps) - q0
            # A staging: smem[row][segment][swizzled chunk] = 8 values
            smem = np.zeros((rows, n_it, 16, 8))
            for mm in range(rows):
                for c in range(n_it * 16):
                    src = a[m0 + mm, q0 * 128 + 8 * c: q0 * 128 + 8 * c + 8]
                    smem[mm, c >> 4, swz(c & 15, mm)] = src
            for bx in range(gx):
                for warp in range(WARPS):
                    tile = bx * WARPS + warp
                    if tile * 16 >= n:
                        continue
                    acc = np.zeros((NT, 16, 8))  # D[nt][W row][token col]
                    for it in range(n_it):
                        blk = tile * Q + q0 + it
                        # per lane: words of rows g, g+8, scales, A chunks
                        af = np.zeros((4, 2, 16, 16))  # [j][mma half][row][k-slot]
                        bf = np.zeros((NT, 4, 2, 16, 8))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            w_off = blk * 1024 + 64 * g + 16 * t
                            s_off = blk * (16 * SB) + (4 * g + t) * (SB // 2)
                            raw = int.from_bytes(bytes(ts[s_off: s_off + SB // 2]), "little")
                            sc = (chunk_scales(raw, fmt, dtype),
                                  chunk_scales(raw >> 16 if fmt == "nvfp4" else raw >> 8, fmt, dtype))
                            for h in range(2):  # rows g (h=0), g+8 (h=1)
                                chunk = td[w_off + 512 * h: w_off + 512 * h + 16]
                                for j in range(4):
                                    word = int.from_bytes(bytes(chunk[4 * j: 4 * j + 4]), "little")
                                    vals = [E2M1[(word >> (4 * e)) & 0xF] * sc[h][j >> 1] for e in range(8)]
                                    row = g + 8 * h
                                    # f[0..3] -> a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3
                                    for hf in range(2):  # k-step 2j + hf: elements 4hf..4hf+3
                                        af[j, hf, row, 2 * t: 2 * t + 2] = vals[4 * hf: 4 * hf + 2]
                                        af[j, hf, row, 2 * t + 8: 2 * t + 10] = vals[4 * hf + 2: 4 * hf + 4]
                            for nt in range(NT):
                                r = min(g + 8 * nt, rows - 1)
                                for j in range(4):
                                    bv = smem[r, it, swz(4 * t + j, g & 1)]
                                    for hf in range(2):
                                        bf[nt, j, hf, 2 * t: 2 * t + 2, g] = bv[4 * hf: 4 * hf + 2]
                                        bf[nt, j, hf, 2 * t + 8: 2 * t + 10, g] = bv[4 * hf + 2: 4 * hf + 4]
                        for nt in range(NT):
                            for j in range(4):
                                for hf in range(2):
                                    acc[nt] += af[j, hf] @ bf[nt, j, hf]
                    for nt in range(NT):
                        for row in range(16):
                            for col in range(8):
                                mm, nn = m0 + 8 * nt + col, tile * 16 + row
                                if mm >= m or nn >= n:
                                    continue
                                if p.split > 1:
                                    ws[by, mm, nn] = acc[nt, row, col]
                                else:
                                    c_out[mm, nn] = acc[nt, row, col]
    if p.split > 1:
        c_out = ws.sum(axis=0)
    post = np.asarray(post, np.float64)
    f = alpha * unit(fmt, dtype) * (1.0 / post[0] if fmt == "nvfp4" else post[None, :])
    return c_out * f + (0.0 if bias is None else bias[None, :])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,split", [(3, 1), (11, 2)])
def test_gemv_emulation_matches_reference(fmt, dtype, m, split):
    n, k = 40, 384
    packed, scales, gs, w64 = host_weight(fmt, n, k)
    sb = 8 if fmt == "nvfp4" else 4
    if fmt == "mxfp4":
        rel, post = GR.prepare_scales_mx(scales)
    else:
        rel, post = scales, np.array([gs], np.float32)
    td, ts = tile_data(np, packed, n, k).ravel(), tile_scales(np, rel, n, k, sb).ravel()
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    bias = rng.standard_normal(n)
    p = plan("sm_90a", m, n, k, fmt, dtype, 132, path="gemv", split=split)
    got = emulate_gemv(p, td, ts, post, a, bias, 0.5, fmt, dtype, m, n, k)
    if fmt == "nvfp4":  # the reference rounds each e2m1 * e4m3 / gs to fp32; the kernel divides once
        codes = E2M1[MR.unpack_fp4(packed)].reshape(n, k // 16, 16)
        w64 = (codes * MR.decode(scales, MR.E4M3).astype(np.float64)[..., None]).reshape(n, k) / float(gs)
    want = 0.5 * a @ w64.T + bias
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12), f"{fmt=} {dtype=} {m=} {split=} {p.short()}"


def emulate_tile(p, td, ts, post, a, bias, alpha, fmt, dtype, m, n, k):
    """templates/fp4_gemm/tile.cuh: stage loads into 'shared memory', lane reads, mma fragments."""
    cfg = p.config
    BM, WT = cfg.bm, cfg.warps_t
    NI, MI = BM // (8 * WT), 2
    SB = 8 if fmt == "nvfp4" else 4
    Q, n_tiles = k // 128, -(-n // 16)
    ws = np.zeros((p.split, m, n))
    gx, gy, gz = p.grid
    for bz in range(gz):
        q0 = bz * p.sps
        n_k = min(Q, q0 + p.sps) - q0
        for by in range(gy):
            m0 = by * BM
            for bx in range(gx):
                n0 = bx * 128
                acc = np.zeros((4, WT, MI, NI, 16, 8))
                for kt in range(n_k):
                    kq = q0 + kt
                    sw = np.zeros(128 * 64, np.uint8)
                    for i in range(512):
                        blk = min(n0 // 16 + (i >> 6), n_tiles - 1) * Q + kq
                        sw[16 * i: 16 * i + 16] = td[blk * 1024 + 16 * (i & 63): blk * 1024 + 16 * (i & 63) + 16]
                    ss = np.zeros(128 * SB, np.uint8)
                    for i in range(128 * SB // 16):
                        blk = min(n0 // 16 + i // SB, n_tiles - 1) * Q + kq
                        o = blk * 16 * SB + 16 * (i % SB)
                        ss[16 * i: 16 * i + 16] = ts[o: o + 16]
                    sa = np.zeros((BM, 16, 8))
                    for r in range(BM):
                        if m0 + r < m:
                            for c in range(16):
                                sa[r, swz(c, r)] = a[m0 + r, kq * 128 + 8 * c: kq * 128 + 8 * c + 8]
                    for wi in range(4):
                        for wt in range(WT):
                            af = np.zeros((MI, 4, 2, 16, 16))
                            bf = np.zeros((NI, 4, 2, 16, 8))
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                for mi in range(MI):
                                    tl = wi * 2 + mi
                                    so = tl * 16 * SB + (4 * g + t) * (SB // 2)
                                    raw = int.from_bytes(bytes(ss[so: so + SB // 2]), "little")
                                    sc = (chunk_scales(raw, fmt, dtype),
                                          chunk_scales(raw >> 16 if fmt == "nvfp4" else raw >> 8, fmt, dtype))
                                    for h in range(2):
                                        wo = tl * 1024 + 512 * h + 64 * g + 16 * t
                                        for j in range(4):
                                            word = int.from_bytes(bytes(sw[wo + 4 * j: wo + 4 * j + 4]), "little")
                                            vals = [E2M1[(word >> (4 * e)) & 0xF] * sc[h][j >> 1] for e in range(8)]
                                            for hf in range(2):
                                                af[mi, j, hf, g + 8 * h, 2 * t: 2 * t + 2] = vals[4 * hf: 4 * hf + 2]
                                                af[mi, j, hf, g + 8 * h, 2 * t + 8: 2 * t + 10] = vals[4 * hf + 2: 4 * hf + 4]
                                for ni in range(NI):
                                    r = wt * NI * 8 + ni * 8 + g
                                    for j in range(4):
                                        bv = sa[r, swz(4 * t + j, g & 1)]
                                        for hf in range(2):
                                            bf[ni, j, hf, 2 * t: 2 * t + 2, g] = bv[4 * hf: 4 * hf + 2]
                                            bf[ni, j, hf, 2 * t + 8: 2 * t + 10, g] = bv[4 * hf + 2: 4 * hf + 4]
                            for mi in range(MI):
                                for ni in range(NI):
                                    for j in range(4):
                                        for hf in range(2):
                                            acc[wi, wt, mi, ni] += af[mi, j, hf] @ bf[ni, j, hf]
                for wi in range(4):
                    for wt in range(WT):
                        for mi in range(MI):
                            for ni in range(NI):
                                for row in range(16):
                                    for col in range(8):
                                        mm = m0 + wt * NI * 8 + 8 * ni + col
                                        nn = n0 + wi * 32 + 16 * mi + row
                                        if mm < m and nn < n:
                                            ws[bz, mm, nn] = acc[wi, wt, mi, ni, row, col]
    post = np.asarray(post, np.float64)
    f = alpha * unit(fmt, dtype) * (1.0 / post[0] if fmt == "nvfp4" else post[None, :])
    return ws.sum(axis=0) * f + (0.0 if bias is None else bias[None, :])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,split", [(5, 1), (40, 2)])
def test_tile_emulation_matches_reference(fmt, dtype, m, split):
    n, k = 136, 256
    packed, scales, gs, w64 = host_weight(fmt, n, k)
    sb = 8 if fmt == "nvfp4" else 4
    if fmt == "mxfp4":
        rel, post = GR.prepare_scales_mx(scales)
    else:
        rel, post = scales, np.array([gs], np.float32)
        codes = E2M1[MR.unpack_fp4(packed)].reshape(n, k // 16, 16)
        w64 = (codes * MR.decode(scales, MR.E4M3).astype(np.float64)[..., None]).reshape(n, k) / float(gs)
    td, ts = tile_data(np, packed, n, k).ravel(), tile_scales(np, rel, n, k, sb).ravel()
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    p = plan("sm_90a", m, n, k, fmt, dtype, 132, path="tile", split=split)
    got = emulate_tile(p, td, ts, post, a, None, 2.0, fmt, dtype, m, n, k)
    assert np.allclose(got, 2.0 * a @ w64.T, rtol=1e-12, atol=1e-12), f"{fmt=} {dtype=} {m=} {p.short()}"


def _prepared_mx(packed, scales, n, k, how):
    """(tiled data, tiled scales, post) of an MXFP4 weight as the reference or the API builds them."""
    if how == "reference":
        rel, post = GR.prepare_scales_mx(scales)
        return tile_data(np, packed, n, k).ravel(), tile_scales(np, rel, n, k, 4).ravel(), post
    from kernelgen.fp4_gemm.api import prepare_arrays

    td, ts, post = prepare_arrays(np, "mxfp4", n, k, packed, scales, "row_major", None)
    return td.ravel(), ts.ravel(), post


@pytest.mark.parametrize("how", ["reference", "api"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("path,m,split", [("gemv", 3, 1), ("gemv", 11, 2), ("tile", 5, 1)])
def test_mx_extreme_row_scales(how, dtype, path, m, split):
    """Review B1: an all-zero group (scale 0x00) beside a group of scale 130, and a within-row
    scale spread of 129: the relative scale clamps to 0 (a flushed group), not a wrapped byte
    (0xFF = NaN, or a huge scale); the result matches the float64 dequantized weight."""
    from ._weights import extreme_mx_weight

    n, k = 40, 256
    packed, scales, w64 = extreme_mx_weight(n, k)
    s = scales.astype(int)
    assert (s.max(axis=1) - s.min(axis=1)).max() > 127 and (scales == 0).any()  # the cases exist
    td, ts, post = _prepared_mx(packed, scales, n, k, how)
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    p = plan("sm_90a", m, n, k, "mxfp4", dtype, 132, path=path, split=split)
    emu = emulate_gemv if path == "gemv" else emulate_tile
    got = emu(p, td, ts, post, a, None, 1.0, "mxfp4", dtype, m, n, k)
    assert np.all(np.isfinite(got)), f"{how=} {dtype=} {p.short()}: rows {np.unique(np.nonzero(~np.isfinite(got))[1])}"
    assert np.allclose(got, a @ w64.T, rtol=1e-12, atol=1e-12), f"{how=} {dtype=} {p.short()}"
