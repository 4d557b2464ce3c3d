"""NumPy emulation of the sm_90a warpgroup-MMA FP4 GEMM (templates/fp4_gemm/wgmma.cuh) at the
level of element values, for the CPU tests: no Hopper GPU is at hand, so the kernel's shared-
memory addressing is checked here (the precedent: kernelgen/mx_gemm/emulate.py).

Two halves, kept apart on purpose:

* `emulate` / `_Cta` MIRROR the kernel line by line: the grid and split-K ranges, each warp's
  tile (clamped to the last one), its global reads of the tiled layout (wp, sp, scale_offset),
  the pair swap of odd rows' words and scale bytes (swap_pairs, __byte_perm), the fragment
  order of raw_frags_of_word / frags_of_word, the st.shared.v4 addresses of the dense weight
  copy DQ, the cp.async addresses of the A slots (stage_load), the descriptors
  (wgmma_desc_k128 and the offsets added to it), the order of the accumulator operands in the
  asm (d[j][e] is operand 4j + e) and the epilogue's (m, n) of acc[j][e]. The formulas are
  copied from the CUDA source on purpose: they are what is under test.
* `wgmma_m64nNk16` MODELS the instruction from the PTX ISA, not from the kernel:
  wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 with both operands K-major in shared
  memory (tnspA = tnspB = 0, scale-a = scale-b = 1), read through matrix descriptors (start
  address bits 0-13, leading byte offset 16-29 (unused by K-major 128-byte swizzle), stride
  byte offset 32-45, base offset 49-51, swizzle mode 62-63, 1 = 128 bytes) and the 128-byte
  swizzle applied to address bits (16-byte unit bits [4, 7) XOR row bits [7, 10)); the f32
  accumulator fragment of m64nNk16 (thread of warp w4 of the warpgroup, lane (g, t), register
  i: D[16 w4 + g + 8 ((i % 4) // 2), 8 (i // 4) + 2 t + i % 2]).

If the kernel's addresses are right, the emulation reproduces X . W^T. Values are float64 and
the e2m1 / scale bit decodes are not emulated: a packed byte of the tiled layout stands for two
weight values (low nibble first) and a scale byte for one group scale value, and the test
weights are integers, so every sum is exact and the check is equality.

KBIT4 (4-bit kbit codes, fp4.cuh FMT_KBIT4: MXFP4's scale bytes, one a group of 32) adds the
kernel's code table to the same shared-memory image: KBIT4_LUT_BYTES right after the A slots
(lut = sa0 + STAGES * A_BYTES, inside WgSmem::TOTAL), written by the mirror of Kbit4Fill's
load / fill with the codebook's values (TABLE and the E4M4 bits not emulated: a nibble is a code
0..15, a scale byte a value) and checked against the table as fp4.cuh defines it (entry c =
(cb[c & 15], cb[c >> 4]) at c * 128 + 4 * copy). The decode reads its pairs from that image at
kbit4_word's addresses (lane_lut + (byte << 7)). No DQ store, A copy or wgmma operand read may
touch the table's bytes, and the table must stay as filled at every decode and at the end
(OverlapError): a table laid over a slot or buffer fails on the CPU, not only on the GPU.

The tiled arrays are layout.py's own (tile_data / tile_scales / arrange on the byte indices),
so the mirror also checks that the kernel reads the layout the way layout.py writes it.

The pipeline is emulated in lock step (all 256 threads run each part of an iteration
together): cp.async data is written at the copy but marked pending until the
cp.async.wait_group that completes it, and a wgmma group reads its operands both at its issue
(no pending copy may be under them: read after write) and at the wgmma.wait_group that
completes it (they must not have changed: write after read), so a slot or buffer reused too
early fails. The lock step keeps each thread's program order and the barrier's, not the
freedom of one warpgroup to run its part after the barrier (wgmma issue, copies) before or
after the other's: a copy after the barrier into the slot of the step just issued is caught in
the lock-step order (a change under a pending group) and would be in the other (a read under
a pending copy). The weight register ring (RING slots, each loaded RING steps ahead of its
decode) is mirrored too; it only reorders global loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernelgen.fp4_gemm.layout import arrange, block_strides, tile_data, tile_scales

STEP_K = 128
WG_BN = 128
WG_DQ_BYTES = WG_BN * STEP_K * 2
THREADS = 256
SB = {"nvfp4": 8, "mxfp4": 4, "kbit4": 4}  # scale bytes a row a step (Fmt<FMT>::SB)
KBIT4_LUT_BYTES = 256 * 128  # fp4.cuh: the kbit4 code table (256 pair entries x 32 lane copies)
MASK64 = (1 << 64) - 1

# Deliberate breakages of the mirror (the negative controls of the tests); None = the kernel.
BUGS = (
    "dq_no_odd_swap",  # DQ address chunk t + 4 (j & 1): the word order swapped, its place not
    "a_no_swizzle",  # A slot chunk a_c & 7, without ^ (row & 7)
    "scale_no_swap",  # scale bytes not swapped for odd rows (byte_order 0x3210 everywhere)
    "no_pair_swap",  # neither words nor scale bytes nor places swapped: right values, 2-way banks
    "dq_two_buffers",  # 2 dense buffers whatever INFLIGHT (a pending group's buffer reused)
    "copy_too_far",  # A copied STAGES - INFLIGHT steps ahead (the slot of a pending group)
    "cp_wait_short",  # cp_async_wait<D> (step kt's copies may still be in flight at the issue)
    "base_unaligned",  # the tiles at the window's start, not rounded up to 1024 bytes
    "lut_one_slot_early",  # kbit4 table at sa0 + (STAGES - 1) A_BYTES: over the last A slot
    "lut_over_dq",  # kbit4 table at sa0 - KBIT4_LUT_BYTES: over the last DQ buffer
)


class HazardError(AssertionError):
    """A wgmma read shared memory that a pending cp.async had not filled, or shared memory under
    a pending wgmma group changed before the wait that completes it."""


class OverlapError(AssertionError):
    """A DQ store, an A copy or a wgmma operand read touched the kbit4 code table's bytes, or the
    table changed after its fill."""


# -- the tiled layout as values ------------------------------------------------------------------

@dataclass
class Tiled:
    """Value images of the tiled weight arrays as the kernel sees them: wmem[byte, nibble] the
    weight value of that nibble of the data array's byte, svals[byte] the scale value of a scale
    byte (the S pointer is s_base bytes into it), and the block strides (launch arguments)."""

    wmem: np.ndarray
    svals: np.ndarray
    s_base: int
    strides: tuple[int, int, int, int]


def _digits(idx: np.ndarray) -> list[np.ndarray]:
    assert idx.max() < 1 << 24
    return [((idx >> (8 * d)) & 255).astype(np.uint8) for d in range(3)]


def _undigits(planes: list[np.ndarray]) -> np.ndarray:
    return sum(p.astype(np.int64).ravel() << (8 * d) for d, p in enumerate(planes))


def tiled_values(wq: np.ndarray, scales: np.ndarray, fmt: str, arrangement: str) -> Tiled:
    """Run layout.py on the indices (+ 1, so that its zero padding reads as index 0) of the
    packed bytes of wq [N, K] (element k of a row in nibble k % 2 of byte k // 2) and of the
    scale bytes [N, K * SB / 128], byte by byte through three uint8 digit planes, and map each
    stored byte back to its values (padding: 0)."""
    n, k = wq.shape
    sb = SB[fmt]
    didx = np.arange(n * k // 2, dtype=np.int64).reshape(n, k // 2) + 1
    sidx = np.arange(scales.size, dtype=np.int64).reshape(scales.shape) + 1
    planes_d, planes_s, ref = [], [], None
    for pd, ps in zip(_digits(didx), _digits(sidx), strict=True):
        td = tile_data(np, pd, n, k, enc=None)
        ts = tile_scales(np, ps, n, k, sb)
        data, sc = arrange(np, td, ts, arrangement)
        planes_d.append(data)
        planes_s.append(sc)
        ref = ref if ref is not None else (data, sc)
    strides = block_strides(arrangement, *ref)
    idx = _undigits(planes_d)  # the data array's bytes
    if arrangement.endswith("inline"):  # one buffer: each block's scale bytes after its 1 KB
        is_scale = np.zeros(ref[0].shape, bool)
        is_scale[:, :, 1024:] = True
        widx, sidx_mem, s_base = np.where(is_scale.ravel(), 0, idx), idx * is_scale.ravel(), 1024
    else:
        widx, sidx_mem, s_base = idx, _undigits(planes_s), 0
    wflat = np.concatenate([[0.0, 0.0], wq.reshape(-1).astype(np.float64)])  # [pad, pad, ...]
    wmem = np.stack([wflat[2 * widx], wflat[2 * widx + 1]], axis=-1)  # index 0 -> padding 0
    sflat = np.concatenate([[0.0], scales.reshape(-1).astype(np.float64)])
    return Tiled(wmem, sflat[sidx_mem], s_base, strides)


# -- the instruction, from the PTX ISA (independent of the kernel) -------------------------------

SWIZZLE_128B = 1  # descriptor bits 62-63 on sm_90: 0 none, 1 128-byte, 2 64-byte, 3 32-byte


def descriptor_fields(desc: int) -> dict[str, int]:
    """The fields of a wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor
    Format"): byte values of the encoded (>> 4) start address and offsets."""
    return {
        "start": (desc & 0x3FFF) << 4,
        "lbo": ((desc >> 16) & 0x3FFF) << 4,
        "sbo": ((desc >> 32) & 0x3FFF) << 4,
        "base_offset": (desc >> 49) & 7,
        "swizzle": (desc >> 62) & 3,
    }


def operand_chunks(desc: int, rows: int) -> np.ndarray:
    """The shared addresses [rows, 2] of the 16-byte chunks of the rows x 16 operand (f16-sized
    elements, K-major, 128-byte swizzle) a descriptor points to. Row i, 16-byte chunk h of the
    row's 32-byte k16 slice: address S + (i // 8) SBO + (i % 8) 128 + 16 h before the swizzle,
    which XORs address bits [4, 7) with bits [7, 10)."""
    f = descriptor_fields(desc)
    assert f["swizzle"] == SWIZZLE_128B, f
    # the pattern repeats every 1024 bytes; a start inside a repeat needs the base offset field
    assert f["base_offset"] == 0 and (f["start"] >> 7) & 7 == 0, f
    i = np.arange(rows)[:, None]
    h = np.arange(2)[None, :]
    addr = f["start"] + (i // 8) * f["sbo"] + (i % 8) * 128 + 16 * h
    return addr ^ (((addr >> 7) & 7) << 4)


def operand_k16(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
    """The operand of operand_chunks read from `smem` (one value per 2-byte slot of the shared
    window, slot = address / 2): element e of chunk h of row i is k = 8 h + e."""
    phys = operand_chunks(desc, rows)
    return smem[(phys // 2)[..., None] + np.arange(8)].reshape(rows, 16)


def accumulator_fragments(d: np.ndarray) -> np.ndarray:
    """D [64, N] -> the f32 accumulator registers of m64nNk16 [4 warps, 32 lanes, N / 2]:
    warp w4 of the warpgroup, lane (g, t) = (lane / 4, lane % 4), register i holds
    D[16 w4 + g + 8 ((i % 4) / 2), 8 (i / 4) + 2 t + i % 2]."""
    n = d.shape[1]
    w4 = np.arange(4)[:, None, None]
    lane = np.arange(32)[None, :, None]
    i = np.arange(n // 2)[None, None, :]
    g, t = lane // 4, lane % 4
    return d[16 * w4 + g + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * t + i % 2]


def wgmma_m64nNk16(smem: np.ndarray, da: int, db: int, n: int) -> np.ndarray:
    """wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 d, da, db, 1, 1, 1, 0, 0: the
    increments of every thread's accumulator registers, [4, 32, N / 2] (D = A . B^T,
    A [64, 16] and B [N, 16] both K-major)."""
    a = operand_k16(smem, da, 64)
    b = operand_k16(smem, db, n)
    return accumulator_fragments(a @ b.T)


# -- the kernel, mirrored ------------------------------------------------------------------------

def wgmma_desc_k128(addr: int) -> int:
    """common/wgmma.cuh wgmma_desc_k128."""
    return (((addr & 0x3FFFF) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)) & MASK64


def scale_offset(fmt: str, g, t):
    """fp4.cuh scale_offset<FMT> (KBIT4: as MXFP4)."""
    return 16 * g + 8 * (t >> 1) if fmt == "nvfp4" else 8 * g


def byte_perm(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """__byte_perm(x, 0, s) on 4-byte words given as their 4 byte values (last axis): result
    byte b is byte (s >> 4b) & 7 of {x, 0} (selectors 4-7: the zero word)."""
    out = np.zeros(x.shape)
    for b in range(4):
        sel = (s >> (4 * b)) & 7
        src = np.take_along_axis(x, np.minimum(sel, 3)[..., None], axis=-1)[..., 0]
        out[..., b] = np.where(sel < 4, src, 0.0)
    return out


@dataclass
class Stats:
    """What the mirror saw besides the values: the worst bank conflict (ways) of the DQ stores
    (st.shared.v4, _phase_ways) and counts of what was emulated."""

    dq_store_ways: int = 0
    wgmmas: int = 0
    ctas: int = 0
    hazards_checked: int = 0
    table_checks: int = 0  # kbit4: times the code table was found as filled
    table_reads: int = 0  # kbit4: table entries the decode read
    table_read_ways: int = 0  # kbit4: worst bank conflict of the decode's table reads (_word_ways)
    sizes: dict = field(default_factory=dict)


def _phase_ways(addr: np.ndarray) -> int:
    """Worst bank conflict (ways) of one 16-byte shared access per lane, addr [..., 32 lanes]:
    the lanes go in 4 phases of 8; in a phase, the distinct addresses on one 16-byte bank group
    ((addr >> 4) % 8) are serialized."""
    a = np.asarray(addr).reshape(-1, 8)
    bank = (a >> 4) & 7
    same_bank = bank[:, :, None] == bank[:, None, :]
    same_addr = a[:, :, None] == a[:, None, :]
    first = ~np.tril(same_addr, k=-1).any(axis=2)  # lane k is the first with its address
    return int((same_bank & first[:, None, :]).sum(axis=2).max())


def _word_ways(addr: np.ndarray) -> int:
    """Worst bank conflict (ways) of one 4-byte shared access per lane, addr [..., 32 lanes]:
    the distinct addresses on one 4-byte bank ((addr >> 2) % 32) are serialized."""
    a = np.asarray(addr).reshape(-1, 32)
    bank = (a >> 2) & 31
    same_bank = bank[:, :, None] == bank[:, None, :]
    same_addr = a[:, :, None] == a[:, None, :]
    first = ~np.tril(same_addr, k=-1).any(axis=2)
    return int((same_bank & first[:, None, :]).sum(axis=2).max())


class _Cta:
    """One CTA of wgmma_gemm<T, FMT, BM, STAGES, RING, INFLIGHT> (names as in wgmma.cuh)."""

    def __init__(self, em: _Launch, bx: int, by: int, bz: int):
        self.em = e = em
        self.BM, self.STAGES, self.INFLIGHT = e.bm, e.stages, e.inflight
        self.D = self.STAGES - 1 - self.INFLIGHT
        if e.bug == "copy_too_far":
            self.D = self.STAGES - self.INFLIGHT
        self.NDQ = 2 if e.bug == "dq_two_buffers" else 2 + self.INFLIGHT  # WgSmem::DQ
        self.A_BYTES = self.BM * STEP_K * 2
        self.LUT_BYTES = KBIT4_LUT_BYTES if e.fmt == "kbit4" else 0  # after the stages
        self.TOTAL = self.NDQ * WG_DQ_BYTES + self.STAGES * self.A_BYTES + self.LUT_BYTES + 1024
        self.smem_start = e.smem_start  # the dynamic window's start (static `last` before it)
        self.base = (self.smem_start + 1023) & ~1023
        if e.bug == "base_unaligned":
            self.base = self.smem_start
        self.dq0, self.sa0 = self.base, self.base + self.NDQ * WG_DQ_BYTES
        # KBIT4: lut = sa0 + STAGES * A_BYTES (the table's bytes [lut, lut + LUT_BYTES))
        self.lut = self.sa0 + self.STAGES * self.A_BYTES
        if e.bug == "lut_one_slot_early":
            self.lut -= self.A_BYTES
        elif e.bug == "lut_over_dq":
            self.lut = self.sa0 - KBIT4_LUT_BYTES
        # bytes the tiles and the table take from the window's start (slack included): in TOTAL
        self.used = max(self.sa0 + self.STAGES * self.A_BYTES, self.lut + self.LUT_BYTES)
        self.used -= self.smem_start
        assert self.used <= self.TOTAL, (self.used, self.TOTAL)
        self.lut_image = None  # the table as filled (kbit4, from fill_table on)
        self.smem = np.full((self.smem_start + self.TOTAL) // 2, np.nan)
        self.pending = np.zeros(self.smem.size, np.int64)  # cp.async group + 1 until it lands
        self.n0, self.m0 = bx * WG_BN, by * self.BM
        self.Q = e.K // STEP_K
        self.q0 = bz * e.sps
        self.n_k = min(self.Q, self.q0 + e.sps) - self.q0
        self.n_tiles = (e.N + 15) >> 4
        self.acc = np.zeros((8, 32, self.BM // 8, 4))
        self.committed = 0  # cp.async groups committed (every thread commits alike)
        self.groups: list[list] = [[], []]  # pending wgmma groups a warpgroup
        # this warp's tile (past the last: re-read it) and its pointers into W and S
        w_t, w_q, s_t, s_q = e.tiled.strides
        warp = np.arange(8)[:, None]
        lane = np.arange(32)[None, :]
        g, t = lane >> 2, lane & 3
        tl = np.minimum(self.n0 // 16 + warp, self.n_tiles - 1)
        self.wp = tl * w_t + self.q0 * w_q + 64 * g + 16 * t
        self.sp = e.tiled.s_base + tl * s_t + self.q0 * s_q + scale_offset(e.fmt, g, t)
        self.RING = e.ring
        self.wa, self.wb, self.sr = [None] * e.ring, [None] * e.ring, [None] * e.ring

    def _access(self, addr: np.ndarray, what: str, table: bool = False) -> None:
        """16-byte accesses at addr: inside the window, and (table False) off the kbit4 table's
        bytes, whether it is filled yet or not (a copy issued before the fill may land after)."""
        addr = np.asarray(addr)
        assert (addr % 16 == 0).all(), what
        assert addr.min() >= self.smem_start and addr.max() + 16 <= self.smem_start + self.TOTAL, what
        if self.LUT_BYTES and not table and self.em.access_checks:
            hit = (addr < self.lut + self.LUT_BYTES) & (addr + 16 > self.lut)
            if hit.any():
                raise OverlapError(f"{what} at {int(addr[hit].min())}.. touches the kbit4 table "
                                   f"[{self.lut}, {self.lut + self.LUT_BYTES})")

    # shared-memory stores, 16 bytes each
    def _store(self, addr: np.ndarray, vals: np.ndarray, what: str, pending: int = 0,
               table: bool = False) -> None:
        addr = np.asarray(addr)
        self._access(addr, what, table)
        slots = (addr // 2)[..., None] + np.arange(8)
        self.smem[slots] = vals
        self.pending[slots] = pending

    def fill_table(self) -> None:
        """KBIT4: Kbit4Fill<T, THREADS>::load(post) and fill(smem + (lut - raw)) (then
        __syncthreads): thread x stores uint4 x + THREADS j (j < PER) of the table, every
        2-byte half of its four words the pair (lo, hi[j]) of codebook values."""
        cb = self.em.codebook
        per = KBIT4_LUT_BYTES // 16 // THREADS
        x = np.arange(THREADS)[:, None]
        j = np.arange(per)[None, :]
        lo = cb[(x >> 3) & 15]  # load(): lo, hi[j]
        hi = cb[(x >> 7) + (THREADS // 128) * j]
        at = self.lut + 16 * (x + THREADS * j)
        pair = np.stack(np.broadcast_arrays(lo, hi), axis=-1)  # [THREADS, PER, 2]
        self._store(at, np.tile(pair, 4), "table fill", table=True)
        # the table as fp4.cuh defines it: entry c = (cb[c & 15], cb[c >> 4]) at c * 128 +
        # 4 * copy, 32 copies; the fill must write exactly that, over exactly the table's bytes
        assert np.array_equal(np.sort(at.ravel()), self.lut + 16 * np.arange(per * THREADS))
        c = np.arange(256)[:, None]
        want = np.stack(np.broadcast_arrays(cb[c & 15], cb[c >> 4]), axis=-1)  # [c, 1, 2]
        want = np.broadcast_to(want, (256, 32, 2)).reshape(-1)
        got = self.smem[self.lut // 2:(self.lut + KBIT4_LUT_BYTES) // 2]
        assert np.array_equal(got, want), "the table fill does not write fp4.cuh's table"
        self.lut_image = want.copy()
        self.check_table("its fill")

    def check_table(self, when: str) -> None:
        """KBIT4: the table's bytes as the fill left them."""
        if not self.LUT_BYTES:
            return
        got = self.smem[self.lut // 2:(self.lut + KBIT4_LUT_BYTES) // 2]
        if not np.array_equal(got, self.lut_image, equal_nan=True):
            raise OverlapError(f"the kbit4 table changed after its fill (at {when})")
        self.em.stats.table_checks += 1

    def kbit4_word(self, w: np.ndarray) -> np.ndarray:
        """kbit4_word(q, dec.lane_lut, o) for every warp and lane, w [8, 32, 8 codes] (word q:
        code i in nibble i): o[p] = the table entry at lane_lut + (byte p << 7), lane_lut = lut
        + 4 lane -> the 8 values [8, 32, 8] (o[p]'s low half first)."""
        code = w.astype(np.int64)
        assert np.array_equal(code, w) and code.min() >= 0 and code.max() < 16, "kbit4 codes"
        byte = code[..., 0::2] | (code[..., 1::2] << 4)  # __byte_perm(q, 0, 0x4440 + p)
        lane_lut = self.lut + 4 * np.arange(32)[None, :, None]
        at = lane_lut + (byte << 7)  # [8, 32, 4]
        assert at.min() >= self.lut and at.max() + 4 <= self.lut + self.LUT_BYTES
        st = self.em.stats
        st.table_reads += at.size
        ways = _word_ways(np.moveaxis(at, 1, -1))  # one ld.shared.b32 a warp and pair p
        st.table_read_ways = max(st.table_read_ways, ways)
        return self.smem[(at // 2)[..., None] + np.arange(2)].reshape(w.shape)

    def load(self, d: int) -> None:
        """The lambda `load(d)`: this warp's 1 KB block and scale word of the next step into
        ring slot d (wa: row g's 16 bytes, wb: row g + 8's, sr: the 8 scale bytes); the pointers
        move a step."""
        e = self.em
        _, w_q, _, s_q = e.tiled.strides
        self.wa[d] = e.tiled.wmem[self.wp[..., None] + np.arange(16)]  # [8, 32, byte, nibble]
        self.wb[d] = e.tiled.wmem[self.wp[..., None] + 512 + np.arange(16)]
        self.sr[d] = e.tiled.svals[self.sp[..., None] + np.arange(8)]
        self.wp = self.wp + w_q
        self.sp = self.sp + s_q

    def decode(self, d: int, buf: int) -> None:
        """Every warp's decode of ring slot d into DQ[buf] (the block `{ swap_pairs .. sts128 }`):
        word j of a 16-byte chunk = bytes 4j .. 4j + 3, element 2i + nibble of byte i."""
        e, bug = self.em, self.em.bug
        self.check_table(f"a decode into DQ[{buf}]")  # the decode reads it (kbit4)
        warp = np.arange(8)[:, None]
        lane = np.arange(32)[None, :]
        g, t = lane >> 2, lane & 3
        wa = self.wa[d].reshape(8, 32, 4, 8)  # [warp, lane, word, element]
        wb = self.wb[d].reshape(8, 32, 4, 8)
        sr_x, sr_y = self.sr[d][..., :4], self.sr[d][..., 4:]  # uint2 .x, .y
        odd = np.broadcast_to(g & 1, (8, 32))
        if bug == "no_pair_swap":
            odd = np.zeros_like(odd)
        perm = np.where(odd[..., None] == 1, [1, 0, 3, 2], [0, 1, 2, 3])  # swap_pairs
        wa = np.take_along_axis(wa, perm[..., None], axis=2)
        wb = np.take_along_axis(wb, perm[..., None], axis=2)
        byte_order = np.where(odd == 1, 0x2301, 0x3210)
        if bug == "scale_no_swap":
            byte_order = np.full_like(byte_order, 0x3210)
        s0 = byte_perm(sr_x, byte_order)  # RowScale s[j] = byte j
        s1 = byte_perm(sr_y, byte_order)
        dq = self.dq0 + buf * WG_DQ_BYTES
        row_g = (16 * warp + g) * 128
        for j in range(4):  # slot j holds word j ^ odd
            wa_j, wb_j = wa[:, :, j], wb[:, :, j]
            if e.fmt == "kbit4":  # WordDecoder: through the table (else the values as they are)
                wa_j, wb_j = self.kbit4_word(wa_j), self.kbit4_word(wb_j)
            f = [None] * 8  # raw_frags_of_word: f[2p] = pair p of row g, f[2p + 1] of row g + 8
            for p in range(4):
                f[2 * p] = wa_j[..., 2 * p:2 * p + 2]
                f[2 * p + 1] = wb_j[..., 2 * p:2 * p + 2]
            for p in range(8):  # frags_of_word: * (p & 1 ? b.s[j] : a.s[j])
                f[p] = f[p] * (s1 if p & 1 else s0)[..., j:j + 1]
            half = (j & 1) if bug == "dq_no_odd_swap" else ((j & 1) ^ odd)
            at = dq + (j >> 1) * (WG_BN * 128) + row_g + (((t + 4 * half) ^ g) << 4)
            self._store(at, np.concatenate([f[0], f[2], f[4], f[6]], axis=-1), "a DQ store")
            self._store(at + 1024, np.concatenate([f[1], f[3], f[5], f[7]], axis=-1), "a DQ store")
            ways = max(_phase_ways(at), _phase_ways(at + 1024))
            e.stats.dq_store_ways = max(e.stats.dq_store_ways, ways)

    def stage_load(self, slot: int, kq: int) -> None:
        """Every thread's cp.async of A (the activations: the wgmma's B) of step kq into slot."""
        e = self.em
        x = np.arange(THREADS)
        a_r, a_c = x >> 4, x & 15
        chunk = (a_c & 7) if e.bug == "a_no_swizzle" else ((a_c & 7) ^ (a_r & 7))
        a_dst = (a_c >> 3) * (self.BM * 128) + a_r * 128 + (chunk << 4)
        a_src = (self.m0 + a_r) * e.K + self.q0 * STEP_K + 8 * a_c  # element offsets
        sa = self.sa0 + slot * self.A_BYTES + a_dst
        xf = e.x.reshape(-1)
        for u in range(self.BM * 16 // THREADS):
            ok = self.m0 + a_r + 16 * u < e.M
            src = np.where(ok, a_src + 16 * u * e.K + kq * STEP_K, 0)[:, None] + np.arange(8)
            vals = np.where(ok[:, None], xf[src], 0.0)  # zero-filled past M
            dst = sa + u * 16 * 128
            self._store(dst, vals, "an A copy", pending=self.committed + 1)

    def cp_async_commit(self) -> None:
        self.committed += 1

    def cp_async_wait(self, n: int) -> None:
        """cp.async.wait_group n: every group but the newest n has landed."""
        done = self.committed - n  # groups 0 .. done - 1
        self.pending[(self.pending > 0) & (self.pending <= done)] = 0

    def _operands(self, da: int, db: int) -> tuple[np.ndarray, np.ndarray]:
        return operand_k16(self.smem, da, 64), operand_k16(self.smem, db, self.BM)

    def wgmma_issue(self, wg: int, da: int, db: int) -> None:
        """Wgmma<T, BM>::run(acc, da, db) of warpgroup wg: the model's operands must not lie
        under a pending copy nor touch the kbit4 table; they are kept to compare at the wait."""
        for desc, rows in ((da, 64), (db, self.BM)):
            self._access(operand_chunks(desc, rows), "a wgmma operand read")
        pend = self.pending.astype(np.float64)
        if operand_k16(pend, da, 64).any() or operand_k16(pend, db, self.BM).any():
            raise HazardError(f"wgmma of warpgroup {wg} reads an A slot still being copied")
        self.groups[wg][-1].append((da, db, self._operands(da, db)))
        self.em.stats.wgmmas += 1

    def wgmma_wait(self, wg: int, n: int) -> None:
        """wgmma.wait_group n of warpgroup wg: every group but the newest n completes; the model
        runs them now, on shared memory as it is at the wait, which must be as at the issue."""
        while len(self.groups[wg]) > n:
            for da, db, (a0, b0) in self.groups[wg].pop(0):
                a1, b1 = self._operands(da, db)
                self.em.stats.hazards_checked += 1
                if not (np.array_equal(a0, a1, equal_nan=True)
                        and np.array_equal(b0, b1, equal_nan=True)):
                    raise HazardError(f"shared memory under a pending wgmma group of warpgroup "
                                      f"{wg} changed before its wait")
                regs = wgmma_m64nNk16(self.smem, da, db, self.BM)  # [4, 32, BM / 2]
                # the asm's accumulator operands: KG_WG_D1(j) = d[j][0..3], operand 4j + e
                self.acc[4 * wg:4 * wg + 4] += regs.reshape(4, 32, self.BM // 8, 4)

    def step(self, kt: int, d: int, da0: list[int], db0: int, cp_wait: int) -> None:
        """Iteration kt of the main loop (ring slot d)."""
        D = self.D
        buf = kt % self.NDQ
        self.decode(d, buf)
        if kt + self.RING < self.n_k:
            self.load(d)
        for wg in (0, 1):
            self.wgmma_wait(wg, self.INFLIGHT)
        self.cp_async_wait(cp_wait)
        # fence.proxy.async + __syncthreads: the lock step already orders everything here
        slot = kt % self.STAGES
        for wg in (0, 1):
            da = (da0[wg] + ((buf * WG_DQ_BYTES) >> 4)) & MASK64
            db = (db0 + ((slot * self.A_BYTES) >> 4)) & MASK64
            self.groups[wg].append([])  # the group the commit below closes
            for s in range(8):
                ka = ((s >> 2) * (WG_BN * 128) + (s & 3) * 32) >> 4
                kb = ((s >> 2) * (self.BM * 128) + (s & 3) * 32) >> 4
                self.wgmma_issue(wg, (da + ka) & MASK64, (db + kb) & MASK64)
        if kt + D < self.n_k:
            self.stage_load((kt + D) % self.STAGES, kt + D)
        self.cp_async_commit()

    def run(self) -> np.ndarray:
        """The main loop (lock step) -> acc [8 warps, 32 lanes, BM / 8, 4]."""
        D, n_k, RING = self.D, self.n_k, self.RING
        for d in range(RING):
            if d < n_k:
                self.load(d)
        for s in range(D):
            if s < n_k:
                self.stage_load(s, s)
            self.cp_async_commit()
        if self.LUT_BYTES:
            self.fill_table()
        da0 = [wgmma_desc_k128(self.dq0 + wg * 64 * 128) for wg in (0, 1)]
        db0 = wgmma_desc_k128(self.sa0)
        cp_wait = D if self.em.bug == "cp_wait_short" else D - 1
        for kt0 in range(0, n_k, RING):
            for d in range(RING):
                kt = kt0 + d
                if kt < n_k:
                    self.step(kt, d, da0, db0, cp_wait)
        for wg in (0, 1):
            self.wgmma_wait(wg, 0)
        self.cp_async_wait(0)
        self.check_table("the end")
        return self.acc


@dataclass
class _Launch:
    """The launch as every CTA sees it (kernel arguments and template parameters)."""

    x: np.ndarray
    tiled: Tiled
    fmt: str
    M: int
    N: int
    K: int
    bm: int
    stages: int
    inflight: int
    ring: int
    sps: int
    bug: str | None
    smem_start: int
    stats: Stats
    codebook: np.ndarray | None  # kbit4: post, the codebook [16]
    access_checks: bool  # kbit4: accesses checked off the table (False: only its contents)


def emulate(wq: np.ndarray, scales: np.ndarray, x: np.ndarray, fmt: str = "nvfp4", bm: int = 128,
            stages: int = 4, inflight: int = 1, ring: int = 3, split: int = 1,
            arrangement: str = "tile_major", bug: str | None = None, smem_start: int = 16,
            codebook: np.ndarray | None = None,
            access_checks: bool = True) -> tuple[np.ndarray, Stats]:
    """C [M, N] = the kernel's fp32 sums (float64 here, before row factor, alpha and bias) of
    X [M, K] . (wq * group scales)^T, and what the mirror saw (Stats).

    wq [N, K]: the decoded weight values (as e2m1 codes decode: any float64 values here); for
    kbit4 the codes 0..15, each standing for codebook[code] (codebook [16]: the kernel's post);
    scales [N, K * SB / 128]: one value per group of 128 / SB (NVFP4: 16, MXFP4, KBIT4: 32) k.
    The grid is the plan's: (ceil(N / 128), ceil(M / BM), ceil(Q / sps)) with sps = ceil(Q /
    split). access_checks False leaves out the checks that no access touches the kbit4 table
    (its contents are still checked: the negative controls of both)."""
    assert bug is None or bug in BUGS, bug
    assert (bug or "").startswith("lut_") <= (fmt == "kbit4"), (bug, fmt)
    n, k = wq.shape
    m = x.shape[0]
    assert k % STEP_K == 0 and x.shape[1] == k and scales.shape == (n, k * SB[fmt] // STEP_K)
    if fmt == "kbit4":
        codebook = np.asarray(codebook, np.float64)
        assert codebook.shape == (16,) and np.isfinite(codebook).all(), codebook
    q = k // STEP_K
    sps = -(-q // split)
    splits = -(-q // sps)
    stats = Stats()
    em = _Launch(np.asarray(x, np.float64), tiled_values(wq, scales, fmt, arrangement),
                 fmt, m, n, k, bm, stages, inflight, ring, sps, bug, smem_start, stats, codebook,
                 access_checks)
    ws = np.full((splits, m, n), np.nan)  # the split-K workspace (or C itself, one split)
    written = np.zeros((splits, m, n), np.int64)
    lane = np.arange(32)[None, :, None, None]
    warp = np.arange(8)[:, None, None, None]
    j = np.arange(bm // 8)[None, None, :, None]
    e = np.arange(4)[None, None, None, :]
    g, t = lane >> 2, lane & 3
    for bz in range(splits):
        for by in range(-(-m // bm)):
            for bx in range(-(-n // WG_BN)):
                cta = _Cta(em, bx, by, bz)
                stats.sizes = {"TOTAL": cta.TOTAL, "DQ": cta.NDQ, "used": cta.used,
                               "lut": cta.lut - cta.smem_start if cta.LUT_BYTES else None}
                acc = cta.run()
                stats.ctas += 1
                # epilogue: acc[j][e] = C[m0 + 8j + 2t + e % 2, n0 + 16 warp + g + 8 (e / 2)]
                mm = np.broadcast_to(cta.m0 + 8 * j + 2 * t + (e & 1), acc.shape)
                nn = np.broadcast_to(cta.n0 + 16 * warp + g + 8 * (e >> 1), acc.shape)
                ok = (mm < m) & (nn < n)
                ws[bz, mm[ok], nn[ok]] = acc[ok]
                np.add.at(written[bz], (mm[ok], nn[ok]), 1)
    assert (written == 1).all(), "the epilogue stores every (m, n) once a split"
    return ws.sum(axis=0), stats  # split_finish: the partials added in split order
