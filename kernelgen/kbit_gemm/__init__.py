"""kbit_gemm: C = A . W^T with W in the kbit format (2..5 bits); the bandwidth path for small M."""

from ..core.registry import Family, register_family
from .config import KbitGemvConfig
from .select import prewarm_configs

register_family(
    Family(
        name="kbit_gemm",
        config_classes=(KbitGemvConfig,),
        prewarm_configs=prewarm_configs,
        description="kbit weight GEMM: bandwidth (GEMV) path for small M",
    )
)

from .api import KbitLinear, gemm, quantize_weight  # noqa: E402
from .select import GemvPlan, plan_gemv, select_gemv  # noqa: E402

__all__ = ["GemvPlan", "KbitGemvConfig", "KbitLinear", "gemm", "plan_gemv", "quantize_weight",
           "select_gemv"]
