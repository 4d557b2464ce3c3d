"""The tiled weight layout both FP4 GEMM kernels read (built once by prepare_weight).

For each tile of 16 rows and each step of 128 k, the 1 KB of packed weights and the 16 x SB
scale bytes (SB = 8 for NVFP4, 4 for MXFP4) are contiguous, ordered the way the lanes of a warp
read them (lane (g, t) = (lane / 4, lane % 4) takes the 16-byte chunk t of rows g and g+8, whose
4-byte word j holds the elements 32j + 8t .. 32j + 8t + 7 of the step: "k-interleaved", so that
the four lanes of a row read the matching activations, A[k0 + 32j + 8t ..], as 64 contiguous
bytes, and word j of every lane lies in the 32-k span 32j .. 32j + 31):

    data   [T, Q, 2 (h), 8 (g), 4 (t), 4 (j), 4]   row = 16 * tile + 8h + g,
                                                  byte = 64q + 16j + 4t + i (as [.., 4, 16])
    scales [T, Q, 8 (g), P, 2 (h), 4 (j)]          scale column = q * SB + P * j + p

where P = SB / 4 (NVFP4: 2, p = t / 2, as word j of lane t lies in the group of 16 number
2j + t / 2; MXFP4: 1, word j in group j). A lane's scales of its words 0..3 in rows g and g+8
are one 8-byte word, at (P * g + p) * 8 of the block.

T = ceil(N / 16) (rows past N are zero), Q = K / 128. A warp's weight load then covers 512
contiguous bytes and consecutive steps follow each other in memory, like a streaming copy. The
bits of each 4-byte word of the data (8 elements of consecutive k) are then permuted / XORed
(ENCODE, below, for the activation type fp16 or bf16) so that the kernels decode them with a
shift and a mask per element pair.
Written for any array module with reshape / transpose (NumPy in the tests, CuPy in the API).
"""

from __future__ import annotations

from typing import Any

TILE_ROWS = 16
STEP_K = 128


def _pad_rows(xp: Any, a: Any, rows: int) -> Any:
    if a.shape[0] == rows:
        return a
    pad = xp.zeros((rows - a.shape[0], a.shape[1]), dtype=a.dtype)
    return xp.concatenate([a, pad], axis=0)


def tile_data(xp: Any, data: Any, n: int, k: int, enc: str | None = "float16") -> Any:
    """Packed 4-bit bytes [N, K/2] -> [T, Q, 2, 8, 4, 16] (chunk t of a row's step: words j of
    elements 32j + 8t ..), each 4-byte word bit-encoded for the activation type `enc` (ENCODE
    below; None: left plain, as kbit4 codes are read): a new C-contiguous array (never a view
    of `data`, so the result outlives it)."""
    t, q = -(-n // TILE_ROWS), k // STEP_K
    d = _pad_rows(xp, data, t * TILE_ROWS).reshape(t, 2, 8, q, 4, 4, 4)  # [.., q, j, t, byte]
    out = xp.empty((t, q, 2, 8, 4, 16), dtype=xp.uint8)  # a new array, the owner of its memory
    out.reshape(t, q, 2, 8, 4, 4, 4)[...] = d.transpose(0, 3, 1, 2, 5, 4, 6)
    d = out
    if enc is None:
        return d
    words = d.reshape(-1).view(xp.uint32)  # little-endian: element i of a word in bits 4i..4i+3
    words[...] = encode_words(xp, words, enc)  # in place: d stays the owner of its memory
    return d


def tile_scales(xp: Any, scales: Any, n: int, k: int, sb: int) -> Any:
    """Row-major scale bytes [N, K * sb / 128] -> [T, Q, 8, sb / 4, 2, 4]: a new C-contiguous
    array (never a view of `scales`)."""
    t, q = -(-n // TILE_ROWS), k // STEP_K
    s = _pad_rows(xp, scales, t * TILE_ROWS).reshape(t, 2, 8, q, 4, sb // 4)  # [.., q, j, p]
    return s.transpose(0, 3, 2, 5, 1, 4).copy()


# -- block order and where the scales go ---------------------------------------------------------
# The (tile, step) blocks above can be stored in four arrangements; the kernels take the byte
# strides of a block along tiles and steps (for W and for S) as launch arguments, so all read
# the same way:
#   tile_major          data [T, Q, 1 KB], scales [T, Q, 16 SB] (a warp's steps are adjacent)
#   step_major          data [Q, T, 1 KB], scales [Q, T, 16 SB] (a step of every tile is adjacent:
#                       warps at the same step read neighbouring blocks, like one streaming copy)
#   *_inline            one array [T, Q | Q, T, 1 KB + 16 SB]: each block's scales follow its
#                       1 KB (one contiguous stream a warp); `scales` is a view of its tail
ARRANGEMENTS = ("tile_major", "step_major", "tile_major_inline", "step_major_inline")


def arrange(xp: Any, td: Any, ts: Any, arrangement: str) -> tuple[Any, Any]:
    """(data, scales) of an arrangement from tile_data / tile_scales (tile-major) results."""
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement {arrangement!r}: expected one of {ARRANGEMENTS}")
    t, q = td.shape[:2]
    if arrangement.startswith("step"):
        td, ts = td.transpose(1, 0, 2, 3, 4, 5), ts.transpose(1, 0, 2, 3, 4, 5)
    if not arrangement.endswith("inline"):
        return xp.ascontiguousarray(td), xp.ascontiguousarray(ts)
    a0, a1 = td.shape[:2]
    ssz = ts[0, 0].size
    buf = xp.empty((a0, a1, 1024 + ssz), dtype=xp.uint8)
    buf[:, :, :1024] = td.reshape(a0, a1, 1024)
    buf[:, :, 1024:] = ts.reshape(a0, a1, ssz)
    return buf, buf[:, :, 1024:]


def arranged_shapes(arrangement: str, t: int, q: int, sb: int) -> tuple[tuple, tuple]:
    """Shapes of (data, scales) of an arrangement for T tiles, Q steps, SB scale bytes a row."""
    a0, a1 = (q, t) if arrangement.startswith("step") else (t, q)
    if arrangement.endswith("inline"):
        return (a0, a1, 1024 + 16 * sb), (a0, a1, 16 * sb)
    return (a0, a1, 2, 8, 4, 16), (a0, a1, 8, sb // 4, 2, 4)


def block_strides(arrangement: str, data: Any, scales: Any) -> tuple[int, int, int, int]:
    """Byte strides of a block (W along tiles, W along steps, S along tiles, S along steps)."""
    wd, sd = data.strides, scales.strides
    if arrangement.startswith("step"):
        return wd[1], wd[0], sd[1], sd[0]
    return wd[0], wd[1], sd[0], sd[1]


def canonical(arrangement: str, data: Any, scales: Any, sb: int) -> tuple[Any, Any]:
    """Views [T, Q, 2, 8, 4, 16] / [T, Q, 8, SB/4, 2, 4] of any arrangement (for the tests)."""
    if arrangement.endswith("inline"):
        a0, a1 = data.shape[:2]
        data = data[:, :, :1024].reshape(a0, a1, 2, 8, 4, 16)
        scales = scales.reshape(a0, a1, 8, sb // 4, 2, 4)
    if arrangement.startswith("step"):
        data, scales = data.transpose(1, 0, 2, 3, 4, 5), scales.transpose(1, 0, 2, 3, 4, 5)
    return data, scales


# -- bit encoding of the weight words ------------------------------------------------------------
# The kernels decode a 32-bit word q (8 elements of one row, consecutive k) into the four T pairs
# of (elements 0,1), (2,3), (4,5), (6,7) with shifts and masks only (fp4.cuh e2m1_word). The
# words are encoded for the activation type (ENCODINGS): for fp16
#     o0 = q & MASK            o1 = rotl(q, 13) & MASK
#     o2 = (q<<4 ^ q<<7) & MASK   o3 = (q<<4 ^ q<<9) & MASK,   MASK = 0x8E008E00
# each half of o_i being the fp16 bits of e2m1 * 2^-14 (sign at bit 15, e1 e0 m at bits 11..9;
# code 1 = 0.5 is the subnormal 2^-15); for bf16
#     o0 = q & MASK            o1 = rotl(q, 12) & MASK
#     o2 = (rotl(q, 8) ^ q<<2) & MASK   o3 = (rotl(q, 8) ^ q<<6) & MASK,   MASK = 0x81C081C0
# each half the bf16 bits of e2m1 * 2^-126 (e1 e0 m at bits 8..6). Either decode is GF(2)-linear
# in q and invertible, so the stored word is q = ENCODE(w) of the plain word w (element i in bits
# 4i..4i+3, as MxTensor packs two elements a byte, low nibble first). A kernel may read words
# encoded for the other type (a shift and a LOP3 a pair more).
E2M1_MASK = 0x8E008E00
E2M1_MASK_BF16 = 0x81C081C0
# per encoding: MASK's bits (e2m1 bits 0..2 and 3 of each half), the rotation of o1, and the
# (kind, amount) terms of o2 and o3 ("s": shift left, "r": rotate left)
ENCODINGS = {
    "float16": ((9, 10, 11, 15, 25, 26, 27, 31), 13, (("s", 4), ("s", 7)), (("s", 4), ("s", 9))),
    "bfloat16": ((6, 7, 8, 15, 22, 23, 24, 31), 12, (("r", 8), ("s", 2)), (("r", 8), ("s", 6))),
}


def _decode_rows(enc: str) -> list[int]:
    """The 32 output bits (o_i at the mask bits, i-major) as masks of the stored word's bits
    they XOR."""
    bits, rot1, t2, t3 = ENCODINGS[enc]

    def term(kind, r, p):
        if kind == "r":
            return 1 << ((p - r) % 32)
        return 1 << (p - r) if p >= r else 0
    rows = [1 << p for p in bits]
    rows += [1 << ((p - rot1) % 32) for p in bits]
    for t in (t2, t3):
        rows += [term(*t[0], p) ^ term(*t[1], p) for p in bits]
    return rows


def _invert(rows: list[int]) -> list[int]:
    """Inverse over GF(2) of the 32 x 32 bit matrix with the given rows (row i = a mask)."""
    n = len(rows)
    a = [(rows[i], 1 << i) for i in range(n)]
    for col in range(n):
        piv = next(i for i in range(col, n) if a[i][0] >> col & 1)
        a[col], a[piv] = a[piv], a[col]
        for i in range(n):
            if i != col and a[i][0] >> col & 1:
                a[i] = (a[i][0] ^ a[col][0], a[i][1] ^ a[col][1])
    return [a[i][1] for i in range(n)]  # row i: which output bits XOR into stored bit i


def _encode_columns(enc: str) -> tuple[int, ...]:
    """ENCODE as 32 masks: bit x of the plain word contributes column x to the stored word."""
    inv = _invert(_decode_rows(enc))
    cols = []
    for x in range(32):
        e, b = x // 4, x % 4  # element e, bit b (3 = sign)
        out = 8 * (e // 2) + (3 if b == 3 else b) + 4 * (e % 2)  # its output bit (index into rows)
        cols.append(sum(1 << i for i in range(32) if inv[i] >> out & 1))
    return tuple(cols)


ENCODE = {enc: _encode_columns(enc) for enc in ENCODINGS}


def encode_words(xp: Any, w: Any, enc: str = "float16") -> Any:
    """Plain uint32 words -> the stored words the kernels decode, encoded for `enc` (a new
    array)."""
    q = xp.zeros(w.shape, dtype=xp.uint32)
    for x, col in enumerate(ENCODE[enc]):
        q ^= ((w >> xp.uint32(x)) & xp.uint32(1)) * xp.uint32(col)
    return q


def decode_word(q: int, enc: str = "float16") -> list[int]:
    """fp4.cuh e2m1_word for words encoded for `enc`, decoded for that type: a stored word ->
    the four 32-bit pairs (fp16 or bf16 bits; for the tests)."""
    q &= 0xFFFFFFFF

    def rotl(r):
        return ((q << r) | (q >> (32 - r))) & 0xFFFFFFFF
    if enc == "float16":
        s4 = (q << 4) & 0xFFFFFFFF
        return [q & E2M1_MASK, rotl(13) & E2M1_MASK, (s4 ^ (q << 7)) & E2M1_MASK,
                (s4 ^ (q << 9)) & E2M1_MASK]
    r8, m = rotl(8), E2M1_MASK_BF16
    return [q & m, rotl(12) & m, (r8 ^ (q << 2)) & m, (r8 ^ (q << 6)) & m]
