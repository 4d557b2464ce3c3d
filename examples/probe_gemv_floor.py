"""Where the kbit GEMV time goes: the streaming-read floor against problem size, and the GEMV
over N and K (M = 1), all timed as CUDA-graph replays with weights rotated past L2.

    python examples/probe_gemv_floor.py [--bits 4,2] [--read-mb 4,8,16,31,64,117]

A bare 16-byte-load read kernel at several grid sizes shows what any bandwidth kernel can reach
at a given size (launch, ramp and tail included); the GEMV sweep over N separates its fixed cost
per launch (the intercept) from its marginal rate.
"""

from __future__ import annotations

import argparse

import numpy as np

SHAPES = ((1024, 4096), (4096, 4096), (14336, 4096), (28672, 4096), (57344, 4096), (4096, 14336))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="4,2")
    ap.add_argument("--read-mb", default="4,8,16,31,64,117")
    args = ap.parse_args()

    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.bench import graph_time, read_bandwidth, read_kernel, rotation
    from kernelgen.kbit_gemm.select import select_gemv

    dev = device_info()
    stream = cupy.cuda.Stream(non_blocking=True)
    k_read = read_kernel()
    with stream:
        print(f"{dev.name}: read (1 GiB) {read_bandwidth() / 1e9:.0f} GB/s", flush=True)
        out1 = cupy.zeros(1, cupy.uint32)
        for mb in (int(v) for v in args.read_mb.split(",") if v):
            nb = mb << 20
            bufs = rotation(lambda nb=nb: cupy.ones(nb // 4, cupy.uint32), nb, dev.l2_bytes)
            n16 = np.uint64(nb // 16)
            for mul in (1, 2, 4, 8):
                grid = dev.sm_count * mul
                t, mode = graph_time(lambda i, g=grid, b=bufs, n=n16: k_read((g,), (256,), (b[i % len(b)], n, out1)),
                                     len(bufs), stream)
                print(f"read {mb:4d} MB grid={grid:5d}: {t * 1e6:7.2f} us = {nb / t / 1e9:5.0f} GB/s [{mode}]",
                      flush=True)
            del bufs
        rng = np.random.default_rng(0)
        for bits in (int(b) for b in args.bits.split(",")):
            for n, k in SHAPES:
                w = cupy.random.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
                base = kg.quantize_weight(w, bits)
                wbytes = base.q.packed.nbytes + base.q.absmax.nbytes
                copies = rotation(lambda base=base: kg.KbitLinear.from_kbit(
                    type(base.q)(base.q.packed.copy(), base.q.absmax.copy(), None, base.q.codebook,
                                 base.q.shape, base.q.bits, base.q.dtype)), wbytes, dev.l2_bytes)
                a = cupy.asarray(rng.standard_normal((1, k)).astype(np.float16))
                out = cupy.empty((1, n), cupy.float16)
                t, mode = graph_time(lambda i, c=copies, a=a, out=out: kg.gemm(a, c[i % len(c)], out=out, path="gemv"),
                                     len(copies), stream)
                plan = select_gemv(dev.arch.name, 1, n, k, bits, "float16", dev.sm_count)
                print(f"gemv k{bits} M=1 {n:6d}x{k:<6d} {wbytes / 2**20:7.2f} MB {t * 1e6:7.2f} us "
                      f"{wbytes / t / 1e9:6.0f} GB/s  split={plan.split} grid={plan.grid} [{mode}]", flush=True)
                del copies, base, w


if __name__ == "__main__":
    main()
