"""Host-side selector of the kbit GEMM's path (GEMV / tensor-core mma / dequantize + cuBLAS)
and of the mma path's tile and K split, as data plus pure functions.

(arch, M, N, K, bits, dtype, SM count, the device's shared memory a block) -> GemmChoice. No GPU
work; `select_gemm` is memoised and printable (KERNELGEN_PRINT_CONFIGS=1) through
`kernelgen.core.select.selector`; `prewarm_mma_configs` walks the same tables over the parts of
each target (kernelgen.arch.PARTS), so prewarm builds exactly what dispatch can pick.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch, parts_of, smem_cap, smem_limits, smem_per_sm
from ..core.config import KernelConfig
from ..core.select import selector, wave_fill
from ..errors import UnsupportedConfigError
from ..kbit.api import check_bits
from .config import BITS, DTYPES
from .select import _shapes, check_shape, plan_gemv
from .tc_config import TILE_K, TILES, KbitMmaConfig, smem_for, stages_for

PATHS = ("gemv", "mma", "dequant")

# -- path crossover ---------------------------------------------------------------------------
# Measured on the H100 (examples/bench_kbit_gemm.py, 4096x4096, 14336x4096, 4096x14336, every
# path forced, weights rotated past L2, back-to-back calls; BENCHMARKS.md "kbit GEMM tensor-core
# path"):
# M <= gemv_max_m: the bandwidth path. At first (M = 32) the mma path was faster for every
# bit-width on the large shapes (14336x4096 4 bits: 44 vs 59 us, 4096x14336: 49 vs 62 us); at
# M = 16 the GEMV was (36 vs >= 48 us).
# Since then the GEMV got faster and takes more M where its passes (16 tokens each, the later
# ones reading the weights mostly from L2) beat the mma tiles: gemv_max_m.
#  - weights of <= GEMV_SMALL_WEIGHT elements (4096x4096), 2-4 bits (H100, session 22,
#    `bench_kbit_gemm.py --layouts flat --bits 2,3,4,5 --ms 13..64`, graph-timed, weights rotated
#    past L2), GEMV / mma us: M = 17 12.6 / 16.2 (2 bits), 16.2 / 17.4 (4 bits); M = 64 19.6 /
#    28.7 (dequant 24.4), 25.2 / 30.0 (dequant 25.7); 5 bits: GEMV_SMALL_5BIT_MAX_M;
#  - larger weights: GEMV_MAX_M by (bits, N >= K), re-measured after the GEMV ran one CTA an SM
#    (session 27, select.py ONE_CTA_MIN_M; same bench, --ms 17,24,32,48,64), GEMV / mma us:
#    14336x4096 M = 64 47.95 / 52.04 (2 bits), 52.13 / 60.91 (3 bits), 28672x4096 M = 64 87.01 /
#    84.75, 99.18 / 101.61; 4 bits 14336x4096 M = 32 39.15 / 42.58, 48 55.56 / 54.41; 5 bits
#    14336x4096 M = 48 66.83 / 71.26 (28672x4096 127.3 / 126.5), 64 87.0 / 73.6; 4096x14336 2 /
#    3 bits M = 48 47.16 / 48.57, 50.97 / 55.86, 64 59.43 / 52.06; 4 bits mma from M = 17 (41.94
#    / 37.01); 5 bits M = 32 50.76 / 52.87, 48 72.00 / 68.84.
GEMV_SMALL_WEIGHT = 1 << 24  # N * K
GEMV_SMALL_MAX_M = 64  # 2-4 bits
# 5 bits: GEMV / mma us 2048x4096 M = 17 / 32 13.4 / 14.5 vs 18.6 / 21.9 (4096x4096: 21.9 / 23.1 vs
# 20.8 / 22.6), then dequantize (DEQUANT_SMALL_MIN_M)
GEMV_SMALL_5BIT_MAX_M = 32
# Session 34 (H100, every path forced, graph-timed, rotated; BENCHMARKS.md "Session 34"): past 64
# tokens the mma path's tile_m 64 takes two token tiles, as much time as at 128, while the GEMV
# adds a pass of 16 tokens at a time: at 2 / 3 bits on 14336x4096, 28672x4096, 11008x4096 (and
# 12288x4096, 32000x4096, 10240x8192 at M = 96) the GEMV was 16-73% faster at M = 65..96 and
# 6-19% at 112 but on 14336x4096 2 bits (84.63 against 83.49 us), so N >= K takes it to 112.
# Session 35 (same method): at M = 128 the 2-bit GEMV was 14-34% faster than the mma path's two
# token tiles on 18432x1536, 24576x1536, 20480x2048, 24576x2048 and 17920x4096 (18432x1536 43.70
# against 58.64 us), and at 3 bits within 2.4% of dequantize + cuBLAS there; where the mma plan
# fills its rounds it wins (MMA_WINDOWS), so N >= K keeps the GEMV to 128 (2 bits) and to 127
# (3 bits; 128 dequantizes).
GEMV_MAX_M: dict[tuple[int, bool], int] = {  # (bits, N >= K) -> M, weights > GEMV_SMALL_WEIGHT
    (2, True): 128, (3, True): 127, (4, True): 32, (5, True): 48,
    (2, False): 48, (3, False): 48, (4, False): 16, (5, False): 32,
}
# ... except MMA_WINDOWS[bits][0] tokens at 2 / 3 bits (N % 128 == 0) where one full 64-token mma tile
# beats the GEMV's 4 passes: on a long K (>= MMA_WINDOW_MIN_K), and where the mma plan runs
# unsplit with its CTAs filling their rounds to MMA_WINDOW_FILL (mma_fill). H100, M = 64, GEMV /
# mma us (examples/tune_paths.py, graph-timed, rotated; sessions 34 and 35, BENCHMARKS.md): K =
# 8192 2 bits 10240x8192 78.76 / 66.70, 8192x8192 64.10 / 53.26, 28672x8192 210.70 / 168.20 (3
# bits 6-9% faster too); unsplit at fill 0.85..0.97 32768x1024 28.02 / 22.83, 28672x1536 34.95 /
# 31.54, 32000x4096 98.60 / 85.68 (3 bits 4-17% faster; 28672x4096 3 bits 7% slower, 2 bits a
# tie). The GEMV was faster on every other weight measured: split mma plans (14336x4096,
# 12288x4096, 16384x1536, 17920x4096 60.40 / 69.87, 18432x1536, 20480x2048) and unsplit ones of
# fill <= 0.73 (24576x1536, 24576x2048, 20480x1024), by 3-39%. (Session 34's rule, weights of
# >= 2^26 elements, took 17920x4096 and left 32768x1024 / 28672x1536.) At M = 48 (one tile of 64
# for 48 tokens) the GEMV was as fast or faster everywhere. The bound was 0.8 until a held-out
# grid (10 more shapes at M = 56 / 64 / 120 / 128) found 26624x1536 (fill 0.79) 5-13% faster on
# mma: between 0.73 and 0.79, it is now 0.75, so no held-out rows are left for it.
# The same at 113..128 tokens (two token tiles against the GEMV's 8 passes): M = 128, mma
# against the faster of the GEMV and dequantize + cuBLAS, us: 16384x1536 2 bits 31.19 / 39.39,
# 3 bits 36.37 / 42.11; 32768x1024 44.27 / 53.08, 51.46 / 57.97; 28672x1536 61.03 / 66.63, 71.16
# / 74.90 (fill 0.85..0.97); K = 8192, 2 bits: 8192x8192 and 28672x8192 (session 34's grids).
# 5 bits (the GEMV to 48 tokens): 33..48, one token tile against 3 passes, M = 48 GEMV / mma
# us: 32768x1024 36.98 / 32.84, 28672x1536 48.55 / 45.90 (fill 0.97 / 0.85); the GEMV faster at
# fill 0.73 (24576x1536 41.65 / 45.44, 24576x2048), 0.61 (20480x1024) and on split plans
# (16384x1536, 18432x1536, 20480x2048, 17920x4096) by 8-33%; at M = 32 on every shape. Fitted
# on those 9 shapes (session 35) with the 2 / 3-bit bound 0.75; a held-out grid of 12 more
# (session 36, M = 40 / 48, BENCHMARKS.md) found the GEMV 8-10% faster at fill 0.76 / 0.79
# (25600x1536, 26624x1536), a tie at 0.85 (28672x4096) and mma 0-12% faster from 0.91
# (30720x1024, 30720x2048, 32000x4096), so 5 bits takes 0.82.
MMA_WINDOWS: dict[int, tuple[tuple[int, int], ...]] = {  # bits -> (first M, last M) windows
    2: ((49, 64), (113, 128)), 3: ((49, 64), (113, 128)), 5: ((33, 48),)}
MMA_WINDOW_MIN_K = {2: 8192, 3: 8192}  # by bits; 5 bits: the fill rule only (no long K measured)
MMA_WINDOW_FILL = {2: 0.75, 3: 0.75, 5: 0.82}  # by bits
# Past the GEMV, small weights (<= GEMV_SMALL_WEIGHT) go to dequantize + cuBLAS sooner: the dequant
# pass is short there and the mma tiles have few CTAs. H100 (session 22, same bench, --ms
# 17..159), mma / dequant us: 4096x4096 M = 65 2 bits 31.6 / 25.3, 4 bits 33.6 / 26.2, 128 34.2 /
# 26.9; 2048x4096 M = 65 27.8 / 15.0 (2 bits), 29.2 / 15.2 (4 bits); 5 bits 4096x4096 M = 32 22.6 /
# 26.3, 48 30.4 / 26.6; 2048x4096 M = 32 21.9 / 13.5.
DEQUANT_SMALL_MIN_M: dict[int, int] = {2: 65, 3: 65, 4: 65, 5: 33}
# M >= DEQUANT_MIN_M[bits]: dequantize W into an fp16/bf16 scratch and call cuBLAS. The mma.sync
# loop runs at ~150-200 TFLOP/s (decode into fragments + A re-read from shared memory by every
# warp bound it), cuBLAS at 600-700, and the dequant pass (2 bytes written per weight) costs as
# much as ~100 rows of mma work, independent of N and K; where the two lines crossed on
# 14336x4096 (4096x14336 agreed within one step): 2 bits 86 vs 101 us at M = 128, 172 vs 108
# at 256; 3 bits 103 vs 102 at 128; 4 bits 94 vs 105 at 128, 162 vs 106 at 192; 5 bits 75 vs 105
# at 64, 126 vs 106 at 128.
# 5 bits from 65 (was 112, session 34): the mma path's two token tiles of 64 took 20-25% longer
# than dequantize + cuBLAS at M = 65..96 on 14336x4096, 28672x4096, 11008x4096 and 4096x14336
# (14336x4096 M = 80 123.5 against 102.4 us); the GEMV was 0.5-8% faster than dequantize at
# M = 65 / 80 on the two largest of them, not on the others.
DEQUANT_MIN_M: dict[int, int] = {2: 160, 3: 128, 4: 144, 5: 65}
# The mma path needs N % 128 == 0 (whole 128-row W tiles); other N take the GEMV path up to
# DEQUANT_MIN_M, where the dequant path (any N) is faster than the mma path and so than the
# GEMV's passes of 16 tokens (each of which reads all of W).
TILE_N_MIN = 128

# -- mma tiles ----------------------------------------------------------------------------------
# (largest M, tile_m): the smallest M tile that covers M (fewer wasted rows), 64 above.
TILE_M_TABLE: tuple[tuple[int, int], ...] = ((32, 32), (1 << 31, 64))
# tile_n = 256 (tile_m 64 only) from this M on, when N % 256 == 0: twice the A reuse per CTA
# (measured: 64x256 ahead of 64x128 from M = 256 on the large shapes, behind below).
TILE_N256_MIN_M = 256
# K split: a split keeps at least this many k-tiles of 64 (pipeline fill is STAGES-1 tiles).
MIN_KT_PER_SPLIT = 4
# cost model of a split (in k-tiles): pipeline fill per work item, and the fp32 partial +
# reduction of a split tile; the split-K workspace stays below this many bytes.
FILL_KT = 3.0
SPLIT_KT = 2.0
MAX_WS_BYTES = 256 << 20


@dataclass(frozen=True)
class MmaPlan:
    """One launch of the mma path: config, K splits (grid.y), k-tiles per split, tile counts."""

    config: KbitMmaConfig
    split: int
    kt_per_split: int
    m_tiles: int
    n_tiles: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.m_tiles * self.n_tiles, self.split, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (256, 1, 1)

    @property
    def smem(self) -> int:
        return self.config.smem_bytes()

    def short(self) -> str:
        return (f"{self.config.short()} split={self.split} k_per_split={self.kt_per_split * TILE_K} "
                f"grid={self.grid} smem={self.smem}")


@dataclass(frozen=True)
class GemmChoice:
    """The path and, for gemv / mma / wgmma, its plan (dequant: dequantize + cuBLAS, no plan;
    wgmma: the FP4 kernel's plan, kernelgen/kbit_gemm/tiled.py flat_wgmma_takes)."""

    path: str
    plan: Any

    def short(self) -> str:
        return f"path={self.path}" + (f" {self.plan.short()}" if self.plan is not None else "")


def check_mma_shape(n: int, k: int) -> None:
    """The mma path's rule: N a multiple of 128 (whole W tiles), K a multiple of 128 (the format)."""
    check_shape(n, k)
    if n % TILE_N_MIN:
        raise ValueError(f"W: N={n}; the kbit GEMM tensor-core path needs N a multiple of "
                         f"{TILE_N_MIN} (whole 128-row tiles); path='gemv' takes any N")


def tile_for(m: int, n: int) -> tuple[int, int]:
    tile_m = next(t for max_m, t in TILE_M_TABLE if m <= max_m)
    tile_n = 256 if tile_m == 64 and m >= TILE_N256_MIN_M and n % 256 == 0 else 128
    return tile_m, tile_n


def mma_slots(cfg: KbitMmaConfig, arch: str, sm_count: int, smem_limit: int | None = None) -> int:
    """CTAs of an mma config resident at once on the device: its launch bounds' blocks an SM,
    as many as the SM's shared memory holds (1 KB a block reserved)."""
    return sm_count * max(1, min(cfg.min_blocks, smem_per_sm(arch, smem_limit) // (cfg.smem_bytes() + 1024)))


def plan_mma(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
             tile: tuple[int, int] | None = None, split: int | None = None,
             smem_limit: int | None = None) -> MmaPlan:
    """Pure planner. `tile` (tile_m, tile_n) and `split` force a choice (tests, tuning).
    `smem_limit`: the device's shared memory a block (None: the target's); the tile keeps the
    stages that fit it (a tile the table picks whose 2 stages do not: the next smaller tile)."""
    check_mma_shape(n, k)
    check_bits(bits)  # before smem_for: 2 ** (2 * bits) table entries
    if m < 1:
        raise ValueError(f"A: M={m}; the kbit GEMM needs M >= 1")
    if tile is None:
        tile_m, tile_n = tile_for(m, n)
        cap = smem_cap(arch, smem_limit)
        tile_m, tile_n = next((t for t in sorted(TILES, key=lambda t: (-t[0] * t[1], -t[1]))
                               if t[0] <= tile_m and t[1] <= tile_n and smem_for(bits, *t, 2) <= cap),
                              (tile_m, tile_n))
    else:
        try:
            tile_m, tile_n = tile
        except (TypeError, ValueError):  # not a pair
            tile_m = tile_n = None
        if not all(isinstance(t, numbers.Integral) for t in (tile_m, tile_n)):
            raise ValueError(f"tile={tile!r}: expected (tile_m, tile_n), one of {sorted(TILES)}")
        tile_m, tile_n = int(tile_m), int(tile_n)
    if (tile_m, tile_n) not in TILES:
        raise ValueError(f"tile={tile}: expected one of {sorted(TILES)}")
    if n % tile_n:
        raise ValueError(f"tile={tile}: N={n} is not a multiple of tile_n={tile_n}")
    cfg = KbitMmaConfig(arch=arch, bits=bits, dtype=dtype, tile_m=tile_m, tile_n=tile_n,
                        stages=stages_for(arch, bits, tile_m, tile_n, smem_limit))
    m_tiles, n_tiles, kt = -(-m // tile_m), n // tile_n, k // TILE_K
    tiles = m_tiles * n_tiles
    if split is None:
        slots = mma_slots(cfg, arch, sm_count, smem_limit)

        def cost(s: int) -> float:  # rounds of resident CTAs x k-tiles a round
            return -(-tiles * s // slots) * (-(-kt // s) + FILL_KT + (SPLIT_KT if s > 1 else 0.0))

        hi = max(1, min(kt // MIN_KT_PER_SPLIT, MAX_WS_BYTES // (4 * m * n)))
        split = min(range(1, hi + 1), key=lambda s: (cost(s), s))
    elif not (isinstance(split, numbers.Integral) and 1 <= split <= kt):
        raise ValueError(f"split_k={split!r}: must be in 1..{kt} (K/{TILE_K}) for K={k}")
    kps = -(-kt // split)
    return MmaPlan(cfg, -(-kt // kps), kps, m_tiles, n_tiles)  # every split non-empty


def gemv_max_m(n: int, k: int, bits: int) -> int:
    """The largest M the GEMV takes (where the mma path can run: N % 128 == 0); see
    GEMV_SMALL_WEIGHT."""
    check_bits(bits)
    if n * k <= GEMV_SMALL_WEIGHT:
        return GEMV_SMALL_5BIT_MAX_M if bits == 5 else GEMV_SMALL_MAX_M
    return GEMV_MAX_M[(bits, n >= k)]


def dequant_min_m(n: int, k: int, bits: int) -> int:
    """The smallest M that dequantizes W for cuBLAS (DEQUANT_MIN_M, DEQUANT_SMALL_MIN_M)."""
    check_bits(bits)
    return (DEQUANT_SMALL_MIN_M if n * k <= GEMV_SMALL_WEIGHT else DEQUANT_MIN_M)[bits]


def mma_fill(plan: MmaPlan, arch: str, sm_count: int, smem_limit: int | None = None) -> float:
    """The mean fill of an mma plan's rounds of resident CTAs (1.0: the last round full)."""
    return wave_fill(plan.m_tiles * plan.n_tiles * plan.split,
                     mma_slots(plan.config, arch, sm_count, smem_limit))


def path_for(m: int, n: int, k: int, bits: int, mma_full: Callable[[], bool] | None = None) -> str:
    """The path at M tokens. `mma_full()`: whether the mma plan at this M runs unsplit and fills
    its rounds to MMA_WINDOW_FILL[bits] (asked in MMA_WINDOWS only; None: not known, the windows then
    take the long-K rule alone)."""
    lo = next((lo for lo, hi in MMA_WINDOWS.get(bits, ()) if lo <= m <= hi), 0)
    window = (lo and n % TILE_N_MIN == 0 and n * k > GEMV_SMALL_WEIGHT
              and lo <= gemv_max_m(n, k, bits)
              and (k >= MMA_WINDOW_MIN_K.get(bits, k + 1) or mma_full is not None and mma_full()))
    if window:
        return "mma"
    if m <= gemv_max_m(n, k, bits):
        return "gemv"
    if m >= dequant_min_m(n, k, bits):
        return "dequant"
    return "gemv" if n % TILE_N_MIN else "mma"


def mma_full(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
             smem_limit: int | None = None) -> Callable[[], bool]:
    """path_for's `mma_full` for a device: the mma plan at M unsplit, its rounds filled to
    MMA_WINDOW_FILL[bits]."""
    def full() -> bool:
        p = plan_mma(arch, m, n, k, bits, dtype, sm_count, smem_limit=smem_limit)
        return p.split == 1 and mma_fill(p, arch, sm_count, smem_limit) >= MMA_WINDOW_FILL[bits]
    return full


def plan_gemm(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
              smem_limit: int | None = None) -> GemmChoice:
    """The path and its plan; `smem_limit` as in plan_mma."""
    from .tiled import flat_wgmma_takes, plan_flat_wgmma  # tiled imports this module's peers

    if flat_wgmma_takes(arch, m, n, k, bits, dtype, sm_count, smem_limit):
        return GemmChoice("wgmma", plan_flat_wgmma(arch, m, n, k, bits, dtype, sm_count,
                                                   smem_limit=smem_limit))
    path = path_for(m, n, k, bits, mma_full(arch, m, n, k, bits, dtype, sm_count, smem_limit))
    if path == "gemv":
        return GemmChoice(path, plan_gemv(arch, m, n, k, bits, dtype, sm_count, smem_limit=smem_limit))
    if path == "mma":
        return GemmChoice(path, plan_mma(arch, m, n, k, bits, dtype, sm_count, smem_limit=smem_limit))
    check_shape(n, k)
    return GemmChoice(path, None)


@selector
def select_gemm(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
                smem_limit: int | None = None) -> GemmChoice:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_gemm(arch, m, n, k, bits, dtype, sm_count, smem_limit)


def prewarm_mma_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KbitMmaConfig]:
    """mma configs the selector can return (spec as kbit_gemm.select.prewarm_configs). Without
    shapes: every tile, at the stages of each part's shared memory. With shapes: the tiles
    dispatch picks for that M, or for every M, on every part (kernelgen.arch.parts_of)."""
    bits_list = tuple(spec.get("bits") or BITS)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = _shapes(spec)
    # the choice is constant between table thresholds: their edges cover every M
    gemv_ends = (GEMV_SMALL_MAX_M, GEMV_SMALL_5BIT_MAX_M, *GEMV_MAX_M.values())
    edges = sorted({1, TILE_N256_MIN_M - 1, TILE_N256_MIN_M} | {e + d for e in gemv_ends for d in (0, 1)}
                   | {d + e for t in (DEQUANT_MIN_M, DEQUANT_SMALL_MIN_M) for d in t.values()
                      for e in (-1, 0)}
                   | {e for mx, _ in TILE_M_TABLE[:-1] for e in (mx, mx + 1)}
                   | {e for ws in MMA_WINDOWS.values() for w in ws for e in w})
    seen: set[KbitMmaConfig] = set()
    for arch in archs:
        get_arch(arch)
        for bits in bits_list:
            for dtype in dtypes:
                if not shapes:
                    for tile_m, tile_n in TILES:
                        for stages in dict.fromkeys(stages_for(arch, bits, tile_m, tile_n, lim)
                                                    for lim in smem_limits(arch)):
                            yield KbitMmaConfig(arch=arch, bits=bits, dtype=dtype, tile_m=tile_m,
                                                tile_n=tile_n, stages=stages)
                    continue
                for sms, lim in parts_of(arch, spec.get("sm_counts")):
                    for m, n, k in shapes:
                        for mm in (m,) if m is not None else edges:
                            full = mma_full(arch, mm, n, k, bits, dtype, sms, lim)
                            if path_for(mm, n, k, bits, full) != "mma":
                                continue
                            try:
                                cfg = plan_mma(arch, mm, n, k, bits, dtype, sms, smem_limit=lim).config
                            except ValueError as e:
                                raise UnsupportedConfigError(str(e)) from None
                            if cfg not in seen:
                                seen.add(cfg)
                                yield cfg


def prewarm_dequant_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KernelConfig]:
    """The kbit dequantize kernel (E4M4 scales -> A's dtype) of the dequant path, per (bits,
    dtype) that can reach it: always without shapes or with an [N, K] shape (every M), else
    when some [M, N, K] shape of the spec selects that path."""
    from ..kbit.config import KbitDequantizeConfig

    bits_list = tuple(spec.get("bits") or BITS)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = _shapes(spec)
    for arch in archs:
        get_arch(arch)
        for bits in bits_list:
            if shapes and all(m is not None and path_for(m, n, k, bits) != "dequant"
                              for m, n, k in shapes):
                continue
            for dtype in dtypes:
                yield KbitDequantizeConfig(arch=arch, bits=bits, dtype=dtype, absmax_dtype="e4m4")
