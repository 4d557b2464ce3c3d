"""core/fastcall.py: the memoised launch of a GEMM's default call gives the full path's
results bit for bit (CuPy and torch, kbit tiled / flat, FP4, with and without bias, a split-K
workspace plan), is made once per signature and used after, and steps aside for what it does
not cover (misaligned A, poisoned outputs, other signatures, capture replays what it memoised).
The same for the activation quantizers (quantize_mx / quantize_nvfp4: several outputs, no
weight) and mx_gemm (A an MxTensor); paths with a launch the memo cannot replay (a temporary
buffer, a launch not offered) are not memoised.

Marked `gpu`.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import kernelgen as kg
from kernelgen.core import fastcall

from ._arrays import host

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["cupy", "torch"])
def xp(request):
    if request.param == "torch":
        return pytest.importorskip("torch")
    import cupy

    return cupy


def put(xp, h):
    if xp.__name__ == "torch":
        return xp.from_numpy(np.ascontiguousarray(h)).cuda()
    return xp.asarray(h)


def full_path(op, a, w, bias, xp, **kw):
    """The same call through the whole path (KERNELGEN_FASTCALL=0 for it)."""
    old = os.environ.get("KERNELGEN_FASTCALL")
    os.environ["KERNELGEN_FASTCALL"] = "0"
    try:
        return op(a, w, bias, **kw)
    finally:
        if old is None:
            del os.environ["KERNELGEN_FASTCALL"]
        else:
            os.environ["KERNELGEN_FASTCALL"] = old


def weight(kind, xp, rng, n, k):
    w = put(xp, (rng.standard_normal((n, k)) * 0.05).astype(np.float16))
    if kind == "nvfp4":
        return kg.quantize_nvfp4(w)
    bits, layout = {"kbit4 tiled": (4, "tiled"), "kbit2 flat": (2, "flat"),
                    "kbit5 flat": (5, "flat")}[kind]
    return kg.quantize_weight(w, bits=bits, layout=layout)


def op_of(kind):
    if kind == "nvfp4":
        from kernelgen.fp4_gemm import fp4_gemm

        return fp4_gemm
    return kg.gemm


@pytest.mark.parametrize("kind,n,k,ms", [("kbit4 tiled", 256, 512, (1, 3)),
                                         ("kbit2 flat", 256, 512, (1, 3)),
                                         ("nvfp4", 256, 512, (1, 3)),
                                         ("kbit4 tiled", 17408, 4096, (1, 3)),
                                         ("kbit5 flat", 8192, 4096, (49, 64))])  # the mma path
def test_memo_matches_the_full_path(kind, n, k, ms, xp, monkeypatch):
    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w, op = weight(kind, xp, rng, n, k), op_of(kind)
    runs = []
    real = fastcall._Recipe.run
    monkeypatch.setattr(fastcall._Recipe, "run", lambda self, ins: runs.append(1) or real(self, ins))
    bias = put(xp, rng.standard_normal(n).astype(np.float16))
    for m in ms:
        for b in (None, bias):
            for _ in range(3):  # new A each time, one signature: recorded once, then replayed
                a = put(xp, rng.standard_normal((m, k)).astype(np.float16))
                got = op(a, w, b)
                assert type(got) is type(a) and tuple(got.shape) == (m, n)
                np.testing.assert_array_equal(host(got), host(full_path(op, a, w, b, xp)))
    memo = fastcall._memos[id(w)]
    assert len(memo) == 4 and len(runs) == 8, (len(memo), len(runs))


def test_steps_aside(xp, monkeypatch):
    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w = weight("kbit4 tiled", xp, rng, 256, 512)
    a = put(xp, rng.standard_normal((2, 512)).astype(np.float16))
    kg.gemm(a, w)
    assert len(fastcall._memos[id(w)]) == 1
    # A 8 bytes past an aligned address: the full path's alignment error, not a launch
    raw = put(xp, rng.standard_normal(2 * 512 + 4).astype(np.float16))
    bad = raw[4:].reshape(2, 512)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kg.gemm(bad, w)
    # poisoned outputs (tests): the full path, nothing memoised
    monkeypatch.setenv("KERNELGEN_POISON", "1")
    a3 = put(xp, rng.standard_normal((3, 512)).astype(np.float16))
    np.testing.assert_array_equal(host(kg.gemm(a3, w)), host(full_path(kg.gemm, a3, w, None, xp)))
    assert len(fastcall._memos[id(w)]) == 1
    # the knob off: the whole path, nothing memoised
    monkeypatch.delenv("KERNELGEN_POISON")
    monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
    np.testing.assert_array_equal(host(kg.gemm(a3, w)), host(full_path(kg.gemm, a3, w, None, xp)))
    assert len(fastcall._memos[id(w)]) == 1
    monkeypatch.setenv("KERNELGEN_FASTCALL", "1")
    kg.gemm(a3, w)
    assert len(fastcall._memos[id(w)]) == 2


def test_entry_points_memoise_apart_and_memos_go_with_the_weight(monkeypatch):
    """fp4_gemm's errors stay its own after gemm memoised the same A signature on the weight;
    a weight's memo goes when the weight does, and with jit.clear_memory_cache."""
    import gc

    import cupy

    from kernelgen.core import jit
    from kernelgen.fp4_gemm import fp4_gemm

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w = weight("kbit4 tiled", cupy, rng, 256, 512)
    a = cupy.asarray(rng.standard_normal((1, 512)).astype(np.float16))
    kg.gemm(a, w)
    kg.gemm(a, w)
    with pytest.raises(ValueError, match="expected an MxTensor"):
        fp4_gemm(a, w)
    key = id(w)
    assert key in fastcall._memos
    del w
    gc.collect()
    assert key not in fastcall._memos
    w = weight("kbit4 tiled", cupy, rng, 256, 512)
    kg.gemm(a, w)
    assert id(w) in fastcall._memos
    jit.clear_memory_cache()
    assert not fastcall._memos
    np.testing.assert_array_equal(cupy.asnumpy(kg.gemm(a, w)), cupy.asnumpy(full_path(kg.gemm, a, w, None, cupy)))


def test_cupy_graph_capture_replays_the_memo(monkeypatch):
    import cupy

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w = weight("kbit4 tiled", cupy, rng, 256, 512)
    a = cupy.asarray(rng.standard_normal((1, 512)).astype(np.float16))
    s = cupy.cuda.Stream(non_blocking=True)
    prev = cupy.cuda.get_current_stream()
    s.use()
    try:
        kg.gemm(a, w)  # recorded on s
        s.begin_capture()
        y = kg.gemm(a, w)  # the memo, launched into the capture
        g = s.end_capture()
        a[...] = cupy.asarray(rng.standard_normal((1, 512)).astype(np.float16))
        g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(y), cupy.asnumpy(full_path(kg.gemm, a, w, None, cupy)))
    finally:
        prev.use()


def same_mx(a, b):
    assert (a.fmt, tuple(a.shape), a.scale_layout) == (b.fmt, tuple(b.shape), b.scale_layout)
    assert type(a.data) is type(b.data) and type(a.scales) is type(b.scales)
    np.testing.assert_array_equal(host(a.data), host(b.data))
    np.testing.assert_array_equal(host(a.scales), host(b.scales))
    assert (a.global_scale is None) == (b.global_scale is None)
    if a.global_scale is not None:
        np.testing.assert_array_equal(host(a.global_scale), host(b.global_scale))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8_e4m3", "mxfp6_e2m3"])
def test_quantize_memo_matches_the_full_path(fmt, xp, monkeypatch):
    """Each call with a new x of one signature: recorded once, then replayed into new outputs,
    bit-exact to the full path (KERNELGEN_FASTCALL=0); the scale layouts and global-scale modes
    memoise apart."""
    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    fastcall.clear()
    rng = np.random.default_rng()
    runs = []
    real = fastcall._Recipe.run
    monkeypatch.setattr(fastcall._Recipe, "run", lambda self, ins: runs.append(1) or real(self, ins))
    if fmt == "nvfp4":
        gs = put(xp, np.array([900.0], np.float32))
        calls = [lambda x: kg.quantize_nvfp4(x, 2688.0), lambda x: kg.quantize_nvfp4(x),
                 lambda x: kg.quantize_nvfp4(x, gs, scale_layout="row_major")]
    else:
        calls = [lambda x: kg.quantize_mx(x, fmt), lambda x: kg.quantize_mx(x, fmt, scale_layout="row_major")]
    for q in calls:
        for m in (1, 16):
            for _ in range(3):
                x = put(xp, rng.standard_normal((m, 512)).astype(np.float16))
                got = q(x)
                monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
                want = q(x)
                monkeypatch.delenv("KERNELGEN_FASTCALL")
                same_mx(got, want)
    entry = "quantize_nvfp4" if fmt == "nvfp4" else "quantize_mx"
    assert len(fastcall._memos[entry]) == 2 * len(calls) and len(runs) == 4 * len(calls)


def test_quantize_memo_steps_aside(monkeypatch):
    """A misaligned x takes the full path (its error); the two-launch NVFP4 path with an
    amax scratch of its own is not memoised."""
    import cupy

    from kernelgen.mx.select import quantize_plan

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    fastcall.clear()
    rng = np.random.default_rng()
    x = cupy.asarray(rng.standard_normal((4, 512)).astype(np.float16))
    kg.quantize_mx(x, "mxfp8_e4m3")
    raw = cupy.asarray(rng.standard_normal(4 * 512 + 4).astype(np.float16))
    with pytest.raises(ValueError, match="16-byte aligned"):
        kg.quantize_mx(raw[4:].reshape(4, 512), "mxfp8_e4m3")
    assert len(fastcall._memos["quantize_mx"]) == 1
    with pytest.raises((ValueError, TypeError), match="dtype"):  # unhashable: the full path's error
        kg.quantize_mx(x, "mxfp8_e4m3", dtype=["float16"])
    kg.quantize_nvfp4(x, 1.0)
    with pytest.raises(ValueError, match="global_scale"):  # == 1.0, but not a scale
        kg.quantize_nvfp4(x, True)
    from kernelgen.arch import device_info

    info = device_info()
    for rows in (4096, 16384, 65536):  # a size whose computed global scale takes the amax pass
        if quantize_plan(info.arch.name, info.sm_count, "nvfp4", "float16", rows, 512, True, "auto").path == "amax":
            break
    else:
        pytest.skip("no amax-path size found on this device")
    big = cupy.asarray(rng.standard_normal((rows, 512)).astype(np.float16))
    before = len(fastcall._memos.get("quantize_nvfp4", {}))
    a, b = kg.quantize_nvfp4(big), kg.quantize_nvfp4(big)
    same_mx(a, b)
    assert len(fastcall._memos.get("quantize_nvfp4", {})) == before


def test_mx_gemm_memo_matches_the_full_path(xp, monkeypatch):
    from kernelgen.arch import device_info
    from kernelgen.mx_gemm import mx_gemm

    if device_info().arch.name not in ("sm_89", "sm_90a", "sm_100a", "sm_120a"):
        pytest.skip("MXFP8 x MXFP8 on the fp8 mma")
    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    b = kg.quantize_mx(put(xp, (rng.standard_normal((256, 512)) * 0.1).astype(np.float16)), "mxfp8_e4m3")
    bias = put(xp, rng.standard_normal(256).astype(np.float16)).to(xp.bfloat16) if xp.__name__ == "torch" \
        else None
    for bi in (None, bias):
        for m in (1, 16):
            for _ in range(3):
                a = kg.quantize_mx(put(xp, rng.standard_normal((m, 512)).astype(np.float16)), "mxfp8_e4m3")
                got = mx_gemm(a, b, bi)
                monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
                want = mx_gemm(a, b, bi)
                monkeypatch.delenv("KERNELGEN_FASTCALL")
                assert type(got) is type(want)
                np.testing.assert_array_equal(host(got), host(want))
    assert len(fastcall._memos[id(b)]) == (4 if xp.__name__ == "torch" else 2)
    # out= (fp16 here): a per-call input, written and returned
    for _ in range(3):
        a = kg.quantize_mx(put(xp, rng.standard_normal((3, 512)).astype(np.float16)), "mxfp8_e4m3")
        out = put(xp, np.full((3, 256), np.nan, np.float16))
        assert mx_gemm(a, b, out=out, out_dtype="float16") is out
        monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
        want = mx_gemm(a, b, out_dtype="float16")
        monkeypatch.delenv("KERNELGEN_FASTCALL")
        np.testing.assert_array_equal(host(out), host(want))
    assert len(fastcall._memos[id(b)]) == (5 if xp.__name__ == "torch" else 3)


def test_an_unoffered_launch_spoils_the_recording(monkeypatch):
    """gemm's dequantize + cuBLAS path (a kernel launched without an offer): nothing memoised."""
    import cupy

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w = weight("kbit4 tiled", cupy, rng, 256, 512)
    a = cupy.asarray(rng.standard_normal((1024, 512)).astype(np.float16))
    assert kg.gemm(a, w, path="dequant").shape == (1024, 256)
    kg.gemm(a, w)  # the selector's dequant path at this M
    assert id(w) not in fastcall._memos


@pytest.mark.parametrize("kind", ["kbit4 tiled", "nvfp4"])
def test_memo_with_out_alpha_and_dtype(kind, xp, monkeypatch):
    """out= is a per-call input (the result is the caller's array, written); fp4_gemm's alpha
    and a CuPy bf16 call's dtype= are part of the signature."""
    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    w, op = weight(kind, xp, rng, 256, 512), op_of(kind)
    kw = {"alpha": 0.5} if kind == "nvfp4" else {}
    for _ in range(3):
        a = put(xp, rng.standard_normal((3, 512)).astype(np.float16))
        out = put(xp, np.full((3, 256), np.nan, np.float16))
        got = op(a, w, None, out=out, **kw)
        assert got is out
        np.testing.assert_array_equal(host(out), host(full_path(op, a, w, None, xp, **kw)))
    assert len(fastcall._memos[id(w)]) == 1
    if xp.__name__ == "cupy":  # bf16 as uint16 bits, dtype= says so
        bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        for _ in range(2):
            a = xp.asarray(bits(rng.standard_normal((3, 512))))
            got = op(a, w, None, dtype="bfloat16", **kw)
            np.testing.assert_array_equal(host(got), host(full_path(op, a, w, None, xp, dtype="bfloat16", **kw)))
        assert len(fastcall._memos[id(w)]) == 2


@pytest.mark.parametrize("graph_safe", [False, True])
@pytest.mark.parametrize("kind", ["kbit4 flat", "kbit4 tiled", "kbit2 flat", "dense"])
def test_fused_moe_memo_matches_the_full_path(kind, graph_safe, xp, monkeypatch):
    """fused_moe through its memo on (w13, w2): the whole path's outputs over fresh routings
    (the one-CTA layout, and the multi-CTA one past SINGLE_MAX pairs), one entry a signature
    for kbit experts; a replay of the exact dispatch raises the whole path's ValueError on an
    out-of-range id, the graph-safe one drops it as the whole path does; the memo goes with
    either weight."""
    import gc

    from kernelgen.moe import fused_moe, quantize_experts

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    e, h, i, k = 8, 256, 128, 2

    def dense(*s):
        return put(xp, (rng.standard_normal(s) * 0.05).astype(np.float16))

    if kind == "dense":
        w = [dense(e, 2 * i, h), dense(e, h, i)]
    else:
        bits, layout = int(kind[4]), kind.split()[1]
        w = [quantize_experts(dense(e, 2 * i, h), bits, layout=layout),
             quantize_experts(dense(e, h, i), bits, layout=layout)]

    def both(x, ids, tw):
        got = fused_moe(x, ids, tw, *w, graph_safe=graph_safe)
        monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
        want = fused_moe(x, ids, tw, *w, graph_safe=graph_safe)
        monkeypatch.delenv("KERNELGEN_FASTCALL")
        assert type(got) is type(want)
        np.testing.assert_array_equal(host(got), host(want))

    for t in (1, 5, 4500):  # 9000 pairs: the multi-CTA layout
        for _ in range(3):
            both(put(xp, rng.standard_normal((t, h)).astype(np.float16)),
                 put(xp, rng.integers(0, e, (t, k)).astype(np.int32)),
                 put(xp, rng.random((t, k)).astype(np.float32)))
    mkey = ("fused_moe", id(w[0]), id(w[1]))
    if kind != "dense":  # dense experts may take the TMA kernel, whose maps hold x_perm's address
        assert len(fastcall._memos[mkey]) == 3
    x = put(xp, rng.standard_normal((5, h)).astype(np.float16))
    ids = rng.integers(0, e, (5, k)).astype(np.int32)
    ids[3, 1] = e
    tw = put(xp, rng.random((5, k)).astype(np.float32))
    if graph_safe:
        both(x, put(xp, ids), tw)
    else:
        for fc in ("1", "0"):
            monkeypatch.setenv("KERNELGEN_FASTCALL", fc)
            with pytest.raises(ValueError, match=r"token 3 slot 1 names expert 8, outside \[0, 8\)"):
                fused_moe(x, put(xp, ids), tw, *w)
        monkeypatch.delenv("KERNELGEN_FASTCALL")
    w.pop()
    gc.collect()
    assert mkey not in fastcall._memos


@pytest.mark.parametrize("kind", ["kbit4 flat", "kbit4 tiled", "dense"])
def test_grouped_gemm_memo_matches_the_full_path(kind, xp, monkeypatch):
    """grouped_gemm through its memo on w: offsets as a MoeLayout or its array, out= new or
    given, with and without SwiGLU; a dense torch weight given new storage is not replayed with
    the old pointer; a replay still checks a layout's host-read offsets[E] against x's rows."""
    from kernelgen.moe import grouped_gemm, quantize_experts
    from kernelgen.moe_routing import moe_dispatch, moe_layout

    monkeypatch.delenv("KERNELGEN_POISON", raising=False)
    rng = np.random.default_rng()
    e, h, n = 8, 256, 256
    dense = put(xp, (rng.standard_normal((e, n, h)) * 0.05).astype(np.float16))
    w = dense if kind == "dense" else quantize_experts(dense, 4, layout=kind.split()[1])

    def call(*args, **kw):
        got = grouped_gemm(*args, **kw)
        monkeypatch.setenv("KERNELGEN_FASTCALL", "0")
        want = grouped_gemm(*args, **{**kw, "out": None})
        monkeypatch.delenv("KERNELGEN_FASTCALL")
        np.testing.assert_array_equal(host(got), host(want))
        return got

    for act in (None, "swiglu"):
        for t in (1, 5):
            for _ in range(3):
                lay = moe_layout(put(xp, rng.integers(0, e, (t, 2)).astype(np.int32)), e)
                xp_ = moe_dispatch(put(xp, rng.standard_normal((t, h)).astype(np.float16)), lay)
                for offs in (lay, lay.offsets):
                    call(xp_, w, offs, activation=act)
                    out = put(xp, np.full((2 * t, n // 2 if act else n), np.nan, np.float16))
                    assert call(xp_, w, offs, activation=act, out=out) is out
    if kind != "dense":
        assert len(fastcall._memos[id(w)]) == 8
    elif xp.__name__ == "torch":  # the same tensor given new storage (as module.cpu().cuda() does)
        w.data = w.data * 2
        call(xp_, w, lay, activation="swiglu")
    lay = moe_layout(put(xp, rng.integers(0, e, (6, 2)).astype(np.int32)), e)
    moe_dispatch(put(xp, np.zeros((6, h), np.float16)), lay)  # offsets[E] = 12 read on the host
    with pytest.raises(ValueError, match=r"offsets\[E\]=12 rows exceed x's M=10 rows"):
        grouped_gemm(xp_, w, lay)  # x_perm of 5 tokens: 10 rows, a memoised signature
