"""moe: the MoE grouped GEMM (one launch over per-expert row segments, TILE_M 8..256, swap_ab
for small tiles, SwiGLU fused into the W13 epilogue; bf16/fp16 or kbit experts) and the layer
`fused_moe`."""

from ..core.registry import Family, register_family
from .config import MoeGemmConfig, MoeKbitConfig, MoeKbitGemvConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="moe",
        config_classes=(MoeGemmConfig, MoeKbitConfig, MoeKbitGemvConfig),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="MoE grouped GEMM (bf16/fp16 experts, fused SwiGLU) and fused_moe",
    )
)

from .api import fused_moe, grouped_gemm  # noqa: E402
from .kbit import (  # noqa: E402
    KbitExperts,
    plan_kbit,
    plan_kbit_gemv,
    quantize_experts,
    select_kbit,
    select_kbit_gemv,
    tile_experts,
)
from .select import GroupedPlan, plan_grouped, select_grouped, tile_m_for  # noqa: E402

__all__ = ["GroupedPlan", "KbitExperts", "MoeGemmConfig", "MoeKbitConfig", "MoeKbitGemvConfig",
           "fused_moe", "grouped_gemm", "plan_grouped", "plan_kbit", "plan_kbit_gemv",
           "quantize_experts", "select_grouped", "select_kbit", "select_kbit_gemv",
           "tile_experts", "tile_m_for"]
