"""Config of the kbit GEMM bandwidth path (GEMV-style kernel for small M)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from ..kbit.config import BITS

DTYPES = ("float16", "bfloat16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
M_TILES = (8, 16)  # tokens per CTA pass = mma N (8) x 1 or 2
WARPS = (4, 8)  # warps per CTA; each owns 16 rows of W
MIN_BLOCKS = (1, 2, 3, 4)  # __launch_bounds__ CTAs/SM: the register cap 65536 / (threads x this)
GROUP_K = 128  # K granularity: a lane's group of 4 blocks of 32 (16*bits bytes, 16B aligned)
TILE_ROWS = 16  # W rows per warp tile
KB = 1024

# (m_tile, bits) -> (warps a CTA, CTAs/SM the launch bounds ask for, dynamic smem cap of a
# CTA: pair table + A slice). 4 warps x 3 CTAs leave 168 registers a thread, what m_tile=8
# needs without rematerialising addresses (ptxas wants ~160); m_tile=16 holds twice the
# fragments (~190) and gets 4 warps x 2. The smem caps let those CTAs share an SM's 228 KB.
LAUNCH: dict[tuple[int, int], tuple[int, int, int]] = {
    (8, 2): (4, 3, 72 * KB), (8, 3): (4, 3, 72 * KB), (8, 4): (4, 3, 72 * KB),
    (8, 5): (4, 3, 96 * KB),
    (16, 2): (4, 2, 96 * KB), (16, 3): (4, 2, 96 * KB), (16, 4): (4, 2, 96 * KB),
    (16, 5): (4, 2, 96 * KB),
}

def lut_bytes(bits: int) -> int:
    """Shared bytes of the pair-code table (templates/kbit_gemm/gemv.cuh, struct Lut)."""
    copies = 16 if bits == 5 else 32
    stride = 256 if bits <= 3 else 4 * copies
    return (1 << (2 * bits)) * stride


@dataclass(frozen=True)
class KbitGemvConfig(KernelConfig):
    family: ClassVar[str] = "kbit_gemm"
    template: ClassVar[str] = "kbit_gemm/gemv.cu.jinja"
    bits: int = 4
    dtype: str = "float16"  # A, bias and C
    m_tile: int = 8
    warps: int = 8
    min_blocks: int = 3
    split_k: bool = False  # K split over grid.y: fp32 workspace + last-warp reduction

    def check(self) -> None:
        def bad(field: str, rule: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"{self.short()}: {field}={getattr(self, field)!r}; {rule}")

        if self.bits not in BITS:
            raise bad("bits", "kbit supports bits in 2..5")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"expected one of {DTYPES}")
        if self.m_tile not in M_TILES:
            raise bad("m_tile", f"expected one of {M_TILES}")
        if self.warps not in WARPS:
            raise bad("warps", f"expected one of {WARPS}")
        if self.min_blocks not in MIN_BLOCKS:
            raise bad("min_blocks", f"expected one of {MIN_BLOCKS}")
        if not isinstance(self.split_k, bool):
            raise bad("split_k", "expected a bool")

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_gemv",)

    def smem_bytes(self) -> int:
        """The most dynamic smem a launch of this config asks for (select.py stays below)."""
        return LAUNCH.get((self.m_tile, self.bits), (0, 0, 96 * KB))[2]

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype]}
