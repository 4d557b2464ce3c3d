"""Benchmark of the FP4-weight GEMM (NVFP4 / MXFP4 weights, fp16 activations) against the
read-bandwidth floor and cuBLAS fp16 (cupy.matmul), all measured in the same run.

    python examples/bench_fp4_gemm.py [--ms 1,2,4,...] [--fmts nvfp4,mxfp4] [--json out.json]
        [--sweep] [--arrangements tile_major,step_major,...] [--probe]
        [--dtype float16|bfloat16] [--encoding float16|bfloat16]

Per (shape, fmt, M): median microseconds per call from a CUDA graph of back-to-back calls, each
call on a different weight copy (copies span >= 8 x L2). Floor = bytes the call must read
(fp4 weights + scales + A) / the streaming read rate of a 16-byte-load kernel. --sweep also times
forced K splits at M=1, GEMV and tile at M = 16..128 and tile and dequant (+ cuBLAS) at M =
128..256 (the selector's crossovers), and on sm_90a the wgmma path at M = 16..4096; --variants
(at --variant-ms) launch variants checked against the default plan; the plain-read line is a
streaming-read kernel over the same bytes in the same kind of graph (launch, ramp and tail).
--arrangements times each block arrangement of the weight (layout.py; outputs checked bit for bit
against the first); --probe adds read-only kernels that walk the bytes exactly as the M=1 GEMV's
warps do (same grid, K slices, ring depth, loads), without decode or mma. --dtype sets the
activations of the timed rows; --encoding the type the weights are encoded for (default: --dtype).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kernelgen.bench import graph_time, read_bandwidth, read_kernel
from kernelgen.core.interop import smem_limit

SHAPES = ((14336, 4096), (4096, 14336))
MS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096)

def plain_read_us(copies, stream) -> float:
    """Microseconds per call of the 16-byte streaming read kernel over one weight copy's fp4
    bytes (one launch; the scales, 1/16 more, not read), in the same graph of back-to-back calls
    as the GEMM: what launch, ramp and tail cost a kernel that only reads."""
    import cupy

    from kernelgen.arch import device_info

    k = read_kernel()
    out = cupy.zeros(1, cupy.uint32)
    grid = device_info().sm_count * 8

    def call(i):
        x = copies[i % len(copies)].data
        k((grid,), (256,), (x, np.uint64(x.nbytes // 16), out))

    return graph_time(call, len(copies), stream)[0] * 1e6


PROBE_SRC = r"""
template <int DEPTH, bool HINT>
__device__ __forceinline__ void walk(const unsigned char* __restrict__ W, const unsigned char* __restrict__ S,
                                     long long wt, long long wq, long long st, long long sq, int tiles,
                                     int Q, int kw_log, int sbytes, unsigned* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kw = 1 << kw_log, ks = warp & (kw - 1);
  const int tile = blockIdx.x * (8 >> kw_log) + (warp >> kw_log);
  if (tile >= tiles) return;
  const int per = (Q + kw - 1) >> kw_log, q0 = ks * per, n = max(0, min(per, Q - q0));
  const unsigned char* wp = W + tile * wt + q0 * wq + 16 * lane;
  const unsigned char* sp = S + tile * st + q0 * sq + sbytes * lane;
  uint4 a[DEPTH], b[DEPTH];
  unsigned s[DEPTH], acc = 0;
  auto load = [&](int d) {
    if (HINT) {
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(a[d].x), "=r"(a[d].y), "=r"(a[d].z), "=r"(a[d].w) : "l"(wp));
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(b[d].x), "=r"(b[d].y), "=r"(b[d].z), "=r"(b[d].w) : "l"(wp + 512));
    } else {
      a[d] = __ldg((const uint4*)wp);
      b[d] = __ldg((const uint4*)(wp + 512));
    }
    s[d] = sbytes == 4 ? __ldg((const unsigned*)sp) : sbytes == 2 ? __ldg((const unsigned short*)sp) : 0u;
    wp += wq;
    sp += sq;
  };
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (d < n) load(d);
  for (int i0 = 0; i0 < n; i0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (i0 + d < n) {
        acc ^= a[d].x ^ a[d].y ^ a[d].z ^ a[d].w ^ b[d].x ^ b[d].y ^ b[d].z ^ b[d].w ^ s[d];
        if (i0 + d + DEPTH < n) load(d);
      }
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}
#define ARGS const unsigned char* W, const unsigned char* S, long long wt, long long wq, long long st, \
    long long sq, int tiles, int Q, int kw_log, int sbytes, unsigned* out
#define PASS W, S, wt, wq, st, sq, tiles, Q, kw_log, sbytes, out
extern "C" __global__ void __launch_bounds__(256, 2) walk2(ARGS) { walk<2, true>(PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) walk4(ARGS) { walk<4, true>(PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) walk2_nohint(ARGS) { walk<2, false>(PASS); }
"""


def probe_us(copies, fmt, dev, stream) -> dict:
    """Microseconds per call of read-only walks over the weight copies in the M=1 GEMV's
    pattern (its plan's grid and K slices): W and scales at depth 2 (with and without the load
    hints), W only at depth 2 and 4, and W and scales with twice / half the warps along K (the
    walk's few registers let 8 CTAs reside on an SM)."""
    import cupy

    from kernelgen.fp4_gemm import plan

    mod = cupy.RawModule(code=PROBE_SRC, options=("-std=c++17",))
    w0 = copies[0]
    p = plan(dev.arch.name, 1, w0.n, w0.k, fmt, "float16", dev.sm_count)
    out = cupy.zeros(1, cupy.uint32)
    sbytes = 4 if fmt == "nvfp4" else 2
    res = {}
    tiles = -(-w0.n // 16)
    for name, fname, with_s, kw in (("W+S d2", "walk2", True, p.kw),
                                    ("W+S d2 no hint", "walk2_nohint", True, p.kw),
                                    ("W d2", "walk2", False, p.kw), ("W d4", "walk4", False, p.kw),
                                    (f"W+S d2 kw{2 * p.kw}", "walk2", True, 2 * p.kw),
                                    (f"W+S d2 kw{p.kw // 2}", "walk2", True, p.kw // 2)):
        if not 1 <= kw <= 8:
            continue
        fn = mod.get_function(fname)
        grid = (-(-tiles * kw // 8),)

        def call(i, fn=fn, with_s=with_s, kw=kw, grid=grid):
            w = copies[i % len(copies)]
            wt, wq, st, sq = (np.int64(x) for x in w.strides())
            fn(grid, (256,), (w.data, w.scales, wt, wq, st, sq, np.int32(tiles), np.int32(w.k // 128),
                              np.int32(kw.bit_length() - 1), np.int32(sbytes if with_s else 0), out))

        res[name] = graph_time(call, len(copies), stream)[0] * 1e6
    return res


def plain_read_bytes_us(nbytes, count, stream) -> float:
    """The plain_read_us kernel over `count` flat buffers of nbytes (W and scales together)."""
    import cupy

    from kernelgen.arch import device_info

    bufs = [cupy.ones(-(-nbytes // 16) * 4, cupy.uint32) for _ in range(count)]
    k = read_kernel()
    out = cupy.zeros(1, cupy.uint32)
    grid = device_info().sm_count * 8

    def call(i):
        x = bufs[i % len(bufs)]
        k((grid,), (256,), (x, np.uint64(x.nbytes // 16), out))

    return graph_time(call, len(bufs), stream)[0] * 1e6


def weight_copies(fmt, n, k, l2_bytes, arrangement="tile_major", enc="float16"):
    """Prepared weights (random codes and scales of a realistic range; random bytes are random
    codes in either encoding, `enc` only tells the kernels how to decode them), enough copies to
    span 8 x L2, and the bytes one call reads from them."""
    import cupy

    from kernelgen.bench import rotation
    from kernelgen.fp4_gemm import Fp4Weight
    from kernelgen.fp4_gemm.api import ARRANGEMENT
    from kernelgen.fp4_gemm.layout import arrange, arranged_shapes

    g = 16 if fmt == "nvfp4" else 32
    rs = cupy.random.RandomState(0)

    t, q, sb = -(-n // 16), k // 128, 128 // g

    dshape, sshape = arranged_shapes("tile_major", t, q, sb)  # the installed package's layout

    def make():  # random bytes are random (encoded) codes; already in the tiled shapes
        data = rs.randint(0, 256, dshape, dtype=cupy.int32).astype(cupy.uint8)
        if fmt == "nvfp4":
            scales = rs.randint(0x30, 0x48, sshape, dtype=cupy.int32).astype(cupy.uint8)
            post = cupy.full(1, 2688.0 / 3.0, cupy.float32)
        else:
            scales = rs.randint(120, 128, sshape, dtype=cupy.int32).astype(cupy.uint8)
            post = cupy.full(n, 2.0**-6, cupy.float32)
        arr = ARRANGEMENT[fmt] if arrangement == "default" else arrangement
        data, scales = arrange(cupy, data, scales, arr)
        return Fp4Weight(fmt, n, k, data, scales, post, cupy.cuda.runtime.getDevice(), arr, enc)

    wbytes = n * k // 2 + n * k // g
    return rotation(make, wbytes, l2_bytes), wbytes


def run_variants(res, dev, fmt, n, k, copies, wbytes, read_bw, stream, rng, variant_ms,
                 only=None) -> None:
    """Variants the selector would not pick, each checked against the default launch; `only`: a
    regular expression their names must match."""
    import dataclasses
    import re

    import cupy

    from kernelgen.fp4_gemm import fp4_gemm, plan
    from kernelgen.fp4_gemm.config import PFS, WGMMA_ARCHS, WGMMA_BMS, WGMMA_SMEM_MAX, wgmma_smem
    from kernelgen.fp4_gemm.select import PF_ARCHS, TILE_MIN_STEPS, wgmma_pipeline

    def variants(m):
        base = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count)
        if base.path == "gemv":
            cfg = base.config
            yield "hint=off", dataclasses.replace(base, config=cfg.replace(hint=False))
            for pf in PFS if dev.arch.name in PF_ARCHS else ():  # L2 prefetch before the PDL wait
                if pf != cfg.pf:
                    yield f"pf={pf}", dataclasses.replace(base, config=cfg.replace(pf=pf))
            for tpw in (1, 2):  # tiles a warp (the planner re-picks KW / grid / split for them)
                if tpw != cfg.tpw:
                    p2 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, tpw=tpw)
                    yield f"tpw={tpw} kw={p2.kw} split={p2.split}", p2
            for kw in (1, 2, 4, 8):  # warps a tile along K (one CTA covers warps / kw tiles)
                if kw != base.kw and kw <= cfg.warps:
                    grid = (-(-(-(-n // (16 * cfg.tpw)) * kw) // cfg.warps), base.grid[1], base.grid[2])
                    yield f"kw={kw}", dataclasses.replace(base, kw=kw, grid=grid)
            # the other resident-warp count (32: <= 64 registers, TPW 1, KW may double; at
            # m_tile 16 one accumulator chain a token half, A loaded a word at a time)
            other = 16 if cfg.warps_per_sm == 32 else 32
            seen = set()
            for s in (None, 1):
                p2 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, wps=other, split=s)
                if (p2.kw, p2.split, p2.grid) not in seen:
                    seen.add((p2.kw, p2.split, p2.grid))
                    name = f"wps={other} tpw={p2.config.tpw} kw={p2.kw} split={p2.split}"
                    yield name, p2
                    if other == 32 and cfg.m_tile == 16:  # A a word at a time; 8-warp CTAs
                        yield name + " a_by_word", dataclasses.replace(
                            p2, config=p2.config.replace(a_by_word=True))
                        if p2.config.warps == 4:
                            yield name + " warps=8", dataclasses.replace(
                                p2, config=p2.config.replace(warps=8), block=(256, 1, 1),
                                grid=(-(-p2.grid[0] // 2), p2.grid[1], p2.grid[2]))
            # A through a cp.async ring in shared memory (16 warps an SM only): on the default
            # plan, or on the 16-warp plan where the default takes 32; and with the other TPW
            ring_bases = [("a_ring", base)] if cfg.warps_per_sm == 16 else []
            if cfg.warps_per_sm == 32:
                p16 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, wps=16)
                ring_bases.append((f"a_ring wps=16 tpw={p16.config.tpw} kw={p16.kw} split={p16.split}", p16))
            other_tpw = 2 if cfg.tpw == 1 else 1
            if cfg.m_tile == 16:
                pt = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, tpw=other_tpw, wps=16)
                ring_bases.append((f"a_ring tpw={other_tpw} kw={pt.kw} split={pt.split}", pt))
            for name, b in ring_bases:
                rc = b.config.replace(a_ring=True)
                yield name, dataclasses.replace(b, config=rc, smem=rc.smem_bytes())
            for w in (4, 8):  # the other CTA size (4-warp CTAs even out the SMs' warp counts)
                if w != cfg.warps and base.kw <= w:
                    grid = (-(-(-(-n // (16 * cfg.tpw)) * base.kw) // w), base.grid[1], base.grid[2])
                    yield f"warps={w}", dataclasses.replace(base, config=cfg.replace(warps=w), grid=grid,
                                                            block=(32 * w, 1, 1))
            for depth in (2, 3) if cfg.warps_per_sm == 32 else (2, 3, 4):
                if depth != cfg.depth and (depth != 3 or cfg.m_tile == 8):  # m_tile 16 spills at 3
                    yield f"depth={depth}", dataclasses.replace(base, config=cfg.replace(depth=depth))
            for s in (1, 2, 3, 4, 6, 8, 12):  # forced K splits (a CTA's warps then share its K range)
                if s != base.split:
                    try:
                        p2 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, split=s)
                    except ValueError:
                        continue
                    yield f"split={s} kw={p2.kw} grid={p2.grid}", p2
        else:
            for bm, wt, st in ((64, 2, 3), (64, 4, 3), (128, 2, 2), (128, 2, 4), (128, 4, 2),
                               (128, 4, 3), (128, 4, 4)):
                p = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, path="tile")
                cfg = p.config.replace(bm=bm, stages=st, warps_t=wt)
                grid = (p.grid[0], -(-m // bm), p.grid[2])
                yield f"bm={bm} wt={wt} st={st}", dataclasses.replace(
                    p, config=cfg, grid=grid, block=(cfg.threads, 1, 1), smem=cfg.smem_bytes())
        if dev.arch.name in WGMMA_ARCHS:  # the wgmma path: A stages x groups in
            wg = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, path="wgmma")  # flight
            c0 = wg.config  # x weight ring at its BM; the other BMs; K splits
            cands = [(c0.bm, st, inf, r) for st in (2, 3, 4) for inf in (0, 1) for r in (1, 2, 3)]
            cands += [(bm, *wgmma_pipeline(bm, WGMMA_SMEM_MAX), c0.ring) for bm in WGMMA_BMS if bm != c0.bm]
            for bm, st, inf, r in cands:
                if st - 1 - inf < 1 or wgmma_smem(bm, st, inf) > WGMMA_SMEM_MAX:
                    continue
                cfg = c0.replace(bm=bm, stages=st, inflight=inf, ring=r)
                grid = (wg.grid[0], -(-m // bm), wg.grid[2])
                yield f"wgmma bm={bm} st={st} inflight={inf} ring={r}", dataclasses.replace(
                    wg, config=cfg, grid=grid, smem=cfg.smem_bytes())
            for s in (1, 2, 4, 8):
                if s != wg.split and s <= k // 128:
                    p2 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, path="wgmma", split=s)
                    yield f"wgmma split={s}", p2
            if c0.bm == 64:  # two CTAs an SM (the one pipeline that fits twice), K split for them
                ctas = wg.grid[0] * wg.grid[1]
                s2 = max(1, min(2 * dev.sm_count // ctas, k // 128 // TILE_MIN_STEPS))
                p2 = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, path="wgmma", split=s2)
                cfg = c0.replace(stages=2, inflight=0, ctas_per_sm=2)
                yield f"wgmma bm=64 st=2 inflight=0 2 CTAs an SM split={p2.split}", dataclasses.replace(
                    p2, config=cfg, smem=cfg.smem_bytes())

    for m in variant_ms:
        a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
        ref = fp4_gemm(a, copies[0]).astype(cupy.float32)
        for name, p in variants(m):
            if only and not re.search(only, name):
                continue
            out = cupy.full((m, n), np.nan, cupy.float16)
            fp4_gemm(a, copies[0], out=out, _plan=p)
            err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
            t, _ = graph_time(lambda i, a=a, out=out, c=copies, p=p: fp4_gemm(
                a, c[i % len(c)], out=out, _plan=p), len(copies), stream)
            fr = (wbytes + m * k * 2) / read_bw / t
            res.setdefault("variants", []).append({"N": n, "K": k, "fmt": fmt, "M": m, "variant": name,
                                                   "arrangement": copies[0].arrangement,
                                                   "us": t * 1e6, "frac_read_bw": fr, "err": err})
            print(f"  variant {fmt} {copies[0].arrangement} {n}x{k} M={m:<4} {name:18} {t * 1e6:8.2f} us {100 * fr:5.1f}% read BW"
                  f"  {2 * m * n * k / t / 1e12:6.1f} TF/s  err {err:.1e}", flush=True)


def sass_histogram(path, dev, dtype="float16", enc="float16") -> None:
    """Opcode counts of the M=1 bandwidth kernel (cuobjdump -sass), to compare with estimates."""
    import collections
    import re
    import subprocess
    import tempfile

    from kernelgen.core.jit import build
    from kernelgen.fp4_gemm import select_fp4

    lines = []
    for fmt in ("nvfp4", "mxfp4"):
        for m in (1, 16):
            cfg = select_fp4(dev.arch.name, m, 14336, 4096, fmt, dtype, dev.sm_count, enc,
                             smem_limit(dev.index)).config
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(build(cfg).cubin)
                f.flush()
                sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
            ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", sass))
            lines.append(f"{cfg.short()}: {sum(ops.values())} instructions; " +
                         ", ".join(f"{o} {c}" for o, c in ops.most_common(24)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def activations(rng, m, k, dtype):
    """A [m, k] on the device: fp16, or bf16 as its uint16 bits (kbit reference f32_to_bf16)."""
    import cupy

    from kernelgen.kbit.reference import f32_to_bf16

    x = rng.standard_normal((m, k)).astype(np.float32)
    return cupy.asarray(x.astype(np.float16) if dtype == "float16" else f32_to_bf16(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--fmts", default="nvfp4,mxfp4")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--variants", action="store_true",
                    help="time launch variants (load hint, tiles a warp, depth, K warps, splits, tile "
                         "BM / stages)")
    ap.add_argument("--variant-ms", default="1,16,256,1024,4096", help="M values of --variants")
    ap.add_argument("--variant-filter", default=None, help="regex: only variants whose name matches")
    ap.add_argument("--sass", default=None, help="write a SASS opcode histogram of the M=1 kernel here")
    ap.add_argument("--arrangements", default="default",
                    help="weight block arrangements to time (layout.py ARRANGEMENTS; default: "
                         "prepare_weight's for the format)")
    ap.add_argument("--probe", action="store_true", help="read-only walks in the GEMV's pattern")
    ap.add_argument("--profile", action="store_true",
                    help="only call the GEMM 3 times per shape / fmt / M (default plan), for ncu")
    ap.add_argument("--profile-wps", type=int, default=None,
                    help="--profile: force the bandwidth path's resident warps an SM (16 / 32)")
    ap.add_argument("--profile-path", default=None, choices=("gemv", "tile", "dequant", "wgmma"),
                    help="--profile: force this path (default: the planner's)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                    help="activations / output of the timed rows (cuBLAS stays fp16)")
    ap.add_argument("--encoding", default=None, choices=("float16", "bfloat16"),
                    help="the activation type the timed weights are encoded for (default: --dtype)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    import cupy

    from kernelgen.arch import device_info
    from kernelgen.bench import copy_bandwidth, rotation
    from kernelgen.fp4_gemm import fp4_gemm, plan, select_fp4

    dev = device_info()
    hint = "bfloat16" if args.dtype == "bfloat16" else None
    enc = args.encoding or args.dtype  # the timed weights are encoded for A's dtype unless told
    copy_bw = copy_bandwidth()
    read_bw = read_bandwidth()
    res: dict = {"device": dev.name, "arch": dev.arch.name, "sms": dev.sm_count,
                 "copy_GBps_read_plus_write": copy_bw / 1e9, "read_GBps": read_bw / 1e9, "rows": []}
    print(f"{dev.name}: copy {copy_bw / 1e9:.0f} GB/s (read+write), read {read_bw / 1e9:.0f} GB/s",
          flush=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    if args.profile:
        for n, k in shapes:
            for fmt in args.fmts.split(","):
                w = weight_copies(fmt, n, k, 0, args.arrangements.split(",")[0])[0][0]
                for m in ms:
                    a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                    p = plan(dev.arch.name, m, n, k, fmt, "float16", dev.sm_count, wps=args.profile_wps,
                             path=args.profile_path)
                    for _ in range(3):
                        fp4_gemm(a, w, _plan=p)
                    print(f"profiled {n}x{k} {fmt} M={m}: {p.short()}", flush=True)
        cupy.cuda.runtime.deviceSynchronize()
        return
    with stream:
        for n, k in shapes:
            dense = rotation(lambda n=n, k=k: cupy.random.standard_normal((n, k), dtype=cupy.float32)
                             .astype(cupy.float16), n * k * 2, dev.l2_bytes)
            cublas = {}
            for m in ms:
                a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                out = cupy.empty((m, n), cupy.float16)
                cublas[m] = graph_time(lambda i, a=a, out=out, d=dense: cupy.matmul(a, d[i % len(d)].T, out=out),
                                       len(dense), stream)[0]
            del dense
            for fmt, arr in [(f, r) for f in args.fmts.split(",") for r in args.arrangements.split(",")]:
                copies, wbytes = weight_copies(fmt, n, k, dev.l2_bytes, arr, enc)
                if arr == args.arrangements.split(",")[0]:
                    plain = plain_read_us(copies, stream)
                    res.setdefault("plain_read_us", {})[f"{n}x{k} {fmt}"] = plain
                    print(f"{n:>5}x{k:<5} {fmt} plain 16-byte read of W's fp4 bytes: {plain:.2f} us",
                          flush=True)
                    if args.probe:
                        pws = plain_read_bytes_us(wbytes, len(copies), stream)
                        res.setdefault("plain_read_w_s_us", {})[f"{n}x{k} {fmt}"] = pws
                        print(f"{n:>5}x{k:<5} {fmt} plain 16-byte read of W + scales ({wbytes} B): "
                              f"{pws:.2f} us = {100 * wbytes / read_bw / (pws * 1e-6):.1f}% read BW", flush=True)
                    firsts = {}
                if args.probe:
                    pr = probe_us(copies, fmt, dev, stream)
                    res.setdefault("probe_us", []).append({"N": n, "K": k, "fmt": fmt, "arrangement": copies[0].arrangement, **pr})
                    print(f"{n:>5}x{k:<5} {fmt} {copies[0].arrangement} walks: " + ", ".join(f"{a} {v:.2f} us" for a, v in pr.items()),
                          flush=True)
                for m in ms:
                    a = activations(np.random.default_rng(m), m, k, args.dtype)
                    out = cupy.empty((m, n), a.dtype)  # bf16 travels as its uint16 bits
                    fp4_gemm(a, copies[0], out=out, dtype=hint)
                    same = firsts.setdefault(m, out.copy())
                    exact = bool((same.view(cupy.uint16) == out.view(cupy.uint16)).all())
                    t, mode = graph_time(lambda i, a=a, out=out, c=copies: fp4_gemm(a, c[i % len(c)], out=out,
                                                                                     dtype=hint),
                                         len(copies), stream)
                    rbytes = wbytes + m * k * 2
                    tc = cublas[m]
                    p = select_fp4(dev.arch.name, m, n, k, fmt, args.dtype, dev.sm_count, enc,
                                   smem_limit(dev.index))
                    row = {"N": n, "K": k, "fmt": fmt, "dtype": args.dtype, "encoding": enc,
                           "arrangement": copies[0].arrangement, "M": m, "us": t * 1e6,
                           "same_as_first": exact, "read_bytes": rbytes,
                           "floor_us": rbytes / read_bw * 1e6, "frac_read_bw": rbytes / read_bw / t,
                           "tflops": 2 * m * n * k / t / 1e12, "cublas_fp16_us": tc * 1e6,
                           "speedup_vs_cublas": tc / t, "timing": mode, "plan": p.short()}
                    res["rows"].append(row)
                    print(f"{n:>5}x{k:<5} {fmt} {copies[0].arrangement} M={m:<4} {t * 1e6:8.2f} us  floor {row['floor_us']:7.2f}"
                          f"  {100 * row['frac_read_bw']:5.1f}% read BW  {row['tflops']:6.1f} TF/s  "
                          f"cuBLAS {tc * 1e6:8.2f} us ({row['speedup_vs_cublas']:.2f}x)  [{p.path} "
                          f"split={p.split}]{'' if exact else '  NOT BIT-EXACT vs the first arrangement'}",
                          flush=True)
                if args.sweep:
                    for m, path, split in ([(1, "gemv", s) for s in (1, 2, 3, 4, 6, 8, 12)]
                                           + [(16, "gemv", s) for s in (2, 4, 7)]
                                           + [(m, pth, None) for m in (16, 32, 64, 128)
                                              for pth in ("gemv", "tile")]
                                           + [(m, pth, None) for m in (128, 192, 256)
                                              for pth in ("tile", "dequant") if (m, pth) != (128, "tile")]
                                           + [(m, "wgmma", None) for m in (16, 32, 64, 128, 192, 256, 512,
                                                                          1024, 4096)
                                              if dev.arch.name == "sm_90a"]):
                        a = activations(rng, m, k, args.dtype)
                        out = cupy.empty((m, n), a.dtype)
                        try:
                            t, _ = graph_time(lambda i, a=a, out=out, c=copies, pth=path, s=split: fp4_gemm(
                                a, c[i % len(c)], out=out, dtype=hint, path=pth, split_k=s), len(copies),
                                stream)
                        except ValueError as e:
                            print(f"  sweep M={m} {path} split={split}: {e}", flush=True)
                            continue
                        fr = (wbytes + m * k * 2) / read_bw / t
                        res.setdefault("sweep", []).append({"N": n, "K": k, "fmt": fmt, "dtype": args.dtype,
                                                            "encoding": enc, "M": m, "path": path,
                                                            "split": split, "us": t * 1e6, "frac_read_bw": fr})
                        print(f"  sweep {fmt} M={m:<3} {path:7} split={split}: {t * 1e6:8.2f} us "
                              f"{100 * fr:5.1f}% read BW", flush=True)
                if args.variants:
                    run_variants(res, dev, fmt, n, k, copies, wbytes, read_bw, stream, rng,
                                 [int(v) for v in args.variant_ms.split(",")], args.variant_filter)
                del copies
    if args.sass:
        sass_histogram(args.sass, dev, args.dtype, enc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
