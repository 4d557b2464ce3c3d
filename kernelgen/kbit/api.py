"""Public kbit API: quantize, dequantize, repack, E4M4 codec. CuPy arrays or torch tensors."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import device_info
from ..core.interop import Ctx, context_of, device_array, dtype_name
from ..core.jit import get_kernel
from ..core.select import selector
from . import reference
from .config import (
    BITS,
    FLOAT_DTYPES,
    THREADS,
    E4M4Config,
    KbitDequantizeConfig,
    KbitQuantizeConfig,
    KbitRepackConfig,
)

create_normal_float_codebook = reference.create_normal_float_codebook
_ABSMAX_OF_STORAGE = {"uint8": "e4m4", "float16": "float16", "float32": "float32"}


@dataclass(frozen=True)
class KbitTensor:
    """A quantized tensor in the flat kbit layout.

    packed  [n_blocks * bits] uint32  bit planes, block-major
    absmax  [n_blocks] uint8          E4M4 scale per block of 32
    absmax_f32 [n_blocks] float32     the exact scales (None once dropped)
    codebook [2**bits] float32        sorted levels in [-1, 1]
    """

    packed: Any
    absmax: Any
    absmax_f32: Any
    codebook: Any
    shape: tuple[int, ...]
    bits: int
    dtype: str  # dtype of the tensor that was quantized (default dequantize dtype)

    @functools.cached_property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _views(self, ctx: Ctx) -> tuple[Any, Any, Any]:
        """Validated cupy views of (packed, absmax, codebook), checked once and then cached."""
        cached = self.__dict__.get("_cached_views")
        if cached is not None and cached[0] == (ctx.kind, ctx.device):
            return cached[1]
        packed, _ = device_array(self.packed, "q.packed", ctx, ("uint32",), ndim=1)
        if packed.size != self.n_blocks * self.bits:
            raise ValueError(f"q.packed: {packed.size} words, shape {self.shape} at {self.bits} "
                             f"bits needs {self.n_blocks * self.bits}")
        absmax, _ = device_array(self.absmax, "q.absmax", ctx, ("uint8",), ndim=1)
        if absmax.size != self.n_blocks:
            raise ValueError(f"q.absmax: {absmax.size} scales, {self.n_blocks} blocks need one each")
        cb, _ = device_array(self.codebook, "q.codebook", ctx, ("float32",), ndim=1)
        if cb.size != 1 << self.bits:
            raise ValueError(f"q.codebook: has {cb.size} entries; bits={self.bits} needs {1 << self.bits}")
        views = (packed, absmax, cb)
        # keyed by device too: a call from another GPU re-validates (and is refused)
        object.__setattr__(self, "_cached_views", ((ctx.kind, ctx.device), views))
        return views

    @functools.cached_property
    def n_blocks(self) -> int:
        return -(-self.numel // 32)


@dataclass(frozen=True)
class KbitTiled:
    """W [N, K] repacked for the GEMM: [K/tile_k][N/tile_n][tile_n][tile_k/32][bits] words."""

    packed: Any
    absmax: Any  # E4M4, same tiling without the bit axis
    codebook: Any
    n: int
    k: int
    bits: int
    tile_n: int
    tile_k: int


def check_bits(bits: Any) -> int:
    """bits as a plain int in 2..5 (numpy integers accepted; 4.0 or True are not)."""
    try:
        b = operator.index(bits)
    except TypeError:  # None, 4.0, a string
        b = None
    if b not in BITS or isinstance(bits, bool):
        raise ValueError(f"bits={bits!r}: kbit supports bits in 2..5")
    return int(b)


_codebooks: dict[tuple[int, int, str], Any] = {}


def _device_codebook(bits: int, ctx: Ctx, codebook: Any) -> tuple[Any, Any]:
    """(native, cupy view) of the codebook: the normal-float one by default (cached per device),
    or the caller's, checked: fp32, 2**bits entries, strictly ascending (one small copy to the
    host; quantization is an offline step)."""
    if codebook is None:
        key = (bits, ctx.device, ctx.kind)
        cached = _codebooks.get(key)
        if cached is None:
            native, view = ctx.empty((1 << bits,), "float32")
            view.set(create_normal_float_codebook(bits), stream=ctx.stream)
            cached = _codebooks[key] = (native, view)
        return cached
    view, _ = device_array(codebook, "codebook", ctx, ("float32",), ndim=1)
    if view.shape[0] != 1 << bits:
        raise ValueError(f"codebook: has {view.shape[0]} entries; bits={bits} needs {1 << bits}")
    host = view.get(stream=ctx.stream)
    if not np.all(np.diff(host) > 0):
        raise ValueError(f"codebook: must be strictly ascending (the index search relies on "
                         f"it), got {host.tolist()}")
    return codebook, view


def _grid(n_warps: int) -> tuple[int, int, int]:
    warps_per_block = THREADS // 32
    return (max(1, -(-n_warps // warps_per_block)), 1, 1)


@selector
def _quantize_config(arch: str, bits: int, dtype: str) -> KbitQuantizeConfig:
    return KbitQuantizeConfig(arch=arch, bits=bits, dtype=dtype)


@selector
def _dequantize_config(arch: str, bits: int, dtype: str, absmax: str) -> KbitDequantizeConfig:
    return KbitDequantizeConfig(arch=arch, bits=bits, dtype=dtype, absmax_dtype=absmax)


def quantize_kbit(x: Any, bits: int = 4, *, codebook: Any = None, dtype: str | None = None) -> KbitTensor:
    """Quantize `x` (fp16 / bf16 / fp32, any shape, contiguous) blockwise with `bits` bits.

    Blocks are 32 consecutive elements of the flattened tensor; a partial last block is padded
    with zeros. `codebook` (fp32, 2**bits sorted entries) defaults to the normal-float one.
    CuPy bf16 input: a uint16 array with dtype="bfloat16".
    """
    bits = check_bits(bits)
    ctx = context_of(x, "x")
    dtype = dtype_name(dtype)
    xa, dt = device_array(x, "x", ctx, FLOAT_DTYPES, hint=dtype)
    if dtype is not None and dtype != dt:  # as quantize_mx: a hint names x's dtype
        raise ValueError(f"x: dtype={dtype!r} given for an array of {dt}")
    n = xa.size
    if n == 0:
        raise ValueError("x: has no elements; kbit quantization needs at least 1")
    cb, cb_v = _device_codebook(bits, ctx, codebook)
    nb = -(-n // 32)
    packed, packed_v = ctx.empty((nb * bits,), "uint32")
    amax, amax_v = ctx.empty((nb,), "float32")
    amax8, amax8_v = ctx.empty((nb,), "uint8")
    cfg = _quantize_config(device_info(ctx.device).arch.name, bits, dt)
    fn = get_kernel(cfg, ctx.device, ctx.stream).fn("kbit_quantize")
    n_warps = min(-(-nb // 8), device_info(ctx.device).sm_count * 48)  # grid-stride, 6 CTAs/SM
    ctx.launch(fn, _grid(n_warps), (THREADS, 1, 1), (xa, cb_v, packed_v, amax_v, amax8_v, np.int64(n)))
    q = KbitTensor(packed, amax8, amax, cb, tuple(int(s) for s in x.shape), bits, dt)
    object.__setattr__(q, "_cached_views", (ctx.kind, (packed_v, amax8_v, cb_v)))
    return q


def dequantize_kbit(q: KbitTensor, dtype: str | None = None, *, absmax: Any = None,
                    out: Any = None) -> Any:
    """Dequantize to `dtype` (fp16 / bf16 / fp32; default: the dtype that was quantized).

    `absmax` overrides the scales: E4M4 bytes (uint8), fp16 or fp32, one per block.
    `out` (optional) receives the result; it must have q's element count and `dtype`.
    """
    if not isinstance(q, KbitTensor):
        raise ValueError(f"q: expected a KbitTensor from quantize_kbit, got {type(q).__name__}")
    dtype = dtype_name(dtype) or q.dtype
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {FLOAT_DTYPES}")
    ctx = context_of(q.packed, "q.packed")
    packed, absmax8, cb = q._views(ctx)
    if absmax is None:
        sa, sdt = absmax8, "uint8"
    else:
        sa, sdt = device_array(absmax, "absmax", ctx, ("uint8", "float16", "float32"), ndim=1)
        if sa.size != q.n_blocks:
            raise ValueError(f"absmax: {sa.size} scales, {q.n_blocks} blocks need one each")
    if out is None:
        out, out_v = ctx.empty(q.shape, dtype)
    else:
        out_v, _ = device_array(out, "out", ctx, (dtype,), hint=dtype)
        if out_v.size != q.numel:
            raise ValueError(f"out: has {out_v.size} elements, q has {q.numel}")
    cfg = _dequantize_config(device_info(ctx.device).arch.name, q.bits, dtype, _ABSMAX_OF_STORAGE[sdt])
    fn = get_kernel(cfg, ctx.device, ctx.stream).fn("kbit_dequantize")
    n_warps = -(-q.n_blocks // 8)  # 8 blocks per warp step; one step per warp (full grid)
    ctx.launch(fn, _grid(n_warps), (THREADS, 1, 1), (packed, sa, cb, out_v, np.int64(q.numel)))
    return out


def _e4m4(x: Any, name: str, src: str, dst: str, symbol: str) -> Any:
    ctx = context_of(x, name)
    xa, _ = device_array(x, name, ctx, (src,))
    out, out_v = ctx.empty(tuple(xa.shape), dst)
    if xa.size:
        cfg = E4M4Config(arch=device_info(ctx.device).arch.name)
        fn = get_kernel(cfg, ctx.device, ctx.stream).fn(symbol)
        ctx.launch(fn, _grid(-(-xa.size // 32)), (THREADS, 1, 1), (xa, out_v, np.int64(xa.size)))
    return out


def encode_e4m4(x: Any) -> Any:
    """fp32 scales -> E4M4 bytes (round to nearest even, saturating at 31, <=0 and NaN -> 0)."""
    return _e4m4(x, "x", "float32", "uint8", "e4m4_encode")


def decode_e4m4(x: Any) -> Any:
    """E4M4 bytes -> fp32."""
    return _e4m4(x, "x", "uint8", "float32", "e4m4_decode")


def repack_kbit(q: KbitTensor, tile_n: int = 128, tile_k: int = 64) -> KbitTiled:
    """Flat layout of a quantized weight W [N, K] -> a tiled layout [K/tile_k][N/tile_n][tile_n]
    [tile_k/32][bits] (run once at load), for GEMM kernels outside kernelgen: kernelgen's own
    `gemm` takes the KbitLinear of `quantize_weight`, which lays the weight out for its kernels."""
    if not isinstance(q, KbitTensor):
        raise ValueError(f"q: expected a KbitTensor from quantize_kbit, got {type(q).__name__}")
    if len(q.shape) != 2:
        raise ValueError(f"q: repack needs a 2-D weight [N, K], got shape {q.shape}")
    ctx = context_of(q.packed, "q.packed")
    # The config checks tile_n / tile_k (and their types) before they are used as divisors.
    cfg = KbitRepackConfig(arch=device_info(ctx.device).arch.name, bits=q.bits, tile_n=tile_n,
                           tile_k=tile_k)
    n, k = q.shape
    if n % tile_n or k % tile_k:
        raise ValueError(f"q: shape {q.shape}: N must be a multiple of tile_n={tile_n} and K of "
                         f"tile_k={tile_k}")
    packed, sa, _ = q._views(ctx)
    pt, pt_v = ctx.empty((packed.size,), "uint32")
    at, at_v = ctx.empty((sa.size,), "uint8")
    total = n * (k // 32)
    fn = get_kernel(cfg, ctx.device, ctx.stream).fn("kbit_repack")
    ctx.launch(fn, (max(1, -(-total // THREADS)), 1, 1), (THREADS, 1, 1),
               (packed, sa, pt_v, at_v, np.int32(n), np.int32(k)))
    return KbitTiled(pt, at, q.codebook, n, k, q.bits, tile_n, tile_k)
