"""Measuring on the GPU the way DESIGN.md asks: CUDA events around many back-to-back calls,
median of repeats, inputs rotated past L2, and the device-copy bandwidth of the same run as
the floor everything is compared with."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def time_gpu(fn: Callable[[int], object], *, iters: int = 50, repeats: int = 7, warmup: int = 3) -> float:
    """Median seconds per call of fn(i) (i cycles through the rotation), events around `iters`."""
    import cupy

    for i in range(warmup):
        fn(i)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for r in range(repeats):
        start.record()
        for i in range(iters):
            fn(r * iters + i)
        end.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / iters)
    return statistics.median(samples)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    import cupy

    src = cupy.empty(nbytes // 4, cupy.float32)
    dst = cupy.empty_like(src)
    src.fill(1.0)
    t = time_gpu(lambda i: cupy.copyto(dst, src), iters=10, repeats=5)
    return 2 * nbytes / t


def rotation(make: Callable[[], object], bytes_each: int, l2_bytes: int, factor: int = 8) -> list:
    """Enough independent copies of an input that together they span factor x L2."""
    count = max(2, -(-factor * l2_bytes // max(1, bytes_each)))
    return [make() for _ in range(count)]


READ_SRC = r"""
extern "C" __global__ void read_bw(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
  unsigned acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
// four loads in flight a thread: uint4 i + j * stride of each pass, j = 0..3 (the tail by the
// same grid-stride loop)
extern "C" __global__ void read_bw4(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
  unsigned acc = 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w) : "l"(p + i + j * stride));
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
"""


def read_kernel(name: str = "read_bw"):
    """A streaming read kernel: name(uint4* p, uint64 n16, uint32* out), 16-byte loads,
    grid-stride (read_bw: one load in flight a thread; read_bw4: four); `out` is written only on
    an impossible xor, which keeps the loads alive."""
    import cupy

    return cupy.RawKernel(READ_SRC, name)


def stream_read_seconds(buf, nbytes: int) -> float:
    """Fastest time of the streaming read kernels (both, at 4 and 8 CTAs an SM) over the first
    nbytes (a multiple of 16) of the device buffer `buf`: what reading those bytes once costs."""
    import cupy
    import numpy as np

    from .arch import device_info

    if nbytes <= 0 or nbytes % 16 or nbytes > buf.nbytes:
        raise ValueError(f"nbytes={nbytes}: a positive multiple of 16 within the buffer's "
                         f"{buf.nbytes} bytes")
    out = cupy.zeros(1, cupy.uint32)
    n = np.uint64(nbytes // 16)
    sms = device_info().sm_count
    best = float("inf")
    for name in ("read_bw", "read_bw4"):
        k = read_kernel(name)
        for per_sm in (4, 8):
            t = time_gpu(lambda i, k=k, g=sms * per_sm: k((g,), (256,), (buf, n, out)),
                         iters=5, repeats=5)
            best = min(best, t)
    return best


def read_bandwidth(nbytes: int = 1 << 30) -> float:
    """Streaming read rate in bytes/s (16-byte loads, grid-stride, 1 GiB): the floor of kernels
    that read weights once."""
    import cupy
    import numpy as np

    from .arch import device_info

    buf = cupy.ones(nbytes // 4, cupy.uint32)
    out = cupy.zeros(1, cupy.uint32)
    k = read_kernel()
    n = np.uint64(nbytes // 16)
    grid = device_info().sm_count * 8
    return nbytes / time_gpu(lambda i: k((grid,), (256,), (buf, n, out)), iters=10, repeats=5)


def graph_time(call: Callable[[int], object], n: int, stream) -> tuple[float, str]:
    """(median seconds per call, "graph" | "stream") of call(i), i = 0..n-1 (a rotation of
    inputs) captured once in a CUDA graph on `stream` and replayed; a call that cannot be
    captured falls back to back-to-back launches."""
    for i in range(n):  # warm-up: compiles, selector memo, split-K scratch, cuBLAS handles
        call(i)
    stream.synchronize()
    try:
        stream.begin_capture()
        for i in range(n):
            call(i)
        graph = stream.end_capture()
        return time_gpu(lambda i: graph.launch(stream), iters=5, repeats=7, warmup=2) / n, "graph"
    except Exception:  # a library that cannot be captured: back-to-back launches instead
        if stream.is_capturing():
            try:
                stream.end_capture()
            except Exception:
                pass
        return time_gpu(call, iters=max(n, 50), repeats=7), "stream"
