"""Every kernel family's paths once on small shapes, for compute-sanitizer: each result checked
against a float64 product of the dequantized operands (GEMMs) or the NumPy reference (formats,
routing), outputs poisoned (NaN) before each launch.

    python examples/sanitize.py [--families kbit,kbit_gemm,fp4_gemm,mx,mx_gemm,moe,moe_routing]
    compute-sanitizer --tool memcheck python examples/sanitize.py      # also racecheck,
                                                                       # synccheck, initcheck
Build the kernels first without the sanitizer (`kernelgen prewarm --arch native` or one plain
run of this script): under it, NVRTC compiles are slow. CuPy's memory pool is switched off, so
every array is its own cudaMalloc and memcheck / initcheck see the true bounds of each (a pool
would hand out neighbouring pieces of one allocation). `--selftest` instead writes one element
past a 100-element array: memcheck must report it (a check of the set-up, not of kernelgen).
Prints one line a case and "N cases ok"; exit 1 on a failed check (the sanitizer reports its
own errors and sets its exit code with --error-exitcode).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

FAMILIES = ("kbit", "kbit_gemm", "fp4_gemm", "mx", "mx_gemm", "moe", "moe_routing")
TOL = 2e-2  # relative error against the float64 product (fp16 / bf16 outputs, fp32 sums)
cases = 0


def note(label: str, err: float | None = None, tol: float = TOL) -> None:
    global cases
    cases += 1
    if err is not None and not err <= tol:  # NaN fails too
        print(f"FAIL {label}: relative error {err:.3g} > {tol}", flush=True)
        sys.exit(1)
    print(f"ok   {label}" + (f" (rel err {err:.2g})" if err is not None else ""), flush=True)


def rel(got, want) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def f64(cp_arr):
    import cupy
    return cupy.asnumpy(cp_arr).astype(np.float64)


def poisoned(shape, dtype="float16"):
    import cupy
    return cupy.full(shape, cupy.nan, dtype)


def kbit(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    from kernelgen.kbit import reference as R
    for bits in (2, 3, 4, 5):
        for dt in ("float16", "float32"):
            x_h = (rng.standard_normal((3, 341)) * 0.1).astype(dt)  # 1023 elements: a ragged last block
            q = kg.quantize_kbit(cupy.asarray(x_h), bits=bits)
            cb = cupy.asnumpy(q.codebook)
            ref_packed, _, ref_absmax = R.quantize(x_h.reshape(-1), bits, cb, dt)
            assert np.array_equal(cupy.asnumpy(q.packed), ref_packed), f"kbit {bits} {dt} packed"
            assert np.array_equal(cupy.asnumpy(q.absmax), ref_absmax), f"kbit {bits} {dt} absmax"
            y = kg.dequantize_kbit(q, "float32")
            note(f"kbit quantize / dequantize bits={bits} {dt}", rel(f64(y).reshape(-1), x_h.reshape(-1)), 0.6)


def kbit_gemm(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    n, k = 256, 512
    w = cupy.asarray((rng.standard_normal((n, k)) * 0.05).astype(np.float16))
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float16))
    for bits in (2, 3, 4, 5):
        for layout in ("flat", "tiled") if bits == 4 else ("flat",):
            lin = kg.quantize_weight(w, bits=bits, layout=layout)
            wd = f64(lin.dequantize("float32"))
            if layout == "flat":
                runs = [("gemv", dict(path="gemv")), ("gemv kw=4", dict(kw=4)),
                        ("gemv split=2", dict(path="gemv", split_k=2)), ("mma", dict(path="mma")),
                        ("mma split=2", dict(path="mma", split_k=2)), ("dequant", dict(path="dequant"))]
            else:
                runs = [("gemv", dict(path="gemv")), ("gemv split=2", dict(path="gemv", split_k=2)),
                        ("tile", dict(path="tile")), ("dequant", dict(path="dequant"))]
                if arch == "sm_90a":
                    runs.append(("wgmma", dict(path="wgmma")))
            for m in (1, 5, 17, 40):
                a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
                want = f64(a) @ wd.T + f64(bias)
                for label, kw in runs:
                    out = poisoned((m, n))
                    kg.gemm(a, lin, bias, out=out, **kw)
                    note(f"kbit_gemm bits={bits} {layout} {label} M={m}", rel(f64(out), want))
    # the selector's own plans on decode-sized weights: one CTA an SM (flat), the balanced GEMV
    # (tiled 17408 x 4096), L2 prefetch (pf) and two passes of tokens
    for (nn, kk), bits, layout, ms in (((4096, 4096), 2, "flat", (1, 5, 16)),
                                       ((4096, 4096), 5, "flat", (1, 5, 16)),
                                       ((17408, 4096), 4, "tiled", (1, 9)),
                                       ((4096, 4096), 4, "tiled", (1, 33))):
        w = cupy.asarray((rng.standard_normal((nn, kk)) * 0.05).astype(np.float16))
        lin = kg.quantize_weight(w, bits=bits, layout=layout)
        wd = f64(lin.dequantize("float32"))
        for m in ms:
            a = cupy.asarray(rng.standard_normal((m, kk)).astype(np.float16))
            out = poisoned((m, nn))
            kg.gemm(a, lin, out=out)
            note(f"kbit_gemm bits={bits} {layout} {nn}x{kk} selector M={m}", rel(f64(out), f64(a) @ wd.T))
        del w, lin, wd


def fp4_gemm(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    from kernelgen.fp4_gemm import fp4_gemm as run
    from kernelgen.mx import dequantize
    n, k = 256, 512
    w = cupy.asarray((rng.standard_normal((n, k)) * 0.05).astype(np.float16))
    for fmt in ("nvfp4", "mxfp4"):
        t = kg.quantize_nvfp4(w) if fmt == "nvfp4" else kg.quantize_mx(w, "mxfp4")
        wd = f64(dequantize(t, "float32"))
        paths = ["gemv", "tile", "dequant"] + (["wgmma"] if arch == "sm_90a" else [])
        for m in (1, 9, 40):
            a = cupy.asarray(rng.standard_normal((m, k)).astype(np.float16))
            want = f64(a) @ wd.T
            for path in paths:
                for split in (None, 2) if path != "dequant" else (None,):
                    out = poisoned((m, n))
                    run(a, t, out=out, path=path, split_k=split)
                    note(f"fp4_gemm {fmt} {path} split={split} M={m}", rel(f64(out), want))
    w = cupy.asarray((rng.standard_normal((4096, 4096)) * 0.05).astype(np.float16))
    t = kg.quantize_nvfp4(w)
    wd = f64(dequantize(t, "float32"))
    for m in (1, 16, 33):  # the selector's plans (pf, m_tile 16, wgmma)
        a = cupy.asarray(rng.standard_normal((m, 4096)).astype(np.float16))
        out = poisoned((m, 4096))
        run(a, t, out=out)
        note(f"fp4_gemm nvfp4 4096x4096 selector M={m}", rel(f64(out), f64(a) @ wd.T))


def mx(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    from kernelgen.mx import dequantize
    from kernelgen.mx_gemm import reference as MR
    for rows, k in ((5, 256), (300, 256), (4096, 4096)):  # the last: sector order, looped grids
        x_h = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
        x = cupy.asarray(x_h)
        for fmt in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"):
            for layout in ("swizzled", "row_major"):
                t = kg.quantize_nvfp4(x, scale_layout=layout) if fmt == "nvfp4" else \
                    kg.quantize_mx(x, fmt, scale_layout=layout)
                if fmt != "nvfp4":
                    h = MR.quantize(x_h.astype(np.float32), fmt, layout)
                    assert np.array_equal(cupy.asnumpy(t.data), h.data), f"{fmt} {layout} codes"
                    assert np.array_equal(cupy.asnumpy(t.scales), h.scales), f"{fmt} {layout} scales"
                for dt in ("float16", "float32"):
                    y = f64(dequantize(t, dt))
                    note(f"mx {fmt} {layout} rows={rows} -> {dt}", rel(y, x_h), 0.6)


def mx_gemm(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    from kernelgen.mx import dequantize
    from kernelgen.mx_gemm import mx_gemm as run
    n, k = 256, 512
    for fa, fb in (("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3")):
        b = kg.quantize_mx(cupy.asarray(rng.standard_normal((n, k)).astype(np.float16)), fb)
        bd = f64(dequantize(b, "float32"))
        for m in (1, 100, 300):
            a = kg.quantize_mx(cupy.asarray(rng.standard_normal((m, k)).astype(np.float16)), fa)
            want = f64(dequantize(a, "float32")) @ bd.T
            for label, cfg in [("selector", None)] + other_targets(arch, fa, fb):
                out = cupy.full((m, n), 0x7FC0, cupy.uint16)  # bf16 NaN
                run(a, b, out=out, config=cfg)
                got = (cupy.asnumpy(out).astype(np.uint32) << 16).view(np.float32)
                note(f"mx_gemm {fa} x {fb} M={m} {label}", rel(got, want))


def other_targets(arch: str, fa: str, fb: str) -> list:
    """The MXFP8 kernels of sm_80 (the fp8 decoded by integer ops) and sm_89 (the fp8
    mma.sync), each tile of their tables, built for this GPU's arch (sm_90a runs both)."""
    from kernelgen.mx_gemm.config import MxFp8GemmConfig
    from kernelgen.mx_gemm.select import FP8_PLAN_TILES
    if arch != "sm_90a":
        return []
    out = []
    for target, extra in (("sm_80", dict(soft_fp8=True)), ("sm_89", dict(hbufs=0))):
        tiles = dict.fromkeys(t for _, rows in FP8_PLAN_TILES[target] for t in rows)
        for bm, bn, wm, wn, st in tiles:
            cfg = MxFp8GemmConfig(arch=arch, a_elem=fa[-4:], b_elem=fb[-4:], tile_m=bm, tile_n=bn,
                                  warps_m=wm, warps_n=wn, stages=st, **extra)
            out.append((f"{target} {bm}x{bn} s{st}", cfg))
    return out


def moe(rng, arch: str) -> None:
    import cupy

    import kernelgen as kg
    from kernelgen.moe import reference as R
    e, hdim, inter, t, top_k = 8, 256, 128, 37, 2
    x = cupy.asarray((rng.standard_normal((t, hdim)) * 0.5).astype(np.float16))
    ids = cupy.asarray(rng.integers(0, e, (t, top_k)).astype(np.int32))
    wts = cupy.asarray(rng.random((t, top_k)).astype(np.float32))
    w13 = cupy.asarray((rng.standard_normal((e, 2 * inter, hdim)) * 0.05).astype(np.float16))
    w2 = cupy.asarray((rng.standard_normal((e, hdim, inter)) * 0.05).astype(np.float16))
    # grouped GEMM over uneven segments (one empty), dense weights, each main loop
    sizes = np.array([0, 5, 17, 1, 40, 3, 9, 2])
    off = cupy.asarray(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    rows = int(sizes.sum())
    xr = cupy.asarray((rng.standard_normal((rows, hdim)) * 0.5).astype(np.float16))
    seg = np.repeat(np.arange(e), sizes)
    w13h = f64(w13)
    want = np.einsum("mk,mnk->mn", f64(xr), w13h[seg])
    for wg in (False, True) if arch == "sm_90a" else (False,):
        out = poisoned((rows, 2 * inter))
        kg.grouped_gemm(xr, w13, off, out=out, wgmma=wg)
        note(f"moe grouped_gemm dense wgmma={wg}", rel(f64(out), want))
    for bits, layout in ((4, "tiled"), (4, "flat"), (2, "flat")):
        q13 = kg.quantize_experts(w13, bits=bits, layout=layout)
        q2 = kg.quantize_experts(w2, bits=bits, layout=layout)
        wq = f64(kg.dequantize_kbit(kg.quantize_kbit(w13, bits=bits), "float32"))  # the same codes
        want_q = np.einsum("mk,mnk->mn", f64(xr), wq[seg])
        out = poisoned((rows, 2 * inter))
        kg.grouped_gemm(xr, q13, off, out=out)
        note(f"moe grouped_gemm kbit{bits} {layout}", rel(f64(out), want_q))
        y = kg.fused_moe(x, ids, wts, q13, q2)
        wq2 = f64(kg.dequantize_kbit(kg.quantize_kbit(w2, bits=bits), "float32"))
        want_f = R.fused_moe(f64(x), cupy.asnumpy(ids), cupy.asnumpy(wts), wq, wq2, "float16")
        note(f"moe fused_moe kbit{bits} {layout}", rel(f64(y), want_f))
    y = kg.fused_moe(x, ids, wts, w13, w2)
    want = R.fused_moe(f64(x), cupy.asnumpy(ids), cupy.asnumpy(wts), w13h, f64(w2), "float16")
    note("moe fused_moe dense", rel(f64(y), want))


def moe_routing(rng, arch: str) -> None:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_moe_routing import smoke
    smoke()  # its own cases, checked against the reference
    note("moe_routing smoke")


RUNS = {"kbit": kbit, "kbit_gemm": kbit_gemm, "fp4_gemm": fp4_gemm, "mx": mx, "mx_gemm": mx_gemm,
        "moe": moe, "moe_routing": moe_routing}
assert tuple(RUNS) == FAMILIES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--selftest", action="store_true", help="one out-of-bounds write, for memcheck")
    args = ap.parse_args()
    import cupy
    cupy.cuda.set_allocator(None)  # every array a cudaMalloc of its own (see above)
    if args.selftest:
        k = cupy.RawKernel(r"""extern "C" __global__ void oob(float* p, int n) { p[n + threadIdx.x] = 1.0f; }""",
                           "oob")
        buf = cupy.zeros(100, cupy.float32)
        k((1,), (1,), (buf, np.int32(100)))
        cupy.cuda.runtime.deviceSynchronize()
        print("selftest launched (memcheck should report an invalid write of size 4)")
        return
    fams = [f for f in args.families.split(",") if f]
    bad = set(fams) - set(FAMILIES)
    if bad:
        ap.error(f"unknown families {sorted(bad)}; choose from {FAMILIES}")
    from kernelgen.arch import device_info
    arch = device_info().arch.name
    rng = np.random.default_rng(0)
    t0 = time.time()
    for f in fams:
        RUNS[f](rng, arch)
    print(f"{cases} cases ok in {time.time() - t0:.0f} s ({arch})")


if __name__ == "__main__":
    main()
