"""Host-side planner of the MoE routing kernels: data plus pure functions, no GPU work.

Layout: one CTA for n = T * top_k <= SINGLE_MAX pairs (one launch, the decode path); above,
the three-kernel multi-CTA path over CHUNK pairs a CTA. The CTA's warps are the most whose
histograms (warps x E ints) fit HIST_INTS. `prewarm_configs` walks the same tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch
from ..core.select import selector
from ..errors import UnsupportedConfigError
from .config import (
    DTYPES,
    HIST_INTS,
    ID_DTYPES,
    ITEMS,
    MAX_EXPERTS,
    MOVE_THREADS,
    W_DTYPES,
    WARPS,
    MoeCombineConfig,
    MoeDispatchConfig,
    MoeLayoutConfig,
    layout_smem,
)

SINGLE_MAX = 8192  # pairs; the one-CTA layout up to here (measured crossover: BENCHMARKS.md)
CHUNK = 4096  # pairs a CTA of the multi-CTA layout (a multiple of 32 * ITEMS * max(WARPS))
MOVE_CTAS_PER_SM = 16  # dispatch / combine grid: resident CTAs of MOVE_THREADS (2048 threads/SM)
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
                multi: bool | None = None) -> LayoutPlan:
    """Pure planner; `multi` forces the path (tests, benchmarks), None picks by SINGLE_MAX."""
    warps = warps_for(num_experts)
    cfg = MoeLayoutConfig(arch=arch, id_dtype=id_dtype, warps=warps)
    if multi is None:
        multi = pairs > SINGLE_MAX
    blocks = max(1, -(-pairs // CHUNK)) if multi else 1
    return LayoutPlan(cfg, bool(multi), blocks, CHUNK if multi else pairs,
                      layout_smem(warps, num_experts))


@selector
def select_layout(arch: str, pairs: int, num_experts: int, id_dtype: str) -> LayoutPlan:
    """The dispatch choice (memoised; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_layout(arch, pairs, num_experts, id_dtype)


def move_grid(rows: int, sm_count: int) -> int:
    """CTAs of dispatch / combine: one a row (token) up to a full wave, grid-stride above."""
    return max(1, min(rows, sm_count * MOVE_CTAS_PER_SM))


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[Any]:
    """Every config dispatch can pick. spec: "num_experts" (list; default: every warps bucket),
    "id_dtypes", "dtypes" (fp16/bf16 kept), "w_dtypes"."""
    experts = spec.get("num_experts")
    if isinstance(experts, int):
        experts = [experts]
    warps_list = sorted({warps_for(int(e)) for e in experts}) if experts else list(WARPS)
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
        yield MoeDispatchConfig(arch=arch)
        for dtype in dtypes:
            for w_dtype in w_dtypes:
                yield MoeCombineConfig(arch=arch, dtype=dtype, w_dtype=w_dtype)


__all__ = ["CHUNK", "LayoutPlan", "MOVE_THREADS", "SINGLE_MAX", "check_experts", "move_grid",
           "plan_layout", "prewarm_configs", "select_layout", "warps_for"]
