"""kbit: 2..5-bit blockwise codebook quantization (normal-float codebooks, E4M4 scales)."""

from ..core.registry import Family, register_family
from .config import E4M4Config, KbitDequantizeConfig, KbitQuantizeConfig, KbitRepackConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="kbit",
        config_classes=(KbitQuantizeConfig, KbitDequantizeConfig, KbitRepackConfig, E4M4Config),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="2-5 bit codebook quantize / dequantize / repack, E4M4 absmax codec",
    )
)

from .api import (  # noqa: E402
    KbitTensor,
    create_normal_float_codebook,
    decode_e4m4,
    dequantize_kbit,
    encode_e4m4,
    quantize_kbit,
    repack_kbit,
)

__all__ = [
    "E4M4Config", "KbitDequantizeConfig", "KbitQuantizeConfig", "KbitRepackConfig", "KbitTensor",
    "create_normal_float_codebook", "decode_e4m4", "dequantize_kbit", "encode_e4m4",
    "quantize_kbit", "repack_kbit",
]
