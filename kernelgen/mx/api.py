"""Public mx API: quantize to NVFP4 / MXFP4 / MXFP6 / MXFP8 and dequantize. CuPy or torch."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ..arch import device_info
from ..core import fastcall
from ..core.interop import Ctx, context_of, device_array, dtype_name, on_stream
from ..core.jit import get_kernel
from .config import FLOAT_DTYPES, lane_elems
from .select import dequantize_plan, quantize_plan
from .tensor import (
    FORMATS,
    MX_FORMATS,
    SCALE_LAYOUTS,
    MxTensor,
    data_shape,
    elem_bits,
    group_size,
    scale_shape,
)


def _input(x: Any, dtype: str | None, fmt: str) -> tuple[Ctx, Any, str, int, int]:
    """(ctx, cupy view, logical dtype, rows, K) of an [..., K] input, checked; rows may be 0."""
    ctx = context_of(x, "x")
    dtype = dtype_name(dtype)
    xa, dt = device_array(x, "x", ctx, FLOAT_DTYPES, hint=dtype)
    if dtype is not None and dtype != dt:
        raise ValueError(f"x: dtype={dtype!r} given for an array of {dt}")
    if xa.ndim < 1:
        raise ValueError(f"x: shape {tuple(xa.shape)}; expected [..., K]")
    k = int(xa.shape[-1])
    g = group_size(fmt)
    if k < 1 or k % g:
        raise ValueError(f"x: K={k} (last dimension) must be a positive multiple of {g}, the "
                         f"{fmt} group size")
    if xa.size and xa.data.ptr % 16:
        raise ValueError("x: data pointer must be 16-byte aligned (the kernels read 16-byte "
                         "vectors); pass a fresh or .copy()'d array")
    return ctx, xa, dt, xa.size // k, k


def _check_layout(scale_layout: str) -> bool:
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r}; expected one of {list(SCALE_LAYOUTS)}")
    return scale_layout == "swizzled"


def _outputs(ctx: Ctx, fmt: str, rows: int, k: int, scale_layout: str):
    """New data and scale arrays of a [rows, K] result (zero-row ones when rows == 0)."""
    data, data_v = ctx.empty(data_shape(fmt, rows, k), "uint8")
    scales, scales_v = ctx.empty(scale_shape(fmt, rows, k, scale_layout), "uint8")
    return data, data_v, scales, scales_v


def _set_global_scale(ctx: Ctx, gs_out_v: Any, mode: str, gs_view: Any, gs_val: float) -> None:
    """gs of a zero-row NVFP4 result, without a kernel of ours: the given value or device
    scalar, or 1.0 (auto: no finite non-zero entry, as `reference.nvfp4_global_scale`)."""

    with on_stream(ctx.device, ctx.stream):
        if mode == "device":
            gs_out_v[...] = gs_view.reshape(1)
        else:
            gs_out_v.fill(gs_val if mode == "value" else 1.0)


def quantize_mx(x: Any, fmt: str, *, scale_layout: str = "swizzled",
                dtype: str | None = None) -> MxTensor:
    """Quantize x [..., K] (fp16 / bf16 / fp32; K % 32 == 0) to an MX format.

    fmt: "mxfp4" | "mxfp6_e2m3" | "mxfp6_e3m2" | "mxfp8_e4m3" | "mxfp8_e5m2". Groups of 32 along K
    share an E8M0 scale (OCP floor rule); elements round to nearest even and saturate. Bit-exact
    with `reference.quantize_mx`. CuPy bf16: a uint16 array with dtype="bfloat16". No rows: an
    MxTensor of zero-row data and scales, nothing launched. Memoised per signature of x and the
    other arguments (core/fastcall.py: the next such call skips the checks and the planner).
    """
    return fastcall.memoised("quantize_mx", None, (x,), (fmt, scale_layout, dtype),
                             lambda: _quantize_mx(x, fmt, scale_layout, dtype), _arrays, _builder,
                             _no_kept)


def _arrays(t: MxTensor) -> tuple:
    """The arrays a quantize made (core/fastcall.py outputs_of)."""
    return (t.data, t.scales) + (() if t.global_scale is None else (t.global_scale,))


def _builder(t: MxTensor) -> Any:
    """MxTensors like t of new arrays (core/fastcall.py build_of)."""
    return lambda outs, _inputs: MxTensor(t.fmt, t.shape, outs[0], outs[1], t.scale_layout,
                                          outs[2] if len(outs) > 2 else None)


def _no_kept() -> set:
    return set()  # a quantize's launches touch its input and outputs only


def _quantize_mx(x: Any, fmt: str, scale_layout: str, dtype: str | None) -> MxTensor:
    if fmt not in MX_FORMATS:
        raise ValueError(f"fmt={fmt!r}; expected one of {list(MX_FORMATS)} (nvfp4: "
                         f"quantize_nvfp4)")
    swizzled = _check_layout(scale_layout)
    ctx, xa, dt, rows, k = _input(x, dtype, fmt)
    if rows == 0:
        data, _, scales, _ = _outputs(ctx, fmt, 0, k, scale_layout)
        return MxTensor(fmt, (0, k), data, scales, scale_layout, None)
    info = device_info(ctx.device)
    plan = quantize_plan(info.arch.name, info.sm_count, fmt, dt, rows, k, swizzled, "value")
    data, data_v, scales, scales_v = _outputs(ctx, fmt, rows, k, scale_layout)
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("mx_quantize")
    args = (xa, data_v, scales_v, data_v, data_v, data_v, np.float32(1), np.int32(0),
            np.int32(0), np.int32(rows), np.int32(k), np.int32(plan.scale_mode),
            np.int32(plan.slots))
    _launch(ctx, fn, plan.grid, plan.block, args)
    return MxTensor(fmt, (rows, k), data, scales, scale_layout, None)


def _launch(ctx: Ctx, fn: Any, grid: int, block: int, args: tuple) -> None:
    ctx.launch(fn, (grid, 1, 1), (block, 1, 1), args, memo=True)


def _global_scale(global_scale: Any, ctx: Ctx) -> tuple[str, Any, float]:
    """(gs_mode, device view or None, value) of the global_scale argument."""
    if global_scale is None:
        return "auto", None, 1.0
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        with np.errstate(over="ignore"):
            gs = np.float32(global_scale)
        if not (math.isfinite(float(gs)) and gs > 0):
            raise ValueError(f"global_scale={global_scale!r}: must be a positive finite fp32 "
                             f"(e.g. 2688 / amax)")
        return "value", None, float(gs)
    view, _ = device_array(global_scale, "global_scale", ctx, ("float32",))
    if view.size != 1:
        raise ValueError(f"global_scale: a device array must hold one fp32 value, got shape "
                         f"{tuple(view.shape)}")
    return "device", view, 1.0


def quantize_nvfp4(x: Any, global_scale: Any = None, *, scale_layout: str = "swizzled",
                   dtype: str | None = None) -> MxTensor:
    """Quantize x [..., K] (fp16 / bf16 / fp32; K % 16 == 0) to NVFP4.

    global_scale: a positive finite float, a one-element fp32 device array (read by the kernel;
    not checked), or None: 2688 / max|x| over the finite entries, computed on the device (no host
    sync). Groups of 16 along K get an E4M3 scale; elements E2M1, RNE with saturation. The result's
    `global_scale` is a new fp32 device array of shape (1,). Bit-exact with
    `reference.quantize_nvfp4`. No rows: zero-row data and scales, global_scale the given one
    (auto: 1.0), none of our kernels launched. Memoised per signature of x (and a device
    global_scale) and the other arguments (core/fastcall.py).
    """
    if isinstance(global_scale, numbers.Real) or global_scale is None:
        inputs, extra = (x,), (scale_layout, dtype, type(global_scale), global_scale)  # True != 1.0 here
    else:
        inputs, extra = (x, global_scale), (scale_layout, dtype, "device")
    return fastcall.memoised("quantize_nvfp4", None, inputs, extra,
                             lambda: _quantize_nvfp4(x, global_scale, scale_layout, dtype),
                             _arrays, _builder, _no_kept)


def _quantize_nvfp4(x: Any, global_scale: Any, scale_layout: str, dtype: str | None) -> MxTensor:
    swizzled = _check_layout(scale_layout)
    ctx, xa, dt, rows, k = _input(x, dtype, "nvfp4")
    mode, gs_view, gs_val = _global_scale(global_scale, ctx)
    if rows == 0:
        data, _, scales, _ = _outputs(ctx, "nvfp4", 0, k, scale_layout)
        gs_out, gs_out_v = ctx.empty((1,), "float32")
        _set_global_scale(ctx, gs_out_v, mode, gs_view, gs_val)
        return MxTensor("nvfp4", (0, k), data, scales, scale_layout, gs_out)
    info = device_info(ctx.device)
    plan = quantize_plan(info.arch.name, info.sm_count, "nvfp4", dt, rows, k, swizzled, mode)
    data, data_v, scales, scales_v = _outputs(ctx, "nvfp4", rows, k, scale_layout)
    gs_out, gs_out_v = ctx.empty((1,), "float32")
    kernel = get_kernel(plan.config, ctx.device, ctx.stream)
    if plan.path == "fused":
        _launch(ctx, kernel.fn("mx_quantize_fused"), plan.grid, plan.block,
                (xa, data_v, scales_v, gs_out_v, np.int32(rows), np.int32(k), np.int32(plan.scale_mode)))
        return MxTensor("nvfp4", (rows, k), data, scales, scale_layout, gs_out)
    partials_v, n_partials = gs_out_v, 0
    if plan.path == "amax":
        partials, partials_v = ctx.empty((plan.amax_grid,), "int32")  # uint32 bits on the device
        n_partials = plan.amax_grid
        _launch(ctx, kernel.fn("mx_amax"), plan.amax_grid, plan.block,
                (xa, partials_v, np.int64(rows * k * xa.itemsize // 16)))
    gs_mode = {"value": 0, "device": 1, "auto": 3 if plan.path == "redundant" else 2}[mode]
    _launch(ctx, kernel.fn("mx_quantize"), plan.grid, plan.block,
            (xa, data_v, scales_v, gs_view if gs_view is not None else gs_out_v, partials_v,
             gs_out_v, np.float32(gs_val), np.int32(gs_mode), np.int32(n_partials),
             np.int32(rows), np.int32(k), np.int32(plan.scale_mode), np.int32(plan.slots)))
    return MxTensor("nvfp4", (rows, k), data, scales, scale_layout, gs_out)


def dequantize(t: MxTensor, dtype: str = "float32", *, out: Any = None) -> Any:
    """MxTensor -> [rows, K] in dtype ("float16" | "bfloat16" | "float32"; CuPy bf16 as uint16).

    MX: code * 2^(scale - 127), exact in fp32; NVFP4: RN(e2m1 * e4m3 / global_scale). NaN where
    a scale byte is NaN (groups that held NaN / Inf). `out`: optional [rows, K] (or any shape of
    rows * K elements) contiguous array of `dtype`. Matches `reference.dequantize_*` bit for bit.
    """
    if not isinstance(t, MxTensor):
        raise ValueError(f"t: expected an MxTensor, got {type(t).__name__}")
    dtype = dtype_name(dtype)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype!r}; expected one of {FLOAT_DTYPES}")
    t.check()
    swizzled = _check_layout(t.scale_layout)
    ctx = context_of(t.data, "t.data")
    data_v, _ = device_array(t.data, "t.data", ctx, ("uint8",))
    scales_v, _ = device_array(t.scales, "t.scales", ctx, ("uint8",))
    slot_bytes = lane_elems(t.fmt) * elem_bits(t.fmt) // 8  # a thread's slot of packed codes
    word = 8 if slot_bytes % 8 == 0 else 4
    if data_v.size and data_v.data.ptr % word:
        raise ValueError(f"t.data: data pointer must be {word}-byte aligned (the kernel loads "
                         f"{t.fmt} codes {word} bytes at a time); pass a fresh or .copy()'d array")
    gs_v = data_v
    if t.fmt == "nvfp4":
        gs_v, _ = device_array(t.global_scale, "t.global_scale", ctx, ("float32",))
        if gs_v.size < 1:
            raise ValueError("t.global_scale: empty; expected the one float32 NVFP4 global scale")
    rows, k = t.shape
    if out is None:
        out, out_v = ctx.empty((rows, k), dtype)
    else:
        out_v, _ = device_array(out, "out", ctx, (dtype,), hint=dtype)
        if out_v.size != rows * k:
            raise ValueError(f"out: has {out_v.size} elements, t has {rows} x {k}")
        if out_v.size and out_v.data.ptr % 16:
            raise ValueError("out: data pointer must be 16-byte aligned (the kernel stores "
                             "16-byte vectors); pass a fresh array")
    if rows == 0:  # an empty tensor (quantize of zero rows): nothing to launch
        return out
    plan = dequantize_plan(device_info(ctx.device).arch.name, t.fmt, dtype, rows, k)
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("mx_dequantize")
    ctx.launch(fn, (plan.grid, 1, 1), (plan.block, 1, 1),
               (data_v, scales_v, gs_v, out_v, np.int32(rows), np.int32(k), np.int32(swizzled)))
    return out


__all__ = ["FORMATS", "MxTensor", "dequantize", "quantize_mx", "quantize_nvfp4"]
