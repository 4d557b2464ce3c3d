"""MoE grouped GEMM plans for a device whose blocks get less shared memory than its target's
(8.6 parts under sm_80: 101376 B = 99 KB a block; the sm_80 rows assume A100's 163 KB):
every row keeps the deepest stage count that fits, a selected row whose fewest stages do not
fit steps down to a smaller one, a forced one raises; without a limit the choice is today's;
prewarm builds what those parts pick. bf16 / fp16 experts and kbit experts."""

import pytest

from kernelgen.arch import ALL_ARCHS, ARCHS, PARTS, base_of
from kernelgen.errors import UnsupportedConfigError
from kernelgen.moe.config import TILES, WG_TILES, MoeGemmConfig, MoeKbitConfig
from kernelgen.moe.kbit import SMEM_BUDGET, plan_kbit, select_kbit
from kernelgen.moe.select import POLICIES, plan_grouped, prewarm_configs, select_grouped

LIMIT = 99 * 1024  # = 101376, sharedMemPerBlockOptin of compute capability 8.6 / 8.9
# (E, H, I, top_k): the benchmark layers (Mixtral-like E = 8, and E = 128)
LAYERS = ((8, 4096, 14336, 2), (128, 2048, 768, 8))
TS = (1, 2, 3, 8, 16, 33, 64, 100, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# the table's stages that sm_120a (99 KB a block) always took fewer of, before the limit rule
SM120_TODAY = {(128, False, 128): 3, (256, False, 128): 2}


def _gemms(e, h, i, top_k):
    for t in TS:
        for n, k, epi in ((2 * i, h, "swiglu"), (h, i, "none")):
            yield t * top_k, n, k, epi


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_row_stages_without_a_limit_are_todays(arch):
    for key, row in TILES.items():
        for few in (False, True):
            want = row.stages_few if few and row.stages_few else row.stages
            if base_of(arch) == "sm_120a":
                want = SM120_TODAY.get(key, want)
            elif ARCHS[arch].smem_optin != ARCHS[base_of(arch)].smem_optin:  # sm_89: sm_80 at 99 KB
                want = MoeGemmConfig.of(base_of(arch), "bfloat16", *key, few=few,
                                        smem_limit=ARCHS[arch].smem_optin).stages
            cfg = MoeGemmConfig.of(arch, "bfloat16", *key, few=few)
            assert cfg.stages == want, (arch, key, few)
            assert MoeGemmConfig.of(arch, "bfloat16", *key, few=few,
                                    smem_limit=ARCHS[arch].smem_optin) == cfg
    for (tm, tn), row in WG_TILES.items():
        assert MoeGemmConfig.of("sm_90a", "bfloat16", tm, False, tn, wgmma=True).stages == row.stages


@pytest.mark.parametrize("epilogue", ("none", "swiglu"))
def test_every_row_fits_a_99_kb_part(epilogue):
    """Each row at 99 KB on sm_80: the deepest stage count up to the row's that fits, nothing
    else changed; the two widest rows are the ones that lose stages."""
    reduced = set()
    for key in TILES:
        for few in (False, True):
            full = MoeGemmConfig.of("sm_80", "bfloat16", *key, epilogue, few)
            cfg = MoeGemmConfig.of("sm_80", "bfloat16", *key, epilogue, few, smem_limit=LIMIT)
            assert cfg.smem_bytes() <= LIMIT, cfg
            assert cfg.replace(stages=full.stages) == full, cfg
            assert cfg.stages == full.stages or cfg.smem_at(cfg.stages + 1) > LIMIT, cfg
            if cfg.stages < full.stages:
                reduced.add((*key, cfg.stages))
    assert reduced == {(128, False, 128, 3), (256, False, 128, 2)}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda s: f"E{s[0]}")
def test_plans_fit_a_99_kb_part(layer, policy):
    """Dispatch on sm_80 at 99 KB over batch sizes of the benchmark layers, every sm_80 part's
    SM count, both policies, plus forced rows: each plan fits; only stages differ from the plan
    without a limit; the selector = the planner."""
    reduced = set()
    for sms, _ in PARTS["sm_80"]:
        for rows, n, k, epi in _gemms(*layer):
            for forced in ({}, {"tile_m": 128, "tile_n": 128}, {"tile_m": 256}):
                full = plan_grouped("sm_80", sms, "bfloat16", layer[0], n, k, rows, epi,
                                    policy=policy, **forced)
                p = plan_grouped("sm_80", sms, "bfloat16", layer[0], n, k, rows, epi,
                                 policy=policy, smem_limit=LIMIT, **forced)
                ctx = f"{sms=} {rows=} {n=} {k=} {epi} {forced} {p.short()}"
                assert p.smem <= LIMIT, ctx
                assert p.config.replace(stages=full.config.stages) == full.config, ctx
                assert p.n_tiles == full.n_tiles, ctx
                if p.config.stages < full.config.stages:
                    reduced.add((p.config.tile_m, p.config.tile_n, p.config.stages))
                if not forced:
                    assert select_grouped("sm_80", sms, "bfloat16", layer[0], n, k, rows, epi,
                                          policy, LIMIT) == p, ctx
    assert reduced == {(128, 128, 3), (256, 128, 2)}


def test_a_row_whose_fewest_stages_do_not_fit_steps_down():
    """sm_90a's prefill row (wgmma 128x256, a group in flight: 3 stages at least) on a
    hypothetical 99 KB part: the selector takes wgmma 128x128 (3 stages fit); forced, it raises
    naming the rule; a limit below every 128-row tile goes to TILE_M 64."""
    e, n, k, rows = 8, 4096, 4096, 8192
    assert plan_grouped("sm_90a", 132, "bfloat16", e, n, k, rows).config.tile_n == 256
    p = plan_grouped("sm_90a", 132, "bfloat16", e, n, k, rows, smem_limit=LIMIT)
    assert p.config.wgmma and (p.config.tile_m, p.config.tile_n) == (128, 128), p.short()
    assert p.smem <= LIMIT and p.n_tiles == n // 128
    with pytest.raises(UnsupportedConfigError, match="fewest it takes.*allows 101376 B"):
        plan_grouped("sm_90a", 132, "bfloat16", e, n, k, rows, tile_m=128, tile_n=256,
                     smem_limit=LIMIT)
    lim = MoeGemmConfig.of("sm_80", "bfloat16", 64, False, 128).smem_at(2)  # 2 stages of 64x128
    p = plan_grouped("sm_80", 108, "bfloat16", e, n, k, rows, smem_limit=lim)
    assert (p.config.tile_m, p.config.tile_n, p.config.stages) == (64, 128, 2), p.short()
    # a wrong row stays an error of its own, not a step down
    with pytest.raises(UnsupportedConfigError, match="exists only on"):
        plan_grouped("sm_80", 108, "bfloat16", e, n, k, rows, wgmma=True, smem_limit=LIMIT)


@pytest.mark.parametrize("arch", ("sm_80", "sm_90a"))
@pytest.mark.parametrize("layer", LAYERS, ids=lambda s: f"E{s[0]}")
def test_kbit_plans_fit_a_99_kb_part(layer, arch):
    """kbit experts: the budget is min(SMEM_BUDGET[arch], the device's): sm_80's 80 KB already
    fits (plans unchanged), sm_90a's 110 KB drops to 99 KB (fewer stages, same CTA shape)."""
    for bits in (2, 3, 4):
        for sms, _ in PARTS[arch]:
            for rows, n, k, epi in _gemms(*layer):
                full = plan_kbit(arch, sms, "bfloat16", bits, layer[0], n, k, rows, epi)
                p = plan_kbit(arch, sms, "bfloat16", bits, layer[0], n, k, rows, epi,
                              smem_limit=LIMIT)
                ctx = f"{bits=} {sms=} {rows=} {n=} {k=} {epi} {p.short()}"
                assert p.smem <= min(LIMIT, SMEM_BUDGET[arch]), ctx
                assert select_kbit(arch, sms, "bfloat16", bits, layer[0], n, k, rows, epi, LIMIT) == p
                if SMEM_BUDGET[arch] <= LIMIT:
                    assert p == full, ctx
                else:
                    assert p.config.replace(stages=full.config.stages) == full.config, ctx
                    assert p.config.stages <= full.config.stages, ctx
    with pytest.raises(UnsupportedConfigError, match="two stages of tile_m=8"):
        plan_kbit(arch, 108, "bfloat16", 4, 8, 4096, 4096, 8, smem_limit=32 * 1024)


def test_prewarm_builds_the_stages_of_99_kb_parts():
    """A layer spec on sm_80 walks every part (and a spec's sm_counts every limit): the rows the
    99 KB parts pick at fewer stages are in it; the default set's rows all fit 99 KB already."""
    spec = {"shapes": [list(s) for s in LAYERS], "dtypes": ["bfloat16"], "policy": "waste"}
    pre = set(prewarm_configs(["sm_80"], spec))
    grouped = {(c.tile_m, c.tile_n, c.stages) for c in pre if isinstance(c, MoeGemmConfig)}
    assert {(256, 128, 3), (256, 128, 2)} <= grouped, sorted(grouped)
    for sms, lim in PARTS["sm_80"]:
        for layer in LAYERS:
            for rows, n, k, epi in _gemms(*layer):
                cfg = plan_grouped("sm_80", sms, "bfloat16", layer[0], n, k, rows, epi,
                                   policy="waste", smem_limit=lim).config
                assert cfg in pre, (sms, lim, rows, cfg.short())
    counted = set(prewarm_configs(["sm_80"], {**spec, "sm_counts": [84]}))
    assert {(c.tile_m, c.tile_n, c.stages) for c in counted if isinstance(c, MoeGemmConfig)} >= \
        {(256, 128, 3), (256, 128, 2)}
    default = [c for c in prewarm_configs(["sm_80"], {}) if isinstance(c, (MoeGemmConfig, MoeKbitConfig))]
    assert default and all(c.smem_bytes() <= LIMIT for c in default)
