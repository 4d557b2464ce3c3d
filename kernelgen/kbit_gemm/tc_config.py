"""Config of the kbit GEMM tensor-core path (mma.sync m16n8k16 with a cp.async pipeline).

Split-K is a launch parameter (grid.y), not a config field: one cubin serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import smem_cap
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from ..kbit.config import BITS
from .config import CTYPE, DTYPES

TILE_K = 64  # two kbit blocks a row per k-tile
WARPS = 8
# (tile_m, tile_n) -> (warps along M, CTAs/SM the launch bounds ask for). Warps sit side by
# side along N (warps_m = 1): each decodes its own W columns once for all its m16 tiles (decode
# is most of a warp's instructions). A warp owns tile_m x (tile_n / 8) of C.
# Measured on the H100 (examples/bench_kbit_gemm.py --tiles, 4 bits): 16-row tiles and 32x256
# were never faster than these three for M >= 17 (the GEMV path took M <= 16 then), so they are
# not built.
TILES: dict[tuple[int, int], tuple[int, int]] = {
    (32, 128): (1, 2),  # warp 32 x 16
    (64, 128): (1, 2),  # warp 64 x 16
    (64, 256): (1, 1),  # warp 64 x 32: 64 fp32 accumulators (~180 registers: one CTA/SM)
}
STAGES = (2, 3, 4, 5, 6)
MAX_STAGES = 4  # the selector's choice, fewer where shared memory does not fit (sm_120a, 8.6 / 8.9)


def lut_bytes(bits: int) -> int:
    """Pair table (2^(2 bits) entries x copies x 4 bytes, mma_gemm.cuh PairLut) + scale table."""
    return (1 << (2 * bits)) * (8 if bits == 5 else 32) * 4 + 256 * 4


def stage_bytes(bits: int, tile_m: int, tile_n: int) -> int:
    """One pipeline stage: A tile, W planes (8*bits bytes a row), one scale word a row."""
    return tile_m * TILE_K * 2 + tile_n * 8 * bits + tile_n * 4


def smem_for(bits: int, tile_m: int, tile_n: int, stages: int) -> int:
    return lut_bytes(bits) + stages * stage_bytes(bits, tile_m, tile_n)


def stages_for(arch: str, bits: int, tile_m: int, tile_n: int, smem_limit: int | None = None) -> int:
    """The deepest pipeline up to MAX_STAGES that fits the shared memory a block of the arch and
    of the device (`smem_limit`; None: the target's)."""
    cap = smem_cap(arch, smem_limit)
    for s in range(MAX_STAGES, 1, -1):
        if smem_for(bits, tile_m, tile_n, s) <= cap:
            return s
    raise UnsupportedConfigError(f"kbit mma tile {tile_m}x{tile_n} at {bits} bits: 2 stages need "
                                 f"{smem_for(bits, tile_m, tile_n, 2)} B of shared memory a block, "
                                 f"{arch} on this device allows {cap} B")


@dataclass(frozen=True)
class KbitMmaConfig(KernelConfig):
    family: ClassVar[str] = "kbit_gemm"
    template: ClassVar[str] = "kbit_gemm/mma_gemm.cu.jinja"
    bits: int = 4
    dtype: str = "float16"  # A, bias and C
    tile_m: int = 64
    tile_n: int = 128
    stages: int = 4

    def check(self) -> None:
        def bad(field: str, rule: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"{self.short()}: {field}={getattr(self, field)!r}; {rule}")

        if self.bits not in BITS:
            raise bad("bits", "kbit supports bits in 2..5")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"expected one of {DTYPES}")
        if (self.tile_m, self.tile_n) not in TILES:
            raise bad("tile_m", f"(tile_m, tile_n)=({self.tile_m}, {self.tile_n}); expected one of "
                                f"{sorted(TILES)}")
        if self.stages not in STAGES:
            raise bad("stages", f"expected one of {STAGES}")

    @property
    def warps_m(self) -> int:
        return TILES[(self.tile_m, self.tile_n)][0]

    @property
    def min_blocks(self) -> int:
        return TILES[(self.tile_m, self.tile_n)][1]

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_mma_gemm",)

    def smem_bytes(self) -> int:
        return smem_for(self.bits, self.tile_m, self.tile_n, self.stages)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "warps_m": self.warps_m,
                "min_blocks": self.min_blocks}
