// kbit: blockwise (32 elements) codebook quantization with 2..5 bits per element.
//
// Storage (flat layout, as produced by quantize):
//   packed [n_blocks * BITS] uint32   block i's bit-plane words at [i*BITS, (i+1)*BITS);
//                                     word b holds bit b of the 32 indices, lane j in bit j
//   absmax [n_blocks]                 fp32 from quantize; E4M4 byte or fp16 for dequantize
// One warp owns a group of BPW = 32/BITS consecutive blocks per step, so that the group's
// BPW*BITS plane words fit in one word per lane and move with one coalesced access.
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"

namespace kg::kbit {

template <int BITS> struct Fmt {
  static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
  static constexpr int LEVELS = 1 << BITS;
  static constexpr int BPW = 32 / BITS;  // blocks per warp step: 16, 10, 8, 6
};

// Nearest codebook index of v by binary search over the midpoints of the sorted codebook.
// `mid` holds midpoint[lane] = (cb[lane] + cb[lane+1]) / 2 in fp32 (lanes < LEVELS-1).
// Result = number of midpoints strictly below v (ties go to the lower index; NaN -> 0).
template <int BITS>
__device__ __forceinline__ uint32_t nearest_index(float v, float mid) {
  uint32_t pos = 0;
#pragma unroll
  for (int s = 1 << (BITS - 1); s >= 1; s >>= 1) {
    const float t = __shfl_sync(0xffffffffu, mid, pos + s - 1);
    if (v > t) pos += s;
  }
  return pos;
}

// Bit b of every lane's index into one word (lane j -> bit j).
template <int BITS>
__device__ __forceinline__ void ballot_planes(uint32_t idx, uint32_t (&planes)[BITS]) {
#pragma unroll
  for (int b = 0; b < BITS; ++b) planes[b] = __ballot_sync(0xffffffffu, (idx >> b) & 1u);
}

template <int BITS>
__device__ __forceinline__ uint32_t lane_index(const uint32_t (&planes)[BITS], int lane) {
  uint32_t idx = 0;
#pragma unroll
  for (int b = 0; b < BITS; ++b) idx |= ((planes[b] >> lane) & 1u) << b;
  return idx;
}

template <typename A> __device__ __forceinline__ float load_absmax(const A* p, long long i);
template <> __device__ __forceinline__ float load_absmax<uint8_t>(const uint8_t* p, long long i) {
  return e4m4_decode(p[i]);
}
template <> __device__ __forceinline__ float load_absmax<half>(const half* p, long long i) {
  return __half2float(p[i]);
}
template <> __device__ __forceinline__ float load_absmax<float>(const float* p, long long i) {
  return p[i];
}

// x [n] (T) -> packed [n_blocks*BITS] u32, absmax [n_blocks] fp32 and E4M4.
// A partial last block reads its missing elements as 0.
template <typename T, int BITS>
__device__ __forceinline__ void quantize(const T* __restrict__ x, const float* __restrict__ codebook,
                                         uint32_t* __restrict__ packed, float* __restrict__ absmax,
                                         uint8_t* __restrict__ absmax_e4m4, long long n) {
  using F = Fmt<BITS>;
  const int lane = lane_id();
  const long long n_blocks = (n + 31) / 32;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long blk0 = warp * F::BPW;
  if (blk0 >= n_blocks) return;

  // Midpoints of the sorted codebook, computed exactly as the reference does (fp32, RN).
  const float c0 = lane < F::LEVELS ? codebook[lane] : 0.0f;
  const float c1 = lane + 1 < F::LEVELS ? codebook[lane + 1] : 0.0f;
  const float mid = __fmul_rn(__fadd_rn(c0, c1), 0.5f);

  // Issue all loads of the step first: BPW independent 32-lane accesses in flight.
  float v[F::BPW];
#pragma unroll
  for (int b = 0; b < F::BPW; ++b) {
    const long long i = (blk0 + b) * 32 + lane;
    v[b] = i < n ? to_float(x[i]) : 0.0f;
  }
  uint32_t my_word = 0;
  float my_amax = 0.0f;
#pragma unroll
  for (int b = 0; b < F::BPW; ++b) {
    const float amax = warp_max(fabsf(v[b]));
    const float q = __fdiv_rn(v[b], fmaxf(amax, 1e-8f));
    uint32_t planes[BITS];
    ballot_planes<BITS>(nearest_index<BITS>(q, mid), planes);
#pragma unroll
    for (int k = 0; k < BITS; ++k)
      if (lane == b * BITS + k) my_word = planes[k];
    if (lane == b) my_amax = amax;
  }
  // One coalesced store of the step's plane words and scales.
  const long long nb = min((long long)F::BPW, n_blocks - blk0);
  if (lane < nb * BITS) packed[blk0 * BITS + lane] = my_word;
  if (lane < nb) {
    absmax[blk0 + lane] = my_amax;
    absmax_e4m4[blk0 + lane] = e4m4_encode(my_amax);
  }
}

// packed [n_blocks*BITS] u32 + absmax [n_blocks] (E4M4 byte / fp16 / fp32) -> out [n] (T).
template <typename T, typename A, int BITS>
__device__ __forceinline__ void dequantize(const uint32_t* __restrict__ packed,
                                           const A* __restrict__ absmax,
                                           const float* __restrict__ codebook, T* __restrict__ out,
                                           long long n) {
  using F = Fmt<BITS>;
  const int lane = lane_id();
  const long long n_blocks = (n + 31) / 32;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long blk0 = warp * F::BPW;
  if (blk0 >= n_blocks) return;

  const float cb = lane < F::LEVELS ? codebook[lane] : 0.0f;
  const long long nb = min((long long)F::BPW, n_blocks - blk0);
  const uint32_t word = lane < nb * BITS ? packed[blk0 * BITS + lane] : 0u;
  const float amax_l = lane < nb ? load_absmax<A>(absmax, blk0 + lane) : 0.0f;
#pragma unroll
  for (int b = 0; b < F::BPW; ++b) {
    uint32_t planes[BITS];
#pragma unroll
    for (int k = 0; k < BITS; ++k) planes[k] = __shfl_sync(0xffffffffu, word, b * BITS + k);
    const float amax = __shfl_sync(0xffffffffu, amax_l, b);
    const float val = __fmul_rn(__shfl_sync(0xffffffffu, cb, lane_index<BITS>(planes, lane)), amax);
    const long long i = (blk0 + b) * 32 + lane;
    if (i < n) out[i] = from_float<T>(val);
  }
}

// Flat -> GEMM-tiled layout for W [N, K] (row-major, blocks of 32 along K):
//   packed_tiled [K/TILE_K][N/TILE_N][TILE_N][TILE_K/32][BITS] u32
//   absmax_tiled [K/TILE_K][N/TILE_N][TILE_N][TILE_K/32]       u8 (E4M4)
// One thread per tiled (column, k-block): it moves BITS words and one scale byte.
template <int BITS, int TILE_N, int TILE_K>
__device__ __forceinline__ void repack(const uint32_t* __restrict__ packed,
                                       const uint8_t* __restrict__ absmax,
                                       uint32_t* __restrict__ packed_tiled,
                                       uint8_t* __restrict__ absmax_tiled, int N, int K) {
  constexpr int KB = TILE_K / 32;  // k-blocks per tile
  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // tiled block index
  const long long total = (long long)N * (K / 32);
  if (t >= total) return;
  const int kb = (int)(t % KB);
  const int col = (int)((t / KB) % TILE_N);
  const long long tile = t / ((long long)KB * TILE_N);
  const int n_tiles = N / TILE_N;
  const int n_tile = (int)(tile % n_tiles);
  const int k_tile = (int)(tile / n_tiles);
  const long long n = (long long)n_tile * TILE_N + col;
  const long long kblock = (long long)k_tile * KB + kb;
  const long long src = n * (K / 32) + kblock;  // flat block id of (n, 32*kblock)
#pragma unroll
  for (int b = 0; b < BITS; ++b) packed_tiled[t * BITS + b] = packed[src * BITS + b];
  absmax_tiled[t] = absmax[src];
}

}  // namespace kg::kbit
