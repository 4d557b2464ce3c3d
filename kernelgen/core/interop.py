"""CuPy arrays and torch tensors in, the caller's kind out, on the caller's current stream.

CuPy has no bfloat16 dtype: bf16 data in CuPy is a uint16 array of bf16 bit patterns, and ops
take a `dtype="bfloat16"` hint for such input. torch bf16 tensors are viewed the same way
without a copy. Every check here runs before any launch and raises ValueError naming the
argument and the rule. This is the per-call hot path: keep it to attribute reads and dict hits.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import knobs
from .fastcall import launched
from .tma import TensorMap

# logical dtype name -> numpy storage dtype
STORAGE = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
}
_NAME_OF = {dt: name for name, dt in STORAGE.items() if name != "bfloat16"}

_cp: Any = None  # the cupy module, imported on first use


def _cupy() -> Any:
    global _cp
    if _cp is None:
        import cupy

        _cp = cupy
    return _cp


@contextlib.contextmanager
def on_stream(device: int, stream: Any) -> Iterator[None]:
    """Run the block's CuPy work on `device` and `stream`, then give the caller back exactly the
    current stream it had. Not `with stream:`: CuPy's exit restores the top of its with-stack,
    which is the legacy stream when the caller made its stream current with `stream.use()` —
    its later launches (and CUDA-graph captures) would then silently move to the legacy stream."""
    cp = _cupy()
    with cp.cuda.Device(device):
        prev = cp.cuda.get_current_stream()
        if prev.ptr == stream.ptr:
            yield
            return
        stream.use()
        try:
            yield
        finally:
            prev.use()


_pdl_devices: dict[int, bool] = {}


def _pdl_device(device: int) -> bool:
    """Whether the device has programmatic dependent launch (compute capability 9.0+)."""
    ok = _pdl_devices.get(device)
    if ok is None:
        from ..arch import device_info

        ok = _pdl_devices[device] = device_info(device).arch.cc >= 90
    return ok


_smem_limits: dict[int, tuple[int, str]] = {}


def smem_limit(device: int) -> int:
    """Shared memory (static + dynamic) a block may use on the device after opt-in
    (sharedMemPerBlockOptin), memoised; the planners size their stages by it."""
    lim = _smem_limits.get(device)
    if lim is None:
        from ..arch import device_info

        info = device_info(device)
        lim = _smem_limits[device] = (info.smem_optin or info.arch.smem_optin,
                                      f"{info.name}, target {info.arch.name}")
    return lim[0]


def check_smem(device: int, smem: int, what: str = "a launch") -> None:
    """DeviceError unless a block of `smem` bytes of shared memory fits the device (the planners
    size stages by smem_limit, so this catches forced configs and plans: 8.6 parts allow 99 KB
    of sm_80's 163 KB). Checked where a kernel is loaded (core/jit.py, before the driver's
    opt-in) and where one is launched with more than 48 KB."""
    limit = smem_limit(device)
    if smem > limit:
        from ..errors import DeviceError

        raise DeviceError(f"{what} needs {smem} bytes of shared memory a block; device {device} "
                          f"({_smem_limits[device][1]}) allows {limit}; force another path")


def _is_torch(x: Any) -> bool:
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


class Ctx:
    """Where the call runs: array kind of the caller, device index, stream to launch on."""

    __slots__ = ("kind", "device", "stream", "foreign")

    def __init__(self, kind: str, device: int, stream: Any, foreign: bool = False):
        self.kind, self.device, self.stream = kind, device, stream
        self.foreign = foreign  # the arrays live on a device other than the current one

    def launch(self, fn: Any, grid: tuple, block: tuple, args: tuple, smem: int = 0,
               memo: bool = False) -> None:
        """Launch `fn` (a kernel of ours: it waits for the previous grid first, see
        KernelConfig) on this call's stream, switching device only when the data needs it; with
        programmatic dependent launch (core/launch.py) where the device has it (sm_90+) and
        KERNELGEN_PDL is not 0; arguments that CuPy cannot pass (a core.tma.TensorMap) go
        through the same driver call, without the PDL attribute where PDL is off. More dynamic
        shared memory than the device allows a block raises DeviceError (check_smem; loading
        such a kernel raises it first). `memo`: a launch the call's memo may replay
        (core/fastcall.py; its arguments the call's arrays, scalars and arrays kept for good)."""
        launched(self, fn, grid, block, args, smem, memo)  # a memo recording sees every launch
        if smem > 48 * 1024:
            check_smem(self.device, smem)
        if not isinstance(grid, int) and len(grid) > 1 and (
                grid[1] > MAX_GRID_YZ or (len(grid) > 2 and grid[2] > MAX_GRID_YZ)):
            raise ValueError(f"grid {tuple(grid)}: CUDA allows at most {MAX_GRID_YZ} blocks along y "
                             f"and z (a forced path over this many passes or splits; the "
                             f"selector's choice does not need it)")
        pdl = _pdl_device(self.device) and knobs.pdl()
        if pdl or any(isinstance(a, TensorMap) for a in args):  # CuPy cannot pass a TensorMap
            from .launch import launch_pdl

            extra = () if pdl else (False,)  # the driver launch, without the PDL attribute
            if self.foreign:
                with _cupy().cuda.Device(self.device):
                    launch_pdl(fn, grid, block, args, smem, self.stream.ptr, *extra)
            else:
                launch_pdl(fn, grid, block, args, smem, self.stream.ptr, *extra)
        elif self.foreign:
            with _cupy().cuda.Device(self.device):
                fn(grid, block, args, shared_mem=smem, stream=self.stream)
        else:
            fn(grid, block, args, shared_mem=smem, stream=self.stream)

    def empty(self, shape: tuple[int, ...], dtype: str) -> tuple[Any, Any]:
        """A new array of the caller's kind, and its cupy view for the launch."""
        cupy = _cupy()
        if self.kind == "torch":
            import torch

            t = torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{self.device}")
            native, view = t, _torch_to_cupy(t)
        else:
            if cupy.cuda.runtime.getDevice() == self.device:
                native = view = cupy.empty(shape, dtype=STORAGE[dtype])
            else:
                with cupy.cuda.Device(self.device):
                    native = view = cupy.empty(shape, dtype=STORAGE[dtype])
        if knobs.poison():  # unwritten elements then show as NaN / 0xFF in tests
            with on_stream(self.device, self.stream):
                view.view(np.uint8).fill(0xFF)
        return native, view


_streams: dict[tuple[int, int], Any] = {}


def context_of(x: Any, name: str) -> Ctx:
    """The call context from the first device argument."""
    cupy = _cupy()
    if type(x) is cupy.ndarray or isinstance(x, cupy.ndarray):
        dev = x.data.device_id
        if cupy.cuda.runtime.getDevice() == dev:
            return Ctx("cupy", dev, cupy.cuda.get_current_stream())
        return Ctx("cupy", dev, cupy.cuda.get_current_stream(dev), foreign=True)
    if _is_torch(x):
        import torch

        if not x.is_cuda:
            raise ValueError(f"{name}: a torch tensor on {x.device}; kernelgen needs a CUDA tensor")
        dev = x.device.index
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # a handle, no Stream object
        handle = raw(dev) if raw is not None else torch.cuda.current_stream(dev).cuda_stream
        stream = _streams.get((dev, handle))  # default streams are handle 0 on every device
        if stream is None:
            with warnings.catch_warnings():  # ExternalStream is the handle-based form we need
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = _streams[(dev, handle)] = cupy.cuda.ExternalStream(handle, dev)
        return Ctx("torch", dev, stream, foreign=cupy.cuda.runtime.getDevice() != dev)
    raise ValueError(
        f"{name}: expected a cupy.ndarray or a CUDA torch.Tensor, got {type(x).__module__}."
        f"{type(x).__name__}" + (" (NumPy arrays live on the host: use cupy.asarray first)"
                                  if isinstance(x, np.ndarray) else "")
    )


def _torch_to_cupy(t: Any) -> Any:
    """Zero-copy cupy view of a contiguous torch CUDA tensor (bf16 -> uint16 bits).

    The view is kept on the tensor (`_kg_cupy`) and reused while the tensor's data pointer and
    shape are unchanged: weights and preallocated outputs cost one check per call. The view does
    not own the tensor (no reference cycle); it lives on the tensor, so it never outlives it.
    """
    ptr = t.data_ptr()
    view = getattr(t, "_kg_cupy", None)
    if view is not None and view.data.ptr == ptr and view.shape == t.shape:
        return view
    import torch

    cupy = _cupy()
    if t.dtype == torch.bfloat16:
        dt = STORAGE["bfloat16"]
    else:
        dt = STORAGE[str(t.dtype)[6:]]  # "torch.float16" -> "float16"
    nbytes = t.numel() * t.element_size()
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None, t.device.index)
    view = cupy.ndarray(tuple(t.shape), dt, cupy.cuda.MemoryPointer(mem, 0))
    try:
        t._kg_cupy = view
    except (AttributeError, RuntimeError):  # a tensor subclass that refuses attributes
        view = cupy.ndarray(tuple(t.shape), dt, cupy.cuda.MemoryPointer(
            cupy.cuda.UnownedMemory(ptr, nbytes, t, t.device.index), 0))
    return view


def optional_int(value: Any, name: str) -> int | None:
    """A forced count of an API call (split_k, kw): None, or the value as int() makes it (numpy
    integers too); a ValueError naming it where int() cannot (a list was a TypeError)."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: expected an integer") from None


def dtype_name(dtype: Any) -> Any:
    """A dtype argument as the name the API checks ("float16", ...): numpy dtypes and scalar
    types and torch dtypes give their names; None, strings and anything else come back as they
    are (the caller's check then names what it expects)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)  # numpy dtype
    if isinstance(name, str):
        return name
    text = str(dtype)
    if text.startswith("torch."):  # torch.float16 -> "float16"
        return text[len("torch."):]
    try:
        return np.dtype(dtype).name  # numpy scalar types (np.float16)
    except TypeError:
        return dtype


def device_array(x: Any, name: str, ctx: Ctx, dtypes: tuple[str, ...], hint: str | None = None,
                 ndim: int | None = None) -> tuple[Any, str]:
    """Validate `x` and return (cupy view, logical dtype). Raises ValueError naming the rule."""
    cupy = _cupy()
    if type(x) is cupy.ndarray or isinstance(x, cupy.ndarray):
        if ctx.kind != "cupy":
            raise ValueError(f"{name}: a cupy array mixed with torch tensors; pass one kind")
        dev = x.data.device_id
        dt = _NAME_OF.get(x.dtype) or str(x.dtype)
        if dt == "uint16" and hint == "bfloat16":
            dt = "bfloat16"
        contiguous = x.flags.c_contiguous
        arr = x
    elif _is_torch(x):
        if ctx.kind != "torch":
            raise ValueError(f"{name}: a torch tensor mixed with cupy arrays; pass one kind")
        if not x.is_cuda:
            raise ValueError(f"{name}: a torch tensor on {x.device}; kernelgen needs a CUDA tensor")
        dev = x.device.index
        dt = str(x.dtype)[6:]
        contiguous = x.is_contiguous()
        arr = None
    else:
        context_of(x, name)  # raises the type error
        raise AssertionError("unreachable")
    if dev != ctx.device:
        raise ValueError(f"{name}: on device {dev}, other arguments are on device {ctx.device}")
    if dt not in dtypes:
        extra = " (bf16 from CuPy: a uint16 array with dtype='bfloat16')" if "bfloat16" in dtypes else ""
        raise ValueError(f"{name}: dtype {dt} not supported; expected one of {', '.join(dtypes)}{extra}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if not contiguous:
        raise ValueError(f"{name}: must be contiguous (row-major); call "
                         f"{'.contiguous()' if arr is None else 'cupy.ascontiguousarray'} first")
    return (arr if arr is not None else _torch_to_cupy(x)), dt


MAX_GRID_YZ = 65535  # a launch's gridDim.y and .z limit

# (tag, device, stream handle[, thread]) -> (fp32 workspace, u32 counters); grown buffers are
# retired, not freed: a CUDA graph captured with the old addresses keeps writing to them. A
# buffer grows to at least twice its size, so the retired ones of a key add up to less than
# its live one (calls with M rising a few rows at a time would otherwise keep one each).
_scratch: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_retired: list[tuple[Any, Any]] = []
_torch_owners: list[tuple[Any, Any]] = []  # torch tensors behind torch callers' scratch views


def scratch(ctx: Ctx, tag: str, ws_elems: int, n_counters: int) -> tuple[Any, Any]:
    """Split-K scratch of one kernel family on the caller's stream: an fp32 workspace of at
    least `ws_elems` and `n_counters` uint32 counters that are zero between launches (the
    kernels reset the ones they use). Reused in stream order; `tag` keeps families' counter
    protocols apart. Never freed once handed out (graphs may hold the addresses).

    torch callers get torch memory (on the current torch stream, which is ctx.stream): a first
    use inside `torch.cuda.graph` (global capture mode, on torch's own side stream) then draws
    from the graph's private pool instead of a cudaMalloc the capture would refuse."""
    import threading

    cp = _cupy()
    ptr = int(ctx.stream.ptr)
    # the per-thread default stream has one handle (2) but a stream per thread
    key: tuple[Any, ...] = (tag, ctx.device, ptr) + ((threading.get_ident(),) if ptr == 2 else ())
    cur = _scratch.get(key)
    if cur is not None and cur[0].size >= ws_elems and cur[1].size >= n_counters:
        return cur
    ws_size = max(ws_elems, 1)
    cnt_size = max(n_counters, 1)
    if cur is not None:  # grow geometrically (see _retired)
        ws_size = cur[0].size if cur[0].size >= ws_size else max(ws_size, 2 * cur[0].size)
        cnt_size = cur[1].size if cur[1].size >= cnt_size else max(cnt_size, 2 * cur[1].size)
    if ctx.kind == "torch":
        import torch

        dev = f"cuda:{ctx.device}"
        owners = (torch.empty(ws_size, dtype=torch.float32, device=dev),
                  torch.zeros(cnt_size, dtype=torch.int32, device=dev))
        _torch_owners.append(owners)
        new = (_torch_to_cupy(owners[0]), _torch_to_cupy(owners[1]).view(cp.uint32))
    else:
        with on_stream(ctx.device, ctx.stream):
            new = (cp.empty(ws_size, cp.float32), cp.zeros(cnt_size, cp.uint32))
    if cur is not None:
        _retired.append(cur)
    _scratch[key] = new
    return new


def gemm_bias_out(ctx: Ctx, a: Any, bias: Any, out: Any, n: int, k: int, dt: str
                  ) -> tuple[Any, Any, Any]:
    """The epilogue arguments of C [..., N] = A [..., K] . W^T (+ bias), checked: (bias view,
    or None; out as the caller gets it; out's cupy view). bias [N] and out [..., N] in dt; out
    is allocated when None. Alignment rules stay with each kernel family."""
    out_shape = tuple(int(s) for s in a.shape[:-1]) + (n,)
    b = None
    if bias is not None:
        b, _ = device_array(bias, "bias", ctx, (dt,), hint=dt, ndim=1)
        if b.shape[0] != n:
            raise ValueError(f"bias: has {b.shape[0]} elements, W has N={n} rows")
    if out is None:
        out, c = ctx.empty(out_shape, dt)
        return b, out, c
    c, _ = device_array(out, "out", ctx, (dt,), hint=dt)
    if tuple(c.shape) != out_shape:
        raise ValueError(f"out: shape {tuple(c.shape)}; expected {out_shape} (A {tuple(a.shape)}, "
                         f"W [{n}, {k}])")
    return b, out, c
