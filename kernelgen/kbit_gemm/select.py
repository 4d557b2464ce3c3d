"""Host-side selector of the kbit GEMM bandwidth path, as data plus one pure function.

(arch, M, N, K, bits, dtype, SM count) -> GemvPlan: the kernel config (m_tile, warps, ring
stages, split_k flag) and the launch (CTAs, m passes, shared memory). No GPU work; memoised and printable
(KERNELGEN_PRINT_CONFIGS=1) through `kernelgen.core.select.selector`. `prewarm_configs` walks the
same function over the shapes of a spec, so prewarm builds exactly what dispatch can pick.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch
from ..core.select import selector
from ..errors import UnsupportedConfigError
from .config import (
    BITS,
    DTYPES,
    FALLBACK,
    GROUP_K,
    LAUNCH,
    STAGE_K,
    TILE_ROWS,
    KbitGemvConfig,
    smem_for,
)

# (largest M, m_tile): tokens a CTA pass covers. M above the last row runs ceil(M/16) passes
# over grid.z (W is read once per pass) until the tensor-core path takes large M.
M_TILE_TABLE: tuple[tuple[int, int], ...] = ((2, 2), (1 << 31, 16))
# The grid is persistent (one CTA per SM per m pass); a CTA streams its units (16*warps rows x
# 256 k) at the rate the memory gives, so the time is about the most units a CTA gets plus, with
# stream-K partial row blocks, the partial write, the count and the last CTA's reduction
# (about half a unit). Whole row blocks per CTA (ctas divides the row blocks) need none of it.
PARTIAL_COST_UNITS = 0.5
# shared memory of an SM (bytes) that resident CTAs share, per target (the mma path's planner
# reads it too)
SMEM_PER_SM: dict[str, int] = {"sm_80": 164 * 1024, "sm_90a": 228 * 1024, "sm_100a": 228 * 1024,
                               "sm_120a": 100 * 1024}
# SM counts of the parts each target runs on, for prewarm of a spec with shapes (a spec's
# "sm_counts" overrides): A100 / A10 / L40S / 4090; H100 SXM, H200 / H100 PCIe / H20;
# B200; RTX 5090 / RTX PRO 6000 / 5080.
SM_COUNTS: dict[str, tuple[int, ...]] = {
    "sm_80": (108, 72, 142, 128),
    "sm_90a": (132, 114, 78),
    "sm_100a": (148,),
    "sm_120a": (170, 188, 84),
}


@dataclass(frozen=True)
class GemvPlan:
    """One launch: config, CTAs per m pass (grid.x), m passes (grid.z), smem, and the work split
    (row blocks x units of a row block; CTA c takes units [c*U/ctas, (c+1)*U/ctas))."""

    config: KbitGemvConfig
    ctas: int
    m_tiles: int
    smem: int
    row_blocks: int
    units_per_row_block: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.ctas, 1, self.m_tiles)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.warps * 32, 1, 1)

    @property
    def units(self) -> int:
        return self.row_blocks * self.units_per_row_block

    @property
    def ws_elems(self) -> int:
        """fp32 workspace of stream-K partials: [m_tiles, ctas, 2 slots, warps x n8 tiles x 128]
        (a warp's accumulator fragments, 4 floats a lane per n8 tile; m_tile 2 and 8: one tile)."""
        cfg = self.config
        slot = cfg.warps * max(1, cfg.m_tile // 8) * 128
        return self.m_tiles * self.ctas * 2 * slot if cfg.split_k else 0

    @property
    def n_counters(self) -> int:
        return self.m_tiles * self.row_blocks if self.config.split_k else 0

    def short(self) -> str:
        return (f"{self.config.short()} ctas={self.ctas} units={self.row_blocks}x"
                f"{self.units_per_row_block} grid={self.grid} smem={self.smem}")


def check_shape(n: int, k: int, name: str = "W") -> None:
    """The rule the kernel needs: K a multiple of 128 (a lane decodes 4-block groups of 16-byte
    aligned plane words), N >= 1, K >= 128."""
    if n < 1 or k < GROUP_K or k % GROUP_K:
        raise ValueError(f"{name}: shape [N={n}, K={k}]; the kbit GEMM needs N >= 1 and K a "
                         f"positive multiple of {GROUP_K} (4 blocks of 32, 16-byte aligned)")


def m_tile_for(m: int) -> int:
    for max_m, tile in M_TILE_TABLE:
        if m <= max_m:
            return tile
    raise AssertionError("unreachable: the last row takes every M")


def launch_for(arch: str, m_tile: int, bits: int) -> tuple[int, int]:
    """(warps, stages) of the table, or the first fallback whose shared memory fits the arch."""
    limit = get_arch(arch).smem_optin
    for warps, stages in (LAUNCH.get((m_tile, bits), FALLBACK[0]), *FALLBACK):
        if smem_for(bits, warps, stages, m_tile) <= limit:
            return warps, stages
    raise AssertionError("unreachable: the smallest fallback fits every arch")


def plan_gemv(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
              split: int | None = None, *, warps: int | None = None,
              stages: int | None = None, m_tile: int | None = None) -> GemvPlan:
    """Pure planner. `split` forces about `split` CTAs per row block (tests, tuning); None picks
    the split. `warps` / `stages` / `m_tile` override the tables (tuning)."""
    check_shape(n, k)
    if m < 1:
        raise ValueError(f"A: M={m}; the kbit GEMM needs M >= 1")
    m_tile = m_tile or m_tile_for(m)
    w0, s0 = launch_for(arch, m_tile, bits)
    warps, stages = warps or w0, stages or s0
    m_tiles = -(-m // m_tile)
    rb = -(-n // (TILE_ROWS * warps))
    kt = -(-k // STAGE_K)
    units = rb * kt
    per_pass = max(1, sm_count // m_tiles)  # CTAs of one m pass resident at once
    if split is None:
        # stream-K over all SMs, or the most whole row blocks per CTA: the cheaper
        g_s = min(units, per_pass)
        cost_s = -(-units // g_s) + (PARTIAL_COST_UNITS if rb % g_s else 0.0)
        g_w = max(d for d in range(1, min(rb, per_pass) + 1) if rb % d == 0)
        ctas = g_w if units // g_w <= cost_s else g_s
    else:
        groups = k // GROUP_K
        if not 1 <= split <= groups:
            raise ValueError(f"split_k={split}: must be in 1..{groups} (K/{GROUP_K}) for K={k}")
        ctas = min(units, rb * split)
    cfg = KbitGemvConfig(arch=arch, bits=bits, dtype=dtype, m_tile=m_tile, warps=warps,
                         stages=stages, split_k=rb % ctas != 0)
    smem = smem_for(bits, warps, stages, min(m, m_tile))
    return GemvPlan(cfg, ctas, m_tiles, smem, rb, kt)


@selector
def select_gemv(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int) -> GemvPlan:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_gemv(arch, m, n, k, bits, dtype, sm_count)


def _shapes(spec: dict[str, Any]) -> list[tuple[int | None, int, int]]:
    out = []
    for s in spec.get("shapes") or ():
        if not isinstance(s, (list, tuple)) or len(s) not in (2, 3):
            raise UnsupportedConfigError(f"kbit_gemm spec shapes: {s!r}; expected [N, K] or [M, N, K]")
        m, n, k = (None, *s) if len(s) == 2 else s
        try:
            check_shape(int(n), int(k), name=f"spec shape {list(s)}")
        except ValueError as e:
            raise UnsupportedConfigError(str(e)) from None
        out.append((m, int(n), int(k)))
    return out


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KbitGemvConfig]:
    """Configs the selector can return. spec: "bits", "dtypes" (others are skipped: this family
    takes fp16/bf16 activations), "shapes" ([N, K]: every M; [M, N, K]: that M), "sm_counts"
    (default: SM_COUNTS of the arch). Without shapes: every config of the table."""
    bits_list = tuple(spec.get("bits") or BITS)
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = _shapes(spec)
    seen: set[KbitGemvConfig] = set()
    for arch in archs:
        get_arch(arch)
        for bits in bits_list:
            for dtype in dtypes:
                if not shapes:
                    for m_tile in sorted({t for _, t in M_TILE_TABLE}):
                        warps, stages = launch_for(arch, m_tile, bits)
                        for split_k in (False, True):
                            yield KbitGemvConfig(arch=arch, bits=bits, dtype=dtype, m_tile=m_tile,
                                                 warps=warps, stages=stages, split_k=split_k)
                    continue
                for sms in spec.get("sm_counts") or SM_COUNTS[arch]:
                    for m, n, k in shapes:
                        # a plan depends on M only through (m_tile, m passes); from sms passes
                        # on every pass gets one CTA
                        reps = (1, *(16 * p for p in range(1, sms + 1)))
                        for mm in (m,) if m is not None else reps:
                            cfg = plan_gemv(arch, mm, n, k, bits, dtype, sms).config
                            if cfg not in seen:
                                seen.add(cfg)
                                yield cfg
