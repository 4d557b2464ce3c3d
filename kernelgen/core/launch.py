"""Kernel launches with programmatic dependent launch (PDL), through the driver's cuLaunchKernelEx.

A kernel launched with the programmatic-stream-serialization attribute may be scheduled while the
grid before it on the stream is still finishing; its first instruction, `griddepcontrol.wait`
(kg::grid_dependency_wait in templates/common/ptx.cuh), then holds it until that grid has
completed and its memory is visible. The result is stream order exactly as without the
attribute, minus the gap between the two grids (0.2-0.6 us measured on an H100 between
back-to-back decode kernels, BENCHMARKS.md "Launch overlap"). Only kernels whose every
entry point waits first may be launched this way: every kernelgen kernel does (KernelConfig).

CuPy has no launch-attribute API, so the call goes to libcuda through ctypes; the same call
without the attribute launches kernels whose parameters CuPy cannot pass (a 128-byte
core.tma.TensorMap, 64-byte aligned). Per thread and per
(function, grid, block, shared memory, stream, PDL or not) the config struct, a parameter
buffer and its pointer array are built once; a call packs the argument values into the buffer
with a precompiled struct and calls the driver (CUDA copies the parameters at the call, so the
buffer is free again when it returns). Captured into a CUDA graph, the launch becomes a
programmatic dependency edge.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import numpy as np

from .tma import TensorMap

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

# numpy scalar type -> struct code (size = alignment); device arrays are 8-byte pointers ("A")
SCALAR_CODES: dict[type, str] = {
    np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q", np.float32: "f",
    np.float64: "d",
}


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, 64-byte value union (8-aligned)
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_uint64 * 8)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


def param_layout(codes: str) -> tuple[str, list[int], int]:
    """(struct format, byte offset of each parameter, total bytes) of kernel parameters with
    these struct codes, each at its natural alignment (as CUDA lays out a parameter buffer)."""
    fmt, offsets, off = "<", [], 0
    for c in codes:
        if c == "M":  # a tensor map (core.tma.TensorMap): 128 bytes, 64-byte aligned
            c, size, align = "128s", 128, 64
        else:
            size = align = struct.calcsize("<" + c)
        pad = -off % align
        fmt += "x" * pad
        off += pad
        offsets.append(off)
        fmt += c
        off += size
    return fmt, offsets, max(off, 8)


class _Packer:
    """A parameter buffer for one argument signature and the pointer array into it."""

    __slots__ = ("struct", "buf", "ptrs", "arrays", "maps")

    def __init__(self, codes: str):
        self.arrays = tuple(i for i, c in enumerate(codes) if c == "A")  # pass .data.ptr
        self.maps = tuple(i for i, c in enumerate(codes) if c == "M")  # pass .raw
        fmt, offsets, size = param_layout(codes.replace("A", "Q"))
        self.struct = struct.Struct(fmt)
        self.buf = ctypes.create_string_buffer(size)
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])


class _Driver:
    """libcuda's cuLaunchKernelEx and cuGetErrorName, loaded on first use (never on a machine
    without a GPU: nothing launches there)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        # no argtypes: every call passes ready ctypes objects (byref config, c_void_p
        # function, pointer array, None), which skips the per-call conversion
        self.launch = lib.cuLaunchKernelEx
        self.launch.restype = ctypes.c_int
        self.error_name = lib.cuGetErrorName
        self.error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.attr = _Attr()
        self.attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.value[0] = 1  # programmaticStreamSerializationAllowed (int at offset 0)

    def error(self, code: int) -> str:
        name = ctypes.c_char_p()
        self.error_name(code, ctypes.byref(name))
        return (name.value or b"?").decode()


_driver: _Driver | None = None
_local = threading.local()  # per thread: {launch key: _Launch}


class _Launch:
    """Everything of one (function, grid, block, smem, stream) launch but the argument values:
    the config struct, the function handle and the parameter buffer. A function's parameter
    types are fixed by its signature, so the first call's argument types hold for every later
    one (a device array where a scalar was, or the reverse, fails in the packing)."""

    __slots__ = ("config", "config_ref", "fn", "function", "packer")

    def __init__(self, driver: _Driver, function: Any, grid: tuple, block: tuple, smem: int,
                 stream_ptr: int, args: tuple | str, pdl: bool = True):
        g = ((grid,) if isinstance(grid, int) else tuple(grid)) + (1, 1)
        b = ((block,) if isinstance(block, int) else tuple(block)) + (1, 1)
        self.config = _Config(g[0], g[1], g[2], b[0], b[1], b[2], smem, stream_ptr or None,
                              ctypes.pointer(driver.attr), 1 if pdl else 0)
        self.config_ref = ctypes.byref(self.config)
        self.fn = ctypes.c_void_p(function.ptr)
        self.function = function  # keeps its module loaded: the handle is not reused meanwhile
        self.packer = _Packer(args if isinstance(args, str) else arg_codes(args))


def arg_codes(args: tuple) -> str:
    """The struct codes of a launch's arguments ("A" a device array, "M" a tensor map)."""
    import cupy

    out = []
    for i, a in enumerate(args):
        if isinstance(a, cupy.ndarray):
            out.append("A")
        elif isinstance(a, TensorMap):
            out.append("M")
        else:
            code = SCALAR_CODES.get(type(a))
            if code is None:
                raise TypeError(f"launch_pdl: argument {i} is a {type(a).__name__}; expected a "
                                f"cupy array, a TensorMap or one of "
                                f"{[t.__name__ for t in SCALAR_CODES]}")
            out.append(code)
    return "".join(out)


def _launch_of(fn: Any, grid: tuple, block: tuple, args: tuple | str, smem: int,
               stream_ptr: int, pdl: bool) -> _Launch:
    """This thread's _Launch of (fn, grid, block, smem, stream, pdl), built on first use from
    the argument types of `args` (or their arg_codes)."""
    global _driver
    if _driver is None:
        _driver = _Driver()
    try:
        cache = _local.launches
    except AttributeError:
        cache = _local.launches = {}
    # keyed by the Function object's identity, which the entry keeps alive (not by its handle:
    # a handle can come back after its module is unloaded, e.g. by jit.clear_memory_cache, for
    # a kernel of other parameter types)
    key = (id(fn), grid, block, smem, stream_ptr, pdl)
    ln = cache.get(key)
    if ln is None:
        if len(cache) > 4096:  # shapes of a long-running server: keep the memo bounded
            cache.clear()
        ln = cache[key] = _Launch(_driver, fn, grid, block, smem, stream_ptr, args, pdl)
    return ln


def _send(ln: _Launch, vals: list, grid: tuple, block: tuple, smem: int) -> None:
    p = ln.packer
    p.struct.pack_into(p.buf, 0, *vals)
    rc = _driver.launch(ln.config_ref, ln.fn, p.ptrs, None)
    if rc:
        raise RuntimeError(f"cuLaunchKernelEx: {_driver.error(rc)} ({rc}) for grid {grid}, block "
                           f"{block}, {smem} bytes of shared memory")


def launch_pdl(fn: Any, grid: tuple, block: tuple, args: tuple, smem: int, stream_ptr: int,
               pdl: bool = True) -> None:
    """Launch cupy Function `fn` on the stream with the PDL attribute (`pdl` False: without it,
    for arguments CuPy's own launch cannot pass, such as a TensorMap). With PDL the kernel must
    start with kg::grid_dependency_wait()."""
    ln = _launch_of(fn, grid, block, args, smem, stream_ptr, pdl)
    p = ln.packer
    vals = list(args)
    for i in p.arrays:
        vals[i] = vals[i].data.ptr
    for i in p.maps:
        vals[i] = vals[i].raw
    _send(ln, vals, grid, block, smem)


def launch_values(fn: Any, grid: tuple, block: tuple, codes: str, smem: int, stream_ptr: int,
                  pdl: bool, vals: list) -> None:
    """launch_pdl with the values given: `vals` are the arguments with each device array as its
    pointer and each tensor map as its bytes, `codes` their arg_codes (core/fastcall.py: a launch
    replayed with other A / bias / C pointers)."""
    _send(_launch_of(fn, grid, block, codes, smem, stream_ptr, pdl), vals, grid, block, smem)
