"""mx family on the CPU: configs, launch plans, the prewarm table, MxTensor, argument errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernelgen.arch import ALL_ARCHS, get_arch
from kernelgen.errors import UnsupportedConfigError
from kernelgen.mx import dequantize, quantize_mx, quantize_nvfp4
from kernelgen.mx import reference as R
from kernelgen.mx.config import (
    CLUSTER,
    FUSED_THREADS,
    THREADS,
    MxDequantizeConfig,
    MxQuantizeConfig,
    lane_elems,
    slots_per_thread,
)
from kernelgen.mx.select import (
    BALANCE_MIN_FILL,
    BALANCED_DEFAULT,
    LOOP_GRID,
    PAD_WORDS_PER_THREAD,
    TILED_FORMATS,
    TILED_MIN_ROWS,
    chunk_grid,
    dequantize_plan,
    prewarm_configs,
    quantize_config,
    quantize_plan,
    slot_counts,
)
from kernelgen.mx.tensor import FORMATS, MX_FORMATS, MxTensor, data_shape, elem_bits, scale_shape

DTYPES = ("float16", "bfloat16", "float32")


# -- configs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"fmt": "fp4"}, "fmt='fp4'"),
    ({"dtype": "float64"}, "dtype='float64'"),
    ({"fmt": "mxfp4", "hw_cvt": True}, "hw_cvt"),
    ({"fmt": "mxfp6_e2m3", "wide": True}, "wide is for mxfp8"),
    ({"fmt": "mxfp8_e4m3", "hw_cvt": True, "arch": "sm_80"}, "hw_cvt"),
    ({"fmt": "nvfp4", "dtype": "float32", "h2": True}, "h2"),
    ({"fmt": "mxfp8_e4m3", "h2": True}, "h2"),
    ({"fmt": "mxfp4", "dtype": "float32", "h2": True}, "h2"),
    # loop is `bool | None`, which validate()'s plain-type check skips: 1 / "x" were taken (and
    # 1 keys the cache apart from True)
    ({"loop": 1}, r"loop=1; expected None, True or False"),
    ({"loop": "x"}, r"loop='x'; expected None, True or False"),
])
def test_quantize_config_rejects(kw, match):
    kw = {"arch": "sm_90a", **kw}
    with pytest.raises(UnsupportedConfigError, match=match):
        MxQuantizeConfig(**kw)


def test_dequantize_config_rejects():
    with pytest.raises(UnsupportedConfigError, match="dtype='int8'"):
        MxDequantizeConfig(arch="sm_90a", fmt="mxfp4", dtype="int8")
    with pytest.raises(UnsupportedConfigError, match="plain int|plain str"):
        MxDequantizeConfig(arch="sm_90a", fmt=4, dtype="float16")


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_symbols_follow_arch(arch):
    nv = MxQuantizeConfig(arch=arch, fmt="nvfp4", dtype="float16")
    fused = get_arch(arch).cc >= 90  # clusters need sm_90+
    assert nv.symbols() == ("mx_quantize", "mx_amax") + (("mx_quantize_fused",) if fused else ())
    assert MxQuantizeConfig(arch=arch, fmt="mxfp6_e3m2", dtype="bfloat16").symbols() == \
        ("mx_quantize",)
    assert MxDequantizeConfig(arch=arch, fmt="nvfp4").symbols() == ("mx_dequantize",)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_slot_geometry(fmt, dtype):
    e = lane_elems(fmt)
    bits = R.MX_FORMATS[fmt].bits if fmt in R.MX_FORMATS else 4
    assert bits * e % 32 == 0, "a lane writes whole 32-bit words"
    assert e * {"float16": 2, "bfloat16": 2, "float32": 4}[dtype] % 16 == 0, "16-byte loads"
    group = 16 if fmt == "nvfp4" else 32
    assert group % e == 0 and 4 * (group // e) <= 32, "a 4-group scale word stays in one warp"
    assert slots_per_thread(fmt, dtype) >= 1
    tv = MxQuantizeConfig(arch="sm_90a", fmt=fmt, dtype=dtype).template_vars()
    assert (tv["lane_elems"], tv["group"], tv["nv"]) == (e, group, fmt == "nvfp4")


# -- shapes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows, k", [(1, 32), (3, 96), (130, 320), (257, 64)])
def test_shapes_match_reference(fmt, rows, k):
    x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
    for layout in ("swizzled", "row_major"):
        if fmt == "nvfp4":
            packed, scales, _ = R.quantize_nvfp4(x, scale_layout=layout)
        else:
            packed, scales = R.quantize_mx(x, fmt, scale_layout=layout)
        assert data_shape(fmt, rows, k) == packed.shape
        assert scale_shape(fmt, rows, k, layout) == scales.shape
    with pytest.raises(ValueError, match="scale_layout"):
        scale_shape(fmt, rows, k, "tiled")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows, k", [(1, 32), (130, 96), (256, 4096)])
def test_slot_counts(fmt, rows, k):
    s = k // (16 if fmt == "nvfp4" else 32)
    lanes = (16 if fmt == "nvfp4" else 32) // lane_elems(fmt)
    total, pad = slot_counts(fmt, rows, k, True)
    assert total == rows * (-(-s // 4) * 4) * lanes
    assert pad == (-(-rows // 128) * 128 - rows) * -(-s // 4)
    assert slot_counts(fmt, rows, k, False) == (rows * s * lanes, 0)


# -- launch plans --------------------------------------------------------------------------------
def test_plan_paths():
    for arch, sms in (("sm_90a", 132), ("sm_80", 108)):
        p = quantize_plan(arch, sms, "nvfp4", "float16", 16, 4096, True, "auto")
        assert (p.path, p.amax_grid, p.slots) == ("redundant", 0, 1), p.short()
    p = quantize_plan("sm_80", 108, "nvfp4", "float16", 64, 4096, True, "auto")
    assert p.path == "amax" and 1 <= p.amax_grid <= 4 * 108, "512 KB: too big to re-read"
    p = quantize_plan("sm_90a", 132, "nvfp4", "bfloat16", 4096, 4096, True, "auto")
    assert p.path == "amax" and p.amax_grid == 4 * 132
    for mode in ("value", "device"):
        assert quantize_plan("sm_90a", 132, "nvfp4", "float16", 16, 4096, True, mode).path == \
            "direct"
    assert quantize_plan("sm_90a", 132, "mxfp4", "float16", 16, 4096, True, "value").path == \
        "direct"
    assert "path=redundant" in quantize_plan("sm_90a", 132, "nvfp4", "float16", 1, 64, True,
                                             "auto").short()
    with pytest.raises(ValueError, match="gs_mode"):
        quantize_plan("sm_90a", 132, "nvfp4", "float16", 1, 64, True, "host")


def test_force_small_auto_path():
    from kernelgen.mx.select import force_small_auto_path

    try:
        force_small_auto_path("fused")
        p = quantize_plan("sm_90a", 132, "nvfp4", "bfloat16", 16, 4096, True, "auto")
        assert (p.path, p.grid, p.block, p.slots) == ("fused", CLUSTER, FUSED_THREADS, 1)
        assert quantize_plan("sm_80", 108, "nvfp4", "bfloat16", 16, 4096, True, "auto").path \
            == "amax", "no fused path on sm_80: the forced choice falls back"
        with pytest.raises(ValueError, match="expected None"):
            force_small_auto_path("cluster")
    finally:
        force_small_auto_path(None)
    assert quantize_plan("sm_90a", 132, "nvfp4", "bfloat16", 16, 4096, True, "auto").path == \
        "redundant"


def test_fused_limit():
    """The fused kernel keeps every slot in registers: up to CLUSTER * FUSED_THREADS * slots."""
    from kernelgen.mx.select import force_small_auto_path

    force_small_auto_path("fused")
    try:
        _check_fused_limit()
    finally:
        force_small_auto_path(None)


def _check_fused_limit():
    cap = CLUSTER * FUSED_THREADS * MxQuantizeConfig(arch="sm_90a").fused_slots
    rows = cap // (4096 // lane_elems("nvfp4"))  # no padding columns at K=4096
    p = quantize_plan("sm_90a", 132, "nvfp4", "float16", rows, 4096, True, "auto")
    assert (p.path, p.slots) == ("fused", MxQuantizeConfig(arch="sm_90a").fused_slots)
    assert quantize_plan("sm_90a", 132, "nvfp4", "float16", rows + 1, 4096, True, "auto").path \
        == "amax"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, swizzled", [(1, 4096, True), (1, 64, False), (130, 96, True),
                                               (16384, 4096, True), (3, 1 << 16, True)])
def test_direct_grid_covers_every_slot_and_padding_word(fmt, dtype, rows, k, swizzled):
    p = quantize_plan("sm_90a", 132, fmt, dtype, rows, k, swizzled, "value")
    total, pad = slot_counts(fmt, rows, k, swizzled, p.config.lane_elems)
    full = slots_per_thread(fmt, dtype, p.config.lane_elems)
    slots = full if -(-total // (THREADS * full)) >= 2 * 132 else 1
    per_sm, loop_slots = LOOP_GRID.get(elem_bits(fmt), (0, 0)) if p.config.loops else (0, 0)
    capped = per_sm and -(-total // (THREADS * slots)) > 132 * per_sm
    assert p.slots == (min(loop_slots or slots, slots) if capped else slots), p.short()
    per_block = THREADS * p.slots
    chunks = -(-total // per_block)
    assert p.path == "direct" and p.block == THREADS
    assert p.grid * THREADS * PAD_WORDS_PER_THREAD >= pad, p.short()
    if not capped:  # a block a chunk
        assert p.grid == max(1, chunks, -(-pad // (THREADS * PAD_WORDS_PER_THREAD))), p.short()
    else:  # the capped grid, each block looping over chunks
        assert p.grid == chunk_grid(chunks, 132, per_sm, BALANCED_DEFAULT) and \
            chunks > p.grid, p.short()
    # fp4 / fp6 loop, but not in sector order (TILED_FORMATS: a block a chunk, no loop)
    assert p.config.loops == (elem_bits(fmt) != 8 and not p.tiled), p.short()
    assert p.tiled == (fmt in TILED_FORMATS and rows >= TILED_MIN_ROWS and swizzled), p.short()
    assert p.config.wide == (elem_bits(fmt) == 8)
    assert chunk_grid(10**6, 132, 0) == 10**6 and chunk_grid(0, 132, 3) == 1
    assert chunk_grid(396, 132, 3) == 396 and chunk_grid(397, 132, 3) == 396
    d = dequantize_plan("sm_90a", fmt, dtype, rows, k)
    assert d.grid * d.block * d.config.template_vars()["slots"] >= rows * k // lane_elems(fmt)


def test_too_large_rejected():
    with pytest.raises(ValueError, match="2\\*\\*31"):
        quantize_plan("sm_90a", 132, "mxfp4", "float16", 1 << 20, 1 << 15, False, "value")
    with pytest.raises(ValueError, match="2\\*\\*31"):
        dequantize_plan("sm_90a", "mxfp4", "float16", 1 << 20, 1 << 15)


# -- prewarm -------------------------------------------------------------------------------------
def test_prewarm_table():
    for arch in ALL_ARCHS:
        cfgs = list(prewarm_configs([arch], {}))
        assert len(cfgs) == len(set(cfgs)) <= 48, f"{arch}: {len(cfgs)} configs"
        q = {(c.fmt, c.dtype) for c in cfgs if isinstance(c, MxQuantizeConfig)}
        d = {(c.fmt, c.dtype) for c in cfgs if isinstance(c, MxDequantizeConfig)}
        assert q == d == {(f, dt) for f in FORMATS for dt in DTYPES}
        # a looping format of TILED_FORMATS: also its config without the loop (sector order)
        unlooped = {(c.fmt, c.dtype) for c in cfgs
                    if isinstance(c, MxQuantizeConfig) and c.loop is False}
        assert unlooped == {(f, dt) for f in TILED_FORMATS if elem_bits(f) != 8 for dt in DTYPES}
        for c in cfgs:
            if isinstance(c, MxQuantizeConfig):
                base = quantize_config(arch, c.fmt, c.dtype)
                assert c in (base, replace(base, loop=False)), "prewarm = dispatch"
                assert c.hw_cvt == (c.fmt.startswith("mxfp8") and get_arch(arch).cc >= 90), c.short()
        # every plan's config is one of them
        for fmt in FORMATS:
            for m, k, sw in ((16, 4096, True), (4096, 4096, True), (4096, 4096, False)):
                assert quantize_plan(arch, 132, fmt, "bfloat16", m, k, sw, "value").config in cfgs
    narrow = list(prewarm_configs(["sm_90a"], {"fmts": ["nvfp4"], "dtypes": ["bfloat16", "int4"]}))
    assert {(type(c).__name__, c.fmt, c.dtype) for c in narrow} == {
        ("MxQuantizeConfig", "nvfp4", "bfloat16"), ("MxDequantizeConfig", "nvfp4", "bfloat16")}


# -- MxTensor ------------------------------------------------------------------------------------
def _tensor(fmt="mxfp4", rows=3, k=64, layout="swizzled", **kw):
    fields = {"data": np.zeros(data_shape(fmt, rows, k), np.uint8),
              "scales": np.zeros(scale_shape(fmt, rows, k, layout), np.uint8),
              "global_scale": np.ones(1, np.float32) if fmt == "nvfp4" else None}
    fields.update(kw)
    return MxTensor(fmt, (rows, k), scale_layout=layout, **fields)


def test_mx_tensor_check():
    for fmt in FORMATS:
        for layout in ("swizzled", "row_major"):
            t = _tensor(fmt, layout=layout)
            t.check()
            assert (t.rows, t.k, t.group) == (3, 64, 16 if fmt == "nvfp4" else 32)
    with pytest.raises(ValueError, match="data has shape"):
        _tensor(data=np.zeros((3, 31), np.uint8)).check()
    with pytest.raises(ValueError, match="scales have shape"):
        _tensor(scales=np.zeros((3, 2), np.uint8)).check()
    with pytest.raises(ValueError, match="global_scale"):
        _tensor("nvfp4", global_scale=None).check()
    with pytest.raises(ValueError, match="global_scale"):
        _tensor("mxfp8_e5m2", global_scale=np.ones(1, np.float32)).check()
    with pytest.raises(ValueError, match="multiple of 32"):
        MxTensor("mxfp4", (3, 48), np.zeros((3, 24), np.uint8), None, "row_major").check()
    assert "mxfp4" in repr(_tensor())


# -- argument errors raised before any device work -------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: quantize_mx(np.zeros((1, 32), np.float16), "mxfp4"), "NumPy arrays live on the host"),
    (lambda: quantize_mx(None, "nvfp4"), "quantize_nvfp4"),
    (lambda: quantize_mx(None, "mxfp5"), "fmt='mxfp5'"),
    (lambda: quantize_mx(None, "mxfp4", scale_layout="tiled"), "scale_layout='tiled'"),
    (lambda: quantize_nvfp4(None, scale_layout="col_major"), "scale_layout='col_major'"),
    (lambda: dequantize("not a tensor"), "expected an MxTensor"),
    (lambda: dequantize(_tensor(), "float64"), "dtype='float64'"),
])
def test_argument_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("gs", [0.0, -1.0, float("inf"), float("nan"), 1e39])
def test_global_scale_must_be_positive_finite_fp32(gs):
    from kernelgen.core.interop import Ctx
    from kernelgen.mx.api import _global_scale

    with pytest.raises(ValueError, match="positive finite fp32"):
        _global_scale(gs, Ctx("cupy", 0, None))
    assert _global_scale(2688.0 / 3, Ctx("cupy", 0, None))[:1] == ("value",)
    assert _global_scale(None, Ctx("cupy", 0, None))[0] == "auto"


def test_mx_formats_listed():
    assert set(MX_FORMATS) == set(R.MX_FORMATS) and set(FORMATS) == set(R.MX_FORMATS) | {"nvfp4"}


# -- the kernels' slot mapping, emulated from the launch plan --------------------------------------
def _slot_indices(plan, total):
    """Slot index of every (thread, slot) the launch runs, as mx.cuh computes it."""
    if plan.path == "fused":
        tid = np.arange(plan.grid * plan.block)
        u_count = -(-total // (plan.grid * plan.block))
        return (np.arange(u_count)[:, None] * plan.grid * plan.block + tid[None, :]).ravel()
    chunk = plan.slots * plan.block
    loops = -(-total // (plan.grid * chunk))  # a block's chunks b + i * grid
    i, b, u, t = np.meshgrid(np.arange(loops), np.arange(plan.grid), np.arange(plan.slots),
                             np.arange(plan.block), indexing="ij")
    return (((i * plan.grid + b) * plan.slots + u) * plan.block + t).ravel()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt, rows, k", [
    (f, r, k) for f in FORMATS
    for r, k in ((1, 64), (16, 4096), (130, 96), (257, 320), (3, 16), (300, 4096))
    if k % (16 if f == "nvfp4" else 32) == 0])
@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
def test_plan_writes_every_byte_once(fmt, dtype, rows, k, layout):
    """Every packed byte and every scale byte (padding included) is written by exactly one lane,
    and the 4 groups of a swizzled scale word sit in 4L lanes of one warp, one row."""
    from kernelgen.mx.select import force_blocks_per_sm, force_small_auto_path, force_wide_fp8

    group = 16 if fmt == "nvfp4" else 32
    bits = data_shape(fmt, 1, 8)[1]  # bytes per 8 elements = bits
    swz = layout == "swizzled"
    s, kt = k // group, -(-(k // group) // 4)
    # 2 SMs: the direct grid's blocks loop over several chunks at (300, 4096); MXFP8 with
    # 16-element lanes too
    # blocks: a forced grid cap (1 an SM; fp8 loops then too)
    variants = [(None, 132, None, None), (None, 2, None, None), (None, 3, None, 1)]
    variants += [("fused", 132, None, None)] if fmt == "nvfp4" else []
    variants += [(None, 132, True, None)] if fmt.startswith("mxfp8") else []
    for small, sms, wide, blocks in variants:
        force_small_auto_path(small)
        force_wide_fp8(wide)
        force_blocks_per_sm(blocks)
        try:
            plan = quantize_plan("sm_90a", sms, fmt, dtype, rows, k, swz,
                                 "auto" if fmt == "nvfp4" else "value")
        finally:
            force_small_auto_path(None)
            force_wide_fp8(None)
            force_blocks_per_sm(None)
        assert plan.config.loops == (blocks is not None or elem_bits(fmt) != 8), plan.short()
        assert not plan.tiled, plan.short()  # this replays the plain order (rows < TILED_MIN_ROWS)
        e = plan.config.lane_elems
        lanes = group // e
        total, pad_words = slot_counts(fmt, rows, k, swz, e)
        spr = (4 * kt if swz else s) * lanes
        idx = _slot_indices(plan, total)
        idx = idx[idx < total]
        assert np.unique(idx).size == total, f"{plan.short()}: slots missed or repeated"
        row, j = idx // spr, idx % spr
        col = j * e
        # packed data: E * bits / 8 bytes per live lane
        live = col < k
        start = row[live] * (k * bits // 8) + col[live] * bits // 8
        cover = np.zeros(rows * k * bits // 8, np.int64)
        np.add.at(cover, (start[:, None] + np.arange(e * bits // 8)[None, :]).ravel(), 1)
        assert np.all(cover == 1), f"{plan.short()}: data bytes written {set(cover.tolist())}"
        g = j // lanes
        if swz:
            lead = j % (4 * lanes) == 0
            # the xor partners (L, 2L) of a leader stay in its warp and its row
            assert np.array_equal(lead, (idx % 32) % (4 * lanes) == 0)
            r, c = row[lead], g[lead]
            off = ((r // 128) * kt + c // 4) * 512 + (r % 32) * 16 + (r // 32 % 4) * 4
            pr = rows + np.arange(pad_words) // kt
            pq = np.arange(pad_words) % kt
            poff = ((pr // 128) * kt + pq) * 512 + (pr % 32) * 16 + (pr // 32 % 4) * 4
            cover = np.zeros(int(np.prod(scale_shape(fmt, rows, k, layout))), np.int64)
            np.add.at(cover, (np.concatenate([off, poff])[:, None] + np.arange(4)).ravel(), 1)
        else:
            lead = j % lanes == 0
            cover = np.zeros(rows * s, np.int64)
            np.add.at(cover, row[lead] * s + g[lead], 1)
        assert np.all(cover == 1), f"{plan.short()}: scale bytes written {set(cover.tolist())}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, k, blocks, slots", [
    (100, 1024, None, 8), (100, 1024, None, None), (1500, 2048, None, 8), (600, 4096, None, None),
    (1500, 2048, 1, 8), (1500, 2048, 1, 1), (4096, 4096, None, None)])
def test_sector_order_writes_every_byte_once(fmt, dtype, rows, k, blocks, slots):
    """Sector order (scale mode 2), replayed as mx.cuh computes it (Tiling, load_tiled, the
    stage index of quantize_slots, flush_tiled; slots 8: the config's U, forced): every packed byte of the input rows is written
    once; every staged scale byte lands, through its chunk's whole-sector stores, on its own
    swizzled offset; the flushes cover every scale byte, padding rows included, exactly once."""
    from kernelgen.mx.select import force_blocks_per_sm, force_tiled

    force_tiled(True)
    force_blocks_per_sm(blocks, slots)
    try:
        p = quantize_plan("sm_90a", 132, fmt, dtype, rows, k, True, "value")
    finally:
        force_tiled(None)
        force_blocks_per_sm(None)
    if p.config.loops or p.slots != p.config.slots:  # looping blocks, or fewer slots a thread
        assert p.scale_mode == 1, p.short()  # than the kernel's U: the plain order
        return
    assert p.tiled and p.scale_mode == 2, p.short()
    e, group = p.config.lane_elems, (16 if fmt == "nvfp4" else 32)
    lanes, bits = group // e, data_shape(fmt, 1, 8)[1]
    spc = THREADS * p.slots // 8
    ncb = k // e // spc
    chunks = -(-rows // 128) * 16 * ncb
    assert p.grid == chunks, p.short()  # a block a chunk
    c = np.arange(chunks)[:, None]  # chunk x thread-slot (u * THREADS + tid)
    s = np.arange(p.slots * THREADS)[None, :]
    t, cb = c // ncb, c % ncb
    row0, j0 = (t >> 4) * 128 + (t & 15) * 2, cb * spc
    r = s // spc
    row, j = row0 + (r & 1) + 32 * (r >> 1), j0 + s % spc
    assert np.all(s // 32 // (spc // 32) == r), "a warp's 32 slots stay in one chunk row"
    ok = row < rows
    start = row[ok] * (k * bits // 8) + j[ok] * e * bits // 8
    cover = np.zeros(rows * k * bits // 8, np.int64)
    np.add.at(cover, (start[:, None] + np.arange(e * bits // 8)[None, :]).ravel(), 1)
    assert np.all(cover == 1), f"{p.short()}: data bytes written {set(cover.tolist())}"
    # stage byte of each leader lane's word (4 groups), then where the flush puts that byte
    lead = j % (4 * lanes) == 0
    rl, jl = np.broadcast_to(row, lead.shape)[lead], j[lead]
    cl = np.broadcast_to(c, lead.shape)[lead]
    word = ((jl % spc) // (4 * lanes)) * 8 + (rl & 1) * 4 + ((rl >> 5) & 3)
    nq = spc // (4 * lanes)
    assert word.max() < 8 * nq  # inside the chunk's stage of nq sectors
    tl, cbl = cl // ncb, cl % ncb
    half = word // 4  # the flushing thread
    q = cbl * spc // (4 * lanes) + half // 2
    sc = k // group  # scale columns (a multiple of 4: no padding columns)
    dst = R.swizzled_offset((tl >> 4) * 128 + (tl & 15) * 2 + (half & 1), 4 * q, sc) + (word % 4) * 4
    g = jl // lanes
    assert np.array_equal(dst, R.swizzled_offset(rl, g, sc)), "stage -> swizzled offset"
    # the flushes of all chunks: 2 nq 16-byte stores each, every scale byte exactly once
    th = np.arange(2 * nq)[None, :]
    t2, cb2 = c // ncb, c % ncb
    off = R.swizzled_offset((t2 >> 4) * 128 + (t2 & 15) * 2 + (th & 1),
                            4 * (cb2 * nq + th // 2), sc)
    cover = np.zeros(int(np.prod(scale_shape(fmt, rows, k, "swizzled"))), np.int64)
    np.add.at(cover, (off.ravel()[:, None] + np.arange(16)[None, :]).ravel(), 1)
    assert np.all(cover == 1), f"{p.short()}: scale bytes written {set(cover.tolist())}"


def test_sector_order_plan():
    """Sector order where TILED_FORMATS / TILED_MIN_ROWS and the shape allow it, a block a
    chunk (a looping format's config without its loop); never for row-major scales, a forced
    grid cap, padding columns or a slot count not a power of 2."""
    from kernelgen.mx.select import force_blocks_per_sm, force_tiled, tiled_applies

    for fmt in FORMATS:
        big = quantize_plan("sm_90a", 132, fmt, "float16", 4096, 4096, True, "value")
        assert big.tiled == (fmt in TILED_FORMATS), big.short()
        # K = 8192: full slots a thread at these rows, so only TILED_MIN_ROWS decides
        at_min = quantize_plan("sm_90a", 132, fmt, "float16", TILED_MIN_ROWS, 8192, True, "value")
        assert at_min.tiled == (fmt in TILED_FORMATS), at_min.short()
        small = quantize_plan("sm_90a", 132, fmt, "float16", TILED_MIN_ROWS - 1, 8192, True,
                              "value")
        assert not small.tiled and small.scale_mode == 1, small.short()
        if fmt in TILED_FORMATS and not small.config.loops:  # rejected for its rows, not its slots
            assert small.slots == small.config.slots, small.short()
        # sector order drops a looping format's loop; elsewhere it loops
        assert big.config.loops == (elem_bits(fmt) != 8 and not big.tiled), big.short()
        assert small.config.loops == (elem_bits(fmt) != 8), small.short()
        assert quantize_plan("sm_90a", 132, fmt, "float16", 4096, 4096, False, "value"
                             ).scale_mode == 0
    p = quantize_plan("sm_90a", 132, "mxfp8_e5m2", "float16", 4096, 4096, True, "value")
    assert p.grid == 32 * 16 * (4096 // p.config.lane_elems // (THREADS * p.slots // 8)) and \
        "tiled" in p.short()
    assert not tiled_applies("nvfp4", 4096, 4096 + 16, 16, 2)  # padding columns
    assert not tiled_applies("nvfp4", 4096, 4096 + 512, 16, 2)  # chunk rows of 64 slots: no
    assert tiled_applies("nvfp4", 4096, 4096 + 512, 16, 1)  # ... of 32: yes
    assert not tiled_applies("nvfp4", 4096, 4096, 16, 3)  # not a power of two
    force_tiled(False)
    try:
        assert quantize_plan("sm_90a", 132, "mxfp8_e4m3", "float16", 4096, 4096, True, "value"
                             ).scale_mode == 1
        force_tiled(True)
        assert quantize_plan("sm_90a", 132, "mxfp8_e4m3", "float16", 600, 4096, True,
                             "value").tiled
        assert not quantize_plan("sm_90a", 132, "mxfp8_e4m3", "float16", 600, 4096 + 32, True,
                                 "value").tiled  # padding columns: the plain order
        # forced: NVFP4 too, without its loop (a block a chunk)
        p = quantize_plan("sm_90a", 132, "nvfp4", "float16", 4096, 4096, True, "value")
        assert p.tiled and p.config.loop is False and p.grid == 2048, p.short()
        force_blocks_per_sm(2)  # a forced grid cap keeps the loop and the plain order
        assert not quantize_plan("sm_90a", 132, "mxfp4", "float16", 4096, 4096, True,
                                 "value").tiled
    finally:
        force_tiled(None)
        force_blocks_per_sm(None)
    with pytest.raises(ValueError, match="on="):
        force_tiled("yes")


def _e2m1_scaled(codes, q1, q3, slow):
    """mx.cuh e2m1_scaled in NumPy: inside [2^-124, 2^124] each element is q1 or q3 (per slot)
    with 2^-1..2^2 set in its exponent field (bits), else `slow`. codes [..., 16]."""
    j = (codes & 7).astype(np.uint32)
    e2 = j >> 1
    base = np.where(((j & 1) == 1) & (e2 > 0), q3[..., None], q1[..., None]).view(np.uint32)
    mag = np.where(j > 0, base + ((e2 - 1) << 23).astype(np.uint32), 0).astype(np.uint32)
    fast = (mag | ((codes.astype(np.uint32) & 8) << 28)).view(np.float32)
    ok = ((q1 >= np.float32(2.0 ** -124)) & (q3 <= np.float32(2.0 ** 124)))[..., None]
    return np.where(ok, fast, slow), ok


def _nvfp4_dequant_fast(codes, sf, gs):
    """mx.cuh dequantize's NVFP4 path in NumPy fp32: per slot q1 = RN(sfv / gs), q3 = RN(1.5 sfv /
    gs), then e2m1_scaled, else the division an element. sf [...] E4M3 bytes."""
    sfv = R.decode(sf, R.E4M3).astype(np.float32)
    gs = np.float32(gs)
    with np.errstate(all="ignore"):
        q1, q3 = sfv / gs, (np.float32(1.5) * sfv) / gs
        slow = (R.decode(codes, R.E2M1).astype(np.float32) * sfv[..., None]) / gs
    return _e2m1_scaled(codes, q1, q3, slow)


@pytest.mark.parametrize("gs", [1.0, 300.0, 2688.0 / 4.5, 1e-3, 3.7e-30, 5e-37, 1e-45, 2.5e30,
                                3e36, 3.4e38, float("inf"), 0.0, -2.0, float("nan")])
def test_nvfp4_dequantize_two_divisions_a_slot_is_exact(gs):
    """The kernel's NVFP4 dequantize (two divisions a slot, exponent-field scaling) equals the
    reference RN(e2m1 * e4m3 / gs) bit for bit: every scale byte x every code, at global scales
    from ordinary to ones that push q1 / q3 out of the fast range (and non-finite / zero)."""
    sf = np.arange(256, dtype=np.uint8)
    codes = np.broadcast_to(np.arange(16, dtype=np.uint8), (256, 16))
    got, ok = _nvfp4_dequant_fast(codes, sf, gs)
    with np.errstate(all="ignore"):
        want = (R.decode(codes, R.E2M1) * R.decode(sf, R.E4M3)[:, None]).astype(np.float32) / \
            np.float32(gs)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), gs
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), gs
    if gs in (1.0, 300.0, 2688.0 / 4.5):  # ordinary scales: every finite non-zero byte is fast
        finite = ~np.isnan(R.decode(sf, R.E4M3)) & (R.decode(sf, R.E4M3) > 0)
        assert ok[finite].all()


def test_mxfp4_dequantize_exponent_field_scaling_is_exact():
    """The same scaling for MXFP4 (q1 = the E8M0 scale, q3 = 1.5 q1; outside [2^-124, 2^124] and
    for NaN the multiply an element) equals decode(code) * scale for every scale byte and code."""
    sbytes = np.arange(256, dtype=np.uint32)
    sc = np.where(sbytes == 0xFF, np.uint32(0x7FC00000),
                  np.where(sbytes == 0, np.uint32(0x00400000), sbytes << 23)).astype(
                      np.uint32).view(np.float32)
    codes = np.broadcast_to(np.arange(16, dtype=np.uint8), (256, 16))
    with np.errstate(all="ignore"):
        want = R.decode(codes, R.E2M1) * sc[:, None]
        got, ok = _e2m1_scaled(codes, sc, np.float32(1.5) * sc, want)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert ok[3:251].all() and not ok[:3].any() and not ok[251:].any()  # 2^-124 .. 1.5 x 2^123


def test_dequantize_out_is_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        dequantize(_tensor(), "float32", np.empty((3, 64), np.float32))


# -- zero rows: an empty MxTensor, nothing planned or launched ------------------------------------
class _HostCtx:
    """Ctx stand-in: new arrays are host arrays (zero-row results only allocate)."""

    kind, device, stream = "cupy", 0, None

    def empty(self, shape, dtype):
        a = np.empty(shape, dtype)
        return a, a


@pytest.fixture
def zero_rows(monkeypatch):
    """quantize_* without a GPU, on a fake zero-row cupy input; a plan / kernel fails the test;
    returns the calls made to the global-scale writer."""
    import kernelgen.mx.api as api

    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(api, "context_of", lambda x, name: _HostCtx())
    monkeypatch.setattr(api, "device_array", lambda x, name, ctx, dtypes, hint=None: (x, "float16"))

    def fail(*a, **k):
        raise AssertionError("zero rows must not plan or launch")

    for name in ("device_info", "get_kernel", "quantize_plan"):
        monkeypatch.setattr(api, name, fail)
    calls = []
    monkeypatch.setattr(api, "_set_global_scale", lambda ctx, v, mode, view, val: calls.append(
        (v.shape, mode, val)))
    mem = cupy.cuda.UnownedMemory(1 << 30, 1, None, 0)
    return lambda shape: cupy.ndarray(shape, np.float16, cupy.cuda.MemoryPointer(mem, 0)), calls


@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64)])
def test_quantize_zero_rows(zero_rows, shape, layout):
    make, calls = zero_rows
    for fmt in MX_FORMATS:
        t = quantize_mx(make(shape), fmt, scale_layout=layout)
        assert (t.fmt, t.shape, t.global_scale) == (fmt, (0, 64), None)
        assert t.data.shape == data_shape(fmt, 0, 64) == (0, 64 * t.bits // 8)
        assert t.scales.shape == scale_shape(fmt, 0, 64, layout) and t.scales.size == 0
    for gs, mode in ((None, "auto"), (448.0, "value")):
        t = quantize_nvfp4(make(shape), gs, scale_layout=layout)
        assert t.shape == (0, 64) and t.data.shape == (0, 32) and t.scales.size == 0
        assert t.global_scale.shape == (1,) and calls[-1] == ((1,), mode, gs or 1.0)
    with pytest.raises(ValueError, match="K=48 .*positive multiple of 32"):
        quantize_mx(make((0, 48)), "mxfp4")
    with pytest.raises(ValueError, match="K=0 .*positive multiple of 16"):
        quantize_nvfp4(make((4, 0)))
    with pytest.raises(AssertionError, match="must not plan"):  # control: one row plans
        quantize_mx(make((1, 64)), "mxfp4")


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_h2_encoders_where_they_apply(arch):
    """The packed 16-bit encoders: fp4 / fp6 (NVFP4 included) with fp16 / bf16 inputs by
    default, off when forced off, never for fp8 / fp32."""
    from kernelgen.mx.config import H2_DEFAULT
    from kernelgen.mx.select import force_h2

    for fmt in FORMATS:
        for dt in DTYPES:
            want = H2_DEFAULT and elem_bits(fmt) != 8 and dt != "float32"
            assert quantize_config(arch, fmt, dt).h2 == want, (fmt, dt)
    force_h2(False)
    try:
        assert not quantize_config(arch, "mxfp4", "float16").h2
        assert not quantize_plan(arch, 132, "mxfp4", "bfloat16", 64, 256, True, "value").config.h2
    finally:
        force_h2(None)
    with pytest.raises(ValueError, match="h2="):
        force_h2("on")


def test_linear_knob():
    from kernelgen.mx.select import force_linear

    assert quantize_config("sm_90a", "mxfp4", "float16").linear
    force_linear(False)
    try:
        assert not quantize_plan("sm_90a", 132, "nvfp4", "float16", 64, 256, True,
                                 "value").config.linear
    finally:
        force_linear(True)
    with pytest.raises(ValueError, match="on="):
        force_linear(None)


def test_scale_bytes_must_fit_32_bit_offsets():
    """The quantize kernels address scale bytes in 32 bits: a launch whose (padded) scale tensor
    reaches 2**31 bytes is refused, even when its slots fit."""
    with pytest.raises(ValueError, match="scale bytes"):
        quantize_plan("sm_90a", 132, "mxfp8_e4m3", "float16", 1, 2**30 - 2**25, True, "value")
    quantize_plan("sm_90a", 132, "mxfp8_e4m3", "float16", 1, 2**25, True, "value")


def test_short_loop_grid():
    """NVFP4 loops at LOOP_GRID_SHORT (3 blocks an SM, 1 slot a thread) while its chunks at one
    slot take SHORT_ROUNDS rounds of that grid, else at LOOP_GRID; a forced cap and the other
    formats ignore it."""
    from kernelgen.mx.select import LOOP_GRID_SHORT, SHORT_ROUNDS, force_blocks_per_sm

    assert LOOP_GRID_SHORT == {"nvfp4": (3, 1)} and SHORT_ROUNDS == (1.5, 12)
    # 768 rows: 384 chunks of full slots, one wave of 3 blocks an SM (not LOOP_GRID's 264)
    p = quantize_plan("sm_90a", 132, "nvfp4", "float16", 768, 4096, True, "value")
    assert p.grid == 384 and p.slots == p.config.slots, p.short()
    for rows, short in ((512, False), (1024, True), (2048, True), (4096, True), (6144, False),
                        (8192, False)):
        for dtype in ("float16", "bfloat16"):
            p = quantize_plan("sm_90a", 132, "nvfp4", dtype, rows, 4096, True, "value")
            total, pad = slot_counts("nvfp4", rows, 4096, True, p.config.lane_elems)
            rounds = -(-total // THREADS) / (3 * 132)
            assert (SHORT_ROUNDS[0] <= rounds <= SHORT_ROUNDS[1]) == short
            if short:
                assert p.slots == 1 and p.grid == chunk_grid(-(-total // THREADS), 132, 3,
                                                             BALANCED_DEFAULT), p.short()
            else:
                assert p.grid <= 2 * 132, p.short()  # LOOP_GRID's cap (or no loop at all)
    # row-major scales loop the same way; MXFP4 (looping where sector order does not apply) not
    assert quantize_plan("sm_90a", 132, "nvfp4", "float16", 2048, 4096, False, "value").slots == 1
    p = quantize_plan("sm_90a", 132, "mxfp4", "float16", 2048, 4096, False, "value")
    assert p.config.loops and p.grid <= 2 * 132 and p.slots == p.config.slots, p.short()
    force_blocks_per_sm(2)  # a forced cap: 2 blocks an SM, full slots
    try:
        p = quantize_plan("sm_90a", 132, "nvfp4", "float16", 2048, 4096, True, "value")
        chunks = 2048 * 4096 // 16 // (THREADS * p.config.slots)
        assert p.slots == p.config.slots and p.grid == chunk_grid(chunks, 132, 2,
                                                                  BALANCED_DEFAULT), p.short()
    finally:
        force_blocks_per_sm(None)


def test_balanced_grid():
    """Balanced capped grids: where the cap's last round would be at least BALANCE_MIN_FILL
    full, the fewest blocks that keep the rounds (every block the same number of chunks, +0 /
    -1); else the cap. Every slot covered once."""
    from kernelgen.mx.select import force_balanced

    assert BALANCE_MIN_FILL == 0.5
    assert chunk_grid(2048, 132, 2) == 264 and chunk_grid(2048, 132, 2, True) == 256  # 76% full
    assert chunk_grid(1024, 132, 2, True) == 256  # 88% full: 4 rounds of 256
    assert chunk_grid(8192, 132, 2, True) == 264  # last round 3% full: keep the cap
    assert chunk_grid(4096, 132, 3, True) == 396  # 34% full
    assert chunk_grid(200, 132, 2, True) == 200 and chunk_grid(0, 132, 2, True) == 1
    for chunks in range(265, 3000, 7):
        g = chunk_grid(chunks, 132, 2, True)
        rounds = -(-chunks // 264)
        fill = chunks - (rounds - 1) * 264
        assert g <= 264 and -(-chunks // g) == rounds and g * (rounds - 1) < chunks
        assert g == (264 if fill < 132 else -(-chunks // rounds)), (chunks, g)
    force_balanced(True)
    try:
        for fmt in ("mxfp4", "mxfp6_e2m3", "nvfp4"):
            p = quantize_plan("sm_90a", 2, fmt, "float16", 300, 4096, True, "value")
            total, pad = slot_counts(fmt, 300, 4096, True, p.config.lane_elems)
            chunks = -(-total // (THREADS * p.slots))
            assert p.grid == max(chunk_grid(chunks, 2, LOOP_GRID[elem_bits(fmt)][0], True),
                                 -(-pad // (THREADS * PAD_WORDS_PER_THREAD))), p.short()
            force_balanced(False)
            assert quantize_plan("sm_90a", 2, fmt, "float16", 300, 4096, True, "value").grid == \
                max(2 * LOOP_GRID[elem_bits(fmt)][0], -(-pad // (THREADS * PAD_WORDS_PER_THREAD)))
            force_balanced(True)
            idx = _slot_indices(p, total)
            idx = idx[idx < total]
            assert np.unique(idx).size == idx.size == total, p.short()
    finally:
        force_balanced(None)
    with pytest.raises(ValueError, match="on="):
        force_balanced("yes")
