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


def extreme_mx_weight(n: int, k: int, seed: int = 0):
    """MXFP4 (packed, row-major scales, W float64) whose rows defeat a naive relative scale
    s - rowmax + 127 (review B1): rows 3i hold an all-zero group (scale 0x00, as quantize_mx
    writes it) beside a group of scale 128 (amax in [8, 16): the naive byte is 0xFF, NaN); rows
    3i+1 a group of scale 0x01 with non-zero elements beside one of scale 130 (spread 129 > 127:
    the naive byte is 0xFE, 2^127); rows 3i+2 are ordinary."""
    from kernelgen.fp4_gemm import reference as GR

    assert k >= 128
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = rng.integers(120, 129, (n, k // 32), dtype=np.uint8)
    for r in range(n):
        g0, g1 = rng.choice(k // 32, 2, replace=False)
        if r % 3 == 0:
            scales[r, g0], scales[r, g1] = 0x00, 128
            codes[r, 32 * g0: 32 * g0 + 32] = 0
        elif r % 3 == 1:
            scales[r, g0], scales[r, g1] = 0x01, 130
            codes[r, 32 * g0: 32 * g0 + 32] |= 1  # no zero code: the group is not zero
    packed = MR.pack_fp4(codes)
    return packed, scales, GR.dequantize("mxfp4", packed, scales)
