"""A CuPy-ops stand-in for kernelgen.moe_routing (moe_layout / moe_dispatch / moe_combine), used
by fused_moe only while that family is not installed. Same contract, pad_to=1 only, not fast
(several small kernels, argsort), no graph safety (CuPy allocations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.interop import context_of, device_array


@dataclass(frozen=True)
class MoeLayout:
    counts: Any  # [E] int32
    offsets: Any  # [E + 1] int32
    dest: Any  # [T * top_k] int32: x_perm row of (t, j)
    src: Any  # [T * top_k] int32: flat t * top_k + j of each x_perm row
    capacity: int
    num_tokens: int
    top_k: int
    num_experts: int


def _cupy():
    import cupy

    return cupy


def _native(ctx, view):
    if ctx.kind == "torch":
        import torch

        return torch.as_tensor(view, device=f"cuda:{ctx.device}")
    return view


def moe_layout(topk_ids: Any, num_experts: int, *, pad_to: int = 1) -> MoeLayout:
    if pad_to != 1:
        raise ValueError("the CuPy stand-in of moe_layout supports pad_to=1 only")
    cp = _cupy()
    ctx = context_of(topk_ids, "topk_ids")
    ids, _ = device_array(topk_ids, "topk_ids", ctx, ("int32", "int64"), ndim=2)
    t, k = (int(s) for s in ids.shape)
    with cp.cuda.Device(ctx.device), ctx.stream:
        flat = ids.reshape(-1).astype(cp.int32)
        order = cp.argsort(flat).astype(cp.int32)  # CuPy's sort is stable
        counts = cp.bincount(flat, minlength=num_experts).astype(cp.int32)[:num_experts]
        offsets = cp.zeros(num_experts + 1, cp.int32)
        offsets[1:] = cp.cumsum(counts)
        dest = cp.empty_like(order)
        dest[order] = cp.arange(order.size, dtype=cp.int32)
    return MoeLayout(_native(ctx, counts), _native(ctx, offsets), _native(ctx, dest),
                     _native(ctx, order), t * k, t, k, num_experts)


def _view(a, ctx):
    cp = _cupy()
    if ctx.kind == "torch":
        from ..core.interop import _torch_to_cupy

        return _torch_to_cupy(a.contiguous())
    return cp.ascontiguousarray(a)


def moe_dispatch(x: Any, layout: MoeLayout, *, exact: bool = True, out: Any = None,
                 dtype: str | None = None) -> Any:
    cp = _cupy()
    ctx = context_of(x, "x")
    xv = _view(x, ctx)
    src = _view(layout.src, ctx)
    with cp.cuda.Device(ctx.device), ctx.stream:
        res = xv[src // layout.top_k] if src.size else cp.empty((0, xv.shape[1]), xv.dtype)
    return _native(ctx, res)


def moe_combine(y_perm: Any, layout: MoeLayout, topk_weights: Any, *, out: Any = None,
                dtype: str | None = None) -> Any:
    cp = _cupy()
    ctx = context_of(y_perm, "y_perm")
    y = _view(y_perm, ctx)
    wv = _view(topk_weights, ctx)
    dest = _view(layout.dest, ctx)
    bf16 = ctx.kind == "torch" and str(y_perm.dtype) == "torch.bfloat16"
    bf16 = bf16 or (ctx.kind == "cupy" and y.dtype == np.uint16)
    with cp.cuda.Device(ctx.device), ctx.stream:
        yf = (y.astype(cp.uint32) << 16).view(cp.float32) if bf16 else y.astype(cp.float32)
        if wv.dtype == np.uint16:
            wv = (wv.astype(cp.uint32) << 16).view(cp.float32)
        t, k = layout.num_tokens, layout.top_k
        rows = yf[dest].reshape(t, k, yf.shape[1]) * wv.astype(cp.float32).reshape(t, k, 1)
        res = rows.sum(axis=1)
        if bf16:
            u = res.view(cp.uint32)
            res = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
        else:
            res = res.astype(y.dtype)
    return _native(ctx, res)
