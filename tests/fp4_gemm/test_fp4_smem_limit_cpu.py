"""FP4 GEMM plans for a device whose blocks get less shared memory than its target's (8.6 parts
under sm_80: A10, A40 report sharedMemPerBlockOptin = 101376 B = 99 KB; the
sm_80 plans assume A100's 163 KB): every plan fits the device, keeps the deepest stage count
that fits and otherwise today's choice; without a limit the choice is today's; prewarm builds
what those parts pick."""

import pytest

from kernelgen.arch import ALL_ARCHS, ARCHS, PARTS, base_of
from kernelgen.errors import UnsupportedConfigError
from kernelgen.fp4_gemm.config import FMTS, Fp4TileConfig, tile_smem
from kernelgen.fp4_gemm.select import (
    TILE_DISPATCH_BMS,
    plan,
    prewarm_configs,
    select_fp4,
    stages_for,
)

LIMIT = 99 * 1024  # = 101376, sharedMemPerBlockOptin of compute capability 8.6 / 8.9
SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096))
MS = sorted({*range(1, 300, 5), 16, 17, 32, 33, 64, 65, 128, 129, 256, 1000, 4096})

# stages_for(arch, fmt, bm) without a limit, as before the limit existed (None: no stage count
# fits; kbit4 tiles stop at BM 64)
TODAY = {
    "sm_80": {"nvfp4": (4, 4, 3), "mxfp4": (4, 4, 3), "kbit4": (4, 4, 3)},
    "sm_90a": {"nvfp4": (4, 4, 4), "mxfp4": (4, 4, 4), "kbit4": (4, 4, 4)},
    "sm_100a": {"nvfp4": (4, 4, 4), "mxfp4": (4, 4, 4), "kbit4": (4, 4, 4)},
    "sm_120a": {"nvfp4": (4, 3, 2), "mxfp4": (4, 4, 2), "kbit4": (4, 2, None)},
}


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_stages_without_a_limit_are_todays(arch):
    base = base_of(arch)
    if ARCHS[arch].smem_optin != ARCHS[base].smem_optin:  # sm_89: sm_80's stages at its 99 KB
        for fmt in TODAY[base]:
            for bm in (32, 64, 128):
                try:
                    want = stages_for(base, fmt, bm, ARCHS[arch].smem_optin)
                except UnsupportedConfigError:
                    with pytest.raises(UnsupportedConfigError, match="shared memory"):
                        stages_for(arch, fmt, bm)
                    continue
                assert stages_for(arch, fmt, bm) == want, (arch, fmt, bm)
        return
    for fmt, want in TODAY[base].items():  # a target like another takes its stages
        for bm, st in zip((32, 64, 128), want, strict=True):
            if st is None:
                with pytest.raises(UnsupportedConfigError, match="shared memory"):
                    stages_for(arch, fmt, bm)
                continue
            assert stages_for(arch, fmt, bm) == st, (arch, fmt, bm)
            # the target's own limit is no limit
            assert stages_for(arch, fmt, bm, ARCHS[arch].smem_optin) == st, (arch, fmt, bm)


@pytest.mark.parametrize("fmt", FMTS)
def test_every_plan_fits_a_99_kb_part(fmt):
    """sm_80 at 99 KB over M, the benchmark shapes and every sm_80 part's SM count: each plan
    (dispatch's and a forced tile path) fits, has the deepest stages that fit, and is otherwise
    the plan without a limit (same BM, grid, split); dispatch = the planner; None = the target's."""
    reduced = set()
    for sms, _ in PARTS["sm_80"]:
        for n, k in SHAPES:
            for m in MS:
                for path in (None, "tile"):
                    full = plan("sm_80", m, n, k, fmt, "float16", sms, path=path)
                    p = plan("sm_80", m, n, k, fmt, "float16", sms, path=path, smem_limit=LIMIT)
                    ctx = f"{m=} {n=} {k=} {sms=} {path=} {p.short()}"
                    assert p.smem <= LIMIT, ctx
                    assert plan("sm_80", m, n, k, fmt, "float16", sms, path=path,
                                smem_limit=ARCHS["sm_80"].smem_optin) == full, ctx
                    if path is None:
                        assert select_fp4("sm_80", m, n, k, fmt, "float16", sms, None, LIMIT) == p, ctx
                    if p.path in ("gemv", "dequant"):  # no shared memory to plan
                        assert p == full, ctx
                        assert p.path == "gemv" or p.smem == 0, ctx
                        continue
                    st, st_full = p.config.stages, full.config.stages
                    assert p.config.replace(stages=st_full) == full.config, ctx
                    assert (p.grid, p.split, p.sps, p.block) == (full.grid, full.split, full.sps,
                                                                 full.block), ctx
                    assert st == st_full or tile_smem(fmt, p.config.bm, st + 1) > LIMIT, ctx
                    if st < st_full:
                        reduced.add((p.config.bm, st))
    # nvfp4: BM 64 at 3 stages, BM 128 at 2; mxfp4 (smaller scales): BM 128 at 2
    assert reduced == ({(64, 3), (128, 2)} if fmt == "nvfp4" else {(128, 2)})


def test_a_bm_whose_2_stages_do_not_fit_steps_down():
    """Below 2 stages of the selected BM the tile path takes the largest BM that fits; below
    every BM a forced tile path raises naming the rule."""
    lim = tile_smem("nvfp4", 64, 2) - 1
    p = plan("sm_80", 100, 4096, 4096, "nvfp4", "float16", 108, smem_limit=lim)
    assert p.path == "tile" and p.config.bm == 32 and p.smem <= lim, p.short()
    assert p.grid[1] == -(-100 // 32), p.short()  # M tiles of the BM it runs
    with pytest.raises(UnsupportedConfigError, match="2 stages need .* allows 1000 B; use path='gemv'"):
        plan("sm_80", 100, 4096, 4096, "nvfp4", "float16", 108, smem_limit=1000)
    # the bandwidth path has no stages: any M forced onto it plans as before
    assert plan("sm_80", 100, 4096, 4096, "nvfp4", "float16", 108, path="gemv", smem_limit=1000) == \
        plan("sm_80", 100, 4096, 4096, "nvfp4", "float16", 108, path="gemv")


def test_prewarm_builds_the_stages_of_99_kb_parts():
    """The default set on sm_80 (`kernelgen prewarm --arch sm_80`) and a spec's shape walk both
    hold the reduced-stage tiles the 8.6 / 8.9 parts pick; the other targets' sets are as before
    (their parts all have the target's limit). BM 128 tiles are never dispatched (M > 128 runs
    dequantize + cuBLAS), so no set holds them."""
    want = {(fmt, bm, stages_for("sm_80", fmt, bm, LIMIT)) for fmt in FMTS for bm in TILE_DISPATCH_BMS}
    assert ("nvfp4", 64, 3) in want and TILE_DISPATCH_BMS == (32, 64)
    default = {(c.fmt, c.bm, c.stages) for c in prewarm_configs(["sm_80"], {})
               if isinstance(c, Fp4TileConfig)}
    assert want <= default
    spec = {"shapes": [list(s) for s in SHAPES], "dtypes": ["float16"]}
    walked = {(c.fmt, c.bm, c.stages) for c in prewarm_configs(["sm_80"], spec)
              if isinstance(c, Fp4TileConfig)}
    assert ("nvfp4", 64, 3) in walked and all(bm in TILE_DISPATCH_BMS for _, bm, _ in walked | default)
    # a spec's sm_counts: each count on every shared-memory limit of the target's parts
    counted = {(c.fmt, c.bm, c.stages) for c in prewarm_configs(["sm_80"], {**spec, "sm_counts": [84]})
               if isinstance(c, Fp4TileConfig)}
    assert {("nvfp4", 64, 3), ("nvfp4", 64, 4)} <= counted
    for arch in ("sm_90a", "sm_100a", "sm_120a"):
        assert all(c.stages == stages_for(arch, c.fmt, c.bm) for c in prewarm_configs([arch], {})
                   if isinstance(c, Fp4TileConfig)), arch
