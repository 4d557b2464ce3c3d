"""Host-side selector of the MoE grouped GEMM, as data plus one pure function.

Inputs are host-side numbers only (no GPU sync, no .item()): the rows M = T * top_k the launch
covers, E, N, K, dtype, epilogue, SM count, the device's shared memory a block (stages fitted to
it, MoeGemmConfig.of; a selected tile whose fewest stages do not fit steps down, plan_grouped).
TILE_M comes from the average rows per expert M / E:
- policy "threshold" (seed 001 §4.2 option A, the default): the first row of TILE_M_TABLE whose
  bound is >= the average;
- policy "waste" (option B): the tile that wastes the fewest padded rows on an expert holding
  ceil(M / E) rows, the larger tile on ties.
swap_ab follows SWAP_AB (tokens on the mma's n8 side up to 32 rows a tile). On sm_90a a TILE_M of
WGMMA_TILE_N runs on the wgmma main loop (templates/moe/grouped_wgmma.cuh) with that TILE_N
(unless wgmma=False forces mma.sync); there the threshold policy takes the wgmma-only TILE_M 192
in place of 128 where experts average WGMMA_TM192_BAND rows. With swap_ab the
weight tile is 32 rows, with the deep pipeline when the experts touched (at most min(E, M))
times the N tiles give fewer than FEW_CTAS_PER_SM CTAs an SM. The grid is sized from the rows of x_perm
(host shape): slots = ceil(M / TILE_M) + min(E, M) (each non-empty expert adds at most one
partial tile), so a launch is graph-safe; slots past the last tile exit at once.

Memoised and printable (KERNELGEN_PRINT_CONFIGS=1) through `kernelgen.core.select.selector`;
`prewarm_configs` walks the same function over the parts of each target (kernelgen.arch.PARTS),
so prewarm builds what dispatch can pick.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..arch import get_arch, parts_of, smem_limits
from ..core.config import KernelConfig
from ..core.select import selector
from ..errors import UnsupportedConfigError
from ..moe_routing.config import ID_DTYPES, MAX_EXPERTS, W_DTYPES
from .config import (
    DTYPES,
    EPILOGUES,
    KBIT_BITS,
    TILE_MS,
    TILE_NS,
    TILES,
    WG_TILES,
    WGMMA_ARCHS,
    MoeGemmConfig,
)

# (largest average rows per expert, TILE_M); the last row takes everything above. TILE_M=256
# stays available (forced, policy "waste") but the threshold table never picks it: at 1024
# rows per expert 128 x 256 tiles measured faster than 256 x 128 (BENCHMARKS.md).
TILE_M_TABLE: tuple[tuple[float, int], ...] = (
    (2.0, 8), (6.0, 16), (14.0, 32), (40.0, 64), (math.inf, 128))
SWAP_AB: dict[int, bool] = {8: True, 16: True, 32: True, 64: False, 128: False, 192: False,
                            256: False}
SWAP_TILE_N = 32  # weight rows of a swap_ab tile
FEW_CTAS_PER_SM = 4  # below: the deep-pipeline variant of a swap_ab row
PLAIN_TILE_N: dict[int, int] = {16: 128, 32: 128, 64: 128, 128: 256, 256: 128}
# TILE_M -> TILE_N of the wgmma path the selector takes on sm_90a (WGMMA_ARCHS) without swap_ab
WGMMA_TILE_N: dict[int, int] = {128: 256, 192: 256}
# (lo, hi]: average rows per expert where the threshold policy takes TILE_M 192 on the wgmma
# path in place of the table's 128: most experts are one 192-token tile (weights streamed once),
# where 128 needs a second, mostly empty tile. H100, uniform routing, TMA copies (BENCHMARKS.md,
# session 21): 7-26% faster at 128-160 rows, 4-7% at 192 (E256 W13 6625 vs 6892 us, E128 3292
# vs 3518), 12-19% slower at 224-256 (E256 W13 7897 vs 6918). With cp.async copies (tma=False)
# the band ends at 176: there 192 was already 5-40% slower at 192 rows (session 20).
WGMMA_TM192_BAND = (112.0, 200.0)
WGMMA_TM192_BAND_CP_ASYNC = (112.0, 176.0)
POLICIES = ("threshold", "waste")


class ItemLaunch:
    """Launch shape of the plans over find_tile's work items (GroupedPlan, moe.kbit's KbitPlan
    and KbitGemvPlan): `config` (threads, smem_bytes()), `experts`, and the plan's rows a pass
    (`pass_rows`) and CTAs a pass (`per_pass`)."""

    def slots(self, m: int) -> int:
        return item_slots(m, self.pass_rows, self.experts)

    def grid(self, m: int) -> tuple[int, int, int]:
        """1-D: the row bound's slots x CTAs a pass, expert-major in the kernel."""
        return (self.slots(m) * self.per_pass, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.config.threads, 1, 1)

    @property
    def smem(self) -> int:
        return self.config.smem_bytes()


class TileItems(ItemLaunch):
    """ItemLaunch of the tile plans (GroupedPlan, moe.kbit's KbitPlan): config.tile_m rows and
    `n_tiles` CTAs a pass."""

    @property
    def pass_rows(self) -> int:
        return self.config.tile_m

    @property
    def per_pass(self) -> int:
        return self.n_tiles


@dataclass(frozen=True)
class GroupedPlan(TileItems):
    """One launch: the config, the N tiles (CTAs a pass) and, through `grid(m)`, the slots."""

    config: MoeGemmConfig
    experts: int
    n_tiles: int

    def short(self) -> str:
        c = self.config
        wg = (", wgmma" + (" tma" if c.tma else "")) if c.wgmma else ""
        return (f"MoeGemm(tile_m={c.tile_m}, tile_n={c.tile_n}, swap_ab={c.swap_ab}{wg}, "
                f"epilogue={c.epilogue}, {c.dtype}) n_tiles={self.n_tiles} smem={self.smem}")


def item_slots(m: int, tile_m: int, experts: int) -> int:
    """Upper bound on the tile_m-row passes of m rows split over the experts (each non-empty
    expert adds at most one partial pass): the grid find_tile walks, from host shapes only."""
    return -(-m // tile_m) + min(experts, m)


def check_shape(e: int, n: int, k: int, epilogue: str, name: str = "w") -> None:
    """What the kernel needs: E >= 1, N a positive multiple of 8 (16 with swiglu: gate/up
    halves of whole 8-row blocks), K a positive multiple of 8 (16-byte row chunks)."""
    step = 16 if epilogue == "swiglu" else 8
    if e < 1 or n < step or n % step or k < 8 or k % 8:
        what = "2I (gate + up rows)" if epilogue == "swiglu" else "N"
        raise ValueError(f"{name}: shape [E={e}, N={n}, K={k}]; the MoE grouped GEMM needs E >= 1, "
                         f"{what} a positive multiple of {step} and K a positive multiple of 8")


def check_forced(config: Any, cls: type, experts: str, **call: Any) -> None:
    """A config forced on grouped_gemm(config=...): a `cls` (the kind `experts` take) whose
    fields equal the call's (dtype, epilogue, ..., and last arch: this device's), else
    ValueError naming them."""
    if not isinstance(config, cls):
        raise ValueError(f"config: {type(config).__name__}; {experts} take a {cls.__name__}")
    if any(getattr(config, f) != v for f, v in call.items()):
        raise ValueError(f"config: {config.short()} does not match "
                         f"{', '.join(f'{f}={v}' for f, v in call.items())} (this device)")


def forced_grouped(config: MoeGemmConfig, arch: str, dtype: str, epilogue: str, e: int, n: int,
                   k: int) -> GroupedPlan:
    """The plan of a forced MoeGemmConfig (bf16 / fp16 experts; grouped_gemm(config=...)):
    dtype, epilogue and arch of the call (this device), and the shape rules."""
    check_forced(config, MoeGemmConfig, "bf16 / fp16 experts", dtype=dtype, epilogue=epilogue,
                 arch=arch)
    check_shape(e, n, k, epilogue)
    return GroupedPlan(config, e, -(-n // config.tile_n))


def tile_m_for(rows: int, experts: int, policy: str = "threshold") -> int:
    """TILE_M from host-side counts only."""
    check_policy(policy)
    if policy == "waste":
        m = max(1, -(-rows // max(1, experts)))
        return min(TILE_MS, key=lambda tm: ((tm - m % tm) % tm, -tm))
    avg = rows / max(1, experts)
    for bound, tile in TILE_M_TABLE:
        if avg <= bound:
            return tile
    raise AssertionError("unreachable: the last row takes every average")


def check_policy(policy: str) -> None:
    """The TILE_M policies: "threshold" (the table) or "waste" (least padding)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: expected one of {POLICIES}")


def uses_wgmma(arch: str, tile_m: int, swap_ab: bool, tile_n: int | None = None) -> bool:
    """The selector's path choice: wgmma on WGMMA_ARCHS for a TILE_M of WGMMA_TILE_N without
    swap_ab (and a forced tile_n of WG_TILES, if any)."""
    if arch not in WGMMA_ARCHS or swap_ab or tile_m not in WGMMA_TILE_N:
        return False
    return tile_n is None or (tile_m, tile_n) in WG_TILES


def plan_grouped(arch: str, sm_count: int, dtype: str, e: int, n: int, k: int, rows: int,
                 epilogue: str = "none", tile_m: int | None = None, swap_ab: bool | None = None,
                 tile_n: int | None = None, policy: str = "threshold",
                 wgmma: bool | None = None, smem_limit: int | None = None,
                 tma: bool | None = None) -> GroupedPlan:
    """Pure planner; tile_m / swap_ab / tile_n force a table row (tests, benchmarks); wgmma
    True / False forces the main-loop path (True: a row of WG_TILES, sm_90a only; without a
    forced tile_m, a rule's TILE_M that has no wgmma row becomes the nearest that has). With
    neither tile_m nor tile_n forced, the threshold policy on sm_90a's wgmma path takes TILE_M
    192 where experts average WGMMA_TM192_BAND rows (WGMMA_TM192_BAND_CP_ASYNC with tma=False)
    and 192 x 256 keeps its stages.
    `smem_limit`: the device's shared memory a block (None: the target's); the row keeps the
    stages that fit it. Where not even its fewest stages fit, a row the rules picked (tile_m
    and tile_n not forced) steps down: the same TILE_M's narrower rows, then each smaller
    TILE_M's rows, widest first; a forced row raises UnsupportedConfigError.
    A wgmma row copies its stages by TMA (MoeGemmConfig.tma; the tensor maps describe every
    shape check_shape admits); `tma` False forces the cp.async copies, True off the wgmma
    path raises ValueError."""
    check_shape(e, n, k, epilogue)
    use_tma = tma is not False
    band = WGMMA_TM192_BAND if use_tma else WGMMA_TM192_BAND_CP_ASYNC
    if epilogue not in EPILOGUES:
        raise ValueError(f"activation: {epilogue!r}; expected None or 'swiglu'")
    if rows < 1:
        raise ValueError(f"rows={rows}: a launch needs at least one row")
    if tile_n is not None and not (isinstance(tile_n, numbers.Integral) and tile_n in TILE_NS):
        raise ValueError(f"tile_n={tile_n!r}: expected one of {TILE_NS}")
    tm = tile_m if tile_m is not None else tile_m_for(rows, e, policy)
    if (wgmma is True and tile_m is None and not swap_ab and arch in WGMMA_ARCHS
            and tm not in WGMMA_TILE_N):
        # the wgmma path forced where the rule's TILE_M has no wgmma row (few rows an expert:
        # an mma.sync swap_ab tile): the nearest TILE_M that has one
        tm = min(WGMMA_TILE_N, key=lambda m: (abs(m - tm), m))
    if (tile_m is None and tile_n is None and policy == "threshold" and tm == 128
            and not swap_ab and wgmma is not False and uses_wgmma(arch, 192, False)
            and band[0] < rows / e <= band[1]
            and _keeps_stages(arch, dtype, 192, epilogue, smem_limit, use_tma)):
        tm = 192
    wg_only = isinstance(tm, numbers.Integral) and tm in WGMMA_TILE_N  # (a list: unhashable)
    if not isinstance(tm, numbers.Integral) or tm not in TILE_MS and not (
            wg_only and uses_wgmma(arch, tm, False) and wgmma is not False and not swap_ab):
        raise ValueError(f"tile_m={tm!r}: expected one of {TILE_MS}"
                         + (f" ({tm}: the wgmma path only, on {WGMMA_ARCHS}, no swap_ab)"
                            if wg_only else ""))
    touched = min(e, rows)

    def row(tm: int, tn: int | None) -> tuple[int, bool, int, bool]:
        """(tile_m, swap_ab, tile_n, wgmma) of TILE_M by the rules (tile_n if given)."""
        swap = SWAP_AB[tm] if swap_ab is None else bool(swap_ab)
        wg = uses_wgmma(arch, tm, swap, tn) if wgmma is None else bool(wgmma)
        wg = wg or tm not in TILE_MS  # a wgmma-only TILE_M: WG_TILES names its tile_n
        if tn is None:
            tn = (WGMMA_TILE_N.get(tm, PLAIN_TILE_N.get(tm)) if wg else
                  SWAP_TILE_N if swap else PLAIN_TILE_N.get(tm))
        if tn is None and wg:
            raise ValueError(f"tile_m={tm}, wgmma=True: no wgmma tile of TILE_M {tm} (wgmma "
                             f"tiles: tile_m in {tuple(sorted({m for m, _ in WG_TILES}))}, no "
                             f"swap_ab)")
        if tn is None:
            raise ValueError(f"tile_m={tm}, swap_ab=False: TILE_M {tm} runs with swap_ab only "
                             f"(the tiles without it: tile_m in {tuple(PLAIN_TILE_N)})")
        return tm, swap, tn, wg

    def config(r: tuple[int, bool, int, bool], limit: int | None = smem_limit) -> MoeGemmConfig:
        tm, swap, tn, wg = r
        few = swap and touched * -(-n // tn) < FEW_CTAS_PER_SM * sm_count
        return MoeGemmConfig.of(arch, dtype, tm, swap, tn, epilogue, few, wg, limit,
                                tma=wg and use_tma)

    first = row(tm, tile_n)
    try:
        cfg = config(first)
    except UnsupportedConfigError as err:
        # only a table row of the target whose fewest stages do not fit the device steps down
        if tile_m is not None or tile_n is not None or smem_limit is None or not _in_table(first):
            raise
        config(first, None)  # raises what is wrong with the row itself
        # the rows below: TILE_M's narrower ones (either table), then each smaller TILE_M's
        # rows, widest first
        def widths(m: int) -> list[int]:  # TILE_M m's tile_n, either table, widest first
            return sorted({t for mm, _, t in TILES if mm == m}
                          | {t for mm, t in WG_TILES if mm == m}, reverse=True)

        below = [row(tm, t) for t in widths(tm) if t < first[2]]
        for m in sorted(TILE_MS, reverse=True):
            if m < tm:
                below += [row(m, None)] + [row(m, t) for t in widths(m)]
        cfg = _first_fit(config, [r for r in dict.fromkeys(below) if _in_table(r)], err)
    if tma and not cfg.tma:
        raise ValueError(f"tma=True: {cfg.short()} is not on the wgmma path; only its tiles "
                         f"copy by TMA (sm_90a, wgmma not False)")
    return GroupedPlan(cfg, e, -(-n // cfg.tile_n))


def _keeps_stages(arch: str, dtype: str, tm: int, epilogue: str, smem_limit: int | None,
                  tma: bool = False) -> bool:
    """The wgmma row of TILE_M tm fits the device with the stages of its WG_TILES row."""
    tn = WGMMA_TILE_N[tm]
    try:
        cfg = MoeGemmConfig.of(arch, dtype, tm, False, tn, epilogue, wgmma=True,
                               smem_limit=smem_limit, tma=tma)
    except UnsupportedConfigError:
        return False
    return cfg.stages == WG_TILES[(tm, tn)].stages


def _in_table(r: tuple[int, bool, int | None, bool]) -> bool:
    tm, swap, tn, wg = r
    return not swap and (tm, tn) in WG_TILES if wg else (tm, swap, tn) in TILES


def _first_fit(config: Any, rows: list, err: UnsupportedConfigError) -> MoeGemmConfig:
    """config(r) of the first of `rows` that fits; else `err` (the selected row's)."""
    for r in rows:
        try:
            return config(r)
        except UnsupportedConfigError:
            continue
    raise err


@selector
def select_grouped(arch: str, sm_count: int, dtype: str, e: int, n: int, k: int, rows: int,
                   epilogue: str = "none", policy: str = "threshold",
                   smem_limit: int | None = None) -> GroupedPlan:
    """The dispatch choice (memoised per argument tuple; printed with KERNELGEN_PRINT_CONFIGS=1)."""
    return plan_grouped(arch, sm_count, dtype, e, n, k, rows, epilogue, policy=policy,
                        smem_limit=smem_limit)


def _rows_to_walk(e: int, top_k: int) -> list[int]:
    """Row counts T * top_k at which a choice can change: every T up to the point where
    min(E, rows) saturates, and both sides of every TILE_M bound (both policies, and
    WGMMA_TM192_BAND's)."""
    ts = set(range(1, e + 2))
    for bound in [b for b, _ in TILE_M_TABLE[:-1]] + list(WGMMA_TM192_BAND):  # (the rules' band)
        t = int(bound * e // top_k)
        ts.update({t, t + 1, t + 2})
    for tm in TILE_MS:  # waste policy: around multiples of each tile per expert
        for mult in (1, 2, 3):
            t = tm * mult * e // top_k
            ts.update({t - 1, t, t + 1})
    ts.add(1 << 20)
    return sorted(t * top_k for t in ts if t >= 1)


def _default_set(arch: str, dtype: str, epilogue: str,
                 smem_limit: int | None = None) -> Iterator[MoeGemmConfig]:
    for tm in [t for _, t in TILE_M_TABLE] + [192]:
        swap = SWAP_AB[tm]
        if tm == 192 and not uses_wgmma(arch, tm, swap):
            continue  # a wgmma tile only
        if uses_wgmma(arch, tm, swap):  # the TMA copies, as the rules pick
            yield MoeGemmConfig.of(arch, dtype, tm, swap, WGMMA_TILE_N[tm], epilogue, wgmma=True,
                                   smem_limit=smem_limit, tma=True)
            continue
        for few in ((False, True) if swap and tm <= 16 else (False,)):
            yield MoeGemmConfig.of(arch, dtype, tm, swap, SWAP_TILE_N if swap else PLAIN_TILE_N[tm],
                                   epilogue, few, smem_limit=smem_limit)


def _layer_shapes(spec: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(E, H, I, top_k) of every layer a spec names: "shapes" [[E, H, I, top_k], ...] (the
    profile-file form) and / or the scalar keys "E", "H", "I", "top_k" (all four)."""
    keys = ("E", "H", "I", "top_k")
    given = [spec.get(kk) for kk in keys]
    if any(v is not None for v in given) and not all(v is not None for v in given):
        raise UnsupportedConfigError(f"moe spec: give all of {keys} or none, got {spec!r}")
    shapes = [tuple(given)] if all(v is not None for v in given) else []
    for sh in spec.get("shapes") or ():
        if not isinstance(sh, (list, tuple)) or len(sh) != 4:
            raise UnsupportedConfigError(f"moe spec shapes: {sh!r}; expected [E, H, I, top_k]")
        shapes.append(tuple(sh))
    out = []
    for sh in shapes:
        try:
            e, h, i, top_k = (operator.index(v) for v in sh)
        except TypeError:
            raise UnsupportedConfigError(f"moe spec: layer {list(sh)}: E, H, I, top_k must be "
                                         f"integers") from None
        if min(e, h, i, top_k) < 1:
            raise UnsupportedConfigError(f"moe spec: layer {list(sh)}: E, H, I, top_k must be >= 1")
        if e > MAX_EXPERTS:  # (its row walk is O(E): E = 10**9 ran out of memory)
            raise UnsupportedConfigError(f"moe spec: layer {list(sh)}: E={e}; fused_moe's routing "
                                         f"takes num_experts in 1..{MAX_EXPERTS}")
        out.append((e, h, i, top_k))
    return out


# prewarm_configs' spec keys and values (Family.spec_keys)
SPEC_KEYS = {"shapes": None, "E": None, "H": None, "I": None, "top_k": None, "dtypes": DTYPES,
             "bits": KBIT_BITS, "policy": POLICIES, "sm_counts": None, "id_dtypes": ID_DTYPES,
             "w_dtypes": W_DTYPES}


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator[KernelConfig]:
    """Configs dispatch can pick. spec: the layers, as "shapes" [[E, H, I, top_k], ...] or the
    keys "E", "H", "I", "top_k" (walk the two GEMMs of each layer, W13 + SwiGLU and W2, over
    every batch size and SM count); "dtypes"; "bits" (kbit experts: 2, 3, 4; with layers it
    adds their kbit configs to the bf16 / fp16 ones); "policy"; "sm_counts" (default: the
    parts of each arch, kernelgen.arch.parts_of; each part's shared memory); with layers also
    the moe_routing kernels fused_moe launches for them (layout, dispatch, combine; "id_dtypes"
    and "w_dtypes" as moe_routing's spec), so `kernelgen prewarm --family moe` covers
    fused_moe. Without layers: the default table for each dtype and epilogue plus a kbit
    decode set (4 bits unless "bits" says otherwise); moe_routing's own default set covers
    the routing kernels then."""
    from .kbit import kbit_prewarm

    dtypes = tuple(d for d in (spec.get("dtypes") or DTYPES) if d in DTYPES)
    layers = _layer_shapes(spec)
    policy = spec.get("policy") or "threshold"
    if isinstance(policy, (list, tuple)) and len(policy) == 1:  # profile files hold lists
        policy = policy[0]
    if policy not in POLICIES:
        raise UnsupportedConfigError(f"moe spec: policy={policy!r}; expected one of {POLICIES}")
    bits_list = [int(b) for b in spec.get("bits") or ()]
    seen: set[KernelConfig] = set()

    def new(cfgs: Iterable[KernelConfig]) -> Iterator[KernelConfig]:
        for cfg in cfgs:
            if cfg not in seen:
                seen.add(cfg)
                yield cfg

    for arch in archs:
        get_arch(arch)
        if not layers:
            for lim in smem_limits(arch):  # the stages of each part's shared memory
                for dtype in dtypes:
                    for epi in EPILOGUES:
                        yield from new(_default_set(arch, dtype, epi, lim))
                yield from new(kbit_prewarm(arch, dtypes, bits_list or [4], None, ((132, lim),), ()))
            continue
        parts = parts_of(arch, spec.get("sm_counts"))
        for e, h, i, top_k in layers:
            rows_list = _rows_to_walk(e, top_k)
            try:
                if bits_list:
                    yield from new(kbit_prewarm(arch, dtypes, bits_list, (e, h, i, top_k),
                                                parts, rows_list))
                for dtype in dtypes:
                    for sms, lim in parts:
                        for rows in rows_list:
                            for n, k, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
                                yield from new((plan_grouped(arch, sms, dtype, e, n, k, rows, epi,
                                                             policy=policy, smem_limit=lim).config,))
            except ValueError as err:
                if isinstance(err, UnsupportedConfigError):
                    raise
                raise UnsupportedConfigError(f"moe spec {spec!r}: {err}") from None
        yield from new(_routing_configs(arch, layers, dtypes, spec))


def _routing_configs(arch: str, layers: list[tuple[int, int, int, int]], dtypes: tuple[str, ...],
                     spec: dict[str, Any]) -> Iterator[KernelConfig]:
    """The moe_routing configs fused_moe can pick for these layers: moe_layout (pad_to=1, every
    T), moe_dispatch, moe_combine (fused_moe never calls the fused moe_route)."""
    from ..moe_routing.config import MoeRouteConfig
    from ..moe_routing.select import prewarm_configs as routing_prewarm

    rspec: dict[str, Any] = {"num_experts": sorted({e for e, *_ in layers}), "dtypes": list(dtypes)}
    for key in ("id_dtypes", "w_dtypes"):
        if spec.get(key):
            rspec[key] = spec[key]
    try:
        for cfg in routing_prewarm([arch], rspec):
            if not isinstance(cfg, MoeRouteConfig):
                yield cfg
    except ValueError as err:
        if isinstance(err, UnsupportedConfigError):
            raise
        raise UnsupportedConfigError(f"moe spec {spec!r}: {err}") from None
