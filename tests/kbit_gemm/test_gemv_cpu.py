"""kbit GEMM checks that need no GPU: the selector table, prewarm = dispatch, input rules
enforced before any launch, and the NumPy reference against an independent computation."""

import numpy as np
import pytest

import kernelgen as kg
from kernelgen.arch import PARTS, SM_COUNTS, smem_cap
from kernelgen.errors import UnsupportedConfigError
from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import reference as GR
from kernelgen.kbit_gemm.config import KbitGemvConfig, kw_red_bytes, launch_of, lut_bytes
from kernelgen.kbit_gemm.select import (
    KW_CHOICES,
    MIN_GROUPS_PER_SPLIT,
    ONE_CTA_FEW_TOKENS,
    ONE_CTA_MIN_M,
    ONE_CTA_TABLE_STEPS,
    ONE_CTA_WARPS,
    kw_choices,
    one_cta,
    plan_gemv,
    prewarm_configs,
    select_gemv,
    warp_steps,
)


def _cdiv(a, b):
    return -(-a // b)


SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096), (200, 384), (1000, 4224), (16, 128)]
MS = [1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100]


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
@pytest.mark.parametrize("n,k", SHAPES)
def test_plans_are_consistent(n, k, bits):
    groups = k // 128
    for m in MS:
        for sms in (132, 114, 20):
            p = select_gemv("sm_90a", m, n, k, bits, "float16", sms)
            ctx = f"{m=} {n=} {k=} {bits=} {sms=} {p.short()}"
            cfg = p.config
            assert cfg.m_tile == (8 if m <= 8 else 16), ctx
            table = launch_of(cfg.m_tile, bits, cfg.kw, cfg.arch)[:2]
            if one_cta(m, bits):  # one CTA an SM, or the table's launch where that spreads wider
                assert (cfg.warps, cfg.min_blocks) in (table, (ONE_CTA_WARPS, 1)), ctx
            elif (cfg.warps, cfg.min_blocks) != table:  # the table's grid, one CTA an SM
                assert (cfg.warps, cfg.min_blocks) == (ONE_CTA_WARPS, 1), ctx
                assert p.ctas_total <= sms, ctx
            # every split non-empty, together they cover K exactly
            assert (p.split - 1) * p.gps < groups <= p.split * p.gps, ctx
            assert cfg.split_k == (p.split > 1), ctx
            # A slice + table fit the config's shared-memory cap, and the cap the arch allows
            rows = min(m, cfg.m_tile)
            red = kw_red_bytes(cfg.warps, cfg.kw, cfg.m_tile)
            assert p.smem == lut_bytes(bits) + rows * p.gps * 128 * 2 + red, ctx
            assert p.smem <= cfg.smem_bytes(), ctx
            assert p.grid[1:] == (p.split, _cdiv(m, cfg.m_tile)), ctx
            assert 1 <= p.ctas <= _cdiv(_cdiv(n, 16), cfg.warps // cfg.kw), ctx
            # persistent: every CTA resident at once
            assert p.ctas * p.split * p.m_tiles <= max(sms * cfg.min_blocks, p.split * p.m_tiles), ctx
            # a split keeps >= MIN_GROUPS_PER_SPLIT groups unless the A slice forces it smaller
            max_gps = (cfg.smem_bytes() - lut_bytes(bits) - red) // (rows * 128 * 2)
            if p.split > 1:
                assert p.gps >= MIN_GROUPS_PER_SPLIT or p.gps == max_gps, ctx


def test_one_cta_an_sm_for_decode_batches():
    """Every M runs one 8-warp CTA an SM with the arch's whole shared memory a block (measured
    faster, select.py ONE_CTA_MIN_M), except below ONE_CTA_FEW_TOKENS where the table's plan
    spreads wider or walks far fewer steps a warp (below)."""
    assert ONE_CTA_MIN_M == {2: 1, 3: 1, 4: 1, 5: 1}
    for bits in (2, 3, 4, 5):
        for m in list(range(1, 80)) + [159]:
            p = select_gemv("sm_90a", m, 14336, 4096, bits, "float16", 132)
            one = (p.config.warps, p.config.min_blocks) == (ONE_CTA_WARPS, 1)
            assert one, (m, bits, p.short())
            assert p.config.smem_bytes() == smem_cap("sm_90a") and p.ctas_total <= 132, p.short()
            if m >= 9:  # the 16-token A slice of K = 4096 fits: no K split (was 2)
                assert p.split == 1 or bits == 5, p.short()
    # Below ONE_CTA_FEW_TOKENS a one-CTA plan on at most half the table's SMs leaves the table's
    # (1024x4096 5 bits M = 1: 32 CTAs against 64); from it on the one-CTA cost spreads the
    # weight itself: 1024x8192 5 bits M = 16 kw 4 x 4 splits, 128 CTAs (measured 11.83 us
    # against the table's 14.01; session 27's 64-CTA kw 1 x 8 plan lost 11% to the table)
    assert ONE_CTA_FEW_TOKENS == 4
    tiny = select_gemv("sm_90a", 1, 1024, 4096, 5, "float16", 132)
    assert tiny.config.min_blocks != 1, tiny.short()
    small = select_gemv("sm_90a", 16, 1024, 8192, 5, "float16", 132)
    assert small.config.min_blocks == 1 and small.config.kw == 4 and small.ctas_total == 128, small.short()
    mid = select_gemv("sm_90a", 12, 11008, 4096, 5, "float16", 132)
    assert mid.config.min_blocks == 1, mid.short()


def test_one_cta_cost_picks_measured_plans():
    """The one-CTA cost (ONE_CTA_STEP and the item steps, session 28's grids): plans the old
    constants missed by 10-35% on the H100."""
    def pick(m, n, k, bits):
        p = select_gemv("sm_90a", m, n, k, bits, "float16", 132)
        assert p.config.min_blocks == 1, p.short()
        return p.config.kw, p.split
    assert pick(8, 14336, 4096, 5) == (1, 1)   # 23.08 us; kw 2 (the old pick) 25.58
    assert pick(16, 18432, 5120, 5) == (1, 2)  # 53.20 us; unsplit kw 1 71.83
    assert pick(12, 2048, 4096, 2) == (4, 1)   # 6.79 us; the table's kw 4 x 2 splits 8.05
    # 5 bits at m_tile 16 weighs K warps one CTA an SM (not on the table's launch)
    assert kw_choices(16, 5, "sm_90a") == (1,) and kw_choices(16, 5, "sm_90a", one=True) == KW_CHOICES


def test_the_table_where_its_warps_walk_far_fewer_steps():
    """Up to 8 tokens (m_tile 8) the table's unsplit kw 1 plan replaces the one-CTA plan where
    the latter's warps walk over 1 / ONE_CTA_TABLE_STEPS times its quad steps (24576x1536:
    every tile in one round of three 4-warp CTAs an SM, 11-35% faster on the H100, session 34);
    the shapes where one CTA an SM measured faster keep it."""
    for bits in (2, 3):
        for m in (1, 2, 3, 4, 8):
            p = select_gemv("sm_90a", m, 24576, 1536, bits, "float16", 132)
            assert (p.config.warps, p.config.min_blocks, p.config.kw, p.split) == (4, 3, 1, 1), p.short()
            one = plan_gemv("sm_90a", m, 24576, 1536, bits, "float16", 132, launch=(ONE_CTA_WARPS, 1))
            assert warp_steps(p, 24576) < ONE_CTA_TABLE_STEPS * warp_steps(one, 24576)
            for n, k in ((12288, 4096), (20480, 2048), (22016, 4096), (28672, 4096), (4096, 14336)):
                q = select_gemv("sm_90a", m, n, k, bits, "float16", 132)
                assert q.config.min_blocks == 1, (n, k, bits, m, q.short())
    # past 8 tokens (m_tile 16), one CTA an SM whatever the steps
    assert select_gemv("sm_90a", 9, 24576, 1536, 2, "float16", 132).config.min_blocks == 1
    # forced K warps or splits: the one-CTA plan for them
    assert plan_gemv("sm_90a", 1, 24576, 1536, 2, "float16", 132, kw=1).config.min_blocks == 1


def test_forced_split_takes_one_cta_an_sm():
    """A forced split_k / kw is planned on the launch the rule would take: split 1 at M = 16,
    K = 4096 fits one CTA an SM (the table's 96 KB would need 2), as dispatch's own plan."""
    for m in (8, 12, 16):
        auto = plan_gemv("sm_90a", m, 14336, 4096, 2, "float16", 132)
        forced = plan_gemv("sm_90a", m, 14336, 4096, 2, "float16", 132, split=1)
        assert auto.split == forced.split == 1 and forced.config.min_blocks == 1, forced.short()
        assert plan_gemv("sm_90a", m, 14336, 4096, 2, "float16", 132, split=1, kw=1).split == 1
    with pytest.raises(ValueError, match="does not fit shared memory"):
        plan_gemv("sm_90a", 16, 14336, 28672, 2, "float16", 132, split=1)  # 896 KB of A


def test_decode_shapes_fill_the_gpu():
    # the issue shapes at M=1 on an H100: one wave of CTAs that keeps most SMs' warps busy
    for n, k in ((14336, 4096), (4096, 14336)):
        p = select_gemv("sm_90a", 1, n, k, 4, "float16", 132)
        cfg = p.config
        assert p.ctas * p.split * p.m_tiles <= 132 * cfg.min_blocks, p.short()
        busy = -(-n // 16) * p.split * cfg.kw  # warps with a share of the work
        assert busy >= 132 * 4, p.short()  # >= 4 busy warps an SM
        # measured choices (select.py): unsplit; 14336x4096 kw 1 one CTA an SM (18.81 us, kw 2
        # 19.17; session 28), 4096x14336 kw 4 (kw 1 would split)
        assert p.split == 1 and cfg.kw == (1 if n == 14336 else 4), p.short()
        assert p.gps % (4 * cfg.kw) == 0, p.short()  # whole quad steps: no idle lanes


def test_equal_items_prefer_k_warps_to_k_splits():
    # 1024x8192 at M = 1..16: kw 2 x 8 splits and kw 4 x 4 splits deal out the same items; each
    # split adds a partial the finishing warp reads (SPLIT_SUM_STEPS), so the planner takes the
    # K warps: measured 18-22% faster on the H100 (BENCHMARKS.md, session 25)
    # (at M <= 8 too, where kw 4 unsplit, 32 CTAs, was 19-27% slower)
    for bits in (2, 3):
        for m in (1, 4, 8, 9, 12, 16):
            p = plan_gemv("sm_90a", m, 1024, 8192, bits, "float16", 132)
            assert (p.config.kw, p.split) == (4, 4), p.short()


def test_plan_printable_and_memoised():
    a = select_gemv("sm_90a", 1, 4096, 4096, 4, "bfloat16", 132)
    assert a is select_gemv("sm_90a", 1, 4096, 4096, 4, "bfloat16", 132)
    s = a.short()
    assert "KbitGemvConfig(" in s and "split=" in s and "grid=" in s


def test_forced_split_rules():
    p = plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, split=1)
    assert p.split == 1 and not p.config.split_k
    p = plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, split=5)
    assert p.split == 5 and p.config.split_k
    with pytest.raises(ValueError, match=r"split_k=33: must be in 1\.\.32"):
        plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, split=33)
    with pytest.raises(ValueError, match="does not fit shared memory"):
        plan_gemv("sm_90a", 16, 4096, 14336, 4, "float16", 132, split=1)
    for bad in ("2", 1.5, [2]):  # was TypeError (1.5: a float split)
        with pytest.raises(ValueError, match=r"split_k=.*: must be in 1\.\.32"):
            plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, split=bad)
    with pytest.raises(ValueError, match=r"bits=6: kbit supports bits in 2\.\.5"):  # was KeyError
        plan_gemv("sm_90a", 1, 4096, 4096, 6, "float16", 132)


def _decoded_groups(p, n, k, m):
    """(tile, m pass, group) -> times decoded with the block's own scales, by the index math of
    gemv.cuh: tile slots, K warps (step it of warp kp = quad step it*kw + kp), lanes t of a quad,
    zero scales past the split's range."""
    cfg = p.config
    kw, slots, groups = cfg.kw, cfg.warps // cfg.kw, k // 128
    n_tiles = _cdiv(n, 16)
    seen = {}
    for x, y, z in np.ndindex(p.ctas, p.split, p.m_tiles):
        g0, g1 = y * p.gps, min(groups, (y + 1) * p.gps)
        n_it = _cdiv(_cdiv(g1 - g0, 4), kw)
        for warp in range(cfg.warps):
            kp, slot = warp % kw, warp // kw
            for tile in range(x * slots + slot, n_tiles, p.ctas * slots):
                for it, t in np.ndindex(n_it, 4):
                    rel = (it * kw + kp) * 4 + t
                    if rel <= g1 - g0 - 1:  # else: zero scales
                        key = (tile, z, g0 + rel)
                        seen[key] = seen.get(key, 0) + 1
    return seen


@pytest.mark.parametrize("kw", (1, 2, 4))
@pytest.mark.parametrize("n,k", [(200, 384), (1000, 4224), (4096, 14336), (14336, 4096), (16, 128)])
def test_k_warps_cover_every_group_once(n, k, kw):
    for m in (1, 9, 33):
        for split in (None, 1, 3):
            try:
                p = plan_gemv("sm_90a", m, n, k, 4, "float16", 132, split, kw)
            except ValueError as e:
                assert "does not fit" in str(e) or "must be in" in str(e)
                continue
            assert p.config.kw == kw
            seen = _decoded_groups(p, n, k, m)
            want = _cdiv(n, 16) * p.m_tiles * (k // 128)
            assert len(seen) == want and set(seen.values()) == {1}, p.short()


def test_k_warp_rules():
    with pytest.raises(ValueError, match="kw=3: expected one of"):
        plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, kw=3)
    with pytest.raises(ValueError, match=r"kw=4: must divide the CTA's warps \(2\)"):
        plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, kw=4, launch=(2, 4))
    with pytest.raises(ValueError, match="leave no shared memory for A"):
        plan_gemv("sm_90a", 1, 4096, 4096, 5, "float16", 132, kw=2, launch=(4, 4))
    for bad in (8, (8,), (8, 0), (0, 1), (8.0, 2), "ab"):  # was ZeroDivisionError / TypeError / ...
        with pytest.raises(ValueError, match=r"launch=.*: expected \(warps, min_blocks\), two ints >= 1"):
            plan_gemv("sm_90a", 1, 4096, 4096, 4, "float16", 132, launch=bad)
    p = plan_gemv("sm_90a", 1, 14336, 4096, 4, "float16", 132, kw=2)
    assert p.smem == lut_bytes(4) + 4096 * 2 + kw_red_bytes(p.config.warps, 2, 8)
    assert p.smem <= p.config.smem_bytes() and p.gps % 8 == 0



def test_k_warps_and_splits_follow_the_fitted_costs(monkeypatch):
    """kw 1 / 2 / 4 weighed at every split (select.py, constants fitted to session 24's H100
    grids under the launch table, i.e. without the one-CTA launch; 5 bits at
    m_tile 16: kw 1): picks of measured rows; a forced kw / split wins."""
    import kernelgen.kbit_gemm.select as S

    # the launch table the constants were fitted on
    monkeypatch.setattr(S, "ONE_CTA_MIN_M", dict.fromkeys(S.ONE_CTA_MIN_M, 1 << 31))
    for (n, k), bits, m, want in (((18432, 5120), 5, 1, (2, 1)), ((11008, 4096), 2, 1, (4, 1)),
                                  ((5120, 13824), 2, 1, (1, 3)), ((6144, 4096), 2, 1, (2, 1)),
                                  ((5120, 13824), 2, 8, (2, 3)), ((28672, 4096), 5, 1, (4, 1))):
        p = plan_gemv("sm_90a", m, n, k, bits, "float16", 132)
        assert (p.config.kw, p.split) == want, (n, k, bits, m, p.short())
    for (n, k), bits, m, want in (((4096, 1024), 3, 16, (2, 1)), ((4096, 4096), 2, 16, (2, 2)),
                                  ((14336, 4096), 2, 16, (1, 2)), ((4096, 1024), 5, 16, (1, 1))):
        p = plan_gemv("sm_90a", m, n, k, bits, "float16", 132)  # m_tile 16 (5 bits: kw 1 only)
        assert (p.config.kw, p.split) == want, (n, k, bits, m, p.short())
    forced = plan_gemv("sm_90a", 1, 6144, 4096, 2, "float16", 132, kw=1, split=2)
    assert (forced.config.kw, forced.split) == (1, 2)
    assert plan_gemv("sm_90a", 1, 6144, 4096, 2, "float16", 132, split=2).split == 2


@pytest.mark.parametrize("n,k", [(100, 96), (100, 0), (0, 128), (64, 4160)])
def test_shape_rule(n, k):
    with pytest.raises(ValueError, match="multiple of 128"):
        plan_gemv("sm_90a", 1, n, k, 4, "float16", 132)


def test_prewarm_table_is_modest_and_compilable():
    for arch in SM_COUNTS:
        cfgs = list(prewarm_configs([arch], {}))
        # 2 dtypes x (the table's launch: 4 bit-widths x m_tile 8 + 3 x m_tile 16, kw 1 / 2 / 4,
        # split or not, and 5 bits at m_tile 16 kw 1, split or not; one CTA an SM: every kw at
        # both m_tiles)
        assert 0 < len(cfgs) <= 2 * ((7 * 6 + 2) + 8 * 6) and len(set(cfgs)) == len(cfgs)
        # the table's caps fit every part (<= 99 KB); one CTA an SM opts in to what the
        # device allows a block (its plans keep within it)
        assert all(c.smem_bytes() <= 99 * 1024 for c in cfgs if c.min_blocks != 1)
        assert all(c.smem_bytes_on(99 * 1024) == 99 * 1024 and c.smem_bytes() == smem_cap(arch)
                   for c in cfgs if c.min_blocks == 1)
        assert {c.min_blocks == 1 for c in cfgs} == {True, False}


@pytest.mark.parametrize("arch", list(SM_COUNTS))
def test_prewarm_equals_dispatch(arch):
    """Every choice dispatch makes for a spec's shapes is in prewarm, and prewarm builds nothing
    dispatch never picks."""
    spec = {"shapes": [[14336, 4096], [4096, 14336], [3, 200, 384]], "bits": [3, 4],
            "dtypes": ["bfloat16", "float32"]}
    pre = set(prewarm_configs([arch], spec))
    picked = set()
    for sms, lim in PARTS[arch]:
        for bits in (3, 4):
            for m in list(range(1, 200)) + [1000, 5000]:
                for n, k in ((14336, 4096), (4096, 14336)):
                    picked.add(select_gemv(arch, m, n, k, bits, "bfloat16", sms, lim).config)
            picked.add(select_gemv(arch, 3, 200, 384, bits, "bfloat16", sms, lim).config)
    assert picked == pre
    assert all(c.dtype == "bfloat16" for c in pre)  # float32 is not this family's dtype
    assert pre <= set(prewarm_configs([arch], {}))


def test_prewarm_rejects_bad_shapes():
    with pytest.raises(UnsupportedConfigError, match="multiple of 128"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[4096, 100]]}))


@pytest.mark.parametrize("bad", [0, -1, None, "x", [132]])
def test_prewarm_rejects_bad_sm_counts(bad):
    """A profile's sm_counts reach every part walk (kernelgen.arch.parts_of): 0 was a
    ZeroDivisionError of the GEMV planner, None / a list a TypeError of int()."""
    from kernelgen.kbit_gemm import prewarm_all

    spec = {"shapes": [[4096, 4096]], "sm_counts": [132, bad]}
    with pytest.raises(UnsupportedConfigError, match=r"spec sm_counts: .*; expected SM counts, "
                                                     r"integers >= 1"):
        list(prewarm_all(["sm_90a"], spec))
    with pytest.raises(UnsupportedConfigError, match=r"expected \[N, K\]"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[1, 2, 3, 4]]}))
    from kernelgen.kbit_gemm import prewarm_all

    for bits in (7, 1, 4.0):  # the family's entry point names the rule (was KeyError for 7)
        with pytest.raises(UnsupportedConfigError, match=f"kbit_gemm spec: bits={bits!r}"):
            list(prewarm_all(["sm_90a"], {"bits": [bits]}))


@pytest.mark.parametrize("field,value", [("bits", 6), ("dtype", "float32"), ("m_tile", 12),
                                         ("warps", 3), ("min_blocks", 0), ("split_k", 1),
                                         ("kw", 3)])
def test_config_check_names_field(field, value):
    kw = dict(arch="sm_90a", bits=4, dtype="float16", m_tile=8, warps=8, split_k=False)
    kw[field] = value
    with pytest.raises(UnsupportedConfigError, match=f"{field}={value!r}"):
        KbitGemvConfig(**kw)


# -- rejected before any launch (no GPU needed) ----------------------------------------------
def test_quantize_weight_rules():
    with pytest.raises(ValueError, match=r"bits=6: kbit supports bits in 2\.\.5"):
        kg.quantize_weight(np.ones((16, 128), np.float16), 6)
    with pytest.raises(ValueError, match=r"w: shape \[N=16, K=100\].*multiple of 128"):
        kg.quantize_weight(np.ones((16, 100), np.float16), 4)
    with pytest.raises(ValueError, match="2-D weight"):
        kg.quantize_weight(np.ones(128, np.float16), 4)
    with pytest.raises(ValueError, match="NumPy arrays live on the host"):
        kg.quantize_weight(np.ones((16, 128), np.float16), 4)


def test_gemm_rules_before_launch():
    with pytest.raises(ValueError, match="W: expected a KbitLinear"):
        kg.gemm(np.ones((1, 128), np.float16), object())
    # forced counts int() cannot take, and a plan that is not a plan: were TypeError (int of a
    # list) / AttributeError (plan.config) on the device path
    a = np.ones((1, 128), np.float16)
    with pytest.raises(ValueError, match=r"split_k=\[2\]: expected an integer"):
        kg.gemm(a, object(), split_k=[2])
    with pytest.raises(ValueError, match=r"kw=\(2,\): expected an integer"):
        kg.gemm(a, object(), kw=(2,))
    from kernelgen.kbit_gemm.api import gemm_with_plan
    with pytest.raises(ValueError, match="plan: int; expected a GemvPlan of plan_gemv"):
        gemm_with_plan(a, object(), 5)
    with pytest.raises(ValueError, match=r"KbitLinear: exactly one of q \(flat layout\) and tiled"):
        kg.KbitLinear(q=None, n=16, k=128)  # gemm trusts n, k: they are checked at construction
    with pytest.raises(ValueError, match=r"KbitLinear: q must be a KbitTensor of shape \(16, 128\)"):
        kg.KbitLinear(q=object(), n=16, k=128)
    with pytest.raises(ValueError, match="expected a KbitTensor"):
        kg.KbitLinear.from_kbit(np.ones(4))


# -- the reference ------------------------------------------------------------------------------
def _quantized(rng, n, k, bits):
    w = (rng.standard_normal((n, k)) * rng.uniform(0.05, 2, (n, 1))).astype(np.float32)
    cb = R.create_normal_float_codebook(bits)
    packed, _, a8 = R.quantize(w, bits, cb)
    return w, packed, a8, cb


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_reference_against_loops(bits):
    rng = np.random.default_rng(bits)
    n, k, m = 5, 128, 3
    w, packed, a8, cb = _quantized(rng, n, k, bits)
    wd = GR.dequantize_weight(packed, a8, cb, bits, n, k)
    # independent dequant: element by element from the bit planes
    planes = packed.reshape(-1, bits)
    for r in range(n):
        for c in range(k):
            blk = r * (k // 32) + c // 32
            idx = sum(((int(planes[blk, b]) >> (c % 32)) & 1) << b for b in range(bits))
            assert wd[r, c] == np.float64(cb[idx]) * np.float64(R.e4m4_decode(a8[blk : blk + 1])[0])
    a = rng.standard_normal((m, k)).astype(np.float16)
    bias = rng.standard_normal(n).astype(np.float16)
    c = GR.gemm(a, wd, bias)
    for i in range(m):
        for j in range(n):
            want = sum(float(a[i, q]) * wd[j, q] for q in range(k)) + float(bias[j])
            assert abs(c[i, j] - want) <= 1e-9 * max(1.0, abs(want))


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_reference_close_to_unquantized(bits):
    rng = np.random.default_rng(10 + bits)
    n, k = 64, 512
    w, packed, a8, cb = _quantized(rng, n, k, bits)
    a = R.f32_to_bf16(rng.standard_normal((4, k)).astype(np.float32))
    c = GR.gemm(a, GR.dequantize_weight(packed, a8, cb, bits, n, k), dtype="bfloat16")
    exact = R.bf16_to_f32(a).astype(np.float64) @ w.astype(np.float64).T
    # the quantization error of W, not of the GEMM: loose, shrinking with bits
    assert GR.rel_error(c, exact) < {2: 0.6, 3: 0.35, 4: 0.2, 5: 0.1}[bits]


def test_rel_error_sees_nan():
    assert np.isnan(GR.rel_error(np.array([np.nan, 1.0]), np.array([1.0, 1.0])))
    assert GR.rel_error(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0


def test_prewarm_spec_shapes_are_checked():
    from kernelgen.errors import UnsupportedConfigError
    from kernelgen.kbit_gemm import prewarm_all

    with pytest.raises(UnsupportedConfigError, match=r"kbit_gemm spec shapes: \[1, 2, 3, 4\]"):
        list(prewarm_all(["sm_90a"], {"shapes": [[1, 2, 3, 4]]}))
    with pytest.raises(UnsupportedConfigError, match=r"spec shape \[4096, 100\].*multiple of 128"):
        list(prewarm_all(["sm_90a"], {"shapes": [[4096, 100]]}))
    cfgs = list(prewarm_all(["sm_90a"], {"shapes": [["16", 4096, 4096]], "bits": [4]}))
    assert cfgs and all(c.arch == "sm_90a" for c in cfgs)


def test_passes_beyond_the_grid_limit_are_refused():
    """M passes go on grid.z (at most 65535): a forced GEMV over more raises, naming the path
    that takes such M; the largest M that fits plans."""
    with pytest.raises(ValueError, match="68750 GEMV passes of 16 tokens.*path='dequant'"):
        plan_gemv("sm_90a", 1_100_000, 4096, 4096, 3, "float16", 132)
    assert plan_gemv("sm_90a", 65535 * 16, 4096, 4096, 3, "float16", 132).grid[2] == 65535
