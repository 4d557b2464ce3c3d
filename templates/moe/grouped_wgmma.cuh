// MoE grouped GEMM on warpgroup MMA (sm_90a): the prefill path of templates/moe/grouped.cuh.
//
// Same contract, work items, loaders, zero-fill of rows past the segment / N / K, SwiGLU
// weight-row interleave and epilogue as kg::moe::Grouped (this file reuses them through the
// instantiation G below, tokens on P, no swap_ab); only the main loop differs:
//
// - CTA tile TM tokens x TN (virtual) weight rows; TM / 64 warpgroups, warpgroup w issues
//   wgmma.m64nTNk16 for tokens 64 w .. 64 w + 63 against all TN weight rows (acc: TN / 2
//   floats a thread, the m16n8 fragment layout of a warp tile of 16 x TN: G's epilogue
//   with warp tile P = 16, Q = TN).
// - The stage layout of grouped.cuh (128-byte rows of 64 k, 16-byte chunks XOR row % 8) is the
//   K-major 128-byte swizzle wgmma reads, given 1024-byte aligned tiles: the stages start on
//   a 1024-byte boundary of the dynamic allocation (aligned at run time) and every tile is a
//   multiple of 8 rows.
// - In tiles of more than 128 tokens a warpgroup whose 64 tokens lie past the tile's rows (an
//   expert's last, partial tile) issues no wgmma: its accumulators stay zero and the epilogue
//   stores none of its rows. 128-token tiles keep the unconditional loop: the branch measured
//   5-9% slower on compute-bound 128 x 256 SwiGLU tiles (H100, session 20).
// - Pipeline over STAGES slots, INFLIGHT (0 or 1) wgmma groups left pending across the
//   barrier. Every thread cp.asyncs its chunks; at k-tile kt each thread waits for its copies
//   of kt, fences them into the async proxy, the CTA syncs, each warpgroup issues four k16
//   wgmmas of kt and commits, the CTA issues the copies of kt + D (D = STAGES - 1 - INFLIGHT)
//   into the slot of kt - 1 - INFLIGHT, then waits until INFLIGHT groups are pending. A slot
//   is refilled only after every warpgroup waited for its group (before the barrier of kt).
//   INFLIGHT 1 keeps the tensor core busy across the barrier and the copy issue; INFLIGHT 0
//   prefetches one k-tile deeper in the same shared memory (bubbles at the barrier, which a
//   second CTA on the SM can fill).
// - GroupedWgmmaTma (the selector's choice, MoeGemmConfig.tma): each stage copied by thread 0
//   as two bulk tensor copies completing on the slot's mbarrier, no CTA barrier. H100,
//   T = 4096: 6-18% faster on E256 (weight-read bound) and 18-24% on E8 (compute bound) than
//   the cp.async copies of GroupedWgmma, which stays for tuning and comparison
//   (BENCHMARKS.md, session 21).
#pragma once
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "moe/grouped.cuh"

namespace kg::moe {

// One k-tile of a warpgroup: 64 tokens at sx (64 rows of the X tile) x TN weight rows at sw,
// four k16 steps of 32 bytes into the 128-byte swizzled rows; one commit group.
template <typename T, int TN>
__device__ __forceinline__ void wgmma_k_tile(float (&acc)[1][TN / 8][4], uint32_t sx, uint32_t sw) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < TK / 16; ++ks)
    Wgmma<T, TN>::run(acc[0], wgmma_desc_k128(sx + ks * 32), wgmma_desc_k128(sw + ks * 32));
  wgmma_commit();
}

// The chunks one thread copies into a stage (X rows, then W rows at dst + TM rows), with the
// rows, zero fill and SwiGLU row interleave of Grouped's Loader. LEAN (CTAs of 384 / 512
// threads, at most 168 / 128 registers): each copy addresses its chunks afresh from the tile's
// bases; the Loader's per-chunk pointers (3 registers a chunk) spilled on 192 x 256. Else the
// Loader's pointers: fresh addressing cost 16% on the compute-bound 128 x 256 SwiGLU tiles
// (H100, session 20).
// Chunk column c = tid % 8, rows tid / 8 + i * THREADS / 8.
template <typename T, int TM, int TN, int THREADS, bool SWIGLU, bool LEAN>
struct TileCopy {
  using G = Grouped<T, TM, TN, THREADS / 32, 1, 1, 2, false, SWIGLU>;  // its loaders
  Loader<T, TM, THREADS> lx;
  Loader<T, TN, THREADS> lw;

  __device__ __forceinline__ TileCopy(const T* X, const T* We, int row0, int rows, int n0, int N,
                                      int K) {
    G::template x_rows<TM>(lx, X, K, row0, rows);
    G::template w_rows<TN>(lw, We, N, K, n0);
  }
  __device__ __forceinline__ void stage(uint32_t dst, int k0, int K) const {
    G::template copy<TM>(lx, dst, k0, K);
    G::template copy<TN>(lw, dst + TM * ROW_BYTES, k0, K);
  }
};

template <typename T, int TM, int TN, int THREADS, bool SWIGLU>
struct TileCopy<T, TM, TN, THREADS, SWIGLU, true> {
  const T* x;  // X row row0, column 8 c
  const T* w;  // W[e] row 0, column 8 c
  int rows, n0, N;

  __device__ __forceinline__ TileCopy(const T* X, const T* We, int row0, int rows_, int n0_,
                                      int N_, int K)
      : x(X + (size_t)row0 * K + (threadIdx.x & 7) * 8), w(We + (threadIdx.x & 7) * 8),
        rows(rows_), n0(n0_), N(N_) {}

  __device__ __forceinline__ void stage(uint32_t dst, int k0, int K) const {
    const int tid = threadIdx.x;
    const bool k_ok = k0 + (tid & 7) * 8 < K;
#pragma unroll
    for (int i = 0; i < (TM * 8 + THREADS - 1) / THREADS; ++i) {
      const int r = tid / 8 + i * (THREADS / 8);
      if (TM * 8 % THREADS == 0 || r < TM) {
        const bool ok = r < rows && k_ok;
        cp_async16_zfill(dst + swz(r, tid & 7), ok ? (const void*)(x + (size_t)r * K + k0) : x, ok);
      }
    }
    dst += TM * ROW_BYTES;
#pragma unroll
    for (int i = 0; i < (TN * 8 + THREADS - 1) / THREADS; ++i) {
      const int r = tid / 8 + i * (THREADS / 8);
      if (TN * 8 % THREADS == 0 || r < TN) {
        int row;
        const bool ok = weight_row<SWIGLU>(n0 + r, N, row) && k_ok;
        cp_async16_zfill(dst + swz(r, tid & 7),
                         ok ? (const void*)(w + (size_t)row * K + k0) : w, ok);
      }
    }
  }
};

// The tile and pipeline shape GroupedWgmma and GroupedWgmmaTma share.
template <typename T, int TM, int TN, int STAGES, int INFLIGHT, bool SWIGLU>
struct WgmmaTile {
  static_assert(TM % 64 == 0 && TM <= 256, "64-row warpgroup tiles");
  static_assert(TN == 64 || TN == 128 || TN == 256, "wgmma n of the common wrappers");
  static_assert(INFLIGHT == 0 || INFLIGHT == 1, "wgmma groups pending across the barrier");
  static constexpr int D = STAGES - 1 - INFLIGHT;  // k-tiles prefetched ahead
  static_assert(D >= 1, "at least one k-tile in flight");
  using G = Grouped<T, TM, TN, TM / 16, 1, 1, STAGES, false, SWIGLU>;  // loaders + epilogue
  static constexpr int THREADS = G::THREADS;  // 32 * TM / 16 = 128 * warpgroups
  static constexpr int STAGE_BYTES = (TM + TN) * ROW_BYTES;
  static_assert(STAGE_BYTES % 1024 == 0, "stages of whole swizzle atoms");
  static constexpr int SMEM_PIPE = STAGES * STAGE_BYTES;
};

template <typename T, int TM, int TN, int STAGES, int INFLIGHT, bool SWIGLU>
struct GroupedWgmma : WgmmaTile<T, TM, TN, STAGES, INFLIGHT, SWIGLU> {
  using B = WgmmaTile<T, TM, TN, STAGES, INFLIGHT, SWIGLU>;
  using typename B::G;
  using B::D, B::THREADS, B::STAGE_BYTES, B::SMEM_PIPE;
  // + up to 1008 bytes to align the stages to 1024, + 16 for the work item (find_tile)
  static constexpr int SMEM = SMEM_PIPE + 1024 + 16;

  static __device__ __forceinline__ void run(const T* __restrict__ X, const T* __restrict__ W,
                                             const int* __restrict__ offsets, T* __restrict__ Y,
                                             int E, int N, int K, int M) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int n_tiles = (N + TN - 1) / TN;
    const TileOf tile = find_tile<TM>(offsets, E, M, n_tiles, blockIdx.x,
                                      reinterpret_cast<int*>(smem + SMEM_PIPE + 1024));
    if (tile.e < 0) return;
    const int n0 = tile.n_tile * TN;
    const T* We = W + (size_t)tile.e * N * K;

    const TileCopy<T, TM, TN, THREADS, SWIGLU, (THREADS > 256)> tc(X, We, tile.row0, tile.rows,
                                                                   n0, N, K);

    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t base = (raw + 1023u) & ~1023u;
    const int k_tiles = (K + TK - 1) / TK;
    const auto load_stage = [&](int kt) {
      tc.stage(base + (uint32_t)((kt % STAGES) * STAGE_BYTES), kt * TK, K);
    };
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (s < k_tiles) load_stage(s);
      cp_async_commit();
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    const bool active = TM <= 128 || wg * 64 < tile.rows;  // warpgroup-uniform (see above)
    float acc[1][TN / 8][4];
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<D - 1>();  // this thread's copies of kt landed
      fence_proxy_async_smem();
      __syncthreads();  // everyone's copies of kt; every warpgroup past its wait for kt - 1 - INFLIGHT
      const uint32_t sx = base + (uint32_t)((kt % STAGES) * STAGE_BYTES) + wg * 64 * ROW_BYTES;
      const uint32_t sw = base + (uint32_t)((kt % STAGES) * STAGE_BYTES) + TM * ROW_BYTES;
      if (active) wgmma_k_tile<T, TN>(acc, sx, sw);
      if (kt + D < k_tiles) load_stage(kt + D);  // into the slot of kt - 1 - INFLIGHT
      cp_async_commit();
      if (active) wgmma_wait<INFLIGHT>();
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    G::epilogue(acc, tile, n0, Y, N, warp, 0, lane);
  }
};

// Warp-specialized variant: warpgroup 0 is the producer (cp.async of whole stages, one
// mbarrier "full" per slot that its 128 threads' copies complete), warpgroups 1.. the consumers
// (wgmma; after waiting for k-tile kt - INFLIGHT's group every consumer thread arrives on that
// slot's "empty" mbarrier, which the producer waits for before refilling it). No CTA-wide
// barrier in the main loop: the producer runs up to STAGES k-tiles ahead.
template <typename T, int TM, int TN, int STAGES, int INFLIGHT, bool SWIGLU>
struct GroupedWgmmaWs {
  static_assert(TM % 64 == 0 && TM <= 256, "64-row warpgroup tiles");
  static_assert(TN == 64 || TN == 128 || TN == 256, "wgmma n of the common wrappers");
  static_assert(INFLIGHT == 0 || INFLIGHT == 1, "wgmma groups pending before a slot is released");
  static_assert(STAGES >= 2, "a slot in use and one filling");
  using GP = Grouped<T, TM, TN, 4, 1, 1, STAGES, false, SWIGLU>;        // producer loaders (128 threads)
  using GE = Grouped<T, TM, TN, TM / 16, 1, 1, STAGES, false, SWIGLU>;  // consumer epilogue
  static constexpr int CONSUMERS = 32 * (TM / 16);
  static constexpr int THREADS = 128 + CONSUMERS;
  static constexpr int STAGE_BYTES = (TM + TN) * ROW_BYTES;
  static_assert(STAGE_BYTES % 1024 == 0, "stages of whole swizzle atoms");
  static constexpr int SMEM_PIPE = STAGES * STAGE_BYTES;
  using PipeSmem = MbarPipeSmem<SMEM_PIPE, STAGES>;
  static constexpr int SMEM = PipeSmem::BYTES + 16;  // + the work item

  static __device__ __forceinline__ void run(const T* __restrict__ X, const T* __restrict__ W,
                                             const int* __restrict__ offsets, T* __restrict__ Y,
                                             int E, int N, int K, int M) {
    extern __shared__ __align__(16) unsigned char smem[];
    const PipeSmem ps(smem);
    const uint32_t base = ps.base, full = ps.full, empty = ps.empty;
    if (threadIdx.x == 0) mbar_init_slots<STAGES>(full, empty, 128, CONSUMERS);
    const int n_tiles = (N + TN - 1) / TN;
    // find_tile's barrier also publishes the mbarrier initialisation
    const TileOf tile = find_tile<TM>(offsets, E, M, n_tiles, blockIdx.x,
                                      reinterpret_cast<int*>(smem + ps.tail));
    if (tile.e < 0) return;
    const int n0 = tile.n_tile * TN;
    const int k_tiles = (K + TK - 1) / TK;

    if (threadIdx.x < 128) {  // producer warpgroup
      Loader<T, TM, 128> lx;
      Loader<T, TN, 128> lw;
      GP::template x_rows<TM>(lx, X, K, tile.row0, tile.rows);
      GP::template w_rows<TN>(lw, W + (size_t)tile.e * N * K, N, K, n0);
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(empty + 8 * s, ((kt / STAGES) - 1) & 1);
        const uint32_t st = base + (uint32_t)(s * STAGE_BYTES);
        GP::template copy<TM>(lx, st, kt * TK, K);
        GP::template copy<TN>(lw, st + TM * ROW_BYTES, kt * TK, K);
        cp_async_mbar_arrive(full + 8 * s);
      }
      cp_async_wait_all();
      return;
    }

    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) - 4, wg = warp >> 2;
    const bool active = TM <= 128 || wg * 64 < tile.rows;  // warpgroup-uniform (see above)
    float acc[1][TN / 8][4];
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full + 8 * s, (kt / STAGES) & 1);
      fence_proxy_async_smem();  // the producer's cp.async data -> the async proxy
      const uint32_t st = base + (uint32_t)(s * STAGE_BYTES);
      if (active) {
        wgmma_k_tile<T, TN>(acc, st + wg * 64 * ROW_BYTES, st + TM * ROW_BYTES);
        wgmma_wait<INFLIGHT>();
      }
      if (kt >= INFLIGHT) mbar_arrive(empty + 8 * ((kt - INFLIGHT) % STAGES));
    }
    wgmma_wait<0>();
    GE::epilogue(acc, tile, n0, Y, N, warp, 0, lane);
  }
};

// TMA variant: the same tile and STAGES slots as GroupedWgmma, D k-tiles copied ahead, but
// each stage is two bulk tensor copies (the copy engine) that thread 0 issues and that complete
// on the slot's "full" mbarrier, instead of every thread's 16-byte cp.asyncs: X rows [row0,
// row0 + TM) x 64 k (the map zero-fills rows past M; rows of the next expert inside the box are
// loaded and computed but never stored) and the weight rows x 64 k (W [E, N, K] as a 3D map;
// with SWIGLU a 5D view [E, N/16, 2, 8, K] of W13 whose box is the gate / up block interleave
// of weight_row). The maps (kernelgen/core/tma.py) zero-fill past N and K. No CTA barrier in
// the loop: after its wait for k-tile kt - INFLIGHT each warpgroup arrives on that slot's
// "empty" mbarrier, and thread 0 waits for it before refilling the slot, so warpgroups wait
// only for data (H100: E8 W13 7% faster than a CTA barrier a k-tile, E256 the same).
template <typename T, int TM, int TN, int STAGES, int INFLIGHT, bool SWIGLU>
struct GroupedWgmmaTma : WgmmaTile<T, TM, TN, STAGES, INFLIGHT, SWIGLU> {
  using B = WgmmaTile<T, TM, TN, STAGES, INFLIGHT, SWIGLU>;
  using typename B::G;
  using B::D, B::THREADS, B::STAGE_BYTES, B::SMEM_PIPE;
  static constexpr int WGS = TM / 64;
  using PipeSmem = MbarPipeSmem<SMEM_PIPE, STAGES>;
  static constexpr int SMEM = PipeSmem::BYTES + 16;  // + the work item

  static __device__ __forceinline__ void run(const TensorMap& tx, const TensorMap& tw,
                                             const int* __restrict__ offsets, T* __restrict__ Y,
                                             int E, int N, int K, int M) {
    extern __shared__ __align__(16) unsigned char smem[];
    const PipeSmem ps(smem);
    const uint32_t base = ps.base, full = ps.full, empty = ps.empty;
    if (threadIdx.x == 0) {
      mbar_init_slots<STAGES>(full, empty, 1, WGS);
      fence_mbarrier_init();
    }
    const int n_tiles = (N + TN - 1) / TN;
    // find_tile's barrier also publishes the mbarrier initialisation
    const TileOf tile = find_tile<TM>(offsets, E, M, n_tiles, blockIdx.x,
                                      reinterpret_cast<int*>(smem + ps.tail));
    if (tile.e < 0) return;
    const int n0 = tile.n_tile * TN;
    const int k_tiles = (K + TK - 1) / TK;
    const auto issue = [&](int kt) {  // thread 0: k-tile kt into its slot
      const int s = kt % STAGES;
      const uint32_t st = base + (uint32_t)(s * STAGE_BYTES), bar = full + 8 * s;
      mbar_arrive_expect_tx(bar, STAGE_BYTES);
      tma_load_2d(st, tx, bar, kt * TK, tile.row0);
      if constexpr (SWIGLU) tma_load_5d(st + TM * ROW_BYTES, tw, bar, kt * TK, 0, 0, n0 / 16, tile.e);
      else tma_load_3d(st + TM * ROW_BYTES, tw, bar, kt * TK, n0, tile.e);
    };
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < D; ++s)
        if (s < k_tiles) issue(s);
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    const bool active = TM <= 128 || wg * 64 < tile.rows;  // warpgroup-uniform (GroupedWgmma)
    float acc[1][TN / 8][4];
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;

    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full + 8 * s, (kt / STAGES) & 1);  // the copies of kt landed
      // thread 0 refills the slot of kt - 1 - INFLIGHT once every warpgroup has released it
      // (the empty mbarrier's phase of that k-tile); no CTA barrier
      if (threadIdx.x == 0 && kt + D < k_tiles) {
        const int j = kt + D - STAGES;
        if (j >= 0) mbar_wait(empty + 8 * (j % STAGES), (j / STAGES) & 1);
        issue(kt + D);
      }
      if (active) {
        const uint32_t st = base + (uint32_t)(s * STAGE_BYTES);
        wgmma_k_tile<T, TN>(acc, st + wg * 64 * ROW_BYTES, st + TM * ROW_BYTES);
        wgmma_wait<INFLIGHT>();
      }
      // this warpgroup has read k-tile kt - INFLIGHT (inactive ones release theirs too)
      if (kt >= INFLIGHT && (threadIdx.x & 127) == 0) mbar_arrive(empty + 8 * ((kt - INFLIGHT) % STAGES));
    }
    wgmma_wait<0>();

    G::epilogue(acc, tile, n0, Y, N, warp, 0, lane);
  }
};

}  // namespace kg::moe
