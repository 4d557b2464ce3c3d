"""Every KERNELGEN_* environment variable, typed, in one place.

Read at call time (cheap) so tests and users can change them without reloading the module.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int | None:
    """'500M', '2G', '1.5GiB', '123456' -> bytes (K/M/G/T are powers of 1024); None if malformed.
    The one size grammar of kernelgen (env knobs and CLI flags)."""
    m = _SIZE.match(text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()]) if m else None


def _size(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    size = parse_size(raw)
    if size is None:
        raise ValueError(f"{name}={raw!r}: expected a size such as 2G or 500M")
    return size


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    help: str


# The table the README and `kernelgen doctor` print; keep it in step with the readers below.
KNOBS: tuple[Knob, ...] = (
    Knob("KERNELGEN_CACHE_DIR", "platformdirs user cache dir", "writable cache directory"),
    Knob("KERNELGEN_CACHE_RO", "(none)", "read-only cache layers searched first, ':'-separated"),
    Knob("KERNELGEN_CACHE_MAX_BYTES", "4G", "size cap of the writable layer, LRU eviction above it; 0: no cap"),
    Knob("KERNELGEN_DISABLE_JIT", "0", "1: a cache miss raises instead of compiling"),
    Knob("KERNELGEN_PRINT_CONFIGS", "0", "1: print each new (problem -> config) choice"),
    Knob("KERNELGEN_LOCK_TIMEOUT", "600", "seconds to wait for another process's compile"),
    Knob("KERNELGEN_KEEP_SOURCE", "1", "0: do not store the rendered source in cache entries"),
    Knob("KERNELGEN_VERBOSE", "0", "1: log each compile (seconds, registers, spills) to stderr"),
    Knob("KERNELGEN_POISON", "0", "1: fill every output kernelgen allocates with 0xFF (tests)"),
    Knob("KERNELGEN_PDL", "1", "0: launch without programmatic dependent launch (sm_90+; README)"),
    Knob("KERNELGEN_FASTCALL", "1", "0: no per-weight launch memo; every GEMM call runs its whole path"),
    Knob("KERNELGEN_TEMPLATES_DIR", "(shipped)", "render from this templates/ folder (template work)"),
)


def cache_dir() -> Path:
    raw = os.environ.get("KERNELGEN_CACHE_DIR", "").strip()
    if raw:
        return Path(raw).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kernelgen"))


def readonly_cache_dirs() -> list[Path]:
    raw = os.environ.get("KERNELGEN_CACHE_RO", "").strip()
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def cache_max_bytes() -> int:
    return _size("KERNELGEN_CACHE_MAX_BYTES", 4 << 30)


def disable_jit() -> bool:
    return _flag("KERNELGEN_DISABLE_JIT")


def print_configs() -> bool:
    return _flag("KERNELGEN_PRINT_CONFIGS")


def lock_timeout() -> float:
    return float(_int("KERNELGEN_LOCK_TIMEOUT", 600))


def keep_source() -> bool:
    raw = os.environ.get("KERNELGEN_KEEP_SOURCE", "").strip()
    return not raw or _flag("KERNELGEN_KEEP_SOURCE")


def verbose() -> bool:
    return _flag("KERNELGEN_VERBOSE")


def templates_dir() -> Path | None:
    raw = os.environ.get("KERNELGEN_TEMPLATES_DIR", "").strip()
    return Path(raw).expanduser() if raw else None


def poison() -> bool:
    return _flag("KERNELGEN_POISON")


def _on(name: str) -> bool:
    """A flag that is on unless set to something other than 1/true/yes/on (one read)."""
    raw = os.environ.get(name, "").strip().lower()
    return not raw or raw in ("1", "true", "yes", "on")


def fastcall() -> bool:
    return _on("KERNELGEN_FASTCALL")


def pdl() -> bool:
    return _on("KERNELGEN_PDL")
