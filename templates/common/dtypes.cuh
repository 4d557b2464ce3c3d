// Element types and exact conversions shared by every family.
// Conversions are the round-to-nearest-even intrinsics so that results agree bit for bit with
// the NumPy references (which use the same rounding).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NVRTC has no libc headers; fixed-width integer types are spelled out here.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;

namespace kg {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<half>(half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ half from_float<half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Pairs of T = half | __nv_bfloat16 in one 32-bit register (element 0 in the low half).
// (lo, hi) rounded to nearest even.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// (s, s) rounded to nearest even (one conversion, then a move: not pack2(s, s)'s code).
template <typename T> __device__ __forceinline__ uint32_t splat2(float s);
template <> __device__ __forceinline__ uint32_t splat2<half>(float s) {
  const __half2 h = __float2half2_rn(s);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t splat2<__nv_bfloat16>(float s) {
  const __nv_bfloat162 h = __float2bfloat162_rn(s);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// a * s for two T at once, one rounding to nearest: fma with -0 (exact products stay exact,
// -0 * x stays -0; bf16x2 fma exists on sm_80 where bf16x2 mul does not).
template <typename T> __device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t s);
template <> __device__ __forceinline__ uint32_t hmul2<half>(uint32_t a, uint32_t s) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  return r;
}
template <> __device__ __forceinline__ uint32_t hmul2<__nv_bfloat16>(uint32_t a, uint32_t s) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  return r;
}

// Two e4m3 codes (the low and high byte of `x`) -> f16x2 of their values times 2^-8, by integer
// ops: each byte to the high byte of its f16 half, the magnitude bits one place lower, so the
// f16 exponent field is e4m3's (bias 15 against 7; subnormals included). NaN codes (|code|
// 0x7F) come out as the finite 480 * 2^-8: callers check for them (e4m3_nan_bytes).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_scaled(uint16_t x) {
  const uint32_t t = __byte_perm((uint32_t)x, 0u, 0x1404);  // b1 << 24 | b0 << 8
  return (t & 0x80008000u) | ((t >> 1) & 0x3F803F80u);
}

// Bit 7 of each byte of the result: that byte of `w` is an e4m3 NaN (|code| 0x7F).
__device__ __forceinline__ uint32_t e4m3_nan_bytes(uint32_t w) {
  return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

// Two e4m3 codes -> f16x2 of their exact values (NaN stays NaN) without the sm_89+ cvt:
// e4m3x2_to_f16x2_scaled, a NaN half given an all-ones exponent (its flag n = 0x80 moved to bit
// 15 of the half; n - n / 32 = 0x7C00), then one exact multiply by 2^8.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_soft(uint16_t x) {
  const uint32_t n = __byte_perm(e4m3_nan_bytes(x), 0u, 0x1404);
  return hmul2<half>(e4m3x2_to_f16x2_scaled(x) | (n - (n >> 5)), 0x5C005C00u);  // x (256, 256)
}

// (a & m) | (b & ~m): one LOP3 (written as lop3 so that a constant m stays its immediate; the
// plain C form became two LOP3s where b is a shifted value).
__device__ __forceinline__ uint32_t bitsel(uint32_t m, uint32_t a, uint32_t b) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(r) : "r"(m), "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

// Warp-wide max by butterfly: every lane ends with the result (no broadcast needed).
// fmaxf drops NaN operands, so a NaN element never becomes the block's scale.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace kg
