"""mx_gemm: block-scaled GEMM D = alpha * A . B^T (+ bias) over MX / NVFP4 operands (MxTensor).

Paths: MXFP8 x MXFP8 as scaled f16 tiles on f16 mma.sync (sm_90a, sm_100a, sm_103a; sm_80 - A100
and the 8.6 parts - with the fp8 decoded by integer ops), on the fp8 mma.sync over the rescaled
fp8 tiles (sm_89, Ada), and the native block-scaled mma.sync of sm_120a / sm_121a (FP8 x FP8,
FP8 x FP4, MXFP4 x MXFP4, NVFP4 x NVFP4). See select.py.
"""

from ..core.registry import Family, register_family
from .config import MxBsGemmConfig, MxFp8GemmConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="mx_gemm",
        config_classes=(MxFp8GemmConfig, MxBsGemmConfig),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="block-scaled GEMM: MXFP8 via scaled f16 tiles (sm_80/sm_90a/sm_100a/sm_103a) or "
                    "the fp8 mma.sync (sm_89), native block-scaled mma.sync on sm_120a/sm_121a",
    )
)

from .api import mx_gemm  # noqa: E402
from .select import MxGemmPlan, plan, select_mx_gemm, supported_pairs  # noqa: E402

__all__ = ["MxBsGemmConfig", "MxFp8GemmConfig", "MxGemmPlan", "mx_gemm", "plan", "select_mx_gemm",
           "supported_pairs"]
