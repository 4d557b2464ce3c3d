"""The pipeline for one config: memory -> disk -> render -> compile -> publish -> load.

`build()` needs no GPU (prewarm uses it); `get_kernel()` loads onto the current device and is
what ops call on every launch: after the first call it is one dict lookup.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

from .. import knobs
from ..errors import GraphCaptureError, JitDisabledError
from .cache import DiskCache, Entry, key_of, manifest_parts
from .compile import (
    codegen_options,
    compile_cubin,
    nvrtc_version,
    resource_summary,
    toolkit_headers_digest,
)
from .config import KernelConfig
from .render import render

_lock = threading.Lock()
_cache: DiskCache | None = None
_cache_env: tuple | None = None


def default_cache() -> DiskCache:
    """The process-wide cache, rebuilt if the KERNELGEN_CACHE_* variables changed."""
    global _cache, _cache_env
    env = (knobs.cache_dir(), tuple(knobs.readonly_cache_dirs()), knobs.cache_max_bytes())
    if _cache is None or env != _cache_env:
        _cache, _cache_env = DiskCache(env[0], list(env[1]), env[2]), env
    return _cache


def key_parts(config: KernelConfig) -> tuple[dict, Any]:
    rendered = render(config)
    parts = manifest_parts(config, rendered, nvrtc_version(), codegen_options(config.arch),
                           toolkit_headers_digest())
    return parts, rendered


@dataclass
class BuildResult:
    config: KernelConfig
    key: str
    cubin: bytes
    entry: Entry | None
    compiled: bool  # False: came from a cache layer


def build(config: KernelConfig, cache: DiskCache | None = None, before_compile=None,
          allow_jit: bool | None = None) -> BuildResult:
    """Return the cubin of `config`, compiling (once across processes) on a miss. No GPU needed.

    `allow_jit`: None follows KERNELGEN_DISABLE_JIT; prewarm passes True (it exists to compile).
    """
    strict = knobs.disable_jit() if allow_jit is None else not allow_jit
    cache = cache or default_cache()
    parts, rendered = key_parts(config)
    key = key_of(parts)

    def _build():
        if strict:
            raise JitDisabledError(
                f"KERNELGEN_DISABLE_JIT=1 and {config.short()} (key {key[:16]}) is in no cache "
                f"layer. Build it ahead with `kernelgen prewarm --family {config.family} "
                f"--arch {config.arch} ...` (or unset KERNELGEN_DISABLE_JIT)."
            )
        if before_compile is not None:
            before_compile(config)
        out = compile_cubin(config, rendered)
        if knobs.verbose():
            res = resource_summary(out.log)
            print(f"[kernelgen] compiled {config.short()} in {out.seconds:.2f}s {res}", file=sys.stderr)
        return out.cubin, {
            "parts": parts,
            "symbols": list(config.symbols()),
            "log": out.log,
            "seconds": out.seconds,
            "source": rendered.source,
        }

    entry, cubin, compiled = cache.get_or_build(key, _build, describe=config.short())
    return BuildResult(config, key, cubin, entry, compiled)


class Kernel:
    """A loaded module: `kernel.fn(symbol)` gives a cupy Function on the device it was loaded on."""

    __slots__ = ("config", "key", "device", "module", "functions")

    def __init__(self, config: KernelConfig, key: str, device: int, cubin: bytes):
        import cupy

        self.config, self.key, self.device = config, key, device
        self.module = cupy.cuda.function.Module()
        self.module.load(cubin)
        self.functions = {}
        from .interop import check_smem, smem_limit  # a part with less than the target: DeviceError

        smem = config.smem_bytes_on(smem_limit(device))
        drv = cupy.cuda.driver
        for sym in config.symbols():
            fn = self.module.get_function(sym)
            # opt in where static + dynamic smem pass the default 48 KB (a kernel's static smem
            # counts against the same limit: 40 KB dynamic beside 8 KB static needs it too)
            static = drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn.ptr)
            if smem and smem + static > 48 * 1024:
                check_smem(device, smem + static, f"{config.short()} ({sym}: {static} static + {smem} dynamic)")
                drv.funcSetAttribute(fn.ptr, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            self.functions[sym] = fn

    def fn(self, symbol: str):
        return self.functions[symbol]


_loaded: dict[tuple[KernelConfig, int], Kernel] = {}


def _refuse_in_capture(config: KernelConfig, stream=None) -> None:
    import cupy

    capturing = False
    try:
        capturing = (stream or cupy.cuda.get_current_stream()).is_capturing()
    except Exception:
        pass
    if not capturing and "torch" in sys.modules:
        try:
            import torch

            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        except Exception:
            pass
    if capturing:
        raise GraphCaptureError(
            f"{config.short()} is not compiled yet and the current stream is capturing a CUDA "
            f"graph; compiling now would break the capture. Call the op once before capture "
            f"(warm-up), or run `kernelgen prewarm` at startup."
        )


def get_kernel(config: KernelConfig, device: int, stream=None) -> Kernel:
    """The loaded kernel for `config` on `device`; a memory hit costs one dict lookup.

    `stream`: the stream the caller will launch on; a miss while it captures a CUDA graph
    raises GraphCaptureError instead of compiling.
    """
    k = _loaded.get((config, device))
    if k is not None:
        return k
    import cupy

    with _lock:
        k = _loaded.get((config, device))
        if k is None:
            res = build(config, before_compile=lambda c: _refuse_in_capture(c, stream))
            with cupy.cuda.Device(device):  # the module belongs to this device's context
                k = Kernel(config, res.key, device, res.cubin)
            _loaded[(config, device)] = k
    return k


def clear_memory_cache() -> None:
    from . import fastcall

    _loaded.clear()
    fastcall.clear()  # its entries hold loaded kernels too
