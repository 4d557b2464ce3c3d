"""kbit experts for the MoE grouped GEMM: quantize W [E, N, K] once (the kbit format of
kernelgen.kbit, blocks of 32 along K), then the grouped GEMM dequantizes in registers. Two
layouts (KbitExperts): 4-bit "tiled" experts (the default) run the FP4 bandwidth kernel over the
MoE work items (templates/moe/grouped_gemv.cu.jinja; plan_kbit_gemv / select_kbit_gemv below);
"flat" experts (2-4 bits) run templates/moe/grouped_kbit.cuh (decode-oriented, always swap_ab),
whose selector follows.

Selector (host numbers only, memoised and printable): TILE_M from the average rows per expert
(KBIT_TILE_M_TABLE); the CTA shape from the CTAs the experts touched (at most min(E, M)) give:
the widest (16 * warps_p weight rows) that still puts MIN_CTAS_PER_SM CTAs on every SM, else
the narrowest with a 4-way k split; stages as many as the shared-memory budget of the arch (or
the device's shared memory a block, where lower) leaves beside the 32 KB pair table.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch, per_target, smem_cap
from ..core.interop import context_of
from ..core.select import selector
from ..errors import UnsupportedConfigError
from ..fp4_gemm.select import kw_for, kw_steps_ok
from ..kbit.api import KbitTensor, check_bits, quantize_kbit
from ..kbit_gemm.api import check_layout
from ..kbit_gemm.tiled import Kbit4Tiled, tile_weight
from .config import (
    DTYPES,
    EPILOGUES,
    GEMV_M_TILES,
    KBIT_BITS,
    KBIT_LUT_BYTES,
    KBIT_TILE_MS,
    KBIT_WARPS,
    MoeKbitConfig,
    MoeKbitGemvConfig,
    kbit_stage_bytes,
)
from .select import ItemLaunch, TileItems, check_forced

# measured (BENCHMARKS.md): the kbit kernel is decode-bound, so TILE_M=8 stays faster than 16
# even where some experts then take two passes over their weights (E=8, top-2, T=16)
KBIT_TILE_M_TABLE: tuple[tuple[float, int], ...] = ((8.0, 8), (16.0, 16), (float("inf"), 32))
MIN_CTAS_PER_SM = 2
MAX_STAGES = 8
# shared memory (bytes) one CTA may take so that two stay resident on an SM
SMEM_BUDGET: dict[str, int] = per_target({"sm_80": 80 * 1024, "sm_90a": 110 * 1024,
                                          "sm_100a": 110 * 1024, "sm_120a": 96 * 1024})
K_STEP = 128  # K granularity: 4 blocks of 32 per lane group
# tiled kbit4 experts: warps along K a tile unit (the planner's rule: fp4_gemm.select.kw_for)
GEMV_KWS = (1, 2, 4, 8)
WAVE_FILL = 0.75  # plan_kbit_gemv: a one-wave kw pick filling less of the wave looks further
# tiles a warp: 2 (swiglu needs its gate / up pair; W2 measured, H100, graph replays, m_tile 8,
# kw 1, tpw 1 -> 2: E128 T = 1 / 4 / 16 27.7 -> 25.5 / 96.3 -> 92.5 / 270.1 -> 239.3 us; E8 T = 16
# at kw 2 89.2 -> 83.6; E8 T = 1 at the same CTA count (kw 4 -> 8) 25.2 -> 25.3)
GEMV_TPW = 2


@dataclass(frozen=True)
class KbitExperts:
    """Expert weights W [E, N, K], 2-4 bits, in one of two layouts (exactly one of q / tiled set):

    flat   `q`: the KbitTensor of quantize_kbit (row e*N + n, K/32 blocks a row, bit planes),
           read by templates/moe/grouped_kbit.cuh (TILE_M 8 / 16 / 32)
    tiled  `tiled`: 4 bits only, the experts' rows stacked as one [E * N, K] weight in the tiled
           layout of the FP4 kernels (kernelgen/kbit_gemm/tiled.py; N a multiple of 16, so no
           16-row tile straddles two experts), read by the FP4 bandwidth kernel over work items
           (templates/moe/grouped_gemv.cu.jinja; 8 or 16 tokens a pass)
    """

    q: KbitTensor | None
    experts: int
    n: int
    k: int
    tiled: Kbit4Tiled | None = None

    def __post_init__(self) -> None:
        e, n, k = self.experts, self.n, self.k
        if (self.q is None) == (self.tiled is None):
            raise ValueError("KbitExperts: exactly one of q (flat layout) and tiled (tiled "
                             "layout) must be set; use quantize_experts(w)")
        if self.tiled is None:
            if not isinstance(self.q, KbitTensor) or tuple(self.q.shape) != (e, n, k):
                raise ValueError(f"KbitExperts: q must be a KbitTensor of shape ({e}, {n}, {k}); "
                                 f"use quantize_experts(w)")
        elif not isinstance(self.tiled, Kbit4Tiled) or (self.tiled.n, self.tiled.k) != (e * n, k):
            raise ValueError(f"KbitExperts: tiled must be a Kbit4Tiled of shape ({e * n}, {k}) "
                             f"(the experts' rows stacked); use quantize_experts(w)")
        check_kbit_shape(e, n, k, self.bits, layout=self.layout)

    @property
    def bits(self) -> int:
        return 4 if self.tiled is not None else self.q.bits

    @property
    def layout(self) -> str:
        return "tiled" if self.tiled is not None else "flat"

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.experts, self.n, self.k)


def check_kbit_shape(e: int, n: int, k: int, bits: int, name: str = "w", layout: str = "flat") -> None:
    if bits not in KBIT_BITS:
        raise ValueError(f"{name}: bits={bits}; kbit experts support bits in {KBIT_BITS}")
    row = 16 if layout == "tiled" else 8
    if e < 1 or n < row or n % row or k < K_STEP or k % K_STEP:
        raise ValueError(f"{name}: shape [E={e}, N={n}, K={k}]; kbit experts ({layout} layout) "
                         f"need E >= 1, N a positive multiple of {row} and K a positive multiple "
                         f"of {K_STEP}")


def check_kbit_epilogue(n: int, epilogue: str, layout: str = "flat", name: str = "w") -> None:
    """The epilogue rule: swiglu splits the N = 2I rows into gate / up halves of whole row
    blocks (8 rows flat, 16-row tiles tiled), so N must be a multiple of 16 (32 tiled)."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"activation: {epilogue!r}; expected None or 'swiglu'")
    mult = 32 if layout == "tiled" else 16
    if epilogue == "swiglu" and n % mult:
        raise ValueError(f"{name}: N={n}; swiglu needs 2I (gate + up rows) a multiple of {mult} "
                         f"({layout} layout" + ("; quantize_experts(w13, layout='flat') takes "
                                                "multiples of 16)" if layout == "tiled" else ")"))


def forced_kbit_gemv_plan(config: MoeKbitGemvConfig, arch: str, dtype: str, epilogue: str, e: int,
                          n: int, k: int, kw: int = 1) -> KbitGemvPlan:
    """The plan of a forced MoeKbitGemvConfig (tiled experts; grouped_gemm(config=...))."""
    check_forced(config, MoeKbitGemvConfig, "tiled kbit experts", dtype=dtype, epilogue=epilogue,
                 arch=arch)
    config.check()
    check_kbit_shape(e, n, k, 4, layout="tiled")
    check_kbit_epilogue(n, epilogue, "tiled")
    if kw not in GEMV_KWS or kw > config.warps:
        raise ValueError(f"kw={kw}: expected one of {GEMV_KWS}, at most the config's "
                         f"{config.warps} warps")
    return KbitGemvPlan(config, e, n, kw)


def forced_kbit_plan(config: MoeKbitConfig, arch: str, dtype: str, epilogue: str, bits: int,
                     e: int, n: int, k: int) -> KbitPlan:
    """The plan of a forced MoeKbitConfig (grouped_gemm(config=...)), after the rules the
    planner applies: dtype, epilogue, bits and arch (this device) of the call, the shape and
    the swiglu rule."""
    check_forced(config, MoeKbitConfig, "kbit experts", dtype=dtype, epilogue=epilogue, bits=bits,
                 arch=arch)
    check_kbit_shape(e, n, k, bits)
    check_kbit_epilogue(n, epilogue)
    return KbitPlan(config, e, -(-n // config.tile_n))


def quantize_experts(w: Any, bits: int = 4, *, codebook: Any = None, dtype: str | None = None,
                     layout: str | None = None) -> KbitExperts:
    """Quantize expert weights W [E, N, K] (fp16 / bf16 / fp32, CuPy or torch) for grouped_gemm
    and fused_moe. K must be a multiple of 128; bits 2, 3 or 4. `layout` "flat" or "tiled"
    (4 bits only, N a multiple of 16; default: "tiled" for 4 bits, else "flat"; see
    KbitExperts)."""
    bits = check_bits(bits)
    layout = check_layout(layout, bits)
    shape = tuple(int(s) for s in getattr(w, "shape", ()))
    if len(shape) != 3:
        raise ValueError(f"w: expected expert weights [E, N, K], got shape {shape}")
    check_kbit_shape(*shape, bits, layout=layout)
    flat = KbitExperts(quantize_kbit(w, bits, codebook=codebook, dtype=dtype), *shape)
    return flat if layout == "flat" else tile_experts(flat)


def tile_experts(x: KbitExperts) -> KbitExperts:
    """The tiled copy of 4-bit flat experts (a new weight on q's device and current stream;
    the bit-identical codes and scales, read by the grouped bandwidth kernel)."""
    if not isinstance(x, KbitExperts) or x.layout != "flat" or x.bits != 4:
        raise ValueError("tile_experts: expects 4-bit KbitExperts in the flat layout")
    e, n, k = x.shape
    check_kbit_shape(e, n, k, 4, layout="tiled")
    ctx = context_of(x.q.codebook, "w.q.codebook")
    return KbitExperts(None, e, n, k, tiled=tile_weight(x.q, ctx, rows=e * n))


def kbit_tile_m(rows: int, experts: int) -> int:
    avg = rows / max(1, experts)
    for bound, tile in KBIT_TILE_M_TABLE:
        if avg <= bound:
            return tile
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class KbitPlan(TileItems):
    config: MoeKbitConfig
    experts: int
    n_tiles: int

    def short(self) -> str:
        c = self.config
        return (f"MoeKbit(bits={c.bits}, tile_m={c.tile_m}, warps={c.warps_p}x{c.warps_k}, "
                f"stages={c.stages}, epilogue={c.epilogue}, {c.dtype}) n_tiles={self.n_tiles}")


def plan_kbit(arch: str, sm_count: int, dtype: str, bits: int, e: int, n: int, k: int, rows: int,
              epilogue: str = "none", tile_m: int | None = None,
              warps: tuple[int, int] | None = None, smem_limit: int | None = None) -> KbitPlan:
    """Pure planner; tile_m / warps force a choice (tests, benchmarks). `smem_limit`: the
    device's shared memory a block (None: the target's), a cap on SMEM_BUDGET[arch]."""
    check_kbit_shape(e, n, k, bits)
    check_kbit_epilogue(n, epilogue)
    if rows < 1:
        raise ValueError(f"rows={rows}: a launch needs at least one row")
    tm = kbit_tile_m(rows, e) if tile_m is None else tile_m
    if tm not in KBIT_TILE_MS:
        raise ValueError(f"tile_m={tm}: kbit experts take tile_m in {KBIT_TILE_MS}")
    if warps is not None:
        try:
            forced = tuple(warps)
        except TypeError:  # not a pair
            forced = None
        if forced not in KBIT_WARPS:
            raise ValueError(f"warps={warps!r}: kbit experts take (warps_p, warps_k) in {KBIT_WARPS}")
        warps = forced
    touched = min(e, rows)
    budget = min(SMEM_BUDGET[get_arch(arch).name], smem_cap(arch, smem_limit))
    room = budget - KBIT_LUT_BYTES - 16

    def fits(w: tuple[int, int]) -> bool:  # two stages at least
        return 2 * kbit_stage_bytes(bits, w[0], w[1], tm) <= room

    if warps is None:
        ok = [w for w in KBIT_WARPS if fits(w)]
        if not ok:
            raise UnsupportedConfigError(f"kbit experts: two stages of tile_m={tm} at {bits} bits "
                                         f"do not fit {budget} B of shared memory a block ({arch} "
                                         f"on this device, with the 32 KB table)")
        warps = ok[-1]
        for w in ok:
            if touched * -(-n // (16 * w[0])) >= MIN_CTAS_PER_SM * sm_count:
                warps = w
                break
    elif not fits(warps):
        raise ValueError(f"warps={warps}: two stages of tile_m={tm} do not fit the shared memory "
                         f"budget of {arch} on this device ({budget} B with the 32 KB table)")
    wp, wk = warps
    stages = max(2, min(MAX_STAGES, room // kbit_stage_bytes(bits, wp, wk, tm)))
    cfg = MoeKbitConfig(arch=arch, dtype=dtype, bits=bits, tile_m=tm, warps_p=wp, warps_k=wk,
                        stages=stages, min_blocks=2, epilogue=epilogue)
    return KbitPlan(cfg, e, -(-n // (16 * wp)))


@dataclass(frozen=True)
class KbitGemvPlan(ItemLaunch):
    """Tiled kbit4 experts: the config, and the warps along K (kw, a launch argument)."""

    config: MoeKbitGemvConfig
    experts: int
    n: int
    kw: int

    @property
    def n_ctas(self) -> int:
        """CTAs an expert pass: the kernel's own count (grouped_gemv.cu.jinja)."""
        c = self.config  # a unit: tpw 16-row tiles (a gate tile and its up tile with swiglu)
        units = -(-(self.n // 2 if c.epilogue == "swiglu" else self.n) // (16 * c.unit_tiles))
        return -(-units // (c.warps // self.kw))

    @property
    def pass_rows(self) -> int:
        return self.config.m_tile

    @property
    def per_pass(self) -> int:
        return self.n_ctas

    def short(self) -> str:
        c = self.config
        return (f"MoeKbitGemv(m_tile={c.m_tile}, warps={c.warps}, tpw={c.tpw}, kw={self.kw}, "
                f"depth={c.depth}, epilogue={c.epilogue}, {c.dtype}) ctas/pass={self.n_ctas}")


def plan_kbit_gemv(arch: str, sm_count: int, dtype: str, e: int, n: int, k: int, rows: int,
                   epilogue: str = "none", m_tile: int | None = None,
                   kw: int | None = None) -> KbitGemvPlan:
    """Pure planner of tiled kbit4 experts; m_tile / kw force a choice (tests, benchmarks).
    m_tile 8 where the touched experts average <= 8 rows, else 16 (passes of 16 past that);
    two 16-row tiles a warp (GEMV_TPW).
    kw: the dense GEMV's rule (fp4_gemm.select.kw_for): the largest whose CTAs, counting the
    passes uniform routing is expected to make (expected_touched, at least rows / m_tile), stay
    within one wave of 2 CTAs an SM, and whose warps keep MIN_STEPS steps of 128 k. Where that
    wave would be less than WAVE_FILL full, the kw (with MIN_STEPS) whose waves are fullest on
    average (CTAs / (waves x slots)): a CTA's warps run at a rate of their own (latency-bound),
    so slots left empty leave bandwidth unused (H100, E8 T = 4 W2: kw 2, 0.64 of one wave, 72.3
    us; kw 8, 2.55 waves (0.85 on average), 69.1 us; BENCHMARKS.md session 19)."""
    check_kbit_shape(e, n, k, 4, layout="tiled")
    check_kbit_epilogue(n, epilogue, "tiled")
    if rows < 1:
        raise ValueError(f"rows={rows}: a launch needs at least one row")
    touched = min(e, rows)
    if m_tile is None:
        m_tile = 8 if rows <= 8 * touched else 16
    if m_tile not in GEMV_M_TILES:
        raise ValueError(f"tile_m={m_tile}: tiled kbit experts take 8 or 16 tokens a pass")
    cfg = MoeKbitGemvConfig(arch=arch, dtype=dtype, m_tile=m_tile, warps=8, epilogue=epilogue,
                            tpw=GEMV_TPW)
    if kw is None:  # one wave: 2 CTAs of 8 warps an SM (16 warps an SM, <= 128 registers)
        passes = max(expected_touched(e, rows), rows / m_tile)
        units = -(-(n // 2 if epilogue == "swiglu" else n) // (16 * cfg.unit_tiles))
        steps, slots = k // K_STEP, 2 * sm_count
        kw = kw_for(units, steps, max(1, int(slots // passes)), cfg.warps)

        def ctas(kw: int) -> float:  # expected CTAs of the launch
            return passes * KbitGemvPlan(cfg, e, n, kw).n_ctas

        if ctas(kw) < WAVE_FILL * slots:
            ok = [w for w in GEMV_KWS if kw_steps_ok(w, steps, cfg.warps)]
            kw = max(ok, key=lambda w: (ctas(w) / (-(-ctas(w) // slots) * slots), -w))
    elif kw not in GEMV_KWS:
        raise ValueError(f"kw={kw}: expected one of {sorted(GEMV_KWS)}")
    return KbitGemvPlan(cfg, e, n, kw)


def expected_touched(e: int, rows: int) -> float:
    """Experts that rows drawn uniformly touch on average (tokens' top-k ids are distinct, so
    a little more in practice; skewed routing touches fewer): the planner's pass count, as the
    grid is sized for the bound min(E, rows) + rows / m_tile."""
    return e * (1.0 - (1.0 - 1.0 / e) ** rows)


@selector
def select_kbit_gemv(arch: str, sm_count: int, dtype: str, e: int, n: int, k: int, rows: int,
                     epilogue: str = "none") -> KbitGemvPlan:
    """The dispatch choice for tiled kbit4 experts (memoised; printed with
    KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_kbit_gemv(arch, sm_count, dtype, e, n, k, rows, epilogue)


@selector
def select_kbit(arch: str, sm_count: int, dtype: str, bits: int, e: int, n: int, k: int, rows: int,
                epilogue: str = "none", smem_limit: int | None = None) -> KbitPlan:
    """The dispatch choice (memoised; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_kbit(arch, sm_count, dtype, bits, e, n, k, rows, epilogue, smem_limit=smem_limit)


def kbit_prewarm(arch: str, dtypes: Iterable[str], bits_list: Iterable[int],
                 shape: tuple[int, int, int, int] | None, parts: Iterable[tuple[int, int]],
                 rows_list: Iterable[int]) -> Iterator[MoeKbitConfig]:
    """Configs select_kbit can return: for a layer shape (E, H, I, top_k) over the rows and
    parts ((SM count, shared memory a block), kernelgen.arch.parts_of) given; without a shape,
    a decode set (TILE_M 8, the widest and narrowest CTA) for each part's shared memory. At
    4 bits also the tiled layout's configs (select_kbit_gemv: m_tile 8 / 16 x both epilogues;
    kw is a launch argument)."""
    for dtype in dtypes:
        if dtype not in DTYPES:
            continue
        for bits in bits_list:
            if bits not in KBIT_BITS:
                continue
            if bits == 4:
                for m_tile in GEMV_M_TILES:
                    for epi in EPILOGUES:
                        yield MoeKbitGemvConfig(arch=arch, dtype=dtype, m_tile=m_tile, warps=8,
                                                epilogue=epi, tpw=GEMV_TPW)
            if shape is None:  # decode: TILE_M 8, the widest and the narrowest CTA
                for sms, lim in parts:
                    for wp, wk in (KBIT_WARPS[0], KBIT_WARPS[-1]):
                        for epi in EPILOGUES:
                            yield plan_kbit(arch, sms, dtype, bits, 1, 16 * wp, K_STEP, 1, epi, 8,
                                            (wp, wk), lim).config
                continue
            e, h, i, top_k = shape
            for sms, lim in parts:
                for rows in rows_list:
                    for n, k, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
                        yield plan_kbit(arch, sms, dtype, bits, e, n, k, rows, epi,
                                        smem_limit=lim).config
