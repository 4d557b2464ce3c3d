"""Launch plans of the mx kernels (pure host code: no GPU work, memoised per problem).

Quantize paths:
  direct  one `mx_quantize` launch; the NVFP4 global scale is a value or a device scalar.
  redundant  NVFP4 with the global scale computed from the input, small inputs (<= 256 KB):
          one `mx_quantize` launch whose every block reduces the whole (L2-resident) input
          itself, then quantizes its slots.
  fused   the same from one cluster of 8 x 1024 threads (sm_90+): the input is read once, the
          amax reduced through distributed shared memory, slots quantized from registers. Not
          the default: measured on the H100 at ~10 us per call in a CUDA graph, ~5 us above the
          direct kernel at the same size (force_small_auto_path("fused") to compare).
  amax    NVFP4 with the global scale computed from the input otherwise: `mx_amax` writes
          per-block partial maxima, `mx_quantize` reduces them per block (two launches, no
          memset, no host sync).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..core.select import selector
from .config import (
    CLUSTER,
    ESIZE,
    FLOAT_DTYPES,
    FUSED_THREADS,
    H2_DEFAULT,
    THREADS,
    WIDE_FP8,
    MxDequantizeConfig,
    MxQuantizeConfig,
    h2_applies,
    hw_fp8_cvt,
    lane_elems,
)
from .tensor import FORMATS, elem_bits, group_size

GS_MODES = ("value", "device", "auto")  # NVFP4 global scale: Python value, device scalar, computed
PAD_WORDS_PER_THREAD = 4  # padding-row scale words a thread zeroes before the grid grows for them
AMAX_UNROLL = 4  # 16-byte loads in flight per thread in mx_amax
MAX_SLOTS = 1 << 31  # slot indices are 32-bit on the device
REDUNDANT_MAX_BYTES = 256 * 1024  # input size up to which every block may re-read it for amax
# Grid of the looping quantize configs once their chunks exceed it, by element bits: (blocks an
# SM, slots a thread of a chunk; 0: the config's full). H100, K = 4096, % of copy at M = 4096 /
# 16384 (BENCHMARKS.md): fp4 2 x full 77-80 / 90-94 (3 x full 77-78 / 90-91, 3 x 1 75-80 /
# 84-91); fp6 3 x 1 83 / 93 (2 x full 81 / 92). fp8 does not loop (a block a chunk: 83-84 / 95).
LOOP_GRID = {4: (2, 0), 6: (3, 1)}
# ... and, per format, the grid while its chunks at that many slots a thread take SHORT_ROUNDS
# rounds of it (more resident warps, shorter chains a thread: a shorter exposed tail). H100,
# K = 4096, NVFP4 us fp16 / bf16, 2 x full -> 3 x 1, two runs (BENCHMARKS.md, session 26):
# M = 1024 (2.6 rounds) 6.41 / 6.40 -> 6.40 / 6.34, 2048 (5.2) 10.05 / 10.06 -> 9.86 / 9.78, 3072
# (7.8) 13.65 / 13.65 -> 13.61 / 13.56, 4096 (10.3) 17.35 / 17.32 -> 17.17 / 17.05; below 2 rounds
# the chunks keep their full slots and fit one wave of 3 blocks an SM: M = 768 (1.9 rounds)
# 5.89 / 5.82 -> 5.54 / 5.43; outside the window 3 x 1 loses: M = 512 (1.3 rounds) 4.15 / 4.10
# -> 4.29 / 4.24, 6144 (15.5) 24.70 / 24.58 -> 24.87 / 24.78, 8192 31.98 -> 32.15, 16384 61.1 ->
# 61.4.
LOOP_GRID_SHORT = {"nvfp4": (3, 1)}
SHORT_ROUNDS = (1.5, 12)
_small_auto_path: str | None = None  # tests / benchmarks: force "fused" or "redundant"
_blocks_per_sm: int | None = None  # tests / benchmarks: the direct grid's cap (0: none)
_wide_fp8: bool | None = None  # tests / benchmarks: MXFP8 lane slots of 16 (True) or 8 elements
_slots: int | None = None  # tests / benchmarks: slots a thread of a chunk (at most the config's)
_h2: bool | None = None  # tests / benchmarks: packed 16-bit encoders on / off where they apply
_linear = True  # tests / benchmarks: False keeps the row / column slot addressing everywhere
# Capped grids balanced (chunk_grid): the fewest blocks that keep the rounds, once the last round
# of the full cap would be at least BALANCE_MIN_FILL full. H100, K = 4096, same run: fp4 (last
# round 76-88% full) M = 2048 / 4096 0.5-1.6% faster, M = 16384 (3%) 0.3-0.5% slower balanced;
# fp6 (17-37% full) 0.2-2% slower balanced (BENCHMARKS.md)
BALANCED_DEFAULT = True
BALANCE_MIN_FILL = 0.5
_balanced: bool | None = None  # tests / benchmarks: override BALANCED_DEFAULT
# Swizzled scales in sector order (scale mode 2, mx.cuh Tiling): chunks of 8 rows whose scale
# bytes fill whole 32-byte sectors, staged in shared memory, a block a chunk, from this many rows
# (below it the last 128-row tile's padding rows would be a large share of the chunks). Where a
# format of TILED_FORMATS and the shape take it, a looping format (fp4 / fp6) drops its chunk
# loop for it (the same config with loop=False); elsewhere it loops as before. H100, K = 4096
# (BENCHMARKS.md): MXFP8 M = 4096 19.4 -> 18.8 us (88 -> 91% of copy), M = 16384 70.5 -> 68.6
# (97 -> 99%); MXFP4 (loop -> sector order) M = 1024 5.95 -> 5.42, 4096 16.67 -> 16.20 (86 ->
# 88%), 16384 59.4 -> 57.1; MXFP6 6.18 -> 5.76, 18.0 -> 17.4 (87 -> 90%), 65.5 -> 62.6. NVFP4
# (heavier scales: 40 registers a block a chunk) loses at M = 1024-4096 (6.47 -> 6.91, 17.46 ->
# 17.57) and keeps its loop and the plain order (staging per chunk in the loop was no faster:
# M = 4096 17.3 -> 17.8 us).
TILED_FORMATS = frozenset({"mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"})
TILED_MIN_ROWS = 512
_tiled: bool | None = None  # tests / benchmarks: sector order wherever the shape allows (True),
# never (False), or by TILED_FORMATS / TILED_MIN_ROWS (None)


def force_small_auto_path(path: str | None) -> None:
    """Force the small-input NVFP4 path ("fused" / "redundant"; None: by arch). For tests and
    benchmarks that compare the paths; clears the plan memo."""
    global _small_auto_path
    if path not in (None, "fused", "redundant"):
        raise ValueError(f"path={path!r}; expected None, 'fused' or 'redundant'")
    _small_auto_path = path
    quantize_plan.cache_clear()


def force_blocks_per_sm(blocks: int | None, slots: int | None = None) -> None:
    """Cap a looping mx_quantize's grid at `blocks` an SM (0: a block a chunk, no loop; None:
    LOOP_GRID; > 0 makes fp8 configs loop as well) and force the slots a thread of a chunk
    (None: the planner's; at most the config's). For tests and benchmarks; clears the plan
    memo."""
    global _blocks_per_sm, _slots
    if blocks is not None and (not isinstance(blocks, int) or blocks < 0):
        raise ValueError(f"blocks={blocks!r}; expected None or an int >= 0")
    if slots is not None and (not isinstance(slots, int) or slots < 1):
        raise ValueError(f"slots={slots!r}; expected None or an int >= 1")
    _blocks_per_sm, _slots = blocks, slots
    quantize_plan.cache_clear()


def force_wide_fp8(wide: bool | None) -> None:
    """MXFP8 quantize with 16-element (True) or 8-element (False) lane slots; None: WIDE_FP8.
    For tests and benchmarks; clears the plan memo."""
    global _wide_fp8
    if wide not in (None, True, False):
        raise ValueError(f"wide={wide!r}; expected None, True or False")
    _wide_fp8 = wide
    quantize_plan.cache_clear()


def force_h2(h2: bool | None) -> None:
    """MX fp4 / fp6 quantize of 16-bit inputs with (True) or without (False) the packed 16-bit
    encoders; None: H2_DEFAULT. For tests and benchmarks; clears the plan memo."""
    global _h2
    if h2 not in (None, True, False):
        raise ValueError(f"h2={h2!r}; expected None, True or False")
    _h2 = h2
    quantize_plan.cache_clear()


def force_linear(on: bool) -> None:
    """mx_quantize with (True, the default) or without the linear-index path. For tests and
    benchmarks; clears the plan memo."""
    global _linear
    if on not in (True, False):
        raise ValueError(f"on={on!r}; expected True or False")
    _linear = on
    quantize_plan.cache_clear()


def force_balanced(on: bool | None) -> None:
    """Capped (looping) grids balanced where chunk_grid allows (True) or filled to the cap
    (False); None: BALANCED_DEFAULT. For tests and benchmarks; clears the plan memo."""
    global _balanced
    if on not in (None, True, False):
        raise ValueError(f"on={on!r}; expected None, True or False")
    _balanced = on
    quantize_plan.cache_clear()


def force_tiled(on: bool | None) -> None:
    """Swizzled scales in sector order wherever the config and shape allow it (True), never
    (False), or by TILED_FORMATS and TILED_MIN_ROWS (None). For tests and benchmarks; clears the
    plan memo."""
    global _tiled
    if on not in (None, True, False):
        raise ValueError(f"on={on!r}; expected None, True or False")
    _tiled = on
    quantize_plan.cache_clear()


def tiled_applies(fmt: str, rows: int, k: int, e: int, slots: int) -> bool:
    """Whether sector order (mx.cuh Tiling) can take [rows, K] with `slots` lane slots a thread
    (the kernel's U; the caller checks it is the config's): no scale padding columns, whole chunk
    rows of 32 * slots lane slots (slots a power of two), 32-bit slot indices over the padded
    rows."""
    spr = k // e
    spc = THREADS * slots // 8
    return ((k // group_size(fmt)) % 4 == 0 and slots & (slots - 1) == 0 and spr % spc == 0
            and _cdiv(rows, 128) * 128 * spr < MAX_SLOTS)


def chunk_grid(chunks: int, sm_count: int, blocks_per_sm: int, balanced: bool = False) -> int:
    """Blocks of mx_quantize for `chunks` chunks: a block a chunk while they fit blocks_per_sm
    resident blocks an SM, else exactly that many blocks an SM, block b running chunks b,
    b + grid, ... (every SM then gets the same number of chunks, +-1; blocks_per_sm 0: no cap).
    balanced: where the cap's last round would be at least BALANCE_MIN_FILL full, the fewest
    blocks that take the same number of rounds, so no block runs a chunk more than another
    (2048 chunks, cap 264: 256 blocks of 8 chunks instead of 200 of 8 and 64 of 7; a nearly
    empty last round is cheap, and shrinking the grid would slow every other round)."""
    cap = sm_count * blocks_per_sm
    if blocks_per_sm <= 0 or chunks <= cap:
        return max(1, chunks)
    rounds = _cdiv(chunks, cap)
    if balanced and chunks - (rounds - 1) * cap >= BALANCE_MIN_FILL * cap:
        return _cdiv(chunks, rounds)
    return cap


@dataclass(frozen=True)
class QuantizePlan:
    config: MxQuantizeConfig
    path: str  # "direct" | "fused" | "redundant" | "amax"
    grid: int
    block: int
    slots: int = 1  # lane slots per thread of mx_quantize (its runtime u_count)
    amax_grid: int = 0  # blocks of mx_amax (path "amax"), = number of partial maxima
    scale_mode: int = 0  # mx_quantize's `swizzled`: 0 row-major, 1 swizzled, 2 sector order

    @property
    def tiled(self) -> bool:
        return self.scale_mode == 2

    def short(self) -> str:
        extra = f", amax_grid={self.amax_grid}" if self.path == "amax" else ""
        extra += ", tiled" if self.tiled else ""
        return f"QuantizePlan({self.config.short()}, path={self.path}, grid={self.grid}, " \
               f"block={self.block}, slots={self.slots}{extra})"


@dataclass(frozen=True)
class DequantizePlan:
    config: MxDequantizeConfig
    grid: int
    block: int

    def short(self) -> str:
        return f"DequantizePlan({self.config.short()}, grid={self.grid}, block={self.block})"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def slot_counts(fmt: str, rows: int, k: int, swizzled: bool,
                e: int | None = None) -> tuple[int, int]:
    """(lane slots the quantize kernels cover, 4-byte scale words of the padding rows);
    e: elements a lane slot (default lane_elems(fmt))."""
    s = k // group_size(fmt)
    lanes = group_size(fmt) // (e or lane_elems(fmt))
    cols = 4 * _cdiv(s, 4) if swizzled else s
    pad_words = (_cdiv(rows, 128) * 128 - rows) * _cdiv(s, 4) if swizzled else 0
    return rows * cols * lanes, pad_words


def quantize_config(arch: str, fmt: str, dtype: str) -> MxQuantizeConfig:
    """The quantize config dispatch uses: the hardware fp8 cvt where the arch has it; MXFP8
    lanes of 16 elements if WIDE_FP8; the packed 16-bit encoders where they apply if
    H2_DEFAULT."""
    wide = (WIDE_FP8 if _wide_fp8 is None else _wide_fp8) and elem_bits(fmt) == 8
    h2 = (H2_DEFAULT if _h2 is None else _h2) and h2_applies(fmt, dtype)
    # a forced grid cap makes fp8 loop too (benchmarks compare); else by format
    loop = True if elem_bits(fmt) == 8 and _blocks_per_sm else None
    return MxQuantizeConfig(arch=arch, fmt=fmt, dtype=dtype, hw_cvt=hw_fp8_cvt(arch, fmt),
                            wide=wide, h2=h2, loop=loop, linear=_linear)


@selector
def quantize_plan(arch: str, sm_count: int, fmt: str, dtype: str, rows: int, k: int,
                  swizzled: bool, gs_mode: str) -> QuantizePlan:
    """The kernels and grid for quantizing [rows, K] of `dtype` to `fmt`."""
    cfg = quantize_config(arch, fmt, dtype)
    if gs_mode not in GS_MODES:
        raise ValueError(f"gs_mode={gs_mode!r}; expected one of {GS_MODES}")
    total, pad_words = slot_counts(fmt, rows, k, swizzled, cfg.lane_elems)
    if total >= MAX_SLOTS:
        raise ValueError(f"x: {rows} rows x K={k} is too large for one launch (rows * K / "
                         f"{cfg.lane_elems} must be < 2**31)")
    s = k // group_size(fmt)
    if (_cdiv(rows, 128) * 128 * 4 * _cdiv(s, 4) if swizzled else rows * s) >= MAX_SLOTS:
        raise ValueError(f"x: {rows} rows x K={k} is too large for one launch (the scale "
                         f"bytes, padding included, must be < 2**31: 32-bit offsets)")
    path, amax_grid = "direct", 0
    if fmt == "nvfp4" and gs_mode == "auto":
        small = _small_auto_path or "redundant"
        if small == "fused" and cfg.fused and total <= CLUSTER * FUSED_THREADS * cfg.fused_slots:
            return QuantizePlan(cfg, "fused", CLUSTER, FUSED_THREADS,
                                _cdiv(total, CLUSTER * FUSED_THREADS), scale_mode=int(swizzled))
        if small == "redundant" and rows * k * ESIZE[dtype] <= REDUNDANT_MAX_BYTES:
            path = "redundant"
        else:
            path = "amax"
            n16 = rows * k * ESIZE[dtype] // 16
            amax_grid = max(1, min(_cdiv(n16, THREADS * AMAX_UNROLL), 4 * sm_count))
    # Full slots per thread (loads in flight) once the grid fills the GPU twice over; below
    # that one slot per thread: more blocks, shorter dependent chains (small-M latency).
    slots = cfg.slots
    if _cdiv(total, THREADS * slots) < 2 * sm_count:
        slots = 1
    # Sector order (TILED_FORMATS): a block a chunk of 8 rows x 32 * slots lane slots over the
    # padded rows, no padding pass; a looping format's config without its loop (unless
    # force_blocks_per_sm set a cap, 0 included: the forced grid then applies)
    want_tiled = (fmt in TILED_FORMATS and rows >= TILED_MIN_ROWS) if _tiled is None else _tiled
    tiled_slots = slots if _slots is None else min(_slots, cfg.slots)
    if swizzled and want_tiled and tiled_slots == cfg.slots and \
            (not cfg.loops or (cfg.loop is None and _blocks_per_sm is None)) and \
            tiled_applies(fmt, rows, k, cfg.lane_elems, tiled_slots):
        chunks = _cdiv(rows, 128) * 16 * (k // cfg.lane_elems // (THREADS * tiled_slots // 8))
        return QuantizePlan(replace(cfg, loop=False) if cfg.loops else cfg, path, chunks, THREADS,
                            tiled_slots, amax_grid, 2)
    # A looping config (fp4 / fp6) gets at most LOOP_GRID's blocks an SM (and slots), each
    # looping over chunks with the next chunk's loads in flight (one wave: no lock-step
    # load-then-compute waves, no partial last wave); fp8 a block a chunk.
    per_sm, loop_slots = LOOP_GRID.get(elem_bits(fmt), (0, 0)) if cfg.loops else (0, 0)
    if cfg.loops and _blocks_per_sm is None and fmt in LOOP_GRID_SHORT:
        b, u = LOOP_GRID_SHORT[fmt]
        if SHORT_ROUNDS[0] <= _cdiv(total, THREADS * u) / (b * sm_count) <= SHORT_ROUNDS[1]:
            per_sm, loop_slots = b, u
    if cfg.loops and _blocks_per_sm is not None:
        per_sm, loop_slots = _blocks_per_sm, 0
    if per_sm and loop_slots and _cdiv(total, THREADS * slots) > per_sm * sm_count:
        slots = min(loop_slots, slots)  # capped grid: its chunk size
    if _slots is not None:
        slots = min(_slots, cfg.slots)
    balanced = BALANCED_DEFAULT if _balanced is None else _balanced
    grid = max(chunk_grid(_cdiv(total, THREADS * slots), sm_count, per_sm, balanced),
               _cdiv(pad_words, THREADS * PAD_WORDS_PER_THREAD))
    return QuantizePlan(cfg, path, grid, THREADS, slots, amax_grid, int(swizzled))


@selector
def dequantize_plan(arch: str, fmt: str, dtype: str, rows: int, k: int) -> DequantizePlan:
    cfg = MxDequantizeConfig(arch=arch, fmt=fmt, dtype=dtype)
    total = rows * k // lane_elems(fmt)
    if total >= MAX_SLOTS:
        raise ValueError(f"{rows} rows x K={k} is too large for one launch (rows * K / "
                         f"{lane_elems(fmt)} must be < 2**31)")
    per_block = THREADS * cfg.template_vars()["slots"]
    return DequantizePlan(cfg, max(1, _cdiv(total, per_block)), THREADS)


SPEC_KEYS = {"fmts": tuple(FORMATS), "dtypes": FLOAT_DTYPES}  # prewarm_configs' (Family.spec_keys)


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator:
    """Every config the mx API can launch: quantize (and, for a looping format of
    TILED_FORMATS, its sector-order config without the loop) and dequantize per (format,
    dtype); narrowed by spec "fmts" and "dtypes" when given."""
    fmts = tuple(f for f in (spec.get("fmts") or FORMATS) if f in FORMATS)
    dtypes = tuple(d for d in (spec.get("dtypes") or FLOAT_DTYPES) if d in FLOAT_DTYPES)
    for arch in archs:
        for fmt in fmts:
            for dt in dtypes:
                q = quantize_config(arch, fmt, dt)
                yield q
                if q.loops and fmt in TILED_FORMATS:
                    yield replace(q, loop=False)
                yield MxDequantizeConfig(arch=arch, fmt=fmt, dtype=dt)
