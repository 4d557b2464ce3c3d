"""Programmatic dependent launch on a device: chains where every launch reads what the launch
just before it wrote give the same bytes with PDL as without, eagerly and replayed from a CUDA
graph, and the PDL path is the one taken (sm_90+).

Marked `gpu` (skipped by tests/conftest.py without a device).
"""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.core import launch

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    import cupy

    return cupy


@pytest.fixture
def pdl_calls(monkeypatch, cupy):
    """Counts launches with the PDL attribute (core.launch._send, under launch_pdl and the
    launch memo's launch_values; skipped on a device without PDL)."""
    from kernelgen.arch import device_info

    if device_info().arch.cc < 90:
        pytest.skip("programmatic dependent launch needs sm_90+")
    calls = []
    real = launch._send

    def spy(ln, *a):
        if ln.config.num_attrs:
            calls.append(ln.function)
        return real(ln, *a)

    monkeypatch.setattr(launch, "_send", spy)
    return calls


def _run(monkeypatch, cupy, pdl: bool, chain, graph: bool):
    monkeypatch.setenv("KERNELGEN_PDL", "1" if pdl else "0")
    stream = cupy.cuda.Stream(non_blocking=True)  # the legacy stream orders launches itself
    if not graph:
        with stream:
            out = chain()
            stream.synchronize()
        return [cupy.asnumpy(o) for o in out]
    with stream:
        chain()  # warm-up: compiles and scratch outside the capture
        stream.synchronize()
        stream.begin_capture()
        out = chain()
        g = stream.end_capture()
        for o in out:  # the replay must write them again
            o.fill(0)
        g.launch(stream)
        stream.synchronize()
    return [cupy.asnumpy(o) for o in out]


def _same_with_and_without(monkeypatch, cupy, pdl_calls, chain, graph: bool, min_pdl: int):
    """The chain's outputs without PDL and with it (at least `min_pdl` launches with the PDL
    attribute): byte for byte the same. Returns the outputs with PDL (and without)."""
    pdl_calls.clear()  # set-up launches (quantizing the weights) do not count
    off = _run(monkeypatch, cupy, False, chain, graph)
    assert not pdl_calls
    on = _run(monkeypatch, cupy, True, chain, graph)
    assert len(pdl_calls) >= min_pdl
    for i, (u, v) in enumerate(zip(off, on, strict=True)):
        assert np.array_equal(u.view(np.uint8), v.view(np.uint8)), f"output {i} differs with PDL"
    return on, off


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kbit_gemv_chain(monkeypatch, cupy, pdl_calls, graph):
    """a_{i+1} = gemm(a_i, W): each GEMV reads the output of the one before it."""
    import kernelgen as kg

    rng = np.random.default_rng(3)
    k = 1024
    w = cupy.asarray((rng.standard_normal((k, k)) / 32).astype(np.float16))
    lin = kg.quantize_weight(w, 4)
    a0 = cupy.asarray(rng.standard_normal((2, k)).astype(np.float16))

    def chain():
        outs, a = [], a0
        for _ in range(6):
            a = kg.gemm(a, lin, path="gemv")
            outs.append(a)
        return outs

    on, _ = _same_with_and_without(monkeypatch, cupy, pdl_calls, chain, graph, 6)
    # and the first link is the GEMV, not two equal wrong answers
    ref = cupy.asnumpy(a0).astype(np.float64) @ cupy.asnumpy(lin.dequantize("float16")).astype(np.float64).T
    assert np.allclose(on[0].astype(np.float64), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_quantize_after_a_writer(monkeypatch, cupy, pdl_calls, graph):
    """A CuPy kernel (no PDL) rewrites x right before each quantize (mx_quantize, and NVFP4's
    amax + quantize with the device global scale) reads it."""
    import kernelgen as kg

    rng = np.random.default_rng(4)
    x = cupy.asarray(rng.standard_normal((256, 1024)).astype(np.float16))
    y = cupy.empty_like(x)

    def chain():
        outs = []
        for i in range(4):
            cupy.multiply(x, np.float16(0.75 + 0.5 * i), out=y)  # not powers of two
            t = kg.quantize_mx(y, "mxfp8_e4m3")
            outs += [t.data, t.scales]
            t = kg.quantize_nvfp4(y)
            outs += [t.data, t.scales, t.global_scale]
        return outs

    _, off = _same_with_and_without(monkeypatch, cupy, pdl_calls, chain, graph, 1)
    assert not np.array_equal(off[0], off[5]), "the writer did not change the input"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_fp4_gemv_chain(monkeypatch, cupy, pdl_calls, graph):
    from kernelgen import quantize_nvfp4
    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight

    rng = np.random.default_rng(5)
    k = 1024
    w = cupy.asarray(rng.standard_normal((k, k)).astype(np.float16))
    W = prepare_weight(quantize_nvfp4(w), act_dtype="float16")
    a0 = cupy.asarray(rng.standard_normal((1, k)).astype(np.float16))

    def chain():
        outs, a = [], a0
        for _ in range(6):
            a = fp4_gemm(a, W, alpha=1 / 32)
            outs.append(a)
        return outs

    on, _ = _same_with_and_without(monkeypatch, cupy, pdl_calls, chain, graph, 6)
    assert np.isfinite(on[-1].astype(np.float32)).all() and np.abs(on[-1]).max() > 0


@pytest.mark.parametrize("kbit", [False, True], ids=["bf16", "kbit4"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_fused_moe_chain(monkeypatch, cupy, pdl_calls, kbit, graph):
    """The whole MoE layer (layout, dispatch, W13 + SwiGLU, W2, combine: each kernel reads the
    one before), twice in a row, the second layer on the first one's output."""
    import kernelgen as kg

    rng = np.random.default_rng(6)
    t, h, i, e, top_k = 5, 256, 128, 8, 2
    x0 = cupy.asarray(rng.standard_normal((t, h)).astype(np.float16))
    w13 = cupy.asarray((rng.standard_normal((e, 2 * i, h)) / 16).astype(np.float16))
    w2 = cupy.asarray((rng.standard_normal((e, h, i)) / 8).astype(np.float16))
    if kbit:
        w13, w2 = kg.quantize_experts(w13, 4), kg.quantize_experts(w2, 4)
    ids = cupy.asarray(rng.integers(0, e, (t, top_k)).astype(np.int32))
    wts = cupy.asarray(rng.random((t, top_k)).astype(np.float32))

    keep = []  # the intermediates of every call outlive the graphs that write them

    def chain():
        keep.append(({}, {}))
        y1 = kg.fused_moe(x0, ids, wts, w13, w2, graph_safe=True, workspace=keep[-1][0])
        y2 = kg.fused_moe(y1, ids, wts, w13, w2, graph_safe=True, workspace=keep[-1][1])
        return [y1, y2]

    on, _ = _same_with_and_without(monkeypatch, cupy, pdl_calls, chain, graph, 8)
    assert np.isfinite(on[1].astype(np.float32)).all() and np.abs(on[1]).max() > 0


# A writer that releases its dependents at once (griddepcontrol.launch_dependents), then spins
# for `ns` nanoseconds before it writes x: a PDL launch after it starts while x is still old.
_WRITER = r"""
extern "C" __global__ void early_writer(unsigned short* x, int n, unsigned short v, long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = v;
}
extern "C" __global__ void copy_no_wait(const unsigned short* x, unsigned short* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i];
}
"""


def _early_write(cupy, x, value: float):
    mod = cupy.RawModule(code=_WRITER, options=("-arch=sm_90",))
    bits = np.float16(value).view(np.uint16)
    # 20 ms: far longer than the host needs to launch what follows (kernels already loaded)
    mod.get_function("early_writer")((4,), (256,), (x, np.int32(x.size), bits, np.int64(20_000_000)))
    return mod


def test_harness_sees_a_missing_wait(cupy, pdl_calls):
    """Control: a PDL launch of a kernel WITHOUT the wait, after the early writer, reads x before
    the writer has written it (so the tests below can tell a wait from none)."""
    x = cupy.ones(1 << 14, cupy.float16)
    y = cupy.zeros_like(x)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        copy = _early_write(cupy, x, 1.0).get_function("copy_no_wait").kernel  # compiled, loaded
        launch.launch_pdl(copy, (4,), (256,), (x, y, np.int32(x.size)), 0, stream.ptr)
        stream.synchronize()
        y.fill(0)
        _early_write(cupy, x, 2.0)
        launch.launch_pdl(copy, (4,), (256,), (x, y, np.int32(x.size)), 0, stream.ptr)
        stream.synchronize()
    assert float(x[0]) == 2.0
    assert (cupy.asnumpy(y) == 1.0).any(), "the copy did not start before the writer wrote x"


def test_pdl_ops_wait_for_an_early_writer(cupy, pdl_calls):
    """The same early writer, then kernelgen ops launched with PDL read x: they see what it
    wrote (quantize_mx, the kbit GEMV, the FP4 GEMV)."""
    import kernelgen as kg
    from kernelgen import quantize_nvfp4
    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight

    rng = np.random.default_rng(7)
    k = 1024
    lin = kg.quantize_weight(cupy.asarray((rng.standard_normal((256, k)) / 32).astype(np.float16)), 4,
                             layout="flat")  # the flat GEMV; the tiled one is the FP4 GEMV's kernel
    W = prepare_weight(quantize_nvfp4(cupy.asarray(rng.standard_normal((256, k)).astype(np.float16))),
                       act_dtype="float16")
    x = cupy.ones((4, k), cupy.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        # every kernel compiled and loaded, every plan memoised: the timed sequence launches fast
        _early_write(cupy, x, 1.0)
        kg.quantize_mx(x, "mxfp8_e4m3", scale_layout="row_major")
        kg.gemm(x, lin, path="gemv")
        fp4_gemm(x[:1], W)
        stream.synchronize()
        pdl_calls.clear()
        _early_write(cupy, x, 3.0)
        q = kg.quantize_mx(x, "mxfp8_e4m3", scale_layout="row_major")
        _early_write(cupy, x, -2.0)
        c = kg.gemm(x, lin, path="gemv")
        _early_write(cupy, x, 0.5)
        d = fp4_gemm(x[:1], W)
        stream.synchronize()
    assert len(pdl_calls) >= 3
    ref_q = kg.quantize_mx(cupy.full((4, k), 3.0, cupy.float16), "mxfp8_e4m3", scale_layout="row_major")
    assert cupy.array_equal(q.data, ref_q.data) and cupy.array_equal(q.scales, ref_q.scales)
    ref_c = kg.gemm(cupy.full((4, k), -2.0, cupy.float16), lin, path="gemv")
    assert cupy.array_equal(c.view(cupy.uint16), ref_c.view(cupy.uint16))
    ref_d = fp4_gemm(cupy.full((1, k), 0.5, cupy.float16), W)
    assert cupy.array_equal(d.view(cupy.uint16), ref_d.view(cupy.uint16))
