"""moe_routing: MoE token routing — layout (counts, padded offsets, stable permutation),
dispatch (gather rows into expert order), combine (weighted sum back per token)."""

from ..core.registry import Family, register_family
from .config import MoeCombineConfig, MoeDispatchConfig, MoeLayoutConfig, MoeRouteConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="moe_routing",
        config_classes=(MoeLayoutConfig, MoeRouteConfig, MoeDispatchConfig, MoeCombineConfig),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="MoE routing: two-phase layout + dispatch (fused for decode), combine",
    )
)

from .api import (  # noqa: E402
    MoeLayout,
    block_bytes,
    moe_blocks,
    moe_combine,
    moe_dispatch,
    moe_layout,
    moe_route,
)
from .select import LayoutPlan, plan_layout, select_layout  # noqa: E402

__all__ = ["LayoutPlan", "MoeCombineConfig", "MoeDispatchConfig", "MoeLayout", "MoeLayoutConfig",
           "MoeRouteConfig", "block_bytes", "moe_blocks", "moe_combine", "moe_dispatch", "moe_layout",
           "moe_route", "plan_layout", "select_layout"]
