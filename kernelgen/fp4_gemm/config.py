"""Configs of the FP4-weight GEMM: the bandwidth (GEMV) path and the tensor-core tile path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import SMEM_PER_SM
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError

FMTS = ("nvfp4", "mxfp4")
# Both kernels also read 4-bit kbit weights (kernelgen.kbit_gemm.tiled, tiled the same way:
# codes through a shared-memory codebook table, E4M4 scales a block of 32; fp4_gemm itself
# takes FMTS only)
GEMV_FMTS = FMTS + ("kbit4",)
FMT_ID = {"nvfp4": 0, "mxfp4": 1, "kbit4": 2}
GROUP = {"nvfp4": 16, "mxfp4": 32, "kbit4": 32}
SCALE_BYTES = {"nvfp4": 8, "mxfp4": 4, "kbit4": 4}  # scale bytes per row per 128 k
DTYPES = ("float16", "bfloat16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
ENC_ID = {"float16": 0, "bfloat16": 1}  # fp4.cuh ENC_F16 / ENC_BF16 (layout.py ENCODINGS)
STEP_K = 128  # K granularity of both kernels: 4 lanes x 32 elements
KBIT4_LUT_BYTES = 32 * 1024  # fp4.cuh: the kbit4 code table a CTA (dynamic shared memory)
KBIT4_WIDE_LUT_BYTES = 64 * 1024  # fp4.cuh: the wide table (one PRMT forms a pair's offset)

# bandwidth path
M_TILES = (8, 16)  # tokens per pass (mma n8 x 1 or 2)
GEMV_WARPS = 8
GEMV_WARPS_PER_SM = (16, 32)  # warps an SM the launch bounds ask for: <= 128 / <= 64 registers
DEPTHS = (2, 3, 4)  # quad steps in flight per warp
TPWS = (1, 2)  # tiles a warp
PFS = (0, 1, 2, 4)  # steps a warp prefetches into L2 before its PDL wait
# tile path
TILE_BN = 128
TILE_BMS = {32: 1, 64: 2, 128: 2}  # BM tokens -> default warps along tokens (4 along W each)
WARPS_T = (1, 2, 4)
STAGES = (2, 3, 4)
KB = 1024


def _bad(cfg: KernelConfig, field: str, rule: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{cfg.short()}: {field}={getattr(cfg, field)!r}; {rule}")


def _check_operands(cfg: Any) -> None:
    """fmt, dtype and enc of the kernels that read the tiled layout (GEMV, tile, wgmma)."""
    if cfg.fmt not in GEMV_FMTS:
        raise _bad(cfg, "fmt", f"expected one of {GEMV_FMTS}")
    if cfg.dtype not in DTYPES:
        raise _bad(cfg, "dtype", f"expected one of {DTYPES}")
    if cfg.enc not in DTYPES:
        raise _bad(cfg, "enc", f"expected one of {DTYPES}")
    if cfg.fmt == "kbit4" and cfg.enc != cfg.dtype:
        raise _bad(cfg, "enc", "kbit4 words decode through a table of the activation type: "
                               "enc must equal dtype")


def _operand_vars(cfg: Any) -> dict[str, Any]:
    """Template variables of those kernels' operands: A's C++ type, fp4.cuh's FMT and ENC ids."""
    return {"ctype": CTYPE[cfg.dtype], "fmt_id": FMT_ID[cfg.fmt], "enc_id": ENC_ID[cfg.enc]}


@dataclass(frozen=True)
class Fp4GemvConfig(KernelConfig):
    family: ClassVar[str] = "fp4_gemm"
    template: ClassVar[str] = "fp4_gemm/gemv.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float16"  # A, bias and C
    enc: str = "float16"  # the activation type the weight words are bit-encoded for (layout.py)
    m_tile: int = 8
    warps: int = GEMV_WARPS
    depth: int = 4
    tpw: int = 1  # tiles (16 W rows) a warp owns at the same k: they share its A fragments
    hint: bool = True  # weight loads skip L1 and prefetch 256-byte L2 segments
    warps_per_sm: int = 16  # resident warps an SM the launch bounds ask for (registers a thread)
    a_by_word: bool = False  # A fragments loaded a word at a time (m_tile 16 at 32 warps an SM)
    # A staged DEPTH steps ahead by cp.async in a shared-memory ring a warp; not a default (see
    # select.py: with L2-only copies it measured 2.5-13x slower; the L1-allocating one is unmeasured)
    a_ring: bool = False
    # steps of weights each warp prefetches into L2 before it waits for the grid before it, then
    # releases the next grid (PDL); 0: wait first (select.py pf_for)
    pf: int = 0
    # kbit4: the 64 KB code table (fp4.cuh kbit4_word_wide: 2 instructions a pair instead of 3)
    lut_wide: bool = False
    # the grid's warps take equal runs of the (tile unit, step) blocks instead of a unit's K
    # slice each (gemv.cuh BAL: a unit shared by runs adds its parts through ws); one pass of
    # M_TILE tokens, no K split, no a_ring, pf 0
    balanced: bool = False

    def check(self) -> None:
        _check_operands(self)
        if self.pf not in PFS:
            raise _bad(self, "pf", f"expected one of {PFS}")
        if self.fmt == "kbit4" and (self.warps < 8 or self.a_ring):
            raise _bad(self, "warps", "kbit4 CTAs hold a 32 KB code table: 8 or 16 warps, no a_ring")
        if not isinstance(self.balanced, bool) or (self.balanced and (self.a_ring or self.pf)):
            raise _bad(self, "balanced", "a bool, True only without a_ring and at pf 0")
        if not isinstance(self.lut_wide, bool) or (self.lut_wide and self.fmt != "kbit4"):
            raise _bad(self, "lut_wide", "a bool, True only for kbit4 (the FP4 formats decode "
                                         "without a table)")
        if self.m_tile not in M_TILES:
            raise _bad(self, "m_tile", f"expected one of {M_TILES}")
        if self.warps not in (4, 8, 16):
            raise _bad(self, "warps", "expected 4, 8 or 16")
        if self.depth not in DEPTHS:
            raise _bad(self, "depth", f"expected one of {DEPTHS}")
        if self.tpw not in TPWS:
            raise _bad(self, "tpw", f"expected one of {TPWS}")
        if not isinstance(self.hint, bool):
            raise _bad(self, "hint", "expected a bool")
        if self.warps_per_sm not in GEMV_WARPS_PER_SM:
            raise _bad(self, "warps_per_sm", f"expected one of {GEMV_WARPS_PER_SM}")
        if self.warps_per_sm == 32 and (self.tpw != 1 or self.depth > (3 if self.m_tile == 8 else 2)):
            raise _bad(self, "warps_per_sm", "32 (<= 64 registers a thread) fits only tpw 1 and "
                                             "depth 2 (3 at m_tile 8)")
        if not isinstance(self.a_by_word, bool):
            raise _bad(self, "a_by_word", "expected a bool")
        if self.a_by_word and (self.m_tile, self.warps_per_sm) != (16, 32):
            raise _bad(self, "a_by_word", "only m_tile 16 at warps_per_sm 32 (elsewhere the "
                                          "step's fragments fit the registers)")
        if not isinstance(self.a_ring, bool):
            raise _bad(self, "a_ring", "expected a bool")
        if self.a_ring and self.warps_per_sm != 16:
            raise _bad(self, "a_ring", "only at warps_per_sm 16 (its row offsets need registers)")

    def symbols(self) -> tuple[str, ...]:
        return ("fp4_gemv",)

    def smem_bytes(self) -> int:
        """Dynamic: kbit4's code table, the a_ring slots (M_TILE rows x 256 bytes a step and
        warp), else none (A is read from global memory); the K-slice sums meet in static smem."""
        if self.fmt == "kbit4":
            return KBIT4_WIDE_LUT_BYTES if self.lut_wide else KBIT4_LUT_BYTES
        return self.warps * self.depth * self.m_tile * 256 if self.a_ring else 0

    def template_vars(self) -> dict[str, Any]:
        # CTAs an SM for warps_per_sm; at 32 (<= 64 registers) the epilogue's factors are not
        # held through the loop
        return {**super().template_vars(), **_operand_vars(self),
                "min_blocks": self.warps_per_sm // self.warps,
                "early": self.m_tile == 8 and self.warps_per_sm == 16,
                "lean": self.warps_per_sm == 32, "a_by_word": self.a_by_word,
                "a_ring": self.a_ring, "pf": self.pf, "lut_wide": self.lut_wide,
                "balanced": self.balanced}


def tile_smem(fmt: str, bm: int, stages: int) -> int:
    lut = KBIT4_LUT_BYTES if fmt == "kbit4" else 0
    return stages * (TILE_BN * 64 + TILE_BN * SCALE_BYTES[fmt] + bm * 256) + lut


@dataclass(frozen=True)
class Fp4TileConfig(KernelConfig):
    family: ClassVar[str] = "fp4_gemm"
    template: ClassVar[str] = "fp4_gemm/tile.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float16"
    enc: str = "float16"  # the activation type the weight words are bit-encoded for (layout.py)
    bm: int = 64
    stages: int = 3
    warps_t: int = 2  # warps along tokens (x 4 along W rows)

    def check(self) -> None:
        _check_operands(self)
        if self.bm not in TILE_BMS:
            raise _bad(self, "bm", f"expected one of {tuple(TILE_BMS)}")
        if self.stages not in STAGES:
            raise _bad(self, "stages", f"expected one of {STAGES}")
        if self.warps_t not in WARPS_T or self.bm % (8 * self.warps_t):
            raise _bad(self, "warps_t", f"expected one of {WARPS_T} dividing BM={self.bm} into n8 tiles")

    @property
    def threads(self) -> int:
        return 128 * self.warps_t

    def symbols(self) -> tuple[str, ...]:
        return ("fp4_tile",)

    def smem_bytes(self) -> int:
        return tile_smem(self.fmt, self.bm, self.stages)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), **_operand_vars(self), "min_blocks": self.min_blocks}

    @property
    def min_blocks(self) -> int:
        """CTAs/SM the launch bounds ask for: 3 of 4-warp CTAs (<= 168 registers a thread);
        larger CTAs need more than 128 registers (8 warps) or get 128 (16 warps), so one."""
        return 3 if self.warps_t == 1 else 1


WGMMA_ARCHS = ("sm_90a",)  # wgmma.mma_async: Hopper only
WGMMA_BMS = (64, 128, 256)  # tokens a CTA: the wgmma's n
WGMMA_THREADS = 256  # two warpgroups of 64 W rows
WGMMA_SMEM_MAX = 227 * KB  # sm_90a's shared memory a block


def wgmma_smem(bm: int, stages: int, inflight: int, fmt: str = "nvfp4") -> int:
    """templates/fp4_gemm/wgmma.cuh WgSmem: 2 + inflight dense weight steps (128 rows x 128 k),
    `stages` A slots (BM rows x 128 k), kbit4's code table and 1024 bytes of alignment slack."""
    lut = KBIT4_LUT_BYTES if fmt == "kbit4" else 0
    return (2 + inflight) * TILE_BN * STEP_K * 2 + stages * bm * STEP_K * 2 + lut + KB


@dataclass(frozen=True)
class Fp4WgmmaConfig(KernelConfig):
    """The tile path on warpgroup MMA (sm_90a; templates/fp4_gemm/wgmma.cuh): each step's weights
    (NVFP4, MXFP4, or tiled 4-bit kbit through its code table) decoded into shared memory in A's
    dtype, wgmma m64 x BM x k16 with the tokens as n."""

    family: ClassVar[str] = "fp4_gemm"
    template: ClassVar[str] = "fp4_gemm/wgmma.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float16"
    enc: str = "float16"  # the activation type the weight words are bit-encoded for (layout.py)
    bm: int = 128
    stages: int = 4  # A slots (cp.async)
    # weight steps in flight a warp (registers): 3 x 1152 bytes x 8 warps = 27 KB an SM, what
    # ~3 TB/s over 112-132 SMs needs at ~1 us of latency (an estimate; bench --variants sweeps it)
    ring: int = 3
    # wgmma groups left pending across the step's barrier (a third dense buffer; needs stages >= 3)
    inflight: int = 1
    # CTAs an SM the launch bounds ask for: 2 (<= 128 registers) overlaps one CTA's barrier and
    # decode with the other's wgmmas where both fit the SM's 228 KB (BM 64, 2 stages, inflight 0)
    ctas_per_sm: int = 1
    # kbit4 only: 2..4 reads a flat kbit weight of that many bits (bit planes, wgmma.cuh FLAT)
    # instead of the tiled layout; 0: the tiled layout
    flat: int = 0

    def check(self) -> None:
        if self.arch not in WGMMA_ARCHS:
            raise _bad(self, "arch", f"wgmma needs one of {WGMMA_ARCHS}")
        _check_operands(self)
        if self.bm not in WGMMA_BMS:
            raise _bad(self, "bm", f"expected one of {WGMMA_BMS}")
        if self.stages not in STAGES:
            raise _bad(self, "stages", f"expected one of {STAGES}")
        if self.ring not in (1, 2, 3):
            raise _bad(self, "ring", "expected 1, 2 or 3")
        if self.flat not in (0, 2, 3, 4) or (self.flat and self.fmt != "kbit4"):
            raise _bad(self, "flat", "0, or 2..4 (the bits of a flat kbit weight) with fmt kbit4")
        if self.inflight not in (0, 1) or self.stages - 1 - self.inflight < 1:
            raise _bad(self, "inflight", f"expected 0 or 1, leaving one A step copied ahead of "
                                         f"{self.stages} stages")
        if self.smem_bytes() > WGMMA_SMEM_MAX:
            raise _bad(self, "stages", f"BM={self.bm} x {self.stages} stages (inflight "
                                       f"{self.inflight}) need {self.smem_bytes()} B of shared "
                                       f"memory, > {WGMMA_SMEM_MAX}")
        # each CTA also holds 1 KB the driver reserves and a little static shared memory
        per_sm = SMEM_PER_SM[self.arch]
        if self.ctas_per_sm not in (1, 2) or self.ctas_per_sm * (self.smem_bytes() + KB + 64) > per_sm:
            raise _bad(self, "ctas_per_sm", f"expected 1, or 2 where two CTAs of "
                                            f"{self.smem_bytes()} B fit {per_sm} B an SM")

    @property
    def threads(self) -> int:
        return WGMMA_THREADS

    def symbols(self) -> tuple[str, ...]:
        return ("fp4_wgmma",)

    def smem_bytes(self) -> int:
        return wgmma_smem(self.bm, self.stages, self.inflight, self.fmt)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), **_operand_vars(self)}


@dataclass(frozen=True)
class Fp4DequantConfig(KernelConfig):
    """FP4 weights (tiled layout) -> dense W' in fp16 / bf16 for the large-M path, dequantize +
    cuBLAS (templates/fp4_gemm/dequant.cuh): NVFP4 W' = e2m1 e4m3 2^-UNIT_EXP with alpha / gs
    written to device scalars, MXFP4 W' = the format's values rounded once to dtype (groups
    prepare_weight flushed read 0)."""

    family: ClassVar[str] = "fp4_gemm"
    template: ClassVar[str] = "fp4_gemm/dequant.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float16"  # A, W' and C
    enc: str = "float16"  # the activation type the weight words are bit-encoded for (layout.py)

    def check(self) -> None:
        if self.fmt not in FMTS:
            raise _bad(self, "fmt", f"expected one of {FMTS} (kbit4 weights have their own: "
                                    f"kernelgen.kbit_gemm.tiled)")
        if self.dtype not in DTYPES:
            raise _bad(self, "dtype", f"expected one of {DTYPES}")
        if self.enc not in DTYPES:
            raise _bad(self, "enc", f"expected one of {DTYPES}")

    @property
    def threads(self) -> int:
        return DEQUANT_THREADS

    def symbols(self) -> tuple[str, ...]:
        return ("fp4_dequant",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), **_operand_vars(self), "threads": self.threads}


DEQUANT_THREADS = 256
