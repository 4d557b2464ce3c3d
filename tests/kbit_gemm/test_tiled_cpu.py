"""The tiled layout of 4-bit kbit weights (kernelgen/kbit_gemm/tiled.py) without a GPU: the
repack against an element-by-element model, the path rule and planner, the configs, and that
prewarm covers every config the planner can return."""

import numpy as np
import pytest

from kernelgen.errors import UnsupportedConfigError
from kernelgen.fp4_gemm.config import KBIT4_LUT_BYTES, Fp4GemvConfig, Fp4TileConfig, Fp4WgmmaConfig
from kernelgen.fp4_gemm.layout import ARRANGEMENTS, canonical
from kernelgen.kbit import reference as R
from kernelgen.kbit_gemm import prewarm_all
from kernelgen.kbit_gemm import tiled as TL
from kernelgen.kbit_gemm.config import KbitTiledDequantConfig


def _planes(rng, n, k):
    """(flat bit planes [n*k/32 * 4], codes [n, k], E4M4 bytes [n*k/32]) of random codes."""
    cb = R.create_normal_float_codebook(4)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.1, 2, (n, 1))).astype(np.float32)
    packed, _, a8 = R.quantize(w, 4, cb)
    return packed, R.unpack_indices(packed, 4).reshape(n, k), a8


def test_codes_of_planes_is_unpack_indices():
    rng = np.random.default_rng(0)
    packed, codes, _ = _planes(rng, 48, 256)
    got = TL.codes_of_planes(np, packed, 48, 256)
    assert got.dtype == np.uint8 and np.array_equal(got, codes)


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("n", (16, 40))
def test_tiled_layout_element_by_element(n, arrangement):
    """Element (row, kk): tile row // 16, half (row % 16) // 8, lane row g = row % 8, step
    kk // 128, word j = (kk % 128) // 32, lane t = (kk % 32) // 8, code i = kk % 8 in bits
    4i..4i+3 of word j of chunk t; the row's scale byte j of the step = the E4M4 of block
    kk // 32. Rows past N are zero."""
    rng = np.random.default_rng(n)
    k = 384
    packed, codes, a8 = _planes(rng, n, k)
    data, scales = TL.tile_kbit4(np, packed, a8, n, k, arrangement)
    d, s = canonical(arrangement, data, scales, 4)
    t_tiles = -(-n // 16)
    assert d.shape == (t_tiles, k // 128, 2, 8, 4, 16) and s.shape == (t_tiles, k // 128, 8, 1, 2, 4)
    for row in range(t_tiles * 16):
        tl, h, g = row // 16, (row % 16) // 8, row % 8
        for kk in range(k):
            q, j, t, i = kk // 128, (kk % 128) // 32, (kk % 32) // 8, kk % 8
            word = int(d[tl, q, h, g, t].view(np.uint32)[j])
            want = codes[row, kk] if row < n else 0
            assert (word >> (4 * i)) & 15 == want, (row, kk)
            want_s = a8[row * (k // 32) + kk // 32] if row < n else 0
            assert s[tl, q, g, 0, h, j] == want_s, (row, kk)


def test_path_rule_and_forced_paths():
    sms = 132
    big_n = TL.TILE_BN * sms  # tile CTAs fill the SMs
    k_big = TL.BIG_WEIGHT // big_n + 128
    assert TL.path_tiled(1, 14336, 4096, sms) == "gemv"
    assert TL.path_tiled(TL.GEMV_MAX_M, 1024, 128, sms) == "gemv"
    assert TL.path_tiled(TL.GEMV_MAX_M + 1, 4096, 4096, sms) == "dequant"  # a small weight
    assert TL.path_tiled(TL.GEMV_MAX_M + 1, big_n, k_big, sms) == "gemv"
    assert TL.path_tiled(TL.TILE_MIN_M - 1, big_n, k_big, sms) == "gemv"
    assert TL.path_tiled(TL.TILE_MIN_M, big_n, k_big, sms) == "tile"
    assert TL.path_tiled(TL.MID_MAX_M, big_n, k_big, sms) == "tile"
    assert TL.path_tiled(TL.MID_MAX_M, 4096, 14336, sms) == "gemv"  # 32 tile CTAs
    assert TL.path_tiled(TL.MID_MAX_M + 1, big_n, k_big, sms) == "dequant"
    # 17..32 tokens on a weight too large for L2 whose tile CTAs fill the SMs: the tile path
    n_w, k_w = 28672, 4096
    assert n_w * k_w >= TL.TILE_LOW_MIN_WEIGHT and n_w // TL.TILE_BN >= sms
    assert [TL.path_tiled(m, n_w, k_w, sms) for m in (16, 17, 32, 33)] == ["gemv", "tile", "tile", "gemv"]
    assert TL.path_tiled(17, 14336, 4096, sms) == "gemv"  # 58.7 M weights: the passes share L2
    assert TL.path_tiled(17, n_w, k_w, 2 * sms) == "gemv"  # too few tile CTAs
    # the bound between 16896x4096 (GEMV faster) and 17920x4096 (tile faster), and on a short K
    # (<= TILE_LOW_MAX_K) the tile path whatever the size, where its CTAs cover the SMs
    assert 16896 * 4096 < TL.TILE_LOW_MIN_WEIGHT <= 17920 * 4096
    assert [TL.path_tiled(24, n, 4096, sms) for n in (16896, 17920)] == ["gemv", "tile"]
    for n, k in ((20480, 1024), (18432, 1536), (20480, 2048)):
        assert [TL.path_tiled(m, n, k, sms) for m in (16, 17, 32, 33)] == ["gemv", "tile", "tile", "gemv"]
    assert TL.path_tiled(24, 16384, 1536, sms) == "gemv"  # 128 tile CTAs < 132 SMs
    assert TL.path_tiled(24, 20480, 2048 + 128, sms) == "gemv"  # 42 M weights, past the short K
    # sm_90a: the wgmma path for 33..256 tokens where a K split keeps >= 16 steps (the H100
    # sweep in fp4_gemm/select.py), ahead of the rule above; other archs keep the rule
    for m, n, k, want in ((32, 14336, 4096, "gemv"), (33, 14336, 4096, "wgmma"), (256, 14336, 4096, "wgmma"),
                          (257, 14336, 4096, "dequant"), (128, 4096, 14336, "wgmma"), (64, 4096, 4096, "gemv")):
        assert TL.plan_tiled("sm_90a", m, n, k, "float16", sms).path == want, (m, n, k)
        assert TL.plan_tiled("sm_80", m, n, k, "float16", sms).path == TL.path_tiled(m, n, k, sms)
        if want == "wgmma" and TL.path_tiled(m, n, k, sms) != "dequant":  # a forced K split
            ch = TL.plan_tiled("sm_90a", m, n, k, "float16", sms, split=2)  # keeps the rule's path
            assert ch.path == TL.path_tiled(m, n, k, sms) and ch.plan.split == 2, ch.short()
    with pytest.raises(ValueError, match="no K split"):  # M = 129..256: the rule says dequant
        TL.plan_tiled("sm_90a", 200, 14336, 4096, "float16", sms, split=2)
    for path in TL.TILED_PATHS:
        ch = TL.plan_tiled("sm_90a", 40, 1152, 4224, "float16", sms, path=path)
        assert ch.path == path and (ch.plan is None) == (path == "dequant")
        if ch.plan is not None:
            assert ch.plan.config.fmt == "kbit4" and ch.plan.path == path
    ch = TL.plan_tiled("sm_90a", 40, 1152, 4224, "bfloat16", sms, path="tile", split=3)
    assert ch.plan.split == 3 and ch.plan.config.enc == "bfloat16"
    with pytest.raises(ValueError, match="path='mma': a tiled 4-bit weight runs on"):
        TL.plan_tiled("sm_90a", 40, 1152, 4224, "float16", sms, path="mma")
    with pytest.raises(ValueError, match="has no K split"):
        TL.plan_tiled("sm_90a", 400, 1152, 4224, "float16", sms, path="dequant", split=2)
    with pytest.raises(ValueError, match="M=0"):
        TL.plan_tiled("sm_90a", 0, 1152, 4224, "float16", sms)
    for path in (None, "gemv", "tile", "wgmma"):  # a split that is not an int: was TypeError
        with pytest.raises(ValueError, match=r"split_k='2': must be in 1\.\.33"):
            TL.plan_tiled("sm_90a", 40, 1152, 4224, "float16", sms, path=path, split="2")
    for n, k in ((0, 4096), (1152, 100)):  # N = 0 was a ZeroDivisionError in the wgmma rule
        with pytest.raises(ValueError, match=rf"shape \[N={n}, K={k}\]; the kbit GEMM needs N >= 1"):
            TL.plan_tiled("sm_90a", 64, n, k, "float16", sms)


def test_gemv_tiles_a_warp():
    """kbit4 takes two tiles a warp at both m_tiles (KBIT4_TPW) unless that needs a global K
    split or leaves SMs without a CTA; the FP4 formats keep GEMV_TPW (one at m_tile 8)."""
    from kernelgen.fp4_gemm.select import plan

    for (n, k), tpw in (((14336, 4096), 2), ((28672, 4096), 2), ((4096, 14336), 1),
                        ((4096, 4096), 1), ((1024, 4096), 1)):
        for m in (1, 8):
            p = plan("sm_90a", m, n, k, "kbit4", "bfloat16", 132)
            assert (p.config.m_tile, p.config.tpw, p.split) == (8, tpw, 1), (n, k, m, p.short())
    assert plan("sm_90a", 1, 14336, 4096, "mxfp4", "bfloat16", 132).config.tpw == 1
    p = plan("sm_90a", 1, 14336, 4096, "kbit4", "bfloat16", 132)
    assert (p.kw, p.grid) == (4, (224, 1, 1)), p.short()


def test_code_table_and_balanced_rules():
    """The wide (64 KB) code table where every part's SM holds it for both CTAs (not on 99 KB
    parts); the balanced GEMV where the kw plan fills at most BAL_FILL of the CTA slots, on
    weights of at least BAL_MIN_ELEMS, in one pass, kbit4 only unless forced; its scratch."""
    from kernelgen.fp4_gemm.config import KBIT4_WIDE_LUT_BYTES
    from kernelgen.fp4_gemm.select import BAL_FILL, BAL_MIN_ELEMS, kbit4_lut_wide, plan

    for arch, lim, wide in (("sm_90a", None, True), ("sm_80", None, True), ("sm_80", 99 * 1024, False),
                            ("sm_120a", None, False), ("sm_100a", None, True)):
        for m in (1, 16):
            p = plan(arch, m, 14336, 4096, "kbit4", "float16", 132, smem_limit=lim)
            assert p.config.lut_wide is wide and p.smem == (KBIT4_WIDE_LUT_BYTES if wide else KBIT4_LUT_BYTES)
            assert kbit4_lut_wide(arch, p.config.m_tile, p.config.warps, 16, lim) is wide
    assert not plan("sm_90a", 1, 14336, 4096, "mxfp4", "float16", 132).config.lut_wide
    with pytest.raises(UnsupportedConfigError, match="lut_wide=True"):
        Fp4GemvConfig(arch="sm_90a", fmt="nvfp4", lut_wide=True).check()
    # 17408 x 4096: the kw plan takes 136 of 264 slots (kw 2); 14336 x 4096 224 (kw 4)
    for m in (1, 8, 16):
        kw = plan("sm_90a", m, 17408, 4096, "kbit4", "float16", 132, balanced=False)
        assert kw.grid[0] <= BAL_FILL[kw.config.m_tile] * 264 and not kw.balanced, kw.short()
        p = plan("sm_90a", m, 17408, 4096, "kbit4", "float16", 132)
        assert p.balanced and p.grid == (264, 1, 1) and p.kw == 1 and p.config.pf == 0, p.short()
        assert p.scratch_sizes(m, 17408) == (264 * 8 * 2 * 32 * 4 * 2 * (p.config.m_tile // 8), 544)
        assert not plan("sm_90a", m, 14336, 4096, "kbit4", "float16", 132).balanced
        assert not plan("sm_90a", m, 17408, 4096, "nvfp4", "float16", 132).balanced
    assert plan("sm_90a", 16, 10240, 8192, "kbit4", "float16", 132).balanced  # fill 0.61 <= 0.66
    assert not plan("sm_90a", 1, 10240, 8192, "kbit4", "float16", 132).balanced  # > 0.56
    assert not plan("sm_90a", 17, 17408, 4096, "kbit4", "float16", 132).balanced  # two passes
    assert 2560 * 2560 < BAL_MIN_ELEMS and not plan("sm_90a", 1, 2560, 2560, "kbit4", "float16", 132).balanced
    assert plan("sm_90a", 1, 17408, 4096, "kbit4", "float16", 132, split=1).kw == 2  # forced: kw
    f = plan("sm_90a", 7, 200, 1024, "nvfp4", "float16", 132, path="gemv", balanced=True)
    # the FP4 formats keep GEMV_TPW (1 at m_tile 8): 13 units x 8 steps, a CTA a unit
    assert f.balanced and f.grid == (13, 1, 1) and f.scratch_sizes(7, 200)[1] == 13, f.short()
    assert plan("sm_90a", 1, 14336, 4096, "kbit4", "float16", 132).scratch_sizes(1, 14336) is None
    with pytest.raises(UnsupportedConfigError, match="balanced=True"):
        Fp4GemvConfig(arch="sm_90a", fmt="kbit4", balanced=True, pf=1).check()
    with pytest.raises(ValueError, match="balanced=True: M=17; the balanced GEMV takes one pass"):
        plan("sm_90a", 17, 17408, 4096, "kbit4", "float16", 132, path="gemv", balanced=True)
    with pytest.raises(ValueError, match="balanced=True: a bool, bandwidth path only"):
        plan("sm_90a", 1, 17408, 4096, "kbit4", "float16", 132, path="tile", balanced=True)
    with pytest.raises(ValueError, match="balanced=True: its grid has no K split"):
        plan("sm_90a", 1, 17408, 4096, "kbit4", "float16", 132, path="gemv", balanced=True, split=2)
    for arch, tpw in (("sm_90a", 2), ("sm_80", 2), ("sm_100a", 1), ("sm_120a", 1)):  # m_tile 16
        assert plan(arch, 16, 17408, 4096, "kbit4", "float16", 132, path="gemv", balanced=True).config.tpw == tpw
        assert plan(arch, 8, 17408, 4096, "kbit4", "float16", 132, path="gemv", balanced=True).config.tpw == 2


def test_kbit4_configs():
    cfg = Fp4GemvConfig(arch="sm_90a", fmt="kbit4", dtype="float16", enc="float16")
    cfg.check()
    assert cfg.smem_bytes() == KBIT4_LUT_BYTES
    assert cfg.template_vars()["fmt_id"] == 2
    with pytest.raises(UnsupportedConfigError, match="enc must equal dtype"):
        Fp4GemvConfig(arch="sm_90a", fmt="kbit4", dtype="float16", enc="bfloat16").check()
    with pytest.raises(UnsupportedConfigError, match="32 KB code table"):
        Fp4GemvConfig(arch="sm_90a", fmt="kbit4", warps=4).check()
    t = Fp4TileConfig(arch="sm_90a", fmt="kbit4", bm=64, stages=2)
    t.check()
    assert t.smem_bytes() == Fp4TileConfig(arch="sm_90a", fmt="mxfp4", bm=64, stages=2).smem_bytes() + KBIT4_LUT_BYTES
    KbitTiledDequantConfig(arch="sm_80", dtype="bfloat16").check()
    KbitTiledDequantConfig(arch="sm_80", dtype="float32").check()  # KbitLinear.dequantize
    assert KbitTiledDequantConfig(arch="sm_80", dtype="float32").template_vars()["ctype"] == "float"
    with pytest.raises(UnsupportedConfigError):
        KbitTiledDequantConfig(arch="sm_80", dtype="int8").check()


ARCHS = ("sm_80", "sm_90a", "sm_100a", "sm_120a")


def test_prewarm_layouts():
    kinds = {type(c).__name__ for c in prewarm_all(ARCHS, {"bits": [4]})}
    assert kinds == {"Fp4GemvConfig", "Fp4TileConfig", "Fp4WgmmaConfig", "KbitTiledDequantConfig"}
    assert all(c.fmt == "kbit4" for c in prewarm_all(ARCHS, {"bits": [4]})
               if isinstance(c, (Fp4GemvConfig, Fp4TileConfig, Fp4WgmmaConfig)))
    assert all(c.arch == "sm_90a" for c in prewarm_all(ARCHS, {"bits": [4]}) if isinstance(c, Fp4WgmmaConfig))
    flat4 = list(prewarm_all(ARCHS, {"bits": [4], "layouts": ["flat"]}))
    assert {type(c).__name__ for c in flat4} == {"KbitGemvConfig", "KbitMmaConfig",
                                                "KbitDequantizeConfig", "Fp4WgmmaConfig"}
    assert all(c.flat == 4 and c.arch == "sm_90a" for c in flat4 if isinstance(c, Fp4WgmmaConfig))
    assert not any(isinstance(c, Fp4GemvConfig) for c in prewarm_all(ARCHS, {"bits": [2, 3, 5]}))
    with pytest.raises(UnsupportedConfigError, match="layouts"):
        list(prewarm_all(ARCHS, {"layouts": ["packed"]}))
    # "layouts" is about 4-bit weights: 3 bits keep their (flat) kernels whatever it says
    for layouts in (["tiled"], ["flat"]):
        cfgs = list(prewarm_all(ARCHS, {"bits": [3, 4], "layouts": layouts}))
        assert any(getattr(c, "bits", None) == 3 for c in cfgs), layouts
        tiled4 = [c for c in cfgs if getattr(c, "fmt", None) == "kbit4" and not getattr(c, "flat", 0)]
        assert bool(tiled4) == (layouts == ["tiled"])
    # fp32 dequantize (KbitLinear.dequantize) only where asked for, as the compile matrix does
    f32 = KbitTiledDequantConfig(arch="sm_90a", dtype="float32")
    assert f32 not in set(prewarm_all(["sm_90a"], {"bits": [4]}))
    assert f32 in set(prewarm_all(["sm_90a"], {"bits": [4], "dtypes": ["float16", "float32"]}))


def test_tile_path_on_a_part_with_less_shared_memory():
    """A device whose blocks get less shared memory than the target's plans assume (8.6 / 8.9
    under sm_80, 99 KB): the tile path keeps fewer stages; where not even 2 stages fit, the
    rule's tile path becomes the GEMV and a forced one raises naming the rule."""
    m, n, k = TL.MID_MAX_M, 128 * 72, 8192
    full = TL.plan_tiled("sm_80", m, n, k, "float16", 72)
    assert full.path == "tile" and full.plan.smem > 101376 and full.plan.config.stages == 4
    small = TL.plan_tiled("sm_80", m, n, k, "float16", 72, smem_limit=101376)
    assert small.path == "tile" and small.plan.smem <= 101376
    assert small.plan.config.replace(stages=4) == full.plan.config and small.plan.config.stages == 2
    assert TL.plan_tiled("sm_80", m, n, k, "float16", 72, smem_limit=full.plan.smem) == full
    tiny = 48 * 1024  # below 2 stages of BM 32 with the 32 KB table
    gemv = TL.plan_tiled("sm_80", m, n, k, "float16", 72, smem_limit=tiny)
    assert gemv.path == "gemv" and gemv.plan.smem <= tiny
    with pytest.raises(UnsupportedConfigError, match="shared memory a block.*path='gemv'"):
        TL.plan_tiled("sm_80", m, n, k, "float16", 72, path="tile", smem_limit=tiny)


def test_forced_tile_path_fits_every_arch():
    """A forced tile path past the selector's range keeps BM 64 (BM 128 with the 32 KB table does
    not fit sm_120a's 99 KB)."""
    for arch in ARCHS:
        ch = TL.plan_tiled(arch, 300, 1152, 4224, "float16", 84, path="tile")
        assert ch.plan.config.bm == 64
        assert ch.plan.smem <= 99 * 1024 or arch != "sm_120a"


SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096), (28672, 8192), (200, 384),
          (1152, 4224))


def test_prewarm_covers_every_plan():
    """Every config plan_tiled returns (every M to 4097, these shapes, each arch's SM counts)
    is in the shape-walk prewarm, and that is within the no-shape enumeration."""
    from kernelgen.arch import PARTS

    full = set(prewarm_all(ARCHS, {"bits": [4]}))
    for n, k in SHAPES:  # each shape's walk on its own (another shape's plans hide no gap)
        walked = set(prewarm_all(ARCHS, {"bits": [4], "shapes": [[n, k]]}))
        assert walked <= full
        for arch in ARCHS:
            for sms, lim in PARTS[arch]:
                for m in range(1, 4098):
                    for dtype in ("float16", "bfloat16"):
                        ch = TL.plan_tiled(arch, m, n, k, dtype, sms, smem_limit=lim)
                        cfg = ch.plan.config if ch.plan is not None else \
                            KbitTiledDequantConfig(arch=arch, dtype=dtype)
                        assert cfg in walked, (arch, sms, n, k, m, dtype)


def test_flat_wgmma_plans_configs_and_rules():
    """Flat 2..4-bit weights on the wgmma kernel (forced path): the tiled weight's wgmma plan with
    Fp4WgmmaConfig.flat = bits, compiled for sm_90a without spills; 5 bits, another arch, a flat
    field off kbit4 or out of range raise naming the rule."""
    from kernelgen.core.compile import compile_cubin, resource_summary
    from kernelgen.core.render import render
    from kernelgen.errors import UnsupportedConfigError
    from kernelgen.fp4_gemm.config import Fp4WgmmaConfig
    from kernelgen.kbit_gemm.tiled import plan_flat_wgmma, plan_tiled

    for bits in (2, 3, 4):
        for m, n, k, split in ((128, 14336, 4096, None), (64, 4096, 14336, 2)):
            p = plan_flat_wgmma("sm_90a", m, n, k, bits, "float16", 132, split)
            base = plan_tiled("sm_90a", m, n, k, "float16", 132, "wgmma", split).plan
            assert p.config == base.config.replace(flat=bits) and p.grid == base.grid
        cfg = plan_flat_wgmma("sm_90a", 128, 14336, 4096, bits, "bfloat16", 132).config
        res = resource_summary(compile_cubin(cfg, render(cfg)).log)
        assert res["spill_bytes"] == 0, (cfg, res)
    with pytest.raises(ValueError, match=r"flat weights of \(2, 3, 4\) bits.*this one has 5"):
        plan_flat_wgmma("sm_90a", 128, 14336, 4096, 5, "float16", 132)
    with pytest.raises(ValueError, match="sm_90a"):
        plan_flat_wgmma("sm_80", 128, 14336, 4096, 2, "float16", 108)
    for kw in (dict(fmt="nvfp4", flat=2), dict(fmt="kbit4", flat=1), dict(fmt="kbit4", flat=5)):
        with pytest.raises(UnsupportedConfigError, match="flat="):
            Fp4WgmmaConfig(arch="sm_90a", dtype="float16", enc="float16", **kw).check()


def test_flat_wgmma_rule():
    """flat_wgmma_takes (H100 grids of session 37): unsplit wgmma plans whose CTAs fill their last
    wave to FLAT_WGMMA_FILL, 2 / 3 bits at 64..256 tokens, 4 bits at 96..128, K >= 2048, sm_90a;
    plan_gemm returns the flat wgmma plan there; prewarm with shapes lists exactly those configs."""
    from kernelgen.kbit_gemm import tc_select as S
    from kernelgen.kbit_gemm.tiled import FLAT_WGMMA_M, flat_wgmma_takes

    def takes(m, n, k, bits, arch="sm_90a", sms=132):
        return flat_wgmma_takes(arch, m, n, k, bits, "float16", sms)

    assert [takes(m, 14336, 4096, 2) for m in (63, 64, 128, 256, 257)] == [False, True, True, True, False]
    assert [takes(m, 14336, 4096, 4) for m in (64, 95, 96, 128, 129)] == [False, False, True, True, False]
    assert all(takes(128, n, k, 3) for n, k in ((28672, 4096), (13824, 5120), (16384, 2048), (14336, 8192)))
    assert not any(takes(128, n, k, 3) for n, k in (
        (18944, 3584),  # 148 CTAs: a last wave of 16
        (12288, 4096),  # 96 CTAs: fill 0.73
        (4096, 14336), (8192, 4096),  # split K
        (32768, 1024)))  # K < FLAT_WGMMA_MIN_K
    assert not takes(128, 14336, 4096, 5) and not takes(128, 14336, 4096, 2, "sm_80", 108)
    assert not takes(128, 14336, 4096, 2, "sm_100a", 148)
    ch = S.plan_gemm("sm_90a", 128, 14336, 4096, 2, "bfloat16", 132)
    assert ch.path == "wgmma" and ch.plan.config.flat == 2 and ch.plan.config.dtype == "bfloat16"
    assert S.plan_gemm("sm_90a", 128, 18944, 3584, 2, "float16", 132).path != "wgmma"
    cfgs = [c for c in prewarm_all(["sm_90a"], {"bits": [2], "shapes": [[14336, 4096], [18944, 3584]],
                                                "dtypes": ["float16"]})
            if isinstance(c, Fp4WgmmaConfig)]
    want = {S.plan_gemm("sm_90a", m, 14336, 4096, 2, "float16", 132).plan.config
            for m in range(FLAT_WGMMA_M[2][0], FLAT_WGMMA_M[2][1] + 1)}
    assert set(cfgs) == want and all(c.flat == 2 for c in cfgs)
