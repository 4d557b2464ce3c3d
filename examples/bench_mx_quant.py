"""Benchmark of issue 5 (quantization): every format x fp16/bf16 input x M in {1, 16, 4096, 16384},
K = 4096, on the current GPU.

Every size: 20 calls captured once in a CUDA graph and replayed (GPU time per call, no host work
in between); large M rotates inputs spanning 2 x L2 so each call reads DRAM, and also reports the
eager per-call time (CUDA events around back-to-back Python calls: host overhead included).
Bandwidth = logical bytes (input in, packed codes + scale bytes out) per second, as a fraction of
the device-copy bandwidth measured in the same run.
NVFP4 is timed with the global scale given (a Python float, "gs=value") and computed on the
device from the input ("gs=auto": one launch for small inputs, amax + quantize else;
"auto:fused": the sm_90+ cluster kernel, forced, for comparison).

    python examples/bench_mx_quant.py [--ms 1,16,4096,16384] [--k 4096] [--json out.json]
        [--blocks-per-sm 0,3,3x1] (also time these grid caps [x slots] of mx_quantize, M > 64;
                                   fp8 loops under a cap > 0)
        [--wide-fp8]            (also time MXFP8 with 16-element lane slots)
        [--no-h2]               (also time fp4 / fp6 without the packed 16-bit encoders)
        [--no-linear]           (also time every format without the linear-index path, M > 64)
"""

from __future__ import annotations

import argparse
import json

import numpy as np

FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2")
DTYPES = ("float16", "bfloat16")
GRAPH_CALLS = 20


def make_x(m: int, k: int, dtype: str):
    import cupy

    v = cupy.random.standard_normal((m, k), dtype=cupy.float32)
    if dtype == "bfloat16":
        return (v.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return v.astype(cupy.float16)


def quantizer(fmt: str, dtype: str, gs: str):
    import kernelgen.mx as mx

    hint = "bfloat16" if dtype == "bfloat16" else None
    if fmt == "nvfp4":
        value = None if gs.startswith("auto") else 2688.0 / 4.5
        return lambda x: mx.quantize_nvfp4(x, value, dtype=hint)
    return lambda x: mx.quantize_mx(x, fmt, dtype=hint)


def logical_bytes(fmt: str, m: int, k: int) -> int:
    from kernelgen.mx.tensor import data_shape, scale_shape

    out = int(np.prod(data_shape(fmt, m, k))) + int(np.prod(scale_shape(fmt, m, k, "swizzled")))
    return m * k * 2 + out


def graph_time(call, stream) -> float:
    """Seconds per call of call(0..GRAPH_CALLS-1) captured in one CUDA graph and replayed: the
    GPU time of the kernels with no host work between them."""
    from kernelgen.bench import time_gpu

    keep = []
    with stream:
        for i in range(GRAPH_CALLS):  # compile, selector memo, pool blocks for the capture
            keep.append(call(i))
        stream.synchronize()
        keep.clear()
        stream.begin_capture()
        for i in range(GRAPH_CALLS):
            keep.append(call(i))
        graph = stream.end_capture()
        t = time_gpu(lambda i: graph.launch(stream), iters=10, repeats=7, warmup=2)
    return t / GRAPH_CALLS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,16,4096,16384")
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--blocks-per-sm", default="",
                    help="extra grid caps of mx_quantize to time at M > 64, each optionally with "
                         "the slots a thread of a chunk (e.g. 0,3,3x1; 0: a block a chunk, no "
                         "loop); the default plan is always timed")
    ap.add_argument("--wide-fp8", action="store_true",
                    help="also time MXFP8 with 16-element lane slots")
    ap.add_argument("--no-h2", action="store_true",
                    help="also time fp4 / fp6 without the packed 16-bit encoders")
    ap.add_argument("--no-linear", action="store_true",
                    help="also time every format without the linear-index path (M > 64)")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    k = args.k

    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth, rotation, time_gpu
    from kernelgen.mx.config import h2_applies
    from kernelgen.mx.select import (
        force_blocks_per_sm,
        force_h2,
        force_linear,
        force_small_auto_path,
        force_wide_fp8,
        quantize_plan,
    )

    info = device_info()
    bw = copy_bandwidth()
    print(f"# {info.name} ({info.arch.name}, {info.sm_count} SMs), device copy {bw / 1e9:.0f} GB/s "
          f"(read + write), K = {k}")
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    extra_caps = [tuple(int(v) for v in c.split("x")) + (None,) for c in
                  args.blocks_per_sm.split(",") if c]  # (blocks an SM, slots or None[, None])
    print("| format | input | M | gs | path | grid cap | graph us/call | GB/s | % of copy | "
          "eager us/call |")
    print("|---|---|---:|---|---|---|---:|---:|---:|---:|")
    for fmt in args.formats.split(","):
        for dtype in DTYPES:
            for m in ms:
                modes = ("value",)
                if fmt == "nvfp4":
                    modes = ("value", "auto") + (("auto:fused",) if m <= 64 else ())
                variants = [(g, None, None, None) for g in modes]
                variants += [(modes[0], c[:2], None, None) for c in (extra_caps if m > 64 else ())
                             if "fp8" not in fmt or c[0]]  # fp8: a cap > 0 makes it loop
                variants += [("value", None, True, None)] if args.wide_fp8 and "fp8" in fmt else []
                variants += [("value", None, None, False)] if args.no_h2 and \
                    h2_applies(fmt, dtype) else []
                variants += [("value", None, None, "nolinear")] if args.no_linear and m > 64 else []
                for gs, cap, wide, h2 in variants:
                    force_linear(h2 != "nolinear")
                    h2 = None if h2 == "nolinear" else h2
                    force_small_auto_path("fused" if gs == "auto:fused" else None)
                    force_blocks_per_sm(*(cap or (None, None)))
                    force_wide_fp8(wide)
                    force_h2(h2)
                    q = quantizer(fmt, dtype, gs)
                    plan = quantize_plan(info.arch.name, info.sm_count, fmt, dtype, m, k, True,
                                         gs.split(":")[0])
                    nbytes = logical_bytes(fmt, m, k)
                    if m <= 64:  # L2-resident anyway; graph replay only
                        xs = [make_x(m, k, dtype)]
                    else:  # distinct inputs spanning 2 x L2, so each call reads from DRAM
                        xs = rotation(lambda m=m, dtype=dtype: make_x(m, k, dtype), m * k * 2,
                                      info.l2_bytes, factor=2)
                    t = graph_time(lambda i, xs=xs, q=q: q(xs[i % len(xs)]), stream)
                    eager = None
                    if m > 64 and cap is None and h2 is None and plan.config.linear:
                        eager = time_gpu(lambda i, xs=xs, q=q: q(xs[i % len(xs)]), iters=20,
                                         repeats=5)
                    del xs
                    r = {"format": fmt, "dtype": dtype, "m": m, "k": k, "gs": gs,
                         "path": plan.path, "grid": plan.grid, "slots": plan.slots,
                         "blocks_per_sm": None if cap is None else cap[0],
                         "lane_elems": plan.config.lane_elems, "h2": plan.config.h2,
                         "linear": plan.config.linear,
                         "us": t * 1e6, "gbps": nbytes / t / 1e9, "frac_copy": nbytes / t / bw,
                         "eager_us": None if eager is None else eager * 1e6}
                    rows.append(r)
                    gs_col = gs if fmt == "nvfp4" else "-"
                    eager_col = "-" if eager is None else f"{eager * 1e6:.1f}"
                    cap_col = f"{plan.grid} blocks x {plan.slots} slots" + (
                        "" if cap is None else f" (forced {cap[0]}/SM)")
                    cap_col += ", 16-element lanes" if wide else ""
                    cap_col += ", h2 off" if h2 is False else ""
                    cap_col += ", linear off" if not plan.config.linear else ""
                    print(f"| {fmt} | {dtype} | {m} | {gs_col} | {plan.path} | {cap_col} | "
                          f"{r['us']:.2f} | {r['gbps']:.0f} | {100 * r['frac_copy']:.0f}% | "
                          f"{eager_col} |", flush=True)
    force_small_auto_path(None)
    force_blocks_per_sm(None)
    force_wide_fp8(None)
    force_h2(None)
    force_linear(True)
    # dequantize to the input dtype at the largest M (not a target; for reference)
    m = max(ms)
    deq = []
    for fmt in args.formats.split(","):
        for dtype in DTYPES:
            t_ = quantizer(fmt, dtype, "value")(make_x(m, k, dtype))
            outs = [cupy.empty((m, k), cupy.float16) for _ in range(2)]
            t = time_gpu(lambda i, t_=t_, outs=outs, dtype=dtype: mx.dequantize(
                t_, dtype, out=outs[i % 2] if dtype == "float16" else None), iters=20, repeats=5)
            nbytes = logical_bytes(fmt, m, k)
            deq.append({"format": fmt, "dtype": dtype, "m": m, "us": t * 1e6,
                        "frac_copy": nbytes / t / bw})
            print(f"dequantize {fmt} -> {dtype} M={m}: {t * 1e6:.1f} us, "
                  f"{100 * nbytes / t / bw:.0f}% of copy", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "arch": info.arch.name, "copy_bw": bw, "k": k,
                       "quantize": rows, "dequantize": deq}, f, indent=1)


if __name__ == "__main__":
    main()
