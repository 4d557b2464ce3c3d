"""Benchmark of the MoE grouped GEMM (issue 4) against the read floor of the experts touched,
torch._grouped_mm and cuBLAS dense bf16, all measured in the same run.

    python examples/bench_moe.py [--shapes E128,E256,E8] [--ts 1,2,4,8,16,64,256,4096]
                                 [--forced] [--path auto|wgmma|mma] [--json out.json]

Per (shape, T, GEMM): W13 + SwiGLU ([E, 2I, H], writes [M, I]) and W2 ([E, H, I]), M = T * top_k
rows routed uniformly (distinct experts per token, like torch.topk), a different routing each
call (several draws rotate). Median microseconds of back-to-back calls (CUDA events), the
floor = bytes of the experts touched (+ activations in and out) / device-copy rate (bytes read
+ written, kernelgen.bench.copy_bandwidth) of the same run, TFLOP/s, the TILE_M / swap_ab /
TILE_N the selector chose, and with --forced the time of every tile-table row. --path forces
the main loop of the selector's row (wgmma: sm_90a only); at T >= 1024 on sm_90a both paths are
also timed with the selector's tile (`path_us`, and their fraction of the cuBLAS rate), the
wgmma one also with cp.async copies in place of TMA ("wgmma_cp_async"). At T >=
1024 the touched experts' weight bytes are also streamed once by the plain read kernels
(`weight_read_us`, kernelgen.bench.stream_read_seconds): no grouped GEMM that reads them is
faster, so `bound_frac_of_cublas_rate` = cuBLAS time / that is the best fraction of the cuBLAS
rate any kernel could reach in that run.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernelgen.core.interop import smem_limit

SHAPES = {"E128": (128, 7168, 2048, 8), "E256": (256, 7168, 2048, 8), "E8": (8, 4096, 14336, 2)}
DRAWS = 4  # routings rotated per measurement


def _routing(rng, t, e, top_k):
    ids = np.argsort(rng.random((t, e)), axis=1)[:, :top_k]
    counts = np.bincount(ids.reshape(-1), minlength=e)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), counts


def _variants(arch, prefill, act, which="all"):
    """Pipeline variants around the table rows (tuning data for config.py TILES / WG_TILES)."""
    from kernelgen.moe.config import WGMMA_ARCHS, MoeGemmConfig

    epi = "swiglu" if act else "none"
    base = dict(arch=arch, dtype="bfloat16", epilogue=epi)
    if prefill:
        specs = [(128, 128, False, 2, 4, 1, st, mb) for st in (2, 3, 4) for mb in (1, 2)]
        specs += [(128, 256, False, 2, 4, 1, st, 1) for st in (2, 3)]
        specs += [(256, 128, False, 4, 2, 1, st, 1) for st in (2, 3, 4)]
        specs += [(64, 128, False, 2, 2, 1, st, mb) for st in (3, 4, 6) for mb in (1, 2, 3)]
    else:
        specs = [(8, tn, True, 1, 1, wk, st, mb) for tn in (32, 64, 128) for wk in (2, 4)
                 for st in (3, 4, 6, 8) for mb in (2, 4)]
        specs += [(16, 64, True, 1, 1, 4, st, 4) for st in (3, 4, 5)]
    specs = [(*sp, False, 1, False) for sp in specs] if which == "all" else []
    if prefill and arch in WGMMA_ARCHS:  # wgmma: warps (tile_m / 16, 1, 1), + groups in flight
        # (tile_m, tile_n, stages, min_blocks, inflight, producer warpgroup)
        wg = [(128, 256, 4, 1, 1, False), (128, 256, 4, 1, 0, False), (128, 256, 3, 1, 0, False),
              (128, 128, 6, 1, 1, False), (128, 128, 6, 1, 0, False), (128, 128, 3, 2, 0, False),
              (256, 128, 4, 1, 1, False), (256, 128, 4, 1, 0, False), (64, 128, 3, 2, 0, False),
              (128, 256, 4, 1, 1, True), (128, 256, 4, 1, 0, True), (128, 128, 6, 1, 1, True),
              (64, 256, 4, 1, 1, True), (64, 128, 4, 2, 1, True),
              (192, 256, 4, 1, 0, False), (192, 256, 4, 1, 1, False), (192, 256, 3, 1, 0, False)]
        specs += [(tm, tn, False, tm // 16, 1, 1, st, mb, True, inf, pr)
                  for tm, tn, st, mb, inf, pr in wg]
    out = []
    for tm, tn, sw, wp, wq, wk, st, mb, wg, inf, pr in specs:
        label = f"{tm}{'s' if sw else 'w' if wg else 'n'}{tn}_w{wp}{wq}{wk}_s{st}_b{mb}"
        label += (f"_i{inf}" if wg else "") + ("_p" if pr else "")
        try:
            cfg = MoeGemmConfig(tile_m=tm, tile_n=tn, swap_ab=sw, warps_p=wp, warps_q=wq,
                                warps_k=wk, stages=st, min_blocks=mb, wgmma=wg, inflight=inf,
                                producer=pr, **base)
        except ValueError:
            continue
        out.append((label, cfg))
    return out


def _graph_time(fn, replays: int = 20, repeats: int = 5) -> float:
    """Median seconds per fn(j) call: j = 0..DRAWS-1 captured once in a torch CUDA graph,
    replayed back to back (no host launch cost between the kernels)."""
    import torch

    for j in range(DRAWS):
        fn(j)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(DRAWS):
            fn(j)
    g.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / (replays * DRAWS))
    return float(np.median(samples))


def _timer(args):
    """time_gpu, or with --graph the graph replay of the rotated calls (falls back to time_gpu
    for a call that cannot be captured)."""
    from kernelgen.bench import time_gpu

    def tm(fn):
        if args.graph:
            try:
                t = _graph_time(fn)
                tm.last = "graph"
                return t
            except Exception:  # noqa: BLE001 - not capturable: stream timing instead
                pass
        tm.last = "stream"
        return time_gpu(fn, iters=args.iters, repeats=5)

    tm.last = "stream"
    return tm


def _weight_read_us(w, touched: float) -> float:
    """us to stream the first `touched` experts' weight bytes of w [E, N, K] once through the
    plain read kernels (kernelgen.bench, no arithmetic): a lower bound on any grouped GEMM that
    reads them."""
    import cupy

    from kernelgen.bench import stream_read_seconds

    e = w.shape[0]
    nbytes = (w[0].numel() * w.element_size() * max(1, min(e, round(touched)))) // 16 * 16
    buf = cupy.from_dlpack(w.view(-1)).view(cupy.uint8)
    return stream_read_seconds(buf, nbytes) * 1e6


def _bench_gemm(args, info, bw, has_gmm, name, t, gemm, x, w, offs, e, n, k, act, touched):
    import torch

    from kernelgen.bench import time_gpu
    from kernelgen.moe import grouped_gemm, plan_grouped, select_grouped
    from kernelgen.moe.config import TILE_MS, TILES, WG_TILES, WGMMA_ARCHS

    m = x.shape[0]
    n_out = n // 2 if act else n
    out = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
    wbytes = touched * n * k * 2
    floor = (wbytes + m * (k + n_out) * 2) / bw
    flops = 2.0 * m * n * k

    def run(j, **kw):
        grouped_gemm(x, w, offs[j % DRAWS], activation=act, out=out, **kw)

    epi = "swiglu" if act else "none"
    path = {"auto": None, "wgmma": True, "mma": False}[args.path]
    if path is None:
        plan = select_grouped(info.arch.name, info.sm_count, "bfloat16", e, n, k, m, epi, "threshold",
                              smem_limit(info.index))
    else:
        plan = plan_grouped(info.arch.name, info.sm_count, "bfloat16", e, n, k, m, epi,
                            wgmma=path, smem_limit=smem_limit(info.index))
    tm = _timer(args)
    tt = tm(lambda j: run(j, wgmma=path))
    timing = tm.last
    row = {"timing": timing, "shape": name, "T": t, "gemm": gemm, "us": tt * 1e6, "floor_us": floor * 1e6,
           "floor_frac": floor / tt, "tflops": flops / tt / 1e12,
           "tile_m": plan.config.tile_m, "swap_ab": plan.config.swap_ab,
           "tile_n": plan.config.tile_n, "wgmma": plan.config.wgmma, "touched": touched}
    if has_gmm:
        wt = w.transpose(-2, -1)
        ends = [o[1:] for o in offs]

        def gmm(j):
            torch._grouped_mm(x, wt, offs=ends[j % DRAWS], out_dtype=torch.bfloat16)

        try:
            row["torch_grouped_mm_us"] = tm(gmm) * 1e6
        except Exception as err:  # noqa: BLE001 - reported, not fatal
            row["torch_grouped_mm_us"] = None
            row["torch_grouped_mm_error"] = str(err).splitlines()[0][:160]
    if t >= 1024:  # cuBLAS dense bf16 of the same M x N x K
        wd = w[0]
        row["cublas_dense_us"] = time_gpu(lambda j: torch.matmul(x, wd.t()),
                                          iters=args.iters, repeats=5) * 1e6
        row["frac_of_cublas_rate"] = row["cublas_dense_us"] / row["us"]
        # the bound: the touched experts' weight bytes alone, streamed once by the plain read
        # kernel (kernelgen.bench) - no kernel that reads them can be faster than this
        row["weight_read_us"] = _weight_read_us(w, touched)
        row["bound_frac_of_cublas_rate"] = row["cublas_dense_us"] / row["weight_read_us"]
        # both paths at the plan's tile_m (mma.sync at 128 where the plan's is wgmma-only 192)
        if info.arch.name in WGMMA_ARCHS and not plan.config.swap_ab:
            row["path_us"], row["path_frac_of_cublas_rate"] = {}, {}
            tm_plan = plan.config.tile_m
            for label, wg, tma in (("mma", False, None), ("wgmma", True, None),
                                   ("wgmma_cp_async", True, False)):
                tm_path = tm_plan if wg or tm_plan in TILE_MS else 128  # 192: a wgmma tile only
                cfg = plan_grouped(info.arch.name, info.sm_count, "bfloat16", e, n, k, m, epi,
                                   tile_m=tm_path, wgmma=wg, tma=tma).config
                us = time_gpu(lambda j, cfg=cfg: run(j, config=cfg), iters=args.iters,
                              repeats=5) * 1e6
                row["path_us"][label] = us
                row["path_frac_of_cublas_rate"][label] = row["cublas_dense_us"] / us

    def timed(**kw):
        try:
            return time_gpu(lambda j: run(j, **kw), iters=max(3, args.iters // 2), repeats=3) * 1e6
        except Exception as err:  # noqa: BLE001
            return f"error: {err}"[:120]

    if args.forced:
        row["forced_us"] = {f"{tm}{'s' if sw else 'n'}{tn}": timed(tile_m=tm, swap_ab=sw, tile_n=tn,
                                                                   wgmma=False)
                            for tm, sw, tn in TILES if not (t >= 1024 and tm <= 16)}
        if info.arch.name in WGMMA_ARCHS:
            row["forced_us"].update({f"{tm}w{tn}": timed(tile_m=tm, tile_n=tn, wgmma=True)
                                     for tm, tn in WG_TILES})
    if ((args.sweep or args.sweep_wgmma) and (t >= 1024 or (args.decode_sweep and t == 1))
            and (name != "E256" or args.sweep_wgmma)):
        which = "all" if args.sweep else "wgmma"
        row["sweep_us"] = {label: timed(config=cfg)
                           for label, cfg in _variants(info.arch.name, t >= 1024, act, which)}
    gm = row.get("torch_grouped_mm_us")
    extra = f" torch_gmm {gm:9.1f}" if isinstance(gm, float) else ""
    if "frac_of_cublas_rate" in row:
        extra += (f" cublas {row['cublas_dense_us']:9.1f} ({row['frac_of_cublas_rate']:.2f}x rate;"
                  f" weights read alone {row['weight_read_us']:.1f} us ="
                  f" {row['bound_frac_of_cublas_rate']:.2f}x at best)")
    for label, us in row.get("path_us", {}).items():
        extra += f" {label} {us:.1f} ({row['path_frac_of_cublas_rate'][label]:.2f}x)"
    print(f"{name:5s} T={t:5d} {gemm:11s} {row['us']:9.1f} us floor {row['floor_us']:8.1f} "
          f"({row['floor_frac']:.2f}) {row['tflops']:6.1f} TF/s tile_m={row['tile_m']} "
          f"swap={row['swap_ab']} tile_n={row['tile_n']} wgmma={row['wgmma']} [{row['timing']}]{extra}",
          flush=True)
    for key in ("forced_us", "sweep_us"):
        if key in row:
            print(f"      {key[:-3]}: " + " ".join(
                f"{kk}={v:.1f}" if isinstance(v, float) else f"{kk}={v}"
                for kk, v in row[key].items()), flush=True)
    return row


def _bench_kbit(args, info, bw, name, w13, w2, bits, bf16_rows):
    """kbit experts at decode, each layout: us, floor of the kbit bytes touched, speed-up over bf16."""
    from kernelgen.moe import quantize_experts, tile_experts

    rows = []
    flat = quantize_experts(w13, bits, layout="flat"), quantize_experts(w2, bits, layout="flat")
    for layout in args.kbit_layouts.split(","):
        if layout == "tiled" and bits != 4:
            continue
        # the same codes in either layout (tile_experts repacks them)
        q13, q2 = flat if layout == "flat" else (tile_experts(flat[0]), tile_experts(flat[1]))
        rows += _bench_kbit_layout(args, info, bw, name, q13, q2, bits, bf16_rows, layout)
        del q13, q2
    return rows


def _bench_kbit_layout(args, info, bw, name, q13, q2, bits, bf16_rows, layout):
    import torch

    from kernelgen.bench import time_gpu
    from kernelgen.moe import grouped_gemm, select_kbit, select_kbit_gemv

    e, h, i, top_k = SHAPES[name]
    rng = np.random.default_rng(1)  # the same routings for every layout
    rows = []
    for t in (int(s) for s in args.kbit_ts.split(",")):
        m = t * top_k
        draws = [_routing(rng, t, e, top_k) for _ in range(DRAWS)]
        offs = [torch.from_numpy(o).cuda() for o, _ in draws]
        touched = float(np.mean([np.count_nonzero(c) for _, c in draws]))
        for gemm, q, n, k, act in (("w13+swiglu", q13, 2 * i, h, "swiglu"), ("w2", q2, h, i, None)):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            n_out = n // 2 if act else n
            out = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
            wbytes = touched * n * k * (bits / 8 + 1 / 32)
            floor = (wbytes + m * (k + n_out) * 2) / bw

            def run(j, x=x, q=q, offs=offs, act=act, out=out, **kw):
                grouped_gemm(x, q, offs[j % DRAWS], activation=act, out=out, **kw)

            tmk = _timer(args)
            tt = tmk(run)
            epi = "swiglu" if act else "none"
            if layout == "tiled":
                plan = select_kbit_gemv(info.arch.name, info.sm_count, "bfloat16", e, n, k, m, epi)
            else:
                plan = select_kbit(info.arch.name, info.sm_count, "bfloat16", bits, e, n, k, m, epi,
                                   smem_limit(info.index))
            bf = [r["us"] for r in bf16_rows if r["shape"] == name and r["T"] == t
                  and r["gemm"] == gemm and "bits" not in r]
            row = {"timing": tmk.last, "shape": name, "T": t, "gemm": gemm, "bits": bits,
                   "layout": layout, "us": tt * 1e6,
                   "floor_us": floor * 1e6, "floor_frac": floor / tt, "plan": plan.short(),
                   "speedup_vs_bf16": (bf[0] / (tt * 1e6)) if bf else None}
            if (args.forced or args.kbit_forced) and layout == "tiled":
                from dataclasses import replace

                from kernelgen.moe import plan_kbit_gemv
                from kernelgen.moe.kbit import KbitGemvPlan

                forced = {}
                for tm in (8, 16):
                    for tpw in ((2,) if act else (1, 2)):
                        for kw in (1, 2, 4, 8):
                            p = plan_kbit_gemv(info.arch.name, info.sm_count, "bfloat16", e, n, k,
                                               m, epi, tm, kw)
                            p = KbitGemvPlan(replace(p.config, tpw=tpw), e, n, kw)
                            tmf = _timer(args)  # graph replays with --graph, as the main rows
                            forced[f"{tm}_t{tpw}_kw{kw}"] = tmf(
                                lambda j, p=p: run(j, config=p)) * 1e6
                row["forced_us"] = forced
            if args.kbit_depth and layout == "tiled":  # the pick at every depth (steps in flight)
                from dataclasses import replace

                from kernelgen.moe.kbit import KbitGemvPlan

                row["depth_us"] = {}
                for d in (2, 3):
                    p = KbitGemvPlan(replace(plan.config, depth=d), e, n, plan.kw)
                    row["depth_us"][f"d{d}"] = _timer(args)(lambda j, p=p: run(j, config=p)) * 1e6
            if (args.forced or args.kbit_forced) and layout != "tiled":
                from kernelgen.moe import plan_kbit
                from kernelgen.moe.config import KBIT_WARPS

                forced = {}
                for tm in (8, 16, 32):
                    for wp, wk in KBIT_WARPS:
                        try:
                            cfg = plan_kbit(info.arch.name, info.sm_count, "bfloat16", bits, e, n,
                                            k, m, "swiglu" if act else "none", tm, (wp, wk)).config
                        except ValueError:
                            continue
                        forced[f"{tm}_w{wp}x{wk}_s{cfg.stages}"] = time_gpu(
                            lambda j, cfg=cfg: run(j, config=cfg), iters=max(3, args.iters // 2),
                            repeats=3) * 1e6
                row["forced_us"] = forced
            rows.append(row)
            sp = f" {row['speedup_vs_bf16']:.2f}x bf16" if bf else ""
            print(f"{name:5s} T={t:5d} {gemm:11s} kbit{bits} {layout:5s} {row['us']:9.1f} us floor "
                  f"{row['floor_us']:8.1f} ({row['floor_frac']:.2f}){sp} {plan.short()} [{row['timing']}]",
                  flush=True)
            for key in ("forced_us", "depth_us"):
                if key in row:
                    print(f"      {key[:-3]}: " + " ".join(f"{kk}={v:.1f}" for kk, v in row[key].items()),
                          flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="E128,E256,E8")
    ap.add_argument("--ts", default="1,2,4,8,16,64,256,4096")
    ap.add_argument("--forced", action="store_true", help="also time every tile-table row")
    ap.add_argument("--sweep", action="store_true",
                    help="also time pipeline variants (stages, warps, CTAs/SM) at T >= 1024")
    ap.add_argument("--sweep-wgmma", action="store_true",
                    help="--sweep over the wgmma variants only (sm_90a)")
    ap.add_argument("--path", choices=("auto", "wgmma", "mma"), default="auto",
                    help="main loop of the selector's row: its choice, or forced (wgmma: sm_90a)")
    ap.add_argument("--kbit", default="4", help="bits of the kbit-expert runs ('' = none)")
    ap.add_argument("--kbit-ts", default="1,2,4,8,16")
    ap.add_argument("--kbit-forced", action="store_true",
                    help="--forced for the kbit rows only (tiled: every m_tile, tpw and kw)")
    ap.add_argument("--kbit-depth", action="store_true",
                    help="tiled kbit rows: also time the selected plan at depth 2 and 3")
    ap.add_argument("--kbit-layouts", default="flat,tiled",
                    help="expert layouts of the kbit runs (tiled: 4 bits only; the same codes)")
    ap.add_argument("--decode-sweep", action="store_true", help="--sweep at T=1 too")
    ap.add_argument("--graph", action="store_true",
                    help="time the main rows (ours, torch._grouped_mm, kbit) as CUDA-graph replays")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy
    import torch

    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth

    info = device_info()
    bw = copy_bandwidth()
    print(f"# {info.name}, {info.sm_count} SMs; device copy {bw / 1e12:.3f} TB/s (read + write)")
    has_gmm = hasattr(torch, "_grouped_mm")
    print(f"# torch {torch.__version__}; torch._grouped_mm {'present' if has_gmm else 'ABSENT'}")
    rng = np.random.default_rng(0)
    results = []

    for name in args.shapes.split(","):
        e, h, i, top_k = SHAPES[name]
        w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16).mul_(h ** -0.5)
        w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16).mul_(i ** -0.5)
        for t in (int(s) for s in args.ts.split(",") if s):  # --ts "": kbit rows only
            m = t * top_k
            draws = [_routing(rng, t, e, top_k) for _ in range(DRAWS)]
            offs = [torch.from_numpy(o).cuda() for o, _ in draws]
            touched = float(np.mean([np.count_nonzero(c) for _, c in draws]))
            x13 = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
            x2 = torch.randn(m, i, device="cuda", dtype=torch.bfloat16)
            for gemm, x, w, n, k, act in (("w13+swiglu", x13, w13, 2 * i, h, "swiglu"),
                                          ("w2", x2, w2, h, i, None)):
                results.append(_bench_gemm(args, info, bw, has_gmm, name, t, gemm, x, w, offs,
                                           e, n, k, act, touched))
            del x13, x2
        for bits in (int(b) for b in args.kbit.split(",") if b):
            results.extend(_bench_kbit(args, info, bw, name, w13, w2, bits, results))
        del w13, w2
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()
        # freeing GBs leaves the device busy for ~0.1 s after the call returns (H100: an E8
        # decode kernel read 195-290 us instead of 167 for 60-100 ms after 22 GB were freed,
        # 167 at once after a pause; BENCHMARKS.md, session 21): let the next shape start clean
        torch.cuda.synchronize()
        time.sleep(1.0)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "copy_bw": bw, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
