"""kernelgen: JIT-generated CUDA kernels for LLM inference.

Kernels compile on first use (NVRTC), live in a locked on-disk cache keyed by their full
config, and are chosen per call by host-side selectors. See README.md.
"""

from ._version import __version__
from .errors import (
    CacheError,
    CacheLockTimeout,
    CompileError,
    DeviceError,
    GraphCaptureError,
    JitDisabledError,
    KernelgenError,
    UnsupportedConfigError,
)
from .kbit import (
    KbitTensor,
    create_normal_float_codebook,
    decode_e4m4,
    dequantize_kbit,
    encode_e4m4,
    quantize_kbit,
    repack_kbit,
)
from .kbit_gemm import KbitLinear, gemm, quantize_weight

__all__ = [
    "CacheError", "CacheLockTimeout", "CompileError", "DeviceError", "GraphCaptureError",
    "JitDisabledError", "KbitLinear", "KbitTensor", "KernelgenError", "UnsupportedConfigError", "__version__",
    "create_normal_float_codebook", "decode_e4m4", "dequantize_kbit", "encode_e4m4", "gemm",
    "quantize_kbit", "quantize_weight", "repack_kbit",
]
