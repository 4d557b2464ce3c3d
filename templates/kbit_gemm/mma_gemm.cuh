// kbit GEMM, tensor-core path (mid and large M):  C[M, N] = A[M, K] . W[N, K]^T (+ bias[N])
//
//   A     [M, K]  T = half | bf16, row-major, rows 16-byte aligned (K % 128 == 0)
//   W     the flat kbit layout the GEMV reads (one weight object serves both paths): row n is
//         K/32 consecutive blocks; packed[(n*K/32 + kb)*BITS + b] = bit plane b of block kb
//         (element i -> bit i), absmax[n*K/32 + kb] = E4M4 scale byte, codebook[2^BITS] fp32
//   C     [M, N]  T, round to nearest; fp32 accumulation
//   ws    [split, M, N] fp32 partials, counters [m_tiles * n_tiles] u32 (split-K only)
//
// CTA tile TILE_M x TILE_N x TILE_K=64 (two kbit blocks per row), 8 warps as WARPS_M x WARPS_N,
// a warp owns (TILE_M/WARPS_M) x (TILE_N/WARPS_N) of C as MT m16 x NT n8 mma tiles.
// STAGES-deep cp.async pipeline per k-tile: A (TILE_M rows x 128 B, 16-byte chunks XOR-swizzled
// by row so ldmatrix is conflict-free; rows past M zero-filled), the W planes (8*BITS bytes a
// row: 16-byte copies for even BITS, 8-byte for odd, whose rows are only 8-byte aligned) and
// the 4-byte aligned scale word holding the row's two E4M4 bytes of this k-tile.
//
// Dequant into mma B fragments in registers. Lane (g, t) feeds column g of an n8 tile with
// k = {2t, 2t+1, 2t+8, 2t+9} of a k16 step, i.e. in block j the element pairs starting at
// 8q + 2t (q = 0..3; step 2j+h uses q = 2h, 2h+1). Rotating each plane word right by 2t - 2b
// and masking puts plane b of pair q at bits 8q+2b, 8q+2b+1: one rotate + one LOP3 a plane gives
// the four 2*BITS-bit "pair codes" of the lane (BITS = 5: plane 4 in a second word). A shared
// table maps a pair code to the T pair (cb[i0], cb[i1]) (replicated per lane: random codes never
// share a bank; 8 copies for BITS = 5 to keep it at 32 KB), which is scaled by the row's block
// scale (exact E4M4 in T, one rounding, as the GEMV path) and fed to the mma. A pair decoded
// once serves the warp's MT m16 tiles.
//
// Work split: grid (m_tiles * n_tiles, split), split chosen at launch; tiles are rastered in groups of GROUP_M m-tiles
// so CTAs running together share W and A in L2. split > 1: each CTA covers kt_per_split k-tiles,
// stores its fp32 partial to ws[split index]; the CTA that brings the tile's counter to the
// split count adds the partials in split order (deterministic), adds the bias, writes C and
// resets the counter for the next launch.
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"

namespace kg::kbit_mma {

constexpr int TILE_K = 64;
constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr int GROUP_M = 8;

template <int BITS> struct PairLut {
  static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
  static constexpr int ENTRIES = 1 << (2 * BITS);
  static constexpr int COPIES = BITS == 5 ? 8 : 32;
  static constexpr int SHIFT = BITS == 5 ? 5 : 7;  // log2(COPIES * 4): bytes of one entry
  static constexpr int BYTES = ENTRIES * COPIES * 4;
};
// E4M4 byte -> its value as a T pair (exact), 256 entries after the pair table.
constexpr int SCALE_TABLE_BYTES = 256 * 4;

template <int BITS, int TILE_M, int TILE_N, int STAGES> struct Smem {
  static constexpr int A = TILE_M * TILE_K * 2;  // bytes a stage
  static constexpr int B = TILE_N * 8 * BITS;    // 2 blocks x BITS words a row
  static constexpr int S = TILE_N * 4;           // one aligned scale word a row
  static constexpr int STAGE = A + B + S;
  static constexpr int TABLES = PairLut<BITS>::BYTES + SCALE_TABLE_BYTES;
  static constexpr int BYTES = TABLES + STAGES * STAGE;
};

// Pair table: entry c (bit 2b+i = plane b of element i) = (cb[i0], cb[i1]) in T, COPIES copies;
// then the scale table.
template <typename T, int BITS>
__device__ __forceinline__ void fill_lut(uint32_t lut_base, const float* __restrict__ codebook) {
  if (threadIdx.x < 256) {
    const float v = e4m4_decode(threadIdx.x);
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(lut_base + PairLut<BITS>::BYTES + 4u * threadIdx.x),
                 "r"(pack2<T>(v, v)) : "memory");
  }
  using L = PairLut<BITS>;
  constexpr int VEC = L::COPIES / 4;  // 16-byte stores an entry
  for (int i = threadIdx.x; i < L::ENTRIES * VEC; i += THREADS) {
    const int c = i / VEC;
    int i0, i1;
    pair_indices<BITS>(c, i0, i1);
    const uint32_t p = pack2<T>(__ldg(codebook + i0), __ldg(codebook + i1));
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" :: "r"(lut_base + (uint32_t)i * 16u), "r"(p)
                 : "memory");
  }
}

// One stage: k-tile kt of A rows m0.. and W rows n0.. into shared memory (async).
template <typename T, int BITS, int TILE_M, int TILE_N>
__device__ __forceinline__ void load_stage(uint32_t st, const T* __restrict__ A,
                                           const uint32_t* __restrict__ packed,
                                           const uint8_t* __restrict__ absmax, int m0, int n0,
                                           int kt, int M, int K) {
  using S = Smem<BITS, TILE_M, TILE_N, 1>;
  // A: TILE_M rows x 8 chunks of 16 bytes; chunk c of row r at r*128 + 16*(c ^ (r & 7)).
#pragma unroll
  for (int i = threadIdx.x; i < TILE_M * 8; i += THREADS) {
    const int r = i >> 3, c = i & 7;
    const bool ok = m0 + r < M;
    const T* src = A + (size_t)(ok ? m0 + r : 0) * K + kt * TILE_K + c * 8;
    cp_async16(st + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)), src, ok ? 16u : 0u);
  }
  // W planes: row r = words [(n0+r)*K/32 + 2kt] * BITS .. + 2*BITS, stored at r*8*BITS.
  const uint32_t sb = st + S::A;
  const size_t kb = (size_t)(K / 32);
  if constexpr (BITS % 2 == 0) {
    constexpr int CH = BITS / 2;  // 16-byte chunks a row
#pragma unroll
    for (int i = threadIdx.x; i < TILE_N * CH; i += THREADS) {
      const int r = i / CH, c = i % CH;
      cp_async16(sb + (uint32_t)(r * 8 * BITS + c * 16),
                 packed + ((size_t)(n0 + r) * kb + 2 * kt) * BITS + c * 4);
    }
  } else {
    constexpr int CH = BITS;  // 8-byte chunks a row
#pragma unroll
    for (int i = threadIdx.x; i < TILE_N * CH; i += THREADS) {
      const int r = i / CH, c = i % CH;
      cp_async8(sb + (uint32_t)(r * 8 * BITS + c * 8),
                packed + ((size_t)(n0 + r) * kb + 2 * kt) * BITS + c * 2);
    }
  }
  // scales: the aligned word holding bytes 2kt, 2kt+1 of the row (bytes 2*(kt&1) .. of it)
  const uint32_t ss = sb + S::B;
  for (int i = threadIdx.x; i < TILE_N; i += THREADS)
    cp_async4(ss + 4u * (uint32_t)i, absmax + (((size_t)(n0 + i) * kb + 2 * kt) & ~(size_t)3));
}

// The BITS plane words of block j of one row (byte address of the row's 2 blocks in smem).
template <int BITS>
__device__ __forceinline__ void load_planes(uint32_t (&w)[BITS], uint32_t row_addr, int j) {
  const uint32_t a = row_addr + (uint32_t)(j * 4 * BITS);
  if constexpr (BITS == 4) {
    const uint4 v = lds128(a);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (BITS == 2) {
    const uint2 v = lds64(a);
    w[0] = v.x; w[1] = v.y;
  } else {
#pragma unroll
    for (int b = 0; b < BITS; ++b) w[b] = lds32(a + 4u * b);
  }
}

// Pair codes of this lane: byte q of lo = planes 0..3 of the pair at 8q + 2t (bit 2b+i),
// byte q of hi = plane 4 (BITS = 5).
template <int BITS> struct Codes { uint32_t lo, hi; };

template <int BITS>
__device__ __forceinline__ Codes<BITS> make_codes(const uint32_t (&w)[BITS], int t2) {
  Codes<BITS> c{0u, 0u};
#pragma unroll
  for (int b = 0; b < (BITS < 4 ? BITS : 4); ++b)
    c.lo |= __funnelshift_r(w[b], w[b], (uint32_t)(t2 - 2 * b) & 31u) & (0x03030303u << (2 * b));
  if constexpr (BITS == 5) c.hi = __funnelshift_r(w[4], w[4], (uint32_t)t2) & 0x03030303u;
  return c;
}

// Shared address of the table entry of pair Q for this lane's copy.
template <int BITS, int Q>
__device__ __forceinline__ uint32_t pair_addr(const Codes<BITS>& c, uint32_t lane_addr) {
  if constexpr (BITS == 5) {
    const uint32_t code = prmt<Q | ((4u + Q) << 4) | 0xCC00u>(c.lo, c.hi);  // 10-bit code
    return lane_addr + (code << PairLut<BITS>::SHIFT);
  } else {
    return lane_addr + (__byte_perm(c.lo, 0u, 0x4440u | Q) << PairLut<BITS>::SHIFT);
  }
}

// k16 step H of block J of the stage: B fragments of the warp's NT n8 tiles first (2 registers
// each), then one m16 A fragment at a time (ldmatrix) against all of them: MT*4 + ... registers
// of A would not leave room for a 64 x 32 warp tile at 2 CTAs/SM.
template <typename T, int BITS, int MT, int NT, int J, int H>
__device__ __forceinline__ void mma_step(const Codes<BITS> (&codes)[NT], const uint32_t (&sc)[NT],
                                         uint32_t lane_addr, uint32_t a_row_addr, uint32_t a_xor,
                                         float (&acc)[MT][NT][4]) {
  constexpr int S = 2 * J + H;  // k16 step within the k-tile
  uint32_t b[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    b[nt][0] = hmul2<T>(lds32(pair_addr<BITS, 2 * H>(codes[nt], lane_addr)), sc[nt]);
    b[nt][1] = hmul2<T>(lds32(pair_addr<BITS, 2 * H + 1>(codes[nt], lane_addr)), sc[nt]);
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {  // 16 rows per m16 tile: 2 KB of the 128-byte rows
    uint32_t a[4];
    ldmatrix_x4(a, a_row_addr + (uint32_t)(mt * 16 * 128) + (((uint32_t)(2 * S) << 4) ^ a_xor));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) Mma<T>::run(acc[mt][nt], a[0], a[1], a[2], a[3], b[nt][0], b[nt][1]);
  }
}

// Block J of a stage: decode codes and scales of the NT rows this lane feeds, two k16 steps.
template <typename T, int BITS, int MT, int NT, int J>
__device__ __forceinline__ void block_step(uint32_t b_rows, uint32_t s_rows, int t2, uint32_t s_shift,
                                           uint32_t scale_base, uint32_t lane_addr,
                                           uint32_t a_row_addr, uint32_t a_xor,
                                           float (&acc)[MT][NT][4]) {
  Codes<BITS> codes[NT];
  uint32_t sc[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    uint32_t w[BITS];
    load_planes<BITS>(w, b_rows + (uint32_t)(nt * 8 * 8 * BITS), J);
    codes[nt] = make_codes<BITS>(w, t2);
    const uint32_t sw = lds32(s_rows + (uint32_t)(nt * 8 * 4));
    sc[nt] = lds32(scale_base + (((sw >> (s_shift + 8 * J)) & 0xFFu) << 2));
  }
  mma_step<T, BITS, MT, NT, J, 0>(codes, sc, lane_addr, a_row_addr, a_xor, acc);
  mma_step<T, BITS, MT, NT, J, 1>(codes, sc, lane_addr, a_row_addr, a_xor, acc);
}

template <typename T, int BITS, int TILE_M, int TILE_N, int WARPS_M, int STAGES>
__device__ __forceinline__ void mma_gemm(const uint32_t* __restrict__ packed,
                                         const uint8_t* __restrict__ absmax,
                                         const float* __restrict__ codebook,
                                         const T* __restrict__ A, const T* __restrict__ bias,
                                         int has_bias, T* __restrict__ C, float* __restrict__ ws,
                                         unsigned* __restrict__ counters, int M, int N, int K,
                                         int kt_per_split) {
  constexpr int WARPS_N = WARPS / WARPS_M;
  constexpr int WTM = TILE_M / WARPS_M, WTN = TILE_N / WARPS_N;
  constexpr int MT = WTM / 16, NT = WTN / 8;
  static_assert(WTM % 16 == 0 && WTN % 8 == 0, "warp tile must be whole m16 x n8 tiles");
  using SM = Smem<BITS, TILE_M, TILE_N, STAGES>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t lut_base = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t scale_base = lut_base + PairLut<BITS>::BYTES;
  const uint32_t stage0 = lut_base + SM::TABLES;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;

  // grouped raster: GROUP_M m-tiles side by side share each W tile while it is in L2
  const int m_tiles = (M + TILE_M - 1) / TILE_M, n_tiles = N / TILE_N;
  const int pid = blockIdx.x, in_group = GROUP_M * n_tiles;
  const int first_m = (pid / in_group) * GROUP_M;
  const int gsz = min(m_tiles - first_m, GROUP_M);
  const int tm = first_m + (pid % in_group) % gsz, tn = (pid % in_group) / gsz;
  const int m0 = tm * TILE_M, n0 = tn * TILE_N;

  const int KT = K / TILE_K;
  const int kt0 = blockIdx.y * kt_per_split;
  const int kt1 = min(KT, kt0 + kt_per_split);
  const int nk = kt1 - kt0;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_stage<T, BITS, TILE_M, TILE_N>(stage0 + s * SM::STAGE, A, packed, absmax, m0, n0,
                                                    kt0 + s, M, K);
    cp_async_commit();
  }
  fill_lut<T, BITS>(lut_base, codebook);  // overlaps the first loads; published by the loop's barrier

  const uint32_t lane_addr = lut_base + 4u * (uint32_t)(lane % PairLut<BITS>::COPIES);
  // ldmatrix rows: lane l -> row l % 16 of an m16 tile, chunk 2s + l / 16 (swizzled by row)
  const int a_r = wm * WTM + (lane & 15);
  const uint32_t a_row_off = (uint32_t)(a_r * 128);
  const uint32_t a_xor = ((uint32_t)(lane >> 4) << 4) ^ ((uint32_t)(a_r & 7) << 4);
  // this lane's W rows: wn*WTN + nt*8 + g
  const int b_r = wn * WTN + g;

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

  for (int i = 0; i < nk; ++i) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage i landed for everyone; stage i-1 is free to overwrite
    {
      const int nxt = i + STAGES - 1;
      if (nxt < nk)
        load_stage<T, BITS, TILE_M, TILE_N>(stage0 + (nxt % STAGES) * SM::STAGE, A, packed, absmax, m0,
                                            n0, kt0 + nxt, M, K);
      cp_async_commit();
    }
    const uint32_t st = stage0 + (uint32_t)((i % STAGES) * SM::STAGE);
    const uint32_t a_row_addr = st + a_row_off;
    const uint32_t b_rows = st + SM::A + (uint32_t)(b_r * 8 * BITS);
    const uint32_t s_rows = st + SM::A + SM::B + (uint32_t)(b_r * 4);
    const uint32_t s_shift = 16u * ((kt0 + i) & 1);  // this k-tile's 2 bytes of the scale word
    block_step<T, BITS, MT, NT, 0>(b_rows, s_rows, 2 * t, s_shift, scale_base, lane_addr, a_row_addr,
                                   a_xor, acc);
    block_step<T, BITS, MT, NT, 1>(b_rows, s_rows, 2 * t, s_shift, scale_base, lane_addr, a_row_addr,
                                   a_xor, acc);
  }
  cp_async_wait<0>();

  // -- epilogue: fragment (mt, nt, 2h + e) = C[m0 + wm*WTM + 16mt + g + 8h, n0 + wn*WTN + 8nt + 2t + e]
  const int row0 = m0 + wm * WTM + g, col0 = n0 + wn * WTN + 2 * t;
  if (gridDim.y > 1) {  // split-K (a launch parameter: one cubin serves both)
    float* wsy = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row0 + 16 * mt + 8 * h;
        if (m >= M) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          __stcg(reinterpret_cast<float2*>(wsy + (size_t)m * N + col0 + 8 * nt),
                 make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]));
      }
    __threadfence();  // partials visible before the count moves
    __syncthreads();
    __shared__ unsigned last;
    unsigned* cnt = counters + (size_t)tm * n_tiles + tn;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // sum in split order (the same fp32 sum whichever CTA is last: its own partial is the
    // value it stored); four splits' loads of a fragment in flight before they are added (one
    // at a time, the rolled loop waited an L2 round trip for every split and fragment)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row0 + 16 * mt + 8 * h;
        if (m >= M) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* src = ws + (size_t)m * N + col0 + 8 * nt;
          float2 v = make_float2(0.0f, 0.0f);
#pragma unroll 1
          for (int y0 = 0; y0 < (int)gridDim.y; y0 += 4) {
            float2 p[4];
#pragma unroll
            for (int y = 0; y < 4; ++y)
              p[y] = y0 + y == (int)blockIdx.y ? make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1])
                     : y0 + y < (int)gridDim.y ? __ldcg(reinterpret_cast<const float2*>(src + (size_t)(y0 + y) * M * N))
                                               : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int y = 0; y < 4; ++y)
              if (y0 + y < (int)gridDim.y) {
                v.x += p[y].x;
                v.y += p[y].y;
              }
          }
          acc[mt][nt][2 * h] = v.x;
          acc[mt][nt][2 * h + 1] = v.y;
        }
      }
    if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch (stream order)
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = col0 + 8 * nt;
    float b0 = 0.0f, b1 = 0.0f;
    if (has_bias) {
      b0 = to_float(bias[n]);
      b1 = to_float(bias[n + 1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row0 + 16 * mt + 8 * h;
        if (m < M)
          *reinterpret_cast<uint32_t*>(C + (size_t)m * N + n) =
              pack2<T>(acc[mt][nt][2 * h] + b0, acc[mt][nt][2 * h + 1] + b1);
      }
  }
}

}  // namespace kg::kbit_mma
