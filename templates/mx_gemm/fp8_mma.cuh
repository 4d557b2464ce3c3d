// MXFP8 x MXFP8 GEMM for sm_90a / sm_100a on f16 mma.sync:
//   D[M, N] = alpha * sum_kb (sa[m, kb] * sb[n, kb]) * (A[m, kb] . B[n, kb]) (+ bias[n])
// A [M, K] and B [N, K] row-major fp8 codes (K contiguous); E8M0 scales per 32 along K in the
// swizzled block-scaled layout [ceil(rows/128), ceil(K/128), 32, 4, 4].
//
// Why f16: on sm_90 the fp8 mma.sync is not a tensor-core instruction of its own - ptxas
// turns it into an fp8 -> f16 conversion and two f16 HMMAs - and each 32-wide k-block would
// need its own fp32 rescale. Here every fp8 element is converted once per CTA, into a shared
// f16 tile, already multiplied by 2^(e_kb - E), where e_kb is its k-block's E8M0 exponent and
// E the largest exponent of its row over all of K (a prologue reads the row's scales once).
// The f16 products then accumulate over all of K in fp32 on the tensor core, and the
// epilogue multiplies by 2^(E(m) - 127) * 2^(E(n) - 127). Exact for e4m3 / e5m2 blocks within
// 2^15 / 2^8 of their row's largest scale; blocks further below keep their value to 2^-24 of
// the row's largest block (far below the output rounding).
//
// Pipeline per k-tile: cp.async of fp8 tiles + scale chunks (STAGES deep) -> barrier ->
// convert to the f16 tiles -> barrier -> ldmatrix + mma over the f16 tiles. The first barrier
// of the next k-tile orders its conversion after every warp's mma reads.
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
  static constexpr int H = (BM + BN) * TK * 2;  // the f16 tiles
  static constexpr int E = (BM + BN) * 4;        // per-row largest scale exponent
  static constexpr int TOTAL = STAGES * STAGE + H + E;
};

// fp8 tile: row r, 16-byte chunk c (0..7) of a 128-byte row, XOR-swizzled.
__device__ __forceinline__ int tile_off(int r, int c) { return r * TK + ((c ^ (r & 7)) << 4); }
// f16 tile: row r, 16-byte chunk c (0..15) of a 256-byte row, low 3 bits XOR-swizzled so that
// ldmatrix's 8 rows x 16 bytes hit 8 bank groups.
__device__ __forceinline__ int htile_off(int r, int c) { return r * 2 * TK + ((c ^ (r & 7)) << 4); }

// The largest of the 4 E8M0 bytes of a scale word.
__device__ __forceinline__ uint32_t max_byte(uint32_t w) {
  const uint32_t m = __vmaxu4(w, w >> 16);
  return max(m & 0xFFu, (m >> 8) & 0xFFu);
}

// f16x2 splat of 2^(b - emax) for E8M0 bytes b <= emax: exact down to 2^-24, 0 below.
__device__ __forceinline__ uint32_t rel_scale_h2(uint32_t b, uint32_t emax) {
  const int d = max((int)b - (int)emax, -126);
  const half h = __float2half_rn(__uint_as_float((uint32_t)(d + 127) << 23));
  const uint32_t u = __half_as_ushort(h);
  return u | (u << 16);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// 16 fp8 codes of one row and k-block (a 16-byte chunk) -> 16 scaled f16 in shared memory.
template <int E>
__device__ __forceinline__ void convert_chunk(uint32_t src, uint32_t dst0, uint32_t dst1, uint32_t s2) {
  const uint4 v = mx_lds128(src);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = hmul2(fp8x2_to_f16x2<E>((uint16_t)(w[i] & 0xFFFFu)), s2);
    h[2 * i + 1] = hmul2(fp8x2_to_f16x2<E>((uint16_t)(w[i] >> 16)), s2);
  }
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst0), "r"(h[0]), "r"(h[1]),
               "r"(h[2]), "r"(h[3]) : "memory");
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst1), "r"(h[4]), "r"(h[5]),
               "r"(h[6]), "r"(h[7]) : "memory");
}

template <int BM, int BN, int WM, int WN, int STAGES, bool UNROLL_KB, int AE, int BE, typename OutT>
__device__ __forceinline__ void fp8_gemm(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint8_t* __restrict__ SA, const uint8_t* __restrict__ SB,
                                         const OutT* __restrict__ bias, int has_bias, OutT* __restrict__ D,
                                         int M, int N, int K, float alpha) {
  constexpr int NT = WM * WN * 32;
  constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  constexpr int MI = WTM / 16, NI = WTN / 8;   // mma pieces per warp
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
  const uint32_t h_a = sbase + STAGES * S::STAGE, h_b = h_a + BM * TK * 2;

  // ---- producer: one k-tile of A, B and their scale chunks into stage `slot` -------------
  // Thread tid copies 16-byte chunk c = tid % 8 of rows tid / 8 + it * NT / 8: one base
  // pointer per operand, stepped by NT / 8 rows.
  static_assert(NT % 8 == 0 && (BM * 8) % NT == 0 && (BN * 8) % NT == 0, "copy split");
  const int c16 = tid & 7, r_base = tid >> 3;
  const uint8_t* a_src = A + (size_t)min(m0 + r_base, M - 1) * K + c16 * 16;
  const uint8_t* b_src = B + (size_t)min(n0 + r_base, N - 1) * K + c16 * 16;
  static_assert((S::SA + S::SB) / 16 <= NT, "one scale copy a thread");
  const bool sc_is_a = tid < S::SA / 16;
  const int sc_j = sc_is_a ? tid : tid - S::SA / 16;
  const int sc_chunk = (sc_is_a ? m0 : n0) / 128 + (sc_j >> 5);
  const bool sc_chunk_ok = sc_chunk < (sc_is_a ? mchunks : nchunks);
  const uint8_t* sc_src = (sc_is_a ? SA : SB) + (size_t)sc_chunk * KT * 512 + (sc_j & 31) * 16;
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
    // scale chunks: 512 contiguous bytes per (128 rows, k-tile), one 16-byte copy a thread
    if (tid < (S::SA + S::SB) / 16) {
      const bool ok = sc_chunk_ok;
      mx_cp16_zfill(st + S::A + S::B + tid * 16, ok ? sc_src + (size_t)kt * 512 : SA, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    mx_cp_commit();
  }

  // ---- prologue: E = the largest scale exponent of each row of A and B over all of K -----
  // TPR threads per row (adjacent lanes) stride over the k-tiles, then combine by shuffles.
  int* e_rows = reinterpret_cast<int*>(smem + STAGES * S::STAGE + S::H);  // [BM + BN]
  {
    constexpr int ROWS = BM + BN, TPR = NT >= ROWS ? NT / ROWS : 1;
    static_assert(TPR <= 32 && (TPR & (TPR - 1)) == 0, "threads per row");
    for (int row = tid / TPR; row < ROWS; row += NT / TPR) {
      const bool is_a = row < BM;
      const int R = (is_a ? m0 : n0 - BM) + row;  // global row of A or B
      const int rows = is_a ? M : N;
      uint32_t m = 0;
      if (R < rows) {
        const uint8_t* base = (is_a ? SA : SB) + (size_t)(R / 128) * KT * 512 +
                              (R & 31) * 16 + ((R >> 5) & 3) * 4;
#pragma unroll 16
        for (int kt = tid % TPR; kt < KT; kt += TPR) m = __vmaxu4(m, ld_nc_u32(base + (size_t)kt * 512));
      }
#pragma unroll
      for (int o = 1; o < TPR; o <<= 1) m = __vmaxu4(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (tid % TPR == 0) e_rows[row] = (int)max_byte(m);
    }
  }
  __syncthreads();
  // this thread's conversion rows: A rows r_base + it * NT / 8, B rows likewise
  int e_cva[BM * 8 / NT], e_cvb[BN * 8 / NT];
#pragma unroll
  for (int it = 0; it < BM * 8 / NT; ++it) e_cva[it] = e_rows[r_base + it * (NT / 8)];
#pragma unroll
  for (int it = 0; it < BN * 8 / NT; ++it) e_cvb[it] = e_rows[BM + r_base + it * (NT / 8)];

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  for (int kt = 0; kt < KT; ++kt) {
    mx_cp_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed; every warp is done reading the f16 tiles
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load(nk, nk % STAGES);
      mx_cp_commit();
    }
    const uint32_t st = sbase + (kt % STAGES) * S::STAGE;
    const uint32_t ssa = st + S::A + S::B, ssb = ssa + S::SA;

    // ---- convert: fp8 chunk (row r, k 16c..16c+15) -> f16 times 2^(e_kb - E(row)) ---------
#pragma unroll
    for (int it = 0; it < BM * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const uint32_t w = lds32(ssa + swz_off((m0 & 127) + r, 0));
      convert_chunk<AE>(st + tile_off(r, c16), h_a + htile_off(r, 2 * c16),
                        h_a + htile_off(r, 2 * c16 + 1),
                        rel_scale_h2((w >> (8 * (c16 >> 1))) & 0xFFu, e_cva[it]));
    }
#pragma unroll
    for (int it = 0; it < BN * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const uint32_t w = lds32(ssb + swz_off((n0 & 127) + r, 0));
      convert_chunk<BE>(st + S::A + tile_off(r, c16), h_b + htile_off(r, 2 * c16),
                        h_b + htile_off(r, 2 * c16 + 1),
                        rel_scale_h2((w >> (8 * (c16 >> 1))) & 0xFFu, e_cvb[it]));
    }
    __syncthreads();  // f16 tiles ready

#pragma unroll (UNROLL_KB ? 8 : 2)
    for (int ks = 0; ks < TK / 16; ++ks) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        mx_ldsm_x4(af[i], h_a + htile_off(wm * WTM + i * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        uint32_t q[4];
        mx_ldsm_x4(q, h_b + htile_off(wn * WTN + j * 8 + (lane & 7) + ((lane >> 4) << 3),
                                      2 * ks + ((lane >> 3) & 1)));
        bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma_f16(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  mx_cp_wait<0>();

  // ---- epilogue: alpha * 2^(E(m) - 127) * 2^(E(n) - 127) * acc + bias, pairs of columns --
  // (E8M0 0 -> 0.0: such a row has only zero-scale blocks, whose f16 values were 0 anyway)
  float pa[MI][2];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      pa[i][h] = alpha * __uint_as_float((uint32_t)e_rows[wm * WTM + i * 16 + g + 8 * h] << 23);
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const int col = n0 + wn * WTN + j * 8 + 2 * t;
    if (col >= N) continue;  // N % 8 == 0: a pair is in or out as a whole
    const int cl = BM + wn * WTN + j * 8 + 2 * t;
    const float p0 = __uint_as_float((uint32_t)e_rows[cl] << 23);
    const float p1 = __uint_as_float((uint32_t)e_rows[cl + 1] << 23);
    float b0 = 0.f, b1 = 0.f;
    if (has_bias) { b0 = to_float(bias[col]); b1 = to_float(bias[col + 1]); }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WTM + i * 16 + g + 8 * h;
        if (row < M) {
          OutT v[2] = {from_float<OutT>(fmaf(acc[i][j][2 * h] * p0, pa[i][h], b0)),
                       from_float<OutT>(fmaf(acc[i][j][2 * h + 1] * p1, pa[i][h], b1))};
          *reinterpret_cast<uint32_t*>(D + (size_t)row * N + col) = *reinterpret_cast<uint32_t*>(v);
        }
      }
  }
}

}  // namespace mx_gemm
}  // namespace kg
