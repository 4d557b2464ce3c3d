"""Host-side selector of the kbit GEMM bandwidth path, as data plus one pure function.

(arch, M, N, K, bits, dtype, SM count, the device's shared memory a block) -> GemvPlan: the kernel
config (m_tile, warps, K warps, split_k flag) and the launch (K splits, grid, shared memory). No
GPU work; memoised and printable (KERNELGEN_PRINT_CONFIGS=1) through
`kernelgen.core.select.selector`. `prewarm_configs` walks the same function over the shapes of a
spec and the parts of each target, so prewarm builds exactly what dispatch can pick.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import product
from typing import Any

from ..arch import base_of, get_arch, parts_of, smem_cap, smem_per_sm
from ..core.interop import MAX_GRID_YZ
from ..core.select import selector, weight_shapes
from ..kbit.api import check_bits
from .config import (
    BITS,
    DTYPES,
    GROUP_K,
    KWS,
    M_TILES,
    TILE_ROWS,
    KbitGemvConfig,
    kw_red_bytes,
    launch_of,
    lut_bytes,
)

# (largest M, m_tile): tokens a CTA pass covers. M above the last row runs ceil(M/16) passes
# over grid.z (W is read once per pass) until the tensor-core path takes large M.
M_TILE_TABLE: tuple[tuple[int, int], ...] = ((8, 8), (1 << 31, 16))
# The grid is persistent (every CTA resident at once); a warp works through its 16-row tiles
# one after the other, so the time is about rounds x (quad steps of a tile + overhead), with
# rounds = ceil(work items / resident warps). The plan (K split on grid.y, K warps kw) is the
# one that minimises it: more splits give more, shorter items (better balance, more warps busy)
# but each item pays exposed latency, and with split-K a fenced fp32 partial + counter; K warps
# (kw > 1: a tile's quad steps dealt over kw warps of one CTA, sums reduced in shared memory)
# are kw times the warps for the same tiles, which count against the same BUSY_WARPS_PER_SM,
# and pay KW_ITEM_OVERHEAD_STEPS (barrier + sums) beside the item's.
# ITEM_OVERHEAD_STEPS: an unsplit item, by m_tile; KW_ITEM_OVERHEAD_STEPS added where kw > 1
# (negative: such an item's exposed latency is shared by its kw warps, so it costs less
# overhead than a kw-1 item).
ITEM_OVERHEAD_STEPS: dict[int, float] = {8: 0.25, 16: 1.0}
SPLIT_ITEM_OVERHEAD_STEPS = 2.5
# ... plus this much a split beyond the first: the warp that finishes a split tile reads every
# split's partials (common/splitk.cuh). Without it, K warps and K splits that deal out the same
# items tied, and the tie went to fewer K warps, i.e. more splits: 1024x8192 M = 9..16 took
# kw 2 x 8 splits, 18-22% slower than kw 4 x 4 (session 25, on session 24's grids). 0.1-0.24
# score the same on the grids; from 0.25 kw 4 unsplit (32 CTAs) ties kw 4 x 4 on 1024x8192 M
# = 1 / 4 and wins the tie, measured 19-27% slower.
SPLIT_SUM_STEPS = 0.2
KW_ITEM_OVERHEAD_STEPS = -0.25
# ... and an SM runs about 8 busy warps before the decode saturates it (H100, 4 bits M = 1:
# 128 CTAs x 7 warps and 224 x 4 both 19.4 us on 14336x4096, 16 warps an SM no faster), so
# items beyond 8 an SM count as another round (4096x14336: 4 splits 19.5-19.8 us, 6 splits
# 20.3-21.1 us; 2 bits 14.5 vs 15.4).
BUSY_WARPS_PER_SM = 8
# ... and a split keeps at least this many groups of 128 k (two quad steps of a warp).
MIN_GROUPS_PER_SPLIT = 8
# K warps weighed: every kw of KWS, except 5 bits at m_tile 16 (its kw > 1 plans measured
# 0-13% slower than kw 1 there, on every shape of the grid) and the (arch, bits) whose m_tile
# 16 K-warp configs spill (ptxas: sm_120a 4 bits, 8-warp CTAs at 128 registers).
KW_CHOICES: tuple[int, ...] = (1, 2, 4)
KW16_SPILLS: frozenset[tuple[str, int]] = frozenset({("sm_120a", 4)})  # base targets (arch.base_of)
# The constants were fitted (session 24, H100, graph-timed, weights rotated past L2;
# BENCHMARKS.md "Session 24") to measured grids: m_tile 8 (M = 1 / 4 / 8) over 25 shapes x 2 /
# 3 / 5 bits, every kw at the planner's split and at splits 1 / 2 / 4; m_tile 16 (M = 9 / 12 /
# 16) over 23 shapes x 2-5 bits, the same kw x splits (and 8); examples/tune_kbit_gemv.py
# measures and judges such grids. The planner's pick is now 1.8% (either m_tile) from the
# fastest measured config on average, against 4.4% / 16.7% (m_tile 8 / 16) with session 23's
# constants (kw 1 only at m_tile 16; kw 2 only in place of a K split at m_tile 8). m_tile 8:
# changed picks up to 42% faster (5120x13824 2 bits M = 8 28.1 -> 19.8 us; 5 bits M = 1:
# 18432x5120 49.2 -> 34.9, 12288x4096 29.0 -> 22.6; 11008x4096 2 / 3 bits +11-17%), the
# slower ones by up to 7.5% (1024x4096 5 bits M = 4; 4096x14336 2 bits M = 4 -5%). m_tile 16:
# 87 of 186 changed, 75 faster by up to 2x (small weights: 4096x1024, 1024x8192 2-4 bits
# +30-40%; 4096x4096 2 / 3 bits +9%), the 10 slower ones all 5 bits, now excluded.
# Session 25's SPLIT_SUM_STEPS took the mean to 1.15% on the same grids plus 1024x8192 /
# 2048x8192 at M = 1 / 4 / 8 (30 picks changed: 21 measured faster by up to 22%, 8 new picks
# the fastest of their rows where the old one was not measured, 1024x4096 5 bits M = 8 6.8%
# slower).


# The GEMV from ONE_CTA_MIN_M[bits] tokens on runs one CTA of ONE_CTA_WARPS warps an SM, with
# all the shared memory a block may have and no register cap below ptxas' choice (160-240 on
# sm_90a), in place of the launch table's 2-3 CTAs an SM: A is staged once an SM instead of once
# a CTA (64 KB a CTA at M = 8, K = 4096), M = 16 takes a K = 4096 A slice without a K split, and
# the decode keeps its registers. H100, 7 shapes x 2-5 bits (session 27,
# BENCHMARKS.md): M = 12 / 16 12-107% faster, M = 4-8 up to 56%, 13 of 120 rows slower by 1-13%
# (1024x8192 3 bits M = 12 / 16 the most); the 128-register code of the same plans was slower in
# 96 of 105 rows. At M = 1..3 one CTA an SM gained 2-13% on average at 4 / 5 bits (5 bits M = 1
# up to 31%: the table's 4-warp plan there was the planner's known miss); 2 / 3 bits started at
# 4 tokens until session 34, whose grids (H100, BENCHMARKS.md "Session 34": 30 shapes x 2 / 3 /
# 5 bits x M = 1..3, 246 rows, 18 shapes new to the planner's fits) found the table's plans there
# up to 55% slower than one CTA an SM (12288x4096 18-22%, 24576x1536 48-55%). Below
# ONE_CTA_FEW_TOKENS the table's plan stays where the one-CTA plan would run on at most
# ONE_CTA_SPREAD of the SMs the table's plan runs on (it spreads the bytes over more SMs), and
# up to 8 tokens (m_tile 8) the table's unsplit kw 1 plan is taken where the one-CTA plan is
# unsplit too and its warps walk over 1 / ONE_CTA_TABLE_STEPS times the table plan's quad steps
# (warp_steps: many tiles on a small K, every tile in one round of three 4-warp CTAs an SM where
# one CTA an SM needs two): 24576x1536 8.25-8.37 us against 10.08-10.17 at 2 bits M = 1..3,
# 9.74-9.83 against 12.22-12.26 at 3; M = 4 / 8 8.63 / 9.25 against 10.34 / 10.29 at 2 bits.
# On the 246 rows the old planner's picks were 3.01% from the fastest measured plan on average
# (worst 54.6%), one CTA an SM from M = 1 1.81% (worst 25.5%), with the table rule 1.24% (worst
# 11.8%). The rule's bound was chosen after all three grids were measured (0.75 or more fired on
# 20480x2048 / 22016x4096, where the one-CTA plan was 8-36% faster; 0.5 fired nowhere), so no
# held-out rows are left for it. From ONE_CTA_FEW_TOKENS on, the one-CTA cost below picks K
# warps and splits that spread: 1024x8192 5 bits M = 16 kw 4 x 4 splits, 128 CTAs, 11.83 us
# against the table's 14.01, where session 27's 64-CTA one-CTA plan had lost 11%. Past 16 tokens
# (passes of 16 on grid.z) one CTA an SM measured 11-58% faster on 5 shapes x 2-5 bits at M =
# 17 / 24 / 32 / 48 (no K split at K = 4096; 1024x8192 3 / 5 bits M = 17 1-2% slower), and
# 10-51% faster at M = 65-159 on 32001x4096 / 14001x4096 (N % 128 != 0: the GEMV runs to
# DEQUANT_MIN_M there), so it has no upper bound. Measured on the H100 only; the other targets
# take the rule as it is (their one-CTA plans keep within the device's shared memory a block).
ONE_CTA_MIN_M: dict[int, int] = {2: 1, 3: 1, 4: 1, 5: 1}
ONE_CTA_WARPS = 8
ONE_CTA_SPREAD = 0.5
ONE_CTA_TABLE_STEPS = 0.6
# The cost of a one-CTA-an-SM plan (min_blocks 1; the table's launches keep the constants above):
# rounds = the most tiles a warp of the persistent grid walks (ceil(tiles / (CTAs x tile
# slots))), each costing its quad steps a K warp times ONE_CTA_STEP[bits] (a 5-bit step decodes
# about twice a 2-bit one's work) plus ONE_CTA_SPLIT_ITEM_STEPS (+ ONE_CTA_SPLIT_SUM_STEPS a
# split beyond the first) where K is split, ONE_CTA_KW_ITEM_STEPS where kw > 1; an unsplit kw 1
# item costs its steps only. Every kw is weighed (no 5-bit m_tile 16 exception: with ptxas' own
# registers its K-warp configs do not spill, and kw 4 was the fastest on several small weights).
# Fitted (session 28, H100, graph-timed, rotated; examples/tune_kbit_gemv.py grids of 24 shapes
# x 2 / 3 / 5 bits (and 4 on 7 of them) x M = 4 / 8 / 12 / 16, every kw x split 1 / 2 / 4 / 8 /
# the planner's, BENCHMARKS.md "Session 28"), with the one-CTA launch from ONE_CTA_FEW_TOKENS
# on: the pick is 0.91% from the fastest measured plan on average (257 rows; 2.75% before,
# worst 35% -> 17.6%); fitted on 180 rows first, the 84 rows of 7 further shapes came out at
# 1.01% (2.35% before).
# Below ONE_CTA_FEW_TOKENS (one CTA an SM from M = 1) a split costs
# ONE_CTA_FEW_SPLIT_ITEM_STEPS instead (its finish weighs more against the lighter steps of 1-3
# tokens: with 1.5 the cost took K splits that lost 8-21% on 2048x4096), and the launch is the
# table's where one CTA an SM would spread over at most ONE_CTA_SPREAD of its SMs. Fitted on 10
# shapes x 4 / 5 bits x M = 1 / 2 (the table's constants there: 1.64% from the fastest, now
# 0.99%; 14336x4096 / 13824x5120 5 bits kw 1 where kw 2 was 10-11% slower); 8 further shapes x
# M = 1 / 2 / 3, not used in the fit: 1.06% -> 0.26%, worst 11.1% -> 2.8%.
ONE_CTA_FEW_TOKENS = 4
ONE_CTA_STEP: dict[int, float] = {2: 1.0, 3: 1.0, 4: 2.0, 5: 2.0}
ONE_CTA_SPLIT_ITEM_STEPS = 1.5
ONE_CTA_FEW_SPLIT_ITEM_STEPS = 3.0
ONE_CTA_SPLIT_SUM_STEPS = 0.1
ONE_CTA_KW_ITEM_STEPS = 0.25


def one_cta(m: int, bits: int) -> bool:
    """Whether the planner weighs one CTA an SM for this M and bit-width (ONE_CTA_MIN_M)."""
    return m >= ONE_CTA_MIN_M[bits]


def one_cta_cost(bits: int, m: int, tiles: int, tile_slots: int, gps: int, kw: int, split: int,
                 step: dict[int, float] | None = None, split_item: float | None = None,
                 few_split_item: float | None = None, split_sum: float | None = None,
                 kw_item: float | None = None) -> float:
    """Cost of a one-CTA-an-SM plan for M tokens (ONE_CTA_STEP; the keywords replace the
    constants, for examples/tune_kbit_gemv.py fit): the most tiles a warp walks (`tile_slots`: a
    pass and split's CTAs x warps / kw, GemvPlan.ctas) times its quad steps a K warp, weighted by
    bit-width, plus the item's split and K-warp steps."""
    step = ONE_CTA_STEP if step is None else step
    if m < ONE_CTA_FEW_TOKENS:
        split_item = ONE_CTA_FEW_SPLIT_ITEM_STEPS if few_split_item is None else few_split_item
    else:
        split_item = ONE_CTA_SPLIT_ITEM_STEPS if split_item is None else split_item
    split_sum = ONE_CTA_SPLIT_SUM_STEPS if split_sum is None else split_sum
    kw_item = ONE_CTA_KW_ITEM_STEPS if kw_item is None else kw_item
    item = (split_item + split_sum * (split - 1) if split > 1 else 0.0) + (kw_item if kw > 1 else 0.0)
    quads = -(-gps // 4)  # quad steps of a tile, dealt over kw warps
    return -(-tiles // tile_slots) * (-(-quads // kw) * step[bits] + item)


def kw_choices(m_tile: int, bits: int, arch: str, one: bool = False) -> tuple[int, ...]:
    """The K warps the planner weighs for this m_tile, bit-width and arch (KW_CHOICES); `one`:
    for one CTA an SM (no 5-bit m_tile 16 exception there, ONE_CTA_STEP)."""
    if m_tile == 16 and ((bits == 5 and not one) or (base_of(arch), bits) in KW16_SPILLS):
        return (1,)
    return KW_CHOICES


@dataclass(frozen=True)
class GemvPlan:
    """One launch: config, K splits (grid.y), groups of 128 k per split, grid.x, grid.z, smem."""

    config: KbitGemvConfig
    split: int
    gps: int
    ctas: int
    m_tiles: int
    smem: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.ctas, self.split, self.m_tiles)

    @property
    def ctas_total(self) -> int:
        return self.ctas * self.split * self.m_tiles

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.warps * 32, 1, 1)

    def short(self) -> str:
        return (f"{self.config.short()} split={self.split} k_per_split={self.gps * GROUP_K} "
                f"grid={self.grid} smem={self.smem}")


def check_shape(n: int, k: int, name: str = "W") -> None:
    """The rule the kernel needs: K a multiple of 128 (a lane loads 4 blocks of 32 as 16-byte
    aligned vectors), N >= 1, K >= 128."""
    if n < 1 or k < GROUP_K or k % GROUP_K:
        raise ValueError(f"{name}: shape [N={n}, K={k}]; the kbit GEMM needs N >= 1 and K a "
                         f"positive multiple of {GROUP_K} (4 blocks of 32, 16-byte aligned)")


def m_tile_for(m: int) -> int:
    for max_m, tile in M_TILE_TABLE:
        if m <= max_m:
            return tile
    raise AssertionError("unreachable: the last row takes every M")


def plan_gemv(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
              split: int | None = None, kw: int | None = None,
              launch: tuple[int, int] | None = None, smem_limit: int | None = None) -> GemvPlan:
    """Pure planner. `split` forces the number of K splits, `kw` the K warps a tile (tests,
    tuning), `launch` = (warps, min_blocks) the CTA shape; None picks them: the launch table's,
    or one CTA of ONE_CTA_WARPS an SM (ONE_CTA_MIN_M; the table's where ONE_CTA_SPREAD, below
    ONE_CTA_FEW_TOKENS, or warp_steps, up to 8 tokens, favour it); a forced min_blocks of 1
    gets all the shared memory a block may have. `smem_limit`: the device's shared memory a
    block (None: the target's): it caps the A slice and, with the 1 KB a block the driver
    keeps, the CTAs an SM holds (kernelgen.arch.smem_per_sm)."""
    check_shape(n, k)
    check_bits(bits)  # the launch tables have rows for 2..5 only
    if m < 1:
        raise ValueError(f"A: M={m}; the kbit GEMM needs M >= 1")
    if kw is not None and kw not in KWS:
        raise ValueError(f"kw={kw}: expected one of {KWS}")
    if launch is not None:
        try:
            warps, blocks = launch
        except (TypeError, ValueError):  # not a pair
            warps = blocks = None
        if not all(isinstance(v, numbers.Integral) and v >= 1 for v in (warps, blocks)):
            raise ValueError(f"launch={launch!r}: expected (warps, min_blocks), two ints >= 1")
    m_tile = m_tile_for(m)
    if -(-m // m_tile) > MAX_GRID_YZ:
        raise ValueError(f"A: M={m} takes {-(-m // m_tile)} GEMV passes of {m_tile} tokens, more "
                         f"than a launch's {MAX_GRID_YZ}; use path='dequant' (the selector's "
                         f"choice at this M)")

    def pick(launch: tuple[int, int] | None) -> GemvPlan:
        if kw is None:  # the kw of the cheapest plan (ties: fewer K warps)
            plans = [_plan(arch, m, n, k, bits, dtype, sm_count, m_tile, split, c, launch,
                           smem_limit)
                     for c in kw_choices(m_tile, bits, arch, one=launch is not None and launch[1] == 1)
                     if launch is None or launch[0] % c == 0]
            return min(plans, key=lambda p: (p.cost, p.plan.config.kw)).plan
        return _plan(arch, m, n, k, bits, dtype, sm_count, m_tile, split, kw, launch,
                     smem_limit).plan

    if launch is None and one_cta(m, bits):
        one = pick((ONE_CTA_WARPS, 1))  # raises only where no launch fits a forced split
        try:
            if m < ONE_CTA_FEW_TOKENS:
                table = pick(None)
                if one.ctas_total <= ONE_CTA_SPREAD * min(sm_count, table.ctas_total):
                    return table
            if m_tile == 8 and kw is None and split is None and one.split == 1:
                # the table's kw 1 plan, where its warps walk fewer quad steps (many tiles, small K)
                flat = _plan(arch, m, n, k, bits, dtype, sm_count, m_tile, None, 1, None,
                             smem_limit).plan
                if flat.split == 1 and warp_steps(flat, n) < ONE_CTA_TABLE_STEPS * warp_steps(one, n):
                    return flat
        except ValueError:  # no table launch fits (a forced split only one CTA an SM's smem fits)
            pass
        return one
    return pick(launch)


def warp_steps(plan: GemvPlan, n: int) -> int:
    """Quad steps the busiest warp of an unsplit plan walks: the tiles a tile slot takes (the
    grid is persistent), times a tile's quad steps a K warp."""
    cfg = plan.config
    tiles, quads = -(-n // TILE_ROWS), -(-plan.gps // 4)
    return -(-tiles // (plan.ctas * (cfg.warps // cfg.kw))) * -(-quads // cfg.kw)


@dataclass(frozen=True)
class _Costed:
    plan: GemvPlan
    cost: float


def _plan(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int, m_tile: int,
          split: int | None, kw: int, launch: tuple[int, int] | None,
          smem_limit: int | None) -> _Costed:
    warps, min_blocks, cap = launch_of(m_tile, bits, kw, arch)
    per_sm = smem_per_sm(arch, smem_limit)
    if launch is not None:
        warps, min_blocks = launch
        # one CTA an SM: all the shared memory a block may have (KbitGemvConfig.smem_bytes)
        cap = smem_cap(arch) if min_blocks == 1 else min(cap, per_sm // min_blocks - 1024)
    cap = min(cap, smem_cap(arch, smem_limit))
    if warps % kw:
        raise ValueError(f"kw={kw}: must divide the CTA's warps ({warps})")
    red = kw_red_bytes(warps, kw, m_tile)
    busy = BUSY_WARPS_PER_SM
    rows = min(m, m_tile)
    m_tiles = -(-m // m_tile)
    tiles = -(-n // TILE_ROWS)
    groups = k // GROUP_K
    max_gps = (cap - lut_bytes(bits) - red) // (rows * GROUP_K * 2)  # the A slice fits smem
    if max_gps < 1:
        raise ValueError(f"launch {warps} warps x {min_blocks} CTAs: the {bits}-bit table and the "
                         f"K-warp sums leave no shared memory for A ({cap} B a CTA)")

    def smem_of(gps: int) -> int:
        return lut_bytes(bits) + rows * gps * GROUP_K * 2 + red

    def resident(gps: int) -> int:  # CTAs an SM holds: launch bounds, then shared memory
        return max(1, min(min_blocks, per_sm // (smem_of(gps) + 1024)))

    slots = warps // kw

    def ctas_of(s: int, gps: int) -> int:
        # persistent grid: no more CTAs along N than stay resident beside the other splits / passes
        return min(-(-tiles // slots), max(1, sm_count * resident(gps) // (s * m_tiles)))

    def cost(s: int) -> float:
        gps = -(-groups // s)
        if min_blocks == 1:  # one CTA an SM (ONE_CTA_STEP)
            return one_cta_cost(bits, m, tiles, ctas_of(s, gps) * slots, gps, kw, s)
        warps_resident = sm_count * min(resident(gps) * warps, busy)
        rounds = -(-(tiles * m_tiles * s * kw) // warps_resident)
        overhead = (SPLIT_ITEM_OVERHEAD_STEPS + SPLIT_SUM_STEPS * (s - 1) if s > 1
                    else ITEM_OVERHEAD_STEPS[m_tile])
        if kw > 1:
            overhead += KW_ITEM_OVERHEAD_STEPS
        quads = -(-gps // 4)  # quad steps of a tile, dealt over kw warps
        return rounds * (-(-quads // kw) + overhead)

    if split is None:
        lo = -(-groups // max_gps)  # fewest splits whose A slice fits
        hi = max(lo, groups // MIN_GROUPS_PER_SPLIT)
        split = min(range(lo, hi + 1), key=lambda s: (cost(s), s))
        gps = -(-groups // split)
        q = 4 * kw  # whole quad steps of every K warp when that costs no more splits
        gps4 = -(-gps // q) * q
        if gps4 <= max_gps and -(-groups // gps4) == split:
            gps = min(gps4, groups)
    else:
        if not (isinstance(split, numbers.Integral) and 1 <= split <= groups):
            raise ValueError(f"split_k={split!r}: must be in 1..{groups} (K/{GROUP_K}) for K={k}")
        gps = -(-groups // split)
        if gps > max_gps:
            need = -(-groups // max_gps)
            raise ValueError(f"split_k={split}: M={m} x K/{split} of A does not fit shared memory "
                             f"({rows} rows x {gps * GROUP_K} k); use split_k >= {need}")
    split = -(-groups // gps)
    ctas = ctas_of(split, gps)
    cfg = KbitGemvConfig(arch=arch, bits=bits, dtype=dtype, m_tile=m_tile, warps=warps,
                         min_blocks=min_blocks, split_k=split > 1, kw=kw)
    return _Costed(GemvPlan(cfg, split, gps, ctas, m_tiles, smem_of(gps)), cost(split))


@selector
def select_gemv(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
                smem_limit: int | None = None) -> GemvPlan:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_gemv(arch, m, n, k, bits, dtype, sm_count, smem_limit=smem_limit)


def _shapes(spec: dict[str, Any]) -> list[tuple[int | None, int, int]]:
    return weight_shapes(spec, "kbit_gemm", check_shape)


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KbitGemvConfig]:
    """Configs the selector can return. spec: "bits", "dtypes" (others are skipped: this family
    takes fp16/bf16 activations), "shapes" ([N, K]: every M; [M, N, K]: that M), "sm_counts"
    (default: the arch's parts, kernelgen.arch.parts_of). Without shapes: every config of the
    launch table and of one CTA an SM."""
    bits_list = tuple(spec.get("bits") or BITS)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = _shapes(spec)
    seen: set[KbitGemvConfig] = set()
    for arch in archs:
        get_arch(arch)
        for bits in bits_list:
            for dtype in dtypes:
                if not shapes:
                    for m_tile in M_TILES:
                        for kw in kw_choices(m_tile, bits, arch, one=True):
                            # the table's launch and one CTA an SM, every kw each weighs, split
                            # or not (the planner weighs them all; larger M compiles on demand)
                            launches = ((launch_of(m_tile, bits, kw, arch)[:2],)
                                        if kw in kw_choices(m_tile, bits, arch) else ()) + \
                                ((ONE_CTA_WARPS, 1),)
                            for (warps, min_blocks), split_k in product(launches, (False, True)):
                                yield KbitGemvConfig(arch=arch, bits=bits, dtype=dtype,
                                                     m_tile=m_tile, warps=warps,
                                                     min_blocks=min_blocks, split_k=split_k,
                                                     kw=kw)
                    continue
                for sms, lim in parts_of(arch, spec.get("sm_counts")):
                    for m, n, k in shapes:
                        # From M = 16 a plan depends on M only through its passes of 16; past
                        # m_hi passes there is at least one work item per resident warp without
                        # a split (the passes alone fill the GPU) and, one CTA an SM, one CTA a
                        # pass and split: the plan no longer changes
                        tiles = -(-n // TILE_ROWS)
                        m_hi = max(4 * sms * 4 // tiles + 2, sms + 1)
                        ms = [*range(1, 17), *(16 * p for p in range(2, m_hi + 1))]
                        for mm in (m,) if m is not None else ms:
                            cfg = plan_gemv(arch, mm, n, k, bits, dtype, sms, smem_limit=lim).config
                            if cfg not in seen:
                                seen.add(cfg)
                                yield cfg
