// FP4 weights in the tiled layout (fp4.cuh) -> dense W' [N, K] in T, for the large-M path:
// cuBLAS then multiplies A by W' (kernelgen/core/dense.py). W' holds the fragments the GEMV and
// tile kernels build (RowScale: exact in T), so that
//   NVFP4: W' = e2m1 * e4m3 * 2^-UNIT_EXP (exact), and the GEMM's alpha is alpha * 2^UNIT_EXP /
//          gs, which lives on the device: block 0 writes it (and beta) to scalars[0..1] for
//          cuBLAS's device pointer mode;
//   MXFP4: W' = T(e2m1 * 2^(s - 127)), the format's value: exact in fp32 (2^(s' - 127) * post[n],
//          s' the rebased byte), then one rounding to T (exact where T holds it, subnormals
//          included); a group prepare_weight flushed (s' = 0: more than 2^127 below its row's
//          largest) is 0; a NaN group's row is NaN through post. alpha as given.
// A thread takes one chunk (fp4_gemm/chunks.cuh): a 16-byte load, one scale word, and four
// 16-byte stores; a warp's stores cover 8 rows x 64 contiguous bytes each.
#pragma once
#include "fp4_gemm/chunks.cuh"
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

template <typename T, int FMT, int ENC>
__device__ __forceinline__ void dequantize_dense(const uint8_t* __restrict__ W,
                                                 const uint8_t* __restrict__ S,
                                                 const float* __restrict__ post,
                                                 T* __restrict__ out, int N, int K, long long wt,
                                                 unsigned wq, long long st, unsigned sq,
                                                 float alpha, int has_bias,
                                                 float* __restrict__ scalars) {
  static_assert(FMT == FMT_NVFP4 || FMT == FMT_MXFP4, "kbit4 has its own (kbit_gemm/tiled.cuh)");
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[0] = FMT == FMT_NVFP4 ? row_factor<T, FMT>(post, alpha, 0) : alpha;
    scalars[1] = has_bias ? 1.0f : 0.0f;
  }
  const unsigned Q = (unsigned)K / STEP_K, blocks = (unsigned)((N + 15) / 16) * Q;
  const WordDecoder<T, FMT, ENC> dec;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < blocks * 64u; i += gridDim.x * blockDim.x) {
    const TiledChunk ch = tiled_chunk(i, Q);
    if (ch.row >= N) continue;  // padding rows of the last tile
    const uint4 d = ld_nc_v4(W + ch.tile * wt + (size_t)ch.q * wq + 16 * ch.c);
    const uint32_t sw = ld_nc_u32(S + ch.tile * st + (size_t)ch.q * sq + scale_offset<FMT>(ch.g, ch.t) + 4 * ch.h);
    T* o = out + (size_t)ch.row * K + (size_t)ch.q * STEP_K + 8 * ch.t;
    if constexpr (FMT == FMT_NVFP4) {
      const RowScale<T, FMT> rs = row_scales<T, FMT>(sw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t p[4];
        dec(word_of(d, j), p);
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = hmul2<T>(p[e], rs.s[j]);
        st_v4(o + 32 * j, p[0], p[1], p[2], p[3]);
      }
    } else {
      // a raw pair is e2m1 * 2^-EXP: times 2^EXP the exact e2m1 value; 2^(s' - 127) * post[n] =
      // 2^(s - 127) is exact and finite (0 where s' = 0), so each value rounds once, to T (the
      // scale is not folded into 2^EXP: that product can overflow where the value does not)
      constexpr float UNIT = RawUnit<T>::EXP == 14 ? 0x1p14f : 0x1p126f;
      const float rowf = __ldg(post + ch.row);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float f = __uint_as_float(((sw >> (8 * j)) & 0xFFu) << 23) * rowf;
        uint32_t p[4];
        dec(word_of(d, j), p);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const T* v = reinterpret_cast<const T*>(&p[e]);
          p[e] = pack2<T>(to_float<T>(v[0]) * UNIT * f, to_float<T>(v[1]) * UNIT * f);
        }
        st_v4(o + 32 * j, p[0], p[1], p[2], p[3]);
      }
    }
  }
}

}  // namespace kg::fp4
