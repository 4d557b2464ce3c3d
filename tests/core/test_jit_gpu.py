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


@pytest.mark.parametrize("mode", ["cupy", "torch_global"])
def test_disk_hit_loads_during_capture(mode, cache_env):
    """A kernel on disk but not yet loaded in this process is loaded (cuModuleLoadData) while a
    graph is being captured: CuPy's capture and torch's global capture mode both allow it, and
    the replay computes what the eager call did."""
    import cupy

    import kernelgen as kg

    rng = cupy.random.default_rng(3)
    x = rng.standard_normal((64, 256), dtype=cupy.float32).astype(cupy.float16)
    if mode == "torch_global":
        torch = pytest.importorskip("torch")
        x = torch.as_tensor(x, device="cuda")
    q = kg.quantize_kbit(x, 4)
    out = kg.dequantize_kbit(q, "float16")  # compiled now: on disk and in memory
    ref = cupy.asnumpy(cupy.asarray(out)).copy()
    jit.clear_memory_cache()  # from here on a disk hit
    if mode == "torch_global":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # capture_error_mode="global" by default
            kg.dequantize_kbit(q, "float16", out=out)
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
    else:
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            kg.dequantize_kbit(q, "float16", out=out)
            g = s.end_capture()
        out.fill(0)
        g.launch(s)
        s.synchronize()
    got = cupy.asnumpy(cupy.asarray(out))
    assert (got == ref).all(), f"{mode}: the replay of a disk-hit kernel differs from eager"
    assert jit._loaded, "the kernel was loaded during the capture"
