"""mx kernels on the GPU against the NumPy reference: bit-exact packed codes, scale bytes (padding
included), global scale and dequantized values, for every format x input dtype x scale layout.

Outputs are poisoned (KERNELGEN_POISON=1) so an unwritten byte shows as a mismatch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernelgen.kbit.reference import f32_to_bf16
from kernelgen.mx import reference as R
from kernelgen.mx.config import H2_DEFAULT, WIDE_FP8
from kernelgen.mx.tensor import FORMATS, data_shape, scale_shape

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16", "float32")
LAYOUTS = ("swizzled", "row_major")
SHAPES = ((1, 64), (16, 4096), (130, 96), (257, 320), (3, 5, 128))  # last: [..., K] input
H2_FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")  # MX ones where config.h2_applies
TINY = {"float16": 2.0 ** -24, "bfloat16": 1e-39, "float32": 1e-41}  # subnormal inputs
HUGE = {"float16": 60000.0, "bfloat16": 3e38, "float32": 3.4e38}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _values(rng, shape, dtype, special):
    """float32 values: per-group random exponents (wide dynamic range), plus special groups."""
    k = shape[-1]
    rows = int(np.prod(shape[:-1]))
    lo, hi = {"float16": (-20, 10), "bfloat16": (-100, 100), "float32": (-140, 120)}[dtype]
    e = rng.integers(lo, hi, (rows, k // 16, 1)).astype(np.float64)
    v = (rng.standard_normal((rows, k // 16, 16)) * np.exp2(e)).reshape(rows, k)
    if special:
        row = lambda i: min(i, rows - 1)  # noqa: E731
        ties = np.array([4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 3.0, 0.0,
                         -0.0, 1.0, 6.0])
        v[row(0), :16] = 0.0
        v[row(0), 16:32] = -0.0
        v[row(0), 32:48] = ties[: min(16, k - 32)] if k >= 48 else v[row(0), 32:48]
        v[row(1), 3] = np.nan
        v[row(2), 5] = np.inf
        v[row(2), min(40, k - 1)] = -np.inf
        v[row(3), :32] = rng.standard_normal(min(32, k)) * TINY[dtype]
        v[row(4), :16] = HUGE[dtype] * np.sign(rng.standard_normal(16))
        v[row(5), :32] = 0.0
        v[row(5), 7] = -1.5
    v = v.astype(np.float32).reshape(shape)
    if dtype == "bfloat16":
        return f32_to_bf16(v)
    return v.astype(dtype)


def _ref_input(xh, dtype):
    return xh.reshape(-1, xh.shape[-1]), dtype if dtype == "bfloat16" else None


def _assert_bytes(got, want, what):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{what}: {len(bad)} bytes differ, first at {bad[:4].tolist()}: " \
        f"got {got[tuple(bad[0])]:#04x} want {want[tuple(bad[0])]:#04x}"


def _assert_values(got, want, what):
    """Bitwise equality, NaN matching NaN (payloads may differ)."""
    got, want = np.asarray(got).reshape(want.shape), np.asarray(want)
    gf = got.view(np.uint16) if got.dtype == np.float16 else got
    wf = want.view(np.uint16) if want.dtype == np.float16 else want
    if want.dtype == np.uint16 or want.dtype == np.float16:  # bf16 bits / fp16
        nan_g = (gf & 0x7FFF) > (0x7C00 if want.dtype == np.float16 else 0x7F80)
        nan_w = (wf & 0x7FFF) > (0x7C00 if want.dtype == np.float16 else 0x7F80)
    else:
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        gf, wf = got.view(np.uint32), want.view(np.uint32)
    assert np.array_equal(nan_g, nan_w), f"{what}: NaN positions differ"
    bad = np.argwhere((gf != wf) & ~nan_w)
    assert bad.size == 0, f"{what}: {len(bad)} values differ, first at {bad[:4].tolist()}: " \
        f"got {got[tuple(bad[0])]} want {want[tuple(bad[0])]}"


def _check_dequantize(t, packed, scales, fmt, gs, ctx):
    import cupy

    import kernelgen.mx as mx

    for out_dtype in DTYPES:
        if fmt == "nvfp4":
            want = R.dequantize_nvfp4(packed, scales, gs, out_dtype)
        else:
            want = R.dequantize_mx(packed, scales, fmt, out_dtype)
        got = mx.dequantize(t, out_dtype)
        _assert_values(cupy.asnumpy(got), want, f"{ctx} dequantize -> {out_dtype}")


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
@pytest.mark.parametrize("shape", [(1, 32), (3, 32), (5, 96), (33, 160), (700, 4096)])
@pytest.mark.parametrize("offset", [0, 4, 12])
def test_dequantize_mxfp6_tails_and_alignment(fmt, shape, offset):
    """MXFP6 dequantize loads a warp's 12-byte slots as 16-byte chunks from a 16-byte aligned
    buffer (an 8-byte last chunk when the slot count is 2 mod 4) and slot by slot otherwise:
    codes placed at byte offsets 0 / 4 / 12 of a fresh buffer, against the reference."""
    import cupy

    from kernelgen.mx.tensor import MxTensor

    rng = np.random.default_rng(hash((fmt, shape, offset)) % 2**32)
    xh = _values(rng, shape, "float32", True)
    packed, scales = R.quantize_mx(xh, fmt)
    buf = cupy.zeros(packed.size + 16, cupy.uint8)
    data = buf[offset:offset + packed.size].reshape(packed.shape)
    data[...] = cupy.asarray(packed)
    t = MxTensor(fmt, shape, data=data, scales=cupy.asarray(scales), scale_layout="swizzled")
    _check_dequantize(t, packed, scales, fmt, None, f"{fmt=} {shape=} {offset=}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt, wide, h2", [(f, None, None) for f in FORMATS if f != "nvfp4"] +
                         [(f, not WIDE_FP8, None) for f in FORMATS if f.startswith("mxfp8")] +
                         [(f, None, not H2_DEFAULT) for f in FORMATS if f in H2_FORMATS])
def test_quantize_mx_exact(fmt, wide, h2, dtype, layout):
    """wide: MXFP8 lanes of 16 / 8 elements forced; h2: the packed 16-bit encoders of MX fp4 /
    fp6 forced on / off (None: the defaults)."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.mx.select import force_h2, force_wide_fp8

    if h2 is not None and dtype == "float32":
        pytest.skip("h2 is for 16-bit inputs")

    rng = np.random.default_rng(hash((fmt, dtype, layout)) % 2**32)
    for shape in SHAPES:
        for special in (False, True):
            xh = _values(rng, shape, dtype, special)
            x2, hint = _ref_input(xh, dtype)
            packed, scales = R.quantize_mx(x2, fmt, dtype=hint, scale_layout=layout)
            force_wide_fp8(wide)
            force_h2(h2)
            try:
                t = mx.quantize_mx(cupy.asarray(xh), fmt, scale_layout=layout, dtype=hint)
            finally:
                force_wide_fp8(None)
                force_h2(None)
            ctx = f"{fmt=} {wide=} {h2=} {dtype=} {layout=} {shape=} {special=}"
            assert t.shape == x2.shape and t.global_scale is None and t.scale_layout == layout
            _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
            _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")
            _check_dequantize(t, packed, scales, fmt, None, ctx)


@pytest.mark.parametrize("h2", [None, not H2_DEFAULT])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_nvfp4_exact(dtype, layout, h2):
    """h2: the packed 16-bit encoders (fp16 / bf16 inputs) forced on / off (None: default)."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.mx.select import force_h2

    if h2 is not None and dtype == "float32":
        pytest.skip("h2 is for 16-bit inputs")
    rng = np.random.default_rng(hash((dtype, layout)) % 2**32)
    for shape in SHAPES:
        for special in (False, True):
            xh = _values(rng, shape, dtype, special)
            x2, hint = _ref_input(xh, dtype)
            gs_auto = R.nvfp4_global_scale(x2, hint)
            # computed on the device; a value (below the rule: scales saturate); a device scalar
            for gs_arg in (None, float(gs_auto) * 0.37, cupy.full((1,), gs_auto * 2, cupy.float32)):
                gs_host = None if gs_arg is None else np.float32(
                    gs_arg if isinstance(gs_arg, float) else gs_auto * 2)
                packed, scales, gs = R.quantize_nvfp4(x2, gs_host, dtype=hint, scale_layout=layout)
                force_h2(h2)
                try:
                    t = mx.quantize_nvfp4(cupy.asarray(xh), gs_arg, scale_layout=layout,
                                          dtype=hint)
                finally:
                    force_h2(None)
                ctx = f"nvfp4 {dtype=} {layout=} {h2=} {shape=} {special=} " \
                    f"gs={type(gs_arg).__name__}"
                got_gs = cupy.asnumpy(t.global_scale)
                assert got_gs.shape == (1,) and got_gs.view(np.uint32)[0] == \
                    np.float32(gs).view(np.uint32), f"{ctx}: gs {got_gs[0]} != {gs}"
                _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
                _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")
                _check_dequantize(t, packed, scales, "nvfp4", gs, ctx)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt, variant", [
    *((f, v) for f in ("nvfp4", "mxfp4", "mxfp6_e3m2") for v in ("loops", "loops1", "default")),
    ("mxfp4", "noh2"), ("nvfp4", "noh2"), ("mxfp6_e2m3", "noh2"), ("mxfp4", "nolinear"),
    ("nvfp4", "nolinear"), ("mxfp8_e4m3", "nolinear"), ("mxfp6_e2m3", "default"), ("mxfp8_e4m3", "loops"),
    ("mxfp8_e5m2", "loops1"),
    *(("mxfp8_e4m3", v) for v in ("default", "wide", "narrow")), ("mxfp8_e5m2", "narrow"),
    ("nvfp4", "balanced"), ("mxfp6_e3m2", "balanced"), ("mxfp4", "nobalance"),
    ("nvfp4", "nobalance"), ("mxfp4", "plain"), ("mxfp6_e2m3", "plain")])
def test_quantize_large_grids_exact(fmt, variant, dtype):
    """Inputs of more chunks than the capped grid: blocks loop over chunks ("loops": 1 block an
    SM, many loops; "loops1": the same with a slot a thread a chunk; fp8 loops only so), next
    chunk's loads in flight; "default": the planner's plan (NVFP4 loops under its cap; the MX
    formats take a block a chunk in sector order at these rows, fp16 groups down to 2^-20 with
    both scale steps); "plain": the plain scale order forced, so MX fp4 / fp6 loop under
    LOOP_GRID's cap; MXFP8 with 16- / 8-element lanes ("wide" / "narrow"); "noh2": without the
    packed 16-bit encoders; "nolinear": row / column slot addressing (no linear-index path);
    "balanced" / "nobalance": capped grids balanced to equal chunks a block wherever chunk_grid
    allows / filled to the cap ("nolinear", "balanced", "nobalance" force the plain order, which
    those knobs act on); padding rows included."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.mx.select import (
        force_balanced,
        force_blocks_per_sm,
        force_h2,
        force_linear,
        force_tiled,
        force_wide_fp8,
        quantize_plan,
    )

    rng = np.random.default_rng(hash((fmt, dtype, variant)) % 2**32)
    xh = _values(rng, (1100, 1024) if variant.startswith("loops") else (1500, 4096), dtype, True)
    x2, hint = _ref_input(xh, dtype)
    plain = variant in ("plain", "nolinear", "balanced", "nobalance")
    force_tiled(False if plain else None)
    if variant == "default" or plain:  # the plan the variant is about
        info = device_info()
        p = quantize_plan(info.arch.name, info.sm_count, fmt, dtype, 1500, 4096, True, "value")
        assert p.tiled == (not plain and fmt != "nvfp4"), p.short()
        assert p.config.loops == (fmt == "nvfp4" or (plain and "fp8" not in fmt)), p.short()
    force_blocks_per_sm(*{"loops": (1, None), "loops1": (1, 1)}.get(variant, (None, None)))
    force_wide_fp8({"wide": True, "narrow": False}.get(variant))
    force_h2(False if variant == "noh2" else None)
    force_linear(variant != "nolinear")
    force_balanced({"balanced": True, "nobalance": False}.get(variant))
    try:
        if fmt == "nvfp4":
            packed, scales, _ = R.quantize_nvfp4(x2, np.float32(300.0), dtype=hint)
            t = mx.quantize_nvfp4(cupy.asarray(xh), 300.0, dtype=hint)
        else:
            packed, scales = R.quantize_mx(x2, fmt, dtype=hint)
            t = mx.quantize_mx(cupy.asarray(xh), fmt, dtype=hint)
    finally:
        force_blocks_per_sm(None)
        force_wide_fp8(None)
        force_h2(None)
        force_linear(True)
        force_balanced(None)
        force_tiled(None)
    ctx = f"{fmt=} {dtype=} {variant=} {xh.shape=}"
    _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
    _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_quantize_sector_order_fp32_exact(fmt):
    """fp32 input in the sector order (a block a chunk; MX fp4 / fp6 without their loop): bytes
    equal to the reference, padding rows of the last 128-row tile included."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.mx.select import quantize_plan

    rng = np.random.default_rng(hash((fmt, "fp32-tiled")) % 2**32)
    xh = _values(rng, (1500, 4096), "float32", True)
    info = device_info()
    p = quantize_plan(info.arch.name, info.sm_count, fmt, "float32", 1500, 4096, True, "value")
    assert p.tiled and not p.config.loops, p.short()
    packed, scales = R.quantize_mx(xh, fmt)
    t = mx.quantize_mx(cupy.asarray(xh), fmt)
    ctx = f"{fmt=} float32 sector order"
    _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
    _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_quantize_sector_order_exact(fmt, dtype, wide):
    """Swizzled scales in sector order (scale mode 2, forced; the configs that do not loop):
    chunks of the 8 rows that share scale sectors, staged in shared memory and stored whole; a
    one-tile input whose padding rows the chunks cover (100 rows) and a larger one (its last tile
    partly padding), lanes of 16 and 8 elements, the config's slots a thread (sector order needs
    them). The plan must take the sector order, so the test cannot pass on the plain path."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.mx.select import force_blocks_per_sm, force_tiled, force_wide_fp8, quantize_plan

    info = device_info()
    rng = np.random.default_rng(hash((fmt, dtype, wide, "tiled")) % 2**32)
    force_tiled(True)
    force_wide_fp8(wide)
    force_blocks_per_sm(None, 8)  # the config's slots (U) a thread
    try:
        for rows, k in ((100, 1024), (1500, 2048)):
            xh = _values(rng, (rows, k), dtype, True)
            x2, hint = _ref_input(xh, dtype)
            plan = quantize_plan(info.arch.name, info.sm_count, fmt, dtype, rows, k, True,
                                 "value")
            assert plan.tiled, plan.short()
            packed, scales = R.quantize_mx(x2, fmt, dtype=hint)
            t = mx.quantize_mx(cupy.asarray(xh), fmt, dtype=hint)
            ctx = f"{fmt=} {dtype=} {xh.shape=} {plan.short()}"
            _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
            _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")
    finally:
        force_tiled(None)
        force_wide_fp8(None)
        force_blocks_per_sm(None)


@pytest.mark.parametrize("small", [None, "fused", "redundant"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_every_global_scale_path(dtype, small):
    """The global scale computed on the device: fused (one cluster), redundant (every block
    reduces the input), amax + quantize - each against the reference on shapes around the
    limits (the path is taken from the plan, so none goes untested)."""
    import cupy

    import kernelgen.mx as mx
    from kernelgen.arch import device_info
    from kernelgen.mx.select import force_small_auto_path, quantize_plan

    info = device_info()
    rng = np.random.default_rng(7)
    seen = set()
    force_small_auto_path(small)
    try:
        for rows, k in ((16, 4096), (64, 4096), (65, 4096), (300, 4096), (1, 16), (2049, 64)):
            xh = _values(rng, (rows, k), dtype, True)
            x2, hint = _ref_input(xh, dtype)
            packed, scales, gs = R.quantize_nvfp4(x2, dtype=hint)
            t = mx.quantize_nvfp4(cupy.asarray(xh), dtype=hint)
            path = quantize_plan(info.arch.name, info.sm_count, "nvfp4", dtype, rows, k, True,
                                 "auto").path
            seen.add(path)
            ctx = f"{dtype=} {rows=} {k=} {path=}"
            got = cupy.asnumpy(t.global_scale).view(np.uint32)[0]
            assert got == np.float32(gs).view(np.uint32), ctx
            _assert_bytes(cupy.asnumpy(t.data), packed, f"{ctx} data")
            _assert_bytes(cupy.asnumpy(t.scales), scales, f"{ctx} scales")
    finally:
        force_small_auto_path(None)
    fused = info.arch.cc >= 90 and small == "fused"
    assert seen == {"amax", "fused" if fused else "redundant"}, f"paths exercised {seen}"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8_e4m3", "mxfp6_e3m2"])
def test_torch_in_torch_out(fmt):
    torch = pytest.importorskip("torch")
    import kernelgen.mx as mx

    rng = np.random.default_rng(3)
    for dtype, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        xh = _values(rng, (33, 256), dtype, True)
        xt = torch.from_numpy(xh.view(np.int16)).cuda().view(tdt)
        t = mx.quantize_nvfp4(xt) if fmt == "nvfp4" else mx.quantize_mx(xt, fmt)
        assert isinstance(t.data, torch.Tensor) and t.data.dtype == torch.uint8
        assert isinstance(t.scales, torch.Tensor) and t.scales.is_cuda
        hint = "bfloat16" if dtype == "bfloat16" else None
        if fmt == "nvfp4":
            packed, scales, gs = R.quantize_nvfp4(xh, dtype=hint)
            assert isinstance(t.global_scale, torch.Tensor)
        else:
            packed, scales = R.quantize_mx(xh, fmt, dtype=hint)
            gs = None
        _assert_bytes(t.data.cpu().numpy(), packed, f"{fmt} torch {dtype} data")
        _assert_bytes(t.scales.cpu().numpy(), scales, f"{fmt} torch {dtype} scales")
        y = mx.dequantize(t, "bfloat16")
        assert y.dtype == torch.bfloat16 and tuple(y.shape) == (33, 256)
        want = R.dequantize_nvfp4(packed, scales, gs, "bfloat16") if fmt == "nvfp4" else \
            R.dequantize_mx(packed, scales, fmt, "bfloat16")
        _assert_values(y.view(torch.int16).cpu().numpy().view(np.uint16), want, f"{fmt} torch")
        out = torch.empty((33, 256), dtype=torch.float32, device="cuda")
        assert mx.dequantize(t, "float32", out=out) is out


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e5m2"])
def test_cuda_graph_replay(fmt):
    """Captured once, replayed on new input: small-M launches (the single-launch NVFP4 path
    included) need no host sync and no allocation outside the graph."""
    import cupy

    import kernelgen.mx as mx

    rng = np.random.default_rng(11)
    x = cupy.asarray(_values(rng, (16, 4096), "float16", False))
    q = (lambda a: mx.quantize_nvfp4(a)) if fmt == "nvfp4" else (lambda a: mx.quantize_mx(a, fmt))
    q(x)  # compile outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        q(x)
        stream.synchronize()
        stream.begin_capture()
        t = q(x)
        graph = stream.end_capture()
        for trial in range(2):
            xh = _values(rng, (16, 4096), "float16", trial == 1)
            x.set(xh, stream=stream)
            graph.launch(stream)
            stream.synchronize()
            if fmt == "nvfp4":
                packed, scales, _ = R.quantize_nvfp4(xh)
            else:
                packed, scales = R.quantize_mx(xh, fmt)
            _assert_bytes(cupy.asnumpy(t.data), packed, f"{fmt} graph replay {trial}")
            _assert_bytes(cupy.asnumpy(t.scales), scales, f"{fmt} graph replay {trial}")


def test_shape_and_dtype_errors():
    import cupy

    import kernelgen.mx as mx

    x = cupy.zeros((4, 48), cupy.float16)
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.quantize_mx(x, "mxfp4")
    with pytest.raises(ValueError, match="multiple of 16"):
        mx.quantize_nvfp4(cupy.zeros((4, 40), cupy.float16))
    with pytest.raises(ValueError, match="dtype='float32' given"):
        mx.quantize_nvfp4(x, dtype="float32")
    with pytest.raises(ValueError, match="dtype int32 not supported"):
        mx.quantize_mx(cupy.zeros((4, 64), cupy.int32), "mxfp4")
    with pytest.raises(ValueError, match="contiguous"):
        mx.quantize_mx(cupy.zeros((64, 8), cupy.float16).T, "mxfp4")
    with pytest.raises(ValueError, match="16-byte aligned"):
        mx.quantize_mx(cupy.zeros(64 * 3 + 1, cupy.float16)[1:].reshape(3, 64), "mxfp4")
    with pytest.raises(ValueError, match="one fp32 value"):
        mx.quantize_nvfp4(x, cupy.ones(2, cupy.float32))
    with pytest.raises(ValueError, match="positive finite"):
        mx.quantize_nvfp4(x, 0.0)
    t = mx.quantize_mx(cupy.zeros((4, 64), cupy.float16), "mxfp4")
    with pytest.raises(ValueError, match="out: has"):
        mx.dequantize(t, "float16", out=cupy.empty((4, 63), cupy.float16))
    with pytest.raises(ValueError, match="out: data pointer must be 16-byte aligned"):
        mx.dequantize(t, "float16", out=cupy.empty(4 * 64 + 8, cupy.float16)[1:4 * 64 + 1])
    buf = cupy.zeros(t.data.size + 8, cupy.uint8)
    shifted = buf[4:4 + t.data.size].reshape(t.data.shape)
    with pytest.raises(ValueError, match="t.data: data pointer must be 8-byte aligned"):
        mx.dequantize(dataclasses.replace(t, data=shifted), "float16")
    tn = mx.quantize_nvfp4(cupy.zeros((4, 64), cupy.float16), 1.0)
    with pytest.raises(ValueError, match="global_scale: empty"):
        mx.dequantize(dataclasses.replace(tn, global_scale=cupy.zeros(0, cupy.float32)), "float16")
    # a numpy dtype object names the same dtype as its string
    d = mx.dequantize(t, np.dtype("float16"))
    assert d.dtype == cupy.float16 and d.shape == (4, 64)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_rows_give_an_empty_tensor(layout):
    """x with no rows: zero-row data and scales of the right widths; NVFP4 global_scale the
    given value / device scalar, or 1.0 (auto). Works as an mx_gemm operand (empty D)."""
    import cupy

    import kernelgen.mx as mx

    for shape in ((0, 64), (2, 0, 64)):
        x = cupy.zeros(shape, cupy.float16)
        for fmt in R.MX_FORMATS:
            t = mx.quantize_mx(x, fmt, scale_layout=layout)
            assert t.shape == (0, 64) and t.global_scale is None
            assert t.data.shape == data_shape(fmt, 0, 64) and t.data.dtype == cupy.uint8
            assert tuple(t.scales.shape) == scale_shape(fmt, 0, 64, layout)
        for gs, want in ((None, 1.0), (448.0, 448.0), (cupy.full(1, 3.5, cupy.float32), 3.5)):
            t = mx.quantize_nvfp4(x, gs, scale_layout=layout)
            assert t.shape == (0, 64) and t.data.shape == (0, 32)
            assert tuple(t.scales.shape) == scale_shape("nvfp4", 0, 64, layout)
            assert float(t.global_scale[0]) == want, (gs, float(t.global_scale[0]))
    torch = pytest.importorskip("torch")
    t = mx.quantize_mx(torch.zeros((0, 64), dtype=torch.bfloat16, device="cuda"), "mxfp8_e4m3")
    assert isinstance(t.data, torch.Tensor) and tuple(t.data.shape) == (0, 64)

