"""kbit GEMM tensor-core path (and the path dispatch, the dequantize + cuBLAS path) on the GPU
against the NumPy reference (dequantize with the E4M4 scales, matmul in float64): relative error
bounds per dtype, every bit-width, M across tile boundaries up to 4097, every tile the selector
can choose forced, split-K off / auto / forced.

Outputs are poisoned (KERNELGEN_POISON=1: NaN for fp16/bf16) or pre-filled with NaN through
out=, so an element the kernel does not write fails the bound.
"""

import functools

import numpy as np
import pytest

from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import quantize_weight
from kernelgen.kbit_gemm import reference as GR
from kernelgen.kbit_gemm.tc_config import TILES

# these tests check the flat layout's kernels (4-bit weights default to the tiled layout:
# test_tiled_gpu.py)
quantize_flat = functools.partial(quantize_weight, layout="flat")

pytestmark = pytest.mark.gpu

BITS = (2, 3, 4, 5)
DTYPES = ("float16", "bfloat16")
MS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 127, 128, 255, 1024, 4097)
# N: one 128 tile, 3 tiles (no 256 tile), 2 x 256; K: 6 k-tiles, 16, 66 (odd k-tiles for the
# 8-byte plane copies and the scale-word halves)
SHAPES = ((128, 384), (384, 1024), (512, 4224))
SPLITS = (None, 1, 3)


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("KERNELGEN_POISON", "1")


def _host(rng, shape, dtype, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    return R.f32_to_bf16(v) if dtype == "bfloat16" else v.astype(np.float16)


@functools.cache
def _weight(bits, dtype, n, k):
    """(KbitLinear, W float64 as the kernel sees it), built once per module."""
    import cupy

    rng = np.random.default_rng(1000 * bits + n + k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 3.0, (n, 1))).astype(np.float32)
    w_host = R.f32_to_bf16(w) if dtype == "bfloat16" else w.astype(np.float16)
    lin = quantize_flat(cupy.asarray(w_host), bits, dtype="bfloat16" if dtype == "bfloat16" else None)
    w64 = GR.dequantize_weight(cupy.asnumpy(lin.q.packed), cupy.asnumpy(lin.q.absmax),
                               cupy.asnumpy(lin.q.codebook), bits, n, k)
    return lin, w64


def _check(c_dev, c_ref, dtype, ctx):
    import cupy

    c = GR.to_float64(cupy.asnumpy(c_dev), dtype)
    assert np.all(np.isfinite(c)), f"{ctx}: {int(np.sum(~np.isfinite(c)))} elements not written / not finite"
    err = GR.rel_error(c, c_ref)
    if not err <= GR.REL_ERROR_BOUND[dtype]:
        c2, r2 = c.reshape(-1, c.shape[-1]), c_ref.reshape(-1, c_ref.shape[-1])
        bad = np.abs(c2 - r2) > 0.05 * (np.abs(r2) + np.linalg.norm(r2) / np.sqrt(r2.size))
        ms, ns = np.nonzero(bad)
        raise AssertionError(f"{ctx}: rel error {err:.3g}; {bad.mean():.1%} bad; tokens "
                             f"{sorted(set(ms.tolist()))[:8]}, cols {ns[:8].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_dispatch_matches_reference(bits, dtype):
    """The selector's path and plan for every M (gemv / mma / dequant), with and without bias."""
    import cupy

    import kernelgen as kg
    from kernelgen.kbit_gemm.tc_select import plan_gemm

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        lin, w64 = _weight(bits, dtype, n, k)
        for m in MS:
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            c = kg.gemm(cupy.asarray(a), lin, None if bias is None else cupy.asarray(bias), dtype=hint)
            path = plan_gemm("sm_90a", m, n, k, bits, dtype, 132).path
            _check(c, GR.gemm(a, w64, bias, dtype), dtype, f"{bits=} {dtype=} {m=} {n=} {k=} {path=}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("tile", sorted(TILES), ids=lambda t: f"{t[0]}x{t[1]}")
def test_mma_tiles_and_splits(tile, bits, dtype):
    """Every tile forced, split-K auto / off / forced, M across the tile edges."""
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    hint = "bfloat16" if dtype == "bfloat16" else None
    for n, k in SHAPES:
        if n % tile[1]:
            continue
        lin, w64 = _weight(bits, dtype, n, k)
        for m in (1, 15, 17, 33, 64, 127, 255):
            a = _host(rng, (m, k), dtype)
            bias = _host(rng, (n,), dtype) if m % 2 else None
            c_ref = GR.gemm(a, w64, bias, dtype)
            a_d, b_d = cupy.asarray(a), None if bias is None else cupy.asarray(bias)
            for split in SPLITS:
                c = kg.gemm(a_d, lin, b_d, dtype=hint, path="mma", tile=tile, split_k=split)
                assert c.shape == (m, n) and c.dtype == a_d.dtype
                _check(c, c_ref, dtype, f"{tile=} {bits=} {dtype=} {m=} {n=} {k=} {split=}")


@pytest.mark.parametrize("path", ("mma", "dequant"))
def test_out_buffer_leading_dims_and_determinism(path):
    import cupy

    import kernelgen as kg

    rng = np.random.default_rng()
    n, k = 512, 4224
    lin, w64 = _weight(4, "float16", n, k)
    a = _host(rng, (3, 11, k), "float16")
    bias = _host(rng, (n,), "float16")
    c_ref = GR.gemm(a, w64, bias)
    out = cupy.full((3, 11, n), np.nan, cupy.float16)
    res = kg.gemm(cupy.asarray(a), lin, cupy.asarray(bias), out=out, path=path, split_k=None)
    assert res is out
    _check(out, c_ref, "float16", f"{path=} out=")
    if path == "mma":  # the split-K reduction runs in split order: bit-identical repeats
        a_d = cupy.asarray(a)
        first = kg.gemm(a_d, lin, path="mma", tile=(32, 128), split_k=5)
        for _ in range(3):
            again = kg.gemm(a_d, lin, path="mma", tile=(32, 128), split_k=5)
            assert bool(cupy.all(first.view(cupy.uint16) == again.view(cupy.uint16)))


def test_torch_inputs_on_a_side_stream():
    torch = pytest.importorskip("torch")

    import kernelgen as kg

    rng = np.random.default_rng()
    n, k, m = 384, 1024, 100
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    lin = quantize_flat(w, 4)
    import cupy

    w64 = GR.dequantize_weight(cupy.asnumpy(cupy.asarray(lin.q.packed)),
                               cupy.asnumpy(cupy.asarray(lin.q.absmax)),
                               cupy.asnumpy(cupy.asarray(lin.q.codebook)), 4, n, k)
    a = _host(rng, (m, k), "bfloat16")
    a_t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for path in ("mma", "dequant"):
            c = kg.gemm(a_t, lin, path=path)
            assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16
            s.synchronize()
            c_np = c.view(torch.int16).cpu().numpy().view(np.uint16)
            _check(c_np, GR.gemm(a, w64, None, "bfloat16"), "bfloat16", f"torch {path=}")


def test_split_k_on_the_dequant_path_is_an_error_and_misaligned_out_is_refused():
    import cupy

    import kernelgen as kg

    lin, _ = _weight(4, "float16", 256, 512)
    a = cupy.asarray(_host(np.random.default_rng(), (4096, 512), "float16"))
    with pytest.raises(ValueError, match="dequant path"):
        kg.gemm(a, lin, path="dequant", split_k=2)
    buf = cupy.zeros(4096 * 256 + 1, cupy.float16)
    with pytest.raises(ValueError, match="4-byte aligned"):
        kg.gemm(a, lin, out=buf[1:].reshape(4096, 256))


def test_split_scratch_grows_without_freeing_what_graphs_may_hold():
    import cupy

    from kernelgen.core import interop

    ctx = interop.context_of(cupy.zeros(1, cupy.float32), "x")
    ws1, cnt1 = interop.scratch(ctx, "test", 10, 3)
    assert interop.scratch(ctx, "test", 5, 2)[0] is ws1  # big enough: reused
    ws2, _ = interop.scratch(ctx, "test", 1 << 20, 3)
    assert ws2.size >= 1 << 20 and ws2 is not ws1
    assert any(old[0] is ws1 for old in interop._retired)  # kept alive, not freed
    assert int(cnt1.sum()) == 0
    n_retired = len(interop._retired)
    for i in range(1, 101):  # M rising a few rows a call: it doubles once, not 100 times
        ws3, _ = interop.scratch(ctx, "test", ws2.size + 64 * i, 3)
    assert len(interop._retired) == n_retired + 1 and ws3.size == 2 * ws2.size


@pytest.mark.parametrize("bits", (4, 5))
def test_mma_on_a_part_with_99_kb(bits, monkeypatch):
    """A device whose blocks get 99 KB (8.6 / 8.9 parts, 101376 B; here the device's limit is
    lowered to it): the mma path at M = 32 (32x128, dispatched at 4 bits; 5 bits dispatch the
    GEMV there, so it is forced) and M = 256 (64x256 with N % 256
    == 0, forced: dispatch takes dequant there) plans the stages that fit (64x256: 3, fewer
    than the target's 4), loads and launches (a kernel over the limit raises DeviceError at
    load) and matches the reference."""
    import cupy

    import kernelgen as kg
    from kernelgen.arch import device_info
    from kernelgen.core import interop
    from kernelgen.kbit_gemm.tc_select import plan_mma, select_gemm

    info = device_info()
    lim = 99 * 1024
    n, k = 4096, 4224  # > GEMV_SMALL_WEIGHT elements and N < K: M = 32 dispatches the mma path at 4 bits
    lin, w64 = _weight(bits, "float16", n, k)
    full = {m: plan_mma(info.arch.name, m, n, k, bits, "float16", info.sm_count) for m in (32, 256)}
    monkeypatch.setitem(interop._smem_limits, info.index, (lim, "test part of 99 KB"))
    rng = np.random.default_rng()
    for m in (32, 256):
        p = plan_mma(info.arch.name, m, n, k, bits, "float16", info.sm_count, smem_limit=lim)
        ctx = f"{bits=} {m=} {p.short()} (without the limit: {full[m].short()})"
        assert p.smem <= lim and p.config.replace(stages=full[m].config.stages) == full[m].config, ctx
        if m == 256:
            assert (p.config.tile_m, p.config.tile_n, p.config.stages) == (64, 256, 3), ctx
            assert full[m].config.stages == 4, ctx
        choice = select_gemm(info.arch.name, m, n, k, bits, "float16", info.sm_count, lim)
        dispatched = m == 32 and choice.path == "mma"  # 5 bits: the GEMV takes M = 32 (forced)
        if dispatched:
            assert choice.plan == p, ctx
        else:
            assert m == 256 or (bits == 5 and choice.path == "gemv"), ctx
        a = _host(rng, (m, k), "float16")
        bias = _host(rng, (n,), "float16")
        c = kg.gemm(cupy.asarray(a), lin, cupy.asarray(bias), path=None if dispatched else "mma")
        _check(c, GR.gemm(a, w64, bias, "float16"), "float16", ctx)
