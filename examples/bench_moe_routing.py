"""Benchmark of MoE token routing (kernelgen.moe_routing) on the GPU.

    python examples/bench_moe_routing.py [--ts 1,16,64,512,4096,65536] [--json out.json]

Per model shape (E, top_k, H) and batch T, GPU microseconds of: layout (phase 1), dispatch
(graph-safe: [capacity, H], no host sync), layout + dispatch together (the issue's decode
target: <= 8 us for T <= 64, E <= 256, top-8), and combine; all replayed from a CUDA graph
(several calls a graph, median over replays), so host launch overhead stays out. Dispatch and
combine bandwidth count bytes read + written (dispatch: 2 x rows x H x 2; combine: T x top_k x
H x 2 read + T x H x 2 written), the way the device copy rate (kernelgen.bench.copy_bandwidth,
same run) counts them. Decode-sized x fits in L2, as it does after the layer that wrote it.
moe_route is the graph-safe layout + dispatch, one fused launch for n = T x top_k <= ROUTE_FUSED_MAX.
Then moe_route at each copy-CTA split (pairs a CTA), the layout's single- vs multi-CTA paths
forced over n (the SINGLE_MAX choice), the single-CTA layout at each CTA size (warps), and the
host wall time of the exact path (layout + dispatch with its one small copy).
Routing: uniform (distinct experts per token); weights fp32; x bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

SHAPES = ((8, 2, 4096), (128, 8, 7168), (256, 8, 7168))  # (E, top_k, H)


def graph_us(fn, budget_s: float = 0.15) -> float:
    """Median GPU microseconds of fn() replayed from a CUDA graph of several calls."""
    import cupy

    cupy.cuda.Device().synchronize()  # inputs made on the null stream are in place
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        once = max(cupy.cuda.get_elapsed_time(start, end) * 1e-3, 2e-6)
        reps = int(min(20, max(1, 2e-4 // once)))  # calls captured in one graph
        warm = [fn() for _ in range(reps)]  # the pool then holds every buffer the capture takes
        del warm
        stream.begin_capture()
        keep = [fn() for _ in range(reps)]  # noqa: F841 (captured buffers stay alive)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        iters = int(min(50, max(2, budget_s / 5 / (once * reps))))
        samples = []
        for _ in range(5):
            start.record(stream)
            for _ in range(iters):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / (iters * reps))
    return statistics.median(samples)


def uniform_ids(t: int, k: int, e: int, rng) -> np.ndarray:
    return np.argsort(rng.random((t, e)), axis=1)[:, :k].astype(np.int32) if t else \
        np.zeros((0, k), np.int32)


def bench_shape(e: int, k: int, h: int, t: int, copy_bw: float) -> dict:
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout, moe_route
    from kernelgen.moe_routing.select import ROUTE_FUSED_MAX

    rng = np.random.default_rng(t + e)
    ids = cupy.asarray(uniform_ids(t, k, e, rng))
    x = cupy.asarray(rng.integers(0, 1 << 14, (t, h), dtype=np.uint16))  # bf16 bit patterns
    w = cupy.asarray(rng.random((t, k)).astype(np.float32))
    lay = moe_layout(ids, e)
    xp = cupy.empty((lay.capacity, h), cupy.uint16)
    rows = t * k
    r = {"E": e, "top_k": k, "H": h, "T": t, "rows": rows, "layout_path": "multi" if lay.multi else "single"}
    r["layout_us"] = graph_us(lambda: moe_layout(ids, e))
    r["dispatch_us"] = graph_us(lambda: moe_dispatch(x, lay, exact=False, out=xp, dtype="bfloat16"))
    r["layout_dispatch_us"] = graph_us(
        lambda: moe_dispatch(x, moe_layout(ids, e), exact=False, out=xp, dtype="bfloat16"))
    r["route_fused"] = rows <= ROUTE_FUSED_MAX
    r["route_us"] = graph_us(lambda: moe_route(x, ids, e, out=xp, dtype="bfloat16"))
    out = cupy.empty((t, h), cupy.uint16)
    r["combine_us"] = graph_us(lambda: moe_combine(xp, lay, w, out=out, dtype="bfloat16"))
    move = 2 * rows * h * 2
    r["dispatch_TBps"] = move / r["dispatch_us"] / 1e6
    r["combine_TBps"] = (rows + t) * h * 2 / r["combine_us"] / 1e6
    r["dispatch_frac_copy"] = r["dispatch_TBps"] * 1e12 / copy_bw
    r["combine_frac_copy"] = r["combine_TBps"] * 1e12 / copy_bw
    return r


def bench_route_split(e: int, k: int, h: int) -> list[dict]:
    """moe_route (fused) with each copy-CTA split: pairs a CTA (the planner's choice: 1 up to
    ROUTE_CTAS_PER_SM CTAs an SM)."""
    import cupy

    from kernelgen.moe_routing import moe_route

    out = []
    for t in (16, 64, 128):
        rng = np.random.default_rng(t + e)
        ids = cupy.asarray(uniform_ids(t, k, e, rng))
        x = cupy.asarray(rng.integers(0, 1 << 14, (t, h), dtype=np.uint16))
        xp = cupy.empty((t * k, h), cupy.uint16)
        r = {"E": e, "top_k": k, "H": h, "T": t}
        for per in (1, 2, 4):
            r[f"per{per}_us"] = graph_us(lambda ids=ids, x=x, xp=xp, per=per: moe_route(
                x, ids, e, out=xp, dtype="bfloat16", fused=True, pairs_per_cta=per))
        out.append(r)
    return out


def bench_warps(e: int, k: int) -> list[dict]:
    """Single-CTA layout with each CTA size (the selector's warps for small n)."""
    import cupy

    from kernelgen.moe_routing import moe_layout
    from kernelgen.moe_routing.config import HIST_INTS, WARPS

    out = []
    for t in (1, 16, 64, 256, 1024):
        ids = cupy.asarray(uniform_ids(t, k, e, np.random.default_rng(t)))
        r = {"E": e, "top_k": k, "T": t}
        for w in WARPS:
            if w * e <= HIST_INTS:
                r[f"w{w}_us"] = graph_us(lambda ids=ids, w=w: moe_layout(ids, e, multi=False, warps=w))
        out.append(r)
    return out


def bench_paths(e: int, k: int) -> list[dict]:
    import cupy

    from kernelgen.moe_routing import moe_layout

    out = []
    for t in (64, 256, 512, 1024, 2048, 4096, 8192):
        ids = cupy.asarray(uniform_ids(t, k, e, np.random.default_rng(t)))
        single = graph_us(lambda ids=ids: moe_layout(ids, e, multi=False))
        multi = graph_us(lambda ids=ids: moe_layout(ids, e, multi=True))
        out.append({"E": e, "top_k": k, "T": t, "n": t * k, "single_us": single, "multi_us": multi})
    return out


def host_exact_us(e: int, k: int, h: int, t: int) -> float:
    """Host wall microseconds a call of layout + exact dispatch (includes the small copy)."""
    import cupy

    from kernelgen.moe_routing import moe_dispatch, moe_layout

    ids = cupy.asarray(uniform_ids(t, k, e, np.random.default_rng(1)))
    x = cupy.zeros((t, h), cupy.uint16)
    for _ in range(20):
        moe_dispatch(x, moe_layout(ids, e), dtype="bfloat16")
    cupy.cuda.get_current_stream().synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(100):
            moe_dispatch(x, moe_layout(ids, e), dtype="bfloat16")
        samples.append((time.perf_counter() - t0) / 100 * 1e6)
    return statistics.median(samples)


def smoke() -> None:
    """Each kernel once on small shapes, checked against the reference (for compute-sanitizer)."""
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout, moe_route
    from kernelgen.moe_routing import reference as R

    rng = np.random.default_rng(0)
    for t, k, e, multi, pad in ((5, 2, 8, False, 1), (700, 8, 256, True, 16), (3, 4, 2048, None, 4)):
        ids_h = rng.integers(-1, e + 1, (t, k)).astype(np.int64)
        lay = moe_layout(cupy.asarray(ids_h), e, pad_to=pad, multi=multi)
        ref = R.layout(ids_h, e, pad)
        x_h = rng.integers(0, 1 << 14, (t, 64), dtype=np.uint16)
        xs = moe_dispatch(cupy.asarray(x_h), lay, exact=False, dtype="bfloat16")
        w_h = rng.random((t, k)).astype(np.float32)
        out = moe_combine(xs, lay, cupy.asarray(w_h), dtype="bfloat16")
        assert np.array_equal(cupy.asnumpy(lay.src), ref.src)
        assert np.array_equal(cupy.asnumpy(lay.dest), ref.dest)
        want = R.combine(R.dispatch(x_h, ref, rows=lay.capacity), ref, w_h, "bfloat16")
        assert np.array_equal(cupy.asnumpy(out), want)
        lay2, xr = moe_route(cupy.asarray(x_h), cupy.asarray(ids_h), e, pad_to=pad, dtype="bfloat16")
        assert np.array_equal(cupy.asnumpy(lay2.src), ref.src)
        # rows past the total are never written (exact=False: capacity rows): copy the rest only
        assert np.array_equal(cupy.asnumpy(xr[: ref.total]), R.dispatch(x_h, ref))
    print("smoke ok")


def main() -> None:
    import cupy

    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth

    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", default="1,16,64,512,4096,65536")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="check each kernel once and exit")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    ts = [int(v) for v in args.ts.split(",")]
    info = device_info()
    copy_bw = copy_bandwidth()
    print(f"# {info.name}, {info.sm_count} SMs; device copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    print("| E | top_k | H | T | layout path | layout us | dispatch us | layout+dispatch us | "
          "moe_route us | combine us | dispatch TB/s (x copy) | combine TB/s (x copy) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for e, k, h in SHAPES:
        for t in ts:
            r = bench_shape(e, k, h, t, copy_bw)
            rows.append(r)
            route = f"{r['route_us']:.2f}" + (" (fused)" if r["route_fused"] else "")
            print(f"| {e} | {k} | {h} | {t} | {r['layout_path']} | {r['layout_us']:.2f} | "
                  f"{r['dispatch_us']:.2f} | {r['layout_dispatch_us']:.2f} | {route} | "
                  f"{r['combine_us']:.2f} | "
                  f"{r['dispatch_TBps']:.2f} ({r['dispatch_frac_copy']:.2f}) | "
                  f"{r['combine_TBps']:.2f} ({r['combine_frac_copy']:.2f}) |", flush=True)
            cupy.get_default_memory_pool().free_all_blocks()
    print("\n| E | top_k | H | T | moe_route, 1 pair a CTA us | 2 pairs us | 4 pairs us |")
    print("|---|---|---|---|---|---|---|")
    split = bench_route_split(256, 8, 7168) + bench_route_split(128, 8, 7168)
    for r in split:
        print(f"| {r['E']} | {r['top_k']} | {r['H']} | {r['T']} | {r['per1_us']:.2f} | "
              f"{r['per2_us']:.2f} | {r['per4_us']:.2f} |", flush=True)
    print("\n| E | top_k | T | n = T x top_k | single-CTA us | multi-CTA us |")
    print("|---|---|---|---|---|---|")
    paths = bench_paths(256, 8) + bench_paths(8, 2)
    for p in paths:
        print(f"| {p['E']} | {p['top_k']} | {p['T']} | {p['n']} | {p['single_us']:.2f} | "
              f"{p['multi_us']:.2f} |", flush=True)
    warps = bench_warps(256, 8) + bench_warps(8, 2)
    print("\n| E | top_k | T | 4 warps us | 8 warps us | 16 warps us | 32 warps us |")
    print("|---|---|---|---|---|---|---|")
    for r in warps:
        cells = " | ".join(f"{r[f'w{w}_us']:.2f}" if f"w{w}_us" in r else "-" for w in (4, 8, 16, 32))
        print(f"| {r['E']} | {r['top_k']} | {r['T']} | {cells} |", flush=True)
    host = {t: host_exact_us(256, 8, 7168, t) for t in (1, 64)}
    print("\nhost wall us per layout + exact dispatch (E=256, top-8, H=7168): " +
          ", ".join(f"T={t}: {v:.1f}" for t, v in host.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "copy_Bps": copy_bw, "rows": rows, "route_split": split,
                       "paths": paths,
                       "warps": warps, "host_exact_us": host}, f, indent=1)


if __name__ == "__main__":
    main()
