// FP4-weight GEMM on warpgroup MMA (sm_90a): the tile path's contract (tile.cuh) for larger M,
//   C[M, N] = alpha * A[M, K] . dequant(W)[N, K]^T (+ bias[N])
//
// CTA tile: 128 W rows (two warpgroups of 64, weights on the wgmma's M side) x BM tokens (the
// wgmma's N: 64, 128 or 256), one 128-k step of the tiled layout an iteration; grid (ceil(N /
// 128), ceil(M / BM), split), blockIdx.z a K range (split-K as tile.cuh).
//
// Warp w decodes tile w of the CTA (16 rows: its 1 KB block and 8-byte scale word of a step,
// loaded from global into a register ring RING steps deep, lanes as in the bandwidth path) into
// a dense copy of the step in shared memory (DQ, 2 + INFLIGHT buffers), in A's type and in the K-major
// 128-byte-swizzle layout of common/wgmma.cuh: lane (g, t) stores word j of rows g and g+8 as one
// 16-byte chunk each (k 8 (t + 4j) .. +7 of the tiled layout's k order). The token rows of A are
// the wgmma's B operand (cp.async, STAGES slots, zero-filled past M, same layout and k order).
// Each warpgroup decodes and reads only its own 64 rows of DQ.
//
// FLAT (kbit4 only; 2..4): W is a flat kbit weight instead (templates/kbit_gemm/mma_gemm.cuh's
// layout: row n's K/32 blocks of FLAT bit-plane words, one E4M4 byte a block, a codebook of
// 2^FLAT entries; the w / s strides unused). Lane (g, t) loads rows g and g+8 of its tile (rows
// past N clamped to N - 1: computed, not stored) a step at a time, FLAT 16-byte words a row (the 4
// lanes of a row read the same words in one request) and each row's 4 scale bytes, and spreads
// byte t of each plane into the 4-bit code words of the tiled chunk (flat_chunk) before the
// decode, which is then the tiled kbit4 one.
//
// Iteration kt (one CTA barrier; INFLIGHT = wgmma groups left pending across it, 0 or 1):
//   decode step kt (ring slot) into DQ[kt % (2 + INFLIGHT)] (its last reader, this warpgroup's
//     group kt - 2 - INFLIGHT, completed at the wait of iteration kt - 1); load step kt + RING
//     into the ring slot;
//   wait until INFLIGHT of this warpgroup's groups are pending (kt - 1 - INFLIGHT done) and for
//     this thread's copies of step kt; fence both (st.shared, cp.async) into the async proxy;
//     __syncthreads (every group kt - 1 - INFLIGHT done, A of step kt and the DQ buffer complete);
//   issue the 8 k16 wgmmas of step kt and commit; copy A of step kt + D (D = STAGES - 1 -
//     INFLIGHT) into the slot of step kt - 1 - INFLIGHT. The wgmmas run while the next step
//     decodes; with INFLIGHT 1 the tensor cores also keep group kt - 1 across the barrier.
#pragma once
#include "common/wgmma.cuh"
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

constexpr int WG_BN = 128;  // W rows a CTA
constexpr int WG_DQ_BYTES = WG_BN * STEP_K * 2;  // one dense step: 2 k-blocks of 64 x 128 rows

template <int FMT, int BM, int STAGES, int INFLIGHT>
struct WgSmem {
  static constexpr int A_BYTES = BM * STEP_K * 2;  // a stage: 2 k-blocks of 64 x BM rows
  static constexpr int DQ = 2 + INFLIGHT;  // dense weight buffers
  static constexpr int LUT_BYTES = FMT == FMT_KBIT4 ? KBIT4_LUT_BYTES : 0;  // after the stages
  // + slack to align the tiles to 1024 bytes (the swizzle is taken from address bits)
  static constexpr int TOTAL = DQ * WG_DQ_BYTES + STAGES * A_BYTES + LUT_BYTES + 1024;
};

__device__ __forceinline__ void sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}
// Weight loads of the ring: not .nc, so that they stay where the loop issues them (ptxas moved
// the .nc form past the barrier and the wgmma issue, a step later than asked).
__device__ __forceinline__ uint4 ld_ring_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ld_ring_v2(const void* p) {
  uint2 r;
  asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// Bits 0..7 of x -> bits 0, 4, .., 28 (element i of a byte of a bit plane to nibble i).
__device__ __forceinline__ uint32_t spread_nibbles(uint32_t x) {
  x = (x | (x << 12)) & 0x000F000Fu;
  x = (x | (x << 6)) & 0x03030303u;
  return (x | (x << 3)) & 0x11111111u;
}

// FLAT: a row's step of flat bit planes (4 blocks x FLAT words, p[w / 4] component w % 4 = word
// j * FLAT + b) -> lane t's tiled chunk: word j = the 4-bit codes of k 32j + 8t .. + 7.
template <int FLAT>
__device__ __forceinline__ uint4 flat_chunk(const uint4 (&p)[FLAT], int t) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int b = 0; b < FLAT; ++b) {
      const int i = j * FLAT + b;
      const uint32_t pw = word_of(p[i >> 2], i & 3);
      w[j] |= spread_nibbles(__byte_perm(pw, 0u, 0x4440u + (uint32_t)t)) << b;
    }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T, int FMT, int BM, int STAGES, int RING, int INFLIGHT, int ENC = ENC_F16, int FLAT = 0>
__device__ __forceinline__ void wgmma_gemm(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S,
                                           const float* __restrict__ post, const T* __restrict__ A,
                                           const T* __restrict__ bias, int has_bias, float alpha,
                                           T* __restrict__ C, float* __restrict__ ws,
                                           unsigned* __restrict__ counters, int M, int N, int K,
                                           int sps, long long w_t, unsigned w_q, long long s_t,
                                           unsigned s_q) {
  static_assert(BM == 64 || BM == 128 || BM == 256, "the wgmma n of common/wgmma.cuh");
  static_assert(INFLIGHT == 0 || INFLIGHT == 1, "wgmma groups pending across the barrier");
  static_assert(RING >= 1 && STAGES - 1 - INFLIGHT >= 1, "pipeline depths: one A step in flight");
  constexpr int THREADS = 256;
  constexpr int D = STAGES - 1 - INFLIGHT;  // A steps copied ahead
  using L = WgSmem<FMT, BM, STAGES, INFLIGHT>;
  // KBIT4: the codebook values of this thread's table stores (Kbit4Fill); first in the source,
  // as the weight ring below is before the A copies (ptxas still issues the A copies first)
  [[maybe_unused]] Kbit4Fill<T, THREADS, false, false, FLAT ? (1 << FLAT) : 16> kfill;
  if constexpr (FMT == FMT_KBIT4) kfill.load(post);
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t dq0 = base, sa0 = base + L::DQ * WG_DQ_BYTES;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wg = __shfl_sync(~0u, warp >> 2, 0);  // warp-uniform: the descriptors stay scalar
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * WG_BN, m0 = blockIdx.y * BM;
  const int Q = K / STEP_K;
  const int q0 = blockIdx.z * sps;
  const int n_k = min(Q, q0 + sps) - q0;
  const int n_tiles = (N + 15) >> 4;

  // this warp's tile (past the last: re-read it, nothing is stored for its rows) and ring
  const long long tl = min(n0 / 16 + warp, n_tiles - 1);
  constexpr int FW = FLAT > 0 ? FLAT : 1;
  // FLAT: rows g, g + 8 of the tile (clamped to N - 1), their steps of planes and scale words
  const long long kb32 = K / 32;
  const long long ra = min(tl * 16 + g, (long long)N - 1), rb = min(tl * 16 + g + 8, (long long)N - 1);
  const uint8_t* wp = FLAT ? W + (ra * kb32 + 4 * (long long)q0) * 4 * FW
                           : W + tl * w_t + (size_t)q0 * w_q + 64 * g + 16 * t;
  const long long w8 = FLAT ? (rb - ra) * kb32 * 4 * FW : 512;
  const uint8_t* sp = FLAT ? S + ra * kb32 + 4 * (long long)q0
                           : S + tl * s_t + (size_t)q0 * s_q + scale_offset<FMT>(g, t);
  const long long s8 = (rb - ra) * kb32;
  [[maybe_unused]] uint4 pa[RING][FW], pb[RING][FW];
  uint4 wa[RING], wb[RING];
  uint2 sr[RING];
  const auto load = [&](int d) {
    if constexpr (FLAT > 0) {
#pragma unroll
      for (int b = 0; b < FLAT; ++b) {
        pa[d][b] = ld_ring_v4(wp + 16 * b);
        pb[d][b] = ld_ring_v4(wp + w8 + 16 * b);
      }
      sr[d].x = __ldg(reinterpret_cast<const uint32_t*>(sp));
      sr[d].y = __ldg(reinterpret_cast<const uint32_t*>(sp + s8));
      wp += 16 * FLAT;
      sp += 4;
    } else {
      wa[d] = ld_ring_v4(wp);
      wb[d] = ld_ring_v4(wp + 512);
      sr[d] = ld_ring_v2(sp);
      wp += w_q;
      sp += s_q;
    }
  };
#pragma unroll
  for (int d = 0; d < RING; ++d)
    if (d < n_k) load(d);

  // A of step kq into slot: chunk c (8 k) of token row r at k-block c / 8, 16-byte position
  // (c % 8) ^ (r % 8) of the row's 128 bytes (rows past M zero). Thread x copies chunk x % 16 of
  // rows x / 16 + 16 u: one shared offset and one row pointer, moved 16 rows a copy.
  constexpr int A_COPIES = BM * 16 / THREADS;
  const int a_r = threadIdx.x >> 4, a_c = threadIdx.x & 15;
  const uint32_t a_dst = (uint32_t)((a_c >> 3) * (BM * 128) + a_r * 128 + (((a_c & 7) ^ (a_r & 7)) << 4));
  const T* a_src = A + (size_t)(m0 + a_r) * K + (size_t)q0 * STEP_K + 8 * a_c;
  const auto stage_load = [&](int slot, int kq) {
    const uint32_t sa = sa0 + (uint32_t)(slot * L::A_BYTES) + a_dst;
#pragma unroll
    for (int u = 0; u < A_COPIES; ++u) {
      const bool ok = m0 + a_r + 16 * u < M;
      cp_async16_zfill(sa + (uint32_t)(u * 16 * 128), ok ? a_src + (size_t)(16 * u) * K + kq * STEP_K : A, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < n_k) stage_load(s, s);
    cp_async_commit();
  }

  // Lanes of odd g handle their words in the order 1, 0, 3, 2 (words and scale bytes swapped
  // in pairs before the decode): the 8 lanes of a quarter warp (rows g, g + 1) then store chunks
  // t + 4 (j % 2) and t + 4 (1 - j % 2), distinct 16-byte bank groups of the swizzled rows
  // (without the swap both rows fill the same half of the banks: 2-way conflicts).
  const uint32_t odd = (uint32_t)(g & 1);
  const auto swap_pairs = [&](uint4& u) {
    const uint32_t x = u.x, z = u.z;
    u.x = odd ? u.y : x;
    u.y = odd ? x : u.y;
    u.z = odd ? u.w : z;
    u.w = odd ? z : u.w;
  };
  const uint32_t byte_order = odd ? 0x2301u : 0x3210u;

  // KBIT4: the code table after the A slots, filled while the first steps load and published
  // before the first decode (post is the codebook)
  WordDecoder<T, FMT, ENC> dec;
  if constexpr (FMT == FMT_KBIT4) {
    const uint32_t lut = sa0 + (uint32_t)(STAGES * L::A_BYTES);
    kfill.fill(reinterpret_cast<uint32_t*>(smem + (lut - raw)));
    __syncthreads();
    dec.lane_lut = lut + 4u * (uint32_t)lane;
  }
  float acc[BM / 8][4];
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // rows g, g+8 of this warp's tile in DQ: byte R * 128 of each k-block (R % 8 = g)
  const uint32_t row_g = (uint32_t)((16 * warp + g) * 128);
  // descriptors of k16 step 0 of a buffer / slot; step s adds its byte offset >> 4
  const uint64_t da0 = wgmma_desc_k128(dq0 + (uint32_t)(wg * 64 * 128));
  const uint64_t db0 = wgmma_desc_k128(sa0);
#pragma unroll 1
  for (int kt0 = 0; kt0 < n_k; kt0 += RING) {
#pragma unroll
    for (int d = 0; d < RING; ++d) {
      const int kt = kt0 + d;
      if (kt < n_k) {  // CTA-uniform
        const int buf = kt % L::DQ;
        const uint32_t dq = dq0 + (uint32_t)(buf * WG_DQ_BYTES);
        {
          if constexpr (FLAT > 0) {
            wa[d] = flat_chunk<FLAT>(pa[d], t);
            wb[d] = flat_chunk<FLAT>(pb[d], t);
          }
          swap_pairs(wa[d]);
          swap_pairs(wb[d]);
          const RowScale<T, FMT> s0 = row_scales<T, FMT>(__byte_perm(sr[d].x, 0u, byte_order));
          const RowScale<T, FMT> s1 = row_scales<T, FMT>(__byte_perm(sr[d].y, 0u, byte_order));
#pragma unroll
          for (int j = 0; j < 4; ++j) {  // slot j holds word j ^ odd
            uint32_t f[8];
            frags_of_word(dec, word_of(wa[d], j), word_of(wb[d], j), s0, s1, j, f);
            const uint32_t at = dq + (uint32_t)((j >> 1) * (WG_BN * 128)) + row_g +
                                ((((uint32_t)t + 4u * ((uint32_t)(j & 1) ^ odd)) ^ (uint32_t)g) << 4);
            sts128(at, f[0], f[2], f[4], f[6]);         // row g: k 8c .. 8c+7 in order
            sts128(at + 1024u, f[1], f[3], f[5], f[7]);  // row g+8
          }
        }
        if (kt + RING < n_k) load(d);
        wgmma_wait<INFLIGHT>();  // this warpgroup's group kt - 1 - INFLIGHT
        cp_async_wait<D - 1>();  // this thread's copies of step kt
        fence_proxy_async_smem();
        __syncthreads();
        const int slot = kt % STAGES;
        const uint64_t da = da0 + (uint64_t)((buf * WG_DQ_BYTES) >> 4);
        const uint64_t db = db0 + (uint64_t)((slot * L::A_BYTES) >> 4);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 8; ++s) {  // k-block s / 4, k16 step s % 4 (32 bytes) of its rows
          const uint32_t ka = (uint32_t)((s >> 2) * (WG_BN * 128) + (s & 3) * 32) >> 4;
          const uint32_t kb = (uint32_t)((s >> 2) * (BM * 128) + (s & 3) * 32) >> 4;
          Wgmma<T, BM>::run(acc, da + ka, db + kb);
        }
        wgmma_commit();
        // the copies go out while the tensor cores run, into the slot of step kt - 1 - INFLIGHT
        if (kt + D < n_k) stage_load((kt + D) % STAGES, kt + D);
        cp_async_commit();
      }
    }
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // acc[j][e] = C[m0 + 8j + 2t + e % 2, n0 + 16 warp + g + 8 (e / 2)]
  const bool split = gridDim.z > 1;
  float* wsz = ws + (size_t)blockIdx.z * M * N;
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = m0 + 8 * j + 2 * t + (e & 1);
      const int n = n0 + 16 * warp + g + 8 * (e >> 1);
      if (m >= M || n >= N) continue;
      if (split) __stcg(wsz + (size_t)m * N + n, acc[j][e]);
      else store_out<T, FMT>(C, bias, has_bias, post, alpha, m, n, N, acc[j][e]);
    }
  if (split)
    split_finish<T, FMT>(ws, counters + (size_t)blockIdx.y * gridDim.x + blockIdx.x, gridDim.z, C,
                         bias, has_bias, post, alpha, m0, BM, n0, WG_BN, M, N);
}

}  // namespace kg::fp4
