// mx: block-scaled narrow floats (NVFP4, MXFP4, MXFP6, MXFP8).
//
// Element codecs (RNE + saturation, exact integer / fp32 arithmetic, no hardware cvt), packing,
// the E4M3 / E8M0 scale rules and the swizzled scale layout - bit for bit as
// kernelgen/mx/reference.py defines them. The device functions up to "quantize / dequantize
// bodies" are generic and meant for reuse (the scaled GEMMs include this header for decoding).
//
// Needs IEEE fp32 semantics: no --use_fast_math / --ftz (subnormals are part of the formats).
#pragma once
#include "common/dtypes.cuh"
#include "common/ptx.cuh"

namespace kg::mx {

// ---------------------------------------------------------------------------------------------
// Element formats: sign on top, EBITS exponent, MBITS mantissa; subnormals at exponent 0.
// SPECIAL: 0 none, 1 E4M3 "fn" (magnitude 0x7F is NaN), 2 IEEE (top exponent is Inf / NaN).
// EMAX: exponent of the largest normal (OCP emax_elem); MAX_CODE: magnitude code of +max.
// ---------------------------------------------------------------------------------------------
template <int EBITS_, int MBITS_, int EMAX_, int MAX_CODE_, int SPECIAL_>
struct Elem {
  static constexpr int EBITS = EBITS_, MBITS = MBITS_, EMAX = EMAX_, SPECIAL = SPECIAL_;
  static constexpr int BITS = 1 + EBITS + MBITS;
  static constexpr int BIAS = (1 << (EBITS - 1)) - 1;
  static constexpr uint32_t MAX_CODE = MAX_CODE_;
  static constexpr uint32_t MAG_MASK = (1u << (BITS - 1)) - 1;
};
using E2M1 = Elem<2, 1, 2, 0x07, 0>;   // max 6
using E2M3 = Elem<2, 3, 2, 0x1F, 0>;   // max 7.5
using E3M2 = Elem<3, 2, 4, 0x1F, 0>;   // max 28
using E4M3 = Elem<4, 3, 8, 0x7E, 1>;   // max 448
using E5M2 = Elem<5, 2, 15, 0x7B, 2>;  // max 57344

template <class A, class B> struct same_type { static constexpr bool value = false; };
template <class A> struct same_type<A, A> { static constexpr bool value = true; };

constexpr float FLT_MAX_F = 3.40282346638528859812e+38f;

__host__ __device__ constexpr float pow2f(int e) { return e >= 0 ? float(1ull << e) : 1.0f / float(1ull << -e); }

// Largest finite value of F (the saturation bound).
template <class F> __host__ __device__ constexpr float max_value() {
  return float((1 << F::MBITS) + (F::MAX_CODE & ((1u << F::MBITS) - 1))) *
         pow2f(F::EMAX - F::MBITS);
}

// t = min(|v|, max) >= 0 (not NaN) -> magnitude code, round to nearest even. With e the
// exponent of t (at least emin), one RN fp32 add of 2^(e + 23 - MBITS) - a number whose ulp is
// the step of F in that binade - rounds t exactly; the code is linear in the rounded value within
// the binade, and a carry into the next binade lands on the right code.
template <class F> __device__ __forceinline__ uint32_t encode_mag(float t) {
  constexpr uint32_t EMIN_FIELD = uint32_t(127 + 1 - F::BIAS);  // fp32 exponent field of 2^emin
  const uint32_t eb = max(__float_as_uint(t) & 0x7f800000u, EMIN_FIELD << 23);
  const uint32_t magic = eb + (uint32_t(23 - F::MBITS) << 23);
  const uint32_t r = __float_as_uint(__fadd_rn(t, __uint_as_float(magic))) - magic;
  return r + (eb >> (23 - F::MBITS)) - (EMIN_FIELD << F::MBITS);
}

// fp32 (not NaN) -> code with sign, RNE, saturating to +-max (Inf too); -0 keeps its sign, as
// the reference's signbit does.
template <class F> __device__ __forceinline__ uint32_t encode(float v) {
  const uint32_t mag = encode_mag<F>(fminf(fabsf(v), max_value<F>()));
  return mag | ((__float_as_uint(v) >> (32 - F::BITS)) & (1u << (F::BITS - 1)));
}

// code (low BITS bits) -> fp32, exact. The code shifted into fp32's field layout is the value
// times 2^(BIAS - 127), subnormals included (fp32 subnormal times a power of two is exact).
template <class F> __device__ __forceinline__ float decode(uint32_t code) {
  const uint32_t mag = code & F::MAG_MASK;
  float v = __fmul_rn(__uint_as_float(mag << (23 - F::MBITS)),
                      __uint_as_float(uint32_t(254 - F::BIAS) << 23));
  if constexpr (F::SPECIAL == 1) {
    if (mag == F::MAG_MASK) v = __uint_as_float(0x7fc00000u);
  } else if constexpr (F::SPECIAL == 2) {
    if ((mag >> F::MBITS) == (1u << F::EBITS) - 1)
      v = __uint_as_float((mag & ((1u << F::MBITS) - 1)) ? 0x7fc00000u : 0x7f800000u);
  }
  return __uint_as_float(__float_as_uint(v) | (((code >> (F::BITS - 1)) & 1u) << 31));
}

// Two E2M1 codes (byte; element 0 in the low nibble) -> half2 {e0, e1}, exact: fp16 with
// exponent field e and mantissa m << 9, times 2^14, is E2M1 (e, m) (0.5 as an fp16 subnormal).
__device__ __forceinline__ __half2 e2m1x2_to_half2(uint32_t byte) {
  const uint32_t h = ((byte & 7u) << 9) | ((byte & 8u) << 12) | ((byte & 0x70u) << 21) |
                     ((byte & 0x80u) << 24);
  __half2 r;
  *reinterpret_cast<uint32_t*>(&r) = h;
  return __hmul2(r, __float2half2_rn(16384.0f));
}

// E8M0 byte -> fp32 2^(c - 127); 0x00 is 2^-127 (an fp32 subnormal), 0xFF is NaN.
__device__ __forceinline__ float e8m0_decode(uint32_t c) {
  return __uint_as_float(c == 0xFFu ? 0x7fc00000u : c == 0u ? 0x00400000u : c << 23);
}

// OCP shared exponent: amax (finite, as fp32 bits) -> E8M0 code floor(log2 amax) - EMAX + 127,
// clamped at 0 (zero and fp32 subnormals give 0).
template <int EMAX> __device__ __forceinline__ uint32_t e8m0_floor(uint32_t amax_bits) {
  return uint32_t(max(int(amax_bits >> 23) - EMAX, 0));
}

// 2^(127 - c) as fp32 for an E8M0 code c <= 252: the exact element multiplier x / 2^(c-127).
__device__ __forceinline__ float e8m0_inverse(uint32_t c) {
  return __uint_as_float((254u - c) << 23);
}

// Byte offset of scale (row r, scale column c) in the swizzled layout
// [ceil(rows/128), k_tiles, 32, 4, 4]: 512-byte tile (r/128, c/4), then (r%32, r/32%4, c%4).
__device__ __forceinline__ long long swizzled_offset(int r, int c, int k_tiles) {
  return ((long long)(r >> 7) * k_tiles + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 +
         (c & 3);
}

// ---------------------------------------------------------------------------------------------
// Packing: codes c[E] (low BITS bits) <-> little-endian words; element i at bits [BITS*i, +BITS)
// of the byte stream (fp4: 2j in the low nibble; fp6: 4 values per 3 bytes; fp8: one per byte).
// ---------------------------------------------------------------------------------------------
template <int BITS, int E> struct Pack {
  static constexpr int WORDS = BITS * E / 32;
  static_assert(BITS * E % 32 == 0, "a lane's codes fill whole 32-bit words");
  static __device__ __forceinline__ void pack(const uint32_t (&c)[E], uint32_t (&w)[WORDS]) {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) w[i] = 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int pos = BITS * i, word = pos / 32, sh = pos % 32;
      w[word] |= c[i] << sh;
      if (sh + BITS > 32) w[word + 1] |= c[i] >> (32 - sh);
    }
  }
  static __device__ __forceinline__ void unpack(const uint32_t (&w)[WORDS], uint32_t (&c)[E]) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int pos = BITS * i, word = pos / 32, sh = pos % 32;
      uint32_t v = w[word] >> sh;
      if (sh + BITS > 32) v |= w[word + 1] << (32 - sh);
      c[i] = v & ((1u << BITS) - 1);
    }
  }
};

// Global stores / loads of a lane's packed words (4-byte aligned; 8-byte aligned for 2 words).
template <int W> __device__ __forceinline__ void store_words(uint8_t* p, const uint32_t (&w)[W]) {
  if constexpr (W == 2) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else if constexpr (W == 4) {
    st_v4(p, w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) reinterpret_cast<uint32_t*>(p)[i] = w[i];
  }
}
template <int W> __device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[W]) {
  if constexpr (W == 2) {
    const uint2 v = ld_nc_v2(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = ld_nc_u32(p + 4 * i);
  }
}

// ---------------------------------------------------------------------------------------------
// Input / output vectors: E consecutive elements of one row, as 16-byte accesses.
// ---------------------------------------------------------------------------------------------
template <typename T, int E> struct InVec {
  static constexpr int VECS = E * (int)sizeof(T) / 16;
  uint4 raw[VECS];
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int v = 0; v < VECS; ++v) raw[v] = ld_nc_v4(reinterpret_cast<const uint4*>(p) + v);
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int v = 0; v < VECS; ++v) raw[v] = make_uint4(0, 0, 0, 0);
  }
  // max |x| as fp32 bits (NaN / Inf give >= 0x7f800000); 16-bit inputs compare their raw pairs
  // (sign cleared, the bit order of magnitudes) and convert the winner once.
  __device__ __forceinline__ uint32_t abs_max_bits() const {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(raw);
    uint32_t m = 0;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < VECS * 4; ++i) m = max(m, w[i] & 0x7fffffffu);
      return m;
    } else {
#pragma unroll
      for (int i = 0; i < VECS * 4; ++i) m = __vmaxu2(m, w[i] & 0x7fff7fffu);
      const uint32_t h = max(m & 0xffffu, m >> 16);
      if constexpr (same_type<T, half>::value) {
        return __float_as_uint(__half2float(__ushort_as_half((unsigned short)h)));
      } else {
        return h << 16;
      }
    }
  }
  __device__ __forceinline__ void to_float(float (&f)[E]) const {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
    for (int i = 0; i < VECS * 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        f[i] = __uint_as_float(w[i]);
      } else if constexpr (same_type<T, half>::value) {
        __half2 h;
        *reinterpret_cast<uint32_t*>(&h) = w[i];
        const float2 p = __half22float2(h);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
      } else {  // bf16: the high half of an fp32
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
    }
  }
};

template <typename T, int E> __device__ __forceinline__ void store_out(T* p, const float (&v)[E]) {
  static_assert(E % 8 == 0, "whole 16-byte stores of 16-bit outputs");
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < E; i += 4)
      st_v4(p + i, __float_as_uint(v[i]), __float_as_uint(v[i + 1]), __float_as_uint(v[i + 2]),
            __float_as_uint(v[i + 3]));
  } else {
#pragma unroll
    for (int i = 0; i < E; i += 8) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (same_type<T, half>::value) {
          const __half2 h = __floats2half2_rn(v[i + 2 * j], v[i + 2 * j + 1]);
          w[j] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
          const __nv_bfloat162 h = __floats2bfloat162_rn(v[i + 2 * j], v[i + 2 * j + 1]);
          w[j] = *reinterpret_cast<const uint32_t*>(&h);
        }
      }
      st_v4(p + i, w[0], w[1], w[2], w[3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantize / dequantize bodies.
//
// Index space ("slots"): a slot is E consecutive elements of one row, owned by one lane; L = GROUP
// / E lanes share a scale group. Rows run over [0, rows); slots per row cover the scale columns
// padded to 4 in the swizzled layout (padding columns hold zeros, so their scale byte is 0x00),
// so the 4 groups of a 4-byte scale word sit in 4L adjacent lanes of one warp and one lane stores
// the word. Padding rows [rows, ceil128(rows)) are zero-filled by a separate grid-stride loop.
// ---------------------------------------------------------------------------------------------
struct Shape {
  int rows, k;
  int s;              // scale columns K / GROUP
  int k_tiles;        // ceil(s / 4)
  int slots_per_row;  // (swizzled ? 4 * k_tiles : s) * L
  uint32_t total;     // rows * slots_per_row (< 2^31, checked on the host)
  long long pad_words;  // 4-byte scale words of the padding rows (swizzled only)
  bool swizzled;
  bool linear;  // no padding columns: slot idx holds elements [idx * E, +E) of the flat input
  bool tiled;   // scale mode 2: chunks in sector order, scales staged (see Tiling)

  template <int GROUP, int E>
  __device__ __forceinline__ static Shape make(int rows, int k, int swizzled) {
    Shape sh;
    sh.rows = rows;
    sh.k = k;
    sh.s = k / GROUP;
    sh.k_tiles = (sh.s + 3) >> 2;
    sh.swizzled = swizzled != 0;
    sh.tiled = swizzled == 2;
    sh.slots_per_row = (sh.swizzled ? 4 * sh.k_tiles : sh.s) * (GROUP / E);
    sh.total = uint32_t(rows) * uint32_t(sh.slots_per_row);
    sh.pad_words = sh.swizzled && !sh.tiled
                       ? (long long)(((rows + 127) & ~127) - rows) * sh.k_tiles : 0;
    sh.linear = sh.slots_per_row * E == k;
    return sh;
  }
};

struct SlotPos {
  uint32_t row;
  int j;  // slot within the row
};

// Max |x| as fp32 bits over finite values only (the NVFP4 global amax ignores NaN / Inf).
template <int E> __device__ __forceinline__ uint32_t finite_max_bits(const float (&v)[E]) {
  uint32_t a = 0;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const uint32_t b = __float_as_uint(v[i]) & 0x7fffffffu;
    a = max(a, b < 0x7f800000u ? b : 0u);
  }
  return a;
}

// NVFP4 global scale from the finite amax (fp32 bits): 2688 / amax, 1 if amax == 0, FLT_MAX cap.
__device__ __forceinline__ float nvfp4_global_scale(uint32_t amax_bits) {
  if (amax_bits == 0) return 1.0f;
  return fminf(__fdiv_rn(2688.0f, __uint_as_float(amax_bits)), FLT_MAX_F);
}

// One slot: quantize E values of a lane (all lanes of the warp call this together: shuffles).
// Returns the group's scale byte; writes the lane's packed words.
// Two fp32 -> two E4M3 / E5M2 codes (lo in the low byte) with the sm_89+ cvt (RNE, satfinite);
// the GPU tests check it against the reference like the integer path.
template <class F> __device__ __forceinline__ uint32_t cvt_fp8x2(float lo, float hi) {
  uint16_t r = 0;
#if __CUDA_ARCH__ >= 890
  if constexpr (F::EBITS == 4) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
#endif
  return r;
}

// ---------------------------------------------------------------------------------------------
// Packed 16-bit encoders (MX fp4 / fp6 elements, fp16 / bf16 inputs): two elements a 32-bit word.
//
// Exactness. The MX element is encode(x * 2^k), k = 127 - scale code, |x * 2^k| < 2^(EMAX + 1)
// by the floor rule. (1) x * 2^k in the input's own 16-bit format is exact or harmless: scaling
// up never loses bits (no overflow: the result is < 2^(EMAX+1) <= 32); scaling down loses bits
// only where the result is below the format's normal range (fp16 2^-14, bf16 2^-126), far below
// half the smallest element step (>= 2^-5), so the result and the exact value both encode to a
// signed zero (RN keeps the sign). fp16 holds 2^k only for k <= 15: every fp16 group multiplies
// by 2^min(k, 15), then by 2^max(k - 15, 0) (1 unless k > 15, a group below 2^(EMAX - 15); then
// both scale up). k >= EMAX - 15 for fp16 (amax <= 65504; k <= EMAX + 24 as amax >= 2^-24 or
// the group is zero, clamped) and >= -125 for bf16, so 2^k (fp16: 2^min(k, 15) and
// 2^max(k - 15, 0)) is a normal number of the format.
// (2) t = min(|y|, max) and e1 = max(t, 2^emin) are exact; eb = e1's exponent field (per lane).
// (3) magic = 2^(e + MANT - MBITS) (eb plus a constant): t < 2^(e+1) <= magic / 2^(MANT-MBITS-1),
// so t + magic lies in [magic, 2 magic), whose ulp is 2^(e - MBITS), the element step in binade e;
// one RN add (HADD2, RNE) rounds t to that step, ties to even because magic / ulp = 2^MANT is even.
// (4) r = bits(s) - bits(magic) = RN(t) / step; the code is r + (e - emin) 2^MBITS, a carry into
// the next binade (r = 2^(MBITS+1)) landing on the right code, exactly as encode_mag does in fp32.
// (5) Lanes: every per-lane result is in [0, 2^16) and the word arithmetic is + / - / shifts by
// < MANT of fields that start at bit MANT, so 32-bit modular arithmetic on the pair is the two
// lanes' arithmetic. tests/mx/test_h2_codec.py replays these steps bit for bit in NumPy over
// every fp16 / bf16 value and every k against reference.encode.
// ---------------------------------------------------------------------------------------------
template <typename T> struct H16;
template <> struct H16<half> {
  static constexpr int MANT = 10, BIAS = 15;
  using T2 = __half2;
};
template <> struct H16<__nv_bfloat16> {
  static constexpr int MANT = 7, BIAS = 127;
  using T2 = __nv_bfloat162;
};
template <typename T> struct is_h16 { static constexpr bool value = false; };
template <> struct is_h16<half> { static constexpr bool value = true; };
template <> struct is_h16<__nv_bfloat16> { static constexpr bool value = true; };

constexpr uint32_t LANES2 = 0x00010001u;  // a 16-bit constant in both lanes

template <typename T> __device__ __forceinline__ typename H16<T>::T2 as_t2(uint32_t w) {
  typename H16<T>::T2 r;
  *reinterpret_cast<uint32_t*>(&r) = w;
  return r;
}
template <typename T2> __device__ __forceinline__ uint32_t t2_bits(T2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Bits (one lane) of F's largest finite value and of 2^emin in the 16-bit format T.
template <class F, typename T> __host__ __device__ constexpr uint32_t h16_max_bits() {
  return (uint32_t((F::MAX_CODE >> F::MBITS) - F::BIAS + H16<T>::BIAS) << H16<T>::MANT) |
         ((F::MAX_CODE & ((1u << F::MBITS) - 1)) << (H16<T>::MANT - F::MBITS));
}
template <class F, typename T> __host__ __device__ constexpr uint32_t h16_emin_field() {
  return uint32_t(H16<T>::BIAS + 1 - F::BIAS);
}

// y: two scaled elements (x * 2^k, see above) -> two codes with sign, lane 0 in bits [0, BITS),
// lane 1 in bits [16, 16 + BITS).
template <class F, typename T> __device__ __forceinline__ uint32_t encode_h2(uint32_t y) {
  constexpr int MANT = H16<T>::MANT, SH = MANT - F::MBITS;
  constexpr uint32_t EXP = ((1u << (15 - MANT)) - 1) << MANT;
  constexpr uint32_t EMIN = h16_emin_field<F, T>();
  const auto t = __hmin2(__habs2(as_t2<T>(y)), as_t2<T>(h16_max_bits<F, T>() * LANES2));
  const uint32_t eb = t2_bits(__hmax2(t, as_t2<T>((EMIN << MANT) * LANES2))) & (EXP * LANES2);
  constexpr uint32_t MAGIC = (uint32_t(SH) << MANT) * LANES2, C = (EMIN << F::MBITS) * LANES2;
  const uint32_t s = t2_bits(__hadd2_rn(t, as_t2<T>(eb + MAGIC)));
  const uint32_t code = (s - eb - (MAGIC + C)) + (eb >> SH);  // s - magic + (eb >> SH) - C
  return code | ((y >> (16 - F::BITS)) & ((1u << (F::BITS - 1)) * LANES2));
}

// Pair words p[i] = codes of elements 2i, 2i+1 (lanes) -> the packed little-endian words.
template <int BITS, int E>
__device__ __forceinline__ void pack_pairs(const uint32_t (&p)[E / 2],
                                           uint32_t (&w)[Pack<BITS, E>::WORDS]) {
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      uint32_t q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = p[4 * i + j] + (p[4 * i + j] >> 12);  // byte 0: e0 | e1 << 4
      w[i] = __byte_perm(__byte_perm(q[0], q[1], 0x5540), __byte_perm(q[2], q[3], 0x5540), 0x5410);
    }
  } else {
    uint32_t c[E];
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      c[2 * i] = p[i] & 0xffffu;
      c[2 * i + 1] = p[i] >> 16;
    }
    Pack<BITS, E>::pack(c, w);
  }
}

// One MX slot of a 16-bit input by the packed encoders (all lanes of the warp together:
// shuffles). Returns the group's scale byte; writes the lane's packed words.
template <class F, typename T, int E, int L>
__device__ __forceinline__ uint32_t quantize_slot_h2(const InVec<T, E>& in,
                                                     uint32_t (&w)[Pack<F::BITS, E>::WORDS]) {
  uint32_t amax = in.abs_max_bits();
#pragma unroll
  for (int o = 1; o < L; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool bad = amax >= 0x7f800000u;  // NaN or Inf in the group
  const uint32_t code = e8m0_floor<F::EMAX>(amax);
  int k = bad ? 0 : 127 - int(code);  // elements times 2^k
  // fp16: k <= EMAX + 24 but for an all-zero group (code 0): any k serves, keep 2^(k-15) finite
  if constexpr (same_type<T, half>::value) k = min(k, F::EMAX + 24);
  const uint32_t* x = reinterpret_cast<const uint32_t*>(in.raw);
  uint32_t y[E / 2];
  if constexpr (same_type<T, half>::value) {
    // 2^k is an fp16 only up to k = 15 (k >= -13: amax <= 65504): times 2^min(k, 15), then
    // 2^max(k - 15, 0). Both products are exact where a second one is not 1 (k > 15: |x| <
    // 2^(EMAX + 1 - k), so x 2^15 and x 2^k stay below 2^(EMAX + 1): powers of two, no
    // overflow), and for k <= 15 the first is the one multiply x 2^k: no branch, the same bits
    // (a branch on k > 15 made the sector-order kernel ~7% slower than bf16's on the H100).
    const auto m1 = as_t2<T>((uint32_t(min(k, 15) + 15) << 10) * LANES2);
    const auto m2 = as_t2<T>((uint32_t(max(k - 15, 0) + 15) << 10) * LANES2);
#pragma unroll
    for (int i = 0; i < E / 2; ++i) y[i] = t2_bits(__hmul2_rn(__hmul2_rn(as_t2<T>(x[i]), m1), m2));
  } else {
    const auto m = as_t2<T>((uint32_t(k + 127) << 7) * LANES2);
#pragma unroll
    for (int i = 0; i < E / 2; ++i) y[i] = t2_bits(__hmul2_rn(as_t2<T>(x[i]), m));
  }
  uint32_t p[E / 2];
#pragma unroll
  for (int i = 0; i < E / 2; ++i) p[i] = encode_h2<F, T>(y[i]);
  pack_pairs<F::BITS, E>(p, w);
  const uint32_t keep = bad ? 0u : 0xffffffffu;
#pragma unroll
  for (int i = 0; i < Pack<F::BITS, E>::WORDS; ++i) w[i] &= keep;
  return bad ? 0xFFu : code;
}

// Two fp32 -> fp16x2 rounded to odd (lane 0 from lo): truncation (cvt.rz) of y with bit 13 - the
// fp16 lsb of a normal result - OR-ed with the sticky bit of the 13 bits below it (bit 13 of
// (y + 0x1fff) ^ y is that bit: a carry into bit 13 happens iff a lower bit is set). Exact round
// to odd for results in fp16's normal range; below it (< 2^-14) the result stays below 2^-14.
__device__ __forceinline__ uint32_t f32x2_to_f16x2_odd(float lo, float hi) {
  uint32_t a = __float_as_uint(lo), b = __float_as_uint(hi), r;
  a |= ((a + 0x1fffu) ^ a) & 0x2000u;
  b |= ((b + 0x1fffu) ^ b) & 0x2000u;
  asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(b)), "f"(__uint_as_float(a)));
  return r;
}

// One NVFP4 slot of a 16-bit input (L = 1: the lane is its group). The elements are the
// reference's y = RN(x * mult) in fp32, rounded to odd into fp16 and encoded by encode_h2.
// Exact: an E2M1 code depends on which side of each E2M1 midpoint (and grid point) y lies; those
// are fp16 numbers with an even last bit; y in fp16 gives itself, else its odd rounding lies
// strictly between the same two consecutive fp16 numbers as y, so on the same side of every
// midpoint (the classic round-to-odd argument); |y| < 2^-14 encodes to a signed zero either way;
// past 65504 the truncation gives 65504 (cvt.rz never makes Inf; Inf stays Inf): both saturate.
// tests/mx/test_h2_codec.py replays it in NumPy (every 16-bit x, many kinds of multiplier).
template <typename T, int E>
__device__ __forceinline__ uint32_t quantize_slot_nv_h2(const InVec<T, E>& in, float gs,
                                                        uint32_t (&w)[Pack<4, E>::WORDS]) {
  const uint32_t amax = in.abs_max_bits();
  const bool bad = amax >= 0x7f800000u;  // NaN or Inf in the group
  const float sf32 = __fmul_rn(__fdiv_rn(__uint_as_float(amax), 6.0f), gs);
  const uint32_t sf = encode_mag<E4M3>(fminf(sf32, max_value<E4M3>()));  // sf32 >= 0
  const float sfv = decode<E4M3>(sf);
  const float mult = sfv > 0.0f ? fminf(__fdiv_rn(gs, sfv), FLT_MAX_F) : 0.0f;
  float v[E];
  in.to_float(v);
  uint32_t p[E / 2];
#pragma unroll
  for (int i = 0; i < E / 2; ++i)
    p[i] = encode_h2<E2M1, half>(
        f32x2_to_f16x2_odd(__fmul_rn(v[2 * i], mult), __fmul_rn(v[2 * i + 1], mult)));
  pack_pairs<4, E>(p, w);
  const uint32_t keep = bad ? 0u : 0xffffffffu;
#pragma unroll
  for (int i = 0; i < Pack<4, E>::WORDS; ++i) w[i] &= keep;
  return bad ? 0x7Fu : sf;
}

// HW: encode fp8 elements with cvt_fp8x2 (MXFP8 on sm_89+), else exact integer arithmetic.
template <class F, bool NV, int E, int L, bool HW = false>
__device__ __forceinline__ uint32_t quantize_slot(const float (&v)[E], uint32_t amax, float gs,
                                                  uint32_t (&w)[Pack<F::BITS, E>::WORDS]) {
  // amax: the lane's max |x| as fp32 bits; reduced over the group's L lanes here
#pragma unroll
  for (int o = 1; o < L; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool bad = amax >= 0x7f800000u;  // NaN or Inf in the group
  uint32_t sbyte;
  float mult;
  if constexpr (NV) {
    // sf = E4M3(RN(RN(amax / 6) * gs)); elements scaled by min(RN(gs / sf), FLT_MAX) (0 if sf 0)
    const float sf32 = __fmul_rn(__fdiv_rn(__uint_as_float(amax), 6.0f), gs);
    const uint32_t sf = encode_mag<E4M3>(fminf(sf32, max_value<E4M3>()));  // sf32 >= 0
    const float sfv = decode<E4M3>(sf);
    mult = sfv > 0.0f ? fminf(__fdiv_rn(gs, sfv), FLT_MAX_F) : 0.0f;
    sbyte = bad ? 0x7Fu : sf;
  } else {
    const uint32_t code = e8m0_floor<F::EMAX>(amax);
    mult = e8m0_inverse(bad ? 127u : code);
    sbyte = bad ? 0xFFu : code;
  }
  // Encode unconditionally (no per-element branch) and clear the words of a NaN / Inf group.
  if constexpr (HW && F::BITS == 8) {
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      const uint32_t lo = cvt_fp8x2<F>(__fmul_rn(v[4 * i], mult), __fmul_rn(v[4 * i + 1], mult));
      const uint32_t hi = cvt_fp8x2<F>(__fmul_rn(v[4 * i + 2], mult), __fmul_rn(v[4 * i + 3], mult));
      w[i] = lo | (hi << 16);
    }
  } else {
    uint32_t c[E];
#pragma unroll
    for (int i = 0; i < E; ++i) c[i] = encode<F>(__fmul_rn(v[i], mult));
    Pack<F::BITS, E>::pack(c, w);
  }
  const uint32_t keep = bad ? 0u : 0xffffffffu;
#pragma unroll
  for (int i = 0; i < Pack<F::BITS, E>::WORDS; ++i) w[i] &= keep;
  return sbyte;
}

// Quantize the U slots idx[u] whose inputs are already loaded (the caller issues all loads
// first, so U * 16-byte loads per thread are in flight). Writes data and scale bytes.
// Byte offset of swizzled_offset in 32 bits (the host keeps the scale tensor below 2^31 bytes).
__device__ __forceinline__ uint32_t swizzled_offset32(uint32_t r, uint32_t c, uint32_t k_tiles) {
  return ((r >> 7) * k_tiles + (c >> 2)) * 512u + (r & 31u) * 16u + ((r >> 5) & 3u) * 4u + (c & 3u);
}

// LIN (sh.linear): slot idx's input and output bytes follow from idx alone (no row / column
// arithmetic, no padding-column tests); pos is then needed for the scale bytes only.
// TILED: the scale words go to the chunk's stage in shared memory (see Tiling), not to global.
template <typename T, class F, bool NV, int GROUP, int E, int U, bool HW = false, bool H2 = false,
          bool LIN = false, bool TILED = false>
__device__ __forceinline__ void quantize_slots(const InVec<T, E> (&in)[U], const uint32_t (&idx)[U],
                                               const SlotPos (&pos)[U], int u_count,
                                               const Shape& sh, float gs,
                                               uint8_t* __restrict__ data,
                                               uint8_t* __restrict__ scales,
                                               uint32_t* stage = nullptr, uint32_t spc = 0) {
  constexpr int L = GROUP / E;
  constexpr int WORDS = Pack<F::BITS, E>::WORDS;
  const long long row_bytes = (long long)sh.k * F::BITS / 8;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u >= u_count) break;  // uniform: the launch covers u_count slots per thread
    const bool in_range = idx[u] < sh.total;
    const uint32_t row = pos[u].row;
    const int j = pos[u].j;
    const int col = j * E;
    uint32_t w[WORDS];
    uint32_t sbyte;
    if constexpr (H2 && NV) {
      sbyte = quantize_slot_nv_h2<T, E>(in[u], gs, w);
    } else if constexpr (H2) {
      sbyte = quantize_slot_h2<F, T, E, L>(in[u], w);
    } else {
      float v[E];
      in[u].to_float(v);
      sbyte = quantize_slot<F, NV, E, L, HW>(v, in[u].abs_max_bits(), gs, w);
    }
    if constexpr (LIN) {
      if (in_range) store_words<WORDS>(data + (size_t)idx[u] * (E * F::BITS / 8), w);
    } else {
      if (in_range && col < sh.k) store_words<WORDS>(data + row * row_bytes + col * F::BITS / 8, w);
    }
    const int g = j / L;
    if (TILED || sh.swizzled) {  // the 4 groups' bytes as one word, in the leading lane
      uint32_t word = sbyte << (8 * (g & 3));
      word |= __shfl_xor_sync(0xffffffffu, word, L);
      word |= __shfl_xor_sync(0xffffffffu, word, 2 * L);
      if constexpr (TILED) {  // rows past the input (padding rows of the last tile) stage zeros
        if (j % (4 * L) == 0)
          stage[((uint32_t(j) % spc) / (4 * L)) * 8 + (row & 1u) * 4 + ((row >> 5) & 3u)] =
              in_range ? word : 0u;
      } else if (in_range && j % (4 * L) == 0) {
        *reinterpret_cast<uint32_t*>(scales + swizzled_offset32(row, g, sh.k_tiles)) = word;
      }
    } else if (in_range && j % L == 0) {
      scales[row * uint32_t(sh.s) + uint32_t(g)] = (uint8_t)sbyte;
    }
  }
}

// Slot index -> (row, slot in row) and the input pointer (nullptr when the slot holds no input:
// out of range or a padding column).
template <typename T, int E>
__device__ __forceinline__ const T* slot_input(const T* x, uint32_t idx, const Shape& sh,
                                               SlotPos& pos) {
  pos.row = idx / uint32_t(sh.slots_per_row);
  pos.j = int(idx - pos.row * uint32_t(sh.slots_per_row));
  if (idx >= sh.total) {
    pos.row = 0;
    pos.j = 0;
    return nullptr;
  }
  const int col = pos.j * E;
  return col < sh.k ? x + (long long)pos.row * sh.k + col : nullptr;
}

// (row, slot) of slot idx + d given those of idx and d = divmod(delta, slots_per_row): no
// division (p.j, d.j < slots_per_row).
__device__ __forceinline__ SlotPos add_pos(SlotPos p, SlotPos d, int slots_per_row) {
  p.row += d.row;
  p.j += d.j;
  if (p.j >= slots_per_row) {
    p.j -= slots_per_row;
    ++p.row;
  }
  return p;
}

// Loads of the u_count slots base + u * THREADS (u < u_count) of a thread; p0: (row, slot) of
// base, du: of THREADS. Out-of-range slots and padding columns load zeros (their pos is unused).
template <typename T, int E, int U, int THREADS, bool LIN = false>
__device__ __forceinline__ void load_slots(const T* __restrict__ x, uint32_t base, SlotPos p0,
                                           SlotPos du, int u_count, const Shape& sh,
                                           uint32_t (&idx)[U], SlotPos (&pos)[U],
                                           InVec<T, E> (&in)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    idx[u] = u < u_count ? base + uint32_t(u * THREADS) : 0xffffffffu;
    pos[u] = u == 0 ? p0 : add_pos(pos[u > 0 ? u - 1 : 0], du, sh.slots_per_row);
    if constexpr (LIN) {
      if (idx[u] < sh.total) in[u].load(x + (size_t)idx[u] * E);
      else in[u].zero();
    } else {
      const int col = pos[u].j * E;
      if (idx[u] < sh.total && col < sh.k) in[u].load(x + (long long)pos[u].row * sh.k + col);
      else in[u].zero();
    }
  }
}

// Zero the scale words of the padding rows [rows, ceil128(rows)) (swizzled layout).
__device__ __forceinline__ void zero_padding_rows(const Shape& sh, uint8_t* __restrict__ scales,
                                                  long long tid, long long nthreads) {
  for (long long i = tid; i < sh.pad_words; i += nthreads) {  // pad_words < 128 * k_tiles
    const int r = sh.rows + int(uint32_t(i) / uint32_t(sh.k_tiles));
    const int q = int(uint32_t(i) % uint32_t(sh.k_tiles));
    *reinterpret_cast<uint32_t*>(scales + swizzled_offset(r, 4 * q, sh.k_tiles)) = 0u;
  }
}

// Block-wide max of a uint32 (every thread gets it). Uses smem[32]; ends with a barrier.
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) v = max(v, smem[i]);
  __syncthreads();
  return v;
}

// Finite amax (fp32 bits) of this thread's share of n16 16-byte vectors: start, start + stride, ...
template <typename T, int THREADS>
__device__ __forceinline__ uint32_t finite_amax_strided(const T* __restrict__ x, long long n16,
                                                        long long start, long long stride) {
  constexpr int E = 16 / sizeof(T);
  constexpr int UNROLL = 4;
  uint32_t a = 0;
  for (long long i = start; i < n16; i += UNROLL * stride) {
    InVec<T, E> in[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (i + u * stride < n16) in[u].load(x + (i + u * stride) * E); else in[u].zero();
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float v[E];
      in[u].to_float(v);
      a = max(a, finite_max_bits(v));
    }
  }
  return a;
}

// Finite amax of n16 16-byte vectors of x, one partial (fp32 bits) per block.
template <typename T, int THREADS>
__device__ __forceinline__ void amax_partials(const T* __restrict__ x, uint32_t* partials,
                                              long long n16) {
  __shared__ uint32_t red[32];
  const uint32_t a = finite_amax_strided<T, THREADS>(
      x, n16, (long long)blockIdx.x * THREADS + threadIdx.x, (long long)gridDim.x * THREADS);
  const uint32_t m = block_max(a, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// The NVFP4 global scale of gs_mode (see quantize_impl); block 0 writes it to gs_out. Modes 2
// and 3 end with a block barrier (every thread of the block calls this).
template <typename T, int THREADS>
__device__ __forceinline__ float global_scale(const T* __restrict__ x, const float* gs_in,
                                              const uint32_t* partials, float* gs_out,
                                              float gs_val, int gs_mode, int n_partials, int rows,
                                              int k) {
  float gs;
  if (gs_mode == 0) {
    gs = gs_val;
  } else if (gs_mode == 1) {
    gs = *gs_in;
  } else if (gs_mode == 2) {
    __shared__ uint32_t red[32];
    uint32_t a = 0;
    for (int i = threadIdx.x; i < n_partials; i += THREADS) a = max(a, partials[i]);
    gs = nvfp4_global_scale(block_max(a, red));
  } else {  // 3: every block reduces the whole (small, L2-resident) input itself
    __shared__ uint32_t red[32];
    gs = nvfp4_global_scale(block_max(
        finite_amax_strided<T, THREADS>(x, (long long)rows * k * sizeof(T) / 16, threadIdx.x,
                                        THREADS), red));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *gs_out = gs;
  return gs;
}

// Sector order (scale mode 2, sh.tiled; swizzled scales, no padding columns, u_count = U). Chunk
// c holds the 8 rows 2i + {0, 1} + 32 * {0, 1, 2, 3} of 128-row tile mt, SPC = THREADS * U / 8
// slots of each from column slot cb * SPC (c = (mt * 16 + i) * ncb + cb, cb fastest; chunks
// cover the padding rows of the last tile). Those rows' scale bytes of any 4 scale columns (4 L
// slots) are one whole 32-byte sector of the swizzled layout, so a chunk's NQ = SPC / (4 L)
// sectors are assembled in shared memory and stored whole. In the plain order a warp covers 32
// slots of one row and writes one 4-byte piece of each of its 8 sectors: as many L2 store
// transactions for NVFP4's scales as for its codes. Thread-slot s = u * THREADS + tid takes chunk
// row s / SPC, column slot s % SPC (a warp still reads 32 contiguous slots of one row).
template <int E, int U, int THREADS, int L> struct Tiling {
  static constexpr uint32_t SPC = THREADS * U / 8, NQ = SPC / (4 * L);
  static_assert((SPC & (SPC - 1)) == 0 && SPC % (4 * L) == 0 && SPC % 32 == 0, "chunk rows");
  static_assert(2 * NQ <= 32, "one warp stores the chunk's sectors");
  uint32_t chunks, t, cb;  // chunks; this one's mt * 16 + i and column block
  __device__ __forceinline__ Tiling(const Shape& sh, uint32_t c) {
    const uint32_t ncb = uint32_t(sh.slots_per_row) / SPC;  // the host checks SPC divides it
    chunks = uint32_t((sh.rows + 127) >> 7) * 16u * ncb;
    t = c / ncb;
    cb = c - t * ncb;
  }
  __device__ __forceinline__ uint32_t row0() const { return (t >> 4) * 128u + (t & 15u) * 2u; }
  __device__ __forceinline__ uint32_t j0() const { return cb * SPC; }
  // Thread-slot u's row in the chunk (0, 1, 32, 33, ...) and column slot.
  __device__ __forceinline__ static uint32_t row_of(int u) {
    const uint32_t r = (uint32_t(u * THREADS) + threadIdx.x) / SPC;
    return (r & 1u) + 32u * (r >> 1);
  }
  __device__ __forceinline__ static uint32_t col_of(int u) {
    return (uint32_t(u * THREADS) + threadIdx.x) % SPC;
  }
};

// Loads of the tiling's chunk: idx[u] is 0 for a slot of an input row, ~0 otherwise (its words
// are not stored and its scale bytes stage as zeros). No column test: sector order is only
// planned without padding columns (every slot of a row holds input).
template <typename T, int E, int U, class TL>
__device__ __forceinline__ void load_tiled(const T* __restrict__ x, const TL& tl, const Shape& sh,
                                           uint32_t (&idx)[U], SlotPos (&pos)[U],
                                           InVec<T, E> (&in)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    pos[u].row = tl.row0() + TL::row_of(u);
    pos[u].j = int(tl.j0() + TL::col_of(u));
    const bool ok = pos[u].row < uint32_t(sh.rows);
    idx[u] = ok ? 0u : 0xffffffffu;
    if (ok) in[u].load(x + (size_t)pos[u].row * uint32_t(sh.k) + uint32_t(pos[u].j) * E);
    else in[u].zero();
  }
}

// Store the tiling's chunk's staged scale sectors: lane t < 2 NQ of warp 0, 16 bytes each.
template <class TL>
__device__ __forceinline__ void flush_tiled(const TL& tl, const Shape& sh, const uint4* stage,
                                            uint8_t* __restrict__ scales, uint32_t lane) {
  if (lane < 2 * TL::NQ) {  // half (lane & 1) of sector lane / 2: row 2i or 2i+1, scale column 4q
    const uint32_t q = tl.cb * TL::NQ + (lane >> 1);
    *reinterpret_cast<uint4*>(scales + swizzled_offset32(tl.row0() + (lane & 1u), 4u * q,
                                                         uint32_t(sh.k_tiles))) = stage[lane];
  }
}

// The direct path: U slots per thread; block b owns the chunks of THREADS * u_count slots
// b, b + grid, b + 2 grid, ... LOOP: the host caps the grid at the resident blocks, so a block
// loops over several chunks when the input is large, the loads of its next chunk issued before
// the current one is quantized (loads stay in flight while the SM computes); else a block
// takes one chunk (the grid covers them all). Interleaved chunks, not an even contiguous share
// a block: the shares (2f911c2) measured 2-14% slower on the H100 in the same run.
// gs_mode (NVFP4): 0 = gs_val, 1 = *gs_in, 2 = from the finite amax partials of mx_amax,
// 3 = each block reduces the finite amax of the whole input (small inputs: one launch, any arch).
// LIN: sh.linear (the wrapper below picks the instantiation).
template <typename T, class F, bool NV, int GROUP, int E, int U, int THREADS, bool HW, bool LOOP,
          bool H2, bool LIN>
__device__ __forceinline__ void quantize_impl(const Shape& sh, const T* __restrict__ x,
                                              uint8_t* __restrict__ data,
                                              uint8_t* __restrict__ scales, const float* gs_in,
                                              const uint32_t* partials, float* gs_out,
                                              float gs_val, int gs_mode, int n_partials, int rows,
                                              int k, int u_count) {
  // u_count (1..U, uniform): slots per thread of a chunk; 1 spreads small inputs over more
  // blocks (shorter per-thread chains), U keeps U loads in flight for large ones.
  const uint32_t spr = uint32_t(sh.slots_per_row);
  const uint32_t chunk = uint32_t(THREADS * u_count), step = gridDim.x * chunk;
  const SlotPos du = {uint32_t(THREADS) / spr, int(uint32_t(THREADS) % spr)};
  const SlotPos dstep = {step / spr, int(step % spr)};
  uint32_t first = blockIdx.x * chunk;  // the block's first slot of the current chunk
  SlotPos p0 = {(first + threadIdx.x) / spr, int((first + threadIdx.x) % spr)};
  uint32_t idx[U];
  SlotPos pos[U];
  InVec<T, E> in[U];
  if constexpr (LOOP) {
    load_slots<T, E, U, THREADS, LIN>(x, first + threadIdx.x, p0, du, u_count, sh, idx, pos, in);
  } else {  // a division a slot, fewer live registers (more blocks an SM)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      idx[u] = u < u_count ? first + uint32_t(u * THREADS) + threadIdx.x : 0xffffffffu;
      const T* p = slot_input<T, E>(x, idx[u], sh, pos[u]);
      if (p) in[u].load(p); else in[u].zero();
    }
  }
  const float gs = NV ? global_scale<T, THREADS>(x, gs_in, partials, gs_out, gs_val, gs_mode,
                                                 n_partials, rows, k)
                     : 1.0f;
  if constexpr (!LOOP) {
    quantize_slots<T, F, NV, GROUP, E, U, HW, H2, LIN>(in, idx, pos, u_count, sh, gs, data, scales);
  } else {
    // One register set and copies, not two sets in turn: the two-set loop of 2f911c2 (twice
    // the loop code) ran 3-10% slower on the H100 than this loop did at c477e5f (two runs, not
    // an A/B of that change alone; suspected: instruction fetch).
    for (;;) {
      const bool more = first + step < sh.total;  // block-uniform; total < 2^31: no overflow
      uint32_t idx2[U];
      SlotPos pos2[U];
      InVec<T, E> in2[U];
      if (more) {
        first += step;
        p0 = add_pos(p0, dstep, int(spr));
        load_slots<T, E, U, THREADS, LIN>(x, first + threadIdx.x, p0, du, u_count, sh, idx2, pos2,
                                          in2);
      }
      quantize_slots<T, F, NV, GROUP, E, U, HW, H2, LIN>(in, idx, pos, u_count, sh, gs, data,
                                                         scales);
      if (!more) break;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        idx[u] = idx2[u];
        pos[u] = pos2[u];
        in[u] = in2[u];
      }
    }
  }
  zero_padding_rows(sh, scales, (long long)blockIdx.x * THREADS + threadIdx.x,
                    (long long)gridDim.x * THREADS);
}

// The direct path in sector order (sh.tiled, see Tiling), for configs that do not loop: block b
// quantizes chunk b, its warps stage their scale words in shared memory, and after a block
// barrier warp 0 stores the chunk's sectors. (Staging per chunk inside the fp4 / fp6 loop gained
// nothing on the H100, so the host plans MXFP4 / MXFP6 here with their loop=False configs, and
// NVFP4 keeps its loop: BENCHMARKS.md, sessions 12 and 26.) No padding-row pass: the chunks
// cover the last tile's padding rows.
template <typename T, class F, bool NV, int GROUP, int E, int U, int THREADS, bool HW, bool H2>
__device__ __forceinline__ void quantize_tiled(const Shape& sh, const T* __restrict__ x,
                                               uint8_t* __restrict__ data,
                                               uint8_t* __restrict__ scales, const float* gs_in,
                                               const uint32_t* partials, float* gs_out,
                                               float gs_val, int gs_mode, int n_partials,
                                               int rows, int k) {
  using TL = Tiling<E, U, THREADS, GROUP / E>;
  __shared__ uint4 stage[2 * TL::NQ];  // 16-byte halves of the chunk's sectors
  const TL tl(sh, blockIdx.x);
  uint32_t idx[U];
  SlotPos pos[U];
  InVec<T, E> in[U];
  load_tiled<T, E, U>(x, tl, sh, idx, pos, in);
  const float gs = NV ? global_scale<T, THREADS>(x, gs_in, partials, gs_out, gs_val, gs_mode,
                                                 n_partials, rows, k)
                     : 1.0f;
  if (blockIdx.x >= tl.chunks) return;  // block-uniform (the host's grid is the chunks)
  quantize_slots<T, F, NV, GROUP, E, U, HW, H2, false, true>(
      in, idx, pos, U, sh, gs, data, scales, reinterpret_cast<uint32_t*>(stage), TL::SPC);
  __syncthreads();
  if (threadIdx.x < 32) flush_tiled(tl, sh, stage, scales, threadIdx.x);
}

// swizzled: 0 row-major scales, 1 swizzled, 2 swizzled in sector order (quantize_tiled; the
// host checks the shape allows it). LINEAR: take the linear-index path where the shape allows it
// (a config knob for comparison).
template <typename T, class F, bool NV, int GROUP, int E, int U, int THREADS, bool HW, bool LOOP,
          bool H2 = false, bool LINEAR = true>
__device__ __forceinline__ void quantize(const T* __restrict__ x, uint8_t* __restrict__ data,
                                         uint8_t* __restrict__ scales, const float* gs_in,
                                         const uint32_t* partials, float* gs_out, float gs_val,
                                         int gs_mode, int n_partials, int rows, int k,
                                         int swizzled, int u_count) {
  // sector order for configs that do not loop (a looping one takes mode 2 as plain swizzled)
  const Shape sh = Shape::make<GROUP, E>(rows, k, LOOP && swizzled == 2 ? 1 : swizzled);
  if constexpr (!LOOP) {
    if (sh.tiled) {
      quantize_tiled<T, F, NV, GROUP, E, U, THREADS, HW, H2>(
          sh, x, data, scales, gs_in, partials, gs_out, gs_val, gs_mode, n_partials, rows, k);
      return;
    }
  }
  if (LINEAR && sh.linear) {
    quantize_impl<T, F, NV, GROUP, E, U, THREADS, HW, LOOP, H2, true>(
        sh, x, data, scales, gs_in, partials, gs_out, gs_val, gs_mode, n_partials, rows, k,
        u_count);
  } else {
    quantize_impl<T, F, NV, GROUP, E, U, THREADS, HW, LOOP, H2, false>(
        sh, x, data, scales, gs_in, partials, gs_out, gs_val, gs_mode, n_partials, rows, k,
        u_count);
  }
}

#if __CUDA_ARCH__ >= 900
// Thread-block clusters (sm_90+): barrier and distributed shared memory reads.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_ld_u32(const uint32_t* smem_ptr, uint32_t rank) {
  const uint32_t local = (uint32_t)__cvta_generic_to_shared(smem_ptr);
  uint32_t remote, v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
}

// NVFP4 with the global scale from the input, in one launch of one CLUSTER-block cluster: every
// thread loads its U slots, the finite amax is reduced over the cluster through distributed
// shared memory, and the slots are quantized from registers (no second read, no scratch).
template <typename T, class F, int GROUP, int E, int U, int THREADS, int CLUSTER>
__device__ __forceinline__ void quantize_fused(const T* __restrict__ x, uint8_t* __restrict__ data,
                                               uint8_t* __restrict__ scales, float* gs_out,
                                               int rows, int k, int swizzled) {
  __shared__ uint32_t red[32];
  __shared__ uint32_t block_amax;
  const Shape sh = Shape::make<GROUP, E>(rows, k, swizzled);
  const long long tid = (long long)blockIdx.x * THREADS + threadIdx.x;
  uint32_t idx[U];
  SlotPos pos[U];
  InVec<T, E> in[U];
  uint32_t a = 0;
  const int u_count = int((sh.total + THREADS * CLUSTER - 1) / (THREADS * CLUSTER));  // <= U
#pragma unroll
  for (int u = 0; u < U; ++u) {
    idx[u] = u < u_count ? uint32_t(u * THREADS * CLUSTER) + uint32_t(tid) : 0xffffffffu;
    const T* p = slot_input<T, E>(x, idx[u], sh, pos[u]);
    if (p) in[u].load(p); else in[u].zero();
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u >= u_count) break;
    float v[E];
    in[u].to_float(v);
    a = max(a, finite_max_bits(v));
  }
  a = block_max(a, red);
  if (threadIdx.x == 0) block_amax = a;
  cluster_arrive();
  cluster_wait();
#pragma unroll
  for (int r = 0; r < CLUSTER; ++r) a = max(a, cluster_ld_u32(&block_amax, r));
  cluster_arrive();  // done reading the other blocks' shared memory (waited on before exit)
  const float gs = nvfp4_global_scale(a);
  if (tid == 0) *gs_out = gs;
  quantize_slots<T, F, true, GROUP, E, U>(in, idx, pos, u_count, sh, gs, data, scales);
  zero_padding_rows(sh, scales, tid, (long long)THREADS * CLUSTER);
  cluster_wait();
}
#endif

// E2M1 codes times a factor s without a multiply an element: a magnitude is 0, 0.5 or 2^e {1,
// 1.5} (e = 0..2), so RN(e2m1 s) is q1 = RN(s) or q3 = RN(1.5 s) times 2^-1..2^2, set in the
// exponent field: exact while q1 and q3 lie in [2^-124, 2^124] (RN commutes with a power-of-two
// scale where both sides are normal). Returns false (v untouched) outside that range or for NaN.
template <int E>
__device__ __forceinline__ bool e2m1_scaled(const uint32_t (&c)[E], float q1, float q3,
                                            float (&v)[E]) {
  if (!(q1 >= 0x1p-124f && q3 <= 0x1p124f)) return false;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const uint32_t j = c[i] & 7u, e2 = j >> 1;
    const uint32_t base = __float_as_uint((j & 1u) && e2 ? q3 : q1);
    const uint32_t mag = j ? base + ((e2 - 1u) << 23) : 0u;  // e2 = 0: 0.5 q1
    v[i] = __uint_as_float(mag | ((c[i] & 8u) << 28));
  }
  return true;
}

// A warp's 32 consecutive slots of WORDS words (bytes 4 WORDS base .. of dense codes, `data`
// 16-byte aligned) into `stage` (32 WORDS words) as 16-byte loads of the first lanes; the codes
// end at `nbytes`, a multiple of 8 (an even slot count), so the last chunk is whole or 8 bytes.
// The caller syncs the warp, then lane l's slot is words WORDS l .. of `stage`.
template <int WORDS>
__device__ __forceinline__ void stage_warp_slots(const uint8_t* __restrict__ data, uint32_t base,
                                                 unsigned long long nbytes, uint32_t* stage,
                                                 uint32_t lane) {
  constexpr uint32_t CHUNKS = 32u * WORDS / 4u;  // 16-byte chunks of the warp's slots
  if (lane >= CHUNKS) return;
  const unsigned long long off = (unsigned long long)base * (4u * WORDS) + 16u * lane;
  uint32_t* dst = stage + 4u * lane;
  if (off + 16u <= nbytes) {
    const uint4 v = ld_nc_v4(data + off);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else if (off < nbytes) {
    const uint2 v = ld_nc_v2(data + off);
    dst[0] = v.x, dst[1] = v.y;
  }
}

// Dequantize U slots per thread: out[r, c] = decode(code) * scale (MX) or
// RN(e2m1 * e4m3 / gs) (NVFP4); NaN where the scale byte is NaN.
template <typename T, class F, bool NV, int GROUP, int E, int U, int THREADS>
__device__ __forceinline__ void dequantize(const uint8_t* __restrict__ data,
                                           const uint8_t* __restrict__ scales, const float* gs_in,
                                           T* __restrict__ out, int rows, int k, int swizzled) {
  constexpr int WORDS = Pack<F::BITS, E>::WORDS;
  const int s = k / GROUP, k_tiles = (s + 3) >> 2, slots_per_row = k / E;
  const uint32_t total = uint32_t(rows) * uint32_t(slots_per_row);
  const long long row_bytes = (long long)k * F::BITS / 8;
  const float gs = NV ? *gs_in : 1.0f;
  uint32_t w[U][WORDS];
  uint32_t sb[U];
  uint32_t idx[U], rows_u[U];
  int cols_u[U];
  // MXFP6 (12-byte slots) from a 16-byte aligned buffer: a warp's 32 slots (384 contiguous
  // bytes) staged by stage_warp_slots, every lane reading its 3 words back (conflict-free: word
  // 3 lane); three 4-byte loads a lane, 12 sectors each, held the kernel at 75% of copy (H100).
  constexpr bool COOP = WORDS == 3;
  constexpr int WW = COOP ? 32 * WORDS : 1;  // words of a warp's slots
  [[maybe_unused]] __shared__ uint32_t stage[COOP ? THREADS / 32 : 1][COOP ? U : 1][WW];
  const bool coop = COOP && (reinterpret_cast<unsigned long long>(data) & 15u) == 0;  // uniform
  const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    idx[u] = (blockIdx.x * U + u) * THREADS + threadIdx.x;
    const uint32_t row = rows_u[u] = idx[u] / uint32_t(slots_per_row);
    const int col = cols_u[u] = int(idx[u] - row * uint32_t(slots_per_row)) * E;
    if (COOP && coop)
      stage_warp_slots<WORDS>(data, idx[u] - lane, (unsigned long long)total * (4u * WORDS),
                              stage[wid][u], lane);
    if (idx[u] < total) {
      if (!coop) load_words<WORDS>(data + row * row_bytes + col * F::BITS / 8, w[u]);
      const long long so = swizzled ? swizzled_offset(row, col / GROUP, k_tiles)
                                    : (long long)row * s + col / GROUP;
      sb[u] = scales[so];
    }
  }
  if (COOP && coop) {
    __syncwarp();
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (idx[u] < total) {
#pragma unroll
        for (int i = 0; i < WORDS; ++i) w[u][i] = stage[wid][u][WORDS * lane + i];
      }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (idx[u] >= total) continue;
    const uint32_t row = rows_u[u];
    const int col = cols_u[u];
    uint32_t c[E];
    Pack<F::BITS, E>::unpack(w[u], c);
    float v[E];
    if constexpr (NV) {
      // Two divisions a slot instead of one an element (e2m1_scaled: RN(e2m1 sfv / gs) from
      // q1 = RN(sfv / gs) and q3 = RN(1.5 sfv / gs), 1.5 sfv exact); outside its range (and for
      // a NaN scale or an odd gs) the division an element.
      const float sfv = decode<E4M3>(sb[u]);
      const float q1 = __fdiv_rn(sfv, gs), q3 = __fdiv_rn(__fmul_rn(1.5f, sfv), gs);
      if (!e2m1_scaled<E>(c, q1, q3, v)) {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = __fdiv_rn(__fmul_rn(decode<F>(c[i]), sfv), gs);
      }
    } else {
      const float sc = e8m0_decode(sb[u]);
      // MXFP4: the same exponent-field scaling, q1 = the scale, q3 = 1.5 x it (exact)
      if (!(same_type<F, E2M1>::value && e2m1_scaled<E>(c, sc, __fmul_rn(1.5f, sc), v))) {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = __fmul_rn(decode<F>(c[i]), sc);
      }
    }
    store_out<T, E>(out + (long long)row * k + col, v);
  }
}

}  // namespace kg::mx
