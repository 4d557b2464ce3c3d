"""Configs of the block-scaled GEMM family `mx_gemm`: D = alpha * A . B^T (+ bias).

Two kernels:
* `MxFp8GemmConfig` - MXFP8 x MXFP8 for sm_90a, sm_100a / sm_103a, sm_89 and sm_80 (whose parts
  have no fp8 instruction: the fp8 -> f16 conversion by integer ops, soft_fp8): every k-block scaled by
  2^(block exponent - the row's largest) once per CTA, then one fp32 accumulation over all of
  K, the rows' largest scales applied in the epilogue (templates/mx_gemm/fp8_mma.cuh). Either
  into f16 tiles for f16 `mma.sync` / wgmma, or (hbufs=0) rescaled in place in the fp8 stages
  for the fp8 wgmma (sm_90a) or the fp8 `mma.sync` (sm_89+: Ada's path).
* `MxBsGemmConfig` - the native block-scaled `mma.sync` of sm_120a / sm_121a (`kind::mxf8f6f4` for
  FP8 x FP8 / FP8 x FP4, `kind::mxf4nvf4` for MXFP4 x MXFP4 and NVFP4 x NVFP4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import get_arch, targets_like
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError

OUT_DTYPES = ("bfloat16", "float16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
TK = 128  # k elements per pipeline stage (both kernels)

# MxTensor.fmt -> (element format of the mma, scale format, k-group size)
FORMATS: dict[str, tuple[str, str, int]] = {
    "mxfp8_e4m3": ("e4m3", "ue8m0", 32),
    "mxfp8_e5m2": ("e5m2", "ue8m0", 32),
    "mxfp4": ("e2m1", "ue8m0", 32),
    "nvfp4": ("e2m1", "ue4m3", 16),
}
FP8_ELEMS = ("e4m3", "e5m2")

# fp8 path: (tile_m, tile_n, warps_m, warps_n, stages). The first four: sm_90a / sm_100a /
# sm_103a (the f16 tiles and 2 to 4 fp8 stages share 227 KB); the next three: sm_80 parts with
# 163 KB a block (A100; 128 x 128 at 131 KB) or 99 KB (8.6; 98.8 and 83.5 KB); the last: sm_89's
# fp8 mma.sync (no f16 tiles: 76 KB), which also runs 128 x 128 s2 (67 KB) and 64 x 64 s4.
FP8_TILES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 256, 2, 4, 2),
    (128, 128, 2, 4, 4),
    (64, 128, 1, 4, 4),
    (64, 64, 1, 4, 4),
    (128, 128, 2, 4, 2),
    (64, 128, 2, 4, 2),
    (64, 64, 1, 4, 3),
    (64, 128, 2, 4, 3),
)
# wgmma variants (sm_90a): 8 warps stacked along M, 2 warpgroups of 64 rows x tile_n;
# (tile_m, tile_n, warps_m, warps_n, stages, f16 tile sets). 0 f16 tile sets: the fp8 wgmma
# reads the stages (the first two rows), rescaled in place or, with prescale, before the call's
# main kernel; 1 or 2: f16 wgmma on converted tiles.
WG_TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (128, 256, 8, 1, 4, 0),
    (128, 128, 8, 1, 4, 0),
    (128, 256, 8, 1, 2, 1),
    (128, 128, 8, 1, 4, 1),
    (128, 128, 8, 1, 2, 2),
)
# block-scaled path of sm_120a / sm_121a (99 KB of shared memory a block)
BS_ARCHS = targets_like("sm_120a")
BS_TILES: tuple[tuple[int, int, int, int, int], ...] = ((128, 128, 2, 4, 2),)
BS_KINDS = {"mxf8f6f4": 0, "mxf4": 1, "nvf4": 2}  # kind_code of templates/mx_gemm/bs_mma.cuh


SHAPE = ("tile_m", "tile_n", "warps_m", "warps_n", "stages")  # the fields a tile table lists


def _bad(cfg: KernelConfig, field: str | tuple[str, ...], rule: str) -> UnsupportedConfigError:
    """The error naming a field (or the fields of a table row) and its value(s)."""
    if isinstance(field, tuple):
        name, value = f"({', '.join(field)})", tuple(getattr(cfg, f) for f in field)
    else:
        name, value = field, getattr(cfg, field)
    return UnsupportedConfigError(f"{cfg.short()}: {name}={value!r}; {rule}")


def _row_bytes(elem: str) -> int:
    return TK // 2 if elem == "e2m1" else TK


@dataclass(frozen=True)
class MxFp8GemmConfig(KernelConfig):
    family: ClassVar[str] = "mx_gemm"
    template: ClassVar[str] = "mx_gemm/fp8_mma.cu.jinja"
    a_elem: str = "e4m3"
    b_elem: str = "e4m3"
    out_dtype: str = "bfloat16"
    tile_m: int = 128
    tile_n: int = 128
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 4
    unroll_kb: bool = False  # unroll the 8 k16 steps of a k-tile fully (else by 2)
    wgmma: bool = False  # sm_90a: wgmma instead of ldmatrix + mma.sync
    # f16 tile sets; 2 (wgmma only): convert the next k-tile under the wgmma; 0: none - the fp8
    # wgmma (sm_90a) or the fp8 mma.sync (sm_89+; Ada's path) on the stages, rescaled in place
    hbufs: int = 1
    # hbufs 0 only: the operands' rows are rescaled once per call by two small kernels of the
    # same module (mx_gemm_rescale_a / _b) into scratch, so the main loop only copies and multiplies
    prescale: bool = False
    # the fp8 -> f16 conversion by integer ops instead of cvt (the same f16 bits): required on
    # sm_80, whose parts have no fp8 instruction; allowed on newer targets so that tests run it
    soft_fp8: bool = False

    def check(self) -> None:
        if not self.wgmma and self.hbufs == 0 and get_arch(self.arch).cc < 89:
            raise _bad(self, "hbufs", "the fp8 mma.sync (hbufs=0) needs sm_89+")
        if get_arch(self.arch).cc < 89 and not self.soft_fp8:
            raise _bad(self, "soft_fp8", "sm_80 has no fp8 instruction (cvt e4m3x2 / e5m2x2 needs "
                                         "sm_89+): its kernels convert by integer ops, soft_fp8=True")
        for f in ("a_elem", "b_elem"):
            if getattr(self, f) not in FP8_ELEMS:
                raise _bad(self, f, f"expected one of {FP8_ELEMS}")
        if self.out_dtype not in OUT_DTYPES:
            raise _bad(self, "out_dtype", f"expected one of {OUT_DTYPES}")
        shape = (self.tile_m, self.tile_n, self.warps_m, self.warps_n, self.stages)
        if self.wgmma:
            if (*shape, self.hbufs) not in WG_TILES:
                raise _bad(self, (*SHAPE, "hbufs"), f"must be one of {WG_TILES} with wgmma")
        elif shape not in FP8_TILES or self.hbufs not in (0, 1):
            raise _bad(self, (*SHAPE, "hbufs"), f"must be one of {FP8_TILES} with hbufs=1 (f16 mma.sync) "
                                                "or 0 (fp8 mma.sync)")
        if not self.wgmma and self.hbufs == 0 and self.soft_fp8:
            raise _bad(self, "soft_fp8", "the fp8 mma.sync (hbufs=0) converts nothing to f16")
        if self.wgmma and self.arch != "sm_90a":
            raise _bad(self, "wgmma", "wgmma exists on sm_90a only")
        if self.prescale and not (self.wgmma and self.hbufs == 0):
            raise _bad(self, "prescale", "pre-rescaled operands feed the fp8 wgmma variant (wgmma, hbufs=0)")
        if self.soft_fp8 and self.wgmma:
            raise _bad(self, "soft_fp8", "the integer conversion feeds the mma.sync kernel (wgmma=False)")

    def symbols(self) -> tuple[str, ...]:
        return ("mx_gemm_fp8",) + (("mx_gemm_rescale_a", "mx_gemm_rescale_b") if self.prescale else ())

    def smem_bytes(self) -> int:
        """templates/mx_gemm/fp8_mma.cuh Fp8Smem: per stage the fp8 A, B tiles and one
        512-byte scale chunk per 128 rows (at least one); once, the f16 A, B tiles and the
        rows' largest scale exponents."""
        sa = max(1, self.tile_m // 128) * 512
        sb = max(1, self.tile_n // 128) * 512
        rows = self.tile_m + self.tile_n
        stage = rows * TK + sa + sb
        if self.hbufs == 0:  # the fp8 wgmma reads the stages: 1024-byte swizzle atoms
            stage = -(-stage // 1024) * 1024
        return self.stages * stage + self.hbufs * rows * TK * 2 + rows * 4

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.out_dtype]}


@dataclass(frozen=True)
class MxBsGemmConfig(KernelConfig):
    family: ClassVar[str] = "mx_gemm"
    template: ClassVar[str] = "mx_gemm/bs_mma.cu.jinja"
    mma_kind: str = "mxf8f6f4"  # "mxf8f6f4" | "mxf4" (mxf4nvf4, ue8m0 x2) | "nvf4" (mxf4nvf4, ue4m3 x4)
    a_elem: str = "e4m3"
    b_elem: str = "e4m3"
    out_dtype: str = "bfloat16"
    tile_m: int = 128
    tile_n: int = 128
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 2

    def check(self) -> None:
        if self.arch not in BS_ARCHS:
            raise _bad(self, "arch", f"the block-scaled mma.sync exists on {' / '.join(BS_ARCHS)} only "
                              "(sm_100a / sm_103a scale through tcgen05 / tensor memory instead)")
        if self.mma_kind not in BS_KINDS:
            raise _bad(self, "mma_kind", f"expected one of {tuple(BS_KINDS)}")
        if self.mma_kind == "mxf8f6f4":
            if self.a_elem not in FP8_ELEMS:
                raise _bad(self, "a_elem", f"kind mxf8f6f4 takes FP8 activations {FP8_ELEMS}")
            if self.b_elem not in (*FP8_ELEMS, "e2m1"):
                raise _bad(self, "b_elem", "kind mxf8f6f4 takes e4m3, e5m2 or e2m1 weights")
        elif (self.a_elem, self.b_elem) != ("e2m1", "e2m1"):
            raise _bad(self, "a_elem", f"kind {self.mma_kind} takes e2m1 x e2m1")
        if self.out_dtype not in OUT_DTYPES:
            raise _bad(self, "out_dtype", f"expected one of {OUT_DTYPES}")
        if (self.tile_m, self.tile_n, self.warps_m, self.warps_n, self.stages) not in BS_TILES:
            raise _bad(self, SHAPE, f"must be one of {BS_TILES}")

    @property
    def scale(self) -> str:
        return "ue4m3" if self.mma_kind == "nvf4" else "ue8m0"

    @property
    def group(self) -> int:
        return 16 if self.mma_kind == "nvf4" else 32

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    def symbols(self) -> tuple[str, ...]:
        return ("mx_gemm_bs",)

    def smem_bytes(self) -> int:
        """templates/mx_gemm/bs_mma.cuh BsShape: A, B rows of a k-tile and the scale chunks."""
        ch = TK // self.group // 4
        sa = max(1, self.tile_m // 128) * ch * 512
        sb = max(1, self.tile_n // 128) * ch * 512
        return self.stages * (self.tile_m * _row_bytes(self.a_elem)
                              + self.tile_n * _row_bytes(self.b_elem) + sa + sb)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.out_dtype],
                "kind_code": BS_KINDS[self.mma_kind], "scale": self.scale}
