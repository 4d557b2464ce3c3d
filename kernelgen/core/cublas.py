"""cublasGemmEx that also runs while the stream captures a CUDA graph.

CuPy's `cublas.setStream` refuses a capturing stream (NotImplementedError in CuPy 14), yet
cuBLAS itself captures fine as long as it does not allocate inside the capture. So the calls a
GEMM needs go through ctypes to the libcublas CuPy has loaded:

CuPy's handle of the device, the call's stream, and a workspace of our own bound after the
stream (cublasSetStream resets the workspace to the library's pool). One workspace per (device,
stream), never freed, so a graph may keep its address: from `core.interop.scratch` for CuPy
callers, a torch tensor for torch callers (allocated from the graph's private pool when the
first call is captured, which torch's global capture mode allows and cudaMalloc would not).
torch's own handle is not used: torch may bundle another libcublas than CuPy's.

Compute is fp32 (CUBLAS_COMPUTE_32F). The scalars are host values read at the call (baked into
a captured graph), or a device [alpha, beta] read when the GEMM runs (`scalars_ptr`).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

# cudaDataType / cublasComputeType_t / cublasOperation_t values (library_types.h, cublas_api.h)
DATA_TYPE = {"float16": 2, "bfloat16": 14, "float32": 0}
COMPUTE_32F = 68
GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
POINTER_MODE_HOST = 0
POINTER_MODE_DEVICE = 1
WORKSPACE_BYTES = 32 << 20  # what cuBLAS asks for on Hopper; more than enough elsewhere


class CublasError(RuntimeError):
    pass


@functools.cache
def _lib() -> ctypes.CDLL:
    """The libcublas this process already uses (CuPy's), found through /proc/self/maps."""
    import cupy_backends.cuda.libs.cublas  # noqa: F401  (loads libcublas)

    path = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.rsplit(None, 1)[-1]
                if "/libcublas.so" in p:
                    path = p
                    break
    except OSError:
        pass
    names = [path] if path else ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise CublasError(f"libcublas not found (tried {names})")
    vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, sz]
    lib.cublasSetPointerMode_v2.argtypes = [vp, i32]
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp,
                                 vp, i32, i32, i32, i32]
    for fn in (lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasSetPointerMode_v2,
               lib.cublasGemmEx):
        fn.restype = i32
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed: cublasStatus_t {status}")


_torch_workspaces: dict[tuple[int, int], Any] = {}


def _workspace(ctx: Any) -> tuple[int, int]:
    """(pointer, bytes) of the call's (device, stream) workspace."""
    if ctx.kind == "torch":
        key = (ctx.device, int(ctx.stream.ptr))
        ws = _torch_workspaces.get(key)
        if ws is None:
            import torch

            ws = _torch_workspaces[key] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8,
                                                      device=f"cuda:{ctx.device}")
        return int(ws.data_ptr()), WORKSPACE_BYTES
    from .interop import scratch

    ws, _ = scratch(ctx, "cublas_workspace", WORKSPACE_BYTES // 4, 1)
    return int(ws.data.ptr), int(ws.nbytes)


def _handle(ctx: Any) -> int:
    """CuPy's cuBLAS handle of ctx.device, launching on ctx.stream with its own workspace."""
    import cupy

    lib = _lib()
    handle = int(cupy.cuda.device.get_cublas_handle())  # the current device's (gemm_ex sets it)
    ws_ptr, ws_bytes = _workspace(ctx)
    _check(lib.cublasSetStream_v2(handle, int(ctx.stream.ptr)), "cublasSetStream")
    _check(lib.cublasSetWorkspace_v2(handle, ws_ptr, ws_bytes), "cublasSetWorkspace")
    return handle


def gemm_ex(ctx: Any, transa: int, transb: int, m: int, n: int, k: int, alpha: float,
            a_ptr: int, a_type: str, lda: int, b_ptr: int, b_type: str, ldb: int, beta: float,
            c_ptr: int, c_type: str, ldc: int, scalars_ptr: int | None = None) -> None:
    """Column-major C [m, n] = alpha op(A) op(B) + beta C on ctx.stream, fp32 compute.
    `scalars_ptr`: the device address of float32 [alpha, beta] (then alpha and beta are not
    read); the handle goes back to host scalars after the call (CuPy's own calls expect them)."""
    import cupy

    lib = _lib()
    one = np.array([alpha], np.float32)
    bet = np.array([beta], np.float32)
    if scalars_ptr is None:
        mode, pa, pb = POINTER_MODE_HOST, one.ctypes.data, bet.ctypes.data
    else:
        mode, pa, pb = POINTER_MODE_DEVICE, scalars_ptr, scalars_ptr + 4
    with cupy.cuda.Device(ctx.device):  # a handle is used on the device it was made for
        handle = _handle(ctx)
        _check(lib.cublasSetPointerMode_v2(handle, mode), "cublasSetPointerMode")
        status = lib.cublasGemmEx(handle, transa, transb, m, n, k, pa, a_ptr, DATA_TYPE[a_type],
                                  lda, b_ptr, DATA_TYPE[b_type], ldb, pb, c_ptr,
                                  DATA_TYPE[c_type], ldc, COMPUTE_32F, GEMM_DEFAULT)
        if mode != POINTER_MODE_HOST:  # restored first, so that the GEMM's error is the one raised
            restored = lib.cublasSetPointerMode_v2(handle, POINTER_MODE_HOST)
        _check(status, "cublasGemmEx")
        if mode != POINTER_MODE_HOST:
            _check(restored, "cublasSetPointerMode")
