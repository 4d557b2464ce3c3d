"""Configs of the mx kernels: quantize (plus the NVFP4 amax and fused kernels) and dequantize.

One config per (format, dtype); the launch shape (slots per thread, block size) follows from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..arch import get_arch
from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError
from .tensor import FORMATS, elem_bits, group_size

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
CTYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float"}
ESIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
ELEM = {"nvfp4": "E2M1", "mxfp4": "E2M1", "mxfp6_e2m3": "E2M3", "mxfp6_e3m2": "E3M2",
        "mxfp8_e4m3": "E4M3", "mxfp8_e5m2": "E5M2"}
THREADS = 256
SLOT_BYTES = 64  # input (or output) bytes per thread in flight: slots = SLOT_BYTES / slot bytes
# mx_quantize with the chunk loop (fp4 / fp6): launch bounds of QUANT_MIN_BLOCKS blocks an SM
# (<= 80 registers: two chunks in registers); the planner's LOOP_GRID caps large grids below it
QUANT_MIN_BLOCKS = 3
# MXFP8 quantize lanes of 16 elements (quant_lane_elems); H100, K = 4096: 20.1 vs 20.4-20.5 us at
# M = 4096 (84% vs 83% of copy), equal at M = 16 and 16384 (BENCHMARKS.md)
WIDE_FP8 = True
# fp4 / fp6 quantize of fp16 / bf16 inputs encodes two elements a 32-bit word in 16-bit lanes
# (mx.cuh "Packed 16-bit encoders"; MX: ~6 SASS instructions an element instead of ~13)
H2_DEFAULT = True
CLUSTER = 8  # fused NVFP4 path: one cluster of 8 blocks of 1024 threads (sm_90+)
FUSED_THREADS = 1024


def lane_elems(fmt: str) -> int:
    """Elements per lane slot: 16 for fp4 / fp6 (8 / 12 output bytes; per-slot work amortised
    over more elements where the integer encoders make the kernel compute-heavy), 8 for fp8."""
    return 8 if elem_bits(fmt) == 8 else 16


def quant_lane_elems(fmt: str, wide: bool = False) -> int:
    """Elements per lane slot of mx_quantize: lane_elems, or 16 for fp8 with `wide` (16-byte
    stores, half the per-slot shuffles / scale / address work per element)."""
    return 16 if wide else lane_elems(fmt)


def slots_per_thread(fmt: str, dtype: str, e: int | None = None) -> int:
    """Slots a thread of a chunk: SLOT_BYTES of input in flight (e: elements a slot)."""
    return max(1, SLOT_BYTES // ((e or lane_elems(fmt)) * ESIZE[dtype]))


def has_fused(arch: str) -> bool:
    """Thread-block clusters (and so the one-launch NVFP4 path) exist from sm_90 on."""
    return get_arch(arch).cc >= 90


def hw_fp8_cvt(arch: str, fmt: str) -> bool:
    """MXFP8 elements can use cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+; taken from sm_90a on:
    sm_89 shares sm_80's quantize tables, not measured on an 8.9 part).
    The fp4 / fp6 cvt forms exist only on the Blackwell targets (sm_100a and after), where we
    cannot test them: those formats always use the exact integer encoders."""
    return elem_bits(fmt) == 8 and get_arch(arch).cc >= 90


def h2_applies(fmt: str, dtype: str) -> bool:
    """The packed 16-bit encoders exist for fp4 / fp6 with fp16 / bf16 inputs: MX elements are
    scaled by a power of two in the input's format, NVFP4 elements are scaled in fp32 and rounded
    to odd into fp16 first; fp8 uses the hardware cvt."""
    return elem_bits(fmt) in (4, 6) and dtype in ("float16", "bfloat16")


def _check(cfg: KernelConfig, fmt: str, dtype: str) -> None:
    if fmt not in FORMATS:
        raise UnsupportedConfigError(f"{cfg.short()}: fmt={fmt!r}; expected one of {list(FORMATS)}")
    if dtype not in FLOAT_DTYPES:
        raise UnsupportedConfigError(f"{cfg.short()}: dtype={dtype!r}; expected one of "
                                     f"{FLOAT_DTYPES}")


def _format_vars(fmt: str, dtype: str) -> dict[str, Any]:
    return {"ctype": CTYPE[dtype], "elem": ELEM[fmt], "nv": fmt == "nvfp4",
            "group": group_size(fmt), "lane_elems": lane_elems(fmt),
            "slots": slots_per_thread(fmt, dtype), "threads": THREADS}


@dataclass(frozen=True)
class MxQuantizeConfig(KernelConfig):
    """fp16 / bf16 / fp32 [rows, K] -> `fmt`. NVFP4 modules also hold `mx_amax` (global amax
    partials) and, from sm_90, `mx_quantize_fused` (one cluster, global scale on the device)."""

    family: ClassVar[str] = "mx"
    template: ClassVar[str] = "mx/quantize.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float16"  # input
    hw_cvt: bool = False  # MXFP8 elements by the hardware cvt (see hw_fp8_cvt)
    wide: bool = False  # MXFP8: 16 elements a lane slot instead of 8 (see quant_lane_elems)
    h2: bool = False  # packed 16-bit element encoders (see h2_applies)
    loop: bool | None = None  # blocks loop over chunks; None: by format (see loops)
    linear: bool = True  # slot addresses from the slot index alone where there is no column padding

    def check(self) -> None:
        _check(self, self.fmt, self.dtype)
        if self.loop is not None and type(self.loop) is not bool:  # validate() skips `bool | None`
            raise UnsupportedConfigError(f"{self.short()}: loop={self.loop!r}; expected None, True "
                                         f"or False")
        if self.hw_cvt and not hw_fp8_cvt(self.arch, self.fmt):
            raise UnsupportedConfigError(f"{self.short()}: hw_cvt needs an mxfp8 format and "
                                         f"sm_90a or newer (cvt.rn.satfinite.e4m3x2/e5m2x2)")
        if self.wide and elem_bits(self.fmt) != 8:
            raise UnsupportedConfigError(f"{self.short()}: wide is for mxfp8 formats (fp4 / fp6 "
                                         f"lanes hold 16 elements already)")
        if self.h2 and not h2_applies(self.fmt, self.dtype):
            raise UnsupportedConfigError(f"{self.short()}: h2 (packed 16-bit encoders) needs an "
                                         f"fp4 / fp6 format and a float16 / bfloat16 input")

    @property
    def lane_elems(self) -> int:
        return quant_lane_elems(self.fmt, self.wide)

    @property
    def slots(self) -> int:
        """Slots a thread of a chunk (the kernel's U)."""
        return slots_per_thread(self.fmt, self.dtype, self.lane_elems)

    @property
    def loops(self) -> bool:
        """Blocks loop over chunks with the next chunk's loads in flight (fp4 / fp6: heavy
        per-element work); fp8 keeps a chunk a block (fewer registers, more blocks an SM) unless
        `loop` says otherwise."""
        return elem_bits(self.fmt) != 8 if self.loop is None else self.loop

    @property
    def fused(self) -> bool:
        return self.fmt == "nvfp4" and has_fused(self.arch)

    @property
    def fused_slots(self) -> int:
        """Slots per thread of the fused kernel (its inputs stay in registers)."""
        return slots_per_thread(self.fmt, self.dtype)

    def symbols(self) -> tuple[str, ...]:
        syms = ("mx_quantize",)
        if self.fmt == "nvfp4":
            syms += ("mx_amax",)
        if self.fused:
            syms += ("mx_quantize_fused",)
        return syms

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), **_format_vars(self.fmt, self.dtype),
                "lane_elems": self.lane_elems, "slots": self.slots, "loop": self.loops,
                "min_blocks": QUANT_MIN_BLOCKS, "fused": self.fused, "h2": self.h2,
                "linear": self.linear,
                "cluster": CLUSTER,
                "fused_threads": FUSED_THREADS,
                "fused_slots": self.fused_slots}


@dataclass(frozen=True)
class MxDequantizeConfig(KernelConfig):
    """`fmt` -> fp16 / bf16 / fp32 [rows, K]."""

    family: ClassVar[str] = "mx"
    template: ClassVar[str] = "mx/dequantize.cu.jinja"
    fmt: str = "nvfp4"
    dtype: str = "float32"  # output

    def check(self) -> None:
        _check(self, self.fmt, self.dtype)

    def symbols(self) -> tuple[str, ...]:
        return ("mx_dequantize",)

    def template_vars(self) -> dict[str, Any]:
        v = _format_vars(self.fmt, self.dtype)
        v["slots"] = max(1, SLOT_BYTES // (lane_elems(self.fmt) * ESIZE[self.dtype]))
        return {**super().template_vars(), **v}
