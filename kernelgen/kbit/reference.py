"""NumPy references of the kbit format. These *define* the format: the kernels agree with them
bit for bit (packed planes, E4M4 bytes, dequantized values).

bf16 arrays are uint16 arrays of bf16 bit patterns (NumPy has no bfloat16).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

BLOCK = 32


# -- codebook -----------------------------------------------------------------------------------
@functools.cache
def _nf_codebook(bits: int) -> tuple[float, ...]:
    """2^bits levels at E[Z | Z in bin] for 2^bits equiprobable bins of N(0,1), scaled to [-1, 1]."""
    levels = 1 << bits
    nd = NormalDist()
    edges = [-math.inf] + [nd.inv_cdf(i / levels) for i in range(1, levels)] + [math.inf]

    def pdf(z: float) -> float:
        return 0.0 if math.isinf(z) else math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

    # E[Z | a < Z < b] = (pdf(a) - pdf(b)) / P(a < Z < b), and P = 1/levels for every bin.
    means = [(pdf(a) - pdf(b)) * levels for a, b in zip(edges[:-1], edges[1:], strict=True)]
    top = max(abs(m) for m in means)
    return tuple(m / top for m in means)


def create_normal_float_codebook(bits: int) -> np.ndarray:
    if bits not in (2, 3, 4, 5):
        raise ValueError(f"bits={bits}: kbit supports bits in 2..5")
    return np.array(_nf_codebook(bits), dtype=np.float32)


def midpoints(codebook: np.ndarray) -> np.ndarray:
    cb = codebook.astype(np.float32)
    return ((cb[:-1] + cb[1:]) * np.float32(0.5)).astype(np.float32)


# -- bf16 bits -----------------------------------------------------------------------------------
def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, NaN kept NaN (as __float2bfloat16_rn)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)


def to_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_f32(x) if dtype == "bfloat16" else np.asarray(x).astype(np.float32)


def from_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return f32_to_bf16(x)
    return x.astype(np.dtype(dtype))


# -- E4M4 --------------------------------------------------------------------------------------
def e4m4_decode(raw: np.ndarray) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.uint8).astype(np.uint32)
    e, m = raw >> 4, raw & 15
    normal = ((e - 11 + 127) << 23 | (m << 19)).astype(np.uint32).view(np.float32)
    sub = m.astype(np.float32) * np.float32(1.0 / 16384.0)
    return np.where(e == 0, sub, normal).astype(np.float32)


def e4m4_encode(x: np.ndarray) -> np.ndarray:
    """Round to nearest even; saturate at 31; zero, negative and NaN -> 0."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.int64)
    e = ((b >> 23) & 0xFF) - 127 + 11
    v = (np.clip(e, 0, None) << 23) | (b & 0x7FFFFF)
    normal = np.minimum((v + 0x3FFFF + ((v >> 19) & 1)) >> 19, 0xFF)
    with np.errstate(over="ignore", invalid="ignore"):
        sub = np.rint(x * np.float32(16384.0))
    sub = np.nan_to_num(sub, nan=0.0, posinf=0.0, neginf=0.0).astype(np.int64)
    out = np.where(e >= 1, normal, sub)
    out = np.where(x >= np.float32(31.0), 0xFF, out)
    out = np.where(x > 0, out, 0)  # zero, negative, NaN
    return out.astype(np.uint8)


# -- quantize / dequantize -----------------------------------------------------------------------
def quantize(x: np.ndarray, bits: int, codebook: np.ndarray, dtype: str | None = None):
    """x (any shape; bf16 as uint16 bits with dtype='bfloat16') -> (packed u32 [nb*bits],
    absmax f32 [nb], absmax E4M4 u8 [nb])."""
    dtype = dtype or np.asarray(x).dtype.name
    v = to_f32(np.asarray(x).reshape(-1), dtype)
    n = v.size
    nb = -(-n // BLOCK)
    blocks = np.zeros(nb * BLOCK, np.float32)
    blocks[:n] = v
    blocks = blocks.reshape(nb, BLOCK)
    amax = np.fmax.reduce(np.abs(blocks), axis=1).astype(np.float32)  # NaN-dropping like fmaxf
    # Normalized value: one fp32 reciprocal per block (round to nearest), then one fp32 multiply
    # per element (round to nearest): q = RN(x * RN(1 / max(amax, 1e-8))). Within 1 ulp of
    # x / amax; the index is the count of midpoints strictly below q (ties low, NaN -> 0).
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        recip = (np.float32(1.0) / np.fmax(amax, np.float32(1e-8))).astype(np.float32)
        q = (blocks * recip[:, None]).astype(np.float32)
    idx = np.searchsorted(midpoints(codebook), q, side="left").astype(np.uint32)
    idx[np.isnan(q)] = 0
    lanes = np.arange(BLOCK, dtype=np.uint64)
    packed = np.empty((nb, bits), np.uint32)
    for b in range(bits):
        packed[:, b] = (((idx >> b) & 1).astype(np.uint64) << lanes).sum(axis=1).astype(np.uint32)
    return packed.reshape(-1), amax, e4m4_encode(amax)


def unpack_indices(packed: np.ndarray, bits: int) -> np.ndarray:
    """packed [nb*bits] -> indices [nb, 32]."""
    planes = np.asarray(packed, np.uint32).reshape(-1, bits)
    lanes = np.arange(BLOCK, dtype=np.uint32)
    idx = np.zeros((planes.shape[0], BLOCK), np.uint32)
    for b in range(bits):
        idx |= ((planes[:, b : b + 1] >> lanes) & 1) << b
    return idx


def absmax_to_f32(absmax: np.ndarray) -> np.ndarray:
    a = np.asarray(absmax)
    return e4m4_decode(a) if a.dtype == np.uint8 else a.astype(np.float32)


def dequantize(packed: np.ndarray, absmax: np.ndarray, codebook: np.ndarray, bits: int, n: int,
               dtype: str = "float32") -> np.ndarray:
    """-> [n] in `dtype` (bf16 as uint16 bits). absmax: E4M4 u8, fp16 or fp32."""
    idx = unpack_indices(packed, bits)
    vals = codebook.astype(np.float32)[idx] * absmax_to_f32(absmax)[:, None]
    return from_f32(vals.reshape(-1)[:n].astype(np.float32), dtype)


def repack(packed: np.ndarray, absmax: np.ndarray, n_rows: int, k: int, bits: int,
           tile_n: int, tile_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat layout of W [N, K] -> [K/tile_k][N/tile_n][tile_n][tile_k/32][bits] (+ absmax)."""
    kb = tile_k // BLOCK
    p = np.asarray(packed).reshape(n_rows // tile_n, tile_n, k // tile_k, kb, bits)
    a = np.asarray(absmax).reshape(n_rows // tile_n, tile_n, k // tile_k, kb)
    # (n_tile, col, k_tile, kb, bit) -> (k_tile, n_tile, col, kb, bit)
    return (np.ascontiguousarray(p.transpose(2, 0, 1, 3, 4)).reshape(-1),
            np.ascontiguousarray(a.transpose(2, 0, 1, 3)).reshape(-1))


def error_bound(codebook: np.ndarray, absmax: np.ndarray) -> np.ndarray:
    """Per-block max |dequant - x| of seed §12: (max_gap/2 + 1/16) * absmax + 1e-6."""
    gap = float(np.max(np.diff(np.sort(codebook.astype(np.float64)))))
    return (gap / 2 + 1 / 16) * np.asarray(absmax, np.float64) + 1e-6


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(10 * np.log10(np.sum(x * x) / np.sum((x - y.astype(np.float64)) ** 2)))
