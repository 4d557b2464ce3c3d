"""Benchmark of the kbit GEMM over M (decode to prefill): every path the selector has (GEMV,
tensor-core mma, dequantize + cuBLAS), the mma tiles forced one by one, against cuBLAS fp16
(`cupy.matmul` on a dense fp16 W) and the read-bandwidth floor, all measured in the same run.

    python examples/bench_kbit_gemm.py [--bits 2,3,4,5] [--ms 16,...,8192] [--tiles]
        [--layouts tiled,flat] [--dtype float16|bfloat16] [--json out.json]

4-bit weights run in each of --layouts ("tiled": the FP4 kernels' layout, kbit_gemm/tiled.py,
paths gemv / tile / dequant, and on sm_90a wgmma (forced too at M >= 16); "flat": gemv / mma /
dequant); other bit-widths are flat only.

Per (shape, bits, M): median microseconds per call; the weights (kbit and fp16) are rotated
past L2 (each call reads a different copy, >= 8 x L2 in all); every path is replayed from a CUDA
graph (GPU time; cuBLAS fp16 runs back to back). TFLOP/s = 2 M N K / t; "vs cuBLAS" = cuBLAS
time / our time; "read BW" = kbit weight bytes (planes + E4M4 scales) / t / measured read rate.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernelgen.bench import read_bandwidth
from kernelgen.core.interop import smem_limit

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
MS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

def timed(call, n: int, graph: bool, label: str = "") -> tuple[float, str]:
    """(median seconds per call of call(i) over a rotation of n inputs, "graph" | "stream").

    A failed capture, a graph that does not take the calls' time, or a call that changes the
    current stream is printed (the row is then stream-timed) instead of passing silently."""
    import cupy

    from kernelgen.bench import time_gpu

    stream = cupy.cuda.get_current_stream()
    for i in range(min(n, 3)):
        call(i)
    stream.synchronize()
    t0 = time.perf_counter()
    call(0)
    stream.synchronize()
    est = time.perf_counter() - t0
    cur = cupy.cuda.get_current_stream()
    if cur.ptr != stream.ptr:
        print(f"  !! {label}: the call changed the current stream {stream.ptr:#x} -> {cur.ptr:#x} "
              f"(launches leave the captured stream); restoring it", flush=True)
        stream.use()
    if graph:
        try:
            for i in range(n):  # warm every rotation entry before capture
                call(i)
            stream.synchronize()
            stream.begin_capture()
            try:
                for i in range(n):
                    call(i)
            finally:
                g = stream.end_capture()
            if cupy.cuda.get_current_stream().ptr != stream.ptr:
                raise RuntimeError("a call inside the capture changed the current stream")
            reps = max(1, min(20, int(0.05 / max(est * n, 1e-6))))
            t = time_gpu(lambda i: g.launch(stream), iters=reps, repeats=5, warmup=1) / n
            # one call's device time cannot be below ~1 us: a faster graph captured no kernels
            if t < 1e-6:
                raise RuntimeError(f"graph replay {t * 1e6:.2f} us per call: the graph holds no "
                                   f"kernels (the launches went to another stream)")
            return t, "graph"
        except Exception as e:
            print(f"  !! {label}: CUDA-graph timing failed, falling back to stream timing: {e!r}",
                  flush=True)
            if cupy.cuda.get_current_stream().ptr != stream.ptr:
                stream.use()
            try:
                if stream.is_capturing():
                    stream.end_capture()
            except Exception as e2:  # an invalidated capture: report, keep going
                print(f"  !! {label}: ending the capture failed too: {e2!r}", flush=True)
    iters = max(3, min(200, int(0.05 / max(est, 1e-6))))
    return time_gpu(call, iters=iters, repeats=5, warmup=1), "stream"


def copies_of(lin, count: int):
    """Independent device copies of a KbitLinear (same codebook), for the L2 rotation."""
    import dataclasses

    import cupy

    from kernelgen.kbit.api import KbitTensor
    from kernelgen.kbit_gemm import KbitLinear

    out = [lin]
    for _ in range(count - 1):
        if lin.tiled is not None:
            t = lin.tiled
            t2 = dataclasses.replace(t, data=cupy.copy(t.data), scales=cupy.copy(t.scales))
            out.append(KbitLinear(None, lin.n, lin.k, t2))
            continue
        q = lin.q
        q2 = KbitTensor(cupy.copy(q.packed), cupy.copy(q.absmax), None, q.codebook, q.shape, q.bits,
                        q.dtype)
        out.append(KbitLinear(q2, lin.n, lin.k))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="2,3,4,5")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--tiles", action="store_true", help="4-bit: every mma tile forced too")
    ap.add_argument("--layouts", default="tiled,flat", help="layouts of 4-bit weights")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                    help="activations of the kbit rows (cuBLAS stays fp16)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.kbit_gemm.tc_config import TILES
    from kernelgen.kbit_gemm.tc_select import plan_gemm
    from kernelgen.kbit_gemm.tiled import plan_tiled

    info = device_info()
    # graphs cannot capture the legacy default stream: a non-blocking one, made current for the
    # whole run with use() (as applications do; timed() reports a call that changes it)
    stream = cupy.cuda.Stream(non_blocking=True)
    stream.use()
    l2 = info.l2_bytes or 50 << 20
    read_bw = read_bandwidth()
    bits_list = [int(b) for b in args.bits.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    print(f"device {info.name} sms={info.sm_count} read_bw={read_bw / 1e12:.2f} TB/s", flush=True)
    for n, k in shapes:
        rng = np.random.default_rng(0)
        w = cupy.asarray(rng.standard_normal((n, k), np.float32).astype(np.float16))
        dense = [w] + [cupy.copy(w) for _ in range(max(1, -(-8 * l2 // (2 * n * k))) - 1)]
        lins = {}
        for bits in bits_list:
            wbytes = n * k * bits // 8 + n * k // 32
            for layout in args.layouts.split(",") if bits == 4 else ("flat",):
                lin = kg.quantize_weight(w, bits, layout=layout)
                lins[bits, layout] = (copies_of(lin, max(2, -(-8 * l2 // wbytes))), wbytes)
        for m in ms:
            a = cupy.asarray(rng.standard_normal((m, k), np.float32).astype(np.float16))
            a_k = a  # the activations of the kbit rows: --dtype (CuPy bf16 as uint16 bits, RNE)
            if args.dtype == "bfloat16":
                u = a.astype(cupy.float32).view(cupy.uint32)
                a_k = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)
            t_cub, _ = timed(lambda i, a=a, d=dense: cupy.matmul(a, d[i % len(d)].T), len(dense), False)
            flops = 2.0 * m * n * k
            base = {"n": n, "k": k, "m": m, "dtype": args.dtype, "cublas_us": t_cub * 1e6,
                    "cublas_tflops": flops / t_cub / 1e12}
            print(f"{n}x{k} M={m}: cuBLAS fp16 {t_cub * 1e6:.1f} us ({flops / t_cub / 1e12:.0f} TFLOP/s)",
                  flush=True)
            for bits, layout in lins:
                ws, wbytes = lins[bits, layout]
                if layout == "tiled":
                    choice = plan_tiled(info.arch.name, m, n, k, args.dtype, info.sm_count,
                                        smem_limit=smem_limit(info.index))
                else:
                    choice = plan_gemm(info.arch.name, m, n, k, bits, args.dtype, info.sm_count,
                                       smem_limit(info.index))
                variants = [("auto", {})]
                if m <= 512:
                    variants.append(("gemv", {"path": "gemv"}))
                if layout == "tiled" and m <= 1024:
                    variants.append(("tile", {"path": "tile"}))
                if layout == "tiled" and m >= 16 and info.arch.name == "sm_90a":
                    variants.append(("wgmma", {"path": "wgmma"}))
                if layout == "flat" and n % 128 == 0 and m <= 8192:
                    variants.append(("mma", {"path": "mma"}))
                    if args.tiles and bits == 4:
                        variants += [(f"mma{tm}x{tn}", {"path": "mma", "tile": (tm, tn)})
                                     for tm, tn in sorted(TILES) if n % tn == 0 and m <= 512
                                     and (tm >= 32 or m <= 256)]
                if m > 16:
                    variants.append(("dequant", {"path": "dequant"}))
                for name, kw in variants:
                    path = kw.get("path", choice.path)
                    try:  # GPU time: every path replayed from a CUDA graph (cuBLAS is capturable)
                        t, mode = timed(lambda i, a_k=a_k, ws=ws, kw=kw: kg.gemm(a_k, ws[i % len(ws)], dtype=args.dtype, **kw), len(ws),
                                        graph=True, label=f"{n}x{k} M={m} {bits}b {layout} {name}")
                    except Exception as e:  # keep going: one failing variant is a finding too
                        rows.append({**base, "bits": bits, "layout": layout, "variant": name,
                                     "error": repr(e)[:300]})
                        print(f"  {bits}b {layout} {name}: ERROR {e!r}"[:300], flush=True)
                        continue
                    row = {**base, "bits": bits, "layout": layout, "variant": name, "path": path,
                           "choice": choice.short() if name == "auto" else None, "us": t * 1e6, "timing": mode,
                           "tflops": flops / t / 1e12, "vs_cublas": t_cub / t,
                           "read_bw_frac": wbytes / t / read_bw}
                    rows.append(row)
                    print(f"  {bits}b {layout:>5} {name:>10}: {t * 1e6:9.2f} us {row['tflops']:6.1f} TFLOP/s "
                          f"x{row['vs_cublas']:.2f} cuBLAS, {row['read_bw_frac']:.0%} read BW {mode}"
                          + (f"  [{choice.short()}]" if name == "auto" else ""), flush=True)
        dense = lins = None  # free before the next shape
        cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "read_bw": read_bw, "rows": rows}, f, indent=1)
    # the auto choice per (shape, bits, M), markdown
    print("\n| shape N x K | bits | layout | M | path | us | TFLOP/s | vs cuBLAS fp16 | read BW |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("variant") == "auto" and "us" in r:
            print(f"| {r['n']}x{r['k']} | {r['bits']} | {r['layout']} | {r['m']} | {r['path']} | {r['us']:.2f} | "
                  f"{r['tflops']:.0f} | {r['vs_cublas']:.2f} | {r['read_bw_frac']:.0%} |")


if __name__ == "__main__":
    main()
