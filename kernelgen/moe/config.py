"""Config of the MoE grouped GEMM (bf16 / fp16 experts): tile shape, swap_ab, warps, stages,
epilogue, and the main-loop path (mma.sync, or wgmma on sm_90a). Every field is part of the
cache key, so each variant is its own cache entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import smem_cap
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from ..fp4_gemm.config import ENC_ID, FMT_ID, KBIT4_LUT_BYTES

DTYPES = ("float16", "bfloat16")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16"}
EPILOGUES = ("none", "swiglu")
TILE_MS = (8, 16, 32, 64, 128, 256)
TILE_NS = (32, 64, 128, 256)
WGMMA_ARCHS = ("sm_90a",)  # wgmma.mma_async: Hopper only (sm_100a has tcgen05 instead)
WGMMA_TILE_MS = (64, 128, 192, 256)  # 64-token warpgroups (192: wgmma only, no mma.sync row)
WGMMA_TILE_NS = (64, 128, 256)  # the wgmma n of templates/common/wgmma.cuh
TK = 64  # k per pipeline stage (templates/moe/grouped.cuh)
ROW_BYTES = 2 * TK
KB = 1024


@dataclass(frozen=True)
class TileShape:
    """One row of the tile table: weight rows a CTA covers, warps (P x Q x K), stages (and the
    deeper pipeline used when few CTAs share the GPU), CTAs per SM the launch bounds ask for."""

    tile_n: int
    warps_p: int
    warps_q: int
    warps_k: int
    stages: int
    min_blocks: int
    stages_few: int | None = None
    inflight: int = 1  # wgmma rows: groups pending across the barrier (MoeGemmConfig.inflight)


# (tile_m, swap_ab, tile_n) -> shape. swap_ab: weight rows on the mma's 16-row side (P), tokens
# on its n8 side (Q); the warps split each stage's four k16 steps and add their partial tiles at
# the end (the decode path streams weights: bytes in flight matter, not mma throughput). Measured
# on H100 (BENCHMARKS.md): 32 weight rows, 2 warps and 4 stages when there are >= 4 CTAs an SM
# (more CTAs resident beat deeper pipelines), 8 stages when fewer. Without swap_ab: tokens on
# P, a classic 2-D warp grid; 128 x 256 tiles with 2 stages were the fastest prefill variant
# measured (fewer X re-reads; 210 registers: one CTA an SM either way).
TILES: dict[tuple[int, bool, int], TileShape] = {
    (8, True, 32): TileShape(32, 1, 1, 2, 4, 4, 8),
    (8, True, 64): TileShape(64, 1, 1, 4, 4, 4, 8),
    (16, True, 32): TileShape(32, 1, 1, 2, 4, 4, 8),
    (16, True, 64): TileShape(64, 1, 1, 4, 4, 4, 8),
    (32, True, 32): TileShape(32, 1, 1, 2, 4, 4, 8),
    (32, True, 64): TileShape(64, 1, 1, 4, 4, 4, 6),
    (16, False, 128): TileShape(128, 1, 4, 1, 4, 2),
    (32, False, 128): TileShape(128, 1, 4, 1, 4, 2),
    (64, False, 128): TileShape(128, 2, 2, 1, 4, 2),
    (128, False, 128): TileShape(128, 2, 4, 1, 4, 1),
    (128, False, 256): TileShape(256, 2, 4, 1, 2, 1),
    (256, False, 128): TileShape(128, 4, 2, 1, 3, 1),
}
# (tile_m, tile_n) -> shape of the wgmma path (sm_90a, templates/moe/grouped_wgmma.cuh): tile_m / 64
# warpgroups (warps_p = tile_m / 16: one warp a 16-token slice of the epilogue), the weight rows
# as the wgmma's n. Measured on H100 at T = 4096 (BENCHMARKS.md; same-config timings in one run
# spread up to ~15%): 128 x 256, 4 stages, one group in flight is the prefill choice (0.54-0.73x
# the cuBLAS dense rate; 3 stages with a group in flight: 1.6x slower, one k-tile of prefetch
# is too little; the producer-warpgroup variant: from 12% faster to 7% slower, no clear win).
# 128 x 128: 3 stages without a group in flight (two k-tiles prefetched), 2 CTAs an SM: 12-20%
# faster than 6 stages with one CTA in the second run.
# 192 x 256: three warpgroups, so an expert of up to 192 rows is one tile (its weights streamed
# once, by one CTA); 4 stages (225 KB) leave no room for a group in flight: none, three k-tiles
# prefetched. Taken where experts average 112-200 rows (select.WGMMA_TM192_BAND).
WG_TILES: dict[tuple[int, int], TileShape] = {
    (128, 128): TileShape(128, 8, 1, 1, 3, 2, inflight=0),
    (128, 256): TileShape(256, 8, 1, 1, 4, 1),
    (192, 256): TileShape(256, 12, 1, 1, 4, 1, inflight=0),
}


def tile_shape(tile_m: int, swap_ab: bool, tile_n: int, few: bool = False,
               wgmma: bool = False) -> TileShape:
    """The table row, with its stage count (for few CTAs if `few`; MoeGemmConfig.of fits it to
    the shared memory); `wgmma`: the row of WG_TILES."""
    if wgmma:
        if swap_ab or (tile_m, tile_n) not in WG_TILES:
            have = ", ".join(f"(tile_m={m}, tile_n={n})" for m, n in WG_TILES)
            raise UnsupportedConfigError(f"no MoE wgmma tile (tile_m={tile_m}, swap_ab={swap_ab}, "
                                         f"tile_n={tile_n}); wgmma tiles are swap_ab=False with "
                                         f"{have}")
        return WG_TILES[(tile_m, tile_n)]
    try:
        s = TILES[(tile_m, swap_ab, tile_n)]
    except KeyError:
        have = ", ".join(f"(tile_m={m}, swap_ab={sw}, tile_n={n})" for m, sw, n in TILES)
        raise UnsupportedConfigError(f"no MoE tile (tile_m={tile_m}, swap_ab={swap_ab}, "
                                     f"tile_n={tile_n}); the table has {have}") from None
    stages = s.stages_few if few and s.stages_few else s.stages
    return TileShape(s.tile_n, s.warps_p, s.warps_q, s.warps_k, stages, s.min_blocks)


@dataclass(frozen=True)
class MoeGemmConfig(KernelConfig):
    family: ClassVar[str] = "moe"
    template: ClassVar[str] = "moe/grouped_gemm.cu.jinja"
    dtype: str = "bfloat16"  # X, W and Y
    tile_m: int = 128  # tokens of a CTA tile
    tile_n: int = 128  # weight rows of a CTA tile (virtual gate/up rows with swiglu)
    swap_ab: bool = False
    warps_p: int = 2
    warps_q: int = 4
    warps_k: int = 1
    stages: int = 4
    min_blocks: int = 1
    epilogue: str = "none"  # "swiglu": W is W13 [E, 2I, K], Y [M, I] = silu(gate) * up
    wgmma: bool = False  # main loop on warpgroup MMA (sm_90a only), else mma.sync
    # wgmma groups left pending across the per-k-tile barrier: 1 overlaps it with tensor work,
    # 0 prefetches one stage deeper (templates/moe/grouped_wgmma.cuh); 1 without wgmma
    inflight: int = 1
    # wgmma only: a producer warpgroup (cp.async + mbarriers) feeds the tile_m / 64 consumer
    # warpgroups, no CTA barrier in the main loop (GroupedWgmmaWs)
    producer: bool = False
    # wgmma only: each stage is two bulk tensor copies (TMA, tensor maps encoded a call) issued
    # by one thread and completing on the slot's mbarrier, instead of every thread's cp.asyncs
    # (GroupedWgmmaTma); the maps need what select.check_shape asks of every shape (16-byte
    # rows: K % 8; with swiglu whole 8-row gate / up blocks: N % 16)
    tma: bool = False

    @classmethod
    def of(cls, arch: str, dtype: str, tile_m: int, swap_ab: bool, tile_n: int,
           epilogue: str = "none", few: bool = False, wgmma: bool = False,
           smem_limit: int | None = None, tma: bool = False) -> MoeGemmConfig:
        """The config of a tile-table row (`few`: its deep-pipeline variant, if it has one;
        `wgmma`: the row of WG_TILES, `tma`: its TMA variant), with the deepest stage count up
        to the row's whose shared memory fits a block of the arch and of the device
        (`smem_limit`; None: the target's): sm_120a and 8.6 / 8.9 parts (99 KB) take fewer on
        the largest tiles. Where not even min_stages fit: UnsupportedConfigError."""
        s = tile_shape(tile_m, swap_ab, tile_n, few, wgmma)
        inflight = s.inflight if wgmma else 1
        least = 2 + (inflight if wgmma else 0)  # one k-tile prefetched beside the groups in flight
        cap = smem_cap(arch, smem_limit)
        cfg = cls(arch=arch, dtype=dtype, tile_m=tile_m, tile_n=tile_n, swap_ab=swap_ab,
                  warps_p=s.warps_p, warps_q=s.warps_q, warps_k=s.warps_k, stages=least,
                  min_blocks=s.min_blocks, epilogue=epilogue, wgmma=wgmma, inflight=inflight,
                  tma=tma)
        if cfg.smem_at(least) > cap:
            raise UnsupportedConfigError(f"{cfg.short()}: {least} stages (the fewest it takes) "
                                         f"need {cfg.smem_at(least)} B of shared memory a block, "
                                         f"{arch} on this device allows {cap} B; force a smaller "
                                         f"tile (tile_m / tile_n)")
        return cfg.replace(stages=max(st for st in range(least, max(least, s.stages) + 1)
                                      if cfg.smem_at(st) <= cap))

    @property
    def tp(self) -> int:  # rows on the mma's 16-row side
        return self.tile_n if self.swap_ab else self.tile_m

    @property
    def tq(self) -> int:  # rows on the mma's n8 side
        return self.tile_m if self.swap_ab else self.tile_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_p * self.warps_q * self.warps_k + (128 if self.producer else 0)

    def check(self) -> None:
        def bad(field: str, rule: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"{self.short()}: {field}={getattr(self, field)!r}; {rule}")

        if self.dtype not in DTYPES:
            raise bad("dtype", f"expected one of {DTYPES}")
        if self.epilogue not in EPILOGUES:
            raise bad("epilogue", f"expected one of {EPILOGUES}")
        if self.tile_m not in TILE_MS and not (self.wgmma and self.tile_m in WGMMA_TILE_MS):
            raise bad("tile_m", f"expected one of {TILE_MS} (wgmma: {WGMMA_TILE_MS})")
        if self.tile_n not in TILE_NS:
            raise bad("tile_n", f"expected one of {TILE_NS}")
        if self.tile_m == 8 and not self.swap_ab:
            raise bad("swap_ab", "tile_m=8 needs swap_ab=True (the mma's token side is 16 rows "
                                 "without it)")
        if not 2 <= self.stages <= 8:
            raise bad("stages", "expected 2..8")
        if self.min_blocks not in (1, 2, 3, 4):
            raise bad("min_blocks", "expected 1..4")
        if self.wgmma:
            self._check_wgmma(bad)
            return
        if self.inflight != 1:
            raise bad("inflight", "only the wgmma path has groups in flight; keep 1")
        if self.producer:
            raise bad("producer", "only the wgmma path has a producer warpgroup")
        if self.tma:
            raise bad("tma", "only the wgmma path copies by TMA")
        for f in ("warps_p", "warps_q", "warps_k"):
            if getattr(self, f) not in (1, 2, 4, 8):
                raise bad(f, "expected 1, 2, 4 or 8")
        if self.threads > 512:
            raise bad("warps_k", f"{self.threads} threads a CTA; at most 512")
        if self.tp % (16 * self.warps_p):
            raise bad("warps_p", f"the 16-row side ({self.tp} rows) must split into multiples "
                                 f"of 16 per warp")
        wq = self.tq // self.warps_q
        if self.tq % self.warps_q or wq % 8:
            raise bad("warps_q", f"the n8 side ({self.tq} rows) must split into multiples of 8 "
                                 f"per warp")
        if self.epilogue == "swiglu" and not self.swap_ab and wq % 16:
            raise bad("epilogue", "swiglu without swap_ab needs 16 weight rows per warp "
                                  "(gate/up n8 pairs)")
        if 4 % self.warps_k:
            raise bad("warps_k", "must divide the 4 k16 steps of a stage")

    def _check_wgmma(self, bad: Any) -> None:
        if self.arch not in WGMMA_ARCHS:
            raise bad("wgmma", f"wgmma (warpgroup MMA) exists only on {WGMMA_ARCHS}, not "
                               f"{self.arch}; use wgmma=False (mma.sync) there")
        if self.swap_ab:
            raise bad("swap_ab", "the wgmma path puts tokens on the 64-row side: swap_ab=False")
        if self.tile_m not in WGMMA_TILE_MS:
            raise bad("tile_m", f"wgmma tiles take tile_m in {WGMMA_TILE_MS} (64-token "
                                f"warpgroups)")
        if self.tile_n not in WGMMA_TILE_NS:
            raise bad("tile_n", f"wgmma tiles take tile_n in {WGMMA_TILE_NS}")
        if (self.warps_p, self.warps_q, self.warps_k) != (self.tile_m // 16, 1, 1):
            raise bad("warps_p", f"wgmma: warps (P, Q, K) must be ({self.tile_m // 16}, 1, 1) "
                                 f"(one warpgroup per 64 tokens)")
        if self.inflight not in (0, 1):
            raise bad("inflight", "wgmma groups pending across the barrier: 0 or 1")
        if self.tma and self.producer:
            raise bad("tma", "the TMA variant has no producer warpgroup (one thread copies)")
        if self.threads > 512:
            raise bad("producer", f"{self.threads} threads a CTA; at most 512")
        if self.tile_n // 2 + 32 > 65536 // self.threads:  # registers a thread at one CTA an SM
            raise bad("tile_n", f"{self.tile_n // 2} fp32 accumulators a thread (+ 32) do not fit "
                                f"the {65536 // self.threads} registers of {self.threads} threads")
        if self.stages < 2 + (0 if self.producer else self.inflight):
            raise bad("stages", f"wgmma with {self.inflight} group(s) in flight needs at least "
                                f"{2 + self.inflight} stages (one k-tile prefetched)")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_grouped_gemm",)

    def smem_bytes(self) -> int:
        return self.smem_at(self.stages)

    def smem_at(self, stages: int) -> int:
        """Dynamic shared memory with `stages` pipeline stages: the stages, or the k-split
        reduction buffer if larger (it reuses them); wgmma: the stages + 1024 bytes to align them
        to the 128-byte swizzle atoms."""
        pipe = stages * (self.tp + self.tq) * ROW_BYTES
        if self.wgmma:  # + full / empty mbarriers of the producer and TMA variants
            bars = 16 * stages if self.producer or self.tma else 0
            return pipe + 1024 + bars + 16
        acc = (self.tp // self.warps_p // 16) * (self.tq // self.warps_q // 8) * 4
        red = (self.warps_k - 1) * self.warps_p * self.warps_q * acc * 32 * 4
        return max(pipe, red) + 16  # + the work item (templates/moe/grouped.cuh find_tile)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "smem": self.smem_bytes()}


KBIT_BITS = (2, 3, 4)  # pair codes of two elements fit one byte
KBIT_TILE_MS = (8, 16, 32)
KBIT_WARPS = ((8, 1), (4, 2), (2, 4))  # (weight-row warps, k-split warps) of a CTA
KBIT_LUT_BYTES = 256 * 32 * 4


def kbit_stage_bytes(bits: int, warps_p: int, warps_k: int, tile_m: int) -> int:
    """Planes + scales of 16 * warps_p rows and tile_m X rows, for warps_k sub-ranges of 128 k."""
    return warps_k * (16 * warps_p * (16 * bits + 4) + tile_m * 256)


@dataclass(frozen=True)
class MoeKbitConfig(KernelConfig):
    """Grouped GEMM over kbit experts (templates/moe/grouped_kbit.cuh): always swap_ab."""

    family: ClassVar[str] = "moe"
    template: ClassVar[str] = "moe/grouped_kbit.cu.jinja"
    dtype: str = "bfloat16"
    bits: int = 4
    tile_m: int = 8
    warps_p: int = 8
    warps_k: int = 1
    stages: int = 4
    min_blocks: int = 2
    epilogue: str = "none"

    @property
    def tile_n(self) -> int:
        return 16 * self.warps_p

    @property
    def threads(self) -> int:
        return 32 * self.warps_p * self.warps_k

    def check(self) -> None:
        def bad(field: str, rule: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"{self.short()}: {field}={getattr(self, field)!r}; {rule}")

        if self.dtype not in DTYPES:
            raise bad("dtype", f"expected one of {DTYPES}")
        if self.bits not in KBIT_BITS:
            raise bad("bits", f"kbit experts support bits in {KBIT_BITS} (pair codes of one byte)")
        if self.tile_m not in KBIT_TILE_MS:
            raise bad("tile_m", f"kbit experts take tile_m in {KBIT_TILE_MS} (decode)")
        if (self.warps_p, self.warps_k) not in KBIT_WARPS:
            raise bad("warps_p", f"(warps_p, warps_k) must be one of {KBIT_WARPS}")
        if not 2 <= self.stages <= 8:
            raise bad("stages", "expected 2..8")
        if self.min_blocks not in (1, 2, 3, 4):
            raise bad("min_blocks", "expected 1..4")
        if self.epilogue not in EPILOGUES:
            raise bad("epilogue", f"expected one of {EPILOGUES}")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_grouped_kbit",)

    def smem_bytes(self) -> int:
        pipe = self.stages * kbit_stage_bytes(self.bits, self.warps_p, self.warps_k, self.tile_m)
        red = (self.warps_k - 1) * self.warps_p * (self.tile_m // 8) * 4 * 32 * 4
        return KBIT_LUT_BYTES + max(pipe, red) + 16

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "smem": self.smem_bytes()}


# 4-bit kbit experts in the tiled layout: the FP4 bandwidth kernel over find_tile's work items
GEMV_M_TILES = (8, 16)  # tokens a pass (mma n8 x 1 or 2)
GEMV_CTA_WARPS = (8, 16)  # a CTA holds the 32 KB code table: 8 or 16 warps, 16 warps an SM


@dataclass(frozen=True)
class MoeKbitGemvConfig(KernelConfig):
    """Grouped GEMM over 4-bit kbit experts in the tiled layout (templates/moe/grouped_gemv.cu.jinja:
    templates/fp4_gemm/gemv.cuh on each work item). tpw: 16-row tiles a warp at the same k (2
    with swiglu: a warp's gate and up tiles; 1 or 2 without); warps along K (kw) are a launch
    argument."""

    family: ClassVar[str] = "moe"
    template: ClassVar[str] = "moe/grouped_gemv.cu.jinja"
    dtype: str = "bfloat16"
    m_tile: int = 8
    warps: int = 8
    depth: int = 2
    epilogue: str = "none"
    tpw: int = 2  # the planner's (moe/kbit.py GEMV_TPW)

    @property
    def unit_tiles(self) -> int:
        """Output tiles a warp unit covers (swiglu: its gate / up pair is one output tile)."""
        return 1 if self.epilogue == "swiglu" else self.tpw

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def check(self) -> None:
        def bad(field: str, rule: str) -> UnsupportedConfigError:
            return UnsupportedConfigError(f"{self.short()}: {field}={getattr(self, field)!r}; {rule}")

        if self.dtype not in DTYPES:
            raise bad("dtype", f"expected one of {DTYPES}")
        if self.m_tile not in GEMV_M_TILES:
            raise bad("m_tile", f"expected one of {GEMV_M_TILES}")
        if self.warps not in GEMV_CTA_WARPS:
            raise bad("warps", f"expected one of {GEMV_CTA_WARPS} (a 32 KB table a CTA)")
        if self.depth not in (2, 3):
            raise bad("depth", "expected 2 or 3 steps in flight a warp")
        if self.epilogue not in EPILOGUES:
            raise bad("epilogue", f"expected one of {EPILOGUES}")
        if self.tpw not in (1, 2) or (self.epilogue == "swiglu" and self.tpw != 2):
            raise bad("tpw", "expected 1 or 2 (2 with swiglu: the gate and up tiles of a warp)")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_grouped_gemv",)

    def smem_bytes(self) -> int:
        return KBIT4_LUT_BYTES + 16  # the code table, then the work item (find_tile)

    def template_vars(self) -> dict[str, Any]:
        # kbit4 codes decode through a table of A's type (enc = dtype); 16 warps an SM (<= 128
        # registers); m_tile 8 holds the epilogue factors through the loop, as the dense GEMV
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "fmt_id": FMT_ID["kbit4"],
                "enc_id": ENC_ID[self.dtype], "tpw": self.tpw, "min_blocks": 16 // self.warps,
                "early": self.m_tile == 8, "lut_bytes": KBIT4_LUT_BYTES}
