"""A per-weight memo of resolved launches: the host hot path of the decode GEMMs.

A GEMM call checks its arguments, asks the selector, loads the kernel, builds its argument
list and launches: ~40-65 us of Python on a slow host for a kernel that runs 5 us at M = 1
(H100 host, BENCHMARKS.md). For one weight the outcome depends only on a *signature* of the
call: the API function, A's array kind, shape, dtype, device and contiguity, the stream (and
the thread, on the per-thread default stream), bias's shape and dtype (or none) and the PDL
knob. So the first call with a signature runs the full path, and where
that path ends in one launch of one kernel (`offer`), the weight keeps the launch with the
three per-call pointers (A, bias, C) as slots; later calls with that signature check A's
alignment, allocate C and launch.

Only the entry points' default calls use it (no out=, dtype=, forced path / split / tile /
kw); a call with another signature, a misaligned A, KERNELGEN_POISON, a launch during stream
capture (recording only: a memo made before a capture is replayed into it), a path that uses
more than one kernel (dequantize + cuBLAS) or arrays on another device than the current one
takes the full path, and so does every call with KERNELGEN_FASTCALL=0. The memo is kept by
weight identity for the weight's lifetime (a weakref finalizer drops it; not on the object, so
a copy or pickle of a weight carries none), at most MAX_ENTRIES signatures a weight, then it
starts over; `clear()` (jit.clear_memory_cache) drops every memo. An entry holds the kernel,
the argument values as pointers and their struct codes: no reference to the recording call's
arrays.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..knobs import fastcall, pdl, poison
from .launch import arg_codes, launch_values

MAX_ENTRIES = 256
_local = threading.local()  # .rec: the launches offered during a recording (list) or None
_memos: dict[int, dict] = {}  # id(weight) -> {signature: _Recipe}


def clear() -> None:
    """Forget every memo (their kernels load again through the whole path)."""
    _memos.clear()


def offer(ctx: Any, fn: Any, grid: tuple, block: tuple, args: tuple, smem: int) -> None:
    """Called by a launch site right before ctx.launch for a launch that may be memoised: its
    arguments are the weight's arrays, scalars, and the call's A / bias / C views."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        rec.append((ctx, fn, grid, block, args, smem))


def _torch_sig(t: Any) -> tuple:
    return (t.shape, t.dtype, t.device.index, t.is_contiguous())


def _cupy_sig(a: Any) -> tuple:
    return (a.shape, a.dtype, a.data.device_id, a.flags.c_contiguous)


def signature(entry: str, A: Any, bias: Any) -> tuple | None:
    """The signature of a call of `entry` (the API function), or None where the memo does not
    apply (see the module doc)."""
    if poison() or not fastcall():
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(A, torch.Tensor):
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None or not A.is_cuda:
            return None
        dev = A.device.index
        if torch.cuda.current_device() != dev:
            return None
        stream = raw(dev)
        if bias is not None and not isinstance(bias, torch.Tensor):
            return None
        sig = ("torch", _torch_sig(A), stream, None if bias is None else _torch_sig(bias))
    else:
        import cupy

        if type(A) is not cupy.ndarray or (bias is not None and type(bias) is not cupy.ndarray):
            return None
        dev = A.data.device_id
        if cupy.cuda.runtime.getDevice() != dev:
            return None
        stream = cupy.cuda.get_current_stream().ptr
        sig = ("cupy", _cupy_sig(A), stream, None if bias is None else _cupy_sig(bias))
    # the per-thread default stream has one handle (2) but a stream, and split-K scratch
    # (interop.scratch), per thread
    thread = threading.get_ident() if stream == 2 else None
    return sig + (entry, pdl(), thread)


class _Recipe:
    """One signature's launch: the kernel and its geometry, the argument values with the
    weight's arrays as pointers, and the slots of A, bias and C."""

    __slots__ = ("fn", "grid", "block", "smem", "stream_ptr", "pdl", "codes", "vals", "ia", "ib",
                 "ic", "out_shape", "out_dtype", "torch_device", "kind")

    def run(self, A: Any, bias: Any) -> Any:
        if self.kind == "torch":
            import torch

            pa = A.data_ptr()
            pb = bias.data_ptr() if bias is not None else 0
            if pa % 16 or pb % 16:
                return None
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.torch_device)
            pc = out.data_ptr()
        else:
            import cupy

            pa = A.data.ptr
            pb = bias.data.ptr if bias is not None else 0
            if pa % 16 or pb % 16:
                return None
            out = cupy.empty(self.out_shape, self.out_dtype)
            pc = out.data.ptr
        vals = self.vals.copy()
        for i in self.ia:
            vals[i] = pa
        for i in self.ib:
            vals[i] = pb
        for i in self.ic:
            vals[i] = pc
        launch_values(self.fn, self.grid, self.block, self.codes, self.smem, self.stream_ptr,
                      self.pdl, vals)
        return out


def _recipe(sig: tuple, A: Any, bias: Any, out: Any, launch: tuple) -> _Recipe | None:
    """The memo entry of a recorded call, or None where its launch is not one we can replay."""
    ctx, fn, grid, block, args, smem = launch
    if ctx.foreign or ctx.stream.is_capturing():
        return None
    kind = sig[0]
    ptr = (lambda x: x.data_ptr()) if kind == "torch" else (lambda x: x.data.ptr)
    pa, pc = ptr(A), ptr(out)
    pb = None if bias is None else ptr(bias)
    if len({pa, pb, pc} - {None}) != 2 + (bias is not None):
        return None  # aliased arguments: not a signature property
    r = _Recipe()
    r.codes = arg_codes(args)
    r.vals, r.ia, r.ib, r.ic = [], [], [], []
    for i, (a, code) in enumerate(zip(args, r.codes, strict=True)):
        if code == "A":  # the weight's arrays and scratch are live for the memo's lifetime
            p = a.data.ptr
            (r.ia if p == pa else r.ib if p == pb else r.ic if p == pc else []).append(i)
            r.vals.append(p)
        else:
            r.vals.append(a.raw if code == "M" else a)
    if not r.ia or not r.ic:
        return None
    from .interop import _pdl_device

    r.fn, r.grid, r.block, r.smem = fn, grid, block, smem
    r.stream_ptr = ctx.stream.ptr
    r.pdl = _pdl_device(ctx.device) and pdl()
    r.kind = kind
    r.out_shape = tuple(out.shape)
    r.out_dtype = out.dtype
    r.torch_device = out.device if kind == "torch" else None
    return r


def call(entry: str, W: Any, A: Any, bias: Any, full: Callable[[], Any]) -> Any:
    """`full()` (the whole path of API function `entry`) for this call, through W's memo where
    it applies."""
    sig = signature(entry, A, bias)
    if sig is None:
        return full()
    memo = _memos.get(id(W))
    if memo is not None:
        r = memo.get(sig)
        if r is not None:
            out = r.run(A, bias)
            if out is not None:
                return out
            return full()
    prev = getattr(_local, "rec", None)
    _local.rec = rec = []
    try:
        out = full()
    finally:
        _local.rec = prev
    if len(rec) == 1:
        r = _recipe(sig, A, bias, out, rec[0])
        if r is not None:
            if memo is None:
                try:
                    weakref.finalize(W, _memos.pop, id(W), None)
                except TypeError:  # not weak-referenceable: no memo
                    return out
                memo = _memos[id(W)] = {}
            elif len(memo) >= MAX_ENTRIES:
                memo.clear()
            memo[sig] = r
    return out
