"""Host-side selector of the FP4-weight GEMM, as data plus one pure function.

(arch, M, N, K, fmt, dtype, SM count, the device's shared memory a block) -> Plan: the path
(bandwidth GEMV for M <= GEMV_MAX_M and, where the tile path has few CTAs, up to
GEMV_VERY_FEW_CTAS_MAX_M; tensor-core tiles above; from DENSE_MIN_M the weight made dense for
cuBLAS; on sm_90a the wgmma kernel for mid M ahead of these, see WGMMA_MIN_M), its config and
its launch (K splits, grid, shared memory). No GPU work; memoised and printable
(KERNELGEN_PRINT_CONFIGS=1).
`prewarm_configs` walks the same function over the shapes of a spec and the parts of each
target (kernelgen.arch.PARTS), so prewarm builds exactly what dispatch can pick.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import (
    KB,
    get_arch,
    parts_of,
    per_target,
    smem_cap,
    smem_limits,
    smem_per_sm,
    targets_like,
)
from ..core.select import selector, wave_fill, weight_shapes
from ..errors import UnsupportedConfigError
from .config import (
    DEQUANT_THREADS,
    DTYPES,
    FMTS,
    GEMV_FMTS,
    GEMV_WARPS,
    GEMV_WARPS_PER_SM,
    KBIT4_WIDE_LUT_BYTES,
    M_TILES,
    STEP_K,
    TILE_BMS,
    TILE_BN,
    TPWS,
    WGMMA_ARCHS,
    WGMMA_BMS,
    WGMMA_SMEM_MAX,
    Fp4DequantConfig,
    Fp4GemvConfig,
    Fp4TileConfig,
    Fp4WgmmaConfig,
    tile_smem,
    wgmma_smem,
)

# Path threshold: M up to this runs the bandwidth path (one pass of <= 16 tokens reads W once);
# above it the tile path, whose CTAs reuse each decoded weight for BM tokens, unless the tile path
# has too few 128-row CTAs to fill the GPU without a K split: then the bandwidth path runs
# ceil(M / 16) passes (grid.z) that stream the same weights at the same time, the later ones
# mostly from L2. H100, graph-timed, same run (`bench_fp4_gemm.py --sweep`, BENCHMARKS.md), GEMV
# vs tile, nvfp4 us: 14336x4096 (112 row CTAs) M = 32 26.4 / 33.2, 64 44.7 / 49.5, 128 90.0 /
# 69.2; 4096x14336 (32) M = 32 27.7 / 43.6, 64 49.5 / 61.2, 128 92.6 / 89.2; 4096x4096 (32) M = 64
# 16.6 / 29.5, 128 28.1 / 36.4; 28672x4096 (224) M = 32 53.8 / 42.7. mxfp4 alike. Measured on
# the H100 only (50 MB L2: the passes' shared weights stay there); other targets inherit it.
GEMV_MAX_M = 16
GEMV_FEW_CTAS_MAX_M = 64  # the GEMV up to here where ceil(N / 128) < SMs
GEMV_VERY_FEW_CTAS_MAX_M = 128  # and up to here where 4 ceil(N / 128) <= SMs
# ... and up to GEMV_MID_MAX_M (3 passes) where the tile path's BM 32 / 64 CTAs are fewer than
# GEMV_MID_CTAS x SMs: the tile path's time there is its per-CTA K loop (two CTAs an SM run at
# once), the GEMV's the weight bytes. H100, session 35 (`examples/tune_paths.py`, graph-timed,
# rotated), GEMV / tile us at M = 24 nvfp4: 20480x1024 (1.21 x SMs) 11.7 / 13.2, 18432x1536
# (1.09) 14.7 / 17.8, 24576x2048 (1.45) 20.3 / 23.2, 16896x4096 (1.0) 26.3 / 31.4, 20480x4096
# 34.2 / 41.4 (mxfp4 12-33% alike; M = 40 / 48 the GEMV 9-58% faster on these); tile as fast or
# faster from 1.7 x SMs: 28672x1536 18.9 / 18.6, 32768x1024 15.4 / 14.1, 32768x2048 26.0 /
# 23.4, 28672x4096 (session 22, M = 32) 53.8 / 42.7.
GEMV_MID_MAX_M = 48
GEMV_MID_CTAS = 1.6
# Bandwidth path: tiles of 16 W rows, KW warps a tile along K (KW_CHOICES up to KW_MAX, summed in
# shared memory: no global split-K epilogue), WARPS / KW tiles a CTA. The largest KW whose CTAs
# all fit one wave (warps_per_sm / 8 CTAs of 8 warps resident an SM: 2 at <= 128 registers) and
# leave every warp >= MIN_STEPS quad steps (128 k) wins: the kernel streams, so what counts is
# enough warps with loads in flight on every SM until the end (at 16 warps an SM, 14336x4096:
# KW 2, 224 CTAs; 4096x14336: KW 8, 256). Only when even the largest KW leaves SMs idle (few
# tiles, long K) are K ranges also split across CTAs (fp32 partials + a counter, summed in split
# order by the last CTA).
MIN_STEPS = 4
# ... except on a short K: where a split's K range is at most SHORT_K_STEPS quad steps, the
# dense launch's KW may leave a warp one step (short_k_kw; the MoE experts keep MIN_STEPS). The
# planner first settles TPW, warps an SM and the split as before, then raises KW within them:
# H100, session 24 (`build/ab_kwmin.py`, graph-timed, rotated), M = 1 / 8 / 16, us:
# 4096x1024 nvfp4 3.96 / 3.97 / 6.11 -> 3.07 / 3.17 / 4.70, mxfp4 3.78 -> 2.70, kbit4 3.86 /
# 4.05 / 5.08 -> 3.22 / 3.45 / 4.49; 2048x2048 nvfp4 4.08 -> 3.30, kbit4 4.00 -> 3.09;
# 4096x2048 nvfp4 4.65 -> 3.94, kbit4 4.50 -> 3.95. Only where the plan launches fewer than
# SHORT_K_BUSY_WARPS warps an SM: 8192x2048 M = 16 (15.5 an SM) ran 2-5% slower at the larger
# KW. (Relaxed before TPW / warps an SM were chosen it also moved 8192x2048 M = 1 / 8 to 32
# warps an SM or TPW 2, 11-25% slower; at K = 4096 it was 16% faster on 1024x4096 M = 16 but 4-7%
# slower on 4096x4096 M = 16.)
SHORT_K_STEPS = 16
SHORT_K_BUSY_WARPS = 12
# No K split where the unsplit plan already gives (nearly) every SM a CTA and a warp at most
# NOSPLIT_MAX_STEPS[m_tile] steps: the split's finish (fp32 partials, a counter, the last CTA's
# sum: ~1.5 us at M = 1) costs more than the doubled warps an SM save on so short a K. H100,
# session 25 (`build/ab_split.py`, graph-timed, rotated; planner's split 2 -> 1, us): 2048x8192
# M = 1 / 8 / 16 nvfp4 7.32 / 7.59 / 10.22 -> 7.04 / 7.06 / 9.32, mxfp4 7.39 / 7.76 / 10.14 ->
# 6.74 / 6.88 / 9.27, kbit4 7.22 / 7.70 / 9.89 -> 7.04 / 7.30 / 8.86; M = 16: 2048x14336 15.62 ->
# 13.75 (nvfp4), 14.85 -> 13.75 (kbit4), 2048x16384 15.96 -> 14.34. The split still wins where
# K is longer (2048x14336 M = 1: 10.02 vs 10.63 unsplit; 2048x28672 16.09 vs 18.87). Where the
# unsplit CTAs leave SMs idle (1024xK: 64 CTAs) kbit4 ran 5-32% faster split and the FP4
# formats were mixed (mxfp4 1024x8192 3-6% faster unsplit, M = 16 on 1024x8192 / 14336 6-11%,
# 1024x16384 split faster): not taken up. The rule fires where N / 16 tiles land on 90-100% of
# the SMs (N = 1920 / 2048 on an H100; 1152 on 72-78 SMs, 2560 / 2688 on 170, ...); measured
# on the H100 only, other parts inherit it.
NOSPLIT_MAX_STEPS = {8: 8, 16: 16}
NOSPLIT_SM_FILL = 0.9
KW_CHOICES = (16, 8, 4, 2, 1)
# The largest KW by (m_tile, warps an SM); KW 16 runs 16-warp CTAs. Measured on H100 (session
# 12, same run, twice, graph-timed, bit-exact), 4096x14336, KW 16 at 32 warps an SM (31
# resident) against KW 8 at 16 (15.5): m_tile 16, M = 9 / 12 / 16 nvfp4 16.91 / 18.00 / 19.15
# -> 16.55 / 17.51 / 18.41 us, mxfp4 16.80 / 17.74 / 19.16 -> 15.61 / 16.52 / 17.49; m_tile 8,
# M = 1 / 4 / 8 nvfp4 14.25 / 14.38 / 14.40 -> 13.96 / 14.39 / 14.75, mxfp4 13.41 / 13.51 /
# 13.50 -> 13.58 / 13.75 / 14.01 (mostly slower), so m_tile 8 keeps KW <= 8; one 16-warp CTA an
# SM (16 warps an SM) was not measured and is not taken.
KW_MAX = {(8, 16): 8, (8, 32): 8, (16, 16): 8, (16, 32): 16}
# Steps of weights in flight per warp. Measured on H100 (graph of back-to-back calls, fp16,
# M = 1 and 16, both decode shapes and formats): depth 2 beat depth 4 in all 8 cases by 2-10%;
# the loop waits on the activation loads (L1TEX scoreboard, ncu), not on the weight bytes.
GEMV_DEPTH = 2
# Tiles a warp owns at the same k, by m_tile: they share the warp's activation fragments, so
# TPW 2 halves the A loads per weight byte (4 KB of A per 1 KB of W at m_tile 16 with one tile).
# Measured on H100 (session 9): m_tile 16 14336x4096 24.4 -> 20.0 us (nvfp4), 23.9 -> 18.9
# (mxfp4); M = 1 (m_tile 8) 1-4% slower. Where TPW 2 leaves too few CTAs for one wave without a
# global K split (4096x14336: 128 CTAs, split 2; 1-3% slower at M = 16), the planner keeps TPW 1.
GEMV_TPW = {8: 1, 16: 2}
# Warps a CTA of the bandwidth path, by (m_tile, warps an SM), where the plan's KW fits (KW <=
# warps; else GEMV_WARPS, or 16 for KW 16; the launch bounds keep the warps an SM: 2 CTAs of 8
# or 4 of 4 at 16, 4 of 8, 8 of 4 or 2 of 16 at 32). 4-warp CTAs even out the SMs' warp counts. Measured on H100, same runs, bit-exact:
# session 10, 16 an SM, m_tile 16 on 14336x4096 (KW 2) 20.06 -> 19.47 us nvfp4, 19.61 -> 19.02
# mxfp4; m_tile 8 unchanged (15.25 vs 15.32). Session 11, 32 an SM, m_tile 8 on 14336x4096 (KW
# 4): M = 1 14.82 -> 14.65 nvfp4, 14.03 -> 13.65 mxfp4; M = 8 15.85 -> 15.39, 15.38 -> 14.40.
GEMV_CTA_WARPS = {(8, 16): 8, (8, 32): 4, (16, 16): 4, (16, 32): 4}
# Resident warps an SM the launch bounds ask for (Fp4GemvConfig.warps_per_sm): 16 (<= 128
# registers), or 32 (<= 64 registers, TPW 1 only) where m_tile's entry allows it AND its plan
# launches twice the warps at no more K splits (14336x4096 M <= 8: KW 2 -> 4, 27 warps an SM
# instead of 14). Measured on H100 (session 11, same run, graph-timed, 8-warp CTAs; plain read of
# W + scales 12.73 / 12.09 us): 14336x4096 M = 1 / 4 / 8 nvfp4 15.26 / 15.61 / 16.30 -> 14.80 /
# 15.24 / 15.90 us, mxfp4 14.33 / 14.68 / 15.67 -> 13.90 / 14.19 / 15.27. Where KW cannot grow
# (4096x14336: KW 8 already) 32 alone is slower: same grid 14.53 -> 15.67 us (nvfp4 M=1), split
# 2 16.48. Before the k-interleaved layout (`bbdfb13`), m_tile 16 at 32 (TPW 1, one accumulator
# chain a token half) was not taken: 14336x4096 M = 16 22.50 us nvfp4 vs 19.38 at 16 (TPW 2),
# M = 9 18.58 vs 18.56; 4096x14336 M = 16 22.29 vs 22.33 (same grid); ncu: its A loads kept L1
# 82% busy (TPW 1 reads 4 bytes of A a weight byte at 16 tokens; TPW 2: 2, L1 56%). A a word at
# a time (a_by_word) +-0.5 us; depth 3 at m_tile 8 (62-64 registers) 3-8% slower. Since
# `bbdfb13` (the 4 lanes of a token row read 64 contiguous bytes of A; L1 throughput 53% -> 26%
# at M = 16) m_tile 16 at 32 warps an SM is the faster one on 14336x4096: M = 16 17.01 vs 17.72
# us (nvfp4), 16.01 vs 17.56 (mxfp4); on 4096x14336 it would need split 2 and the rule keeps 16
# (19.25 vs 19.26 nvfp4; 18.71 vs 19.32 mxfp4).
GEMV_WPS32 = {8: True, 16: True}
# ... and by target: ptxas for sm_89 spills 20-584 bytes in those 64-register kernels (NVRTC 13.0
# and 13.5; sm_80's and sm_90a's builds of the same source do not), so Ada keeps 16 warps an SM
GEMV_WPS32_ARCH = per_target({"sm_80": True, "sm_89": False, "sm_90a": True, "sm_100a": True,
                              "sm_120a": True})
# kbit4 weights (kernelgen.kbit_gemm.tiled) take 16 warps an SM (two 8-warp CTAs, each with
# its 32 KB code table). Measured on H100 (session 13, same run, graph-timed, fp16 / bf16 alike),
# the default rule's 32 against 16, us: 14336x4096 M = 1 / 4 / 8 / 16 15.18 / 16.09 / 16.81 /
# 23.53 vs 15.48 / 15.86 / 16.26 / 20.00; 4096x14336 M = 16 21.43 vs 20.04 (M <= 8: 16 either
# way); 4096x4096 M = 16 9.60 vs 11.35 (at TPW 2; TPW 1 at 16, below, 9.10). 32 wins at M = 1
# (2-3%) and loses from M = 4 on; m_tile 16 at 32 also spills on sm_90a (16 bytes).
KBIT4_WPS = 16
# kbit4 keeps TPW 2 (KBIT4_TPW) only where its CTAs cover every SM (this many a SM); else TPW 1,
# twice the CTAs. Measured on H100 (session 13, same run, graph-timed, fp16), TPW 2 -> 1, us:
# 4096x4096 M = 9 / 16 11.02 / 11.40 -> 8.42 / 9.10 (128 -> 256 CTAs); 1024x4096 9.23 / 9.44 ->
# 5.71 / 6.03 (32 -> 64); 14336x4096 (224 CTAs at TPW 2) 19.11 / 19.80 vs 19.29 / 21.15 at TPW 1.
KBIT4_TPW2_MIN_CTAS = 1
# kbit4's TPW by m_tile (GEMV_TPW for the FP4 formats), under the same two rules (no global K
# split, KBIT4_TPW2_MIN_CTAS). m_tile 8 takes 2 since its scales apply after the mma (gemv.cuh
# POST, session 19): H100, graph-timed, fp16, twice each, 14336x4096 (224 CTAs at kw 4) M = 1
# 14.40 / 14.32 -> 14.13 / 14.03 us, M = 8 15.34 / 15.28 -> 14.70 / 14.68; 4096x14336 keeps
# TPW 1 (TPW 2 needs split 2: 13.77 -> 15.59), 4096x4096 too (128 CTAs < 132 SMs).
KBIT4_TPW = {8: 2, 16: 2}
# kbit4 tiles take at most 64 tokens (its selector sends M > 128 to dequantize + cuBLAS; a
# forced tile path there keeps BM 64, which fits every arch's shared memory with the 32 KB table)
KBIT4_TILE_BM_MAX = 64
# A through a per-warp cp.async ring in shared memory (Fp4GemvConfig.a_ring) is NOT taken.
# Measured on H100 (session 12, same graph run, bit-exact) with cp.async.cg (L2 only): 14336x4096
# nvfp4 M = 1 / 8 / 16 122.2 / 37.2 / 47.6 us vs 14.56 / 15.36 / 19.20 default; 4096x14336 73.2 /
# 34.0 / 77.4 vs 14.59 / 15.10 / 22.32 (mxfp4 alike): every warp's A went to L2, fewer distinct
# rows slower (rows past M re-read row M-1). The kernel now copies with .ca (L1) and zero-fills
# rows past M once: not yet measured (bench --variants --variant-filter a_ring).


# Tile path: BM by M (largest M of the row), split-K until the CTAs make one wave.
TILE_BM_TABLE: tuple[tuple[int, int], ...] = ((32, 32), (128, 64), (1 << 31, 128))
TILE_MIN_STEPS = 4
# From this M on, W is made dense in A's dtype (one kernel, templates/fp4_gemm/dequant.cuh: 2.56
# bytes of traffic a weight, ~89% of the copy rate) and cuBLAS multiplies (kernelgen/core/
# dense.py): the mma.sync tile path runs at 0.3-0.45x cuBLAS fp16 from M = 129 on (BM 128), its
# loop bound by the decode and the m16n8k16 issue rate, not by the weight bytes. Measured on the
# H100 (session 15, graph-timed, weights rotated past L2, nvfp4 / mxfp4 alike), tile / dequant
# us: 14336x4096 M = 128 70.0 / 103.2, 192 129.1 / 105.6, 256 128.8 / 109.1, 1024 441.7 /
# 219.6, 4096 1764 / 761 (cuBLAS fp16 703); 4096x14336 M = 192 163.2 / 107.2; 4096x4096 M = 192
# 65.8 / 29.8; 28672x4096 M = 128 138.2 / 205.4, 192 267.8 / 210.1. So the tile path keeps M <=
# 128 (BM <= 64) and dequantize + cuBLAS takes every M above.
DENSE_MIN_M = 129
# The wgmma path (sm_90a: each step's weights decoded into shared memory, wgmma m64nBMk16) takes
# WGMMA_MIN_M..WGMMA_MAX_M tokens where every K split keeps >= WGMMA_MIN_STEPS 128-k steps (its
# prologue, drain and split-K epilogue amortised). Measured on the H100 (session 17, graph-timed,
# weights rotated past L2), wgmma / what the rule gave before, us: nvfp4 14336x4096 (112 row
# CTAs, 32 steps) M = 32 28.7 / 26.7 (gemv), 64 29.9 / 44.7 (gemv), 128 40.9 / 69.4 (tile), 192
# 66.0 / 105.1 (dequant), 256 69.6 / 109.4, 1024 290 / ~237; tiled kbit4 14336x4096 M = 64 30.6
# / 51.8, 128 41.6 / 91.7, 256 67.2 / 110.8, 1024 284.7 / 237.4; 4096x14336 (32 row CTAs, split
# 4: 28 steps) M = 16 30.1 / 18.8, 64 37.7 / 51.8, 128 55.6 / 89.9, 256 93.9 / 116.9; 4096x4096
# (split 4: 8 steps) M = 64 21.3 / 16.7 (nvfp4) and 20.2 / 18.3 (kbit4), 128 34.4 / 25.3, 256
# 63.0 / 32.2: too few steps a split. Its loop is bound by the decode's issue latency (ncu, M =
# 64: 304 instructions a warp a step, 2 warps a scheduler, tensor pipe 31% busy; BENCHMARKS.md).
WGMMA_MIN_M = 33
WGMMA_MAX_M = 256
WGMMA_MIN_STEPS = 16
# ... and, unsplit (the weight's 128-row CTAs already cover the SMs), WGMMA_SHORT_K_M tokens on a
# K of at least WGMMA_SHORT_K_STEPS steps: the few steps cost a short pipeline, not a split-K
# epilogue. H100 (session 34, BENCHMARKS.md; graph-timed, rotated), wgmma / the rule's path
# before (tile, gemv), kbit4 and nvfp4 at M = 64 / 96 / 128 on 24576x1536, 18432x1536,
# 16384x1536, 32768x1024 and 20480x1024: faster in all 30 rows, by 0.2-55% (24576x1536 kbit4
# M = 128 37.81 / 57.86 us, 16384x1536 19.36 / 42.20). At M = 48 it lost 3 of 10 rows to
# the tile path (+20% kbit4 on 18432x1536, 20480x1024) and at 192 / 256 half of them to dequantize
# + cuBLAS (by up to 38%, where the CTAs leave a second wave mostly empty).
WGMMA_SHORT_K_M = (49, 128)
WGMMA_SHORT_K_STEPS = 8
# Where the GEMV needs at most 3 passes (M <= WGMMA_WAVE_M) and, on such a short K, past 128
# tokens, the wgmma path takes the weight only where its CTAs fill their waves (wave_fill >=
# WGMMA_WAVE_MIN): a last wave mostly empty costs a whole CTA's time for few rows. H100, session
# 35 (`examples/tune_paths.py`, graph-timed, rotated; kbit4 / nvfp4 / mxfp4, 12 shapes of K =
# 1024..4096 with 96..256 row CTAs, BENCHMARKS.md), us, wgmma against the best other path:
# M = 40 / 48 on 18432x1536 (fill 0.55), 20480x1024 (0.61), 22528x1536 (0.67), 18432x2048,
# 20480x2048, 20480x4096 the GEMV was 9-40% faster (nvfp4 18432x2048 M = 40: 31.2 / 23.3); on
# 24576x1536 (0.73), 28672x1536 (0.85), 16384x1536 and 32768x1024 (0.97) wgmma was 4-53%
# faster. At M = 56 (4 passes) wgmma won on every shape (22528x1536 nvfp4 26.9 / 29.4 tile).
# M = 160..256 on K = 1024 / 1536: wgmma 2-49% faster at fill >= 0.73 (28672x1536 kbit4 M =
# 192 59.2 / 82.5 dequantize + cuBLAS), dequantize + cuBLAS 0-38% faster at <= 0.61; 0.67
# (22528x1536) and 12288x1536 (one wave of 96) are mixed (kbit4 wgmma 5-11% faster, nvfp4 up to
# 7% slower). Past 128 tokens K = 2048 (16 steps) counts as short: 17408x2048 (0.52) and
# 18432x2048 (0.55) ran dequantize 1-26% faster, 20480x2048 (0.61) was mixed (kbit4 wgmma up to
# 8% faster, nvfp4 up to 5% slower); at K = 4096 wgmma held at 0.53-0.55 (18432x4096 123-142
# against 135-144 us). The bound was 0.7 until a held-out grid (BENCHMARKS.md, session 35) ran
# 23552x2048 (fill 0.697) at M = 36 / 44 8-26% faster on wgmma than on the GEMV; 22528x1536
# (0.667) went the other way, so it is 0.68, and that grid no longer holds out for it.
WGMMA_WAVE_M = 48
WGMMA_WAVE_MIN = 0.68
# Past 128 tokens on a short K the fill that pays falls as K grows (longer pipelines amortise a
# CTA's fixed cost) and is higher for NVFP4 (twice the scales to decode a step); dequantize +
# cuBLAS costs the same for every format. WGMMA_LATE_FILL[fmt] = the bound at (8, 16) steps,
# linear between. H100, session 36 (`examples/tune_paths.py`, graph-timed, rotated; 270 rows of
# sessions 34-36 at M = 144..256, BENCHMARKS.md), wgmma against dequantize + cuBLAS: kbit4 at 8
# steps 18% slower at fill 0.64 (21504x1024 M = 144), 10-14% faster at 0.73 (36864x1024); at 16
# steps 9-13% slower at 0.52 (17408x2048), a tie at 0.55, 1-7% faster at 0.61 (10240x2048,
# 20480x2048) and 17-24% at 0.67 (22528x2048); mxfp4 alike. NVFP4 at 8 steps 3-11% slower at
# 0.73 (36864x1024), 2-3% faster at 0.82 (27648x1024); at 12 steps 1-8% slower at 0.67, mixed at
# 0.73 (12288x1536 one wave of 96: 2-5% slower, 24576x1536: 1-9% faster); at 16 steps mixed at
# 0.61, 7-16% faster at 0.67 (22528x2048). (The single bound 0.68 left 22528x2048 kbit4 M = 240
# at 99.7 against 75.2 us.)
WGMMA_LATE_FILL = {"nvfp4": (0.78, 0.64), "mxfp4": (0.70, 0.58), "kbit4": (0.70, 0.58)}


def late_fill(fmt: str, q: int) -> float:
    """The wave fill the wgmma path needs past 128 tokens on an unsplit K of q <= 16 steps."""
    lo, hi = WGMMA_LATE_FILL[fmt]
    span = WGMMA_MIN_STEPS - WGMMA_SHORT_K_STEPS
    return lo + (hi - lo) * (min(max(q, WGMMA_SHORT_K_STEPS), WGMMA_MIN_STEPS) - WGMMA_SHORT_K_STEPS) / span


DEQUANT_CTAS_PER_SM = 8  # 256-thread CTAs of the dequantize kernel: a full SM, one chunk a thread
# stages per (arch, bm): as deep as the arch's shared memory allows for one CTA an SM (and the
# device's, where a part allows less: 8.6 under sm_80 and sm_89 take 99 KB a block)
SMEM_BUDGET = per_target({"sm_80": 160 * 1024, "sm_90a": 220 * 1024, "sm_100a": 220 * 1024,
                          "sm_120a": 99 * 1024})
MAX_STAGES = 4


@dataclass(frozen=True)
class Plan:
    """One launch: config, K splits, quad steps (128 k) per split, grid, block, dynamic smem,
    warps a tile along K (bandwidth path)."""

    config: Fp4GemvConfig | Fp4TileConfig | Fp4DequantConfig | Fp4WgmmaConfig
    split: int
    sps: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    kw: int = 1  # bandwidth path: warps a tile along K (a power of two dividing the CTA's warps)

    @property
    def path(self) -> str:
        if isinstance(self.config, Fp4DequantConfig):
            return "dequant"
        if isinstance(self.config, Fp4WgmmaConfig):
            return "wgmma"
        return "gemv" if isinstance(self.config, Fp4GemvConfig) else "tile"

    @property
    def warps_launched(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2] * self.block[0] // 32

    @property
    def balanced(self) -> bool:
        return isinstance(self.config, Fp4GemvConfig) and self.config.balanced

    def scratch_sizes(self, m: int, n: int) -> tuple[int, int] | None:
        """(fp32 workspace elements, counters) of the launch's scratch, None without one: a K
        split's partial C per split and tile counters; a balanced GEMV's two part slots a warp
        (its lanes' fp32 sums) and a counter a unit of TPW tiles."""
        if self.balanced:
            c = self.config
            nv = c.tpw * (c.m_tile // 8) * 4
            tiles = -(-n // 16)
            return self.grid[0] * c.warps * 2 * nv * 32, -(-tiles // c.tpw)
        return (self.split * m * n, self.counters) if self.split > 1 else None

    @property
    def counters(self) -> int:
        """Split-K tile counters the launch uses (grid.x x the non-split grid dim)."""
        if self.path == "dequant":
            return 0
        g = self.grid
        return g[0] * (g[2] if self.path == "gemv" else g[1])

    def short(self) -> str:
        if self.path == "dequant":
            return f"dequant: {self.config.short()} + cuBLAS, grid={self.grid} block={self.block}"
        kw = f" kw={self.kw}" if self.path == "gemv" else ""
        return (f"{self.path}: {self.config.short()} split={self.split}{kw} k_per_split="
                f"{self.sps * STEP_K} grid={self.grid} block={self.block} smem={self.smem}")


def check_shape(n: int, k: int, name: str = "W") -> None:
    """N >= 1 and K a positive multiple of 128 (a lane's 16-byte chunk of 32 elements, four
    lanes a step; also a whole number of NVFP4 (16) and MXFP4 (32) groups)."""
    if n < 1 or k < STEP_K or k % STEP_K:
        raise ValueError(f"{name}: shape [N={n}, K={k}]; the FP4 GEMM needs N >= 1 and K a "
                         f"positive multiple of {STEP_K}")


def _smem_budget(arch: str, smem_limit: int | None) -> int:
    return min(SMEM_BUDGET[arch], smem_cap(arch, smem_limit))


def stages_for(arch: str, fmt: str, bm: int, smem_limit: int | None = None) -> int:
    """The deepest tile pipeline up to MAX_STAGES that fits SMEM_BUDGET[arch] and the device's
    shared memory a block (`smem_limit`; None: the target's)."""
    cap = _smem_budget(arch, smem_limit)
    for s in range(MAX_STAGES, 1, -1):
        if tile_smem(fmt, bm, s) <= cap:
            return s
    raise UnsupportedConfigError(f"fp4 tile BM={bm} ({fmt}): 2 stages need {tile_smem(fmt, bm, 2)} "
                                 f"B of shared memory a block, {arch} on this device allows {cap} "
                                 f"B; use path='gemv'")


def bm_for(m: int) -> int:
    for max_m, bm in TILE_BM_TABLE:
        if m <= max_m:
            return bm
    raise AssertionError("unreachable")


# the BMs dispatch can give the tile path (M in (GEMV_MAX_M, DENSE_MIN_M)); BM 128 is forced only
TILE_DISPATCH_BMS = tuple(sorted({bm_for(m) for m in range(GEMV_MAX_M + 1, DENSE_MIN_M)}))


# PDL early release (gemv.cuh PF): for small weights (N * K <= PF_MAX_ELEMS) at M <= PF_MAX_M on
# the archs that launch with PDL, each warp prefetches its first PF_STEPS steps into L2 before it
# waits for the grid before it, then releases the next grid: the ramp of a short grid overlaps
# the tail of the one before. Measured on H100 (session 18, graph replays of back-to-back calls,
# weights rotated past L2), us, pf 0 -> 1: 4096x4096 M = 1 nvfp4 5.89 -> 5.49, mxfp4 5.66 ->
# 5.17, kbit4 6.09 -> 5.62 (M = 16 8.45 -> 7.89); 1024x4096 kbit4 4.34 -> 4.14, 2048x4096 4.75
# -> 4.62. Larger weights lose: 6144x4096 nvfp4 M = 1 7.68 -> 8.16, 14336x4096 mxfp4 13.45 ->
# 13.79, kbit4 M = 16 18.73 -> 20.21 (pf 2 / 4 slower than 1 on 4096x4096). sm_80 has no PDL:
# a prefetch there would only add latency.
PF_STEPS = 1
PF_MAX_ELEMS = 1 << 24
PF_MAX_M = 16
PF_ARCHS = targets_like("sm_90a", "sm_100a", "sm_120a")


def pf_for(arch: str, m: int, n: int, k: int) -> int:
    """Steps each GEMV warp prefetches into L2 before its PDL wait (0: wait first). A pure
    function of the shape (the selector memoises it): with KERNELGEN_PDL=0 the prefetch still
    runs, without the overlap it is there for (not measured)."""
    return PF_STEPS if arch in PF_ARCHS and m <= PF_MAX_M and n * k <= PF_MAX_ELEMS else 0


def kw_steps_ok(kw: int, steps: int, kw_max: int, min_steps: int = MIN_STEPS) -> bool:
    """kw warps may share a unit's steps of 128 k: kw 1, or up to kw_max with min_steps each."""
    return kw == 1 or (kw <= kw_max and -(-steps // kw) >= min_steps)


def kw_for(units: int, steps: int, ctas_cap: int, kw_max: int, min_steps: int = MIN_STEPS) -> int:
    """Warps a tile unit along K: the largest up to kw_max whose CTAs (counted in CTAs of
    GEMV_WARPS) fit ctas_cap and whose warps get min_steps (MIN_STEPS: also the MoE experts'
    rule, kernelgen/moe/kbit.py plan_kbit_gemv; short_k_kw passes 1)."""
    for kw in KW_CHOICES:
        if kw == 1 or (kw_steps_ok(kw, steps, kw_max, min_steps)
                       and -(-units * kw // GEMV_WARPS) <= ctas_cap):
            return kw
    raise AssertionError("unreachable")


def gemv_m_tile(m: int) -> int:
    """Tokens a pass of the bandwidth path: 8 up to M = 8, else 16."""
    return 8 if m <= 8 else 16


# kbit4 decodes through the wide (64 KB) code table wherever the SM's shared memory holds it for
# every resident CTA: one PRMT forms a pair's table offset, 2 instructions a pair instead of 3
# (fp4.cuh kbit4_word_wide; H100, session 23: 0-2% faster at M <= 8, up to 8% at bf16 M = 16);
# on parts of 100 KB an SM the 32 KB table keeps 2 CTAs.
def kbit4_lut_wide(arch: str, m_tile: int, warps: int, wps: int, smem_limit: int | None = None) -> bool:
    """Whether the kbit4 GEMV takes the wide code table: its wps / warps CTAs an SM each fit
    the 64 KB table, gemv.cuh's K-slice sums (static, warps x m_tile x 128 bytes) and the 1 KB
    the driver keeps a block in the SM's shared memory (`smem_limit`: the device's a block)."""
    per_cta = KBIT4_WIDE_LUT_BYTES + warps * m_tile * 128 + 16 + KB
    return max(1, wps // warps) * per_cta <= smem_per_sm(arch, smem_limit)


# The balanced GEMV (gemv.cuh BAL: the grid's warps take equal runs of (unit, step) blocks; a
# unit shared by runs adds its parts through ws, one fence, counter and finisher a run) replaces
# the kw plan for kbit4 where that plan leaves many of the SMs' CTA slots empty (FILL: its CTAs
# over KBIT4_WPS / GEMV_WARPS a SM) on weights of at least BAL_MIN_ELEMS. Its finish adds ~2-3 us
# at the end of the grid (an L2 round trip for the counter, one for the parts), which full
# grids do not win back. Measured on H100 (session 23, graph-timed, rotated, fp16), kw plan ->
# balanced, us: M = 1: 17408x4096 (fill 0.52) 20.40 -> 19.42, 18432x5120 (0.55) 25.15 ->
# 23.67, 10240x8192 (0.61) 21.55 -> 21.81, 22016x4096 (0.65) 21.64 -> 22.39, 12288x4096 (0.73)
# 13.47 -> 15.59, 14336x4096 (0.85) 14.42 -> 17.44; M = 16: 29.14 -> 25.48, 34.90 -> 29.15,
# 30.38 -> 28.00, 29.68 -> 27.90, 18.34 -> 20.32, 18.69 -> 22.41; 4096x4096 M = 1 5.54 -> 9.27.
# The FP4 formats' plans (32 warps an SM where it pays) lost in every shape tried (14336x4096,
# 4096x14336, 10240x8192: 15-33% slower): forced only.
BAL_FILL = {8: 0.56, 16: 0.66}  # by m_tile: balanced where the kw plan's fill is at most this
BAL_MIN_ELEMS = 1 << 26


def balanced_takes(fmt: str, m: int, n: int, k: int, sm_count: int, kw_plan: Plan) -> bool:
    """Whether dispatch runs the balanced GEMV (gemv.cuh BAL) instead of kw_plan (see BAL_FILL)."""
    if fmt in FMTS or n * k < BAL_MIN_ELEMS:
        return False
    cfg = kw_plan.config
    slots = cfg.warps_per_sm // cfg.warps * sm_count
    ctas = kw_plan.grid[0] * kw_plan.grid[1] * kw_plan.grid[2]
    return ctas <= BAL_FILL[cfg.m_tile] * slots


# the balanced GEMV keeps the table's TPW but at m_tile 16 on the archs where TPW 2 spills
# there (ptxas, CUDA 13: 28-120 bytes on sm_100a / sm_120a; none on sm_80 / sm_90a, where TPW 2
# is 3-18% faster at M = 16 on H100, equal at M = 9)
BAL_TPW2_M16_ARCHS = targets_like("sm_80", "sm_90a")


def balanced_tpw(arch: str, fmt: str, m_tile: int) -> int:
    """Tiles a warp of the balanced GEMV (see BAL_TPW2_M16_ARCHS)."""
    tpw = (GEMV_TPW if fmt in FMTS else KBIT4_TPW)[m_tile]
    return 1 if m_tile == 16 and arch not in BAL_TPW2_M16_ARCHS else tpw


def _balanced(arch, m, n, k, fmt, dtype, sm_count, enc, smem_limit) -> Plan | None:
    """The balanced GEMV (one pass of M_TILE tokens, 16 warps an SM in CTAs of GEMV_WARPS,
    balanced_tpw): as many CTAs as fit the SMs at once, fewer where the blocks would not give
    every warp one; None where M needs two passes."""
    m_tile = gemv_m_tile(m)
    if m > m_tile:
        return None
    wps = KBIT4_WPS if fmt not in FMTS else 16
    tpw = balanced_tpw(arch, fmt, m_tile)
    tiles = -(-n // 16)
    blocks = -(-tiles // tpw) * (k // STEP_K)
    if blocks >= 1 << 31:  # the kernel counts blocks (and run starts past them) in 32 bits
        return None
    ctas = min(wps // GEMV_WARPS * sm_count, -(-blocks // GEMV_WARPS))
    cfg = Fp4GemvConfig(arch=arch, fmt=fmt, dtype=dtype, enc=enc, m_tile=m_tile, warps=GEMV_WARPS,
                        depth=GEMV_DEPTH, tpw=tpw, warps_per_sm=wps, balanced=True,
                        lut_wide=fmt == "kbit4" and kbit4_lut_wide(arch, m_tile, GEMV_WARPS, wps, smem_limit))
    cfg.check()
    return Plan(cfg, 1, k // STEP_K, (ctas, 1, 1), (GEMV_WARPS * 32, 1, 1), cfg.smem_bytes(), 1)


def _gemv(arch, m, n, k, fmt, dtype, sm_count, split, tpw, wps, enc, smem_limit=None,
          balanced=None):
    if balanced or (balanced is None and split is None and tpw is None and wps is None):
        b = _balanced(arch, m, n, k, fmt, dtype, sm_count, enc, smem_limit)
        if balanced and b is None:
            raise ValueError(f"balanced=True: M={m}; the balanced GEMV takes one pass of at most 16 "
                             f"tokens and fewer than 2^31 (tile unit, step) blocks")
        if b is not None and balanced:
            return b
        if b is not None:
            p = _gemv(arch, m, n, k, fmt, dtype, sm_count, split, tpw, wps, enc, smem_limit, False)
            return b if balanced_takes(fmt, m, n, k, sm_count, p) else p
    m_tile = gemv_m_tile(m)
    if wps is None and fmt not in FMTS:  # kbit4: 16 (see KBIT4_WPS)
        wps = KBIT4_WPS
    if wps is None:  # 32 warps an SM only where it launches 2x the warps without more K splits
        p = _gemv(arch, m, n, k, fmt, dtype, sm_count, split, tpw, 16, enc, smem_limit, False)
        if GEMV_WPS32[m_tile] and GEMV_WPS32_ARCH[arch] and tpw in (None, 1):
            p32 = _gemv(arch, m, n, k, fmt, dtype, sm_count, split, 1, 32, enc, smem_limit, False)
            if p32.warps_launched >= 2 * p.warps_launched and p32.split <= p.split:
                return p32
        return p
    if tpw is None and wps == 32:  # <= 64 registers: one tile a warp
        tpw = 1
    if tpw is None:  # the table's TPW unless it would need a global K split to fill the GPU
        tpw = (GEMV_TPW if fmt in FMTS else KBIT4_TPW)[m_tile]  # (kbit4: or leave SMs
        # without a CTA, KBIT4_TPW2_MIN_CTAS)
        if tpw > 1:
            p2 = _gemv(arch, m, n, k, fmt, dtype, sm_count, None, tpw, wps, enc, smem_limit, False)
            if p2.split > 1 or (fmt not in FMTS and
                                p2.grid[0] * p2.grid[1] * p2.grid[2] < KBIT4_TPW2_MIN_CTAS * sm_count):
                tpw = 1
    m_tiles = -(-m // m_tile)
    units = -(-n // (16 * tpw))  # a warp's tiles (TPW x 16 W rows)
    q = k // STEP_K
    one_wave = wps // GEMV_WARPS * sm_count  # CTAs of 8 warps
    if split is None:
        kw = kw_for(units, q, max(1, one_wave // m_tiles), KW_MAX[m_tile, wps])
        ctas = -(-units * kw // GEMV_WARPS) * m_tiles
        split = max(1, min(one_wave // ctas, q // (kw * MIN_STEPS)))
    elif not (isinstance(split, numbers.Integral) and 1 <= split <= q):
        raise ValueError(f"split_k={split!r}: must be in 1..{q} (K/{STEP_K}) for K={k}")
    sps = -(-q // split)
    split = -(-q // sps)
    kw = kw_for(units, sps, max(1, one_wave // (m_tiles * split)), KW_MAX[m_tile, wps])
    return _gemv_plan(arch, m, n, k, fmt, dtype, enc, m_tile, tpw, wps, split, sps, kw, smem_limit)


def _gemv_plan(arch, m, n, k, fmt, dtype, enc, m_tile, tpw, wps, split, sps, kw, smem_limit) -> Plan:
    """The K-slice GEMV's launch for a settled TPW, warps an SM, K split and KW."""
    units = -(-n // (16 * tpw))
    m_tiles = -(-m // m_tile)
    cta_warps = GEMV_CTA_WARPS[m_tile, wps] if fmt in FMTS else GEMV_WARPS  # kbit4: 32 KB table a CTA
    warps = cta_warps if kw <= cta_warps else max(GEMV_WARPS, kw)  # KW 16: 16-warp CTAs
    cfg = Fp4GemvConfig(arch=arch, fmt=fmt, dtype=dtype, enc=enc, m_tile=m_tile, warps=warps,
                        depth=GEMV_DEPTH, tpw=tpw, warps_per_sm=wps, pf=pf_for(arch, m, n, k),
                        lut_wide=fmt == "kbit4" and kbit4_lut_wide(arch, m_tile, warps, wps, smem_limit))
    cfg.check()
    grid = (-(-units * kw // warps), split, m_tiles)
    return Plan(cfg, split, sps, grid, (warps * 32, 1, 1), cfg.smem_bytes(), kw)


def no_split(p: Plan, arch, m, n, k, fmt, dtype, enc, sm_count, smem_limit) -> Plan:
    """A K-split GEMV plan of one pass replaced by the unsplit plan (its own TPW, warps an SM
    and KW) where that one gives at least NOSPLIT_SM_FILL of the SMs a CTA and a warp at most
    NOSPLIT_MAX_STEPS[m_tile] steps; other plans as they are."""
    cfg = p.config
    if not isinstance(cfg, Fp4GemvConfig) or cfg.balanced or p.split == 1 or p.grid[2] != 1:
        return p
    alt = _gemv(arch, m, n, k, fmt, dtype, sm_count, 1, None, None, enc, smem_limit, False)
    steps = -(-(k // STEP_K) // alt.kw)
    if alt.grid[0] >= NOSPLIT_SM_FILL * sm_count and steps <= NOSPLIT_MAX_STEPS[cfg.m_tile]:
        return alt
    return p


def short_k_kw(p: Plan, arch, m, n, k, fmt, dtype, enc, sm_count, smem_limit) -> Plan:
    """A K-slice GEMV plan whose split's K range is at most SHORT_K_STEPS quad steps and whose
    warps are fewer than SHORT_K_BUSY_WARPS an SM, with the largest KW whose CTAs fit one wave
    at its TPW, warps an SM and split even where a warp gets fewer than MIN_STEPS (KW may pass
    the steps: 4096x1024 M = 16, 8 steps, ran fastest at KW 16, the idle warps adding zero
    sums); other plans as they are."""
    cfg = p.config
    if (not isinstance(cfg, Fp4GemvConfig) or cfg.balanced or p.sps > SHORT_K_STEPS
            or p.warps_launched >= SHORT_K_BUSY_WARPS * sm_count):
        return p
    units = -(-n // (16 * cfg.tpw))
    one_wave = cfg.warps_per_sm // GEMV_WARPS * sm_count
    kw = kw_for(units, p.sps, max(1, one_wave // (p.grid[2] * p.split)),
                KW_MAX[cfg.m_tile, cfg.warps_per_sm], min_steps=1)
    if kw <= p.kw:
        return p
    return _gemv_plan(arch, m, n, k, fmt, dtype, enc, cfg.m_tile, cfg.tpw, cfg.warps_per_sm,
                      p.split, p.sps, kw, smem_limit)


def _tile(arch, m, n, k, fmt, dtype, sm_count, split, enc, smem_limit):
    bm = bm_for(m) if fmt in FMTS else min(bm_for(m), KBIT4_TILE_BM_MAX)
    # where not even 2 stages of BM fit the device: the largest smaller BM that fits
    cap = _smem_budget(arch, smem_limit)
    bm = next((b for b in sorted(TILE_BMS, reverse=True) if b <= bm and tile_smem(fmt, b, 2) <= cap), bm)
    cfg = Fp4TileConfig(arch=arch, fmt=fmt, dtype=dtype, enc=enc, bm=bm,
                        stages=stages_for(arch, fmt, bm, smem_limit), warps_t=TILE_BMS[bm])
    return _tile_plan(cfg, m, n, k, split, lambda ctas: -(-sm_count // ctas))


def _tile_plan(cfg: Fp4TileConfig | Fp4WgmmaConfig, m: int, n: int, k: int, split: int | None,
               splits_to_fill: Callable[[int], int]) -> Plan:
    """A tile kernel's launch: 128 W rows x BM tokens a CTA, K split `split` times, or (None)
    splits_to_fill(CTAs) times but keeping TILE_MIN_STEPS steps a split."""
    q = k // STEP_K
    if split is None:
        split = _auto_split(q, -(-n // TILE_BN) * -(-m // cfg.bm), splits_to_fill)
    elif not (isinstance(split, numbers.Integral) and 1 <= split <= q):
        raise ValueError(f"split_k={split!r}: must be in 1..{q} (K/{STEP_K}) for K={k}")
    sps = -(-q // split)
    split = -(-q // sps)
    grid = (-(-n // TILE_BN), -(-m // cfg.bm), split)
    return Plan(cfg, split, sps, grid, (cfg.threads, 1, 1), cfg.smem_bytes())


def _auto_split(q: int, ctas: int, splits_to_fill: Callable[[int], int]) -> int:
    """K splits of a tile kernel with `ctas` CTAs a split over q steps: splits_to_fill(ctas),
    keeping TILE_MIN_STEPS steps a split."""
    return max(1, min(splits_to_fill(ctas), q // TILE_MIN_STEPS))


def _wgmma_fill(sm_count: int) -> Callable[[int], int]:
    """One CTA an SM: split K while the CTAs of every split still fit the SMs."""
    return lambda ctas: sm_count // ctas


def wgmma_takes(arch: str, m: int, n: int, k: int, sm_count: int, fmt: str = "nvfp4",
                smem_limit: int | None = None) -> bool:
    """Whether dispatch runs the wgmma path (see WGMMA_MIN_M, WGMMA_SHORT_K_M, WGMMA_WAVE_MIN):
    also not where the device's shared memory a block (`smem_limit`) holds no pipeline of its BM."""
    if arch not in WGMMA_ARCHS or not WGMMA_MIN_M <= m <= WGMMA_MAX_M:
        return False
    bm, q = wgmma_bm(m), k // STEP_K
    if wgmma_smem(bm, 2, 0, fmt) > min(WGMMA_SMEM_MAX, smem_cap(arch, smem_limit)):
        return False
    ctas = -(-n // TILE_BN) * -(-m // bm)
    split = _auto_split(q, ctas, _wgmma_fill(sm_count))
    fill = wave_fill(ctas * split, sm_count)
    full = fill >= WGMMA_WAVE_MIN
    if split == 1 and q <= WGMMA_MIN_STEPS:  # a short K, unsplit
        if q < WGMMA_SHORT_K_STEPS:
            return False
        if m > WGMMA_SHORT_K_M[1]:
            return fill >= late_fill(fmt, q)
        return m >= WGMMA_SHORT_K_M[0] or full
    if -(-q // split) < WGMMA_MIN_STEPS:
        return False
    return m > WGMMA_WAVE_M or ctas * split <= sm_count or full


def wgmma_bm(m: int) -> int:
    """Tokens a CTA of the wgmma path: the smallest WGMMA_BMS entry covering M, else the largest."""
    return next((b for b in WGMMA_BMS if m <= b), WGMMA_BMS[-1])


def wgmma_pipeline(bm: int, cap: int, fmt: str = "nvfp4") -> tuple[int, int]:
    """(stages, inflight) of the wgmma path at BM within `cap` bytes of shared memory: one wgmma
    group kept in flight across the barrier (a third dense weight buffer) with the deepest A
    pipeline of >= 3 stages that fits, else none with the deepest that fits."""
    for inflight in (1, 0):
        for stages in range(MAX_STAGES, 1 + inflight, -1):
            if wgmma_smem(bm, stages, inflight, fmt) <= cap:
                return stages, inflight
    raise UnsupportedConfigError(f"fp4 wgmma BM={bm} ({fmt}): 2 stages need "
                                 f"{wgmma_smem(bm, 2, 0, fmt)} B of shared memory a block, the "
                                 f"device allows {cap} B")


def _wgmma(arch, m, n, k, fmt, dtype, sm_count, split, enc, smem_limit):
    if arch not in WGMMA_ARCHS:
        raise ValueError(f"path='wgmma': needs one of {WGMMA_ARCHS}, not {arch}")
    bm = wgmma_bm(m)
    stages, inflight = wgmma_pipeline(bm, min(WGMMA_SMEM_MAX, smem_cap(arch, smem_limit)), fmt)
    cfg = Fp4WgmmaConfig(arch=arch, fmt=fmt, dtype=dtype, enc=enc, bm=bm, stages=stages,
                         inflight=inflight)
    return _tile_plan(cfg, m, n, k, split, _wgmma_fill(sm_count))


def path_for(m: int, n: int, sm_count: int) -> str:
    """The bandwidth path ("gemv"), the tile path or dequantize + cuBLAS ("dequant") for M
    tokens (see GEMV_MAX_M, DENSE_MIN_M)."""
    ctas = -(-n // TILE_BN)
    if (m <= GEMV_MAX_M or m <= GEMV_FEW_CTAS_MAX_M and ctas < sm_count
            or m <= GEMV_MID_MAX_M and ctas < GEMV_MID_CTAS * sm_count
            or m <= GEMV_VERY_FEW_CTAS_MAX_M and 4 * ctas <= sm_count):
        return "gemv"
    return "dequant" if m >= DENSE_MIN_M else "tile"


def _dequant(arch: str, n: int, k: int, fmt: str, dtype: str, sm_count: int, enc: str) -> Plan:
    cfg = Fp4DequantConfig(arch=arch, fmt=fmt, dtype=dtype, enc=enc)  # checked as it is made
    chunks = -(-n // 16) * (k // STEP_K) * 64  # one 16-byte chunk (32 weights) a thread
    if chunks >= 1 << 31:
        raise ValueError(f"W: [N={n}, K={k}] is {chunks} chunks of 32 weights (rows padded to 16); "
                         f"the dequant path takes fewer than 2**31")
    grid = (max(1, min(-(-chunks // DEQUANT_THREADS), DEQUANT_CTAS_PER_SM * sm_count)), 1, 1)
    return Plan(cfg, 1, k // STEP_K, grid, (DEQUANT_THREADS, 1, 1), 0)


def plan(arch: str, m: int, n: int, k: int, fmt: str, dtype: str, sm_count: int,
         path: str | None = None, split: int | None = None, tpw: int | None = None,
         wps: int | None = None, enc: str | None = None, smem_limit: int | None = None,
         balanced: bool | None = None) -> Plan:
    """Pure planner. `path` ("gemv" / "tile" / "dequant" / "wgmma": sm_90a; a
    `split` without a path never gives wgmma, and where the rule says dequant gives the tile
    path), `split`, `tpw`
    (tiles a warp of the bandwidth path, 1 or 2) and `wps` (its resident warps an SM, 16 or 32;
    32 implies TPW 1) force a choice (tests, tuning). `enc`: the activation type the weight
    words are encoded for (Fp4Weight.encoding; default dtype). `smem_limit`: the device's
    shared memory a block (kernelgen.core.interop.smem_limit; None: the target's): the tile and
    wgmma paths keep the stages (and the tile path the BM) that fit it, kbit4's bandwidth path
    the code table that fits its CTAs (kbit4_lut_wide). `balanced` (bandwidth path): True forces
    the balanced GEMV (M <= 16), False the K-slice plans, None the rule (balanced_takes)."""
    check_shape(n, k)
    if m < 1:
        raise ValueError(f"A: M={m}; the FP4 GEMM needs M >= 1")
    if fmt not in GEMV_FMTS:
        raise ValueError(f"W: format {fmt!r}; the FP4 GEMM takes {FMTS} (and kbit4, the "
                         f"tiled 4-bit kbit weights of kernelgen.kbit_gemm)")
    get_arch(arch)
    if path is None:
        # a forced K split keeps the rule's path (the wgmma rule is about its own splits)
        takes = split is None and wgmma_takes(arch, m, n, k, sm_count, fmt, smem_limit)
        path = "wgmma" if takes else path_for(m, n, sm_count)
        if path == "dequant" and split is not None:  # a forced K split asks for the tile path
            path = "tile"
    if tpw is not None and (path != "gemv" or tpw not in TPWS):
        raise ValueError(f"tpw={tpw!r}: expected one of {TPWS}, bandwidth path only (path={path!r})")
    if wps is not None and (path != "gemv" or wps not in GEMV_WARPS_PER_SM):
        raise ValueError(f"wps={wps!r}: expected one of {GEMV_WARPS_PER_SM}, bandwidth path only "
                         f"(path={path!r})")
    if balanced is not None and (path != "gemv" or not isinstance(balanced, bool)):
        raise ValueError(f"balanced={balanced!r}: a bool, bandwidth path only (path={path!r})")
    if balanced and (split is not None or tpw is not None or wps is not None):
        raise ValueError("balanced=True: its grid has no K split, and its TPW and warps an SM are "
                         "its own (balanced_tpw)")
    enc = dtype if enc is None else enc
    if path == "dequant":
        if fmt not in FMTS:
            raise ValueError(f"path='dequant': {fmt} weights have their own (kernelgen.kbit_gemm.tiled)")
        if split is not None:
            raise ValueError(f"split_k={split}: the dequant path (dequantize + cuBLAS) has no K split")
        return _dequant(arch, n, k, fmt, dtype, sm_count, enc)
    if path == "gemv":
        p = _gemv(arch, m, n, k, fmt, dtype, sm_count, split, tpw, wps, enc, smem_limit, balanced)
        if split is None and tpw is None and wps is None:
            p = no_split(p, arch, m, n, k, fmt, dtype, enc, sm_count, smem_limit)
        return short_k_kw(p, arch, m, n, k, fmt, dtype, enc, sm_count, smem_limit)
    if path == "tile":
        return _tile(arch, m, n, k, fmt, dtype, sm_count, split, enc, smem_limit)
    if path == "wgmma":
        return _wgmma(arch, m, n, k, fmt, dtype, sm_count, split, enc, smem_limit)
    raise ValueError(f"path={path!r}: expected 'gemv', 'tile', 'wgmma', 'dequant' or None")


@selector
def select_fp4(arch: str, m: int, n: int, k: int, fmt: str, dtype: str, sm_count: int,
               enc: str | None = None, smem_limit: int | None = None) -> Plan:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1);
    `enc` and `smem_limit` as in plan."""
    return plan(arch, m, n, k, fmt, dtype, sm_count, enc=enc, smem_limit=smem_limit)


def pfs_of(arch: str) -> tuple[int, ...]:
    """The PF values dispatch can give a GEMV config on arch (pf_for)."""
    return (0, PF_STEPS) if arch in PF_ARCHS else (0,)


def _shapes(spec: dict[str, Any]) -> list[tuple[int | None, int, int]]:
    return weight_shapes(spec, "fp4_gemm", check_shape)


def _cta_warps(m_tile: int, wps: int) -> list[int]:
    """CTA sizes _gemv can give m_tile at wps warps an SM: the table's, GEMV_WARPS, and KW 16's."""
    return sorted({GEMV_WARPS, GEMV_CTA_WARPS[m_tile, wps]} | ({16} if KW_MAX[m_tile, wps] >= 16 else set()))


# M values that reach every bucket of the tables: each M the bandwidth path can take (its plan
# depends on the passes, hence on M) and both ends of every BM bucket.
def _probe_ms() -> list[int]:
    ms = list(range(1, GEMV_VERY_FEW_CTAS_MAX_M + 2))
    lo = GEMV_MAX_M + 1
    for max_m, _ in TILE_BM_TABLE:
        ms += [lo, min(max_m, 1 << 16)]
        lo = max_m + 1
    return ms + wgmma_probe_ms()


def wgmma_probe_ms() -> list[int]:
    """Both ends of every BM bucket of the wgmma path's M range."""
    lo, ms = WGMMA_MIN_M, []
    for bm in WGMMA_BMS:
        if bm >= lo:
            ms += [lo, min(bm, WGMMA_MAX_M)]
            lo = bm + 1
    return ms


def wgmma_configs(arch: str, fmt: str, dtype: str) -> list[Fp4WgmmaConfig]:
    """The wgmma configs dispatch can pick for (arch, fmt, dtype): each BM's pipeline (the
    shape does not enter the config; sm_90a's parts share one shared-memory limit)."""
    if arch not in WGMMA_ARCHS:
        return []
    return [plan(arch, bm, 4096, 4096, fmt, dtype, 132, path="wgmma").config for bm in WGMMA_BMS]


# prewarm_configs' spec keys and values (Family.spec_keys)
SPEC_KEYS = {"fmts": FMTS, "dtypes": DTYPES, "shapes": None, "sm_counts": None}


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]
                    ) -> Iterator[Fp4GemvConfig | Fp4TileConfig | Fp4DequantConfig | Fp4WgmmaConfig]:
    """Configs the selector can return on the parts of each arch (kernelgen.arch.parts_of).
    spec: "fmts" (nvfp4 / mxfp4), "dtypes" (others skipped), "shapes" ([N, K]: every M; [M, N,
    K]: that M), "sm_counts". Without shapes: every config dispatch can pick."""
    fmts = tuple(f for f in (spec.get("fmts") or FMTS) if f in FMTS)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = _shapes(spec)
    seen: set = set()
    for arch in archs:
        get_arch(arch)
        for fmt in fmts:
            for dtype in dtypes:
                if not shapes:  # what dispatch can pick (the variants the bench and tests
                    for pf in pfs_of(arch):  # force, e.g. depth 4, TPW 2 at m_tile 8, compile on demand)
                        for m_tile in M_TILES:
                            for tpw in sorted({1, GEMV_TPW[m_tile]}):
                                for warps in _cta_warps(m_tile, 16):
                                    yield Fp4GemvConfig(arch=arch, fmt=fmt, dtype=dtype, enc=dtype,
                                                        m_tile=m_tile, warps=warps, depth=GEMV_DEPTH,
                                                        tpw=tpw, pf=pf)
                        for m_tile in (mt for mt in M_TILES if GEMV_WPS32[mt] and GEMV_WPS32_ARCH[arch]):
                            for warps in _cta_warps(m_tile, 32):
                                yield Fp4GemvConfig(arch=arch, fmt=fmt, dtype=dtype, enc=dtype,
                                                    m_tile=m_tile, warps=warps, depth=GEMV_DEPTH, tpw=1,
                                                    warps_per_sm=32, pf=pf)
                    yield Fp4DequantConfig(arch=arch, fmt=fmt, dtype=dtype, enc=dtype)
                    for bm in TILE_DISPATCH_BMS:  # the stages of each part's shared memory
                        for stages in dict.fromkeys(stages_for(arch, fmt, bm, lim)
                                                    for lim in smem_limits(arch)):
                            yield Fp4TileConfig(arch=arch, fmt=fmt, dtype=dtype, enc=dtype, bm=bm,
                                                stages=stages, warps_t=TILE_BMS[bm])
                    yield from wgmma_configs(arch, fmt, dtype)
                    continue
                for sms, lim in parts_of(arch, spec.get("sm_counts")):
                    for m, n, k in shapes:
                        for mm in (m,) if m is not None else _probe_ms():
                            cfg = plan(arch, int(mm), n, k, fmt, dtype, sms, smem_limit=lim).config
                            if cfg not in seen:
                                seen.add(cfg)
                                yield cfg
