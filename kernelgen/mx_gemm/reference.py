"""NumPy reference of mx_gemm: dequantize both operands exactly (kernelgen/mx/reference.py),
then D = alpha * A . B^T (+ bias) in float64."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kbit.reference import from_f32, to_f32
from ..mx import reference as R

# ||D - D_ref|| / ||D_ref|| bounds of the kernels' output: fp32 accumulation (per 32-wide
# k-block inside the tensor core, then scaled into fp32) and the final rounding of D.
REL_ERROR_BOUND = {"float16": 2e-3, "bfloat16": 8e-3}


@dataclass(frozen=True)
class HostMx:
    """The fields of kernelgen.mx.tensor.MxTensor, holding NumPy (or device) arrays."""

    fmt: str
    shape: tuple[int, int]
    data: Any
    scales: Any
    scale_layout: str = "swizzled"
    global_scale: Any = None


def quantize(x: np.ndarray, fmt: str, scale_layout: str = "swizzled") -> HostMx:
    """float32 [rows, K] -> HostMx by the format's NumPy reference quantizer."""
    x = np.ascontiguousarray(x, np.float32)
    if fmt == "nvfp4":
        data, scales, gs = R.quantize_nvfp4(x, scale_layout=scale_layout)
        return HostMx(fmt, x.shape, data, scales, scale_layout, np.array([gs], np.float32))
    data, scales = R.quantize_mx(x, fmt, scale_layout=scale_layout)
    return HostMx(fmt, x.shape, data, scales, scale_layout)


def upload(h: HostMx, xp: Any) -> Any:
    """The same operand on the device (`xp`: cupy, or a function numpy -> device array): an
    MxTensor when kernelgen.mx.tensor exists, else a HostMx of device arrays."""
    put = xp.asarray if hasattr(xp, "asarray") else xp
    gs = None if h.global_scale is None else put(h.global_scale)
    fields = dict(fmt=h.fmt, shape=tuple(h.shape), data=put(h.data), scales=put(h.scales),
                  scale_layout=h.scale_layout, global_scale=gs)
    try:
        from ..mx.tensor import MxTensor
    except ImportError:
        return HostMx(**fields)
    return MxTensor(**fields)


def dequantize(x: Any) -> np.ndarray:
    """An MxTensor-like object holding NumPy arrays -> its values, float64 [rows, K]."""
    if x.fmt == "nvfp4":
        v = R.dequantize_nvfp4(x.data, x.scales, float(np.asarray(x.global_scale).reshape(-1)[0]))
    else:
        v = R.dequantize_mx(x.data, x.scales, x.fmt)
    return np.asarray(v, np.float64)


def mx_gemm(a: Any, b: Any, bias: np.ndarray | None = None, alpha: float = 1.0,
            out_dtype: str = "bfloat16") -> np.ndarray:
    """float64 D [M, N]; bias in out_dtype (bf16 as uint16 bits)."""
    d = float(np.float32(alpha)) * (dequantize(a) @ dequantize(b).T)
    if bias is not None:
        d = d + to_f32(np.asarray(bias), out_dtype).astype(np.float64)[None, :]
    return d


def round_output(d: np.ndarray, out_dtype: str) -> np.ndarray:
    return from_f32(np.asarray(d, np.float32), out_dtype)


def to_float64(d: np.ndarray, out_dtype: str) -> np.ndarray:
    return to_f32(np.asarray(d), out_dtype).astype(np.float64)


def rel_error(d: np.ndarray, d_ref: np.ndarray) -> float:
    """||d - d_ref|| / ||d_ref|| (Frobenius); NaN anywhere gives NaN (fails any bound)."""
    d, d_ref = np.asarray(d, np.float64), np.asarray(d_ref, np.float64)
    return float(np.linalg.norm(d - d_ref) / max(np.linalg.norm(d_ref), 1e-300))
