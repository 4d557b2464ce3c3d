"""Benchmark of the MXFP8 GEMM (mx_gemm, fp8 mma.sync path) against torch._scaled_mm (cuBLASLt
fp8, per-tensor scales) and cuBLAS bf16 (torch.matmul), all measured in the same run.

    python examples/bench_mx_gemm.py [--shapes 8192x8192x8192,...] [--json out.json] [--variants]
                                     [--operands gauss|codes]

Per shape (M x N x K): median time per call over back-to-back calls (CUDA events), TFLOP/s =
2 M N K / t. Operands (--operands): quantized normal values (default) or random finite E4M3
codes with E8M0 scales near 1 (the sm_90a fp8 wgmma rescales codes below their row's largest
block scale: random codes take its slower rounding path more often). --variants also
times every fp8 tile with the k16 loop unrolled by 2 and fully, with the fp8 -> f16
conversion by integer ops (soft_fp8: what the sm_80 kernels run), on the fp8 mma.sync over the
rescaled stages (sm_89's kernel; on sm_90 ptxas lowers it to f16 HMMAs), and the opt-in wgmma
variant on sm_90a (what the selector table is set from); tiles that do not fit the part's
shared memory are skipped.
"""

from __future__ import annotations

import argparse
import json
import warnings

SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 8192), (16, 8192, 8192),
          (128, 4096, 4096))


def _operand(fmt: str, rows: int, k: int, seed: int, kind: str = "gauss"):
    """kind "gauss": normal values times a per-row magnitude and a per-32-block power of two in
    [2^-3, 2^1], quantized on the device (what a quantized layer feeds the GEMM); "codes":
    uniformly random finite codes (a log-uniform spread of magnitudes inside every block) with
    scales 2^-3 .. 2^3."""
    import cupy

    from kernelgen.mx_gemm.reference import HostMx, upload

    rs = cupy.random.RandomState(seed)
    if kind == "gauss":
        from kernelgen.mx import quantize_mx

        x = (rs.standard_normal((rows, k), dtype=cupy.float32)
             * rs.uniform(0.25, 4.0, (rows, 1), dtype=cupy.float32)
             * cupy.repeat(2.0 ** rs.randint(-3, 2, (1, k // 32)), 32, axis=1).astype(cupy.float32))
        return quantize_mx(x, fmt)
    data = rs.randint(0, 256, (rows, k), dtype=cupy.int32).astype(cupy.uint8)
    data[(data & 0x7F) >= 0x7C] = 0x38  # no NaN / Inf codes (E4M3 NaN, E5M2 Inf / NaN): 1.0
    s = -(-k // 32)
    scales = rs.randint(124, 131, (-(-rows // 128), -(-s // 4), 32, 4, 4), dtype=cupy.int32)
    return upload(HostMx(fmt, (rows, k), data, scales.astype(cupy.uint8)), cupy)


def bench_shape(m: int, n: int, k: int, variants: bool, operands: str = "gauss") -> dict:
    """One shape: mx_gemm (selector's config, and every tile if `variants`), torch._scaled_mm
    on the same fp8 bytes with per-tensor scales, torch bf16 matmul."""
    import cupy
    import torch

    from kernelgen.arch import device_info
    from kernelgen.bench import time_gpu
    from kernelgen.mx_gemm import mx_gemm, select_mx_gemm
    from kernelgen.mx_gemm.config import FP8_TILES, WG_TILES, MxFp8GemmConfig

    info = device_info()
    flop = 2.0 * m * n * k
    a, b = _operand("mxfp8_e4m3", m, k, 1, operands), _operand("mxfp8_e4m3", n, k, 2, operands)
    out = cupy.empty((m, n), cupy.uint16)
    plan = select_mx_gemm(info.arch.name, "mxfp8_e4m3", "mxfp8_e4m3", m, n, k, "bfloat16",
                          info.sm_count, info.smem_optin)
    t_mx = time_gpu(lambda i: mx_gemm(a, b, out=out), iters=20, repeats=5)
    # cuBLASLt fp8 with per-tensor scales on the same bytes: A [M, K] . (B [N, K])^T
    ta = torch.as_tensor(a.data, device="cuda").view(torch.float8_e4m3fn)
    tb = torch.as_tensor(b.data, device="cuda").view(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; it is the handle form
        warnings.simplefilter("ignore", DeprecationWarning)
        torch_stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with torch_stream:
        t_ref = time_gpu(lambda i: torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one,
                                                    out_dtype=torch.bfloat16), iters=20, repeats=5)
        t_bf = time_gpu(lambda i: torch.matmul(x, w.t()), iters=20, repeats=5)
    var = {}  # last: a failing opt-in variant cannot spoil the numbers above
    if variants:
        cc = info.arch.cc
        hows = (False, "unroll", "soft") if cc >= 89 else ("soft", "soft unroll")  # sm_80: soft only
        kinds = [((*t, 1), u, False) for t in FP8_TILES for u in hows]
        if cc >= 89:  # the fp8 mma.sync on the rescaled stages (sm_89's path)
            kinds += [((*t, 0), "fp8mma", False) for t in FP8_TILES]
        if info.arch.name == "sm_90a":
            kinds += [(t, False, True) for t in WG_TILES]
            kinds += [((*t, True), False, True) for t in WG_TILES if t[5] == 0]
        for (bm, bn, wm, wn, st, hb, *pre), how, wg in kinds:
            name = (f"{bm}x{bn}" + (f" s{st} w{wm * wn}" if not wg else f" wgmma s{st} h{hb}") +
                    (" prescale" if pre else "") + (f" {how}" if how else ""))
            try:  # tiles past the part's shared memory: reported, skipped
                cfg = MxFp8GemmConfig(arch=info.arch.name, tile_m=bm, tile_n=bn, warps_m=wm,
                                      warps_n=wn, stages=st, unroll_kb="unroll" in str(how),
                                      wgmma=wg, hbufs=hb, prescale=bool(pre),
                                      soft_fp8="soft" in str(how))
                if cfg.smem_bytes() > info.smem_optin:
                    var[name] = f"skipped: {cfg.smem_bytes()} B of shared memory"
                    continue
            except ValueError as e:
                var[name] = f"skipped: {e}"
                continue
            try:
                t = time_gpu(lambda i, c=cfg: mx_gemm(a, b, out=out, config=c), iters=20, repeats=5)
            except Exception as e:  # the opt-in variants come last: report and stop there
                var[name] = f"failed: {type(e).__name__}: {e}"
                break
            var[name] = flop / t / 1e12
    r = {"m": m, "n": n, "k": k, "mx_tflops": flop / t_mx / 1e12, "mx_us": t_mx * 1e6,
         "scaled_mm_tflops": flop / t_ref / 1e12, "bf16_tflops": flop / t_bf / 1e12,
         "config": plan.config.short(), "variants": var}
    r["ratio"] = r["mx_tflops"] / r["scaled_mm_tflops"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--operands", default="gauss", choices=("gauss", "codes"),
                    help="gauss: quantized normal values (default); codes: random finite codes")
    args = ap.parse_args()

    from kernelgen.arch import device_info

    info = device_info()
    print(f"device: {info.name} ({info.arch.name}, {info.sm_count} SMs), operands: {args.operands}")
    print("| M x N x K | mx_gemm TFLOP/s | config | torch._scaled_mm fp8 TFLOP/s | ratio | "
          "bf16 matmul TFLOP/s |")
    print("|---|---|---|---|---|---|")
    rows = []
    for spec in args.shapes.split(","):
        m, n, k = (int(v) for v in spec.split("x"))
        r = bench_shape(m, n, k, args.variants, args.operands)
        rows.append(r)
        print(f"| {m} x {n} x {k} | {r['mx_tflops']:.0f} | {r['config']} | "
              f"{r['scaled_mm_tflops']:.0f} | {r['ratio']:.2f} | {r['bf16_tflops']:.0f} |",
              flush=True)
        if r["variants"]:
            print("    variants: " + ", ".join(f"{k_} {v:.0f}" if isinstance(v, float) else f"{k_} {v}"
                                            for k_, v in r["variants"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
