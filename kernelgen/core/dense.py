"""The large-M path of the quantized GEMMs: W made dense in an [N, K] scratch, then cuBLAS.

A family's dequantize kernel writes W (in A's dtype) into the scratch, then cublasGemmEx (fp32
compute) multiplies; the bias comes in through beta = 1 on C pre-filled with it (N rounded up
to ROW_ALIGN for cuBLAS, C then in a padded scratch, copied out). The scalars
are host values, or device ones (`scalars`: a float32 [alpha, beta] the dequantize kernel
writes, for a factor that lives on the device, like an NVFP4 global scale)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import cublas
from .interop import Ctx, on_stream, scratch

# cuBLAS runs slow kernels where N (its M: C^T = W . A^T) is not a multiple of 8 fp16 / bf16
# elements (H100, 32001x4096 fp16: 355 us at M = 128 and 1441 at 512, against 48-91 us for
# 14008x4096; a padded ldc alone did not help, BENCHMARKS.md session 27). There the GEMM runs
# over N rounded up: W's scratch has the extra rows (never written; their C columns are
# garbage and dropped) and C a padded scratch, copied out.
ROW_ALIGN = 8


def dense_scratch(ctx: Ctx, n: int, k: int, dt: str, tag: str = "dense_w") -> tuple[Any, Any]:
    """(native, cupy view) of an [N, K] scratch of dtype dt (the dequantized W; tag "dense_c":
    the padded C). While a CuPy stream captures a CUDA graph the scratch comes from
    core.interop.scratch (never freed: the graph keeps writing to its address at every replay; a
    pool block freed after the call could be handed to another array). Otherwise a fresh array,
    returned to the pool after the call (torch captures draw from the graph's private pool,
    which the graph keeps)."""
    if ctx.kind == "cupy" and ctx.stream.ptr not in (0, 1) and ctx.stream.is_capturing():
        ws, _ = scratch(ctx, f"{tag}:{dt}", -(-n * k // 2), 1)
        w = ws[: -(-n * k // 2)].view(np.float16 if dt == "float16" else np.uint16)[: n * k]
        w = w.reshape(n, k)
        return w, w
    return ctx.empty((n, k), dt)


def device_scalars(ctx: Ctx) -> Any:
    """A float32 [2] on the call's stream for [alpha, beta] written by a kernel (reused in stream
    order, never freed: graphs keep its address). Like the W scratch it is one per stream,
    shared by every call (kbit and FP4) on it: two graphs captured on one stream must not be
    replayed concurrently on different streams, as for the split-K scratch."""
    ws, _ = scratch(ctx, "dense_scalars", 2, 1)
    return ws[:2]


def dense_gemm(ctx: Ctx, dequantize: Any, a: Any, b: Any, has_bias: bool, c: Any, m: int, n: int,
               k: int, dt: str, alpha: float = 1.0, scalars: Any = None) -> None:
    """C = alpha A . W^T (+ bias) through W dense: `dequantize(w, wv)` writes W into an [N, K]
    scratch of A's dtype (2*N*K bytes for the call; w as the caller's array kind, wv its cupy
    view), then cuBLAS (cublasGemmEx, fp32 compute), the bias through beta = 1. `scalars`: a
    float32 device array whose [alpha, beta] the dequantize kernel has written (alpha is then
    not read). Every launch goes to ctx.stream; the caller's current stream is left as it was."""
    npad = -(-n // ROW_ALIGN) * ROW_ALIGN  # rows of W past N: never written, their C discarded
    w_native, wv = dense_scratch(ctx, npad, k, dt)
    dequantize(w_native[:n], wv[:n])
    c_native, cv = (None, c.reshape(m, n)) if npad == n else dense_scratch(ctx, m, npad, dt, "dense_c")
    if has_bias:
        with on_stream(ctx.device, ctx.stream):
            cv[:, :n] = b[None, :]
    # column-major view: C^T [N, M] = W [N, K] . A^T ([K, M] column-major = A row-major)
    cublas.gemm_ex(ctx, cublas.OP_T, cublas.OP_N, npad, m, k, alpha, wv.data.ptr, dt, k, a.data.ptr,
                   dt, k, 1.0 if has_bias else 0.0, cv.data.ptr, dt, npad,
                   scalars_ptr=None if scalars is None else int(scalars.data.ptr))
    if npad != n:
        with on_stream(ctx.device, ctx.stream):
            c.reshape(m, n)[...] = cv[:, :n]
    del w_native, c_native  # stream-ordered pools (cupy, torch) keep them alive for the queued work
