// MXFP8 x MXFP8 GEMM on the fp8 mma.sync (sm_89+; the path for sm_90a and sm_100a):
//   D[M, N] = alpha * sum_kb (sa[m, kb] * sb[n, kb]) * (A[m, kb] . B[n, kb]) (+ bias[n])
// A [M, K] and B [N, K] row-major fp8 codes (K contiguous); E8M0 scales per 32 along K in the
// swizzled block-scaled layout [ceil(rows/128), ceil(K/128), 32, 4, 4].
//
// CTA tile BM x BN x 128 (one k-tile = 4 MX k-blocks = one 4-byte scale word per row of the
// swizzled layout), warps WM x WN, STAGES-deep cp.async pipeline. Each 32-wide k-block is one
// mma per 16x8 piece with zero C; its 4 results are added to the fp32 accumulators times
// sa * sb (E8M0 decoded by a shift into the fp32 exponent; one FMUL + one FFMA per element).
#pragma once
#include "common/dtypes.cuh"
#include "common/ptx.cuh"
#include "mx_gemm/ops.cuh"

namespace kg {
namespace mx_gemm {

using namespace kg::mx;

constexpr int TK = 128;  // k per pipeline stage (bytes of an fp8 row)

template <int BM, int BN, int STAGES> struct Fp8Smem {
  static constexpr int A = BM * TK, B = BN * TK;
  static constexpr int SA = (BM > 128 ? BM / 128 : 1) * 512, SB = (BN > 128 ? BN / 128 : 1) * 512;
  static constexpr int STAGE = A + B + SA + SB;
  static constexpr int TOTAL = STAGES * STAGE;
};

// Row r (< rows of the tile), 16-byte chunk c (0..7) of a 128-byte row: XOR swizzle so that
// ldmatrix (8 rows, same chunk) and the cp.async writes hit 8 different bank groups.
__device__ __forceinline__ int tile_off(int r, int c) { return r * TK + ((c ^ (r & 7)) << 4); }

template <int BM, int BN, int WM, int WN, int STAGES, bool UNROLL_KB, int AE, int BE, typename OutT>
__device__ __forceinline__ void fp8_gemm(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint8_t* __restrict__ SA, const uint8_t* __restrict__ SB,
                                         const OutT* __restrict__ bias, int has_bias, OutT* __restrict__ D,
                                         int M, int N, int K, float alpha) {
  constexpr int NT = WM * WN * 32;
  constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  constexpr int MI = WTM / 16, NI = WTN / 8;   // mma pieces per warp per k-block
  static_assert(MI >= 1 && NI % 2 == 0, "warp tile must be 16 x 16 multiples");
  using S = Fp8Smem<BM, BN, STAGES>;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, t = lane & 3;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords<8>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int KT = (K + TK - 1) / TK;                 // k-tiles = scale chunks per 128 rows
  const int mchunks = (M + 127) / 128, nchunks = (N + 127) / 128;
  const uint32_t sbase = mx_smem_addr(smem);

  // ---- producer: one k-tile of A, B and their scale chunks into stage `slot` -------------
  // Thread tid copies 16-byte chunk c = tid % 8 of rows tid / 8 + it * NT / 8: one base
  // pointer per operand, stepped by NT / 8 rows (keeps the per-copy state out of registers).
  static_assert(NT % 8 == 0 && (BM * 8) % NT == 0 && (BN * 8) % NT == 0, "copy split");
  const int c16 = tid & 7, r_base = tid >> 3;
  const uint8_t* a_src = A + (size_t)min(m0 + r_base, M - 1) * K + c16 * 16;
  const uint8_t* b_src = B + (size_t)min(n0 + r_base, N - 1) * K + c16 * 16;
  auto load = [&](int kt, int slot) {
    const uint32_t st = sbase + slot * S::STAGE;
    const int kbyte = kt * TK;
    const bool k_ok = kbyte + c16 * 16 < K;
#pragma unroll
    for (int it = 0; it < BM * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const bool ok = k_ok && m0 + r < M;
      mx_cp16_zfill(st + tile_off(r, c16), ok ? a_src + (size_t)it * (NT / 8) * K + kbyte : A, ok);
    }
#pragma unroll
    for (int it = 0; it < BN * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const bool ok = k_ok && n0 + r < N;
      mx_cp16_zfill(st + S::A + tile_off(r, c16), ok ? b_src + (size_t)it * (NT / 8) * K + kbyte : B, ok);
    }
    // scale chunks: 512 contiguous bytes per (128 rows, k-tile)
    for (int i = tid; i < (S::SA + S::SB) / 16; i += NT) {
      const bool is_a = i < S::SA / 16;
      const int j = is_a ? i : i - S::SA / 16;
      const int chunk = (is_a ? m0 : n0) / 128 + (j >> 5);
      const bool ok = chunk < (is_a ? mchunks : nchunks);
      const uint8_t* base = is_a ? SA : SB;
      const uint8_t* src = ok ? base + ((size_t)chunk * KT + kt) * 512 + (j & 31) * 16 : base;
      mx_cp16_zfill(st + S::A + S::B + (is_a ? 0 : S::SA) + j * 16, src, ok);
    }
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    mx_cp_commit();
  }

  // rows (of the 128-row scale chunk) this lane scales: tile row + offset of m0 in its chunk
  const int ra0 = (m0 & 127) + wm * WTM + g, rb0 = (n0 & 127) + wn * WTN + 2 * t;

  for (int kt = 0; kt < KT; ++kt) {
    mx_cp_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load(nk, nk % STAGES);
      mx_cp_commit();
    }
    const int slot = kt % STAGES;
    const uint32_t sa_tile = sbase + slot * S::STAGE, sb_tile = sa_tile + S::A;
    const uint32_t ssa = sb_tile + S::B, ssb = ssa + S::SA;

    // scale words: 4 k-blocks of one row / column each
    uint32_t wa[MI][2], wb[NI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) wa[i][h] = lds32(ssa + swz_off(ra0 + i * 16 + h * 8, 0));
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) wb[j][h] = lds32(ssb + swz_off(rb0 + j * 8 + h, 0));

#pragma unroll (UNROLL_KB ? 4 : 1)
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = wm * WTM + i * 16 + (lane & 15);
        mx_ldsm_x4(af[i], sa_tile + tile_off(r, kb * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        const int r = wn * WTN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t q[4];
        mx_ldsm_x4(q, sb_tile + tile_off(r, kb * 2 + ((lane >> 3) & 1)));
        bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
      }
      // E8M0 -> fp32 by moving the byte into the exponent field (0x00 -> 0.0 instead of
      // 2^-127: only all-zero or sub-2^-119 groups have it; 0xFF -> +Inf, so a NaN group
      // poisons its outputs with Inf / NaN)
      float fa[MI][2], fb[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) fa[i][h] = __uint_as_float(((wa[i][h] >> (8 * kb)) & 0xFFu) << 23);
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) fb[j][h] = __uint_as_float(((wb[j][h] >> (8 * kb)) & 0xFFu) << 23);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          float d[4];
          MmaFp8<AE, BE>::run(d, af[i], bf[j]);
          // sa * sb are both exact powers of two: acc += (d * sa) * sb, one rounding
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc[i][j][e] = fmaf(d[e] * fa[i][e >> 1], fb[j][e & 1], acc[i][j][e]);
        }
    }
  }
  mx_cp_wait<0>();

  // ---- epilogue: alpha * acc + bias, rounded to OutT, pairs of columns --------------------
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const int col = n0 + wn * WTN + j * 8 + 2 * t;
    if (col >= N) continue;  // N % 8 == 0: a pair is in or out as a whole
    float b0 = 0.f, b1 = 0.f;
    if (has_bias) { b0 = to_float(bias[col]); b1 = to_float(bias[col + 1]); }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WTM + i * 16 + g + 8 * h;
        if (row < M) {
          OutT v[2] = {from_float<OutT>(fmaf(alpha, acc[i][j][2 * h], b0)),
                       from_float<OutT>(fmaf(alpha, acc[i][j][2 * h + 1], b1))};
          *reinterpret_cast<uint32_t*>(D + (size_t)row * N + col) = *reinterpret_cast<uint32_t*>(v);
        }
      }
  }
}

}  // namespace mx_gemm
}  // namespace kg
