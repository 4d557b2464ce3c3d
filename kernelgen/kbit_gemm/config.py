"""Config of the kbit GEMM bandwidth path (GEMV-style kernel for small M)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from ..kbit.config import BITS

DTYPES = ("float16", "bfloat16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
# tokens per CTA pass: 2 = column mode (2 tokens x 4 blocks on the mma's 8 columns, block scales
# applied in fp32 after the mma: no per-weight scale multiply), 16 = row mode (tokens on two n8
# tiles, each W pair scaled before the mma). The kernel also takes 8 (row mode, one n8 tile);
# the tables leave it out to keep the prewarm set small.
M_TILES = (2, 8, 16)
WARPS = (2, 4, 8, 16)  # warps per CTA; each owns 16 rows of W, the CTA a row block of 16*warps
STAGES = (2, 3, 4, 5, 6, 8)  # cp.async ring depth (units of 256 k a CTA has in flight + 1)
GROUP_K = 128  # K granularity (the last unit of a row may be half a unit)
STAGE_K = 256  # k per unit (one ring stage)
TILE_ROWS = 16  # W rows per warp
LUT_BYTES = 64 * 1024  # decode table (templates/kbit_gemm/gemv.cuh)
A_TOKEN_BYTES = 576  # one token's A in a stage: 512 bytes + 64 (bank offset between tokens)
KB = 1024

# (m_tile, bits) -> (warps, stages) on parts with 228 KB of shared memory per SM (sm_90a,
# sm_100a): one CTA per SM; the ring keeps (stages - 1) units of 128 rows x 256 k in flight,
# 24..60 KB of weights an SM (Little's law at ~3 TB/s and ~700 ns wants ~16-24 KB).
LAUNCH: dict[tuple[int, int], tuple[int, int]] = {
    (2, 2): (8, 6), (2, 3): (8, 5), (2, 4): (8, 4), (2, 5): (8, 4),
    (16, 2): (8, 6), (16, 3): (8, 5), (16, 4): (8, 4), (16, 5): (8, 4),
}
# smaller shared memory (sm_80: 163 KB, sm_120a: 99 KB a CTA): the first of these that fits
FALLBACK: tuple[tuple[int, int], ...] = ((8, 4), (8, 3), (4, 4), (4, 3), (4, 2), (2, 2))


def stage_bytes(bits: int, warps: int, tokens: int) -> int:
    """Shared bytes of one ring stage: planes + scale bytes of 16*warps rows x 256 k, and A."""
    return TILE_ROWS * warps * (32 * bits + 8) + tokens * A_TOKEN_BYTES


def smem_for(bits: int, warps: int, stages: int, tokens: int) -> int:
    """Dynamic shared memory of a launch: table + ring + 512 zero bytes + a 16-byte flag."""
    return LUT_BYTES + stages * stage_bytes(bits, warps, tokens) + 512 + 16


@dataclass(frozen=True)
class KbitGemvConfig(KernelConfig):
    family: ClassVar[str] = "kbit_gemm"
    template: ClassVar[str] = "kbit_gemm/gemv.cu.jinja"
    bits: int = 4
    dtype: str = "float16"  # A, bias and C
    m_tile: int = 8
    warps: int = 8
    stages: int = 4
    split_k: bool = False  # stream-K partial row blocks: fp32 workspace + last-CTA reduction

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
        if self.stages not in STAGES:
            raise bad("stages", f"expected one of {STAGES}")
        if not isinstance(self.split_k, bool):
            raise bad("split_k", "expected a bool")

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_gemv",)

    def smem_bytes(self) -> int:
        """The most dynamic smem a launch of this config asks for (m_tile tokens of A)."""
        return smem_for(self.bits, self.warps, self.stages, self.m_tile)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype]}
