// FP4-weight GEMM, bandwidth path (decode, M <= 16 per pass):
//   C[M, N] = alpha * A[M, K] . dequant(W)[N, K]^T (+ bias[N])
//
//   A  [M, K] T = half | bf16, row-major, K % 128 == 0 (16-byte aligned rows)
//   W, S, post: see fp4.cuh (prepared weight, tiled layout)
//   C  [M, N] T; fp32 accumulation; ws [split, M, N] fp32 + counters [m_tiles, ctas_x] (split-K)
//
// grid (ceil(units / (WARPS / KW)), split, m_tiles), WARPS warps a CTA, KW = 1 << kw_log warps a
// unit of TPW tiles: warp w of CTA x owns the TPW x 16 W rows of tiles TPW * u .. TPW * u + TPW-1,
// u = x * (WARPS / KW) + w / KW (weights on the mma's 16-row side, tokens on its n8 side: a small
// M wastes no weight bytes; TPW = 2 shares each activation fragment between two tiles) over
// slice w % KW of the CTA's K range (blockIdx.y); the KW partial sums meet in shared memory in
// slice order (deterministic). blockIdx.z is the pass of M_TILE tokens. Each weight byte is
// loaded once, as 16-byte ld.global.nc by lanes that together cover 1 KB of contiguous memory a
// tile and step (tiled layout); DEPTH steps per warp are in flight in a register ring, the first
// issued before anything else (after the PF prologue: L2 prefetches, the PDL wait). The
// activation fragments are 16-byte loads from global memory (L1
// hits after the first warp of an SM: A is small and every warp of a K slice reads the same
// bytes; the k-interleaved layout makes the 4 lanes of a token row read 64 contiguous bytes), at
// immediate offsets from one pointer per token row: no staging, no barrier before the loop
// (A_RING instead stages them per warp through shared memory by cp.async, see below).
#pragma once
#include "fp4_gemm/fp4.cuh"

namespace kg::fp4 {

// Where a CTA works. GridPlace: the dense launch (blockIdx.x: unit block, .y: K split, .z: M pass;
// read where used, as before the MoE launch shared this kernel). ItemPlace: a work item of the
// MoE grouped launch (templates/moe/grouped_gemv.cu.jinja: one pass of an expert's rows, one
// block of its units; never split along K, so the split code compiles out).
struct GridPlace {
  static constexpr bool ITEM = false;
  __device__ __forceinline__ int x() const { return blockIdx.x; }
  __device__ __forceinline__ int y() const { return blockIdx.y; }
  __device__ __forceinline__ int z() const { return blockIdx.z; }
  __device__ __forceinline__ int splits() const { return gridDim.y; }
  __device__ __forceinline__ int nx() const { return gridDim.x; }
  __device__ __forceinline__ int tile_base() const { return 0; }
  __device__ __forceinline__ int up() const { return 0; }
};
struct ItemPlace {
  static constexpr bool ITEM = true;
  int unit_block, base, up_tiles;  // unit block, W tile of the weight's row 0, gate -> up tiles
  __device__ __forceinline__ int x() const { return unit_block; }
  __device__ __forceinline__ int y() const { return 0; }
  __device__ __forceinline__ int z() const { return 0; }
  __device__ __forceinline__ int splits() const { return 1; }
  __device__ __forceinline__ int nx() const { return 1; }
  __device__ __forceinline__ int tile_base() const { return base; }
  __device__ __forceinline__ int up() const { return up_tiles; }
};

// f(i, nt, e, m, n) for each fragment (i, nt, e) of a lane of the warp's TPW tiles from tile tb
// that lies inside C [M, N]: C[m, n], m = m_lane + 8nt + (e & 1) (m_lane: the pass's first token
// + 2t), n = 16 (tb + i) + g + 8 (e >> 1); a tile past N has n >= N
template <int TPW, int NT, typename F>
__device__ __forceinline__ void for_frags(int m_lane, int g, int M, int N, int tb, F&& f) {
#pragma unroll
  for (int i = 0; i < TPW; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = m_lane + 8 * nt + (e & 1), n = (tb + i) * 16 + g + 8 * (e >> 1);
        if (m < M && n < N) f(i, nt, e, m, n);
      }
}

// GLU (TPW 2, ItemPlace): a warp's two tiles are gate tile u and up tile u + place.up() of a
// weight whose rows are [gate; up] (W13); N is the output width (the gate rows) and C gets
// silu(gate) * up, both sums in fp32 times their row factors, rounded once. No bias, no K split.
template <typename T, int FMT, int M_TILE, int WARPS, int DEPTH, int TPW, bool HINT, bool EARLY,
          bool LEAN = false, bool A_BY_WORD = false, bool A_RING = false, int ENC = ENC_F16,
          bool GLU = false, typename Place = GridPlace, int PF = 0, bool WIDE = false,
          bool BAL = false>
__device__ __forceinline__ void gemv(const uint8_t* __restrict__ W, const uint8_t* __restrict__ S,
                                     const float* __restrict__ post, const T* __restrict__ A,
                                     const T* __restrict__ bias, int has_bias, float alpha,
                                     T* __restrict__ C, float* __restrict__ ws,
                                     unsigned* __restrict__ counters, int M, int N, int K, int sps,
                                     int kw_log, long long wt, unsigned wq, long long st,
                                     unsigned sq, const Place place) {
  static_assert(M_TILE == 8 || M_TILE == 16, "m_tile is 8 or 16 tokens");
  static_assert(TPW == 1 || TPW == 2, "a warp owns 1 or 2 tiles");
  static_assert(PF == 0 || !Place::ITEM, "PF: the dense launch's entry point leaves its wait to gemv");
  static_assert(!GLU || (TPW == 2 && Place::ITEM),
                "GLU pairs a gate and an up tile in one warp, in the MoE launch (no K split)");
  static_assert(!BAL || (!Place::ITEM && !A_RING && PF == 0),
                "BAL: the dense launch, A from global memory, no L2 prefetch");
  constexpr int NT = M_TILE / 8;
  constexpr int SB = Fmt<FMT>::SB;
  // LEAN (m_tile 16 at <= 64 registers): one accumulator chain per token half (the two n8
  // halves are already independent); A_BY_WORD loads the activation fragments a word at a time
  // (fewer registers live, the L1 latency exposed per word) instead of all four per step
  constexpr bool LEAN16 = LEAN && NT == 2;
  constexpr int CH = LEAN16 ? 1 : TPW == 1 ? 2 : TPW;  // independent mma accumulator chains
  // MXFP4 with fp16 at m_tile 8 applies its group scales after the mma (fp4.cuh
  // mx_word_factor: 4 FFMA a word instead of 8 HMUL2, and a cheaper decode of the scale bytes).
  // NVFP4 cannot (the four lanes of a row hold two groups in each word); m_tile 16 would spill
  // at 128 registers; bf16 would lose precision: its raw fragments are e2m1 * 2^-126, so a
  // word's unscaled sum with small activations falls into fp32's subnormals (relative error
  // 5e-4 at |A| ~ 2^-16, a NumPy model of the fp32 roundings), while fp16's unit is 2^-14.
  // KBIT4 at m_tile 8 likewise, fp16 and bf16 (fp4.cuh KbitPost: the table's scale keeps the
  // sums in range): 4 FFMA and the factors a word instead of 8 HMUL2 and the scale pairs.
  constexpr bool POST = NT == 1 && ((FMT == FMT_MXFP4 && RawUnit<T>::EXP == 14) || FMT == FMT_KBIT4);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kw = 1 << kw_log, ks = warp & (kw - 1);
  const int tiles = (N + 15) >> 4;
  const int Q = K / STEP_K;
  // BAL (balanced): the (unit, step) blocks in unit-major order, B = units x Q (< 2^31: the
  // host checks), are cut into runs of L = ceil(B / warps of the grid) blocks, run gw to warp
  // gw (the last ones may be short or empty). A run covers the end of one unit, whole units,
  // the start of another: a whole unit is stored by its warp, the parts of a shared unit meet
  // through ws (flush / finish below). kw_log = 0.
  const uint32_t units = (tiles + TPW - 1) / TPW;
  const uint32_t B = units * (uint32_t)Q, G = (uint32_t)place.nx() * WARPS;
  const uint32_t L = (B + G - 1) / G;
  const uint32_t gw = (uint32_t)place.x() * WARPS + warp;
  const uint32_t b_lo = BAL ? gw * L : 0;
  const int tile0 = BAL ? (int)(b_lo / Q) * TPW
                        : (place.x() * (WARPS >> kw_log) + (warp >> kw_log)) * (GLU ? 1 : TPW);
  const bool active = tile0 < tiles;
  const int q_cta = place.y() * sps;
  const int n_cta = min(Q, q_cta + sps) - q_cta;  // >= 1: the host ensures it
  const int per = (n_cta + kw - 1) >> kw_log;
  const int q0 = BAL ? (int)(b_lo % Q) : q_cta + ks * per;
  const int n_it = BAL ? (b_lo < B ? (int)min(L, B - b_lo) : 0) : active ? max(0, min(per, n_cta - ks * per)) : 0;

  // this warp's (tile, step) blocks, at W + tile * wt + step * wq (S: st, sq; layout.py
  // arrangements): lane (g, t) reads chunk t of rows g (wp) and g+8 (wp + 512) and one 8-byte
  // scale word (scale_offset); the ring slots are filled in step order, each load moving the
  // pointers one step on. A second tile past N re-reads the last tile (its rows are never
  // stored); GLU's second tile is the up tile.
  const uint8_t* wp[TPW];
  const uint8_t* sp[TPW];
#pragma unroll
  for (int i = 0; i < TPW; ++i) {
    const long long tl = place.tile_base() + (GLU ? min(tile0, tiles - 1) + i * place.up() : min(tile0 + i, tiles - 1));
    wp[i] = W + tl * wt + (size_t)q0 * wq + 64 * g + 16 * t;
    sp[i] = S + tl * st + (size_t)q0 * sq + scale_offset<FMT>(g, t);
  }
  // PF > 0 (small weights, select.py pf_for): the entry point did not wait for the grid
  // before it (gemv.cu.jinja). Before anything is read, prefetch the first PF steps of this
  // warp's weight blocks into L2 (1 KB and the scale bytes a tile and step, a 32-byte sector a
  // lane: read-only inputs, and L2 is the point of coherence, so a line fetched early still
  // sees the previous grid's stores), then wait, then let the next grid start its own ramp.
  if constexpr (PF > 0) {
#pragma unroll
    for (int d = 0; d < PF; ++d) {
      if (d < n_it) {
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          prefetch_l2(wp[i] - (64 * g + 16 * t) + (size_t)d * wq + 32 * lane);
          if (32 * lane < 16 * SB) prefetch_l2(sp[i] - scale_offset<FMT>(g, t) + (size_t)d * sq + 32 * lane);
        }
      }
    }
    grid_dependency_wait();
    grid_launch_dependents();
  }
  // KBIT4: the codebook values of this thread's table stores, requested first (Kbit4Fill)
  [[maybe_unused]] Kbit4Fill<T, WARPS * 32, POST, WIDE> kfill;
  if constexpr (FMT == FMT_KBIT4) kfill.load(post);
  uint4 wa[DEPTH][TPW], wb[DEPTH][TPW];
  uint2 sr[DEPTH][TPW];  // rows g (.x) and g+8 (.y), byte j: word j
  [[maybe_unused]] const int u_first = tile0 / TPW;  // BAL: the run's first unit
  [[maybe_unused]] int lu = u_first, ls = q0;  // BAL: the unit and step of the next load
  const auto load = [&](int d) {
#pragma unroll
    for (int i = 0; i < TPW; ++i) {
      wa[d][i] = ld_stream_v4<HINT>(wp[i]);
      wb[d][i] = ld_stream_v4<HINT>(wp[i] + 512);
      sr[d][i] = ld_nc_v2(sp[i]);
      wp[i] += wq;
      sp[i] += sq;
    }
    if constexpr (BAL) {  // past the unit's last step: the next unit's first (warp-uniform)
      if (++ls == Q) {
        ls = 0;
        ++lu;
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          const long long tl = min(lu * TPW + i, tiles - 1);
          wp[i] = W + tl * wt + 64 * g + 16 * t;
          sp[i] = S + tl * st + scale_offset<FMT>(g, t);
        }
      }
    }
  };
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (d < n_it) load(d);

  // KBIT4: the CTA fills its code table (dynamic shared memory, KBIT4_LUT_BYTES) while the
  // first weights are in flight (post: the codebook)
  WordDecoder<T, FMT, ENC, WIDE> dec;
  if constexpr (FMT == FMT_KBIT4) {
    static_assert(!A_RING, "kbit4 keeps its table where the A ring would go");
    extern __shared__ __align__(16) uint32_t lut[];
    kfill.fill(lut);
    __syncthreads();
    dec.lut = (uint32_t)__cvta_generic_to_shared(lut);
    dec.lane_lut = WIDE ? 4u * lane : dec.lut + 4u * lane;
  }

  // the epilogue's row factors and bias: EARLY (m_tile 8 at <= 128 registers) loaded now (their
  // latency hides behind the loop), else in the stores (registers)
  const bool pre = ks == 0 && place.splits() == 1;  // this warp stores C
  float fac[TPW][2], bia[TPW][2];
  if ((EARLY || GLU) && !BAL) {
#pragma unroll
    for (int i = 0; i < TPW; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = GLU ? min(tile0 * 16 + g + 8 * h, N - 1) + 16 * i * place.up()
                          : min((tile0 + i) * 16 + g + 8 * h, N - 1);
        fac[i][h] = pre ? row_factor<T, FMT, POST>(post, alpha, n) : 0.0f;
        bia[i][h] = pre && has_bias ? to_float(bias[n]) : 0.0f;
      }
  }

  // token rows g (+8) of this pass; rows past M re-read row M-1 (their columns are never stored)
  const int m0 = place.z() * M_TILE;
  const int rows = min(M_TILE, M - m0);
  const T* ap[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)  // BAL: the row's start (a step's offset is ds * STEP_K)
    ap[nt] = A + (size_t)(m0 + min(g + 8 * nt, rows - 1)) * K + (size_t)(BAL ? 0 : q0) * STEP_K + 8 * t;

  // A_RING: the step's A rows (M_TILE x 256 bytes) are copied by cp.async into this warp's ring
  // slot of dynamic shared memory (full 32-byte sectors, DEPTH steps ahead like the weights) and
  // read back by conflict-free LDS (swz). Lane copies row lane / LPR, chunks lane % LPR + LPR u
  // (one source pointer, immediate offsets; the destinations precomputed). The copies allocate
  // in L1 (.ca: every warp of a K slice reads the same A; H100 with .cg, L2 only: 2.5-13x slower,
  // worst at small M). Rows past M are zero-filled once per slot (the first DEPTH fills read
  // nothing) and then skipped: no lane re-reads row M-1.
  constexpr uint32_t SLOT = M_TILE * 256;
  constexpr int LPR = 32 / M_TILE, NCP = 16 / LPR;  // lanes a row, copies a lane
  [[maybe_unused]] uint32_t rd[4] = {}, wr[NCP] = {};
  [[maybe_unused]] const T* arow = A;
  [[maybe_unused]] bool a_row_ok = false;
  if constexpr (A_RING) {
    extern __shared__ __align__(16) uint8_t a_ring_smem[];
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(a_ring_smem) + warp * (DEPTH * SLOT);
#pragma unroll
    for (int j = 0; j < 4; ++j) rd[j] = ring + g * 256 + swz(t + 4 * j, g) * 16;  // chunk t + 4j of row g (+8)
    const int r = lane / LPR, c0 = lane % LPR;
#pragma unroll
    for (int u = 0; u < NCP; ++u) wr[u] = ring + r * 256 + swz(c0 + LPR * u, r) * 16;
    arow = A + (size_t)(m0 + min(r, rows - 1)) * K + (size_t)q0 * STEP_K + 8 * c0;
    a_row_ok = r < rows;
  }
  const auto fill = [&](int d, bool first) {  // the next step's A into slot d (steps in order)
    if (first || a_row_ok) {  // a row past M: zeros on the slot's first fill, then nothing
#pragma unroll
      for (int u = 0; u < NCP; ++u) cp_async16_ca(wr[u] + d * SLOT, arow + 8 * LPR * u, a_row_ok ? 16u : 0u);
    }
    arow += STEP_K;
  };
  if constexpr (A_RING) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (d < n_it) fill(d, true);
      cp_async_commit();  // one group a step, empty or not: wait_group counts steps
    }
  }

  float acc[CH][NT][4];
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[c][nt][0] = acc[c][nt][1] = acc[c][nt][2] = acc[c][nt][3] = 0.0f;

  // BAL: acc holds unit du's sum over its steps ds0 .. ds - 1; flush() stores it (a whole unit)
  // or writes it as one part of the unit to ws (slot 0: the run's first unit, 1: its last),
  // then clears acc. After the run, one fence publishes the parts; the part that brings a
  // unit's counter to its number of parts adds them all in run order, stores C and resets the
  // counter for the next launch (stream order).
  constexpr int NV = TPW * NT * 4;  // floats a lane holds
  // v[i][nt]: the sums of tile i of the warp's TPW (TPW == 1 adds its two chains, words 0, 2 and
  // 1, 3; LEAN m16 has one)
  const auto chain_sums = [&](float (&v)[TPW][NT][4]) {
#pragma unroll
    for (int i = 0; i < TPW; ++i)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[i][nt][e] = CH == 1 ? acc[0][nt][e] : TPW == 1 ? acc[0][nt][e] + acc[1][nt][e] : acc[i][nt][e];
  };
  [[maybe_unused]] int du = u_first, ds = q0, ds0 = q0, pend0 = -1, pend1 = -1;
  [[maybe_unused]] const bool mine = NT == 2 || 2 * t < rows;  // this lane holds tokens below M
  const auto store = [&](int u, const float (&x)[TPW][NT][4]) {
    for_frags<TPW, NT>(m0 + 2 * t, g, M, N, u * TPW, [&](int i, int nt, int e, int m, int n) {
      store_out<T, FMT, POST>(C, bias, has_bias, post, alpha, m, n, N, x[i][nt][e]);
    });
  };
  const auto flush = [&]() {
    float v[TPW][NT][4];
    chain_sums(v);
    if (ds0 == 0 && ds == Q) {
      store(du, v);
    } else {
      const int slot = du == u_first ? 0 : 1;
      (slot == 0 ? pend0 : pend1) = du;
      if (mine) {
        float* part = ws + (size_t)(gw * 2 + slot) * NV * 32 + lane;
#pragma unroll
        for (int x = 0; x < NV; ++x) __stcg(part + 32 * x, (&v[0][0][0])[x]);
      }
    }
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[c][nt][0] = acc[c][nt][1] = acc[c][nt][2] = acc[c][nt][3] = 0.0f;
  };
  const auto finish = [&](int u) {  // after the fence: count this part of unit u in
    unsigned old = 0;
    if (lane == 0) old = atomicAdd(counters + u, 1u);
    old = __shfl_sync(FULL, old, 0);
    const uint32_t u0 = (uint32_t)u * Q;  // the unit's first block
    const uint32_t g_first = u0 / L, g_last = (u0 + Q - 1) / L;  // the runs holding its ends
    if (old != g_last - g_first) return;
    __threadfence();
    float sum[TPW][NT][4];
    float* sf = &sum[0][0][0];
#pragma unroll
    for (int x = 0; x < NV; ++x) sf[x] = 0.0f;
    constexpr int R = NV <= 8 ? 4 : 2;  // parts in flight (registers: m_tile 16 at TPW 2 spilled at 4)
    for (uint32_t h0 = g_first; h0 <= g_last; h0 += R) {
      float pv[R][NV];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t h = h0 + r;  // slot 0 where the unit is the run's first
        if (mine && h <= g_last) {
          const float* part = ws + (size_t)(h * 2 + (h * L >= u0 ? 0 : 1)) * NV * 32 + lane;
#pragma unroll
          for (int x = 0; x < NV; ++x) pv[r][x] = __ldcg(part + 32 * x);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (mine && h0 + r <= g_last) {
#pragma unroll
          for (int x = 0; x < NV; ++x) sf[x] += pv[r][x];
        }
    }
    store(u, sum);
    if (lane == 0) counters[u] = 0u;
  };

  for (int it0 = 0; it0 < n_it; it0 += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (it0 + d < n_it) {  // warp-uniform
        uint4 b[4][NT];  // A[token][k0 + 32j + 8t .. +7] of this step, shared by the TPW tiles
        if constexpr (A_RING) {
          cp_async_wait<DEPTH - 1>();  // this step's group has landed (this lane's copies)
          __syncwarp();                // and every other lane's
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) b[j][nt] = lds128(rd[j] + d * SLOT + nt * 2048);
        } else if constexpr (!A_BY_WORD) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) b[j][nt] = ld_nc_v4(ap[nt] + (BAL ? ds : d) * STEP_K + 32 * j);
        }
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          RowScale<T, FMT> sca, scb;
          if constexpr (!POST) {
            sca = row_scales<T, FMT>(sr[d][i].x);
            scb = row_scales<T, FMT>(sr[d][i].y);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if constexpr (A_BY_WORD) {
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) b[j][nt] = ld_nc_v4(ap[nt] + (BAL ? ds : d) * STEP_K + 32 * j);
            }
            uint32_t f[8];
            const int c = CH == 1 ? 0 : TPW == 1 ? (j & 1) : i;
            if constexpr (POST) {  // raw fragments, the group factor on the word's sums
              raw_frags_of_word(dec, word_of(wa[d][i], j), word_of(wb[d][i], j), f);
              float xa, xb;
              if constexpr (FMT == FMT_KBIT4) {
                kbit4_word_factors<T>(sr[d][i].x, sr[d][i].y, j, xa, xb);
              } else {
                xa = mx_word_factor<T>(sr[d][i].x, j);
                xb = mx_word_factor<T>(sr[d][i].y, j);
              }
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                Mma<T>::run(p, f[0], f[1], f[2], f[3], b[j][nt].x, b[j][nt].y);
                Mma<T>::run(p, f[4], f[5], f[6], f[7], b[j][nt].z, b[j][nt].w);
                acc[c][nt][0] = fmaf(p[0], xa, acc[c][nt][0]);  // row g
                acc[c][nt][1] = fmaf(p[1], xa, acc[c][nt][1]);
                acc[c][nt][2] = fmaf(p[2], xb, acc[c][nt][2]);  // row g+8
                acc[c][nt][3] = fmaf(p[3], xb, acc[c][nt][3]);
              }
            } else {
              frags_of_word(dec, word_of(wa[d][i], j), word_of(wb[d][i], j), sca, scb, j, f);
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                Mma<T>::run(acc[c][nt], f[0], f[1], f[2], f[3], b[j][nt].x, b[j][nt].y);
                Mma<T>::run(acc[c][nt], f[4], f[5], f[6], f[7], b[j][nt].z, b[j][nt].w);
              }
            }
          }
        }
        // the slot refills once decoded (no register copies; DEPTH - 1 steps stay in flight)
        if (it0 + d + DEPTH < n_it) load(d);  // warp-uniform
        if constexpr (BAL) {
          if (++ds == Q || it0 + d + 1 == n_it) {  // the unit's last step, or the run's
            flush();
            ++du;
            ds0 = ds = 0;
          }
        }
        if constexpr (A_RING) {
          __syncwarp();  // every lane has read slot d
          if (it0 + d + DEPTH < n_it) fill(d, false);
          cp_async_commit();
        }
      }
    }
    if constexpr (!BAL) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) ap[nt] += DEPTH * STEP_K;
    }
  }
  if constexpr (BAL) {  // every unit flushed; count the parts in
    if (pend0 >= 0 || pend1 >= 0) {
      __threadfence();
      __syncwarp();
      if (pend0 >= 0) finish(pend0);
      if (pend1 >= 0) finish(pend1);
    }
  } else {  // the K slices' sums meet in shared memory; warp slice 0 stores
    float v[TPW][NT][4];  // tile tile0 + i
    chain_sums(v);
    if (kw > 1) {  // the tile's KW slices, summed by slice 0 in slice order
      __shared__ float red[WARPS * NV * 32];
#pragma unroll
      for (int i = 0; i < TPW; ++i)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[(warp * NV + (i * NT + nt) * 4 + e) * 32 + lane] = v[i][nt][e];
      __syncthreads();
      if (ks == 0) {
#pragma unroll
        for (int i = 0; i < TPW; ++i)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float s = 0.0f;
              for (int y = 0; y < kw; ++y) s += red[((warp + y) * NV + (i * NT + nt) * 4 + e) * 32 + lane];
              v[i][nt][e] = s;
            }
      }
    }

    const bool split = place.splits() > 1;
    float* wsy = ws + (size_t)place.y() * M * N;
    if (GLU && active && ks == 0) {  // fragment (0 / 1, nt, 2h + e): gate / up of C[m, n]
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + 8 * nt + 2 * t + (e & 1), n = tile0 * 16 + g + 8 * (e >> 1);
          if (m < M && n < N)
            C[(size_t)m * N + n] = from_float<T>(silu(v[0][nt][e] * fac[0][e >> 1]) * (v[1][nt][e] * fac[1][e >> 1]));
        }
    } else if (active && ks == 0) {
      for_frags<TPW, NT>(m0 + 2 * t, g, M, N, tile0, [&](int i, int nt, int e, int m, int n) {
        if (split) __stcg(wsy + (size_t)m * N + n, v[i][nt][e]);
        else if (EARLY) C[(size_t)m * N + n] = out_value<T>(v[i][nt][e], fac[i][e >> 1], has_bias, bia[i][e >> 1]);
        else store_out<T, FMT, POST>(C, bias, has_bias, post, alpha, m, n, N, v[i][nt][e]);
      });
    }
    constexpr int CTA_ROWS = 16 * TPW;  // W rows a (warp group of KW) covers
    if (split)
      split_finish<T, FMT, POST>(ws, counters + (size_t)place.z() * place.nx() + place.x(), place.splits(), C,
                                 bias, has_bias, post, alpha, m0, M_TILE,
                                 place.x() * (WARPS >> kw_log) * CTA_ROWS, (WARPS >> kw_log) * CTA_ROWS, M, N);
  }
}

}  // namespace kg::fp4
