// MoE grouped GEMM, one launch for all experts:  Y[rows of e] = X[rows of e] . W[e]^T
//
//   X        [M, K]   T = half | bf16, row-major (x_perm: expert segments back to back)
//   W        [E, N, K] T, row-major (each expert's rows are K-contiguous, like X)
//   offsets  [E + 1]  int32: expert e owns rows [offsets[e], offsets[e+1]) of X and Y; any
//            segment sizes (padded or not); rows outside [0, min(offsets[E], M)) are never
//            touched (find_tile clamps every segment to the M rows of X and Y)
//   Y        [M, N]   T, or [M, N/2] with SWIGLU (below); fp32 accumulation, rounded to nearest
//
// Tile map. grid.x enumerates work items: expert e has ceil(count_e / TILE_M) M tiles times
// the N tiles, ordered expert-major, N tile, then M tile fastest (see find_tile). The host
// sizes the grid from host-side counts only ((M / TILE_M + min(E, M)) x N tiles, an upper
// bound); warp 0 of each CTA scans the offsets (up to 256 experts a round, a lane owning up to
// FIND_PER consecutive ones, warp prefix sum) to find its item, and an item past the last exits before loading anything. Experts with no rows own
// no item.
//
// Operands. Both X and W rows are K-contiguous, which is what mma.m16n8k16.row.col wants for A
// (16 x k16, row-major) and for B (n8 x k16 given as rows of k). The CTA tile is TP x TQ: the
// "P" side feeds the mma's 16-row A operand, the "Q" side its n8 B operand. Without SWAP, P =
// tokens (TILE_M) and Q = weight rows (TILE_N); with SWAP (decode), P = weight rows and Q =
// tokens, so 8 or 16 tokens fill whole n8 tiles while the weights fill the 16-row side.
//
// Pipeline. STAGES-deep cp.async (16 B, zero-filled past the segment / N / K) into shared
// memory, 64 k per stage, rows of 128 B with their 16-byte chunks XOR-swizzled by row % 8 so
// that ldmatrix reads hit 8 different bank groups. Warps are WARPS_P x WARPS_Q x WARPS_K; the
// WARPS_K warps of one (p, q) position take alternate k16 steps of every stage and add their
// accumulators through shared memory at the end (decode tiles are small: 2 or 4 warps share
// one 32 x 8 or 64 x 8 tile).
//
// SWIGLU (W13 [E, 2I, K]: rows [0, I) gate, rows [I, 2I) up, the usual concatenation). The
// weight side of a tile covers 2 x (TW / 2) "virtual" rows v, loaded in blocks of 8:
// block b = v / 8 holds gate rows (b even) or up rows (b odd) of columns i = (b / 2) * 8 + v % 8.
// An mma fragment then holds matching gate and up values in the same thread (SWAP: rows g and
// g + 8 of an m16 tile; no SWAP: n8 tiles 2j and 2j + 1), the epilogue writes
// silu(gate) * up to Y [M, I], and the [M, 2I] intermediate never exists.
#pragma once
#include "common/dtypes.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"

namespace kg::moe {

constexpr int TK = 64;          // k per stage: one 128-byte row of T per tile row
constexpr int ROW_BYTES = TK * 2;

// byte offset of 16-byte chunk c of tile row r (chunks XOR-swizzled by r % 8)
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return (uint32_t)(r * ROW_BYTES + ((c ^ (r & 7)) << 4));
}

// This CTA's work item: (expert, first row, rows, N tile), or e = -1 past the last item.
// Items are ordered expert-major, then N tile, then M tile fastest: CTAs that run together
// share an expert's W tile (its M tiles are adjacent) and its few X tiles (reused across the N
// tiles from L2). Warp 0 walks the experts FIND_PER * 32 at a time (one round up to E = 256):
// lane l of a round owns c = ceil(experts / 32) consecutive experts, issues all its offsets
// loads at once (one L2 round trip a round, not one a 32 experts), counts their items, and a
// warp prefix sum of the lanes' counts says whose range holds `item`; that lane finds the
// expert in its own c. Every CTA walks this before its first weight load: its cost is latency.
// `s_tile`: 4 ints of shared memory in the dynamic allocation (grouped_gemv.cu.jinja: after its
// code table; its kernel adds static shared memory, which jit.py's opt-in counts).
struct TileOf { int e, row0, rows, n_tile; };
constexpr int FIND_PER = 8;  // experts a lane per round at most

template <int TILE_M>
__device__ __forceinline__ TileOf find_tile(const int* __restrict__ offsets, int E, int M,
                                            int n_tiles, int item, int* s_tile) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int found[4] = {-1, 0, 0, 0};
    int before = 0;  // items of the experts already walked
    for (int base = 0; base < E; base += 32 * FIND_PER) {
      const int end = min(E, base + 32 * FIND_PER);
      const int c = (end - base + 31) >> 5;  // experts a lane this round (warp-uniform)
      const int e0 = base + lane * c;        // this lane's experts: [e0, min(e0 + c, end))
      int off[FIND_PER + 1];                 // offsets[e0 .. e0 + c], all requested first
#pragma unroll
      for (int j = 0; j <= FIND_PER; ++j) off[j] = j <= c && e0 + j <= end ? __ldg(offsets + e0 + j) : 0;
      int mt[FIND_PER];  // M tiles of expert e0 + j (rows < M: find_tile clamps every segment)
      int n = 0;
#pragma unroll
      for (int j = 0; j < FIND_PER; ++j) {
        const int hi = min(off[j + 1], M);
        mt[j] = j < c && e0 + j < end && hi > off[j] ? (hi - off[j] + TILE_M - 1) / TILE_M : 0;
        n += mt[j] * n_tiles;
      }
      int incl = n;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int first = before + incl - n;
      const bool mine = item >= first && item < first + n;
      const unsigned hit = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        int local = item - first;
#pragma unroll
        for (int j = 0; j < FIND_PER; ++j) {
          const int nj = mt[j] * n_tiles;
          if (found[0] < 0 && local < nj) {
            found[0] = e0 + j;
            found[1] = off[j] + (local % mt[j]) * TILE_M;
            found[2] = min(TILE_M, min(off[j + 1], M) - found[1]);
            found[3] = local / mt[j];
          }
          if (found[0] < 0) local -= nj;
        }
      }
      if (hit) {
        const int src = __ffs(hit) - 1;
#pragma unroll
        for (int i = 0; i < 4; ++i) found[i] = __shfl_sync(0xffffffffu, found[i], src);
        break;
      }
      before += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane < 4) s_tile[lane] = found[lane];
  }
  __syncthreads();
  return TileOf{s_tile[0], s_tile[1], s_tile[2], s_tile[3]};
}

// Add the WARPS_K warps' partial tiles of one (p, q) position through shared memory (lane-major:
// no bank conflicts); returns false for the warps that are done (wk > 0). `red` reuses the
// pipeline's buffers: every cp.async group has completed and the CTA is past a barrier.
template <int ACC, int WARPS_PQ, int WARPS_K>
__device__ __forceinline__ bool reduce_k(float (&acc)[ACC], float* red, int pq, int wk, int lane) {
  if constexpr (WARPS_K > 1) {
    __syncthreads();
    if (wk > 0) {
      float* dst = red + ((size_t)((wk - 1) * WARPS_PQ + pq) * ACC) * 32 + lane;
#pragma unroll
      for (int i = 0; i < ACC; ++i) dst[i * 32] = acc[i];
    }
    __syncthreads();
    if (wk > 0) return false;
#pragma unroll 1
    for (int w = 1; w < WARPS_K; ++w) {
      const float* src = red + ((size_t)((w - 1) * WARPS_PQ + pq) * ACC) * 32 + lane;
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] += src[i * 32];
    }
  }
  return true;
}

// Epilogue with weight rows on P (swap_ab): fragment (mi, ni, e) holds weight row
// p0 + mi*16 + g + 8*(e/2) (virtual rows with SWIGLU) and token q0 + ni*8 + 2t + e%2.
template <typename T, bool SWIGLU, int MI, int NI>
__device__ __forceinline__ void store_swap(const float (&acc)[MI][NI][4], const TileOf& tile,
                                           int p0, int q0, T* __restrict__ Y, int N, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    const int v = p0 + mi * 16 + g;
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = q0 + ni * 8 + 2 * t + e;
        if (m >= tile.rows) continue;
        T* yrow = Y + (size_t)(tile.row0 + m) * (SWIGLU ? N / 2 : N);
        if constexpr (SWIGLU) {
          const int col = (p0 + mi * 16) / 2 + g;  // rows g / g+8 = gate / up of one column
          if (col < N / 2) yrow[col] = from_float<T>(silu(acc[mi][ni][e]) * acc[mi][ni][2 + e]);
        } else {
          if (v < N) yrow[v] = from_float<T>(acc[mi][ni][e]);
          if (v + 8 < N) yrow[v + 8] = from_float<T>(acc[mi][ni][2 + e]);
        }
      }
  }
}

// Weight row of virtual tile row v: itself, or with SWIGLU the gate / up row of block v / 8
// (see the header comment); false past N (or past I).
template <bool SWIGLU>
__device__ __forceinline__ bool weight_row(int v, int N, int& row) {
  if constexpr (SWIGLU) {
    const int half_n = N / 2, b = v >> 3, col = (b >> 1) * 8 + (v & 7);
    row = (b & 1) ? half_n + col : col;
    return col < half_n;
  } else {
    row = v;
    return v < N;
  }
}

// Global row pointers of the chunks one thread copies per stage (fixed over k): chunk column
// c = tid % 8, rows tid / 8 + i * THREADS / 8.
template <typename T, int ROWS, int THREADS>
struct Loader {
  static constexpr int PER = (ROWS * 8 + THREADS - 1) / THREADS;  // chunks a thread copies
  const T* ptr[PER];
  bool ok[PER];  // row exists (inside the segment / N)
};

template <typename T, int TP, int TQ, int WARPS_P, int WARPS_Q, int WARPS_K, int STAGES,
          bool SWAP, bool SWIGLU>
struct Grouped {
  static constexpr int THREADS = 32 * WARPS_P * WARPS_Q * WARPS_K;
  static constexpr int WP = TP / WARPS_P;  // warp tile, P side (multiple of 16)
  static constexpr int WQ = TQ / WARPS_Q;  // warp tile, Q side (multiple of 8)
  static constexpr int MI = WP / 16;
  static constexpr int NI = WQ / 8;
  static constexpr int STAGE_BYTES = (TP + TQ) * ROW_BYTES;
  static constexpr int ACC = MI * NI * 4;
  static constexpr int TW = SWAP ? TP : TQ;  // weight rows of a tile
  static constexpr int TM = SWAP ? TQ : TP;  // tokens of a tile
  static_assert(WP % 16 == 0 && WQ % 8 == 0, "warp tile: 16 x 8 multiples");
  static_assert(!SWIGLU || (SWAP ? WP % 16 == 0 : WQ % 16 == 0), "gate/up pairs in one warp");
  static constexpr int SMEM_PIPE = STAGES * STAGE_BYTES;
  static constexpr int SMEM_RED = (WARPS_K - 1) * WARPS_P * WARPS_Q * ACC * 32 * 4;
  // + 16 bytes for the work item (find_tile)
  static constexpr int SMEM_MAIN = SMEM_PIPE > SMEM_RED ? SMEM_PIPE : SMEM_RED;
  static constexpr int SMEM = SMEM_MAIN + 16;

  // Fill a loader for tile rows [0, ROWS): x rows (tokens) or w rows (weights).
  template <int ROWS>
  static __device__ __forceinline__ void x_rows(Loader<T, ROWS, THREADS>& L, const T* X, int K,
                                                int row0, int rows) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < L.PER; ++i) {
      const int r = tid / 8 + i * (THREADS / 8);
      L.ok[i] = r < rows;
      L.ptr[i] = X + (size_t)(row0 + (L.ok[i] ? r : 0)) * K + (tid & 7) * 8;
    }
  }
  template <int ROWS>
  static __device__ __forceinline__ void w_rows(Loader<T, ROWS, THREADS>& L, const T* We, int N,
                                                int K, int n0) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < L.PER; ++i) {
      const int r = tid / 8 + i * (THREADS / 8);
      int row;
      const bool ok = weight_row<SWIGLU>(n0 + r, N, row) && r < ROWS;
      L.ok[i] = ok;
      L.ptr[i] = We + (size_t)(ok ? row : 0) * K + (tid & 7) * 8;
    }
  }

  template <int ROWS>
  static __device__ __forceinline__ void copy(const Loader<T, ROWS, THREADS>& L, uint32_t dst,
                                              int k0, int K) {
    const int tid = threadIdx.x;
    const bool k_ok = k0 + (tid & 7) * 8 < K;
#pragma unroll
    for (int i = 0; i < L.PER; ++i) {
      const int r = tid / 8 + i * (THREADS / 8);
      if (ROWS * 8 % THREADS == 0 || r < ROWS) {
        const bool ok = L.ok[i] && k_ok;
        cp_async16_zfill(dst + swz(r, tid & 7),
                         ok ? (const void*)(L.ptr[i] + k0) : (const void*)L.ptr[i], ok);
      }
    }
  }

  static __device__ __forceinline__ void run(const T* __restrict__ X, const T* __restrict__ W,
                                             const int* __restrict__ offsets, T* __restrict__ Y,
                                             int E, int N, int K, int M) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int n_tiles = (N + TW - 1) / TW;
    const TileOf tile = find_tile<TM>(offsets, E, M, n_tiles, blockIdx.x,
                                      reinterpret_cast<int*>(smem + SMEM_MAIN));
    if (tile.e < 0) return;
    const int n0 = tile.n_tile * TW;  // first (virtual) weight row of the tile
    const T* We = W + (size_t)tile.e * N * K;

    Loader<T, TP, THREADS> lp;
    Loader<T, TQ, THREADS> lq;
    if constexpr (SWAP) {
      w_rows<TP>(lp, We, N, K, n0);
      x_rows<TQ>(lq, X, K, tile.row0, tile.rows);
    } else {
      x_rows<TP>(lp, X, K, tile.row0, tile.rows);
      w_rows<TQ>(lq, We, N, K, n0);
    }

    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const int k_tiles = (K + TK - 1) / TK;
    const auto load_stage = [&](int kt) {
      const uint32_t st = base + (uint32_t)((kt % STAGES) * STAGE_BYTES);
      copy<TP>(lp, st, kt * TK, K);
      copy<TQ>(lq, st + TP * ROW_BYTES, kt * TK, K);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_stage(s);
      cp_async_commit();
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wp = warp % WARPS_P, wq = (warp / WARPS_P) % WARPS_Q, wk = warp / (WARPS_P * WARPS_Q);
    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

    // ldmatrix lane roles. A (x4): row = lane % 16, chunk +lane / 16. B (x4 over two n8 tiles):
    // row = (lane / 16) * 8 + lane % 8, chunk + (lane / 8) % 2; (x2): row = lane % 8, same chunk.
    const int a_row = wp * WP + (lane & 15), a_chk = lane >> 4;
    const int b_row = wq * WQ + ((lane >> 4) << 3) + (lane & 7), b_chk = (lane >> 3) & 1;

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      if (kt + STAGES - 1 < k_tiles) load_stage(kt + STAGES - 1);
      cp_async_commit();
      const uint32_t sp = base + (uint32_t)((kt % STAGES) * STAGE_BYTES);
      const uint32_t sq = sp + TP * ROW_BYTES;
#pragma unroll
      for (int kk = wk; kk < TK / 16; kk += WARPS_K) {
        uint32_t a[MI][4], b[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          ldmatrix_x4_ordered(sp + swz(a_row + mi * 16, 2 * kk + a_chk), a[mi][0], a[mi][1], a[mi][2],
                              a[mi][3]);
        if constexpr (NI % 2 == 0) {
#pragma unroll
          for (int ni = 0; ni < NI; ni += 2)
            ldmatrix_x4_ordered(sq + swz(b_row + ni * 8, 2 * kk + b_chk), b[ni][0], b[ni][1],
                                b[ni + 1][0], b[ni + 1][1]);
        } else {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni)
            ldmatrix_x2_ordered(sq + swz(wq * WQ + ni * 8 + (lane & 7), 2 * kk + b_chk), b[ni][0],
                                b[ni][1]);
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni)
            Mma<T>::run(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[ni][0], b[ni][1]);
      }
    }
    cp_async_wait<0>();

    float* flat = &acc[0][0][0];
    if (!reduce_k<ACC, WARPS_P * WARPS_Q, WARPS_K>(*reinterpret_cast<float(*)[ACC]>(flat),
                                                   reinterpret_cast<float*>(smem),
                                                   wq * WARPS_P + wp, wk, lane))
      return;
    epilogue(acc, tile, n0, Y, N, wp, wq, lane);
  }

  // Fragment (mi, ni, e): P index wp*WP + mi*16 + g + 8*(e/2), Q index wq*WQ + ni*8 + 2t + e%2.
  static __device__ __forceinline__ void epilogue(const float (&acc)[MI][NI][4], const TileOf& tile,
                                                  int n0, T* __restrict__ Y, int N, int wp, int wq,
                                                  int lane) {
    const int g = lane >> 2, t = lane & 3;
    if constexpr (SWAP) {
      store_swap<T, SWIGLU, MI, NI>(acc, tile, n0 + wp * WP, wq * WQ, Y, N, lane);
    } else {
      // P = tokens, Q = weight rows (n): pairs of adjacent n in one 32-bit store
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = wp * WP + mi * 16 + g + 8 * h;
          if (m >= tile.rows) continue;
          T* yrow = Y + (size_t)(tile.row0 + m) * (SWIGLU ? N / 2 : N);
          if constexpr (SWIGLU) {
#pragma unroll
            for (int ni = 0; ni < NI; ni += 2) {  // n8 tiles 2j (gate) and 2j+1 (up)
              const int col = (n0 + wq * WQ + ni * 8) / 2 + 2 * t;
              if (col < N / 2) {
                const uint32_t p = pack2<T>(silu(acc[mi][ni][2 * h]) * acc[mi][ni + 1][2 * h],
                                              silu(acc[mi][ni][2 * h + 1]) * acc[mi][ni + 1][2 * h + 1]);
                *reinterpret_cast<uint32_t*>(yrow + col) = p;
              }
            }
          } else {
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
              const int n = n0 + wq * WQ + ni * 8 + 2 * t;
              if (n < N)
                *reinterpret_cast<uint32_t*>(yrow + n) =
                    pack2<T>(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
          }
        }
    }
  }
};

}  // namespace kg::moe
