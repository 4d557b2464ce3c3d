"""MoE grouped GEMM without a GPU: configs, tile table, selector (thresholds, waste policy,
swap_ab, tile_n, grid bound), prewarm sets, the NumPy references, shape errors."""

import math
from dataclasses import replace

import numpy as np
import pytest

from kernelgen.errors import UnsupportedConfigError
from kernelgen.moe import reference as MR
from kernelgen.moe.config import TILES, WG_TILES, MoeGemmConfig, MoeKbitGemvConfig
from kernelgen.moe.select import (
    SWAP_AB,
    TILE_M_TABLE,
    WGMMA_TILE_N,
    WGMMA_TM192_BAND,
    plan_grouped,
    prewarm_configs,
    select_grouped,
    tile_m_for,
)

SHAPES = {"E128": (128, 7168, 2048, 8), "E256": (256, 7168, 2048, 8), "E8": (8, 4096, 14336, 2)}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a", "sm_120a"])
def test_every_table_row_is_a_valid_config(arch):
    for (tm, sw, tn) in TILES:
        for epi in ("none", "swiglu"):
            cfg = MoeGemmConfig.of(arch, "bfloat16", tm, sw, tn, epi)
            assert cfg.tile_m == tm and cfg.swap_ab == sw and cfg.tile_n == tn
            assert cfg.smem_bytes() <= {"sm_120a": 99 * 1024}.get(arch, 163 * 1024), cfg


def test_config_rules():
    with pytest.raises(UnsupportedConfigError, match="tile_m=8 needs swap_ab=True"):
        MoeGemmConfig(arch="sm_90a", tile_m=8, swap_ab=False)
    with pytest.raises(UnsupportedConfigError, match="tile_m=12"):
        MoeGemmConfig(arch="sm_90a", tile_m=12)
    with pytest.raises(UnsupportedConfigError, match="dtype='float32'"):
        MoeGemmConfig(arch="sm_90a", dtype="float32")
    with pytest.raises(UnsupportedConfigError, match="epilogue='gelu'"):
        MoeGemmConfig(arch="sm_90a", epilogue="gelu")
    with pytest.raises(UnsupportedConfigError, match="16-row side"):
        MoeGemmConfig(arch="sm_90a", tile_m=16, tile_n=128, warps_p=2, warps_q=4)
    assert MoeGemmConfig.of("sm_90a", "bfloat16", 8, True, 32, few=True).stages == 8
    with pytest.raises(UnsupportedConfigError, match="gate/up n8 pairs"):
        MoeGemmConfig(arch="sm_90a", tile_m=128, tile_n=32, warps_p=2, warps_q=4, epilogue="swiglu")
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        MoeGemmConfig(arch="sm_120a", tile_m=256, tile_n=128, warps_p=4, warps_q=2, stages=4)
    with pytest.raises(UnsupportedConfigError, match="no MoE tile"):
        MoeGemmConfig.of("sm_90a", "bfloat16", 64, True, 64)
    # every variant is its own cache entry: the fields that differ reach the canonical JSON
    a = MoeGemmConfig.of("sm_90a", "bfloat16", 8, True, 64)
    b = MoeGemmConfig.of("sm_90a", "bfloat16", 16, True, 64)
    c = MoeGemmConfig.of("sm_90a", "bfloat16", 8, True, 64, "swiglu")
    assert len({a.to_json(), b.to_json(), c.to_json()}) == 3


def test_wgmma_config_rules():
    for (tm, tn), shape in WG_TILES.items():
        for epi in ("none", "swiglu"):
            cfg = MoeGemmConfig.of("sm_90a", "float16", tm, False, tn, epi, wgmma=True)
            assert cfg.wgmma and (cfg.warps_p, cfg.warps_q, cfg.warps_k) == (tm // 16, 1, 1)
            assert cfg.threads == 2 * tm and cfg.stages == shape.stages >= 3
            assert cfg.smem_bytes() == cfg.stages * (tm + tn) * 128 + 1024 + 16
            # one CTA an SM at least, min_blocks of them where the table asks for more
            assert cfg.min_blocks * (cfg.smem_bytes() + 1024) <= 228 * 1024, cfg
        for arch in ("sm_80", "sm_100a", "sm_120a"):
            with pytest.raises(UnsupportedConfigError, match="wgmma .warpgroup MMA. exists only on"):
                MoeGemmConfig.of(arch, "bfloat16", tm, False, tn, wgmma=True)
    base = dict(arch="sm_90a", tile_m=128, tile_n=256, warps_p=8, warps_q=1, warps_k=1, stages=4,
                wgmma=True)
    MoeGemmConfig(**base)
    with pytest.raises(UnsupportedConfigError, match="swap_ab=False"):
        MoeGemmConfig(**{**base, "swap_ab": True})
    with pytest.raises(UnsupportedConfigError, match="wgmma tiles take tile_n"):
        MoeGemmConfig(**{**base, "tile_n": 32})
    with pytest.raises(UnsupportedConfigError, match="wgmma tiles take tile_m"):
        MoeGemmConfig(**{**base, "tile_m": 32, "warps_p": 2})
    with pytest.raises(UnsupportedConfigError, match=r"must be \(8, 1, 1\)"):
        MoeGemmConfig(**{**base, "warps_p": 2, "warps_q": 4})
    with pytest.raises(UnsupportedConfigError, match="at least 3 stages"):
        MoeGemmConfig(**{**base, "stages": 2})
    assert MoeGemmConfig(**{**base, "stages": 2, "inflight": 0}).inflight == 0
    with pytest.raises(UnsupportedConfigError, match="inflight=2"):
        MoeGemmConfig(**{**base, "inflight": 2})
    with pytest.raises(UnsupportedConfigError, match="only the wgmma path"):
        MoeGemmConfig(arch="sm_90a", inflight=0)
    with pytest.raises(UnsupportedConfigError, match="only the wgmma path has a producer"):
        MoeGemmConfig(arch="sm_90a", producer=True)
    ws = MoeGemmConfig(**{**base, "producer": True})
    assert ws.threads == 384 and ws.smem_bytes() == 4 * 384 * 128 + 1024 + 16 * 4 + 16
    with pytest.raises(UnsupportedConfigError, match="640 threads"):
        MoeGemmConfig(**{**base, "tile_m": 256, "tile_n": 128, "warps_p": 16, "producer": True})
    # 192 x 256 with a producer: 512 threads, 128 registers, 128 accumulators a thread
    with pytest.raises(UnsupportedConfigError, match="128 fp32 accumulators a thread"):
        MoeGemmConfig(**{**base, "tile_m": 192, "warps_p": 12, "producer": True})
    assert MoeGemmConfig(**{**base, "tile_m": 192, "tile_n": 128, "warps_p": 12,
                            "producer": True}).threads == 512
    with pytest.raises(UnsupportedConfigError, match="no MoE wgmma tile"):
        MoeGemmConfig.of("sm_90a", "bfloat16", 64, False, 128, wgmma=True)
    # 256-token tiles (4 warpgroups, 512 threads) are valid configs outside the table
    assert MoeGemmConfig(**{**base, "tile_m": 256, "tile_n": 128, "warps_p": 16}).threads == 512
    # TMA copies: the wgmma path without a producer; two mbarriers (8 bytes each) a stage
    with pytest.raises(UnsupportedConfigError, match="only the wgmma path copies by TMA"):
        MoeGemmConfig(arch="sm_90a", tma=True)
    with pytest.raises(UnsupportedConfigError, match="no producer warpgroup"):
        MoeGemmConfig(**{**base, "producer": True, "tma": True})
    assert MoeGemmConfig(**{**base, "tma": True}).smem_bytes() == 4 * 384 * 128 + 1024 + 16 * 4 + 16
    assert MoeGemmConfig(**{**base, "tma": True}).to_json() != MoeGemmConfig(**base).to_json()
    # the path is part of the cache key
    assert MoeGemmConfig(**base).to_json() != MoeGemmConfig(**{**base, "wgmma": False,
                                                               "warps_p": 2, "warps_q": 4}).to_json()


def test_wgmma_selector():
    """sm_90a takes wgmma for the TILE_Ms of WGMMA_TILE_N (prefill), no other arch does;
    wgmma=False / True force the path, a forced tile_n outside WG_TILES stays on mma.sync."""
    e, h, i, k = SHAPES["E128"]
    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_120a"):
        for n, kk, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
            p = select_grouped(arch, 132, "bfloat16", e, n, kk, 4096 * k, epi)
            assert p.config.wgmma == (arch == "sm_90a"), (arch, p.short())
            if arch == "sm_90a":
                assert p.config.tile_m == 128 and p.config.tile_n == WGMMA_TILE_N[128]
                assert "wgmma" in p.short()
            d = select_grouped(arch, 132, "bfloat16", e, n, kk, 4 * k, epi)  # decode
            assert not d.config.wgmma, d.short()
    p = plan_grouped("sm_90a", 132, "bfloat16", e, h, i, 4096 * k, wgmma=False)
    assert not p.config.wgmma and p.config.tile_m == 128 and p.config.tile_n == 256
    p = plan_grouped("sm_90a", 132, "bfloat16", e, h, i, 4096 * k, tile_n=128)
    assert p.config.wgmma and p.config.tile_n == 128 and p.n_tiles == h // 128
    p = plan_grouped("sm_90a", 132, "bfloat16", e, h, i, 4096 * k, tile_m=64)
    assert not p.config.wgmma  # 64-token tiles stay on mma.sync
    with pytest.raises(ValueError, match="exists only on"):
        plan_grouped("sm_80", 132, "bfloat16", e, h, i, 4096 * k, wgmma=True)
    with pytest.raises(ValueError, match="no MoE wgmma tile"):
        plan_grouped("sm_90a", 132, "bfloat16", e, h, i, 4096 * k, tile_m=16, wgmma=True)
    # wgmma=True without a tile_m where the rule takes a swap_ab mma.sync TILE_M (a few rows an
    # expert) or 256: the nearest TILE_M with a wgmma tile
    for rows, policy, want in ((4 * k, "threshold", 128), (37, "threshold", 128),
                               (4096 * 64, "waste", 192)):
        assert tile_m_for(rows, e, policy) not in WGMMA_TILE_N
        p = plan_grouped("sm_90a", 132, "bfloat16", e, h, i, rows, wgmma=True, policy=policy)
        assert (p.config.tile_m, p.config.wgmma, p.config.swap_ab) == (want, True, False), p.short()
    with pytest.raises(ValueError, match="no wgmma tile of TILE_M 8"):
        plan_grouped("sm_90a", 132, "bfloat16", e, h, i, 4 * k, swap_ab=True, wgmma=True)


def test_wgmma_tile_m_192_band():
    """sm_90a's threshold policy takes the wgmma-only TILE_M 192 for averages in
    WGMMA_TM192_BAND (lo, hi] and 128 on either side; no other arch, policy, forced path /
    tile_n, or a device where 192 x 256 loses stages does; forced 192 plans on sm_90a's wgmma
    path and is a clear error elsewhere."""
    e, h, i, k = SHAPES["E256"]
    lo, hi = WGMMA_TM192_BAND
    cases = [(int(lo * e), 128), (int(lo * e) + 1, 192), (int(hi * e), 192),
             (int(hi * e) + 1, 128)]
    for rows, tm in cases:
        for n, kk, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
            p = select_grouped("sm_90a", 132, "bfloat16", e, n, kk, rows, epi)
            assert (p.config.tile_m, p.config.tile_n, p.config.wgmma) == (
                tm, WGMMA_TILE_N[tm], True), (rows, p.short())
            if tm == 192:
                assert p.config.inflight == 0 and p.config.stages == 4, p.short()
            for arch in ("sm_80", "sm_100a", "sm_120a"):
                assert select_grouped(arch, 132, "bfloat16", e, n, kk, rows, epi).config.tile_m \
                    == 128
            for kw in ({"wgmma": False}, {"policy": "waste"}, {"tile_n": 128}, {"tile_n": 256},
                       {"smem_limit": 200 * 1024}):
                q = plan_grouped("sm_90a", 132, "bfloat16", e, n, kk, rows, epi, **kw)
                assert q.config.tile_m != 192, (kw, q.short())
    p = plan_grouped("sm_90a", 132, "bfloat16", 8, 256, 512, 100, tile_m=192)
    assert (p.config.tile_m, p.config.wgmma, p.n_tiles) == (192, True, 1)
    for arch, kw in (("sm_80", {}), ("sm_90a", {"wgmma": False}), ("sm_90a", {"swap_ab": True})):
        with pytest.raises(ValueError, match="tile_m=192: .*the wgmma path only"):
            plan_grouped(arch, 132, "bfloat16", 8, 256, 512, 100, tile_m=192, **kw)
    with pytest.raises(ValueError, match=r"no MoE wgmma tile .*\(tile_m=192, tile_n=256\)"):
        plan_grouped("sm_90a", 132, "bfloat16", 8, 256, 512, 100, tile_m=192, tile_n=128)
    # a part whose blocks get 99 KB: the 225 KB tile steps down to wgmma 128 x 128
    p = plan_grouped("sm_90a", 132, "bfloat16", e, 2 * i, h, 128 * e, "swiglu",
                     smem_limit=99 * 1024)
    assert (p.config.tile_m, p.config.tile_n, p.config.wgmma) == (128, 128, True), p.short()


def test_tile_m_threshold_policy():
    # option A: average rows per expert against the table's bounds
    e = 128
    for bound, tile in TILE_M_TABLE[:-1]:
        rows = int(bound * e)
        assert tile_m_for(rows, e) == tile, (bound, tile)
    assert tile_m_for(1, 128) == 8
    assert tile_m_for(10**7, 8) == 128  # 256 only forced or by the waste policy
    prev = 0
    for rows in range(1, 100_000, 97):  # monotone in the rows
        tm = tile_m_for(rows, 64)
        assert tm >= prev
        prev = tm


def test_tile_m_waste_policy():
    assert tile_m_for(8 * 256, 8, "waste") == 256  # no waste anywhere: the largest tile
    assert tile_m_for(8 * 96, 8, "waste") == 32  # 96 = 3 x 32: 32 wastes 0, 64 wastes 32
    assert tile_m_for(8 * 1, 8, "waste") == 8
    with pytest.raises(ValueError, match="policy='max'"):
        tile_m_for(8, 8, "max")


def test_selector_decode_and_prefill_choices():
    for name, (e, h, i, k) in SHAPES.items():
        for t in (1, 2, 4, 8, 16):
            for n, kk, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
                p = select_grouped("sm_90a", 132, "bfloat16", e, n, kk, t * k, epi)
                assert p.config.swap_ab and p.config.tile_m <= 16, (name, t, p.short())
        p = select_grouped("sm_90a", 132, "bfloat16", e, 2 * i, h, 4096 * k, "swiglu")
        assert not p.config.swap_ab and p.config.tile_m >= 128, (name, p.short())
    # few CTAs (2 experts x 128 tiles on 132 SMs): the deep-pipeline variant
    p = plan_grouped("sm_90a", 132, "bfloat16", 8, 4096, 14336, 2)
    assert p.config.tile_n == 32 and p.n_tiles == 128 and p.config.stages == 8
    p = plan_grouped("sm_90a", 132, "bfloat16", 128, 4096, 7168, 8)
    assert p.config.stages == 4
    assert SWAP_AB[8] and not SWAP_AB[128]


def test_grid_bounds_every_tile():
    """grid.x = ceil(M / TILE_M) + min(E, M) covers the tiles of any split of M rows."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        e = int(rng.integers(1, 300))
        m = int(rng.integers(1, 5000))
        cuts = np.sort(rng.integers(0, m + 1, e - 1))
        counts = np.diff(np.concatenate([[0], cuts, [m]]))
        for tm in (8, 16, 32, 64, 128, 192, 256):
            p = plan_grouped("sm_90a", 132, "float16", e, 256, 256, m, tile_m=tm)
            need = int(sum(-(-c // tm) for c in counts))
            assert need <= p.slots(m), (e, m, tm)


def test_forced_rows_and_errors():
    p = plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 100, tile_m=16, swap_ab=False)
    assert p.config.tile_m == 16 and not p.config.swap_ab and p.config.tile_n == 128
    with pytest.raises(ValueError, match="no MoE tile"):
        plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 100, tile_m=64, swap_ab=True)
    with pytest.raises(ValueError, match="tile_m=12"):
        plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 100, tile_m=12)
    with pytest.raises(ValueError, match="K a positive multiple of 8"):
        plan_grouped("sm_90a", 132, "float16", 8, 256, 250, 100)
    with pytest.raises(ValueError, match=r"2I \(gate \+ up rows\) a positive multiple of 16"):
        plan_grouped("sm_90a", 132, "float16", 8, 200, 256, 100, "swiglu")
    with pytest.raises(ValueError, match="rows=0"):
        plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 0)
    # grouped_gemm hands tile_m / tile_n over as given: tile_n 0 was a ZeroDivisionError, a
    # string or list tile_n / tile_m a TypeError
    for bad in (0, 100, "128", [128], 128.0):
        with pytest.raises(ValueError, match=r"tile_n=.*: expected one of \(32, 64, 128, 256\)"):
            plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 100, tile_n=bad)
    for bad in ("64", [64], 64.0):
        with pytest.raises(ValueError, match=r"tile_m=.*: expected one of \(8, 16"):
            plan_grouped("sm_90a", 132, "float16", 8, 256, 256, 100, tile_m=bad)


def test_prewarm_default_set_is_modest_and_valid():
    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_120a"):
        cfgs = list(prewarm_configs([arch], {}))
        assert 0 < len(cfgs) <= 48 and len(set(cfgs)) == len(cfgs)  # 8 of them tiled kbit4
        assert len([c for c in cfgs if isinstance(c, MoeKbitGemvConfig)]) == 8
        assert {c.epilogue for c in cfgs} == {"none", "swiglu"}
        wg_tiles = {(tm, WGMMA_TILE_N[tm]) for tm in (128, 192)} if arch == "sm_90a" else set()
        assert {c.tile_m for c in cfgs if isinstance(c, MoeGemmConfig)} == (
            {8, 16, 32, 64, 128} | {tm for tm, _ in wg_tiles})
        wg = {(c.tile_m, c.tile_n) for c in cfgs if isinstance(c, MoeGemmConfig) and c.wgmma}
        assert wg == wg_tiles, (arch, wg)


@pytest.mark.parametrize("name", list(SHAPES))
def test_prewarm_spec_is_what_dispatch_picks(name):
    e, h, i, k = SHAPES[name]
    spec = {"E": e, "H": h, "I": i, "top_k": k, "dtypes": ["bfloat16"], "sm_counts": [132]}
    pre = set(prewarm_configs(["sm_90a"], spec))
    picked = set()
    for t in list(range(1, 600)) + [1000, 4096, 5000, 65536, 10**6]:
        for n, kk, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
            picked.add(plan_grouped("sm_90a", 132, "bfloat16", e, n, kk, t * k, epi).config)
    assert picked <= pre, sorted(c.short() for c in picked - pre)
    with pytest.raises(UnsupportedConfigError, match="give all of"):
        list(prewarm_configs(["sm_90a"], {"E": 8}))
    # the profile-file form: a list of layers, list-valued policy
    spec2 = {"shapes": [[e, h, i, k]], "dtypes": ["bfloat16"], "sm_counts": [132],
             "policy": ["threshold"]}
    assert set(prewarm_configs(["sm_90a"], spec2)) == pre
    with pytest.raises(UnsupportedConfigError, match=r"expected \[E, H, I, top_k\]"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[8, 4096]]}))
    with pytest.raises(UnsupportedConfigError, match="multiple of 16"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[8, 4096, 100, 2]]}))


def test_reference_grouped_gemm_and_layer():
    rng = np.random.default_rng(1)
    e, h, i, t, k = 5, 16, 8, 7, 3
    ids = rng.integers(0, e, (t, k))
    ids[0] = [2, 2, 2]  # duplicates count once each
    offsets, dest = MR.layout(ids, e)
    assert offsets[-1] == t * k and np.all(np.diff(offsets) >= 0)
    flat = ids.reshape(-1)
    # stable: rows of an expert in increasing flat index
    for ex in range(e):
        rows = np.sort(dest[flat == ex])
        assert np.array_equal(rows, np.arange(offsets[ex], offsets[ex + 1]))
        assert np.all(np.diff(np.nonzero(flat == ex)[0]) > 0)
    x = rng.standard_normal((t, h))
    w13 = rng.standard_normal((e, 2 * i, h))
    w2 = rng.standard_normal((e, h, i))
    wts = rng.random((t, k))
    out = MR.fused_moe(x, ids, wts, w13, w2)
    for tok in range(t):
        want = np.zeros(h)
        for j in range(k):
            ex = ids[tok, j]
            g, u = w13[ex, :i] @ x[tok], w13[ex, i:] @ x[tok]
            want += wts[tok, j] * (w2[ex] @ (g / (1 + np.exp(-g)) * u))
        np.testing.assert_allclose(out[tok], want, rtol=1e-12, atol=1e-12)
    # grouped GEMM: rows outside the segments are NaN
    xp = rng.standard_normal((offsets[-1] + 2, h))
    y = MR.grouped_gemm(xp, w13, offsets, "swiglu")
    assert np.isnan(y[-2:]).all() and np.isfinite(y[:-2]).all() and y.shape == (xp.shape[0], i)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\)"):
        MR.layout(np.array([[5]]), e)


def test_reference_rounding_helpers():
    v = np.array([1.0 + 2**-9, 3.0, -0.5])
    assert MR.round_to(v, "bfloat16")[0] == 1.0  # ties to even at bf16's 8 bits
    assert MR.round_to(v, "float16")[0] == 1.0 + 2**-9
    assert math.isclose(MR.silu(np.array([0.0]))[0], 0.0)


def test_kbit_configs_and_selector():
    from kernelgen.moe import plan_kbit, select_kbit
    from kernelgen.moe.config import KBIT_WARPS, MoeKbitConfig

    for arch in ("sm_80", "sm_90a", "sm_100a", "sm_120a"):
        for bits in (2, 3, 4):
            for tm in (8, 16, 32):
                for warps in KBIT_WARPS:
                    try:
                        p = plan_kbit(arch, 132, "bfloat16", bits, 8, 4096, 7168, 8, "swiglu", tm,
                                      warps)
                    except ValueError as err:
                        assert "do not fit the shared memory" in str(err) and warps != KBIT_WARPS[0]
                        continue
                    assert 2 <= p.config.stages <= 8 and p.config.tile_m == tm
                p = plan_kbit(arch, 132, "bfloat16", bits, 8, 4096, 14336, 8 * 64)  # auto fits
                assert p.config.tile_m == 32
    with pytest.raises(UnsupportedConfigError, match="bits=5"):
        MoeKbitConfig(arch="sm_90a", bits=5)
    with pytest.raises(UnsupportedConfigError, match="tile_m=64"):
        MoeKbitConfig(arch="sm_90a", tile_m=64)
    with pytest.raises(UnsupportedConfigError, match=r"\(warps_p, warps_k\)"):
        MoeKbitConfig(arch="sm_90a", warps_p=8, warps_k=2)
    # decode: wide CTAs when the experts touched fill the GPU, k-split when they do not
    assert select_kbit("sm_90a", 132, "bfloat16", 4, 128, 4096, 7168, 64, "swiglu").config.warps_p == 8
    assert select_kbit("sm_90a", 132, "bfloat16", 4, 8, 4096, 14336, 2).config.warps_k == 4
    with pytest.raises(ValueError, match="K a positive multiple of 128"):
        plan_kbit("sm_90a", 132, "bfloat16", 4, 8, 256, 200, 8)
    # a forced warps that is not a row of KBIT_WARPS was TypeError / IndexError / KeyError (8,
    # "x", {}), an unknown arch a KeyError of SMEM_BUDGET
    assert plan_kbit("sm_90a", 132, "bfloat16", 4, 8, 256, 256, 8, warps=[4, 2]).config.warps_k == 2
    for bad in (8, (8,), "x", {}, (8, 2)):
        with pytest.raises(ValueError, match=r"warps=.*: kbit experts take \(warps_p, warps_k\) in"):
            plan_kbit("sm_90a", 132, "bfloat16", 4, 8, 256, 256, 8, warps=bad)
    with pytest.raises(UnsupportedConfigError, match="arch='sm_75': not a kernelgen target"):
        plan_kbit("sm_75", 132, "bfloat16", 4, 8, 256, 256, 8)


def test_kbit_prewarm_is_what_dispatch_picks():
    from kernelgen.moe import plan_kbit

    e, h, i, k = SHAPES["E8"]
    spec = {"E": e, "H": h, "I": i, "top_k": k, "dtypes": ["bfloat16"], "sm_counts": [132],
            "bits": [4]}
    pre = set(prewarm_configs(["sm_90a"], spec))
    for t in list(range(1, 300)) + [4096, 10**5]:
        for n, kk, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
            assert plan_kbit("sm_90a", 132, "bfloat16", 4, e, n, kk, t * k, epi).config in pre


def test_reference_dequantize_experts():
    from kernelgen.kbit import reference as KR

    rng = np.random.default_rng(2)
    e, n, k, bits = 2, 3, 64, 4
    w = rng.standard_normal((e, n, k)).astype(np.float32)
    cb = KR.create_normal_float_codebook(bits)
    packed, _, absmax = KR.quantize(w.reshape(-1), bits, cb)
    w64 = MR.dequantize_experts(packed, absmax, cb, bits, (e, n, k))
    flat = KR.dequantize(packed, absmax, cb, bits, e * n * k)
    np.testing.assert_array_equal(w64.reshape(-1).astype(np.float32), flat)
    assert np.abs(w64 - w).max() < 0.5 * np.abs(w).max()


def test_kbit_pair_codes_model():
    """The pair-code construction of templates/moe/grouped_kbit.cuh (make_codes) and its table,
    modelled on Python ints: byte r of le / he / lo / ho = elements (8r, 8r+1) / (8r+2, 8r+3) /
    (8r+4, 8r+5) / (8r+6, 8r+7), bit 2b + i = plane b of element i."""
    m2, m4, mask = 0x33333333, 0x0F0F0F0F, 0xFFFFFFFF

    def bitsel(m, a, b):
        return ((a & m) | (b & ~m)) & mask

    def codes(w, bits):
        l01, h01 = bitsel(m2, w[0], (w[1] << 2) & mask), bitsel(m2, w[0] >> 2, w[1])
        if bits == 2:
            return l01 & m4, h01 & m4, (l01 >> 4) & m4, (h01 >> 4) & m4
        l23 = (w[2] & m2) if bits == 3 else bitsel(m2, w[2], (w[3] << 2) & mask)
        h23 = ((w[2] >> 2) & m2) if bits == 3 else bitsel(m2, w[2] >> 2, w[3])
        return (bitsel(m4, l01, (l23 << 4) & mask), bitsel(m4, h01, (h23 << 4) & mask),
                bitsel(m4, l01 >> 4, l23), bitsel(m4, h01 >> 4, h23))

    rng = np.random.default_rng(3)
    for bits in (2, 3, 4):
        lut = [(sum(((c >> (2 * b)) & 1) << b for b in range(4)) & ((1 << bits) - 1),
                sum(((c >> (2 * b + 1)) & 1) << b for b in range(4)) & ((1 << bits) - 1))
               for c in range(256)]
        for _ in range(20):
            idx = rng.integers(0, 1 << bits, 32)
            w = [int(sum(((int(idx[j]) >> b) & 1) << j for j in range(32))) for b in range(bits)]
            got = np.empty(32, np.int64)
            for word, off in zip(codes(w, bits), (0, 2, 4, 6), strict=True):
                for r in range(4):
                    got[8 * r + off: 8 * r + off + 2] = lut[(word >> (8 * r)) & 0xFF]
            assert np.array_equal(got, idx), bits


def test_kbit_mma_fragment_order_model():
    """grouped_kbit.cuh feeds lane (g, t) the weight pairs (8r, 8r+1 | 8r+2, 8r+3), then
    (8r+4, 8r+5 | 8r+6, 8r+7) of its block t, and X's 16-byte chunk of the same 8 k as b0 / b1:
    assembled by the m16n8k16 fragment layout, the 8 mmas of a 128-k sub-range give W . X^T."""
    rng = np.random.default_rng(4)
    w, x = rng.standard_normal((16, 128)), rng.standard_normal((8, 128))
    d = np.zeros((16, 8))
    for r in range(4):
        for step in range(2):
            a, b = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                e0 = 32 * t + 8 * r + (4 if step else 0)
                e1 = e0 + 2
                for row in (g, g + 8):  # a0 / a1 at k-slots 2t, 2t+1; a2 / a3 at 2t+8, 2t+9
                    a[row, 2 * t:2 * t + 2], a[row, 2 * t + 8:2 * t + 10] = w[row, e0:e0 + 2], w[row, e1:e1 + 2]
                b[2 * t:2 * t + 2, g], b[2 * t + 8:2 * t + 10, g] = x[g, e0:e0 + 2], x[g, e1:e1 + 2]
            assert not np.isnan(a).any() and not np.isnan(b).any()
            d += a @ b
    np.testing.assert_allclose(d, w @ x.T, rtol=1e-12, atol=1e-12)



def test_forced_kbit_config_follows_the_planner_rules():
    from kernelgen.moe import plan_kbit
    from kernelgen.moe.config import MoeKbitConfig
    from kernelgen.moe.kbit import forced_kbit_plan

    cfg = MoeKbitConfig(arch="sm_90a", dtype="bfloat16", bits=4, warps_p=4, warps_k=2,
                        epilogue="swiglu")
    p = forced_kbit_plan(cfg, "sm_90a", "bfloat16", "swiglu", 4, 8, 256, 512)
    assert p.config is cfg and p.n_tiles == 256 // 64
    for n in (24, 40):  # multiples of 8, not of 16: the planner and a forced config refuse both
        with pytest.raises(ValueError, match=r"swiglu needs 2I \(gate \+ up rows\) a multiple of 16"):
            forced_kbit_plan(cfg, "sm_90a", "bfloat16", "swiglu", 4, 8, n, 512)
        with pytest.raises(ValueError, match="a multiple of 16"):
            plan_kbit("sm_90a", 132, "bfloat16", 4, 8, n, 512, 8, "swiglu")
        assert forced_kbit_plan(cfg.replace(epilogue="none"), "sm_90a", "bfloat16", "none", 4, 8,
                                n, 512).n_tiles == 1
    with pytest.raises(ValueError, match="does not match dtype=float16"):
        forced_kbit_plan(cfg, "sm_90a", "float16", "swiglu", 4, 8, 256, 512)
    with pytest.raises(ValueError, match="bits=3"):
        forced_kbit_plan(cfg, "sm_90a", "bfloat16", "swiglu", 3, 8, 256, 512)
    with pytest.raises(ValueError, match="MoeKbitConfig"):
        forced_kbit_plan(MoeGemmConfig.of("sm_90a", "bfloat16", 8, True, 32, "swiglu"),
                         "sm_90a", "bfloat16", "swiglu", 4, 8, 256, 512)
    # a config of another arch compiles, then fails at module load: refused before the build
    with pytest.raises(ValueError, match=r"arch=sm_90a.* does not match .*arch=sm_80 \(this device\)"):
        forced_kbit_plan(cfg, "sm_80", "bfloat16", "swiglu", 4, 8, 256, 512)


def test_forced_grouped_config_is_checked():
    from kernelgen.moe.select import forced_grouped

    cfg = MoeGemmConfig.of("sm_90a", "bfloat16", 8, True, 32, "swiglu")
    p = forced_grouped(cfg, "sm_90a", "bfloat16", "swiglu", 8, 256, 512)
    assert p.config is cfg and p.n_tiles == 256 // 32
    for args, msg in ((("sm_80", "bfloat16", "swiglu"), r"arch=sm_90a.*arch=sm_80 \(this device\)"),
                      (("sm_90a", "float16", "swiglu"), "dtype=float16"),
                      (("sm_90a", "bfloat16", "none"), "epilogue=none")):
        with pytest.raises(ValueError, match=msg):
            forced_grouped(cfg, *args, 8, 256, 512)
    with pytest.raises(ValueError, match="multiple of 16"):
        forced_grouped(cfg, "sm_90a", "bfloat16", "swiglu", 8, 24, 512)
    with pytest.raises(ValueError, match="bf16 / fp16 experts take a MoeGemmConfig"):
        forced_grouped(object(), "sm_90a", "bfloat16", "swiglu", 8, 256, 512)


def test_host_row_bounds():
    from kernelgen.moe.api import check_rows

    check_rows(10, None)
    check_rows(10, 10, 10)
    check_rows(0, 0)
    with pytest.raises(ValueError, match=r"rows=11: must be in 0..M=10"):
        check_rows(10, 11)
    for bad in ([5], "x", {}):  # was TypeError (int of a list) / int()'s unnamed ValueError
        with pytest.raises(ValueError, match=r"rows=.*: must be in 0..M=10"):
            check_rows(10, bad)
    with pytest.raises(ValueError, match=r"offsets\[E\]=11 rows exceed x's M=10"):
        check_rows(10, None, 11)


def find_tile_model(offsets, m, tile_m, n_tiles, item):
    """templates/moe/grouped.cuh find_tile, one expert at a time: (e, row0, rows, n_tile)."""
    first = 0
    for e in range(len(offsets) - 1):
        lo, hi = offsets[e], min(offsets[e + 1], m)
        mt = -(-(hi - lo) // tile_m) if hi > lo else 0
        if first <= item < first + mt * n_tiles:
            local = item - first
            row0 = lo + (local % mt) * tile_m
            return e, row0, min(tile_m, hi - row0), local // mt
        first += mt * n_tiles
    return -1, 0, 0, 0


def find_tile_rounds(offsets, m, tile_m, n_tiles, item, per=8):
    """find_tile's walk as grouped.cuh runs it: rounds of up to 32 * per experts, lane l owning
    c = ceil(experts / 32) consecutive ones, a prefix sum over the lanes' item counts, the first
    lane whose range holds `item` finding the expert in its own c."""
    e_count = len(offsets) - 1
    before = 0
    for base in range(0, e_count, 32 * per):
        end = min(e_count, base + 32 * per)
        c = (end - base + 31) // 32
        for lane in range(32):
            experts = range(min(base + lane * c, end), min(base + lane * c + c, end))
            mts = [-(-(min(offsets[e + 1], m) - offsets[e]) // tile_m)
                   if min(offsets[e + 1], m) > offsets[e] else 0 for e in experts]
            n = sum(mts) * n_tiles
            if before <= item < before + n:
                local = item - before
                for e, mt in zip(experts, mts, strict=True):
                    if local < mt * n_tiles:
                        row0 = offsets[e] + (local % mt) * tile_m
                        return e, row0, min(tile_m, min(offsets[e + 1], m) - row0), local // mt
                    local -= mt * n_tiles
            before += n
    return -1, 0, 0, 0


def test_find_tile_rounds_match_the_expert_walk():
    """The lane / round walk of grouped.cuh find_tile returns what the one-expert-at-a-time
    walk does: E across the round and lane boundaries (1..600), zero-row experts, one expert
    holding every row, offsets[E] above and below M, every item and three past the last."""
    rng = np.random.default_rng()
    for e_count in (1, 31, 32, 33, 255, 256, 257, 300, 600):
        for kind in range(3):
            rows = np.zeros(e_count, np.int64)
            if kind == 0:
                np.add.at(rows, rng.integers(0, e_count, 200), 1)
            elif kind == 1:
                rows = rng.choice([0, 0, 1, 5, 17], e_count)
            else:
                rows[rng.integers(e_count)] = 300
            offsets = np.concatenate([[0], np.cumsum(rows)]).tolist()
            for m in (offsets[-1], max(0, offsets[-1] - 7), offsets[-1] + 5):
                for tile_m, n_tiles in ((8, 3), (64, 1)):
                    items = sum(-(-(min(offsets[e + 1], m) - offsets[e]) // tile_m) * n_tiles
                                for e in range(e_count) if min(offsets[e + 1], m) > offsets[e])
                    for item in range(items + 3):
                        assert (find_tile_rounds(offsets, m, tile_m, n_tiles, item)
                                == find_tile_model(offsets, m, tile_m, n_tiles, item)), \
                            (e_count, kind, m, tile_m, n_tiles, item)


@pytest.mark.parametrize("offsets,m", [([0, 3, 3, 10], 10), ([0, 3, 3, 12], 10),
                                       ([0, 9, 20, 40], 10), ([0, 0, 0, 0], 4),
                                       ([0, 17, 40, 41, 80], 33)])
def test_tile_map_stays_within_x_rows(offsets, m):
    """offsets[E] beyond x's M rows: the clamped tile map reads / writes rows < M only and still
    covers every row below min(offsets[E], M) once per N tile within the host's grid."""
    e = len(offsets) - 1
    for tm in (8, 16, 64):
        p = plan_grouped("sm_90a", 132, "float16", e, 256, 256, m, tile_m=tm)
        seen = {}
        for item in range(p.grid(m)[0]):
            ex, row0, rows, nt = find_tile_model(offsets, m, tm, p.n_tiles, item)
            if ex < 0:
                continue
            assert 0 <= row0 and row0 + rows <= m and offsets[ex] <= row0 and rows >= 1
            for r in range(row0, row0 + rows):
                seen[(r, nt)] = seen.get((r, nt), 0) + 1
        want = {(r, nt) for r in range(min(offsets[-1], m)) for nt in range(p.n_tiles)}
        assert set(seen) == want and set(seen.values()) <= {1}, (offsets, m, tm)


def test_prewarm_spec_covers_fused_moe_routing():
    """`kernelgen prewarm --family moe` with layers builds the routing kernels fused_moe picks
    (layout over every T and id dtype, dispatch, combine for every weight dtype and split);
    the no-spec set stays moe's own (moe_routing's default set covers those)."""
    from kernelgen.moe_routing.config import (
        ID_DTYPES,
        W_DTYPES,
        MoeCombineConfig,
        MoeDispatchConfig,
    )
    from kernelgen.moe_routing.select import combine_launch, select_layout

    for arch in ("sm_80", "sm_90a"):
        assert {c.family for c in prewarm_configs([arch], {})} == {"moe"}
    for name, (e, h, i, k) in SHAPES.items():
        spec = {"E": e, "H": h, "I": i, "top_k": k, "dtypes": ["bfloat16"], "sm_counts": [132]}
        pre = list(prewarm_configs(["sm_90a"], spec))
        assert len(pre) == len(set(pre))
        pre = set(pre)
        assert {c.family for c in pre} == {"moe", "moe_routing"}
        assert MoeDispatchConfig(arch="sm_90a") in pre
        for t in list(range(0, 300)) + [1024, 2048, 4096, 10**5]:
            for idt in ID_DTYPES:
                assert select_layout("sm_90a", t * k, e, idt).config in pre, (name, t, idt)
            for hh in (h, i):  # combine runs on y_perm [rows, H]; bf16 vectors of 8
                split, _ = combine_launch(t, hh // 8, 132)
                for wdt in W_DTYPES:
                    assert MoeCombineConfig(arch="sm_90a", dtype="bfloat16", w_dtype=wdt,
                                            split=split) in pre
    with pytest.raises(UnsupportedConfigError, match="num_experts"):
        list(prewarm_configs(["sm_90a"], {"E": 2049, "H": 128, "I": 64, "top_k": 2,
                                          "dtypes": ["bfloat16"], "sm_counts": [132]}))
    # refused before the O(E) row walk (E = 10**9 ran out of memory)
    with pytest.raises(UnsupportedConfigError, match=r"E=1000000000; .*num_experts in 1\.\.2048"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[10**9, 128, 64, 2]]}))


class _Arr:
    """A stand-in device array: a shape, 2-byte items and a data pointer (fused_moe's host
    steps with device_array stubbed)."""

    itemsize = 2

    def __init__(self, *shape: int, ptr: int = 0):
        self.shape, self.ndim = shape, len(shape)
        self.data = type("Ptr", (), {"ptr": ptr})()


def _stub_fused_moe(monkeypatch, calls):
    """fused_moe's steps stubbed (each recorded in `calls`); _Arr arguments pass device_array,
    anything else reaches the real one. Returns the layout the stub moe_layout gives."""
    from kernelgen.core import interop
    from kernelgen.moe import api

    class Lay:
        offsets = "offsets"

    lay = Lay()

    def fake_array(a, name, ctx, dtypes, hint=None, ndim=None):
        if isinstance(a, _Arr):
            return a, "bfloat16"
        return interop.device_array(a, name, ctx, dtypes, hint, ndim)

    class Info:  # the host-side planning fused_moe does before its first launch
        class arch:
            name = "sm_90a"
        sm_count = 132

    class Ctx:
        device = 0
        stream = type("Stream", (), {"ptr": 0})()  # fused_moe's check_point keeps the handle

    monkeypatch.setattr(api, "context_of", lambda a, name: Ctx)
    monkeypatch.setattr(api, "device_info", lambda device: Info)
    monkeypatch.setattr(api, "smem_limit", lambda device: None)
    monkeypatch.setattr(api, "device_array", fake_array)
    monkeypatch.setattr(api, "moe_layout", lambda ids, ne, pad_to: calls.append(("layout", ne, pad_to))
                        or lay)
    monkeypatch.setattr(api, "moe_dispatch", lambda x, layout, exact, dtype: calls.append(
        ("dispatch", layout, exact)) or "x_perm")

    def gemm(x, w, offsets, **kw):
        calls.append(("gemm", x, offsets, kw["rows"], kw.get("activation")))
        return "hidden" if x == "x_perm" else "y_perm"

    monkeypatch.setattr(api, "grouped_gemm", gemm)
    monkeypatch.setattr(api, "moe_combine", lambda y, layout, w, dtype: ("out", y, layout))
    return lay


def test_fused_moe_wiring(monkeypatch):
    """fused_moe's host steps with the kernels stubbed: the layout reaches both GEMMs (host
    row bound), rows = T * top_k, exact / graph-safe dispatch, workspace keeps the buffers."""
    from kernelgen.moe import api

    t, k, e, h, i = 5, 2, 4, 16, 8
    calls = []
    lay = _stub_fused_moe(monkeypatch, calls)
    x, ids, wts = _Arr(t, h), _Arr(t, k), _Arr(t, k)
    w13, w2 = _Arr(e, 2 * i, h), _Arr(e, h, i)
    for graph_safe in (False, True):
        calls.clear()
        ws = {}
        assert api.fused_moe(x, ids, wts, w13, w2, graph_safe=graph_safe,
                             workspace=ws) == ("out", "y_perm", lay)
        assert calls == [("layout", e, 1), ("dispatch", lay, not graph_safe),
                         ("gemm", "x_perm", lay, t * k, "swiglu"),
                         ("gemm", "hidden", lay, t * k, None)]
        assert ws == {"layout": lay, "x_perm": "x_perm", "hidden": "hidden", "y_perm": "y_perm"}


def test_fused_moe_checks_every_argument_before_the_layout(monkeypatch):
    """A bad argument raises before moe_layout launches anything: topk_weights' shape, x's rows
    of 16-byte vectors and alignment, w13's 2I rule (16; flat kbit experts too), w13 / w2
    alignment, and a topk_ids that is no device array."""
    from kernelgen.kbit.api import KbitTensor
    from kernelgen.moe import KbitExperts, api

    t, k, e, h, i = 5, 2, 4, 16, 8
    calls = []
    _stub_fused_moe(monkeypatch, calls)

    def flat(e, n, kk):  # flat kbit experts of a shape (no device arrays: the rules are host's)
        return KbitExperts(KbitTensor(None, None, None, None, (e, n, kk), 4, "bfloat16"), e, n, kk)

    ok = dict(x=_Arr(t, h), topk_ids=_Arr(t, k), topk_weights=_Arr(t, k), w13=_Arr(e, 2 * i, h),
              w2=_Arr(e, h, i))
    cases = [
        (dict(topk_weights=_Arr(t, k + 1)), r"topk_weights: shape \(5, 3\); expected \[5, 2\]"),
        (dict(topk_weights=_Arr(k, t)), r"topk_weights: shape \(2, 5\)"),
        (dict(x=_Arr(t, h, ptr=8)), "x: data pointer must be 16-byte aligned"),
        (dict(x=_Arr(t, 12), w13=_Arr(e, 2 * i, 12), w2=_Arr(e, 12, i)),
         "w13: .* K a positive multiple of 8"),
        (dict(w13=_Arr(e, 24, h), w2=_Arr(e, h, 12)), r"w13: shape \[E=4, N=24, K=16\]; .*2I "
                                                      r"\(gate \+ up rows\) a positive multiple of 16"),
        (dict(x=_Arr(t, 128), w13=flat(e, 24, 128), w2=_Arr(e, 128, 12)),
         r"w13: N=24; swiglu needs 2I \(gate \+ up rows\) a multiple of 16"),
        (dict(w13=_Arr(e, 2 * i, h, ptr=8)), "w13: data pointer must be 16-byte aligned"),
        (dict(w2=_Arr(e, h, i, ptr=4)), "w2: data pointer must be 16-byte aligned"),
        (dict(topk_ids=[[0, 1]] * t), "topk_ids: expected a cupy.ndarray or a CUDA torch.Tensor"),
        # the GEMMs' forced choices and policy: planned on the host before the layout
        (dict(tile_m=7), r"tile_m=7: expected one of \(8, 16"),
        (dict(tile_m=8, swap_ab=False), "TILE_M 8 runs with swap_ab only"),
        (dict(policy="fewest"), r"policy='fewest': expected one of \('threshold', 'waste'\)"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            api.fused_moe(**{**ok, **bad})
        assert calls == [], f"{bad}: launched {calls}"


def test_forced_choices_plan_or_raise_value_error():
    """Every forced (tile_m, swap_ab, tile_n, wgmma, policy) of the dense planner, and every
    forced tile_m / row count of the kbit planners, either plans or raises ValueError naming
    the rule (tile_m 8 without swap_ab, or with wgmma, was a KeyError / TypeError)."""
    import itertools

    from kernelgen.moe.kbit import plan_kbit, plan_kbit_gemv
    from kernelgen.moe.select import plan_grouped

    planned = 0
    for arch in ("sm_80", "sm_90a", "sm_120a"):
        for tm, sw, tn, wg, pol, epi in itertools.product(
                (None, 7, 8, 16, 64, 128, 192, 512), (None, True, False), (None, 32, 128, 256, 100),
                (None, True, False), ("threshold", "waste", "x"), ("swiglu", "none")):
            try:
                plan_grouped(arch, 132, "bfloat16", 8, 256, 512, 100, epi, tm, sw, tn, pol, wg)
                planned += 1
            except ValueError:
                pass
        for tm, bits, rows, epi in itertools.product((None, 0, 7, 8, 16, 32, 64), (2, 3, 4),
                                                     (0, 1, 100, 100000), ("swiglu", "none")):
            for fn, args in ((plan_kbit, (arch, 132, "bfloat16", bits, 8, 256, 512, rows, epi, tm)),
                             (plan_kbit_gemv, (arch, 132, "bfloat16", 8, 256, 512, rows, epi, tm))):
                try:
                    fn(*args)
                    planned += 1
                except ValueError:
                    pass
    assert planned > 100  # the sweep reaches real plans, not only errors
    with pytest.raises(ValueError, match="TILE_M 8 runs with swap_ab only"):
        plan_grouped("sm_90a", 132, "bfloat16", 8, 256, 512, 100, "none", 8, False)
    with pytest.raises(ValueError, match=r"tile_m=8, wgmma=True: no wgmma tile of TILE_M 8"):
        plan_grouped("sm_90a", 132, "bfloat16", 8, 256, 512, 100, "none", 8, None, None,
                     "threshold", True)


def test_kbit_scale_bits_model():
    """grouped_kbit.cuh takes a block's scale pair as the E4M4 byte shifted into T's fields
    (kbit_gemm::ScaleBits: << 6 for fp16, << 3 for bf16) against a table of codebook x 2^4 /
    x 2^116: the shifted byte must be the scale over that power exactly, for all 256 bytes
    (E4M4 subnormals on T's subnormals)."""
    from kernelgen.kbit import reference as KR

    raw = np.arange(256, dtype=np.uint32)
    want = KR.e4m4_decode(raw.astype(np.uint8)).astype(np.float64)
    f16 = (raw << 6).astype(np.uint16).view(np.float16).astype(np.float64)
    bf16 = ((raw << 3) << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    np.testing.assert_array_equal(f16 * 2.0**4, want)
    np.testing.assert_array_equal(bf16 * 2.0**116, want)


def test_tiled_kbit_plan_rule():
    """Tiled kbit4 experts: m_tile 8 while the touched experts average <= 8 rows; the largest
    kw whose CTAs (a pass an expert uniform routing is expected to touch) fit one wave of 2
    CTAs an SM with >= 4 steps a warp, or, where that fills under 3/4 of the wave, the kw whose
    waves are fullest on average; the grid is the kernel's item bound (passes + touched) x CTAs a pass."""
    from kernelgen.moe import plan_kbit_gemv, select_kbit_gemv

    cases = [  # (E, N, K, rows, epilogue) -> (m_tile, kw, CTAs a pass)
        ((128, 4096, 7168, 8, "swiglu"), (8, 2, 32)),   # E128 W13, T = 1: 8 x 32 = 256 CTAs
        ((128, 7168, 2048, 8, "none"), (8, 1, 28)),     # E128 W2: 224 CTAs at kw 1
        ((8, 28672, 4096, 2, "swiglu"), (8, 1, 112)),   # E8 W13, T = 1
        ((8, 4096, 14336, 2, "none"), (8, 8, 128)),     # E8 W2: 2 x 128 = 256 CTAs
        ((8, 4096, 14336, 32, "none"), (8, 2, 32)),     # E8 W2, T = 16: 7.9 passes expected
        ((8, 4096, 14336, 8, "none"), (8, 8, 128)),     # E8 W2, T = 4: kw 2 fills 0.64 of a
        # wave (5.25 passes expected x 32 CTAs), kw 8 0.85 of its three on average
        ((8, 4096, 512, 2, "none"), (8, 1, 16)),        # 4 steps: kw 2 would leave 2 a warp
        ((4, 256, 1024, 64, "none"), (16, 2, 2)),       # 16 rows an expert: m_tile 16
    ]
    for (e, n, k, rows, epi), (mt, kw, ctas) in cases:
        p = plan_kbit_gemv("sm_90a", 132, "bfloat16", e, n, k, rows, epi)
        assert (p.config.m_tile, p.kw, p.n_ctas) == (mt, kw, ctas), (e, n, k, rows, epi, p.short())
        assert p.grid(rows) == ((-(-rows // mt) + min(e, rows)) * ctas, 1, 1)
        assert p.config.tpw == 2
        assert select_kbit_gemv("sm_90a", 132, "bfloat16", e, n, k, rows, epi) == p
    with pytest.raises(ValueError, match="tile_m=32: tiled kbit experts take 8 or 16"):
        plan_kbit_gemv("sm_90a", 132, "bfloat16", 8, 256, 256, 8, "none", 32)
    with pytest.raises(ValueError, match="kw=3"):
        plan_kbit_gemv("sm_90a", 132, "bfloat16", 8, 256, 256, 8, "none", 8, 3)
    with pytest.raises(ValueError, match="N a positive multiple of 16"):
        plan_kbit_gemv("sm_90a", 132, "bfloat16", 8, 200, 256, 8, "none")
    with pytest.raises(ValueError, match="multiple of 32"):
        plan_kbit_gemv("sm_90a", 132, "bfloat16", 8, 240, 256, 8, "swiglu")
    with pytest.raises(ValueError, match="rows=0"):
        plan_kbit_gemv("sm_90a", 132, "bfloat16", 8, 256, 256, 0)


def test_tiled_kbit_prewarm_covers_dispatch():
    """A layer spec with 4 bits builds what select_kbit_gemv picks over the walked rows; one
    without 4 bits builds no tiled config."""
    from kernelgen.moe import select_kbit_gemv

    spec = {"E": 128, "H": 7168, "I": 2048, "top_k": 8, "dtypes": ["bfloat16"], "bits": [4],
            "sm_counts": [132]}
    cfgs = set(prewarm_configs(["sm_90a"], spec))
    for rows in (1, 8, 64, 128, 1024, 32768):
        for n, k, epi in ((4096, 7168, "swiglu"), (7168, 2048, "none")):
            assert select_kbit_gemv("sm_90a", 132, "bfloat16", 128, n, k, rows, epi).config in cfgs
    spec["bits"] = [2, 3]
    assert not [c for c in prewarm_configs(["sm_90a"], spec) if isinstance(c, MoeKbitGemvConfig)]


def test_forced_tiled_kbit_plan_is_checked():
    from kernelgen.moe.kbit import forced_kbit_gemv_plan

    cfg = MoeKbitGemvConfig(arch="sm_90a", dtype="bfloat16", m_tile=8, warps=8, epilogue="none",
                            tpw=1)
    p = forced_kbit_gemv_plan(cfg, "sm_90a", "bfloat16", "none", 8, 256, 512, 4)
    assert (p.kw, p.n_ctas) == (4, 8)  # tpw 1: 16 units, 2 a CTA
    p = forced_kbit_gemv_plan(replace(cfg, tpw=2), "sm_90a", "bfloat16", "none", 8, 256, 512, 4)
    assert (p.kw, p.n_ctas) == (4, 4)
    for args, msg in ((("sm_80", "bfloat16", "none"), "arch=sm_80"),
                      (("sm_90a", "float16", "none"), "dtype=float16"),
                      (("sm_90a", "bfloat16", "swiglu"), "epilogue=swiglu")):
        with pytest.raises(ValueError, match=msg):
            forced_kbit_gemv_plan(cfg, *args, 8, 256, 512)
    with pytest.raises(ValueError, match="kw=3"):
        forced_kbit_gemv_plan(cfg, "sm_90a", "bfloat16", "none", 8, 256, 512, 3)
    with pytest.raises(ValueError, match="kbit experts take a MoeKbitGemvConfig"):
        forced_kbit_gemv_plan(object(), "sm_90a", "bfloat16", "none", 8, 256, 512)


def test_kbit_experts_take_exactly_one_layout():
    from kernelgen.moe import KbitExperts

    with pytest.raises(ValueError, match="exactly one of q"):
        KbitExperts(None, 2, 16, 128)


def test_tma_rule():
    """The selector copies wgmma stages by TMA (every shape check_shape admits maps), never off
    the wgmma path; tma=False forces cp.async, tma=True off the wgmma path is a ValueError."""
    big = plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, 32768, "swiglu")
    assert big.config.wgmma and big.config.tma and "tma" in big.short()
    assert not plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, 32768, "swiglu",
                            tma=False).config.tma
    decode = plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, 8, "swiglu")
    assert not decode.config.wgmma and not decode.config.tma
    with pytest.raises(ValueError, match="not on the wgmma path"):
        plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, 8, "swiglu", tma=True)
    with pytest.raises(ValueError, match="not on the wgmma path"):
        plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, 32768, "swiglu", wgmma=False,
                     tma=True)
    for arch in ("sm_80", "sm_100a", "sm_120a"):
        assert not plan_grouped(arch, 132, "bfloat16", 256, 4096, 7168, 32768, "swiglu").config.tma
    # the 192 band ends at 200 rows an expert with TMA copies, at 176 with cp.async
    from kernelgen.moe.select import WGMMA_TM192_BAND, WGMMA_TM192_BAND_CP_ASYNC

    lo, hi = WGMMA_TM192_BAND_CP_ASYNC
    assert WGMMA_TM192_BAND[0] == lo and WGMMA_TM192_BAND[1] > hi
    rows = int(hi * 256) + 256  # past the cp.async band, inside the TMA one
    assert plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, rows, "swiglu").config.tile_m == 192
    assert plan_grouped("sm_90a", 132, "bfloat16", 256, 4096, 7168, rows, "swiglu",
                        tma=False).config.tile_m == 128
