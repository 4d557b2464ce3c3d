"""NumPy emulation of the sm_120a block-scaled kernel (templates/mx_gemm/bs_mma.cuh), for the
CPU tests: no Blackwell GPU is available, so the kernel's addressing is checked here.

Two halves, kept apart on purpose:
* `_Kernel` mirrors the kernel line by line: tile raster, the cp.async copies of a k-tile into
  the XOR-swizzled shared tiles and scale chunks, and every lane's shared-memory reads that
  form the fragment and scale registers.
* `_mma` is the instruction as the PTX ISA / CUTLASS SM120 traits define it (fragment layout
  of A, B, C; scale-a/b-data with byte-id 0 and thread-id 0; e2m1 in bits [2, 6) of the
  8-bit containers of kind::mxf8f6f4): what the hardware computes from those registers.
If the kernel's addresses are right, the emulation reproduces the reference GEMM.
"""

from __future__ import annotations

import numpy as np

from ..mx import reference as R
from .config import TK, MxBsGemmConfig

_ELEM = {"e4m3": R.E4M3, "e5m2": R.E5M2, "e2m1": R.E2M1}
LANES = np.arange(32)


def _u32(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Little-endian 32-bit shared loads at byte offsets `off` (one per lane)."""
    b = buf[off[..., None] + np.arange(4)].astype(np.uint64)
    return (b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24).astype(np.uint64)


def _u16(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
    b = buf[off[..., None] + np.arange(2)].astype(np.uint64)
    return b[..., 0] | b[..., 1] << 8


def _e2m1x4_to_f8f6f4(x: np.ndarray) -> np.ndarray:
    y = (x & 0xF) | ((x & 0xF0) << 4) | ((x & 0xF00) << 8) | ((x & 0xF000) << 12)
    return (y << 2) & 0xFFFFFFFF


class _Kernel:
    """State and address math of one launch (names follow bs_mma.cuh)."""

    def __init__(self, cfg: MxBsGemmConfig, m: int, n: int, k: int):
        self.cfg, self.M, self.N, self.K = cfg, m, n, k
        self.A_ROW = TK // 2 if cfg.a_elem == "e2m1" else TK
        self.B_ROW = TK // 2 if cfg.b_elem == "e2m1" else TK
        self.GROUP = cfg.group
        self.CH = TK // self.GROUP // 4
        self.KSTEP = 32 if cfg.mma_kind == "mxf8f6f4" else 64
        bm, bn = cfg.tile_m, cfg.tile_n
        self.RCA, self.RCB = max(1, bm // 128), max(1, bn // 128)
        self.SA, self.SB = self.RCA * self.CH * 512, self.RCB * self.CH * 512
        self.A, self.B = bm * self.A_ROW, bn * self.B_ROW
        self.STAGE = self.A + self.B + self.SA + self.SB
        self.NT = cfg.threads
        self.KT = -(-k // TK)
        self.kchunks = (k // self.GROUP + 3) // 4
        self.mchunks, self.nchunks = -(-m // 128), -(-n // 128)
        self.a_ld, self.b_ld = k * self.A_ROW // TK, k * self.B_ROW // TK

    @staticmethod
    def bs_off(row_bytes: int, r, b):
        nc = row_bytes // 16
        return r * row_bytes + ((((b >> 4) ^ r) & (nc - 1)) << 4) + (b & 15)

    def bs_scale_off(self, r, q):
        return (r >> 7) * self.CH * 512 + q * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4

    @staticmethod
    def tile_coords(bid: int, tiles_m: int, tiles_n: int, group: int = 8) -> tuple[int, int]:
        per_group = group * tiles_n
        first_m = (bid // per_group) * group
        rows = min(tiles_m - first_m, group)
        return first_m + (bid % per_group) % rows, (bid % per_group) // rows

    def load(self, st: np.ndarray, kt: int, m0: int, n0: int, a: np.ndarray, b: np.ndarray,
             sa: np.ndarray, sb: np.ndarray) -> None:
        """Every thread's cp.async of k-tile kt (16 bytes each, zero-filled when not valid)."""
        cfg, af, bf = self.cfg, a.reshape(-1), b.reshape(-1)
        for i in range(cfg.tile_m * self.A_ROW // 16):
            r, c = divmod(i, self.A_ROW // 16)
            byte = kt * self.A_ROW + c * 16
            ok = m0 + r < self.M and byte < self.a_ld
            dst = self.bs_off(self.A_ROW, r, c * 16)
            src = (m0 + r) * self.a_ld + byte
            st[dst:dst + 16] = af[src:src + 16] if ok else 0
        for i in range(cfg.tile_n * self.B_ROW // 16):
            r, c = divmod(i, self.B_ROW // 16)
            byte = kt * self.B_ROW + c * 16
            ok = n0 + r < self.N and byte < self.b_ld
            dst = self.A + self.bs_off(self.B_ROW, r, c * 16)
            src = (n0 + r) * self.b_ld + byte
            st[dst:dst + 16] = bf[src:src + 16] if ok else 0
        for i in range((self.SA + self.SB) // 16):
            is_a = i < self.SA // 16
            j = i if is_a else i - self.SA // 16
            rc, q = j // (self.CH * 32), (j // 32) % self.CH
            chunk, kc = (m0 if is_a else n0) // 128 + rc, kt * self.CH + q
            ok = chunk < (self.mchunks if is_a else self.nchunks) and kc < self.kchunks
            base = (sa if is_a else sb).reshape(-1)
            src = (chunk * self.kchunks + kc) * 512 + (j & 31) * 16
            dst = self.A + self.B + (0 if is_a else self.SA) + j * 16
            st[dst:dst + 16] = base[src:src + 16] if ok else 0


def _decode_elem(codes: np.ndarray, elem: str) -> np.ndarray:
    return R.decode(codes.astype(np.uint8), _ELEM[elem]).astype(np.float64)


def _decode_scale(byte: np.ndarray, kind: str) -> np.ndarray:
    byte = np.asarray(byte, np.uint8)
    if kind == "nvf4":
        return R.decode(byte, R.E4M3).astype(np.float64)
    return R.e8m0_decode(byte).astype(np.float64)


def _mma(cfg: MxBsGemmConfig, a_regs: list, b_regs: list, sfa: np.ndarray, sfb: np.ndarray) -> np.ndarray:
    """What the block-scaled mma.sync computes (16 x 8, float64) from the warp's registers:
    a_regs[q], b_regs[q] and sfa / sfb are arrays over the 32 lanes."""
    g, t = LANES >> 2, LANES & 3
    if cfg.mma_kind == "mxf8f6f4":
        kk, per = 32, 4  # 4 codes of 8 bits per register
        A = np.zeros((16, kk))
        B = np.zeros((kk, 8))
        for q in range(4):
            for p in range(per):
                byte = (a_regs[q] >> (8 * p)) & 0xFF
                A[g + 8 * (q & 1), 16 * (q >> 1) + 4 * t + p] = _decode_elem(byte, cfg.a_elem)
        for q in range(2):
            for p in range(per):
                byte = (b_regs[q] >> (8 * p)) & 0xFF
                code = (byte >> 2) & 0xF if cfg.b_elem == "e2m1" else byte
                B[16 * q + 4 * t + p, g] = _decode_elem(code, cfg.b_elem)
        groups, gsize = 1, 32
    else:
        kk, per = 64, 8  # 8 packed e2m1 codes per register, lowest k in the low nibble
        A = np.zeros((16, kk))
        B = np.zeros((kk, 8))
        for q in range(4):
            for p in range(per):
                A[g + 8 * (q & 1), 32 * (q >> 1) + 8 * t + p] = _decode_elem((a_regs[q] >> (4 * p)) & 0xF, "e2m1")
        for q in range(2):
            for p in range(per):
                B[32 * q + 8 * t + p, g] = _decode_elem((b_regs[q] >> (4 * p)) & 0xF, "e2m1")
        groups, gsize = (2, 32) if cfg.mma_kind == "mxf4" else (4, 16)
    # thread-id 0: A rows from lanes with lane % 4 in {0, 1} (row g + 8 * lane), B columns
    # from lanes with lane % 4 == 0; byte j of the register scales k-group j.
    sel_a = LANES % 4 < 2
    rows = (g + 8 * (LANES & 1))[sel_a]
    sel_b = LANES % 4 == 0
    cols = g[sel_b]
    SFA = np.zeros((16, groups))
    SFB = np.zeros((groups, 8))
    for j in range(groups):
        SFA[rows, j] = _decode_scale((sfa[sel_a] >> (8 * j)) & 0xFF, cfg.mma_kind)
        SFB[j, cols] = _decode_scale((sfb[sel_b] >> (8 * j)) & 0xFF, cfg.mma_kind)
    As = A * np.repeat(SFA, gsize, axis=1)
    Bs = B * np.repeat(SFB, gsize, axis=0)
    return As @ Bs


def emulate(cfg: MxBsGemmConfig, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray,
            m: int, n: int, k: int, alpha: float = 1.0, gsa: float = 1.0, gsb: float = 1.0
            ) -> np.ndarray:
    """float64 D [m, n] (before the output rounding; no bias) as the kernel would compute it.
    a, b: packed codes [rows, K * bits / 8]; sa, sb: swizzled scale bytes."""
    kn = _Kernel(cfg, m, n, k)
    bm, bn, wm_n, wn_n = cfg.tile_m, cfg.tile_n, cfg.warps_m, cfg.warps_n
    WTM, WTN = bm // wm_n, bn // wn_n
    MI, NI = WTM // 16, WTN // 8
    g, t = LANES >> 2, LANES & 3
    tiles_m, tiles_n = -(-m // bm), -(-n // bn)
    out = np.full((m, n), np.nan)
    scale = alpha / (gsa * gsb) if cfg.mma_kind == "nvf4" else alpha
    for bid in range(tiles_m * tiles_n):
        tm, tn = kn.tile_coords(bid, tiles_m, tiles_n)
        m0, n0 = tm * bm, tn * bn
        acc = np.zeros((wm_n * wn_n, MI, NI, 16, 8))
        st = np.zeros(kn.STAGE, np.uint8)
        for kt in range(kn.KT):
            kn.load(st, kt, m0, n0, a, b, sa, sb)
            ta, tb = 0, kn.A
            ssa, ssb = kn.A + kn.B, kn.A + kn.B + kn.SA
            for warp in range(wm_n * wn_n):
                wm, wn = warp // wn_n, warp % wn_n
                ra0 = (m0 & 127) + wm * WTM + g + 8 * (LANES & 1)
                rb0 = (n0 & 127) + wn * WTN + g
                for ks in range(TK // kn.KSTEP):
                    q_step = ks if cfg.mma_kind == "nvf4" else 0
                    shift = 0 if cfg.mma_kind == "nvf4" else (8 * ks if cfg.mma_kind == "mxf8f6f4" else 16 * ks)
                    sfa = [_u32(st, ssa + kn.bs_scale_off(ra0 + i * 16, q_step)) >> shift for i in range(MI)]
                    sfb = [_u32(st, ssb + kn.bs_scale_off(rb0 + j * 8, q_step)) >> shift for j in range(NI)]
                    ka = ks * (kn.KSTEP * kn.A_ROW // TK)
                    kb = ks * (kn.KSTEP * kn.B_ROW // TK)
                    af = [[_u32(st, ta + kn.bs_off(kn.A_ROW, wm * WTM + i * 16 + g + 8 * (q & 1),
                                                   ka + 16 * (q >> 1) + 4 * t)) for q in range(4)]
                          for i in range(MI)]
                    bf = []
                    for j in range(NI):
                        r = wn * WTN + j * 8 + g
                        if cfg.mma_kind == "mxf8f6f4" and cfg.b_elem == "e2m1":
                            bf.append([_e2m1x4_to_f8f6f4(_u16(st, tb + kn.bs_off(kn.B_ROW, r, kb + 8 * q + 2 * t)))
                                       for q in range(2)])
                        else:
                            bf.append([_u32(st, tb + kn.bs_off(kn.B_ROW, r, kb + 16 * q + 4 * t))
                                       for q in range(2)])
                    for i in range(MI):
                        for j in range(NI):
                            acc[warp, i, j] += _mma(cfg, af[i], bf[j], sfa[i], sfb[j])
        # epilogue: lane (g, t) writes D[g + 8h][2t + e] of each piece
        for warp in range(wm_n * wn_n):
            wm, wn = warp // wn_n, warp % wn_n
            for i in range(MI):
                for j in range(NI):
                    for h in range(2):
                        for e in range(2):
                            row = m0 + wm * WTM + i * 16 + g + 8 * h
                            col = n0 + wn * WTN + j * 8 + 2 * t + e
                            ok = (row < m) & (col < n)
                            out[row[ok], col[ok]] = scale * acc[warp, i, j][(g + 8 * h)[ok], (2 * t + e)[ok]]
    return out
