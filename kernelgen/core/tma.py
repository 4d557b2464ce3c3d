"""Tensor maps for the bulk tensor copies of sm_90 kernels (templates/common/tma.cuh).

A tensor map describes a tiled view of a device array: its base address, up to five
dimensions (innermost first) with their byte strides, the box one copy moves, and the swizzle of
the box in shared memory. The driver encodes it (`cuTensorMapEncodeTiled`, a host-only call: no
device work, no synchronisation, capturable calls stay capturable) into 128 opaque bytes that the
kernel takes by value as a `__grid_constant__` parameter; core.launch passes a `TensorMap`
argument as those bytes. Maps hold raw addresses, so they are encoded for each call's arrays.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from ..errors import DeviceError

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
DATA_UINT16 = 1  # 16-bit elements copied as bits (fp16, bf16): out-of-bounds fill is 0x0000
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
OOB_FILL_ZERO = 0
INTERLEAVE_NONE = 0


class TensorMap:
    """An encoded CUtensorMap (128 bytes), a kernel argument of core.launch."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes):
        if len(raw) != 128:
            raise ValueError(f"a tensor map is 128 bytes, got {len(raw)}")
        self.raw = raw


_encode = None


def _encoder():
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode = fn
    return _encode


def check_tiled(ptr: int, dims: Sequence[int], strides: Sequence[int], box: Sequence[int],
                elem_bytes: int = 2, swizzle_bytes: int = 128) -> None:
    """The rules cuTensorMapEncodeTiled enforces, as ValueErrors naming the one broken (so a
    bad view fails before the driver's bare CUDA_ERROR_INVALID_VALUE)."""
    rank = len(dims)
    if not 1 <= rank <= 5 or len(box) != rank or len(strides) != rank - 1:
        raise ValueError(f"tensor map: rank {rank} with {len(box)} box sizes and {len(strides)} "
                         f"strides; ranks 1..5, one stride per dimension after the first")
    if ptr % 16:
        raise ValueError(f"tensor map: base address {ptr:#x} must be 16-byte aligned")
    for i, d in enumerate(dims):
        if not 1 <= d <= 1 << 32:
            raise ValueError(f"tensor map: dimension {i} has {d} elements; 1..2^32")
    for i, s in enumerate(strides, 1):
        if s % 16 or not 0 < s < 1 << 40:
            raise ValueError(f"tensor map: stride of dimension {i} is {s} bytes; a multiple of "
                             f"16 below 2^40 (rows of K elements need K * {elem_bytes} % 16 == 0)")
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise ValueError(f"tensor map: box dimension {i} is {b}; 1..256")
    if box[0] * elem_bytes > swizzle_bytes:
        raise ValueError(f"tensor map: the box's inner {box[0] * elem_bytes} bytes exceed the "
                         f"{swizzle_bytes}-byte swizzle span")


def encode_tiled(ptr: int, dims: Sequence[int], strides: Sequence[int], box: Sequence[int],
                 elem_bytes: int = 2) -> TensorMap:
    """A tiled map of 16-bit elements at device address `ptr`: `dims` elements a dimension
    (innermost first), `strides` the byte strides of dimensions 1.., `box` the elements one copy
    moves a dimension; 128-byte swizzle, 256-byte L2 promotion, zeros outside the tensor."""
    if elem_bytes != 2:
        raise ValueError(f"tensor map: {elem_bytes}-byte elements; only 16-bit ones are encoded")
    check_tiled(ptr, dims, strides, box, elem_bytes)
    rank = len(dims)
    out = (ctypes.c_uint64 * 16)()
    gdim = (ctypes.c_uint64 * rank)(*dims)
    gstr = (ctypes.c_uint64 * max(1, rank - 1))(*strides)
    bdim = (ctypes.c_uint32 * rank)(*box)
    estr = (ctypes.c_uint32 * rank)(*([1] * rank))
    rc = _encoder()(ctypes.addressof(out), DATA_UINT16, rank, ctypes.c_void_p(ptr), gdim, gstr,
                    bdim, estr, INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_ZERO)
    if rc:
        raise DeviceError(f"cuTensorMapEncodeTiled: CUDA error {rc} for dims {list(dims)}, "
                          f"strides {list(strides)}, box {list(box)} at {ptr:#x}")
    return TensorMap(bytes(out))
