"""kbit experts for the MoE grouped GEMM: quantize W [E, N, K] once (the kbit format of
kernelgen.kbit, blocks of 32 along K), then the grouped GEMM dequantizes in registers
(templates/moe/grouped_kbit.cuh, decode-oriented, always swap_ab).

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

from ..arch import smem_cap
from ..core.select import selector
from ..errors import UnsupportedConfigError
from ..kbit.api import KbitTensor, check_bits, quantize_kbit
from .config import (
    DTYPES,
    EPILOGUES,
    KBIT_BITS,
    KBIT_LUT_BYTES,
    KBIT_TILE_MS,
    KBIT_WARPS,
    MoeKbitConfig,
    kbit_stage_bytes,
)

# measured (BENCHMARKS.md): the kbit kernel is decode-bound, so TILE_M=8 stays faster than 16
# even where some experts then take two passes over their weights (E=8, top-2, T=16)
KBIT_TILE_M_TABLE: tuple[tuple[float, int], ...] = ((8.0, 8), (16.0, 16), (float("inf"), 32))
MIN_CTAS_PER_SM = 2
MAX_STAGES = 8
# shared memory (bytes) one CTA may take so that two stay resident on an SM
SMEM_BUDGET: dict[str, int] = {"sm_80": 80 * 1024, "sm_90a": 110 * 1024, "sm_100a": 110 * 1024,
                               "sm_120a": 96 * 1024}
K_STEP = 128  # K granularity: 4 blocks of 32 per lane group


@dataclass(frozen=True)
class KbitExperts:
    """Expert weights W [E, N, K] in the flat kbit layout (row e*N + n, K/32 blocks a row)."""

    q: KbitTensor
    experts: int
    n: int
    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.q, KbitTensor) or tuple(self.q.shape) != (self.experts, self.n, self.k):
            raise ValueError(f"KbitExperts: q must be a KbitTensor of shape "
                             f"({self.experts}, {self.n}, {self.k}); use quantize_experts(w)")
        check_kbit_shape(self.experts, self.n, self.k, self.q.bits)

    @property
    def bits(self) -> int:
        return self.q.bits

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.experts, self.n, self.k)


def check_kbit_shape(e: int, n: int, k: int, bits: int, name: str = "w") -> None:
    if bits not in KBIT_BITS:
        raise ValueError(f"{name}: bits={bits}; kbit experts support bits in {KBIT_BITS}")
    if e < 1 or n < 8 or n % 8 or k < K_STEP or k % K_STEP:
        raise ValueError(f"{name}: shape [E={e}, N={n}, K={k}]; kbit experts need E >= 1, N a "
                         f"positive multiple of 8 and K a positive multiple of {K_STEP}")


def check_kbit_epilogue(n: int, epilogue: str) -> None:
    """The epilogue rule: swiglu splits the N = 2I rows into gate / up halves of whole
    8-row blocks, so N must be a multiple of 16."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"activation: {epilogue!r}; expected None or 'swiglu'")
    if epilogue == "swiglu" and n % 16:
        raise ValueError(f"w: N={n}; swiglu needs 2I (gate + up rows) a multiple of 16")


def forced_kbit_plan(config: MoeKbitConfig, dtype: str, epilogue: str, bits: int, e: int,
                     n: int, k: int) -> KbitPlan:
    """The plan of a forced MoeKbitConfig (grouped_gemm(config=...)), after the rules the
    planner applies: dtype, epilogue and bits of the call, the shape and the swiglu rule."""
    if not isinstance(config, MoeKbitConfig):
        raise ValueError(f"config: {type(config).__name__}; kbit experts take a MoeKbitConfig")
    if config.dtype != dtype or config.epilogue != epilogue or config.bits != bits:
        raise ValueError(f"config: {config.short()} does not match dtype={dtype}, "
                         f"epilogue={epilogue}, bits={bits}")
    check_kbit_shape(e, n, k, bits)
    check_kbit_epilogue(n, epilogue)
    return KbitPlan(config, e, -(-n // config.tile_n))


def quantize_experts(w: Any, bits: int = 4, *, codebook: Any = None,
                     dtype: str | None = None) -> KbitExperts:
    """Quantize expert weights W [E, N, K] (fp16 / bf16 / fp32, CuPy or torch) for grouped_gemm
    and fused_moe. K must be a multiple of 128; bits 2, 3 or 4."""
    bits = check_bits(bits)
    shape = tuple(int(s) for s in getattr(w, "shape", ()))
    if len(shape) != 3:
        raise ValueError(f"w: expected expert weights [E, N, K], got shape {shape}")
    check_kbit_shape(*shape, bits)
    return KbitExperts(quantize_kbit(w, bits, codebook=codebook, dtype=dtype), *shape)


def kbit_tile_m(rows: int, experts: int) -> int:
    avg = rows / max(1, experts)
    for bound, tile in KBIT_TILE_M_TABLE:
        if avg <= bound:
            return tile
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class KbitPlan:
    config: MoeKbitConfig
    experts: int
    n_tiles: int

    def grid(self, m: int) -> tuple[int, int, int]:
        slots = -(-m // self.config.tile_m) + min(self.experts, m)
        return (slots * self.n_tiles, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.threads, 1, 1)

    @property
    def smem(self) -> int:
        return self.config.smem_bytes()

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
    touched = min(e, rows)
    budget = min(SMEM_BUDGET[arch], smem_cap(arch, smem_limit))
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
    a decode set (TILE_M 8, the widest and narrowest CTA) for each part's shared memory."""
    for dtype in dtypes:
        if dtype not in DTYPES:
            continue
        for bits in bits_list:
            if bits not in KBIT_BITS:
                continue
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
