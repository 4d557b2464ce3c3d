"""mx_gemm on the CPU: configs, selector, format / shape errors, prewarm table, the row-major
scale re-layout, and the NumPy emulation of the sm_120a block-scaled kernel's addressing
(kernelgen/mx_gemm/emulate.py) against the reference GEMM."""

import numpy as np
import pytest

from kernelgen.arch import ALL_ARCHS, get_arch
from kernelgen.errors import UnsupportedConfigError
from kernelgen.mx import reference as R
from kernelgen.mx_gemm import reference as GR
from kernelgen.mx_gemm.api import swizzle
from kernelgen.mx_gemm.config import BS_TILES, FP8_TILES, WG_TILES, MxBsGemmConfig, MxFp8GemmConfig
from kernelgen.mx_gemm.emulate import emulate
from kernelgen.mx_gemm.select import (
    FP8_PLAN_TILES,
    PAIRS,
    plan,
    prewarm_configs,
    select_mx_gemm,
    supported_pairs,
)

FP8 = ("mxfp8_e4m3", "mxfp8_e5m2")


# -- configs ---------------------------------------------------------------------------------
def test_fp8_config_on_sm80_needs_the_integer_conversion():
    with pytest.raises(UnsupportedConfigError, match=r"soft_fp8=False; sm_80 has no fp8 instruction"):
        MxFp8GemmConfig(arch="sm_80")
    MxFp8GemmConfig(arch="sm_80", tile_m=64, tile_n=64, warps_m=1, warps_n=4, stages=3,
                    soft_fp8=True).validate()
    MxFp8GemmConfig(arch="sm_90a", soft_fp8=True).validate()  # allowed: the H100 tests run it
    with pytest.raises(UnsupportedConfigError, match="soft_fp8=True; the integer conversion feeds the mma.sync"):
        MxFp8GemmConfig(arch="sm_90a", tile_m=128, tile_n=128, warps_m=8, warps_n=1, stages=4,
                        wgmma=True, hbufs=1, soft_fp8=True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a", "sm_103a"])
def test_block_scaled_config_only_on_sm120(arch):
    with pytest.raises(UnsupportedConfigError, match="sm_120a / sm_121a only"):
        MxBsGemmConfig(arch=arch)
    for ok in ("sm_120a", "sm_121a"):  # RTX 50 class, GB10
        MxBsGemmConfig(arch=ok).validate()


@pytest.mark.parametrize("bad", [dict(a_elem="e2m1"), dict(out_dtype="float32"),
                                 dict(tile_m=96), dict(stages=9)])
def test_fp8_config_field_errors(bad):
    with pytest.raises(UnsupportedConfigError, match=next(iter(bad))):
        MxFp8GemmConfig(arch="sm_90a", **bad)


def test_a_tile_error_shows_the_whole_row():
    """A tile row that is not in the table names all its fields and values (a wrong stage count
    was reported as tile_m=128)."""
    with pytest.raises(UnsupportedConfigError,
                       match=r"\(tile_m, tile_n, warps_m, warps_n, stages\)=\(128, 128, 2, 4, 3\); must be one of"):
        MxBsGemmConfig(arch="sm_121a", stages=3)
    with pytest.raises(UnsupportedConfigError, match=r"stages, hbufs\)=\(128, 128, 2, 4, 9, 1\)"):
        MxFp8GemmConfig(arch="sm_90a", stages=9)


@pytest.mark.parametrize("bad", [dict(mma_kind="mxf8f6f4", a_elem="e2m1", b_elem="e2m1"),
                                 dict(mma_kind="mxf4", a_elem="e4m3", b_elem="e2m1"),
                                 dict(mma_kind="nvf4", a_elem="e2m1", b_elem="e4m3"),
                                 dict(mma_kind="tf32")])
def test_bs_config_kind_errors(bad):
    with pytest.raises(UnsupportedConfigError):
        MxBsGemmConfig(arch="sm_120a", **bad)


@pytest.mark.parametrize("tile", FP8_TILES)
def test_fp8_smem_fits_hopper(tile):
    bm, bn, wm, wn, st = tile
    cfg = MxFp8GemmConfig(arch="sm_90a", tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st)
    stage = (bm + bn) * 128 + max(1, bm // 128) * 512 + max(1, bn // 128) * 512
    assert cfg.smem_bytes() == st * stage + (bm + bn) * 256 + (bm + bn) * 4
    assert cfg.smem_bytes() <= get_arch("sm_90a").smem_optin


# -- selector --------------------------------------------------------------------------------
def test_pairs_table():
    for arch in ("sm_80", "sm_90a", "sm_100a"):
        assert set(supported_pairs(arch)) == {(a, b) for a in FP8 for b in FP8}
    assert ("mxfp8_e4m3", "mxfp4") in PAIRS["sm_120a"]
    assert ("nvfp4", "nvfp4") in PAIRS["sm_120a"] and ("mxfp4", "mxfp4") in PAIRS["sm_120a"]
    assert ("mxfp4", "mxfp8_e4m3") not in PAIRS["sm_120a"]  # FP4 activations x FP8: no kind


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("m,tile", [(1, (64, 64)), (128, (64, 64)), (129, (128, 128)),
                                    (256, (128, 128)), (4096, (128, 256))])
def test_fp8_path_tiles(arch, m, tile):
    p = plan(arch, "mxfp8_e4m3", "mxfp8_e5m2", m, 4096, 4096, "bfloat16", 132)
    assert p.path == "fp8_mma" and (p.config.tile_m, p.config.tile_n) == tile, p.short()
    assert (p.config.a_elem, p.config.b_elem) == ("e4m3", "e5m2")
    assert p.grid[0] == -(-m // tile[0]) * -(-4096 // tile[1])
    assert p.block == (p.config.threads, 1, 1) and p.smem == p.config.smem_bytes()
    assert "fp8_mma" in p.short()


@pytest.mark.parametrize("a,b,kind,elems", [
    ("mxfp8_e4m3", "mxfp8_e4m3", "mxf8f6f4", ("e4m3", "e4m3")),
    ("mxfp8_e5m2", "mxfp4", "mxf8f6f4", ("e5m2", "e2m1")),
    ("mxfp4", "mxfp4", "mxf4", ("e2m1", "e2m1")),
    ("nvfp4", "nvfp4", "nvf4", ("e2m1", "e2m1")),
])
@pytest.mark.parametrize("arch,sms", [("sm_120a", 170), ("sm_121a", 48)])
def test_sm120_native_path(a, b, kind, elems, arch, sms):
    p = plan(arch, a, b, 300, 1024, 4096, "float16", sms)
    assert p.path == "bs_mma" and p.config.mma_kind == kind and p.config.arch == arch
    assert (p.config.a_elem, p.config.b_elem) == elems
    assert p.smem <= get_arch(arch).smem_optin


def test_selector_memoised():
    args = ("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 100, 256, 512, "bfloat16", 132)
    assert select_mx_gemm(*args) is select_mx_gemm(*args)


@pytest.mark.parametrize("a,b", [("mxfp8_e4m3", "mxfp4"), ("nvfp4", "nvfp4")])
def test_sm80_fp4_error_names_what_runs(a, b):
    with pytest.raises(ValueError, match="cannot run on sm_80; sm_80 runs mxfp8_e4m3 x mxfp8_e4m3.*fp4_gemm"):
        plan("sm_80", a, b, 16, 256, 256, "bfloat16", 108)


# (SM count, shared memory a block) of sm_80 parts: A100, 8.6 parts (99 KB) -> the tiles
SM80_CASES = [((108, 163 * 1024), 1, (64, 64, 1, 4, 4)), ((108, 163 * 1024), 16, (64, 128, 1, 4, 4)),
              ((108, 163 * 1024), 4096, (128, 128, 2, 4, 2)),
              ((72, 99 * 1024), 1, (64, 64, 1, 4, 3)), ((84, 99 * 1024), 16, (64, 128, 2, 4, 2)),
              ((84, 99 * 1024), 4096, (64, 128, 2, 4, 2))]


@pytest.mark.parametrize("part,m,tile", SM80_CASES)
def test_sm80_mxfp8_plans_fit_the_part(part, m, tile):
    """sm_80 runs MXFP8 x MXFP8 on the mma.sync kernel with the integer fp8 conversion, on a tile
    whose shared memory fits the part's blocks (99 KB on 8.6 parts, 163 KB on A100)."""
    sms, lim = part
    n = 4096 if m != 16 else 128 * sms  # 128-wide tiles fill the SMs
    p = plan("sm_80", "mxfp8_e5m2", "mxfp8_e4m3", m, n, 4096, "float16", sms, lim)
    c = p.config
    assert p.path == "fp8_mma" and c.soft_fp8 and not c.wgmma, p.short()
    assert (c.tile_m, c.tile_n, c.warps_m, c.warps_n, c.stages) == tile, p.short()
    assert (c.a_elem, c.b_elem) == ("e5m2", "e4m3")
    assert p.smem <= lim
    assert plan("sm_80", "mxfp8_e5m2", "mxfp8_e4m3", m, n, 4096, "float16", sms).config.smem_bytes() \
        <= get_arch("sm_80").smem_optin
    with pytest.raises(ValueError, match="sm_80 part with 65536 B of shared memory a block"):
        plan("sm_80", "mxfp8_e5m2", "mxfp8_e4m3", m, n, 4096, "float16", sms, 64 * 1024)


@pytest.mark.parametrize("m,n,tile", [(1, 4096, (64, 64, 1, 4, 4)), (64, 142 * 128, (64, 128, 2, 4, 3)),
                                      (4096, 4096, (128, 128, 2, 4, 2))])
def test_sm89_plans_take_the_fp8_mma_sync(m, n, tile):
    """Ada (sm_89) multiplies on the fp8 mma.sync over the rescaled stages (hbufs 0): no f16
    tiles, no integer decoding, tiles within its 99 KB a block."""
    p = plan("sm_89", "mxfp8_e4m3", "mxfp8_e5m2", m, n, 4096, "bfloat16", 142, 99 * 1024)
    c = p.config
    assert p.path == "fp8_mma" and c.hbufs == 0 and not c.wgmma and not c.soft_fp8, p.short()
    assert (c.tile_m, c.tile_n, c.warps_m, c.warps_n, c.stages) == tile, p.short()
    assert p.smem <= 99 * 1024 and get_arch("sm_89").smem_optin == 99 * 1024
    with pytest.raises(UnsupportedConfigError, match="hbufs=0; the fp8 mma.sync .* needs sm_89"):
        MxFp8GemmConfig(arch="sm_80", tile_m=64, tile_n=64, warps_m=1, warps_n=4, stages=4, hbufs=0,
                        soft_fp8=True)
    with pytest.raises(UnsupportedConfigError, match="soft_fp8=True; the fp8 mma.sync .* converts nothing"):
        c.replace(soft_fp8=True)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_103a"])
def test_hopper_plans_keep_the_fp8_instruction(arch):
    for m in (1, 100, 4096):
        assert not plan(arch, "mxfp8_e4m3", "mxfp8_e4m3", m, 4096, 4096, "bfloat16", 132).config.soft_fp8


def _perm_1404(x):
    """__byte_perm(x, 0, 0x1404) of a 16-bit x: byte 0 -> bits 8..15, byte 1 -> bits 24..31."""
    return (x & 0xFF) << 8 | (x >> 8 & 0xFF) << 24


def _e4m3x2_scaled(x):  # templates/common/dtypes.cuh e4m3x2_to_f16x2_scaled
    t = _perm_1404(x)
    return (t & 0x80008000) | ((t >> 1) & 0x3F803F80)


def _halves(h):
    return np.stack([h & 0xFFFF, h >> 16], axis=1).astype(np.uint16).view(np.float16)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_soft_fp8_conversion_replayed(elem):
    """templates/mx_gemm/ops.cuh fp8x2_to_f16x2_soft (e4m3: common/dtypes.cuh
    e4m3x2_to_f16x2_soft, also fp4.cuh's scale decoding below sm_89), replayed in NumPy on every
    pair of codes (each in the low and in the high byte): the f16 of the code's value, NaN for
    NaN codes."""
    fmt = {"e4m3": R.E4M3, "e5m2": R.E5M2}[elem]
    lo, hi = np.meshgrid(np.arange(256, dtype=np.uint32), np.arange(256, dtype=np.uint32))
    x = (lo | hi << 8).ravel()
    if elem == "e5m2":
        got = _halves(_perm_1404(x)).astype(np.float64)
    else:
        n = _perm_1404(((x & 0x7F7F) + 0x0101) & 0x8080)  # e4m3_nan_bytes, placed
        # times 256 (fma.rn.f16x2 with -0): exact (the values need at most 4 significant bits)
        got = _halves(_e4m3x2_scaled(x) | (n - (n >> 5))).astype(np.float64) * 256.0
    want = np.stack([R.decode((x & 0xFF).astype(np.uint8), fmt),
                     R.decode((x >> 8).astype(np.uint8), fmt)], axis=1).astype(np.float64)
    nan = np.isnan(want)
    assert nan.sum() == 2 * 256 * (2 if elem == "e4m3" else 6)  # 2 / 6 NaN codes a byte, 2 bytes
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))  # -0 stays -0


def test_soft_e4m3_folded_scale_replayed():
    """templates/mx_gemm/fp8_mma.cuh convert_chunk's integer e4m3 path for chunks without NaN:
    RN16(e4m3x2_to_f16x2_scaled(x) * (s2 * 2^8)) equals RN16(value * s2), what the cvt path
    computes, bit for bit, for every finite code and every scale s2 = 2^d (d = 0 .. -24) or 0;
    and e4m3_nan_bytes flags exactly the NaN codes of a word."""
    codes = np.arange(256, dtype=np.uint32)
    val = R.decode(codes.astype(np.uint8), R.E4M3)
    finite = ~np.isnan(val)
    x = codes[finite] | codes[finite][::-1] << 8
    scaled = _halves(_e4m3x2_scaled(x))
    exact = np.stack([R.decode((x & 0xFF).astype(np.uint8), R.E4M3),
                      R.decode((x >> 8).astype(np.uint8), R.E4M3)], axis=1).astype(np.float16)
    for s2 in [np.float16(2.0 ** d) for d in range(0, -25, -1)] + [np.float16(0.0)]:
        s2x = np.float16(s2 * np.float16(256.0))
        assert np.array_equal((scaled * s2x).view(np.uint16), (exact * s2).view(np.uint16)), float(s2)
    flags = ((codes & 0x7F) + 0x01) & 0x80  # e4m3_nan_bytes on one byte
    assert np.array_equal(flags != 0, np.isnan(val))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("a,b", [("mxfp8_e4m3", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp4", "mxfp4")])
def test_fp4_pairs_rejected_before_sm120(arch, a, b):
    with pytest.raises(ValueError, match=f"cannot run on {arch}.*mxfp8_e4m3 x mxfp8_e4m3"):
        plan(arch, a, b, 16, 256, 256, "bfloat16", 132)


def test_unknown_format_rejected():
    with pytest.raises(ValueError, match="mxfp6_e2m3.*not supported"):
        plan("sm_120a", "mxfp6_e2m3", "mxfp6_e2m3", 16, 256, 256, "bfloat16", 170)


@pytest.mark.parametrize("m,n,k", [(0, 256, 256), (16, 12, 256), (16, 256, 48), (16, 256, 0)])
def test_shape_rules(m, n, k):
    with pytest.raises(ValueError, match="multiple of"):
        plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", m, n, k, "bfloat16", 132)


def test_out_dtype_rule():
    with pytest.raises(ValueError, match="out_dtype"):
        plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 16, 256, 256, "float32", 132)


def test_forced_config_must_be_a_config():
    """mx_gemm(config=...) hands the object to forced(): one that is not a config raised
    AttributeError (its .short() in the message)."""
    from kernelgen.mx_gemm.select import forced

    p = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 16, 256, 256, "bfloat16", 132)
    assert forced(p, p.config).config == p.config
    for bad in (None, 5, "MxFp8GemmConfig", p.config.as_dict()):
        with pytest.raises(ValueError, match=r"config: \w+; this call \(MxFp8GemmConfig\(.*takes a "
                                             r"MxFp8GemmConfig"):
            forced(p, bad)
    bs = MxBsGemmConfig(arch="sm_120a")
    with pytest.raises(ValueError, match="does not fit this call"):  # a config of the other kind
        forced(p, bs)


# -- prewarm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, None, "x", [132]])
def test_prewarm_rejects_bad_sm_counts(bad):
    """A profile's sm_counts went to plan() as given: None / 'x' raised TypeError comparing
    with the tile counts."""
    spec = {"shapes": [[64, 4096, 4096]], "sm_counts": [bad]}
    with pytest.raises(UnsupportedConfigError, match=r"spec sm_counts: .*; expected SM counts"):
        list(prewarm_configs(["sm_90a"], spec))


def test_prewarm_table():
    sm80 = list(prewarm_configs(["sm_80"], {}))
    assert all(c.soft_fp8 for c in sm80)  # both shared-memory sizes of sm_80's parts
    assert {(c.tile_m, c.tile_n, c.warps_m, c.warps_n, c.stages) for c in sm80} == \
        {(64, 64, 1, 4, 4), (64, 128, 1, 4, 4), (128, 128, 2, 4, 2), (64, 64, 1, 4, 3), (64, 128, 2, 4, 2)}
    for arch in ALL_ARCHS:
        cfgs = list(prewarm_configs([arch], {}))
        assert 0 < len(cfgs) <= 40 and len(set(cfgs)) == len(cfgs)
        assert all(c.arch == arch for c in cfgs)
    kinds = {c.mma_kind for c in prewarm_configs(["sm_120a"], {})}
    assert kinds == {"mxf8f6f4", "mxf4", "nvf4"}
    tiles = {(c.tile_m, c.tile_n) for c in prewarm_configs(["sm_90a"], {})}
    assert tiles == {(t[0], t[1]) for t in FP8_TILES}


def test_prewarm_spec_covers_dispatch():
    spec = {"formats": [["mxfp8_e4m3", "mxfp8_e4m3"]], "out_dtypes": ["bfloat16"],
            "shapes": [[1, 4096, 4096], [8192, 8192, 8192]]}
    cfgs = set(prewarm_configs(["sm_90a"], spec))
    for m in (1, 8192):
        assert plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", m, 4096, 4096, "bfloat16", 132).config in cfgs
    assert {(c.tile_m, c.tile_n) for c in cfgs} == {(64, 64), (128, 256)}
    wide = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 16, 128 * 132, 256, "bfloat16", 132)
    assert (wide.config.tile_m, wide.config.tile_n) == (64, 128)


# -- scale re-layout -------------------------------------------------------------------------
@pytest.mark.parametrize("rows,s", [(1, 1), (130, 5), (256, 8), (77, 129)])
def test_row_major_to_swizzled_matches_reference(rows, s):
    sc = np.random.default_rng(rows + s).integers(0, 255, (rows, s), dtype=np.uint8)
    np.testing.assert_array_equal(swizzle(np, sc, rows, s), R.swizzle_scales(sc))


# -- sm_120a kernel emulation ----------------------------------------------------------------
def _operands(fmt_a, fmt_b, m, n, k, seed):
    rng = np.random.default_rng(seed)
    xa = (rng.standard_normal((m, k)) * rng.uniform(0.01, 10, (m, 1))).astype(np.float32)
    xb = (rng.standard_normal((n, k)) * rng.uniform(0.01, 10, (n, 1))).astype(np.float32)
    return GR.quantize(xa, fmt_a), GR.quantize(xb, fmt_b)


SM120_CASES = [(a, b, 130, 136, 160) for a, b in [
    ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp4"),
    ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4")]] + \
    [(a, b, 40, 264, 256) for a, b in [("mxfp8_e4m3", "mxfp4"), ("nvfp4", "nvfp4")]]


@pytest.mark.parametrize("a_fmt,b_fmt,m,n,k", SM120_CASES)
def test_sm120_emulation_reproduces_reference(a_fmt, b_fmt, m, n, k):
    a, b = _operands(a_fmt, b_fmt, m, n, k, seed=m + n + k)
    p = plan("sm_120a", a_fmt, b_fmt, m, n, k, "bfloat16", 170)
    gsa = float(a.global_scale[0]) if a.global_scale is not None else 1.0
    gsb = float(b.global_scale[0]) if b.global_scale is not None else 1.0
    d = emulate(p.config, a.data, a.scales, b.data, b.scales, m, n, k, alpha=0.5, gsa=gsa, gsb=gsb)
    ref = GR.mx_gemm(a, b, alpha=0.5)
    assert not np.isnan(d).any(), f"{p.short()}: unwritten outputs"
    # MX values are exact in float64 on both sides; the NVFP4 reference rounds each value
    # e2m1 * e4m3 / gs to fp32, the kernel divides by gs_a * gs_b once at the end
    bound = 1e-6 if a_fmt == "nvfp4" else 1e-12
    assert GR.rel_error(d, ref) < bound, f"{a_fmt} x {b_fmt} {m=} {n=} {k=} {p.short()}"


def test_emulation_sees_a_wrong_scale_layout():
    """The emulation check can fail: row-major scale bytes passed as swizzled give a wrong D."""
    m = n = 128
    k = 256
    a, b = _operands("mxfp8_e4m3", "mxfp8_e4m3", m, n, k, seed=3)
    a_rm = GR.quantize(R.dequantize_mx(a.data, a.scales, a.fmt), a.fmt, "row_major")
    p = plan("sm_120a", a.fmt, b.fmt, m, n, k, "bfloat16", 170)
    wrong = np.zeros(a.scales.size, np.uint8)
    wrong[: a_rm.scales.size] = a_rm.scales.reshape(-1)
    d = emulate(p.config, a.data, wrong, b.data, b.scales, m, n, k)
    assert GR.rel_error(d, GR.mx_gemm(a, b)) > 1e-2


def test_reference_exact_on_representable_values():
    # integers up to 8 with one power-of-two scale per group are exact in E4M3 and E8M0
    rng = np.random.default_rng(0)
    xa = rng.integers(-8, 9, (8, 64)).astype(np.float32)
    xb = rng.integers(-8, 9, (16, 64)).astype(np.float32)
    a, b = GR.quantize(xa, "mxfp8_e4m3"), GR.quantize(xb, "mxfp8_e4m3")
    np.testing.assert_array_equal(GR.mx_gemm(a, b, alpha=2.0), 2.0 * xa.astype(np.float64) @ xb.T)


def test_compile_matrix_archs():
    archs = {c.arch for c in prewarm_configs(ALL_ARCHS, {})}
    assert archs == set(ALL_ARCHS)
    assert len(BS_TILES) >= 1


# -- Hopper kernel emulation (fp8 -> scaled f16 tiles, f16 mma, row scales in the epilogue) --
FP8_CASES = [(t, "mxfp8_e4m3", "mxfp8_e4m3") for t in [*FP8_TILES, *(("wgmma", *w) for w in WG_TILES)]] \
    + [(FP8_TILES[0], "mxfp8_e5m2", "mxfp8_e4m3"), (("wgmma", *WG_TILES[2]), "mxfp8_e4m3", "mxfp8_e5m2"),
       (("wgmma", *WG_TILES[0]), "mxfp8_e5m2", "mxfp8_e4m3"), (("wgmma", *WG_TILES[1]), "mxfp8_e4m3", "mxfp8_e5m2")] \
    + [(("mma8", *t), a, b) for t in sorted({t for _, ts in FP8_PLAN_TILES["sm_89"] for t in ts})
       for a, b in (("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e4m3"))]


@pytest.mark.parametrize("tile,a_fmt,b_fmt", FP8_CASES)
def test_fp8_kernel_emulation_reproduces_reference(tile, a_fmt, b_fmt):
    from kernelgen.mx_gemm.emulate_fp8 import emulate_fp8

    m, n, k = 70, 264, 288  # partial row / column tiles, K not a multiple of the 128 k-tile
    wg, mma8 = tile[0] == "wgmma", tile[0] == "mma8"  # mma8: sm_89's fp8 mma.sync (hbufs 0)
    bm, bn, wm, wn, st, hb = tile[1:] if wg else (*tile[1:], 0) if mma8 else (*tile, 1)
    cfg = MxFp8GemmConfig(arch="sm_89" if mma8 else "sm_90a", a_elem=a_fmt[-4:], b_elem=b_fmt[-4:],
                          tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st, wgmma=wg, hbufs=hb)
    a, b = _operands(a_fmt, b_fmt, m, n, k, seed=bm + bn)
    d = emulate_fp8(cfg, a.data, a.scales, b.data, b.scales, m, n, k, alpha=-1.5)
    assert not np.isnan(d).any(), f"{cfg.short()}: unwritten outputs"
    # hbufs 0 rounds codes of blocks below their row's largest scale to fp8 (the operands'
    # k-blocks span 2^-6 .. 2^1 here); the f16 tiles keep them exactly
    bound = 2e-5 if cfg.hbufs == 0 else 1e-9
    assert GR.rel_error(d, GR.mx_gemm(a, b, alpha=-1.5)) < bound, cfg.short()


def test_fp8_kernel_emulation_wide_scale_spread():
    """k-blocks 2^-30 .. 2^0 within one row: blocks far below the row's largest scale are
    rounded on f16's subnormal grid; the result stays far inside the output rounding."""
    from kernelgen.mx_gemm.emulate_fp8 import emulate_fp8

    m, n, k = 16, 128, 256
    rng = np.random.default_rng(5)
    spread = np.repeat(2.0 ** rng.integers(-30, 1, (1, k // 32)), 32, axis=1)
    a = GR.quantize((rng.standard_normal((m, k)) * spread).astype(np.float32), "mxfp8_e4m3")
    b = GR.quantize(rng.standard_normal((n, k)).astype(np.float32), "mxfp8_e5m2")
    cfg = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e5m2", m, n, k, "bfloat16", 132).config
    d = emulate_fp8(cfg, a.data, a.scales, b.data, b.scales, m, n, k)
    assert GR.rel_error(d, GR.mx_gemm(a, b)) < 1e-6
    # the fp8 wgmma's in-place rescale rounds such blocks to e4m3's subnormal step instead
    bm, bn, wm, wn, st, hb = WG_TILES[1]
    cfg = MxFp8GemmConfig(arch="sm_90a", a_elem="e4m3", b_elem="e5m2", tile_m=bm, tile_n=bn,
                          warps_m=wm, warps_n=wn, stages=st, wgmma=True, hbufs=hb)
    d = emulate_fp8(cfg, a.data, a.scales, b.data, b.scales, m, n, k)
    assert 0 < GR.rel_error(d, GR.mx_gemm(a, b)) < 1e-4


@pytest.mark.parametrize("tile", [(*t, False) for t in WG_TILES] + [(*t, True) for t in WG_TILES if t[5] == 0])
def test_wgmma_variant_compiles_without_spills(tile):
    """Opt-in (not in the prewarm table until measured), so compiled here instead."""
    from kernelgen.core.compile import compile_cubin, resource_summary
    from kernelgen.core.render import render

    bm, bn, wm, wn, st, hb, pre = tile
    cfg = MxFp8GemmConfig(arch="sm_90a", tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st,
                          wgmma=True, hbufs=hb, prescale=pre)
    out = compile_cubin(cfg, render(cfg))
    res = resource_summary(out.log)
    assert res["registers"] and res["spill_bytes"] == 0, out.log
    assert cfg.smem_bytes() <= get_arch("sm_90a").smem_optin


def test_wgmma_variant_only_sm90a():
    bm, bn, wm, wn, st, hb = WG_TILES[0]
    with pytest.raises(UnsupportedConfigError, match="sm_90a only"):
        MxFp8GemmConfig(arch="sm_100a", tile_m=bm, tile_n=bn, warps_m=wm, warps_n=wn, stages=st,
                        wgmma=True, hbufs=hb)
    with pytest.raises(UnsupportedConfigError, match="hbufs=1"):
        MxFp8GemmConfig(arch="sm_90a", hbufs=2)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
def test_operands_are_valid_mxtensors(fmt, layout):
    """What the tests and the benchmark feed mx_gemm is the mx-quant contract's MxTensor."""
    from kernelgen.mx.tensor import MxTensor

    x = np.random.default_rng(1).standard_normal((130, 96)).astype(np.float32)
    t = GR.upload(GR.quantize(x, fmt, layout), np)
    assert isinstance(t, MxTensor)
    t.check()


def test_wgmma_switch(monkeypatch):
    from kernelgen.mx_gemm import select as sel  # kernelgen.mx_gemm the attribute is the function

    monkeypatch.setattr(sel, "SM90_WGMMA", True)
    big = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 4096, 4096, 4096, "bfloat16", 132).config
    assert big.wgmma and (big.tile_m, big.tile_n, big.hbufs, big.prescale) == (128, 256, 0, True)  # 512 CTAs
    mid = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 256, 4096, 4096, "bfloat16", 132).config
    assert mid.wgmma and (mid.tile_m, mid.tile_n, mid.hbufs, mid.prescale) == (128, 128, 0, True)  # 128x256: 32 CTAs
    assert mid in set(prewarm_configs(["sm_90a"], {}))
    monkeypatch.setattr(sel, "SM90_PRESCALE", False)
    inplace = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 4096, 4096, 4096, "bfloat16", 132).config
    assert inplace.wgmma and (inplace.tile_n, inplace.hbufs, inplace.prescale) == (256, 0, False)
    f16 = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", 256, 4096, 4096, "bfloat16", 132).config
    assert f16.wgmma and (f16.tile_n, f16.hbufs) == (128, 2)
    monkeypatch.setattr(sel, "SM90_PRESCALE", True)
    small = plan("sm_90a", "mxfp8_e4m3", "mxfp8_e4m3", sel.SMALL_M, 4096, 4096, "bfloat16", 132)
    assert not small.config.wgmma and small.config.tile_m == 64
    assert not plan("sm_100a", "mxfp8_e4m3", "mxfp8_e4m3", 4096, 4096, 4096, "bfloat16", 148).config.wgmma
    assert big in set(prewarm_configs(["sm_90a"], {}))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_fp8_rescale_integer_path_is_exact(elem):
    """templates/mx_gemm/fp8_mma.cuh rescale_codes: where it takes the integer path (every
    magnitude >= (d + 1) << mantissa bits, d below the byte limit, no NaN / Inf) the code minus
    d << mantissa bits is the fp8 code nearest to value * 2^-d, for every code and d; and the
    path is refused for every code it would get wrong."""
    from kernelgen.mx import reference as R

    fmt = {"e4m3": R.E4M3, "e5m2": R.E5M2}[elem]
    mb = 3 if elem == "e4m3" else 2
    special = 0x7F if elem == "e4m3" else 0x7C
    codes = np.arange(256, dtype=np.uint8)
    vals = R.decode(codes, fmt)
    refused = 0
    for d in range(1, 40):
        want = R.encode(vals * 2.0 ** -d, fmt, saturate=True)
        mag = codes & 0x7F
        takes = (d < (128 >> mb) - 1) & (mag >= ((d + 1) << mb)) & (mag < special)
        got = (codes.astype(np.int64) - (d << mb)).astype(np.uint8)
        assert np.array_equal(got[takes], want[takes]), (elem, d)
        # refused codes: the subtraction would be wrong (or the special value lost)
        wrong = ~takes & ((mag < (d << mb)) | (got != want) | (mag >= special))
        refused += int(wrong.sum())
    assert refused > 0


def test_prescale_rule():
    with pytest.raises(UnsupportedConfigError, match="prescale"):
        MxFp8GemmConfig(arch="sm_90a", prescale=True)  # mma.sync
    cfg = MxFp8GemmConfig(arch="sm_90a", tile_m=128, tile_n=256, warps_m=8, warps_n=1, stages=4,
                          wgmma=True, hbufs=0, prescale=True)
    assert cfg.symbols() == ("mx_gemm_fp8", "mx_gemm_rescale_a", "mx_gemm_rescale_b")
