"""kbit GEMM tensor-core path without a GPU: config rules, tile / split planning, the path
selector and its thresholds, prewarm = dispatch, shape errors naming the rule."""

import pytest

from kernelgen.arch import PARTS, SM_COUNTS, get_arch, smem_limits
from kernelgen.errors import UnsupportedConfigError
from kernelgen.kbit_gemm import KbitMmaConfig
from kernelgen.kbit_gemm import tc_select as S
from kernelgen.kbit_gemm.tc_config import TILE_K, TILES, smem_for, stages_for

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (384, 1024), (512, 4224))


@pytest.mark.parametrize("arch", list(SM_COUNTS))
@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_every_tile_fits_every_arch(arch, bits):
    for tm, tn in TILES:
        st = stages_for(arch, bits, tm, tn)
        cfg = KbitMmaConfig(arch=arch, bits=bits, tile_m=tm, tile_n=tn, stages=st)
        assert cfg.smem_bytes() == smem_for(bits, tm, tn, st)
        assert 2 <= st <= 4 and (st == 4 or get_arch(arch).smem_optin == 99 * 1024), cfg  # sm_120a, sm_89


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
@pytest.mark.parametrize("n,k", SHAPES)
def test_mma_plans_cover_k_and_fill_the_gpu(n, k, bits):
    for m in (17, 33, 64, 100, 128, 255, 512, 1024, 2047):
        for sms in (132, 108, 170):
            p = S.plan_mma("sm_90a", m, n, k, bits, "float16", sms)
            kt = k // TILE_K
            tm, tn = p.config.tile_m, p.config.tile_n
            ctx = f"{m=} {n=} {k=} {sms=} {p.short()}"
            assert p.m_tiles == -(-m // tm) and p.n_tiles == n // tn, ctx
            assert p.kt_per_split * (p.split - 1) < kt <= p.kt_per_split * p.split, ctx  # non-empty splits
            assert p.split == 1 or p.kt_per_split >= S.MIN_KT_PER_SPLIT, ctx
            assert p.split * m * n * 4 <= max(S.MAX_WS_BYTES, m * n * 4), ctx
            assert tm == S.tile_for(m, n)[0], ctx
            # the grid fills most of the GPU when the K range allows it
            tiles = p.m_tiles * p.n_tiles
            assert tiles * p.split >= 0.75 * min(sms, tiles * (kt // S.MIN_KT_PER_SPLIT)), ctx


def test_tile_table():
    assert S.tile_for(17, 4096) == (32, 128)
    assert S.tile_for(32, 4096) == (32, 128)
    assert S.tile_for(33, 4096) == (64, 128)
    assert S.tile_for(S.TILE_N256_MIN_M, 4096) == (64, 256)
    assert S.tile_for(S.TILE_N256_MIN_M, 384) == (64, 128)  # N % 256 != 0


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_path_thresholds(bits):
    """GEMV up to gemv_max_m (by weight size, N >= K and bits), mma up to dequant_min_m."""
    for n, k in ((4096, 14336), (14336, 4096), (4096, 4096), (2048, 4096), (28672, 4096)):
        lo, hi = S.gemv_max_m(n, k, bits), S.dequant_min_m(n, k, bits)
        assert 12 <= lo < hi
        assert S.path_for(1, n, k, bits) == "gemv"
        assert S.path_for(lo, n, k, bits) == "gemv"
        if lo + 1 < hi:
            assert S.path_for(lo + 1, n, k, bits) == "mma"
            assert S.path_for(hi - 1, n, k, bits) == "mma"
        assert S.path_for(hi, n, k, bits) == "dequant"
    # N % 128 != 0 (no mma tiles): the GEMV up to dequant_min_m, then dequant (any N)
    for n, k in ((200, 4096), (50257, 4096), (32001, 5120)):
        hi = S.dequant_min_m(n, k, bits)
        assert S.path_for(100 if hi > 100 else hi - 1, n, k, bits) == "gemv"
        assert S.path_for(hi - 1, n, k, bits) == "gemv" and S.path_for(hi, n, k, bits) == "dequant"
        assert S.plan_gemm("sm_90a", 4096, n, k, bits, "float16", 132).path == "dequant"
    # MMA_WINDOWS (2 / 3 bits: 49..64 and 113..128 tokens, one / two full mma tiles against the
    # GEMV's 4 / 8 passes; 5 bits: 33..48) where N % 128 == 0, N >= K: mma on K >= 8192 (2 / 3
    # bits), or where mma_full() says the mma plan fills its rounds; 4 bits, N % 128 != 0 and
    # small weights keep the table
    ms = (32, 33, 48, 49, 64, 65, 112, 113, 127, 128, 129)
    wins = {2: ((49, 64), (113, 128)), 3: ((49, 64), (113, 128)), 5: ((33, 48),)}.get(bits, ())
    for n, k in ((8192, 8192), (28672, 4096), (32768, 1024), (32001, 8192), (2048, 8192)):
        for full in (None, lambda: True, lambda: False):
            window = (n % 128 == 0 and n * k > S.GEMV_SMALL_WEIGHT
                      and (k >= 8192 and bits != 5 or full is not None and full()))
            for m in ms:
                table = ("gemv" if m <= S.gemv_max_m(n, k, bits) else "dequant"
                         if m >= S.dequant_min_m(n, k, bits) else "gemv" if n % 128 else "mma")
                want = "mma" if window and any(lo <= m <= hi for lo, hi in wins) else table
                assert S.path_for(m, n, k, bits, full) == want, (n, k, m, full)


def test_mma_window_5_bits():
    """5 bits at 33..48 tokens: mma where the unsplit plan fills its rounds to 0.82 (32768x1024,
    28672x1536 at 0.85, 30720x1024 at 0.91), the GEMV at fill 0.73 / 0.76 / 0.79 (24576x1536,
    25600x1536, 26624x1536: 2 / 3 bits take 0.76 and 0.79) and on split plans (16384x1536)."""
    sel = lambda m, n, k, b=5: S.plan_gemm("sm_90a", m, n, k, b, "float16", 132).path  # noqa: E731
    assert S.MMA_WINDOW_FILL[5] > S.MMA_WINDOW_FILL[2] == S.MMA_WINDOW_FILL[3]
    for n, k in ((32768, 1024), (28672, 1536), (30720, 1024)):
        assert [sel(m, n, k) for m in (32, 33, 48, 49)] == ["gemv", "mma", "mma", "mma"], (n, k)
    for n, k in ((25600, 1536), (26624, 1536)):
        fill = S.mma_fill(S.plan_mma("sm_90a", 48, n, k, 5, "float16", 132), "sm_90a", 132)
        assert S.MMA_WINDOW_FILL[2] < fill < S.MMA_WINDOW_FILL[5], (n, k)
        assert [sel(m, n, k) for m in (33, 48, 49)] == ["gemv", "gemv", "mma"], (n, k)
        assert sel(64, n, k, 2) == "mma", (n, k)
    for n, k in ((24576, 1536), (16384, 1536), (8192, 8192)):  # no long-K rule at 5 bits
        assert [sel(m, n, k) for m in (32, 33, 48, 49)] == ["gemv", "gemv", "gemv", "mma"], (n, k)


@pytest.mark.parametrize("bits", (2, 3))
def test_mma_windows_by_fill(bits):
    """plan_gemm asks path_for's mma_full from the mma plan: unsplit, its CTAs filling their
    rounds to MMA_WINDOW_FILL (H100 measurements in tc_select.py)."""
    sel = lambda m, n, k: S.plan_gemm("sm_90a", m, n, k, bits, "float16", 132).path  # noqa: E731
    p = S.plan_mma("sm_90a", 64, 28672, 1536, bits, "float16", 132)
    assert p.split == 1 and S.mma_fill(p, "sm_90a", 132) == 224 / 264  # two CTAs an SM
    assert S.mma_fill(S.plan_mma("sm_90a", 64, 24576, 1536, bits, "float16", 132), "sm_90a", 132) == 192 / 264
    for n, k in ((32768, 1024), (28672, 1536), (32000, 4096), (16384, 1536)):  # full, unsplit
        want = "gemv" if n == 16384 else "mma"  # 16384x1536 at 64 tokens: split 2
        # 32000x4096 from 64 tokens: the wgmma kernel's 250 CTAs fill their waves (tiled.py
        # flat_wgmma_takes); K 1024 / 1536 is shorter than that rule takes
        at64, at65 = ("wgmma", "wgmma") if k == 4096 else (want, "gemv")
        assert [sel(m, n, k) for m in (48, 49, 64, 65)] == ["gemv", want, at64, at65], (n, k)
    assert [sel(m, 16384, 1536) for m in (112, 113, 128)] == ["gemv", "mma", "mma"]
    for n, k in ((24576, 1536), (17920, 4096), (20480, 2048)):  # fill 0.73, split 3, split 3
        assert [sel(m, n, k) for m in (49, 64, 113, 127)] == ["gemv"] * 4, (n, k)
        assert sel(128, n, k) == ("gemv" if bits == 2 else "dequant"), (n, k)
    assert sel(64, 8192, 8192) == sel(128, 8192, 8192) == "mma"  # K >= 8192
    # the table (sessions 22 / 27 / 34 measurements)
    assert S.gemv_max_m(4096, 14336, bits) == {2: 48, 3: 48, 4: 16, 5: 32}[bits]
    assert S.gemv_max_m(14336, 4096, bits) == {2: 128, 3: 127, 4: 32, 5: 48}[bits]
    assert S.dequant_min_m(14336, 4096, bits) == {2: 160, 3: 128, 4: 144, 5: 65}[bits]
    assert S.gemv_max_m(4096, 4096, bits) == (32 if bits == 5 else 64)
    assert S.gemv_max_m(2048, 4096, bits) == (32 if bits == 5 else 64)  # small: N < K no matter
    assert S.dequant_min_m(4096, 4096, bits) == (33 if bits == 5 else 65)
    # N % 8 != 0 as N % 8 == 0: the dense path pads N for cuBLAS (core/dense.py ROW_ALIGN)
    for n in (32001, 14004, 14008):
        assert S.dequant_min_m(n, 4096, bits) == S.DEQUANT_MIN_M[bits]
    assert S.dequant_min_m(14336, 4096, bits) == S.DEQUANT_MIN_M[bits]


def test_choice_printable_and_memoised():
    a = S.select_gemm("sm_90a", 64, 4096, 14336, 4, "float16", 132)
    assert a is S.select_gemm("sm_90a", 64, 4096, 14336, 4, "float16", 132)
    assert a.path == "mma" and "tile_m=64" in a.short() and "split=" in a.short()
    assert S.select_gemm("sm_90a", 4096, 4096, 4096, 4, "float16", 132).short() == "path=dequant"


def test_forced_tiles_and_splits():
    p = S.plan_mma("sm_90a", 5, 512, 4224, 4, "float16", 132, tile=(64, 256), split=3)
    assert (p.config.tile_m, p.config.tile_n, p.split) == (64, 256, 3)
    assert p.kt_per_split == 22
    with pytest.raises(ValueError, match="expected one of"):
        S.plan_mma("sm_90a", 5, 512, 4224, 4, "float16", 132, tile=(16, 128))
    with pytest.raises(ValueError, match="not a multiple of tile_n=256"):
        S.plan_mma("sm_90a", 5, 384, 1024, 4, "float16", 132, tile=(64, 256))
    with pytest.raises(ValueError, match=r"split_k=17: must be in 1\.\.16"):
        S.plan_mma("sm_90a", 5, 384, 1024, 4, "float16", 132, split=17)


@pytest.mark.parametrize("tile", [64, (64,), (64, 128, 1), "ab", (64.5, 128), ("64", "128"),
                                  (None, None)])
def test_forced_tile_not_a_pair_of_ints(tile):
    """gemm(tile=...) hands the tile to plan_mma as given: anything but two ints is a
    ValueError naming it (was TypeError / IndexError / KeyError, and (64.5, 128) ran as 64)."""
    import numpy as np

    p = S.plan_mma("sm_90a", 64, 4096, 4096, 4, "float16", 132, tile=np.array([64, 256]))
    assert (p.config.tile_m, p.config.tile_n) == (64, 256)  # numpy integers: as before
    with pytest.raises(ValueError, match=r"tile=.*: expected \(tile_m, tile_n\), one of"):
        S.plan_mma("sm_90a", 64, 4096, 4096, 4, "float16", 132, tile=tile)


@pytest.mark.parametrize("split", ["2", 1.5, [2], (2,)])
def test_forced_split_not_an_int(split):
    """A split_k that is not an integer is a ValueError naming it (was TypeError, and 1.5 ran as
    a float split)."""
    with pytest.raises(ValueError, match=r"split_k=.*: must be in 1\.\.64"):
        S.plan_mma("sm_90a", 64, 4096, 4096, 4, "float16", 132, split=split)


@pytest.mark.parametrize("bits", [0, 1, 6, 2**31, None])
def test_planners_name_bad_bits(bits):
    """bits outside 2..5 raised KeyError from the crossover / launch tables (plan_gemm at every
    M, path_for, dequant_min_m), and plan_mma hung building a 2 ** (2 * bits) table size."""
    for m in (1, 100, 1000):
        with pytest.raises(ValueError, match=rf"bits={bits!r}: kbit supports bits in 2\.\.5"):
            S.plan_gemm("sm_90a", m, 4096, 4096, bits, "float16", 132)
    for fn in (S.path_for, lambda *a: S.dequant_min_m(*a[1:]), lambda *a: S.gemv_max_m(*a[1:])):
        with pytest.raises(ValueError, match=rf"bits={bits!r}"):
            fn(100, 4096, 4096, bits)
    with pytest.raises(ValueError, match=rf"bits={bits!r}"):
        S.plan_mma("sm_90a", 64, 4096, 4096, bits, "float16", 132)


@pytest.mark.parametrize("n,k,rule", [(200, 1024, "multiple of 128"), (384, 1000, "multiple of 128"),
                                      (384, 0, "multiple of 128")])
def test_mma_shape_rule_names_it(n, k, rule):
    with pytest.raises(ValueError, match=rule):
        S.plan_mma("sm_90a", 64, n, k, 4, "float16", 132)


@pytest.mark.parametrize("field,value", [("bits", 6), ("dtype", "float32"), ("tile_m", 48),
                                         ("stages", 9)])
def test_config_check_names_field(field, value):
    with pytest.raises(UnsupportedConfigError, match=field):
        KbitMmaConfig(arch="sm_90a", **{field: value})


def test_config_smem_cap_per_arch():
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        KbitMmaConfig(arch="sm_120a", bits=5, tile_m=64, tile_n=256, stages=4)


@pytest.mark.parametrize("arch", list(SM_COUNTS))
def test_prewarm_equals_dispatch(arch):
    """Every mma config dispatch picks for a spec's shapes is in prewarm, and no other."""
    from kernelgen.kbit_gemm import prewarm_all

    spec = {"shapes": [[14336, 4096], [4096, 14336], [200, 384]], "bits": [3, 4],
            "dtypes": ["bfloat16", "float32"], "layouts": ["flat"]}  # 4 bits: the flat layout's
    pre = {c for c in S.prewarm_mma_configs([arch], spec)}
    picked = set()
    for sms, lim in PARTS[arch]:
        for bits in (3, 4):
            for m in list(range(1, 300)) + [1000, 2047, 2048, 5000]:
                for n, k in ((14336, 4096), (4096, 14336), (200, 384)):
                    ch = S.select_gemm(arch, m, n, k, bits, "bfloat16", sms, lim)
                    if ch.path == "mma":
                        picked.add(ch.plan.config)
    assert picked == pre
    assert pre <= set(prewarm_all([arch], {"layouts": ["flat"]}))
    assert pre <= set(prewarm_all([arch], spec))


def test_no_spec_prewarm_has_every_tile_once():
    """Each tile once per (bits, dtype) at the stages of each shared-memory limit of the
    target's parts (sm_80: 64x256 at 4 / 5 bits also at 3 stages, 8.6 / 8.9 parts' 99 KB)."""
    for arch in SM_COUNTS:
        cfgs = list(S.prewarm_mma_configs([arch], {}))
        want = {(bits, dt, tm, tn, stages_for(arch, bits, tm, tn, lim)) for bits in (2, 3, 4, 5)
                for dt in ("float16", "bfloat16") for tm, tn in TILES for lim in smem_limits(arch)}
        assert len(cfgs) == len(set(cfgs)) == len(want) >= len(TILES) * 4 * 2
        assert {(c.bits, c.dtype, c.tile_m, c.tile_n, c.stages) for c in cfgs} == want


def _rotr(x: int, s: int) -> int:
    s &= 31
    return ((x >> s) | (x << (32 - s))) & 0xFFFFFFFF


@pytest.mark.parametrize("bits", (2, 3, 4, 5))
def test_fragment_decode_model(bits):
    """A NumPy model of what lane (g, t) of mma_gemm.cuh feeds the mma for one W row and k-tile:
    the stage copy (2 blocks x bits words from the flat layout), the rotate-and-mask pair codes,
    the pair table's index split, and the scale byte of the aligned scale word. It must name
    exactly the codebook indices / scales of W[n, 16s + {2t, 2t+1, 2t+8, 2t+9}] that the m16n8k16
    B fragment (registers b0, b1 of k16 step s) holds."""
    import numpy as np

    from kernelgen.kbit import reference as R

    rng = np.random.default_rng(bits)
    n_rows, k = 3, 384
    w = rng.standard_normal((n_rows, k)).astype(np.float32) * rng.uniform(0.1, 3, (n_rows, 1))
    packed, _, amax8 = R.quantize(w, bits, R.create_normal_float_codebook(bits))
    idx = R.unpack_indices(packed, bits).reshape(n_rows, k)  # [n, k] codebook indices
    kb = k // 32
    for n in range(n_rows):
        for kt in range(k // TILE_K):
            words = packed[(n * kb + 2 * kt) * bits:(n * kb + 2 * kt + 2) * bits]  # the stage copy
            base = (n * kb + 2 * kt) & ~3  # the aligned scale word
            sword = int.from_bytes(bytes(amax8[base:base + 4]), "little")
            for t in range(4):
                for j in range(2):
                    wj = [int(x) for x in words[j * bits:(j + 1) * bits]]
                    lo = 0
                    for b in range(min(bits, 4)):
                        lo |= _rotr(wj[b], 2 * t - 2 * b) & (0x03030303 << (2 * b))
                    hi = _rotr(wj[4], 2 * t) & 0x03030303 if bits == 5 else 0
                    s_byte = (sword >> (16 * (kt & 1) + 8 * j)) & 0xFF
                    assert s_byte == amax8[n * kb + 2 * kt + j], (n, kt, j)
                    for h in range(2):
                        s = 2 * j + h
                        for reg, q in ((0, 2 * h), (1, 2 * h + 1)):
                            code = ((lo >> (8 * q)) & 0xFF) | (((hi >> (8 * q)) & 0xFF) << 8)
                            i0 = sum(((code >> (2 * b)) & 1) << b for b in range(bits))
                            i1 = sum(((code >> (2 * b + 1)) & 1) << b for b in range(bits))
                            k0 = kt * TILE_K + 16 * s + 2 * t + 8 * reg  # B fragment row of reg
                            assert (i0, i1) == (idx[n, k0], idx[n, k0 + 1]), (n, kt, t, s, reg)


def test_prewarm_covers_the_dequant_paths_kernel():
    """The dequant path launches kbit's dequantize kernel: `prewarm --family kbit_gemm` builds it
    whenever some M of the spec can reach that path, and not otherwise."""
    from kernelgen.kbit.config import KbitDequantizeConfig
    from kernelgen.kbit_gemm import prewarm_all
    from kernelgen.kbit_gemm.config import KbitTiledDequantConfig

    # the flat layout: kbit's dequantize kernel; the tiled layout (4-bit default): its own
    for layout, want in (("flat", KbitDequantizeConfig(arch="sm_90a", bits=4, dtype="float16",
                                                       absmax_dtype="e4m4")),
                         ("tiled", KbitTiledDequantConfig(arch="sm_90a", dtype="float16"))):
        spec = {"bits": [4], "dtypes": ["float16"], "layouts": [layout]}
        every_m = set(prewarm_all(["sm_90a"], {**spec, "shapes": [[4096, 4096]]}))
        assert want in every_m
        big_m = set(prewarm_all(["sm_90a"], {**spec, "shapes": [[4096, 4096, 4096]]}))
        assert want in big_m
        decode = set(prewarm_all(["sm_90a"], {**spec, "shapes": [[16, 4096, 4096], [64, 4096, 4096]]}))
        assert not any(isinstance(c, type(want)) for c in decode)
    assert S.plan_gemm("sm_90a", 4096, 4096, 4096, 4, "float16", 132).path == "dequant"
