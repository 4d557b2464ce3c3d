"""mx: block-scaled narrow floating-point formats (NVFP4, MXFP4, MXFP6, MXFP8).

`kernelgen.mx.reference` (NumPy) defines the formats bit for bit - element codes, packing,
E4M3 / E8M0 scale bytes and the block-scaled swizzled scale layout; the kernels
(`quantize_nvfp4`, `quantize_mx`, `dequantize`) agree with it exactly. `MxTensor` is what the
scaled GEMMs consume; `templates/mx/mx.cuh` holds the device codecs they share.
"""

from ..core.registry import Family, register_family
from .config import MxDequantizeConfig, MxQuantizeConfig
from .select import SPEC_KEYS, prewarm_configs

register_family(
    Family(
        name="mx",
        config_classes=(MxQuantizeConfig, MxDequantizeConfig),
        prewarm_configs=prewarm_configs,
        spec_keys=SPEC_KEYS,
        description="NVFP4 / MXFP4 / MXFP6 / MXFP8 quantize (swizzled or row-major scales) and "
                    "dequantize",
    )
)

from .api import dequantize, quantize_mx, quantize_nvfp4  # noqa: E402
from .tensor import FORMATS, MxTensor  # noqa: E402

__all__ = ["FORMATS", "MxDequantizeConfig", "MxQuantizeConfig", "MxTensor", "dequantize",
           "quantize_mx", "quantize_nvfp4"]
