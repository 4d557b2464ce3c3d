"""FP4 GEMM checks that need no GPU: the weight-word decode and scale decode (emulated bit for
bit against kernelgen/mx/reference.py), the selector, prewarm = dispatch, configs and input rules."""

import re
from pathlib import Path

import numpy as np
import pytest

from kernelgen.arch import PARTS, SM_COUNTS, get_arch
from kernelgen.core.render import render
from kernelgen.errors import UnsupportedConfigError
from kernelgen.fp4_gemm import reference as GR
from kernelgen.fp4_gemm.config import (
    ENC_ID,
    Fp4DequantConfig,
    Fp4GemvConfig,
    Fp4TileConfig,
    Fp4WgmmaConfig,
    tile_smem,
    wgmma_smem,
)
from kernelgen.fp4_gemm.layout import (
    E2M1_MASK,
    E2M1_MASK_BF16,
    ENCODINGS,
    decode_word,
    encode_words,
)
from kernelgen.fp4_gemm.select import (
    DENSE_MIN_M,
    GEMV_CTA_WARPS,
    GEMV_DEPTH,
    GEMV_MAX_M,
    GEMV_TPW,
    KW_MAX,
    MIN_STEPS,
    SHORT_K_STEPS,
    WGMMA_WAVE_MIN,
    bm_for,
    late_fill,
    path_for,
    plan,
    prewarm_configs,
    select_fp4,
    stages_for,
    wave_fill,
    wgmma_takes,
)
from kernelgen.mx import reference as MR

from ._weights import host_weight

HEADER = Path(__file__).resolve().parents[2] / "templates" / "fp4_gemm" / "fp4.cuh"


# -- the device decode, emulated -----------------------------------------------------------------
E2M1 = MR.decode(np.arange(16, dtype=np.uint8), MR.E2M1).astype(np.float64)


def _raw_values(o, dtype, enc="float16"):
    """Two raw T values of a pair decoded from a word encoded for `enc` (fp4.cuh e2m1_word; a
    word encoded for the other type moves the magnitude: bf16 three bits down, fp16 up)."""
    if dtype != enc:
        if dtype == "bfloat16":
            o = (o & 0x90009000) | ((o >> 3) & ~0x90009000 & 0xFFFFFFFF)
        else:
            o = (o & 0x80048000) | ((o << 3) & ~0x80048000 & 0xFFFFFFFF)
    if dtype == "bfloat16":
        return (np.array([o & 0xFFFF, o >> 16], np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.array([o & 0xFFFF, o >> 16], np.uint16).view(np.float16).astype(np.float64)


def test_header_decode_is_the_emulated_one():
    """fp4.cuh e2m1_word is the decode layout.py inverts: its masks and ENC ids, and in each
    encoding's branch the rotations / shifts of ENCODINGS, that branch's mask, and the
    conversion for the other activation type (its guard and its shift)."""
    src = HEADER.read_text()
    assert f"E2M1_MASK = 0x{E2M1_MASK:08X}u" in src
    assert f"E2M1_MASK_BF16 = 0x{E2M1_MASK_BF16:08X}u" in src
    assert f"constexpr int ENC_F16 = {ENC_ID['float16']};" in src
    assert f"constexpr int ENC_BF16 = {ENC_ID['bfloat16']};" in src
    body = src[src.index("void e2m1_word("):]
    body = body[: body.index("\n}\n")]
    guard = "if constexpr (ENC == ENC_F16) {"
    assert body.count(guard) == 1 and body.count("} else {") == 1
    branches = dict(zip(("float16", "bfloat16"), body.split(guard)[1].split("} else {"), strict=True))
    cross = {"float16": ("RawUnit<T>::EXP == 126", "bitsel(0x90009000u, o[p], o[p] >> 3)"),
             "bfloat16": ("RawUnit<T>::EXP == 14", "bitsel(0x80048000u, o[p], o[p] << 3)")}
    for enc, text in branches.items():
        _, rot1, t2, t3 = ENCODINGS[enc]
        mask = "E2M1_MASK" if enc == "float16" else "E2M1_MASK_BF16"
        want = [f"__funnelshift_l(q, q, {rot1}) & {mask};", f"o[0] = q & {mask};", *cross[enc]]
        want += [f"__funnelshift_l(q, q, {r})" if kind == "r" else f"q << {r}" for kind, r in t2 + t3]
        for expr in want:
            assert expr in text, (enc, expr)
        assert text.count(f"& {mask};") == 4 and "E2M1_MASK" not in text.replace(mask, ""), enc


@pytest.mark.parametrize("enc", ["float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_e2m1_word_decode_exact(dtype, enc):
    """Every code in every element slot, and random words: encode (prepare, for either
    activation type) then the kernel's shifts and masks give e2m1 * 2^-14 (fp16) / 2^-126
    (bf16), signs (of zero too) included."""
    rng = np.random.default_rng(0)
    words = [c << (4 * i) for i in range(8) for c in range(16)]
    words += [0x76543210, 0xFEDCBA98] + [int(x) for x in rng.integers(0, 2**32, 2000, dtype=np.uint64)]
    plain = np.array(words, np.uint64).astype(np.uint32)
    stored = encode_words(np, plain, enc)
    assert stored.dtype == np.uint32 and len(set(stored.tolist())) == len(set(plain.tolist()))
    exp = 14 if dtype == "float16" else 126
    for w, q in zip(plain.tolist(), stored.tolist(), strict=True):
        got = np.concatenate([_raw_values(o, dtype, enc) for o in decode_word(q, enc)])
        want = E2M1[[(w >> (4 * i)) & 0xF for i in range(8)]] * 2.0 ** -exp
        assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), hex(w)


# fp4.cuh e4m3x2_to_half2 without the sm_89 cvt is common/dtypes.cuh e4m3x2_to_f16x2_soft,
# replayed on every pair of codes by tests/mx_gemm/test_mx_gemm_cpu.py test_soft_fp8_conversion_replayed


def _bf16_exact(v):
    v32 = v.astype(np.float32)
    return np.array_equal(v32.astype(np.float64), v) and np.array_equal(
        MR.bf16_to_f32(MR.from_f32(v32, "bfloat16")).astype(np.float64), v)


def test_scaled_pairs_exact():
    """fp4.cuh RowScale: raw e2m1 pair * group scale is exact in T for every code and scale
    (MXFP4 fp16: groups down to 2^-24 below the row's largest)."""
    e4m3 = MR.decode(np.arange(127, dtype=np.uint8), MR.E4M3).astype(np.float64)  # finite, >= 0
    e4m3 = np.concatenate([e4m3, -e4m3])
    prod = (E2M1[:, None] * 2.0 ** -14) * e4m3[None, :]  # fp16 NVFP4: scale = e4m3
    assert np.array_equal(prod.astype(np.float16).astype(np.float64), prod)
    prod = (E2M1[:, None] * 2.0 ** -126) * (e4m3 * 2.0 ** 119)[None, :]  # bf16 NVFP4
    assert _bf16_exact(prod) and np.array_equal(prod * 2.0 ** 7, E2M1[:, None] * e4m3[None, :])
    for s in range(103, 128):  # fp16 MXFP4: scale 2^(s'-127+15), unit 2^-1
        sc = np.float16(2.0 ** (s - 112))
        prod = (E2M1 * 2.0 ** -14) * float(sc)
        assert np.array_equal(prod.astype(np.float16).astype(np.float64), prod)
        assert np.array_equal(prod * 0.5, E2M1 * 2.0 ** (s - 127)), s
    for s in range(1, 128):  # bf16 MXFP4: scale 2^(s'-127+126), unit 1
        prod = (E2M1 * 2.0 ** -126) * 2.0 ** (s - 1)
        assert _bf16_exact(prod) and np.array_equal(prod, E2M1 * 2.0 ** (s - 127)), s


def test_e2m1_times_scale_fits_fp16_and_bf16():
    # the kernels scale W pairs in T before the mma: every e2m1 x e4m3 product is exact in both
    e4m3 = MR.decode(np.arange(127, dtype=np.uint8), MR.E4M3).astype(np.float64)
    prod = (E2M1[:, None] * e4m3[None, :]).ravel()
    assert np.array_equal(prod.astype(np.float16).astype(np.float64), prod)
    bf = MR.from_f32(prod.astype(np.float32), "bfloat16")
    assert np.array_equal(MR.bf16_to_f32(bf).astype(np.float64), prod)


def test_mx_prepare_rebases_scales_exactly():
    packed, scales, _, w64 = host_weight("mxfp4", 130, 256)
    rel, rowfac = GR.prepare_scales_mx(scales)
    codes = MR.decode(MR.unpack_fp4(packed), MR.E2M1).astype(np.float64).reshape(130, 8, 32)
    w = codes * np.ldexp(1.0, rel.astype(np.int64) - 127)[..., None] * rowfac.astype(np.float64)[:, None, None]
    assert rel.max() <= 127
    assert np.array_equal(w.reshape(130, 256), w64)


def test_reference_gemm_alpha_bias():
    rng = np.random.default_rng(1)
    _, _, _, w64 = host_weight("nvfp4", 32, 128)
    a = rng.standard_normal((3, 128)).astype(np.float16)
    bias = rng.standard_normal(32).astype(np.float16)
    d = GR.gemm(a, w64, bias, alpha=0.5)
    want = 0.5 * a.astype(np.float64) @ w64.T + bias.astype(np.float64)
    assert np.allclose(d, want, rtol=1e-12, atol=1e-12)


# -- selector ------------------------------------------------------------------------------------
SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096), (28672, 4096), (200, 384), (1000, 4224), (16, 128)]
MS = [1, 2, 3, 5, 8, 15, 16, 17, 33, 64, 65, 127, 128, 129, 256, 1024, 4096]


def test_path_rule_at_the_measured_points():
    """The bandwidth path above 16 tokens where the tile path has few 128-row CTAs (the H100
    sweep in BENCHMARKS.md / select.py), the tile path where it fills the GPU."""
    assert path_for(16, 28672, 132) == "gemv" and path_for(17, 28672, 132) == "tile"
    # 17..48 tokens: the GEMV also where the tile CTAs are fewer than 1.6 x SMs (27000 rows)
    assert [path_for(m, 20480, 132) for m in (17, 48, 49, 64)] == ["gemv", "gemv", "tile", "tile"]
    assert path_for(48, 26880, 132) == "gemv" and path_for(48, 27136, 132) == "tile"
    assert path_for(32, 14336, 132) == "gemv" and path_for(64, 14336, 132) == "gemv"
    assert path_for(65, 14336, 132) == "tile" and path_for(128, 14336, 132) == "tile"
    assert path_for(128, 4096, 132) == "gemv" and path_for(129, 4096, 132) == "dequant"
    assert path_for(100, 14336, 132) == "tile" and path_for(129, 14336, 132) == "dequant"
    assert path_for(64, 14336, 112) == "tile"  # as many row CTAs as SMs: the tile path fills them
    assert path_for(DENSE_MIN_M - 1, 14336, 132) == "tile" and path_for(DENSE_MIN_M, 14336, 132) == "dequant"
    assert path_for(DENSE_MIN_M, 4096, 132) == "dequant" and path_for(1 << 20, 16, 132) == "dequant"
    for m in (1, 16, 32, 64, 128, 129):
        assert select_fp4("sm_90a", m, 4096, 4096, "nvfp4", "float16", 132).path == path_for(m, 4096, 132)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_plans_are_consistent(n, k, fmt):
    q = k // 128
    for m in MS:
        for sms in (132, 114, 20):
            p = select_fp4("sm_90a", m, n, k, fmt, "float16", sms)
            ctx = f"{m=} {n=} {k=} {sms=} {p.short()}"
            ctas = -(-n // 128)
            gemv = (m <= GEMV_MAX_M or m <= 64 and ctas < sms or m <= 48 and ctas < 1.6 * sms
                    or m <= 128 and 4 * ctas <= sms)
            # wgmma: 33..256 tokens, one CTA an SM, >= 16 steps a K split; at 33..48 tokens
            # where the CTAs are one wave or fill their waves to 0.68; the same past 128 tokens
            # on K <= 16 steps unsplit, which takes 49..128 tokens from 8 steps
            wg_bm = 64 if m <= 64 else 128 if m <= 128 else 256
            wg_ctas = ctas * -(-m // wg_bm)
            wg_split = max(1, min(sms // wg_ctas, q // 4))
            waves = -(-wg_ctas * wg_split // sms)
            full = wg_ctas * wg_split >= 0.68 * waves * sms
            if wg_split == 1 and q <= 16:
                wg = 33 <= m <= 256 and q >= 8 and (49 <= m <= 128 or full)
            else:
                wg = 33 <= m <= 256 and -(-q // wg_split) >= 16 and (m > 48 or waves == 1 or full)
            want = "wgmma" if wg else "gemv" if gemv else "dequant" if m >= DENSE_MIN_M else "tile"
            assert p.path == want, ctx
            if wg:
                assert p.config.bm == wg_bm and p.split == -(-q // -(-q // wg_split)), ctx
                assert p.grid == (ctas, -(-m // wg_bm), p.split), ctx
            if p.path == "dequant":  # one thread a 16-byte chunk, at most 8 full CTAs an SM
                chunks = -(-n // 16) * q * 64
                assert (p.split, p.sps, p.smem, p.block) == (1, q, 0, (256, 1, 1)), ctx
                assert p.grid == (min(-(-chunks // 256), 8 * sms), 1, 1), ctx
                assert p.counters == 0 and p.config.fmt == fmt, ctx
                continue
            assert (p.split - 1) * p.sps < q <= p.split * p.sps, ctx  # splits cover K, none empty
            assert p.smem <= p.config.smem_bytes(), ctx
            if p.path == "gemv":
                cfg = p.config
                assert cfg.m_tile == (8 if m <= 8 else 16), ctx
                assert p.grid[2] == -(-m // cfg.m_tile), ctx  # passes of m_tile tokens
                assert p.kw in (1, 2, 4, 8, 16) and p.kw <= KW_MAX[cfg.m_tile, cfg.warps_per_sm] and p.smem == 0, ctx
                units = -(-n // (16 * cfg.tpw))
                cta = GEMV_CTA_WARPS[cfg.m_tile, cfg.warps_per_sm]
                assert cfg.warps == (cta if p.kw <= cta else max(8, p.kw)), ctx
                assert p.block == (32 * cfg.warps, 1, 1) and p.kw <= cfg.warps, ctx
                assert p.grid == (-(-units * p.kw // cfg.warps), p.split, -(-m // cfg.m_tile)), ctx
                per = -(-p.sps // p.kw)
                assert cfg.depth == GEMV_DEPTH, ctx
                assert cfg.tpw == GEMV_TPW[cfg.m_tile] or (cfg.tpw == 1 and p.split == 1), ctx
                # every K slice has a full ring, except on a short K (select.short_k_kw)
                assert p.kw == 1 or per >= MIN_STEPS or p.sps <= SHORT_K_STEPS, ctx
                if p.split > 1:  # split only past the largest KW
                    kw_max = KW_MAX[cfg.m_tile, cfg.warps_per_sm]
                    assert p.kw == kw_max and p.sps >= kw_max * MIN_STEPS, ctx
            elif p.path == "tile":
                assert p.config.bm == bm_for(m), ctx
                assert p.grid == (-(-n // 128), -(-m // p.config.bm), p.split), ctx


def test_decode_shapes_fill_the_gpu():
    for n, k in ((14336, 4096), (4096, 14336)):
        for m in (1, 16):
            p = select_fp4("sm_90a", m, n, k, "nvfp4", "bfloat16", 132)
            warps = -(-n // 16) * p.kw * p.split * p.grid[2]
            assert warps >= 132 * 12, p.short()  # >= 12 streaming warps an SM
            assert p.split == 1, p.short()  # no global split-K epilogue
            ctas_per_sm = p.config.warps_per_sm // p.config.warps  # the launch bounds
            assert p.grid[0] * p.split * p.grid[2] <= 132 * ctas_per_sm, p.short()  # one wave


def test_plan_printable_and_memoised():
    a = select_fp4("sm_90a", 1, 4096, 4096, "mxfp4", "bfloat16", 132)
    assert a is select_fp4("sm_90a", 1, 4096, 4096, "mxfp4", "bfloat16", 132)
    s = a.short()
    assert s.startswith("gemv: Fp4GemvConfig(") and "split=" in s and "grid=" in s


def test_forced_path_and_split():
    p = plan("sm_90a", 5, 4096, 4096, "nvfp4", "float16", 132, path="tile", split=1)
    assert p.path == "tile" and p.split == 1 and p.config.bm == 32
    p = plan("sm_90a", 40, 4096, 4096, "nvfp4", "float16", 132, path="gemv", split=3)
    assert p.path == "gemv" and p.split == 3 and p.grid[2] == 3
    with pytest.raises(ValueError, match=r"split_k=33: must be in 1\.\.32"):
        plan("sm_90a", 1, 4096, 4096, "nvfp4", "float16", 132, split=33)
    for bad in ("2", 1.5, [2]):  # was TypeError (1.5: a float split)
        for path in (None, "gemv", "tile", "wgmma"):
            with pytest.raises(ValueError, match=r"split_k=.*: must be in 1\.\.32"):
                plan("sm_90a", 40, 4096, 4096, "nvfp4", "float16", 132, path=path, split=bad)
    p = plan("sm_90a", 16, 4096, 14336, "nvfp4", "float16", 132, path="gemv", split=1)
    # K split inside the CTAs: KW 16 (16-warp CTAs) at m_tile 16
    assert p.split == 1 and (p.kw, p.config.warps, p.grid) == (16, 16, (256, 1, 1)), p.short()
    with pytest.raises(ValueError, match="path='wmma': expected 'gemv', 'tile', 'wgmma', 'dequant'"):
        plan("sm_90a", 1, 4096, 4096, "nvfp4", "float16", 132, path="wmma")


def test_no_k_split_where_the_unsplit_plan_fills_the_sms():
    """2048x8192: the unsplit plan gives 128 of 132 SMs a CTA and a warp at most 8 steps (KW 8
    at 16 warps an SM; 4 at M = 16, KW 16), so the K split (whose finish cost more than it
    saved: BENCHMARKS.md, session 25) is not taken; on a longer K the split stays at M <= 8 (14
    steps a warp) and goes at M = 16 up to 16 steps (kbit4, KW 8: 2048x16384); where the unsplit
    CTAs leave SMs idle (N = 1024) it stays (kbit4 measured 5-32% faster split there)."""
    for fmt in ("nvfp4", "mxfp4", "kbit4"):
        for m in (1, 8, 16):
            p = select_fp4("sm_90a", m, 2048, 8192, fmt, "float16", 132)
            assert p.path == "gemv" and p.split == 1, p.short()
            assert p == plan("sm_90a", m, 2048, 8192, fmt, "float16", 132, split=1), p.short()
        assert select_fp4("sm_90a", 1, 2048, 14336, fmt, "float16", 132).split == 2
    assert select_fp4("sm_90a", 1, 1024, 8192, "kbit4", "float16", 132).split == 2
    for k, split in ((14336, 1), (16384, 1), (28672, 2)):  # kbit4 M = 16: 14 / 16 / 28 steps
        p = select_fp4("sm_90a", 16, 2048, k, "kbit4", "float16", 132)
        assert (p.kw, p.split) == (8, split), p.short()
    # a forced TPW / warps an SM keeps the split the planner gives it
    assert plan("sm_90a", 1, 2048, 8192, "nvfp4", "float16", 132, wps=16).split == 2


def test_two_tiles_a_warp_plan():
    """TPW = 2 covers the same warps with half the tile units: 14336x4096 at M = 16 goes from
    KW 2 to KW 4 (224 CTAs either way) at 16 warps an SM; on 4096x14336 it would need a global
    split (128 CTAs). The default at M = 16 is TPW 1 at 32 warps an SM on both (KW 16 on
    4096x14336)."""
    one = plan("sm_90a", 16, 14336, 4096, "nvfp4", "float16", 132, tpw=1, wps=16)
    two = plan("sm_90a", 16, 14336, 4096, "nvfp4", "float16", 132, tpw=2)
    assert (one.kw, one.grid, one.config.tpw, one.config.warps) == (2, (448, 1, 1), 1, 4), one.short()
    assert (two.kw, two.grid, two.config.tpw, two.config.warps) == (4, (448, 1, 1), 2, 4), two.short()
    assert plan("sm_90a", 16, 14336, 4096, "nvfp4", "float16", 132, wps=16) == two
    # the default since the k-interleaved layout: 32 warps an SM (TPW 1, twice the warps of two)
    p = select_fp4("sm_90a", 16, 14336, 4096, "nvfp4", "float16", 132)
    assert (p.config.warps_per_sm, p.config.tpw, p.kw, p.grid) == (32, 1, 4, (896, 1, 1)), p.short()
    assert select_fp4("sm_90a", 1, 14336, 4096, "nvfp4", "float16", 132).config.tpw == 1
    wide = plan("sm_90a", 16, 4096, 14336, "nvfp4", "float16", 132, tpw=2)  # 16 warps an SM: KW 8
    assert (wide.kw, wide.grid) == (8, (128, 2, 1)), wide.short()
    p = select_fp4("sm_90a", 16, 4096, 14336, "nvfp4", "float16", 132)
    assert (p.config.tpw, p.kw, p.grid, p.config.warps_per_sm) == (1, 16, (256, 1, 1), 32), p.short()
    p = plan("sm_90a", 1, 40, 384, "mxfp4", "float16", 132, tpw=2)  # 3 tiles: 2 units, KW 8
    assert (p.kw, p.grid) == (8, (2, 1, 1)), p.short()  # (short K: select.short_k_kw)
    with pytest.raises(ValueError, match="tpw=3: expected one of"):
        plan("sm_90a", 1, 4096, 4096, "nvfp4", "float16", 132, tpw=3)
    with pytest.raises(ValueError, match="bandwidth path only"):
        plan("sm_90a", 200, 4096, 4096, "nvfp4", "float16", 132, tpw=2)  # the tile path


@pytest.mark.parametrize("n,k", [(100, 96), (100, 0), (0, 128), (64, 4160)])
def test_shape_rule(n, k):
    with pytest.raises(ValueError, match="positive multiple of 128"):
        plan("sm_90a", 1, n, k, "nvfp4", "float16", 132)


def test_format_rule():
    with pytest.raises(ValueError, match="format 'mxfp8_e4m3'"):
        plan("sm_90a", 1, 128, 128, "mxfp8_e4m3", "float16", 132)


def test_stages_fit_every_arch():
    for arch in SM_COUNTS:
        for fmt in ("nvfp4", "mxfp4"):
            for bm in (32, 64, 128):
                s = stages_for(arch, fmt, bm)
                assert s >= 2 and tile_smem(fmt, bm, s) <= {"sm_120a": 99 * 1024}.get(arch, 220 * 1024)


def test_prewarm_table_is_modest():
    for arch in SM_COUNTS:
        cfgs = list(prewarm_configs([arch], {}))
        # per (fmt, dtype): 10 GEMV (16 warps an SM: 1 at m_tile 8, 2 TPW x 2 CTA sizes at
        # m_tile 16; 32 an SM: 2 CTA sizes at m_tile 8, 3 at 16) + 2 tile configs (BM 32, 64:
        # dispatch sends M > 128 to the dequantize kernel, + 1); sm_80 also the fewer stages of
        # 8.6 parts (99 KB) at nvfp4 BM 64; sm_89 (99 KB only) no GEMV at 32 warps an SM;
        # sm_90a also 3 wgmma configs (BM 64 / 128 / 256); the PDL archs also each GEMV config
        # with pf = 1 (small weights, select.pf_for)
        bound = {"sm_80": 54, "sm_89": 34, "sm_90a": 104}.get(arch, 92)
        assert 0 < len(cfgs) <= bound and len(set(cfgs)) == len(cfgs)
        wg = {Fp4WgmmaConfig} if arch == "sm_90a" else set()
        assert {type(c) for c in cfgs} == {Fp4GemvConfig, Fp4TileConfig, Fp4DequantConfig} | wg
        assert sum(isinstance(c, Fp4DequantConfig) for c in cfgs) == 4  # 2 formats x 2 dtypes
        gemv = [c for c in cfgs if isinstance(c, Fp4GemvConfig)]
        pdl = get_arch(arch).cc >= 90
        assert {c.pf for c in gemv} == ({0, 1} if pdl else {0})
        assert sum(c.pf > 0 for c in gemv) == (sum(c.pf == 0 for c in gemv) if pdl else 0)
        assert any(c.warps_per_sm == 32 for c in gemv) == (arch != "sm_89")


@pytest.mark.parametrize("arch", list(SM_COUNTS))
def test_prewarm_equals_dispatch(arch):
    spec = {"shapes": [[14336, 4096], [4096, 14336], [3, 200, 384]], "dtypes": ["bfloat16", "float32"]}
    pre = set(prewarm_configs([arch], spec))
    picked = set()
    for sms, lim in PARTS[arch]:
        for fmt in ("nvfp4", "mxfp4"):
            for m in list(range(1, 300)) + [1000, 5000]:
                for n, k in ((14336, 4096), (4096, 14336)):
                    picked.add(select_fp4(arch, m, n, k, fmt, "bfloat16", sms, None, lim).config)
            picked.add(select_fp4(arch, 3, 200, 384, fmt, "bfloat16", sms, None, lim).config)
    assert picked == pre
    assert all(c.dtype == "bfloat16" for c in pre)
    assert pre <= set(prewarm_configs([arch], {}))


def test_prewarm_rejects_bad_shapes():
    with pytest.raises(UnsupportedConfigError, match="multiple of 128"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[4096, 100]]}))
    with pytest.raises(UnsupportedConfigError, match=r"expected \[N, K\]"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[1, 2, 3, 4]]}))


@pytest.mark.parametrize("field,value", [("fmt", "mxfp8_e4m3"), ("dtype", "float32"),
                                         ("m_tile", 12), ("warps", 3), ("depth", 5),
                                         ("tpw", 4)])
def test_gemv_config_check_names_field(field, value):
    kw = dict(arch="sm_90a", fmt="nvfp4", dtype="float16", m_tile=8, warps=8, depth=4)
    kw[field] = value
    with pytest.raises(UnsupportedConfigError, match=f"{field}={value!r}"):
        Fp4GemvConfig(**kw)


@pytest.mark.parametrize("field,value", [("fmt", "nvfp8"), ("bm", 48), ("stages", 5)])
def test_tile_config_check_names_field(field, value):
    kw = dict(arch="sm_90a", fmt="nvfp4", dtype="float16", bm=64, stages=3)
    kw[field] = value
    with pytest.raises(UnsupportedConfigError, match=f"{field}={value!r}"):
        Fp4TileConfig(**kw)


def test_tile_config_smem_per_arch():
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        Fp4TileConfig(arch="sm_120a", fmt="nvfp4", dtype="float16", bm=128, stages=3)


# -- rejected before any launch ------------------------------------------------------------------
def test_api_rules_before_launch():
    from kernelgen.fp4_gemm import fp4_gemm, prepare_weight

    from ._weights import FakeMxTensor

    with pytest.raises(ValueError, match="expected an MxTensor"):
        fp4_gemm(np.ones((1, 128), np.float16), object())
    with pytest.raises(ValueError, match=r"split_k=\[2\]: expected an integer"):  # was TypeError
        fp4_gemm(np.ones((1, 128), np.float16), object(), split_k=[2])
    t = FakeMxTensor("mxfp6_e2m3", (16, 128), None, None, "row_major", None)
    with pytest.raises(ValueError, match="format 'mxfp6_e2m3'"):
        prepare_weight(t, act_dtype="float16")
    with pytest.raises(ValueError, match="format 'mxfp6_e2m3'"):  # W's errors before A's
        fp4_gemm(np.ones((1, 128), np.float16), t)
    ok = FakeMxTensor("nvfp4", (16, 128), None, None, "row_major", None)
    with pytest.raises(TypeError, match="act_dtype"):  # the activation type is not guessed
        prepare_weight(ok)
    with pytest.raises(ValueError, match="act_dtype='float32'"):
        prepare_weight(ok, act_dtype="float32")
    t = FakeMxTensor("nvfp4", (16, 100), None, None, "row_major", None)
    with pytest.raises(ValueError, match="positive multiple of 128"):
        prepare_weight(t, act_dtype="float16")
    t = FakeMxTensor("nvfp4", (16, 128), np.zeros((16, 64), np.uint8), None, "row_major", None)
    with pytest.raises(ValueError, match="NumPy arrays live on the host"):
        prepare_weight(t, act_dtype="float16")


def test_warps_per_sm_plan_and_rules():
    """32 resident warps an SM (<= 64 registers, TPW 1 only) doubles KW on 14336x4096 (896 CTAs
    of 4 warps, all resident at 8 an SM): the planner takes it there at m_tile 8 and 16 (since the
    k-interleaved layout), and on 4096x14336 at m_tile 16 (KW 8 -> 16, 16-warp CTAs), not at
    m_tile 8 there (KW 8 is its largest: 32 would only add a K split); the config refuses it
    where it cannot fit."""
    p = plan("sm_90a", 1, 14336, 4096, "mxfp4", "float16", 132, wps=32)
    assert (p.kw, p.grid, p.config.warps_per_sm, p.block) == (4, (896, 1, 1), 32, (128, 1, 1)), p.short()
    assert "__launch_bounds__(128, 8)" in render(p.config).source
    for m in (1, 4, 8):
        assert select_fp4("sm_90a", m, 14336, 4096, "mxfp4", "float16", 132) == p
        d = select_fp4("sm_90a", m, 4096, 14336, "nvfp4", "float16", 132)
        assert (d.kw, d.split, d.config.warps_per_sm) == (8, 1, 16), d.short()
        assert plan("sm_90a", m, 4096, 14336, "nvfp4", "float16", 132, wps=32).split == 2
    d16 = select_fp4("sm_90a", 16, 14336, 4096, "mxfp4", "float16", 132)
    assert (d16.config.warps_per_sm, d16.config.tpw) == (32, 1), d16.short()
    w16 = select_fp4("sm_90a", 16, 4096, 14336, "mxfp4", "float16", 132)
    assert (w16.config.warps_per_sm, w16.split, w16.kw, w16.config.warps) == (32, 1, 16, 16), \
        w16.short()
    assert "__launch_bounds__(512, 2)" in render(w16.config).source
    assert "__launch_bounds__(256, 2)" in render(plan("sm_90a", 1, 14336, 4096, "mxfp4", "float16",
                                                      132, wps=16).config).source
    p16 = plan("sm_90a", 16, 14336, 4096, "mxfp4", "float16", 132, wps=32)  # TPW 1, 4-warp CTAs
    assert (p16.kw, p16.grid, p16.config.tpw, p16.config.warps) == (4, (896, 1, 1), 1, 4), p16.short()
    assert "__launch_bounds__(128, 8)" in render(p16.config).source
    with pytest.raises(UnsupportedConfigError, match="warps_per_sm=32"):
        plan("sm_90a", 16, 14336, 4096, "mxfp4", "float16", 132, wps=32, tpw=2)
    Fp4GemvConfig(arch="sm_90a", m_tile=8, tpw=1, depth=3, warps_per_sm=32).check()
    for m_tile, depth in ((8, 4), (16, 3)):
        with pytest.raises(UnsupportedConfigError, match=r"depth 2 \(3 at m_tile 8\)"):
            Fp4GemvConfig(arch="sm_90a", m_tile=m_tile, tpw=1, depth=depth, warps_per_sm=32).check()
    with pytest.raises(UnsupportedConfigError, match="a_by_word=True; only m_tile 16 at warps_per_sm 32"):
        Fp4GemvConfig(arch="sm_90a", m_tile=8, tpw=1, depth=2, warps_per_sm=32, a_by_word=True).check()
    Fp4GemvConfig(arch="sm_90a", m_tile=16, tpw=1, depth=2, warps_per_sm=32, a_by_word=True).check()
    ring = Fp4GemvConfig(arch="sm_90a", m_tile=16, tpw=2, depth=2, warps=4, a_ring=True)
    assert ring.smem_bytes() == 4 * 2 * 16 * 256 and Fp4GemvConfig(arch="sm_90a").smem_bytes() == 0
    tail = ", 0, false, kg::fp4::GridPlace, 0,"  # enc 0, no GLU, the dense grid, pf 0
    assert " true" + tail in render(ring).source and " false" + tail in render(ring.replace(a_ring=False)).source
    # then the code table (lut_wide) and the balanced grid (balanced), in that order
    flags = re.compile(r"GridPlace, 0,\s*(true|false), (true|false)>\(")
    assert flags.search(render(ring).source).groups() == ("false", "false")
    kb = Fp4GemvConfig(arch="sm_90a", fmt="kbit4", m_tile=8, tpw=2, depth=2, lut_wide=True, balanced=True)
    assert flags.search(render(kb).source).groups() == ("true", "true")
    assert flags.search(render(kb.replace(balanced=False)).source).groups() == ("true", "false")
    with pytest.raises(UnsupportedConfigError, match="a_ring=True; only at warps_per_sm 16"):
        Fp4GemvConfig(arch="sm_90a", m_tile=8, tpw=1, depth=2, warps_per_sm=32, a_ring=True).check()
    with pytest.raises(UnsupportedConfigError, match="warps_per_sm=24"):
        Fp4GemvConfig(arch="sm_90a", warps_per_sm=24).check()
    with pytest.raises(ValueError, match=r"wps=32: expected one of \(16, 32\), bandwidth path only"):
        plan("sm_90a", 200, 4096, 4096, "nvfp4", "float16", 132, wps=32)  # the tile path
    with pytest.raises(ValueError, match=r"wps=8: expected one of \(16, 32\)"):  # was a KeyError
        plan("sm_90a", 1, 4096, 4096, "nvfp4", "float16", 132, wps=8)


# -- weights encoded for the other activation type: not prewarmed, compiled on first use --------
def _cross_configs():
    """Per arch, the M = 1 / 16 bandwidth and M = 64 tile configs dispatch would pick for bf16
    activations on words encoded for fp16 and the reverse (both formats)."""
    from kernelgen.arch import ALL_ARCHS

    return [plan(arch, m, 14336, 4096, fmt, dt, SM_COUNTS[arch][0],
                 enc="float16" if dt == "bfloat16" else "bfloat16").config
            for arch in ALL_ARCHS for fmt in ("nvfp4", "mxfp4") for dt in ("float16", "bfloat16")
            for m in (1, 16, 64)]


@pytest.mark.parametrize("cfg", _cross_configs(), ids=lambda c: c.short())
def test_cross_encoding_configs_compile_without_spills(cfg):
    from kernelgen.core.compile import compile_cubin, resource_summary

    assert cfg.enc != cfg.dtype
    out = compile_cubin(cfg, render(cfg))
    res = resource_summary(out.log)
    assert res["registers"] and res["spill_bytes"] == 0, f"{cfg}: {res}\n{out.log}"


def test_dequant_path_rules():
    """M > 128: the dequantize kernel's config for the call's format, dtype and encoding; a K
    split forced without a path runs the tile path; the dequant path refuses a split, kbit4
    (its own dequantize: kernelgen.kbit_gemm.tiled) and weights past its 32-bit chunk index."""
    p = plan("sm_90a", 4096, 4096, 4096, "nvfp4", "float16", 132)
    assert p.path == "dequant" and p.config == Fp4DequantConfig(arch="sm_90a", fmt="nvfp4",
                                                                dtype="float16", enc="float16")
    p = plan("sm_90a", 200, 4096, 4096, "mxfp4", "bfloat16", 132, enc="float16")
    assert p.path == "dequant" and (p.config.fmt, p.config.dtype, p.config.enc) == ("mxfp4", "bfloat16", "float16")
    assert "dequant: Fp4DequantConfig(" in p.short() and "cuBLAS" in p.short()
    p = plan("sm_90a", 4096, 4096, 4096, "mxfp4", "bfloat16", 132, split=2)
    assert p.path == "tile" and p.split == 2, p.short()
    with pytest.raises(ValueError, match="has no K split"):
        plan("sm_90a", 4096, 4096, 4096, "nvfp4", "float16", 132, path="dequant", split=2)
    with pytest.raises(ValueError, match="kbit4 weights have their own"):
        plan("sm_90a", 4096, 4096, 4096, "kbit4", "float16", 132, path="dequant")
    with pytest.raises(ValueError, match=r"fewer than 2\*\*31"):
        plan("sm_90a", 4096, 1 << 20, 1 << 17, "nvfp4", "float16", 132, path="dequant")
    for field, bad in (("fmt", "kbit4"), ("dtype", "float32"), ("enc", "int8")):
        with pytest.raises(UnsupportedConfigError, match=f"{field}="):
            Fp4DequantConfig(arch="sm_90a", **{field: bad})


# -- the wgmma tile path (sm_90a, templates/fp4_gemm/wgmma.cuh) ---------------------------------
def test_wgmma_plan_rules():
    """BM: the smallest of 64 / 128 / 256 covering M (256 and more token tiles above); one wgmma
    group in flight across the barrier (a third dense weight buffer) with the most A stages
    (>= 3) that fit 227 KB, else none (BM 256: 2 stages); K split until the 128-row CTAs cover
    the SMs (at least TILE_MIN_STEPS steps a split); kbit4 with its code table; refused off
    sm_90a and with BW-path knobs. Dispatch picks it for 33..256 tokens with >= 16 steps a
    K split (wgmma_takes; the H100 sweep in select.py)."""
    cases = {  # (m, n, k) -> (bm, stages, inflight, split, grid)
        (1, 14336, 4096): (64, 4, 1, 1, (112, 1, 1)),
        (64, 14336, 4096): (64, 4, 1, 1, (112, 1, 1)),
        (65, 4096, 4096): (128, 4, 1, 4, (32, 1, 4)),
        (128, 4096, 14336): (128, 4, 1, 4, (32, 1, 4)),
        (129, 14336, 4096): (256, 2, 0, 1, (112, 1, 1)),
        (1000, 4096, 4096): (256, 2, 0, 1, (32, 4, 1)),
        (300, 200, 384): (256, 2, 0, 1, (2, 2, 1)),  # 3 steps: no split below TILE_MIN_STEPS
    }
    for (m, n, k), (bm, stages, inflight, split, grid) in cases.items():
        p = plan("sm_90a", m, n, k, "nvfp4", "float16", 132, path="wgmma")
        got = (p.config.bm, p.config.stages, p.config.inflight, p.split, p.grid)
        assert p.path == "wgmma" and got == (bm, stages, inflight, split, grid), (m, n, k, p.short())
        assert p.smem == wgmma_smem(bm, stages, inflight) <= 227 * 1024 and p.block == (256, 1, 1)
        assert p.counters == grid[0] * grid[1] and p.short().startswith("wgmma: Fp4WgmmaConfig(")
        takes = 33 <= m <= 256 and p.sps >= 16
        assert wgmma_takes("sm_90a", m, n, k, 132) == takes, (m, n, k)
        assert (select_fp4("sm_90a", m, n, k, "nvfp4", "float16", 132).path == "wgmma") == takes
    # the measured points: 14336x4096 (32 steps) and 4096x14336 (split 4: 28) take it from M = 33
    # to 256, 4096x4096 (split 4: 8 steps) never; nor any M outside 33..256, nor other archs
    for n, k in ((14336, 4096), (4096, 14336), (28672, 4096)):
        assert [wgmma_takes("sm_90a", m, n, k, 132) for m in (32, 33, 64, 65, 128, 129, 256, 257)] \
            == [False] + [True] * 6 + [False], (n, k)
    assert not any(wgmma_takes("sm_90a", m, 4096, 4096, 132) for m in range(1, 1025, 7))
    # a short K unsplit (<= 16 steps; the 128-row CTAs cover the SMs): 49..128 tokens from 8
    # steps on (WGMMA_SHORT_K_M); 33..48 only where the CTAs fill their waves to WGMMA_WAVE_MIN
    # and 129..256 to late_fill (by format and steps; for NVFP4, the format here, at least as
    # high) (measured on 23 / 37 shapes, select.py), and never where the CTAs would split K
    # (4096x1536: 32 CTAs) or K has fewer than 8 steps
    ms = (32, 33, 48, 49, 64, 96, 128, 129, 192, 256, 257)
    for n, k in ((24576, 1536), (16384, 1536), (32768, 1024), (16768, 1024), (24576, 2048)):
        assert wave_fill(-(-n // 128), 132) >= WGMMA_WAVE_MIN, (n, k)
        assert [wgmma_takes("sm_90a", m, n, k, 132) for m in ms] == [False] + [True] * 9 + [False], (n, k)
        for fmt in ("kbit4", "mxfp4"):
            assert select_fp4("sm_90a", 96, n, k, fmt, "float16", 132).path == "wgmma", (n, k, fmt)
    for n, k in ((18432, 1536), (20480, 1024), (22528, 1536), (17408, 2048), (10240, 1536)):
        assert wave_fill(-(-n // 128), 132) < WGMMA_WAVE_MIN, (n, k)
        assert [wgmma_takes("sm_90a", m, n, k, 132) for m in ms] \
            == [False] * 3 + [True] * 4 + [False] * 4, (n, k)
    # past 128 tokens the bound falls from 8 to 16 steps and is higher for NVFP4 (session 36):
    # kbit4 / mxfp4 take fill 0.67 at 12 and 16 steps, 0.61 at 16, 0.73 at 8; NVFP4 0.67 only at
    # 16 steps, 0.82 at 8, not 0.73 there
    assert [late_fill("kbit4", q) for q in (8, 12, 16)] == pytest.approx([0.70, 0.64, 0.58])
    assert [late_fill("nvfp4", q) for q in (8, 12, 16)] == pytest.approx([0.78, 0.71, 0.64])
    assert late_fill("mxfp4", 6) == late_fill("mxfp4", 8) and late_fill("mxfp4", 20) == late_fill("mxfp4", 16)
    late = {(22528, 2048): (True, True), (22528, 1536): (True, False), (10240, 2048): (True, False),
            (36864, 1024): (True, False), (27648, 1024): (True, True), (19456, 1536): (False, False),
            (21504, 1024): (False, False), (17408, 2048): (False, False)}
    for (n, k), (kb, nv) in late.items():
        for m in (144, 192, 256):
            assert [wgmma_takes("sm_90a", m, n, k, 132, f) for f in ("kbit4", "mxfp4", "nvfp4")] \
                == [kb, kb, nv], (n, k, m)
            assert wgmma_takes("sm_90a", 128, n, k, 132, "nvfp4"), (n, k)  # 49..128: any fill
    # a longer K: 33..48 tokens also need the fill where the CTAs pass the SMs (a second wave),
    # not where they are one partial wave (14336x4096 above); past 48 tokens the rule as before
    assert wave_fill(160, 132) < WGMMA_WAVE_MIN <= wave_fill(112, 132) == 112 / 132
    assert wave_fill(264, 132) == 1.0 and wave_fill(133, 132) == 133 / 264
    for n, k in ((20480, 4096), (18432, 4096), (17920, 4096)):
        assert [wgmma_takes("sm_90a", m, n, k, 132) for m in (33, 48, 49, 129, 256)] \
            == [False, False, True, True, True], (n, k)
        for m in (33, 48):  # -> the GEMV: the tile path's CTAs are fewer than 1.6 x SMs
            assert select_fp4("sm_90a", m, n, k, "nvfp4", "float16", 132).path == "gemv", (n, k, m)
    for n, k in ((4096, 1536), (8192, 1024), (16384, 768), (16896, 896)):
        assert not any(wgmma_takes("sm_90a", m, n, k, 132) for m in (64, 96, 128)), (n, k)
    assert not any(wgmma_takes(a, 128, 14336, 4096, 132) for a in ("sm_80", "sm_100a", "sm_120a"))
    assert select_fp4("sm_90a", 100, 14336, 4096, "mxfp4", "bfloat16", 132).path == "wgmma"
    # a block of less shared memory than 2 stages of the BM need: the rule without it
    assert wgmma_takes("sm_90a", 64, 14336, 4096, 132, "nvfp4", 99 * 1024)  # BM 64: 2 x 32 + 2 x 16 KB
    for m, fmt in ((128, "nvfp4"), (256, "mxfp4"), (64, "kbit4")):
        assert not wgmma_takes("sm_90a", m, 14336, 4096, 132, fmt, 99 * 1024), (m, fmt)
    p = select_fp4("sm_90a", 128, 14336, 4096, "nvfp4", "float16", 132, "float16", 99 * 1024)
    assert p.path == "tile" and p.smem <= 99 * 1024, p.short()
    # a forced K split without a path keeps the rule's path (never wgmma)
    assert plan("sm_90a", 64, 14336, 4096, "nvfp4", "float16", 132, split=2).path == "gemv"
    assert plan("sm_90a", 200, 14336, 4096, "nvfp4", "float16", 132, split=32).path == "tile"
    p = plan("sm_90a", 200, 4096, 4096, "mxfp4", "bfloat16", 132, path="wgmma", split=5, enc="float16")
    assert (p.split, p.sps, p.grid) == (5, 7, (32, 1, 5)) and p.config.enc == "float16", p.short()
    for arch in ("sm_80", "sm_100a", "sm_120a"):
        with pytest.raises(ValueError, match=r"path='wgmma': needs one of \('sm_90a',\)"):
            plan(arch, 256, 4096, 4096, "nvfp4", "float16", 132, path="wgmma")
    # tiled kbit4 weights: their 32 KB code table after the A slots (BM 128: 3 stages)
    p = plan("sm_90a", 128, 4096, 4096, "kbit4", "bfloat16", 132, path="wgmma")
    assert (p.config.fmt, p.config.stages, p.config.inflight) == ("kbit4", 3, 1), p.short()
    assert p.smem == wgmma_smem(128, 3, 1, "kbit4") == wgmma_smem(128, 3, 1) + 32 * 1024
    with pytest.raises(ValueError, match=r"split_k=33: must be in 1\.\.32"):
        plan("sm_90a", 256, 4096, 4096, "nvfp4", "float16", 132, path="wgmma", split=33)
    with pytest.raises(ValueError, match="tpw=2"):
        plan("sm_90a", 256, 4096, 4096, "nvfp4", "float16", 132, path="wgmma", tpw=2)
    with pytest.raises(ValueError, match="wps=32"):
        plan("sm_90a", 256, 4096, 4096, "nvfp4", "float16", 132, path="wgmma", wps=32)
    # a part with less shared memory a block keeps what fits (BM 128: 3 stages, no group in flight)
    p = plan("sm_90a", 128, 4096, 4096, "nvfp4", "float16", 132, path="wgmma", smem_limit=140 * 1024)
    assert (p.config.stages, p.config.inflight, p.smem) == (2, 0, wgmma_smem(128, 2, 0)), p.short()
    with pytest.raises(UnsupportedConfigError, match=r"BM=256 \(nvfp4\): 2 stages need"):
        plan("sm_90a", 256, 4096, 4096, "nvfp4", "float16", 132, path="wgmma", smem_limit=99 * 1024)


@pytest.mark.parametrize("field,value", [("arch", "sm_80"), ("arch", "sm_100a"), ("fmt", "mxfp8_e4m3"),
                                         ("dtype", "float32"), ("enc", "int8"), ("bm", 32),
                                         ("stages", 5), ("ring", 4), ("inflight", 2),
                                         ("ctas_per_sm", 3)])
def test_wgmma_config_check_names_field(field, value):
    with pytest.raises(UnsupportedConfigError, match=f"{field}="):
        Fp4WgmmaConfig(**{"arch": "sm_90a", field: value})


def test_wgmma_config_pipeline_rules():
    with pytest.raises(UnsupportedConfigError, match=r"stages=3; BM=256 x 3 stages \(inflight 0\) need \d+ B"):
        Fp4WgmmaConfig(arch="sm_90a", bm=256, stages=3, inflight=0)
    with pytest.raises(UnsupportedConfigError, match="inflight=1; expected 0 or 1, leaving one A step"):
        Fp4WgmmaConfig(arch="sm_90a", bm=64, stages=2, inflight=1)
    assert Fp4WgmmaConfig(arch="sm_90a", bm=128, stages=4, inflight=1).smem_bytes() == 3 * 32768 + 4 * 32768 + 1024
    with pytest.raises(UnsupportedConfigError, match="enc='float16'; kbit4 words decode through a table"):
        Fp4WgmmaConfig(arch="sm_90a", fmt="kbit4", dtype="bfloat16", enc="float16")
    two = Fp4WgmmaConfig(arch="sm_90a", bm=64, stages=2, inflight=0, ctas_per_sm=2)
    assert "__launch_bounds__(256, 2)" in render(two).source
    for kw in ({"bm": 64, "stages": 3, "inflight": 0}, {"bm": 128, "stages": 2, "inflight": 0}, {"bm": 64}):
        with pytest.raises(UnsupportedConfigError, match="ctas_per_sm=2; expected 1, or 2 where two CTAs"):
            Fp4WgmmaConfig(arch="sm_90a", ctas_per_sm=2, **kw)


def _wgmma_configs():
    return list(dict.fromkeys(
        plan("sm_90a", m, 4096, 4096, fmt, dt, 132, path="wgmma",
             enc="float16" if dt == "bfloat16" else "bfloat16").config
        for fmt in ("nvfp4", "mxfp4") for dt in ("float16", "bfloat16") for m in (64, 128, 256)))


def test_wgmma_configs_in_prewarm():
    """Dispatch picks the wgmma path on sm_90a (wgmma_takes), so prewarm builds every (fmt,
    dtype, BM) of it there: fp4_gemm's nvfp4 / mxfp4, kbit_gemm's tiled kbit4 (words encoded
    for the activation type) and its flat 2..4-bit weights (kbit_gemm/tiled.py
    flat_wgmma_takes); no other arch gets one."""
    from kernelgen.core.registry import families

    def wg(name, archs):
        fam = families()[name]
        return {c for c in fam.prewarm_configs(archs, fam.matrix_spec or {}) if isinstance(c, Fp4WgmmaConfig)}

    fp4, kbit_all = wg("fp4_gemm", ["sm_90a"]), wg("kbit_gemm", ["sm_90a"])
    kbit = {c for c in kbit_all if not c.flat}
    assert len(fp4) == 12 and {c.fmt for c in fp4} == {"nvfp4", "mxfp4"}
    assert len(kbit) == 6 and {c.fmt for c in kbit} == {"kbit4"}
    # each BM at 2 and 3 bits, BM 128 at 4 bits (the rule's 96..128 tokens)
    assert {c.replace(flat=0) for c in kbit_all - kbit} == kbit
    assert sorted((c.flat, c.bm) for c in kbit_all - kbit) == sorted(
        [(b, bm) for b in (2, 3) for bm in (64, 128, 256)] * 2 + [(4, 128)] * 2)
    assert all(c.enc == c.dtype for c in fp4 | kbit) and {c.bm for c in fp4 | kbit} == {64, 128, 256}
    assert fp4 == {c for c in prewarm_configs(["sm_90a"], {}) if isinstance(c, Fp4WgmmaConfig)}
    assert not wg("fp4_gemm", ["sm_80", "sm_100a", "sm_120a"]) | wg("kbit_gemm", ["sm_80", "sm_100a", "sm_120a"])


@pytest.mark.parametrize("cfg", _wgmma_configs(), ids=lambda c: c.short())
def test_wgmma_cross_encoding_configs_compile_without_spills(cfg):
    """path="wgmma" with words encoded for the other activation type (the matrix has the
    matching encodings)."""
    from kernelgen.core.compile import compile_cubin, resource_summary

    out = compile_cubin(cfg, render(cfg))
    res = resource_summary(out.log)
    assert res["registers"] and res["spill_bytes"] == 0, f"{cfg}: {res}\n{out.log}"
    assert res["static_smem"] + cfg.smem_bytes() <= 227 * 1024, res
    assert "entry function 'fp4_wgmma'" in out.log and "for 'sm_90a'" in out.log, out.log
    assert "serializ" not in out.log, out.log  # ptxas: wgmma serialized (register pressure)


@pytest.mark.parametrize("cfg", [Fp4WgmmaConfig(arch="sm_90a", fmt=f, dtype=d, enc=d, bm=64, stages=2, inflight=0,
                                                ring=r, ctas_per_sm=2)
                                 for f in ("nvfp4", "mxfp4") for d in ("float16", "bfloat16") for r in (1, 2, 3)],
                         ids=lambda c: c.short())
def test_wgmma_two_ctas_an_sm_compile_within_128_registers(cfg):
    """__launch_bounds__(256, 2): at most 128 registers a thread, and no spills to get there."""
    from kernelgen.core.compile import compile_cubin, resource_summary

    res = resource_summary(compile_cubin(cfg, render(cfg)).log)
    assert 0 < res["registers"] <= 128 and res["spill_bytes"] == 0, (cfg.short(), res)


def test_short_k_raises_kw_where_few_warps_run():
    """short_k_kw: a K range of <= SHORT_K_STEPS steps gets the largest KW whose CTAs fit one
    wave at the settled TPW / warps an SM / split, where the K-slice plan launches fewer than
    SHORT_K_BUSY_WARPS warps an SM; busier plans, longer K and the MoE experts' rule stay."""
    from kernelgen.fp4_gemm import select as S

    for fmt in ("nvfp4", "kbit4"):
        p = select_fp4("sm_90a", 1, 4096, 1024, fmt, "float16", 132)
        assert (p.kw, p.grid, p.config.tpw, p.config.warps_per_sm) == (8, (256, 1, 1), 1, 16), p.short()
    p = select_fp4("sm_90a", 16, 2048, 2048, "mxfp4", "float16", 132)
    assert (p.kw, p.config.warps, p.config.warps_per_sm) == (16, 16, 32), p.short()
    busy = select_fp4("sm_90a", 16, 8192, 2048, "nvfp4", "float16", 132)  # 15.5 warps an SM
    assert busy.kw == 4 and busy.warps_launched >= S.SHORT_K_BUSY_WARPS * 132, busy.short()
    assert select_fp4("sm_90a", 16, 4096, 4096, "nvfp4", "float16", 132).kw == 8  # K = 4096
    assert S.kw_for(256, 8, 264, 8) == 2  # the experts' rule keeps MIN_STEPS
