"""The one-CTA cost the flat kbit GEMV planner minimises, and examples/tune_kbit_gemv.py's fit."""

import importlib.util
import json
from pathlib import Path

import pytest

from kernelgen.kbit_gemm.select import (
    ONE_CTA_WARPS,
    TILE_ROWS,
    one_cta_cost,
    plan_gemv,
    select_gemv,
)

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("tune_kbit_gemv", ROOT / "examples" / "tune_kbit_gemv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cost(p, m, n):
    slots = p.ctas * (p.config.warps // p.config.kw)
    return one_cta_cost(p.config.bits, m, -(-n // TILE_ROWS), slots, p.gps, p.config.kw, p.split)


@pytest.mark.parametrize("m,n,k,bits", [(8, 14336, 4096, 5), (16, 18432, 5120, 5), (12, 2048, 4096, 2),
                                        (8, 4096, 14336, 3), (32, 11008, 4096, 5), (1, 14336, 4096, 5),
                                        (2, 13824, 5120, 4)])
def test_the_pick_is_the_cheapest_one_cta_plan(m, n, k, bits):
    p = select_gemv("sm_90a", m, n, k, bits, "float16", 132)
    assert (p.config.warps, p.config.min_blocks) == (ONE_CTA_WARPS, 1), p.short()
    for kw in (1, 2, 4):
        for split in (1, 2, 4):
            try:
                alt = plan_gemv("sm_90a", m, n, k, bits, "float16", 132, kw=kw, split=split,
                                launch=(ONE_CTA_WARPS, 1))
            except ValueError:  # the A slice does not fit unsplit
                continue
            assert _cost(p, m, n) <= _cost(alt, m, n) + 1e-9, (p.short(), alt.short())


def test_fit_finds_the_constants_that_made_the_times(tmp_path, capsys):
    """Times made by the planner's own cost: its constants score 0% and are among the best."""
    rows = []
    for n, k, bits, m in ((14336, 4096, 5, 8), (2048, 4096, 2, 12), (4096, 14336, 3, 8), (18432, 5120, 5, 16),
                          (14336, 4096, 5, 1)):
        us = {}
        for kw in (1, 2, 4):
            for split in (1, 2, 4):
                try:
                    p = plan_gemv("sm_90a", m, n, k, bits, "float16", 132, kw=kw, split=split,
                                  launch=(ONE_CTA_WARPS, 1))
                except ValueError:
                    continue
                us[f"kw{kw}s{p.split}g{p.gps}w{ONE_CTA_WARPS}b1"] = 1.0 + _cost(p, m, n) + 0.01 * kw
        us["kw1s1"] = 1e9  # an older grid's key (the table's launch) is read, not fitted
        rows.append({"n": n, "k": k, "bits": bits, "m": m, "us": us})
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(rows))
    _tool().fit([str(path)], top=3)
    out = capsys.readouterr().out
    assert "5 rows; the planner's constants: 0.00% from the fastest" in out, out
    assert out.splitlines()[1].startswith("0.00%"), out
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(SystemExit, match="no measured rows that the planner runs one CTA an SM"):
        _tool().fit([str(empty)], top=1)


def _paths_tool():
    spec = importlib.util.spec_from_file_location("tune_paths", ROOT / "examples" / "tune_paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tune_paths_forces_the_paths_the_apis_have():
    from kernelgen.kbit_gemm.tc_select import PATHS
    from kernelgen.kbit_gemm.tiled import TILED_PATHS

    kinds = _paths_tool().KINDS
    for kind, paths in kinds.items():
        have = TILED_PATHS if kind in ("kbit4", "nvfp4", "mxfp4") else PATHS
        assert set(paths) == set(have), (kind, paths)


def test_tune_paths_judge(tmp_path, capsys):
    """The default's distance from the fastest forced path: rows past --show printed, the mean
    over the rows that have both (a faster default counts 0), a file without any refused."""
    tool = _paths_tool()
    rows = [dict(n=4096, k=1536, kind="kbit2", m=96, us={"default": 81.0, "gemv": 60.0, "mma": 81.0}),
            dict(n=4096, k=1536, kind="kbit2", m=16, us={"default": 14.5, "gemv": 14.8, "mma": 34.5}),
            dict(n=4096, k=1536, kind="kbit4", m=64, us={"gemv": 30.0}),  # no default: skipped
            dict(n=4096, k=1536, kind="nvfp4", m=48, us={"default": 31.0, "wgmma": 30.0})]
    assert tool.distance(rows[0]) == pytest.approx((0.35, "gemv"))
    assert tool.distance(rows[2]) is None
    p = tmp_path / "paths.json"
    p.write_text(json.dumps(rows))
    tool.judge([str(p)], 0.03)
    out = capsys.readouterr().out
    assert "kbit2 M=96" in out and "fastest gemv (+35.0%)" in out
    assert "M=16" not in out and "nvfp4 M=48" in out  # 3.3% > 3%
    assert "3 rows" in out and f"{100 * (0.35 + 0.0 + 1 / 30) / 3:.2f}% from the fastest" in out
    (tmp_path / "none.json").write_text(json.dumps(rows[2:3]))
    with pytest.raises(SystemExit, match="no row"):
        tool.judge([str(tmp_path / "none.json")], 0.03)


def test_tune_paths_selection():
    """--kinds / --paths checked before any GPU work: a subset of the kinds' paths (and
    "default") passes, anything else names what it expected."""
    sel = _paths_tool().selection
    assert sel("kbit4,nvfp4", None) == (["kbit4", "nvfp4"], None)
    assert sel("kbit4,nvfp4", "default,wgmma,dequant") == (["kbit4", "nvfp4"], {"default", "wgmma", "dequant"})
    with pytest.raises(SystemExit, match=r"--paths: \['mma'\]; expected some of"):
        sel("kbit4", "default,mma")
    with pytest.raises(SystemExit, match="--kinds: 'fp8'"):
        sel("kbit4,fp8", "default")


def test_tune_paths_replay(tmp_path, capsys):
    """judge --replay scores the path this checkout's selector picks (its forced time), not the
    measured default; a row that did not time that path is left out."""
    tool = _paths_tool()
    base = dict(arch="sm_90a", sm_count=132)
    rows = [  # picks (session 35 rules): gemv, tile, mma
        dict(base, n=18432, k=1536, kind="nvfp4", m=40, us={"default": 29.0, "gemv": 18.4, "tile": 29.0}),
        dict(base, n=20480, k=1024, kind="kbit4", m=24, us={"default": 15.2, "gemv": 15.2, "tile": 14.0}),
        dict(base, n=32768, k=1024, kind="kbit2", m=64, us={"default": 28.0, "gemv": 28.0, "mma": 25.2}),
        dict(base, n=18432, k=1536, kind="nvfp4", m=48, us={"default": 29.3, "tile": 29.3}),  # no gemv
    ]
    assert [tool.pick(r) for r in rows[:3]] == ["gemv", "tile", "mma"]
    assert tool.distance(rows[0]) == pytest.approx((29.0 / 18.4 - 1, "gemv"))
    assert tool.distance(rows[0], replay=True) == pytest.approx((0.0, "gemv"))
    assert tool.distance(rows[2], replay=True) == pytest.approx((0.0, "mma"))
    assert tool.distance(rows[3], replay=True) is None and tool.distance(rows[3]) is not None
    rows[1]["us"]["tile"] = 16.0  # the pick now 5% slower than the GEMV
    p = tmp_path / "g.json"
    p.write_text(json.dumps(rows))
    tool.judge([str(p)], 0.03, replay=True)
    out = capsys.readouterr().out
    assert "kbit4 M=24: picks tile" in out and "fastest gemv (+5.3%)" in out
    assert "3 rows: this checkout's pick is" in out and f"{100 * (16 / 15.2 - 1) / 3:.2f}%" in out
