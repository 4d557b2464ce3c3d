// 4-bit kbit weights in the tiled layout of the FP4 bandwidth path (fp4_gemm/fp4.cuh, kernelgen/
// fp4_gemm/layout.py, kernelgen/kbit_gemm/tiled.py) -> dense W [N, K] in T (half, bf16, float),
// for the dequantize + cuBLAS path and KbitLinear.dequantize: out = T(RN(cb[code] * scale)), the
// values of kbit/kbit.cuh's dequantize.
//
// A (tile, step) block holds 16 rows x 128 k: 16-byte chunk c = 32h + 4g + t is lane (g, t)'s
// chunk of row 16 * tile + 8h + g, whose word j holds the codes of k = 128 step + 32j + 8t + i
// (code i in bits 4i..4i+3); the row's 4 scale bytes of the step (byte j: block j) are the
// 4-byte word at 8g + 4h of the block's scales. A thread takes one chunk: a 16-byte load, one
// scale word, and 4 x 16-byte stores of 8 consecutive outputs.
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"
#include "common/ptx.cuh"
#include "fp4_gemm/chunks.cuh"

namespace kg::kbit_gemm {

template <typename T>
__device__ __forceinline__ void dequantize_tiled(const uint8_t* __restrict__ W,
                                                 const uint8_t* __restrict__ S,
                                                 const float* __restrict__ codebook,
                                                 T* __restrict__ out, int N, int K, long long wt,
                                                 unsigned wq, long long st, unsigned sq) {
  __shared__ float cb[16];
  if (threadIdx.x < 16) cb[threadIdx.x] = __ldg(codebook + threadIdx.x);
  __syncthreads();
  const int Q = K / 128, tiles = (N + 15) / 16;
  const long long chunks = (long long)tiles * Q * 64;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < chunks;
       i += (long long)gridDim.x * blockDim.x) {
    const fp4::TiledChunk ch = fp4::tiled_chunk(i, (long long)Q);
    if (ch.row >= N) continue;  // padding rows of the last tile
    const uint4 d = ld_nc_v4(W + ch.tile * wt + (size_t)ch.q * wq + 16 * ch.c);
    const uint32_t sw = __ldg(reinterpret_cast<const uint32_t*>(S + ch.tile * st + (size_t)ch.q * sq + 8 * ch.g + 4 * ch.h));
    T* o = out + (size_t)ch.row * K + (size_t)ch.q * 128 + 8 * ch.t;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = j == 0 ? d.x : j == 1 ? d.y : j == 2 ? d.z : d.w;
      const float s = e4m4_decode_nobranch((sw >> (8 * j)) & 0xFFu);
      if constexpr (sizeof(T) == 4) {  // fp32: two 16-byte stores
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = cb[(w >> (4 * i)) & 15u] * s;
        *reinterpret_cast<float4*>(o + 32 * j) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(o + 32 * j + 4) = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        uint32_t p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          p[e] = pack2<T>(cb[(w >> (8 * e)) & 15u] * s, cb[(w >> (8 * e + 4)) & 15u] * s);
        *reinterpret_cast<uint4*>(o + 32 * j) = make_uint4(p[0], p[1], p[2], p[3]);
      }
    }
  }
}

}  // namespace kg::kbit_gemm
