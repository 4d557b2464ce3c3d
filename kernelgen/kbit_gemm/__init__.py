"""kbit_gemm: C = A . W^T with W in the kbit format (2..5 bits): a bandwidth (GEMV) path for
small M, a tensor-core (mma.sync) path above, dequantize + cuBLAS for large M; 4-bit weights by
default in the tiled layout of the FP4 kernels (tiled.py)."""

from ..core.registry import Family, register_family
from ..errors import UnsupportedConfigError
from .config import BITS, DTYPES, KbitGemvConfig, KbitTiledDequantConfig
from .select import prewarm_configs
from .tc_config import KbitMmaConfig
from .tc_select import prewarm_dequant_configs, prewarm_mma_configs
from .tiled import prewarm_flat_wgmma_configs, prewarm_tiled_configs

# prewarm_all's spec keys and values (Family.spec_keys); "float32": the tiled dequantize's output
SPEC_KEYS = {"bits": BITS, "dtypes": (*DTYPES, "float32"), "layouts": None, "shapes": None,
             "sm_counts": None}


def prewarm_all(archs, spec):  # type: ignore[no-untyped-def]
    """Every kernel dispatch can launch, from the tables it uses: for flat weights the GEMV
    (select.py), mma (tc_select.py) and kbit dequantize (tc_select.py) kernels of their bits, for
    tiled 4-bit weights those of tiled.py. spec "layouts" lists the layouts of 4-bit weights
    (default ["tiled"], api.default_layout; add "flat" for weights quantized with
    layout="flat"); 2, 3 and 5-bit weights are always flat."""
    from ..kbit.api import check_bits
    from .api import LAYOUTS, default_layout

    archs = tuple(archs)
    try:  # bits 7: a spec error, not a KeyError of the launch tables
        bits_list = tuple(check_bits(b) for b in spec.get("bits") or BITS)
    except ValueError as e:
        raise UnsupportedConfigError(f"kbit_gemm spec: {e}") from None
    layouts = spec.get("layouts")
    if layouts is not None and (not isinstance(layouts, (list, tuple)) or
                                any(v not in LAYOUTS for v in layouts)):
        raise UnsupportedConfigError(f"kbit_gemm spec layouts: {layouts!r}; expected a list of {LAYOUTS}")

    def wanted(bits: int, layout: str) -> bool:
        if bits != 4:  # one layout
            return layout == default_layout(bits)
        return layout == default_layout(bits) if layouts is None else layout in layouts

    flat = [b for b in bits_list if wanted(b, "flat")]
    if flat:
        flat_spec = {**spec, "bits": flat}
        yield from prewarm_configs(archs, flat_spec)
        yield from prewarm_mma_configs(archs, flat_spec)
        yield from prewarm_dequant_configs(archs, flat_spec)
        yield from prewarm_flat_wgmma_configs(archs, flat_spec)
    if 4 in bits_list and wanted(4, "tiled"):
        yield from prewarm_tiled_configs(archs, spec)


register_family(
    Family(
        name="kbit_gemm",
        config_classes=(KbitGemvConfig, KbitMmaConfig, KbitTiledDequantConfig),
        prewarm_configs=prewarm_all,
        spec_keys=SPEC_KEYS,
        description="kbit weight GEMM: bandwidth (GEMV) path for small M, mma.sync tiles above; "
                    "4-bit weights tiled for the FP4 kernels",
        matrix_spec={"layouts": ["flat", "tiled"], "dtypes": ["float16", "bfloat16", "float32"]},
    )
)

from .api import KbitLinear, gemm, quantize_weight  # noqa: E402
from .select import GemvPlan, plan_gemv, select_gemv  # noqa: E402
from .tc_select import GemmChoice, MmaPlan, plan_gemm, plan_mma, select_gemm  # noqa: E402

__all__ = ["GemmChoice", "GemvPlan", "KbitGemvConfig", "KbitLinear", "KbitMmaConfig", "MmaPlan",
           "gemm", "plan_gemm", "plan_gemv", "plan_mma", "quantize_weight", "select_gemm",
           "select_gemv"]
