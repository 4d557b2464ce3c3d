"""NumPy emulation of the bandwidth kernel (templates/fp4_gemm/gemv.cuh) lane by lane: the
tiled-layout reads, the scale decode and its units (fp4.cuh row_scales, mx_word_factor,
UNIT_EXP), the A staging swizzle, the mma fragment layout (each m16n8k16 assembled from the 32
lanes' registers), split-K and the epilogue, checked against the float64 reference. The address
expressions are the kernel's; what it cannot see is a typo in the CUDA spelling of them, nor the
fp32 roundings (sums here are float64: precision is the GPU tests' part)."""

import numpy as np
import pytest

from kernelgen.fp4_gemm import reference as GR
from kernelgen.fp4_gemm import select as S
from kernelgen.fp4_gemm.layout import (
    ARRANGEMENTS,
    arrange,
    block_strides,
    decode_word,
    tile_data,
    tile_scales,
)
from kernelgen.fp4_gemm.select import plan
from kernelgen.mx import reference as MR

from ._weights import host_weight

E2M1 = MR.decode(np.arange(16, dtype=np.uint8), MR.E2M1).astype(np.float64)
RAW_EXP = {"float16": 14, "bfloat16": 126}  # fp4.cuh RawUnit: raw pair value = e2m1 * 2^-EXP


def swz(c, row):
    return c ^ ((c >> 2) & 3) ^ ((row & 1) << 2)


def word_raw(word, dtype, enc="float16"):
    """fp4.cuh e2m1_word on a word stored for activation type `enc`: the 8 raw T values
    (element order), bit by bit."""
    out = []
    for o in decode_word(word, enc):
        if dtype != enc and dtype == "bfloat16":  # bitsel(0x90009000, o, o >> 3)
            o = (o & 0x90009000) | ((o >> 3) & ~0x90009000 & 0xFFFFFFFF)
        elif dtype != enc:  # bitsel(0x80048000, o, o << 3)
            o = (o & 0x80048000) | ((o << 3) & ~0x80048000 & 0xFFFFFFFF)
        if dtype == "bfloat16":
            halves = np.array([o & 0xFFFF, o >> 16], np.uint32) << 16
            out += [float(x) for x in halves.view(np.float32)]
        else:
            out += [float(x) for x in np.array([o & 0xFFFF, o >> 16], np.uint16).view(np.float16)]
    return out


def row_scales(raw, fmt, dtype):
    """fp4.cuh row_scales: 4 scale bytes of a row (byte j: word j) -> their T scales as float64."""
    b = np.array([(raw >> (8 * j)) & 0xFF for j in range(4)], np.uint8)
    if fmt == "nvfp4":
        return list(MR.decode(b, MR.E4M3).astype(np.float64) * (1.0 if dtype == "float16" else 2.0 ** 119))
    if dtype == "float16":  # the fp32 bits b * 2^23 + 15 * 2^23 (mod 2^32), rounded to fp16
        bits = ((b.astype(np.uint32) + np.uint32(15)) << np.uint32(23)).view(np.float32)
        return [float(np.float16(x)) for x in bits]
    bits = (b.astype(np.uint32) << np.uint32(23)).view(np.float32)  # then * 2^126 (bf16: exact)
    return [float(np.float64(x) * 2.0 ** 126) for x in bits]


def scaled(raw_vals, sc, dtype):
    """hmul2: raw * scale rounded to T (exact wherever RowScale says so)."""
    v = np.array(raw_vals) * sc
    return list(v.astype(np.float16).astype(np.float64)) if dtype == "float16" else list(v)


def unit(fmt, dtype):  # 2^UNIT_EXP
    if fmt == "nvfp4":
        return 2.0 ** 14 if dtype == "float16" else 2.0 ** 7
    return 0.5 if dtype == "float16" else 1.0


def mx_word_factor(raw, dtype):
    """fp4.cuh mx_word_factor of the 4 bytes of raw: fp32 bits (b + 15 | 126) * 2^23 (mod 2^32)."""
    c = 15 if dtype == "float16" else 126
    b = np.array([(raw >> (8 * j)) & 0xFF for j in range(4)], np.uint32)
    return [float(x) for x in ((b + np.uint32(c)) << np.uint32(23)).view(np.float32)]


def lane_frags(wd, sd, w_base, s_base, fmt, dtype, SB, post=False, enc="float16"):
    """af[j][hf][row][k-slot]: the scaled A fragments the 32 lanes build from one (tile, step)
    block of 1 KB at wd[w_base:] and its scales at sd[s_base:] (gemv: the global arrays; the tile
    path: its shared-memory copies). post (the gemv's MXFP4): (raw fragments, fac[j][row]), the
    fp32 factor each lane applies to word j's mma sums of its rows (the 4 lanes of a row agree)."""
    af = np.zeros((4, 2, 16, 16))
    fac = np.full((4, 16), np.nan)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        w_off = w_base + 64 * g + 16 * t
        s_off = s_base + (16 * g + 8 * (t >> 1) if fmt == "nvfp4" else 8 * g)  # fp4.cuh scale_offset
        raw = int.from_bytes(bytes(sd[s_off: s_off + 8]), "little")
        sc = (row_scales(raw & 0xFFFFFFFF, fmt, dtype), row_scales(raw >> 32, fmt, dtype))
        for h in range(2):
            chunk = wd[w_off + 512 * h: w_off + 512 * h + 16]
            for j in range(4):
                word = int.from_bytes(bytes(chunk[4 * j: 4 * j + 4]), "little")
                row = g + 8 * h
                if post:
                    vals = word_raw(word, dtype, enc)
                    x = mx_word_factor((raw >> (32 * h)) & 0xFFFFFFFF, dtype)[j]
                    assert np.isnan(fac[j, row]) or fac[j, row] == x or (np.isnan(x) and np.isnan(fac[j, row]))
                    fac[j, row] = x
                else:
                    vals = scaled(word_raw(word, dtype, enc), sc[h][j], dtype)
                for hf in range(2):  # k-step 2j + hf: elements 4hf..4hf+3
                    af[j, hf, row, 2 * t: 2 * t + 2] = vals[4 * hf: 4 * hf + 2]
                    af[j, hf, row, 2 * t + 8: 2 * t + 10] = vals[4 * hf + 2: 4 * hf + 4]
    return (af, fac) if post else af


def _strides(strides, k, SB):
    """(wt, wq, st, sq, s_off): a block's byte strides and the scales' offset in ts (tile-major
    flat arrays by default; layout.py block_strides for the other arrangements)."""
    Q = k // 128
    return strides or (Q * 1024, 1024, Q * 16 * SB, 16 * SB, 0)


def emulate_gemv(p, td, ts, post, a, bias, alpha, fmt, dtype, m, n, k, strides=None, enc="float16"):
    cfg = p.config
    M_TILE, WARPS, NT, TPW = cfg.m_tile, cfg.warps, cfg.m_tile // 8, cfg.tpw
    KW = p.kw
    SB = 8 if fmt == "nvfp4" else 4
    Q, n_tiles = k // 128, -(-n // 16)
    w_t, w_q, s_t, s_q, s_off = _strides(strides, k, SB)
    c_out = np.full((m, n), np.nan)
    ws = np.zeros((p.split, m, n))
    gx, gy, gz = p.grid
    for bz in range(gz):
        m0 = bz * M_TILE
        rows = min(M_TILE, m - m0)
        for by in range(gy):
            q_cta = by * p.sps
            n_cta = min(Q, q_cta + p.sps) - q_cta
            per = -(-n_cta // KW)
            for bx in range(gx):
                part = {}
                for warp in range(WARPS):
                    tile0, ks = (bx * (WARPS // KW) + warp // KW) * TPW, warp % KW
                    if tile0 >= n_tiles:
                        continue
                    q0 = q_cta + ks * per
                    n_it = max(0, min(per, n_cta - ks * per))
                    acc = np.zeros((TPW, NT, 16, 8))  # D[tile][nt][W row][token col]

                    def load_a(it, m0=m0, rows=rows, q0=q0):  # the 32 lanes' ld_nc_v4(ap[nt] + it * 128 + 32 j), j = 0..3
                        bf = np.zeros((NT, 4, 2, 16, 8))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            for nt in range(NT):
                                r = m0 + min(g + 8 * nt, rows - 1)
                                for j in range(4):
                                    k0 = (q0 + it) * 128 + 32 * j + 8 * t
                                    assert 0 <= r < m and k0 + 8 <= k, (r, k0, p.short())  # in A
                                    bv = a[r, k0: k0 + 8]
                                    for hf in range(2):
                                        bf[nt, j, hf, 2 * t: 2 * t + 2, g] = bv[4 * hf: 4 * hf + 2]
                                        bf[nt, j, hf, 2 * t + 8: 2 * t + 10, g] = bv[4 * hf + 2: 4 * hf + 4]
                        return bf

                    for it in range(n_it):
                        bf = load_a(it)  # shared by the warp's TPW tiles
                        for i in range(TPW):  # a tile past N re-reads the last one
                            tl, q = min(tile0 + i, n_tiles - 1), q0 + it
                            post_mx = fmt == "mxfp4" and NT == 1 and dtype == "float16"  # gemv.cuh POST
                            af = lane_frags(td, ts, tl * w_t + q * w_q, s_off + tl * s_t + q * s_q, fmt,
                                            dtype, SB, post=post_mx, enc=enc)
                            for nt in range(NT):
                                for j in range(4):
                                    if post_mx:
                                        raw_af, fac = af
                                        acc[i, nt] += fac[j][:, None] * sum(raw_af[j, hf] @ bf[nt, j, hf] for hf in range(2))
                                        continue
                                    for hf in range(2):
                                        acc[i, nt] += af[j, hf] @ bf[nt, j, hf]
                    part.setdefault(tile0, []).append(acc)
                for tile0, accs in part.items():  # slice 0 sums the KW slices in slice order
                    acc = np.zeros_like(accs[0])
                    for x in accs:
                        acc = acc + x
                    for i in range(TPW):
                        for nt in range(NT):
                            for row in range(16):
                                for col in range(8):
                                    mm, nn = m0 + 8 * nt + col, (tile0 + i) * 16 + row
                                    if mm >= m or nn >= n:
                                        continue
                                    if p.split > 1:
                                        ws[by, mm, nn] = acc[i, nt, row, col]
                                    else:
                                        c_out[mm, nn] = acc[i, nt, row, col]
    if p.split > 1:
        c_out = ws.sum(axis=0)
    post = np.asarray(post, np.float64)
    f = alpha * unit(fmt, dtype) * (1.0 / post[0] if fmt == "nvfp4" else post[None, :])
    return c_out * f + (0.0 if bias is None else bias[None, :])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,split,k,kw", [(3, 1, 384, 1), (11, 2, 384, 1), (5, 1, 1024, 2)])
def test_gemv_emulation_matches_reference(fmt, dtype, m, split, k, kw):
    _check_gemv(fmt, dtype, m, split, 40, k, kw)


def test_gemv_emulation_uneven_k_slices():
    """KW = 8 warps a tile over 33 steps: slices of 5, the seventh 3, the last empty."""
    _check_gemv("nvfp4", "float16", 2, 1, 24, 33 * 128, 8)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("tpw", [1, 2])
@pytest.mark.parametrize("m,split,n,k,kw", [(3, 1, 40, 384, 1), (11, 2, 40, 384, 1), (5, 1, 200, 1024, 2),
                                            (17, 1, 200, 1024, 2), (2, 1, 24, 33 * 128, 8)])
def test_gemv_emulation_tiles_a_warp(fmt, tpw, m, split, n, k, kw):
    """TPW = 1 and 2 at m_tile 8 and 16: N = 40 / 200 / 24 are 3 / 13 / 2 tiles, so with TPW 2
    the last warp's second tile is past N (re-reads the last tile, never stored) except at 24."""
    _check_gemv(fmt, "float16", m, split, n, k, kw, tpw=tpw)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,split,n,k,kw", [(3, 1, 40, 384, 1), (12, 1, 200, 1024, 2), (16, 2, 40, 4224, 4), (9, 1, 40, 4224, 8)])
def test_gemv_emulation_32_warps_an_sm(fmt, m, split, n, k, kw):
    """The 32-warps-an-SM plans (TPW 1; 4-warp CTAs at m_tile 16) read A, W and S in bounds
    and cover every output once."""
    _check_gemv(fmt, "float16", m, split, n, k, kw, wps=32)


def test_gemv_emulation_short_k_plans():
    """Short K (select.short_k_kw): KW 8 over 3 steps (five warps with none), KW 8 over 8
    steps at m_tile 8 and KW 16 over 8 steps at m_tile 16 (16-warp CTAs)."""
    _check_gemv("nvfp4", "float16", 3, 1, 40, 384, 8, short_k=True)
    _check_gemv("mxfp4", "float16", 5, 1, 200, 1024, 8, short_k=True)
    _check_gemv("nvfp4", "bfloat16", 16, 1, 200, 1024, 16, wps=32, short_k=True)


def _check_gemv(fmt, dtype, m, split, n, k, kw, tpw=None, wps=None, short_k=False):
    packed, scales, gs, w64 = host_weight(fmt, n, k)
    sb = 8 if fmt == "nvfp4" else 4
    if fmt == "mxfp4":
        rel, post = GR.prepare_scales_mx(scales)
    else:
        rel, post = scales, np.array([gs], np.float32)
    td, ts = tile_data(np, packed, n, k, dtype).ravel(), tile_scales(np, rel, n, k, sb).ravel()
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    bias = rng.standard_normal(n)
    p = plan("sm_90a", m, n, k, fmt, dtype, 132, path="gemv", split=split, tpw=tpw, wps=wps)
    if not short_k:  # the K-slice plan before short_k_kw raises its KW (these shapes' K is short)
        p = S._gemv("sm_90a", m, n, k, fmt, dtype, 132, split, tpw, wps, dtype)
    assert p.kw == kw and (wps is None or p.config.warps_per_sm == wps), p.short()
    assert p.config.enc == dtype  # words encoded for the activations (the default)
    got = emulate_gemv(p, td, ts, post, a, bias, 0.5, fmt, dtype, m, n, k, enc=dtype)
    if fmt == "nvfp4":  # the reference rounds each e2m1 * e4m3 / gs to fp32; the kernel divides once
        codes = E2M1[MR.unpack_fp4(packed)].reshape(n, k // 16, 16)
        w64 = (codes * MR.decode(scales, MR.E4M3).astype(np.float64)[..., None]).reshape(n, k) / float(gs)
    want = 0.5 * a @ w64.T + bias
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12), f"{fmt=} {dtype=} {m=} {split=} {p.short()}"


def emulate_tile(p, td, ts, post, a, bias, alpha, fmt, dtype, m, n, k, strides=None, enc="float16"):
    """templates/fp4_gemm/tile.cuh: stage loads into 'shared memory', lane reads, mma fragments."""
    cfg = p.config
    BM, WT = cfg.bm, cfg.warps_t
    NI, MI = BM // (8 * WT), 2
    SB = 8 if fmt == "nvfp4" else 4
    Q, n_tiles = k // 128, -(-n // 16)
    w_t, w_q, s_t, s_q, s_off = _strides(strides, k, SB)
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
                        o = min(n0 // 16 + (i >> 6), n_tiles - 1) * w_t + kq * w_q + 16 * (i & 63)
                        sw[16 * i: 16 * i + 16] = td[o: o + 16]
                    ss = np.zeros(128 * SB, np.uint8)
                    for i in range(128 * SB // 16):
                        o = s_off + min(n0 // 16 + i // SB, n_tiles - 1) * s_t + kq * s_q + 16 * (i % SB)
                        ss[16 * i: 16 * i + 16] = ts[o: o + 16]
                    sa = np.zeros((BM, 16, 8))
                    for r in range(BM):
                        if m0 + r < m:
                            for c in range(16):
                                sa[r, swz(c, r)] = a[m0 + r, kq * 128 + 8 * c: kq * 128 + 8 * c + 8]
                    for wi in range(4):
                        for wt in range(WT):
                            af = np.stack([lane_frags(sw, ss, (wi * 2 + mi) * 1024, (wi * 2 + mi) * 16 * SB,
                                                      fmt, dtype, SB, enc=enc) for mi in range(MI)])
                            bf = np.zeros((NI, 4, 2, 16, 8))
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                for ni in range(NI):
                                    r = wt * NI * 8 + ni * 8 + g
                                    for j in range(4):
                                        bv = sa[r, swz(t + 4 * j, g & 1)]
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
    td, ts = tile_data(np, packed, n, k, dtype).ravel(), tile_scales(np, rel, n, k, sb).ravel()
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    p = plan("sm_90a", m, n, k, fmt, dtype, 132, path="tile", split=split)
    got = emulate_tile(p, td, ts, post, a, None, 2.0, fmt, dtype, m, n, k, enc=dtype)
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


def _flat(arrangement, td6, ts6, sb):
    """(W buffer, S buffer, strides) of an arrangement as the kernels see them: flat bytes of
    the owning arrays, block strides and the scales' offset into their buffer."""
    data, scales = arrange(np, td6, ts6, arrangement)
    wt, wq, st, sq = block_strides(arrangement, data, scales)
    if arrangement.endswith("inline"):
        return data.ravel(), data.ravel(), (wt, wq, st, sq, 1024)
    return data.ravel(), scales.ravel(), (wt, wq, st, sq, 0)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("path,m,split,tpw", [("gemv", 3, 1, 1), ("gemv", 11, 2, 2), ("tile", 5, 1, None)])
def test_arrangements_read_the_same_blocks(fmt, arrangement, path, m, split, tpw):
    """The kernels' reads through an arrangement's strides give the tile-major result exactly."""
    n, k = 40, 384
    packed, scales, gs, _ = host_weight(fmt, n, k)
    sb = 8 if fmt == "nvfp4" else 4
    rel, post = GR.prepare_scales_mx(scales) if fmt == "mxfp4" else (scales, np.array([gs], np.float32))
    td6, ts6 = tile_data(np, packed, n, k), tile_scales(np, rel, n, k, sb)
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float16).astype(np.float64)
    p = plan("sm_90a", m, n, k, fmt, "float16", 132, path=path, split=split, tpw=tpw)
    emu = emulate_gemv if path == "gemv" else emulate_tile
    want = emu(p, td6.ravel(), ts6.ravel(), post, a, None, 1.0, fmt, "float16", m, n, k)
    wd, sd, strides = _flat(arrangement, td6, ts6, sb)
    got = emu(p, wd, sd, post, a, None, 1.0, fmt, "float16", m, n, k, strides=strides)
    assert np.array_equal(got, want), (arrangement, p.short())



@pytest.mark.parametrize("m_tile", [8, 16])
def test_a_ring_slots_round_trip(m_tile):
    """gemv.cuh a_ring indexing: the lanes' cp.async copies (row lane / LPR, chunk lane % LPR +
    LPR u, at swz) fill every 16-byte chunk of a slot exactly once, each LDS of lane (g, t), word
    j, token half nt reads the chunk t + 4j of row g + 8 nt, and each quarter warp's 8 reads hit
    8 different 16-byte bank groups."""
    lpr, ncp = 32 // m_tile, 16 // (32 // m_tile)
    where = {}
    for lane in range(32):
        r, c0 = lane // lpr, lane % lpr
        for u in range(ncp):
            c = c0 + lpr * u
            off = r * 256 + swz(c, r) * 16
            assert off not in where and 0 <= off < m_tile * 256
            where[off] = (r, c)
    assert len(where) == m_tile * 16
    for nt in range(m_tile // 8):
        for j in range(4):
            for q in range(4):  # quarter warps: lanes 8q .. 8q+7
                banks = set()
                for lane in range(8 * q, 8 * q + 8):
                    g, t = lane >> 2, lane & 3
                    off = g * 256 + swz(t + 4 * j, g) * 16 + nt * 2048  # gemv.cuh rd[j]
                    assert where[off] == (g + 8 * nt, t + 4 * j), (lane, j, nt)
                    banks.add((off // 16) % 8)
                assert len(banks) == 8, (q, j, nt)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("path,m,split", [("gemv", 3, 1), ("gemv", 11, 2), ("tile", 5, 1)])
def test_mx_nan_group_rows(dtype, path, m, split):
    """An E8M0 NaN group (0xFF): the kernels decode its byte to some finite or infinite scale
    (row_scales has no NaN case); the row factor from prepare is NaN, so the row's outputs are."""
    n, k = 40, 256
    packed, scales, _, _ = host_weight("mxfp4", n, k)
    scales = scales.copy()
    rows = [1, 20, 39]
    for i, r in enumerate(rows):
        scales[r, 2 * i + 1] = 0xFF
    w64 = GR.dequantize("mxfp4", packed, scales, None)
    td, ts, post = _prepared_mx(packed, scales, n, k, "api")
    assert np.isnan(post[rows]).all() and np.isfinite(np.delete(post, rows)).all()
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float16).astype(np.float64)
    p = plan("sm_90a", m, n, k, "mxfp4", dtype, 132, path=path, split=split)
    emu = emulate_gemv if path == "gemv" else emulate_tile
    with np.errstate(invalid="ignore", over="ignore"):
        got = emu(p, td, ts, post, a, None, 1.0, "mxfp4", dtype, m, n, k)
    assert np.isnan(got[:, rows]).all()
    keep = np.setdiff1d(np.arange(n), rows)
    assert np.allclose(got[:, keep], a @ w64[keep].T, rtol=1e-12, atol=1e-12)
