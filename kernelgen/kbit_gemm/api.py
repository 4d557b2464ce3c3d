"""Public kbit GEMM API: quantize a weight once, then C = A . W^T (+ bias). CuPy or torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import device_info
from ..core import cublas
from ..core.interop import Ctx, context_of, device_array, gemm_bias_out, on_stream, scratch
from ..core.jit import get_kernel
from ..kbit.api import KbitTensor, check_bits, dequantize_kbit, quantize_kbit
from .config import DTYPES, GROUP_K, TILE_ROWS
from .select import GemvPlan, check_shape, m_tile_for, plan_gemv, select_gemv
from .tc_select import PATHS, plan_mma, select_gemm


@dataclass(frozen=True)
class KbitLinear:
    """A weight W [N, K] quantized for `gemm`: the flat kbit layout, as quantize_kbit makes it
    (no repack: row n is K/32 consecutive blocks, which the GEMV streams as it is).

    Call it like a layer: `lin(A, bias=None, out=None)` is `gemm(A, lin, bias, out=out)`.
    """

    q: KbitTensor
    n: int
    k: int

    def __post_init__(self) -> None:
        # gemm trusts n and k for the launch: they must be the weight's own shape.
        if not isinstance(self.q, KbitTensor) or tuple(self.q.shape) != (self.n, self.k):
            raise ValueError(f"KbitLinear: q must be a KbitTensor of shape ({self.n}, {self.k}); "
                             f"use quantize_weight(w) or KbitLinear.from_kbit(q)")
        check_shape(self.n, self.k, name="q")

    @property
    def bits(self) -> int:
        return self.q.bits

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @classmethod
    def from_kbit(cls, q: KbitTensor) -> KbitLinear:
        """Wrap an already quantized 2-D weight (checks the GEMM's shape rule)."""
        if not isinstance(q, KbitTensor):
            raise ValueError(f"q: expected a KbitTensor from quantize_kbit, got {type(q).__name__}")
        if len(q.shape) != 2:
            raise ValueError(f"q: the kbit GEMM needs a 2-D weight [N, K], got shape {q.shape}")
        check_shape(*q.shape, name="q")
        return cls(q, int(q.shape[0]), int(q.shape[1]))

    def dequantize(self, dtype: str | None = None) -> Any:
        return dequantize_kbit(self.q, dtype)

    def __call__(self, A: Any, bias: Any = None, *, out: Any = None, dtype: str | None = None) -> Any:
        return gemm(A, self, bias, out=out, dtype=dtype)


def quantize_weight(w: Any, bits: int = 4, *, codebook: Any = None, dtype: str | None = None) -> KbitLinear:
    """Quantize a weight W [N, K] (fp16 / bf16 / fp32, CuPy or torch) once for `gemm`.

    K must be a multiple of 128. `codebook` and `dtype` as in quantize_kbit (CuPy bf16: a uint16
    array with dtype="bfloat16").
    """
    bits = check_bits(bits)
    shape = tuple(getattr(w, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"w: the kbit GEMM needs a 2-D weight [N, K], got shape {shape}")
    check_shape(int(shape[0]), int(shape[1]), name="w")
    return KbitLinear(quantize_kbit(w, bits, codebook=codebook, dtype=dtype), int(shape[0]), int(shape[1]))


def gemm(A: Any, W: KbitLinear, bias: Any = None, *, out: Any = None, dtype: str | None = None,
         split_k: int | None = None, path: str | None = None,
         tile: tuple[int, int] | None = None, kw: int | None = None) -> Any:
    """C = A . W^T (+ bias): A [..., K] fp16 / bf16 (contiguous, 16-byte aligned), W a KbitLinear
    [N, K], bias [N] and C [..., N] in A's dtype; fp32 accumulation, C rounded to nearest.

    `out` receives C (A's dtype, shape [..., N], contiguous). `dtype="bfloat16"` marks CuPy
    uint16 data as bf16. The selector picks the path ("gemv": bandwidth kernel, "mma": tensor-core
    kernel, N % 128 == 0; "dequant": W dequantized to a scratch + cuBLAS) and its plan; `path`,
    `tile` ((tile_m, tile_n) of the mma path), `split_k` (number of K splits) and `kw` (warps
    of a GEMV CTA sharing one tile's K range: 1, 2, 4; implies the gemv path) force them.
    Runs on the caller's current stream; results come back as the caller's array kind.
    """
    return _gemm(A, W, bias, out, dtype, split_k, path, tile, kw, None)


def gemm_with_plan(A: Any, W: KbitLinear, plan: GemvPlan, bias: Any = None, *, out: Any = None,
                   dtype: str | None = None) -> Any:
    """`gemm` on the GEMV path with a plan of `plan_gemv` (tuning scripts and tests: a
    forced CTA shape); the plan must be for this M, N, K, bits and dtype."""
    return _gemm(A, W, bias, out, dtype, None, "gemv", None, None, plan)


def _gemm(A: Any, W: KbitLinear, bias: Any, out: Any, dtype: str | None, split_k: int | None,
          path: str | None, tile: tuple[int, int] | None, kw: int | None,
          plan: GemvPlan | None) -> Any:
    if not isinstance(W, KbitLinear):
        raise ValueError(f"W: expected a KbitLinear from quantize_weight, got {type(W).__name__}")
    ctx = context_of(A, "A")
    a, dt = device_array(A, "A", ctx, DTYPES, hint=dtype)
    if a.ndim < 2:
        raise ValueError(f"A: expected [M, K] (or [..., K]), got shape {tuple(a.shape)}")
    k, n = int(a.shape[-1]), W.n
    if k != W.k:
        raise ValueError(f"A: K={k} does not match the weight's K={W.k} (W is [{W.n}, {W.k}])")
    if a.data.ptr % 16:
        raise ValueError("A: data pointer must be 16-byte aligned (a fresh or sliced-by-rows "
                         "array of K % 128 == 0 columns is)")
    m = int(a.size // k)
    packed, absmax, cb = W.q._views(ctx)
    b, out, c = gemm_bias_out(ctx, a, bias, out, n, k, dt)
    if c.data.ptr % 4:  # a fresh allocation always passes
        raise ValueError("out: data pointer must be 4-byte aligned (C is stored two elements "
                         "at a time)")
    if b is None:
        b = a
    if m == 0:
        return out
    info = device_info(ctx.device)
    if path is None:
        path = "mma" if tile is not None else "gemv" if kw is not None else select_gemm(
            info.arch.name, m, n, k, W.bits, dt, info.sm_count).path
    if tile is not None and path != "mma":
        raise ValueError(f"tile={tile}: only the mma path has tiles; path={path!r}")
    if kw is not None and path != "gemv":
        raise ValueError(f"kw={kw}: only the gemv path has K warps; path={path!r}")
    if split_k is not None and path == "dequant":
        raise ValueError(f"split_k={split_k}: the dequant path (dequantize + cuBLAS) has no K "
                         f"split; force path='gemv' or 'mma' to split K")
    if path == "mma":
        return _gemm_mma(ctx, W, a, b, bias is not None, c, out, m, n, k, dt, info, tile, split_k)
    if path == "dequant":
        return _gemm_dequant(ctx, W, a, b, bias is not None, c, out, m, n, k, dt)
    if path != "gemv":
        raise ValueError(f"path={path!r}: expected one of {PATHS} (or None: the selector's choice)")
    if plan is not None:
        cfg = plan.config
        if (cfg.bits, cfg.dtype, cfg.m_tile, plan.m_tiles) != (W.bits, dt, m_tile_for(m), -(-m // cfg.m_tile)) \
                or plan.gps * GROUP_K * plan.split < k or plan.gps * GROUP_K * (plan.split - 1) >= k:
            raise ValueError(f"plan {plan.short()}: not a plan for M={m}, N={n}, K={k}, "
                             f"bits={W.bits}, {dt}")
    elif split_k is None and kw is None:
        plan = select_gemv(info.arch.name, m, n, k, W.bits, dt, info.sm_count)
    else:
        plan = plan_gemv(info.arch.name, m, n, k, W.bits, dt, info.sm_count,
                         None if split_k is None else int(split_k), None if kw is None else int(kw))
    if plan.config.split_k:
        ws, counters = scratch(ctx, "kbit_gemv", plan.split * m * n, plan.m_tiles * -(-n // TILE_ROWS))
    else:
        ws = counters = c
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("kbit_gemv")
    args = (packed, absmax, cb, a, b, np.int32(bias is not None), c, ws, counters, np.int32(m),
            np.int32(n), np.int32(k), np.int32(plan.gps))
    ctx.launch(fn, plan.grid, plan.block, args, smem=plan.smem)
    return out


def _gemm_mma(ctx: Ctx, W: KbitLinear, a: Any, b: Any, has_bias: bool, c: Any, out: Any, m: int,
              n: int, k: int, dt: str, info: Any, tile: tuple[int, int] | None,
              split_k: int | None) -> Any:
    """The tensor-core path (templates/kbit_gemm/mma_gemm.cuh) on the flat layout."""
    if tile is None and split_k is None:
        choice = select_gemm(info.arch.name, m, n, k, W.bits, dt, info.sm_count)
        plan = choice.plan if choice.path == "mma" else None
    else:
        plan = None
    if plan is None:
        plan = plan_mma(info.arch.name, m, n, k, W.bits, dt, info.sm_count, tile,
                        None if split_k is None else int(split_k))
    packed, absmax, cb = W.q._views(ctx)
    if plan.split > 1:
        ws, counters = scratch(ctx, "kbit_mma", plan.split * m * n, plan.m_tiles * plan.n_tiles)
    else:
        ws = counters = c
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("kbit_mma_gemm")
    args = (packed, absmax, cb, a, b, np.int32(has_bias), c, ws, counters, np.int32(m),
            np.int32(n), np.int32(k), np.int32(plan.kt_per_split))
    ctx.launch(fn, plan.grid, plan.block, args, smem=plan.smem)
    return out


def _dequant_scratch(ctx: Ctx, n: int, k: int, dt: str) -> tuple[Any, Any]:
    """(native, cupy view) of the [N, K] dequantized-W scratch. While a CuPy stream captures a
    CUDA graph the scratch comes from core.interop.scratch (never freed: the graph keeps writing
    to its address at every replay; a pool block freed after the call could be handed to another
    array). Otherwise a fresh array, returned to the pool after the call (torch captures draw
    from the graph's private pool, which the graph keeps)."""
    if ctx.kind == "cupy" and ctx.stream.ptr not in (0, 1) and ctx.stream.is_capturing():
        ws, _ = scratch(ctx, f"kbit_dequant_w:{dt}", -(-n * k // 2), 1)
        w = ws[: -(-n * k // 2)].view(np.float16 if dt == "float16" else np.uint16)[: n * k]
        w = w.reshape(n, k)
        return w, w
    return ctx.empty((n, k), dt)


def _gemm_dequant(ctx: Ctx, W: KbitLinear, a: Any, b: Any, has_bias: bool, c: Any, out: Any,
                  m: int, n: int, k: int, dt: str) -> Any:
    """Large M: W dequantized into an [N, K] scratch of A's dtype (2*N*K bytes for the call),
    then cuBLAS (cublasGemmEx, fp32 compute) C = A . W^T (+ bias through beta = 1).
    Every launch goes to ctx.stream; the caller's current stream is left as it was."""
    w_native, wv = _dequant_scratch(ctx, n, k, dt)
    dequantize_kbit(W.q, dt, out=w_native)
    if has_bias:
        with on_stream(ctx.device, ctx.stream):
            c.reshape(m, n)[...] = b[None, :]
    # column-major view: C^T [N, M] = W [N, K] . A^T ([K, M] column-major = A row-major)
    cublas.gemm_ex(ctx, cublas.OP_T, cublas.OP_N, n, m, k, 1.0, wv.data.ptr, dt, k, a.data.ptr,
                   dt, k, 1.0 if has_bias else 0.0, c.data.ptr, dt, n)
    del w_native  # stream-ordered pools (cupy, torch) keep it alive for the queued work
    return out
