"""Configs of the kbit format kernels (quantize, dequantize, repack, E4M4 codec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError

BITS = (2, 3, 4, 5)
BLOCKSIZE = 32
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
ABSMAX_DTYPES = ("e4m4", "float16", "float32")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float", "e4m4": "uint8_t"}
THREADS = 256


def _check_bits(cfg: KernelConfig, bits: int) -> None:
    if bits not in BITS:
        raise UnsupportedConfigError(f"{cfg.short()}: bits={bits}; kbit supports bits in 2..5")


def _check_dtype(cfg: KernelConfig, name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UnsupportedConfigError(f"{cfg.short()}: {name}={value!r}; expected one of {allowed}")


@dataclass(frozen=True)
class KbitQuantizeConfig(KernelConfig):
    family: ClassVar[str] = "kbit"
    template: ClassVar[str] = "kbit/quantize.cu.jinja"
    bits: int = 4
    dtype: str = "float16"  # input

    def check(self) -> None:
        _check_bits(self, self.bits)
        _check_dtype(self, "dtype", self.dtype, FLOAT_DTYPES)

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_quantize",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "threads": THREADS}


@dataclass(frozen=True)
class KbitDequantizeConfig(KernelConfig):
    family: ClassVar[str] = "kbit"
    template: ClassVar[str] = "kbit/dequantize.cu.jinja"
    bits: int = 4
    dtype: str = "float16"  # output
    absmax_dtype: str = "e4m4"

    def check(self) -> None:
        _check_bits(self, self.bits)
        _check_dtype(self, "dtype", self.dtype, FLOAT_DTYPES)
        _check_dtype(self, "absmax_dtype", self.absmax_dtype, ABSMAX_DTYPES)

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_dequantize",)

    def template_vars(self) -> dict[str, Any]:
        return {
            **super().template_vars(),
            "ctype": CTYPE[self.dtype],
            "absmax_ctype": CTYPE[self.absmax_dtype],
            "threads": THREADS,
        }


@dataclass(frozen=True)
class KbitRepackConfig(KernelConfig):
    family: ClassVar[str] = "kbit"
    template: ClassVar[str] = "kbit/repack.cu.jinja"
    bits: int = 4
    tile_n: int = 128
    tile_k: int = 64

    def check(self) -> None:
        _check_bits(self, self.bits)
        if self.tile_n not in (64, 128, 256):
            raise UnsupportedConfigError(f"{self.short()}: tile_n={self.tile_n}; expected 64, 128 or 256")
        if self.tile_k not in (32, 64, 128):
            raise UnsupportedConfigError(f"{self.short()}: tile_k={self.tile_k}; expected 32, 64 or 128")

    def symbols(self) -> tuple[str, ...]:
        return ("kbit_repack",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "threads": THREADS}


@dataclass(frozen=True)
class E4M4Config(KernelConfig):
    family: ClassVar[str] = "kbit"
    template: ClassVar[str] = "kbit/absmax.cu.jinja"

    def symbols(self) -> tuple[str, ...]:
        return ("e4m4_encode", "e4m4_decode")

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "threads": THREADS}
