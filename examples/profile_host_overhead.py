"""Host-side cost of one cached kernelgen call against a bare CuPy RawKernel launch, and a
cProfile of the kernelgen path (where the microseconds go).

    python examples/profile_host_overhead.py
"""

import cProfile
import os
import pstats
import time

import cupy
import numpy as np

import kernelgen as kg


def per_call(f, n=20000, rounds=5):
    best = 1e9
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
        cupy.cuda.Device().synchronize()
    return best * 1e6


def main():
    x = cupy.random.standard_normal(32, dtype=cupy.float32).astype(cupy.float16)
    q = kg.quantize_kbit(x, 4)
    out = cupy.empty(32, cupy.float16)
    raw = cupy.RawKernel(r'''extern "C" __global__ void k(const unsigned* p, const unsigned char* a,
        const float* c, unsigned short* o, long long n) { if (n < 0) o[0] = (unsigned short)c[0]; }''', "k")
    args = (q.packed, q.absmax, q.codebook, out, np.int64(32))
    raw((1,), (256,), args)
    kg.dequantize_kbit(q, out=out)
    t_raw = per_call(lambda: raw((1,), (256,), args))
    t_kg = per_call(lambda: kg.dequantize_kbit(q, out=out))
    t_alloc = per_call(lambda: kg.dequantize_kbit(q))
    t_quant = per_call(lambda: kg.quantize_kbit(x, 4))
    print(f"raw {t_raw:.2f} us | dequantize(out=) {t_kg:.2f} us ({t_kg / t_raw:.2f}x) | "
          f"dequantize {t_alloc:.2f} us | quantize {t_quant:.2f} us")
    # the PDL launch path (core/launch.py: cuLaunchKernelEx through ctypes) on the same kernel,
    # and a cached GEMV call with and without it
    from kernelgen.core.launch import launch_pdl

    sp = cupy.cuda.get_current_stream().ptr
    t_pdl = per_call(lambda: launch_pdl(raw.kernel, (1,), (256,), args, 0, sp))
    lin = kg.quantize_weight(cupy.random.standard_normal((256, 1024), dtype=cupy.float32).astype(cupy.float16), 4)
    a = cupy.random.standard_normal((1, 1024), dtype=cupy.float32).astype(cupy.float16)
    o = cupy.empty((1, 256), cupy.float16)
    kg.gemm(a, lin, out=o)
    t_gemv = per_call(lambda: kg.gemm(a, lin, out=o), n=5000)
    os.environ["KERNELGEN_PDL"] = "0"
    t_gemv0 = per_call(lambda: kg.gemm(a, lin, out=o), n=5000)
    del os.environ["KERNELGEN_PDL"]
    print(f"raw through launch_pdl {t_pdl:.2f} us ({t_pdl / t_raw:.2f}x raw) | gemm M=1 (out=) "
          f"{t_gemv:.2f} us with PDL, {t_gemv0:.2f} us without")
    try:
        import torch

        xt = torch.randn(32, device="cuda", dtype=torch.float16)
        qt = kg.quantize_kbit(xt, 4)
        ot = torch.empty(32, device="cuda", dtype=torch.float16)
        t_torch = per_call(lambda: kg.dequantize_kbit(qt, out=ot))
        print(f"torch dequantize(out=) {t_torch:.2f} us ({t_torch / t_raw:.2f}x raw)")
    except ImportError:
        pass
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20000):
        kg.dequantize_kbit(q, out=out)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
