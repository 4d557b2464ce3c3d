"""CuPy arrays and torch tensors in, the caller's kind out, on the caller's current stream.

CuPy has no bfloat16 dtype: bf16 data in CuPy is a uint16 array of bf16 bit patterns, and ops
take a `dtype="bfloat16"` hint for such input. torch bf16 tensors are viewed the same way
without a copy. Every check here runs before any launch and raises ValueError naming the
argument and the rule.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# logical dtype name -> (numpy storage dtype, element bytes)
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
_TORCH_NAMES = {
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
    "uint8": "uint8", "int32": "int32", "int64": "int64", "int16": "int16",
    "uint16": "uint16", "uint32": "uint32",
}


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and "torch" in sys.modules


class Ctx:
    """Where the call runs: array kind of the caller, device index, stream to launch on."""

    __slots__ = ("kind", "device", "stream")

    def __init__(self, kind: str, device: int, stream: Any):
        self.kind, self.device, self.stream = kind, device, stream

    def empty(self, shape: tuple[int, ...], dtype: str) -> tuple[Any, Any]:
        """A new array of the caller's kind, and its cupy view for the launch."""
        import cupy

        if self.kind == "torch":
            import torch

            t = torch.empty(shape, dtype=getattr(torch, _TORCH_NAMES[dtype]), device=f"cuda:{self.device}")
            return t, _torch_to_cupy(t)
        with cupy.cuda.Device(self.device):
            a = cupy.empty(shape, dtype=STORAGE[dtype])
        return a, a


_streams: dict[int, Any] = {}


def context_of(x: Any, name: str) -> Ctx:
    """The call context from the first device argument."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return Ctx("cupy", x.device.id, cupy.cuda.get_current_stream(x.device.id))
    if _is_torch(x):
        import torch

        if not x.is_cuda:
            raise ValueError(f"{name}: a torch tensor on {x.device}; kernelgen needs a CUDA tensor")
        dev = x.device.index
        handle = torch.cuda.current_stream(dev).cuda_stream
        stream = _streams.get(handle)
        if stream is None:
            stream = _streams[handle] = cupy.cuda.ExternalStream(handle, dev)
        return Ctx("torch", dev, stream)
    raise ValueError(
        f"{name}: expected a cupy.ndarray or a CUDA torch.Tensor, got {type(x).__module__}."
        f"{type(x).__name__}" + (" (NumPy arrays live on the host: use cupy.asarray first)"
                                  if isinstance(x, np.ndarray) else "")
    )


def _torch_to_cupy(t: Any) -> Any:
    """Zero-copy cupy view of a contiguous torch CUDA tensor (bf16 -> uint16 bits)."""
    import cupy
    import torch

    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
        dt = np.uint16
    else:
        dt = np.dtype(str(t.dtype).replace("torch.", ""))
    nbytes = t.numel() * t.element_size()
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dt, cupy.cuda.MemoryPointer(mem, 0))


def logical_dtype(x: Any, hint: str | None = None) -> str:
    if _is_torch(x):
        return str(x.dtype).replace("torch.", "")
    name = x.dtype.name
    if name == "uint16" and hint == "bfloat16":
        return "bfloat16"
    return name


def device_array(x: Any, name: str, ctx: Ctx, dtypes: tuple[str, ...], hint: str | None = None,
                 ndim: int | None = None) -> tuple[Any, str]:
    """Validate `x` and return (cupy view, logical dtype). Raises ValueError naming the rule."""
    import cupy

    if isinstance(x, cupy.ndarray):
        if ctx.kind != "cupy":
            raise ValueError(f"{name}: a cupy array mixed with torch tensors; pass one kind")
        arr = x
    elif _is_torch(x):
        if ctx.kind != "torch":
            raise ValueError(f"{name}: a torch tensor mixed with cupy arrays; pass one kind")
        if not x.is_cuda:
            raise ValueError(f"{name}: a torch tensor on {x.device}; kernelgen needs a CUDA tensor")
        if not x.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (row-major); call .contiguous() first")
        arr = None
    else:
        context_of(x, name)  # raises the type error
        raise AssertionError("unreachable")
    dev = x.device.index if arr is None else arr.device.id
    if dev != ctx.device:
        raise ValueError(f"{name}: on device {dev}, other arguments are on device {ctx.device}")
    dt = logical_dtype(x, hint)
    if dt not in dtypes:
        extra = " (bf16 from CuPy: a uint16 array with dtype='bfloat16')" if "bfloat16" in dtypes else ""
        raise ValueError(f"{name}: dtype {dt} not supported; expected one of {', '.join(dtypes)}{extra}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if arr is None:
        arr = _torch_to_cupy(x)
    elif not arr.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous; call cupy.ascontiguousarray first")
    return arr, dt


def returned(native: Any) -> Any:
    return native
