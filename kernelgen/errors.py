"""Typed errors. Every message names the thing, the value and the rule (or what to do)."""

from __future__ import annotations


class KernelgenError(Exception):
    """Base class of every kernelgen error."""


class UnsupportedConfigError(KernelgenError, ValueError):
    """A Config that cannot be built for its arch (tile too large, bits out of range, ...)."""


class CompileError(KernelgenError):
    """NVRTC rejected a rendered kernel. Carries the config, the log and the numbered source."""

    def __init__(self, config: object, log: str, source: str, options: list[str]):
        self.config = config
        self.log = log
        self.source = source
        self.options = list(options)
        super().__init__(
            f"NVRTC failed to compile {config!r}\n--- log ---\n{log.strip()}\n"
            f"--- options ---\n{' '.join(self.options)}\n"
            f"(the numbered source is in .numbered_source() / .dump())"
        )

    def numbered_source(self) -> str:
        lines = self.source.splitlines()
        width = len(str(len(lines)))
        return "\n".join(f"{i + 1:>{width}} | {line}" for i, line in enumerate(lines))

    def dump(self, file=None) -> None:
        import sys

        print(str(self), file=file or sys.stderr)
        print(self.numbered_source(), file=file or sys.stderr)


class CacheError(KernelgenError):
    """The disk cache cannot do what was asked (lock timeout, bad archive, ...)."""


class CacheLockTimeout(CacheError):
    """Waited too long for another process that compiles the same kernel."""


class JitDisabledError(KernelgenError):
    """KERNELGEN_DISABLE_JIT=1 and the kernel is not in any cache layer."""


class GraphCaptureError(KernelgenError):
    """Asked to compile, or to read device data on the host, while the current stream is
    capturing a CUDA graph."""


class DeviceError(KernelgenError):
    """No usable CUDA device, or the device's arch is not one we build for."""
