// kbit GEMM, bandwidth path (decode, small M):  C[M, N] = A[M, K] . W[N, K]^T (+ bias[N])
//
//   A     [M, K]  T = half | bf16, row-major, 16-byte aligned rows (K % 128 == 0)
//   W     flat kbit layout of [N, K]: row n = K/32 consecutive blocks of 32 elements;
//         packed[(n*K/32 + kb)*BITS + b] = bit plane b of block kb (lane j -> bit j),
//         absmax[n*K/32 + kb] = E4M4 scale byte, codebook[2^BITS] fp32
//   C     [M, N]  T, written with round-to-nearest; fp32 accumulation throughout
//   ws    [m_tiles, ctas, 2, WARPS*NT*128] fp32 partial row blocks, counters [m_tiles, RB] u32
//
// Memory side. A CTA of WARPS warps owns a *row block* of R = 16*WARPS rows of W; a *unit* is one
// row block x 256 k (one pipeline stage: R rows x 32*BITS bytes of planes, R x 8 scale bytes, and
// the A slice of the tokens, rows x 512 bytes). Every thread copies its share of a unit with
// 16-byte cp.async (4 bytes for the scales) into a ring of STAGES stage buffers in shared memory,
// STAGES-1 units ahead of the decode: a warp's copy instruction reads 512 contiguous bytes, no
// register waits on DRAM, and each SM keeps (STAGES-1) units (24..60 KB of weights) of reads in
// flight (Little's law at ~3 TB/s and ~700 ns: ~16-24 KB an SM). One CTA per SM.
//
// Work split (stream-K). The units of all row blocks, row block major, are cut into gridDim.x
// equal contiguous ranges, one per CTA (a persistent grid: every SM busy for any N). A row
// block whose units one CTA covers entirely is stored straight away; the others (at most the
// first and the last of a CTA's range) store an fp32 partial to ws, and the CTA that brings the
// row block's counter to its number of contributors adds the partials in CTA order
// (deterministic), adds the bias, writes C and resets the counter for the next launch.
//
// Decode (per warp: 16 rows x 256 k of the stage). Lane (g, t) decodes blocks 2t, 2t+1 of rows
// g and g+8 of the warp's 16 rows: one m16n8k16 "M" tile of W, the tokens on the mma's N=8 side.
// k order: the sum over k does not care in which order k is visited, so lane (g, t) feeds
// k-slots {2t, 2t+1, 2t+8, 2t+9} of mma step S (0..7) of its block j from elements 4S..4S+3 of
// that block; A is copied into the stage in that order (one 16-byte load gives a lane the B
// fragments of two mma steps).
// Tables (64 KB, replicated per lane so that random codes never collide in a bank; a 256-byte
// entry stride lets one PRMT of (code byte, lane*4) form the address):
//   BITS 3, 4: pair table: code = the 2*BITS bits {plane b of elements e, e+1}, entry =
//              (cb[i_e], cb[i_e+1]) as a T pair; 3 bits ignore code bits 6, 7.
//   BITS 2:    quad table: code = plane 0, 1 bits of 4 elements, entry = 4 values.
//   BITS 5:    pair table of 10-bit codes, 64-byte stride (16 copies): PRMT + shift address.
// Block scales. The 4 lanes of a quad feed 4 different blocks into one mma, so the scale cannot
// simply multiply the mma's fp32 sum. Two modes (M_TILE):
//   row mode (m_tile 8, 16; tokens on NT = m_tile/8 n8 tiles): each W pair is scaled (HMUL2)
//     before the mma. The table holds cb * F (F = 16 for fp16, 2^116 for bf16) and the scale is
//     the E4M4 byte shifted into a T (raw << 6 for fp16, raw << 3 for bf16; subnormal E4M4 lands
//     on subnormal T), so (cb*F) * (E4M4/F) is the exact cb * scale rounded once.
//   column mode (m_tile 2: M <= 2): W goes in unscaled and the mma's 8 columns are (token, quad
//     lane): B column 4*token + c holds the token's A only on the k-slots of quad lane c (the
//     other B lanes read a zero buffer), so output column 4*token + c of row g is the sum over
//     lane c's block alone. After each block's 8 steps the lane scales those sums in fp32 (the
//     E4M4 byte << 19 as fp32 bits = E4M4 * 2^-116; table cb * FC; OUT = 2^116 / FC at the
//     end) and the two lanes holding a token's columns add up in the epilogue. No per-weight
//     multiply, and the scaled product is fp32 (one rounding less than row mode).
#pragma once
#include "common/dtypes.cuh"
#include "common/mma.cuh"
#include "common/ptx.cuh"

namespace kg::kbit_gemm {

constexpr int TILE_ROWS = 16;    // W rows per warp (mma M)
constexpr int STAGE_K = 256;     // k per unit: 4 lanes x 2 blocks of 32
constexpr int GROUP_K = 128;     // K granularity (K % 128 == 0); a half stage at the K end
constexpr int LUT_BYTES = 65536;
constexpr int A_TOKEN_BYTES = 576;  // 512 + 64: tokens g, g+1 land in other banks
constexpr uint32_t FULL = 0xffffffffu;

// -- PTX helpers of this kernel ------------------------------------------------------------------
// cp.async with a source size: 0 copies nothing and zero-fills (k past K).
__device__ __forceinline__ void cpa16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cpa4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpa_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ uint4 ld_sh128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}
__device__ __forceinline__ uint32_t ld_sh_u16(uint32_t addr) {
  uint16_t r;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(addr));
  return r;
}
__device__ __forceinline__ void st_sh128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                         uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" :: "r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d) : "memory");
}
// (a & m) | (b & ~m) as one LOP3.
__device__ __forceinline__ uint32_t bitsel(uint32_t m, uint32_t a, uint32_t b) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(r) : "r"(m), "r"(a), "r"(b));
  return r;
}

// -- decode table ------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Table scale F: the scale operand is E4M4 / F (see the header). Column mode (COL) scales in
// fp32 after the mma: scale operand = the E4M4 byte << 19 as fp32 bits = E4M4 * 2^-116, the
// table holds cb * FC and the sums are multiplied by 2^116 / FC = OUT at the end (fp16: FC =
// 2^15 keeps every intermediate a normal fp32; bf16: FC = 2^116, OUT = 1).
template <typename T> struct ScaleFmt;
template <> struct ScaleFmt<half> {
  static constexpr float F = 16.0f;
  static constexpr int SHIFT = 6;  // E4M4 byte -> fp16 bits: exponent bits 10..13, mantissa 6..9
  static constexpr float FC = 32768.0f;
  static constexpr float OUT = 2535301200456458802993406410752.0f;  // 2^101
};
template <> struct ScaleFmt<__nv_bfloat16> {
  static constexpr float F = 83076749736557242056487941267521536.0f;  // 2^116
  static constexpr int SHIFT = 3;  // E4M4 byte -> bf16 bits: exponent bits 7..10, mantissa 3..6
  static constexpr float FC = 83076749736557242056487941267521536.0f;  // 2^116
  static constexpr float OUT = 1.0f;
};

// Codebook index of element i of a table entry (c: the code byte(s) the kernel builds).
template <int BITS> __device__ __forceinline__ int code_index(int c, int i) {
  int idx = 0;
  if constexpr (BITS == 2) {
    idx = ((c >> i) & 1) | (((c >> (4 + i)) & 1) << 1);  // quad: plane 0 bits 0..3, plane 1 4..7
  } else {
#pragma unroll
    for (int b = 0; b < (BITS == 5 ? 4 : BITS); ++b) idx |= ((c >> (2 * b + i)) & 1) << b;
    if constexpr (BITS == 5) idx |= ((c >> (8 + i)) & 1) << 4;
  }
  return idx;
}

// 4096 16-byte stores, consecutive threads on consecutive 16 bytes; the codebook (times F) sits
// in registers (lane l holds cb[l mod 2^BITS]) and the trip count is uniform, so every lane
// takes part in every shuffle.
template <typename T, int BITS, int THREADS, bool COL>
__device__ __forceinline__ void fill_lut(uint32_t lut_base, const float* __restrict__ codebook) {
  static_assert(4096 % THREADS == 0, "the fill takes 4096 / THREADS stores a thread");
  constexpr int STRIDE = BITS == 5 ? 64 : 256;  // bytes an entry
  constexpr int SPE = STRIDE / 16;              // stores an entry
  const int lane = threadIdx.x & 31;
  const float cb = __ldg(codebook + (lane & ((1 << BITS) - 1))) *
                   (COL ? ScaleFmt<T>::FC : ScaleFmt<T>::F);
#pragma unroll 4
  for (int s = threadIdx.x; s < 4096; s += THREADS) {
    const int e = s / SPE;
    const uint32_t v0 = pack2<T>(__shfl_sync(FULL, cb, code_index<BITS>(e, 0)),
                                 __shfl_sync(FULL, cb, code_index<BITS>(e, 1)));
    uint32_t v1 = v0;
    if constexpr (BITS == 2)
      v1 = pack2<T>(__shfl_sync(FULL, cb, code_index<BITS>(e, 2)),
                    __shfl_sync(FULL, cb, code_index<BITS>(e, 3)));
    st_sh128(lut_base + (uint32_t)s * 16u, v0, v1, v0, v1);
  }
}

// a * (half H of s, broadcast) for two T at once, rounded to nearest (fma with -0: exact
// products stay exact, and bf16x2 fma exists on sm_80 where bf16x2 mul does not).
template <typename T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<half> { static constexpr bool value = true; };
template <typename T, int H> __device__ __forceinline__ uint32_t hmul_bc(uint32_t a, uint32_t s) {
  constexpr bool F16 = IsHalf<T>::value;
  uint32_t r;
  if constexpr (F16 && H == 0)
    asm("{ .reg .b16 l, h; .reg .b32 s2; mov.b32 {l, h}, %2; mov.b32 s2, {l, l};"
        " fma.rn.f16x2 %0, %1, s2, %3; }" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  else if constexpr (F16)
    asm("{ .reg .b16 l, h; .reg .b32 s2; mov.b32 {l, h}, %2; mov.b32 s2, {h, h};"
        " fma.rn.f16x2 %0, %1, s2, %3; }" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  else if constexpr (H == 0)
    asm("{ .reg .b16 l, h; .reg .b32 s2; mov.b32 {l, h}, %2; mov.b32 s2, {l, l};"
        " fma.rn.bf16x2 %0, %1, s2, %3; }" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  else
    asm("{ .reg .b16 l, h; .reg .b32 s2; mov.b32 {l, h}, %2; mov.b32 s2, {h, h};"
        " fma.rn.bf16x2 %0, %1, s2, %3; }" : "=r"(r) : "r"(a), "r"(s), "r"(0x80008000u));
  return r;
}

// -- codes of one block (BITS plane words of one row) ----------------------------------------------
// Pair tables (BITS 3, 4, 5): byte r of
//   c[0] = code of elements (8r, 8r+1)     c[1] = (8r+4, 8r+5)
//   c[2] = code of elements (8r+2, 8r+3)   c[3] = (8r+6, 8r+7)
// with bit 2b+i = plane b of element i (planes 0..3); for BITS = 5, c[4..7] hold the plane-4
// bits of the same pairs in bits 0..1 of each byte. mma step S uses the pair at 4S (c[S&1]) and
// at 4S+2 (c[2 + (S&1)]), byte S/2.
// Quad table (BITS 2): byte r of c[0] = elements 8r..8r+3, c[1] = 8r+4..8r+7 (bits 0..3 plane 0,
// bits 4..7 plane 1); mma step S uses byte S/2 of c[S&1].
template <int BITS> struct Codes {
  static constexpr int N = BITS == 2 ? 2 : BITS == 5 ? 8 : 4;
  uint32_t c[N];
};

template <int BITS>
__device__ __forceinline__ Codes<BITS> make_codes(const uint32_t* w) {
  constexpr uint32_t M2 = 0x33333333u, M4 = 0x0F0F0F0Fu;
  Codes<BITS> r;
  if constexpr (BITS == 2) {
    r.c[0] = bitsel(M4, w[0], w[1] << 4);
    r.c[1] = bitsel(M4, w[0] >> 4, w[1]);
  } else {
    // nibble q of l01 / h01: planes 0,1 of the pair at 4q / 4q+2
    const uint32_t l01 = bitsel(M2, w[0], w[1] << 2);
    const uint32_t h01 = bitsel(M2, w[0] >> 2, w[1]);
    if constexpr (BITS == 3) {
      // plane 2 goes to bits 4,5; bits 6,7 carry plane-2 bits of other elements (ignored)
      r.c[0] = bitsel(M4, l01, w[2] << 4);
      r.c[1] = bitsel(M4, l01 >> 4, w[2]);
      r.c[2] = bitsel(M4, h01, w[2] << 2);
      r.c[3] = bitsel(M4, h01 >> 4, w[2] >> 2);
    } else {
      const uint32_t l23 = bitsel(M2, w[2], w[3] << 2);
      const uint32_t h23 = bitsel(M2, w[2] >> 2, w[3]);
      r.c[0] = bitsel(M4, l01, l23 << 4);
      r.c[1] = bitsel(M4, l01 >> 4, l23);
      r.c[2] = bitsel(M4, h01, h23 << 4);
      r.c[3] = bitsel(M4, h01 >> 4, h23);
    }
    if constexpr (BITS == 5) {
      constexpr uint32_t B2 = 0x03030303u;
      r.c[4] = w[4] & B2;
      r.c[5] = (w[4] >> 4) & B2;
      r.c[6] = (w[4] >> 2) & B2;
      r.c[7] = (w[4] >> 6) & B2;
    }
  }
  return r;
}

// The two T pairs of one row for mma step S: x0 = elements (4S, 4S+1), x1 = (4S+2, 4S+3),
// unscaled. lane_word: BITS 2: lane*8, BITS 3/4: lane*4, BITS 5: (lane%16)*4.
template <int BITS, int S, bool COL>
__device__ __forceinline__ void lookup(const Codes<BITS>& c, uint32_t lut_base, uint32_t lane_word,
                                       uint32_t& x0, uint32_t& x1) {
  constexpr uint32_t R = S >> 1;
  if constexpr (BITS == 2) {
    const uint32_t a = lut_base + __byte_perm(c.c[S & 1], lane_word, 0x5504u | (R << 4));
    if constexpr (COL) {
      // two 4-byte loads: x0 and x1 feed non-adjacent mma registers straight from the table
      // (an LDS.64 pair costs two register moves); row mode's HMUL2 moves them anyway
      x0 = lds32(a);
      x1 = lds32(a + 4u);
    } else {
      const uint2 v = lds64(a);
      x0 = v.x;
      x1 = v.y;
    }
  } else if constexpr (BITS <= 4) {
    // byte 0 = lane*4 (b byte 0), byte 1 = code (a byte R), bytes 2,3 = 0 (b byte 1)
    x0 = lds32(lut_base + __byte_perm(c.c[S & 1], lane_word, 0x5504u | (R << 4)));
    x1 = lds32(lut_base + __byte_perm(c.c[2 + (S & 1)], lane_word, 0x5504u | (R << 4)));
  } else {
    // bits 0..7 = code of planes 0..3, bits 8..9 = plane 4 (bytes 2,3: sign of the plane-4
    // byte 0, which is 0 since its bytes are at most 3)
    constexpr uint32_t SEL = R | ((4u + R) << 4) | 0xCC00u;
    const uint32_t k0 = prmt<SEL>(c.c[S & 1], c.c[4 + (S & 1)]);
    const uint32_t k1 = prmt<SEL>(c.c[2 + (S & 1)], c.c[6 + (S & 1)]);
    x0 = lds32(lut_base + (k0 << 6) + lane_word);
    x1 = lds32(lut_base + (k1 << 6) + lane_word);
  }
}

// Step S (compile time: the code bytes are PRMT immediates) of block J: rows g, g+8 from the
// table, times the B fragments of NT n8 tiles (bq: the lane's 16-byte A chunk of steps
// 2(S/2), 2(S/2)+1). Row mode: each W pair scaled by its block's scale (half J of sa / sb)
// first, since the 4 lanes of a quad feed 4 different blocks into one mma. Column mode: W goes
// in unscaled; B column c holds A only on the k-slots of quad lane c (lanes with g % 4 != t
// read zeros), so output column c is the sum over block 2c+J alone and is scaled in fp32 later.
template <typename T, int BITS, int NT, int J, int S, bool COL>
__device__ __forceinline__ void mma_step(const Codes<BITS>& ca, const Codes<BITS>& cb,
                                         uint32_t lut_base, uint32_t lane_word, uint32_t sa,
                                         uint32_t sb, const uint4 (&bq)[NT], float (&acc)[NT][4]) {
  uint32_t x0, x1, y0, y1;
  lookup<BITS, S, COL>(ca, lut_base, lane_word, x0, x1);
  lookup<BITS, S, COL>(cb, lut_base, lane_word, y0, y1);
  // A operand (W): reg0 row g k(2t,2t+1) = elements 4S, 4S+1; reg1 row g+8; reg2/3 4S+2, 4S+3
  if constexpr (!COL) {
    x0 = hmul_bc<T, J>(x0, sa);
    x1 = hmul_bc<T, J>(x1, sa);
    y0 = hmul_bc<T, J>(y0, sb);
    y1 = hmul_bc<T, J>(y1, sb);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    Mma<T>::run(acc[nt], x0, y0, x1, y1, (S & 1) ? bq[nt].z : bq[nt].x,
                (S & 1) ? bq[nt].w : bq[nt].y);
}

// E4M4 byte B of w as fp32 bits (E4M4 * 2^-116; subnormal E4M4 lands on subnormal fp32).
template <int B> __device__ __forceinline__ float col_scale(uint32_t w) {
  return __uint_as_float(B == 3 ? (w >> 5) & 0x07F80000u : (w << (19 - 8 * B)) & 0x07F80000u);
}

// Block J of the lane's two (8 mma steps). Column mode: the 8 steps go into fresh sums d, and
// lane (g, t) adds d (columns 2t, 2t+1: blocks 4(t%2)+J and 4(t%2)+2+J of token t/2) times
// their scales (sa / sb: the 4 scale bytes of blocks 4(t%2)..+3 of rows g / g+8) to acc.
template <typename T, int BITS, int NT, int J, bool COL>
__device__ __forceinline__ void block_mmas(const Codes<BITS>& ca, const Codes<BITS>& cb,
                                           uint32_t lut_base, uint32_t lane_word, uint32_t sa,
                                           uint32_t sb, const uint32_t (&a_lane)[NT],
                                           float (&acc)[NT][4]) {
  float d[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int q = 0; q < 4; ++q) d[nt][q] = 0.0f;
  float (&tgt)[NT][4] = COL ? d : acc;
#pragma unroll
  for (int sp = 0; sp < 4; ++sp) {
    uint4 bq[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) bq[nt] = ld_sh128(a_lane[nt] + (uint32_t)(4 * J + sp) * 64u);
    if (sp == 0) {
      mma_step<T, BITS, NT, J, 0, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
      mma_step<T, BITS, NT, J, 1, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
    } else if (sp == 1) {
      mma_step<T, BITS, NT, J, 2, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
      mma_step<T, BITS, NT, J, 3, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
    } else if (sp == 2) {
      mma_step<T, BITS, NT, J, 4, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
      mma_step<T, BITS, NT, J, 5, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
    } else {
      mma_step<T, BITS, NT, J, 6, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
      mma_step<T, BITS, NT, J, 7, COL>(ca, cb, lut_base, lane_word, sa, sb, bq, tgt);
    }
  }
  if constexpr (COL) {
    acc[0][0] = fmaf(d[0][0], col_scale<J>(sa), acc[0][0]);
    acc[0][1] = fmaf(d[0][1], col_scale<2 + J>(sa), acc[0][1]);
    acc[0][2] = fmaf(d[0][2], col_scale<J>(sb), acc[0][2]);
    acc[0][3] = fmaf(d[0][3], col_scale<2 + J>(sb), acc[0][3]);
  }
}

// -- the kernel ---------------------------------------------------------------------------------
// grid (ctas, 1, m_tiles), WARPS warps a CTA, dynamic smem = LUT_BYTES + STAGES * stage bytes
// + 512 + 16 (stage bytes: R*(32*BITS + 8) + rows*576, rows = tokens of this m tile).
// Every CTA gets >= 1 unit (the host keeps ctas <= units).
template <typename T, int BITS, int M_TILE, int WARPS, int STAGES, bool SPLIT>
struct Gemv {
  static_assert(M_TILE == 2 || M_TILE == 8 || M_TILE == 16, "m_tile is 2, 8 or 16 tokens");
  static_assert(STAGES >= 2, "a ring of at least 2 stages");
  static constexpr bool COL = M_TILE == 2;           // column mode: 2 tokens x 4 blocks on n8
  static constexpr int NT = COL ? 1 : M_TILE / 8;    // mma n8 tiles
  static constexpr int THREADS = WARPS * 32;
  static constexpr int R = TILE_ROWS * WARPS;        // rows of a row block
  static constexpr int WROW = 32 * BITS;             // plane bytes of a row in a stage
  static constexpr int CH = NT == 1 && !COL ? 2 : 1;  // independent accumulator chains
  static constexpr int SLOT = WARPS * NT * 128;      // floats of one partial row block

  static constexpr int A_PER = (M_TILE * 32 + THREADS - 1) / THREADS;  // A chunks a thread

  // The copies of one unit into a stage buffer: each thread's share is fixed (BITS 16-byte plane
  // chunks, one 4-byte scale word, up to A_PER 16-byte A chunks), so the thread keeps its source
  // pointers at k = 0 of the current row block and a unit only adds its k offset. Everything
  // past K (the second half of a half unit, A past K) is zero-filled: source size 0, nothing is
  // read (the pointer may point past the row, or past the array for the last row).
  struct Loader {
    const uint32_t* w_src[BITS];
    const uint8_t* s_src;
    const T* a_src[A_PER];
    uint32_t w_dst0, w_c4[BITS], s_dst, a_dst0;
    int w_row[BITS], s_row, a_k;
    bool w_hi[BITS], s_hi, a_on[A_PER];
    int rb, ks;  // the next unit to copy

    __device__ __forceinline__ void init(int u, int KT, const T* A, int rows, int K) {
      const int tid = threadIdx.x;
      // plane chunk i = tid + j*THREADS is row i / (2*BITS), chunk i % (2*BITS) of the stage, at
      // byte 16*i of it (rows are 2*BITS chunks): one base a thread, plus an immediate per j
#pragma unroll
      for (int j = 0; j < BITS; ++j) {
        const int i = tid + j * THREADS, r = i / (2 * BITS), c = i - r * (2 * BITS);
        w_row[j] = r;
        w_c4[j] = (uint32_t)(4 * c);
        w_hi[j] = c >= BITS;
      }
      // 4 bits: 16-byte chunks swapped in pairs on odd rows (rows g, g+1 hit other banks); row
      // r = i / 8, so r & 1 is bit 3 of i, the same for every j
      w_dst0 = (uint32_t)(BITS == 4 ? (tid ^ ((tid >> 3) & 1)) : tid) * 16u;
      s_row = tid >> 1;
      s_hi = tid & 1;
      s_dst = (uint32_t)(R * WROW + tid * 4);
      // A: 16-byte chunk q of token m (k = 8q) at m*576 + (q%8)*64 + (q/8)*16: lane t's chunk c
      // at c*64 + t*16; chunk i = tid + j*THREADS is token i / 32, q = tid % 32
      {
        const int m = tid >> 5, q = tid & 31;
        a_k = 8 * q;
        a_dst0 = (uint32_t)(R * (WROW + 8) + m * A_TOKEN_BYTES + (q & 7) * 64 + (q >> 3) * 16);
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
          const int mj = m + j * (THREADS / 32);
          a_on[j] = mj < rows;
          a_src[j] = A + (size_t)min(mj, rows - 1) * K + 8 * q;
        }
      }
      rb = u / KT;
      ks = u - rb * KT;
#pragma unroll
      for (int j = 0; j < A_PER; ++j) a_src[j] += (size_t)ks * STAGE_K;
    }
    __device__ __forceinline__ void rows_of(const uint32_t* packed, const uint8_t* absmax, int N,
                                            int K) {
      const size_t kb = (size_t)(K / 32);
#pragma unroll
      for (int j = 0; j < BITS; ++j) {
        const int n = min(rb * R + w_row[j], N - 1);  // rows past N re-read row N-1 (not stored)
        w_src[j] = packed + ((size_t)n * kb * BITS + (size_t)ks * 8 * BITS + w_c4[j]);
      }
      s_src = absmax + (size_t)min(rb * R + s_row, N - 1) * kb + (size_t)ks * 8 + 4 * s_hi;
    }
    // (the source pointers advance with the unit: w_src, s_src, a_src point at unit ks)
    __device__ __forceinline__ void copy(uint32_t st, int K) {
      const bool whole = (ks + 1) * STAGE_K <= K;  // else only the first 128 k (4 blocks) exist
#pragma unroll
      for (int j = 0; j < BITS; ++j)
        cpa16(st + w_dst0 + j * THREADS * 16, w_src[j], whole || !w_hi[j] ? 16u : 0u);
      cpa4(st + s_dst, s_src, whole || !s_hi ? 4u : 0u);
#pragma unroll
      for (int j = 0; j < A_PER; ++j)
        if (a_on[j])
          cpa16(st + a_dst0 + j * (THREADS / 32) * A_TOKEN_BYTES, a_src[j],
                ks * STAGE_K + a_k < K ? 16u : 0u);
    }
    __device__ __forceinline__ void next(int KT, const uint32_t* packed, const uint8_t* absmax,
                                         const T* A, int N, int K) {
      if (++ks == KT) {
        ks = 0;
        ++rb;
        rows_of(packed, absmax, N, K);
#pragma unroll
        for (int j = 0; j < A_PER; ++j) a_src[j] -= (size_t)(KT - 1) * STAGE_K;
      } else {
#pragma unroll
        for (int j = 0; j < BITS; ++j) w_src[j] += 8 * BITS;
        s_src += 8;
#pragma unroll
        for (int j = 0; j < A_PER; ++j) a_src[j] += STAGE_K;
      }
    }
  };

  // Fragment (nt, 2h + e) = C[m0 + 8nt + 2t + e, n0 + 16*warp + g + 8h] (+ bias). Column mode:
  // (0, 2h + e) = the part of row g + 8h of token t/2 over half (t%2) of the blocks: lanes t,
  // t^1 add up, times OUT.
  static __device__ __forceinline__ void store(const float (&v)[NT][4], int n0, int m0, int M,
                                               int N, const T* __restrict__ bias, int has_bias,
                                               T* __restrict__ C) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    if constexpr (COL) {
      float r[2] = {v[0][0] + v[0][1], v[0][2] + v[0][3]};
#pragma unroll
      for (int h = 0; h < 2; ++h) r[h] = (r[h] + __shfl_xor_sync(FULL, r[h], 1)) * ScaleFmt<T>::OUT;
      const int m = m0 + (t >> 1);
      if ((t & 1) || m >= M) return;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + TILE_ROWS * warp + g + 8 * h;
        if (n < N) C[(size_t)m * N + n] = from_float<T>(r[h] + (has_bias ? to_float(bias[n]) : 0.0f));
      }
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + TILE_ROWS * warp + g + 8 * h;
      if (n >= N) continue;
      const float bv = has_bias ? to_float(bias[n]) : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * nt + 2 * t + e;
          if (m < M) C[(size_t)m * N + n] = from_float<T>(v[nt][2 * h + e] + bv);
        }
    }
  }

  static __device__ __forceinline__ void run(const uint32_t* __restrict__ packed,
                                             const uint8_t* __restrict__ absmax,
                                             const float* __restrict__ codebook,
                                             const T* __restrict__ A, const T* __restrict__ bias,
                                             int has_bias, T* __restrict__ C,
                                             float* __restrict__ ws,
                                             unsigned* __restrict__ counters, int M, int N,
                                             int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t lut_base = (uint32_t)__cvta_generic_to_shared(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * M_TILE;
    const int rows = min(M_TILE, M - m0);
    const T* Az = A + (size_t)m0 * K;
    const int KT = (K + STAGE_K - 1) / STAGE_K;      // units of a row block
    const int RB = (N + R - 1) / R;
    const int U = RB * KT;
    const int G = gridDim.x, c = blockIdx.x;
    const int u0 = (int)((long long)c * U / G), u1 = (int)((long long)(c + 1) * U / G);
    const int n_u = u1 - u0;
    const uint32_t stage_bytes = (uint32_t)(R * (WROW + 8) + rows * A_TOKEN_BYTES);
    const uint32_t ring = lut_base + LUT_BYTES;
    const uint32_t zeros = ring + STAGES * stage_bytes;  // 512 zero bytes: column mode's idle B
    const uint32_t flag = zeros + 512u;
    if constexpr (COL)
      for (int i = threadIdx.x; i < 32; i += THREADS) st_sh128(zeros + 16u * i, 0u, 0u, 0u, 0u);

    // the first STAGES-1 units in flight before the table is built
    Loader ld;
    ld.init(u0, KT, Az, rows, K);
    ld.rows_of(packed, absmax, N, K);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < n_u) {
        ld.copy(ring + s * stage_bytes, K);
        ld.next(KT, packed, absmax, Az, N, K);
      }
      cpa_commit();
    }
    fill_lut<T, BITS, THREADS, COL>(lut_base, codebook);

    const uint32_t lane_word = BITS == 2 ? (uint32_t)lane * 8u
                             : BITS == 5 ? (uint32_t)(lane & 15) * 4u : (uint32_t)lane * 4u;
    // this lane's offsets inside a stage: plane words of rows g, g+8 of the warp; their scale
    // bytes (blocks 2t, 2t+1); A of tokens g, g+8 (tokens past M read token M-1: a broadcast,
    // and their columns are never stored)
    const int rg = TILE_ROWS * warp + g;
    const int lw = BITS == 4 ? 0 : t * 8 * BITS;  // 4 bits: chunks (2t, 2t+1) ^ (g & 1)
    const uint32_t w_off0 = (uint32_t)(rg * WROW + lw), w_off1 = w_off0 + 8u * WROW;
    // (column mode: the 4 bytes of blocks 4(t%2)..+3, and B lanes (g, t) read token g/4 when
    // g % 4 == t, else zeros)
    const uint32_t s_off0 = (uint32_t)(R * WROW + rg * 8 + (COL ? 4 * (t & 1) : 2 * t));
    const uint32_t s_off1 = s_off0 + 64u;
    uint32_t a_off[NT];
    bool a_zero = false;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = COL ? g >> 2 : g + 8 * nt;
      a_zero = COL && ((g & 3) != t || tok >= rows);
      a_off[nt] = (uint32_t)(R * (WROW + 8) + min(tok, rows - 1) * A_TOKEN_BYTES + t * 16);
    }

    float acc[CH][NT][4];
#pragma unroll
    for (int j = 0; j < CH; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[j][nt][0] = acc[j][nt][1] = acc[j][nt][2] = acc[j][nt][3] = 0.0f;

    // compute side: row block rb, unit ks of it; the first segment is whole if it starts at ks 0
    int rb = u0 / KT, ks = u0 - rb * KT;
    bool seg_whole = ks == 0;
    int slot = 0;
    for (int i = 0; i < n_u; ++i) {
      cpa_wait<STAGES - 2>();  // this thread's copies of unit i have landed
      __syncthreads();         // everyone's have; and stage (i-1) % STAGES is free again
      if (i + STAGES - 1 < n_u) {
        ld.copy(ring + (slot == 0 ? STAGES - 1 : slot - 1) * stage_bytes, K);
        ld.next(KT, packed, absmax, Az, N, K);
      }
      cpa_commit();
      const uint32_t st = ring + slot * stage_bytes;
      slot = slot + 1 == STAGES ? 0 : slot + 1;

      // plane words of rows g, g+8, blocks 2t, 2t+1 (block j at [j*BITS, (j+1)*BITS))
      uint32_t wa[2 * BITS], wb[2 * BITS];
      if constexpr (BITS == 4) {
        const uint32_t x = (uint32_t)(g & 1) * 16u;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t co = ((uint32_t)(2 * t + h) * 16u) ^ x;
          const uint4 p = ld_sh128(st + w_off0 + co), q = ld_sh128(st + w_off1 + co);
          wa[4 * h] = p.x; wa[4 * h + 1] = p.y; wa[4 * h + 2] = p.z; wa[4 * h + 3] = p.w;
          wb[4 * h] = q.x; wb[4 * h + 1] = q.y; wb[4 * h + 2] = q.z; wb[4 * h + 3] = q.w;
        }
      } else if constexpr (BITS == 2) {
        const uint4 p = ld_sh128(st + w_off0), q = ld_sh128(st + w_off1);
        wa[0] = p.x; wa[1] = p.y; wa[2] = p.z; wa[3] = p.w;
        wb[0] = q.x; wb[1] = q.y; wb[2] = q.z; wb[3] = q.w;
      } else {
#pragma unroll
        for (int h = 0; h < BITS; ++h) {
          const uint2 p = lds64(st + w_off0 + 8u * h), q = lds64(st + w_off1 + 8u * h);
          wa[2 * h] = p.x; wa[2 * h + 1] = p.y;
          wb[2 * h] = q.x; wb[2 * h + 1] = q.y;
        }
      }
      // row mode: scales of blocks 2t, 2t+1 as T halves (raw << SHIFT: see the header);
      // column mode: the raw bytes of blocks 4(t%2)..+3
      uint32_t sa, sb;
      if constexpr (COL) {
        sa = lds32(st + s_off0);
        sb = lds32(st + s_off1);
      } else {
        sa = __byte_perm(ld_sh_u16(st + s_off0), 0u, 0x4140u) << ScaleFmt<T>::SHIFT;
        sb = __byte_perm(ld_sh_u16(st + s_off1), 0u, 0x4140u) << ScaleFmt<T>::SHIFT;
      }
      uint32_t a_lane[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) a_lane[nt] = a_zero ? zeros + (uint32_t)t * 16u : st + a_off[nt];
      {
        const Codes<BITS> ca = make_codes<BITS>(wa), cb = make_codes<BITS>(wb);
        block_mmas<T, BITS, NT, 0, COL>(ca, cb, lut_base, lane_word, sa, sb, a_lane, acc[0]);
      }
      {
        const Codes<BITS> ca = make_codes<BITS>(wa + BITS), cb = make_codes<BITS>(wb + BITS);
        block_mmas<T, BITS, NT, 1, COL>(ca, cb, lut_base, lane_word, sa, sb, a_lane, acc[CH - 1]);
      }

      // end of a row block's segment: store it, or (stream-K) hand in its partial
      const bool rb_end = ks + 1 == KT;
      if (rb_end || i + 1 == n_u) {
        float sum[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            sum[nt][q] = CH == 2 ? acc[0][nt][q] + acc[CH - 1][nt][q] : acc[0][nt][q];
            acc[0][nt][q] = acc[CH - 1][nt][q] = 0.0f;
          }
        if constexpr (SPLIT) {
          if (seg_whole && rb_end)
            store(sum, rb * R, m0, M, N, bias, has_bias, C);
          else
            partial(sum, rb, KT, U, u0, ws, counters, flag, m0, M, N, bias, has_bias, C);
        } else {
          store(sum, rb * R, m0, M, N, bias, has_bias, C);  // the host keeps segments whole
        }
      }
      if (rb_end) {
        ks = 0;
        ++rb;
        seg_whole = true;
      } else {
        ++ks;
      }
    }
  }

  // CTA that owns unit u (the inverse of u0(c) = c*U/G).
  static __device__ __forceinline__ int cta_of(int u, int U) {
    return (int)(((long long)(u + 1) * gridDim.x - 1) / U);
  }

  // Stream-K: this CTA's part of row block rb goes to its ws slot (0: the first segment of its
  // range, 1: the last); the CTA that counts last adds the parts in CTA order.
  static __device__ __forceinline__ void partial(const float (&v)[NT][4], int rb, int KT, int U,
                                                 int u0, float* __restrict__ ws,
                                                 unsigned* __restrict__ counters, uint32_t flag,
                                                 int m0, int M, int N, const T* __restrict__ bias,
                                                 int has_bias, T* __restrict__ C) {
    const int G = gridDim.x, lane = threadIdx.x & 31;
    const size_t zbase = (size_t)blockIdx.z * G * 2;
    const int me = (threadIdx.x >> 5) * NT * 128 + lane * 4;  // this thread's floats in a slot
    {
      float* dst = ws + (zbase + 2 * blockIdx.x + (u0 / KT == rb ? 0 : 1)) * SLOT + me;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        __stcg(reinterpret_cast<float4*>(dst + nt * 128), make_float4(v[nt][0], v[nt][1], v[nt][2], v[nt][3]));
    }
    __threadfence();  // this thread's part is visible before the count moves
    __syncthreads();
    const int cf = cta_of(rb * KT, U), cl = cta_of(rb * KT + KT - 1, U);
    unsigned* cnt = counters + (size_t)blockIdx.z * ((N + R - 1) / R) + rb;
    if (threadIdx.x == 0) {
      const unsigned prev = atomicAdd(cnt, 1u);
      asm volatile("st.shared.u32 [%0], %1;" :: "r"(flag), "r"(prev == (unsigned)(cl - cf) ? 1u : 0u)
                   : "memory");
    }
    __syncthreads();
    if (lds32(flag) == 0u) return;
    __threadfence();
    float tot[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) tot[nt][0] = tot[nt][1] = tot[nt][2] = tot[nt][3] = 0.0f;
#pragma unroll 1
    for (int c = cf; c <= cl; ++c) {
      const int cu0 = (int)((long long)c * U / G);
      const float* src = ws + (zbase + 2 * c + (cu0 / KT == rb ? 0 : 1)) * SLOT + me;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 p = __ldcg(reinterpret_cast<const float4*>(src + nt * 128));
        tot[nt][0] += p.x;
        tot[nt][1] += p.y;
        tot[nt][2] += p.z;
        tot[nt][3] += p.w;
      }
    }
    store(tot, rb * R, m0, M, N, bias, has_bias, C);
    if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch (stream order)
  }
};

}  // namespace kg::kbit_gemm
