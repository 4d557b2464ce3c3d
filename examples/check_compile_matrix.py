"""The compile matrix's checks (tests/core/test_compile_matrix.py: compiles, reports, no spills)
over every prewarm config of every family and arch, in one process a core, with this machine's
NVRTC: a quick check of a new NVRTC version (the matrix's no-spill assertion depends on it).

    python examples/check_compile_matrix.py [sm_90a,sm_120a]     # default: every target

Prints each failing config (error, no ptxas report, or spill bytes) and a count; exit 1 if any.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def configs():
    from kernelgen.arch import ALL_ARCHS
    from kernelgen.core.registry import matrix_configs
    want = set(sys.argv[1].split(",")) if len(sys.argv) > 1 and sys.argv[1] else set(ALL_ARCHS)
    if want - set(ALL_ARCHS):
        sys.exit(f"unknown targets {sorted(want - set(ALL_ARCHS))}; choose from {', '.join(ALL_ARCHS)}")
    by_family = matrix_configs([a for a in ALL_ARCHS if a in want])
    return list(dict.fromkeys(c for cfgs in by_family.values() for c in cfgs))


def one(cfg):
    from kernelgen.core.compile import compile_cubin, resource_summary
    from kernelgen.core.render import render
    try:
        out = compile_cubin(cfg, render(cfg))
    except Exception as e:  # noqa: BLE001
        return (str(cfg), "error", str(e)[:400])
    res = resource_summary(out.log)
    if not res["registers"]:
        return (str(cfg), "noreport", "")
    if res["spill_bytes"]:
        return (str(cfg), "spill", json.dumps(res))
    return None


if __name__ == "__main__":
    from kernelgen.core.compile import nvrtc_version
    t0 = time.time()
    cfgs = configs()
    print(f"NVRTC {nvrtc_version()}: {len(cfgs)} configs", flush=True)
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        bad = [r for r in ex.map(one, cfgs, chunksize=4) if r]
    for r in bad:
        print(*r, sep=" | ")
    print(f"{len(bad)} failed of {len(cfgs)} in {time.time() - t0:.0f}s")
    sys.exit(1 if bad else 0)
