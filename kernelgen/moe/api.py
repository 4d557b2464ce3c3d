"""Public MoE API: the grouped GEMM over expert segments, and the whole layer `fused_moe`.
CuPy arrays or torch tensors in, the caller's kind out, on the caller's current stream."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..arch import device_info
from ..core import fastcall
from ..core.interop import _cupy, _torch_to_cupy, context_of, device_array, smem_limit
from ..core.jit import get_kernel
from ..moe_routing import MoeLayout, moe_combine, moe_dispatch, moe_layout
from ..moe_routing.api import _capturing, capture_error, checked_total
from ..moe_routing.api import _rows_of as rows_of
from ..moe_routing.config import ID_DTYPES, W_DTYPES
from .config import DTYPES, MoeGemmConfig, MoeKbitConfig, MoeKbitGemvConfig
from .kbit import (
    KbitExperts,
    KbitGemvPlan,
    check_kbit_epilogue,
    forced_kbit_gemv_plan,
    forced_kbit_plan,
    plan_kbit,
    plan_kbit_gemv,
    select_kbit,
    select_kbit_gemv,
)
from .select import check_policy, check_shape, forced_grouped, plan_grouped, select_grouped


def grouped_gemm(x: Any, w: Any, offsets: Any, *, activation: str | None = None, out: Any = None,
                 rows: int | None = None, tile_m: int | None = None, swap_ab: bool | None = None,
                 tile_n: int | None = None, policy: str = "threshold",
                 dtype: str | None = None, wgmma: bool | None = None,
                 config: MoeGemmConfig | MoeKbitConfig | MoeKbitGemvConfig | KbitGemvPlan | None = None
                 ) -> Any:
    """Y[rows of e] = X[rows of e] . W[e]^T for every expert e, one launch.

    x [M, K] and w [E, N, K] fp16 / bf16 (same dtype, contiguous, 16-byte aligned; CuPy bf16:
    uint16 with dtype="bfloat16"), or w a KbitExperts from quantize_experts (2-4 bits,
    dequantized in registers; flat layout: tile_m 8 / 16 / 32, always swap_ab; tiled 4-bit
    layout: tile_m 8 / 16 tokens a pass). offsets [E + 1] int32 on
    the device: expert e owns rows [offsets[e], offsets[e+1]) (any segment sizes, padded or
    not; never read on the host), or the MoeLayout of moe_layout (its offsets; checked against
    x's rows once an exact dispatch or total() has read offsets[E] on the host). offsets[E]
    must be <= M: offsets are device data, not checked on the host otherwise (no sync); the
    kernel clamps every segment to the first M rows, so rows past M are never read or written.
    activation="swiglu": w is W13 [E, 2I, K] (gate rows, then up rows) and Y [M, I] =
    silu(X . gate^T) * (X . up^T). Rows of Y outside every segment are not written.
    `rows`: the host-side row count the selector uses, <= M (default M; e.g. T * top_k when x
    is a capacity-sized buffer). tile_m / swap_ab / tile_n (tile_n: dense weights only) force a
    table row; policy "threshold" (default) or "waste" picks TILE_M (kernelgen.moe.select);
    wgmma True / False forces the main loop (True: warpgroup MMA, sm_90a only, its stages
    copied by TMA, at the nearest TILE_M that has a wgmma tile where tile_m is not given; None:
    the selector's; a MoeGemmConfig with tma=False keeps cp.async copies);
    `config` forces a whole
    MoeGemmConfig / MoeKbitConfig / MoeKbitGemvConfig (tuning; dtype, epilogue and bits must
    match the call, arch the device's; the last with one warp a tile along K, or a whole
    KbitGemvPlan of plan_kbit_gemv with its kw).
    A call without `config` is memoised on w per signature of x, the offsets array, out and the
    other arguments (core/fastcall.py: the next such call skips the checks and the selector;
    a MoeLayout's host-read offsets[E] is still checked against x's rows).
    """
    def full() -> Any:
        return _grouped_gemm(x, w, offsets, activation, out, rows, tile_m, swap_ab, tile_n, policy,
                             dtype, wgmma, config)

    if config is not None:
        return full()
    off = offsets
    if isinstance(offsets, MoeLayout):
        off = offsets.offsets
        if offsets.known_total is not None and len(getattr(x, "shape", ())) == 2:
            check_rows(int(x.shape[0]), rows, offsets.known_total)
    extra = (activation, rows, tile_m, swap_ab, tile_n, policy, dtype, wgmma, _storage(w))
    if out is None:
        return fastcall.memoised("grouped_gemm", w, (x, off), extra, full, lambda y: (y,),
                                 lambda y: fastcall.first, lambda: _kept(w))
    return fastcall.memoised("grouped_gemm", w, (x, off, out), extra, full, lambda y: (),
                             lambda y: fastcall.given_out, lambda: _kept(w))


def _grouped_gemm(x: Any, w: Any, offsets: Any, activation: str | None, out: Any, rows: int | None,
                  tile_m: int | None, swap_ab: bool | None, tile_n: int | None, policy: str,
                  dtype: str | None, wgmma: bool | None, config: Any) -> Any:
    """grouped_gemm's whole path."""
    ctx = context_of(x, "x")
    xa, dt = device_array(x, "x", ctx, DTYPES, hint=dtype, ndim=2)
    kbit = isinstance(w, KbitExperts)
    if kbit:
        e, n, kw = w.shape
    else:
        wa, wdt = device_array(w, "w", ctx, DTYPES, hint=dt, ndim=3)
        if wdt != dt:
            raise ValueError(f"w: dtype {wdt}; must match x ({dt})")
        e, n, kw = (int(s) for s in wa.shape)
    known = None  # offsets[E] when the host has read it already
    if isinstance(offsets, MoeLayout):
        known, offsets = offsets.known_total, offsets.offsets
    off, _ = device_array(offsets, "offsets", ctx, ("int32",), ndim=1)
    m, k = int(xa.shape[0]), int(xa.shape[1])
    check_rows(m, rows, known)
    if kw != k:
        raise ValueError(f"w: K={kw} does not match x's K={k} (x [{m}, {k}], w [{e}, {n}, {kw}])")
    if off.shape[0] != e + 1:
        raise ValueError(f"offsets: {off.shape[0]} entries; E={e} experts need E + 1")
    epilogue = "swiglu" if activation == "swiglu" else "none"
    if activation not in (None, "swiglu"):
        raise ValueError(f"activation={activation!r}: expected None or 'swiglu'")
    for name, arr in (("x", xa),) if kbit else (("x", xa), ("w", wa)):
        if arr.data.ptr % 16:
            raise ValueError(f"{name}: data pointer must be 16-byte aligned")
    n_out = n // 2 if epilogue == "swiglu" else n
    if out is None:
        out, ya = ctx.empty((m, n_out), dt)
    else:
        ya, _ = device_array(out, "out", ctx, (dt,), hint=dt, ndim=2)
        if tuple(ya.shape) != (m, n_out):
            raise ValueError(f"out: shape {tuple(ya.shape)}; expected {(m, n_out)} "
                             f"(x [{m}, {k}], w [{e}, {n}, {k}], activation={activation})")
        if ya.data.ptr % 4:
            raise ValueError("out: data pointer must be 4-byte aligned")
    if m == 0:
        return out
    info = device_info(ctx.device)
    r = m if rows is None else max(1, int(rows))
    plan = plan_experts(info, smem_limit(ctx.device), w, dt, epilogue, r, tile_m, swap_ab, tile_n,
                        policy, wgmma, config)
    if kbit and w.layout == "tiled":
        launch_tiled(ctx, xa, w, off, ya, m, plan)
        return out
    if kbit:
        packed, absmax, cb = w.q._views(ctx)
        fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("moe_grouped_kbit")
        ctx.launch(fn, plan.grid(m), plan.block, (xa, packed, absmax, cb, off, ya, np.int32(e),
                                                  np.int32(n), np.int32(k), np.int32(m)),
                   smem=plan.smem, memo=True)
        return out
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("moe_grouped_gemm")
    if plan.config.tma:  # not memoisable: the tensor maps hold x's address
        tx, tw = tensor_maps(plan.config, xa, wa, m, e, n, k)
        ctx.launch(fn, plan.grid(m), plan.block,
                   (tx, tw, off, ya, np.int32(e), np.int32(n), np.int32(k), np.int32(m)), smem=plan.smem)
        return out
    ctx.launch(fn, plan.grid(m), plan.block,
               (xa, wa, off, ya, np.int32(e), np.int32(n), np.int32(k), np.int32(m)), smem=plan.smem,
               memo=True)
    return out


def plan_experts(info: Any, lim: int | None, w: Any, dt: str, epilogue: str, rows: int,
                 tile_m: int | None, swap_ab: bool | None, tile_n: int | None, policy: str,
                 wgmma: bool | None, config: Any) -> Any:
    """The launch plan of grouped_gemm for weights w (dense [E, N, K] or KbitExperts) at `rows`
    selector rows: host work only, so fused_moe checks both of its GEMMs' arguments before its
    first launch. Raises ValueError on a forced choice the weights cannot take."""
    check_policy(policy)
    arch = info.arch.name
    if not isinstance(w, KbitExperts):
        e, n, k = (int(s) for s in w.shape)
        if config is not None:
            return forced_grouped(config, arch, dt, epilogue, e, n, k)
        if tile_m is None and swap_ab is None and tile_n is None and wgmma is None:
            return select_grouped(arch, info.sm_count, dt, e, n, k, rows, epilogue, policy, lim)
        return plan_grouped(arch, info.sm_count, dt, e, n, k, rows, epilogue, tile_m, swap_ab,
                            tile_n, policy, wgmma, lim)
    e, n, k = w.shape
    if swap_ab is False:
        raise ValueError("swap_ab=False: kbit experts always run swap_ab (decode kernel)")
    if wgmma:
        raise ValueError("wgmma=True: kbit experts run their own decode kernel (mma.sync)")
    if tile_n is not None:
        raise ValueError(f"tile_n={tile_n}: kbit experts take no tile_n (their tile is 16 W rows)")
    if w.layout == "tiled":  # the FP4 bandwidth kernel over find_tile's work items
        if isinstance(config, KbitGemvPlan):  # a whole plan (kw too): tests, benchmarks
            return forced_kbit_gemv_plan(config.config, arch, dt, epilogue, e, n, k, config.kw)
        if config is not None:
            return forced_kbit_gemv_plan(config, arch, dt, epilogue, e, n, k)
        if tile_m is None:
            return select_kbit_gemv(arch, info.sm_count, dt, e, n, k, rows, epilogue)
        return plan_kbit_gemv(arch, info.sm_count, dt, e, n, k, rows, epilogue, tile_m)
    if config is not None:
        return forced_kbit_plan(config, arch, dt, epilogue, w.bits, e, n, k)
    if tile_m is None:
        return select_kbit(arch, info.sm_count, dt, w.bits, e, n, k, rows, epilogue, lim)
    return plan_kbit(arch, info.sm_count, dt, w.bits, e, n, k, rows, epilogue, tile_m,
                     smem_limit=lim)


def tensor_maps(config: MoeGemmConfig, xa: Any, wa: Any, m: int, e: int, n: int, k: int) -> tuple:
    """The two tensor maps of the TMA variant (templates/moe/grouped_wgmma.cuh GroupedWgmmaTma):
    X [M, K] in boxes of tile_m rows x 64 k; W [E, N, K] in boxes of tile_n rows x 64 k, or with
    swiglu the view [E, I / 8, 2, 8, K] of W13 (8-row blocks of gate, then up rows) in boxes of
    tile_n / 16 block pairs: the interleave of the mma.sync path's weight_row. check_shape's
    rules (K % 8, N % 16 with swiglu) are what the maps need."""
    from ..core.tma import encode_tiled

    rb = 2 * k  # bytes a row
    tx = encode_tiled(xa.data.ptr, (k, m), (rb,), (64, config.tile_m))
    if config.epilogue == "swiglu":
        i = n // 2
        tw = encode_tiled(wa.data.ptr, (k, 8, 2, i // 8, e), (rb, i * rb, 8 * rb, n * rb),
                          (64, 8, 2, config.tile_n // 16, 1))
    else:
        tw = encode_tiled(wa.data.ptr, (k, n, e), (rb, n * rb), (64, config.tile_n, 1))
    return tx, tw


def launch_tiled(ctx: Any, xa: Any, w: KbitExperts, off: Any, ya: Any, m: int, plan: Any) -> None:
    """Tiled kbit4 experts: the FP4 bandwidth kernel over find_tile's work items."""
    e, n, k = w.shape
    t = w.tiled
    if t.device != ctx.device:
        raise ValueError(f"w: tiled experts on device {t.device}, x on device {ctx.device}")
    wt, wq, st, sq = t.strides()
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("moe_grouped_gemv")
    ctx.launch(fn, plan.grid(m), plan.block,
               (t.data, t.scales, t.codebook, xa, off, ya, np.int32(e), np.int32(n), np.int32(k),
                np.int32(m), np.int32(plan.kw.bit_length() - 1), np.int32(plan.n_ctas), np.int64(wt), np.uint32(wq),
                np.int64(st), np.uint32(sq)), smem=plan.smem, memo=True)


def check_weight(w: Any, name: str, ctx: Any, dt: str, epilogue: str) -> tuple[int, int, int]:
    """The shape [E, N, K] of expert weights (x's dtype, or KbitExperts) after the rules
    grouped_gemm applies before its launch: dtype, device, contiguity, alignment, the shape and
    the epilogue's (kbit experts: their shape rules hold from quantize_experts)."""
    if isinstance(w, KbitExperts):
        check_kbit_epilogue(w.n, epilogue, w.layout, name)
        if w.layout == "flat":
            w.q._views(ctx)
        elif w.tiled.device != ctx.device:
            raise ValueError(f"{name}: tiled experts on device {w.tiled.device}, x on device "
                             f"{ctx.device}")
        return w.shape
    wa, _ = device_array(w, name, ctx, (dt,), hint=dt, ndim=3)
    e, n, k = (int(s) for s in wa.shape)
    check_shape(e, n, k, epilogue, name)
    if wa.data.ptr % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")
    return e, n, k


def check_rows(m: int, rows: int | None, known_total: int | None = None) -> None:
    """Host-side bounds of offsets[E] against x's M rows: `rows` (the selector's row count)
    and offsets[E] where the host knows it must not exceed M."""
    if rows is not None:
        try:
            r = int(rows)
        except (TypeError, ValueError):  # None, a list, 'x': not a row count
            r = -1
        if not 0 <= r <= m:
            raise ValueError(f"rows={rows!r}: must be in 0..M={m} (x's rows; offsets[E] <= M)")
    if known_total is not None and known_total > m:
        raise ValueError(f"offsets: offsets[E]={known_total} rows exceed x's M={m} rows")


def fused_moe(x: Any, topk_ids: Any, topk_weights: Any, w13: Any, w2: Any, *,
              graph_safe: bool = False, tile_m: int | None = None, swap_ab: bool | None = None,
              policy: str = "threshold", dtype: str | None = None,
              workspace: dict | None = None) -> Any:
    """The MoE layer: out[t] = sum_j topk_weights[t, j] * W2[e] . silu-glu(W13[e] . x[t]).

    x [T, H] fp16 / bf16; topk_ids [T, top_k] int32 / int64; topk_weights [T, top_k];
    w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I] in x's dtype, or either as
    KbitExperts (quantize_experts).
    Steps: layout (pad_to=1: the grouped GEMM masks rows per expert, so segments need no
    padding) -> dispatch -> W13 + SwiGLU -> W2 -> combine. The exact dispatch (default) reads
    offsets[E] on the host (one small copy; an id outside [0, E) raises ValueError), so x_perm
    has offsets[E] = T * top_k rows. `graph_safe=True` asks dispatch for its no-sync
    capacity buffer (T * top_k rows with pad_to=1); offsets[E] is then T * top_k less the
    dropped ids, rows past it stay unwritten and nothing reads them. Every launch size comes
    from host shapes and nothing syncs.
    Under CUDA-graph capture: the kernels must be compiled already (an eager call or
    `kernelgen prewarm`), and the intermediates (layout, x_perm, hidden, y_perm), allocated
    in the call, must outlive the graph: torch's graph capture keeps them in its private
    pool; under CuPy capture pass `workspace={}` (it receives them under those keys) and
    keep it as long as the graph, or CuPy's pool may hand their memory to other arrays
    while replays still write there.
    A call without `workspace` is memoised on the pair (w13, w2) per signature of x, topk_ids,
    topk_weights and the other arguments (core/fastcall.py): the next such call allocates the
    intermediates and sends the kernels with the launch arguments of the first (on the exact
    dispatch, after the same host check of the ids), skipping the Python of the five steps.
    """
    def full() -> tuple:
        return _fused_moe(x, topk_ids, topk_weights, w13, w2, graph_safe, tile_m, swap_ab, policy,
                          dtype)

    if workspace is not None:
        out, layout, x_perm, hid, y_perm = full()
        workspace.update(layout=layout, x_perm=x_perm, hidden=hid, y_perm=y_perm)
        return out
    return fastcall.memoised("fused_moe", (w13, w2), (x, topk_ids, topk_weights),
                             (graph_safe, tile_m, swap_ab, policy, dtype, _storage(w13), _storage(w2)),
                             full, _made,
                             lambda r: _first_of, lambda: _kept(w13) | _kept(w2))[0]


def _storage(w: Any) -> tuple | None:
    """A dense weight's pointer, shape and dtype (part of a memo's signature: torch can give the
    same tensor new storage, e.g. module.cpu() then .cuda()); None for KbitExperts."""
    if isinstance(w, KbitExperts):
        return None
    if hasattr(w, "data_ptr"):
        return (w.data_ptr(), tuple(w.shape), str(w.dtype))
    data = getattr(w, "data", None)
    return (getattr(data, "ptr", None), tuple(getattr(w, "shape", ())), str(getattr(w, "dtype", "")))


def _made(r: tuple) -> tuple:
    """fused_moe's new arrays: out, the layout's one buffer, x_perm, hidden, y_perm."""
    out, layout, x_perm, hid, y_perm = r
    return out, layout._views["base"], x_perm, hid, y_perm


def _first_of(outs: list, inputs: tuple) -> tuple:
    return (outs[0],)


def _kept(w: Any) -> set:
    """The pointers of a weight's device arrays (dense experts, or KbitExperts' arrays)."""
    if isinstance(w, KbitExperts):
        arrs = (w.q.packed, w.q.absmax, w.q.codebook) if w.tiled is None else \
            (w.tiled.data, w.tiled.scales, w.tiled.codebook)
    else:
        arrs = (w,)
    return {a.data_ptr() if hasattr(a, "data_ptr") else a.data.ptr for a in arrs}


def _fused_moe(x: Any, topk_ids: Any, topk_weights: Any, w13: Any, w2: Any, graph_safe: bool,
               tile_m: int | None, swap_ab: bool | None, policy: str, dtype: str | None) -> tuple:
    """fused_moe's whole path: (out, layout, x_perm, hidden, y_perm)."""
    # every argument rule the steps below apply is checked here, before the first launch
    ctx = context_of(x, "x")
    xa, dt = device_array(x, "x", ctx, DTYPES, hint=dtype, ndim=2)
    ids, _ = device_array(topk_ids, "topk_ids", ctx, ID_DTYPES, ndim=2)
    s13, s2 = check_weight(w13, "w13", ctx, dt, "swiglu"), check_weight(w2, "w2", ctx, dt, "none")
    t, h = (int(s) for s in xa.shape)
    e, two_i, h13 = s13
    if h13 != h:
        raise ValueError(f"w13: shape {s13}; its last dim must be x's H={h}")
    if s2 != (e, h, two_i // 2):
        raise ValueError(f"w2: shape {s2}; expected [E, H, I] = {(e, h, two_i // 2)} from w13 "
                         f"{s13} and x {tuple(xa.shape)}")
    ids_shape = tuple(int(s) for s in ids.shape)
    if ids_shape[0] != t:
        raise ValueError(f"topk_ids: shape {ids_shape}; expected [T={t}, top_k]")
    top_k = ids_shape[1]
    wts, _ = device_array(topk_weights, "topk_weights", ctx, W_DTYPES, hint=dt)  # moe_combine's
    if tuple(int(s) for s in wts.shape) not in ((t, top_k), (t * top_k,)):
        raise ValueError(f"topk_weights: shape {tuple(wts.shape)}; expected [{t}, {top_k}] like "
                         f"topk_ids")
    rows_of(xa, "x")  # moe_dispatch's rules: rows of 16-byte vectors, 16-byte aligned
    rows = t * top_k

    def forced(wt: Any) -> dict[str, Any]:  # kbit experts: tile_m 8..32 (tiled 8 / 16), swap_ab
        if isinstance(wt, KbitExperts):
            return dict(tile_m=None if tile_m is None else min(tile_m, 16 if wt.layout == "tiled" else 32))
        return dict(tile_m=tile_m, swap_ab=swap_ab)

    # both GEMMs' plans (host work, memoised): a forced tile_m / swap_ab or a policy the
    # weights cannot take raises here, not after the routing kernels ran
    check_policy(policy)
    if rows:
        info, lim = device_info(ctx.device), smem_limit(ctx.device)
        for wt, epilogue in ((w13, "swiglu"), (w2, "none")):
            f = forced(wt)
            plan_experts(info, lim, wt, dt, epilogue, rows, f["tile_m"], f.get("swap_ab"), None,
                         policy, None, None)
    layout = moe_layout(topk_ids, e, pad_to=1)
    if not graph_safe:  # a replay of the memo repeats the exact dispatch's check of the ids
        sp, dev = ctx.stream.ptr, ctx.device  # not the stream object: the memo outlives it
        fastcall.check_point(lambda outs, inputs: _check_ids_read(outs[1], inputs[1], e, top_k, sp, dev))
    x_perm = moe_dispatch(x, layout, exact=not graph_safe, dtype=dt)
    kw = dict(rows=rows, policy=policy, dtype=dt)
    hid = grouped_gemm(x_perm, w13, layout, activation="swiglu", **kw, **forced(w13))
    y_perm = grouped_gemm(hid, w2, layout, **kw, **forced(w2))
    return moe_combine(y_perm, layout, topk_weights, dtype=dt), layout, x_perm, hid, y_perm


def _check_ids_read(buf: Any, ids: Any, e: int, top_k: int, stream_ptr: int, device: int) -> None:
    """The exact dispatch's host check, on a replay's layout buffer and topk_ids (either kind),
    on the recorded stream (the signature's)."""
    cupy = _cupy()
    with warnings.catch_warnings():  # ExternalStream: the handle-based form (core/interop.py)
        warnings.simplefilter("ignore", DeprecationWarning)
        stream = cupy.cuda.ExternalStream(stream_ptr, device)
    if _capturing(stream):
        raise capture_error()
    view = (lambda a: a) if isinstance(buf, cupy.ndarray) else _torch_to_cupy
    checked_total(view(buf), view(ids), e, top_k, stream, device)
