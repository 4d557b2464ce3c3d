"""Test weights: quantized with the NumPy reference (kernelgen/mx/reference.py) and wrapped like
the MxTensor contract (notes: kernelgen/mx/tensor.py), uploaded with cupy.asarray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelgen.mx import reference as MR


@dataclass(frozen=True)
class FakeMxTensor:
    """The fields of kernelgen.mx.tensor.MxTensor that the FP4 GEMM reads."""

    fmt: str
    shape: tuple[int, int]
    data: Any
    scales: Any
    scale_layout: str
    global_scale: Any


def mx_tensor_class():
    try:
        from kernelgen.mx.tensor import MxTensor
    except ImportError:
        return FakeMxTensor
    return MxTensor


def host_weight(fmt: str, n: int, k: int, layout: str = "row_major", seed: int = 0):
    """(packed, scales, global scale or None, W float64 as the format decodes it)."""
    from kernelgen.fp4_gemm import reference as GR

    rng = np.random.default_rng(seed + n + 7 * k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 3.0, (n, 1))).astype(np.float32)
    if fmt == "nvfp4":
        packed, scales, gs = MR.quantize_nvfp4(w, scale_layout=layout)
    else:
        packed, scales = MR.quantize_mx(w, "mxfp4", scale_layout=layout)
        gs = None
    return packed, scales, gs, GR.dequantize(fmt, packed, scales, gs)


def device_weight(fmt: str, n: int, k: int, layout: str = "row_major", seed: int = 0, xp=None):
    """(MxTensor-like on the GPU, W float64). xp: cupy (default) or a torch-like uploader."""
    import cupy

    packed, scales, gs, w64 = host_weight(fmt, n, k, layout, seed)
    up = xp or cupy.asarray
    cls = mx_tensor_class()
    t = cls(fmt=fmt, shape=(n, k), data=up(packed), scales=up(scales), scale_layout=layout,
            global_scale=None if gs is None else up(np.array([gs], np.float32)))
    return t, w64
