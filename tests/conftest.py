"""Shared fixtures and the capability table behind the `gpu` / `multigpu` markers.

Tests never skip from inside their bodies: a test that needs a device carries a marker, and
`pytest_collection_modifyitems` skips it here when the machine lacks that device.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=1)
def _device_count() -> int:
    from kernelgen.arch import gpu_available

    if not gpu_available():
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def pytest_collection_modifyitems(config, items):
    needs = {"gpu": 1, "multigpu": 2}
    for item in items:
        for marker, minimum in needs.items():
            if item.get_closest_marker(marker) is None:
                continue
            have = _device_count()
            if have < minimum:
                item.add_marker(pytest.mark.skip(
                    reason=f"marked {marker}: needs {minimum} CUDA device(s), found {have}"))
                break


@pytest.fixture
def cache_env(tmp_path, monkeypatch) -> Path:
    """A fresh, empty writable cache layer, no read-only layers, JIT on, nothing loaded.

    Returns the cache root (KERNELGEN_CACHE_DIR); `kernelgen.core.jit.default_cache()` follows
    the environment, so every build in the test uses it.
    """
    from kernelgen.core import jit

    root = tmp_path / "cache"
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(root))
    for name in ("KERNELGEN_CACHE_RO", "KERNELGEN_DISABLE_JIT", "KERNELGEN_CACHE_MAX_BYTES",
                 "KERNELGEN_LOCK_TIMEOUT", "KERNELGEN_KEEP_SOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(jit, "_loaded", {})
    return root
