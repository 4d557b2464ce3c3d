"""The streaming read kernels of kernelgen.bench (the read floors of the benchmarks and the
bound of bench_moe.py): they compile for every arch of the matrix without a device, and on a
device they read every 16-byte chunk, the unrolled passes and the tail alike.

A kernel writes out[0] only when the xor of what one thread read is 0x12345678: a buffer of
zeros with that word in one chunk marks whether the thread owning the chunk read it.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.bench import READ_SRC

MARK = 0x12345678


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_read_kernels_compile(arch):
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(READ_SRC, "read.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch.rstrip('a')}"])
    except nvrtc.NVRTCError as err:  # pragma: no cover - the log says why
        pytest.fail(f"{err}: {nvrtc.getProgramLog(prog)}")
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["read_bw", "read_bw4"])
def test_read_kernels_read_every_chunk(name):
    import cupy

    from kernelgen.bench import read_kernel

    k = read_kernel(name)
    grid, block = 3, 64  # 192 threads: n16 = 1000 leaves a partial pass and a tail
    n16 = 1000
    for chunk in (0, 191, 192 * 4 - 1, 192 * 4, 900, n16 - 1):
        buf = cupy.zeros(4 * n16, cupy.uint32)
        buf[4 * chunk + 1] = MARK
        out = cupy.zeros(1, cupy.uint32)
        k((grid,), (block,), (buf, np.uint64(n16), out))
        assert int(out[0]) == MARK, (name, chunk)
        # past n16: never read
        out[...] = 0
        k((grid,), (block,), (buf, np.uint64(chunk), out))
        assert int(out[0]) == 0, (name, chunk)


@pytest.mark.gpu
def test_stream_read_seconds_is_a_rate():
    import cupy

    from kernelgen.bench import stream_read_seconds

    nbytes = 64 << 20
    buf = cupy.ones(nbytes // 4, cupy.uint32)
    t = stream_read_seconds(buf, nbytes)
    assert 0.05e12 < nbytes / t < 20e12
    assert stream_read_seconds(buf, nbytes // 2) < t
