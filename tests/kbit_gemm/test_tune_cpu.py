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
