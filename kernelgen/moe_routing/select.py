"""Host-side planner of the MoE routing kernels: data plus pure functions, no GPU work.

Layout: one CTA for n = T * top_k <= SINGLE_MAX pairs (one launch, the decode path); above,
the three-kernel multi-CTA path over CHUNK pairs a CTA. The single CTA's size comes from
SINGLE_WARPS by n, capped by the most warps whose histograms (warps x E ints) fit HIST_INTS;
the multi-CTA path uses that cap. Route (graph-safe layout + dispatch): one fused launch for
n <= ROUTE_FUSED_MAX. The tables are measured on an H100 (BENCHMARKS.md, moe_routing).
`prewarm_configs` walks the same tables.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch
from ..core.select import selector
from ..errors import UnsupportedConfigError
from .config import (
    DTYPES,
    FUSED_MAX,
    HIST_INTS,
    ID_DTYPES,
    ITEMS,
    MAX_EXPERTS,
    MOVE_THREADS,
    ROUTE_MAX_CTA_PAIRS,
    W_DTYPES,
    WARPS,
    MoeCombineConfig,
    MoeDispatchConfig,
    MoeLayoutConfig,
    MoeRouteConfig,
    layout_smem,
    route_smem,
)

SINGLE_MAX = 8192  # pairs; the one-CTA layout up to here (measured crossover: BENCHMARKS.md)
# (largest n, warps) of the one-CTA layout: 8 warps fastest up to 2048 pairs (3.5-5 us at
# E = 8..256 vs 4.4-5.8 with 32), 16 from there to SINGLE_MAX (21.0 us at n = 8192, E = 256)
SINGLE_WARPS: tuple[tuple[int, int], ...] = ((2048, 8), (SINGLE_MAX, 16))
ROUTE_FUSED_MAX = 1024  # pairs; the fused route measured faster than two launches up to here
CHUNK = 4096  # pairs a CTA of the multi-CTA layout (a multiple of 32 * ITEMS * max(WARPS))
MOVE_CTAS_PER_SM = 16  # dispatch / combine grid: resident CTAs of MOVE_THREADS (2048 threads/SM)
COMBINE_SPLIT_WAVES = 4  # combine splits columns up to this many waves of CTAs (combine_launch)
# fused route: copy CTAs an SM before a CTA takes two pairs (H100, E = 128 / 256, top-8,
# H = 7168: a pair a CTA 5.2-5.3 us at T = 64 vs 5.3-5.4 with two; at T = 128 two pairs 7.7 us
# vs 8.3 with one)
ROUTE_CTAS_PER_SM = 4
assert CHUNK % (32 * ITEMS * max(WARPS)) == 0


def check_experts(num_experts: int) -> None:
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts}: must be in 1..{MAX_EXPERTS} (the layout "
                         f"keeps a histogram row of E ints per warp in shared memory)")


def warps_for(num_experts: int) -> int:
    """Most warps whose histograms fit: warps * E <= HIST_INTS."""
    check_experts(num_experts)
    return max(w for w in WARPS if w == WARPS[0] or w * num_experts <= HIST_INTS)


@dataclass(frozen=True)
class LayoutPlan:
    config: MoeLayoutConfig
    multi: bool  # the three-kernel path
    blocks: int  # CTAs of the count / scatter kernels (1 for the single path)
    chunk: int  # pairs a CTA
    smem: int

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.warps * 32, 1, 1)

    def short(self) -> str:
        path = f"multi blocks={self.blocks} chunk={self.chunk}" if self.multi else "single"
        return f"{self.config.short()} {path} smem={self.smem}"


def plan_layout(arch: str, pairs: int, num_experts: int, id_dtype: str,
                multi: bool | None = None, warps: int | None = None) -> LayoutPlan:
    """Pure planner; `multi` forces the path and `warps` the CTA size (tests, benchmarks);
    None picks by SINGLE_MAX and warps_for."""
    if multi is None:
        multi = pairs > SINGLE_MAX
    if warps is None:
        warps = warps_for(num_experts)
        if not multi:
            warps = min(warps, next(w for n, w in SINGLE_WARPS if pairs <= n) if pairs <= SINGLE_MAX
                        else warps)
    elif warps not in WARPS or warps * num_experts > max(HIST_INTS, WARPS[0] * num_experts):
        raise ValueError(f"warps={warps}: expected one of {WARPS} with warps x E <= {HIST_INTS} "
                         f"(E={num_experts})")
    cfg = MoeLayoutConfig(arch=arch, id_dtype=id_dtype, warps=warps)
    blocks = max(1, -(-pairs // CHUNK)) if multi else 1
    return LayoutPlan(cfg, bool(multi), blocks, CHUNK if multi else pairs,
                      layout_smem(warps, num_experts))


@selector
def select_layout(arch: str, pairs: int, num_experts: int, id_dtype: str) -> LayoutPlan:
    """The dispatch choice (memoised; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_layout(arch, pairs, num_experts, id_dtype)


@dataclass(frozen=True)
class RoutePlan:
    """The fused route launch: `side` layout CTAs, then a copy CTA per `pairs_per_cta` pairs."""

    config: MoeRouteConfig
    pairs_per_cta: int
    side: int
    ctas: int  # side + copy CTAs
    smem: int


def plan_route(arch: str, pairs: int, num_experts: int, id_dtype: str, sm_count: int,
               pad_to: int = 1, pairs_per_cta: int | None = None) -> RoutePlan:
    """Fused route for pairs <= FUSED_MAX: a pair a copy CTA while that fills ROUTE_CTAS_PER_SM
    CTAs an SM, more pairs a CTA above (at most ROUTE_MAX_CTA_PAIRS; every copy CTA reads all
    ids). One layout CTA; with pad_to > 1 up to an SM's worth more share the padding rows.
    `pairs_per_cta` forces the split (tests, benchmarks)."""
    check_experts(num_experts)
    if pairs > FUSED_MAX:
        raise ValueError(f"fused route: {pairs} pairs; it takes at most {FUSED_MAX}")
    if pairs_per_cta is None:
        per = min(ROUTE_MAX_CTA_PAIRS, max(1, -(-pairs // (sm_count * ROUTE_CTAS_PER_SM))))
    elif isinstance(pairs_per_cta, numbers.Integral) and 1 <= pairs_per_cta <= ROUTE_MAX_CTA_PAIRS:
        per = int(pairs_per_cta)
    else:
        raise ValueError(f"pairs_per_cta={pairs_per_cta!r}: must be an int in 1..{ROUTE_MAX_CTA_PAIRS}")
    side = 1 if pad_to == 1 else max(1, min(num_experts, sm_count))
    return RoutePlan(MoeRouteConfig(arch=arch, id_dtype=id_dtype), per, side,
                     side + -(-pairs // per), route_smem(num_experts))


def combine_launch(tokens: int, vpr: int, sm_count: int) -> tuple[bool, tuple[int, int, int]]:
    """(split, grid) of combine. Columns split over grid.y (a thread a 16-byte column, its
    top_k loads in flight at once) while the grid stays within COMBINE_SPLIT_WAVES waves of
    resident CTAs; above, a CTA a token, grid-stride. H100, H = 7168, top-8: a CTA a token took
    14.3 / 14.9 / 38.4 us at T = 16 / 64 / 512 (latency-bound), the split 2.5 / 3.4 us at
    T = 16 / 64; at T = 4096 a CTA a token runs at 0.95x copy."""
    chunks = -(-vpr // MOVE_THREADS)
    if tokens * chunks <= COMBINE_SPLIT_WAVES * sm_count * MOVE_CTAS_PER_SM:
        return True, (max(1, tokens), chunks, 1)
    return False, (move_grid(tokens, sm_count), 1, 1)


def move_grid(rows: int, sm_count: int) -> int:
    """CTAs of dispatch / combine: one a row (token) up to a full wave, grid-stride above."""
    return max(1, min(rows, sm_count * MOVE_CTAS_PER_SM))


# prewarm_configs' spec keys and values (Family.spec_keys)
SPEC_KEYS = {"num_experts": None, "id_dtypes": ID_DTYPES, "dtypes": DTYPES, "w_dtypes": W_DTYPES}


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[Any]:
    """Every config dispatch can pick. spec: "num_experts" (list; default: every warps bucket),
    "id_dtypes", "dtypes" (fp16/bf16 kept), "w_dtypes"."""
    experts = spec.get("num_experts")
    if isinstance(experts, int):
        experts = [experts]
    if experts:  # the multi-CTA size and every single-CTA size the table can pick
        try:
            experts = [int(e) for e in experts]
        except (TypeError, ValueError):  # None, a list, 'x'
            raise UnsupportedConfigError(f"moe_routing spec num_experts: {spec['num_experts']!r}; "
                                         f"expected integers in 1..{MAX_EXPERTS}") from None
        warps_list = sorted({min(w, warps_for(e)) for e in experts
                             for w in (warps_for(e), *(w for _, w in SINGLE_WARPS))})
    else:
        warps_list = list(WARPS)
    id_dtypes = tuple(spec.get("id_dtypes") or ID_DTYPES)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    w_dtypes = tuple(spec.get("w_dtypes") or W_DTYPES)
    for bad in set(id_dtypes) - set(ID_DTYPES):
        raise UnsupportedConfigError(f"moe_routing spec id_dtypes: {bad!r}; expected {ID_DTYPES}")
    for arch in archs:
        get_arch(arch)
        for id_dtype in id_dtypes:
            for warps in warps_list:
                yield MoeLayoutConfig(arch=arch, id_dtype=id_dtype, warps=warps)
            yield MoeRouteConfig(arch=arch, id_dtype=id_dtype)
        yield MoeDispatchConfig(arch=arch)
        for dtype in dtypes:
            for w_dtype in w_dtypes:
                for split in (False, True):
                    yield MoeCombineConfig(arch=arch, dtype=dtype, w_dtype=w_dtype, split=split)


__all__ = ["CHUNK", "LayoutPlan", "MOVE_THREADS", "ROUTE_FUSED_MAX", "RoutePlan", "SINGLE_MAX",
           "SINGLE_WARPS", "check_experts", "combine_launch",
           "move_grid", "plan_layout", "plan_route", "prewarm_configs", "select_layout", "warps_for"]
