// kbit GEMM, bandwidth path (decode, small M):  C[M, N] = A[M, K] . W[N, K]^T (+ bias[N])
//
//   A     [M, K]  T = half | bf16, row-major, 16-byte aligned rows (K % 128 == 0)
//   W     flat kbit layout of [N, K]: row n = K/32 consecutive blocks of 32 elements;
//         packed[(n*K/32 + kb)*BITS + b] = bit plane b of block kb (lane j -> bit j),
//         absmax[n*K/32 + kb] = E4M4 scale byte, codebook[2^BITS] fp32
//   C     [M, N]  T, written with round-to-nearest; fp32 accumulation throughout
//   ws    [split, M, N] fp32 partial sums, counters [m_tiles, N/16] u32 (split-K only)
//
// Work split. A warp owns 16 rows of W (one m16n8k16 "M" tile; the tokens are the mma's N=8
// columns, so the small M dimension costs no wasted weight bytes) and streams them over the
// CTA's K range. The 4 lanes of a quad (lanes 4g..4g+3) each take one *group* of 4 consecutive
// blocks (16*BITS bytes: 16-byte aligned for every BITS, loaded as BITS uint4) of rows g and
// g+8, so a warp step covers 16 rows x 512 k with 2*BITS 16-byte loads + 2 scale words a lane,
// and every byte it loads is a byte it decodes (no shuffles). The grid is persistent (one wave);
// a warp runs flat over (its tiles x quad steps), and each uint4 slot is reloaded with the next
// step's data (the next tile's too) as soon as its block is decoded: one step in flight, one
// register buffer.
//
// k order. The sum over k does not care in which order k is visited, so the mma's 16 k-slots
// are mapped to whatever the lane can decode cheaply: lane (g, t) feeds k-slots {2t, 2t+1,
// 2t+8, 2t+9} of mma step s of block j from elements {4s, 4s+1, 4s+2, 4s+3} of its own block j.
// A (the mma's B operand) is staged once per CTA in shared memory and read in the same order:
// one 8-byte load per mma for those 4 consecutive k.
//
// Decode. Two elements at a time through a shared-memory table indexed by a "pair code": the
// 2*BITS bits {plane b bit e, plane b bit e+1}_b, which a few bit-select ops build for 4 pairs
// per 32-bit word. Each table entry holds the half2/bf16x2 (cb[i_e], cb[i_e+1]), replicated per
// lane (32 copies; 16 for BITS=5) so that random codes never collide in a bank. The table
// holds codebook values times a power of two (ScaleBits); the 4 lanes of a quad feed 4
// different blocks into one mma, so each W pair is multiplied by its block's E4M4 scale in T
// (scale over that power of two, exact; one rounding of the product) before the mma, and the
// fp32 accumulators are kept per block index j (4 independent mma chains).
//
// K warps (KW > 1): the KW warps w = KW*slot + kp of a CTA share one tile at a time; warp kp
// takes the tile's quad steps kp, kp + KW, ... (adjacent 512-k chunks of a row in flight
// together), all KW warps run the same step count (a step past the range decodes with zero
// scales), and at the end of a tile warps kp > 0 leave their fp32 sums in shared memory for
// warp kp = 0, which adds them in kp order (deterministic) and stores: more resident warps per
// tile without a global split. One named barrier per slot and tile; the sums are
// double-buffered by tile parity, so a warp never overwrites a buffer not yet read.
//
// Split-K (grid.y > 1): each CTA covers a K range; partial sums go to ws, and the last warp to
// finish a tile (a per-tile counter) adds the partials in split order (deterministic), adds
// the bias, writes C and resets the counter for the next launch.
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "common/splitk.cuh"

namespace kg::kbit_gemm {

constexpr int TILE_ROWS = 16;     // W rows per warp tile (mma M)
constexpr int GROUP_BLOCKS = 4;   // blocks per lane per step
constexpr int GROUP_K = 32 * GROUP_BLOCKS;  // 128: k per group; K % 128 == 0
constexpr uint32_t FULL = 0xffffffffu;

// -- block scales: ScaleBits, table_value, scale2 (common/e4m4.cuh) ---------------------------

// -- pair-code table ------------------------------------------------------------------------
// Entry c (code of 2*BITS bits, bit 2b+i = plane b of element i) = pair (cb[i0], cb[i1]),
// replicated COPIES times, lane l reading copy l % COPIES at byte c*STRIDE + 4*(l % COPIES).
// STRIDE = 256 for BITS <= 3 lets one prmt build the address (code in byte 1, lane*4 in byte 0).
template <int BITS> struct Lut {
  static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
  static constexpr int ENTRIES = 1 << (2 * BITS);
  static constexpr int COPIES = BITS == 5 ? 16 : 32;
  static constexpr int STRIDE = BITS <= 3 ? 256 : 4 * COPIES;
  static constexpr int BYTES = ENTRIES * STRIDE;  // 4K, 16K, 32K, 64K
};

// Lane l's codebook value cb[l mod 2^BITS] for fill_lut, read before the kernel's first weight
// loads (read after them, it waited behind them: the tiled 4-bit GEMV entered its loop ~0.7 us
// later, fp4.cuh Kbit4Fill).
template <int BITS>
__device__ __forceinline__ float lane_codebook(const float* __restrict__ codebook) {
  return __ldg(codebook + (threadIdx.x & ((1 << BITS) - 1)));
}

// The CTA writes the table with 16-byte stores (4 copies of one entry each), consecutive lanes
// on consecutive 16 bytes; the codebook sits in registers (lane l holds cb[l mod 2^BITS],
// lane_codebook) and the trip count is a constant, so the loop unrolls and no shuffle waits on
// another.
template <typename T, int BITS, int THREADS>
__device__ __forceinline__ void fill_lut(unsigned char* lut, float lane_cb) {
  using L = Lut<BITS>;
  constexpr int VEC = L::COPIES / 4;          // 16-byte stores per entry
  constexpr int TOTAL = L::ENTRIES * VEC;     // a multiple of 32
  const float cb = table_value<T>(lane_cb);
#pragma unroll 8
  for (int i = threadIdx.x; i < (TOTAL + THREADS - 1) / THREADS * THREADS; i += THREADS) {
    const int c = min(i, TOTAL - 1) / VEC;    // warp-uniform bound: every lane shuffles
    int i0, i1;
    pair_indices<BITS>(c, i0, i1);
    const uint32_t p = pack2<T>(__shfl_sync(FULL, cb, i0), __shfl_sync(FULL, cb, i1));
    if (i < TOTAL)
      *reinterpret_cast<uint4*>(lut + c * L::STRIDE + (i % VEC) * 16) = make_uint4(p, p, p, p);
  }
}

// -- pair codes of one block ----------------------------------------------------------------------
// From the BITS plane words of a block: byte r of
//   le = code of elements (8r, 8r+1)     lo = (8r+4, 8r+5)
//   he = code of elements (8r+2, 8r+3)   ho = (8r+6, 8r+7)
// (planes 0..3: 2 bits per plane per pair, bit 2b+i = plane b of element i), and for BITS = 5
// the plane-4 bits of the same pairs in bits 0..1 of the bytes of le4/lo4/he4/ho4.
// mma step s uses the pairs starting at 4s (le/lo) and 4s+2 (he/ho): byte s/2 of the even word
// for even s, of the odd word for odd s.
template <int BITS> struct Codes {
  uint32_t le, lo, he, ho;
  uint32_t le4, lo4, he4, ho4;
};

template <int BITS>
__device__ __forceinline__ Codes<BITS> make_codes(const uint32_t* w) {
  constexpr uint32_t M2 = 0x33333333u, M4 = 0x0F0F0F0Fu;
  Codes<BITS> c;
  // nibble q of l01 / h01: planes 0,1 of the pair at 4q / 4q+2.
  const uint32_t l01 = bitsel(M2, w[0], w[1] << 2);
  const uint32_t h01 = bitsel(M2, w[0] >> 2, w[1]);
  if constexpr (BITS == 2) {
    c.le = l01 & M4;
    c.lo = (l01 >> 4) & M4;
    c.he = h01 & M4;
    c.ho = (h01 >> 4) & M4;
  } else {
    const uint32_t l23 = BITS == 3 ? (w[2] & M2) : bitsel(M2, w[2], w[3] << 2);
    const uint32_t h23 = BITS == 3 ? ((w[2] >> 2) & M2) : bitsel(M2, w[2] >> 2, w[3]);
    c.le = bitsel(M4, l01, l23 << 4);
    c.lo = bitsel(M4, l01 >> 4, l23);
    c.he = bitsel(M4, h01, h23 << 4);
    c.ho = bitsel(M4, h01 >> 4, h23);
  }
  if constexpr (BITS == 5) {
    const uint32_t l4 = w[4] & M2, h4 = (w[4] >> 2) & M2;
    c.le4 = l4 & M4;
    c.lo4 = (l4 >> 4) & M4;
    c.he4 = h4 & M4;
    c.ho4 = (h4 >> 4) & M4;
  }
  return c;
}

// Shared address of the table entry of one pair. lane_addr = table base + this lane's copy
// offset (BITS <= 3: only the copy offset, below 256; the base is added by the caller).
template <int BITS, int S, bool HI>
__device__ __forceinline__ uint32_t pair_addr(const Codes<BITS>& c, uint32_t lane_addr,
                                              uint32_t lut_base) {
  constexpr uint32_t R = S >> 1;
  const uint32_t w = HI ? ((S & 1) ? c.ho : c.he) : ((S & 1) ? c.lo : c.le);
  if constexpr (BITS <= 3) {
    // byte 0 = lane*4 (b byte 0), byte 1 = code (a byte R), bytes 2,3 = 0 (b byte 1)
    return lut_base + __byte_perm(w, lane_addr, 0x5504u | (R << 4));
  } else if constexpr (BITS == 4) {
    return lane_addr + (__byte_perm(w, 0u, 0x4440u | R) << 7);
  } else {
    const uint32_t w4 = HI ? ((S & 1) ? c.ho4 : c.he4) : ((S & 1) ? c.lo4 : c.le4);
    // bits 0..7 = code of planes 0..3, bits 8..9 = plane 4 (bytes 2,3: sign of w4's byte 0,
    // which is 0 since w4's bytes are at most 3)
    const uint32_t code = prmt<R | ((4u + R) << 4) | 0xCC00u>(w, w4);
    return lane_addr + (code << 6);
  }
}

// The mma of step S of block j: W fragments a0..a3 (rows g, g+8 already scaled), and the 4 k
// of lane t from A in shared memory, for NT n8 tiles.
template <typename T, int NT, int S>
__device__ __forceinline__ void mma_w(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                      const uint32_t (&arow)[NT], uint32_t kbase, int j,
                                      float (&acc)[NT][4]) {
  // B operand (A^T): the 4 k of lane t, block j, step S = 8-byte chunk (j&1)*8 + S of the
  // 128-byte line j>>1 (swizzled with x_a, which arow already holds).
  const uint32_t line = kbase + 128u * (uint32_t)(j >> 1);
  const uint32_t chunk = 8u * (uint32_t)((j & 1) * 8 + S);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint2 bfrag = lds64((arow[nt] + line) ^ chunk);
    Mma<T>::run(acc[nt], a0, a1, a2, a3, bfrag.x, bfrag.y);
  }
}

// One mma step S (compile-time: the pair selectors become immediates) of block j: rows g, g+8
// of W from the table, scaled by the rows' block scales. The 4 lanes of a quad feed 4
// different groups (blocks) into one mma, so the scale cannot wait for the fp32 sum: it
// multiplies the W pairs (one rounding in T).
template <typename T, int BITS, int NT, int S>
__device__ __forceinline__ void mma_step(const Codes<BITS>& ca, const Codes<BITS>& cb,
                                         uint32_t lane_addr, uint32_t lut_base,
                                         const uint32_t (&arow)[NT], uint32_t kbase, int j,
                                         uint32_t s0, uint32_t s1, float (&acc)[NT][4]) {
  // A operand (W): reg0 row g k(2t,2t+1) = pair 4S, reg1 row g+8, reg2/3 pair 4S+2.
  const uint32_t a0 = hmul2<T>(lds32(pair_addr<BITS, S, false>(ca, lane_addr, lut_base)), s0);
  const uint32_t a1 = hmul2<T>(lds32(pair_addr<BITS, S, false>(cb, lane_addr, lut_base)), s1);
  const uint32_t a2 = hmul2<T>(lds32(pair_addr<BITS, S, true>(ca, lane_addr, lut_base)), s0);
  const uint32_t a3 = hmul2<T>(lds32(pair_addr<BITS, S, true>(cb, lane_addr, lut_base)), s1);
  mma_w<T, NT, S>(a0, a1, a2, a3, arow, kbase, j, acc);
}

// -- A staging -----------------------------------------------------------------------------------
// As[m][k] (k relative to the CTA's K range, kr columns) with the 8-byte chunks of each
// 128-byte line XOR-swizzled by (k / 128 mod 4, m mod 4): the 16 lanes of a half warp read 16
// different chunk positions, i.e. all 32 banks once (see mma_step).
__device__ __forceinline__ uint32_t a_swizzle(int m, int k) {
  const int x = (((k >> 7) & 3) << 2) | (m & 3);
  return (uint32_t)((k & ~63) | ((((k >> 2) & 15) ^ x) << 2));
}

template <typename T>
__device__ __forceinline__ void stage_a(uint32_t as_base, const T* __restrict__ A, int rows,
                                        int kr, int K) {
  const int units = kr >> 4;  // 16-element units per row
  for (int m = 0; m < rows; ++m)
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      const int k = u << 4;
      const T* src = A + (size_t)m * K + k;
      const uint32_t row = as_base + 2u * (uint32_t)(m * kr);
#pragma unroll
      for (int c = 0; c < 4; ++c) cp_async8(row + 2u * a_swizzle(m, k + 4 * c), src + 4 * c);
    }
}

// -- epilogue of one warp tile ------------------------------------------------------------------
// Fragment (nt, 2h + e) = C[m0 + 8nt + 2t + e, 16*tile + g + 8h]. Without split-K: + bias, round,
// store. With split-K: store the fp32 partial to ws[blockIdx.y]; the warp that brings the tile's
// counter to gridDim.y adds all partials in split order (deterministic), adds the bias, writes
// C and resets the counter for the next launch (stream order).
template <typename T, int M_TILE, bool SPLIT>
__device__ __forceinline__ void store_tile(const float (&acc)[M_TILE / 8][4], int tile, int m0,
                                           int lane, const T* __restrict__ bias, int has_bias,
                                           T* __restrict__ C, float* __restrict__ ws,
                                           unsigned* __restrict__ counters, int M, int N,
                                           int n_tiles) {
  constexpr int NT = M_TILE / 8;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (!SPLIT) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = tile * TILE_ROWS + g + 8 * h;
      if (n >= N) continue;
      const float bv = has_bias ? to_float(bias[n]) : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * nt + 2 * t + e;
          if (m < M) C[(size_t)m * N + n] = from_float<T>(acc[nt][2 * h + e] + bv);
        }
    }
  } else {
    float* wsy = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = tile * TILE_ROWS + g + 8 * h;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * nt + 2 * t + e;
          if (n < N && m < M) __stcg(wsy + (size_t)m * N + n, acc[nt][2 * h + e]);
        }
    }
    __threadfence();  // this lane's partials are visible before the count moves
    __syncwarp();
    unsigned* cnt = counters + (size_t)blockIdx.z * n_tiles + tile;
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(cnt, 1u);
    prev = __shfl_sync(FULL, prev, 0);
    if (prev == gridDim.y - 1) {
      __threadfence();
      // lanes walk the tile's (token, row) outputs, rows fastest (common/splitk.cuh; 4 outputs x
      // 1 split in flight: 2 x 4 / 2 x 2 spill at m_tile 16 on sm_90a / sm_100a)
      sum_splits<4, 1>(ws, (size_t)M * N, (int)gridDim.y, lane, min(M_TILE, M - m0) * TILE_ROWS, 32,
                 [&](int p) -> long long {
                   const int m = m0 + p / TILE_ROWS, n = tile * TILE_ROWS + p % TILE_ROWS;
                   return n < N ? (long long)m * N + n : -1;
                 },
                 [&](int p, float v) {
                   const int m = m0 + p / TILE_ROWS, n = tile * TILE_ROWS + p % TILE_ROWS;
                   C[(size_t)m * N + n] = from_float<T>(v + (has_bias ? to_float(bias[n]) : 0.0f));
                 });
      __syncwarp();
      if (lane == 0) *cnt = 0u;
    }
  }
}

// -- K-warp reduction --------------------------------------------------------------------------------
__device__ __forceinline__ void sts128(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d) : "memory");
}
__device__ __forceinline__ float4 lds128f(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void bar_sync_named(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}


// -- the kernel body -------------------------------------------------------------------------------
// grid (ctas_x, split, m_tiles), WARPS warps a CTA (WARPS / KW tile slots); dynamic smem =
// Lut::BYTES + rows*gps*128*2 (A) + K-warp sums (2 parities x slots x (KW-1) x NT x
// 512 bytes, config.py kw_red_bytes). gps = groups (of 128 k) per split; every
// split is non-empty (the host guarantees it).
template <typename T, int BITS, int M_TILE, int WARPS, int KW, bool SPLIT>
__device__ __forceinline__ void gemv(const uint32_t* __restrict__ packed,
                                     const uint8_t* __restrict__ absmax,
                                     const float* __restrict__ codebook, const T* __restrict__ A,
                                     const T* __restrict__ bias, int has_bias, T* __restrict__ C,
                                     float* __restrict__ ws, unsigned* __restrict__ counters,
                                     int M, int N, int K, int gps) {
  static_assert(M_TILE == 8 || M_TILE == 16, "m_tile is 8 or 16 tokens");
  static_assert(KW >= 1 && WARPS % KW == 0, "a CTA's warps are whole K-warp slots");
  constexpr int NT = M_TILE / 8;  // mma n8 tiles
  constexpr int SLOTS = WARPS / KW;
  using L = Lut<BITS>;
  extern __shared__ __align__(128) unsigned char smem[];  // 128: the A swizzle XORs address bits
  const uint32_t lut_base = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t as_base = lut_base + L::BYTES;

  const float lane_cb = lane_codebook<BITS>(codebook);  // first: fill_lut's codebook value
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.z * M_TILE;
  const int rows = min(M_TILE, M - m0);
  const int G = K / GROUP_K;                 // groups per row
  const int g0 = blockIdx.y * gps;
  const int g1 = min(G, g0 + gps);
  const int kr = (g1 - g0) * GROUP_K;        // this CTA's K range

  // The first step's planes and scales. Without split-K at <= 4 bits (EARLY_W) they are
  // requested before the A slice and the table, so their DRAM latency overlaps that prologue
  // (ncu, 4096x4096 4 bits: 21% of the warps' samples waited on them after the barrier; H100,
  // graphs: 0.15-0.85 us a call at M = 1). Split-K and 5-bit configs load them after it (early,
  // 4-bit m_tile 16 and 5-bit m_tile 8 split spilled 8 bytes at 128 / 168 registers, and 5-bit
  // M = 1 took 10.05 -> 11.79 us on 4096x4096, 29.6 -> 32.1 on 14336x4096, behind its 64 KB
  // table fill). The walk's indices are set where the loads start (start_walk), so that a late
  // config holds none of them through the prologue, as before. Not on sm_100 (measured on
  // sm_90a only; there the 4-bit m_tile 8 kw 4 config spilled 4 bytes early).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && __CUDA_ARCH__ < 1200
  constexpr bool EARLY_W = false;
#else
  constexpr bool EARLY_W = !SPLIT && BITS <= 4;
#endif
  int kp, slot, n_it, n_tiles, tile0, tstride, n_steps;
  uint32_t row_u4;
  const uint4* w4 = reinterpret_cast<const uint4*>(packed);

  // 32-bit element offsets of rows r0 = 16*tile + g and r1 = r0 + 8 (W below 64 GB): uint4
  // of the planes, bytes of the scales; rows past N re-read row N-1 (nothing is stored).
  struct Rows { uint32_t w0, w1, s0, s1; };
  const auto rows_of = [&](int tile) {
    const uint32_t r0 = (uint32_t)min(tile * TILE_ROWS + g, N - 1);
    const uint32_t r1 = (uint32_t)min(tile * TILE_ROWS + g + 8, N - 1);
    return Rows{r0 * row_u4, r1 * row_u4, r0 * (uint32_t)(K / 32), r1 * (uint32_t)(K / 32)};
  };
  // this warp's step it is the tile's quad step it*KW + kp; a lane past the K range re-reads
  // a valid group (and gets zero scales)
  const auto group_of = [&](int it) { return min(g0 + (it * KW + kp) * 4 + t, g1 - 1); };

  // wa/wb: rows r0/r1, the group's 4 blocks x BITS plane words (block j at [j*BITS, (j+1)*BITS)),
  // loaded as BITS uint4 "slots". Rolling prefetch: as soon as block j's codes are built, the
  // slots whose last word belongs to block j are reloaded with the next step's data, so one
  // step of loads is in flight with a single register buffer.
  uint32_t wa[4 * BITS], wb[4 * BITS];
  const auto load_slot = [&](const Rows& r, int grp, int b) {
    const uint4 u = ld_nc_v4(w4 + (r.w0 + (uint32_t)(grp * BITS + b)));
    const uint4 v = ld_nc_v4(w4 + (r.w1 + (uint32_t)(grp * BITS + b)));
    wa[4 * b] = u.x; wa[4 * b + 1] = u.y; wa[4 * b + 2] = u.z; wa[4 * b + 3] = u.w;
    wb[4 * b] = v.x; wb[4 * b + 1] = v.y; wb[4 * b + 2] = v.z; wb[4 * b + 3] = v.w;
  };

  Rows cur;
  uint32_t sa = 0, sb = 0;
  const auto start_walk = [&]() {  // the walk's indices and the first step's loads
    kp = warp % KW;  // K warp
    slot = warp / KW;  // tile slot
    n_it = (((g1 - g0 + 3) >> 2) + KW - 1) / KW;  // this warp's quad steps of a tile
    n_tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
    row_u4 = (uint32_t)(G * BITS);  // uint4 per W row
    // This warp's tiles: tile0, tile0 + tstride, ... (the grid is persistent: at most one
    // wave). Steps run flat over (tile, quad step) so the next step's loads, also those of the
    // next tile, are always in flight while the current step is decoded.
    tile0 = blockIdx.x * SLOTS + slot;
    tstride = gridDim.x * SLOTS;
    n_steps = tile0 < n_tiles ? ((n_tiles - 1 - tile0) / tstride + 1) * n_it : 0;
    cur = rows_of(tile0);
    if (n_steps > 0) {
      const int grp = group_of(0);
#pragma unroll
      for (int b = 0; b < BITS; ++b) load_slot(cur, grp, b);
      sa = ld_nc_u32(absmax + (cur.s0 + 4u * grp));
      sb = ld_nc_u32(absmax + (cur.s1 + 4u * grp));
    }
  };
  if constexpr (EARLY_W) start_walk();

  stage_a<T>(as_base, A + (size_t)m0 * K + (size_t)g0 * GROUP_K, rows, kr, K);
  fill_lut<T, BITS, WARPS * 32>(smem, lane_cb);
  cp_async_wait_all();
  __syncthreads();

  if constexpr (!EARLY_W) start_walk();

  const uint32_t lane_addr = BITS <= 3 ? (uint32_t)lane * 4u
                                       : lut_base + (uint32_t)(lane % L::COPIES) * 4u;
  // A fragment rows: token g (+8 for the second n8 tile); tokens past M read row rows-1 (their
  // outputs are never stored), so every lane loads without a predicate. Every chunk this lane
  // reads has swizzle x_a = (t, g mod 4), and rows start 128-byte aligned, so the address of
  // chunk c of a line is (line start + 8*x_a) ^ 8c: one XOR a load.
  const uint32_t x_a = (uint32_t)((t << 2) | (g & 3));
  uint32_t arow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m = g + 8 * nt;
    arow[nt] = as_base + 2u * (uint32_t)(min(m, rows - 1) * kr + t * GROUP_K) + 8u * x_a;
  }

  // K-warp sums after the A slice (16-byte aligned: the slice is whole 256-byte rows)
  const uint32_t red_base = as_base + 2u * (uint32_t)(rows * gps * GROUP_K);
  int parity = 0;
  int tile = tile0, it = 0;
  float acc[GROUP_BLOCKS][NT][4];  // per block j of a group: independent mma chains
#pragma unroll
  for (int j = 0; j < GROUP_BLOCKS; ++j)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[j][nt][0] = acc[j][nt][1] = acc[j][nt][2] = acc[j][nt][3] = 0.0f;

  for (int step = 0; step < n_steps; ++step) {
    const bool more = step + 1 < n_steps;
    const bool last_of_tile = it + 1 == n_it;
    const int it_next = last_of_tile ? 0 : it + 1;
    const int tile_next = last_of_tile ? tile + tstride : tile;
    const Rows nxt = last_of_tile ? rows_of(tile_next) : cur;
    const int grp_next = group_of(it_next);
    uint32_t nsa = 0, nsb = 0;
    if (more) {
      nsa = ld_nc_u32(absmax + (nxt.s0 + 4u * grp_next));
      nsb = ld_nc_u32(absmax + (nxt.s1 + 4u * grp_next));
    }
    // A lane past the K range decodes a valid group (group_of) with zero scales, so that it
    // adds exact zeros, and reads A of the same clamped group (in range, finite): no predicate
    // or zero fill per mma. Bytes into the A row, relative to this lane's t * GROUP_K.
    const int rel = (it * KW + kp) * 4 + t, rel_c = min(rel, g1 - g0 - 1);
    const uint32_t kbase = 2u * (uint32_t)((rel_c - t) * GROUP_K);
    const uint32_t sa_k = rel == rel_c ? sa : 0u, sb_k = rel == rel_c ? sb : 0u;
#pragma unroll
    for (int j = 0; j < GROUP_BLOCKS; ++j) {
      const Codes<BITS> ca = make_codes<BITS>(wa + j * BITS);
      const Codes<BITS> cb = make_codes<BITS>(wb + j * BITS);
      if (more) {
#pragma unroll
        for (int b = 0; b < BITS; ++b)
          if ((4 * b + 3) / BITS == j) load_slot(nxt, grp_next, b);  // slot b's last block is j
      }
      // the block's E4M4 scale as a T pair, over ScaleBits<T>::TABLE (exact)
      const uint32_t s0 = scale2<T>(sa_k, j);
      const uint32_t s1 = scale2<T>(sb_k, j);
      // one accumulator set per block j: 4 independent mma chains instead of one
      mma_step<T, BITS, NT, 0>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 1>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 2>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 3>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 4>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 5>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 6>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
      mma_step<T, BITS, NT, 7>(ca, cb, lane_addr, lut_base, arow, kbase, j, s0, s1, acc[j]);
    }
    sa = nsa;
    sb = nsb;
    if (last_of_tile) {
      float sum[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sum[nt][i] = (acc[0][nt][i] + acc[1][nt][i]) + (acc[2][nt][i] + acc[3][nt][i]);
          acc[0][nt][i] = acc[1][nt][i] = acc[2][nt][i] = acc[3][nt][i] = 0.0f;
        }
      if constexpr (KW > 1) {
        // sums of K warps kp > 0 -> shared memory (buffer of this tile's parity) -> warp kp = 0
        const uint32_t buf = red_base + (uint32_t)(((parity * SLOTS + slot) * (KW - 1)) * NT * 512);
        if (kp > 0) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            sts128(buf + (uint32_t)((((kp - 1) * NT + nt) * 32 + lane) * 16), sum[nt][0],
                   sum[nt][1], sum[nt][2], sum[nt][3]);
        }
        bar_sync_named(1 + slot, 32 * KW);
        if (kp == 0) {
#pragma unroll
          for (int q = 0; q < KW - 1; ++q)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const float4 v = lds128f(buf + (uint32_t)(((q * NT + nt) * 32 + lane) * 16));
              sum[nt][0] += v.x; sum[nt][1] += v.y; sum[nt][2] += v.z; sum[nt][3] += v.w;
            }
          store_tile<T, M_TILE, SPLIT>(sum, tile, m0, lane, bias, has_bias, C, ws, counters, M,
                                       N, n_tiles);
        }
        parity ^= 1;
      } else {
        store_tile<T, M_TILE, SPLIT>(sum, tile, m0, lane, bias, has_bias, C, ws, counters, M, N,
                                     n_tiles);
      }
    }
    tile = tile_next;
    it = it_next;
    cur = nxt;
  }
}

}  // namespace kg::kbit_gemm
