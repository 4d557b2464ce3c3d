"""Public MoE routing API: layout (phase 1), dispatch (phase 2), combine. CuPy or torch.

    layout = moe_layout(topk_ids, E, pad_to=1)        # no host sync
    x_perm = moe_dispatch(x, layout)                   # exact: one 12-byte device->host copy
    x_perm = moe_dispatch(x, layout, exact=False)      # [capacity, H], no sync, graph-safe
    out = moe_combine(y_perm, layout, topk_weights)    # out[t] = sum_j w[t,j] y_perm[dest[t,j]]

Ids outside [0, E) are dropped (no row; dest = -1; they add nothing in combine) and counted on
the device in `layout.invalid` = [count, first bad flat index]; the exact dispatch and
`layout.check()` raise ValueError naming the first bad token. The graph-safe path never syncs:
check `layout.invalid` (or call `layout.check()`) outside the graph.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arch import device_info
from ..core.interop import context_of, device_array
from ..core.jit import get_kernel
from ..errors import GraphCaptureError
from .config import (
    DTYPES,
    FUSED_MAX,
    ID_DTYPES,
    MOVE_THREADS,
    W_DTYPES,
    MoeCombineConfig,
    MoeDispatchConfig,
)
from .select import (
    CHUNK,
    ROUTE_FUSED_MAX,
    check_experts,
    combine_launch,
    move_grid,
    plan_layout,
    plan_route,
    select_layout,
)

MOVE_DTYPES = ("float16", "bfloat16", "float32", "uint16", "uint8")  # dispatch copies bytes
INT32_LIMIT = (1 << 31) - 1


@dataclass(frozen=True, eq=False)
class MoeLayout:
    """Phase-1 result; arrays are int32 of the caller's kind (CuPy or torch), on its device.

    counts [E], offsets [E + 1] (segments padded to pad_to; offsets[E] = rows incl. padding),
    dest [T * top_k] (row of pair t * top_k + j; stable within an expert; -1 for a dropped id),
    src [capacity] (pair of each row; -1 for padding rows and rows >= offsets[E]),
    invalid [2] (dropped ids, first dropped flat index or INT32_MAX).
    capacity = T * top_k + E * (pad_to - 1): what graph-safe callers allocate.
    `stream`: the (cupy) stream its kernels were queued on; host reads wait for it.
    `kind`: its arrays' kind ("cupy" / "torch"); dispatch and combine take arrays of that kind.
    """

    num_experts: int
    top_k: int
    num_tokens: int
    pad_to: int
    capacity: int
    counts: Any
    offsets: Any
    dest: Any
    src: Any
    invalid: Any
    multi: bool  # made by the multi-CTA path
    _views: dict = field(repr=False, compare=False)  # cupy views: buf, offsets, dest, src, ids
    _host: dict = field(default_factory=dict, repr=False, compare=False)  # total once copied
    stream: Any = field(default=None, repr=False, compare=False)
    kind: str = field(default="cupy", repr=False, compare=False)

    @property
    def device(self) -> int:
        return self._views["buf"].data.device_id

    @property
    def known_total(self) -> int | None:
        """offsets[E] if the host has read it (exact dispatch, total()), else None."""
        return self._host.get("total")

    def _meta(self, stream: Any) -> int:
        """One device->host copy of (offsets[E], invalid) on `stream`, after the layout's own
        stream when that is another one; raises on a dropped id; the total. While either
        stream captures a CUDA graph the copy (and the wait) would break the capture: raises
        GraphCaptureError instead."""
        if "total" not in self._host:
            if _capturing(stream) or (self.stream is not None and _capturing(self.stream)):
                raise capture_error()
            if self.stream is not None and self.stream.ptr != stream.ptr:
                self.stream.synchronize()  # the layout kernels may sit on a non-blocking stream
            self._host["total"] = checked_total(self._views["buf"], self._views["ids"],
                                                self.num_experts, self.top_k, stream, self.device)
        return self._host["total"]

    def total(self) -> int:
        """offsets[E] read now: waits for the stream the layout was built on and reads on the
        caller's current stream of the layout's kind (torch's for torch tensors), so after a
        graph replay on that stream too; raises ValueError naming the first out-of-range id."""
        self._host.pop("total", None)
        return self._meta(context_of(self.offsets, "layout").stream)

    def check(self) -> int:
        """Alias of total(): the exact path's validation, for graph-safe callers."""
        return self.total()


def capture_error() -> GraphCaptureError:
    return GraphCaptureError(
        "offsets[E] is read on the host (moe_dispatch / moe_route exact=True, "
        "fused_moe graph_safe=False, layout.total() / check()) while the stream is "
        "capturing a CUDA graph; the device->host copy would break the capture. "
        "Under capture pass exact=False (moe_dispatch, moe_route) or graph_safe=True "
        "(fused_moe), and call layout.check() outside the graph.")


def _read(view: Any, stream: Any, device: int) -> np.ndarray:
    """Blocking device->host copy queued on `stream` (of `device`)."""
    import cupy

    with cupy.cuda.Device(device):
        return cupy.asnumpy(view, stream=stream)


def checked_total(buf: Any, ids: Any, e: int, k: int, stream: Any, device: int) -> int:
    """offsets[E] of a layout buffer (cupy int32 [counts E | offsets E+1 | invalid 2 | ...]),
    read with one blocking copy on `stream`; raises ValueError naming the first out-of-range id
    of `ids` (a cupy [T, k] view) where the layout dropped any."""
    total, bad, first = (int(v) for v in _read(buf[2 * e: 2 * e + 3], stream, device))
    if bad:
        t, j = divmod(first, k)
        val = int(_read(ids.reshape(-1)[first: first + 1], stream, device)[0])
        raise ValueError(f"topk_ids: token {t} slot {j} names expert {val}, outside "
                         f"[0, {e}) ({bad} id(s) out of range; they are dropped)")
    return total


def _capturing(stream: Any) -> bool:
    """Whether `stream` (a cupy stream; torch's as an ExternalStream) captures a CUDA graph.
    The legacy default stream never does (a capture cannot start there)."""
    try:
        return stream.ptr not in (0, 1) and bool(stream.is_capturing())
    except Exception:  # a stream that cannot say is read as before
        return False


def _ctx_for(layout: MoeLayout, arr: Any, name: str):
    if not isinstance(layout, MoeLayout):
        raise ValueError(f"layout: expected a MoeLayout from moe_layout, got {type(layout).__name__}")
    ctx = context_of(arr, name)
    if ctx.kind != layout.kind:  # the streams of the two kinds are not ordered
        what = "a cupy array mixed with torch tensors" if ctx.kind == "cupy" else \
            "a torch tensor mixed with cupy arrays"
        raise ValueError(f"{name}: {what} (the layout's, from moe_layout); pass one kind")
    if ctx.device != layout.device:
        raise ValueError(f"{name}: on device {ctx.device}, the layout is on device {layout.device}")
    return ctx


def moe_layout(topk_ids: Any, num_experts: int, *, pad_to: int = 1,
               multi: bool | None = None, warps: int | None = None) -> MoeLayout:
    """Phase 1: counts, padded offsets and the stable permutation of topk_ids [T, top_k]
    (int32 or int64). One launch for T * top_k <= SINGLE_MAX pairs, three above; no host sync.
    `multi` forces the multi-CTA path (True) or the single-CTA one (False); `warps` the CTA
    size (tests, benchmarks)."""
    ctx, ids, idt, t, k, e = _check_ids(topk_ids, num_experts, pad_to)
    n = t * k
    info = device_info(ctx.device)
    if multi is None and warps is None:
        plan = select_layout(info.arch.name, n, e, idt)
    else:
        plan = plan_layout(info.arch.name, n, e, idt, multi=None if multi is None else bool(multi),
                           warps=warps)
    lay, (counts, offsets, invalid, dest, src, bh) = _alloc(ctx, ids, t, k, e, pad_to, plan.multi,
                                                            plan.blocks * (e + 2) if plan.multi else 0)
    kern = get_kernel(plan.config, ctx.device, ctx.stream)
    i32 = np.int32
    if not plan.multi:
        ctx.launch(kern.fn("moe_layout_single"), (1, 1, 1), plan.block,
                   (ids, i32(n), i32(e), i32(pad_to), i32(lay.capacity), counts, offsets, dest, src,
                    invalid), smem=plan.smem, memo=True)
    else:
        ctx.launch(kern.fn("moe_layout_count"), (plan.blocks, 1, 1), plan.block,
                   (ids, i32(n), i32(e), i32(plan.chunk), bh), smem=plan.smem, memo=True)
        ctx.launch(kern.fn("moe_layout_scan"), (1, 1, 1), plan.block,
                   (i32(plan.blocks), i32(e), i32(pad_to), i32(lay.capacity), bh, counts, offsets,
                    src, invalid), smem=plan.smem, memo=True)
        ctx.launch(kern.fn("moe_layout_scatter"), (plan.blocks, 1, 1), plan.block,
                   (ids, i32(n), i32(e), i32(plan.chunk), bh, offsets, dest, src), smem=plan.smem,
                   memo=True)
    return lay


def _check_ids(topk_ids: Any, num_experts: int, pad_to: int):
    """(ctx, ids view, id dtype, T, top_k, E) after the argument rules of moe_layout."""
    ctx = context_of(topk_ids, "topk_ids")
    ids, idt = device_array(topk_ids, "topk_ids", ctx, ID_DTYPES, ndim=2)
    t, k = (int(s) for s in ids.shape)
    if k < 1:
        raise ValueError(f"topk_ids: shape {tuple(ids.shape)}; top_k (dim 1) must be >= 1")
    if type(num_experts) is not int and not isinstance(num_experts, np.integer):
        raise ValueError(f"num_experts: expected an int, got {type(num_experts).__name__}")
    e = int(num_experts)
    check_experts(e)
    if type(pad_to) is not int or pad_to < 1:
        raise ValueError(f"pad_to={pad_to!r}: must be an int >= 1")
    if t * k + e * (pad_to - 1) > INT32_LIMIT - 32 * CHUNK:
        raise ValueError(f"topk_ids: {t} tokens x top_k {k} (+ padding) rows exceed int32 "
                         f"indexing; process the batch in blocks (moe_blocks)")
    return ctx, ids, idt, t, k, e


def _alloc(ctx, ids, t: int, k: int, e: int, pad_to: int, multi: bool, bh_size: int):
    """One int32 buffer [counts E | offsets E+1 | invalid 2 | dest n | src capacity | bh]:
    one allocation a call, and offsets[E], invalid adjacent for the exact path's one copy.
    Returns the MoeLayout and the cupy views (counts, offsets, invalid, dest, src, bh)."""
    n, cap = t * k, t * k + e * (pad_to - 1)
    head = 2 * e + 3
    native, buf = ctx.empty((head + n + cap + bh_size,), "int32")
    cut = (0, e, 2 * e + 1, head, head + n, head + n + cap, head + n + cap + bh_size)
    views = [buf[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]
    nat = [native[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]
    lay = MoeLayout(e, k, t, pad_to, cap, nat[0], nat[1], nat[3], nat[4], nat[2], multi,
                    {"buf": buf, "offsets": views[1], "dest": views[3], "src": views[4], "ids": ids,
                     "base": native},
                    stream=ctx.stream, kind=ctx.kind)
    return lay, views


def moe_route(x: Any, topk_ids: Any, num_experts: int, *, pad_to: int = 1, exact: bool = False,
              out: Any = None, dtype: str | None = None,
              fused: bool | None = None,
              pairs_per_cta: int | None = None) -> tuple[MoeLayout, Any]:
    """Layout and dispatch in one call: (layout, x_perm). exact=False (default) gives the
    graph-safe [capacity, H] x_perm with no host sync; for T * top_k <= ROUTE_FUSED_MAX (1024)
    pairs it is one fused launch (the decode path), else moe_layout + moe_dispatch. exact=True is
    moe_layout + moe_dispatch(exact=True). `fused` forces the choice and `pairs_per_cta` the fused
    kernel's split (tests, benchmarks)."""
    ctx, ids, idt, t, k, e = _check_ids(topk_ids, num_experts, pad_to)
    n = t * k
    xa, dt = device_array(x, "x", ctx, MOVE_DTYPES, hint=dtype, ndim=2)  # before any launch
    if int(xa.shape[0]) != t:
        raise ValueError(f"x: {xa.shape[0]} rows; topk_ids has {t} tokens")
    vpr, _ = _rows_of(xa, "x")
    if fused is None:
        fused = not exact and n <= ROUTE_FUSED_MAX
    elif fused and n > FUSED_MAX:
        raise ValueError(f"moe_route: fused=True takes at most {FUSED_MAX} pairs, got {n}")
    if not fused:
        lay = moe_layout(topk_ids, num_experts, pad_to=pad_to)
        return lay, moe_dispatch(x, lay, exact=exact, out=out, dtype=dtype)
    if exact:
        raise ValueError("moe_route: fused=True is the graph-safe path; it needs exact=False")
    info = device_info(ctx.device)
    plan = plan_route(info.arch.name, n, e, idt, info.sm_count, pad_to, pairs_per_cta)
    lay, (counts, offsets, invalid, dest, src, _) = _alloc(ctx, ids, t, k, e, pad_to, False, 0)
    h = int(xa.shape[1])
    if out is None:
        out, o = ctx.empty((lay.capacity, h), dt)
    else:
        o, _ = device_array(out, "out", ctx, (dt,), hint=dt, ndim=2)
        if int(o.shape[1]) != h or int(o.shape[0]) < lay.capacity:
            raise ValueError(f"out: shape {tuple(o.shape)}; expected at least "
                             f"[{lay.capacity}, {h}] (capacity rows of x's width)")
        _rows_of(o, "out")
    fn = get_kernel(plan.config, ctx.device, ctx.stream).fn("moe_route_fused")
    i32 = np.int32
    ctx.launch(fn, (plan.ctas, 1, 1), (MOVE_THREADS, 1, 1),
               (ids, i32(n), i32(e), i32(pad_to), i32(lay.capacity), i32(plan.pairs_per_cta),
                i32(plan.side), xa, o, i32(vpr), i32(k), counts, offsets, dest, src, invalid),
               smem=plan.smem)
    return lay, out


def _rows_of(a: Any, name: str) -> tuple[int, int]:
    """(vectors of 16 bytes a row, row bytes) of a 2-D array, checking the 16-byte rules."""
    row_bytes = int(a.shape[1]) * a.itemsize
    if row_bytes % 16:
        raise ValueError(f"{name}: rows of {a.shape[1]} x {a.itemsize} B = {row_bytes} B; the "
                         f"routing kernels move 16-byte vectors (H a multiple of {16 // a.itemsize})")
    if a.data.ptr % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")
    return row_bytes // 16, row_bytes


def moe_dispatch(x: Any, layout: MoeLayout, *, exact: bool = True, out: Any = None,
                 dtype: str | None = None) -> Any:
    """Phase 2: x_perm[r] = x[src[r] // top_k] for x [T, H] (fp16 / bf16 / fp32 / uint8 / uint16;
    rows of a multiple of 16 bytes); padding rows (src = -1 below offsets[E]) are zero-filled.

    exact=True: one small device->host copy (offsets[E] and the invalid counter; raises
    ValueError naming the first out-of-range id), then x_perm is [offsets[E], H].
    exact=False: x_perm is [capacity, H] with no host sync (CUDA-graph safe); rows at and past
    offsets[E] are left unwritten (unspecified). `out` receives x_perm (>= the rows above).
    """
    ctx = _ctx_for(layout, x, "x")
    xa, dt = device_array(x, "x", ctx, MOVE_DTYPES, hint=dtype, ndim=2)
    if int(xa.shape[0]) != layout.num_tokens:
        raise ValueError(f"x: {xa.shape[0]} rows; the layout has {layout.num_tokens} tokens")
    vpr, _ = _rows_of(xa, "x")
    h = int(xa.shape[1])
    rows = layout._meta(ctx.stream) if exact else layout.capacity
    if out is None:
        out, o = ctx.empty((rows, h), dt)
    else:
        o, odt = device_array(out, "out", ctx, (dt,), hint=dt, ndim=2)
        if int(o.shape[1]) != h or int(o.shape[0]) < rows:
            raise ValueError(f"out: shape {tuple(o.shape)}; expected at least [{rows}, {h}] "
                             f"({'offsets[E]' if exact else 'capacity'} rows of x's width)")
        _rows_of(o, "out")
    if rows == 0 or vpr == 0:
        return out
    info = device_info(ctx.device)
    fn = get_kernel(MoeDispatchConfig(arch=info.arch.name), ctx.device, ctx.stream).fn("moe_dispatch")
    total_ptr = layout._views["offsets"][layout.num_experts:]
    ctx.launch(fn, (move_grid(rows, info.sm_count), 1, 1), (MOVE_THREADS, 1, 1),
               (xa, o, layout._views["src"], total_ptr, np.int32(vpr), np.int32(layout.top_k)), memo=True)
    return out


def moe_combine(y_perm: Any, layout: MoeLayout, topk_weights: Any, *, out: Any = None,
                dtype: str | None = None, w_dtype: str | None = None) -> Any:
    """out[t] = sum_j w[t, j] * y_perm[dest[t * top_k + j]] for y_perm [rows, H] fp16 / bf16
    (rows as moe_dispatch returned), topk_weights [T, top_k] fp32 / fp16 / bf16. Each product
    and sum is one fp32 op rounded to nearest, j in increasing order (deterministic), then out
    [T, H] in y's dtype. Dropped ids add nothing. CuPy bf16: uint16 arrays with dtype= /
    w_dtype="bfloat16"."""
    ctx = _ctx_for(layout, y_perm, "y_perm")
    y, dt = device_array(y_perm, "y_perm", ctx, DTYPES, hint=dtype, ndim=2)
    w, wdt = device_array(topk_weights, "topk_weights", ctx, W_DTYPES, hint=w_dtype or dtype)
    t, k = layout.num_tokens, layout.top_k
    if tuple(int(s) for s in w.shape) not in ((t, k), (t * k,)):
        raise ValueError(f"topk_weights: shape {tuple(w.shape)}; expected [{t}, {k}] like topk_ids")
    vpr, _ = _rows_of(y, "y_perm")
    h = int(y.shape[1])
    need = layout._host.get("total", layout.capacity)
    if int(y.shape[0]) < need:
        raise ValueError(f"y_perm: {y.shape[0]} rows; expected at least {need} (offsets[E] after an "
                         f"exact dispatch, else capacity)")
    if out is None:
        out, o = ctx.empty((t, h), dt)
    else:
        o, _ = device_array(out, "out", ctx, (dt,), hint=dt, ndim=2)
        if tuple(int(s) for s in o.shape) != (t, h):
            raise ValueError(f"out: shape {tuple(o.shape)}; expected [{t}, {h}]")
        _rows_of(o, "out")
    if t == 0 or vpr == 0:
        return out
    info = device_info(ctx.device)
    split, grid = combine_launch(t, vpr, info.sm_count)
    cfg = MoeCombineConfig(arch=info.arch.name, dtype=dt, w_dtype=wdt, split=split)
    fn = get_kernel(cfg, ctx.device, ctx.stream).fn("moe_combine")
    ctx.launch(fn, grid, (MOVE_THREADS, 1, 1),
               (y, np.int32(y.shape[0]), layout._views["dest"], w, o, np.int32(t), np.int32(k),
                np.int32(vpr)), memo=True)
    return out


def _check_counts(fn: str, **counts: Any) -> None:
    """block_bytes / moe_blocks: every count an int (numpy integers too; a string or None was a
    TypeError of the arithmetic)."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{fn}: {name}={v!r}; expected an int")


def block_bytes(tokens: int, top_k: int, hidden: int, *, num_experts: int = 0, pad_to: int = 1,
                itemsize: int = 2) -> int:
    """Device bytes one block of `tokens` needs beyond x and out: x_perm and y_perm (capacity
    rows each), the layout buffer and the multi-CTA histograms."""
    _check_counts("block_bytes", tokens=tokens, top_k=top_k, hidden=hidden,
                  num_experts=num_experts, pad_to=pad_to, itemsize=itemsize)
    pairs = tokens * top_k
    cap = pairs + num_experts * (pad_to - 1)
    hist = (-(-pairs // CHUNK)) * (num_experts + 2) * 4
    return 2 * cap * hidden * itemsize + (2 * num_experts + 3 + pairs + cap) * 4 + hist


def moe_blocks(num_tokens: int, top_k: int, hidden: int, max_bytes: int, *,
               num_experts: int = 0, pad_to: int = 1, itemsize: int = 2) -> Iterator[tuple[int, int]]:
    """Token ranges [start, stop) whose routing (block_bytes: x_perm + y_perm + layout) fits
    max_bytes, for batches too large to route at once. Per block:

        for a, b in moe_blocks(T, top_k, H, 2 << 30, num_experts=E):
            lay = moe_layout(topk_ids[a:b], E)
            y = experts(moe_dispatch(x[a:b], lay))
            moe_combine(y, lay, topk_weights[a:b], out=out[a:b])

    Row slices of contiguous arrays are contiguous views, so nothing is copied.
    """
    _check_counts("moe_blocks", num_tokens=num_tokens, top_k=top_k, hidden=hidden,
                  max_bytes=max_bytes, num_experts=num_experts, pad_to=pad_to, itemsize=itemsize)
    if num_tokens < 0 or top_k < 1 or hidden < 1:
        raise ValueError(f"moe_blocks: num_tokens={num_tokens}, top_k={top_k}, hidden={hidden}; "
                         f"expected >= 0, >= 1, >= 1")
    def size(tokens: int) -> int:
        return block_bytes(tokens, top_k, hidden, num_experts=num_experts, pad_to=pad_to,
                           itemsize=itemsize)

    if size(1) > max_bytes:
        raise ValueError(f"moe_blocks: max_bytes={max_bytes} holds no token (one token needs "
                         f"{size(1)} B with E={num_experts}, pad_to={pad_to}, H={hidden})")
    step = max(1, (max_bytes - size(0)) // (size(2) - size(1)))
    step = min(step, max(1, num_tokens), (INT32_LIMIT - 32 * CHUNK - num_experts * pad_to) // top_k)
    while size(step) > max_bytes:  # the histogram term grows by CTA, not by token
        step -= max(1, step // 256)
    for a in range(0, num_tokens, step):
        yield a, min(a + step, num_tokens)


__all__ = ["MoeLayout", "block_bytes", "moe_blocks", "moe_combine", "moe_dispatch", "moe_layout",
           "moe_route"]
