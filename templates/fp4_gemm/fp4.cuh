// FP4 (E2M1) weights for fp16 / bf16 tensor-core GEMMs: decode, scales, loads, split-K finish.
//
// Weight layout both kernels read (kernelgen/fp4_gemm/layout.py; prepare_weight makes it):
//   W  packed E2M1 (two a byte, element 2j in the low nibble of byte j) tiled per 16 rows and
//      128 k: [T, Q, 2 (h), 8 (g), 4 (t), 16 B], row = 16*tile + 8h + g (T = ceil(N/16), rows
//      past N zero, Q = K/128): the 1 KB a warp loads per step is contiguous.
//   S  scale bytes of the same blocks: [T, Q, 8 (g), 4 (t), 2 (h), SB/4] (SB = 128 / group):
//        NVFP4: E4M3 bytes as quantized (groups of 16);
//        MXFP4: E8M0 bytes *relative to the row*: s' = max(s - rowmax + 127, 0) (<= 127;
//               0xFF = NaN), so 2^(s'-127) <= 1 fits fp16 / bf16; the row's 2^(rowmax-127) is
//               applied in fp32 to the accumulator (post[n]). s' = 0 decodes as 0 (a flushed
//               group: one more than 2^127 below the row's largest, e.g. an all-zero group of
//               scale 0x00 beside a group of amax >= 8; unclamped it would wrap to 0xFF / 2^127).
//      A lane's scales of rows g and g+8 are one 4-byte (NVFP4) / 2-byte (MXFP4) word.
//   post  NVFP4: [1] fp32 global scale, a copy (D *= alpha / gs); MXFP4: [N] fp32 row factors
//         (D *= alpha * post[n]).
//
// Lane work unit ("quad step", 128 k of 16 W rows): lane (g, t) = (lane / 4, lane % 4) loads the
// 16-byte chunk t (elements 32t..32t+31) of rows g and g+8. mma k-step s (0..7) takes elements
// 4s..4s+3 of the chunk: word s/2, nibbles 4(s%2)..4(s%2)+3. The mma's k-slots {2t,2t+1} and
// {2t+8,2t+9} then stand for the actual k {32t+4s, +1} and {+2, +3}: the activation fragment of
// lane t is the 8 bytes A[token][k0 + 32t + 4s .. +3], i.e. one 16-byte shared load per two
// k-steps. A group never straddles a k-step of a lane (NVFP4: words 0-1 / 2-3 are two groups,
// MXFP4: the chunk is one group), so each lane scales its own W pairs by its own group scale in
// fp16 / bf16 before the mma (exact: e2m1 x e4m3 has <= 6 significant bits and fits both types).
#pragma once
#include "common/dtypes.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"

namespace kg::fp4 {

constexpr int FMT_NVFP4 = 0;
constexpr int FMT_MXFP4 = 1;
constexpr int STEP_K = 128;  // k per quad step (4 lanes x 32 elements)
constexpr uint32_t FULL = 0xffffffffu;

// scale bytes per row per quad step: 128 / G
template <int FMT> struct Fmt { static constexpr int SB = FMT == FMT_NVFP4 ? 8 : 4; };

// prmt with a run-time selector of 3-bit byte indices (bit 3 of each nibble must be 0).
__device__ __forceinline__ uint32_t prmt_r(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// -- E2M1 -> fp16 / bf16 pairs ----------------------------------------------------------------
// Hopper has no fp4 cvt. Byte tables indexed by the 3-bit magnitude, looked up four at a time
// with prmt: fp16 values of e2m1 have a zero low byte, so one table of high bytes suffices;
// bf16 needs a high and a low table. The sign bits need no table: those of the odd elements
// n1, n3, n5, n7 already sit at bit 7 of w's bytes, those of the even ones at bit 7 of the
// bytes of w << 4; one prmt interleaves them into the byte order of the lookups.
template <typename T> struct E2m1Lut;
template <> struct E2m1Lut<half> {
  static constexpr bool LOW = false;  // low bytes all zero
  static constexpr uint32_t H0 = 0x3E3C3800u, H1 = 0x46444240u;  // 0 .5 1 1.5 | 2 3 4 6
  static constexpr uint32_t L0 = 0u, L1 = 0u;
};
template <> struct E2m1Lut<__nv_bfloat16> {
  static constexpr bool LOW = true;
  static constexpr uint32_t H0 = 0x3F3F3F00u, H1 = 0x40404040u;
  static constexpr uint32_t L0 = 0xC0800000u, L1 = 0xC0804000u;
};

// Word w = elements n0..n7 (nibble i = element i) -> r[p] = T pair (n_2p, n_2p+1), low half
// first. h0, h1: the high-byte table (E2m1Lut::H0/H1, or a scaled copy, see RowScale).
template <typename T>
__device__ __forceinline__ void e2m1x8(uint32_t w, uint32_t h0, uint32_t h1, uint32_t (&r)[4]) {
  using L = E2m1Lut<T>;
  const uint32_t mag = w & 0x77777777u, w4 = w << 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t m = h ? mag >> 16 : mag;
    const uint32_t sg = __byte_perm(w4, w, h ? 0x7362u : 0x5140u);  // bit 7 of byte i: sign of n_4h+i
    const uint32_t hi = prmt_r(h0, h1, m) | (sg & 0x80808080u);  // one LOP3
    if constexpr (!L::LOW) {
      r[2 * h] = __byte_perm(hi, 0u, 0x1404u);      // [0, hi0, 0, hi1]
      r[2 * h + 1] = __byte_perm(hi, 0u, 0x3424u);  // [0, hi2, 0, hi3]
    } else {
      const uint32_t lo = prmt_r(L::L0, L::L1, m);
      r[2 * h] = __byte_perm(lo, hi, 0x5140u);      // [lo0, hi0, lo1, hi1]
      r[2 * h + 1] = __byte_perm(lo, hi, 0x7362u);  // [lo2, hi2, lo3, hi3]
    }
  }
}

// -- scales -----------------------------------------------------------------------------------
// Relative E8M0 byte s' -> 2^(s'-127) (0 for s' == 0, NaN for 0xFF).
__device__ __forceinline__ float e8m0_rel_to_float(uint32_t b) {
  return b == 0xFFu ? __int_as_float(0x7fffffff) : __uint_as_float(b << 23);
}

// The scales of one lane's chunk of one row: `raw` = the 2 (NVFP4) or 1 (MXFP4) scale bytes
// in its low bits; sc[0] for words 0-1, sc[1] for words 2-3, as T pairs.
// NVFP4 scales are produced as e4m3 * 2^-8 (the fp16 bit pattern of the e4m3 byte: no
// conversion for fp16; NVFP4_UNIT below undoes the 2^-8 in the epilogue). W pairs times that
// stay exact in fp16: products of e2m1 and e4m3 are multiples of 2^-10 below 2688, so after
// the 2^-8 multiples of 2^-18 (>= fp16's 2^-24 step) below 10.5. NaN bytes (0x7F / 0xFF) give NaN.
constexpr float NVFP4_UNIT = 256.0f;
__device__ __forceinline__ uint32_t e4m3x2_to_half2_unit(uint32_t raw) {
  const uint32_t x = __byte_perm(raw, 0u, 0x4140u);  // [b0, 0, b1, 0]: one byte a 16-bit lane
  uint32_t h = ((x & 0x007F007Fu) << 7) | ((x & 0x00800080u) << 8);
  const uint32_t nan = (((x & 0x007F007Fu) + 0x00010001u) & 0x00800080u) * 0xFCu;  // 0x7E00 a NaN lane
  return h | nan;
}

// MXFP4 with fp16: the group scale 2^(s'-127) is a power of two, so it goes into the table
// instead of a multiply per W pair: every non-zero e2m1 value is a normal fp16, and adding d to
// its exponent is adding 4d to its high byte (the zero entry stays 0). The table holds
// e2m1 * 2^(s'-127+13) for s'-127 in [-26, 0] (largest 6 * 2^13 < 65504; MX_UNIT undoes the 2^13
// in the epilogue); groups more than 2^26 below their row's largest are flushed to zero, a NaN
// scale gives a table of NaNs.
template <typename T, int FMT>
struct RowScale {
  static constexpr bool IN_TABLE = FMT == FMT_MXFP4 && !E2m1Lut<T>::LOW;
  uint32_t h0, h1;  // high-byte table
  uint32_t s[2];    // T pair scales of words 0-1 and 2-3 (unused when IN_TABLE)
};
template <typename T, int FMT>
constexpr float MX_UNIT = RowScale<T, FMT>::IN_TABLE ? 1.0f / 8192.0f : 1.0f;

// The scales of one lane's chunk of one row: `raw` = the 2 (NVFP4) or 1 (MXFP4) scale bytes in
// its low bits.
template <typename T, int FMT>
__device__ __forceinline__ RowScale<T, FMT> chunk_scales(uint32_t raw) {
  RowScale<T, FMT> r;
  r.h0 = E2m1Lut<T>::H0;
  r.h1 = E2m1Lut<T>::H1;
  if constexpr (FMT == FMT_NVFP4) {
    const uint32_t h2 = e4m3x2_to_half2_unit(raw);  // (lo, hi) = groups (first, second)
    if constexpr (E2m1Lut<T>::LOW) {  // bf16: exact through fp32
      const __half2 hh = *reinterpret_cast<const __half2*>(&h2);
      r.s[0] = splat2<T>(__low2float(hh));
      r.s[1] = splat2<T>(__high2float(hh));
    } else {
      r.s[0] = __byte_perm(h2, 0u, 0x1010u);  // (lo, lo)
      r.s[1] = __byte_perm(h2, 0u, 0x3232u);  // (hi, hi)
    }
  } else if constexpr (RowScale<T, FMT>::IN_TABLE) {
    const int d = (int)(raw & 0xFFu) - 127 + 13;
    const uint32_t add = (uint32_t)(4 * d);
    const bool nan = (raw & 0xFFu) == 0xFFu, flush = d < -13;
    r.h0 = nan ? 0x7E7E7E7Eu : flush ? 0u : r.h0 + add * 0x01010100u;
    r.h1 = nan ? 0x7E7E7E7Eu : flush ? 0u : r.h1 + add * 0x01010101u;
  } else {
    r.s[0] = r.s[1] = splat2<T>(e8m0_rel_to_float(raw & 0xFFu));
  }
  return r;
}

// Word j of rows g (wa, scales a) and g+8 (wb, scales b) -> the A fragments of k-steps 2j
// (f[0..3]) and 2j+1 (f[4..7]), scaled: f = {a0, a1, a2, a3} as mma.cuh orders them.
template <typename T, int FMT>
__device__ __forceinline__ void frags_of_word(uint32_t wa, uint32_t wb, const RowScale<T, FMT>& a,
                                              const RowScale<T, FMT>& b, int j, uint32_t (&f)[8]) {
  uint32_t ra[4], rb[4];
  e2m1x8<T>(wa, a.h0, a.h1, ra);
  e2m1x8<T>(wb, b.h0, b.h1, rb);
  if constexpr (RowScale<T, FMT>::IN_TABLE) {
    f[0] = ra[0]; f[1] = rb[0]; f[2] = ra[1]; f[3] = rb[1];
    f[4] = ra[2]; f[5] = rb[2]; f[6] = ra[3]; f[7] = rb[3];
  } else {
    const uint32_t sa = a.s[j >> 1], sb = b.s[j >> 1];
    f[0] = hmul2<T>(ra[0], sa); f[1] = hmul2<T>(rb[0], sb);
    f[2] = hmul2<T>(ra[1], sa); f[3] = hmul2<T>(rb[1], sb);
    f[4] = hmul2<T>(ra[2], sa); f[5] = hmul2<T>(rb[2], sb);
    f[6] = hmul2<T>(ra[3], sa); f[7] = hmul2<T>(rb[3], sb);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

// -- loads --------------------------------------------------------------------------------------
// Streaming 16-byte weight load: read once, so no L1 line; ask L2 for the whole 256-byte
// segment (the tiled layout makes the next bytes the ones the neighbouring lanes want).
template <bool HINT> __device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  if constexpr (!HINT) return ld_nc_v4(p);
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ld_nc_u16(const void* p) {
  unsigned short r;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  unsigned short r;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(addr));
  return r;
}

// A tile in shared memory: token rows of 256-byte segments (128 k); 16-byte chunk c of a
// segment is stored at swz(c, row): the 8 lanes of each quarter warp (2 tokens x 4 t) reading
// chunk 4t + j hit 8 different 16-byte bank groups.
__device__ __forceinline__ uint32_t swz(uint32_t c, uint32_t row) {
  return c ^ ((c >> 2) & 3u) ^ ((row & 1u) << 2);
}

// -- epilogue -----------------------------------------------------------------------------------
// Row factor of the output: alpha / gs (NVFP4) or alpha * 2^(rowmax - 127) (MXFP4), times the
// units the fragments were scaled in (NVFP4_UNIT, MX_UNIT).
template <typename T, int FMT>
__device__ __forceinline__ float row_factor(const float* __restrict__ post, float alpha, int n) {
  if constexpr (FMT == FMT_NVFP4) return alpha * NVFP4_UNIT / __ldg(post);
  else return alpha * MX_UNIT<T, FMT> * __ldg(post + n);
}

template <typename T, int FMT>
__device__ __forceinline__ void store_out(T* __restrict__ C, const T* __restrict__ bias,
                                          int has_bias, const float* __restrict__ post,
                                          float alpha, int m, int n, int N, float v) {
  float r = v * row_factor<T, FMT>(post, alpha, n);
  if (has_bias) r += to_float(bias[n]);
  C[(size_t)m * N + n] = from_float<T>(r);
}

// Split-K finish of one CTA tile (rows [n_lo, n_lo + n_cnt) x tokens [m_lo, m_lo + m_cnt)):
// every thread has stored its fp32 partials to ws[split]; the CTA that brings the tile's counter
// to `splits` adds the partials in split order (deterministic), applies the row factor and bias,
// writes C and resets the counter for the next launch (stream order).
template <typename T, int FMT>
__device__ __forceinline__ void split_finish(const float* __restrict__ ws, unsigned* counter,
                                             int splits, T* __restrict__ C,
                                             const T* __restrict__ bias, int has_bias,
                                             const float* __restrict__ post, float alpha, int m_lo,
                                             int m_cnt, int n_lo, int n_cnt, int M, int N) {
  __shared__ unsigned last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const size_t stride = (size_t)M * N;
#pragma unroll 1
  for (int p = threadIdx.x; p < m_cnt * n_cnt; p += blockDim.x) {
    const int m = m_lo + p / n_cnt, n = n_lo + p % n_cnt;
    if (m >= M || n >= N) continue;
    const float* src = ws + (size_t)m * N + n;
    float v = 0.0f;
#pragma unroll 1
    for (int y = 0; y < splits; ++y) v += __ldcg(src + y * stride);
    store_out<T, FMT>(C, bias, has_bias, post, alpha, m, n, N, v);
  }
  if (threadIdx.x == 0) *counter = 0u;
}

}  // namespace kg::fp4
