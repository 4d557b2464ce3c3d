// FP4-weight GEMM, bandwidth path (decode, M <= 16 per pass):
//   C[M, N] = alpha * A[M, K] . dequant(W)[N, K]^T (+ bias[N])
//
//   A  [M, K] T = half | bf16, row-major, K % 128 == 0 (16-byte aligned rows)
//   W, S, post: see fp4.cuh (prepared weight, tiled layout)
//   C  [M, N] T; fp32 accumulation; ws [split, M, N] fp32 + counters [m_tiles, ctas_x] (split-K)
//
// grid (ceil(N / (16 WARPS)), split, m_tiles), WARPS warps a CTA. Warp w of CTA x owns the 16
// W rows of tile x*WARPS + w (weights on the mma's 16-row side, tokens on its n8 side: a small
// M wastes no weight bytes) over the CTA's K range (blockIdx.y); blockIdx.z is the pass of
// M_TILE tokens. A[m0:m0+M_TILE, K range] is staged in shared memory once per CTA (cp.async,
// swizzled, see fp4.cuh swz). Each weight byte is loaded once, as 16-byte ld.global.nc by lanes
// that together cover 1 KB of contiguous memory a step (tiled layout); DEPTH quad steps per warp are in flight (a
// register ring: step i+DEPTH is issued as soon as step i is taken out of its slot).
#pragma once
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

template <typename T, int FMT, int M_TILE, int WARPS, int DEPTH, bool HINT>
__device__ __forceinline__ void gemv(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S,
                                     const float* __restrict__ post, const T* __restrict__ A,
                                     const T* __restrict__ bias, int has_bias, float alpha,
                                     T* __restrict__ C, float* __restrict__ ws,
                                     unsigned* __restrict__ counters, int M, int N, int K,
                                     int sps) {
  static_assert(M_TILE == 8 || M_TILE == 16, "m_tile is 8 or 16 tokens");
  constexpr int NT = M_TILE / 8;
  constexpr int SB = Fmt<FMT>::SB;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t as_base = (uint32_t)__cvta_generic_to_shared(smem);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.z * M_TILE;
  const int rows = min(M_TILE, M - m0);
  const int Q = K / STEP_K;
  const int q0 = blockIdx.y * sps;
  const int n_it = min(Q, q0 + sps) - q0;  // quad steps of this CTA (>= 1: the host ensures it)
  const int kr = n_it * STEP_K;
  const int tile = blockIdx.x * WARPS + warp;
  const bool active = tile * 16 < N;

  // this warp's (tile, step) blocks of the tiled layout: 1 KB of W, 16 * SB scale bytes each;
  // lane (g, t) reads chunk t of rows g (w_p) and g+8 (w_p + 512) and one scale word
  const size_t blk = (size_t)tile * Q + q0;
  const uint8_t* w_p = W + blk * 1024 + 64 * g + 16 * t;
  const uint8_t* s_p = S + blk * (16 * SB) + (size_t)(4 * g + t) * (SB / 2);

  uint4 wa[DEPTH], wb[DEPTH];
  uint32_t sr[DEPTH];  // rows g (low half) and g+8 (high half)
  // The ring loads the steps in order through running pointers.
  const uint8_t* w_next = w_p;
  const uint8_t* s_next = s_p;
  const auto load = [&](int d) {
    wa[d] = ld_stream_v4<HINT>(w_next);
    wb[d] = ld_stream_v4<HINT>(w_next + 512);
    sr[d] = FMT == FMT_NVFP4 ? ld_nc_u32(s_next) : ld_nc_u16(s_next);
    w_next += 1024;
    s_next += 16 * SB;
  };
  // weights first: their latency overlaps the A staging
  if (active) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
      if (d < n_it) load(d);
  }

  // A slice: rows x kr, 256-byte segments per 128 k, 16-byte chunks swizzled per token row
  {
    const T* a0 = A + (size_t)m0 * K + (size_t)q0 * STEP_K;
    const int chunks = kr / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
      const int m = i / chunks, c = i % chunks;
      const uint32_t dst = as_base + (uint32_t)(m * kr * 2) + 256u * (uint32_t)(c >> 4) +
                           16u * swz((uint32_t)(c & 15), (uint32_t)m);
      cp_async16(dst, a0 + (size_t)m * K + 8 * c);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }

  // This lane's token rows g (+8): rows past `rows` re-read row rows-1 (valid shared memory);
  // their output columns are tokens >= M and are never stored, so they need no zeroing. The
  // four chunk offsets of word j (swizzle of chunk 4t + j) are the same every step.
  uint32_t arow[NT];  // advanced by one 256-byte segment a step
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    arow[nt] = as_base + (uint32_t)(min(g + 8 * nt, rows - 1) * kr * 2);
  uint32_t aoff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) aoff[j] = 16u * swz((uint32_t)(4 * t + j), (uint32_t)(g & 1));

  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.0f;

  const int n_run = active ? n_it : 0;
  for (int it0 = 0; it0 < n_run; it0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int it = it0 + d;
      if (it < n_run) {
        const uint4 u = wa[d], v = wb[d];
        const RowScale<T, FMT> sca = chunk_scales<T, FMT>(sr[d]);
        const RowScale<T, FMT> scb = chunk_scales<T, FMT>(FMT == FMT_NVFP4 ? sr[d] >> 16 : sr[d] >> 8);
        if (it + DEPTH < n_run) load(d);  // warp-uniform
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t f[8];
          frags_of_word<T, FMT>(word_of(u, j), word_of(v, j), sca, scb, j, f);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint4 b = lds128(arow[nt] + aoff[j]);
            Mma<T>::run(acc[j & 1][nt], f[0], f[1], f[2], f[3], b.x, b.y);
            Mma<T>::run(acc[j & 1][nt], f[4], f[5], f[6], f[7], b.z, b.w);
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) arow[nt] += 256u;
      }
    }
  }

  // fragment (nt, 2h + e) = C[m0 + 8nt + 2t + e, 16*tile + g + 8h]
  const bool split = gridDim.y > 1;
  float* wsy = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + 8 * nt + 2 * t + (i & 1), n = tile * 16 + g + 8 * (i >> 1);
      if (!active || m >= M || n >= N) continue;
      const float v = acc[0][nt][i] + acc[1][nt][i];
      if (split) __stcg(wsy + (size_t)m * N + n, v);
      else store_out<T, FMT>(C, bias, has_bias, post, alpha, m, n, N, v);
    }
  if (split)
    split_finish<T, FMT>(ws, counters + (size_t)blockIdx.z * gridDim.x + blockIdx.x, gridDim.y, C,
                         bias, has_bias, post, alpha, m0, M_TILE, blockIdx.x * WARPS * 16,
                         WARPS * 16, M, N);
}

}  // namespace kg::fp4
