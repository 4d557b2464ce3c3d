"""`MxTensor`: a block-scaled quantized matrix on the device (the contract between the mx
quantization kernels and the scaled GEMMs; see kernelgen/mx/reference.py for the formats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# format -> (element bits, group size along K, scale kind)
FORMATS: dict[str, tuple[int, int, str]] = {
    "nvfp4": (4, 16, "e4m3"),
    "mxfp4": (4, 32, "e8m0"),
    "mxfp6_e2m3": (6, 32, "e8m0"),
    "mxfp6_e3m2": (6, 32, "e8m0"),
    "mxfp8_e4m3": (8, 32, "e8m0"),
    "mxfp8_e5m2": (8, 32, "e8m0"),
}
MX_FORMATS = tuple(f for f in FORMATS if f != "nvfp4")
SCALE_LAYOUTS = ("swizzled", "row_major")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")


def elem_bits(fmt: str) -> int:
    """Bits per element: 4 (nvfp4, mxfp4), 6 (mxfp6_*) or 8 (mxfp8_*)."""
    check_format(fmt)
    return FORMATS[fmt][0]


def group_size(fmt: str) -> int:
    """Elements per scale along K: 16 (nvfp4) or 32 (mx formats)."""
    check_format(fmt)
    return FORMATS[fmt][1]


def data_shape(fmt: str, rows: int, k: int) -> tuple[int, int]:
    """Shape of the packed uint8 data: [rows, K * bits / 8]."""
    return (rows, k * elem_bits(fmt) // 8)


def scale_shape(fmt: str, rows: int, k: int, scale_layout: str) -> tuple[int, ...]:
    """Shape of the uint8 scale buffer: swizzled [ceil(rows/128), ceil(S/4), 32, 4, 4] (rows padded
    to 128, scale columns to 4, padding bytes 0x00) or row_major [rows, S], S = K / group."""
    s = k // group_size(fmt)
    if scale_layout == "swizzled":
        return (-(-rows // 128), -(-s // 4), 32, 4, 4)
    if scale_layout == "row_major":
        return (rows, s)
    raise ValueError(f"scale_layout must be one of {list(SCALE_LAYOUTS)}, got {scale_layout!r}")


@dataclass(frozen=True)
class MxTensor:
    """A quantized [rows, K] matrix; groups run along K.

    fmt:          "nvfp4" | "mxfp4" | "mxfp6_e2m3" | "mxfp6_e3m2" | "mxfp8_e4m3" | "mxfp8_e5m2"
    shape:        logical (rows, K)
    data:         uint8 [rows, K * bits / 8], packed as reference.py packs (fp4: element 2j in the
                  low nibble; fp6: 4 values in 3 bytes little-endian; fp8: one per byte)
    scales:       uint8 E4M3 (nvfp4) or E8M0 (mx) bytes in `scale_layout` (see `scale_shape`)
    scale_layout: "swizzled" | "row_major"
    global_scale: nvfp4: fp32 device array of shape (1,) holding gs (decode divides by gs);
                  None for the mx formats
    Arrays are CuPy arrays, or torch tensors when the input was a torch tensor.
    """

    fmt: str
    shape: tuple[int, int]
    data: Any
    scales: Any
    scale_layout: str
    global_scale: Any = None

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[1]

    @property
    def bits(self) -> int:
        return elem_bits(self.fmt)

    @property
    def group(self) -> int:
        return group_size(self.fmt)

    def check(self) -> None:
        """Raise ValueError if fields disagree with each other (shapes, layout, global scale)."""
        check_format(self.fmt)
        rows, k = self.shape
        if rows < 0 or k < 1 or k % self.group:
            raise ValueError(f"MxTensor {self.fmt}: shape {self.shape} needs rows >= 0 and K a "
                             f"positive multiple of {self.group}")
        if tuple(self.data.shape) != data_shape(self.fmt, rows, k):
            raise ValueError(f"MxTensor {self.fmt}: data has shape {tuple(self.data.shape)}, "
                             f"expected {data_shape(self.fmt, rows, k)}")
        want = scale_shape(self.fmt, rows, k, self.scale_layout)
        if tuple(self.scales.shape) != want:
            raise ValueError(f"MxTensor {self.fmt}: scales have shape "
                             f"{tuple(self.scales.shape)}, expected {want} ({self.scale_layout})")
        if (self.fmt == "nvfp4") != (self.global_scale is not None):
            raise ValueError(f"MxTensor {self.fmt}: global_scale must be set for nvfp4 and only "
                             f"for nvfp4")

    def __repr__(self) -> str:
        return (f"MxTensor(fmt={self.fmt!r}, shape={self.shape}, "
                f"scale_layout={self.scale_layout!r})")
