"""NumPy reference of the FP4-weight GEMM: dequantize W with kernelgen/mx/reference.py (float64
of the exact fp32 values), then D = alpha * A . W^T (+ bias) in float64. bf16 arrays are uint16
bit patterns."""

from __future__ import annotations

import numpy as np

from ..kbit.reference import bf16_to_f32
from ..mx import reference as MR

# ||D - D_ref|| / ||D_ref|| bounds of the kernel's output: the weight products are exact (e2m1 x
# group scale fits fp16 / bf16), so what remains is fp32 accumulation order and the rounding
# of D to fp16 / bf16 (2^-11 / 2^-8 relative, per element).
REL_ERROR_BOUND = {"float16": 2e-3, "bfloat16": 8e-3}


def dequantize(fmt: str, data: np.ndarray, scales: np.ndarray, global_scale: float | None = None
               ) -> np.ndarray:
    """W [N, K] float64 from packed bytes [N, K/2] and scales (row-major or swizzled)."""
    if fmt == "nvfp4":
        return MR.dequantize_nvfp4(data, scales, np.float32(global_scale)).astype(np.float64)
    if fmt == "mxfp4":
        return MR.dequantize_mx(data, scales, "mxfp4").astype(np.float64)
    raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {fmt!r}")


def to_float64(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x)
    return (bf16_to_f32(x) if dtype == "bfloat16" else x.astype(np.float32)).astype(np.float64)


def gemm(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, alpha: float = 1.0,
         dtype: str = "float16") -> np.ndarray:
    """alpha * A . W^T + bias in float64. a: [..., K] in `dtype` (bf16 as uint16), w: [N, K]."""
    a64 = to_float64(a, dtype)
    d = float(np.float32(alpha)) * (a64.reshape(-1, a64.shape[-1]) @ np.asarray(w, np.float64).T)
    if bias is not None:
        d = d + to_float64(bias, dtype)[None, :]
    return d.reshape(*a64.shape[:-1], w.shape[0])


def rel_error(d: np.ndarray, d_ref: np.ndarray) -> float:
    """||d - d_ref|| / ||d_ref|| (Frobenius); NaN anywhere gives NaN (which fails any bound)."""
    d, d_ref = np.asarray(d, np.float64), np.asarray(d_ref, np.float64)
    return float(np.linalg.norm(d - d_ref) / max(np.linalg.norm(d_ref), 1e-300))


def prepare_scales_mx(scales_rm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What prepare_weight computes for MXFP4 (row-major E8M0 [N, S]): relative bytes
    s' = max(s - rowmax + 127, 0) (0xFF stays NaN) and the fp32 row factors 2^(rowmax - 127),
    NaN for a row with a NaN group (the kernels then need no NaN case in their scale decode).
    s' = 0 is a flushed group (the kernels decode it as 0): a group more than 2^127 below its
    row's largest, e.g. an all-zero group (scale 0x00) beside one of amax >= 8."""
    s = np.asarray(scales_rm, np.int32)
    finite = np.where(s == MR.E8M0_NAN, 0, s)
    rowmax = finite.max(axis=1, keepdims=True)
    rel = np.where(s == MR.E8M0_NAN, MR.E8M0_NAN, np.clip(s - rowmax + 127, 0, 254)).astype(np.uint8)
    post = np.ldexp(np.float32(1.0), (rowmax[:, 0] - 127)).astype(np.float32)
    return rel, np.where((s == MR.E8M0_NAN).any(axis=1), np.float32(np.nan), post).astype(np.float32)
