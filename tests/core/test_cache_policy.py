"""Cache policies: the size cap applied on publish, transient read errors, strict mode vs
prewarm, plain-int config fields."""

import errno
from pathlib import Path

import numpy as np
import pytest

from kernelgen.core.cache import DiskCache
from kernelgen.core.jit import build
from kernelgen.errors import JitDisabledError, UnsupportedConfigError
from kernelgen.kbit.config import E4M4Config, KbitQuantizeConfig


def test_cap_applied_on_a_process_first_publish(cache_env):
    a = build(E4M4Config(arch="sm_80"), cache=DiskCache(cache_env, [], max_bytes=0))
    size = sum(f.stat().st_size for f in a.entry.path.iterdir())
    # A new process (a new DiskCache) publishing one more entry must enforce a cap of ~1.5 entries.
    b = build(E4M4Config(arch="sm_90a"), cache=DiskCache(cache_env, [], max_bytes=size * 3 // 2))
    assert b.entry.path.is_dir(), "the newest entry must survive"
    assert not a.entry.path.exists(), "the least recently used entry should have been evicted"


def test_zero_cap_means_no_cap(cache_env):
    cache = DiskCache(cache_env, [], max_bytes=0)
    for arch in ("sm_80", "sm_90a"):
        build(E4M4Config(arch=arch), cache=cache)
    assert len(list(cache.entries())) == 2


def test_transient_read_error_keeps_the_entry(cache_env, monkeypatch):
    res = build(E4M4Config(arch="sm_90a"))
    real = Path.read_bytes

    def flaky(self):
        if self.name == "kernel.cubin":
            raise OSError(errno.EIO, "I/O error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    assert DiskCache().load(res.key) is None, "an unreadable entry must not be used"
    monkeypatch.setattr(Path, "read_bytes", real)
    assert res.entry.path.is_dir(), "a transient read error must not delete the entry"
    assert DiskCache().load(res.key) is not None


def test_allow_jit_overrides_strict_mode(cache_env, monkeypatch):
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "1")
    cfg = E4M4Config(arch="sm_80")
    with pytest.raises(JitDisabledError):
        build(cfg)
    assert build(cfg, allow_jit=True).compiled  # what `kernelgen prewarm` does
    assert not build(cfg).compiled  # and strict mode then hits


@pytest.mark.parametrize("bad", [4.0, np.int64(4), True, "4"])
def test_int_fields_must_be_plain_ints(bad):
    with pytest.raises(UnsupportedConfigError, match="bits="):
        KbitQuantizeConfig(arch="sm_90a", bits=bad, dtype="float16")
