"""kbit_gemm: C = A . W^T with W in the kbit format (2..5 bits): a bandwidth (GEMV) path for
small M, a tensor-core (mma.sync) path above, dequantize + cuBLAS for large M."""

from ..core.registry import Family, register_family
from .config import KbitGemvConfig
from .select import prewarm_configs
from .tc_config import KbitMmaConfig
from .tc_select import prewarm_dequant_configs, prewarm_mma_configs


def prewarm_all(archs, spec):  # type: ignore[no-untyped-def]
    """Every kernel dispatch can launch, from the tables it uses: GEMV (select.py), mma
    (tc_select.py) and the kbit dequantize kernel of the dequant path (tc_select.py)."""
    archs = tuple(archs)
    yield from prewarm_configs(archs, spec)
    yield from prewarm_mma_configs(archs, spec)
    yield from prewarm_dequant_configs(archs, spec)


register_family(
    Family(
        name="kbit_gemm",
        config_classes=(KbitGemvConfig, KbitMmaConfig),
        prewarm_configs=prewarm_all,
        description="kbit weight GEMM: bandwidth (GEMV) path for small M, mma.sync tiles above",
    )
)

from .api import KbitLinear, gemm, quantize_weight  # noqa: E402
from .select import GemvPlan, plan_gemv, select_gemv  # noqa: E402
from .tc_select import GemmChoice, MmaPlan, plan_gemm, plan_mma, select_gemm  # noqa: E402

__all__ = ["GemmChoice", "GemvPlan", "KbitGemvConfig", "KbitLinear", "KbitMmaConfig", "MmaPlan",
           "gemm", "plan_gemm", "plan_gemv", "plan_mma", "quantize_weight", "select_gemm",
           "select_gemv"]
