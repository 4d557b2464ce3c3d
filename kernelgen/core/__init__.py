"""The pipeline every kernel family uses: config -> render -> compile -> cache -> load -> launch."""

from .cache import DiskCache, describe_miss, key_of, manifest_parts
from .config import KernelConfig
from .jit import build, default_cache, get_kernel, key_parts
from .registry import Family, families, register_family

__all__ = [
    "DiskCache", "Family", "KernelConfig", "build", "default_cache", "describe_miss", "families",
    "get_kernel", "key_of", "key_parts", "manifest_parts", "register_family",
]
