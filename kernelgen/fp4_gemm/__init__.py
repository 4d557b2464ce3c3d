"""fp4_gemm: D = alpha * A . W^T (+ bias) with W in NVFP4 or MXFP4, A / D fp16 or bf16.

Weights are dequantized in registers into mma.sync fragments: a bandwidth (GEMV) path for
small M, a tensor-core tile path with a cp.async pipeline above; at large M the weight is made
dense in A's dtype for cuBLAS (select.py). On sm_90a the wgmma path (mid M, long enough K)
decodes each step's weights into shared memory for warpgroup MMA."""

from ..core.registry import Family, register_family
from .config import Fp4DequantConfig, Fp4GemvConfig, Fp4TileConfig, Fp4WgmmaConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="fp4_gemm",
        config_classes=(Fp4GemvConfig, Fp4TileConfig, Fp4DequantConfig, Fp4WgmmaConfig),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="FP4-weight (NVFP4 / MXFP4) GEMM: bandwidth path for small M, mma tiles above (wgmma on sm_90a), dequantize + cuBLAS at large M",
    )
)

from .api import Fp4Weight, fp4_gemm, prepare_weight  # noqa: E402
from .select import Plan, plan, select_fp4  # noqa: E402

__all__ = ["Fp4DequantConfig", "Fp4GemvConfig", "Fp4TileConfig", "Fp4WgmmaConfig", "Fp4Weight", "Plan", "fp4_gemm", "plan",
           "prepare_weight", "select_fp4"]
