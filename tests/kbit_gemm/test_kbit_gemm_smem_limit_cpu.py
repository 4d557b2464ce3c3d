"""kbit GEMM plans for a device whose blocks get less shared memory than its target's (8.6 parts
under sm_80: 101376 B = 99 KB a block, 100 KB an SM; the sm_80 plans assume A100's 163 /
164 KB): every path's plan fits the device (mma: the deepest stages that fit, the tile of the
table; tiled 4-bit weights: the tile path with fewer stages; GEMV: CTAs an SM from the part's
shared memory); without a limit the choice is today's; prewarm builds what those parts pick."""

import pytest

from kernelgen.arch import ALL_ARCHS, ARCHS, PARTS, SMEM_PER_SM, smem_per_sm
from kernelgen.errors import UnsupportedConfigError
from kernelgen.fp4_gemm.config import Fp4TileConfig, tile_smem
from kernelgen.kbit_gemm import prewarm_all
from kernelgen.kbit_gemm import tc_select as S
from kernelgen.kbit_gemm import tiled as TL
from kernelgen.kbit_gemm.select import plan_gemv, select_gemv
from kernelgen.kbit_gemm.tc_config import TILES, KbitMmaConfig, smem_for, stages_for

LIMIT = 99 * 1024  # = 101376, sharedMemPerBlockOptin of compute capability 8.6 (and 8.9, sm_89's)
SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096))
MS = sorted({*range(17, 300, 6), 32, 33, 64, 65, 128, 144, 255, 256, 257, 512, 1000, 4097})


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_mma_stages_without_a_limit_are_todays(arch):
    """4 stages everywhere but 64x256 at 4 / 5 bits on the 99 KB targets sm_120a / sm_89 (3), as before the limit."""
    for bits in (2, 3, 4, 5):
        for tm, tn in TILES:
            want = 3 if ARCHS[arch].smem_optin == 99 * 1024 and (tm, tn, bits) in ((64, 256, 4), (64, 256, 5)) else 4
            assert stages_for(arch, bits, tm, tn) == want, (arch, bits, tm, tn)
            assert stages_for(arch, bits, tm, tn, ARCHS[arch].smem_optin) == want


def test_smem_per_sm_of_a_part():
    assert smem_per_sm("sm_80") == SMEM_PER_SM["sm_80"] == 164 * 1024
    assert smem_per_sm("sm_80", ARCHS["sm_80"].smem_optin) == 164 * 1024
    assert smem_per_sm("sm_80", LIMIT) == 100 * 1024  # 8.6: 99 KB a block, 100 an SM
    assert smem_per_sm("sm_120a", LIMIT) == SMEM_PER_SM["sm_120a"]


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_mma_plans_fit_a_99_kb_part(bits):
    """The mma path (forced, every M; and dispatch's) on sm_80 at 99 KB: the table's tile at the
    deepest stage count that fits (the K split: test_mma_split_counts_ctas_an_sm_of_the_part)."""
    reduced = set()
    for sms, _ in PARTS["sm_80"]:
        for n, k in SHAPES:
            for m in MS:
                full = S.plan_mma("sm_80", m, n, k, bits, "float16", sms)
                p = S.plan_mma("sm_80", m, n, k, bits, "float16", sms, smem_limit=LIMIT)
                ctx = f"{m=} {n=} {k=} {sms=} {p.short()}"
                assert p.smem <= LIMIT, ctx
                assert S.plan_mma("sm_80", m, n, k, bits, "float16", sms,
                                  smem_limit=ARCHS["sm_80"].smem_optin) == full, ctx
                st, st_full = p.config.stages, full.config.stages
                assert p.config.replace(stages=st_full) == full.config, ctx
                cfg = p.config
                assert st == st_full or smem_for(bits, cfg.tile_m, cfg.tile_n, st + 1) > LIMIT, ctx
                if st < st_full:
                    reduced.add((cfg.tile_m, cfg.tile_n, st))
                ch = S.select_gemm("sm_80", m, n, k, bits, "float16", sms, LIMIT)
                if ch.plan is not None:
                    assert ch.plan.smem <= LIMIT, f"{ctx} {ch.short()}"
                if ch.path == "mma":
                    assert ch.plan == p, ctx
    # 64x256 (M >= 256, N % 256 == 0) at 4 / 5 bits: 3 stages; 2 / 3 bits fit 4
    assert reduced == ({(64, 256, 3)} if bits in (4, 5) else set())


def test_mma_split_counts_ctas_an_sm_of_the_part():
    """32x128 at 4 bits (2 CTAs an SM on an A100 by shared memory) is one an SM on a 100 KB SM:
    the K split the cost model picks sees half the slots."""
    m, n, k, sms = 32, 4096, 4096, 72
    full = S.plan_mma("sm_80", m, n, k, 4, "float16", sms)
    cfg = full.config
    assert (cfg.tile_m, cfg.tile_n, cfg.min_blocks) == (32, 128, 2)
    assert 2 * (cfg.smem_bytes() + 1024) <= 164 * 1024 and 2 * (cfg.smem_bytes() + 1024) > 100 * 1024
    part = S.plan_mma("sm_80", m, n, k, 4, "float16", sms, smem_limit=LIMIT)
    assert part.config == full.config and part.split != full.split, (full.short(), part.short())
    # the split of an A100 with half the SMs: 2 CTAs x sms/2 slots == 1 x sms
    assert part.split == S.plan_mma("sm_80", m, n, k, 4, "float16", sms // 2).split


def test_mma_tile_steps_down_where_2_stages_do_not_fit():
    m, n, k = 512, 4096, 4096
    assert S.tile_for(m, n) == (64, 256)
    lim = smem_for(4, 64, 256, 2) - 1
    p = S.plan_mma("sm_80", m, n, k, 4, "float16", 108, smem_limit=lim)
    assert (p.config.tile_m, p.config.tile_n) == (64, 128) and p.smem <= lim, p.short()
    lim = smem_for(4, 32, 128, 2) - 1
    with pytest.raises(UnsupportedConfigError, match="2 stages need .* allows"):
        S.plan_mma("sm_80", m, n, k, 4, "float16", 108, smem_limit=lim)
    with pytest.raises(UnsupportedConfigError, match="64x256 at 4 bits: 2 stages need"):
        S.plan_mma("sm_80", m, n, k, 4, "float16", 108, tile=(64, 256), smem_limit=smem_for(4, 64, 256, 2) - 1)


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_gemv_plans_fit_a_99_kb_part(bits):
    """The bandwidth path on sm_80 at 99 KB: every plan fits, and its grid is what a 100 KB SM
    holds (a persistent grid: no more CTAs than stay resident)."""
    for sms, _ in PARTS["sm_80"]:
        for n, k in SHAPES:
            for m in (1, 2, 4, 7, 8, 9, 16, 32, 64, 100, 200):
                p = select_gemv("sm_80", m, n, k, bits, "float16", sms, LIMIT)
                assert p == plan_gemv("sm_80", m, n, k, bits, "float16", sms, smem_limit=LIMIT)
                ctx = f"{m=} {n=} {k=} {sms=} {p.short()}"
                assert p.smem <= LIMIT, ctx
                resident = max(1, min(p.config.min_blocks, 100 * 1024 // (p.smem + 1024)))
                assert p.ctas * p.split * p.m_tiles <= max(sms * resident, p.split * p.m_tiles), ctx


def test_tiled_plans_fit_a_99_kb_part():
    """Tiled 4-bit weights on sm_80 at 99 KB: the rule's paths stay (the tile path at the deepest
    stages that fit beside the 32 KB table: BM 64 at 2), every plan fits; a forced tile path too."""
    reduced = set()
    for sms, _ in PARTS["sm_80"]:
        for n, k in SHAPES + ((128 * sms, 8192),):
            for m in (1, 16, 64, 65, 97, 100, 128, 129, 300):
                for path in (None, "tile"):
                    full = TL.plan_tiled("sm_80", m, n, k, "float16", sms, path=path)
                    ch = TL.plan_tiled("sm_80", m, n, k, "float16", sms, path=path, smem_limit=LIMIT)
                    ctx = f"{m=} {n=} {k=} {sms=} {path=} {ch.short()}"
                    assert ch.path == full.path, ctx
                    if ch.plan is None:
                        continue
                    assert ch.plan.smem <= LIMIT, ctx
                    if ch.path == "tile":
                        cfg = ch.plan.config
                        assert cfg.replace(stages=full.plan.config.stages) == full.plan.config, ctx
                        st = cfg.stages
                        assert st == full.plan.config.stages or tile_smem("kbit4", cfg.bm, st + 1) > LIMIT, ctx
                        if st < full.plan.config.stages:
                            reduced.add((cfg.bm, st))
                    if path is None:
                        assert TL.select_tiled("sm_80", m, n, k, "float16", sms, LIMIT) == ch, ctx
    assert reduced == {(64, 2)}  # BM 32 (forced tile path, M <= 32) keeps 4 stages: 100352 B


def test_prewarm_builds_the_stages_of_99_kb_parts():
    """`kernelgen prewarm --arch sm_80` (default set) and a spec's shape walk hold the reduced
    stages the 8.6 / 8.9 parts pick: the tiled 4-bit tile (BM 64, 2 stages), the flat layout's
    64x256 mma tile at 3 stages (4 bits with layouts ["flat"], and 5 bits; dispatch sends the M
    that would take it to the dequant path, so a shape walk has it only for a forced path)."""
    default = list(prewarm_all(["sm_80"], {}))
    assert Fp4TileConfig(arch="sm_80", fmt="kbit4", dtype="float16", enc="float16", bm=64,
                         stages=2, warps_t=2) in default
    assert KbitMmaConfig(arch="sm_80", bits=5, tile_m=64, tile_n=256, stages=3) in default
    flat = list(prewarm_all(["sm_80"], {"layouts": ["flat"], "bits": [4]}))
    assert KbitMmaConfig(arch="sm_80", bits=4, tile_m=64, tile_n=256, stages=3) in flat
    spec = {"shapes": [list(s) for s in SHAPES], "bits": [4], "layouts": ["flat", "tiled"],
            "dtypes": ["float16"]}
    walked = set(prewarm_all(["sm_80"], spec))
    assert Fp4TileConfig(arch="sm_80", fmt="kbit4", dtype="float16", enc="float16", bm=64,
                         stages=4, warps_t=2) in walked
    assert Fp4TileConfig(arch="sm_80", fmt="kbit4", dtype="float16", enc="float16", bm=64,
                         stages=2, warps_t=2) in walked
    # every plan of a 99 KB part is in the walk (tests/kbit_gemm/test_tiled_cpu.py walks them all)
    for sms, lim in PARTS["sm_80"]:
        for m in (1, 16, 64, 100, 128):
            ch = TL.plan_tiled("sm_80", m, 14336, 4096, "float16", sms, smem_limit=lim)
            assert ch.plan.config in walked, (sms, lim, m, ch.short())
