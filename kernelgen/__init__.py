"""kernelgen: JIT-generated CUDA kernels for LLM inference.

Kernels compile on first use (NVRTC), live in a locked on-disk cache keyed by their full
config, and are chosen per call by host-side selectors. See README.md.

The GEMMs of the block-scaled formats live in their packages (`kernelgen.fp4_gemm.fp4_gemm`,
`kernelgen.mx_gemm.mx_gemm`): a same-named function here would hide the package.
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
from .moe import KbitExperts, fused_moe, grouped_gemm, quantize_experts
from .moe_routing import MoeLayout, moe_blocks, moe_combine, moe_dispatch, moe_layout, moe_route
from .mx import MxTensor, quantize_mx, quantize_nvfp4

__all__ = [
    "CacheError", "CacheLockTimeout", "CompileError", "DeviceError", "GraphCaptureError",
    "JitDisabledError", "KbitExperts", "KbitLinear", "KbitTensor", "KernelgenError", "MoeLayout",
    "MxTensor", "UnsupportedConfigError", "__version__", "create_normal_float_codebook",
    "decode_e4m4", "dequantize_kbit", "encode_e4m4", "fused_moe", "gemm",
    "grouped_gemm", "moe_blocks", "moe_combine", "moe_dispatch", "moe_layout", "moe_route",
    "quantize_experts", "quantize_kbit", "quantize_mx", "quantize_nvfp4",
    "quantize_weight", "repack_kbit",
]
