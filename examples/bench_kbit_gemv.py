"""Benchmark of the kbit GEMM bandwidth path (decode shapes) against the read-bandwidth floor
and cuBLAS fp16 (cupy.matmul), all measured in the same run.

    python examples/bench_kbit_gemv.py [--bits 2,3,4,5] [--ms 1,2,4,8,16] [--json out.json]

Per (shape, bits, M): median microseconds per call, weights rotated past L2 (each call reads a
different copy; >= 8 x L2 in total), calls replayed from a CUDA graph so host launch overhead
stays out. Floors: weight bytes (planes + E4M4 scales) / read bandwidth, where the read
bandwidth is measured by a streaming 16-byte-load kernel; the device copy rate (bytes read +
written, kernelgen.bench.copy_bandwidth) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from kernelgen.bench import graph_time, read_bandwidth
from kernelgen.core.interop import smem_limit

SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096))

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="2,3,4,5")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--sweep", default="1,2,3,4,6,8",
                    help="K splits forced at M=1, 4 bits, for the tuning table (empty: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bits_list = [int(b) for b in args.bits.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth, rotation
    from kernelgen.kbit_gemm.select import select_gemv

    dev = device_info()
    copy_bw = copy_bandwidth()
    read_bw = read_bandwidth()
    res: dict = {"device": dev.name, "arch": dev.arch.name, "sms": dev.sm_count,
                 "l2_bytes": dev.l2_bytes, "copy_GBps_read_plus_write": copy_bw / 1e9,
                 "read_GBps": read_bw / 1e9, "rows": []}
    print(f"{dev.name}: copy {copy_bw / 1e9:.0f} GB/s (read+write), read {read_bw / 1e9:.0f} GB/s",
          flush=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    with stream:
        cublas: dict[tuple[int, int, int], tuple[float, str]] = {}
        for n, k in shapes:
            dense_bytes = n * k * 2
            dense = rotation(lambda n=n, k=k: cupy.random.standard_normal((n, k), dtype=cupy.float32)
                             .astype(cupy.float16), dense_bytes, dev.l2_bytes)
            for m in ms:
                a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                out = cupy.empty((m, n), cupy.float16)
                cublas[(n, k, m)] = graph_time(
                    lambda i, a=a, out=out, d=dense: cupy.matmul(a, d[i % len(d)].T, out=out),
                    len(dense), stream)
            del dense
            w = cupy.random.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
            for bits in bits_list:
                base = kg.quantize_weight(w, bits, layout="flat")
                wbytes = base.q.packed.nbytes + base.q.absmax.nbytes
                copies = rotation(lambda base=base: kg.KbitLinear.from_kbit(
                    type(base.q)(base.q.packed.copy(), base.q.absmax.copy(), None, base.q.codebook,
                                 base.q.shape, base.q.bits, base.q.dtype), layout="flat"), wbytes, dev.l2_bytes)
                t1 = None
                for m in ms:
                    a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                    out = cupy.empty((m, n), cupy.float16)
                    t, mode = graph_time(
                        lambda i, a=a, out=out, c=copies: kg.gemm(a, c[i % len(c)], out=out),
                        len(copies), stream)
                    t1 = t if m == 1 else t1
                    tc, _ = cublas[(n, k, m)]
                    plan = select_gemv(dev.arch.name, m, n, k, bits, "float16", dev.sm_count,
                                       smem_limit(dev.index))
                    row = {"N": n, "K": k, "bits": bits, "M": m, "us": t * 1e6,
                           "weight_bytes": wbytes, "floor_us": wbytes / read_bw * 1e6,
                           "frac_read_bw": wbytes / read_bw / t, "frac_copy_bw": wbytes / copy_bw / t,
                           "GBps": wbytes / t / 1e9, "cublas_fp16_us": tc * 1e6,
                           "speedup_vs_cublas": tc / t, "vs_M1": t / t1 if t1 else None,
                           "timing": mode, "rotation": len(copies), "plan": plan.short()}
                    res["rows"].append(row)
                    print(f"{n:>5}x{k:<5} k{bits} M={m:<2} {t * 1e6:7.2f} us  floor {row['floor_us']:6.2f}"
                          f"  {100 * row['frac_read_bw']:5.1f}% read BW  cuBLAS {tc * 1e6:6.2f} us "
                          f"({row['speedup_vs_cublas']:.2f}x)  M/M1 {row['vs_M1']:.2f}  [{mode}]",
                          flush=True)
                if bits == 4 and args.sweep:
                    a = cupy.asarray(rng.standard_normal((1, k)).astype(np.float16))
                    out = cupy.empty((1, n), cupy.float16)
                    sweep = {}
                    for sp in (int(v) for v in args.sweep.split(",")):
                        try:
                            t, _ = graph_time(lambda i, c=copies, sp=sp, a=a, out=out: kg.gemm(
                                a, c[i % len(c)], out=out, split_k=sp), len(copies), stream)
                        except ValueError:
                            continue
                        sweep[sp] = t * 1e6
                    res.setdefault("split_sweep_M1_k4", {})[f"{n}x{k}"] = sweep
                    print(f"  split sweep {n}x{k} k4 M=1: " +
                          ", ".join(f"{sp}: {us:.2f} us" for sp, us in sweep.items()), flush=True)
                del copies, base
            del w
    print()
    print(f"{'shape':>11} {'bits':>4} {'M':>3} {'us':>8} {'floor':>7} {'%readBW':>8} "
          f"{'cuBLAS':>8} {'speedup':>8} {'t/t(M=1)':>8}")
    for r in res["rows"]:
        print(f"{r['N']:>5}x{r['K']:<5} {r['bits']:>4} {r['M']:>3} {r['us']:8.2f} {r['floor_us']:7.2f} "
              f"{100 * r['frac_read_bw']:7.1f}% {r['cublas_fp16_us']:8.2f} {r['speedup_vs_cublas']:7.2f}x "
              f"{r['vs_M1']:8.2f}")
    res["summary"] = {"median_frac_read_bw_M1": statistics.median(
        r["frac_read_bw"] for r in res["rows"] if r["M"] == 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
