// E4M4 absmax scale: 4 exponent bits (bias 11), 4 mantissa bits, subnormals, no sign/NaN/Inf.
//   e > 0:  2^(e-11) * (1 + m/16)     range [2^-10, 31]
//   e == 0: 2^-14 * m                 (subnormal; 0x00 is zero)
// Encode rounds to nearest even and saturates to 31 (0xFF); zero, negative and NaN encode to 0.
#pragma once
#include "common/dtypes.cuh"

namespace kg {

__device__ __forceinline__ float e4m4_decode(uint32_t raw) {
  const uint32_t e = (raw >> 4) & 0xF, m = raw & 0xF;
  if (e == 0) return (float)m * (1.0f / 16384.0f);            // exact: m * 2^-14
  return __uint_as_float(((e - 11u + 127u) << 23) | (m << 19));  // build the IEEE bits
}

// Same values as e4m4_decode without a branch: for e == 0 build 2^-10 * (1 + m/16) and subtract
// 2^-10 (exact: the difference m * 2^-14 is representable).
__device__ __forceinline__ float e4m4_decode_nobranch(uint32_t raw) {
  const uint32_t e = (raw >> 4) & 0xF, m = raw & 0xF;
  const float v = __uint_as_float(((max(e, 1u) + 116u) << 23) | (m << 19));
  return e ? v : __fsub_rn(v, 0.0009765625f);
}

__device__ __forceinline__ uint8_t e4m4_encode(float x) {
  if (!(x > 0.0f)) return 0;        // zero, negative, NaN
  if (x >= 31.0f) return 0xFF;      // saturate (also +Inf)
  const uint32_t b = __float_as_uint(x);
  const int e = (int)(b >> 23) - 127 + 11;  // biased E4M4 exponent
  if (e >= 1) {
    // Keep the exponent and 23-bit mantissa together so a mantissa carry bumps the exponent;
    // drop 19 bits with round-to-nearest-even.
    const uint32_t v = ((uint32_t)e << 23) | (b & 0x7FFFFFu);
    const uint32_t r = (v + 0x3FFFFu + ((v >> 19) & 1u)) >> 19;
    return r > 0xFFu ? 0xFF : (uint8_t)r;
  }
  return (uint8_t)rintf(x * 16384.0f);  // subnormal: exact scale, rintf is RNE; 16 -> 0x10 ok
}

// Same bytes as e4m4_encode, without branches (both paths computed, then selected).
__device__ __forceinline__ uint32_t e4m4_encode_nobranch(float x) {
  const uint32_t b = __float_as_uint(x);
  const uint32_t v = b - (116u << 23);  // (e << 23) | mantissa for e = exponent - 127 + 11 >= 1
  const uint32_t rn = min((v + 0x3FFFFu + ((v >> 19) & 1u)) >> 19, 0xFFu);
  // Subnormal (x < 2^-10): rint(x * 2^14) < 16, rounded to nearest even by adding 1.5 * 2^23.
  const uint32_t rs = __float_as_uint(__fmaf_rn(x, 16384.0f, 12582912.0f)) - 0x4B400000u;
  const uint32_t r = x >= 31.0f ? 0xFFu : (b >= 0x3A800000u ? rn : rs);
  return x > 0.0f ? r : 0u;  // zero, negative, NaN -> 0
}

// -- E4M4 block scales applied in T (the kbit GEMV, the kbit experts, the tiled 4-bit GEMV) --
// An E4M4 byte shifted into T's exponent and mantissa fields is its value / 2^4 (fp16) or
// / 2^116 (bf16), E4M4 subnormals landing on T's subnormals: one PRMT and one shift a scale
// pair instead of a decode. The tables hold the codebook (rounded to T) times the same power
// of two, so table entry x scale pair is the exact product W * scale, rounded once in T as
// before (codebook entries below 4096 in magnitude for fp16; the kbit levels lie in [-1, 1]).
template <typename T> struct ScaleBits;
template <> struct ScaleBits<half> {
  static constexpr int SHIFT = 6;
  static constexpr float TABLE = 16.0f;
};
template <> struct ScaleBits<__nv_bfloat16> {
  static constexpr int SHIFT = 3;
  static constexpr float TABLE = 0x1p116f;
};

// codebook value as the tables hold it: rounded to T, times ScaleBits<T>::TABLE (exact)
template <typename T> __device__ __forceinline__ float table_value(float cb) {
  return to_float(from_float<T>(cb)) * ScaleBits<T>::TABLE;
}

// (s, s) / TABLE as a T pair, s = E4M4 byte j of w (j a constant after unrolling).
template <typename T> __device__ __forceinline__ uint32_t scale2(uint32_t w, int j) {
  return __byte_perm(w, 0u, 0x4040u | ((uint32_t)j << 8) | (uint32_t)j) << ScaleBits<T>::SHIFT;
}

// A pair table's entry c holds the codebook indices of two elements with their BITS plane bits
// interleaved (bit 2b + i = plane b of element i): i0 / i1 are element 0's / 1's (the kbit
// GEMV, mma and MoE kbit tables)
template <int BITS> __device__ __forceinline__ void pair_indices(int c, int& i0, int& i1) {
  i0 = i1 = 0;
#pragma unroll
  for (int b = 0; b < BITS; ++b) {
    i0 |= ((c >> (2 * b)) & 1) << b;
    i1 |= ((c >> (2 * b + 1)) & 1) << b;
  }
}

}  // namespace kg
