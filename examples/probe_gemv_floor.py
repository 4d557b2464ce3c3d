"""Where the kbit GEMV time goes: the streaming-read floor against problem size, and the GEMV
over N and K (M = 1), all timed as CUDA-graph replays with weights rotated past L2.

    python examples/probe_gemv_floor.py [--bits 4,2] [--read-mb 4,8,16,31,64,117]
    python examples/probe_gemv_floor.py --table 2,3,4,5 [--shapes 14336x4096,4096x14336]
        [--ms 1,16] [--variants sel,kw1,kw2,kw4@8x2,kw2/s2] [--json out.json]
    ncu -k kbit_gemv --launch-skip 2 python examples/probe_gemv_floor.py --once 4:14336x4096

A bare 16-byte-load read kernel at several grid sizes shows what any bandwidth kernel can reach
at a given size (launch, ramp and tail included); the GEMV sweep over N separates its fixed cost
per launch (the intercept) from its marginal rate. --table instead times the GEMV per bits,
shape and M against the read floor of its weight bytes (bytes / 1 GiB read rate) and against
the plain read kernel on the same bytes; --variants times forced plans beside the selector's
("sel"), "old" (the launch table of e5cac3d: kw 1, 4 warps x 3 / x 2 at m_tile 8 / 16) and
kw<K>[@<warps>x<CTAs an SM>][/s<K splits>], e.g. kw1 = the planner's kw=1 plan.
"""

from __future__ import annotations

import argparse

import numpy as np

SHAPES = ((1024, 4096), (4096, 4096), (14336, 4096), (28672, 4096), (57344, 4096), (4096, 14336))


def _rotated_weight(kg, bits: int, n: int, k: int, l2_bytes: int):
    """A random [n, k] weight quantized to `bits`, its kbit bytes, and copies of it rotated past
    L2 (kernelgen.bench.rotation): (weight, bytes, copies)."""
    import cupy

    from kernelgen.bench import rotation

    w = cupy.random.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
    base = kg.quantize_weight(w, bits, layout="flat")
    wbytes = base.q.packed.nbytes + base.q.absmax.nbytes
    copies = rotation(lambda: kg.KbitLinear.from_kbit(
        type(base.q)(base.q.packed.copy(), base.q.absmax.copy(), None, base.q.codebook,
                     base.q.shape, base.q.bits, base.q.dtype), layout="flat"), wbytes, l2_bytes)
    return base, wbytes, copies


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="4,2")
    ap.add_argument("--read-mb", default="4,8,16,31,64,117")
    ap.add_argument("--table", default="", help="bits of the GEMV table (skips the rest)")
    ap.add_argument("--shapes", default="14336x4096,4096x14336")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--variants", default="sel", help="plans of --table (see the docstring)")
    ap.add_argument("--json", default="")
    ap.add_argument("--prebuild", type=int, default=0,
                    help="compile every GEMV config of the K-warp launches (tests, --variants) "
                         "into the disk cache with this many processes, then exit")
    ap.add_argument("--once", default="", help="BITS:NxK: 3 launches at M=1 (for ncu)")
    args = ap.parse_args()
    if args.prebuild:
        prebuild(args.prebuild)
        return
    if args.once:
        once(args.once)
        return
    if args.table:
        gemv_table(args)
        return

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
                base, wbytes, copies = _rotated_weight(kg, bits, n, k, dev.l2_bytes)
                a = cupy.asarray(rng.standard_normal((1, k)).astype(np.float16))
                out = cupy.empty((1, n), cupy.float16)
                t, mode = graph_time(lambda i, c=copies, a=a, out=out: kg.gemm(a, c[i % len(c)], out=out, path="gemv"),
                                     len(copies), stream)
                plan = select_gemv(dev.arch.name, 1, n, k, bits, "float16", dev.sm_count)
                print(f"gemv k{bits} M=1 {n:6d}x{k:<6d} {wbytes / 2**20:7.2f} MB {t * 1e6:7.2f} us "
                      f"{wbytes / t / 1e9:6.0f} GB/s  split={plan.split} grid={plan.grid} [{mode}]", flush=True)
                del copies, base


def once(spec: str) -> None:
    """Three M=1 launches of one GEMV variant (a target for ncu --launch-skip 2)."""
    import cupy

    import kernelgen as kg

    bits, shape = spec.split(":")
    n, k = (int(v) for v in shape.split("x"))
    w = cupy.random.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
    lin = kg.quantize_weight(w, int(bits), layout="flat")
    a = cupy.random.standard_normal((1, k), dtype=cupy.float32).astype(cupy.float16)
    for _ in range(3):
        kg.gemm(a, lin, path="gemv")
    cupy.cuda.Device().synchronize()


def gemv_table(args: argparse.Namespace) -> None:
    """GEMV time per bits, shape and M, fp16, weights rotated past L2, graphs."""
    import json

    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.bench import graph_time, read_bandwidth, read_kernel
    from kernelgen.kbit_gemm.api import gemm_with_plan

    dev = device_info()
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    with stream:
        bw = read_bandwidth()
        print(f"{dev.name}: read (1 GiB) {bw / 1e9:.0f} GB/s", flush=True)
        k_read = read_kernel()
        out1 = cupy.zeros(1, cupy.uint32)
        rng = np.random.default_rng(0)
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
        for bits in (int(b) for b in args.table.split(",") if b):
            for n, k in shapes:
                base, wbytes, copies = _rotated_weight(kg, bits, n, k, dev.l2_bytes)
                # the plain read kernel on the same bytes (same rotation), 8 CTAs an SM
                bufs = [c.q.packed for c in copies]
                n16 = np.uint64(base.q.packed.nbytes // 16)
                t_read, _ = graph_time(lambda i, b=bufs, n16=n16: k_read((dev.sm_count * 8,), (256,), (b[i % len(b)], n16, out1)),
                                       len(bufs), stream)
                for m in (int(v) for v in args.ms.split(",") if v):
                    a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                    out = cupy.empty((m, n), cupy.float16)
                    for var in (v for v in args.variants.split(",") if v):
                        try:
                            plan = variant_plan(var, dev, m, n, k, bits)
                        except ValueError as e:
                            print(f"k{bits} M={m:2d} {n:5d}x{k:<5d} {var}: {e}", flush=True)
                            continue
                        t, mode = graph_time(lambda i, c=copies, a=a, out=out, p=plan: gemm_with_plan(
                            a, c[i % len(c)], p, out=out), len(copies), stream)
                        floor = wbytes / bw
                        cfg = plan.config
                        rows.append(dict(bits=bits, n=n, k=k, m=m, variant=var, us=t * 1e6,
                                         floor_us=floor * 1e6, read_us=t_read * 1e6,
                                         pct_read_bw=100 * floor / t, split=plan.split, kw=cfg.kw,
                                         warps=cfg.warps, min_blocks=cfg.min_blocks,
                                         grid=list(plan.grid), mode=mode))
                        print(f"k{bits} M={m:2d} {n:5d}x{k:<5d} {var:10s} {t * 1e6:7.2f} us  floor "
                              f"{floor * 1e6:6.2f} us ({100 * floor / t:4.1f}% read BW)  plain read "
                              f"{t_read * 1e6:6.2f} us  kw={cfg.kw} {cfg.warps}x{cfg.min_blocks} "
                              f"split={plan.split} grid={plan.grid} [{mode}]", flush=True)
                del copies, bufs, base
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev.name, read_bw=bw, rows=rows), f, indent=1)


def _build(cfg):
    from kernelgen.core.jit import build

    return build(cfg, allow_jit=True).compiled


def prebuild(procs: int) -> None:
    """Compile the GEMV configs of every launch the K-warp tests and sweeps force (sm_90a) in
    parallel processes, so that the timed runs and tests find them in the disk cache."""
    import itertools
    import time
    from concurrent.futures import ProcessPoolExecutor

    from kernelgen.kbit_gemm.config import BITS, DTYPES, LAUNCH, M_TILES, KbitGemvConfig, launch_of

    shapes = [(w, b, kw) for kw in (2, 4) for w, b in ((4, 4), (4, 3), (8, 2)) if w % kw == 0]
    cfgs = set()
    for bits, dtype, m_tile, split_k in itertools.product(BITS, DTYPES, M_TILES, (False, True)):
        launches = {(*LAUNCH[(m_tile, bits)][:2], 1), (4, 3, 1), (4, 2, 1), *shapes}
        launches |= {(*launch_of(m_tile, bits, kw)[:2], kw) for kw in (2, 4)}
        for w, b, kw in launches:
            cfgs.add(KbitGemvConfig(arch="sm_90a", bits=bits, dtype=dtype, m_tile=m_tile, warps=w,
                                    min_blocks=b, split_k=split_k, kw=kw))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(procs) as ex:
        built = sum(ex.map(_build, sorted(cfgs, key=str)))
    print(f"prebuild: {len(cfgs)} configs ({built} compiled) in {time.perf_counter() - t0:.1f} s",
          flush=True)


def variant_plan(var, dev, m, n, k, bits):
    """The plan of a --variants entry: "sel" (the selector) or kw<K>[@<W>x<B>][/s<S>]."""
    import re

    from kernelgen.kbit_gemm.select import plan_gemv, select_gemv

    if var == "sel":
        return select_gemv(dev.arch.name, m, n, k, bits, "float16", dev.sm_count)
    if var == "old":  # the table before K warps (e5cac3d): kw 1, 4 warps x 3 (m_tile 8) / x 2
        return plan_gemv(dev.arch.name, m, n, k, bits, "float16", dev.sm_count, None, 1,
                         (4, 3) if m <= 8 else (4, 2))
    hit = re.fullmatch(r"kw(\d)(?:@(\d+)x(\d+))?(?:/s(\d+))?", var)
    if not hit:
        raise SystemExit(f"--variants: {var!r} is not sel or kw<K>[@<W>x<B>][/s<S>]")
    kw, w, b, s = hit.groups()
    return plan_gemv(dev.arch.name, m, n, k, bits, "float16", dev.sm_count,
                     None if s is None else int(s), int(kw),
                     None if w is None else (int(w), int(b)))


if __name__ == "__main__":
    main()
