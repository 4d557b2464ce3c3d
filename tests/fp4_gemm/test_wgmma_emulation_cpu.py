"""The sm_90a warpgroup-MMA FP4 GEMM (templates/fp4_gemm/wgmma.cuh) emulated in NumPy
(_wgmma_emulate.py): the kernel's addresses (mirrored line by line) against the wgmma
instruction as the PTX ISA defines it (modelled apart), at the level of element values, on
layout.py's tiled arrays. Integer test values: every sum is exact, so the check is equality.
KBIT4 adds the code table after the A slots: its place and size in the same image, its fill,
the decode's reads of it, and that nothing else touches it (OverlapError).
What this cannot see: the e2m1 / scale bit decodes (the GPU and the other CPU tests' part), the
fp32 roundings, a typo in the CUDA spelling of a formula copied here, and the hardware itself."""

import itertools

import numpy as np
import pytest

from kernelgen.fp4_gemm.config import (
    STAGES,
    WGMMA_BMS,
    WGMMA_SMEM_MAX,
    Fp4WgmmaConfig,
    wgmma_smem,
)
from kernelgen.fp4_gemm.layout import ARRANGEMENTS
from kernelgen.fp4_gemm.select import wgmma_pipeline

from ._wgmma_emulate import BUGS, SB, HazardError, OverlapError, emulate

SHAPES = ((200, 384), (72, 256), (136, 512))  # N: not a multiple of 128 / of 16; Q = 3, 2, 4
MS = (1, 17, 64, 65, 130)


def _problem(n, k, m, fmt, seed):
    """Integer weights (kbit4: codes 0..15 into a codebook of 16 distinct integers), group scales
    and activations (float64), the codebook (kbit4, else None) and the reference X . W^T."""
    rng = np.random.default_rng(seed)
    cb = None
    if fmt == "kbit4":
        cb = rng.permutation(np.arange(-50, 51))[:16].astype(np.float64)
        wq = rng.integers(0, 16, (n, k)).astype(np.float64)
    else:
        wq = rng.integers(-50, 51, (n, k)).astype(np.float64)
    scales = rng.integers(1, 10, (n, k * SB[fmt] // 128)).astype(np.float64)
    x = rng.integers(-50, 51, (m, k)).astype(np.float64)
    w = (wq if cb is None else cb[wq.astype(np.int64)]) * np.repeat(scales, 128 // SB[fmt], axis=1)
    return wq, scales, x, cb, x @ w.T


def _run(n, k, m, fmt="nvfp4", seed=0, **kw):
    wq, scales, x, cb, ref = _problem(n, k, m, fmt, seed)
    c, stats = emulate(wq, scales, x, fmt=fmt, codebook=cb, **kw)
    if fmt == "kbit4":  # the table checked at every decode and at the end, read by the decode
        assert stats.table_checks > 0 and stats.table_reads > 0
        assert stats.table_read_ways == 1  # each lane its own copy of the entry
    return c, ref, stats


def _check_sizes(stats, bm, stages, inflight, fmt):
    """WgSmem::TOTAL = config's wgmma_smem, and the tiles and the kbit4 table (from the 1024-byte
    aligned base) end within it, counted from the dynamic window's start."""
    want = wgmma_smem(bm, stages, inflight, fmt)
    assert stats.sizes["TOTAL"] == want, (stats.sizes, want)
    assert stats.sizes["used"] <= want, (stats.sizes, want)
    if fmt == "kbit4":
        assert stats.sizes["lut"] + 32 * 1024 == stats.sizes["used"], stats.sizes


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("bm", WGMMA_BMS)
def test_emulation_matches_the_reference(bm, n, k, split):
    """The planner's pipeline for BM and the format (wgmma_pipeline at 227 KB; kbit4's has the
    code table to fit too), every M of MS, the three formats and every block arrangement in turn:
    C = X . W^T exactly, every (m, n) stored once a split, the DQ stores free of bank conflicts,
    WgSmem::TOTAL = config's, and the kbit4 table untouched by anything but its fill."""
    for i, m in enumerate(MS):
        fmt = ("nvfp4", "mxfp4", "kbit4")[(i + k // 128) % 3]
        stages, inflight = wgmma_pipeline(bm, WGMMA_SMEM_MAX, fmt)
        arrangement = ARRANGEMENTS[(i + split) % len(ARRANGEMENTS)]
        c, ref, stats = _run(n, k, m, fmt, seed=i, bm=bm, stages=stages, inflight=inflight,
                             split=split, arrangement=arrangement)
        where = (m, fmt, arrangement, stages, inflight)
        assert np.array_equal(c, ref), (where, np.argwhere(c != ref)[:8])
        assert stats.dq_store_ways == 1, where
        _check_sizes(stats, bm, stages, inflight, fmt)
        assert stats.hazards_checked == stats.wgmmas > 0


def test_kbit4_pipelines_of_the_planner():
    """The pipelines the planner picks for kbit4 at 227 KB (the main test runs each): the table
    takes a stage at BM 128 and the third dense buffer at BM 256."""
    assert [wgmma_pipeline(bm, WGMMA_SMEM_MAX, "kbit4") for bm in WGMMA_BMS] == [(4, 1), (3, 1), (2, 0)]


def _pipelines(fmt="nvfp4"):
    """Every (BM, stages, inflight) Fp4WgmmaConfig accepts for fmt (227 KB of shared memory)."""
    for bm, stages, inflight in itertools.product(WGMMA_BMS, STAGES, (0, 1)):
        try:
            Fp4WgmmaConfig(arch="sm_90a", fmt=fmt, bm=bm, stages=stages, inflight=inflight)
        except Exception:
            continue
        yield bm, stages, inflight


@pytest.mark.parametrize("bm,stages,inflight", list(_pipelines()))
def test_every_pipeline(bm, stages, inflight):
    """K = 10 steps (more than any ring or stage count), whole and split 3 ways (4, 4, 2 steps),
    every weight ring depth: the slots and buffers are reused only once their wgmma groups are
    done and read only once their copies landed (no HazardError), and the values are right."""
    n, k, m = 136, 1280, 65
    for ring, split in itertools.product((1, 2, 3), (1, 3)):
        c, ref, _ = _run(n, k, m, "mxfp4" if ring == 2 else "nvfp4", seed=ring, bm=bm,
                         stages=stages, inflight=inflight, ring=ring, split=split)
        assert np.array_equal(c, ref), (ring, split)


@pytest.mark.parametrize("bm,stages,inflight", list(_pipelines("kbit4")))
def test_every_kbit4_pipeline(bm, stages, inflight):
    """As test_every_pipeline for the pipelines that fit kbit4's table (K = 10 steps, whole and
    split 3 ways): every A slot and DQ buffer reused, none over the table, the values right."""
    n, k, m = 136, 1280, 65
    for ring, split in ((3, 1), (1, 3)):
        c, ref, stats = _run(n, k, m, "kbit4", seed=ring, bm=bm, stages=stages,
                             inflight=inflight, ring=ring, split=split)
        assert np.array_equal(c, ref), (ring, split)
        _check_sizes(stats, bm, stages, inflight, "kbit4")


@pytest.mark.parametrize("smem_start", [0, 16, 528, 1008, 1024])
def test_dynamic_window_start(smem_start):
    """Wherever the dynamic shared memory starts, the tiles are rounded up to 1024 bytes (the
    swizzle is taken from address bits) and stay inside WgSmem::TOTAL."""
    c, ref, stats = _run(200, 256, 33, bm=64, stages=3, inflight=1, smem_start=smem_start)
    assert np.array_equal(c, ref)
    _check_sizes(stats, 64, 3, 1, "nvfp4")


@pytest.mark.parametrize("smem_start", [0, 16, 528, 1008, 1024])
@pytest.mark.parametrize("bm", WGMMA_BMS)
def test_dynamic_window_start_kbit4(bm, smem_start):
    """The same with kbit4's table at the planner's pipelines (BM 128 and 256: 230400 of 232448
    bytes): slack, DQ buffers, A slots and table within config's wgmma_smem of the window's
    start, wherever it starts."""
    stages, inflight = wgmma_pipeline(bm, WGMMA_SMEM_MAX, "kbit4")
    c, ref, stats = _run(200, 256, 33, "kbit4", bm=bm, stages=stages, inflight=inflight,
                         smem_start=smem_start)
    assert np.array_equal(c, ref)
    _check_sizes(stats, bm, stages, inflight, "kbit4")


VALUE_BUGS = ("dq_no_odd_swap", "a_no_swizzle", "scale_no_swap", "base_unaligned")
HAZARD_BUGS = ("dq_two_buffers", "copy_too_far", "cp_wait_short")
TABLE_BUGS = {"lut_one_slot_early": "an A copy", "lut_over_dq": "a DQ store"}


def test_bugs_are_classified():
    assert set(BUGS) == set(VALUE_BUGS) | set(HAZARD_BUGS) | set(TABLE_BUGS) | {"no_pair_swap"}


@pytest.mark.parametrize("bug", VALUE_BUGS)
def test_a_broken_address_fails(bug):
    """Negative controls: the mirror with one formula broken no longer reproduces X . W^T (so
    the test above can fail). An unaligned tile base may also trip the model's assumption of
    a start at a swizzle repeat (no base offset) instead."""
    try:
        c, ref, _ = _run(136, 512, 17, bm=64, stages=4, inflight=1, bug=bug)
    except HazardError:
        raise
    except AssertionError:
        assert bug == "base_unaligned"
        return
    assert not np.array_equal(c, ref)
    assert np.count_nonzero(c != ref) > c.size // 4  # most of C, not a stray element


@pytest.mark.parametrize("bug", HAZARD_BUGS)
def test_a_broken_pipeline_fails(bug):
    """Negative controls of the hazard checks: two dense buffers with a group in flight, A
    copied into the slot of a pending group, a cp.async wait one group short (K = 10 steps:
    more than the stages, so that the slots are reused)."""
    with pytest.raises(HazardError):
        _run(136, 1280, 17, bm=64, stages=4, inflight=1, bug=bug)


def test_the_pair_swap_is_for_the_banks():
    """Without the odd rows' pair swap (words, scale bytes and places alike) the values are
    the same, but the DQ stores conflict 2 ways: the bank check can fail too."""
    c, ref, stats = _run(136, 512, 17, bm=64, stages=4, inflight=1, bug="no_pair_swap")
    assert np.array_equal(c, ref)
    assert stats.dq_store_ways == 2


@pytest.mark.parametrize("bm", WGMMA_BMS)
@pytest.mark.parametrize("bug", TABLE_BUGS)
def test_a_misplaced_table_fails(bug, bm):
    """Negative controls of the kbit4 table checks (the planner's pipelines, K = 10 steps: every
    slot and buffer written): the table one A slot too early (over the last slot) or over the
    last DQ buffer. The access check names the first store into it; without the access checks,
    the table's contents are found changed at the next decode."""
    stages, inflight = wgmma_pipeline(bm, WGMMA_SMEM_MAX, "kbit4")
    kw = dict(bm=bm, stages=stages, inflight=inflight, bug=bug)
    with pytest.raises(OverlapError, match=f"^{TABLE_BUGS[bug]} at .* touches the kbit4 table"):
        _run(136, 1280, 17, "kbit4", **kw)
    with pytest.raises(OverlapError, match="table changed after its fill"):
        _run(136, 1280, 17, "kbit4", access_checks=False, **kw)
