// PTX wrappers of the mx_gemm kernels: fp8 <-> f16 conversion (sm_89+; fp8 -> f16 also by
// integer ops, for sm_80), the fp8 mma.sync (sm_89+), the Blackwell block-scaled mma.sync
// (sm_120a / sm_121a), a 2-byte shared load. One wrapper per instruction shape; element formats
// are template parameters. f16 mma.sync, ldmatrix, cp.async and 16-byte shared loads are the
// common ones (common/mma.cuh, common/ptx.cuh).
#pragma once
#include "common/dtypes.cuh"

namespace kg {
namespace mx_gemm {

// Element formats; the kernel templates name them from the config (a_elem / b_elem upper-cased).
// In kg::mx_gemm, not kg::mx: kg::mx (mx/mx.cuh) has the codec types E4M3 / E5M2 / E2M1.
enum Elem : int { E4M3 = 0, E5M2 = 1, E2M1 = 2 };

// Two fp8 codes (the low and high byte of `x`) -> f16x2, exactly, by integer ops: what sm_80
// (no fp8 instruction) runs, and what SOFT asks for on newer parts (its tests run on them).
// e5m2 is an f16 cut to its high byte (the same exponent bias; Inf and NaN too); e4m3:
// common/dtypes.cuh e4m3x2_to_f16x2_soft. Bit-identical to the cvt but for NaN payloads.
template <int E> __device__ __forceinline__ uint32_t fp8x2_to_f16x2_soft(uint16_t x) {
  if constexpr (E == E5M2)
    return __byte_perm((uint32_t)x, 0u, 0x1404);  // b1 << 24 | b0 << 8
  else
    return e4m3x2_to_f16x2_soft(x);
}

// Whether fp8 -> f16 goes by integer ops: asked for (SOFT), or no fp8 cvt (below sm_89).
template <bool SOFT> __device__ constexpr bool fp8_decode_soft() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  return true;
#else
  return SOFT;
#endif
}

// Two fp8 codes -> f16x2, exactly: one F2FP, or fp8x2_to_f16x2_soft (fp8_decode_soft).
template <int E, bool SOFT = false> __device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint16_t x) {
  if constexpr (fp8_decode_soft<SOFT>()) {
    return fp8x2_to_f16x2_soft<E>(x);
  } else {
    uint32_t r;
    if constexpr (E == E4M3)
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
    else
      asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(x));
    return r;
  }
}

// Two f16 -> two fp8 (the high half to the high byte), nearest even, saturated to finite
// (sm_89+: one F2FP).
template <int E> __device__ __forceinline__ uint32_t f16x2_to_fp8x2(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if constexpr (E == E4M3)
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(x));
  else
    asm("cvt.rn.satfinite.e5m2x2.f16x2 %0, %1;" : "=h"(r) : "r"(x));
  return r;
#else
  static_assert(E < 0, "f16 -> fp8 needs sm_89+ (its callers: the fp8 wgmma / mma.sync rescale)");
  return 0;
#endif
}

// fp8 mma.sync (sm_89+): D[16 x 8] += A[16 x 32] . B[8 x 32]^T, fp32 accumulators in place.
// Fragments of 8-bit elements (4 a register, lowest k in the low byte): a0 = A[g][4t..4t+3],
// a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[g][4t..], b1 = B[g][16+4t..]
// (B as rows of N): what ldmatrix_x4 gives from row-major tiles of 16-byte chunks.
template <int AE, int BE> struct MmaFp8 {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#define KG_MMA_FP8(AT, BT)                                                                       \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." AT "." BT ".f32 {%0, %1, %2, %3}, "     \
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                   \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
    if constexpr (AE == E4M3 && BE == E4M3) KG_MMA_FP8("e4m3", "e4m3");
    else if constexpr (AE == E4M3) KG_MMA_FP8("e4m3", "e5m2");
    else if constexpr (BE == E4M3) KG_MMA_FP8("e5m2", "e4m3");
    else KG_MMA_FP8("e5m2", "e5m2");
#undef KG_MMA_FP8
  }
};

// Block-scaled mma.sync of sm_120a / sm_121a: D += (A * SF_A) . (B * SF_B), fp32 accumulators in place.
// Scale operands: byte-id 0 and thread-id 0 always; every lane holds the scales of its own
// row (A: row g + 8 * (lane & 1)) and column (B: column g), so any lane the hardware reads
// from has the right value. Byte j of the scale register is the scale of the j-th k-group of
// the instruction (1X: one group of 32; 2X: two of 32; 4X: four of 16).
#define KG_MX_MMA_BS(SHAPE, KIND, VEC, AT, BT, ST)                                               \
  asm volatile("mma.sync.aligned." SHAPE ".row.col.kind::" KIND ".block_scale.scale_vec::" VEC  \
               ".f32." AT "." BT ".f32." ST " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "     \
               "{%0, %1, %2, %3}, {%10}, {%11, %11}, {%12}, {%11, %11};"                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa),      \
                 "h"((uint16_t)0), "r"(sfb))

// kind::mxf8f6f4, m16n8k32, ue8m0 scales per 32 (scale_vec::1X). Operands in 8-bit containers;
// e2m1 sits in bits [2, 6) of its byte (fragment layout as MmaFp8).
template <int AE, int BE> struct MmaMxf8f6f4;
#define KG_MX_MMA_F8F6F4_SPEC(AE, BE, AT, BT)                                                    \
  template <> struct MmaMxf8f6f4<AE, BE> {                                                       \
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],            \
                                               const uint32_t (&b)[2], uint32_t sfa,             \
                                               uint32_t sfb) {                                   \
      KG_MX_MMA_BS("m16n8k32", "mxf8f6f4", "1X", AT, BT, "ue8m0");                               \
    }                                                                                            \
  };
KG_MX_MMA_F8F6F4_SPEC(E4M3, E4M3, "e4m3", "e4m3")
KG_MX_MMA_F8F6F4_SPEC(E4M3, E5M2, "e4m3", "e5m2")
KG_MX_MMA_F8F6F4_SPEC(E5M2, E4M3, "e5m2", "e4m3")
KG_MX_MMA_F8F6F4_SPEC(E5M2, E5M2, "e5m2", "e5m2")
KG_MX_MMA_F8F6F4_SPEC(E4M3, E2M1, "e4m3", "e2m1")
KG_MX_MMA_F8F6F4_SPEC(E5M2, E2M1, "e5m2", "e2m1")
#undef KG_MX_MMA_F8F6F4_SPEC

// kind::mxf4nvf4, m16n8k64, packed e2m1 (8 per register, lowest k in the low nibble):
// a0 = A[g][8t..8t+7], a1 = A[g+8][8t..], a2 = A[g][32+8t..], a3 = A[g+8][32+8t..];
// b0 = B[8t..8t+7][g], b1 = B[32+8t..][g]. UE8M0 per 32 (2X) or UE4M3 per 16 (4X).
template <bool NV> struct MmaMxf4nvf4;
template <> struct MmaMxf4nvf4<false> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
    KG_MX_MMA_BS("m16n8k64", "mxf4nvf4", "2X", "e2m1", "e2m1", "ue8m0");
  }
};
template <> struct MmaMxf4nvf4<true> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
    KG_MX_MMA_BS("m16n8k64", "mxf4nvf4", "4X", "e2m1", "e2m1", "ue4m3");
  }
};
#undef KG_MX_MMA_BS

// 2-byte shared load (fp4 pairs of the FP8 x FP4 path); volatile for the reason of kg::lds32.
__device__ __forceinline__ uint32_t mx_lds16(uint32_t addr) {
  uint16_t r;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(addr));
  return r;
}

// Four packed e2m1 codes (16 bits, lowest k in the low nibble) -> four 8-bit containers of
// kind::mxf8f6f4, each code in bits [2, 6) of its byte (what ldmatrix .b4x16_p64 + the
// CUTLASS shift produce).
__device__ __forceinline__ uint32_t e2m1x4_to_f8f6f4(uint32_t x) {
  const uint32_t y = (x & 0xFu) | ((x & 0xF0u) << 4) | ((x & 0xF00u) << 8) | ((x & 0xF000u) << 12);
  return y << 2;
}

__device__ __forceinline__ uint32_t mx_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of scale (row r, scale column c) inside the swizzled scale layout's 512-byte
// chunks [32][4][4], for rows counted from a multiple of 128: (r / 128) chunks of 512 bytes
// (one per 128 rows in the shared copy), then (r % 32) * 16 + (r / 32 % 4) * 4 + c.
__device__ __forceinline__ int swz_off(int r, int c) {
  return (r >> 7) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + c;
}

// Grouped raster over (m tiles, n tiles): GROUP m-tiles share their B columns in L2.
template <int GROUP>
__device__ __forceinline__ void tile_coords(int id, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = GROUP * tiles_n;
  const int first_m = (id / per_group) * GROUP;
  const int rows = min(tiles_m - first_m, GROUP);
  tm = first_m + (id % per_group) % rows;
  tn = (id % per_group) / rows;
}

}  // namespace mx_gemm
}  // namespace kg
