"""Tensor-map rules checked on the host (kernelgen.core.tma.check_tiled) before the driver's
encoder sees a view: each broken rule is a ValueError that names it. The encoding itself needs
libcuda and runs in the MoE GPU tests (tests/moe/test_moe_gpu.py,
test_tma_small_views_and_cp_async_agree)."""

from __future__ import annotations

import pytest

from kernelgen.core.tma import TensorMap, check_tiled


def test_a_valid_view_passes():
    check_tiled(1 << 20, (7168, 32768), (14336,), (64, 192))
    check_tiled(1 << 20, (7168, 8, 2, 256, 256), (14336, 2048 * 14336, 8 * 14336, 4096 * 14336),
                (64, 8, 2, 16, 1))


@pytest.mark.parametrize("ptr, dims, strides, box, rule", [
    (8, (64, 4), (128,), (64, 4), "16-byte aligned"),
    (0, (64, 4), (100,), (64, 4), "multiple of 16"),
    (0, (64, 4), (1 << 40,), (64, 4), r"below 2\^40"),
    (0, (64, 4), (128,), (64, 257), "1..256"),
    (0, (128, 4), (256,), (128, 4), "128-byte swizzle span"),
    (0, (64, 4), (), (64, 4), "one stride per dimension"),
    (0, (64,) * 6, (128,) * 5, (1,) * 6, "ranks 1..5"),
    (0, (0, 4), (128,), (64, 4), "dimension 0 has 0 elements"),
])
def test_broken_rules_raise(ptr, dims, strides, box, rule):
    with pytest.raises(ValueError, match=rule):
        check_tiled(ptr, dims, strides, box)


def test_tensor_map_is_128_bytes():
    assert TensorMap(bytes(128)).raw == bytes(128)
    with pytest.raises(ValueError, match="128 bytes"):
        TensorMap(bytes(64))
