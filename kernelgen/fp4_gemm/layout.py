"""The tiled weight layout both FP4 GEMM kernels read (built once by prepare_weight).

For each tile of 16 rows and each step of 128 k, the 1 KB of packed weights and the 16 x SB
scale bytes (SB = 8 for NVFP4, 4 for MXFP4) are contiguous, ordered the way the lanes of a warp
read them (lane (g, t) = (lane / 4, lane % 4) takes the 16-byte chunk t of rows g and g+8):

    data   [T, Q, 2 (h), 8 (g), 4 (t), 16]      row = 16 * tile + 8h + g, byte = 64q + 16t + i
    scales [T, Q, 8 (g), 4 (t), 2 (h), SB / 4]  scale column = q * SB + t * SB / 4 + i

T = ceil(N / 16) (rows past N are zero), Q = K / 128. A warp's weight load then covers 512
contiguous bytes and consecutive steps follow each other in memory, like a streaming copy.
Written for any array module with reshape / transpose (NumPy in the tests, CuPy in the API).
"""

from __future__ import annotations

from typing import Any

TILE_ROWS = 16
STEP_K = 128


def _pad_rows(xp: Any, a: Any, rows: int) -> Any:
    if a.shape[0] == rows:
        return a
    pad = xp.zeros((rows - a.shape[0], a.shape[1]), dtype=a.dtype)
    return xp.concatenate([a, pad], axis=0)


def tile_data(xp: Any, data: Any, n: int, k: int) -> Any:
    """Packed fp4 bytes [N, K/2] -> [T, Q, 2, 8, 4, 16]: a new C-contiguous array (never a
    view of `data`, so the result outlives it)."""
    t, q = -(-n // TILE_ROWS), k // STEP_K
    d = _pad_rows(xp, data, t * TILE_ROWS).reshape(t, 2, 8, q, 4, 16)
    return d.transpose(0, 3, 1, 2, 4, 5).copy()  # a new C-order array even where a view would do


def tile_scales(xp: Any, scales: Any, n: int, k: int, sb: int) -> Any:
    """Row-major scale bytes [N, K * sb / 128] -> [T, Q, 8, 4, 2, sb / 4]: a new C-contiguous
    array (never a view of `scales`)."""
    t, q = -(-n // TILE_ROWS), k // STEP_K
    s = _pad_rows(xp, scales, t * TILE_ROWS).reshape(t, 2, 8, q, 4, sb // 4)
    return s.transpose(0, 3, 2, 4, 1, 5).copy()
