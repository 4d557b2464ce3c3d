"""The loader on a device: memory hit, functions present, no compile inside graph capture."""

from __future__ import annotations

import pytest

from kernelgen.core import jit
from kernelgen.errors import GraphCaptureError
from kernelgen.kbit.config import E4M4Config, KbitQuantizeConfig

pytestmark = pytest.mark.gpu


@pytest.fixture
def arch():
    from kernelgen.arch import device_info

    return device_info(0).arch.name


@pytest.mark.parametrize("make", [lambda a: E4M4Config(arch=a),
                                  lambda a: KbitQuantizeConfig(arch=a, bits=3)], ids=["e4m4", "quant"])
def test_get_kernel_memory_hit(make, arch, cache_env):
    cfg = make(arch)
    k = jit.get_kernel(cfg, 0)
    assert set(k.functions) == set(cfg.symbols()), cfg
    assert jit.get_kernel(cfg, 0) is k, f"{cfg}: second call was not a memory hit"
    jit.clear_memory_cache()
    k2 = jit.get_kernel(cfg, 0)  # from disk now
    assert k2 is not k and k2.key == k.key, cfg


def test_refuses_to_compile_during_capture(arch, cache_env):
    import cupy

    cfg = E4M4Config(arch=arch)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(GraphCaptureError, match="warm-up"):
                jit.get_kernel(cfg, 0)
        finally:
            s.end_capture()
    assert jit.get_kernel(cfg, 0).functions, "after capture, compiling works again"
