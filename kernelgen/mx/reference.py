"""NumPy references of the block-scaled formats. These *define* the formats: kernels agree with
them bit for bit on packed element bytes and scale bytes.

Element formats (sign bit on top, then exponent, then mantissa; subnormals when exponent == 0):

=======  ====  ===========  =========  ===================================================
format   bias  max finite   min > 0    specials
=======  ====  ===========  =========  ===================================================
E2M1     1     6.0          0.5        none
E2M3     1     7.5          0.125      none
E3M2     3     28.0         0.0625     none
E4M3     7     448.0        2**-9      "fn": no Inf; S.1111.111 is NaN (0x7F / 0xFF)
E5M2     15    57344.0      2**-16     IEEE: exponent 31 is Inf (m == 0) or NaN (m != 0)
E8M0     127   2**127       2**-127    unsigned, exponent only; 0xFF is NaN
=======  ====  ===========  =========  ===================================================

Encoding (`encode`) is exact round-to-nearest-even of the float64 value (fp32 / fp16 / bf16 inputs
are exact in float64), with saturation to +-max finite (PTX ``cvt.rn.satfinite``): finite
overflow and +-Inf give +-max. ``saturate=False`` is offered for E4M3 (overflow -> NaN 0x7F) and
E5M2 (overflow -> +-Inf, IEEE). NaN encodes as 0x7F for E4M3 and E5M2 (sign dropped); the formats
without NaN (E2M1, E2M3, E3M2) encode NaN as +max (chosen here; the block quantizers never pass a
NaN to an element encoder). Zero keeps its sign.

Block formats, x [M, K] (rows = GEMM M or N, K = reduction dim; groups run along K):

* NVFP4: groups of 16, E2M1 elements, one E4M3 scale per group, one fp32 global scale.
* MX (OCP Microscaling v1.0): groups of 32, E8M0 scale per group; elements mxfp4 (E2M1),
  mxfp6_e2m3, mxfp6_e3m2, mxfp8_e4m3, mxfp8_e5m2.

Packing along K, row-major [M, K * bits / 8] uint8: fp4 two per byte, element 2j in the low nibble;
fp6 four per three bytes, little-endian bit stream (element i occupies bits [6i, 6i+6) of the
24-bit word b0 | b1 << 8 | b2 << 16); fp8 one per byte.

Scale layouts: "swizzled" = the cuBLAS / CUTLASS block-scaled layout
[ceil(M/128), ceil(S/4), 32, 4, 4] (S = K / group) - see `swizzle_scales`; "row_major" = [M, S].

bf16 arrays are uint16 arrays of bf16 bit patterns (NumPy has no bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from kernelgen.kbit.reference import bf16_to_f32, from_f32

NVFP4_GROUP = 16
MX_GROUP = 32
NVFP4_GLOBAL_NUMERATOR = 6.0 * 448.0  # = 2688: E2M1 max times E4M3 max
SCALE_PAD_BYTE = 0x00  # padding of the swizzled layout: E4M3 +0.0, E8M0 2**-127 (both finite)
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF
_FLT_MAX = np.float32(np.finfo(np.float32).max)

ScaleLayout = Literal["swizzled", "row_major"]
OutDtype = Literal["float32", "float16", "bfloat16"]


# -- element formats -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ElemFormat:
    """A sign / exponent / mantissa element format (codes are the low `bits` bits of a uint8)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_normal: float
    nan_code: int | None  # canonical NaN code (positive); None: the format has no NaN
    has_inf: bool

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (also the scale of the subnormals)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest normal (OCP's emax_elem)."""
        return int(np.floor(np.log2(self.max_normal)))

    @property
    def max_code(self) -> int:
        """Code of +max finite."""
        mant = int(self.max_normal / 2.0 ** (self.emax - self.mbits)) - (1 << self.mbits)
        return ((self.emax + self.bias) << self.mbits) | mant


E2M1 = ElemFormat("e2m1", 2, 1, 1, 6.0, None, False)
E2M3 = ElemFormat("e2m3", 2, 3, 1, 7.5, None, False)
E3M2 = ElemFormat("e3m2", 3, 2, 3, 28.0, None, False)
E4M3 = ElemFormat("e4m3", 4, 3, 7, 448.0, E4M3_NAN, False)
E5M2 = ElemFormat("e5m2", 5, 2, 15, 57344.0, 0x7F, True)
ELEM_FORMATS = {f.name: f for f in (E2M1, E2M3, E3M2, E4M3, E5M2)}

MX_FORMATS: dict[str, ElemFormat] = {
    "mxfp4": E2M1, "mxfp6_e2m3": E2M3, "mxfp6_e3m2": E3M2, "mxfp8_e4m3": E4M3, "mxfp8_e5m2": E5M2,
}


def decode(codes: np.ndarray, fmt: ElemFormat) -> np.ndarray:
    """Element codes (uint8, low `fmt.bits` bits used) -> float32 values (exact)."""
    c = np.asarray(codes).astype(np.int64) & ((1 << fmt.bits) - 1)
    sign = (c >> (fmt.bits - 1)) & 1
    mag = c & ((1 << (fmt.bits - 1)) - 1)
    e, m = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    sig = np.where(e == 0, m, m + (1 << fmt.mbits)).astype(np.float64)
    val = np.ldexp(sig, np.where(e == 0, fmt.emin, e - fmt.bias) - fmt.mbits)
    if fmt.has_inf:
        top = e == (1 << fmt.ebits) - 1
        val = np.where(top & (m == 0), np.inf, np.where(top, np.nan, val))
    elif fmt.nan_code is not None:
        val = np.where(mag == fmt.nan_code, np.nan, val)
    return np.where(sign == 1, -val, val).astype(np.float32)


def encode(x: np.ndarray, fmt: ElemFormat, saturate: bool = True) -> np.ndarray:
    """float values -> element codes (uint8): round to nearest even, see the module docstring for
    saturation, NaN and Inf."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    _, ex = np.frexp(a)  # a = f * 2**ex, f in [0.5, 1): floor(log2 a) = ex - 1
    e = np.maximum(ex - 1, fmt.emin)
    n = np.rint(np.ldexp(a, fmt.mbits - e))  # significand in units of the ulp at exponent e
    carry = n >= (2 << fmt.mbits)  # rounded up into the next binade
    e, n = np.where(carry, e + 1, e), np.where(carry, n / 2, n).astype(np.int64)
    normal = n >= (1 << fmt.mbits)
    mag = np.where(normal, ((e + fmt.bias) << fmt.mbits) | (n - (1 << fmt.mbits)), n)
    over = (np.ldexp(n.astype(np.float64), e - fmt.mbits) > fmt.max_normal) | np.isinf(x)
    if saturate or fmt.nan_code is None:
        over_code = fmt.max_code
    else:
        over_code = ((1 << fmt.ebits) - 1) << fmt.mbits if fmt.has_inf else fmt.nan_code
    mag = np.where(over, over_code, mag)
    code = np.where(np.signbit(x), mag | (1 << (fmt.bits - 1)), mag)
    nan_code = fmt.max_code if fmt.nan_code is None else fmt.nan_code
    return np.where(np.isnan(x), nan_code, code).astype(np.uint8)


def e8m0_decode(codes: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 2**(code - 127); 0xFF -> NaN. 0x00 is 2**-127 (an fp32 subnormal)."""
    c = np.asarray(codes).astype(np.int64)
    return np.where(c == E8M0_NAN, np.nan, np.ldexp(1.0, c - 127)).astype(np.float32)


def e8m0_encode(x: np.ndarray) -> np.ndarray:
    """|x| -> E8M0 byte, rounding down to a power of two (floor(log2|x|) + 127, clamped to
    [0, 254]): the OCP shared-exponent rule. Zero -> 0x00; NaN and +-Inf -> 0xFF; sign ignored."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    ok = np.isfinite(a)
    _, ex = np.frexp(np.where(ok, a, 0.0))
    code = np.where(a > 0, np.clip(ex - 1 + 127, 0, 254), 0)
    return np.where(ok, code, E8M0_NAN).astype(np.uint8)


# -- packing -------------------------------------------------------------------------------------
def _check_last(n: int, multiple: int, what: str) -> None:
    if n % multiple:
        raise ValueError(f"{what}: the last dimension ({n}) must be a multiple of {multiple}")


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """[..., K] 4-bit codes -> [..., K/2] uint8; element 2j in the low nibble of byte j."""
    c = np.asarray(codes).astype(np.uint8) & 0xF
    _check_last(c.shape[-1], 2, "pack_fp4 codes")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """[..., K/2] uint8 -> [..., K] 4-bit codes (inverse of `pack_fp4`)."""
    p = np.asarray(packed, dtype=np.uint8)
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def pack_fp6(codes: np.ndarray) -> np.ndarray:
    """[..., K] 6-bit codes -> [..., 3K/4] uint8. Each 4 elements form the little-endian 24-bit word
    w = c0 | c1 << 6 | c2 << 12 | c3 << 18, stored as bytes w & 0xFF, w >> 8 & 0xFF, w >> 16."""
    c = np.asarray(codes).astype(np.uint32) & 0x3F
    _check_last(c.shape[-1], 4, "pack_fp6 codes")
    q = c.reshape(*c.shape[:-1], -1, 4)
    w = q[..., 0] | (q[..., 1] << 6) | (q[..., 2] << 12) | (q[..., 3] << 18)
    b = np.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=-1).astype(np.uint8)
    return b.reshape(*c.shape[:-1], -1)


def unpack_fp6(packed: np.ndarray) -> np.ndarray:
    """[..., 3K/4] uint8 -> [..., K] 6-bit codes (inverse of `pack_fp6`)."""
    p = np.asarray(packed, dtype=np.uint8).astype(np.uint32)
    _check_last(p.shape[-1], 3, "unpack_fp6 packed")
    t = p.reshape(*p.shape[:-1], -1, 3)
    w = t[..., 0] | (t[..., 1] << 8) | (t[..., 2] << 16)
    c = np.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], axis=-1).astype(np.uint8)
    return c.reshape(*p.shape[:-1], -1)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack [..., K] codes of a 4-, 6- or 8-bit format along the last axis."""
    if bits == 8:
        return np.asarray(codes).astype(np.uint8)
    return pack_fp4(codes) if bits == 4 else pack_fp6(codes)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return np.asarray(packed).astype(np.uint8)
    return unpack_fp4(packed) if bits == 4 else unpack_fp6(packed)


# -- scale layouts -------------------------------------------------------------------------------
def swizzled_shape(m: int, s: int) -> tuple[int, int, int, int, int]:
    """[numMTiles, numKTiles, 32, 4, 4] for M rows and S scale columns (rows padded to 128,
    scale columns to 4)."""
    return (-(-m // 128), -(-s // 4), 32, 4, 4)


def swizzled_offset(r: int, c: int, s: int) -> int:
    """Byte offset of scale (row r, scale column c) in the swizzled layout of S scale columns:
    tile (r // 128, c // 4) of 512 bytes, then (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4."""
    k_tiles = -(-s // 4)
    return ((r // 128) * k_tiles + c // 4) * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4


def swizzle_scales(scales: np.ndarray, pad_value: int = SCALE_PAD_BYTE) -> np.ndarray:
    """Row-major scale bytes [M, S] -> [ceil(M/128), ceil(S/4), 32, 4, 4] uint8, with
    out[r // 128, c // 4, r % 32, r // 32 % 4, c % 4] = scales[r, c] (flat offset as in
    `swizzled_offset`). Padded rows and columns hold `pad_value`."""
    s = np.asarray(scales, dtype=np.uint8)
    if s.ndim != 2:
        raise ValueError(f"scales must be 2-D [M, S], got shape {s.shape}")
    mt, kt = swizzled_shape(*s.shape)[:2]
    padded = np.full((mt * 128, kt * 4), pad_value, np.uint8)
    padded[: s.shape[0], : s.shape[1]] = s
    # rows r = (mt, i = r // 32 % 4, j = r % 32), columns c = (kt, l = c % 4) -> (mt, kt, j, i, l)
    return np.ascontiguousarray(padded.reshape(mt, 4, 32, kt, 4).transpose(0, 3, 2, 1, 4))


def unswizzle_scales(swizzled: np.ndarray, m: int, s: int) -> np.ndarray:
    """Inverse of `swizzle_scales`: [numMTiles, numKTiles, 32, 4, 4] -> [m, s] (padding dropped)."""
    sw = np.asarray(swizzled, dtype=np.uint8)
    if sw.shape != swizzled_shape(m, s):
        raise ValueError(f"swizzled scales have shape {sw.shape}, expected "
                         f"{swizzled_shape(m, s)} for {m} rows and {s} scale columns")
    mt, kt = sw.shape[:2]
    rows = sw.transpose(0, 3, 2, 1, 4).reshape(mt * 128, kt * 4)
    return np.ascontiguousarray(rows[:m, :s])


def _layout_scales(codes: np.ndarray, layout: ScaleLayout) -> np.ndarray:
    if layout == "row_major":
        return np.ascontiguousarray(codes, dtype=np.uint8)
    if layout == "swizzled":
        return swizzle_scales(codes)
    raise ValueError(f"scale_layout must be 'swizzled' or 'row_major', got {layout!r}")


def _row_major_scales(scales: np.ndarray, m: int, s: int) -> np.ndarray:
    sc = np.asarray(scales, dtype=np.uint8)
    if sc.ndim == 5:
        return unswizzle_scales(sc, m, s)
    if sc.shape != (m, s):
        raise ValueError(f"scales have shape {sc.shape}; expected row-major {(m, s)} or "
                         f"swizzled {swizzled_shape(m, s)}")
    return sc


# -- inputs / outputs ----------------------------------------------------------------------------
def _input_f32(x: np.ndarray, dtype: str | None, group: int, name: str = "x") -> np.ndarray:
    """fp16 / fp32 array, or uint16 bf16 bits with dtype='bfloat16' -> float32 [M, K]."""
    x = np.asarray(x)
    dtype = dtype or x.dtype.name
    if dtype == "bfloat16":
        if x.dtype != np.uint16:
            raise TypeError(f"{name}: bfloat16 input must be uint16 bit patterns, got {x.dtype}")
        v = bf16_to_f32(x)
    elif dtype in ("float16", "float32") and x.dtype.name == dtype:
        v = x.astype(np.float32)
    else:
        raise TypeError(f"{name}: dtype must be float16, float32 or bfloat16 (uint16 bits), "
                        f"got array {x.dtype} with dtype={dtype!r}")
    if v.ndim != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {v.shape}")
    if v.shape[0] < 1 or v.shape[1] < group or v.shape[1] % group:
        raise ValueError(f"{name} has shape {v.shape}: M must be >= 1 and K a positive multiple "
                         f"of the group size {group}")
    return v


def _output(v: np.ndarray, out_dtype: OutDtype) -> np.ndarray:
    """float32 -> out_dtype by round to nearest even (bf16 as uint16 bits)."""
    if out_dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype!r}")
    with np.errstate(over="ignore"):
        return from_f32(v.astype(np.float32), out_dtype)


# -- MX ------------------------------------------------------------------------------------------
def _mx_format(fmt: str) -> ElemFormat:
    if fmt not in MX_FORMATS:
        raise ValueError(f"fmt must be one of {sorted(MX_FORMATS)}, got {fmt!r}")
    return MX_FORMATS[fmt]


def quantize_mx(x: np.ndarray, fmt: str, *, dtype: str | None = None,
                scale_layout: ScaleLayout = "swizzled") -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] (K % 32 == 0) -> (packed uint8 [M, K * bits / 8], E8M0 scales).

    Per group of 32 along K (OCP MX v1.0 section 6.3): shared_exp = floor(log2(amax)) - emax_elem,
    clamped to >= -127 (a finite fp32 amax can never exceed the E8M0 range); scale byte
    shared_exp + 127; element i = encode(x_i / 2**shared_exp) with RNE and saturation to +-max
    normal (E5M2 too). The division is exact (equal to an fp32 multiply by 2**-shared_exp: results
    that would be fp32-subnormal round to zero in every element format anyway).
    All-zero group: scale 0x00 (2**-127), elements +-0. A group holding NaN or +-Inf: scale 0xFF
    (NaN) and all element codes 0.
    Scales: [ceil(M/128), ceil(K/32/4), 32, 4, 4] if scale_layout == "swizzled", else [M, K/32].
    """
    f = _mx_format(fmt)
    v = _input_f32(x, dtype, MX_GROUP)
    m, k = v.shape
    g = v.reshape(m, k // MX_GROUP, MX_GROUP).astype(np.float64)
    amax = np.max(np.abs(g), axis=-1)  # NaN propagates
    scale = e8m0_encode(np.ldexp(amax, -f.emax))  # floor(log2 amax) - emax, clamped; 0xFF if NaN/Inf
    bad = scale == E8M0_NAN
    with np.errstate(invalid="ignore"):
        vals = np.where(bad[..., None], 0.0, g / e8m0_decode(scale).astype(np.float64)[..., None])
    codes = encode(vals, f).reshape(m, k)
    return pack_codes(codes, f.bits), _layout_scales(scale, scale_layout)


def dequantize_mx(packed: np.ndarray, scales: np.ndarray, fmt: str,
                  out_dtype: OutDtype = "float32") -> np.ndarray:
    """(packed [M, K * bits / 8], E8M0 scales swizzled or [M, K/32]) -> [M, K] in out_dtype:
    decode(code) * 2**(scale - 127), exact in fp32, NaN where the scale is 0xFF."""
    f = _mx_format(fmt)
    codes = unpack_codes(packed, f.bits)
    m, k = codes.shape
    sc = _row_major_scales(scales, m, k // MX_GROUP)
    vals = decode(codes, f).reshape(m, k // MX_GROUP, MX_GROUP).astype(np.float64)
    v = (vals * e8m0_decode(sc).astype(np.float64)[..., None]).reshape(m, k)
    return _output(v.astype(np.float32), out_dtype)


# -- NVFP4 ---------------------------------------------------------------------------------------
def nvfp4_global_scale(x: np.ndarray, dtype: str | None = None) -> np.float32:
    """The 6*448 rule: fp32(2688 / amax) with amax = max |x| over the finite entries (fp32 division,
    round to nearest). No finite non-zero entry: 1.0. A quotient that overflows: FLT_MAX."""
    v = _input_f32(np.asarray(x).reshape(1, -1), dtype, 1)
    a = np.abs(v[np.isfinite(v)])
    amax = np.float32(a.max()) if a.size else np.float32(0)
    if amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        gs = np.float32(NVFP4_GLOBAL_NUMERATOR) / amax
    return np.float32(min(gs, _FLT_MAX))


def quantize_nvfp4(x: np.ndarray, global_scale: float | None = None, *, dtype: str | None = None,
                   scale_layout: ScaleLayout = "swizzled"
                   ) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """x [M, K] (K % 16 == 0) -> (packed uint8 [M, K/2], E4M3 scales, global scale fp32).

    gs = `global_scale` (positive finite, taken as fp32) or `nvfp4_global_scale(x)`. Per group of
    16 along K, every step one fp32 operation rounded to nearest even:
      sf_f32    = RN(RN(amax_g / 6) * gs)           amax_g = max |x| of the group
      sf        = E4M3(sf_f32)                        RNE, saturating to 448; scale byte
      out_scale = min(RN(gs / decode(sf)), FLT_MAX)   0 if decode(sf) == 0
      element   = E2M1(RN(x * out_scale))             RNE, saturating to +-6
    A group holding NaN or +-Inf: scale byte 0x7F (E4M3 NaN) and element codes 0.
    Scales: [ceil(M/128), ceil(K/16/4), 32, 4, 4] if scale_layout == "swizzled", else [M, K/16].
    """
    v = _input_f32(x, dtype, NVFP4_GROUP)
    m, k = v.shape
    if global_scale is None:
        gs = nvfp4_global_scale(v)
    else:
        gs = np.float32(global_scale)
        if not (np.isfinite(gs) and gs > 0):
            raise ValueError(f"global_scale must be a positive finite fp32, got {global_scale!r}")
    g = v.reshape(m, k // NVFP4_GROUP, NVFP4_GROUP)
    finite = np.all(np.isfinite(g), axis=-1)
    amax = np.where(finite, np.max(np.abs(np.where(np.isfinite(g), g, 0)), axis=-1), 0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        sf_f32 = (amax.astype(np.float32) / np.float32(6.0)).astype(np.float32) * gs
        sf = encode(sf_f32, E4M3)
        sf_val = decode(sf, E4M3)
        out_scale = np.where(sf_val > 0, np.minimum(gs / sf_val, _FLT_MAX), np.float32(0))
        scaled = (g * out_scale.astype(np.float32)[..., None]).astype(np.float32)
    codes = np.where(finite[..., None], encode(scaled, E2M1), 0).reshape(m, k)
    sf = np.where(finite, sf, E4M3_NAN).astype(np.uint8)
    return pack_fp4(codes), _layout_scales(sf, scale_layout), np.float32(gs)


def dequantize_nvfp4(packed: np.ndarray, scales: np.ndarray, global_scale: float,
                     out_dtype: OutDtype = "float32") -> np.ndarray:
    """(packed [M, K/2], E4M3 scales swizzled or [M, K/16], gs) -> [M, K] in out_dtype:
    RN(e2m1 * e4m3 / gs) in fp32 (the product is exact), NaN where the scale byte is NaN."""
    codes = unpack_fp4(packed)
    m, k = codes.shape
    sc = decode(_row_major_scales(scales, m, k // NVFP4_GROUP), E4M3)
    vals = decode(codes, E2M1).reshape(m, k // NVFP4_GROUP, NVFP4_GROUP)
    v = (vals * sc[..., None]).astype(np.float32) / np.float32(global_scale)
    return _output(v.reshape(m, k).astype(np.float32), out_dtype)
