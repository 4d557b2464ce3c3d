"""4-bit kbit weights in the tiled layout of the FP4 bandwidth path (kernelgen/fp4_gemm/layout.py).

The FP4 GEMV streams 16 W rows x 128 k a warp step as 1 KB of 4-bit words plus 64 scale bytes;
4-bit kbit weights have the same bytes per element (a code a nibble, an E4M4 byte a block of
32 = MXFP4's group), so they take the same layout and kernels (fmt "kbit4", fp4.cuh
FMT_KBIT4): the codes are left plain (code i of a word in bits 4i..4i+3) and decode through a
shared-memory table of the codebook instead of bit arithmetic. Four paths read the layout:
  gemv     the FP4 bandwidth kernel (M in passes of 8 / 16 tokens)
  tile     the FP4 tensor-core tile kernel (mma.sync, 128 W rows x 32 or 64 tokens a CTA)
  dequant  W dequantized to A's dtype by kbit_dequant_tiled, then cuBLAS
  wgmma    sm_90a: the FP4 warpgroup-MMA kernel (templates/fp4_gemm/wgmma.cuh, each step's
           weights decoded into shared memory), for mid M where fp4_gemm.select.wgmma_takes.
`plan_tiled` picks one from host-side numbers; `prewarm_tiled_configs` walks the same rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import device_info, get_arch, parts_of, smem_limits
from ..core.config import KernelConfig
from ..core.dense import dense_gemm
from ..core.interop import on_stream, smem_limit
from ..core.jit import get_kernel
from ..core.select import selector, wave_fill, weight_shapes
from ..errors import UnsupportedConfigError
from ..fp4_gemm.api import launch_plan
from ..fp4_gemm.config import (
    GEMV_WARPS,
    M_TILES,
    TILE_BMS,
    TILE_BN,
    WGMMA_ARCHS,
    Fp4GemvConfig,
    Fp4TileConfig,
)
from ..fp4_gemm.layout import arrange, arranged_shapes, block_strides, tile_data, tile_scales
from ..fp4_gemm.select import (
    GEMV_DEPTH,
    KBIT4_TPW,
    KBIT4_WPS,
    WGMMA_MAX_M,
    Plan,
    balanced_tpw,
    bm_for,
    kbit4_lut_wide,
    pfs_of,
    stages_for,
    wgmma_bm,
    wgmma_configs,
    wgmma_probe_ms,
    wgmma_takes,
)
from ..fp4_gemm.select import plan as fp4_plan
from .config import DTYPES, KbitTiledDequantConfig
from .select import check_shape

ARRANGEMENT = "step_major"  # as MXFP4's (fp4_gemm.api.ARRANGEMENT): the same bytes a block
TILED_PATHS = ("gemv", "tile", "dequant", "wgmma")
FLAT_WGMMA_BITS = (2, 3, 4)  # flat weights the wgmma kernel reads (plan_flat_wgmma)

# -- path rule (H100, session 13, examples/bench_kbit_gemm.py --bits 4, graph-timed, weights
# rotated past L2, fp16, every path forced; us, gemv / tile / dequant) ---------------------------
# M <= GEMV_MAX_M: the bandwidth kernel, one pass of 8 / 16 tokens a z-slice of the grid (past
# 16 the passes read W again, mostly from L2): M = 64 14336x4096 54.5 / 68.2 / 101.9, 4096x14336
# 50.8 / 100.9 / 104.4, 4096x4096 18.8 / 56.0 / 24.4.
GEMV_MAX_M = 64
# GEMV_MAX_M < M <= MID_MAX_M: small weights (N x K < BIG_WEIGHT) dequantize + cuBLAS (4096x4096
# M = 65 / 128: 28.2 / 58.5 / 26.3 and 30.5 / 58.5 / 25.7); large ones the GEMV, or the tile
# path from TILE_MIN_M where its 128-row CTAs alone fill half the SMs (14336x4096, 112 CTAs: M =
# 65 87.5 / 97.8 / 102.6, M = 128 109.4 / 98.0 / 103.3; 4096x14336, 32 CTAs: 84.1 / 134.0 /
# 105.3 and 96.4 / 136.8 / 110.1). The flat layout's mma kernel is 5-15% faster on these two
# (91-93 us).
MID_MAX_M = 128
BIG_WEIGHT = 1 << 25
TILE_MIN_M = 97
TILE_MIN_CTAS_PER_SM = 0.5
# Two GEMV passes (17..32 tokens) of a weight too large to stay in L2 between them read it twice
# from DRAM; the tile path (BM 32) reads it once where its 128-row CTAs fill the SMs. H100
# (session 22, graph-timed, every path forced), gemv / tile us: 28672x4096 (117 M weights, 224
# CTAs) M = 17 / 24 / 32 48.7 / 49.9 / 52.9 vs 45.3 / 44.8 / 45.6 (M = 16: 29.8 vs 44.3);
# 14336x4096 (58.7 M, 112 CTAs) stays on the GEMV: 27.4 / 28.1 / 29.5 vs 29.2 / 30.6 / 32.8.
# Session 35 (`examples/tune_paths.py`, same method): 16896x4096 (69.2 M, 132 CTAs) M = 24 / 32
# 28.9 / 29.5 vs 34.7 / 34.0, 20480x4096 (83.9 M) 49.8 / 51.1 vs 45.2 / 44.4, and in a later
# (then held-out) grid 17920x4096 (73.4 M) at M = 20 / 28 48.9 / 50.5 vs 45.7 / 45.0: the bound
# sits between 69.2 and 73.4 M weights (37-39 MB of codes and scales, the L2 50 MB). On a short K
# (<= TILE_LOW_MAX_K) the tile path's BM 32 CTAs beat the two passes whatever the weight's
# size: 8-14% on all 10 such shapes with >= SMs tile CTAs (20480x1024 15.2 / 15.6 vs 14.0 /
# 14.0; 24576x1536 20.9 / 21.7 vs 19.2 / 19.6; 20480x2048 26.8 / 28.0 vs 24.7 / 24.6).
TILE_LOW_MAX_M = 32
TILE_LOW_MIN_WEIGHT = 17 << 22
TILE_LOW_MAX_K = 2048
# M > MID_MAX_M: dequantize + cuBLAS (M = 129: 14336x4096 104.6 vs tile 147.2; M = 4096: 748.8
# us, 0.97x cuBLAS fp16 on the dense weight).


@dataclass(frozen=True, eq=False)
class Kbit4Tiled:
    """A 4-bit kbit weight W [N, K] in the tiled layout (built by `tile_weight`): CuPy arrays on
    `device`, owned by it. T = ceil(N / 16), Q = K / 128; in the step_major arrangement:
    data      uint8 [Q, T, 2, 8, 4, 16]: the codes two a byte, low nibble first, each 16-byte
              chunk lane (g, t)'s words j = codes of k 32j + 8t .. +7 of rows g / g + 8
    scales    uint8 [Q, T, 8, 1, 2, 4]: the E4M4 byte of each block of 32 (byte j of a row's
              step: block j)
    codebook  float32 [16], the sorted levels
    dtype     the dtype of the tensor that was quantized (KbitLinear.dequantize's default)
    origin    a small array of the caller's kind (the source codebook): dequantize returns
              that kind and runs on its current stream
    """

    n: int
    k: int
    data: Any
    scales: Any
    codebook: Any
    device: int
    dtype: str = "float16"
    origin: Any = None
    arrangement: str = ARRANGEMENT

    def __post_init__(self) -> None:
        import cupy

        t, q = -(-self.n // 16), self.k // 128
        dshape, sshape = arranged_shapes(self.arrangement, t, q, 4)
        for name, x, shape, dt in (("data", self.data, dshape, "uint8"),
                                   ("scales", self.scales, sshape, "uint8"),
                                   ("codebook", self.codebook, (16,), "float32")):
            if not isinstance(x, cupy.ndarray):
                raise ValueError(f"Kbit4Tiled.{name}: expected a CuPy array (tile_weight makes "
                                 f"them), got {type(x).__name__}")
            if tuple(x.shape) != shape or str(x.dtype) != dt:
                raise ValueError(f"Kbit4Tiled.{name}: {x.dtype} {tuple(x.shape)}; a tiled 4-bit "
                                 f"weight [{self.n}, {self.k}] needs {dt} {shape}")
            if x.data.device_id != self.device:
                raise ValueError(f"Kbit4Tiled.{name}: on device {x.data.device_id}, the weight "
                                 f"says device {self.device}")

    def strides(self) -> tuple[int, int, int, int]:
        """Byte strides of a block: W along tiles, W along steps, S along tiles, S along steps."""
        return block_strides(self.arrangement, self.data, self.scales)


def codes_of_planes(xp: Any, packed: Any, n: int, k: int, bits: int = 4) -> Any:
    """Flat kbit bit planes (packed[block * bits + b], bit j = plane b of element j) -> the
    codes [N, K] as uint8 (a new array), 32768 blocks at a time."""
    nb = n * k // 32
    planes = packed.reshape(nb, bits)
    lanes = xp.arange(32, dtype=xp.uint32)
    out = xp.empty((nb, 32), dtype=xp.uint8)
    step = 1 << 15
    for lo in range(0, nb, step):
        p = planes[lo:lo + step]
        idx = xp.zeros((p.shape[0], 32), dtype=xp.uint32)
        for b in range(bits):
            idx |= ((p[:, b:b + 1] >> lanes) & xp.uint32(1)) << xp.uint32(b)
        out[lo:lo + step] = idx.astype(xp.uint8)
    return out.reshape(n, k)


def tile_kbit4(xp: Any, packed: Any, absmax: Any, n: int, k: int,
               arrangement: str = ARRANGEMENT) -> tuple[Any, Any]:
    """(data, scales) of a 4-bit kbit weight [N, K] (flat planes, E4M4 bytes) in the tiled
    layout, K % 128 == 0: the codes two a byte, low nibble first (element 2i), tiled like fp4
    words but not bit-encoded; the E4M4 bytes as MXFP4's scale bytes (4 a row and step). Any
    array module (NumPy in the tests, CuPy in tile_weight); new arrays."""
    codes = codes_of_planes(xp, packed, n, k, 4)
    nib = (codes[:, 0::2] | (codes[:, 1::2] << xp.uint8(4))).astype(xp.uint8)
    del codes
    return arrange(xp, tile_data(xp, nib, n, k, None),
                   tile_scales(xp, absmax.reshape(n, k // 32), n, k, 4), arrangement)


def tile_weight(q: Any, ctx: Any, rows: int | None = None) -> Kbit4Tiled:
    """The tiled copy of a 4-bit KbitTensor [N, K] (flat layout) on ctx's device and stream;
    `rows`: N for a tensor of more dimensions (the experts' [E, N, K] as [E * N, K])."""
    import cupy

    n, k = (int(s) for s in q.shape) if rows is None else (rows, int(q.shape[-1]))
    packed, absmax, cb = q._views(ctx)
    with on_stream(ctx.device, ctx.stream):
        data, scales = tile_kbit4(cupy, packed, absmax, n, k)
        cb = cb.astype(cupy.float32, copy=True)  # q's buffers may go away
    return Kbit4Tiled(n, k, data, scales, cb, ctx.device, q.dtype, q.codebook)


# -- plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TiledChoice:
    """The path of a tiled 4-bit weight and, for gemv / tile, its launch (fp4_gemm Plan)."""

    path: str
    plan: Plan | None

    def short(self) -> str:
        return f"path={self.path}" + (f" {self.plan.short()}" if self.plan is not None else "")


def path_tiled(m: int, n: int, k: int, sm_count: int) -> str:
    if (16 < m <= TILE_LOW_MAX_M and (n * k >= TILE_LOW_MIN_WEIGHT or k <= TILE_LOW_MAX_K)
            and -(-n // TILE_BN) >= sm_count):
        return "tile"
    if m <= GEMV_MAX_M:
        return "gemv"
    if m > MID_MAX_M or n * k < BIG_WEIGHT:
        return "dequant"
    if m >= TILE_MIN_M and -(-n // TILE_BN) >= TILE_MIN_CTAS_PER_SM * sm_count:
        return "tile"
    return "gemv"


def plan_tiled(arch: str, m: int, n: int, k: int, dtype: str, sm_count: int,
               path: str | None = None, split: int | None = None,
               smem_limit: int | None = None) -> TiledChoice:
    """Pure planner; `path` (TILED_PATHS) and `split` (K splits of gemv / tile / wgmma) force a choice.
    `smem_limit`: shared memory a block of the device (None: the target's; less on 8.6
    parts under sm_80): the tile path keeps the stages (and BM) that fit it; where none does, the
    rule's tile path becomes the GEMV's (a forced one raises UnsupportedConfigError)."""
    check_shape(n, k)  # before the wgmma rule, which divides by N's tiles
    if m < 1:
        raise ValueError(f"A: M={m}; the kbit GEMM needs M >= 1")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {DTYPES}")
    forced = path
    if path is None:
        # a forced K split keeps the rule's path (the wgmma rule is about its own splits)
        takes = split is None and wgmma_takes(arch, m, n, k, sm_count, "kbit4", smem_limit)
        path = "wgmma" if takes else path_tiled(m, n, k, sm_count)
    if path not in TILED_PATHS:
        raise ValueError(f"path={path!r}: a tiled 4-bit weight runs on {TILED_PATHS} (the mma "
                         f"path reads the flat layout: quantize_weight(..., layout='flat'))")
    if path == "dequant":
        if split is not None:
            raise ValueError(f"split_k={split}: the dequant path (dequantize + cuBLAS) has no K split")
        return TiledChoice(path, None)
    try:
        plan = fp4_plan(arch, m, n, k, "kbit4", dtype, sm_count, path=path, split=split,
                        smem_limit=smem_limit)
    except UnsupportedConfigError:  # not even 2 stages of the smallest tile fit the device
        if forced is not None or path != "tile":
            raise
        path, plan = "gemv", fp4_plan(arch, m, n, k, "kbit4", dtype, sm_count, path="gemv",
                                      split=split, smem_limit=smem_limit)
    return TiledChoice(path, plan)


def plan_flat_wgmma(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
                    split: int | None = None, smem_limit: int | None = None) -> Plan:
    """A flat 2..4-bit weight on the wgmma kernel (sm_90a), its bit planes decoded in the kernel
    (Fp4WgmmaConfig.flat): the tiled 4-bit weight's wgmma plan for the shape, reading the flat
    layout (flat_wgmma_takes: where the selector picks it)."""
    if bits not in FLAT_WGMMA_BITS:
        raise ValueError(f"path='wgmma': flat weights of {FLAT_WGMMA_BITS} bits (their codes fit "
                         f"the kernel's 4-bit code table); this one has {bits}")
    p = plan_tiled(arch, m, n, k, dtype, sm_count, "wgmma", split, smem_limit).plan
    return dataclasses.replace(p, config=p.config.replace(flat=bits))


# -- where a flat weight takes the wgmma kernel (H100, session 37, build/probe_flatwg.py: 21
# weights x 2..4 bits x M 64..256, graph-timed, rotated, fp16, against the selector's gemv / mma /
# dequant). It pays where its 128-row CTAs run unsplit and fill their last wave to
# FLAT_WGMMA_FILL: 1.0-1.7x at 2 / 3 bits over 64..256 tokens; at 4 bits 1.1-1.3x at 96..128
# (M = 64 and 192..256 lose or tie at the plan's ring of 3: 231 registers). Below that fill, or
# split, it lost up to 2x (18944x3584: 148 CTAs, fill 0.56, 0.69-0.92x; 4096x4096: 0.5-0.8x).
# Held out after the rule (6 weights x 3 bits x M 64 / 128 / 256): every row it picks was the
# fastest path (1.07-1.64x the best other) once 4 bits stopped at 128 tokens.
# K >= FLAT_WGMMA_MIN_K: the grids' shortest K was 2048; shorter ones were not measured.
FLAT_WGMMA_M = {2: (64, 256), 3: (64, 256), 4: (96, 128)}
FLAT_WGMMA_FILL = 0.8
FLAT_WGMMA_MIN_K = 2048


def flat_wgmma_takes(arch: str, m: int, n: int, k: int, bits: int, dtype: str, sm_count: int,
                     smem_limit: int | None = None) -> bool:
    """Whether dispatch runs a flat weight on the wgmma kernel (the rule above)."""
    lo, hi = FLAT_WGMMA_M.get(bits, (1, 0))
    if arch not in WGMMA_ARCHS or k < FLAT_WGMMA_MIN_K or not lo <= m <= hi:
        return False
    try:
        p = plan_tiled(arch, m, n, k, dtype, sm_count, "wgmma", None, smem_limit).plan
    except (UnsupportedConfigError, ValueError):  # no pipeline fits the part's shared memory
        return False
    ctas = p.grid[0] * p.grid[1]
    slots = sm_count * p.config.ctas_per_sm
    return p.split == 1 and wave_fill(ctas, slots) >= FLAT_WGMMA_FILL


def prewarm_flat_wgmma_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KernelConfig]:
    """The flat weights' wgmma configs (spec as kbit_gemm.select's, "bits" the flat ones): without
    shapes the config of each BM the rule's tokens reach, for 2..4 bits (sm_90a); with shapes
    the ones flat_wgmma_takes picks on every part."""
    bits_list = [b for b in (spec.get("bits") or FLAT_WGMMA_BITS) if b in FLAT_WGMMA_BITS]
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = weight_shapes(spec, "kbit_gemm", check_shape)
    seen: set = set()
    for arch in archs:
        get_arch(arch)
        for bits in bits_list:
            for dtype in dtypes:
                if not shapes:  # the BMs of the rule's tokens (4 bits: BM 128 only; its BM 256
                    # variant spills at 255 registers and is reached only when forced)
                    lo, hi = FLAT_WGMMA_M[bits]
                    bms = {wgmma_bm(m) for m in range(lo, hi + 1)}
                    for cfg in wgmma_configs(arch, "kbit4", dtype):
                        if cfg.bm in bms:
                            yield cfg.replace(flat=bits)
                    continue
                for sms, lim in parts_of(arch, spec.get("sm_counts")):
                    for m, n, k in shapes:
                        lo, hi = FLAT_WGMMA_M[bits]
                        ms = (m,) if m is not None else range(lo, hi + 1)
                        for mm in ms:
                            if flat_wgmma_takes(arch, int(mm), n, k, bits, dtype, sms, lim):
                                cfg = plan_flat_wgmma(arch, int(mm), n, k, bits, dtype, sms,
                                                      smem_limit=lim).config
                                if cfg not in seen:
                                    seen.add(cfg)
                                    yield cfg


@selector
def select_tiled(arch: str, m: int, n: int, k: int, dtype: str, sm_count: int,
                 smem_limit: int | None = None) -> TiledChoice:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_tiled(arch, m, n, k, dtype, sm_count, smem_limit=smem_limit)


# -- launches -----------------------------------------------------------------------------------
def gemm_tiled(ctx: Any, W: Kbit4Tiled, a: Any, b: Any, has_bias: bool, c: Any, m: int, n: int,
               k: int, dt: str, info: Any, path: str | None, split: int | None) -> None:
    """C = A . W^T (+ bias) of a tiled weight on ctx's stream (c: C's cupy view, written)."""
    if W.device != ctx.device:
        raise ValueError(f"W: on device {W.device}, A is on device {ctx.device}")
    lim = smem_limit(ctx.device)
    if path is None and split is None:
        choice = select_tiled(info.arch.name, m, n, k, dt, info.sm_count, lim)
    else:
        choice = plan_tiled(info.arch.name, m, n, k, dt, info.sm_count, path,
                            None if split is None else int(split), lim)
    if choice.path == "dequant":
        dense_gemm(ctx, lambda _w, wv: dequantize_tiled(ctx, W, dt, wv), a, b, has_bias, c, m, n, k, dt)
        return
    launch_plan(ctx, choice.plan, W.data, W.scales, W.codebook, W.strides(), a, b, has_bias, 1.0,
                c, m, n, k)


def dequantize_tiled(ctx: Any, W: Kbit4Tiled, dt: str, out: Any) -> None:
    """out [N, K] (a cupy array of dtype dt: fp16, bf16 or fp32) = the dense values of W, as
    kbit dequantize makes them (T(RN(cb[code] * scale)))."""
    info = device_info(ctx.device)
    cfg = KbitTiledDequantConfig(arch=info.arch.name, dtype=dt)
    fn = get_kernel(cfg, ctx.device, ctx.stream).fn("kbit_dequant_tiled")
    wt, wq, st, sq = W.strides()
    chunks = -(-W.n // 16) * (W.k // 128) * 64
    grid = max(1, min(-(-chunks // 256), info.sm_count * 8))
    ctx.launch(fn, (grid, 1, 1), (256, 1, 1),
               (W.data, W.scales, W.codebook, out, np.int32(W.n), np.int32(W.k), np.int64(wt),
                np.uint32(wq), np.int64(st), np.uint32(sq)))


# -- prewarm ------------------------------------------------------------------------------------
def _probe_ms() -> list[int]:
    """M values that reach every plan of the tiled paths: every M up to MID_MAX_M (the GEMV's
    plans change with its passes), the wgmma path's BM buckets, and one past both."""
    return sorted(set(range(1, MID_MAX_M + 2)) | set(wgmma_probe_ms()) | {max(MID_MAX_M, WGMMA_MAX_M) + 1})


def prewarm_tiled_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KernelConfig]:
    """Configs the tiled paths can launch for 4-bit weights (spec as kbit_gemm.select's:
    "dtypes", "shapes", "sm_counts"). Without shapes: every GEMV config the FP4 planner can
    give kbit4 (both m_tiles, each TPW, KBIT4_WPS warps an SM, the code table each part's shared
    memory takes; the balanced GEMV of each m_tile), every tile config M in
    [TILE_MIN_M, MID_MAX_M] reaches (at the stages of each part's shared memory), the wgmma
    config of each BM (sm_90a), and the dequantize kernel ("float32" among the dtypes: also its
    fp32 output, for KbitLinear.dequantize). With shapes: every part's plans
    (kernelgen.arch.parts_of)."""
    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    shapes = weight_shapes(spec, "kbit_gemm", check_shape)
    seen: set = set()
    for arch in archs:
        get_arch(arch)
        if "float32" in (spec.get("dtypes") or ()):  # KbitLinear.dequantize("float32")
            yield KbitTiledDequantConfig(arch=arch, dtype="float32")
        for dtype in dtypes:
            if not shapes:
                for m_tile in M_TILES:  # the code tables the parts' shared memory takes
                    wides = tuple(dict.fromkeys(kbit4_lut_wide(arch, m_tile, GEMV_WARPS, KBIT4_WPS, lim)
                                                for lim in smem_limits(arch)))
                    for tpw in sorted({1, KBIT4_TPW[m_tile]}):
                        for pf in pfs_of(arch):
                            for wide in wides:
                                yield Fp4GemvConfig(arch=arch, fmt="kbit4", dtype=dtype, enc=dtype,
                                                    m_tile=m_tile, warps=GEMV_WARPS, depth=GEMV_DEPTH,
                                                    tpw=tpw, warps_per_sm=KBIT4_WPS, pf=pf,
                                                    lut_wide=wide)
                    for wide in wides:  # the balanced GEMV
                        yield Fp4GemvConfig(arch=arch, fmt="kbit4", dtype=dtype, enc=dtype, m_tile=m_tile,
                                            warps=GEMV_WARPS, depth=GEMV_DEPTH,
                                            tpw=balanced_tpw(arch, "kbit4", m_tile),
                                            warps_per_sm=KBIT4_WPS, lut_wide=wide, balanced=True)
                tile_ms = [*range(17, TILE_LOW_MAX_M + 1), *range(TILE_MIN_M, MID_MAX_M + 1)]
                for bm in sorted({bm_for(m) for m in tile_ms}):
                    for stages in dict.fromkeys(stages_for(arch, "kbit4", bm, lim)
                                                for lim in smem_limits(arch)):
                        yield Fp4TileConfig(arch=arch, fmt="kbit4", dtype=dtype, enc=dtype, bm=bm,
                                            stages=stages, warps_t=TILE_BMS[bm])
                yield KbitTiledDequantConfig(arch=arch, dtype=dtype)
                yield from wgmma_configs(arch, "kbit4", dtype)
                continue
            for sms, lim in parts_of(arch, spec.get("sm_counts")):
                for m, n, k in shapes:
                    for mm in (m,) if m is not None else _probe_ms():
                        ch = plan_tiled(arch, int(mm), n, k, dtype, sms, smem_limit=lim)
                        cfg = ch.plan.config if ch.plan is not None else \
                            KbitTiledDequantConfig(arch=arch, dtype=dtype)
                        if cfg not in seen:
                            seen.add(cfg)
                            yield cfg
