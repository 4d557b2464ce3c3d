"""Public API: `mx_gemm(A, B, bias=None, *, alpha=1.0, out=None, out_dtype="bfloat16")`.

A [M, K] and B [N, K] are MxTensor operands (kernelgen/mx/tensor.py; any object with the same
attributes works): packed codes `data` (uint8 [rows, K * bits / 8]), `scales` (uint8, swizzled
[ceil(rows/128), ceil(S/4), 32, 4, 4] or row-major [rows, S]), `scale_layout`, `fmt`, `shape`
and, for NVFP4, `global_scale` (fp32 device array of shape (1,)). CuPy or torch arrays; the
result comes back as the same kind, launched on the caller's current stream. Alignment: data
and swizzled scales 16 bytes (16-byte cp.async), out 4 bytes (pairs of columns per store).
Configs with `prescale` (the sm_90a selector's above M = 128) first write both operands
rescaled to their rows' largest block scale into per-stream scratch ((M + N) * K bytes, kept
for reuse), then run the GEMM on those.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arch import device_info
from ..core import fastcall
from ..core.interop import Ctx, context_of, device_array, dtype_name, on_stream, scratch
from ..core.jit import get_kernel
from .config import FORMATS, OUT_DTYPES, MxBsGemmConfig, MxFp8GemmConfig
from .select import forced, select_mx_gemm

_BITS = {"e4m3": 8, "e5m2": 8, "e2m1": 4}


def check_aligned(view: Any, name: str, nbytes: int, why: str) -> None:
    """ValueError unless the device address of `view` (a cupy view) is a multiple of nbytes.
    Empty arrays pass: nothing is read or written through them."""
    ptr = int(view.data.ptr)
    if view.size and ptr % nbytes:
        raise ValueError(f"{name}: data pointer must be {nbytes}-byte aligned ({why}); it is "
                         f"{ptr % nbytes} bytes past a multiple of {nbytes}: pass a fresh array "
                         f"or a slice of whole rows")


def _operand(x: Any, name: str, ctx: Ctx | None) -> tuple[Ctx, str, int, int, Any, Any, Any]:
    """Validate one MxTensor; returns (ctx, fmt, rows, K, data view, swizzled scales view, gs)."""
    for attr in ("fmt", "shape", "data", "scales", "scale_layout"):
        if not hasattr(x, attr):
            raise ValueError(f"{name}: expected an MxTensor (kernelgen.mx), got {type(x).__name__} "
                             f"without .{attr}")
    fmt = x.fmt
    if fmt not in FORMATS:
        raise ValueError(f"{name}: format {fmt!r} is not supported by mx_gemm; expected one of "
                         f"{sorted(FORMATS)}")
    elem, _, group = FORMATS[fmt]
    if len(x.shape) != 2:
        raise ValueError(f"{name}: shape {tuple(x.shape)}; mx_gemm takes 2-D operands [rows, K]")
    rows, k = (int(s) for s in x.shape)
    if ctx is None:
        ctx = context_of(x.data, f"{name}.data")
    data, _ = device_array(x.data, f"{name}.data", ctx, ("uint8",), ndim=2)
    want = (rows, k * _BITS[elem] // 8)
    if tuple(data.shape) != want:
        raise ValueError(f"{name}.data: shape {tuple(data.shape)}; a {fmt} tensor of shape "
                         f"{(rows, k)} packs into {want}")
    check_aligned(data, f"{name}.data", 16, "the kernels copy operand rows in 16-byte cp.async "
                  "chunks")
    s_cols = k // group
    sc, _ = device_array(x.scales, f"{name}.scales", ctx, ("uint8",))
    swz = (-(-rows // 128), -(-s_cols // 4), 32, 4, 4)
    if x.scale_layout == "swizzled":
        if sc.size != int(np.prod(swz)):
            raise ValueError(f"{name}.scales: {sc.size} bytes; the swizzled layout of {rows} rows "
                             f"x {s_cols} scale columns is {swz}")
        check_aligned(sc, f"{name}.scales", 16, "the kernels copy swizzled scales in 16-byte "
                      "cp.async chunks")
    elif x.scale_layout == "row_major":
        if tuple(sc.shape) != (rows, s_cols):
            raise ValueError(f"{name}.scales: shape {tuple(sc.shape)}; row_major scales are "
                             f"{(rows, s_cols)}")
        sc = _swizzle_on_device(sc, rows, s_cols, ctx)
    else:
        raise ValueError(f"{name}.scale_layout={x.scale_layout!r}; expected 'swizzled' or 'row_major'")
    gs = None
    if fmt == "nvfp4":
        if getattr(x, "global_scale", None) is None:
            raise ValueError(f"{name}: an nvfp4 operand needs global_scale (a one-element fp32 "
                             f"device array; quantize_nvfp4 sets it); it is None")
        gs, _ = device_array(x.global_scale, f"{name}.global_scale", ctx, ("float32",))
        if gs.size != 1:
            raise ValueError(f"{name}.global_scale: {gs.size} elements; expected shape (1,)")
    return ctx, fmt, rows, k, data, sc, gs


def swizzle(xp: Any, sc: Any, rows: int, s_cols: int) -> Any:
    """Row-major scale bytes [rows, S] -> the swizzled layout with `xp` (numpy or cupy), padding
    bytes 0x00, as kernelgen/mx/reference.py swizzle_scales."""
    mt, kt = -(-rows // 128), -(-s_cols // 4)
    padded = xp.zeros((mt * 128, kt * 4), xp.uint8)
    padded[:rows, :s_cols] = sc
    return xp.ascontiguousarray(padded.reshape(mt, 4, 32, kt, 4).transpose(0, 3, 2, 1, 4))


def _swizzle_on_device(sc: Any, rows: int, s_cols: int, ctx: Ctx) -> Any:
    """A copy per call; quantize with the swizzled layout to skip it."""
    import cupy

    with on_stream(ctx.device, ctx.stream):
        return swizzle(cupy, sc, rows, s_cols)


def _out_view(out: Any, ctx: Ctx, m: int, n: int, out_dtype: str) -> Any:
    """The cupy view of a caller's `out`, checked: [M, N] of out_dtype, 4-byte aligned."""
    d, _ = device_array(out, "out", ctx, (out_dtype,), hint=out_dtype, ndim=2)
    if tuple(d.shape) != (m, n):
        raise ValueError(f"out: shape {tuple(d.shape)}; expected {(m, n)}")
    check_aligned(d, "out", 4, "the kernels store D two elements at a time")
    return d


def _prescaled(ctx: Ctx, kern: Any, a: Any, sa: Any, b: Any, sb: Any, m: int, n: int, k: int
               ) -> tuple[Any, Any, Any, Any]:
    """A and B with every k-block rescaled to its row's largest block scale (the prescale
    configs' rescale kernels), and each row's largest scale byte E (int32), in per-stream
    scratch: (A', B', E of A, E of B)."""
    import cupy

    off_b = -(-m * k // 16) * 16
    off_e = off_b + -(-n * k // 16) * 16
    nbytes = off_e + 4 * (m + n)
    ws, _ = scratch(ctx, "mx_gemm_prescale", -(-nbytes // 4), 0)
    raw = ws.view(cupy.uint8)
    a2 = raw[:m * k].reshape(m, k)
    b2 = raw[off_b:off_b + n * k].reshape(n, k)
    e = raw[off_e:off_e + 4 * (m + n)].view(cupy.int32)
    for sym, x, sx, y, ey, rows in (("mx_gemm_rescale_a", a, sa, a2, e[:m], m),
                                    ("mx_gemm_rescale_b", b, sb, b2, e[m:], n)):
        ctx.launch(kern.fn(sym), (-(-rows // 8), 1, 1), (256, 1, 1),
                   (x, sx, y, ey, np.int32(rows), np.int32(k)))
    return a2, b2, e[:m], e[m:]


def mx_gemm(A: Any, B: Any, bias: Any = None, *, alpha: float = 1.0, out: Any = None,
            out_dtype: str = "bfloat16", config: MxFp8GemmConfig | MxBsGemmConfig | None = None) -> Any:
    """D [M, N] = alpha * A . B^T (+ bias) for block-scaled A [M, K] and B [N, K].

    Format pairs by arch (others raise ValueError naming what the arch runs): sm_80 (A100, 8.6
    parts; fp8 decoded by integer ops) / sm_89 / sm_90a / sm_100a / sm_103a MXFP8 x MXFP8 (E4M3 / E5M2);
    sm_120a / sm_121a also MXFP8 x MXFP4, MXFP4 x MXFP4, NVFP4 x NVFP4.
    M >= 0 (M = 0: an empty [0, N] D, nothing launched), N a multiple of 8, K a multiple of 32. bias [N] and out [M, N] in out_dtype
    ("bfloat16" or "float16"; CuPy bf16 is uint16). fp32 accumulation, D rounded to nearest.
    `config` forces a kernel config of the selector's path (tests, tuning); None: the selector's.
    A call without config is memoised on B per signature of A's arrays, bias, out and the
    other arguments (core/fastcall.py: the next such call skips the checks and the selector).
    """
    if config is None and all(hasattr(A, f) for f in ("data", "scales", "fmt")):
        inputs = (A.data, A.scales, getattr(A, "global_scale", None), bias)
        extra = (A.fmt, A.shape, getattr(A, "scale_layout", None), alpha, out_dtype)
        full = lambda: _mx_gemm(A, B, bias, alpha, out, out_dtype, None)  # noqa: E731
        if out is None:
            return fastcall.memoised("mx_gemm", B, inputs, extra, full, lambda d: (d,),
                                     lambda d: fastcall.first, lambda: _kept(B))
        return fastcall.memoised("mx_gemm", B, inputs + (out,), extra, full, lambda d: (),
                                 lambda d: _given_out, lambda: _kept(B))
    return _mx_gemm(A, B, bias, alpha, out, out_dtype, config)


def _given_out(outs: list, inputs: tuple) -> Any:
    """build_of's function for a call that wrote the caller's out (its fifth input)."""
    return inputs[4]


def _kept(B: Any) -> set:
    """The pointers of B's arrays: all a memoised launch may keep besides the call's arrays."""
    ptr = (lambda x: x.data_ptr()) if hasattr(B.data, "data_ptr") else (lambda x: x.data.ptr)
    return {ptr(x) for x in (B.data, B.scales, getattr(B, "global_scale", None)) if x is not None}


def _mx_gemm(A: Any, B: Any, bias: Any, alpha: float, out: Any, out_dtype: str,
             config: MxFp8GemmConfig | MxBsGemmConfig | None) -> Any:
    out_dtype = dtype_name(out_dtype)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype!r}; expected one of {OUT_DTYPES}")
    ctx, a_fmt, m, k, a, sa, gsa = _operand(A, "A", None)
    _, b_fmt, n, kb, b, sb, gsb = _operand(B, "B", ctx)
    if k != kb:
        raise ValueError(f"B: K={kb} does not match A's K={k} (A is [{m}, {k}], B is [{n}, {kb}])")
    info = device_info(ctx.device)
    # M = 0 is planned as M = 1 (the same format, N and K rules), then nothing is launched
    plan = select_mx_gemm(info.arch.name, a_fmt, b_fmt, max(m, 1), n, k, out_dtype, info.sm_count,
                          info.smem_optin)
    if config is not None:
        plan = forced(plan, config)
    if out is None:
        out, d = ctx.empty((m, n), out_dtype)
    else:
        d = _out_view(out, ctx, m, n, out_dtype)
    if bias is not None:
        bv, _ = device_array(bias, "bias", ctx, (out_dtype,), hint=out_dtype, ndim=1)
        if bv.shape[0] != n:
            raise ValueError(f"bias: {bv.shape[0]} elements; B has N={n} rows")
    else:
        bv = d
    if m == 0:
        return out
    kern = get_kernel(plan.config, ctx.device, ctx.stream)
    fn = kern.fn(plan.symbol)
    if plan.path == "fp8_mma":
        ea = eb = d  # (unused unless prescale)
        if isinstance(plan.config, MxFp8GemmConfig) and plan.config.prescale:
            a, b, ea, eb = _prescaled(ctx, kern, a, sa, b, sb, m, n, k)
        args = (a, b, sa, sb, ea, eb, bv, np.int32(bias is not None), d, np.int32(m), np.int32(n),
                np.int32(k), np.float32(alpha))
    else:
        gsa_, gsb_ = (gsa, gsb) if gsa is not None else (d, d)
        args = (a, b, sa, sb, gsa_, gsb_, bv, np.int32(bias is not None), d, np.int32(m),
                np.int32(n), np.int32(k), np.float32(alpha))
    ctx.launch(fn, plan.grid, plan.block, args, smem=plan.smem, memo=True)
    return out
