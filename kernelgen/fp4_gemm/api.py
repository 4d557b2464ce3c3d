"""Public FP4-weight GEMM API: D = alpha * A . W^T (+ bias), W NVFP4 or MXFP4. CuPy or torch."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import device_info
from ..core import fastcall
from ..core.dense import dense_gemm, device_scalars
from ..core.interop import (
    Ctx,
    context_of,
    device_array,
    dtype_name,
    gemm_bias_out,
    on_stream,
    optional_int,
    scratch,
    smem_limit,
)
from ..core.jit import get_kernel
from .config import DTYPES, FMTS, GROUP, SCALE_BYTES
from .layout import ARRANGEMENTS, arrange, arranged_shapes, block_strides, tile_data, tile_scales
from .select import Plan, check_shape, plan, select_fp4

# How prepare_weight stores the blocks (layout.py ARRANGEMENTS). Measured on H100 (session 10,
# M = 1, both decode shapes, same run): step-major beats tile-major by 3% (mxfp4) to 3-6%
# (nvfp4); scales inline help nvfp4 (1152-byte blocks, 128-byte aligned: 14336x4096 15.68 ->
# 15.17 us) and hurt mxfp4 (1088-byte blocks straddle 128-byte lines: 14.23 -> 14.90 us).
ARRANGEMENT = {"nvfp4": "step_major_inline", "mxfp4": "step_major"}


@dataclass(frozen=True, eq=False)
class Fp4Weight:
    """A weight W [N, K] ready for `fp4_gemm` (built once by `prepare_weight`).

    Its arrays are CuPy arrays on `device` (also for torch input), owned by it (no view of the
    MxTensor's buffers), C-contiguous (the scales of an *_inline arrangement: the view of each
    block's tail); the constructor checks their shapes and dtypes against fmt, n, k and the
    arrangement (`check_arrays`), so fp4_gemm trusts them. T = ceil(N/16), Q = K/128; in the
    tile_major arrangement (layout.py has the others; prepare_weight's default is ARRANGEMENT):
    data    uint8 [T, Q, 2, 8, 4, 16], the packed E2M1 bytes (element 2j in the low nibble of
            byte j, as MxTensor packs them) in the tiled layout of layout.py
    scales  uint8 [T, Q, 8, SB/4, 2, 4], tiled the same way: E4M3 bytes (nvfp4, groups of 16,
            SB=8) or E8M0 bytes relative to the row's largest, max(s - rowmax + 127, 0)
            (mxfp4, groups of 32, SB=4; 0 = a flushed group; 0xFF marks a NaN group, which
            the kernels do not decode as NaN: its row's post must be NaN, as prepare_weight
            makes it)
    post    float32: nvfp4 the global scale [1] (D is divided by it); mxfp4 the row factors
            2^(rowmax - 127) [N] (D is multiplied by them; NaN for a row with a NaN group)
    encoding  the activation type ("float16" / "bfloat16") data's words are bit-encoded for
            (layout.py ENCODINGS; it must describe `data`): either type of A works, the
            matching one decodes in fewer instructions (3-16% faster at M <= 16, BENCHMARKS.md)
    """

    fmt: str
    n: int
    k: int
    data: Any
    scales: Any
    post: Any
    device: int
    arrangement: str = "tile_major"
    encoding: str = "float16"

    def __post_init__(self) -> None:
        if self.encoding not in DTYPES:
            raise ValueError(f"Fp4Weight.encoding: {self.encoding!r}; expected one of {DTYPES}")
        check_arrays(self.fmt, self.n, self.k, self.data, self.scales, self.post, self.arrangement)
        cupy = _cupy()
        for name in ("data", "scales", "post"):
            x = getattr(self, name)
            if not isinstance(x, cupy.ndarray):
                raise ValueError(f"Fp4Weight.{name}: expected a CuPy array (prepare_weight makes "
                                 f"them), got {type(x).__module__}.{type(x).__name__}")
            if x.data.device_id != self.device:
                raise ValueError(f"Fp4Weight.{name}: on device {x.data.device_id}, the weight "
                                 f"says device {self.device}")
        # the kernels read each block as 16-byte chunks (cp.async / ld.v4) and 8-byte scale words
        check_aligned(self.data.data.ptr, "Fp4Weight.data", 16, "16-byte weight loads")
        check_aligned(self.scales.data.ptr, "Fp4Weight.scales", 8, "8-byte scale-word loads")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def strides(self) -> tuple[int, int, int, int]:
        """Byte strides of a block: W along tiles, W along steps, S along tiles, S along steps."""
        return block_strides(self.arrangement, self.data, self.scales)

    def __call__(self, A: Any, bias: Any = None, *, alpha: float = 1.0, out: Any = None,
                 dtype: str | None = None) -> Any:
        return fp4_gemm(A, self, bias, alpha=alpha, out=out, dtype=dtype)


def _ptr(x: Any) -> int:
    return x.data.ptr if hasattr(x.data, "ptr") else x.ctypes.data


def check_arrays(fmt: str, n: int, k: int, data: Any, scales: Any, post: Any,
                 arrangement: str = "tile_major") -> None:
    """Raise ValueError unless (data, scales, post) are the arrays of an Fp4Weight of this fmt,
    shape [n, k] and arrangement (see Fp4Weight): shapes, dtypes, C-contiguity (inline scales:
    the view of data's block tails). Any array module."""
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"Fp4Weight.arrangement: {arrangement!r}; expected one of {ARRANGEMENTS}")
    if fmt not in FMTS:
        raise ValueError(f"Fp4Weight.fmt: {fmt!r}; expected {' or '.join(FMTS)}")
    if not all(isinstance(v, (int, np.integer)) for v in (n, k)):
        raise ValueError(f"Fp4Weight: n and k must be integers, got {n!r}, {k!r}")
    check_shape(int(n), int(k))
    t, q, sb = -(-n // 16), k // 128, SCALE_BYTES[fmt]
    dshape, sshape = arranged_shapes(arrangement, t, q, sb)
    want = {"data": (dshape, "uint8"), "scales": (sshape, "uint8"),
            "post": ((1,) if fmt == "nvfp4" else (n,), "float32")}
    inline = arrangement.endswith("inline")
    for name, x in (("data", data), ("scales", scales), ("post", post)):
        shape, dt = want[name]
        if not all(hasattr(x, a) for a in ("shape", "dtype", "flags")):
            raise ValueError(f"Fp4Weight.{name}: expected an array, got {type(x).__name__}")
        if tuple(x.shape) != shape or str(x.dtype) != dt:
            raise ValueError(f"Fp4Weight.{name}: {x.dtype} {tuple(x.shape)}; a {fmt} weight "
                             f"[{n}, {k}] needs {dt} {shape} (build it with prepare_weight)")
        if name == "scales" and inline:
            if tuple(x.strides) != tuple(data.strides[:2]) + (1,) or _ptr(x) != _ptr(data) + 1024:
                raise ValueError(f"Fp4Weight.scales: {arrangement} scales must be data[:, :, 1024:]")
        elif not x.flags.c_contiguous:
            raise ValueError(f"Fp4Weight.{name}: must be C-contiguous")


def check_aligned(ptr: int, name: str, nbytes: int, why: str) -> None:
    """Raise ValueError unless the device address `ptr` of `name` is a multiple of nbytes."""
    if ptr % nbytes:
        raise ValueError(f"{name}: data pointer must be {nbytes}-byte aligned ({why}); it is "
                         f"{ptr % nbytes} bytes past a multiple of {nbytes}: pass a fresh array "
                         f"or a slice of whole rows")


def _cupy():
    import cupy

    return cupy


def _check_mx_tensor(t: Any) -> tuple[str, int, int]:
    """(fmt, N, K) of an MxTensor the FP4 GEMM can take, else ValueError (no array touched)."""
    for attr in ("fmt", "shape", "data", "scales", "scale_layout", "global_scale"):
        if not hasattr(t, attr):
            raise ValueError(f"W: expected an MxTensor (kernelgen.mx) or an Fp4Weight, got "
                             f"{type(t).__name__} without .{attr}")
    if t.fmt not in FMTS:
        raise ValueError(f"W: format {t.fmt!r}; the FP4 GEMM takes {' or '.join(FMTS)} weights")
    shape = tuple(int(s) for s in t.shape)
    if len(shape) != 2:
        raise ValueError(f"W: expected a 2-D weight [N, K], got shape {shape}")
    check_shape(*shape)
    return t.fmt, shape[0], shape[1]


def prepare_weight(t: Any, arrangement: str | None = None, *, act_dtype: str) -> Fp4Weight:
    """An MxTensor (fmt "nvfp4" or "mxfp4", any scale layout) -> Fp4Weight, on t's device.
    `arrangement` (layout.py ARRANGEMENTS; default ARRANGEMENT[fmt]) orders the blocks;
    `act_dtype` ("float16" / "bfloat16", the model's activations): the type the words are
    encoded for. A of the other type works too, 3-19% slower at M <= 16 (BENCHMARKS.md), and
    its kernels are not in `kernelgen prewarm`'s set: they compile on first use.

    Makes a copy in the kernels' tiled layout (layout.py; W's bytes, its scales, its global
    scale): keep the Fp4Weight and drop the MxTensor. Scales may be row-major [N, S] or
    swizzled ([ceil(N/128), ceil(S/4), 32, 4, 4], padding dropped); MXFP4 scales are rebased
    per row (see Fp4Weight).
    """
    fmt, n, k = _check_mx_tensor(t)
    act_dtype = dtype_name(act_dtype)
    if act_dtype not in DTYPES:
        raise ValueError(f"act_dtype={act_dtype!r}; expected one of {DTYPES}")
    cupy = _cupy()
    ctx = context_of(t.data, "W.data")
    data, _ = device_array(t.data, "W.data", ctx, ("uint8",))
    sc, _ = device_array(t.scales, "W.scales", ctx, ("uint8",))
    gs = None
    if fmt == "nvfp4":
        if t.global_scale is None:
            raise ValueError("W.global_scale: an nvfp4 weight needs its fp32 global scale")
        gs, _ = device_array(t.global_scale, "W.global_scale", ctx, ("float32",))
    with on_stream(ctx.device, ctx.stream):
        arr = ARRANGEMENT[fmt] if arrangement is None else arrangement
        data, sc, post = prepare_arrays(cupy, fmt, n, k, data, sc, t.scale_layout, gs, arr,
                                        act_dtype)
    return Fp4Weight(fmt, n, k, data, sc, post, ctx.device, arr, act_dtype)


def prepare_arrays(xp: Any, fmt: str, n: int, k: int, data: Any, scales: Any,
                   scale_layout: str, global_scale: Any, arrangement: str = "tile_major",
                   enc: str = "float16") -> tuple[Any, Any, Any]:
    """(data, scales, post) of an Fp4Weight from W's packed bytes [N, K/2], its scale bytes
    (row_major [N, S] or swizzled) and, for nvfp4, its fp32 global scale [1], the words encoded
    for the activation type `enc`; xp is the array module of the inputs (CuPy in
    prepare_weight, NumPy in the tests). All three results are new arrays: none shares memory
    with an input."""
    if tuple(data.shape) != (n, k // 2):
        raise ValueError(f"W.data: shape {tuple(data.shape)}; expected ({n}, {k // 2}) for a "
                         f"[{n}, {k}] fp4 weight (two elements a byte)")
    s_cols = k // GROUP[fmt]
    sc = scales
    if scale_layout == "row_major":
        if tuple(sc.shape) != (n, s_cols):
            raise ValueError(f"W.scales: row_major shape {tuple(sc.shape)}; expected ({n}, {s_cols})")
    elif scale_layout == "swizzled":
        mt, kt = -(-n // 128), -(-s_cols // 4)
        if sc.size != mt * kt * 512:
            raise ValueError(f"W.scales: swizzled scales have {sc.size} bytes; expected "
                             f"[{mt}, {kt}, 32, 4, 4] for {n} rows and {s_cols} scale columns")
        sc = sc.reshape(mt, kt, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(mt * 128, kt * 4)
        sc = xp.ascontiguousarray(sc[:n, :s_cols])
    else:
        raise ValueError(f"W.scale_layout: {scale_layout!r}; expected 'row_major' or 'swizzled'")
    if fmt == "nvfp4":
        if global_scale is None or global_scale.size != 1:
            got = "none" if global_scale is None else f"shape {tuple(global_scale.shape)}"
            raise ValueError(f"W.global_scale: expected 1 fp32 element, got {got}")
        post = global_scale.reshape(1).astype(xp.float32, copy=True)  # W's buffer may go away
    else:
        # relative E8M0 bytes, clamped: a group > 2^127 below the row's largest (an all-zero
        # group, scale 0x00, beside one of amax >= 8) would wrap to 0xFF (NaN) or 2^127. A NaN
        # group makes its row's factor NaN (every output of the row is NaN, as in the reference;
        # the kernels' scale decode then needs no NaN case)
        s = sc.astype(xp.int32)
        nan = s == 0xFF
        rowmax = xp.where(nan, 0, s).max(axis=1, keepdims=True)
        sc = xp.where(nan, 0xFF, xp.clip(s - rowmax + 127, 0, 254)).astype(xp.uint8)
        post = xp.ldexp(xp.ones(n, xp.float32), (rowmax[:, 0] - 127).astype(xp.int32))
        post = xp.where(nan.any(axis=1), xp.float32(xp.nan), post).astype(xp.float32)
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement {arrangement!r}: expected one of {ARRANGEMENTS}")
    td, ts = arrange(xp, tile_data(xp, data, n, k, enc),
                     tile_scales(xp, sc, n, k, SCALE_BYTES[fmt]), arrangement)
    return td, ts, post


# prepared weights of MxTensors passed to fp4_gemm directly, encoded for the activation type
# of the call: (id, act dtype) -> (weakref, Fp4Weight)
_prepared: dict[tuple[int, str], tuple[Any, Fp4Weight]] = {}


def _as_weight(W: Any, act_dtype: str) -> Fp4Weight:
    if isinstance(W, Fp4Weight):
        return W
    key = (id(W), act_dtype)
    hit = _prepared.get(key)
    if hit is not None and hit[0]() is W:
        return hit[1]
    prep = prepare_weight(W, act_dtype=act_dtype)
    try:
        ref = weakref.ref(W, lambda _r: _prepared.pop(key, None))
    except TypeError:  # not weak-referenceable: prepare on every call
        return prep
    _prepared[key] = (ref, prep)
    return prep


def fp4_gemm(A: Any, W: Any, bias: Any = None, *, alpha: float = 1.0, out: Any = None,
             dtype: str | None = None, split_k: int | None = None, path: str | None = None,
             _plan: Plan | None = None) -> Any:
    """D = alpha * A . W^T (+ bias).

    A [..., K] fp16 / bf16 (contiguous, 16-byte aligned, K % 128 == 0); W an MxTensor of fmt
    "nvfp4" / "mxfp4" (prepared for A's dtype on first use and remembered: one prepared copy
    per dtype it is used with) or an Fp4Weight from `prepare_weight` (either A dtype; the one
    it was prepared for is faster); bias [N] and D [..., N] in A's dtype; fp32 accumulation,
    D rounded to nearest. On sm_90a mid M (select.wgmma_takes) runs the wgmma path (the weights
    of each step decoded into shared memory for warpgroup MMA); otherwise large M
    (select.DENSE_MIN_M) runs W made dense in A's dtype (exact for NVFP4; MXFP4 values as the
    format gives them, within the dtype's range) through cuBLAS. `out` receives D.
    `dtype="bfloat16"` marks CuPy uint16 data as bf16. `split_k` / `path` ("gemv" | "tile" |
    "dequant" | "wgmma": sm_90a) override the selector (tests, tuning; a
    `split_k` alone where the selector would dequantize runs the tile path; `_plan` replaces
    both, for benchmarks of variants). Runs on the caller's current stream; returns the caller's
    array kind.
    A call without a forced choice is memoised on W per signature of A, bias, out, alpha and
    dtype (core/fastcall.py: the next such call skips the checks and the selector).
    """
    if split_k is None and path is None and _plan is None:
        return fastcall.call("fp4_gemm", W, A, bias,
                             lambda: _fp4_gemm(A, W, bias, alpha, out, dtype, None, None, None),
                             out, (alpha, dtype))
    return _fp4_gemm(A, W, bias, alpha, out, dtype, split_k, path, _plan)


def _fp4_gemm(A: Any, W: Any, bias: Any, alpha: float, out: Any, dtype: str | None,
              split_k: int | None, path: str | None, _plan: Plan | None) -> Any:
    split_k = optional_int(split_k, "split_k")
    if isinstance(W, Fp4Weight):
        wn, wk, wdev = W.n, W.k, W.device
    else:  # W's errors before A's; A's before an MxTensor is prepared (a copy and launches)
        _, wn, wk = _check_mx_tensor(W)
        wdev = context_of(W.data, "W.data").device
    ctx = context_of(A, "A")
    a, dt = device_array(A, "A", ctx, DTYPES, hint=dtype)
    if a.ndim < 2:
        raise ValueError(f"A: expected [M, K] (or [..., K]), got shape {tuple(a.shape)}")
    k, n = int(a.shape[-1]), wn
    if k != wk:
        raise ValueError(f"A: K={k} does not match the weight's K={wk} (W is [{wn}, {wk}])")
    if wdev != ctx.device:
        raise ValueError(f"W: on device {wdev}, A is on device {ctx.device}")
    check_aligned(a.data.ptr, "A", 16, "the kernels load A in 16-byte chunks")
    W = _as_weight(W, dt)
    m = int(a.size // k)
    b, out, c = gemm_bias_out(ctx, a, bias, out, n, k, dt)
    if b is not None:
        check_aligned(b.data.ptr, "bias", 2, "the kernels load one 2-byte element at a time")
    else:
        b = a
    check_aligned(c.data.ptr, "out", 2, "the kernels store one 2-byte element at a time")
    if m == 0:
        return out
    info = device_info(ctx.device)
    if _plan is not None:  # its kernel must decode W's encoding
        p = _plan if _plan.config.enc == W.encoding else dataclasses.replace(
            _plan, config=_plan.config.replace(enc=W.encoding))
    elif split_k is None and path is None:
        p = select_fp4(info.arch.name, m, n, k, W.fmt, dt, info.sm_count, W.encoding,
                       smem_limit(ctx.device))
    else:
        p = plan(info.arch.name, m, n, k, W.fmt, dt, info.sm_count, path=path,
                 split=None if split_k is None else int(split_k), enc=W.encoding,
                 smem_limit=smem_limit(ctx.device))
    launch_plan(ctx, p, W.data, W.scales, W.post, W.strides(), a, b, bias is not None, alpha, c,
                m, n, k)
    return out


def launch_plan(ctx: Ctx, p: Plan, data: Any, scales: Any, post: Any,
                strides: tuple[int, int, int, int], a: Any, b: Any, has_bias: bool, alpha: float,
                c: Any, m: int, n: int, k: int) -> None:
    """Launch a plan of the tiled-weight kernels (gemv.cuh / tile.cuh / wgmma.cuh) on ctx's stream: the
    weight's tiled (data, scales), its post array (NVFP4 global scale, MXFP4 row factors, the
    kbit4 codebook) and block strides (W along tiles / steps, S along tiles / steps). The
    dequant path writes W dense into a scratch (its kernel also writes cuBLAS's alpha and beta
    to device scalars: NVFP4's alpha / gs), then cuBLAS multiplies (core/dense.py)."""
    wt, wq, st, sq = strides
    if max(wq, sq) >= 1 << 32:
        raise ValueError(f"W: a step stride of {max(wq, sq)} bytes; the kernels take < 2**32")
    if p.path == "dequant":
        scalars = device_scalars(ctx)
        dense_gemm(ctx, lambda _w, wv: dequantize_dense(ctx, p, data, scales, post, strides, wv,
                                                         n, k, alpha, has_bias, scalars),
                   a, b, has_bias, c, m, n, k, p.config.dtype, scalars=scalars)
        return
    fn = get_kernel(p.config, ctx.device, ctx.stream).fn(p.config.symbols()[0])
    sizes = p.scratch_sizes(m, n)
    if sizes is not None:
        ws, counters = scratch(ctx, "fp4_gemm", *sizes)
    else:
        ws = counters = c
    args = (data, scales, post, a, b, np.int32(has_bias), np.float32(alpha), c, ws,
            counters, np.int32(m), np.int32(n), np.int32(k), np.int32(p.sps))
    if p.path == "gemv":
        args += (np.int32(p.kw.bit_length() - 1),)
    args += (np.int64(wt), np.uint32(wq), np.int64(st), np.uint32(sq))
    ctx.launch(fn, p.grid, p.block, args, smem=p.smem, memo=True)


def dequantize_dense(ctx: Ctx, p: Plan, data: Any, scales: Any, post: Any,
                     strides: tuple[int, int, int, int], out: Any, n: int, k: int, alpha: float,
                     has_bias: bool, scalars: Any) -> None:
    """The dequant path's first kernel (templates/fp4_gemm/dequant.cuh) on ctx's stream: out
    ([N, K] cupy array of the plan's dtype) = W' and scalars (float32 [2]) = cuBLAS's (alpha,
    beta): NVFP4 W' = e2m1 e4m3 2^-UNIT_EXP with alpha 2^UNIT_EXP / gs, MXFP4 W' = the format's
    values with alpha as given."""
    wt, wq, st, sq = strides
    fn = get_kernel(p.config, ctx.device, ctx.stream).fn(p.config.symbols()[0])
    ctx.launch(fn, p.grid, p.block, (data, scales, post, out, np.int32(n), np.int32(k),
                                     np.int64(wt), np.uint32(wq), np.int64(st), np.uint32(sq),
                                     np.float32(alpha), np.int32(has_bias), scalars))
