// Tensor-core mma.sync wrappers (sm_80+), one per shape; the operand type is a template
// parameter, the PTX text is generated from it.
#pragma once
#include "common/dtypes.cuh"

namespace kg {

// D[16x8] += A[16x16] . B[16x8]: fp16 or bf16 operands, fp32 accumulators.
// Fragments as PTX defines them for m16n8k16 (row-major A, column-major B): a0..a3 hold A's
// (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); b0, b1 hold B's (2t..2t+1, g), (2t+8.., g)
// with g = lane / 4, t = lane % 4.
#define KG_MMA_M16N8K16(AB)                                                                      \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32 {%0, %1, %2, %3}, "               \
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                            \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                           \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

template <typename T> struct Mma;
template <> struct Mma<half> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    KG_MMA_M16N8K16("f16");
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    KG_MMA_M16N8K16("bf16");
  }
};
#undef KG_MMA_M16N8K16

// Four 8x8 b16 matrices from shared memory (sm_75+): lane l gives the 16-byte row address of
// matrix l / 8, row l % 8; register i receives matrix i in the mma fragment layout (row g,
// columns 2t, 2t+1), i.e. an m16k16 A fragment when the matrices are (rows 0-7, k 0-7),
// (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ldmatrix .x4 / .x2 with a "memory" clobber, registers by reference (any four / two
// fragments): ordered against shared stores and barriers as a memory access, where
// ldmatrix_x4 above is ordered only by its volatile. The clobber can change the schedule, so
// the two are separate names.
__device__ __forceinline__ void ldmatrix_x4_ordered(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                    uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_ordered(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}

}  // namespace kg
