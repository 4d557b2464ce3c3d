"""Interop checks that run before any device work, so they need no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from kernelgen.core.interop import STORAGE, Ctx, context_of, device_array, dtype_name


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint16, np.uint8])
def test_numpy_array_is_refused_with_advice(dtype):
    x = np.zeros(64, dtype)
    with pytest.raises(ValueError) as exc:
        context_of(x, "x")
    msg = str(exc.value)
    assert msg.startswith("x: ") and "cupy.asarray" in msg and "numpy.ndarray" in msg, msg


@pytest.mark.parametrize("x", [[1.0, 2.0], (1, 2), 3.0, None, "abc", memoryview(b"ab")],
                         ids=lambda v: type(v).__name__)
def test_non_array_is_refused(x):
    with pytest.raises(ValueError) as exc:
        context_of(x, "weights")
    msg = str(exc.value)
    assert msg.startswith("weights: ") and "cupy.ndarray" in msg and "torch.Tensor" in msg, msg
    assert type(x).__name__ in msg, msg
    assert "cupy.asarray" not in msg, f"NumPy advice given for a {type(x).__name__}: {msg}"


def test_device_array_refuses_numpy():
    """The per-argument check refuses host memory the same way as the context."""
    ctx = Ctx("cupy", 0, None)
    with pytest.raises(ValueError, match="codebook: .*cupy.asarray"):
        device_array(np.zeros(16, np.float32), "codebook", ctx, ("float32",))
    with pytest.raises(ValueError, match="codebook: .*got builtins.list"):
        device_array([0.0] * 16, "codebook", ctx, ("float32",))


def test_bf16_storage_is_16_bit():
    assert STORAGE["bfloat16"].itemsize == 2 and STORAGE["bfloat16"].kind == "u"


def test_dtype_arguments_are_normalised_to_their_names():
    """numpy dtypes and scalar types name the same dtype as their strings (the API's dtype
    checks then accept them); anything else comes back unchanged for the check to refuse."""
    assert dtype_name(np.dtype("float16")) == "float16"
    assert dtype_name(np.float32) == "float32"
    assert dtype_name("bfloat16") == "bfloat16" and dtype_name(None) is None
    odd = object()
    assert dtype_name(odd) is odd and dtype_name(3) == 3
