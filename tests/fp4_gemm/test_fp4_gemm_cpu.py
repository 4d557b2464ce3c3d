"""FP4 GEMM checks that need no GPU: the decode tables and scale decode (emulated bit for bit
against kernelgen/mx/reference.py), the selector, prewarm = dispatch, configs and input rules."""

import re
from pathlib import Path

import numpy as np
import pytest

from kernelgen.errors import UnsupportedConfigError
from kernelgen.fp4_gemm import reference as GR
from kernelgen.fp4_gemm.config import Fp4GemvConfig, Fp4TileConfig, tile_smem
from kernelgen.fp4_gemm.select import (
    GEMV_MAX_M,
    MIN_STEPS,
    SM_COUNTS,
    bm_for,
    plan,
    prewarm_configs,
    select_fp4,
    stages_for,
)
from kernelgen.mx import reference as MR

from ._weights import host_weight

HEADER = Path(__file__).resolve().parents[2] / "templates" / "fp4_gemm" / "fp4.cuh"


# -- the device decode, emulated -----------------------------------------------------------------
def _prmt(a, b, c):
    """PTX prmt.b32 (default mode): byte i of d = byte (c >> 4i & 7) of {b, a}; bit 3 replicates
    the sign of the selected byte."""
    bs = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    r = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        v = bs[sel & 7]
        if sel & 8:
            v = 0xFF if v & 0x80 else 0
        r |= v << (8 * i)
    return r


def _lut(ctype):
    src = HEADER.read_text()
    blk = src[src.index(f"template <> struct E2m1Lut<{ctype}>"):]
    blk = blk[: blk.index("};")]
    return {k: int(v, 16) for k, v in re.findall(r"(H0|H1|L0|L1) = (0x[0-9A-Fa-f]+)u", blk)}


def _e2m1x8(w, lut, low):
    """fp4.cuh e2m1x8: word of 8 codes -> 4 registers of two 16-bit values."""
    mag, w4 = w & 0x77777777, (w << 4) & 0xFFFFFFFF
    out = []
    for h in range(2):
        m = (mag >> 16) if h else mag
        sg = _prmt(w4, w, 0x7362 if h else 0x5140)
        hi = _prmt(lut["H0"], lut["H1"], m & 0xFFFF) | (sg & 0x80808080)
        if low:
            lo = _prmt(lut["L0"], lut["L1"], m & 0xFFFF)
            out += [_prmt(lo, hi, 0x5140), _prmt(lo, hi, 0x7362)]
        else:
            out += [_prmt(hi, 0, 0x1404), _prmt(hi, 0, 0x3424)]
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_e2m1_decode_tables_exact(dtype):
    low = dtype == "bfloat16"
    lut = _lut("__nv_bfloat16" if low else "half")
    rng = np.random.default_rng(0)
    words = [0x76543210, 0xFEDCBA98] + [int(x) for x in rng.integers(0, 2**32, 500, dtype=np.uint64)]
    for w in words:
        regs = _e2m1x8(w, lut, low)
        halves = np.array([(r >> (16 * i)) & 0xFFFF for r in regs for i in range(2)], np.uint16)
        got = (halves.view(np.float16).astype(np.float64) if not low
               else (halves.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
        want = MR.decode(np.array([(w >> (4 * i)) & 0xF for i in range(8)]), MR.E2M1).astype(np.float64)
        assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), hex(w)


def test_e4m3_scale_decode_exact():
    # fp4.cuh e4m3_to_float: the fp16 bit pattern ((b & 0x7F) << 7 | sign << 15) is e4m3 * 2^-8
    b = np.arange(256)
    h = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).astype(np.uint16).view(np.float16)
    got = h.astype(np.float64) * 256.0
    want = MR.decode(b.astype(np.uint8), MR.E4M3).astype(np.float64)
    finite = (b & 0x7F) != 0x7F
    assert np.array_equal(got[finite], want[finite])
    assert np.all(np.isnan(want[~finite]))


def test_e2m1_times_scale_fits_fp16_and_bf16():
    # the kernels scale W pairs in T before the mma: every e2m1 x e4m3 product is exact in both
    e2m1 = MR.decode(np.arange(16, dtype=np.uint8), MR.E2M1).astype(np.float64)
    e4m3 = MR.decode(np.arange(127, dtype=np.uint8), MR.E4M3).astype(np.float64)
    prod = (e2m1[:, None] * e4m3[None, :]).ravel()
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
SHAPES = [(14336, 4096), (4096, 14336), (4096, 4096), (200, 384), (1000, 4224), (16, 128)]
MS = [1, 2, 3, 5, 8, 15, 16, 17, 33, 64, 127, 256, 1024, 4096]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_plans_are_consistent(n, k, fmt):
    q = k // 128
    for m in MS:
        for sms in (132, 114, 20):
            p = select_fp4("sm_90a", m, n, k, fmt, "float16", sms)
            ctx = f"{m=} {n=} {k=} {sms=} {p.short()}"
            assert p.path == ("gemv" if m <= GEMV_MAX_M else "tile"), ctx
            assert (p.split - 1) * p.sps < q <= p.split * p.sps, ctx  # splits cover K, none empty
            assert p.smem <= p.config.smem_bytes(), ctx
            if p.path == "gemv":
                cfg = p.config
                assert cfg.m_tile == (8 if m <= 8 else 16), ctx
                assert p.grid == (-(-n // 128), p.split, -(-m // cfg.m_tile)), ctx
                assert p.smem == min(m, cfg.m_tile) * p.sps * 256, ctx
                assert cfg.depth == (4 if p.sps >= 4 else 2), ctx
                if p.split > 1:
                    assert p.sps >= MIN_STEPS or p.smem > cfg.smem_bytes() // 2, ctx
            else:
                assert p.config.bm == bm_for(m), ctx
                assert p.grid == (-(-n // 128), -(-m // p.config.bm), p.split), ctx


def test_decode_shapes_fill_the_gpu():
    for n, k in ((14336, 4096), (4096, 14336)):
        for m in (1, 16):
            p = select_fp4("sm_90a", m, n, k, "nvfp4", "bfloat16", 132)
            warps = -(-n // 16) * p.split * p.grid[2]
            assert warps >= 132 * 8, p.short()  # >= a CTA's 8 warps on every SM
            assert p.grid[0] * p.split * p.grid[2] <= 132 * 2, p.short()  # one wave, 2 CTAs/SM


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
    with pytest.raises(ValueError, match="do not fit"):
        plan("sm_90a", 16, 4096, 14336, "nvfp4", "float16", 132, path="gemv", split=1)
    with pytest.raises(ValueError, match="path='wgmma'"):
        plan("sm_90a", 1, 4096, 4096, "nvfp4", "float16", 132, path="wgmma")


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
        assert 0 < len(cfgs) <= 40 and len(set(cfgs)) == len(cfgs)
        assert {type(c) for c in cfgs} == {Fp4GemvConfig, Fp4TileConfig}


@pytest.mark.parametrize("arch", list(SM_COUNTS))
def test_prewarm_equals_dispatch(arch):
    spec = {"shapes": [[14336, 4096], [4096, 14336], [3, 200, 384]], "dtypes": ["bfloat16", "float32"]}
    pre = set(prewarm_configs([arch], spec))
    picked = set()
    for sms in SM_COUNTS[arch]:
        for fmt in ("nvfp4", "mxfp4"):
            for m in list(range(1, 300)) + [1000, 5000]:
                for n, k in ((14336, 4096), (4096, 14336)):
                    picked.add(select_fp4(arch, m, n, k, fmt, "bfloat16", sms).config)
            picked.add(select_fp4(arch, 3, 200, 384, fmt, "bfloat16", sms).config)
    assert picked == pre
    assert all(c.dtype == "bfloat16" for c in pre)
    assert pre <= set(prewarm_configs([arch], {}))


def test_prewarm_rejects_bad_shapes():
    with pytest.raises(UnsupportedConfigError, match="multiple of 128"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[4096, 100]]}))
    with pytest.raises(UnsupportedConfigError, match=r"expected \[N, K\]"):
        list(prewarm_configs(["sm_90a"], {"shapes": [[1, 2, 3, 4]]}))


@pytest.mark.parametrize("field,value", [("fmt", "mxfp8_e4m3"), ("dtype", "float32"),
                                         ("m_tile", 12), ("warps", 3), ("depth", 3)])
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
    t = FakeMxTensor("mxfp6_e2m3", (16, 128), None, None, "row_major", None)
    with pytest.raises(ValueError, match="format 'mxfp6_e2m3'"):
        prepare_weight(t)
    t = FakeMxTensor("nvfp4", (16, 100), None, None, "row_major", None)
    with pytest.raises(ValueError, match="positive multiple of 128"):
        prepare_weight(t)
    t = FakeMxTensor("nvfp4", (16, 128), np.zeros((16, 64), np.uint8), None, "row_major", None)
    with pytest.raises(ValueError, match="NumPy arrays live on the host"):
        prepare_weight(t)


def test_mx_fp16_scaled_table_exact():
    # fp4.cuh chunk_scales (MXFP4, fp16): high-byte table + 4d per byte (zero entry kept) is
    # e2m1 * 2^d for every d in [-13, 13]; decoded through e2m1x8 with that table
    lut = _lut("half")
    codes = np.arange(16)
    w = sum(int(c) << (4 * i) for i, c in enumerate(codes[:8])), sum(int(c) << (4 * i) for i, c in enumerate(codes[8:]))
    want_base = MR.decode(codes.astype(np.uint8), MR.E2M1).astype(np.float64)
    for d in range(-13, 14):
        add = (4 * d) & 0xFFFFFFFF
        t = {"H0": (lut["H0"] + add * 0x01010100) & 0xFFFFFFFF, "H1": (lut["H1"] + add * 0x01010101) & 0xFFFFFFFF}
        got = []
        for word in w:
            regs = _e2m1x8(word, t, False)
            got += [(r >> (16 * i)) & 0xFFFF for r in regs for i in range(2)]
        got = np.array(got, np.uint16).view(np.float16).astype(np.float64)
        assert np.array_equal(got, want_base * 2.0 ** d), d
        assert np.array_equal(np.signbit(got), np.signbit(want_base)), d
