"""prepare_weight's array work (api.prepare_arrays, run with NumPy as the array module), the
Fp4Weight checks and the alignment rule, on the CPU."""

import numpy as np
import pytest

from kernelgen.fp4_gemm import Fp4Weight
from kernelgen.fp4_gemm import reference as GR
from kernelgen.fp4_gemm.api import check_aligned, check_arrays, prepare_arrays
from kernelgen.fp4_gemm.layout import tile_data, tile_scales

from ._weights import extreme_mx_weight, host_weight


def _prepare(fmt, n, k, layout="row_major"):
    packed, scales, gs, _ = host_weight(fmt, n, k, layout)
    g = None if gs is None else np.array([gs], np.float32)
    return (packed, scales, g), prepare_arrays(np, fmt, n, k, packed, scales, layout, g)


# K = 128 with N % 16 == 0 is where the tiled layout is a plain reshape of W's bytes (review B2)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k,layout", [(16, 128, "row_major"), (32, 128, "row_major"),
                                        (200, 384, "row_major"), (16, 128, "swizzled")])
def test_prepared_arrays_own_their_memory(fmt, n, k, layout):
    inputs, prepared = _prepare(fmt, n, k, layout)
    for i, x in enumerate(prepared):
        assert x.flags.c_contiguous and x.flags.owndata, (fmt, i)
        for y in inputs:
            assert y is None or not np.shares_memory(x, y), (fmt, n, k, layout, i)
    check_arrays(fmt, n, k, *prepared)


def test_layout_never_returns_a_view():
    data = np.arange(16 * 64, dtype=np.uint8).reshape(16, 64)
    scales = np.arange(16 * 8, dtype=np.uint8).reshape(16, 8)
    assert not np.shares_memory(tile_data(np, data, 16, 128), data)
    assert not np.shares_memory(tile_scales(np, scales, 16, 128, 8), scales)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_prepare_swizzled_equals_row_major(fmt):
    _, rm = _prepare(fmt, 200, 384)
    _, sw = _prepare(fmt, 200, 384, "swizzled")
    for x, y in zip(rm, sw, strict=True):
        assert np.array_equal(x, y)


def test_prepare_mx_matches_reference_and_clamps():
    n, k = 40, 256
    packed, scales, _ = extreme_mx_weight(n, k)
    td, ts, post = prepare_arrays(np, "mxfp4", n, k, packed, scales, "row_major", None)
    rel, post_ref = GR.prepare_scales_mx(scales)
    assert np.array_equal(ts, tile_scales(np, rel, n, k, 4)) and np.array_equal(post, post_ref)
    assert post.dtype == np.float32 and np.array_equal(td, tile_data(np, packed, n, k))
    s = scales.astype(int)
    want = np.maximum(s - s.max(axis=1, keepdims=True) + 127, 0)  # no 0xFF in these scales
    assert np.array_equal(rel, want) and (rel == 0).any() and rel.max() == 127


def test_prepare_rejects_bad_inputs():
    packed, scales, gs, _ = host_weight("nvfp4", 32, 256)
    g = np.array([gs], np.float32)
    with pytest.raises(ValueError, match=r"W.data: shape \(32, 128\); expected \(16, 128\)"):
        prepare_arrays(np, "nvfp4", 16, 256, packed, scales, "row_major", g)
    with pytest.raises(ValueError, match=r"W.scales: row_major shape \(32, 16\); expected \(32, 8\)"):
        prepare_arrays(np, "mxfp4", 32, 256, packed, scales, "row_major", None)
    with pytest.raises(ValueError, match="W.scales: swizzled scales have 512 bytes"):
        prepare_arrays(np, "nvfp4", 32, 256, packed, scales, "swizzled", g)
    with pytest.raises(ValueError, match="W.scale_layout: 'col_major'"):
        prepare_arrays(np, "nvfp4", 32, 256, packed, scales, "col_major", g)
    with pytest.raises(ValueError, match=r"W.global_scale: expected 1 fp32 element, got shape \(2,\)"):
        prepare_arrays(np, "nvfp4", 32, 256, packed, scales, "row_major", np.ones(2, np.float32))


# -- Fp4Weight checks (review C4) ---------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_check_arrays_names_the_array(fmt):
    n, k = 40, 256
    _, (d, s, p) = _prepare(fmt, n, k)
    check_arrays(fmt, n, k, d, s, p)
    with pytest.raises(ValueError, match=r"Fp4Weight.data: uint8 \(3, 2, 2, 8, 4, 16\); a .* \[40, 384\] "
                                         r"needs uint8 \(3, 3, 2, 8, 4, 16\)"):
        check_arrays(fmt, n, 384, d, s, p)
    with pytest.raises(ValueError, match="Fp4Weight.data"):
        check_arrays(fmt, 60, k, d, s, p)  # 4 tiles of 16 rows, not 3
    with pytest.raises(ValueError, match="Fp4Weight.scales"):
        check_arrays(fmt, n, k, d, s.view(np.int8), p)
    with pytest.raises(ValueError, match="Fp4Weight.post: float64"):
        check_arrays(fmt, n, k, d, s, p.astype(np.float64))
    with pytest.raises(ValueError, match="Fp4Weight.post"):
        check_arrays(fmt, n, k, d, s, np.ones(41 if fmt == "mxfp4" else 2, np.float32))
    with pytest.raises(ValueError, match="Fp4Weight.data: must be C-contiguous"):
        check_arrays(fmt, n, k, np.asfortranarray(d), s, p)
    with pytest.raises(ValueError, match="Fp4Weight.scales: expected an array, got list"):
        check_arrays(fmt, n, k, d, [0], p)
    other = "mxfp4" if fmt == "nvfp4" else "nvfp4"
    with pytest.raises(ValueError, match="Fp4Weight.(scales|post)"):
        check_arrays(other, n, k, d, s, p)
    with pytest.raises(ValueError, match="Fp4Weight.fmt: 'mxfp8'"):
        check_arrays("mxfp8", n, k, d, s, p)
    with pytest.raises(ValueError, match="positive multiple of 128"):
        check_arrays(fmt, n, 200, d, s, p)
    with pytest.raises(ValueError, match="n and k must be integers"):
        check_arrays(fmt, 40.0, k, d, s, p)


def test_fp4weight_validates_on_construction():
    n, k = 40, 256
    _, (d, s, p) = _prepare("mxfp4", n, k)
    with pytest.raises(ValueError, match="Fp4Weight.data: expected a CuPy array .* got numpy.ndarray"):
        Fp4Weight("mxfp4", n, k, d, s, p, 0)
    with pytest.raises(ValueError, match="Fp4Weight.scales: uint8"):  # shapes first
        Fp4Weight("mxfp4", n, k, d, s[:1], p, 0)


# -- alignment (review H5); fp4_gemm applies it to A (16), bias and out (2) -----------------------
def test_check_aligned():
    check_aligned(0x7F0000001000, "A", 16, "why")
    check_aligned(0x7F0000001002, "out", 2, "why")
    with pytest.raises(ValueError, match=r"A: data pointer must be 16-byte aligned \(the kernels "
                                         r"load A in 16-byte chunks\); it is 8 bytes past"):
        check_aligned(0x7F0000001008, "A", 16, "the kernels load A in 16-byte chunks")
    with pytest.raises(ValueError, match="out: data pointer must be 2-byte aligned"):
        check_aligned(0x7F0000001001, "out", 2, "one 2-byte element at a time")
