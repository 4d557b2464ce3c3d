"""Benchmark of issue 2 §7: compile and cache timings, host overhead, quantize / dequantize
throughput against the device-copy bandwidth of the same run.

    python examples/bench_kbit_format.py [--elements 67108864] [--json out.json] [--only throughput]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def fresh_process_first_call(cache_dir: str) -> dict:
    """Time the first quantize+dequantize in a new process whose disk cache is warm."""
    code = r"""
import time, json
t0 = time.perf_counter()
import cupy, kernelgen as kg
from kernelgen.core import jit
x = cupy.ones(4096, cupy.float16); cupy.cuda.Device().synchronize()
t1 = time.perf_counter()
q = kg.quantize_kbit(x, 4)
t2 = time.perf_counter()
y = kg.dequantize_kbit(q)
t3 = time.perf_counter()
cupy.cuda.Device().synchronize()
print(json.dumps({"import_s": t1 - t0, "first_quantize_s": t2 - t1, "first_dequantize_s": t3 - t2,
                  "compiled": [k.config.short() for k in jit._loaded.values()]}))
"""
    env = dict(os.environ, KERNELGEN_CACHE_DIR=cache_dir, KERNELGEN_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(dtype: str, bits: int, n: int, bw: float, l2_bytes: int) -> dict:
    """Quantize and dequantize of n elements, inputs rotated past L2, as fractions of `bw`."""
    import cupy

    import kernelgen as kg
    from kernelgen.bench import rotation, time_gpu

    esize = 4 if dtype == "float32" else 2
    storage = {"float16": cupy.float16, "bfloat16": cupy.uint16, "float32": cupy.float32}[dtype]

    def make_x():
        v = cupy.random.standard_normal(n, dtype=cupy.float32)
        if dtype == "bfloat16":
            return (v.view(cupy.uint32) >> 16).astype(cupy.uint16)
        return v.astype(storage)

    xs = rotation(make_x, n * esize, l2_bytes, factor=2)  # each is >= 128 MB already
    hint = "bfloat16" if dtype == "bfloat16" else None
    qs = [kg.quantize_kbit(xi, bits, dtype=hint) for xi in xs]
    outs = [cupy.empty(n, storage) for _ in qs]
    t_q = time_gpu(lambda i: kg.quantize_kbit(xs[i % len(xs)], bits, dtype=hint), iters=10)
    t_d = time_gpu(lambda i: kg.dequantize_kbit(qs[i % len(qs)], dtype, out=outs[i % len(outs)]),
                   iters=10)
    nb = n // 32
    q_bytes = n * esize + nb * bits * 4 + nb * 5  # x in; planes, fp32 + e4m4 scales out
    d_bytes = nb * bits * 4 + nb + n * esize  # planes + e4m4 in; values out
    return {"quantize_us": t_q * 1e6, "quantize_frac_copy": q_bytes / t_q / bw,
            "dequantize_us": t_d * 1e6, "dequantize_frac_copy": d_bytes / t_d / bw}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=("compile", "host", "throughput"), default=None,
                    help="run one section (1. compile/cache, 2. host overhead, 3. throughput)")
    args = ap.parse_args()

    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth
    from kernelgen.core import jit
    from kernelgen.kbit.config import KbitDequantizeConfig, KbitQuantizeConfig

    dev = device_info()
    res: dict = {"device": dev.name, "arch": dev.arch.name, "sms": dev.sm_count}
    cache_dir = tempfile.mkdtemp(prefix="kg-bench-")
    os.environ["KERNELGEN_CACHE_DIR"] = cache_dir

    # 1. cold compile per kernel, then a warm disk hit (load from disk + cuModuleLoad)
    if args.only in (None, "compile"):
        cold, warm = {}, {}
        for bits in (2, 3, 4, 5):
            for cfg in (KbitQuantizeConfig(arch=dev.arch.name, bits=bits, dtype="float16"),
                        KbitDequantizeConfig(arch=dev.arch.name, bits=bits, dtype="float16")):
                t = time.perf_counter()
                jit.get_kernel(cfg, dev.index)
                cold[cfg.short()] = time.perf_counter() - t
                jit.clear_memory_cache()
                t = time.perf_counter()
                jit.get_kernel(cfg, dev.index)
                warm[cfg.short()] = time.perf_counter() - t
        res["cold_compile_s"] = cold
        res["warm_disk_hit_s"] = warm
        res["fresh_process"] = fresh_process_first_call(cache_dir)

    # 2. host overhead per call: kbit dequantize of one block vs a bare RawKernel launch
    if args.only in (None, "host"):
        x = cupy.random.standard_normal(32, dtype=cupy.float32).astype(cupy.float16)
        q = kg.quantize_kbit(x, 4)
        out = cupy.empty(32, cupy.float16)
        raw = cupy.RawKernel(r'''extern "C" __global__ void k(const unsigned* p, const unsigned char* a,
            const float* c, unsigned short* o, long long n) { if (threadIdx.x == 0 && n < 0) o[0] = (unsigned short)c[0]; }''', "k")
        args_raw = (q.packed, q.absmax, q.codebook, out, np.int64(32))
        raw((1,), (256,), args_raw)
        kg.dequantize_kbit(q, out=out)
        cupy.cuda.Device().synchronize()
        n_calls = 20000

        def host_time(f):
            best = 1e9
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n_calls):
                    f()
                best = min(best, (time.perf_counter() - t) / n_calls)
                cupy.cuda.Device().synchronize()
            return best

        t_raw = host_time(lambda: raw((1,), (256,), args_raw))
        t_kg = host_time(lambda: kg.dequantize_kbit(q, out=out))
        t_kg_alloc = host_time(lambda: kg.dequantize_kbit(q))
        res["host_overhead_us"] = {"cupy_rawkernel": t_raw * 1e6, "dequantize_out": t_kg * 1e6,
                                   "dequantize_alloc": t_kg_alloc * 1e6, "ratio_out": t_kg / t_raw}

    # 3. throughput at >= 64M elements, inputs rotated past L2
    if args.only in (None, "throughput"):
        bw = copy_bandwidth()
        res["copy_GBps"] = bw / 1e9
        n = args.elements
        thr = {f"{dt}/k{bits}": throughput(dt, bits, n, bw, dev.l2_bytes)
               for dt in ("float16", "bfloat16", "float32") for bits in (2, 3, 4, 5)}
        res["throughput"] = thr
    text = json.dumps(res, indent=1)
    print(text)
    if "throughput" in res:  # short table last: us and fraction of the copy bandwidth
        print(f"copy {res['copy_GBps']:.0f} GB/s; n={args.elements}")
        print(f"{'dtype/bits':14s} {'quant us':>9s} {'frac':>5s} {'dequant us':>10s} {'frac':>5s}")
        for k, v in res["throughput"].items():
            print(f"{k:14s} {v['quantize_us']:9.1f} {v['quantize_frac_copy']:5.2f} "
                  f"{v['dequantize_us']:10.1f} {v['dequantize_frac_copy']:5.2f}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
