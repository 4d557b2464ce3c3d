"""MoE routing without a GPU: the NumPy reference against a naive per-pair definition and its
invariants over skewed cases, configs, the planner, prewarm and the block iterator."""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.errors import UnsupportedConfigError
from kernelgen.moe_routing import reference as R
from kernelgen.moe_routing.api import block_bytes, moe_blocks
from kernelgen.moe_routing.config import (
    FUSED_MAX,
    HIST_INTS,
    MAX_EXPERTS,
    ROUTE_MAX_CTA_PAIRS,
    MoeCombineConfig,
    MoeDispatchConfig,
    MoeLayoutConfig,
    MoeRouteConfig,
    layout_smem,
)
from kernelgen.moe_routing.select import (
    CHUNK,
    SINGLE_MAX,
    combine_launch,
    move_grid,
    plan_layout,
    plan_route,
    prewarm_configs,
    warps_for,
)

from .cases import CASES, routing

SHAPES = ((0, 8, 16), (1, 1, 8), (1, 8, 256), (5, 2, 8), (64, 8, 128), (64, 8, 256),
          (300, 4, 3), (1000, 8, 256))


def naive_layout(ids: np.ndarray, e: int, pad_to: int):
    """The definition, one pair at a time: rows of expert e in increasing flat index."""
    flat = [int(v) for v in ids.reshape(-1)]
    per = [[i for i, v in enumerate(flat) if v == x] for x in range(e)]
    offsets = [0]
    for rows in per:
        offsets.append(offsets[-1] + -(-len(rows) // pad_to) * pad_to)
    dest = [-1] * len(flat)
    src = [-1] * R.capacity(ids.shape[0], ids.shape[1], e, pad_to)
    for x, rows in enumerate(per):
        for r, i in enumerate(rows):
            dest[i] = offsets[x] + r
            src[offsets[x] + r] = i
    return [len(p) for p in per], offsets, dest, src


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("t,k,e", SHAPES)
@pytest.mark.parametrize("pad_to", (1, 16))
def test_layout_matches_definition(case, t, k, e, pad_to):
    ids = routing(case, t, k, e)
    lay = R.layout(ids, e, pad_to)
    counts, offsets, dest, src = naive_layout(ids, e, pad_to)
    ctx = f"{case=} {t=} {k=} {e=} {pad_to=}"
    assert lay.counts.tolist() == counts, ctx
    assert lay.offsets.tolist() == offsets, ctx
    assert lay.dest.tolist() == dest, ctx
    assert lay.src.tolist() == src, ctx
    assert lay.invalid.tolist() == [0, R.NO_INVALID], ctx
    assert all(a.dtype == np.int32 for a in (lay.counts, lay.offsets, lay.dest, lay.src))


@pytest.mark.parametrize("case", CASES)
def test_layout_invariants_large_t(case):
    t, k, e, pad_to = 200_000, 8, 256, 8
    ids = routing(case, t, k, e)
    lay = R.layout(ids, e, pad_to)
    flat = ids.reshape(-1)
    assert np.array_equal(lay.counts, np.bincount(flat, minlength=e))
    seg = np.diff(lay.offsets)
    assert np.all(seg % pad_to == 0) and np.all(seg >= lay.counts) and np.all(seg - lay.counts < pad_to)
    assert np.array_equal(lay.src[lay.dest], np.arange(flat.size))  # a permutation
    assert np.all(lay.src[lay.total:] == -1) and lay.src.size == t * k + e * (pad_to - 1)
    real = lay.src[: lay.total] >= 0
    assert real.sum() == flat.size
    experts = np.repeat(np.arange(e), seg)
    assert np.array_equal(flat[lay.src[: lay.total][real]], experts[real])  # rows in their segment
    rows = lay.src[: lay.total]
    same = (experts[1:] == experts[:-1]) & real[1:] & real[:-1]
    assert np.all(rows[1:][same] > rows[:-1][same]), "not stable"
    if case == "hot80":
        assert lay.counts[0] >= 0.75 * t


def test_invalid_ids_are_dropped_and_named():
    ids = routing("uniform", 10, 4, 16)
    ids[3, 2] = 16
    ids[7, 0] = -1
    lay = R.layout(ids, 16)
    assert lay.invalid.tolist() == [2, 3 * 4 + 2]
    assert lay.dest[14] == -1 and lay.dest[28] == -1
    assert lay.total == 38 and lay.counts.sum() == 38
    x = np.arange(10 * 8, dtype=np.float16).reshape(10, 8)
    y = R.dispatch(x, lay)
    w = np.ones((10, 4), np.float32)
    out = R.combine(y, lay, w, "float16")
    assert out[3].astype(np.float32).tolist() == (3 * x[3].astype(np.float32)).tolist()


def test_dispatch_reference_rows_and_padding():
    ids = routing("hot80", 33, 2, 8)
    lay = R.layout(ids, 8, pad_to=4)
    x = np.random.default_rng(0).standard_normal((33, 16)).astype(np.float16)
    xp = R.dispatch(x, lay)
    assert xp.shape == (lay.total, 16)
    for r, s in enumerate(lay.src[: lay.total]):
        want = x[s // 2] if s >= 0 else np.zeros(16, np.float16)
        assert np.array_equal(xp[r], want), r
    assert R.dispatch(x, lay, rows=lay.src.size).shape == (lay.src.size, 16)


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("w_dtype", ("float32", "float16", "bfloat16"))
def test_combine_reference_is_the_fixed_order_fp32_sum(dtype, w_dtype):
    rng = np.random.default_rng(1)
    t, k, e, h = 17, 4, 8, 8
    ids = routing("duplicates", t, k, e)
    lay = R.layout(ids, e)
    y = R.from_f32(rng.standard_normal((lay.total, h)).astype(np.float32), dtype)
    w = R.from_f32(rng.random((t, k)).astype(np.float32), w_dtype)
    out = R.combine(y, lay, w, dtype, w_dtype)
    yf, wf = R.to_f32(y, dtype), R.to_f32(w, w_dtype)
    for tok in range(t):  # scalar fp32 loop: the order the kernel uses
        acc = np.zeros(h, np.float32)
        for j in range(k):
            acc = (acc + np.float32(wf[tok, j]) * yf[lay.dest[tok * k + j]]).astype(np.float32)
        assert np.array_equal(out[tok], R.from_f32(acc, dtype)), tok
    ref64 = sum(wf[:, j : j + 1].astype(np.float64) * yf[lay.dest.reshape(t, k)[:, j]] for j in range(k))
    assert np.max(np.abs(R.to_f32(out, dtype) - ref64)) <= 0.02 * np.max(np.abs(ref64))


def test_configs_check_their_fields():
    with pytest.raises(UnsupportedConfigError, match="id_dtype"):
        MoeLayoutConfig(arch="sm_90a", id_dtype="int16")
    with pytest.raises(UnsupportedConfigError, match="warps"):
        MoeLayoutConfig(arch="sm_90a", warps=12)
    with pytest.raises(UnsupportedConfigError, match="w_dtype"):
        MoeCombineConfig(arch="sm_90a", w_dtype="float64")
    with pytest.raises(UnsupportedConfigError, match="dtype"):
        MoeCombineConfig(arch="sm_90a", dtype="float32")
    with pytest.raises(UnsupportedConfigError, match="arch"):
        MoeDispatchConfig(arch="sm_75")
    for w in (4, 8, 16, 32):  # the largest E a warps bucket serves fits the default 48 KB
        assert layout_smem(w, HIST_INTS // w) <= 48 * 1024
    with pytest.raises(UnsupportedConfigError, match="id_dtype"):
        MoeRouteConfig(arch="sm_90a", id_dtype="uint8")
    assert MoeRouteConfig(arch="sm_90a").smem_bytes() <= 48 * 1024


def test_planner():
    assert warps_for(8) == 32 and warps_for(256) == 32 and warps_for(257) == 16
    assert warps_for(1024) == 8 and warps_for(MAX_EXPERTS) == 4
    with pytest.raises(ValueError, match="num_experts"):
        warps_for(MAX_EXPERTS + 1)
    with pytest.raises(ValueError, match="num_experts"):
        warps_for(0)
    p = plan_layout("sm_90a", 512, 256, "int32")  # SINGLE_WARPS: 8 up to 2048 pairs
    assert not p.multi and p.blocks == 1 and p.config.warps == 8
    assert plan_layout("sm_90a", 2049, 256, "int32").config.warps == 16
    assert plan_layout("sm_90a", SINGLE_MAX, 1024, "int32").config.warps == 8  # E caps it
    assert plan_layout("sm_90a", 100, 2048, "int32").config.warps == 4
    assert plan_layout("sm_90a", SINGLE_MAX + 1, 256, "int32").config.warps == 32  # multi
    p = plan_layout("sm_90a", SINGLE_MAX + 1, 128, "int64")
    assert p.multi and p.blocks == -(-(SINGLE_MAX + 1) // CHUNK) and p.chunk == CHUNK
    assert plan_layout("sm_90a", 100, 8, "int32", multi=True).blocks == 1
    assert plan_layout("sm_90a", 512, 256, "int32", warps=4).config.warps == 4
    with pytest.raises(ValueError, match="warps=32"):
        plan_layout("sm_90a", 512, 257, "int32", warps=32)
    with pytest.raises(ValueError, match="warps=12"):
        plan_layout("sm_90a", 512, 8, "int32", warps=12)
    r = plan_route("sm_90a", 512, 256, "int32", 132)
    assert (r.pairs_per_cta, r.side, r.ctas) == (1, 1, 513) and r.smem <= r.config.smem_bytes()
    r = plan_route("sm_90a", FUSED_MAX, 2048, "int64", 132, pad_to=16)
    assert (r.pairs_per_cta, r.side, r.ctas) == (4, 132, 132 + FUSED_MAX // 4)
    assert plan_route("sm_90a", 1024, 256, "int32", 132).pairs_per_cta == 2  # T = 128, top-8
    assert r.smem <= r.config.smem_bytes()
    assert plan_route("sm_90a", 64, 8, "int32", 132, pad_to=4).side == 8  # a layout CTA an expert
    assert plan_route("sm_90a", FUSED_MAX, 8, "int32", 16).pairs_per_cta == ROUTE_MAX_CTA_PAIRS
    assert plan_route("sm_90a", 100, 8, "int32", 132, pairs_per_cta=3).ctas == 1 + 34
    assert plan_route("sm_90a", 0, 8, "int32", 132).ctas == 1
    with pytest.raises(ValueError, match="at most"):
        plan_route("sm_90a", FUSED_MAX + 1, 8, "int32", 132)
    with pytest.raises(ValueError, match="pairs_per_cta=9"):
        plan_route("sm_90a", 100, 8, "int32", 132, pairs_per_cta=9)
    for bad in ("2", [2], 1.5):  # moe_route hands it over as given: was TypeError / a float split
        with pytest.raises(ValueError, match=r"pairs_per_cta=.*: must be an int in 1\.\.8"):
            plan_route("sm_90a", 100, 8, "int32", 132, pairs_per_cta=bad)
    assert combine_launch(1, 896, 132) == (True, (1, 7, 1))  # T = 1, H = 7168 bf16
    assert combine_launch(16, 896, 132) == (True, (16, 7, 1))  # one wave: columns split
    assert combine_launch(64, 896, 132) == (True, (64, 7, 1))
    assert combine_launch(512, 896, 132) == (True, (512, 7, 1))
    assert combine_launch(4096, 896, 132) == (False, (132 * 16, 1, 1))  # past 4 waves: a CTA a token
    assert combine_launch(10**6, 512, 132) == (False, (132 * 16, 1, 1))
    assert move_grid(0, 132) == 1 and move_grid(512, 132) == 512 and move_grid(10**7, 132) == 132 * 16


def test_prewarm_set():
    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_120a"):
        cfgs = list(prewarm_configs([arch], {}))
        assert len(cfgs) == len(set(cfgs)) == 23
        assert sum(isinstance(c, MoeLayoutConfig) for c in cfgs) == 8
    spec = {"num_experts": [256], "id_dtypes": ["int32"], "dtypes": ["bfloat16"], "w_dtypes": ["float32"]}
    cfgs = list(prewarm_configs(["sm_90a"], spec))
    assert cfgs == [MoeLayoutConfig(arch="sm_90a", id_dtype="int32", warps=8),
                    MoeLayoutConfig(arch="sm_90a", id_dtype="int32", warps=16),
                    MoeLayoutConfig(arch="sm_90a", id_dtype="int32", warps=32),
                    MoeRouteConfig(arch="sm_90a", id_dtype="int32"),
                    MoeDispatchConfig(arch="sm_90a"),
                    MoeCombineConfig(arch="sm_90a", dtype="bfloat16", w_dtype="float32", split=False),
                    MoeCombineConfig(arch="sm_90a", dtype="bfloat16", w_dtype="float32", split=True)]
    # every layout config the planner picks for E in the spec is prewarmed
    for e in (8, 256, 300, 2048):
        spec = {"num_experts": [e], "id_dtypes": ["int64"]}
        cfgs = set(prewarm_configs(["sm_90a"], spec))
        for n in (0, 1, 512, 2048, 2049, SINGLE_MAX, SINGLE_MAX + 1, 10**6):
            assert plan_layout("sm_90a", n, e, "int64").config in cfgs, (e, n)
    with pytest.raises(UnsupportedConfigError, match="id_dtypes"):
        list(prewarm_configs(["sm_90a"], {"id_dtypes": ["int8"]}))
    for bad in ([None], [[8]], ["x"]):  # a profile's num_experts: was TypeError (None, a list)
        with pytest.raises(UnsupportedConfigError, match=r"num_experts: .*; expected integers in "
                                                         r"1\.\.2048"):
            list(prewarm_configs(["sm_90a"], {"num_experts": bad}))


@pytest.mark.parametrize("t,max_bytes,e,pad_to", [(0, 1 << 20, 8, 1), (1, 1 << 20, 8, 1),
                                                  (3_000_000, 1 << 30, 256, 1),
                                                  (100_000, 64 << 20, 128, 16)])
def test_moe_blocks_cover_the_batch_within_the_budget(t, max_bytes, e, pad_to):
    k, h = 8, 7168
    blocks = list(moe_blocks(t, k, h, max_bytes, num_experts=e, pad_to=pad_to))
    assert [a for a, _ in blocks] == ([0] + [b for _, b in blocks[:-1]] if t else [])
    assert (blocks[-1][1] if blocks else 0) == t
    for a, b in blocks:
        assert b > a
        assert block_bytes(b - a, k, h, num_experts=e, pad_to=pad_to) <= max_bytes
    if len(blocks) > 1:  # not needlessly small
        a, b = blocks[0]
        assert block_bytes(b - a + 1, k, h, num_experts=e, pad_to=pad_to) > 0.99 * max_bytes


def test_moe_blocks_errors():
    with pytest.raises(ValueError, match="holds no token"):
        list(moe_blocks(10, 8, 7168, 1000))
    with pytest.raises(ValueError, match="num_tokens"):
        list(moe_blocks(-1, 8, 7168, 1 << 30))
    # counts that are not ints: were TypeErrors of the arithmetic (1.5 tokens: of range())
    for kw, name in ((dict(num_tokens="10"), "num_tokens='10'"), (dict(num_tokens=1.5), "num_tokens=1.5"),
                     (dict(max_bytes=None), "max_bytes=None"), (dict(pad_to="x"), "pad_to='x'"),
                     (dict(num_experts=[8]), r"num_experts=\[8\]")):
        args = {"num_tokens": 10, "top_k": 8, "hidden": 7168, "max_bytes": 1 << 30, **kw}
        with pytest.raises(ValueError, match=rf"moe_blocks: {name}; expected an int"):
            list(moe_blocks(**args))
    with pytest.raises(ValueError, match="block_bytes: hidden=None; expected an int"):
        block_bytes(10, 8, None)
    assert list(moe_blocks(np.int64(10), 8, 7168, 1 << 30)) == [(0, 10)]  # numpy ints: as before


class _Stream:
    def __init__(self, ptr: int):
        self.ptr, self.synced = ptr, 0

    def synchronize(self) -> None:
        self.synced += 1


class _Ctx:
    kind, device = "cupy", 0

    def __init__(self, stream):
        self.stream = stream

    def empty(self, shape, dtype):
        a = np.zeros(shape, dtype)
        return a, a


def test_layout_host_reads_wait_for_the_build_stream(monkeypatch):
    """total() / check() read offsets[E] after the work of the stream the layout kernels ran
    on (e.g. torch's non-blocking current stream), not only the caller's current one."""
    from kernelgen.moe_routing import api

    build = _Stream(0x1234)
    ids = np.array([[0, 2], [1, 9]], np.int32)  # 9 is out of range for E = 4
    lay, views = api._alloc(_Ctx(build), ids, 2, 2, 4, 1, False, 0)
    assert lay.stream is build and lay.known_total is None
    views[1][:] = [0, 1, 2, 3, 3]  # offsets (expert 3 empty; the bad id is dropped)
    reads = []

    def read(view, stream, device):
        reads.append(stream)
        return np.array(view)

    monkeypatch.setattr(api, "_read", read)
    monkeypatch.setattr(api.MoeLayout, "device", property(lambda self: 0))  # numpy stand-ins
    cur = _Stream(0)
    monkeypatch.setattr(api, "context_of", lambda arr, name: _Ctx(cur))
    assert lay.total() == 3 and lay.known_total == 3
    assert build.synced == 1 and reads == [cur]  # waited for the build stream, read on cur
    assert lay.check() == 3 and build.synced == 2
    monkeypatch.setattr(api, "context_of", lambda arr, name: _Ctx(_Stream(0x1234)))
    lay.total()
    assert build.synced == 2  # same stream: stream order suffices
    views[2][:] = [1, 3]  # invalid: one dropped id, flat index 3 (token 1, slot 1)
    with pytest.raises(ValueError, match=r"token 1 slot 1 names expert 9, outside \[0, 4\)"):
        lay.total()


class _Dev:
    """A stand-in device array: shape, item size and a data pointer (the host-side rules)."""

    def __init__(self, *shape: int, itemsize: int = 2, ptr: int = 0):
        self.shape, self.itemsize = shape, itemsize
        self.data = type("Ptr", (), {"ptr": ptr})()


def test_route_checks_x_before_the_layout(monkeypatch):
    """moe_route's layout + dispatch path (exact=True, or T * top_k past ROUTE_FUSED_MAX)
    checks x before moe_layout launches anything: x's rows, 16-byte rows, alignment."""
    from kernelgen.moe_routing import api

    calls = []
    monkeypatch.setattr(api, "context_of", lambda arr, name: _Ctx(_Stream(0)))
    monkeypatch.setattr(api, "device_array", lambda a, name, ctx, dtypes, hint=None, ndim=None:
                        (a, "int32" if name == "topk_ids" else "float16"))
    monkeypatch.setattr(api, "moe_layout", lambda *a, **kw: calls.append("layout"))
    monkeypatch.setattr(api, "moe_dispatch", lambda *a, **kw: calls.append("dispatch"))
    for t, exact in ((4, True), (600, False)):  # 600 x 2 pairs > ROUTE_FUSED_MAX: not fused
        ids = _Dev(t, 2, itemsize=4)
        api.moe_route(_Dev(t, 64), ids, 8, exact=exact)
        assert calls == ["layout", "dispatch"], (t, exact)
        for x, msg in ((_Dev(t + 1, 64), f"x: {t + 1} rows; topk_ids has {t} tokens"),
                       (_Dev(t, 12), r"x: rows of 12 x 2 B = 24 B; .*H a multiple of 8"),
                       (_Dev(t, 64, ptr=8), "x: data pointer must be 16-byte aligned")):
            calls.clear()
            with pytest.raises(ValueError, match=msg):
                api.moe_route(x, ids, 8, exact=exact)
            assert calls == [], (t, exact, msg)


def test_dispatch_and_combine_take_the_layouts_kind(monkeypatch):
    """A layout of one array kind with x / y_perm of the other is refused (their streams are
    not ordered), before anything reads the layout's views."""
    from kernelgen.moe_routing import api

    ids = np.zeros((2, 2), np.int32)
    lay, _ = api._alloc(_Ctx(_Stream(0)), ids, 2, 2, 4, 1, False, 0)
    assert lay.kind == "cupy"
    torch_ctx = _Ctx(_Stream(0))
    torch_ctx.kind = "torch"
    monkeypatch.setattr(api, "context_of", lambda arr, name: torch_ctx)
    with pytest.raises(ValueError, match=r"x: a torch tensor mixed with cupy arrays \(the layout's"):
        api.moe_dispatch(_Dev(2, 64), lay, exact=False)
    with pytest.raises(ValueError, match=r"y_perm: a torch tensor mixed with cupy arrays \(the "):
        api.moe_combine(_Dev(4, 64), lay, _Dev(2, 2))
    lay_t, _ = api._alloc(torch_ctx, ids, 2, 2, 4, 1, False, 0)
    assert lay_t.kind == "torch"
    monkeypatch.setattr(api, "context_of", lambda arr, name: _Ctx(_Stream(0)))
    with pytest.raises(ValueError, match="x: a cupy array mixed with torch tensors"):
        api.moe_dispatch(_Dev(2, 64), lay_t)


class _Capturing(_Stream):
    def is_capturing(self) -> bool:
        return True


def test_host_read_under_capture_raises_graph_capture_error(monkeypatch):
    """The exact path's offsets[E] read (moe_dispatch(exact=True), fused_moe(graph_safe=False),
    total()) while the read stream or the layout's build stream captures a CUDA graph raises
    GraphCaptureError naming the graph-safe arguments, before any copy or wait; a total read
    already needs no copy and is returned."""
    from kernelgen.errors import GraphCaptureError
    from kernelgen.moe_routing import api

    reads = []
    monkeypatch.setattr(api, "_read", lambda view, stream, device: reads.append(stream))
    ids = np.zeros((2, 2), np.int32)
    for build, read in ((_Stream(0x1234), _Capturing(0x5678)), (_Capturing(0x1234), _Stream(0)),
                        (_Capturing(0x1234), _Capturing(0x1234))):
        lay, _ = api._alloc(_Ctx(build), ids, 2, 2, 4, 1, False, 0)
        with pytest.raises(GraphCaptureError, match=r"exact=False .*graph_safe=True"):
            lay._meta(read)
        assert reads == [] and build.synced == 0 and lay.known_total is None
        lay._host["total"] = 4  # read before the capture: no copy
        assert lay._meta(read) == 4 and reads == []
    assert not api._capturing(_Capturing(0)), "the legacy stream never captures"
