"""A memo of resolved launches: the host hot path of decode-time calls.

A GEMM call checks its arguments, asks the selector, loads the kernel, builds its argument
list and launches: ~40-65 us of Python on a slow host for a kernel that runs 5 us at M = 1
(H100 host, BENCHMARKS.md); an activation quantize or an MXFP8 GEMM about as much. For one
weight (or, for a quantize, none) the outcome depends only on a *signature* of the call: the
API function, each per-call array's kind, shape, dtype, device and contiguity (or its absence),
the call's other arguments that reach the kernels (`extra`), the stream (and the thread, on the
per-thread default stream) and the PDL knob. So the first call with a signature runs the full
path, and where every launch of ours in it was sent with `Ctx.launch(..., memo=True)`, the memo
keeps them with the per-call pointers as slots: the inputs' and the new
outputs'; later calls with that signature check the inputs' alignment, allocate the outputs and
launch.

Only the entry points' calls without a forced choice use it (gemm / fp4_gemm: no forced path /
split / tile / kw / plan, out= a per-call input; quantize_mx / quantize_nvfp4: any call;
mx_gemm / grouped_gemm: no config, out= a per-call input; fused_moe: no workspace, on the pair of weights,
its intermediates new outputs and the exact dispatch's host check a `check_point` the replay
repeats); a call
with another signature, a misaligned input, KERNELGEN_POISON, a launch during stream capture
(recording only: a memo made before a capture is replayed into it), a path with a launch not
marked memo=True (dequantize + cuBLAS) or a pointer that is neither a per-call array nor one the
memo may keep (`fixed`: a weight's arrays; the GEMMs' split-K scratch, never freed), or arrays
on another device than the current one takes the full path, and so does every call with
KERNELGEN_FASTCALL=0. A weight's memo is kept by its identity for its lifetime (a weakref
finalizer drops it; not on the object, so a copy or pickle of a weight carries none), a
quantize's by the entry point; at most MAX_ENTRIES signatures a memo, then it starts over;
`clear()` (jit.clear_memory_cache) drops every memo. An entry holds the kernels, the argument
values as pointers and their struct codes (a pointer into an output as its offset there): no
reference to the recording call's arrays.
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
# .rec: the memo=True launches of a recording (list) or None; .tainted: it saw another launch
_local = threading.local()
_memos: dict[Any, dict] = {}  # id(weight) or an entry name -> {signature: _Recipe}


def clear() -> None:
    """Forget every memo (their kernels load again through the whole path)."""
    _memos.clear()


def launched(ctx: Any, fn: Any, grid: tuple, block: tuple, args: tuple, smem: int, memo: bool) -> None:
    """Called by Ctx.launch for every launch: during a recording, a memo=True launch (its
    arguments the per-call arrays, scalars, and arrays the memo may keep) is recorded, any other
    spoils the recording (the memo would miss its work)."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        if memo:
            rec.append((ctx, fn, grid, block, args, smem))
        else:
            _local.tainted = True


def _torch_sig(t: Any) -> tuple:
    return (t.shape, t.dtype, t.device.index, t.is_contiguous())


def _cupy_sig(a: Any) -> tuple:
    return (a.shape, a.dtype, a.data.device_id, a.flags.c_contiguous)


def signature(entry: str, inputs: tuple, extra: tuple = ()) -> tuple | None:
    """The signature of a call of `entry` (the API function) with per-call arrays `inputs` (the
    first one given; the others of its kind or None) and the other arguments `extra`
    (hashable), or None where the memo does not apply (see the module doc)."""
    if poison() or not fastcall():
        return None
    A = inputs[0]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(A, torch.Tensor):
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None or not A.is_cuda:
            return None
        dev = A.device.index
        if torch.cuda.current_device() != dev:
            return None
        stream = raw(dev)
        if any(x is not None and not isinstance(x, torch.Tensor) for x in inputs):
            return None
        sig = ("torch", stream, *(None if x is None else _torch_sig(x) for x in inputs))
    else:
        import cupy

        if type(A) is not cupy.ndarray or any(x is not None and type(x) is not cupy.ndarray for x in inputs):
            return None
        dev = A.data.device_id
        try:
            if cupy.cuda.runtime.getDevice() != dev:
                return None
            stream = cupy.cuda.get_current_stream().ptr
        except cupy.cuda.runtime.CUDARuntimeError:  # no usable device: the full path says why
            return None
        sig = ("cupy", stream, *(None if x is None else _cupy_sig(x) for x in inputs))
    # the per-thread default stream has one handle (2) but a stream, and split-K scratch
    # (interop.scratch), per thread
    thread = threading.get_ident() if stream == 2 else None
    return sig + (entry, extra, pdl(), thread)


class _Recipe:
    """One signature's launches: for each, the kernel and its geometry, the argument values
    (kept arrays as pointers) and the slots of the per-call pointers (inputs, then outputs);
    the outputs' shapes and dtypes, and `build`, which makes the call's result of them."""

    __slots__ = ("launches", "outs", "kind", "torch_device", "build", "marks")

    def run(self, inputs: tuple) -> Any:
        if self.kind == "torch":
            import torch

            ptrs = [0 if x is None else x.data_ptr() for x in inputs]
            if any(p % 16 for p in ptrs):
                return None
            outs = [torch.empty(shape, dtype=dt, device=self.torch_device) for shape, dt in self.outs]
            ptrs += [o.data_ptr() for o in outs]
        else:
            import cupy

            ptrs = [0 if x is None else x.data.ptr for x in inputs]
            if any(p % 16 for p in ptrs):
                return None
            outs = [cupy.empty(shape, dt) for shape, dt in self.outs]
            ptrs += [o.data.ptr for o in outs]
        for j, (fn, grid, block, codes, smem, stream_ptr, pdl_on, vals, slots) in enumerate(self.launches):
            for pos, check in self.marks:
                if pos == j:
                    check(outs, inputs)
            vals = vals.copy()
            for i, s, off in slots:
                vals[i] = ptrs[s] + off
            launch_values(fn, grid, block, codes, smem, stream_ptr, pdl_on, vals)
        for pos, check in self.marks:
            if pos == len(self.launches):  # a check after the last launch
                check(outs, inputs)
        return self.build(outs, inputs)


def _recipe(sig: tuple, inputs: tuple, outputs: tuple, launches: list, fixed: set | None,
            build: Callable[[list, tuple], Any], marks: list = ()) -> _Recipe | None:
    """The memo entry of a recorded call, or None where its launches are not ones we can replay:
    every array argument must be one of the call's inputs or outputs (or lie inside an output:
    a view of it), or (fixed None) any array, else one in `fixed`; every input and output must
    reach a launch. `marks`: (launch index, check) of the recording's check_point calls."""
    kind = sig[0]
    ptr = (lambda x: x.data_ptr()) if kind == "torch" else (lambda x: x.data.ptr)
    size = (lambda x: x.numel() * x.element_size()) if kind == "torch" else (lambda x: x.nbytes)
    per_call = [None if x is None else ptr(x) for x in inputs] + [ptr(o) for o in outputs]
    given = [p for p in per_call if p is not None]
    if len(set(given)) != len(given) or 0 in given:
        return None  # aliased or empty arrays: not a signature property
    spans = [(p, p + size(o), len(inputs) + j) for j, (p, o) in enumerate(zip(per_call[len(inputs):],
                                                                             outputs, strict=True))]
    from .interop import _pdl_device

    r = _Recipe()
    r.launches, used = [], set()
    for ctx, fn, grid, block, args, smem in launches:
        if ctx.foreign or ctx.stream.is_capturing():
            return None
        codes = arg_codes(args)
        vals, slots = [], []
        for i, (a, code) in enumerate(zip(args, codes, strict=True)):
            if code == "A":
                p = a.data.ptr
                end = p + a.nbytes  # launch arrays are cupy views; one wholly inside an output
                inside = [(j, p - lo) for lo, hi, j in spans if lo < p and end <= hi]
                if p in per_call:
                    slots.append((i, per_call.index(p), 0))
                    used.add(per_call.index(p))
                elif inside:  # a view into an output (our arrays: contiguous)
                    slots.append((i, *inside[0]))
                elif fixed is not None and p not in fixed:
                    return None
                vals.append(p)
            else:
                vals.append(a.raw if code == "M" else a)
        r.launches.append((fn, grid, block, codes, smem, ctx.stream.ptr,
                           _pdl_device(ctx.device) and pdl(), vals, slots))
    if used != {i for i, p in enumerate(per_call) if p is not None}:
        return None
    r.kind = kind
    r.outs = [(tuple(o.shape), o.dtype) for o in outputs]
    r.torch_device = inputs[0].device if kind == "torch" else None
    r.build = build
    r.marks = list(marks)
    return r


def check_point(check: Callable[[list, tuple], Any]) -> None:
    """Called by a recorded call's full path where it checks something on the host between
    its launches (fused_moe's exact dispatch: the routing's dropped ids): a replay calls
    `check(outs, inputs)` (the replay's new arrays and the call's inputs) at the same point,
    before the next launch; it may raise. Outside a recording: nothing."""
    rec = getattr(_local, "rec", None)
    if rec is not None:
        _local.marks.append((len(rec), check))


def memoised(entry: str, key: Any, inputs: tuple, extra: tuple, full: Callable[[], Any],
             outputs_of: Callable[[Any], tuple], build_of: Callable[[Any], Callable[[list, tuple], Any]],
             fixed: Callable[[], set] | None = None) -> Any:
    """`full()` (the whole path of API function `entry`) for this call, through the memo of
    `key` (a weight, kept by identity while it lives; or None: the entry's own memo) where it
    applies (a tuple of weights: one memo for the pair, kept while both live). `outputs_of(result)`:
    the arrays the call made; `build_of(result)`: a function of new such arrays and the call's
    inputs to the result they stand in; `fixed()`: the pointers a replay may reuse (None: any)."""
    if getattr(_local, "rec", None) is not None:  # inside another call's recording: its launches
        return full()
    sig = signature(entry, inputs, extra)
    if sig is None:
        return full()
    keys = key if isinstance(key, tuple) else () if key is None else (key,)
    mkey = entry if not keys else id(keys[0]) if len(keys) == 1 else (entry, *map(id, keys))
    memo = _memos.get(mkey)
    if memo is not None:
        try:
            r = memo.get(sig)
        except TypeError:  # an unhashable argument: the full path judges it
            return full()
        if r is not None:
            out = r.run(inputs)
            if out is not None:
                return out
            return full()
    try:
        hash(sig)
    except TypeError:  # an unhashable argument: the full path judges it
        return full()
    rec: list = []
    _local.rec, _local.tainted, _local.marks = rec, False, []
    try:
        out = full()
        tainted = _local.tainted
    finally:
        _local.rec = None
    if rec and not tainted:
        r = _recipe(sig, inputs, outputs_of(out), rec, None if fixed is None else fixed(), build_of(out),
                    _local.marks)
        if r is not None:
            if memo is None:
                try:
                    for k in keys:
                        weakref.finalize(k, _memos.pop, mkey, None)
                except TypeError:  # not weak-referenceable: no memo
                    return out
                memo = _memos[mkey] = {}
            elif len(memo) >= MAX_ENTRIES:
                memo.clear()
            memo[sig] = r
    return out


def call(entry: str, W: Any, A: Any, bias: Any, full: Callable[[], Any], out: Any = None,
         extra: tuple = ()) -> Any:
    """A GEMM call C = A . W^T (+ bias) through W's memo: C new (one output), or the caller's
    `out` (then a per-call input, and the result)."""
    if out is None:
        return memoised(entry, W, (A, bias), extra, full, lambda c: (c,), lambda c: first)
    return memoised(entry, W, (A, bias, out), extra, full, lambda c: (), lambda c: given_out)


def first(outs: list, inputs: tuple) -> Any:
    """build_of's function for a call whose result is its one new array."""
    return outs[0]


def given_out(outs: list, inputs: tuple) -> Any:
    """build_of's function for a GEMM that wrote the caller's out (its third input)."""
    return inputs[2]
