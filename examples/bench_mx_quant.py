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
        [--no-balance]          (also time capped grids filled to the cap where the plan
                                 balances them)
        [--tiled]               (also time the swizzled scales' sector order toggled, M > 64:
                                 forced on where the config can take it and the plan does not,
                                 off where the plan takes it)
        [--same-copy]           (also time, in the same graph harness, copies of the same bytes:
                                 "rw" reads the input and writes out/in of it in the format's
                                 ratio, "sym" reads and writes half the logical bytes each, a
                                 pure read of the input, and an empty kernel; every quantize
                                 row then also gets its % of the best same-size copy, and a fit
                                 t = a + bytes / bw over the M > 64 gives each one's fixed cost)
        [--profile]             (launch each default quantize and its "rw" copy once at each
                                 M > 64, nothing timed: for `ncu --clock-control none`)
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np

FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2")
DTYPES = ("float16", "bfloat16")
GRAPH_CALLS = 20
RATIO = {4: (4, 1), 6: (8, 3), 8: (2, 1)}  # element bits -> input / output 16-byte vectors

# A warp's unit: DEN x 32 input vectors read, NUM x 32 output vectors written (each the xor of
# the unit's inputs, so every load is live), 16-byte accesses, coalesced like mx_quantize's.
RW_SRC = r"""
extern "C" __global__ void rw_copy(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                   unsigned long long units) {
  const unsigned lane = threadIdx.x & 31;
  const unsigned long long nw = (gridDim.x * (unsigned long long)blockDim.x) >> 5;
  for (unsigned long long u = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) >> 5;
       u < units; u += nw) {
    uint4 v[DEN];
#pragma unroll
    for (int j = 0; j < DEN; ++j)
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                   : "l"(src + (u * DEN + j) * 32 + lane));
    uint4 a = v[0];
#pragma unroll
    for (int j = 1; j < DEN; ++j) { a.x ^= v[j].x; a.y ^= v[j].y; a.z ^= v[j].z; a.w ^= v[j].w; }
#pragma unroll
    for (int j = 0; j < NUM; ++j) {
      uint4 o;
      o.x = v[j].x ^ a.y; o.y = v[j].y ^ a.z; o.z = v[j].z ^ a.w; o.w = v[j].w ^ a.x;
      dst[(u * NUM + j) * 32 + lane] = o;
    }
  }
}
extern "C" __global__ void nop() {}
"""


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


@functools.cache
def rw_kernels(den: int, num: int):
    """(rw_copy, nop) RawKernels of the DEN / NUM unit."""
    import cupy

    mod = cupy.RawModule(code=RW_SRC, options=(f"-DDEN={den}", f"-DNUM={num}"))
    return mod.get_function("rw_copy"), mod.get_function("nop")


def rw_launcher(den: int, num: int, srcs: list, n_in: int, sm_count: int, persistent: bool):
    """(call(i), bytes moved) of rw_copy over the first n_in bytes of srcs[i % len] into fresh
    outputs; persistent: 8 blocks of 256 an SM, grid-stride; else a unit a warp."""
    import cupy

    rw, _ = rw_kernels(den, num)
    units = n_in // (16 * 32 * den)
    outs = [cupy.empty(units * num * 32 * 16, cupy.uint8) for _ in range(GRAPH_CALLS)]
    grid = sm_count * 8 if persistent else -(-units // 8)
    n = np.uint64(units)
    return (lambda i: rw((grid,), (256,), (srcs[i % len(srcs)], outs[i % len(outs)], n)),
            units * 32 * 16 * (den + num))


def same_copies(m: int, k: int, fmt: str, xs: list, stream, info, cache: dict) -> dict:
    """Graph-timed copies of the same bytes as quantizing [m, k] fp16 / bf16 to fmt (memoised by
    the bytes): {name: (us, bytes)}."""
    import cupy

    from kernelgen.bench import read_kernel
    from kernelgen.mx.tensor import elem_bits

    den, num = RATIO[elem_bits(fmt)]
    key = (m, k, den, num, fmt == "nvfp4")
    if key in cache:
        return cache[key]
    n_in = m * k * 2
    res = {}
    for name, persistent in (("rw", True), ("rw1", False)):
        call, nbytes = rw_launcher(den, num, xs, n_in, info.sm_count, persistent)
        res[name] = (graph_time(call, stream) * 1e6, nbytes)
    half = logical_bytes(fmt, m, k) // 2 // 512 * 512  # a copy of the same logical bytes
    srcs = [cupy.ones(half, cupy.uint8) for _ in range(max(2, -(-2 * info.l2_bytes // half)))]
    for name, persistent in (("sym", True), ("sym1", False)):
        call, nbytes = rw_launcher(1, 1, srcs, half, info.sm_count, persistent)
        res[name] = (graph_time(call, stream) * 1e6, nbytes)
    dsts = [cupy.empty(half, cupy.uint8) for _ in range(GRAPH_CALLS)]
    res["copyto"] = (graph_time(lambda i: cupy.copyto(dsts[i], srcs[i % len(srcs)]), stream)
                     * 1e6, 2 * half)
    rd = read_kernel()
    sink = cupy.zeros(1, cupy.uint32)
    n16 = np.uint64(n_in // 16)
    res["read"] = (graph_time(lambda i: rd((info.sm_count * 8,), (256,),
                                           (xs[i % len(xs)], n16, sink)), stream) * 1e6, n_in)
    _, nop = rw_kernels(1, 1)
    res["nop1"] = (graph_time(lambda i: nop((1,), (32,), ()), stream) * 1e6, 0)
    res["nop2048"] = (graph_time(lambda i: nop((2048,), (256,), ()), stream) * 1e6, 0)
    cache[key] = res
    print(f"# same-size copies M={m} {fmt} ratio {den}:{num}: " + ", ".join(
        f"{n} {us:.2f} us" + (f" ({b / us / 1e3:.0f} GB/s)" if b else "")
        for n, (us, b) in res.items()), flush=True)
    return res


def fit(points: list) -> tuple[float, float] | None:
    """Least squares t_us = a + bytes / bw over (bytes, us) points: (a us, bw GB/s)."""
    if len(points) < 2:
        return None
    b, t = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    slope, a = np.polyfit(b, t, 1)
    return float(a), float(1e-3 / slope)


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
    ap.add_argument("--no-balance", action="store_true",
                    help="also time capped grids filled to the cap where the plan balances them")
    ap.add_argument("--tiled", action="store_true",
                    help="also time the sector order toggled (M > 64)")
    ap.add_argument("--same-copy", action="store_true",
                    help="also time copies of the same bytes in the same graph harness (M > 64)")
    ap.add_argument("--profile", action="store_true",
                    help="launch each default quantize and its rw copy once per M > 64 (ncu)")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    k = args.k

    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth, rotation, time_gpu
    from kernelgen.mx.config import h2_applies
    from kernelgen.mx.select import (
        force_balanced,
        force_blocks_per_sm,
        force_h2,
        force_linear,
        force_small_auto_path,
        force_tiled,
        force_wide_fp8,
        quantize_plan,
    )

    def reset() -> None:
        force_small_auto_path(None)
        force_blocks_per_sm(None)
        force_wide_fp8(None)
        force_h2(None)
        force_linear(True)
        force_balanced(None)
        force_tiled(None)

    info = device_info()
    if args.profile:
        profile(args, info)
        return
    bw = copy_bandwidth()
    print(f"# {info.name} ({info.arch.name}, {info.sm_count} SMs), device copy {bw / 1e9:.0f} GB/s "
          f"(read + write), K = {k}")
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    copy_cache: dict = {}
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
                if (args.no_balance or args.tiled) and m > 64:
                    reset()  # probe the default plan, not the last variant's
                if args.no_balance and m > 64:
                    force_balanced(False)
                    p_cap = quantize_plan(info.arch.name, info.sm_count, fmt, dtype, m, k, True,
                                          "value")
                    force_balanced(None)
                    if p_cap.grid != quantize_plan(info.arch.name, info.sm_count, fmt, dtype, m, k,
                                                   True, "value").grid:
                        variants += [("value", None, None, "nobalance")]
                if args.tiled and m > 64:
                    on = quantize_plan(info.arch.name, info.sm_count, fmt, dtype, m, k, True,
                                       "value").tiled
                    force_tiled(not on)
                    if quantize_plan(info.arch.name, info.sm_count, fmt, dtype, m, k, True,
                                     "value").tiled != on:  # the config can take it
                        variants += [("value", None, None, "untiled" if on else "tiled")]
                    force_tiled(None)
                for gs, cap, wide, h2 in variants:
                    knob = h2 if isinstance(h2, str) else ""
                    force_linear(knob != "nolinear")
                    force_balanced(False if knob == "nobalance" else None)
                    force_tiled({"tiled": True, "untiled": False}.get(knob))
                    h2 = None if knob else h2
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
                    same = None
                    if args.same_copy and m > 64:
                        same = same_copies(m, k, fmt, xs, stream, info, copy_cache)
                    eager = None
                    if m > 64 and cap is None and h2 is None and not knob and plan.config.linear:
                        eager = time_gpu(lambda i, xs=xs, q=q: q(xs[i % len(xs)]), iters=20,
                                         repeats=5)
                    del xs
                    r = {"format": fmt, "dtype": dtype, "m": m, "k": k, "gs": gs,
                         "path": plan.path, "grid": plan.grid, "slots": plan.slots,
                         "blocks_per_sm": None if cap is None else cap[0],
                         "lane_elems": plan.config.lane_elems, "h2": plan.config.h2,
                         "linear": plan.config.linear, "knob": knob, "tiled": plan.tiled,
                         "bytes": nbytes,
                         "us": t * 1e6, "gbps": nbytes / t / 1e9, "frac_copy": nbytes / t / bw,
                         "eager_us": None if eager is None else eager * 1e6}
                    if same:  # the best same-size copy's rate (rw / sym, either grid)
                        best = max(b / us for n, (us, b) in same.items()
                                   if n.startswith(("rw", "sym", "copyto")))
                        r["frac_same_copy"] = nbytes / (t * 1e6) / best
                        r["frac_rw_copy"] = nbytes / (t * 1e6) / max(
                            same[n][1] / same[n][0] for n in ("rw", "rw1"))
                    rows.append(r)
                    gs_col = gs if fmt == "nvfp4" else "-"
                    eager_col = "-" if eager is None else f"{eager * 1e6:.1f}"
                    cap_col = f"{plan.grid} blocks x {plan.slots} slots" + (
                        "" if cap is None else f" (forced {cap[0]}/SM)")
                    cap_col += ", 16-element lanes" if wide else ""
                    cap_col += ", h2 off" if h2 is False else ""
                    cap_col += ", linear off" if not plan.config.linear else ""
                    cap_col += ", not balanced" if knob == "nobalance" else ""
                    cap_col += ", sector order" if plan.tiled else ""
                    same_col = "" if not same else \
                        f" same-size copy {100 * r['frac_same_copy']:.0f}% " \
                        f"(rw {100 * r['frac_rw_copy']:.0f}%) |"
                    print(f"| {fmt} | {dtype} | {m} | {gs_col} | {plan.path} | {cap_col} | "
                          f"{r['us']:.2f} | {r['gbps']:.0f} | {100 * r['frac_copy']:.0f}% | "
                          f"{eager_col} |{same_col}", flush=True)
    reset()
    print_fits(rows, copy_cache)
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
                       "quantize": rows, "dequantize": deq,
                       "same_copies": [{"m": key[0], "k": key[1], "den": key[2], "num": key[3],
                                        "nvfp4": key[4], **{n: {"us": us, "bytes": b}
                                                            for n, (us, b) in res.items()}}
                                       for key, res in copy_cache.items()]}, f, indent=1)


def print_fits(rows: list, copy_cache: dict) -> None:
    """Fixed cost (intercept) and steady rate of t = a + bytes / bw over the M > 64 of each
    quantize variant and each same-size copy."""
    groups: dict = {}
    for r in rows:
        if r["m"] > 64 and r["gs"] == "value":
            key = (r["format"], r["dtype"], None if r["blocks_per_sm"] is None else
                   f"cap {r['blocks_per_sm']}", f"E{r['lane_elems']} u{r['slots']}", "h2" if r["h2"] else None,
                   None if r["linear"] else "nolinear", r["knob"])
            groups.setdefault(key, []).append((r["bytes"], r["us"]))
    for key, res in copy_cache.items():
        for n, (us, b) in res.items():
            if b:
                groups.setdefault(("copy", n, key[2], key[3]), []).append((b, us))
    print("# fit t = a + bytes / bw over M > 64: | what | a (us) | bw (GB/s) | points |")
    for key, pts in groups.items():
        f = fit(pts)
        if f:
            print(f"| {' '.join(str(v) for v in key if v not in (None, ''))} | {f[0]:.2f} | "
                  f"{f[1]:.0f} | {len(pts)} |", flush=True)


def profile(args, info) -> None:
    """One launch each of the default quantize (fp16 in) and the rw copy of the same bytes at
    every M > 64, in that order (for ncu)."""
    import cupy

    from kernelgen.mx.tensor import elem_bits

    k = args.k
    for m in [int(v) for v in args.ms.split(",") if int(v) > 64]:
        for fmt in args.formats.split(","):
            x = make_x(m, k, "float16")
            quantizer(fmt, "float16", "value")(x)
            call, _ = rw_launcher(*RATIO[elem_bits(fmt)], [x], m * k * 2, info.sm_count, True)
            call(0)
            cupy.cuda.Device().synchronize()
            print(f"# profiled M={m} {fmt}", flush=True)


if __name__ == "__main__":
    main()
