// FP4-weight GEMM, tensor-core tile path (larger M):
//   C[M, N] = alpha * A[M, K] . dequant(W)[N, K]^T (+ bias[N])
//
// CTA tile: BN = 128 W rows x BM tokens, BK = 128 k per stage, STAGES-deep cp.async pipeline.
// Warps: 4 along W (32 rows each = 2 m16 tiles; weights on the mma's 16-row side, "swap_ab")
// x WARPS_T along tokens (BM / WARPS_T tokens each = NI n8 tiles). grid (ceil(N/128),
// ceil(M/BM), split); blockIdx.z takes a K range (split-K: fp32 partials + last-CTA reduction).
//
// Shared memory per stage: W [8 tiles][1 KB] and scales [8 tiles][16 * SB] as in the tiled
// layout (fp4.cuh; block (tile, step) at W + tile * w_t + step * w_q, S likewise), A [BM][256 B] (chunks swizzled, fp4.cuh swz). A lane reads chunk t of its W rows (16 B = 4 words, 8
// k-steps) and the matching 16-byte activation chunks t + 4j, as in the bandwidth path (fp4.cuh).
#pragma once
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

constexpr int TILE_BN = 128;
constexpr int TILE_WARPS_W = 4;

template <int FMT, int BM>
struct TileSmem {
  static constexpr int W_BYTES = TILE_BN * 64;
  static constexpr int S_BYTES = TILE_BN * Fmt<FMT>::SB;
  static constexpr int A_BYTES = BM * 256;
  static constexpr int STAGE = W_BYTES + S_BYTES + A_BYTES;
  static constexpr int LUT_BYTES = FMT == FMT_KBIT4 ? KBIT4_LUT_BYTES : 0;  // after the stages
};

template <typename T, int FMT, int BM, int WARPS_T, int STAGES, int ENC = ENC_F16>
__device__ __forceinline__ void tile_gemm(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S,
                                          const float* __restrict__ post, const T* __restrict__ A,
                                          const T* __restrict__ bias, int has_bias, float alpha,
                                          T* __restrict__ C, float* __restrict__ ws,
                                          unsigned* __restrict__ counters, int M, int N, int K,
                                          int sps, long long w_t, unsigned w_q, long long s_t,
                                          unsigned s_q) {
  constexpr int THREADS = 32 * TILE_WARPS_W * WARPS_T;
  constexpr int NI = BM / (8 * WARPS_T);
  constexpr int MI = 2;
  constexpr int SB = Fmt<FMT>::SB;
  using L = TileSmem<FMT, BM>;
  static_assert(NI >= 1 && BM % (8 * WARPS_T) == 0, "BM must split into n8 tiles per warp");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wi = warp % TILE_WARPS_W, wt = warp / TILE_WARPS_W;
  const int n0 = blockIdx.x * TILE_BN, m0 = blockIdx.y * BM;
  const int Q = K / STEP_K;
  const int q0 = blockIdx.z * sps;
  const int n_k = min(Q, q0 + sps) - q0;
  const int n_tiles = (N + 15) / 16;  // 16-row tiles of the tiled layout

  // stage = 8 tiles x (1 KB of W, 16 * SB scale bytes) from the tiled layout (tiles past the
  // last re-read it; nothing is stored for them) + BM token rows of A
  const auto stage_load = [&](int slot, int kq) {
    const uint32_t sw = base + (uint32_t)(slot * L::STAGE);
    const uint32_t ss = sw + L::W_BYTES, sa = ss + L::S_BYTES;
#pragma unroll
    for (int i = threadIdx.x; i < TILE_BN * 4; i += THREADS) {  // W: 64 chunks a tile
      const long long tl = min(n0 / 16 + (i >> 6), n_tiles - 1);
      cp_async16(sw + 16u * (uint32_t)i, W + tl * w_t + (size_t)kq * w_q + 16 * (i & 63));
    }
#pragma unroll
    for (int i = threadIdx.x; i < TILE_BN * SB / 16; i += THREADS) {  // scales: SB chunks a tile
      const long long tl = min(n0 / 16 + i / SB, n_tiles - 1);
      cp_async16(ss + 16u * (uint32_t)i, S + tl * s_t + (size_t)kq * s_q + 16 * (i % SB));
    }
#pragma unroll
    for (int i = threadIdx.x; i < BM * 16; i += THREADS) {  // A: 16 chunks a token row
      const int r = i >> 4, c = i & 15;
      const int m = m0 + r;
      const bool ok = m < M;
      cp_async16_zfill(sa + 256u * (uint32_t)r + 16u * swz((uint32_t)c, (uint32_t)r),
                       A + (size_t)(ok ? m : 0) * K + (size_t)kq * STEP_K + 8 * c, ok);
    }
  };

  [[maybe_unused]] Kbit4Fill<T, THREADS> kfill;  // KBIT4: its codebook reads go first
  if constexpr (FMT == FMT_KBIT4) kfill.load(post);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_k) stage_load(s, q0 + s);
    cp_async_commit();
  }
  // KBIT4: the code table after the stages, filled while they load (the loop's first barrier
  // publishes it; post is the codebook)
  WordDecoder<T, FMT, ENC> dec;
  if constexpr (FMT == FMT_KBIT4) {
    kfill.fill(reinterpret_cast<uint32_t*>(smem + STAGES * L::STAGE));
    dec.lane_lut = base + (uint32_t)(STAGES * L::STAGE) + 4u * (uint32_t)lane;
  }

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

  const uint32_t par = (uint32_t)(g & 1);
#pragma unroll 1
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nxt = kt + STAGES - 1;
      if (nxt < n_k) stage_load(nxt % STAGES, q0 + nxt);
      cp_async_commit();
    }
    const uint32_t sw = base + (uint32_t)((kt % STAGES) * L::STAGE);
    const uint32_t ss = sw + L::W_BYTES, sa = ss + L::S_BYTES;
    uint4 wv[MI][2];
    RowScale<T, FMT> sc[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const uint32_t tl = (uint32_t)(wi * 2 + mi);  // tile of this m16 block in the stage
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wv[mi][h] = lds128(sw + tl * 1024u + (uint32_t)(512 * h + 64 * g + 16 * t));
      const uint2 raw = lds64(ss + tl * (16u * SB) + (uint32_t)scale_offset<FMT>(g, t));
      sc[mi][0] = row_scales<T, FMT>(raw.x);
      sc[mi][1] = row_scales<T, FMT>(raw.y);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 b[NI];
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const uint32_t r = (uint32_t)(wt * NI * 8 + ni * 8 + g);
        b[ni] = lds128(sa + 256u * r + 16u * swz((uint32_t)(t + 4 * j), par));
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        uint32_t f[8];
        frags_of_word(dec, word_of(wv[mi][0], j), word_of(wv[mi][1], j), sc[mi][0], sc[mi][1],
                              j, f);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          Mma<T>::run(acc[mi][ni], f[0], f[1], f[2], f[3], b[ni].x, b[ni].y);
          Mma<T>::run(acc[mi][ni], f[4], f[5], f[6], f[7], b[ni].z, b[ni].w);
        }
      }
    }
  }
  cp_async_wait<0>();

  // fragment (mi, ni, 2h + e) = C[m0 + wt*NI*8 + 8ni + 2t + e, n0 + wi*32 + 16mi + g + 8h]
  const bool split = gridDim.z > 1;
  float* wsz = ws + (size_t)blockIdx.z * M * N;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m0 + wt * NI * 8 + 8 * ni + 2 * t + (i & 1);
        const int n = n0 + wi * 32 + 16 * mi + g + 8 * (i >> 1);
        if (m >= M || n >= N) continue;
        if (split) __stcg(wsz + (size_t)m * N + n, acc[mi][ni][i]);
        else store_out<T, FMT>(C, bias, has_bias, post, alpha, m, n, N, acc[mi][ni][i]);
      }
  if (split)
    split_finish<T, FMT>(ws, counters + (size_t)blockIdx.y * gridDim.x + blockIdx.x, gridDim.z, C,
                         bias, has_bias, post, alpha, m0, BM, n0, TILE_BN, M, N);
}

}  // namespace kg::fp4
