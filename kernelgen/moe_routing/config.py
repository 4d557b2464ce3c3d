"""Configs of the MoE routing kernels: layout (phase 1), dispatch (row gather), combine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.config import KernelConfig
from ..errors import UnsupportedConfigError

ID_DTYPES = ("int32", "int64")
DTYPES = ("float16", "bfloat16")  # combine: y_perm and out
W_DTYPES = ("float32", "float16", "bfloat16")  # combine: topk_weights
CTYPE = {"int32": "int", "int64": "long long", "float16": "half", "bfloat16": "__nv_bfloat16",
         "float32": "float"}
WARPS = (4, 8, 16, 32)  # layout CTA: warps; each owns a histogram row of E ints in smem
MAX_EXPERTS = 2048  # smem (warps + 1) * E * 4 stays <= 40 KB with 4 warps
HIST_INTS = 8192  # warps * E budget of the layout histograms (32 KB)
ITEMS = 4  # ids a lane loads ahead in the layout passes
MOVE_THREADS = 128  # dispatch / combine / fused route CTA
FUSED_MAX = 2048  # pairs (T * top_k) the fused route takes: every CTA holds all ids in registers
ROUTE_MAX_CTA_PAIRS = 8  # pairs a copy CTA of the fused route takes at most
MOVE_UNROLL = 8  # 16-byte vectors a dispatch thread has in flight


def max_experts(warps: int) -> int:
    """Most experts a layout CTA of `warps` takes: its histograms fit HIST_INTS."""
    return min(MAX_EXPERTS, HIST_INTS // warps)


def layout_smem(warps: int, num_experts: int) -> int:
    """Shared bytes of a layout CTA: a histogram row per warp, the expert bases, scan scratch."""
    return (warps + 1) * num_experts * 4 + 64 * 4


@dataclass(frozen=True)
class MoeLayoutConfig(KernelConfig):
    """Phase 1: the single-CTA kernel for small batches and the three multi-CTA kernels
    (count per CTA, scan, stable scatter); one module, the selector picks the path."""

    family: ClassVar[str] = "moe_routing"
    template: ClassVar[str] = "moe_routing/layout.cu.jinja"
    id_dtype: str = "int32"
    warps: int = 32

    def check(self) -> None:
        if self.id_dtype not in ID_DTYPES:
            raise UnsupportedConfigError(f"{self.short()}: id_dtype={self.id_dtype!r}; expected one "
                                         f"of {ID_DTYPES}")
        if self.warps not in WARPS:
            raise UnsupportedConfigError(f"{self.short()}: warps={self.warps!r}; expected one of {WARPS}")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_layout_single", "moe_layout_count", "moe_layout_scan", "moe_layout_scatter")

    def smem_bytes(self) -> int:
        return layout_smem(self.warps, max_experts(self.warps))

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "id_ctype": CTYPE[self.id_dtype], "items": ITEMS,
                "max_experts": max_experts(self.warps)}


@dataclass(frozen=True)
class MoeDispatchConfig(KernelConfig):
    """Phase 2: x_perm[r] = x[src[r] / top_k] by 16-byte vectors; dtype-blind (rows of bytes)."""

    family: ClassVar[str] = "moe_routing"
    template: ClassVar[str] = "moe_routing/dispatch.cu.jinja"

    def symbols(self) -> tuple[str, ...]:
        return ("moe_dispatch",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "threads": MOVE_THREADS, "unroll": MOVE_UNROLL}


def route_smem(num_experts: int) -> int:
    """Dynamic shared bytes of a fused-route CTA: histogram, offsets, scan scratch."""
    return (2 * num_experts + 34) * 4


@dataclass(frozen=True)
class MoeRouteConfig(KernelConfig):
    """Layout + dispatch fused in one launch for n <= FUSED_MAX pairs (graph-safe x_perm)."""

    family: ClassVar[str] = "moe_routing"
    template: ClassVar[str] = "moe_routing/route.cu.jinja"
    id_dtype: str = "int32"

    def check(self) -> None:
        if self.id_dtype not in ID_DTYPES:
            raise UnsupportedConfigError(f"{self.short()}: id_dtype={self.id_dtype!r}; expected one "
                                         f"of {ID_DTYPES}")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_route_fused",)

    def smem_bytes(self) -> int:
        return route_smem(MAX_EXPERTS)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "id_ctype": CTYPE[self.id_dtype], "threads": MOVE_THREADS,
                "max_pairs": FUSED_MAX, "unroll": MOVE_UNROLL, "max_cta_pairs": ROUTE_MAX_CTA_PAIRS}


@dataclass(frozen=True)
class MoeCombineConfig(KernelConfig):
    """out[t] = sum_j w[t, j] * y_perm[dest[t * top_k + j]], fp32, fixed order."""

    family: ClassVar[str] = "moe_routing"
    template: ClassVar[str] = "moe_routing/combine.cu.jinja"
    dtype: str = "bfloat16"
    w_dtype: str = "float32"
    split: bool = False  # columns over grid.y (tiny batches) instead of a CTA a token

    def check(self) -> None:
        if self.dtype not in DTYPES:
            raise UnsupportedConfigError(f"{self.short()}: dtype={self.dtype!r}; expected one of {DTYPES}")
        if self.w_dtype not in W_DTYPES:
            raise UnsupportedConfigError(f"{self.short()}: w_dtype={self.w_dtype!r}; expected one "
                                         f"of {W_DTYPES}")

    def symbols(self) -> tuple[str, ...]:
        return ("moe_combine",)

    def template_vars(self) -> dict[str, Any]:
        return {**super().template_vars(), "ctype": CTYPE[self.dtype], "w_ctype": CTYPE[self.w_dtype],
                "threads": MOVE_THREADS}
