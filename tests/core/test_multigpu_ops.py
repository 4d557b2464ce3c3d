"""Every family's ops with their arrays on device 1 while device 0 is current (and the reverse
in threads): the kernels load and launch on the arrays' device, allocations and scratch land
there, and the results match the same calls with everything on device 0.

Marked `multigpu` (skipped by tests/conftest.py with fewer than two devices). The two GPUs are
taken to be the same model, so each call gets the same plan on both and the results agree to
the rounding of a reordered fp32 sum (split-K reductions may add in another order).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ._arrays import HIDDEN, host, moe_layer

pytestmark = pytest.mark.multigpu

N, K = 256, 512


@pytest.fixture(params=["cupy", "torch"])
def kind(request):
    if request.param == "torch":
        pytest.importorskip("torch")
    return request.param


def placer(kind: str, dev: int):
    """host array -> the same values on `dev` as `kind`, without changing the current device."""
    import cupy

    def put(h):
        if kind == "torch":
            import torch

            return torch.from_numpy(np.ascontiguousarray(h)).to(f"cuda:{dev}")
        with cupy.cuda.Device(dev):
            return cupy.asarray(h)
    return put


def device_of(x) -> int:
    return x.device.index if hasattr(x, "is_cuda") else x.data.device_id


def _arch() -> str:
    from kernelgen.arch import device_info

    return device_info(0).arch.name


# -- one function a family: returns [(label, output array)] ------------------------------------

def kbit_gemm(put, rng):
    import kernelgen as kg

    w = put((rng.standard_normal((N, K)) * 0.05).astype(np.float16))
    bias = put(rng.standard_normal(N).astype(np.float16))
    out = []
    for bits, layout in ((2, "flat"), (3, "flat"), (4, "flat"), (5, "flat"), (4, "tiled")):
        lin = kg.quantize_weight(w, bits=bits, layout=layout)
        paths = [dict(path="gemv"), dict(path="gemv", split_k=2), dict(path="dequant")]
        paths += [dict(path="mma", split_k=2)] if layout == "flat" else [dict(path="tile")]
        if layout == "tiled" and _arch() == "sm_90a":
            paths.append(dict(path="wgmma"))
        for m in (1, 17):
            a = put(rng.standard_normal((m, K)).astype(np.float16))
            out.append((f"{bits} {layout} M={m} selector", kg.gemm(a, lin, bias)))
            for kw in paths:
                out.append((f"{bits} {layout} M={m} {kw}", kg.gemm(a, lin, bias, **kw)))
        out.append((f"{bits} {layout} dequantize", lin.dequantize("float32")))
    return out


def fp4_gemm(put, rng):
    import kernelgen as kg
    from kernelgen.fp4_gemm import fp4_gemm as run
    from kernelgen.mx import dequantize

    w = put((rng.standard_normal((N, K)) * 0.05).astype(np.float16))
    out = []
    for fmt in ("nvfp4", "mxfp4"):
        t = kg.quantize_nvfp4(w) if fmt == "nvfp4" else kg.quantize_mx(w, "mxfp4")
        out.append((f"{fmt} dequantize", dequantize(t, "float32")))
        paths = ["gemv", "tile", "dequant"] + (["wgmma"] if _arch() == "sm_90a" else [])
        for m in (1, 40):
            a = put(rng.standard_normal((m, K)).astype(np.float16))
            out.append((f"{fmt} M={m} selector", run(a, t)))
            for path in paths:
                out.append((f"{fmt} M={m} {path}", run(a, t, path=path)))
    return out


def mx(put, rng):
    import kernelgen as kg
    from kernelgen.mx import dequantize

    x = put((rng.standard_normal((300, 256)) * 3).astype(np.float16))
    out = []
    for fmt in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"):
        for layout in ("swizzled", "row_major"):
            t = kg.quantize_nvfp4(x, scale_layout=layout) if fmt == "nvfp4" else \
                kg.quantize_mx(x, fmt, scale_layout=layout)
            out += [(f"{fmt} {layout} data", t.data), (f"{fmt} {layout} scales", t.scales),
                    (f"{fmt} {layout} dequantize", dequantize(t, "float16"))]
    return out


def mx_gemm(put, rng):
    import kernelgen as kg
    from kernelgen.mx_gemm import mx_gemm as run

    b = kg.quantize_mx(put(rng.standard_normal((N, K)).astype(np.float16)), "mxfp8_e4m3")
    out = []
    for m in (1, 300):
        a = kg.quantize_mx(put(rng.standard_normal((m, K)).astype(np.float16)), "mxfp8_e4m3")
        out.append((f"M={m}", run(a, b)))
    return out


def moe(put, rng):
    import kernelgen as kg

    x, ids, wts, w13, w2 = moe_layer(put, rng)
    sizes = np.array([0, 5, 17, 1, 40, 3, 9, 2])
    off = put(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    xr = put((rng.standard_normal((int(sizes.sum()), HIDDEN)) * 0.5).astype(np.float16))
    out = [("dense fused_moe", kg.fused_moe(x, ids, wts, w13, w2))]
    for wg in (False, True) if _arch() == "sm_90a" else (False,):
        out.append((f"dense grouped_gemm wgmma={wg}", kg.grouped_gemm(xr, w13, off, wgmma=wg)))
    for bits, layout in ((4, "tiled"), (3, "flat")):
        q13 = kg.quantize_experts(w13, bits=bits, layout=layout)
        q2 = kg.quantize_experts(w2, bits=bits, layout=layout)
        out.append((f"kbit{bits} {layout} grouped_gemm", kg.grouped_gemm(xr, q13, off)))
        out.append((f"kbit{bits} {layout} fused_moe", kg.fused_moe(x, ids, wts, q13, q2)))
    return out


def moe_routing(put, rng):
    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout, moe_route

    out = []
    for t, k, e, multi, pad in ((5, 2, 8, False, 1), (700, 8, 256, True, 16)):
        ids = put(rng.integers(-1, e + 1, (t, k)).astype(np.int32))
        x = put(rng.standard_normal((t, 64)).astype(np.float16))
        w = put(rng.random((t, k)).astype(np.float32))
        lay = moe_layout(ids, e, pad_to=pad, multi=multi)
        xs = moe_dispatch(x, lay, exact=False)
        total = int(host(lay.offsets)[-1])
        lay2, xr = moe_route(x, ids, e, pad_to=pad)
        ok = moe_layout(put(rng.integers(0, e, (t, k)).astype(np.int32)), e, pad_to=pad)
        out += [(f"T={t} src", lay.src), (f"T={t} dest", lay.dest), (f"T={t} offsets", lay.offsets),
                (f"T={t} dispatch", xs[:total]), (f"T={t} combine", moe_combine(xs, lay, w)),
                (f"T={t} route", xr[:total]), (f"T={t} route src", lay2.src),
                (f"T={t} exact dispatch", moe_dispatch(x, ok, exact=True))]
    return out


FAMILIES = {"kbit_gemm": kbit_gemm, "fp4_gemm": fp4_gemm, "mx": mx, "mx_gemm": mx_gemm,
            "moe": moe, "moe_routing": moe_routing}


def run_on(family: str, kind: str, dev: int, current: int, seed: int):
    """The family's calls with every array on `dev` while `current` is the current device."""
    import cupy

    cupy.cuda.Device(current).use()
    if kind == "torch":
        import torch

        torch.cuda.set_device(current)
    outs = FAMILIES[family](placer(kind, dev), np.random.default_rng(seed))
    for label, x in outs:
        assert device_of(x) == dev, f"{family} {label}: output on device {device_of(x)}, inputs on {dev}"
        assert cupy.cuda.runtime.getDevice() == current, f"{family} {label} changed the current device"
    return [(label, host(x)) for label, x in outs]


def assert_same(a, b, what: str) -> None:
    assert [label for label, _ in a] == [label for label, _ in b]
    for (label, x), (_, y) in zip(a, b, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what} {label}"
        if x.dtype.kind == "f":
            scale = max(float(np.abs(x.astype(np.float64)).max()), 1e-30)
            assert np.isfinite(x).all() and np.isfinite(y).all(), f"{what} {label}: non-finite"
            err = float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) / scale
            assert err <= 1e-3, f"{what} {label}: devices differ by {err:.3g} of the range"
        else:
            assert np.array_equal(x, y), f"{what} {label}: devices differ"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_on_the_other_device(family, kind, monkeypatch):
    """Data on device 1 with device 0 current, against everything on device 0; kernels loaded
    afresh so the first load of each module happens while the other device is current."""
    from kernelgen.core import jit

    monkeypatch.setenv("KERNELGEN_POISON", "1")
    jit.clear_memory_cache()
    try:
        on1 = run_on(family, kind, 1, 0, seed=7)
        on0 = run_on(family, kind, 0, 0, seed=7)
    finally:
        import cupy

        cupy.cuda.Device(0).use()
    assert_same(on0, on1, family)


def test_threads_one_device_each(monkeypatch):
    """Two threads, each with its own current device and data, calling ops at once from an
    empty in-memory kernel table, each call twice (outputs not poisoned: the second call of a
    GEMM replays the launch memo of core/fastcall.py): each thread gets its own device's
    modules and memo entries, and the same results."""
    from kernelgen.core import jit

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    jit.clear_memory_cache()
    results, errors = {}, []
    start = threading.Barrier(2)

    def work(dev):
        try:
            start.wait()
            runs = [[r for fam in ("kbit_gemm", "fp4_gemm", "moe")
                     for r in run_on(fam, "cupy", dev, dev, seed=11)] for _ in range(2)]
            assert_same(runs[0], runs[1], f"device {dev}, first and second call")
            results[dev] = runs[1]
        except BaseException as exc:  # noqa: BLE001 - reported below with its device
            errors.append((dev, exc))

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert_same(results[0], results[1], "threads")
