"""NumPy emulation of the GEMV kernel (templates/kbit_gemm/gemv.cuh) lane by lane: the stage
copies (chunk order, 4-bit chunk swizzle, zero fill past K, A in lane order), the table fill
and its PRMT addresses, the pair / quad codes, row mode (HMUL2 scales) and column mode (fp32
scales after the mma, zero B lanes), the mma fragment layout (each m16n8k16 assembled from the 32
lanes' registers), stream-K partials with the last-contributor reduction and the epilogue,
checked against the float64 reference. The address expressions are the kernel's; what it cannot
see is a typo in their CUDA spelling, timing, or the cp.async ring order."""

import numpy as np
import pytest

from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import reference as GR
from kernelgen.kbit_gemm.config import A_TOKEN_BYTES, LUT_BYTES
from kernelgen.kbit_gemm.select import plan_gemv

U32 = np.uint32


def prmt(a, b, sel):
    """PTX prmt (selector nibble bit 3: replicate the byte's sign)."""
    x = np.asarray(a, np.uint64) | (np.asarray(b, np.uint64) << np.uint64(32))
    sel = np.asarray(sel, np.uint64)
    out = np.zeros(np.broadcast(x, sel).shape, np.uint64)
    for i in range(4):
        nib = (sel >> np.uint64(4 * i)) & np.uint64(0xF)
        byte = (x >> (np.uint64(8) * (nib & np.uint64(7)))) & np.uint64(0xFF)
        sign = np.where((byte & np.uint64(0x80)) != 0, np.uint64(0xFF), np.uint64(0))
        out |= np.where((nib & np.uint64(8)) != 0, sign, byte) << np.uint64(8 * i)
    return out.astype(U32)


def byte_perm(a, b, sel):  # __byte_perm: the low 3 bits of each selector nibble
    return prmt(a, b, sel & 0x7777)


def bitsel(m, a, b):
    return (np.asarray(a, U32) & U32(m)) | (np.asarray(b, U32) & ~U32(m))


def shl(x, n):
    return (np.asarray(x, np.uint64) << np.uint64(n)).astype(U32)


def shr(x, n):
    return np.asarray(x, U32) >> U32(n)


def to_bits(x, dt):
    x = np.asarray(x, np.float32)
    if dt == "float16":
        return x.astype(np.float16).view(np.uint16).astype(U32)
    return R.f32_to_bf16(np.atleast_1d(x)).astype(U32).reshape(x.shape)


def from_bits(b, dt):
    b = np.asarray(b, U32).astype(np.uint16)
    if dt == "float16":
        return b.view(np.float16).astype(np.float64)
    return R.bf16_to_f32(np.atleast_1d(b)).astype(np.float64).reshape(b.shape)


def halves(r, dt):
    r = np.asarray(r, U32)
    return from_bits(r & U32(0xFFFF), dt), from_bits(r >> U32(16), dt)


def pack2(lo, hi, dt):
    return to_bits(lo, dt) | (to_bits(hi, dt) << U32(16))


class Smem:
    def __init__(self, n):
        self.b = np.full(n, 0xAB, np.uint8)  # garbage: whatever is read before written shows

    def words(self, addr, n, align):
        addr = np.asarray(addr, np.int64)
        assert np.all(addr % align == 0) and np.all(addr + 4 * n <= self.b.size)
        w = self.b.view(U32)
        return [w[addr // 4 + i] for i in range(n)]

    def u16(self, addr):
        return self.b.view(np.uint16)[np.asarray(addr, np.int64) // 2].astype(U32)

    def put(self, addr, data):
        assert addr + len(data) <= self.b.size
        self.b[addr:addr + len(data)] = data


def code_index(c, i, bits):
    if bits == 2:
        return ((c >> i) & 1) | (((c >> (4 + i)) & 1) << 1)
    idx = 0
    for b in range(4 if bits == 5 else bits):
        idx |= ((c >> (2 * b + i)) & 1) << b
    if bits == 5:
        idx |= ((c >> (8 + i)) & 1) << 4
    return idx


def fill_lut(sm, cb, bits, dt, col):
    f = {("float16", False): 16.0, ("float16", True): 2.0 ** 15}.get((dt, col), 2.0 ** 116)
    cbf = (cb.astype(np.float32) * np.float32(f)).astype(np.float32)
    spe = (64 if bits == 5 else 256) // 16
    for s in range(4096):
        e = s // spe
        v0 = int(pack2(cbf[code_index(e, 0, bits)], cbf[code_index(e, 1, bits)], dt))
        v1 = int(pack2(cbf[code_index(e, 2, bits)], cbf[code_index(e, 3, bits)], dt)) if bits == 2 else v0
        sm.put(s * 16, np.array([v0, v1, v0, v1], U32).view(np.uint8))


def make_codes(w, bits):
    m2, m4 = 0x33333333, 0x0F0F0F0F
    if bits == 2:
        return [bitsel(m4, w[0], shl(w[1], 4)), bitsel(m4, shr(w[0], 4), w[1])]
    l01, h01 = bitsel(m2, w[0], shl(w[1], 2)), bitsel(m2, shr(w[0], 2), w[1])
    if bits == 3:
        c = [bitsel(m4, l01, shl(w[2], 4)), bitsel(m4, shr(l01, 4), w[2]),
             bitsel(m4, h01, shl(w[2], 2)), bitsel(m4, shr(h01, 4), shr(w[2], 2))]
    else:
        l23, h23 = bitsel(m2, w[2], shl(w[3], 2)), bitsel(m2, shr(w[2], 2), w[3])
        c = [bitsel(m4, l01, shl(l23, 4)), bitsel(m4, shr(l01, 4), l23),
             bitsel(m4, h01, shl(h23, 4)), bitsel(m4, shr(h01, 4), h23)]
    if bits == 5:
        b2 = U32(0x03030303)
        c += [w[4] & b2, shr(w[4], 4) & b2, shr(w[4], 2) & b2, shr(w[4], 6) & b2]
    return c


def lookup(c, s, bits, sm, lane_word):
    r = s >> 1
    if bits == 2:
        v = sm.words(byte_perm(c[s & 1], lane_word, 0x5504 | (r << 4)), 2, 8)
        return v[0], v[1]
    if bits <= 4:
        return (sm.words(byte_perm(c[s & 1], lane_word, 0x5504 | (r << 4)), 1, 4)[0],
                sm.words(byte_perm(c[2 + (s & 1)], lane_word, 0x5504 | (r << 4)), 1, 4)[0])
    sel = r | ((4 + r) << 4) | 0xCC00
    k0 = prmt(c[s & 1], c[4 + (s & 1)], sel).astype(np.int64)
    k1 = prmt(c[2 + (s & 1)], c[6 + (s & 1)], sel).astype(np.int64)
    return sm.words((k0 << 6) + lane_word, 1, 4)[0], sm.words((k1 << 6) + lane_word, 1, 4)[0]


LANE = np.arange(32)
G, T = LANE >> 2, LANE & 3


def mma(acc, a, b, dt):
    """acc [32, 4] += A(16x16) . B(16x8), operands from the lanes' registers (PTX fragments)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for reg, (r, k) in zip(a, ((G, 2 * T), (G + 8, 2 * T), (G, 2 * T + 8), (G + 8, 2 * T + 8)),
                           strict=True):
        A[r, k], A[r, k + 1] = halves(reg, dt)
    for reg, k in zip(b, (2 * T, 2 * T + 8), strict=True):
        B[k, G], B[k + 1, G] = halves(reg, dt)
    D = A @ B
    acc += np.stack([D[G, 2 * T], D[G, 2 * T + 1], D[G + 8, 2 * T], D[G + 8, 2 * T + 1]], 1)


def col_scale(w, b):
    w = np.asarray(w, U32)
    x = (shr(w, 5) if b == 3 else shl(w, 19 - 8 * b)) & U32(0x07F80000)
    return x.view(np.float32).astype(np.float64)


def emulate(packed, absmax, cb, a_bits, bias, m, n, k, bits, dt, plan):
    """C [m, n] float64 (before the final rounding) as the kernel computes it."""
    cfg = plan.config
    col, warps, stages = cfg.m_tile == 2, cfg.warps, cfg.stages
    nt_n = 1 if col else cfg.m_tile // 8
    ch = 2 if nt_n == 1 and not col else 1
    rr, wrow = 16 * warps, 32 * bits
    kt, rb_n = -(-k // 256), -(-n // rr)
    units, gg = rb_n * kt, plan.ctas
    out_f = 2.0 ** 101 if (col and dt == "float16") else 1.0
    slot_f = warps * nt_n * 128
    c_out = np.full((m, n), np.nan)
    ws = np.full(max(plan.ws_elems, 1), np.nan)
    counters = np.zeros(max(plan.n_counters, 1), np.int64)
    pk = packed.astype(U32).view(np.uint8)
    ab = np.ascontiguousarray(a_bits).view(np.uint8).reshape(-1)
    for z in range(plan.m_tiles):
        m0 = z * cfg.m_tile
        rows = min(cfg.m_tile, m - m0)
        stage = rr * (wrow + 8) + rows * A_TOKEN_BYTES
        assert LUT_BYTES + stages * stage + 528 <= plan.smem
        for c in range(gg):
            sm = Smem(plan.smem)
            u0, u1 = c * units // gg, (c + 1) * units // gg
            assert u1 > u0, "a CTA without units"
            zeros = LUT_BYTES + stages * stage
            sm.put(zeros, np.zeros(512, np.uint8))
            fill_lut(sm, cb, bits, dt, col)

            lane_word = (LANE * 8 if bits == 2 else (LANE & 15) * 4 if bits == 5 else LANE * 4)
            acc = np.zeros((warps, ch, nt_n, 32, 4))
            for u in range(u0, u1):
                rb, ks = divmod(u, kt)
                st = LUT_BYTES + ((u - u0) % stages) * stage
                copy(sm, st, rb, ks, rows, m0, pk, absmax, ab, n, k, bits, warps)
                for w in range(warps):
                    rg = 16 * w + G
                    off0 = rg * wrow + (0 if bits == 4 else T * 8 * bits)
                    off1 = off0 + 8 * wrow
                    if bits == 4:
                        wa, wb = [], []
                        for h in range(2):
                            co = ((2 * T + h) * 16) ^ ((G & 1) * 16)
                            wa += sm.words(st + off0 + co, 4, 16)
                            wb += sm.words(st + off1 + co, 4, 16)
                    elif bits == 2:
                        wa, wb = sm.words(st + off0, 4, 16), sm.words(st + off1, 4, 16)
                    else:
                        wa, wb = [], []
                        for h in range(bits):
                            wa += sm.words(st + off0 + 8 * h, 2, 8)
                            wb += sm.words(st + off1 + 8 * h, 2, 8)
                    s_off0 = st + rr * wrow + rg * 8 + (4 * (T & 1) if col else 2 * T)
                    if col:
                        sa, sb = sm.words(s_off0, 1, 4)[0], sm.words(s_off0 + 64, 1, 4)[0]
                    else:
                        sh = 6 if dt == "float16" else 3
                        sa = shl(byte_perm(sm.u16(s_off0), 0, 0x4140), sh)
                        sb = shl(byte_perm(sm.u16(s_off0 + 64), 0, 0x4140), sh)
                    a_lane = []
                    for nt in range(nt_n):
                        tok = (G >> 2) if col else G + 8 * nt
                        a_off = st + rr * (wrow + 8) + np.minimum(tok, rows - 1) * A_TOKEN_BYTES + T * 16
                        zero = ((G & 3) != T) | (tok >= rows) if col else np.zeros(32, bool)
                        a_lane.append(np.where(zero, zeros + T * 16, a_off))
                    for j in range(2):
                        ca = make_codes(wa[j * bits:(j + 1) * bits], bits)
                        cbc = make_codes(wb[j * bits:(j + 1) * bits], bits)
                        d = np.zeros((nt_n, 32, 4)) if col else acc[w, j if ch == 2 else 0]
                        for sp in range(4):
                            bq = [sm.words(a_lane[nt] + (4 * j + sp) * 64, 4, 16) for nt in range(nt_n)]
                            for s in (2 * sp, 2 * sp + 1):
                                x0, x1 = lookup(ca, s, bits, sm, lane_word)
                                y0, y1 = lookup(cbc, s, bits, sm, lane_word)
                                if not col:  # HMUL2 with the block's scale (half j), one rounding
                                    x0, x1, y0, y1 = (pack2(*(v * halves(sc, dt)[j] for v in halves(x, dt)), dt)
                                                      for x, sc in ((x0, sa), (x1, sa), (y0, sb), (y1, sb)))
                                for nt in range(nt_n):
                                    b = (bq[nt][2], bq[nt][3]) if s & 1 else (bq[nt][0], bq[nt][1])
                                    mma(d[nt], (x0, y0, x1, y1), b, dt)
                        if col:
                            a0 = acc[w, 0, 0]
                            for q, (sc, b) in enumerate(((sa, j), (sa, 2 + j), (sb, j), (sb, 2 + j))):
                                a0[:, q] += d[0][:, q] * col_scale(sc, b)
                if ks + 1 < kt and u + 1 < u1:
                    continue
                sums = acc[:, 0] + (acc[:, 1] if ch == 2 else 0)
                acc[:] = 0
                if not (max(u0, rb * kt) == rb * kt and ks + 1 == kt):  # a partial segment
                    assert cfg.split_k
                    def slot(cc, z=z, rb=rb):  # CTA cc's ws slot of row block rb
                        return ((z * gg + cc) * 2 + (0 if (cc * units // gg) // kt == rb else 1)) * slot_f

                    ws[slot(c):slot(c) + slot_f] = sums.reshape(-1)
                    cf, cl = ((rb * kt + 1) * gg - 1) // units, ((rb * kt + kt) * gg - 1) // units
                    counters[z * rb_n + rb] += 1
                    if counters[z * rb_n + rb] != cl - cf + 1:
                        continue
                    counters[z * rb_n + rb] = 0
                    sums = sum(ws[slot(cc):slot(cc) + slot_f] for cc in range(cf, cl + 1)).reshape(sums.shape)
                store(c_out, sums, rb * rr, m0, m, n, bias, col, nt_n, warps, out_f)
    assert not counters.any(), "a counter left non-zero for the next launch"
    return c_out


def copy(sm, st, rb, ks, rows, m0, pk, absmax, ab, n, k, bits, warps):
    """Loader.copy of unit (rb, ks): plane chunk i = tid + j*THREADS at byte 16*i (4 bits: pairs
    swapped on odd rows), scale word tid, A chunk q of token m in lane order; zeros past K."""
    rr, wrow, kb, whole = 16 * warps, 32 * bits, k // 32, (ks + 1) * 256 <= k
    for i in range(32 * warps * bits):
        r, cc = divmod(i, 2 * bits)
        nn = min(rb * rr + r, n - 1)
        dst = st + 16 * ((i ^ ((i >> 3) & 1)) if bits == 4 else i)
        src = 4 * ((nn * kb + ks * 8) * bits + 4 * cc)
        sm.put(dst, pk[src:src + 16] if whole or cc < bits else np.zeros(16, np.uint8))
    for tid in range(32 * warps):
        nn, h = min(rb * rr + (tid >> 1), n - 1), tid & 1
        src = nn * kb + ks * 8 + 4 * h
        sm.put(st + rr * wrow + 4 * tid, absmax[src:src + 4] if whole or h == 0 else np.zeros(4, np.uint8))
    for i in range(rows * 32):
        tok, q = i >> 5, i & 31
        dst = st + rr * (wrow + 8) + tok * A_TOKEN_BYTES + (q & 7) * 64 + (q >> 3) * 16
        src = 2 * ((m0 + tok) * k + ks * 256 + 8 * q)
        sm.put(dst, ab[src:src + 16] if ks * 256 + 8 * q < k else np.zeros(16, np.uint8))


def store(c_out, v, n0, m0, m, n, bias, col, nt_n, warps, out_f):
    for w in range(warps):
        for ln in range(32):
            g, t = ln >> 2, ln & 3
            for h in range(2):
                nn = n0 + 16 * w + g + 8 * h
                if nn >= n:
                    continue
                if col:
                    mm = m0 + (t >> 1)
                    if t & 1 or mm >= m:
                        continue
                    r = v[w, 0, ln, 2 * h:2 * h + 2].sum() + v[w, 0, ln ^ 1, 2 * h:2 * h + 2].sum()
                    c_out[mm, nn] = r * out_f + bias[nn]
                    continue
                for nt in range(nt_n):
                    for e in range(2):
                        mm = m0 + 8 * nt + 2 * t + e
                        if mm < m:
                            c_out[mm, nn] = v[w, nt, ln, 2 * h + e] + bias[nn]


CASES = [  # bits, dtype, m, n, k, forced split, SM count (few SMs: long stream-K ranges)
    (4, "float16", 1, 200, 384, None, 132), (4, "bfloat16", 2, 96, 1024, None, 5),
    (2, "float16", 1, 300, 640, None, 7), (3, "bfloat16", 2, 200, 384, 3, 132),
    (5, "float16", 1, 96, 1024, 1, 132), (2, "bfloat16", 3, 200, 384, None, 3),
    (3, "float16", 16, 96, 384, None, 132), (4, "float16", 17, 96, 384, 2, 132),
    (5, "bfloat16", 9, 200, 384, None, 4), (4, "float16", 1, 2100, 256, None, 132),
]


@pytest.mark.parametrize("bits,dt,m,n,k,split,sms", CASES)
def test_emulated_kernel_matches_reference(bits, dt, m, n, k, split, sms):
    rng = np.random.default_rng(bits * 1000 + m * 7 + n + k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 3.0, (n, 1))).astype(np.float32)
    cb = R.create_normal_float_codebook(bits)
    packed, _, a8 = R.quantize(w, bits, cb)
    w64 = GR.dequantize_weight(packed, a8, cb, bits, n, k)
    a_bits = to_bits(rng.standard_normal((m, k)), dt).astype(np.uint16)
    bias_bits = to_bits(rng.standard_normal(n), dt).astype(np.uint16)
    bias = from_bits(bias_bits, dt)
    p = plan_gemv("sm_90a", m, n, k, bits, dt, sms, split)
    ctx = f"{bits=} {dt=} {m=} {n=} {k=} {split=} {sms=} {p.short()}"
    c = emulate(packed, a8, cb, a_bits, bias, m, n, k, bits, dt, p)
    assert np.isfinite(c).all(), f"{ctx}: {int((~np.isfinite(c)).sum())} outputs not written"
    a_ref = a_bits.view(np.float16) if dt == "float16" else a_bits
    b_ref = bias_bits.view(np.float16) if dt == "float16" else bias_bits
    err = GR.rel_error(c, GR.gemm(a_ref, w64, b_ref, dt))
    # fp32 accumulation in another order than float64, W pairs rounded to T once (row mode):
    # well inside the GPU bound
    assert err <= GR.REL_ERROR_BOUND[dt] / 4, f"{ctx}: rel error {err:.3g}"
