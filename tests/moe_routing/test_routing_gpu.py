"""MoE routing kernels on the GPU against the NumPy reference: layout and dispatch bit-exact,
combine bit-exact too (the kernel and the reference do the same fp32 ops in the same order).

Outputs are poisoned (KERNELGEN_POISON=1: 0xFF bytes, i.e. -1 ints and NaN floats), so an
element a kernel does not write shows. Single- and multi-CTA layouts, int32 / int64 ids, exact
and graph-safe dispatch, CUDA-graph replay, torch tensors, dropped ids, block-wise batches.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.moe_routing import reference as R

from .cases import CASES, routing

pytestmark = pytest.mark.gpu

# (T, top_k, E): decode, odd sizes, prefill; SINGLE_MAX (8192) and CHUNK (4096) boundaries
SHAPES = ((1, 8, 256), (7, 2, 8), (64, 8, 256), (64, 8, 128), (513, 4, 3), (1024, 8, 257),
          (1025, 8, 64), (3000, 6, 1000), (5000, 2, 2048))


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _np(a):
    import cupy

    if hasattr(a, "detach"):
        return a.detach().cpu().numpy() if str(a.dtype) != "torch.bfloat16" else \
            a.detach().view(__import__("torch").int16).cpu().numpy().view(np.uint16)
    return cupy.asnumpy(a)


def _check_layout(lay, ref, ctx):
    assert lay.capacity == ref.src.size, ctx
    for name in ("counts", "offsets", "dest", "src", "invalid"):
        got, want = _np(getattr(lay, name)), getattr(ref, name)
        assert got.dtype == np.int32, f"{ctx} {name} dtype {got.dtype}"
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            raise AssertionError(f"{ctx} {name}: {bad.size} differ, first at {bad[:5]}: "
                                 f"got {got[bad[:5]]}, want {want[bad[:5]]}")


def _host(rng, shape, dtype):
    v = rng.standard_normal(shape).astype(np.float32)
    return R.from_f32(v, dtype)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("t,k,e", SHAPES)
@pytest.mark.parametrize("multi", (False, True))
def test_layout_equals_reference(case, t, k, e, multi):
    import cupy

    from kernelgen.moe_routing import moe_layout

    ids = routing(case, t, k, e)
    for id_dtype, pad_to in (("int32", 1), ("int64", 16)):
        ctx = f"{case=} {t=} {k=} {e=} {multi=} {id_dtype=} {pad_to=}"
        lay = moe_layout(cupy.asarray(ids.astype(id_dtype)), e, pad_to=pad_to, multi=multi)
        assert lay.multi == multi
        _check_layout(lay, R.layout(ids, e, pad_to), ctx)


@pytest.mark.parametrize("warps", (4, 8, 16))
@pytest.mark.parametrize("t,k,e", [(1, 8, 256), (64, 8, 256), (300, 4, 3), (1000, 8, 16), (6000, 2, 200)])
@pytest.mark.parametrize("multi", (False, True))
def test_layout_forced_cta_size(warps, t, k, e, multi):
    import cupy

    from kernelgen.moe_routing import moe_layout

    ids = routing("hot80", t, k, e)
    lay = moe_layout(cupy.asarray(ids), e, pad_to=4, multi=multi, warps=warps)
    _check_layout(lay, R.layout(ids, e, 4), f"{warps=} {t=} {k=} {e=} {multi=}")


# n = T * top_k <= FUSED_MAX (2048, the fused kernel's limit; auto picks it up to 1024);
# (1000, 2, 16) and (256, 8, 64) put 4 pairs on a copy CTA (132 SMs; ROUTE_CTAS_PER_SM)
ROUTE_SHAPES = ((0, 8, 256), (1, 8, 256), (1, 1, 1), (7, 2, 8), (16, 8, 256), (64, 8, 256),
                (64, 8, 128), (100, 3, 2048), (256, 8, 64), (1000, 2, 16))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("t,k,e", ROUTE_SHAPES)
def test_fused_route_equals_reference(case, t, k, e):
    import cupy

    from kernelgen.moe_routing import moe_route

    rng = np.random.default_rng(t + e)
    ids = routing(case, t, k, e)
    h = 7168 if t <= 16 else 256
    x_h = _host(rng, (t, h), "bfloat16")
    for id_dtype, pad_to in (("int32", 1), ("int64", 16)):
        ctx = f"{case=} {t=} {k=} {e=} {id_dtype=} {pad_to=}"
        lay, xp = moe_route(cupy.asarray(x_h), cupy.asarray(ids.astype(id_dtype)), e, pad_to=pad_to,
                            dtype="bfloat16", fused=True)
        ref = R.layout(ids, e, pad_to)
        _check_layout(lay, ref, ctx)
        assert xp.shape == (lay.capacity, h), ctx
        assert np.array_equal(cupy.asnumpy(xp)[: ref.total], R.dispatch(x_h, ref)), ctx


@pytest.mark.parametrize("t,k,e,h,per", [(64, 8, 256, 7168, 2), (33, 3, 16, 4096, 5), (9, 7, 5, 64, 8),
                                         (100, 8, 64, 24, 3)])
def test_fused_route_pairs_per_cta(t, k, e, h, per):
    """Copy CTAs of several pairs: the rows of a CTA straddle tokens, items past the first batch
    of loads, ids an int64 view off a 16-byte boundary (the scalar id loads), dropped ids."""
    import cupy

    from kernelgen.moe_routing import moe_route

    rng = np.random.default_rng(t * per)
    ids = routing("hot80", t, k, e)
    ids[t // 2, 0], ids[t - 1, k - 1] = e + 3, -1
    x_h = _host(rng, (t, h), "bfloat16")
    wide = cupy.asarray(np.concatenate([[0], ids.reshape(-1)]).astype(np.int64))
    for pad_to, ids_d in ((1, cupy.asarray(ids.astype(np.int32))), (8, wide[1:].reshape(t, k))):
        ctx = f"{t=} {k=} {e=} {h=} {per=} {pad_to=}"
        ref = R.layout(ids, e, pad_to)
        poisoned = cupy.full((ref.src.size, h), 0xFFFF, cupy.uint16)  # padding rows must be zeroed
        lay, xp = moe_route(cupy.asarray(x_h), ids_d, e, pad_to=pad_to, dtype="bfloat16",
                            fused=True, pairs_per_cta=per, out=poisoned)
        _check_layout(lay, ref, ctx)
        assert np.array_equal(cupy.asnumpy(xp)[: ref.total], R.dispatch(x_h, ref)), ctx


def test_route_paths_and_invalid_ids():
    import cupy

    from kernelgen.moe_routing import moe_route

    t, k, e, h = 40, 4, 16, 64
    ids = routing("uniform", t, k, e)
    ids[5, 3], ids[30, 0] = e, -7
    x_h = _host(np.random.default_rng(2), (t, h), "float16")
    ref = R.layout(ids, e, 2)
    want = R.dispatch(x_h, ref)
    for fused in (True, False):
        lay, xp = moe_route(cupy.asarray(x_h), cupy.asarray(ids), e, pad_to=2, fused=fused)
        _check_layout(lay, ref, f"{fused=}")
        assert np.array_equal(cupy.asnumpy(xp)[: ref.total], want)
        with pytest.raises(ValueError, match="token 5 slot 3 names expert 16"):
            lay.check()
    with pytest.raises(ValueError, match="token 5 slot 3"):
        moe_route(cupy.asarray(x_h), cupy.asarray(ids), e, exact=True)
    ids[5, 3], ids[30, 0] = 0, 1
    lay, xp = moe_route(cupy.asarray(x_h), cupy.asarray(ids), e, exact=True)
    ref = R.layout(ids, e)
    assert xp.shape == (ref.total, h) and np.array_equal(cupy.asnumpy(xp), R.dispatch(x_h, ref))
    with pytest.raises(ValueError, match="fused=True is the graph-safe path"):
        moe_route(cupy.asarray(x_h), cupy.asarray(ids), e, exact=True, fused=True)


def test_route_checks_x_before_the_layout(monkeypatch):
    """exact=True and T * top_k > ROUTE_FUSED_MAX go through moe_layout: a bad x raises
    before it launches (moe_layout stubbed to fail)."""
    import cupy

    from kernelgen.moe_routing import api

    def reached(*args, **kw):
        raise AssertionError("moe_layout reached: x was not checked first")

    monkeypatch.setattr(api, "moe_layout", reached)
    for t, exact in ((4, True), (600, False)):
        ids = cupy.zeros((t, 2), cupy.int32)
        for x, msg in ((cupy.ones((t, 64), cupy.int32), "x: dtype int32 not supported"),
                       (cupy.ones((t + 1, 64), cupy.float16), f"x: {t + 1} rows"),
                       (cupy.ones((t, 12), cupy.float16), "H a multiple of 8")):
            with pytest.raises(ValueError, match=msg):
                api.moe_route(x, ids, 8, exact=exact)


@pytest.mark.parametrize("t,k,e,multi", [(0, 8, 256, None), (1, 1, 1, None), (1, 8, 256, True),
                                         (0, 2, 8, True), (150_000, 8, 256, None)])
def test_layout_edges_and_large_t(t, k, e, multi):
    import cupy

    from kernelgen.moe_routing import moe_layout

    ids = routing("hot80", t, k, e)
    lay = moe_layout(cupy.asarray(ids.astype(np.int32)), e, pad_to=8, multi=multi)
    _check_layout(lay, R.layout(ids, e, 8), f"{t=} {k=} {e=} {multi=}")
    assert lay.total() == int(R.layout(ids, e, 8).total)


@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "uint8"))
@pytest.mark.parametrize("t,k,e,h", [(1, 8, 256, 7168), (64, 8, 256, 4096), (200, 2, 8, 64),
                                     (9000, 2, 16, 128)])
@pytest.mark.parametrize("pad_to", (1, 16))
def test_dispatch_exact_and_graph_safe(dtype, t, k, e, h, pad_to):
    import cupy

    from kernelgen.moe_routing import moe_dispatch, moe_layout

    rng = np.random.default_rng(t + h)
    ids = routing("hot80", t, k, e)
    x_h = rng.integers(0, 255, (t, h), dtype=np.uint8) if dtype == "uint8" else _host(rng, (t, h), dtype)
    hint = "bfloat16" if dtype == "bfloat16" else None
    lay = moe_layout(cupy.asarray(ids), e, pad_to=pad_to)
    ref = R.layout(ids, e, pad_to)
    want = R.dispatch(x_h, ref)
    ctx = f"{dtype=} {t=} {k=} {e=} {h=} {pad_to=}"
    xp = moe_dispatch(cupy.asarray(x_h), lay, dtype=hint)
    assert xp.shape == (ref.total, h), ctx
    assert np.array_equal(cupy.asnumpy(xp), want), ctx
    xs = moe_dispatch(cupy.asarray(x_h), lay, exact=False, dtype=hint)
    assert xs.shape == (lay.capacity, h), ctx
    assert np.array_equal(cupy.asnumpy(xs)[: ref.total], want), ctx
    out = cupy.full((lay.capacity + 3, h), 7, dtype=xs.dtype)
    moe_dispatch(cupy.asarray(x_h), lay, exact=False, out=out, dtype=hint)
    got = cupy.asnumpy(out)
    assert np.array_equal(got[: ref.total], want) and np.all(got[ref.total:] == 7), ctx


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("w_dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("t,k,e,h", [(1, 8, 256, 7168), (64, 8, 128, 4096), (333, 2, 8, 136),
                                     (2000, 10, 64, 256)])
def test_combine_equals_reference(dtype, w_dtype, t, k, e, h):
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_layout

    rng = np.random.default_rng(t * k + h)
    ids = routing("duplicates", t, k, e)
    ref = R.layout(ids, e, 4)
    y_h = _host(rng, (ref.total, h), dtype)
    w_h = R.from_f32(rng.random((t, k)).astype(np.float32), w_dtype)
    lay = moe_layout(cupy.asarray(ids.astype(np.int32)), e, pad_to=4)
    lay.total()  # the exact path's host total: y_perm of exactly offsets[E] rows is accepted
    out = moe_combine(cupy.asarray(y_h), lay, cupy.asarray(w_h), dtype=dtype,
                      w_dtype=w_dtype if w_dtype == "bfloat16" else None)
    want = R.combine(y_h, ref, w_h, dtype, w_dtype)
    got = cupy.asnumpy(out)
    ctx = f"{dtype=} {w_dtype=} {t=} {k=} {e=} {h=}"
    assert got.shape == (t, h), ctx
    if not np.array_equal(got, want):
        gf, wf = R.to_f32(got, dtype), R.to_f32(want, dtype)
        raise AssertionError(f"{ctx}: {np.sum(got != want)} differ; max |diff| "
                             f"{np.nanmax(np.abs(gf - wf))}, ref max {np.max(np.abs(wf))}")


def test_invalid_ids():
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout

    t, k, e, h = 40, 4, 16, 64
    ids = routing("uniform", t, k, e)
    ids[5, 3], ids[30, 0] = e, -7
    for multi in (False, True):
        lay = moe_layout(cupy.asarray(ids), e, multi=multi)
        ref = R.layout(ids, e)
        _check_layout(lay, ref, f"{multi=}")
        assert cupy.asnumpy(lay.invalid).tolist() == [2, 5 * k + 3]
        x = cupy.asarray(_host(np.random.default_rng(0), (t, h), "float16"))
        xs = moe_dispatch(x, lay, exact=False)  # graph-safe: no check, no raise
        with pytest.raises(ValueError, match=r"token 5 slot 3 names expert 16, outside \[0, 16\)"):
            moe_dispatch(x, lay)
        with pytest.raises(ValueError, match="token 5 slot 3"):
            lay.check()
        w = cupy.ones((t, k), cupy.float32)
        out = cupy.asnumpy(moe_combine(xs, lay, w))
        want = R.combine(R.dispatch(cupy.asnumpy(x), ref, rows=lay.capacity), ref,
                         np.ones((t, k), np.float32), "float16")
        assert np.array_equal(out, want)


@pytest.mark.parametrize("fused", (False, True))
def test_graph_capture_replays_new_routing(fused):
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout, moe_route

    t, k, e, h = 64, 8, 256, 1024
    rng = np.random.default_rng(5)
    ids = cupy.asarray(routing("uniform", t, k, e).astype(np.int32))
    x = cupy.asarray(_host(rng, (t, h), "bfloat16"))
    w = cupy.asarray(rng.random((t, k)).astype(np.float32))

    def step():
        if fused:
            lay, xs = moe_route(x, ids, e, pad_to=16, dtype="bfloat16", fused=True)
        else:
            lay = moe_layout(ids, e, pad_to=16)
            xs = moe_dispatch(x, lay, exact=False, dtype="bfloat16")
        return lay, xs, moe_combine(xs, lay, w, dtype="bfloat16")

    step()  # compile and warm the memory pool outside the capture
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        lay, xs, out = step()
        graph = stream.end_capture()
    for case in ("hot80", "one_expert", "duplicates"):
        new = routing(case, t, k, e, seed=3)
        with stream:  # the new ids land before the replay reads them
            ids[...] = cupy.asarray(new.astype(np.int32))
            graph.launch(stream)
        stream.synchronize()
        ref = R.layout(new, e, 16)
        _check_layout(lay, ref, case)
        xp = R.dispatch(cupy.asnumpy(x), ref, rows=lay.capacity)
        assert np.array_equal(cupy.asnumpy(xs)[: ref.total], xp[: ref.total]), case
        assert np.array_equal(cupy.asnumpy(out), R.combine(xp, ref, cupy.asnumpy(w), "bfloat16")), case


def test_exact_dispatch_under_capture_raises_graph_capture_error():
    """moe_dispatch(exact=True) while the stream captures raises GraphCaptureError (not a CUDA
    error), and the capture still ends cleanly."""
    import cupy

    from kernelgen.errors import GraphCaptureError
    from kernelgen.moe_routing import moe_dispatch, moe_layout

    t, k, e, h = 8, 2, 8, 64
    ids = cupy.asarray(routing("uniform", t, k, e))
    x = cupy.ones((t, h), cupy.float16)
    lay = moe_layout(ids, e)
    moe_dispatch(x, moe_layout(ids, e))  # compile and warm the pool outside the capture
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(GraphCaptureError, match="exact=False"):
                moe_dispatch(x, lay, exact=True)
        finally:
            stream.end_capture()
    assert moe_dispatch(x, lay).shape == (t * k, h)  # outside the capture it reads as before


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout

    t, k, e, h = 48, 8, 128, 512
    ids_h = routing("hot80", t, k, e)
    ids = torch.from_numpy(ids_h).cuda()  # int64, as torch.topk returns
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(t, k, device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # the inputs were made on the default stream
    with torch.cuda.stream(s):
        lay = moe_layout(ids, e, pad_to=8)
        xp = moe_dispatch(x, lay)
        out = moe_combine(xp, lay, w)
    s.synchronize()
    assert isinstance(lay.dest, torch.Tensor) and lay.dest.dtype == torch.int32
    assert isinstance(xp, torch.Tensor) and xp.dtype == torch.bfloat16
    ref = R.layout(ids_h, e, 8)
    _check_layout(lay, ref, "torch")
    x_h = _np(x)
    xp_ref = R.dispatch(x_h, ref)
    assert np.array_equal(_np(xp), xp_ref)
    assert np.array_equal(_np(out), R.combine(xp_ref, ref, w.cpu().numpy(), "bfloat16"))


def test_layout_of_the_other_kind_is_refused():
    """A layout built from torch ids with cupy x / y_perm (or the reverse) raises ValueError:
    the two kinds' streams are not ordered."""
    torch = pytest.importorskip("torch")
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout

    t, k, e, h = 4, 2, 8, 64
    ids = routing("uniform", t, k, e)
    lay_t = moe_layout(torch.from_numpy(ids).cuda(), e)
    lay_c = moe_layout(cupy.asarray(ids), e)
    x_c, x_t = cupy.ones((t, h), cupy.float16), torch.ones(t, h, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="x: a cupy array mixed with torch tensors"):
        moe_dispatch(x_c, lay_t, exact=False)
    with pytest.raises(ValueError, match="y_perm: a cupy array mixed with torch tensors"):
        moe_combine(cupy.ones((t * k, h), cupy.float16), lay_t, cupy.ones((t, k), cupy.float32))
    with pytest.raises(ValueError, match="x: a torch tensor mixed with cupy arrays"):
        moe_dispatch(x_t, lay_c)


def test_blockwise_equals_whole_batch():
    import cupy

    from kernelgen.moe_routing import block_bytes, moe_blocks, moe_combine, moe_dispatch, moe_layout

    t, k, e, h = 20_000, 4, 64, 128
    rng = np.random.default_rng(9)
    ids_h = routing("hot80", t, k, e)
    ids = cupy.asarray(ids_h)
    x = cupy.asarray(_host(rng, (t, h), "float16"))
    w = cupy.asarray(rng.random((t, k)).astype(np.float32))
    lay = moe_layout(ids, e)
    whole = moe_combine(moe_dispatch(x, lay), lay, w)
    budget = 8 << 20
    blocks = list(moe_blocks(t, k, h, budget, num_experts=e))
    assert len(blocks) > 3
    out = cupy.empty((t, h), cupy.float16)
    for a, b in blocks:
        lay = moe_layout(ids[a:b], e)
        xp = moe_dispatch(x[a:b], lay)
        moe_combine(xp, lay, w[a:b], out=out[a:b])
        assert xp.nbytes + lay._views["buf"].nbytes <= block_bytes(b - a, k, h, num_experts=e)
    assert np.array_equal(cupy.asnumpy(out), cupy.asnumpy(whole))
    ref = R.layout(ids_h, e)
    assert np.array_equal(cupy.asnumpy(out), R.combine(R.dispatch(cupy.asnumpy(x), ref), ref,
                                                       cupy.asnumpy(w), "float16"))


def test_input_errors():
    import cupy

    from kernelgen.moe_routing import moe_combine, moe_dispatch, moe_layout

    ids = cupy.zeros((4, 2), cupy.int32)
    with pytest.raises(ValueError, match="topk_ids: dtype float32"):
        moe_layout(cupy.zeros((4, 2), cupy.float32), 8)
    with pytest.raises(ValueError, match="expected 2 dimensions"):
        moe_layout(cupy.zeros(8, cupy.int32), 8)
    with pytest.raises(ValueError, match="num_experts=0"):
        moe_layout(ids, 0)
    with pytest.raises(ValueError, match="pad_to"):
        moe_layout(ids, 8, pad_to=0)
    lay = moe_layout(ids, 8)
    with pytest.raises(ValueError, match="x: 5 rows; the layout has 4 tokens"):
        moe_dispatch(cupy.zeros((5, 64), cupy.float16), lay)
    with pytest.raises(ValueError, match="16-byte vectors"):
        moe_dispatch(cupy.zeros((4, 20), cupy.float16), lay)
    with pytest.raises(ValueError, match="dtype uint16 not supported"):
        moe_combine(cupy.zeros((8, 64), cupy.uint16), lay, cupy.ones((4, 2), cupy.float32))
    with pytest.raises(ValueError, match=r"topk_weights: shape \(4, 3\)"):
        moe_combine(cupy.zeros((8, 64), cupy.float16), lay, cupy.ones((4, 3), cupy.float32))
    with pytest.raises(ValueError, match="y_perm: 7 rows"):
        moe_combine(cupy.zeros((7, 64), cupy.float16), lay, cupy.ones((4, 2), cupy.float32))
    with pytest.raises(ValueError, match="layout: expected a MoeLayout"):
        moe_dispatch(cupy.zeros((4, 64), cupy.float16), "nope")
