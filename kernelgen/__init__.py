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
from .fp4_gemm import fp4_gemm
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
from .moe import KbitExperts, fused_moe, grouped_gemm, quantize_experts
from .moe_routing import MoeLayout, moe_blocks, moe_combine, moe_dispatch, moe_layout, moe_route
from .mx import MxTensor, quantize_mx, quantize_nvfp4
from .mx_gemm import mx_gemm

__all__ = [
    "CacheError", "CacheLockTimeout", "CompileError", "DeviceError", "GraphCaptureError",
    "JitDisabledError", "KbitExperts", "KbitLinear", "KbitTensor", "KernelgenError", "MoeLayout",
    "MxTensor", "UnsupportedConfigError", "__version__", "create_normal_float_codebook",
    "decode_e4m4", "dequantize_kbit", "encode_e4m4", "fp4_gemm", "fused_moe", "gemm",
    "grouped_gemm", "moe_blocks", "moe_combine", "moe_dispatch", "moe_layout", "moe_route",
    "mx_gemm", "quantize_experts", "quantize_kbit", "quantize_mx", "quantize_nvfp4",
    "quantize_weight", "repack_kbit",
]
