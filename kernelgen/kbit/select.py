"""Which kbit kernels exist for an arch. The format kernels have no tile choice: one config per
(bits, dtype, absmax dtype); repack follows the GEMM tile table."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .config import (
    ABSMAX_DTYPES,
    BITS,
    FLOAT_DTYPES,
    E4M4Config,
    KbitDequantizeConfig,
    KbitQuantizeConfig,
    KbitRepackConfig,
)

# (tile_n, tile_k) of the tiled layout the GEMM consumes; one entry until the GEMM lands.
REPACK_TILES = ((128, 64),)
SPEC_KEYS = {"bits": BITS, "dtypes": FLOAT_DTYPES}  # what prewarm_configs reads (Family.spec_keys)


def prewarm_configs(archs: Iterable[str], spec: dict[str, Any]) -> Iterator:
    """Every config the kbit API can launch, optionally narrowed by spec bits/dtypes."""
    bits = spec.get("bits") or BITS
    dtypes = spec.get("dtypes") or FLOAT_DTYPES
    for arch in archs:
        yield E4M4Config(arch=arch)
        for b in bits:
            for dt in dtypes:
                yield KbitQuantizeConfig(arch=arch, bits=b, dtype=dt)
                for ad in ABSMAX_DTYPES:
                    yield KbitDequantizeConfig(arch=arch, bits=b, dtype=dt, absmax_dtype=ad)
            for tn, tk in REPACK_TILES:
                yield KbitRepackConfig(arch=arch, bits=b, tile_n=tn, tile_k=tk)
