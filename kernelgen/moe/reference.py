"""NumPy reference of the MoE grouped GEMM (plain and with the fused SwiGLU) and of the whole
MoE layer. bf16 arrays are uint16 bit patterns; results are float64.

Definitions the kernels follow:
- offsets [E + 1]: expert e owns rows [offsets[e], offsets[e+1]) of X and Y; rows outside
  every segment are not written.
- W13 [E, 2I, H]: rows [0, I) are the gate projection, rows [I, 2I) the up projection (the usual
  concatenation); swiglu(g, u) = silu(g) * u = g / (1 + exp(-g)) * u.
- The layer: out[t] = sum_j topk_weights[t, j] * W2[e] . swiglu(W13[e] . x[t]), e = topk_ids[t, j]
  (a token naming an expert twice counts it twice); the kernels round the [M, I] intermediate
  and the [M, H] expert outputs to the activation dtype, which `round_intermediate` mirrors.
"""

from __future__ import annotations

import numpy as np

from ..kbit import reference as R

# ||Y - Y_ref|| / ||Y_ref|| bounds: fp16 / bf16 operands, fp32 accumulation, Y rounded once.
REL_ERROR_BOUND = {"float16": 2e-3, "bfloat16": 8e-3}
# the whole layer: two GEMMs, the rounded intermediate, the combine
LAYER_REL_ERROR_BOUND = {"float16": 4e-3, "bfloat16": 1.6e-2}


def to_float64(a: np.ndarray, dtype: str) -> np.ndarray:
    return R.to_f32(np.asarray(a), dtype).astype(np.float64)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """float64 -> the dtype's value (RNE) -> float64."""
    return to_float64(R.from_f32(np.asarray(a, np.float32), dtype), dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def grouped_gemm(x: np.ndarray, w: np.ndarray, offsets: np.ndarray,
                 activation: str | None = None) -> np.ndarray:
    """Y [M, N] (or [M, N/2] with activation="swiglu"); x [M, K], w [E, N, K] as float64.
    Rows outside every segment are NaN (the kernel leaves them unwritten)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    offsets = np.asarray(offsets, np.int64)
    e_count, n, _ = w.shape
    y = np.full((x.shape[0], n // 2 if activation == "swiglu" else n), np.nan)
    for e in range(e_count):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        ye = x[lo:hi] @ w[e].T
        if activation == "swiglu":
            ye = silu(ye[:, : n // 2]) * ye[:, n // 2:]
        y[lo:hi] = ye
    return y


def layout(topk_ids: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [E+1], dest [T*top_k]): stable expert order, flat index t*top_k + j."""
    flat = np.asarray(topk_ids, np.int64).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(f"topk_ids: ids must lie in [0, {num_experts})")
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    dest = np.empty(flat.size, np.int64)
    dest[order] = np.arange(flat.size)
    return offsets, dest


def fused_moe(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray, w13: np.ndarray,
              w2: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """The layer in float64 on float64 inputs; with `dtype`, the intermediate [M, I] and the
    expert outputs [M, H] are rounded to it as the kernels do (round_intermediate)."""
    x = np.asarray(x, np.float64)
    t, _ = x.shape
    top_k = topk_ids.shape[1] if t else 1
    offsets, dest = layout(topk_ids, w13.shape[0])
    x_perm = np.empty((t * top_k, x.shape[1]))
    x_perm[dest] = np.repeat(x, top_k, axis=0)
    h = grouped_gemm(x_perm, w13, offsets, "swiglu")
    if dtype is not None:
        h = round_to(h, dtype)
    y = grouped_gemm(h, w2, offsets)
    if dtype is not None:
        y = round_to(y, dtype)
    wts = np.asarray(topk_weights, np.float64).reshape(-1)
    out = (y[dest] * wts[:, None]).reshape(t, top_k, y.shape[1]).sum(axis=1)
    return out


def rel_error(c: np.ndarray, c_ref: np.ndarray) -> float:
    """||c - c_ref|| / ||c_ref|| (Frobenius); NaN anywhere gives NaN (fails any bound)."""
    c, c_ref = np.asarray(c, np.float64), np.asarray(c_ref, np.float64)
    return float(np.linalg.norm(c - c_ref) / max(np.linalg.norm(c_ref), 1e-300))


def dequantize_experts(packed: np.ndarray, absmax: np.ndarray, codebook: np.ndarray, bits: int,
                       shape: tuple[int, int, int]) -> np.ndarray:
    """W [E, N, K] float64 from the flat kbit layout (absmax: E4M4 bytes), as the kernel sees it
    before its own rounding: codebook[index] * scale."""
    e, n, k = shape
    idx = R.unpack_indices(packed, bits)[: e * n * k // R.BLOCK]
    scale = R.absmax_to_f32(absmax).astype(np.float64)[: idx.shape[0], None]
    return (np.asarray(codebook, np.float64)[idx] * scale).reshape(e, n, k)
