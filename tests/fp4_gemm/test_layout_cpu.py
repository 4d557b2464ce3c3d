"""The tiled layout (kernelgen/fp4_gemm/layout.py) puts every word where the kernels read it, bit-encoded."""

import numpy as np
import pytest

from kernelgen.fp4_gemm.api import check_arrays
from kernelgen.fp4_gemm.layout import (
    ARRANGEMENTS,
    arrange,
    arranged_shapes,
    block_strides,
    canonical,
    encode_words,
    tile_data,
    tile_scales,
)


@pytest.mark.parametrize("enc", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,k,sb", [(16, 128, 8), (200, 384, 8), (37, 512, 4)])
def test_tiled_offsets_match_the_kernels(n, k, sb, enc):
    rng = np.random.default_rng(n + k)
    data = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 256, (n, k * sb // 128), dtype=np.uint8)
    td, ts = tile_data(np, data, n, k, enc).ravel(), tile_scales(np, scales, n, k, sb).ravel()
    q_steps, tiles = k // 128, -(-n // 16)
    assert td.size == tiles * 16 * k // 2 and ts.size == tiles * 16 * k * sb // 128
    for r in range(n):
        tile, h, g = r // 16, (r % 16) // 8, r % 8
        for q in range(q_steps):
            blk = tile * q_steps + q
            for t in range(4):  # gemv.cuh / tile.cuh: lane (g, t), rows g (h = 0) and g + 8
                off = blk * 1024 + 512 * h + 64 * g + 16 * t
                soff = blk * 16 * sb + (16 * g + 8 * (t >> 1) if sb == 8 else 8 * g) + 4 * h
                for j in range(4):  # word j: elements 32j + 8t .. + 7 (4 bytes from 16j + 4t)
                    plain = data[r, 64 * q + 16 * j + 4 * t: 64 * q + 16 * j + 4 * t + 4].copy().view(np.uint32)
                    assert np.array_equal(td[off + 4 * j:off + 4 * j + 4].view(np.uint32),
                                          encode_words(np, plain, enc))
                    group = (128 * q + 32 * j + 8 * t) // (128 // sb)  # of elements .. + 7 alike
                    assert group == (128 * q + 32 * j + 8 * t + 7) // (128 // sb)
                    assert ts[soff + j] == scales[r, group], (r, q, t, j)
    pad = tile_data(np, data, n, k).reshape(tiles * 16 // 16, q_steps, 2, 8, 4, 16)
    if n % 16:  # rows past N are zero
        last = pad[-1].transpose(1, 2, 0, 3, 4).reshape(16, q_steps * 64)
        assert not last[n % 16:].any()


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("fmt,sb", [("nvfp4", 8), ("mxfp4", 4)])
def test_arrangements_hold_the_same_blocks(arrangement, fmt, sb):
    """Each arrangement stores block (tile, step) at tile * wt + step * wq of its data (scales:
    st, sq), has the shapes check_arrays wants and views back to the tile-major arrays."""
    n, k = 40, 512
    t, q = 3, 4
    rng = np.random.default_rng(sb)
    td = tile_data(np, rng.integers(0, 256, (n, k // 2), dtype=np.uint8), n, k)
    ts = tile_scales(np, rng.integers(0, 256, (n, k * sb // 128), dtype=np.uint8), n, k, sb)
    data, scales = arrange(np, td, ts, arrangement)
    assert (data.shape, scales.shape) == arranged_shapes(arrangement, t, q, sb)
    post = np.ones(1 if fmt == "nvfp4" else n, np.float32)
    check_arrays(fmt, n, k, data, scales, post, arrangement)
    wt, wq, st, sq = block_strides(arrangement, data, scales)
    wbuf = data.reshape(-1)
    sbase = 1024 if arrangement.endswith("inline") else 0
    sbuf = wbuf if sbase else scales.reshape(-1)
    for tile in range(t):
        for step in range(q):
            o = tile * wt + step * wq
            assert np.array_equal(wbuf[o:o + 1024], td[tile, step].reshape(-1))
            o = sbase + tile * st + step * sq
            assert np.array_equal(sbuf[o:o + 16 * sb], ts[tile, step].reshape(-1))
    cd, cs = canonical(arrangement, data, scales, sb)
    assert np.array_equal(cd, td) and np.array_equal(cs, ts)
    if arrangement != "tile_major":
        with pytest.raises(ValueError, match="needs uint8"):
            check_arrays(fmt, n, k, data, scales, post, "tile_major")

