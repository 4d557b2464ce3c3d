// FP4-weight GEMM, bandwidth path (decode, M <= 16 per pass):
//   C[M, N] = alpha * A[M, K] . dequant(W)[N, K]^T (+ bias[N])
//
//   A  [M, K] T = half | bf16, row-major, K % 128 == 0 (16-byte aligned rows)
//   W, S, post: see fp4.cuh (prepared weight, row-major scales)
//   C  [M, N] T; fp32 accumulation; ws [split, M, N] fp32 + counters [m_tiles, ctas_x] (split-K)
//
// grid (ceil(N / (16 WARPS)), split, m_tiles), WARPS warps a CTA. Warp w of CTA x owns the 16
// W rows of tile x*WARPS + w (weights on the mma's 16-row side, tokens on its n8 side: a small
// M wastes no weight bytes) over the CTA's K range (blockIdx.y); blockIdx.z is the pass of
// M_TILE tokens. A[m0:m0+M_TILE, K range] is staged in shared memory once per CTA (cp.async,
// swizzled, see fp4.cuh swz). Each weight byte is loaded once, as 16-byte ld.global.nc by lanes
// whose quad covers 64 contiguous bytes of a row; DEPTH quad steps per warp are in flight (a
// register ring: step i+DEPTH is issued as soon as step i is taken out of its slot).
#pragma once
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

template <typename T, int FMT, int M_TILE, int WARPS, int DEPTH>
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

  // rows g, g+8 of the tile (rows past N re-read row N-1; nothing is stored for them)
  const int r0 = min(tile * 16 + g, N - 1), r1 = min(tile * 16 + g + 8, N - 1);
  const uint8_t* wa_p = W + (size_t)r0 * (K / 2) + (size_t)q0 * 64 + 16 * t;
  const uint8_t* wb_p = W + (size_t)r1 * (K / 2) + (size_t)q0 * 64 + 16 * t;
  const uint8_t* sa_p = S + (size_t)r0 * (K / (STEP_K / SB)) + (size_t)q0 * SB + (SB / 4) * t;
  const uint8_t* sb_p = S + (size_t)r1 * (K / (STEP_K / SB)) + (size_t)q0 * SB + (SB / 4) * t;

  uint4 wa[DEPTH], wb[DEPTH];
  uint32_t sa[DEPTH], sb[DEPTH];
  const auto load = [&](int d, int it) {
    wa[d] = ld_nc_v4(wa_p + 64 * it);
    wb[d] = ld_nc_v4(wb_p + 64 * it);
    if constexpr (FMT == FMT_NVFP4) {
      sa[d] = ld_nc_u16(sa_p + SB * it);
      sb[d] = ld_nc_u16(sb_p + SB * it);
    } else {
      sa[d] = ld_nc_u8(sa_p + SB * it);
      sb[d] = ld_nc_u8(sb_p + SB * it);
    }
  };
  // weights first: their latency overlaps the A staging
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (active && d < n_it) load(d, d);

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

  // this lane's token rows: g (+8); tokens past `rows` read as zero
  uint32_t arow[NT];
  bool a_ok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m = g + 8 * nt;
    a_ok[nt] = m < rows;
    arow[nt] = as_base + (uint32_t)(min(m, rows - 1) * kr * 2);
  }
  const uint32_t par = (uint32_t)(g & 1);  // swizzle row parity (token rows g and g+8 agree)

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
        uint32_t sca[2], scb[2];
        chunk_scales<T, FMT>(sa[d], sca);
        chunk_scales<T, FMT>(sb[d], scb);
        if (it + DEPTH < n_run) load(d, it + DEPTH);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t f[8];
          frags_of_word<T>(word_of(u, j), word_of(v, j), sca[j >> 1], scb[j >> 1], f);
          const uint32_t off = 256u * (uint32_t)it + 16u * swz((uint32_t)(4 * t + j), par);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            uint4 b = make_uint4(0u, 0u, 0u, 0u);
            if (a_ok[nt]) b = lds128(arow[nt] + off);
            Mma<T>::run(acc[j & 1][nt], f[0], f[1], f[2], f[3], b.x, b.y);
            Mma<T>::run(acc[j & 1][nt], f[4], f[5], f[6], f[7], b.z, b.w);
          }
        }
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
