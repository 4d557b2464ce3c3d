"""Host-side selector of `mx_gemm`: (arch, formats of A and B, M, N, K, out dtype, SM count)
-> MxGemmPlan (path, config, launch). Pure, memoised and printable (KERNELGEN_PRINT_CONFIGS=1);
`prewarm_configs` walks the same function, so prewarm builds what dispatch can pick.

Paths by arch:
* sm_90a, sm_100a, sm_103a: "fp8_mma" - MXFP8 x MXFP8 (E4M3 / E5M2 in any pairing): fp8 converted to
  scaled f16 tiles in shared memory, f16 mma.sync (templates/mx_gemm/fp8_mma.cuh; an opt-in
  wgmma variant on sm_90a). sm_100a / sm_103a have no block-scaled mma.sync (their block
  scaling is tcgen05 + tensor memory, future work), so they run the Hopper-style kernel.
* sm_120a, sm_121a: "bs_mma" - the native block-scaled mma.sync: MXFP8 x MXFP8 and MXFP8 x MXFP4
  (kind::mxf8f6f4), MXFP4 x MXFP4 and NVFP4 x NVFP4 (kind::mxf4nvf4).
* sm_80 (A100; the 8.6 parts, A10 / A40, run its cubins): "fp8_mma" for MXFP8 x MXFP8 with the
  fp8 -> f16 conversion by integer ops (soft_fp8: no fp8 instruction there), tiles by the part's
  shared memory (FP8_PLAN_TILES); no FP4 pair (fp4_gemm runs FP4 weights).
* sm_89 (Ada: L40S, RTX 4090, L4): "fp8_mma" on the fp8 mma.sync (hbufs=0: the fp8 stages
  rescaled in place to each row's largest block scale, one fp32 accumulation over K).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import KB, get_arch, parts_of, per_target, smem_cap
from ..core.select import selector
from ..errors import UnsupportedConfigError
from .config import (
    BS_TILES,
    FORMATS,
    FP8_TILES,
    OUT_DTYPES,
    WG_TILES,
    MxBsGemmConfig,
    MxFp8GemmConfig,
)

MXFP8 = ("mxfp8_e4m3", "mxfp8_e5m2")
# (arch) -> {(A format, B format): path}
PAIRS: dict[str, dict[tuple[str, str], str]] = per_target({
    "sm_80": {(a, b): "fp8_mma" for a in MXFP8 for b in MXFP8},
    "sm_90a": {(a, b): "fp8_mma" for a in MXFP8 for b in MXFP8},
    "sm_100a": {(a, b): "fp8_mma" for a in MXFP8 for b in MXFP8},
    "sm_120a": {**{(a, b): "bs_mma" for a in MXFP8 for b in (*MXFP8, "mxfp4")},
                ("mxfp4", "mxfp4"): "bs_mma", ("nvfp4", "nvfp4"): "bs_mma"},
})
K_MULTIPLE = 32  # one MX group; 16-byte copies of fp4 rows (32 codes)
N_MULTIPLE = 8   # output columns are written in pairs by 8-column mma pieces
# sm_90a: the wgmma variant above SMALL_M (its GPU tests pass; measured on the H100 with
# examples/bench_mx_gemm.py --variants, BENCHMARKS.md): 8192^3 128x256 wgmma 350 TFLOP/s vs the
# best mma.sync tile 278; M=128, N=K=4096: 128x128 wgmma (2 stages, 2 f16 tile sets) 68 vs 51.
# The 128x256 tile once one wave of it fills every SM, else 128x128, both the fp8 wgmma with
# the operands rescaled once per call (prescale; H100, quantized normal operands, TFLOP/s:
# 8192^3 958 / 781 for 128x128, 4096^3 809 / 719; in-place rescale in every CTA 406 / 364;
# f16 wgmma 325 / 317; torch._scaled_mm 1411 / 1277). SM90_PRESCALE False: the in-place
# rescale for 128x256 and the f16 wgmma (two tile sets) for 128x128, as measured before.
SM90_WGMMA = True
SM90_PRESCALE = True
WG_FP8_BIG, WG_FP8_MID = (128, 256, 8, 1, 4, 0), (128, 128, 8, 1, 4, 0)
WG_F16_MID = (128, 128, 8, 1, 2, 2)
assert {WG_FP8_BIG, WG_FP8_MID, WG_F16_MID} <= set(WG_TILES)
# fp8 path: 64-row tiles up to this M (fewer rows of zeros; M=128, N=K=4096: 64x64 82 TFLOP/s vs
# 68 for the best 128-row tile), 128-row tiles above; 128 x 256 once those alone fill every SM.
SMALL_M = 128
# fp8 path tiles (big, mid, small, narrow) (FP8_TILES rows) by target, and for sm_80 by the
# shared memory a block of the part may take (the first that fits): big once one wave of it
# fills every SM above SMALL_M, else mid; small / narrow (64-wide N until 128-wide tiles fill
# the SMs) up to SMALL_M. sm_80's and sm_89's are not measured (no 8.x part here): A100 keeps
# the Hopper choice with 2 stages for 128 x 128; 99 KB parts get the 8-warp 64 x 128 tile (2
# stages) and a 3-stage 64 x 64; sm_89's fp8 mma.sync, without f16 tiles, 128 x 128 in 2
# stages, 64 x 128 in 3 and 64 x 64 in 4.
_HOPPER = ((128, 256, 2, 4, 2), (128, 128, 2, 4, 4), (64, 128, 1, 4, 4), (64, 64, 1, 4, 4))
FP8_PLAN_TILES: dict[str, tuple[tuple[int, tuple[tuple[int, int, int, int, int], ...]], ...]] = per_target({
    "sm_80": ((163 * KB, ((128, 128, 2, 4, 2), (128, 128, 2, 4, 2), (64, 128, 1, 4, 4), (64, 64, 1, 4, 4))),
              (99 * KB, ((64, 128, 2, 4, 2), (64, 128, 2, 4, 2), (64, 128, 2, 4, 2), (64, 64, 1, 4, 3)))),
    "sm_89": ((99 * KB, ((128, 128, 2, 4, 2), (128, 128, 2, 4, 2), (64, 128, 2, 4, 3), (64, 64, 1, 4, 4))),),
    "sm_90a": ((227 * KB, _HOPPER),),
    "sm_100a": ((227 * KB, _HOPPER),),
})
# how the fp8 path's kernel multiplies: "f16" (cvt into f16 tiles, f16 mma.sync), "soft" (the
# same, the fp8 decoded by integer ops: no fp8 instruction), "fp8" (fp8 mma.sync on the stages)
FP8_KERNEL: dict[str, str] = per_target({"sm_80": "soft", "sm_89": "fp8", "sm_90a": "f16",
                                         "sm_100a": "f16"})
assert all(set(t) <= set(FP8_TILES) for rows in FP8_PLAN_TILES.values() for _, t in rows)


@dataclass(frozen=True)
class MxGemmPlan:
    path: str
    config: MxFp8GemmConfig | MxBsGemmConfig
    m: int
    n: int

    @property
    def tiles(self) -> int:
        return -(-self.m // self.config.tile_m) * -(-self.n // self.config.tile_n)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.tiles, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.threads, 1, 1)

    @property
    def smem(self) -> int:
        return self.config.smem_bytes()

    @property
    def symbol(self) -> str:
        return self.config.symbols()[0]

    def short(self) -> str:
        return f"{self.path}: {self.config.short()} grid={self.grid} smem={self.smem}"


def supported_pairs(arch: str) -> tuple[tuple[str, str], ...]:
    get_arch(arch)
    return tuple(PAIRS.get(arch, {}))


def check_formats(arch: str, a_fmt: str, b_fmt: str) -> str:
    """The path for (arch, A format, B format), or a ValueError naming what the arch can run."""
    for name, f in (("A", a_fmt), ("B", b_fmt)):
        if f not in FORMATS:
            raise ValueError(f"{name}: format {f!r} is not supported by mx_gemm; expected one of "
                             f"{sorted(FORMATS)} (MXFP6 is not wired to a GEMM yet)")
    pairs = PAIRS.get(arch, {})
    path = pairs.get((a_fmt, b_fmt))
    if path is None:
        can = ", ".join(f"{a} x {b}" for a, b in pairs)
        hint = ""
        if {a_fmt, b_fmt} & {"mxfp4", "nvfp4"}:
            hint = ("; FP4 weights with fp16/bf16 activations run on every arch through the "
                    "fp4_gemm family")
        raise ValueError(f"mx_gemm: {a_fmt} x {b_fmt} cannot run on {arch}; {arch} runs {can}{hint}")
    return path


def check_shape(m: int, n: int, k: int) -> None:
    if m < 1 or n < N_MULTIPLE or n % N_MULTIPLE or k < K_MULTIPLE or k % K_MULTIPLE:
        raise ValueError(f"mx_gemm: M={m}, N={n}, K={k}; needs M >= 1, N a positive multiple of "
                         f"{N_MULTIPLE} and K a positive multiple of {K_MULTIPLE}")


def fp8_tiles(arch: str, smem_limit: int | None = None) -> tuple[tuple[int, int, int, int, int], ...]:
    """(big, mid, small, narrow) of the fp8 path on a part whose blocks may take `smem_limit`
    bytes (None: the target's); ValueError where none fits."""
    cap = smem_cap(arch, smem_limit)
    for need, tiles in FP8_PLAN_TILES[arch]:
        if need <= cap:
            return tiles
    hb = 0 if FP8_KERNEL[arch] == "fp8" else 1
    need = max(MxFp8GemmConfig(arch=arch, tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st,
                               hbufs=hb, soft_fp8=FP8_KERNEL[arch] == "soft").smem_bytes()
               for bm, bn, wm, wn, st in FP8_PLAN_TILES[arch][-1][1])
    raise ValueError(f"mx_gemm: {arch} part with {cap} B of shared memory a block; the MXFP8 "
                     f"tiles need {need} B")


def plan(arch: str, a_fmt: str, b_fmt: str, m: int, n: int, k: int, out_dtype: str,
         sm_count: int, smem_limit: int | None = None) -> MxGemmPlan:
    """Pure planner (raises ValueError for a format pair or shape the arch cannot run).
    `smem_limit`: the shared memory a block of the device may take (None: the target's)."""
    get_arch(arch)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype!r}; expected one of {OUT_DTYPES}")
    path = check_formats(arch, a_fmt, b_fmt)
    check_shape(m, n, k)
    a_elem, b_elem = FORMATS[a_fmt][0], FORMATS[b_fmt][0]
    if path == "fp8_mma":
        big, mid, small, narrow = fp8_tiles(arch, smem_limit)
        if m <= SMALL_M:  # decode sizes: 64-wide N tiles until 128-wide ones fill the SMs
            tile = small if -(-n // small[1]) >= sm_count else narrow
        elif -(-m // big[0]) * -(-n // big[1]) >= sm_count:
            tile = big  # one wave of the big tile already fills every SM
        else:
            tile = mid
        bm, bn, wm, wn, st = tile
        wg, hb, pre = False, 0 if FP8_KERNEL[arch] == "fp8" else 1, False
        if SM90_WGMMA and arch == "sm_90a" and m > SMALL_M:
            mid_wg = WG_FP8_MID if SM90_PRESCALE else WG_F16_MID
            fills = -(-m // WG_FP8_BIG[0]) * -(-n // WG_FP8_BIG[1]) >= sm_count
            (bm, bn, wm, wn, st, hb), wg = (WG_FP8_BIG if fills else mid_wg), True
            pre = SM90_PRESCALE
        cfg: MxFp8GemmConfig | MxBsGemmConfig = MxFp8GemmConfig(
            arch=arch, a_elem=a_elem, b_elem=b_elem, out_dtype=out_dtype, tile_m=bm, tile_n=bn,
            warps_m=wm, warps_n=wn, stages=st, wgmma=wg, hbufs=hb, prescale=pre,
            soft_fp8=FP8_KERNEL[arch] == "soft")
    else:
        kind = "nvf4" if a_fmt == "nvfp4" else "mxf4" if a_fmt == "mxfp4" else "mxf8f6f4"
        bm, bn, wm, wn, st = BS_TILES[0]
        cfg = MxBsGemmConfig(arch=arch, mma_kind=kind, a_elem=a_elem, b_elem=b_elem,
                             out_dtype=out_dtype, tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn,
                             stages=st)
    return MxGemmPlan(path, cfg, m, n)


def forced(p: MxGemmPlan, cfg: MxFp8GemmConfig | MxBsGemmConfig) -> MxGemmPlan:
    """`p` with `cfg` in place of the selector's config (same path, formats and out dtype)."""
    if not isinstance(cfg, (MxFp8GemmConfig, MxBsGemmConfig)):
        raise ValueError(f"config: {type(cfg).__name__}; this call ({p.config.short()}) takes a "
                         f"{type(p.config).__name__}")
    keep = ("arch", "a_elem", "b_elem", "out_dtype") + (("mma_kind",) if p.path == "bs_mma" else ())
    if type(cfg) is not type(p.config) or any(getattr(cfg, f) != getattr(p.config, f) for f in keep):
        raise ValueError(f"config {cfg.short()} does not fit this call ({p.config.short()}): "
                         f"same kernel kind, {', '.join(keep)} required")
    return MxGemmPlan(p.path, cfg, p.m, p.n)


@selector
def select_mx_gemm(arch: str, a_fmt: str, b_fmt: str, m: int, n: int, k: int, out_dtype: str,
                   sm_count: int, smem_limit: int | None = None) -> MxGemmPlan:
    """The dispatch choice (memoised per argument tuple)."""
    return plan(arch, a_fmt, b_fmt, m, n, k, out_dtype, sm_count, smem_limit)


# prewarm_configs' spec keys and values (Family.spec_keys): "formats" takes the pairs of any arch
SPEC_KEYS = {"formats": tuple(sorted({p for pairs in PAIRS.values() for p in pairs})),
             "out_dtypes": OUT_DTYPES, "dtypes": OUT_DTYPES, "shapes": None, "sm_counts": None}


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[MxFp8GemmConfig | MxBsGemmConfig]:
    """Configs the selector can return. spec: "formats" ([[A, B], ...]; default: every pair
    the arch runs), "out_dtypes" / "dtypes" (default both), "shapes" ([M, N, K]; default:
    every tile of the path), "sm_counts". Each target's parts (arch.parts_of: SM count and
    shared memory a block) are walked."""
    outs = tuple(d for d in (spec.get("out_dtypes") or spec.get("dtypes") or OUT_DTYPES)
                 if d in OUT_DTYPES)
    seen: set = set()
    for arch in archs:
        get_arch(arch)
        pairs = [tuple(p) for p in spec.get("formats") or PAIRS.get(arch, {})]
        pairs = [p for p in pairs if p in PAIRS.get(arch, {})]
        shapes = spec.get("shapes")
        for a_fmt, b_fmt in pairs:
            for out in outs:
                if shapes:
                    for s in shapes:
                        if len(s) != 3:
                            raise UnsupportedConfigError(f"mx_gemm spec shapes: {s!r}; expected [M, N, K]")
                        for sms, lim in parts_of(arch, spec.get("sm_counts")):
                            cfg = plan(arch, a_fmt, b_fmt, *map(int, s), out, sms, lim).config
                            if cfg not in seen:
                                seen.add(cfg)
                                yield cfg
                    continue
                # every tile the planner can pick: small M (narrow, wide N), mid, big
                for lim in sorted({lim for _, lim in parts_of(arch, spec.get("sm_counts"))}, reverse=True):
                    for m, n in ((SMALL_M, 128), (SMALL_M, 1 << 16), (4096, 256), (1 << 16, 1 << 16)):
                        cfg = plan(arch, a_fmt, b_fmt, m, n, 1024, out, 132, lim).config
                        if cfg not in seen:
                            seen.add(cfg)
                            yield cfg
