"""Config of the kbit GEMM bandwidth path (GEMV-style kernel for small M)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import per_target, smem_cap
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from ..kbit.config import BITS

DTYPES = ("float16", "bfloat16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
M_TILES = (8, 16)  # tokens per CTA pass = mma N (8) x 1 or 2
WARPS = (4, 8)  # warps per CTA; each K-warp slot (kw warps) owns 16 rows of W at a time
KWS = (1, 2, 4)  # warps sharing one tile's K range inside a CTA (sums reduced in shared memory)
MIN_BLOCKS = (1, 2, 3, 4)  # __launch_bounds__ CTAs/SM: the register cap 65536 / (threads x this)
GROUP_K = 128  # K granularity: a lane's group of 4 blocks of 32 (16*bits bytes, 16B aligned)
TILE_ROWS = 16  # W rows per warp tile
KB = 1024

# (m_tile, bits) -> (warps a CTA, CTAs/SM the launch bounds ask for, dynamic smem cap of a
# CTA: pair table + A slice). 4 warps x 3 CTAs leave 168 registers a thread, what m_tile=8
# needs without rematerialising addresses (ptxas wants ~160). m_tile=16 takes 8 warps x 2 at
# <= 128 registers (0 spills at 2..4 bits): the 16-row A slice is staged once for 8 warps and
# an SM holds 16 (H100, same run, 4 warps x 2 -> 8 x 2: 4 bits M=16 14336x4096 32.1 -> 29.2 us,
# 4096x14336 48.4 -> 37.0; 2 bits 26.6 -> 23.4, 42.7 -> 30.7; 4096x4096 17.6 -> 19.0); 5 bits
# spills 16 bytes at 128 and keeps 4 warps x 2 (measured 60.0 / 125.6 us vs 46.9 / 78.7 us
# spilling). The smem caps let those CTAs share an SM's 228 KB (and stay <= 99 KB: sm_120a).
LAUNCH: dict[tuple[int, int], tuple[int, int, int]] = {
    (8, 2): (4, 3, 72 * KB), (8, 3): (4, 3, 72 * KB), (8, 4): (4, 3, 72 * KB),
    (8, 5): (4, 3, 96 * KB),
    (16, 2): (8, 2, 96 * KB), (16, 3): (8, 2, 96 * KB), (16, 4): (8, 2, 96 * KB),
    (16, 5): (4, 2, 96 * KB),
}

# (m_tile, bits) -> the launch of K-warp configs (kw > 1): 8-warp CTAs x 2 at <= 128 registers
# (the loop's SASS is the same as at 168 registers), except 5 bits at m_tile 8, which spills
# at 128 and keeps 4 warps x 3. The planner weighs K warps at both m_tiles (select.py
# kw_choices: not 5 bits at m_tile 16).
KW_LAUNCH: dict[tuple[int, int], tuple[int, int, int]] = {
    (8, 2): (8, 2, 96 * KB), (8, 3): (8, 2, 96 * KB), (8, 4): (8, 2, 96 * KB),
    (8, 5): (4, 3, 96 * KB),
    (16, 2): (8, 2, 96 * KB), (16, 3): (8, 2, 96 * KB), (16, 4): (8, 2, 96 * KB),
    (16, 5): (8, 2, 96 * KB),
}


# Per-arch exceptions to LAUNCH: sm_100a's ptxas spills 8 bytes at 4 bits, m_tile 16, 128
# registers (unsplit), so that one keeps 4 warps x 2 there.
LAUNCH_BY_ARCH: dict[str, dict[tuple[int, int], tuple[int, int, int]]] = per_target({
    "sm_100a": {(16, 4): (4, 2, 96 * KB)},
})


def launch_of(m_tile: int, bits: int, kw: int, arch: str = "") -> tuple[int, int, int]:
    """(warps a CTA, CTAs/SM of the launch bounds, smem cap of a CTA) of a table config."""
    if kw == 1:
        return LAUNCH_BY_ARCH.get(arch, {}).get((m_tile, bits), LAUNCH[(m_tile, bits)])
    return KW_LAUNCH[(m_tile, bits)]


def kw_red_bytes(warps: int, kw: int, m_tile: int) -> int:
    """Shared bytes of the K-warp sums (gemv.cuh): 2 parities x slots x (kw-1) x NT x 512."""
    return 2 * (warps // kw) * (kw - 1) * (m_tile // 8) * 512


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
    kw: int = 1  # warps of a CTA sharing one tile's K range (shared-memory reduction)

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
        if self.kw not in KWS or self.warps % self.kw:
            raise bad("kw", f"expected one of {KWS} dividing warps={self.warps}")
        if not isinstance(self.split_k, bool):
            raise bad("split_k", "expected a bool")

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_gemv",)

    def smem_bytes(self) -> int:
        """The most dynamic smem a launch of this config asks for (select.py stays below): a
        one-CTA-an-SM config (min_blocks 1, select.py ONE_CTA_MIN_M) all that a block may have."""
        if self.min_blocks == 1:
            return smem_cap(self.arch)
        return launch_of(self.m_tile, self.bits, self.kw, self.arch)[2] if (self.m_tile, self.bits) in LAUNCH \
            else 96 * KB

    def smem_bytes_on(self, limit: int) -> int:
        """One CTA an SM: what the device allows a block (a 99 KB part of sm_80: 99 KB; the
        planner sizes the A slice by that limit), else smem_bytes()."""
        return min(self.smem_bytes(), limit) if self.min_blocks == 1 else self.smem_bytes()

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype]}


@dataclass(frozen=True)
class KbitTiledDequantConfig(KernelConfig):
    """Tiled 4-bit kbit weights -> dense W in fp16 / bf16 (templates/kbit_gemm/tiled.cuh): the
    dequantize + cuBLAS path of the tiled layout (kernelgen/kbit_gemm/tiled.py)."""

    family: ClassVar[str] = "kbit_gemm"
    template: ClassVar[str] = "kbit_gemm/dequant_tiled.cu.jinja"
    dtype: str = "float16"  # the output: fp16 / bf16 (the dequant path), fp32 (dequantize())

    def check(self) -> None:
        if self.dtype not in OUT_DTYPES:
            raise UnsupportedConfigError(f"{self.short()}: dtype={self.dtype!r}; expected one of {OUT_DTYPES}")

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_dequant_tiled",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": {**CTYPE, "float32": "float"}[self.dtype]}


OUT_DTYPES = DTYPES + ("float32",)
