// MXFP8 x MXFP8 GEMM for sm_90a / sm_100a / sm_103a, sm_89 and sm_80 on mma.sync / wgmma:
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
// sm_80 (A100, and the 8.6 parts that run its cubins) has no fp8 instruction: SOFT converts by
// integer ops (ops.cuh fp8x2_to_f16x2_soft, the same f16 bits); the rest of the mma.sync
// kernel is the same. sm_89 (Ada), whose fp8 mma.sync is a tensor-core instruction at twice
// the f16 rate, takes MMA8 (HB = 0 without wgmma): the stages rescaled in place as for the fp8
// wgmma below, then ldmatrix + mma.sync m16n8k32 straight from them.
//
// Pipeline per k-tile: cp.async of fp8 tiles + scale chunks (STAGES deep) -> barrier ->
// convert to the f16 tiles -> barrier -> ldmatrix + mma over the f16 tiles. The first barrier
// of the next k-tile orders its conversion after every warp's mma reads. The opt-in wgmma
// variant (sm_90a) issues wgmma from the f16 tiles instead; with two f16 tile sets (HB = 2)
// it leaves the wgmma running while the next k-tile is converted.
//
// HB = 0 (wgmma only): no f16 tiles. Each fp8 chunk is rescaled in place, to the nearest
// fp8 of its value times 2^(e_kb - E) (a no-op for blocks at the row's largest scale), and
// the fp8 wgmma (k32, QGMMA at twice the f16 rate) reads the stage directly; the rescale of
// k-tile kt runs under the wgmma of kt - 1. Values keep every bit while the scaled code stays
// a normal fp8 number; below that they round to the format's subnormal step (2^-9 for e4m3,
// 2^-16 for e5m2, relative to the row's largest block scale), which is far below the output
// rounding. NaN codes stay NaN; an e5m2 Inf in a rescaled block saturates to the largest
// finite value. PRE: the same rescale done once per operand row by rescale_rows (a pass over
// A and B, ~3% of a large GEMM's time) instead of in every CTA that loads the row; the main
// loop then only copies and multiplies.
#pragma once
#include "common/dtypes.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "common/wgmma.cuh"
#include "mx_gemm/ops.cuh"

namespace kg {
namespace mx_gemm {

constexpr int TK = 128;  // k per pipeline stage (bytes of an fp8 row)

template <int BM, int BN, int STAGES, int HB> struct Fp8Smem {
  static constexpr int A = BM * TK, B = BN * TK;
  static constexpr int SA = (BM > 128 ? BM / 128 : 1) * 512, SB = (BN > 128 ? BN / 128 : 1) * 512;
  // HB == 0: the fp8 wgmma reads the stages, whose tiles must start on 1024-byte swizzle atoms
  // (the fp8 mma.sync of MMA8 needs no such alignment; it keeps the same layout)
  static constexpr int STAGE = HB == 0 ? (A + B + SA + SB + 1023) / 1024 * 1024 : A + B + SA + SB;
  static constexpr int H1 = (BM + BN) * TK * 2;  // one set of f16 tiles
  static constexpr int H = HB * H1;
  static constexpr int E = (BM + BN) * 4;        // per-row largest scale exponent
  static constexpr int TOTAL = STAGES * STAGE + H + E;
};

// fp8 tile: row r, 16-byte chunk c (0..7) of a 128-byte row, XOR-swizzled.
__device__ __forceinline__ int tile_off(int r, int c) { return r * TK + ((c ^ (r & 7)) << 4); }
// f16 tile: row r, 16-byte chunk c (0..15) of a 256-byte row, low 3 bits XOR-swizzled so that
// ldmatrix's 8 rows x 16 bytes hit 8 bank groups.
__device__ __forceinline__ int htile_off(int r, int c) { return r * 2 * TK + ((c ^ (r & 7)) << 4); }

// A warp's mma fragments of k step ks by ldmatrix, from the A tile at a (its rows a_row ..
// a_row + 16 MI) and the B tile at b (rows b_row .. b_row + 8 NI): fp8 stages (tile_off, a
// step of 32 k: 16-byte columns 2 ks, 2 ks + 1) or f16 tiles (F16: htile_off, 16 k a step)
template <bool F16, int MI, int NI>
__device__ __forceinline__ void ldsm_frags(uint32_t a, uint32_t b, int a_row, int b_row, int ks,
                                           int lane, uint32_t (&af)[MI][4], uint32_t (&bf)[NI][2]) {
  const auto off = [](int r, int c) { return F16 ? htile_off(r, c) : tile_off(r, c); };
#pragma unroll
  for (int i = 0; i < MI; ++i) ldmatrix_x4(af[i], a + off(a_row + i * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
  for (int j = 0; j < NI; j += 2) {
    uint32_t q[4];
    ldmatrix_x4(q, b + off(b_row + j * 8 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
    bf[j][0] = q[0]; bf[j][1] = q[1]; bf[j + 1][0] = q[2]; bf[j + 1][1] = q[3];
  }
}

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

// f16 tile of the wgmma variant: K-major, 128-byte swizzle - two regions of 64 k (128-byte
// rows), 16-byte chunk c8 of a row XOR (row & 7); region bases are 1024-byte aligned.
template <int ROWS> __device__ __forceinline__ int wg_off(int r, int c8) {
  return (c8 >> 3) * ROWS * 128 + r * 128 + (((c8 & 7) ^ (r & 7)) << 4);
}
// (the shared-memory matrix descriptor of both wgmma variants: common/wgmma.cuh wgmma_desc_k128)
template <int N> struct WgmmaF16;
// D[64 x N] += A[64 x 32] . B[N x 32]^T, fp8 (formats AE, BE) from shared memory; as WgmmaF16.
template <int N, int AE, int BE> struct WgmmaFp8;

__device__ __forceinline__ uint32_t hmul2_rn(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// 16 fp8 codes of one row and k-block (a 16-byte chunk) -> 16 scaled f16 in shared memory.
// Integer e4m3 decoding (SOFT, and always below sm_89): a chunk without NaN codes (the usual
// case) takes e4m3x2_to_f16x2_scaled with its 2^-8 folded into the scale (s2 * 2^8 is exact:
// s2 is 0 or a power of two <= 1 in every row whose outputs are kept), so each pair costs 3
// integer ops and the multiply.
template <int E, bool SOFT>
__device__ __forceinline__ void convert_chunk(uint32_t src, uint32_t dst0, uint32_t dst1, uint32_t s2) {
  constexpr bool kSoft = fp8_decode_soft<SOFT>();
  const uint4 v = lds128(src);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t h[8];
  if (kSoft && E == E4M3 &&
      (e4m3_nan_bytes(w[0]) | e4m3_nan_bytes(w[1]) | e4m3_nan_bytes(w[2]) | e4m3_nan_bytes(w[3])) == 0) {
    const uint32_t s2x = hmul2_rn(s2, 0x5C005C00u);  // s2 * 2^8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[2 * i] = hmul2_rn(e4m3x2_to_f16x2_scaled((uint16_t)(w[i] & 0xFFFFu)), s2x);
      h[2 * i + 1] = hmul2_rn(e4m3x2_to_f16x2_scaled((uint16_t)(w[i] >> 16)), s2x);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[2 * i] = hmul2_rn(fp8x2_to_f16x2<E, kSoft>((uint16_t)(w[i] & 0xFFFFu)), s2);
      h[2 * i + 1] = hmul2_rn(fp8x2_to_f16x2<E, kSoft>((uint16_t)(w[i] >> 16)), s2);
    }
  }
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst0), "r"(h[0]), "r"(h[1]),
               "r"(h[2]), "r"(h[3]) : "memory");
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst1), "r"(h[4]), "r"(h[5]),
               "r"(h[6]), "r"(h[7]) : "memory");
}

// Mantissa bits of the fp8 formats.
template <int E> struct Fp8Bits { static constexpr int MB = E == E4M3 ? 3 : 2; };

// 16 fp8 codes (v) times 2^-d (d >= 1; s2 the f16x2 splat of 2^-d), rounded to the nearest
// fp8. While every code's exponent field exceeds d (the result stays a normal number) and no
// code is NaN / Inf, this is exact integer arithmetic: the exponent field minus d, byte by
// byte. Otherwise through f16 (exact: the products are f16 numbers down to fp8's rounding
// step) and back (NaN stays NaN; an e5m2 Inf saturates).
template <int E> __device__ __forceinline__ uint4 rescale_codes(uint4 v, int d, uint32_t s2) {
  constexpr int MB = Fp8Bits<E>::MB;
  // magnitudes from which on a code is NaN / Inf: e4m3 0x7F, e5m2 0x7C
  constexpr uint32_t SPECIAL4 = (E == E4M3 ? 0x01u : 0x04u) * 0x01010101u;  // 0x80 - that
  const uint32_t t4 = (uint32_t)((d + 1) << MB) * 0x01010101u;  // smallest magnitude kept normal
  uint32_t w[4] = {v.x, v.y, v.z, v.w}, ok = 0x80808080u, special = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ok &= (w[i] | 0x80808080u) - t4;            // bit 7 of a byte: |code| >= t
    special |= (w[i] & 0x7F7F7F7Fu) + SPECIAL4;  // bit 7 of a byte: NaN / Inf
  }
  if (d < (128 >> MB) - 1 && ok == 0x80808080u && (special & 0x80808080u) == 0) {
    const uint32_t d4 = (uint32_t)(d << MB) * 0x01010101u;  // no borrow: every byte >= t > d4
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] -= d4;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = f16x2_to_fp8x2<E>(hmul2_rn(fp8x2_to_f16x2<E>((uint16_t)(w[i] & 0xFFFFu)), s2)) |
             (f16x2_to_fp8x2<E>(hmul2_rn(fp8x2_to_f16x2<E>((uint16_t)(w[i] >> 16)), s2)) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One fp8 k-tile (TK = 128 k) as four k32 wgmma steps in one group: this warpgroup's 64 A rows
// at shared address a, the B tile at b (both K-major, 128-byte swizzle, 1024-byte aligned).
template <int BN, int AE, int BE, int NI>
__device__ __forceinline__ void wgmma_fp8_ktile(float (&acc)[1][NI][4], uint32_t a, uint32_t b) {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int ks = 0; ks < TK / 32; ++ks)
    WgmmaFp8<BN, AE, BE>::run(acc, wgmma_desc_k128(a + ks * 32), wgmma_desc_k128(b + ks * 32));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int BM, int BN, int WM, int WN, int STAGES, bool UNROLL_KB, bool WG, int HB, bool PRE,
          bool SOFT, int AE, int BE, typename OutT>
__device__ __forceinline__ void fp8_gemm(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint8_t* __restrict__ SA, const uint8_t* __restrict__ SB,
                                         const int* __restrict__ EA, const int* __restrict__ EB,
                                         const OutT* __restrict__ bias, int has_bias, OutT* __restrict__ D,
                                         int M, int N, int K, float alpha) {
  constexpr int NT = WM * WN * 32;
  constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  constexpr int MI = WTM / 16, NI = WTN / 8;   // mma pieces per warp
  static_assert(MI >= 1 && NI % 2 == 0, "warp tile must be 16 x 16 multiples");
  static_assert(!WG || (WTM == 16 && WN == 1 && BM % 64 == 0), "wgmma: warps stacked along M");
  using S = Fp8Smem<BM, BN, STAGES, HB>;
  // MMA8 (no f16 tiles, no wgmma; sm_89+): the fp8 mma.sync reads the stages, rescaled in place
  constexpr bool MMA8 = HB == 0 && !WG;
  static_assert(HB == 1 || WG || MMA8, "two f16 tile sets: wgmma variants only");
  static_assert(!MMA8 || !SOFT, "the fp8 mma.sync needs no f16 conversion");
  static_assert(!PRE || (WG && HB == 0), "pre-rescaled operands: the fp8 wgmma variant");
  extern __shared__ __align__(1024) uint8_t smem[];  // 1024: the wgmma swizzle atoms

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
  const uint32_t h_base = sbase + STAGES * S::STAGE;

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
      cp_async16(st + tile_off(r, c16), ok ? a_src + (size_t)it * (NT / 8) * K + kbyte : A, ok ? 16 : 0);
    }
#pragma unroll
    for (int it = 0; it < BN * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const bool ok = k_ok && n0 + r < N;
      cp_async16(st + S::A + tile_off(r, c16), ok ? b_src + (size_t)it * (NT / 8) * K + kbyte : B,
                 ok ? 16 : 0);
    }
    // scale chunks: 512 contiguous bytes per (128 rows, k-tile), one 16-byte copy a thread
    // (the wgmma variant with HB == 0 copies each row's scale word instead, below)
    if ((HB != 0 || MMA8) && tid < (S::SA + S::SB) / 16) {
      const bool ok = sc_chunk_ok;
      cp_async16(st + S::A + S::B + tid * 16, ok ? sc_src + (size_t)kt * 512 : SA, ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }

  // ---- prologue: E = the largest scale exponent of each row of A and B over all of K -----
  // TPR threads per row (adjacent lanes) stride over the k-tiles, then combine by shuffles.
  int* e_rows = reinterpret_cast<int*>(smem + STAGES * S::STAGE + S::H);  // [BM + BN]
  {
    constexpr int ROWS = BM + BN, TPR = NT >= ROWS ? NT / ROWS : 1;
    static_assert(TPR <= 32 && (TPR & (TPR - 1)) == 0, "threads per row");
    if constexpr (PRE) {  // the rescale kernels wrote E of every row
      for (int row = tid; row < ROWS; row += NT) {
        const bool is_a = row < BM;
        const int R = (is_a ? m0 : n0 - BM) + row;
        e_rows[row] = R < (is_a ? M : N) ? __ldg((is_a ? EA : EB) + R) : 0;
      }
    } else
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

  if constexpr (PRE) {
    // operands rescaled beforehand (rescale_rows): the stages go to the fp8 wgmma as they land;
    // one group in flight, the stage of kt - 2 refilled with kt + STAGES - 2
    static_assert(STAGES >= 3, "two k-tiles in flight");
    const uint32_t a_rows = (warp >> 2) * 64 * TK;
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 3>();  // stage kt (stages up to kt - 1 + STAGES - 2 were issued)
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async bytes -> wgmma
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // kt - 2 read its stage
      __syncthreads();  // every thread's copies of kt in; kt - 2's stage free everywhere
      {
        const int nk = kt + STAGES - 2;
        if (kt >= 1 && nk < KT) load(nk, nk % STAGES);
        cp_async_commit();
      }
      const uint32_t st = sbase + (kt % STAGES) * S::STAGE;
      wgmma_fp8_ktile<BN, AE, BE>(acc, st + a_rows, st + S::A);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  } else if constexpr (WG && HB == 0) {
    // fp8 wgmma on the stages, one k-tile's wgmma group kept in flight. Iteration kt: rescale
    // k-tile kt in place (each thread the 16-byte chunks it copied itself, with the scale words
    // its row's c16 == 0 lane copied: no barrier before it) while the wgmma of kt - 1 runs;
    // wait for kt - 2's wgmma; barrier; refill kt - 2's stage; issue kt's four k32 steps.
    static_assert(STAGES >= 3, "two k-tiles in flight");
    const uint32_t a_rows = (warp >> 2) * 64 * TK;  // this warpgroup's 64 rows
    // scale words of the RA A rows and RB B rows a thread rescales, contiguous per thread row
    // group r_base (read back with WPT / 4 16-byte loads): word j of group r_base at stage
    // offset S::A + S::B + 4 (r_base WPT + j), the A rows first
    constexpr int RA = BM * 8 / NT, RB = BN * 8 / NT, WPT = RA + RB;
    static_assert(WPT % 4 == 0 && (NT / 8) * WPT * 4 <= S::SA + S::SB, "scale words");
    // (rows past M / N get zero words: 0 = their E, so their zero tiles are left alone)
    const uint8_t* sw_a[BM * 8 / NT];
    const uint8_t* sw_b[BN * 8 / NT];
    uint32_t ok_rows = 0;  // bit it: A row it in range; bit 8 + it: B row it
#pragma unroll
    for (int it = 0; it < BM * 8 / NT; ++it) {
      const int R = m0 + r_base + it * (NT / 8), Rc = min(R, M - 1);
      sw_a[it] = SA + (size_t)(Rc / 128) * KT * 512 + (Rc & 31) * 16 + ((Rc >> 5) & 3) * 4;
      ok_rows |= (uint32_t)(R < M) << it;
    }
#pragma unroll
    for (int it = 0; it < BN * 8 / NT; ++it) {
      const int R = n0 + r_base + it * (NT / 8), Rc = min(R, N - 1);
      sw_b[it] = SB + (size_t)(Rc / 128) * KT * 512 + (Rc & 31) * 16 + ((Rc >> 5) & 3) * 4;
      ok_rows |= (uint32_t)(R < N) << (8 + it);
    }
    static_assert(BM * 8 / NT <= 8 && BN * 8 / NT <= 24, "row bits");
    auto load_words = [&](int kt, int slot) {
      const uint32_t sw = sbase + slot * S::STAGE + S::A + S::B;
      if (c16 == 0) {
#pragma unroll
        for (int it = 0; it < RA; ++it)
          cp_async4_zfill(sw + 4 * (r_base * WPT + it), sw_a[it] + (size_t)kt * 512, (ok_rows >> it) & 1u);
#pragma unroll
        for (int it = 0; it < RB; ++it)
          cp_async4_zfill(sw + 4 * (r_base * WPT + RA + it), sw_b[it] + (size_t)kt * 512,
                          (ok_rows >> (8 + it)) & 1u);
      }
    };
    // the prologue above committed STAGES - 1 groups of load() (tiles only); one more group
    // now with their scale words; later stages come whole (tiles and words) in one group
    for (int s = 0; s < STAGES - 1 && s < KT; ++s) load_words(s, s);
    cp_async_commit();
    for (int kt = 0; kt < KT; ++kt) {
      // groups: STAGES - 1 tile groups, the words group, then one per iteration (iteration
      // j >= 1 loads stage j + STAGES - 2). Stage kt >= STAGES - 1 came with iteration
      // kt - STAGES + 2, which has STAGES - 3 newer groups; kt = 0 waits for everything
      if (kt == 0) cp_async_wait<0>(); else cp_async_wait<STAGES - 3>();
      __syncwarp();  // the c16 == 0 lane's scale words -> its row's other lanes
      const uint32_t st = sbase + (kt % STAGES) * S::STAGE;
      uint32_t words[WPT];
#pragma unroll
      for (int q = 0; q < WPT / 4; ++q) {
        const uint4 w4 = lds128(st + S::A + S::B + 16 * (r_base * (WPT / 4) + q));
        words[4 * q] = w4.x; words[4 * q + 1] = w4.y; words[4 * q + 2] = w4.z; words[4 * q + 3] = w4.w;
      }
      bool wrote = false;
      // four chunks at a time: their loads first, then the rescales and stores
#pragma unroll
      for (int j0 = 0; j0 < WPT; j0 += 4) {
        uint4 v[4];
        uint32_t addr[4];
#pragma unroll
        for (int j = j0; j < j0 + 4; ++j) {
          addr[j - j0] = j < RA ? st + tile_off(r_base + j * (NT / 8), c16)
                                : st + S::A + tile_off(r_base + (j - RA) * (NT / 8), c16);
          v[j - j0] = lds128(addr[j - j0]);
        }
#pragma unroll
        for (int j = j0; j < j0 + 4; ++j) {
          const int e = j < RA ? e_cva[j] : e_cvb[j - RA];
          const int b = (int)((words[j] >> (8 * (c16 >> 1))) & 0xFFu);
          if (b != e) {
            const uint32_t s2 = rel_scale_h2((uint32_t)b, (uint32_t)e);
            const uint4 o = j < RA ? rescale_codes<AE>(v[j - j0], e - b, s2)
                                   : rescale_codes<BE>(v[j - j0], e - b, s2);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr[j - j0]), "r"(o.x),
                         "r"(o.y), "r"(o.z), "r"(o.w) : "memory");
            wrote = true;
          }
        }
      }
      // rescaled bytes -> the wgmma (async proxy); a thread that wrote nothing has nothing to order
      if (wrote) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // kt - 2 read its stage
      __syncthreads();  // every thread's chunks of kt rescaled; kt - 2's stage free everywhere
      {
        const int nk = kt + STAGES - 2;  // into the stage of kt - 2
        if (kt >= 1 && nk < KT) {
          load(nk, nk % STAGES);
          load_words(nk, nk % STAGES);
        }
        cp_async_commit();
      }
      wgmma_fp8_ktile<BN, AE, BE>(acc, st + a_rows, st + S::A);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  } else
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed; every warp is done reading the f16 tiles
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load(nk, nk % STAGES);
      cp_async_commit();
    }
    const uint32_t st = sbase + (kt % STAGES) * S::STAGE;
    const uint32_t ssa = st + S::A + S::B, ssb = ssa + S::SA;
    const uint32_t h_a = h_base + (HB == 2 ? (kt & 1) * S::H1 : 0), h_b = h_a + BM * TK * 2;

    if constexpr (MMA8) {
      // ---- this thread's chunks of the stage rescaled in place to their row's largest block
      // scale (rescale_codes; chunks whose k-block has the row's largest scale stay as they are)
#pragma unroll
      for (int it = 0; it < (BM + BN) * 8 / NT; ++it) {
        const bool is_a = it < BM * 8 / NT;
        const int r = r_base + (is_a ? it : it - BM * 8 / NT) * (NT / 8);
        const uint32_t w = lds32(is_a ? ssa + swz_off((m0 & 127) + r, 0) : ssb + swz_off((n0 & 127) + r, 0));
        const int b = (int)((w >> (8 * (c16 >> 1))) & 0xFFu);
        const int e = is_a ? e_cva[it] : e_cvb[it - BM * 8 / NT];
        if (b < e) {  // b > e only in rows past M / N (E = 0 there; their outputs are dropped)
          const uint32_t addr = st + (is_a ? 0 : S::A) + tile_off(r, c16);
          const uint32_t s2 = rel_scale_h2((uint32_t)b, (uint32_t)e);
          const uint4 o = is_a ? rescale_codes<AE>(lds128(addr), e - b, s2)
                               : rescale_codes<BE>(lds128(addr), e - b, s2);
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(o.x), "r"(o.y),
                       "r"(o.z), "r"(o.w) : "memory");
        }
      }
      __syncthreads();  // the stage rescaled
      // ---- ldmatrix + fp8 mma.sync (k32) straight from the stage
#pragma unroll (UNROLL_KB ? 4 : 2)
      for (int ks = 0; ks < TK / 32; ++ks) {
        uint32_t af[MI][4], bf[NI][2];
        ldsm_frags<false>(st, st + S::A, wm * WTM, wn * WTN, ks, lane, af, bf);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j) MmaFp8<AE, BE>::run(acc[i][j], af[i], bf[j][0], bf[j][1]);
      }
      continue;
    }

    // ---- convert: fp8 chunk (row r, k 16c..16c+15) -> f16 times 2^(e_kb - E(row)) ---------
#pragma unroll
    for (int it = 0; it < BM * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const uint32_t w = lds32(ssa + swz_off((m0 & 127) + r, 0));
      convert_chunk<AE, SOFT>(st + tile_off(r, c16),
                        h_a + (WG ? wg_off<BM>(r, 2 * c16) : htile_off(r, 2 * c16)),
                        h_a + (WG ? wg_off<BM>(r, 2 * c16 + 1) : htile_off(r, 2 * c16 + 1)),
                        rel_scale_h2((w >> (8 * (c16 >> 1))) & 0xFFu, e_cva[it]));
    }
#pragma unroll
    for (int it = 0; it < BN * 8 / NT; ++it) {
      const int r = r_base + it * (NT / 8);
      const uint32_t w = lds32(ssb + swz_off((n0 & 127) + r, 0));
      convert_chunk<BE, SOFT>(st + S::A + tile_off(r, c16),
                        h_b + (WG ? wg_off<BN>(r, 2 * c16) : htile_off(r, 2 * c16)),
                        h_b + (WG ? wg_off<BN>(r, 2 * c16 + 1) : htile_off(r, 2 * c16 + 1)),
                        rel_scale_h2((w >> (8 * (c16 >> 1))) & 0xFFu, e_cvb[it]));
    }
    if constexpr (WG) {
      // generic-proxy stores -> visible to the tensor core's async proxy
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      // HB == 2: the previous k-tile's wgmma ran during this conversion; finish it before the
      // barrier, after which the next conversion may overwrite its tiles
      if constexpr (HB == 2) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    __syncthreads();  // f16 tiles ready

    if constexpr (WG) {
      // warpgroup w4 = warp / 4 owns rows 64 * w4 .. of the tile; k16 step ks: region ks / 4,
      // 32 bytes per step inside the 128-byte swizzled rows
      const uint32_t a_rows = h_a + (warp >> 2) * 64 * 128;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < TK / 16; ++ks)
        WgmmaF16<BN>::run(acc, wgmma_desc_k128(a_rows + (ks >> 2) * BM * 128 + (ks & 3) * 32),
                          wgmma_desc_k128(h_b + (ks >> 2) * BN * 128 + (ks & 3) * 32));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if constexpr (HB == 1) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    } else {
#pragma unroll (UNROLL_KB ? 8 : 2)
      for (int ks = 0; ks < TK / 16; ++ks) {
        uint32_t af[MI][4], bf[NI][2];
        ldsm_frags<true>(h_a, h_b, wm * WTM, wn * WTN, ks, lane, af, bf);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NI; ++j)
            Mma<half>::run(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][0], bf[j][1]);
      }
    }
  }
  if constexpr (WG && HB == 2) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  cp_async_wait<0>();

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

// Operand rows rescaled once for the PRE variant: Y[r, k] = the fp8 code of X[r, k] times
// 2^(e_kb - E_r), as rescale_codes, and Erow[r] = E_r (the largest E8M0 byte of row r; 0 for
// an all-zero-scale row). X, Y [rows, K] (K % 32 == 0, rows 16-byte aligned), scales SX in the
// swizzled layout. One warp a row, 16-byte chunks.
template <int E>
__device__ __forceinline__ void rescale_rows(const uint8_t* __restrict__ X, const uint8_t* __restrict__ SX,
                                             uint8_t* __restrict__ Y, int* __restrict__ Erow, int rows,
                                             int K) {
  const int r = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int KT = (K + TK - 1) / TK;
  const uint8_t* srow = SX + (size_t)(r / 128) * KT * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4;
  uint32_t m = 0;
  for (int kt = lane; kt < KT; kt += 32) m = __vmaxu4(m, ld_nc_u32(srow + (size_t)kt * 512));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = __vmaxu4(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int e = (int)max_byte(m);
  if (lane == 0) Erow[r] = e;
  const uint8_t* x = X + (size_t)r * K;
  uint8_t* y = Y + (size_t)r * K;
#pragma unroll 4
  for (int c = lane; c < K / 16; c += 32) {  // chunk c: k 16c .. 16c + 15, k-block c / 2
    uint4 v = ld_nc_v4(x + 16 * c);
    const int kb = c >> 1;
    const int b = (int)srow[(size_t)(kb >> 2) * 512 + (kb & 3)];
    if (b != e) v = rescale_codes<E>(v, e - b, rel_scale_h2((uint32_t)b, (uint32_t)e));
    *reinterpret_cast<uint4*>(y + 16 * c) = v;
  }
}

}  // namespace mx_gemm
}  // namespace kg
