// MoE grouped GEMM with kbit experts (decode-oriented):  Y[rows of e] = X[rows of e] . W[e]^T
//
//   X, offsets, Y, the work items and the SWIGLU row pairing: as templates/moe/grouped.cuh.
//   W        the flat kbit layout of [E, N, K] (quantize_kbit of the 3-D weight; K % 128 == 0):
//            row r = e*N + n is K/32 blocks; packed[(r*K/32 + kb)*BITS + b] = bit plane b of
//            block kb (bit j = element j), absmax[r*K/32 + kb] = E4M4 scale, codebook[2^BITS]
//
// Always swap_ab: weight rows on the mma's 16-row side (a warp owns 16 rows), tokens on its n8
// side. A stage is WARPS_K sub-ranges of 128 k (4 blocks); the planes, scales and X rows of a
// stage arrive by cp.async. Weight rows past N copy a valid row (their outputs are never
// stored), X rows past the segment are zero-filled; sub-ranges past K zero-fill their scales
// and X and skip their planes (stale planes decode to finite values, times a zero scale).
// Warp (wp, wk) decodes rows wp*16 + g and + 8, block t of sub-range wk, in registers:
//   - a few bit selects turn the BITS plane words into "pair codes" of two adjacent elements
//     (make_codes: 16 pairs a block, 4 per code word, one per byte);
//   - a shared table maps a pair code to the two codebook values as a T pair (256 entries, one
//     copy per lane: random codes never collide in a bank), then one packed multiply by the
//     block scale. As in the kbit GEMV (ScaleBits), the table holds the codebook
//     (rounded to T) times a power of two and the E4M4 byte shifted into T's fields is the
//     scale over that power: one PRMT + shift a scale pair, the product bit-identical (one
//     rounding in T).
// The mma's k order is free (a sum): lane t's k-slots {2t, 2t+1 | 2t+8, 2t+9} take elements
// {8r, 8r+1 | 8r+2, 8r+3} (then {8r+4, 8r+5 | 8r+6, 8r+7}) of its block t, so X is read as it
// lies: one 16-byte shared load of 8 consecutive k per token and byte r feeds two mmas. X rows
// in shared memory are 256 bytes a sub-range, their 16-byte chunks swizzled so that the 8
// lanes of a quarter warp hit 8 different bank groups.
#pragma once
#include "common/e4m4.cuh"  // ScaleBits, table_value: E4M4 scales as one PRMT + shift
#include "moe/grouped.cuh"

namespace kg::moe {

constexpr int KBIT_LUT_BYTES = 256 * 32 * 4;  // pair table: 256 codes x 32 lane copies x 4 B

// 16-byte chunk c (0..15) of X row q in a 256-byte sub-range row: chunk groups of the quarter
// warp {4t + q'} x {q even, q odd} are all different mod 8.
__device__ __forceinline__ int x_chunk(int c, int q) { return c ^ (((c >> 3) & 1) | ((q & 1) << 1)); }

// Pair codes of one block (BITS plane words, element j in bit j): byte r of
//   le = elements (8r, 8r+1)   he = (8r+2, 8r+3)   lo = (8r+4, 8r+5)   ho = (8r+6, 8r+7)
// with bit 2b + i = plane b of the pair's element i (planes >= BITS are 0). A handful of bit
// selects for 32 elements (the construction of templates/kbit_gemm/gemv.cuh).
struct Codes { uint32_t le, lo, he, ho; };

template <int BITS>
__device__ __forceinline__ Codes make_codes(const uint32_t (&w)[4]) {
  constexpr uint32_t M2 = 0x33333333u, M4 = 0x0F0F0F0Fu;
  // nibble n: planes 0, 1 of elements (4n, 4n+1) (l01) / (4n+2, 4n+3) (h01)
  const uint32_t l01 = bitsel(M2, w[0], w[1] << 2);
  const uint32_t h01 = bitsel(M2, w[0] >> 2, w[1]);
  if constexpr (BITS == 2) {
    return Codes{l01 & M4, (l01 >> 4) & M4, h01 & M4, (h01 >> 4) & M4};
  } else {
    const uint32_t l23 = BITS == 3 ? (w[2] & M2) : bitsel(M2, w[2], w[3] << 2);
    const uint32_t h23 = BITS == 3 ? ((w[2] >> 2) & M2) : bitsel(M2, w[2] >> 2, w[3]);
    return Codes{bitsel(M4, l01, l23 << 4), bitsel(M4, l01 >> 4, l23), bitsel(M4, h01, h23 << 4),
                 bitsel(M4, h01 >> 4, h23)};
  }
}

// The scaled T pair of the code in byte r of `codes`: this lane's copy of the table entry.
template <typename T>
__device__ __forceinline__ uint32_t pair(uint32_t lane_lut, uint32_t codes, int r, uint32_t scale) {
  return hmul2<T>(lds32(lane_lut + (__byte_perm(codes, 0u, 0x4440u | (uint32_t)r) << 7)), scale);
}

template <typename T, int BITS, int WARPS_P, int WARPS_K, int TQ, int STAGES, bool SWIGLU>
struct GroupedKbit {
  static_assert(BITS >= 2 && BITS <= 4, "kbit experts: 2..4 bits (pair codes fit a byte)");
  static constexpr int THREADS = 32 * WARPS_P * WARPS_K;
  static constexpr int TP = 16 * WARPS_P;  // weight rows of a CTA
  static constexpr int NI = TQ / 8;
  static constexpr int ACC = NI * 4;
  static constexpr int PLANE_BYTES = TP * 16 * BITS;  // per sub-range: [TP][4 blocks][BITS] u32
  static constexpr int SCALE_BYTES = TP * 4;           // per sub-range: [TP][4 blocks] u8
  static constexpr int X_BYTES = TQ * 256;             // per sub-range: [TQ][128 k] T
  static constexpr int SUB_BYTES = PLANE_BYTES + SCALE_BYTES + X_BYTES;
  static constexpr int STAGE_BYTES = WARPS_K * SUB_BYTES;
  static constexpr int SMEM_RED = (WARPS_K - 1) * WARPS_P * ACC * 32 * 4;
  static constexpr int SMEM_PIPE = STAGES * STAGE_BYTES > SMEM_RED ? STAGES * STAGE_BYTES : SMEM_RED;
  static constexpr int SMEM_MAIN = KBIT_LUT_BYTES + SMEM_PIPE;
  static constexpr int SMEM = SMEM_MAIN + 16;  // + the work item

  // Entry c (bit 2b + i = plane b of element i) = (cb[index 0], cb[index 1]) as a T pair; lane l
  // holds cb[l mod 2^BITS] (lane_cb, read before the kernel's first loads: read after its
  // first stages, the fill waited behind them) and the others' values come by shuffle (the trip
  // count is a constant: every lane shuffles).
  static_assert(2048 % THREADS == 0, "the table fill needs THREADS dividing 2048");
  static __device__ __forceinline__ void fill_lut(unsigned char* lut, float lane_cb) {
    const float cb = table_value<T>(lane_cb);
#pragma unroll 4
    for (int i = threadIdx.x; i < 256 * 8; i += THREADS) {  // 8 x 16 B = 32 copies an entry
      const int c = i >> 3;
      int i0, i1;
      pair_indices<4>(c, i0, i1);
      constexpr int MASK = (1 << BITS) - 1;
      const uint32_t v = pack2<T>(__shfl_sync(0xFFFFFFFFu, cb, i0 & MASK), __shfl_sync(0xFFFFFFFFu, cb, i1 & MASK));
      *reinterpret_cast<uint4*>(lut + c * 128 + (i & 7) * 16) = make_uint4(v, v, v, v);
    }
  }

  static __device__ __forceinline__ void run(const T* __restrict__ X,
                                             const uint32_t* __restrict__ packed,
                                             const uint8_t* __restrict__ absmax,
                                             const float* __restrict__ codebook,
                                             const int* __restrict__ offsets, T* __restrict__ Y,
                                             int E, int N, int K, int M) {
    extern __shared__ __align__(128) unsigned char smem[];
    const float lane_cb = __ldg(codebook + (threadIdx.x & ((1 << BITS) - 1)));  // fill_lut's, first
    const int n_tiles = (N + TP - 1) / TP;
    const TileOf tile = find_tile<TQ>(offsets, E, M, n_tiles, blockIdx.x,
                                      reinterpret_cast<int*>(smem + SMEM_MAIN));
    if (tile.e < 0) return;
    const int n0 = tile.n_tile * TP;
    const int KB = K / 32;  // blocks per row
    const int tid = threadIdx.x;

    const uint32_t lut = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t pipe = lut + KBIT_LUT_BYTES;
    const int k_tiles = (KB + 4 * WARPS_K - 1) / (4 * WARPS_K);

    // Copy slots, fixed over k (only the k offset moves from stage to stage): slot j of a
    // thread is item tid + j * THREADS of the stage's plane chunks (WARPS_K x TP x BITS, 16 B),
    // scale words (WARPS_K x TP, 4 B) and X chunks (WARPS_K x TQ x 16, 16 B). Per slot: the
    // source at stage 0 (a valid row: weight rows past N are clamped), the shared offset in a
    // stage, the sub-range's first block (a sub-range past K reads nothing) and for X whether
    // the token row is in the segment.
    constexpr int P_ITEMS = WARPS_K * TP * BITS, S_ITEMS = WARPS_K * TP, X_ITEMS = WARPS_K * TQ * 16;
    constexpr int P_SLOTS = (P_ITEMS + THREADS - 1) / THREADS;
    constexpr int S_SLOTS = (S_ITEMS + THREADS - 1) / THREADS;
    constexpr int X_SLOTS = (X_ITEMS + THREADS - 1) / THREADS;
    const uint32_t* p_src[P_SLOTS];
    const uint8_t* s_src[S_SLOTS];
    const T* x_src[X_SLOTS];
    uint32_t p_dst[P_SLOTS], s_dst[S_SLOTS], x_dst[X_SLOTS];
    int p_kb[P_SLOTS], s_kb[S_SLOTS], x_kb[X_SLOTS];  // first block of the slot's sub-range
    bool x_ok[X_SLOTS];
    const auto w_block = [&](int r, int s) -> size_t {  // block of (row r, sub-range s)
      int row;
      const bool ok = weight_row<SWIGLU>(n0 + r, N, row);
      return ((size_t)tile.e * N + (ok ? row : 0)) * KB + 4 * s;
    };
#pragma unroll
    for (int j = 0; j < P_SLOTS; ++j) {
      const int i = min(tid + j * THREADS, P_ITEMS - 1);
      const int s = i / (TP * BITS), r = (i / BITS) % TP, c = i % BITS;
      p_src[j] = packed + w_block(r, s) * BITS + c * 4;
      p_dst[j] = (uint32_t)(s * SUB_BYTES + r * 16 * BITS + c * 16);
      p_kb[j] = 4 * s;
    }
#pragma unroll
    for (int j = 0; j < S_SLOTS; ++j) {
      const int i = min(tid + j * THREADS, S_ITEMS - 1);
      const int s = i / TP, r = i % TP;
      s_src[j] = absmax + w_block(r, s);
      s_dst[j] = (uint32_t)(s * SUB_BYTES + PLANE_BYTES + r * 4);
      s_kb[j] = 4 * s;
    }
#pragma unroll
    for (int j = 0; j < X_SLOTS; ++j) {
      const int i = min(tid + j * THREADS, X_ITEMS - 1);
      const int s = i / (TQ * 16), q = (i / 16) % TQ, c = i % 16;
      x_ok[j] = q < tile.rows;
      x_src[j] = X + (size_t)(tile.row0 + (x_ok[j] ? q : 0)) * K + 128 * s + c * 8;
      x_dst[j] = (uint32_t)(s * SUB_BYTES + PLANE_BYTES + SCALE_BYTES + q * 256 + x_chunk(c, q) * 16);
      x_kb[j] = 4 * s;
    }
    // Stage kt (at shared offset st): blocks kt * 4 * WARPS_K + 4s .. + 3 of every row, k 32x
    // that of X. Items past the end copy nothing (their threads skip); with WARPS_K == 1 every
    // sub-range of a stage lies inside K.
    const auto load_stage = [&](int kt, uint32_t st) {
      const int kb0 = kt * 4 * WARPS_K;
#pragma unroll
      for (int j = 0; j < P_SLOTS; ++j)
        if (tid + j * THREADS < P_ITEMS && (WARPS_K == 1 || kb0 + p_kb[j] < KB))
          cp_async16(st + p_dst[j], p_src[j] + (size_t)kb0 * BITS);
#pragma unroll
      for (int j = 0; j < S_SLOTS; ++j)
        if (tid + j * THREADS < S_ITEMS) {
          if constexpr (WARPS_K == 1) {
            cp_async4(st + s_dst[j], s_src[j] + kb0);
          } else {
            const bool ok = kb0 + s_kb[j] < KB;
            cp_async4_zfill(st + s_dst[j], ok ? s_src[j] + kb0 : s_src[j], ok);
          }
        }
#pragma unroll
      for (int j = 0; j < X_SLOTS; ++j)
        if (tid + j * THREADS < X_ITEMS) {
          const bool ok = x_ok[j] && (WARPS_K == 1 || kb0 + x_kb[j] < KB);
          cp_async16_zfill(st + x_dst[j], ok ? x_src[j] + (size_t)kb0 * 32 : x_src[j], ok);
        }
    };
    constexpr uint32_t PIPE_BYTES = STAGES * STAGE_BYTES;
    const auto next = [](uint32_t off) {
      return off + STAGE_BYTES == PIPE_BYTES ? 0u : off + STAGE_BYTES;
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_stage(s, pipe + (uint32_t)(s * STAGE_BYTES));
      cp_async_commit();
    }
    fill_lut(smem, lane_cb);  // overlaps the first stages' copies; the loop's barrier publishes it

    const int lane = tid & 31, warp = tid >> 5;
    const int wp = warp % WARPS_P, wk = warp / WARPS_P;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane_lut = lut + (uint32_t)lane * 4u;
    float acc[NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) acc[ni][0] = acc[ni][1] = acc[ni][2] = acc[ni][3] = 0.0f;
    const int r0 = wp * 16 + g;

    uint32_t rd = 0, wr = (uint32_t)((STAGES - 1) * STAGE_BYTES);  // stage offsets: read, load
    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      if (kt + STAGES - 1 < k_tiles) load_stage(kt + STAGES - 1, pipe + wr);
      cp_async_commit();
      wr = next(wr);
      const uint32_t sub = pipe + rd + (uint32_t)(wk * SUB_BYTES);
      rd = next(rd);
      // rows r0, r0 + 8: block t's planes and scale
      uint32_t w0[4] = {0u, 0u, 0u, 0u}, w1[4] = {0u, 0u, 0u, 0u};
      {
        const uint32_t a0 = sub + (uint32_t)((r0 * 4 + t) * 4 * BITS);
        const uint32_t a1 = a0 + (uint32_t)(8 * 16 * BITS);
        if constexpr (BITS == 4) {
          const uint4 u = lds128(a0), v = lds128(a1);
          w0[0] = u.x; w0[1] = u.y; w0[2] = u.z; w0[3] = u.w;
          w1[0] = v.x; w1[1] = v.y; w1[2] = v.z; w1[3] = v.w;
        } else {
#pragma unroll
          for (int b = 0; b < BITS; ++b) { w0[b] = lds32(a0 + 4 * b); w1[b] = lds32(a1 + 4 * b); }
        }
      }
      const unsigned char* sc = smem + (sub - lut) + PLANE_BYTES;
      // (scale, scale) / ScaleBits<T>::TABLE as a T pair: the byte in both halves, shifted
      constexpr int SH = ScaleBits<T>::SHIFT;
      const uint32_t s0 = __byte_perm((uint32_t)sc[r0 * 4 + t], 0u, 0x4040u) << SH;
      const uint32_t s1 = __byte_perm((uint32_t)sc[(r0 + 8) * 4 + t], 0u, 0x4040u) << SH;
      const uint32_t xs = sub + PLANE_BYTES + SCALE_BYTES;
      const Codes ca = make_codes<BITS>(w0), cb = make_codes<BITS>(w1);
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // byte r: elements 8r..8r+7 of block t
        // W pairs (8r, 8r+1) (8r+2, 8r+3) (8r+4, 8r+5) (8r+6, 8r+7) of rows r0 and r0 + 8
        const uint32_t a_le = pair<T>(lane_lut, ca.le, r, s0), b_le = pair<T>(lane_lut, cb.le, r, s1);
        const uint32_t a_he = pair<T>(lane_lut, ca.he, r, s0), b_he = pair<T>(lane_lut, cb.he, r, s1);
        const uint32_t a_lo = pair<T>(lane_lut, ca.lo, r, s0), b_lo = pair<T>(lane_lut, cb.lo, r, s1);
        const uint32_t a_ho = pair<T>(lane_lut, ca.ho, r, s0), b_ho = pair<T>(lane_lut, cb.ho, r, s1);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int tok = ni * 8 + g;
          const int c = 4 * t + r;  // X chunk: k 32t + 8r .. + 7, in the weights' pair order
          const uint4 xv = lds128(xs + (uint32_t)(tok * 256 + x_chunk(c, tok) * 16));
          Mma<T>::run(acc[ni], a_le, b_le, a_he, b_he, xv.x, xv.y);
          Mma<T>::run(acc[ni], a_lo, b_lo, a_ho, b_ho, xv.z, xv.w);
        }
      }
    }
    cp_async_wait<0>();

    if (!reduce_k<ACC, WARPS_P, WARPS_K>(*reinterpret_cast<float(*)[ACC]>(&acc[0][0]),
                                         reinterpret_cast<float*>(smem + KBIT_LUT_BYTES), wp, wk,
                                         lane))
      return;
    store_swap<T, SWIGLU, 1, NI>(*reinterpret_cast<const float(*)[1][NI][4]>(&acc[0][0]), tile,
                                 n0 + wp * 16, 0, Y, N, lane);
  }
};

}  // namespace kg::moe
