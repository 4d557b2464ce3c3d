"""NumPy reference of the kbit GEMM: dequantize W with the E4M4 scales (exactly what the kernel
uses), then C = A . W^T (+ bias) in float64. bf16 arrays are uint16 bit patterns."""

from __future__ import annotations

import numpy as np

from ..kbit import reference as R

# ||C - C_ref|| / ||C_ref|| bounds of the kernel's output: fp16 / bf16 operands of the mma
# (codebook values rounded to the dtype) and the final rounding of C.
REL_ERROR_BOUND = {"float16": 2e-3, "bfloat16": 8e-3}


def dequantize_weight(packed: np.ndarray, absmax: np.ndarray, codebook: np.ndarray, bits: int,
                      n: int, k: int) -> np.ndarray:
    """W [n, k] float64 from the flat layout (absmax: E4M4 bytes, fp16 or fp32)."""
    idx = R.unpack_indices(packed, bits)[: n * k // R.BLOCK]
    vals = codebook.astype(np.float64)[idx] * R.absmax_to_f32(absmax).astype(np.float64)[: idx.shape[0], None]
    return vals.reshape(n, k)


def gemm(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, dtype: str = "float16") -> np.ndarray:
    """C = A . W^T + bias in float64. a: [..., K] in `dtype` (bf16 as uint16), w: [N, K] float64."""
    a64 = R.to_f32(np.asarray(a), dtype).astype(np.float64)
    c = a64.reshape(-1, a64.shape[-1]) @ np.asarray(w, np.float64).T
    if bias is not None:
        c = c + R.to_f32(np.asarray(bias), dtype).astype(np.float64)[None, :]
    return c.reshape(*a64.shape[:-1], w.shape[0])


def to_float64(c: np.ndarray, dtype: str) -> np.ndarray:
    return R.to_f32(np.asarray(c), dtype).astype(np.float64)


def rel_error(c: np.ndarray, c_ref: np.ndarray) -> float:
    """||c - c_ref|| / ||c_ref|| (Frobenius); NaN anywhere gives NaN (which fails any bound)."""
    c, c_ref = np.asarray(c, np.float64), np.asarray(c_ref, np.float64)
    return float(np.linalg.norm(c - c_ref) / max(np.linalg.norm(c_ref), 1e-300))
