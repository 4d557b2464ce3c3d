// Native block-scaled GEMM of sm_120a / sm_121a (RTX 50 / GB10 class), mma.sync with scales:
//   KIND 0  kind::mxf8f6f4 m16n8k32, scale_vec::1X ue8m0: MXFP8 A x MXFP8 or MXFP4 B
//   KIND 1  kind::mxf4nvf4 m16n8k64, scale_vec::2X ue8m0: MXFP4 x MXFP4 (packed in smem)
//   KIND 2  kind::mxf4nvf4 m16n8k64, scale_vec::4X ue4m3: NVFP4 x NVFP4 (/ global scales)
// D[M, N] = alpha * (A * SF_A) . (B * SF_B)^T (+ bias[n]); A [M, K], B [N, K] packed along K
// exactly as kernelgen/mx/reference.py packs them; scales in the swizzled layout
// [ceil(rows/128), ceil(S/4), 32, 4, 4] (S = K / group).
//
// CTA tile BM x BN x 128 elements, warps WM x WN, STAGES-deep cp.async pipeline. A k-tile
// holds 128 / group scale columns: one (MX) or two (NVFP4) 512-byte chunks per 128 rows, so
// one 4-byte word per row and chunk carries the scales of four consecutive k-groups.
// kernelgen/mx_gemm/emulate.py mirrors this file's addressing in NumPy (CPU-tested).
#pragma once
#include "common/dtypes.cuh"
#include "common/ptx.cuh"
#include "mx_gemm/ops.cuh"

namespace kg {
namespace mx_gemm {

template <int KIND, int AE, int BE, int BM, int BN, int STAGES> struct BsShape {
  static constexpr int TKE = 128;                                   // k elements per k-tile
  static constexpr int A_ROW = AE == E2M1 ? 64 : 128;               // bytes of a row per k-tile
  static constexpr int B_ROW = BE == E2M1 ? 64 : 128;
  static constexpr int GROUP = KIND == 2 ? 16 : 32;
  static constexpr int CH = TKE / GROUP / 4;                        // scale chunks per k-tile
  static constexpr int KSTEP = KIND == 0 ? 32 : 64;                 // k of one mma
  static constexpr int RCA = BM > 128 ? BM / 128 : 1, RCB = BN > 128 ? BN / 128 : 1;
  static constexpr int A = BM * A_ROW, B = BN * B_ROW;
  static constexpr int SA = RCA * CH * 512, SB = RCB * CH * 512;
  static constexpr int STAGE = A + B + SA + SB;
  static constexpr int TOTAL = STAGES * STAGE;
};

// Byte b of row r in a tile of ROW-byte rows: 16-byte chunks XOR-swizzled by the row.
template <int ROW> __device__ __forceinline__ int bs_off(int r, int b) {
  constexpr int NC = ROW / 16;
  return r * ROW + ((((b >> 4) ^ r) & (NC - 1)) << 4) + (b & 15);
}

// Word of scale row R (counted from the 128-aligned chunk base) and chunk q of a k-tile.
template <int CH> __device__ __forceinline__ int bs_scale_off(int R, int q) {
  return (R >> 7) * CH * 512 + q * 512 + (R & 31) * 16 + ((R >> 5) & 3) * 4;
}

template <int KIND, int AE, int BE, int BM, int BN, int WM, int WN, int STAGES, typename OutT>
__device__ __forceinline__ void bs_gemm(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B,
                                        const uint8_t* __restrict__ SA, const uint8_t* __restrict__ SB,
                                        const float* __restrict__ gsa, const float* __restrict__ gsb,
                                        const OutT* __restrict__ bias, int has_bias,
                                        OutT* __restrict__ D, int M, int N, int K, float alpha) {
  using S = BsShape<KIND, AE, BE, BM, BN, STAGES>;
  constexpr int NT = WM * WN * 32;
  constexpr int WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8;
  static_assert(KIND == 0 ? AE != E2M1 : (AE == E2M1 && BE == E2M1), "format pair of the kind");
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN, g = lane >> 2, t = lane & 3;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords<8>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int KT = (K + S::TKE - 1) / S::TKE;
  const int kchunks = (K / S::GROUP + 3) / 4;  // scale chunks along K in the swizzled layout
  const int mchunks = (M + 127) / 128, nchunks = (N + 127) / 128;
  const size_t a_ld = (size_t)K * S::A_ROW / S::TKE, b_ld = (size_t)K * S::B_ROW / S::TKE;
  const uint32_t sbase = mx_smem_addr(smem);

  auto load = [&](int kt, int slot) {
    const uint32_t st = sbase + slot * S::STAGE;
#pragma unroll
    for (int i = tid; i < BM * S::A_ROW / 16; i += NT) {
      const int r = i / (S::A_ROW / 16), c = i % (S::A_ROW / 16);
      const size_t byte = (size_t)kt * S::A_ROW + c * 16;
      const bool ok = m0 + r < M && byte < a_ld;
      cp_async16(st + bs_off<S::A_ROW>(r, c * 16), ok ? A + (m0 + r) * a_ld + byte : A, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = tid; i < BN * S::B_ROW / 16; i += NT) {
      const int r = i / (S::B_ROW / 16), c = i % (S::B_ROW / 16);
      const size_t byte = (size_t)kt * S::B_ROW + c * 16;
      const bool ok = n0 + r < N && byte < b_ld;
      cp_async16(st + S::A + bs_off<S::B_ROW>(r, c * 16), ok ? B + (n0 + r) * b_ld + byte : B,
                 ok ? 16 : 0);
    }
    for (int i = tid; i < (S::SA + S::SB) / 16; i += NT) {  // [row chunk][q][512 bytes]
      const bool is_a = i < S::SA / 16;
      const int j = is_a ? i : i - S::SA / 16;
      const int rc = j / (S::CH * 32), q = (j / 32) % S::CH;
      const int chunk = (is_a ? m0 : n0) / 128 + rc, kc = kt * S::CH + q;
      const bool ok = chunk < (is_a ? mchunks : nchunks) && kc < kchunks;
      const uint8_t* base = is_a ? SA : SB;
      const uint8_t* src = ok ? base + ((size_t)chunk * kchunks + kc) * 512 + (j & 31) * 16 : base;
      cp_async16(st + S::A + S::B + (is_a ? 0 : S::SA) + j * 16, src, ok ? 16 : 0);
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
    cp_async_commit();
  }
  // scale rows of this lane: A row g + 8 * (lane & 1) of each 16-row piece, B column g
  const int ra0 = (m0 & 127) + wm * WTM + g + 8 * (lane & 1), rb0 = (n0 & 127) + wn * WTN + g;

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load(nk, nk % STAGES);
      cp_async_commit();
    }
    const uint32_t ta = sbase + (kt % STAGES) * S::STAGE, tb = ta + S::A;
    const uint32_t ssa = tb + S::B, ssb = ssa + S::SA;
#pragma unroll
    for (int ks = 0; ks < S::TKE / S::KSTEP; ++ks) {
      // scale registers: byte j = scale of the j-th k-group of this mma
      uint32_t sfa[MI], sfb[NI];
      constexpr int Q_PER_STEP = KIND == 2 ? 1 : 0;  // NVFP4: a chunk per k-step
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const uint32_t w = lds32(ssa + bs_scale_off<S::CH>(ra0 + i * 16, Q_PER_STEP ? ks : 0));
        sfa[i] = KIND == 2 ? w : w >> (KIND == 0 ? 8 * ks : 16 * ks);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const uint32_t w = lds32(ssb + bs_scale_off<S::CH>(rb0 + j * 8, Q_PER_STEP ? ks : 0));
        sfb[j] = KIND == 2 ? w : w >> (KIND == 0 ? 8 * ks : 16 * ks);
      }
      // operand fragments: byte offsets of this k-step inside the k-tile rows
      const int ka = ks * (S::KSTEP * S::A_ROW / S::TKE), kb = ks * (S::KSTEP * S::B_ROW / S::TKE);
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = wm * WTM + i * 16 + g;
        // fp8: 4 codes at k 4t (+16); packed fp4: 8 codes at k 8t (+32) -> both 4t bytes (+16)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          af[i][q] = lds32(ta + bs_off<S::A_ROW>(r + 8 * (q & 1), ka + 16 * (q >> 1) + 4 * t));
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int r = wn * WTN + j * 8 + g;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if constexpr (KIND == 0 && BE == E2M1)  // 4 codes at k 4t (+16) = 2 bytes at 2t (+8)
            bf[j][q] = e2m1x4_to_f8f6f4(mx_lds16(tb + bs_off<S::B_ROW>(r, kb + 8 * q + 2 * t)));
          else
            bf[j][q] = lds32(tb + bs_off<S::B_ROW>(r, kb + 16 * q + 4 * t));
        }
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          if constexpr (KIND == 0)
            MmaMxf8f6f4<AE, BE>::run(acc[i][j], af[i], bf[j], sfa[i], sfb[j]);
          else
            MmaMxf4nvf4<KIND == 2>::run(acc[i][j], af[i], bf[j], sfa[i], sfb[j]);
        }
    }
  }
  cp_async_wait<0>();

  const float scale = KIND == 2 ? alpha / (gsa[0] * gsb[0]) : alpha;
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const int col = n0 + wn * WTN + j * 8 + 2 * t;
    if (col >= N) continue;
    float b0 = 0.f, b1 = 0.f;
    if (has_bias) { b0 = to_float(bias[col]); b1 = to_float(bias[col + 1]); }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WTM + i * 16 + g + 8 * h;
        if (row < M) {
          OutT v[2] = {from_float<OutT>(fmaf(scale, acc[i][j][2 * h], b0)),
                       from_float<OutT>(fmaf(scale, acc[i][j][2 * h + 1], b1))};
          *reinterpret_cast<uint32_t*>(D + (size_t)row * N + col) = *reinterpret_cast<uint32_t*>(v);
        }
      }
  }
}

}  // namespace mx_gemm
}  // namespace kg
