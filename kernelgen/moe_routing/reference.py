"""NumPy reference of MoE token routing: layout (counts, padded offsets, stable permutation),
dispatch (gather rows into expert order) and combine (weighted sum back per token).

Definitions the kernels match exactly:
- flat index i = t * top_k + j for token t, slot j; its expert e = topk_ids[t, j].
- An id outside [0, E) is dropped: no row, dest[i] = -1; `invalid` counts them and names the
  smallest such flat index (INT32_MAX when none).
- Expert e's segment starts at offsets[e]; its rows hold its flat indices in increasing order
  (stable), then padding rows (src = -1) up to a multiple of pad_to. offsets[E] = total rows.
- src has `capacity = T * top_k + E * (pad_to - 1)` entries; rows >= offsets[E] are -1 too.
- combine: out[t] = sum over j (in increasing j) of w[t, j] * y[dest[t*top_k + j]], each product
  and sum one fp32 operation rounded to nearest (no FMA), then rounded to the output dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kbit.reference import bf16_to_f32, f32_to_bf16

NO_INVALID = np.iinfo(np.int32).max  # invalid[1] when every id is in range


def capacity(num_tokens: int, top_k: int, num_experts: int, pad_to: int) -> int:
    """Upper bound on the rows of x_perm: every pair plus the most padding E segments can need."""
    return num_tokens * top_k + num_experts * (pad_to - 1)


@dataclass(frozen=True)
class Layout:
    counts: np.ndarray  # [E] int32
    offsets: np.ndarray  # [E + 1] int32
    dest: np.ndarray  # [T * top_k] int32, -1 for a dropped (invalid) id
    src: np.ndarray  # [capacity] int32, -1 for padding rows
    invalid: np.ndarray  # [2] int32: number of ids outside [0, E), first such flat index
    top_k: int

    @property
    def total(self) -> int:
        return int(self.offsets[-1])


def layout(topk_ids: np.ndarray, num_experts: int, pad_to: int = 1) -> Layout:
    ids = np.asarray(topk_ids).astype(np.int64)
    t, k = ids.shape
    flat = ids.reshape(-1)
    ok = (flat >= 0) & (flat < num_experts)
    counts = np.bincount(flat[ok], minlength=num_experts).astype(np.int64)
    padded = -(-counts // pad_to) * pad_to
    offsets = np.zeros(num_experts + 1, np.int64)
    np.cumsum(padded, out=offsets[1:])
    dest = np.full(flat.size, -1, np.int64)
    src = np.full(capacity(t, k, num_experts, pad_to), -1, np.int64)
    order = np.argsort(np.where(ok, flat, num_experts), kind="stable")[: int(ok.sum())]
    experts = flat[order]
    # rank of each pair within its expert: position in the sorted order minus the expert's start
    starts = np.zeros(num_experts + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    rows = offsets[experts] + np.arange(order.size) - starts[experts]
    dest[order] = rows
    src[rows] = order
    bad = np.flatnonzero(~ok)
    invalid = np.array([bad.size, bad[0] if bad.size else NO_INVALID], np.int64)
    i32 = np.int32
    return Layout(counts.astype(i32), offsets.astype(i32), dest.astype(i32), src.astype(i32),
                  invalid.astype(i32), k)


def dispatch(x: np.ndarray, lay: Layout, rows: int | None = None) -> np.ndarray:
    """x_perm [rows, H] (rows = offsets[E] by default); padding rows are zero. Any dtype."""
    rows = lay.total if rows is None else rows
    out = np.zeros((rows, x.shape[1]), x.dtype)
    src = lay.src[: min(rows, lay.total)]
    real = src >= 0
    out[: src.size][real] = x[src[real] // lay.top_k]
    return out


def to_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """Storage (uint16 for bf16) -> float32 values."""
    return bf16_to_f32(a) if dtype == "bfloat16" else np.asarray(a).astype(np.float32)


def from_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> storage of `dtype`, round to nearest even."""
    if dtype == "bfloat16":
        return f32_to_bf16(a)
    return a.astype(np.float16 if dtype == "float16" else np.float32)


def combine(y: np.ndarray, lay: Layout, weights: np.ndarray, dtype: str,
            w_dtype: str = "float32") -> np.ndarray:
    """out [T, H] in `dtype` storage: the fixed-order fp32 weighted sum (see module doc)."""
    yf = to_f32(y, dtype)
    w = to_f32(weights, w_dtype).reshape(-1, lay.top_k)
    t = w.shape[0]
    dest = lay.dest.reshape(t, lay.top_k)
    acc = np.zeros((t, yf.shape[1]), np.float32)
    for j in range(lay.top_k):  # one fp32 multiply, then one fp32 add, per slot in order
        d = dest[:, j]
        ok = d >= 0
        prod = w[ok, j : j + 1] * yf[d[ok]]
        acc[ok] = acc[ok] + prod
    return from_f32(acc, dtype)
