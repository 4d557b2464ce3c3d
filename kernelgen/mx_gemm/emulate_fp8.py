"""NumPy emulation of the Hopper MXFP8 kernel (templates/mx_gemm/fp8_mma.cuh) for the CPU tests:
the kernel's addressing - cp.async copies into the XOR-swizzled fp8 stage, the prologue's
per-row largest scale exponent E, the conversion into the swizzled f16 tiles with
2^(e_kb - E) (or, hbufs 0, the in-place fp8 rescale and the fp8 wgmma / mma.sync operands), every lane's
ldmatrix addresses, the epilogue - mirrored line by line, with the
instructions (cvt e4m3x2 / e5m2x2 -> f16x2, mul.rn.f16x2, ldmatrix .x4, mma m16n8k16 f16) as
PTX defines them. If the addresses are right, it reproduces the reference GEMM.
"""

from __future__ import annotations

import numpy as np

from ..mx import reference as R
from .config import TK, MxFp8GemmConfig
from .emulate import LANES, _Kernel, _u32

_FP8 = {"e4m3": R.E4M3, "e5m2": R.E5M2}


def tile_off(r, c):
    return r * TK + ((c ^ (r & 7)) << 4)


def htile_off(r, c):
    return r * 2 * TK + ((c ^ (r & 7)) << 4)


def wg_off(rows, r, c8):
    return (c8 >> 3) * rows * 128 + r * 128 + (((c8 & 7) ^ (r & 7)) << 4)


def _wgmma_operand(h: np.ndarray, start: int, rows: int) -> np.ndarray:
    """[rows, 16] f16 values a K-major, 128-byte-swizzled descriptor at `start` (stride 1024
    per 8 rows) points to: element (r, kk) at L = start + (r // 8) * 1024 + (r % 8) * 128 + 2 kk,
    bits 4-6 of L XOR bits 7-9 (the swizzle atom's row)."""
    r = np.arange(rows)[:, None]
    kk = np.arange(16)[None, :]
    lin = start + (r // 8) * 1024 + (r % 8) * 128 + 2 * kk
    phys = lin ^ (((lin >> 7) & 7) << 4)
    u = h[phys].astype(np.uint16) | (h[phys + 1].astype(np.uint16) << 8)
    return u.view(np.float16).astype(np.float64)


def _wgmma_fp8_operand(st: np.ndarray, start: int, rows: int, fmt) -> np.ndarray:
    """[rows, 32] values of fp8 codes (format `fmt`) a K-major, 128-byte-swizzled descriptor at
    `start` points to: code (r, kk) at L = start + (r // 8) * 1024 + (r % 8) * 128 + kk, bits
    4-6 of L XOR bits 7-9."""
    r = np.arange(rows)[:, None]
    kk = np.arange(32)[None, :]
    lin = start + (r // 8) * 1024 + (r % 8) * 128 + kk
    return R.decode(st[lin ^ (((lin >> 7) & 7) << 4)], fmt).astype(np.float64)


def swz_off(r, c):
    return (r >> 7) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + c


def _ldsm_x4(smem: np.ndarray, addr: np.ndarray) -> list[np.ndarray]:
    """ldmatrix.x4.b16: lane l gives the row address of matrix l // 8, row l % 8; register i of
    lane L holds bytes 4 * (L % 4) .. + 3 of row L // 4 of matrix i."""
    out = []
    for i in range(4):
        rows = addr[8 * i + (LANES >> 2)]
        out.append(_u32(smem, rows + 4 * (LANES & 3)))
    return out


def _ldsm_frags(smem: np.ndarray, a: int, b: int, a_row: int, b_row: int, ks: int, mi: int, ni: int,
                off) -> tuple[list, list]:
    """fp8_mma.cuh ldsm_frags: a warp's A fragments (mi pieces of 16 rows from a_row) and B
    fragments (ni pieces of 8 rows from b_row) of k step ks; off: tile_off or htile_off."""
    afr = [_ldsm_x4(smem, a + off(a_row + i * 16 + (LANES & 15), 2 * ks + (LANES >> 4))) for i in range(mi)]
    bfr = []
    for j in range(0, ni, 2):
        q = _ldsm_x4(smem, b + off(b_row + j * 8 + (LANES & 7) + ((LANES >> 4) << 3), 2 * ks + ((LANES >> 3) & 1)))
        bfr += [[q[0], q[1]], [q[2], q[3]]]
    return afr, bfr


def _f16_pair(reg: np.ndarray) -> np.ndarray:
    """uint32 per lane -> [32, 2] float64 (low half first)."""
    u = np.stack([reg & 0xFFFF, reg >> 16], axis=-1).astype(np.uint16)
    return u.view(np.float16).astype(np.float64)


def _mma_f16(a: list, b: list) -> np.ndarray:
    """mma.m16n8k16 f16 -> 16 x 8 (float64): a0 = A[g][2t..], a1 = A[g+8][2t..],
    a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t..][g], b1 = B[2t+8..][g]."""
    g, t = LANES >> 2, LANES & 3
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for q in range(4):
        v = _f16_pair(a[q])
        for p in range(2):
            A[g + 8 * (q & 1), 2 * t + 8 * (q >> 1) + p] = v[:, p]
    for q in range(2):
        v = _f16_pair(b[q])
        for p in range(2):
            B[2 * t + 8 * q + p, g] = v[:, p]
    return A @ B


def _mma_fp8(a: list, b: list, fa, fb) -> np.ndarray:
    """mma.m16n8k32 fp8 -> 16 x 8 (float64): a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 =
    A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..][g], b1 = B[16+4t..][g] (low byte first)."""
    g, t = LANES >> 2, LANES & 3
    A = np.zeros((16, 32))
    B = np.zeros((32, 8))
    for q in range(4):
        for p in range(4):
            A[g + 8 * (q & 1), 4 * t + 16 * (q >> 1) + p] = R.decode(((a[q] >> (8 * p)) & 0xFF).astype(np.uint8), fa)
    for q in range(2):
        for p in range(4):
            B[4 * t + 16 * q + p, g] = R.decode(((b[q] >> (8 * p)) & 0xFF).astype(np.uint8), fb)
    return A @ B


def _e8m0_bits(e: np.ndarray) -> np.ndarray:
    """fp32 with exponent field e (as `e << 23` in the kernel): 2^(e - 127), 0.0 for e == 0."""
    e = np.asarray(e, np.int64)
    return np.where(e == 0, 0.0, np.ldexp(1.0, e - 127))


def _rel_scale(b: int, emax: int) -> np.float16:
    d = max(b - emax, -126)
    return np.float16(np.float32(2.0 ** d))  # __float2half_rn of an fp32 power of two


def emulate_fp8(cfg: MxFp8GemmConfig, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray,
                m: int, n: int, k: int, alpha: float = 1.0) -> np.ndarray:
    """float64 D [m, n] (before the output rounding; no bias) as fp8_mma.cuh computes it."""
    BM, BN, WMn, WNn = cfg.tile_m, cfg.tile_n, cfg.warps_m, cfg.warps_n  # stages: one at a time here
    NT = WMn * WNn * 32
    WTM, WTN = BM // WMn, BN // WNn
    MI, NI = WTM // 16, WTN // 8
    SA_B, SB_B = max(1, BM // 128) * 512, max(1, BN // 128) * 512
    A_B, B_B = BM * TK, BN * TK
    STAGE = A_B + B_B + SA_B + SB_B  # (hbufs 0 rounds it up to 1024 bytes: no effect here)
    KT = -(-k // TK)
    mchunks, nchunks = -(-m // 128), -(-n // 128)
    fa, fb = _FP8[cfg.a_elem], _FP8[cfg.b_elem]
    af, bf, saf, sbf = a.reshape(-1), b.reshape(-1), sa.reshape(-1), sb.reshape(-1)
    tiles_m, tiles_n = -(-m // BM), -(-n // BN)
    out = np.full((m, n), np.nan)
    g, t = LANES >> 2, LANES & 3
    for bid in range(tiles_m * tiles_n):
        tm, tn = _Kernel.tile_coords(bid, tiles_m, tiles_n)
        m0, n0 = tm * BM, tn * BN
        # prologue: E per tile row (A rows, then B rows)
        e_rows = np.zeros(BM + BN, np.int64)
        for row in range(BM + BN):
            is_a = row < BM
            rr = (m0 if is_a else n0 - BM) + row
            if rr < (m if is_a else n):
                base = (rr // 128) * KT * 512 + (rr & 31) * 16 + ((rr >> 5) & 3) * 4
                words = [(saf if is_a else sbf)[base + kt * 512: base + kt * 512 + 4] for kt in range(KT)]
                e_rows[row] = int(np.max(np.concatenate(words)))
        acc = np.zeros((WMn * WNn, MI, NI, 16, 8))
        hsets = [np.zeros((BM + BN) * TK * 2, np.uint8) for _ in range(max(cfg.hbufs, 1))]
        for kt in range(KT):
            st = np.zeros(STAGE, np.uint8)
            kbyte = kt * TK
            for tid in range(NT):  # cp.async, as the load lambda
                c16, r_base = tid & 7, tid >> 3
                k_ok = kbyte + c16 * 16 < k
                for it in range(BM * 8 // NT):
                    r = r_base + it * (NT // 8)
                    ok = k_ok and m0 + r < m
                    src = (m0 + r) * k + kbyte + c16 * 16
                    st[tile_off(r, c16): tile_off(r, c16) + 16] = af[src:src + 16] if ok else 0
                for it in range(BN * 8 // NT):
                    r = r_base + it * (NT // 8)
                    ok = k_ok and n0 + r < n
                    src = (n0 + r) * k + kbyte + c16 * 16
                    dst = A_B + tile_off(r, c16)
                    st[dst:dst + 16] = bf[src:src + 16] if ok else 0
                if tid < (SA_B + SB_B) // 16:
                    is_a = tid < SA_B // 16
                    j = tid if is_a else tid - SA_B // 16
                    chunk = (m0 if is_a else n0) // 128 + (j >> 5)
                    ok = chunk < (mchunks if is_a else nchunks)
                    src = chunk * KT * 512 + (j & 31) * 16 + kt * 512
                    dst = A_B + B_B + tid * 16
                    st[dst:dst + 16] = (saf if is_a else sbf)[src:src + 16] if ok else 0
            ssa, ssb = A_B + B_B, A_B + B_B + SA_B
            if cfg.hbufs == 0:  # rescale in place, then four k32 steps of the fp8 wgmma / mma.sync
                # (the wgmma kernel copies each row's word of the k-tile, 0 for rows past M / N;
                # the mma.sync one reads it from the stage's scale chunks, skipping rows whose
                # byte exceeds E: only rows past M / N, E = 0 there)
                def word(is_a, r, m0=m0, n0=n0, kt=kt, st=st, ssa=ssa, ssb=ssb):
                    if not cfg.wgmma:
                        off = (ssa if is_a else ssb) + swz_off(((m0 if is_a else n0) & 127) + r, 0)
                        return int(_u32(st, np.array([off]))[0])
                    rr, lim, sc = (m0 + r, m, saf) if is_a else (n0 + r, n, sbf)
                    if rr >= lim:
                        return 0
                    base = (rr // 128) * KT * 512 + (rr & 31) * 16 + ((rr >> 5) & 3) * 4 + kt * 512
                    return int(_u32(sc, np.array([base]))[0])
                for tid in range(NT):
                    c16, r_base = tid & 7, tid >> 3
                    for is_a, rows_n, fmt in ((True, BM, fa), (False, BN, fb)):
                        for it in range(rows_n * 8 // NT):
                            r = r_base + it * (NT // 8)
                            w = word(is_a, r)
                            e = int(e_rows[r if is_a else BM + r])
                            bexp = (w >> (8 * (c16 >> 1))) & 0xFF
                            if bexp < e:  # (wgmma: bexp <= e in every row)
                                src = (0 if is_a else A_B) + tile_off(r, c16)
                                v = R.decode(st[src:src + 16], fmt).astype(np.float16) * _rel_scale(bexp, e)
                                st[src:src + 16] = R.encode(v.astype(np.float64), fmt, saturate=True)
                if not cfg.wgmma:  # ldmatrix of the fp8 stage + mma.sync m16n8k32
                    for warp in range(WMn * WNn):
                        wm, wn = warp // WNn, warp % WNn
                        for ks in range(TK // 32):
                            afr, bfr = _ldsm_frags(st, 0, A_B, wm * WTM, wn * WTN, ks, MI, NI, tile_off)
                            for i in range(MI):
                                for j in range(NI):
                                    acc[warp, i, j] += _mma_fp8(afr[i], bfr[j], fa, fb)
                    continue
                for w4 in range(WMn * WNn // 4):
                    d = np.zeros((64, BN))
                    for ks in range(TK // 32):
                        d += (_wgmma_fp8_operand(st, w4 * 64 * TK + ks * 32, 64, fa)
                              @ _wgmma_fp8_operand(st, A_B + ks * 32, BN, fb).T)
                    for w in range(4):
                        for j in range(NI):
                            acc[4 * w4 + w, 0, j] += d[16 * w:16 * w + 16, 8 * j:8 * j + 8]
                continue
            # f16 tile set kt % hbufs (the kernel's h_a / h_b of this k-tile); the emulation
            # keeps one array per set and starts each k-tile's set from the previous contents
            h = hsets[kt % cfg.hbufs]
            h_b = BM * TK * 2
            for tid in range(NT):  # conversion
                c16, r_base = tid & 7, tid >> 3
                for is_a, rows_n, fmt in ((True, BM, fa), (False, BN, fb)):
                    for it in range(rows_n * 8 // NT):
                        r = r_base + it * (NT // 8)
                        w = int(_u32(st, np.array([(ssa if is_a else ssb)
                                                    + swz_off(((m0 if is_a else n0) & 127) + r, 0)]))[0])
                        e = e_rows[r if is_a else BM + r]
                        s2 = _rel_scale((w >> (8 * (c16 >> 1))) & 0xFF, int(e))
                        src = (0 if is_a else A_B) + tile_off(r, c16)
                        vals = R.decode(st[src:src + 16], fmt).astype(np.float16) * s2
                        dst = (0 if is_a else h_b)
                        hb = vals.astype(np.float16).view(np.uint8)
                        if cfg.wgmma:
                            rows = BM if is_a else BN
                            d0, d1 = dst + wg_off(rows, r, 2 * c16), dst + wg_off(rows, r, 2 * c16 + 1)
                        else:
                            d0, d1 = dst + htile_off(r, 2 * c16), dst + htile_off(r, 2 * c16 + 1)
                        h[d0:d0 + 16], h[d1:d1 + 16] = hb[:16], hb[16:]
            if cfg.wgmma:  # two warpgroups of 64 rows; warp w holds rows 16 (w % 4) of its group
                for w4 in range(WMn * WNn // 4):
                    d = np.zeros((64, BN))
                    for ks in range(TK // 16):
                        a_ = _wgmma_operand(h, w4 * 64 * 128 + (ks >> 2) * BM * 128 + (ks & 3) * 32, 64)
                        b_ = _wgmma_operand(h, h_b + (ks >> 2) * BN * 128 + (ks & 3) * 32, BN)
                        d += a_ @ b_.T
                    for w in range(4):
                        for j in range(NI):
                            acc[4 * w4 + w, 0, j] += d[16 * w:16 * w + 16, 8 * j:8 * j + 8]
                continue
            for warp in range(WMn * WNn):  # ldmatrix + mma
                wm, wn = warp // WNn, warp % WNn
                for ks in range(TK // 16):
                    afr, bfr = _ldsm_frags(h, 0, h_b, wm * WTM, wn * WTN, ks, MI, NI, htile_off)
                    for i in range(MI):
                        for j in range(NI):
                            acc[warp, i, j] += _mma_f16(afr[i], bfr[j])
        for warp in range(WMn * WNn):  # epilogue
            wm, wn = warp // WNn, warp % WNn
            for i in range(MI):
                for j in range(NI):
                    for hh in range(2):
                        for e in range(2):
                            row = m0 + wm * WTM + i * 16 + g + 8 * hh
                            col = n0 + wn * WTN + j * 8 + 2 * t + e
                            pa = alpha * _e8m0_bits(e_rows[wm * WTM + i * 16 + g + 8 * hh])
                            pb = _e8m0_bits(e_rows[BM + wn * WTN + j * 8 + 2 * t + e])
                            ok = (row < m) & (col < n)
                            v = acc[warp, i, j][(g + 8 * hh), (2 * t + e)] * pb * pa
                            out[row[ok], col[ok]] = v[ok]
    return out
