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
