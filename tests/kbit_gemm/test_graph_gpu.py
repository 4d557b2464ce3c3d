"""kbit GEMM inside CUDA graphs: every path (gemv, mma, dequant; split-K off and on) captured
on a non-blocking stream made current with `stream.use()` (as examples/bench_kbit_gemm.py and
most CuPy code do), replayed with new inputs copied into the captured input buffers, and
compared with eager calls (bit-identical for the deterministic kernels) and the NumPy reference.

Regression of the bench failure on the H100 (forced mma at M=1 timed at 0.1 us from an empty
graph, every later capture failing): a `with stream:` block inside the op restored CuPy's
with-stack top (the legacy stream) instead of the caller's `use()`d stream, so later launches
left the capture. Every test here checks that the current stream is still the caller's.
"""

import functools

import numpy as np
import pytest

from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import quantize_weight
from kernelgen.kbit_gemm import reference as GR

pytestmark = pytest.mark.gpu

# these tests check the flat layout's kernels (4-bit weights default to the tiled layout:
# test_tiled_gpu.py)
quantize_flat = functools.partial(quantize_weight, layout="flat")

N, K = 512, 4224  # 4 mma tiles of 128, 33 k-tiles of 128 (odd: partial splits)
# (path, M, split_k): split_k None = the planner's choice (split at these sizes), 1 = no split
CASES = (
    ("gemv", 1, 1), ("gemv", 1, None), ("gemv", 4, 3), ("gemv", 16, None),
    ("mma", 1, 1), ("mma", 1, None), ("mma", 40, 1), ("mma", 40, 3),
    ("dequant", 200, None),
)


def _host(rng, shape, dtype):
    v = rng.standard_normal(shape).astype(np.float32)
    return R.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


@functools.cache
def _weight(bits, dtype):
    import cupy

    rng = np.random.default_rng(7 * bits)
    lin = quantize_flat(cupy.asarray(_host(rng, (N, K), dtype)), bits,
                             dtype="bfloat16" if dtype == "bfloat16" else None)
    w64 = GR.dequantize_weight(cupy.asnumpy(lin.q.packed), cupy.asnumpy(lin.q.absmax),
                               cupy.asnumpy(lin.q.codebook), bits, N, K)
    return lin, w64


@pytest.fixture
def stream():
    """A non-blocking stream made current with use(); the previous current stream restored."""
    import cupy

    prev = cupy.cuda.get_current_stream()
    s = cupy.cuda.Stream(non_blocking=True)
    s.use()
    yield s
    prev.use()


def _still_current(s, what):
    import cupy

    cur = cupy.cuda.get_current_stream()
    assert cur.ptr == s.ptr, (f"{what}: the current stream changed from the caller's {s.ptr:#x} to "
                              f"{cur.ptr:#x} (0 = legacy): later launches leave the caller's stream "
                              f"and its graph capture")


def _capture(s, fn):
    """The graph of fn() captured on s; an open capture is ended before an error propagates."""
    s.begin_capture()
    try:
        fn()
    except BaseException:
        if s.is_capturing():
            s.end_capture()
        raise
    return s.end_capture()


def _kw(path, split):
    return {"path": path} if path == "dequant" else {"path": path, "split_k": split}


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("path,m,split", CASES, ids=lambda v: str(v))
def test_graph_replay_matches_eager(stream, path, m, split, dtype):
    import cupy

    import kernelgen as kg

    bits = 4 if dtype == "float16" else 3
    lin, w64 = _weight(bits, dtype)
    hint = "bfloat16" if dtype == "bfloat16" else None
    st = np.uint16 if dtype == "bfloat16" else np.float16
    kw = {**_kw(path, split), "dtype": hint}
    rng = np.random.default_rng(m)
    has_bias = m % 2 == 0
    a_buf = cupy.empty((m, K), st)
    b_buf = cupy.empty((N,), st) if has_bias else None
    c_buf = cupy.empty((m, N), st)

    def load(a, b):
        a_buf.set(a, stream=stream)
        if has_bias:
            b_buf.set(b, stream=stream)

    def call(out=None):
        return kg.gemm(a_buf, lin, b_buf, out=out, **kw)

    load(_host(rng, (m, K), dtype), _host(rng, (N,), dtype))
    call(c_buf)  # warm-up: compile, load, split-K scratch, cuBLAS handle, all outside capture
    stream.synchronize()
    _still_current(stream, f"eager {path} {m=} {split=}")
    g = _capture(stream, lambda: call(c_buf))
    _still_current(stream, f"capture {path} {m=} {split=}")
    for rep in range(3):  # new inputs through the captured buffers
        a, b = _host(rng, (m, K), dtype), _host(rng, (N,), dtype)
        load(a, b)
        c_buf.view(np.uint16).fill(0xFFFF)  # NaN: the replay must write every element
        g.launch(stream)
        stream.synchronize()
        got = cupy.asnumpy(c_buf)
        eager = cupy.asnumpy(call())
        stream.synchronize()
        ctx = f"{path} {m=} {split=} {dtype} replay {rep}"
        c = GR.to_float64(got, dtype)
        assert np.all(np.isfinite(c)), f"{ctx}: {int(np.sum(~np.isfinite(c)))} elements not written"
        if path != "dequant":  # same kernel, same inputs, fixed reduction order: same bits
            assert np.array_equal(got.view(np.uint16), eager.view(np.uint16)), f"{ctx}: graph != eager"
        else:  # cuBLAS may pick another algorithm under capture: bounded, not bitwise
            assert GR.rel_error(c, GR.to_float64(eager, dtype)) <= GR.REL_ERROR_BOUND[dtype], ctx
        ref = GR.gemm(a, w64, b if has_bias else None, dtype)
        err = GR.rel_error(c, ref)
        assert err <= GR.REL_ERROR_BOUND[dtype], f"{ctx}: rel error {err:.3g} vs the reference"
    _still_current(stream, f"replays {path} {m=} {split=}")


def test_bench_sequence_every_capture_holds_kernels(stream):
    """The bench's order in one process on one use()d stream: gemv M=1, forced mma M=1
    (split-K), gemv M=16 (split-K), mma M=40, dequant M=200; each graph replays the work (a
    graph without kernels leaves the NaN fill in place) and each capture starts on the caller's
    stream."""
    import cupy

    import kernelgen as kg

    lin, w64 = _weight(4, "float16")
    rng = np.random.default_rng(3)
    for path, m, split in (("gemv", 1, None), ("mma", 1, None), ("gemv", 16, None),
                           ("mma", 40, None), ("dequant", 200, None)):
        kw = _kw(path, split)
        a = _host(rng, (m, K), "float16")
        a_buf, c_buf = cupy.asarray(a), cupy.empty((m, N), cupy.float16)
        for _ in range(2):
            kg.gemm(a_buf, lin, out=c_buf, **kw)
        stream.synchronize()
        assert cupy.cuda.get_current_stream().ptr == stream.ptr, f"{path} {m=}: stream changed"
        g = _capture(stream, lambda a_buf=a_buf, c_buf=c_buf, kw=kw: [kg.gemm(a_buf, lin, out=c_buf, **kw)
                                                           for _ in range(3)])
        c_buf.fill(np.nan)
        stream.synchronize()
        g.launch(stream)
        stream.synchronize()
        c = cupy.asnumpy(c_buf).astype(np.float64)
        assert np.all(np.isfinite(c)), f"{path} {m=}: the graph did not write C (empty graph?)"
        err = GR.rel_error(c, GR.gemm(a, w64, None))
        assert err <= GR.REL_ERROR_BOUND["float16"], f"{path} {m=}: rel error {err:.3g}"


def test_dequant_scratch_in_a_graph_is_not_handed_back_to_the_pool(stream):
    """The dequant path's [N, K] W scratch, allocated while capturing, stays owned (the graph
    writes it at every replay): arrays allocated after the capture do not alias it."""
    import cupy

    import kernelgen as kg

    lin, w64 = _weight(4, "float16")
    m = 200
    a = _host(np.random.default_rng(5), (m, K), "float16")
    a_buf, c_buf = cupy.asarray(a), cupy.empty((m, N), cupy.float16)
    kg.gemm(a_buf, lin, out=c_buf, path="dequant")
    stream.synchronize()
    g = _capture(stream, lambda: kg.gemm(a_buf, lin, out=c_buf, path="dequant"))
    # same size as the scratch: the pool would hand back a freed block of it first
    others = [cupy.full((N, K), 7.0, cupy.float16) for _ in range(4)]
    g.launch(stream)
    stream.synchronize()
    for x in others:
        assert bool(cupy.all(x == 7.0)), "a replay wrote into memory the pool handed out again"
    err = GR.rel_error(cupy.asnumpy(c_buf).astype(np.float64), GR.gemm(a, w64, None))
    assert err <= GR.REL_ERROR_BOUND["float16"]


def _torch_weight(torch):
    """A 4-bit KbitLinear of a random torch [N, K] weight and its float64 dequantization."""
    import cupy

    lin = quantize_flat(torch.randn(N, K, dtype=torch.float16, device="cuda"), 4)
    w64 = GR.dequantize_weight(cupy.asnumpy(cupy.asarray(lin.q.packed)),
                               cupy.asnumpy(cupy.asarray(lin.q.absmax)),
                               cupy.asnumpy(cupy.asarray(lin.q.codebook)), 4, N, K)
    return lin, w64


def _check_torch_replays(g, a_t, c_t, w64, rng, path, m):
    """Two replays of g on fresh A (C poisoned first) against the float64 reference."""
    import torch

    for rep in range(2):
        a = _host(rng, (m, K), "float16")
        a_t.copy_(torch.from_numpy(a))
        c_t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        c = c_t.cpu().numpy().astype(np.float64)
        assert np.all(np.isfinite(c)), f"torch {path} {m=} replay {rep}: C not written"
        err = GR.rel_error(c, GR.gemm(a, w64, None))
        assert err <= GR.REL_ERROR_BOUND["float16"], f"torch {path} {m=}: rel error {err:.3g}"


@pytest.mark.parametrize("path,m,split", (("gemv", 16, None), ("mma", 1, None), ("dequant", 200, None)),
                         ids=lambda v: str(v))
def test_torch_graph_capture(path, m, split):
    """torch.cuda.graph (global capture mode) on the stream the warm-up ran on: the capture
    reuses that stream's split-K scratch and cuBLAS workspace."""
    torch = pytest.importorskip("torch")

    import kernelgen as kg

    lin, w64 = _torch_weight(torch)
    kw = _kw(path, split)
    rng = np.random.default_rng(11)
    a_t = torch.empty((m, K), dtype=torch.float16, device="cuda")
    c_t = torch.empty((m, N), dtype=torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a_t.copy_(torch.from_numpy(_host(rng, (m, K), "float16")))
        for _ in range(2):
            kg.gemm(a_t, lin, out=c_t, **kw)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        kg.gemm(a_t, lin, out=c_t, **kw)
    _check_torch_replays(g, a_t, c_t, w64, rng, path, m)


@pytest.mark.parametrize("path,m", (("gemv", 16), ("dequant", 200)), ids=lambda v: str(v))
def test_torch_graph_on_its_own_side_stream(path, m):
    """torch.cuda.graph(g) without stream=: torch captures on a side stream no warm-up ran on,
    so the per-stream split-K scratch (gemv M=16) and cuBLAS workspace (dequant) of that stream
    are made inside a global-mode capture, from torch memory (a cudaMalloc would be refused)."""
    torch = pytest.importorskip("torch")

    import kernelgen as kg

    lin, w64 = _torch_weight(torch)
    kw = _kw(path, None)
    rng = np.random.default_rng(12)
    a_t = torch.from_numpy(_host(rng, (m, K), "float16")).cuda()
    c_t = torch.empty((m, N), dtype=torch.float16, device="cuda")
    kg.gemm(a_t, lin, out=c_t, **kw)  # warm-up (compile, load) on the current stream
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kg.gemm(a_t, lin, out=c_t, **kw)
    _check_torch_replays(g, a_t, c_t, w64, rng, path, m)
