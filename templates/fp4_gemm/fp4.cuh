// FP4 (E2M1) weights for fp16 / bf16 tensor-core GEMMs: decode, scales, loads, split-K finish.
//
// Weight layout both kernels read (kernelgen/fp4_gemm/layout.py; prepare_weight makes it; the
// blocks may be stored tile- or step-major, scales apart or after each block: the kernels take
// a block's byte strides along tiles and steps as arguments):
//   W  packed E2M1 tiled per 16 rows and 128 k: [T, Q, 2 (h), 8 (g), 4 (t), 4 (j), 4 B], row =
//      16*tile + 8h + g (T = ceil(N/16), rows past N zero, Q = K/128): the 1 KB a warp loads per
//      step is contiguous. Chunk t (16 B) of a row's step holds four 4-byte words; word j holds
//      the 8 elements 32j + 8t .. 32j + 8t + 7 ("k-interleaved"), its bits encoded for e2m1_word
//      below (layout.py ENCODE).
//   S  scale bytes of the same blocks: [T, Q, 8 (g), P, 2 (h), 4 (j)], P = SB / 4 (SB = 128 /
//      group): lane (g, t) reads the 8-byte word at (P*g + p) * 8, p = t / 2 (NVFP4) or 0
//      (MXFP4): byte j of its low / high half is the scale of word j of row g / g+8:
//        NVFP4: E4M3 bytes as quantized (groups of 16: word j of lane t is in group 2j + t/2);
//        MXFP4: E8M0 bytes *relative to the row* (word j is in group j): s' = max(s - rowmax +
//               127, 0) (<= 127), so 2^(s'-127) <= 1 fits fp16 / bf16; the row's
//               2^(rowmax-127) is applied in fp32 to the accumulator (post[n]). 0xFF marks a
//               NaN group: the kernels decode it to some finite or infinite value and rely on
//               its row's post[n] being NaN (prepare_weight sets it). s' = 0 (a flushed group:
//               one more than 2^127 below the row's largest, e.g. an all-zero group of scale
//               0x00 beside a group of amax >= 8; unclamped it would wrap to 0xFF / 2^127)
//               decodes as 0 (RowScale), or as 2^-127 of the row's largest group where the
//               gemv scales after the mma (mx_word_factor).
//   post  NVFP4: [1] fp32 global scale, a copy (D *= alpha / gs); MXFP4: [N] fp32 row factors
//         (D *= alpha * post[n]; NaN where the row has a NaN group); KBIT4: the codebook [16].
//
// Lane work unit ("quad step", 128 k of 16 W rows): lane (g, t) = (lane / 4, lane % 4) loads the
// 16-byte chunk t of rows g and g+8. mma k-step s (0..7) takes elements 4(s%2)..4(s%2)+3 of
// word s/2. The mma's k-slots {2t,2t+1} and {2t+8,2t+9} then stand for the actual k {32j + 8t +
// 4(s%2), +1} and {+2, +3}: the activation fragments of lane t for word j are the 16 bytes
// A[token][k0 + 32j + 8t .. +7], and the four lanes of a token row read 64 contiguous bytes (2
// sectors of one line) an instruction. A group never straddles a word, so each lane scales its
// own W pairs by the group scale of the word in fp16 / bf16 before the mma (one multiply a
// pair, exact: see RowScale), or, where the bandwidth path allows it (gemv.cuh POST: MXFP4 at
// fp16 and KBIT4, m_tile 8), the word's fp32 mma sums after it (mx_word_factor, KbitPost).
#pragma once
#include "common/dtypes.cuh"
#include "common/e4m4.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"
#include "common/splitk.cuh"

namespace kg::fp4 {

constexpr int FMT_NVFP4 = 0;
constexpr int FMT_MXFP4 = 1;
// 4-bit kbit weights (kernelgen/kbit_gemm/tiled.py): codes into a 16-entry codebook, an E4M4
// scale a block of 32 (= a word's group, as MXFP4's), decoded through a shared-memory table
// (below); post is then the codebook (fp32 [16])
constexpr int FMT_KBIT4 = 2;
constexpr int STEP_K = 128;  // k per quad step (4 lanes x 32 elements)
constexpr uint32_t FULL = 0xffffffffu;

// scale bytes per row per quad step: 128 / G
template <int FMT> struct Fmt { static constexpr int SB = FMT == FMT_NVFP4 ? 8 : 4; };

// -- E2M1 words -> T pairs ----------------------------------------------------------------------
// A stored word q (8 elements of one row, bit-encoded by kernelgen/fp4_gemm/layout.py for the
// activation type ENC) -> o[p] = the pair (element 2p, 2p+1), low half first, as raw T bits:
// fp16 sign at bit 15 and e1 e0 m at bits 11..9 is exactly e2m1 * 2^-14 (code 1 = 0.5 lands on
// the subnormal 2^-15); bf16 takes the magnitude three bits lower (bits 8..6): e2m1 * 2^-126.
// A word encoded for T decodes in 8 instructions either way (ENC_F16: 1 SHF + 4 LOP3 + 3 shifts
// the compiler issues as IMAD.SHL; ENC_BF16: 2 SHF + 4 LOP3 + 2 IMAD.SHL); a word encoded for
// the other type adds a shift and a LOP3 a pair (moving the magnitude, the sign stays at 15).
constexpr int ENC_F16 = 0;   // layout.py ENCODINGS["float16"]
constexpr int ENC_BF16 = 1;  // layout.py ENCODINGS["bfloat16"]
constexpr uint32_t E2M1_MASK = 0x8E008E00u;       // fp16 pair: sign 15, magnitude 11..9
constexpr uint32_t E2M1_MASK_BF16 = 0x81C081C0u;  // bf16 pair: sign 15, magnitude 8..6
template <typename T> struct RawUnit;  // raw pair value = e2m1 * 2^-EXP
template <> struct RawUnit<half> { static constexpr int EXP = 14; };
template <> struct RawUnit<__nv_bfloat16> { static constexpr int EXP = 126; };

template <typename T, int ENC>
__device__ __forceinline__ void e2m1_word(uint32_t q, uint32_t (&o)[4]) {
  if constexpr (ENC == ENC_F16) {
    const uint32_t s4 = q << 4;
    o[0] = q & E2M1_MASK;
    o[1] = __funnelshift_l(q, q, 13) & E2M1_MASK;
    o[2] = (s4 ^ (q << 7)) & E2M1_MASK;
    o[3] = (s4 ^ (q << 9)) & E2M1_MASK;
    if constexpr (RawUnit<T>::EXP == 126) {
#pragma unroll
      for (int p = 0; p < 4; ++p) o[p] = bitsel(0x90009000u, o[p], o[p] >> 3);  // sign stays at 15
    }
  } else {
    const uint32_t r8 = __funnelshift_l(q, q, 8);
    o[0] = q & E2M1_MASK_BF16;
    o[1] = __funnelshift_l(q, q, 12) & E2M1_MASK_BF16;
    o[2] = (r8 ^ (q << 2)) & E2M1_MASK_BF16;
    o[3] = (r8 ^ (q << 6)) & E2M1_MASK_BF16;
    if constexpr (RawUnit<T>::EXP == 14) {  // magnitude up 3 bits; the low sign's copy (bit 18)
#pragma unroll                              // is cleared by taking bit 18 from o (zero there)
      for (int p = 0; p < 4; ++p) o[p] = bitsel(0x80048000u, o[p], o[p] << 3);
    }
  }
}

// -- 4-bit codebook words (FMT_KBIT4) -------------------------------------------------------------
// A stored word holds the codes of 8 consecutive k, code i in bits 4i..4i+3 (as fp4 words before
// their encoding), so byte p is the pair code c_p = code(2p) | code(2p+1) << 4. The table holds
// entry c = the T pair (cb[c & 15], cb[c >> 4]) times ScaleBits<T>::TABLE 32 times, at c * 128
// + 4 * copy: lane l reads copy l, so 32 random codes never collide in a bank (32 KB). A pair
// costs a PRMT (the byte), a LEA (c * 128 + the lane's copy address) and the LDS. The wide table
// (the bandwidth path, where the SMs hold it) puts entry c at c * 256 (64 KB, the upper 128
// bytes of each entry unused): one PRMT then forms the whole offset c * 256 + 4 * lane from the
// word and a register holding 4 * lane, and the LDS adds the table's base as its immediate, 2
// instructions a pair (0-2% faster on H100: the LDS latency, not the count, bounds it). The E4M4
// scale pair (scale2) then multiplies the entry exactly (the kbit GEMV's rule: one rounding to
// T of w * scale), except where the bandwidth path scales after the mma (KbitPost below).
constexpr int KBIT4_LUT_BYTES = 256 * 128;
constexpr int KBIT4_WIDE_LUT_BYTES = 256 * 256;

// KBIT4 scaled after the mma (the bandwidth path at m_tile 8, gemv.cuh POST): the table holds
// cb x KbitPost<T>::TABLE and a word's two mma sums are multiplied in fp32 by the rows' E4M4
// factors (kbit4_word_factors), so the sums come out in units of 1 / KbitPost<T>::UNIT
// (row_factor multiplies by UNIT): fp16 holds cb x 2^4 (< 2^16) and takes
// E4M4 / 16, both exact (unit 1); bf16 holds cb x 2^64 and takes E4M4 x 2^-116 straight from
// the byte's bits (b << 19 is that value as an fp32, E4M4 subnormals as fp32 subnormals, which
// FFMA takes as they are: no flush-to-zero in our options), unit 2^-52: a product w a below
// 2^-74 lands on fp32 subnormals, a sum overflows past |a| ~ 2^60. No rounding of w x scale to
// T, as the pre-mma scaling does; per word 4 FFMA and the factors instead of 8 HMUL2.
template <typename T> struct KbitPost;
template <> struct KbitPost<half> {  // the pre-mma table: factor E4M4 / 16 (ScaleBits' scale2)
  static constexpr float TABLE = ScaleBits<half>::TABLE, UNIT = 1.0f;
};
template <> struct KbitPost<__nv_bfloat16> { static constexpr float TABLE = 0x1p64f, UNIT = 0x1p52f; };

template <typename T> __device__ __forceinline__ float kbit4_post_value(float cb) {
  return to_float(from_float<T>(cb)) * KbitPost<T>::TABLE;
}

// E4M4 byte j of rows g (x) and g+8 (y) -> the fp32 factors of word j's mma sums (above)
template <typename T>
__device__ __forceinline__ void kbit4_word_factors(uint32_t x, uint32_t y, int j, float& fx, float& fy) {
  if constexpr (RawUnit<T>::EXP == 14) {  // fp16: the (E4M4 / 16) pair, widened
    const uint32_t sel = (uint32_t)j * 0x11u + (uint32_t)(4 + j) * 0x1100u;  // [x_j, x_j, y_j, y_j]
    const uint32_t h2 = (__byte_perm(x, y, sel) << ScaleBits<half>::SHIFT) & 0x3FC03FC0u;
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    fx = f.x;
    fy = f.y;
  } else {  // bf16: b << 19 = E4M4 x 2^-116 as an fp32
    fx = __uint_as_float(((x >> (8 * j)) & 0xFFu) << 19);
    fy = __uint_as_float(((y >> (8 * j)) & 0xFFu) << 19);
  }
}

// The table's fill, in two halves: load() reads the codebook values this thread's stores need
// (call it before the CTA's first weight loads: issued after them, the codebook reads waited
// behind them and every CTA started its loop ~0.7 us later, H100), fill() writes the table.
// Thread t stores uint4 i = t + THREADS j (4 copies of entry c = i / 8): with THREADS a multiple
// of 128, c & 15 = (t / 8) & 15 for every j and c >> 4 = t / 128 + (THREADS / 128) j.
// NCB: the codebook's entries (16; fewer for the codes of flat 2 / 3-bit planes, whose table
// entries past them are never read: their reads are clamped to the last entry).
template <typename T, int THREADS, bool POST = false, bool WIDE = false, int NCB = 16>
struct Kbit4Fill {
  static_assert(THREADS % 128 == 0, "the fill needs a multiple of 128 threads");
  static constexpr int STRIDE = WIDE ? 256 : 128;  // bytes an entry (its 32 copies: the first 128)
  static constexpr int PER = KBIT4_LUT_BYTES / 16 / THREADS;  // uint4 stores a thread
  float lo, hi[PER];
  __device__ __forceinline__ void load(const float* __restrict__ cb) {
    const int t = threadIdx.x;
    const auto entry = [](int c) { return NCB < 16 ? min(c, NCB - 1) : c; };
    lo = __ldg(cb + entry((t >> 3) & 15));
#pragma unroll
    for (int j = 0; j < PER; ++j) hi[j] = __ldg(cb + entry((t >> 7) + (THREADS / 128) * j));
  }
  __device__ __forceinline__ void fill(uint32_t* lut) const {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const uint32_t p = POST ? pack2<T>(kbit4_post_value<T>(lo), kbit4_post_value<T>(hi[j]))
                              : pack2<T>(table_value<T>(lo), table_value<T>(hi[j]));
      const int i = threadIdx.x + THREADS * j;  // uint4 i of the copies: entry i / 8
      if constexpr (WIDE)
        *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(lut) + (i >> 3) * STRIDE + (i & 7) * 16) =
            make_uint4(p, p, p, p);
      else
        reinterpret_cast<uint4*>(lut)[i] = make_uint4(p, p, p, p);
    }
  }
};

// One stored word -> o[p] = (cb[code 2p], cb[code 2p+1]) x TABLE as a T pair, low half first;
// lane_lut: the shared-memory address of this lane's copy of entry 0 (table + 4 * lane)
__device__ __forceinline__ void kbit4_word(uint32_t q, uint32_t lane_lut, uint32_t (&o)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p)
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(o[p]) : "r"(lane_lut + (__byte_perm(q, 0u, 0x4440u + p) << 7)));
}
// The wide table: lane_sel = 4 * lane (byte 0), lut = the table's shared address (a constant of
// the kernel's shared layout, folded into the LDS as its immediate)
__device__ __forceinline__ void kbit4_word_wide(uint32_t q, uint32_t lane_sel, uint32_t lut, uint32_t (&o)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p)  // [4 lane, c_p, 0, 0]
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(o[p]) : "r"(lut + __byte_perm(q, lane_sel, 0x5504u + 16u * p)));
}

// A word's four T pairs for format FMT (weights encoded for ENC); KBIT4 reads its table (WIDE:
// the 64 KB one)
template <typename T, int FMT, int ENC, bool WIDE = false>
struct WordDecoder {
  uint32_t lane_lut = 0;  // FMT_KBIT4: shared address of this lane's copy (kbit4_word); WIDE: 4 lane
  uint32_t lut = 0;       // WIDE: the table's shared address
  __device__ __forceinline__ void operator()(uint32_t q, uint32_t (&o)[4]) const {
    if constexpr (FMT == FMT_KBIT4 && WIDE) kbit4_word_wide(q, lane_lut, lut, o);
    else if constexpr (FMT == FMT_KBIT4) kbit4_word(q, lane_lut, o);
    else e2m1_word<T, ENC>(q, o);
  }
};

// -- scales -----------------------------------------------------------------------------------
// RowScale: the group scales of one lane's four words of one row as T pairs (s, s): s[j] for
// word j. A scaled pair raw * s is exact in T and its value is w * scale * 2^-UNIT_EXP;
// row_factor multiplies the fp32 sum by 2^UNIT_EXP.
//   fp16 NVFP4: s = e4m3 (exact in fp16)                 -> w e4m3 2^-14  (multiples of 2^-24)
//   bf16 NVFP4: s = e4m3 * 2^119                        -> w e4m3 2^-7
//   fp16 MXFP4: s = 2^(s'-127+15) (0 below 2^-24)       -> w 2^(s'-127+1): exact for groups down
//               to 2^-24 below the row's largest, rounded below that (they add < 2^-24 relative)
//   bf16 MXFP4: s = 2^(s'-127+126)                      -> w 2^(s'-127)
//   KBIT4:      s = E4M4 / TABLE (scale2)               -> w scale      (table entries cb x TABLE)
// s' = 0 (a flushed MXFP4 group) gives s = 0; NaN e4m3 bytes (0x7F / 0xFF) give NaN; an E8M0 0xFF
// group's value is not used (prepare_weight makes its row's factor NaN).
template <typename T, int FMT>
struct RowScale {
  uint32_t s[4];
};
template <typename T, int FMT>
constexpr int UNIT_EXP = FMT == FMT_KBIT4 ? 0 : FMT == FMT_NVFP4 ? (RawUnit<T>::EXP == 14 ? 14 : 7)
                                                                     : (RawUnit<T>::EXP == 14 ? -1 : 0);

// Two e4m3 bytes (low 16 bits of raw) -> half2 of their exact values (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t raw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(r) : "r"(raw));
  return r;
#else
  return e4m3x2_to_f16x2_soft((uint16_t)raw);  // common/dtypes.cuh
#endif
}

// The 4 scale bytes of one row (byte j: word j's group) -> its RowScale.
template <typename T, int FMT>
__device__ __forceinline__ RowScale<T, FMT> row_scales(uint32_t raw) {
  RowScale<T, FMT> r;
  if constexpr (FMT == FMT_KBIT4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) r.s[j] = scale2<T>(raw, j);
  } else if constexpr (FMT == FMT_NVFP4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t h2 = e4m3x2_to_half2(raw >> (16 * h));  // (lo, hi) = words (2h, 2h+1)
      if constexpr (RawUnit<T>::EXP == 14) {
        r.s[2 * h] = __byte_perm(h2, 0u, 0x1010u);      // (lo, lo)
        r.s[2 * h + 1] = __byte_perm(h2, 0u, 0x3232u);  // (hi, hi)
      } else {  // exact through fp32: e4m3 * 2^119 < 2^128
        const __half2 hh = *reinterpret_cast<const __half2*>(&h2);
        r.s[2 * h] = splat2<T>(__low2float(hh) * 0x1p119f);
        r.s[2 * h + 1] = splat2<T>(__high2float(hh) * 0x1p119f);
      }
    }
  } else {  // b = s' <= 127 (0xFF: its row's post[n] is NaN, so any value here will do)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t b = __byte_perm(raw, 0u, 0x4440u + j);
      // fp16: 2^(b-112) as an fp32 (b = 0: 2^-112, which rounds to 0 in fp16); bf16: 2^(b-127)
      // (b = 0: 0) * 2^126. One rounding to T either way, as RowScale says.
      const float f = RawUnit<T>::EXP == 14 ? __uint_as_float(b * (1u << 23) + (15u << 23))
                                            : __uint_as_float(b << 23) * 0x1p126f;
      r.s[j] = splat2<T>(f);
    }
  }
  return r;
}

// Word j of rows g (wa) and g+8 (wb) -> the unscaled (raw) A fragments of k-steps 2j (f[0..3])
// and 2j+1 (f[4..7]): f = {a0, a1, a2, a3} as mma.cuh orders them.
template <typename T, int FMT, int ENC, bool WIDE>
__device__ __forceinline__ void raw_frags_of_word(const WordDecoder<T, FMT, ENC, WIDE>& dec, uint32_t wa,
                                                  uint32_t wb, uint32_t (&f)[8]) {
  uint32_t ra[4], rb[4];
  dec(wa, ra);
  dec(wb, rb);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    f[2 * p] = ra[p];
    f[2 * p + 1] = rb[p];
  }
}

// The same fragments scaled by the rows' group scales of word j (a: row g, b: row g+8).
template <typename T, int FMT, int ENC, bool WIDE>
__device__ __forceinline__ void frags_of_word(const WordDecoder<T, FMT, ENC, WIDE>& dec, uint32_t wa,
                                              uint32_t wb, const RowScale<T, FMT>& a,
                                              const RowScale<T, FMT>& b, int j, uint32_t (&f)[8]) {
  raw_frags_of_word(dec, wa, wb, f);
#pragma unroll
  for (int p = 0; p < 8; ++p) f[p] = hmul2<T>(f[p], p & 1 ? b.s[j] : a.s[j]);
}

// MXFP4 scaled after the mma (the bandwidth path): every k of word j, in all four lanes of a
// row, is in group j, so the m16n8k16 products of a word's two k-steps from raw fragments times
// the row's fp32 factor 2^(s' - 127 + 1 + 14) (fp16) / 2^(s' - 127 + 126) (bf16) are the sums
// of the scaled fragments, in the same unit (UNIT_EXP): the factor is RowScale's scale before its
// rounding to T. Byte j of raw (s' <= 127) -> that factor; s' = 0 gives 2^-112 / 2^-1, i.e. 2^-127
// of the row's largest group (RowScale rounds it to 0: a difference below 2^-126 of the row's
// scale). 0xFF: a garbage factor, its row's post[n] is NaN.
template <typename T>
__device__ __forceinline__ float mx_word_factor(uint32_t raw, int j) {
  const uint32_t b = __byte_perm(raw, 0u, 0x4440u + j);
  return __uint_as_float(b * (1u << 23) + ((RawUnit<T>::EXP == 14 ? 15u : 126u) << 23));
}

// A lane's 8-byte scale word of a block: (P*g + p) * 8, P = SB / 4, p = t / 2 (NVFP4) or 0
template <int FMT>
__device__ __forceinline__ int scale_offset(int g, int t) {  // KBIT4: as MXFP4
  return FMT == FMT_NVFP4 ? 16 * g + 8 * (t >> 1) : 8 * g;
}

__device__ __forceinline__ uint32_t word_of(const uint4& u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

// -- loads --------------------------------------------------------------------------------------
// Streaming 16-byte weight load: read once, so no L1 line; ask L2 for the whole 256-byte
// segment (the tiled layout makes the next bytes the ones the neighbouring lanes want).
template <bool HINT> __device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  if constexpr (!HINT) return ld_nc_v4(p);
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// A tile in shared memory: token rows of 256-byte segments (128 k); 16-byte chunk c of a
// segment is stored at swz(c, row): the 8 lanes of each quarter warp (2 tokens x 4 t) reading
// chunk t + 4j hit 8 different 16-byte bank groups (bits 0-1: t ^ j; bit 2: j ^ row).
__device__ __forceinline__ uint32_t swz(uint32_t c, uint32_t row) {
  return c ^ ((c >> 2) & 3u) ^ ((row & 1u) << 2);
}

// 16-byte cp.async that allocates in L1 (.ca; common/ptx.cuh's cp_async16 is .cg, L2 only):
// for data every warp of an SM re-reads (the GEMV's activations). src_bytes 0 reads nothing
// and lands 16 zeros.
__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// -- epilogue -----------------------------------------------------------------------------------
// Row factor of the output: alpha / gs (NVFP4) or alpha * 2^(rowmax - 127) (MXFP4), times
// 2^UNIT_EXP (the unit the scaled fragments are in, see RowScale).
template <typename T, int FMT, bool POST = false>
__device__ __forceinline__ float row_factor(const float* __restrict__ post, float alpha, int n) {
  constexpr float unit = UNIT_EXP<T, FMT> == 14 ? 0x1p14f : UNIT_EXP<T, FMT> == 7 ? 0x1p7f
                         : UNIT_EXP<T, FMT> == -1 ? 0.5f : 1.0f;
  if constexpr (FMT == FMT_KBIT4) return POST ? alpha * KbitPost<T>::UNIT : alpha;  // post: the codebook
  else if constexpr (FMT == FMT_NVFP4) return alpha * unit / __ldg(post);
  else return alpha * unit * __ldg(post + n);
}

// D = RN(RN(sum * factor) + bias): two roundings, never contracted (the GEMV and tile paths
// agree; the dequant path's cuBLAS epilogue rounds its own way)
template <typename T>
__device__ __forceinline__ T out_value(float v, float fac, int has_bias, float b) {
  float r = __fmul_rn(v, fac);
  if (has_bias) r = __fadd_rn(r, b);
  return from_float<T>(r);
}

template <typename T, int FMT, bool POST = false>
__device__ __forceinline__ void store_out(T* __restrict__ C, const T* __restrict__ bias,
                                          int has_bias, const float* __restrict__ post,
                                          float alpha, int m, int n, int N, float v) {
  C[(size_t)m * N + n] = out_value<T>(v, row_factor<T, FMT, POST>(post, alpha, n), has_bias,
                                      has_bias ? to_float(bias[n]) : 0.0f);
}

// Split-K finish of one CTA tile (rows [n_lo, n_lo + n_cnt) x tokens [m_lo, m_lo + m_cnt)):
// every thread has stored its fp32 partials to ws[split]; the CTA that brings the tile's counter
// to `splits` adds the partials in split order (common/splitk.cuh), applies the row factor and
// bias, writes C and resets the counter for the next launch (stream order).
template <typename T, int FMT, bool POST = false>
__device__ __forceinline__ void split_finish(const float* __restrict__ ws, unsigned* counter,
                                             int splits, T* __restrict__ C,
                                             const T* __restrict__ bias, int has_bias,
                                             const float* __restrict__ post, float alpha, int m_lo,
                                             int m_cnt, int n_lo, int n_cnt, int M, int N) {
  __shared__ unsigned last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // tokens past M are not walked (M = 1 on a 32-token tile: 1 row of 32)
  sum_splits(ws, (size_t)M * N, splits, threadIdx.x, min(m_cnt, M - m_lo) * n_cnt, blockDim.x,
             [&](int p) -> long long {
               const int m = m_lo + p / n_cnt, n = n_lo + p % n_cnt;
               return n < N ? (long long)m * N + n : -1;
             },
             [&](int p, float v) {
               store_out<T, FMT, POST>(C, bias, has_bias, post, alpha, m_lo + p / n_cnt, n_lo + p % n_cnt, N, v);
             });
  if (threadIdx.x == 0) *counter = 0u;
}

}  // namespace kg::fp4
