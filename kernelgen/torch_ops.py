"""kernelgen's layers as torch custom ops (`torch.library`), for `torch.compile` and CUDA graphs.

A call of `kernelgen.gemm` inside a compiled function makes Dynamo trace into CuPy code: a graph
break, and an error under `fullgraph=True`. Through these ops the compiler sees one opaque node
whose output shape and dtype come from a fake implementation, so the graph stays whole and
`mode="reduce-overhead"` captures the launch in its CUDA graph:

    import kernelgen as kg
    import kernelgen.torch_ops as kto

    w = kto.register(kg.quantize_weight(weight, bits=4))   # an int handle for the weight
    y = torch.ops.kernelgen.linear(x, w, bias)               # bias: a tensor or None
    y = torch.ops.kernelgen.fused_moe(x, topk_ids, topk_weights, w13, w2)
    kto.release(w)                                           # when the layer goes away

Weights are registered once, outside the compiled code: quantized weights are not tensors, so
the ops name them by a process-local int handle (Dynamo treats it as a constant of the graph).
`register` takes what the eager API takes for that argument:
- `linear`: a `KbitLinear` (`kernelgen.gemm`), an `Fp4Weight` or an NVFP4 / MXFP4 `MxTensor`
  (`kernelgen.fp4_gemm.fp4_gemm`), or an MXFP8 `MxTensor` (x is quantized to the same format,
  then `kernelgen.mx_gemm.mx_gemm`, out in x's dtype);
- `fused_moe`: `KbitExperts` or a dense expert tensor [E, N, K] in x's dtype.
The registry holds a reference until `release`. Inputs are torch CUDA tensors; outputs are new
tensors on x's device, in x's dtype. `fused_moe` runs graph-safe (no host sync; results equal
the eager default). Kernels compile on first eager use: run the model once (or `kernelgen
prewarm`) before capture, as for the eager API. Needs torch >= 2.4 (`torch.library.register_fake`).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from .kbit_gemm import KbitLinear
from .kbit_gemm import gemm as _kbit_gemm
from .moe import KbitExperts
from .moe import fused_moe as _fused_moe_eager

if not hasattr(torch.library, "register_fake"):
    raise ImportError(f"kernelgen.torch_ops needs torch >= 2.4 (torch.library.register_fake); "
                      f"this is torch {torch.__version__}")

_registry: dict[int, Any] = {}
_next = itertools.count(1)
_lock = threading.Lock()

MX8 = ("mxfp8_e4m3", "mxfp8_e5m2")


def _linear_kind(w: Any) -> str:
    from .fp4_gemm import Fp4Weight
    from .mx import MxTensor

    if isinstance(w, KbitLinear):
        return "kbit"
    if isinstance(w, Fp4Weight) or (isinstance(w, MxTensor) and w.fmt in ("nvfp4", "mxfp4")):
        return "fp4"
    if isinstance(w, MxTensor) and w.fmt in MX8:
        return "mx8"
    return ""


def register(w: Any) -> int:
    """A handle for `w` (see the module doc for what each op takes), kept until `release`."""
    ok = _linear_kind(w) or isinstance(w, KbitExperts) or (
        isinstance(w, torch.Tensor) and w.is_cuda and w.dim() == 3)
    if not ok:
        raise ValueError(f"register: expected a KbitLinear, Fp4Weight, MxTensor (nvfp4 / mxfp4 / "
                         f"mxfp8), KbitExperts or a CUDA tensor [E, N, K] of dense experts, got "
                         f"{type(w).__module__}.{type(w).__name__}")
    with _lock:
        h = next(_next)
        _registry[h] = w
    return h


def release(handle: int) -> None:
    """Forget a handle (the weight is then freed with its last other reference)."""
    with _lock:
        if _registry.pop(handle, None) is None:
            raise ValueError(f"release: handle {handle} is not registered")


def weight(handle: int) -> Any:
    """The object registered under `handle`."""
    w = _registry.get(handle)
    if w is None:
        raise ValueError(f"kernelgen handle {handle} is not registered (kernelgen.torch_ops."
                         f"register(weight) gives one; released handles are gone)")
    return w


def _out_rows(w: Any) -> int:
    """N of a linear weight (the output's last dimension)."""
    return int(w.n) if hasattr(w, "n") else int(w.shape[0])


def _linear(x: torch.Tensor, w: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] . W^T (+ bias) for the weight registered as `w`."""
    wt = weight(w)
    kind = _linear_kind(wt)
    if kind == "kbit":
        return _kbit_gemm(x, wt, bias)
    if kind == "fp4":
        from .fp4_gemm import fp4_gemm

        return fp4_gemm(x, wt, bias)
    if kind == "mx8":
        from .mx import quantize_mx
        from .mx_gemm import mx_gemm

        _check_mx8_x(x)
        return mx_gemm(quantize_mx(x, wt.fmt), wt, bias, out_dtype=str(x.dtype).removeprefix("torch."))
    raise ValueError(f"linear: handle {w} holds {type(wt).__name__}, not a linear weight")


def _linear_fake(x: torch.Tensor, w: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    wt = weight(w)
    kind = _linear_kind(wt)
    if not kind:
        raise ValueError(f"linear: handle {w} holds {type(wt).__name__}, not a linear weight")
    if kind == "mx8":
        _check_mx8_x(x)
    return x.new_empty((*x.shape[:-1], _out_rows(wt)))


def _check_mx8_x(x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"linear: an MXFP8 weight takes x [M, K], got shape {tuple(x.shape)}")


def _fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: int,
               w2: int) -> torch.Tensor:
    """The MoE layer of `kernelgen.fused_moe` (graph-safe dispatch) over registered experts."""
    return _fused_moe_eager(x, topk_ids, topk_weights, _experts(w13), _experts(w2),
                            graph_safe=True)


def _fused_moe_fake(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    w13: int, w2: int) -> torch.Tensor:
    _experts(w13), _experts(w2)
    return x.new_empty(x.shape)


# torch.library.Library rather than custom_op: the same op for the compiler, ~20 us less
# Python a call (custom_op's wrappers; H100 host, BENCHMARKS.md)
_lib = torch.library.Library("kernelgen", "DEF")
_lib.define("linear(Tensor x, int w, Tensor? bias=None) -> Tensor")
_lib.define("fused_moe(Tensor x, Tensor topk_ids, Tensor topk_weights, int w13, int w2) -> Tensor")
# every backend (a CPU x gets kernelgen's ValueError, not a missing-kernel error); no autograd
# formula: inference ops
_lib.impl("linear", _linear, "CompositeExplicitAutograd")
_lib.impl("fused_moe", _fused_moe, "CompositeExplicitAutograd")
torch.library.register_fake("kernelgen::linear", _linear_fake, lib=_lib)
torch.library.register_fake("kernelgen::fused_moe", _fused_moe_fake, lib=_lib)
linear = torch.ops.kernelgen.linear
fused_moe = torch.ops.kernelgen.fused_moe


def _experts(handle: int) -> Any:
    w = weight(handle)
    if not (isinstance(w, KbitExperts) or isinstance(w, torch.Tensor)):
        raise ValueError(f"fused_moe: handle {handle} holds {type(w).__name__}, not experts "
                         f"(KbitExperts or a dense [E, N, K] tensor)")
    return w
