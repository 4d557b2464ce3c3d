// kbit: blockwise (32 elements) codebook quantization with 2..5 bits per element.
//
// Storage (flat layout, as produced by quantize):
//   packed [n_blocks * BITS] uint32   block i's bit-plane words at [i*BITS, (i+1)*BITS);
//                                     word b holds bit b of the 32 indices, lane j in bit j
//   absmax [n_blocks]                 fp32 from quantize; E4M4 byte or fp16 for dequantize
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"
#include "common/ptx.cuh"

namespace kg::kbit {

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

// ---------------------------------------------------------------------------------------------
// Quantize / dequantize: 4 lanes per block of 32, each lane owns 8 consecutive elements (one
// 16-byte access of fp16/bf16, two of fp32). A warp covers 8 blocks per step, grid-stride.
//
// Bit-matrix layout of one lane's 8 elements (bit-exact tricks, see the notes beside each):
//   X  (32 bits): byte b = byte `sub` of plane word b, i.e. bit 8b+j = bit b of element j.
//   Y  (32 bits): nibble nib(j) = the 4 low index bits of element j, nib(j) = 2*(j&3) + (j>>2).
// X <-> Y is one involution (two delta swaps, address bits 0<->3 and 1<->4).
// ---------------------------------------------------------------------------------------------
constexpr int LANES_PER_BLOCK = 4;
constexpr int BLOCKS_PER_STEP = 32 / LANES_PER_BLOCK;  // blocks a warp handles per loop step

__host__ __device__ constexpr int nib(int j) { return 2 * (j & 3) + (j >> 2); }

__device__ __forceinline__ uint32_t planes_nibbles_swap(uint32_t x) {
  uint32_t t = ((x >> 7) ^ x) & 0x00AA00AAu;
  x ^= t ^ (t << 7);
  t = ((x >> 14) ^ x) & 0x0000CCCCu;
  x ^= t ^ (t << 14);
  return x;
}

// 8 fp32 values -> T with round to nearest even (as from_float), 16-byte stores.
template <typename T> struct Store8;
template <> struct Store8<half> {
  static __device__ __forceinline__ void vec(half* p, const float (&v)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    st_v4(p, w[0], w[1], w[2], w[3]);
  }
};
template <> struct Store8<__nv_bfloat16> {
  static __device__ __forceinline__ void vec(__nv_bfloat16* p, const float (&v)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    st_v4(p, w[0], w[1], w[2], w[3]);
  }
};
template <> struct Store8<float> {
  static __device__ __forceinline__ void vec(float* p, const float (&v)[8]) {
    st_v4(p, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
          __float_as_uint(v[3]));
    st_v4(p + 4, __float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]),
          __float_as_uint(v[7]));
  }
};

// Scale of a block for dequantize; E4M4 without branches (same values as e4m4_decode).
template <typename A> __device__ __forceinline__ float scale_of(const A* p, long long i) {
  return load_absmax<A>(p, i);
}
template <> __device__ __forceinline__ float scale_of<uint8_t>(const uint8_t* p, long long i) {
  return e4m4_decode_nobranch(__ldg(p + i));
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15u) == 0;
}

// -- quantize ------------------------------------------------------------------------------------
// Normalized value q = RN(x * RN(1 / max(amax, 1e-8))); index = number of codebook midpoints
// strictly below q (NaN -> 0), exactly as reference.quantize. The count comes from a table over
// QNB buckets of [-1, 1]: bkt() is monotone, so every midpoint in a lower bucket is < q and every
// one in a higher bucket is > q; only the (at most one, for the normal-float codebooks)
// midpoint of q's own bucket is compared. A codebook with two midpoints in one bucket takes the
// general path (count all midpoints below q). Exact for any sorted codebook.
constexpr int QNB = 64;       // buckets: width 1/32 (the NF5 midpoints are >= 0.0348 apart)
constexpr int QCOPIES = 16;   // table copies, one per half-warp lane: conflict-free 8-byte reads
constexpr float QBIAS = 8388608.0f;  // 2^23: ulp 1, so the rounded sum is the bucket number

// Bucket as the bits of a float in [2^23, 2^23 + QNB]. The upper clamp is only needed for
// midpoints: |q| <= 1 + 2^-21, so q's bucket never exceeds QNB. NaN -> bucket 0.
__device__ __forceinline__ uint32_t bkt_bits(float v) {
  return __float_as_uint(fmaxf(__fmaf_rn(v, 0.5f * QNB, QBIAS + 0.5f * QNB), QBIAS));
}

struct QTable {
  uint2 e[(QNB + 1) * QCOPIES];  // {bits of the candidate midpoint (+inf: none), lo}
  float mid[32];
};

template <int BITS>
__device__ __forceinline__ bool build_qtable(QTable& t, const float* __restrict__ codebook) {
  constexpr int L = 1 << BITS;
  __shared__ int bk[32];
  const int tid = threadIdx.x;
  if (tid < L - 1) {
    // Midpoints exactly as the reference: (cb[i] + cb[i+1]) * 0.5 in fp32, round to nearest.
    const float m = __fmul_rn(__fadd_rn(codebook[tid], codebook[tid + 1]), 0.5f);
    t.mid[tid] = m;
    bk[tid] = (int)(min(bkt_bits(m), __float_as_uint(QBIAS + QNB)) - __float_as_uint(QBIAS));
  }
  __syncthreads();
  int multi = 0;
  for (int b = tid; b <= QNB; b += blockDim.x) {
    int lo = 0, cnt = 0;
#pragma unroll 1
    for (int i = 0; i < L - 1; ++i) {
      lo += bk[i] < b;
      cnt += bk[i] == b;
    }
    const uint32_t cand = cnt ? __float_as_uint(t.mid[lo]) : 0x7F800000u;
#pragma unroll
    for (int c = 0; c < QCOPIES; ++c) t.e[b * QCOPIES + c] = make_uint2(cand, (uint32_t)lo);
    multi |= cnt > 1;
  }
  return __syncthreads_or(multi) != 0;
}

// 8 consecutive elements in their storage format (16 bytes; 32 for fp32), so that the next
// step's input can be in flight while this step computes.
template <typename T> struct Raw8 {
  uint4 a;
  // vec: x is 16-byte aligned and the whole warp step is in range (uniform over the warp).
  static __device__ __forceinline__ Raw8 load(const T* x, long long e0, long long n, bool vec) {
    Raw8 r;
    if (vec) {
      r.a = ld_nc_v4(x + e0);
    } else {  // unaligned tensor or the last block: element by element, zeros past the end
      const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
      uint32_t h[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = e0 + j < n ? (uint32_t)xs[e0 + j] : 0u;
      r.a = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    }
    return r;
  }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = kg::to_float(*reinterpret_cast<const T*>(&w[i]));
      v[2 * i + 1] = kg::to_float(*(reinterpret_cast<const T*>(&w[i]) + 1));
    }
  }
};
template <> struct Raw8<float> {
  uint4 a, b;
  static __device__ __forceinline__ Raw8 load(const float* x, long long e0, long long n, bool vec) {
    Raw8 r;
    if (vec) {
      r.a = ld_nc_v4(x + e0);
      r.b = ld_nc_v4(x + e0 + 4);
    } else {
      const uint32_t* xs = reinterpret_cast<const uint32_t*>(x);
      uint32_t h[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = e0 + j < n ? xs[e0 + j] : 0u;
      r.a = make_uint4(h[0], h[1], h[2], h[3]);
      r.b = make_uint4(h[4], h[5], h[6], h[7]);
    }
    return r;
  }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y);
    v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);
    v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y);
    v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);
  }
};

template <typename T, int BITS, bool MULTI>
__device__ __forceinline__ void quantize_step(const QTable& tab, const Raw8<T>& raw, uint32_t step,
                                              uint32_t aoff, uint32_t* __restrict__ packed,
                                              float* __restrict__ absmax,
                                              uint8_t* __restrict__ absmax_e4m4,
                                              uint32_t n_blocks) {
  const int lane = lane_id();
  const int sub = lane & 3;
  const uint32_t blk = step * BLOCKS_PER_STEP + (lane >> 2);
  float v[8];
  raw.to_float(v);
  // Block absmax: 8 local, then the 4 lanes of the block. fmaxf drops NaN like np.fmax.
  float amax = fabsf(v[0]);
#pragma unroll
  for (int j = 1; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float r = __frcp_rn(fmaxf(amax, 1e-8f));

  // Indices straight into their fields: element j at bit 4*nib(j) of y0 (BITS <= 4), or at
  // byte j%4 of y0 (j < 4) / y1 (j >= 4) for BITS = 5.
  uint32_t y0 = 0, y1 = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float q = __fmul_rn(v[j], r);
    const int sh = BITS <= 4 ? 4 * nib(j) : 8 * (j & 3);
    uint32_t& y = (BITS <= 4 || j < 4) ? y0 : y1;
    if (MULTI) {  // some bucket holds 2+ midpoints (not a normal-float codebook): count all
      uint32_t k = 0;
#pragma unroll 1
      for (int i = 0; i < (1 << BITS) - 1; ++i) k += q > tab.mid[i];
      y += k << sh;
    } else {
      const uint2 e = lds64(bkt_bits(q) * (QCOPIES * 8u) + aoff);
      y += e.y << sh;
      if (q > __uint_as_float(e.x)) y += 1u << sh;  // fields don't overlap: + is |
    }
  }

  // Indices -> this lane's byte of every plane word.
  uint32_t X, p4 = 0;
  if (BITS <= 4) {
    X = planes_nibbles_swap(y0);
  } else {
    const uint32_t ylo = y0, yhi = y1;  // byte k: index of element k / k+4
    X = planes_nibbles_swap((ylo & 0x0F0F0F0Fu) | ((yhi << 4) & 0xF0F0F0F0u));
    // Bit 4 of each byte -> bits 28..31 (multiplier shifts bit 8k+4 by 24-7k; no carries).
    const uint32_t plo = (ylo & 0x10101010u) * 0x01020408u;
    const uint32_t phi = (yhi & 0x10101010u) * 0x01020408u;
    p4 = (plo >> 28) | ((phi >> 24) & 0xF0u);
  }
  // 4x4 byte transpose across the block's lanes: lane s gets [lane0..3's byte s] = plane s.
  // Step A (xor 2): lanes 0,1 keep planes 0,1 of lanes {s, s^2}, lanes 2,3 planes 2,3.
  // Step B (xor 1): each lane picks its plane from itself and its neighbour.
  const uint32_t sel_a = (sub & 2) ? 0x3276u : 0x5410u;
  const uint32_t sel_b = (sub & 1) ? 0x3715u : 0x6240u;
  const uint32_t A = __byte_perm(X, __shfl_xor_sync(0xffffffffu, X, 2), sel_a);
  const uint32_t W = __byte_perm(A, __shfl_xor_sync(0xffffffffu, A, 1), sel_b);
  uint32_t W4 = 0;
  if (BITS == 5) {
    W4 = p4 << (8 * sub);
    W4 |= __shfl_xor_sync(0xffffffffu, W4, 1);
    W4 |= __shfl_xor_sync(0xffffffffu, W4, 2);
  }
  const uint32_t a8 = e4m4_encode_nobranch(amax);  // no branch: the stores below stay predicated
  if (blk < n_blocks) {
    if (sub < (BITS < 4 ? BITS : 4)) packed[(size_t)blk * BITS + sub] = W;
    if (BITS == 5 && sub == 1) packed[(size_t)blk * BITS + 4] = W4;
    if (sub == 0) absmax[blk] = amax;
    if (sub == 2) absmax_e4m4[blk] = (uint8_t)a8;
  }
}

template <typename T, int BITS, bool MULTI>
__device__ __forceinline__ void quantize_loop(const QTable& tab, const T* __restrict__ x,
                                              uint32_t* __restrict__ packed,
                                              float* __restrict__ absmax,
                                              uint8_t* __restrict__ absmax_e4m4, long long n) {
  // Block and step numbers in 32 bits (n < 2^37 elements); element offsets in 64.
  const uint32_t n_blocks = (uint32_t)((n + 31) / 32);
  const uint32_t n_steps = (n_blocks + BLOCKS_PER_STEP - 1) / BLOCKS_PER_STEP;
  const uint32_t n_warps = gridDim.x * blockDim.x / 32;
  uint32_t step = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (step >= n_steps) return;
  const bool x_vec = aligned16(x);  // else every step takes the element-by-element path
  const int lane = lane_id();
  // Shared address of entry (bucket, copy) = bits(u) * 128 + aoff: the bias of the float bits
  // (2^23 -> 0x4B000000, times 128) cancels in 32-bit unsigned arithmetic.
  const uint32_t aoff = (uint32_t)__cvta_generic_to_shared(tab.e) +
                        (uint32_t)(lane & (QCOPIES - 1)) * 8u -
                        __float_as_uint(QBIAS) * (QCOPIES * 8u);
  // Element e0 of a step: (step * 8 + lane / 4) * 32 + (lane % 4) * 8 = step * 256 + lane * 8.
  // Steps below n_full have all 256 elements in range: with x aligned, one 16-byte access each.
  const uint32_t n_full = x_vec ? (uint32_t)(n / 256) : 0u;
  const long long e_lane = lane * 8;
  // Two buffers, so that step i+1's input is in flight while step i computes (no copies).
  Raw8<T> a = Raw8<T>::load(x, (long long)step * 256 + e_lane, n, step < n_full);
  Raw8<T> b;
  for (;;) {
    uint32_t next = step + n_warps;
    if (next < n_steps) b = Raw8<T>::load(x, (long long)next * 256 + e_lane, n, next < n_full);
    quantize_step<T, BITS, MULTI>(tab, a, step, aoff, packed, absmax, absmax_e4m4, n_blocks);
    if (next >= n_steps) break;
    step = next;
    next = step + n_warps;
    if (next < n_steps) a = Raw8<T>::load(x, (long long)next * 256 + e_lane, n, next < n_full);
    quantize_step<T, BITS, MULTI>(tab, b, step, aoff, packed, absmax, absmax_e4m4, n_blocks);
    if (next >= n_steps) break;
    step = next;
  }
}

// x [n] (T) -> packed [n_blocks*BITS] u32, absmax [n_blocks] fp32 and E4M4.
// A partial last block reads its missing elements as 0. Any grid size works (grid-stride).
template <typename T, int BITS>
__device__ __forceinline__ void quantize(const T* __restrict__ x, const float* __restrict__ codebook,
                                         uint32_t* __restrict__ packed, float* __restrict__ absmax,
                                         uint8_t* __restrict__ absmax_e4m4, long long n) {
  __shared__ QTable tab;
  if (build_qtable<BITS>(tab, codebook))
    quantize_loop<T, BITS, true>(tab, x, packed, absmax, absmax_e4m4, n);
  else
    quantize_loop<T, BITS, false>(tab, x, packed, absmax, absmax_e4m4, n);
}

// -- dequantize ----------------------------------------------------------------------------------
// packed [n_blocks*BITS] u32 + absmax [n_blocks] (E4M4 byte / fp16 / fp32) -> out [n] (T).
// out = T(RN(cb[idx] * absmax)). The codebook lives in registers, replicated over the warp
// (lane l holds cb[l mod 2^BITS]), so a shuffle indexed by (Y >> 4*nib(j)) needs no masking:
// shfl reads the low 5 bits of the lane operand, and bits >= BITS only pick a replica.
template <typename T, typename A, int BITS>
__device__ __forceinline__ void dequantize(const uint32_t* __restrict__ packed,
                                           const A* __restrict__ absmax,
                                           const float* __restrict__ codebook, T* __restrict__ out,
                                           long long n) {
  constexpr int L = 1 << BITS;
  const int lane = lane_id();
  const int sub = lane & 3;
  // Block and step numbers in 32 bits (n < 2^37 elements); element offsets in 64.
  const uint32_t n_blocks = (uint32_t)((n + 31) / 32);
  const uint32_t n_steps = (n_blocks + BLOCKS_PER_STEP - 1) / BLOCKS_PER_STEP;
  const uint32_t warp0 = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const uint32_t n_warps = gridDim.x * blockDim.x / 32;
  const bool out_vec = aligned16(out);
  // Plane words of a block start 16-byte (BITS=4) / 8-byte (BITS=2) aligned if packed does.
  const bool planes_vec = (reinterpret_cast<unsigned long long>(packed) & (4u * BITS - 1)) == 0;
  const float cb = codebook[lane & (L - 1)];
  // Byte `sub` of two words into bytes 0, 1.
  const uint32_t sel = (uint32_t)sub | ((uint32_t)(sub + 4) << 4);

  for (uint32_t step = warp0; step < n_steps; step += n_warps) {
    const uint32_t blk = step * BLOCKS_PER_STEP + (lane >> 2);
    const uint32_t blk_c = blk < n_blocks ? blk : n_blocks - 1;  // dead lanes: any valid block
    uint32_t w[BITS];
    const uint32_t* pw = packed + (size_t)blk_c * BITS;
    bool done = false;
    if constexpr (BITS == 4) {
      if (planes_vec) {
        const uint4 u = ld_nc_v4(pw);
        w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
        done = true;
      }
    }
    if constexpr (BITS == 2) {
      if (planes_vec) {
        const uint2 u = ld_nc_v2(pw);
        w[0] = u.x; w[1] = u.y;
        done = true;
      }
    }
    if (!done) {
#pragma unroll
      for (int b = 0; b < BITS; ++b) w[b] = __ldg(pw + b);
    }
    const float amax = scale_of<A>(absmax, blk_c);

    uint32_t X = __byte_perm(w[0], w[1], sel);
    if (BITS == 3) X = __byte_perm(X, w[2], 0x0010u | ((uint32_t)(sub + 4) << 8));
    if (BITS >= 4) X = __byte_perm(X, __byte_perm(w[2], w[3], sel), 0x5410u);
    const uint32_t Y = planes_nibbles_swap(X);  // nibble nib(j): bits 0..3 of element j
    uint32_t src[8];
    if (BITS <= 4) {
#pragma unroll
      for (int j = 0; j < 8; ++j) src[j] = Y >> (4 * nib(j));
    } else {
      // Bit 4 of element j (bit j of the 5th plane's byte) joins its low 4 bits in a byte:
      // ylo byte k = element k, yhi byte k = element k+4. The multiplier moves bit k of a clean
      // nibble to bit 8k+4 with no carries; bits 5..7 of each byte are left as don't-care.
      const uint32_t x4 = w[BITS - 1] >> (8 * sub);
      const uint32_t tlo = (x4 & 0xFu) * 0x02040810u;
      const uint32_t thi = ((x4 >> 4) & 0xFu) * 0x02040810u;
      const uint32_t ylo = (Y & 0x0F0F0F0Fu) | (tlo & 0xF0F0F0F0u);
      const uint32_t yhi = ((Y >> 4) & 0x0F0F0F0Fu) | (thi & 0xF0F0F0F0u);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        src[k] = ylo >> (8 * k);
        src[k + 4] = yhi >> (8 * k);
      }
    }
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(__shfl_sync(0xffffffffu, cb, (int)src[j]), amax);

    const long long e0 = (long long)blk * 32 + sub * 8;
    if (out_vec && e0 + 8 <= n) {
      Store8<T>::vec(out + e0, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (e0 + j < n) out[e0 + j] = from_float<T>(v[j]);
    }
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
