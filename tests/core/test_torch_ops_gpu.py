"""kernelgen.torch_ops: the custom ops give the eager API's results, eagerly, under
torch.compile(fullgraph=True) and inside the CUDA graphs of mode="reduce-overhead"; the fake
implementations give shapes without a launch; bad handles are clear errors.

Marked `gpu`; needs torch >= 2.4 (skipped otherwise).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "register_fake"):
    pytest.skip("torch < 2.4: no torch.library.register_fake", allow_module_level=True)

import kernelgen as kg  # noqa: E402
import kernelgen.torch_ops as kto  # noqa: E402

from ._arrays import moe_layer  # noqa: E402

N, K = 256, 512


@pytest.fixture
def rng():
    return np.random.default_rng()


def cuda(h):
    return torch.from_numpy(np.ascontiguousarray(h)).cuda()


def weights(kind: str, rng):
    w = cuda((rng.standard_normal((N, K)) * 0.05).astype(np.float16))
    if kind == "kbit4 tiled":
        return kg.quantize_weight(w, bits=4)
    if kind == "kbit3 flat":
        return kg.quantize_weight(w, bits=3)
    if kind == "nvfp4":
        return kg.quantize_nvfp4(w)
    return kg.quantize_mx(w, "mxfp8_e4m3")


def eager(kind: str, x, wt, bias):
    if kind.startswith("kbit"):
        return kg.gemm(x, wt, bias)
    if kind == "nvfp4":
        from kernelgen.fp4_gemm import fp4_gemm

        return fp4_gemm(x, wt, bias)
    from kernelgen.mx_gemm import mx_gemm

    return mx_gemm(kg.quantize_mx(x, wt.fmt), wt, bias, out_dtype="float16")


KINDS = ["kbit4 tiled", "kbit3 flat", "nvfp4", "mxfp8"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 37])
def test_linear_eager_and_compiled(kind, m, rng):
    wt = weights(kind, rng)
    h = kto.register(wt)
    try:
        bias = cuda(rng.standard_normal(N).astype(np.float16))
        x = cuda(rng.standard_normal((m, K)).astype(np.float16))
        want = eager(kind, x, wt, bias)
        got = torch.ops.kernelgen.linear(x, h, bias)
        assert got.shape == (m, N) and got.dtype == torch.float16 and got.device == x.device
        assert torch.equal(got, want)

        def f(x, bias):  # torch ops around ours: one graph, no break
            return torch.relu(torch.ops.kernelgen.linear(x * 2.0, h, bias)) + 1.0

        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        ref = torch.relu(eager(kind, x * 2.0, wt, bias)) + 1.0
        assert torch.equal(compiled(x, bias), ref)
        assert torch.equal(torch.ops.kernelgen.linear(x, h, None), eager(kind, x, wt, None))
    finally:
        kto.release(h)


def test_linear_in_cuda_graphs_of_reduce_overhead(rng):
    """mode="reduce-overhead": the op's launch replays in torch's CUDA graph, new inputs each
    call (the graph reads its static input copy), results as eager."""
    wt = weights("kbit4 tiled", rng)
    h = kto.register(wt)
    try:
        def f(x):
            return torch.ops.kernelgen.linear(x, h, None) * 0.5

        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # warm-up runs, the capture, then replays
            x = cuda(rng.standard_normal((4, K)).astype(np.float16))
            got = compiled(x).clone()
            assert torch.equal(got, kg.gemm(x, wt) * 0.5)
        assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    finally:
        kto.release(h)


@pytest.mark.parametrize("experts", ["kbit4 tiled", "dense"])
def test_fused_moe_op(experts, rng):
    x, ids, wts, w13, w2 = moe_layer(cuda, rng)
    if experts != "dense":
        w13, w2 = kg.quantize_experts(w13, bits=4), kg.quantize_experts(w2, bits=4)
    h13, h2 = kto.register(w13), kto.register(w2)
    try:
        want = kg.fused_moe(x, ids, wts, w13, w2)
        assert torch.equal(torch.ops.kernelgen.fused_moe(x, ids, wts, h13, h2), want)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, i, w: torch.ops.kernelgen.fused_moe(x, i, w, h13, h2) + x,
                                 fullgraph=True)
        assert torch.equal(compiled(x, ids, wts), want + x)
    finally:
        kto.release(h13)
        kto.release(h2)


def test_fake_shapes_without_a_launch(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    h = kto.register(weights("kbit4 tiled", rng))
    try:
        with FakeTensorMode():
            x = torch.empty((3, 5, K), dtype=torch.float16, device="cuda")
            y = torch.ops.kernelgen.linear(x, h, None)
        assert y.shape == (3, 5, N) and y.dtype == torch.float16
    finally:
        kto.release(h)


def test_bad_handles_and_weights(rng):
    wt = weights("kbit4 tiled", rng)
    x = cuda(rng.standard_normal((2, K)).astype(np.float16))
    with pytest.raises(ValueError, match="register: expected a KbitLinear"):
        kto.register(np.zeros((4, 4)))
    h = kto.register(wt)
    kto.release(h)
    with pytest.raises(ValueError, match=f"handle {h} is not registered"):
        torch.ops.kernelgen.linear(x, h, None)
    with pytest.raises(ValueError, match=f"release: handle {h} is not registered"):
        kto.release(h)
    h = kto.register(wt)
    with pytest.raises(ValueError, match="a torch tensor on cpu"):
        torch.ops.kernelgen.linear(torch.zeros(2, K, dtype=torch.float16), h, None)
    kto.release(h)
    dense = kto.register(cuda(np.zeros((2, 16, K), np.float16)))
    try:
        with pytest.raises(ValueError, match="not a linear weight"):
            torch.ops.kernelgen.linear(x, dense, None)
    finally:
        kto.release(dense)
