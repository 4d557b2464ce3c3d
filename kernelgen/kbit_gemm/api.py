"""Public kbit GEMM API: quantize a weight once, then C = A . W^T (+ bias). CuPy or torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import device_info
from ..core import fastcall, interop
from ..core.dense import dense_gemm
from ..core.interop import (
    Ctx,
    context_of,
    device_array,
    dtype_name,
    gemm_bias_out,
    optional_int,
    scratch,
)
from ..core.jit import get_kernel
from ..fp4_gemm.api import launch_plan
from ..kbit.api import KbitTensor, check_bits, dequantize_kbit, quantize_kbit
from .config import DTYPES, GROUP_K, TILE_ROWS
from .select import GemvPlan, check_shape, m_tile_for, plan_gemv, select_gemv
from .tc_select import PATHS, TILE_N_MIN, plan_mma, select_gemm
from .tiled import Kbit4Tiled, dequantize_tiled, gemm_tiled, plan_flat_wgmma, tile_weight

LAYOUTS = ("flat", "tiled")


def default_layout(bits: int) -> str:
    """4 bits: "tiled" (kernelgen/kbit_gemm/tiled.py: the FP4 bandwidth and tile kernels; on the
    H100 1.2-3x faster than flat at M <= 16, BENCHMARKS.md); 2, 3, 5 bits: "flat" (the only
    layout they have)."""
    return "tiled" if bits == 4 else "flat"


@dataclass(frozen=True)
class KbitLinear:
    """A weight W [N, K] quantized for `gemm`, in one of two layouts:
    flat   `q`: the KbitTensor as quantize_kbit makes it (row n = K/32 consecutive blocks of bit
           planes), which the flat GEMV, mma and dequant kernels read; any bit-width
    tiled  `tiled`: 4 bits only, the codes repacked into the tiled layout of the FP4 kernels
           (kernelgen/kbit_gemm/tiled.py), read by its gemv, tile, dequant (and on sm_90a wgmma)
           paths; `q` is None (no second copy of the weight)
    Exactly one of q / tiled is set.

    Call it like a layer: `lin(A, bias=None, out=None)` is `gemm(A, lin, bias, out=out)`.
    """

    q: KbitTensor | None
    n: int
    k: int
    tiled: Kbit4Tiled | None = None

    def __post_init__(self) -> None:
        # gemm trusts n and k for the launch: they must be the weight's own shape.
        if (self.q is None) == (self.tiled is None):
            raise ValueError("KbitLinear: exactly one of q (flat layout) and tiled (tiled "
                             "layout) must be set; use quantize_weight(w) or KbitLinear.from_kbit(q)")
        if self.tiled is not None:
            if not isinstance(self.tiled, Kbit4Tiled) or (self.tiled.n, self.tiled.k) != (self.n, self.k):
                raise ValueError(f"KbitLinear: tiled must be a Kbit4Tiled of shape ({self.n}, {self.k})")
        elif not isinstance(self.q, KbitTensor) or tuple(self.q.shape) != (self.n, self.k):
            raise ValueError(f"KbitLinear: q must be a KbitTensor of shape ({self.n}, {self.k}); "
                             f"use quantize_weight(w) or KbitLinear.from_kbit(q)")
        check_shape(self.n, self.k, name="q")

    @property
    def bits(self) -> int:
        return 4 if self.tiled is not None else self.q.bits

    @property
    def layout(self) -> str:
        return "tiled" if self.tiled is not None else "flat"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @classmethod
    def from_kbit(cls, q: KbitTensor, layout: str | None = None) -> KbitLinear:
        """Wrap an already quantized 2-D weight (checks the GEMM's shape rule). `layout`
        (LAYOUTS; default: default_layout(bits)) "tiled" makes a repacked copy on q's device
        (q itself is not kept)."""
        if not isinstance(q, KbitTensor):
            raise ValueError(f"q: expected a KbitTensor from quantize_kbit, got {type(q).__name__}")
        if len(q.shape) != 2:
            raise ValueError(f"q: the kbit GEMM needs a 2-D weight [N, K], got shape {q.shape}")
        check_shape(*q.shape, name="q")
        layout = check_layout(layout, q.bits)
        n, k = int(q.shape[0]), int(q.shape[1])
        if layout == "flat":
            return cls(q, n, k)
        return cls(None, n, k, tile_weight(q, context_of(q.packed, "q.packed")))

    def dequantize(self, dtype: str | None = None) -> Any:
        """W [N, K] dense in `dtype` (fp16 / bf16 / fp32; default: the dtype that was
        quantized), as the caller's array kind, the values of dequantize_kbit either layout."""
        if self.tiled is None:
            return dequantize_kbit(self.q, dtype)
        t = self.tiled
        dt = dtype_name(dtype) or t.dtype
        if dt not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"dtype={dt!r}: expected float16, bfloat16 or float32")
        ctx = context_of(t.origin if t.origin is not None else t.codebook, "W.tiled")
        if ctx.device != t.device:
            raise ValueError(f"W: on device {t.device}, its source arrays on device {ctx.device}")
        out, out_v = ctx.empty((self.n, self.k), dt)
        dequantize_tiled(ctx, t, dt, out_v)
        return out

    def __call__(self, A: Any, bias: Any = None, *, out: Any = None, dtype: str | None = None) -> Any:
        return gemm(A, self, bias, out=out, dtype=dtype)


def check_layout(layout: str | None, bits: int) -> str:
    layout = default_layout(bits) if layout is None else layout
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    if layout == "tiled" and bits != 4:
        raise ValueError(f"layout='tiled': 4-bit weights only (bits={bits}); use layout='flat'")
    return layout


def quantize_weight(w: Any, bits: int = 4, *, codebook: Any = None, dtype: str | None = None,
                    layout: str | None = None) -> KbitLinear:
    """Quantize a weight W [N, K] (fp16 / bf16 / fp32, CuPy or torch) once for `gemm`.

    K must be a multiple of 128. `codebook` and `dtype` as in quantize_kbit (CuPy bf16: a uint16
    array with dtype="bfloat16"). `layout` (LAYOUTS; default: "tiled" for 4 bits, else "flat",
    see KbitLinear) chooses the kernels that will read it.
    """
    bits = check_bits(bits)
    shape = tuple(getattr(w, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"w: the kbit GEMM needs a 2-D weight [N, K], got shape {shape}")
    check_shape(int(shape[0]), int(shape[1]), name="w")
    check_layout(layout, bits)
    return KbitLinear.from_kbit(quantize_kbit(w, bits, codebook=codebook, dtype=dtype), layout)


def gemm(A: Any, W: KbitLinear, bias: Any = None, *, out: Any = None, dtype: str | None = None,
         split_k: int | None = None, path: str | None = None,
         tile: tuple[int, int] | None = None, kw: int | None = None) -> Any:
    """C = A . W^T (+ bias): A [..., K] fp16 / bf16 (contiguous, 16-byte aligned), W a KbitLinear
    [N, K], bias [N] and C [..., N] in A's dtype; fp32 accumulation, C rounded to nearest.

    `out` receives C (A's dtype, shape [..., N], contiguous). `dtype="bfloat16"` marks CuPy
    uint16 data as bf16. The selector picks the path and its plan. A flat weight: "gemv"
    (bandwidth kernel), "mma" (tensor-core kernel, N % 128 == 0), "dequant" (W dequantized to a
    scratch + cuBLAS), "wgmma" (sm_90a, 2..4 bits, 64..256 tokens where its unsplit CTAs fill
    their last wave: the tiled weight's warpgroup-MMA kernel decoding the bit planes itself,
    kbit_gemm/tiled.py flat_wgmma_takes);
    `tile` ((tile_m, tile_n) of the mma path) and `kw` (warps of a GEMV CTA sharing one tile's
    K range: 1, 2, 4; implies the gemv path) force its plans. A tiled 4-bit
    weight (KbitLinear.layout): "gemv", "tile", "dequant", or "wgmma" (sm_90a: mid M)
    (kbit_gemm/tiled.py). `path` and `split_k` (number of K splits) force either (a flat
    weight's `split_k` alone where the selector would dequantize runs the mma path, or the GEMV
    where N % 128 != 0). Runs on the caller's current stream; results come back as the caller's array kind.
    A call without a forced choice is memoised on W per signature of A, bias, out and dtype
    (core/fastcall.py: the next such call skips the checks and the selector).
    """
    if split_k is None and path is None and tile is None and kw is None and isinstance(W, KbitLinear):
        return fastcall.call("kbit_gemm", W, A, bias,
                             lambda: _gemm(A, W, bias, out, dtype, None, None, None, None, None),
                             out, (dtype,))
    return _gemm(A, W, bias, out, dtype, split_k, path, tile, kw, None)


def gemm_with_plan(A: Any, W: KbitLinear, plan: GemvPlan, bias: Any = None, *, out: Any = None,
                   dtype: str | None = None) -> Any:
    """`gemm` on the GEMV path with a plan of `plan_gemv` (tuning scripts and tests: a
    forced CTA shape); the plan must be for this M, N, K, bits and dtype."""
    if not isinstance(plan, GemvPlan):
        raise ValueError(f"plan: {type(plan).__name__}; expected a GemvPlan of plan_gemv")
    return _gemm(A, W, bias, out, dtype, None, "gemv", None, None, plan)


def _gemm(A: Any, W: KbitLinear, bias: Any, out: Any, dtype: str | None, split_k: int | None,
          path: str | None, tile: tuple[int, int] | None, kw: int | None,
          plan: GemvPlan | None) -> Any:
    split_k, kw = optional_int(split_k, "split_k"), optional_int(kw, "kw")
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
    if W.tiled is not None:  # knobs of the flat layout's kernels, refused before any work
        for name, v in (("tile", tile), ("kw", kw), ("plan", plan)):
            if v is not None:
                raise ValueError(f"{name}={v!r}: a knob of the flat layout's kernels; this weight "
                                 f"is tiled (quantize_weight(..., layout='flat') for those)")
    b, out, c = gemm_bias_out(ctx, a, bias, out, n, k, dt)
    if c.data.ptr % 4:  # a fresh allocation always passes
        raise ValueError("out: data pointer must be 4-byte aligned (C is stored two elements "
                         "at a time)")
    if b is None:
        b = a
    if m == 0:
        return out
    info = device_info(ctx.device)
    if W.tiled is not None:
        gemm_tiled(ctx, W.tiled, a, b, bias is not None, c, m, n, k, dt, info, path, split_k)
        return out
    lim = interop.smem_limit(ctx.device)
    if path is None:
        path = "mma" if tile is not None else "gemv" if kw is not None else select_gemm(
            info.arch.name, m, n, k, W.bits, dt, info.sm_count, lim).path
        if path == "dequant" and split_k is not None:  # a forced split: a path that splits K
            path = "gemv" if n % TILE_N_MIN else "mma"
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
    if path == "wgmma":  # the flat bit planes decoded in the FP4 wgmma kernel
        choice = select_gemm(info.arch.name, m, n, k, W.bits, dt, info.sm_count, lim) \
            if split_k is None else None
        plan = choice.plan if choice is not None and choice.path == "wgmma" else plan_flat_wgmma(
            info.arch.name, m, n, k, W.bits, dt, info.sm_count,
            None if split_k is None else int(split_k), lim)
        packed, absmax, cb = W.q._views(ctx)
        launch_plan(ctx, plan, packed, absmax, cb, (0, 0, 0, 0), a, b, bias is not None, 1.0, c,
                    m, n, k)
        return out
    if path != "gemv":
        raise ValueError(f"path={path!r}: expected one of {PATHS + ('wgmma',)} (or None: the "
                         f"selector's choice)")
    if plan is not None:
        cfg = plan.config
        if (cfg.bits, cfg.dtype, cfg.m_tile, plan.m_tiles) != (W.bits, dt, m_tile_for(m), -(-m // cfg.m_tile)) \
                or plan.gps * GROUP_K * plan.split < k or plan.gps * GROUP_K * (plan.split - 1) >= k:
            raise ValueError(f"plan {plan.short()}: not a plan for M={m}, N={n}, K={k}, "
                             f"bits={W.bits}, {dt}")
    elif split_k is None and kw is None:
        plan = select_gemv(info.arch.name, m, n, k, W.bits, dt, info.sm_count, lim)
    else:
        plan = plan_gemv(info.arch.name, m, n, k, W.bits, dt, info.sm_count,
                         None if split_k is None else int(split_k), None if kw is None else int(kw),
                         smem_limit=lim)
    if plan.config.split_k:
        ws, counters = scratch(ctx, "kbit_gemv", plan.split * m * n, plan.m_tiles * -(-n // TILE_ROWS))
    else:
        ws = counters = c
    packed, absmax, cb = W.q._views(ctx)
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("kbit_gemv")
    args = (packed, absmax, cb, a, b, np.int32(bias is not None), c, ws, counters, np.int32(m),
            np.int32(n), np.int32(k), np.int32(plan.gps))
    ctx.launch(fn, plan.grid, plan.block, args, smem=plan.smem, memo=True)
    return out


def _gemm_mma(ctx: Ctx, W: KbitLinear, a: Any, b: Any, has_bias: bool, c: Any, out: Any, m: int,
              n: int, k: int, dt: str, info: Any, tile: tuple[int, int] | None,
              split_k: int | None) -> Any:
    """The tensor-core path (templates/kbit_gemm/mma_gemm.cuh) on the flat layout."""
    lim = interop.smem_limit(ctx.device)
    if tile is None and split_k is None:
        choice = select_gemm(info.arch.name, m, n, k, W.bits, dt, info.sm_count, lim)
        plan = choice.plan if choice.path == "mma" else None
    else:
        plan = None
    if plan is None:
        plan = plan_mma(info.arch.name, m, n, k, W.bits, dt, info.sm_count, tile,
                        None if split_k is None else int(split_k), lim)
    packed, absmax, cb = W.q._views(ctx)
    if plan.split > 1:
        ws, counters = scratch(ctx, "kbit_mma", plan.split * m * n, plan.m_tiles * plan.n_tiles)
    else:
        ws = counters = c
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("kbit_mma_gemm")
    args = (packed, absmax, cb, a, b, np.int32(has_bias), c, ws, counters, np.int32(m),
            np.int32(n), np.int32(k), np.int32(plan.kt_per_split))
    ctx.launch(fn, plan.grid, plan.block, args, smem=plan.smem, memo=True)
    return out


def _gemm_dequant(ctx: Ctx, W: KbitLinear, a: Any, b: Any, has_bias: bool, c: Any, out: Any,
                  m: int, n: int, k: int, dt: str) -> Any:
    """Large M: W dequantized into an [N, K] scratch of A's dtype, then cuBLAS (dense_gemm)."""
    dense_gemm(ctx, lambda w, _wv: dequantize_kbit(W.q, dt, out=w), a, b, has_bias, c, m, n, k, dt)
    return out


