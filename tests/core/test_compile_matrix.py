"""Every config any family can launch, for every arch, compiles with NVRTC and does not spill.

No cache and no GPU: render + compile_cubin directly. This is what `kernelgen prewarm` would
build for all targets, so a template change that breaks one (bits, dtype, arch) shows up here.
"""

from __future__ import annotations

import pytest

from kernelgen.arch import ALL_ARCHS, smem_limits
from kernelgen.core.compile import compile_cubin, nvrtc_version, resource_summary
from kernelgen.core.registry import families, matrix_configs
from kernelgen.core.render import render

# per family: what `kernelgen prewarm --family F` builds, and what dispatch can launch beyond it
# (Family.matrix_spec); a family may also yield kernels of another family that its dispatch
# launches; prewarm and this matrix deduplicate those
BY_FAMILY = matrix_configs()
MATRIX = list(dict.fromkeys(cfg for cfgs in BY_FAMILY.values() for cfg in cfgs))


def test_matrix_covers_every_family_and_arch():
    assert {c.family for c in MATRIX} == set(families()), "a family yields no config"
    for name, fam in families().items():
        archs = {c.arch for c in BY_FAMILY[name]}
        want = set(fam.archs if fam.archs is not None else ALL_ARCHS)
        assert want <= set(ALL_ARCHS), f"family {name}: unknown archs {sorted(want - set(ALL_ARCHS))}"
        assert archs == want, f"family {name}: configs for {sorted(archs)}, declares {sorted(want)}"
    for name, cfgs in BY_FAMILY.items():
        assert len(set(cfgs)) == len(cfgs), f"family {name}: prewarm yields a config twice"


@pytest.mark.parametrize("cfg", MATRIX, ids=lambda c: c.short())
def test_compiles_without_spills(cfg):
    out = compile_cubin(cfg, render(cfg))
    assert out.cubin[:4] == b"\x7fELF", f"{cfg}: not an ELF cubin"
    res = resource_summary(out.log)
    # no report is not "no spills": NVRTC 13.0 was seen to drop the ptxas -v log
    assert res["registers"], f"{cfg}: no ptxas report from NVRTC {nvrtc_version()}\n{out.log}"
    assert res["spill_bytes"] == 0, f"{cfg}: spills {res}\n{out.log}"
    # the planners size dynamic shared memory by each part's limit (arch.PARTS; 99 KB on 8.6
    # parts under sm_80, and on sm_89 / sm_120a) without the kernel's static shared memory: a config a part can be
    # given must fit it with both (interop.check_smem refuses it at load otherwise)
    for lim in smem_limits(cfg.arch):
        if cfg.smem_bytes() <= lim:
            assert res["static_smem"] + cfg.smem_bytes() <= lim, f"{cfg}: {res} + {cfg.smem_bytes()} > {lim}"
    assert f"for '{cfg.arch}'" in out.log, f"{cfg}: compiled for another arch\n{out.log}"
    for sym in cfg.symbols():
        assert f"entry function '{sym}'" in out.log, f"{cfg}: {sym} missing\n{out.log}"
