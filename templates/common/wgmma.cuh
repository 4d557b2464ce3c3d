// Warpgroup MMA (sm_90a only): wgmma.mma_async with both operands in shared memory, fp32
// accumulators in registers. Generic helpers shared by every family: the K-major 128-byte-
// swizzle shared-memory descriptor, the fences and group bookkeeping, and m64nNk16 wrappers for
// f16 / bf16 operands (N = 64, 128, 256).
//
// Shared-memory layout the descriptor describes (K-major, 128-byte swizzle): rows of 64 16-bit
// elements (128 bytes), 16-byte chunk c of row r stored at chunk c ^ (r % 8), 8-row atoms of
// 1024 bytes that start on 1024-byte boundaries (the swizzle is taken from address bits, so the
// tile base must be 1024-byte aligned). k16 step s of a 64-wide row starts 32 * s bytes in.
//
// Accumulators: a warpgroup (4 consecutive warps, the first a multiple of 4) computes a 64 x N
// tile; warp w % 4 holds rows 16 (w % 4) .. +15 as N / 8 fragments d[j][0..3] laid out like the
// mma.m16n8 C fragment: d[j][e] is row g + 8 (e / 2), column 8 j + 2 t + e % 2 (g = lane / 4,
// t = lane % 4).
//
// Ordering rules (PTX ISA, "asynchronous warpgroup level matrix multiply"):
// - wgmma_fence() before the first wgmma of a batch (after the accumulators were written by
//   ordinary code, e.g. zeroed); consecutive wgmmas into the same accumulators need none;
// - shared memory written through the generic proxy (st.shared, cp.async) must be followed by
//   fence_proxy_async() in the writing threads and a barrier before a wgmma reads it;
// - wgmma_commit() closes a group; wgmma_wait<N>() returns when at most N groups are pending;
//   the accumulators must not be read, and the shared tiles of a pending group not
//   overwritten, before the wait that completes its group.
#pragma once
#include "common/dtypes.cuh"

namespace kg {

// Descriptor of a K-major, 128-byte-swizzled tile at shared-window address `addr`: start >> 4,
// leading byte offset 16 (unused with this swizzle), stride byte offset 1024 (8-row atoms),
// layout type 1 (128-byte swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_desc_k128(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes of this thread (st.shared, cp.async after its wait)
// become visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// mbarrier helpers (sm_90) for producer / consumer pipelines, by shared-window address.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrive on `bar` once every cp.async this thread issued so far has landed (the init count
// includes this arrival: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// The full / empty mbarrier pair of each of STAGES pipeline slots, 8 bytes apart (one thread).
template <int STAGES>
__device__ __forceinline__ void mbar_init_slots(uint32_t full, uint32_t empty, uint32_t full_count,
                                                uint32_t empty_count) {
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    mbar_init(full + 8 * s, full_count);
    mbar_init(empty + 8 * s, empty_count);
  }
}
// Dynamic shared memory of an mbarrier pipeline: PIPE bytes of stages from the first
// 1024-byte boundary (swizzle atoms), then the full and the empty mbarrier of each of STAGES
// slots. BYTES: what that takes with the alignment slack; tail: the byte offset from smem of what
// follows the barriers.
template <int PIPE, int STAGES>
struct MbarPipeSmem {
  static constexpr int BYTES = PIPE + 1024 + 16 * STAGES;
  uint32_t base, full, empty, tail;
  __device__ __forceinline__ explicit MbarPipeSmem(const void* smem) {
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem);
    base = (raw + 1023u) & ~1023u;
    full = base + PIPE;
    empty = full + 8 * STAGES;
    tail = empty + 8 * STAGES - raw;
  }
};
// Spin until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nKG_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KG_MBAR_WAIT;\n}" ::"r"(bar), "r"(parity) : "memory");
}

// D[64 x N] (+)= A[64 x 16] . B[N x 16]^T, A and B K-major in shared memory (descriptors),
// T = half | __nv_bfloat16; scale_d = 0 ignores D's old value (overwrites), 1 accumulates.
template <typename T, int N> struct Wgmma;

#define KG_WG_D1(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define KG_WG_D8(j) KG_WG_D1(j), KG_WG_D1(j + 1), KG_WG_D1(j + 2), KG_WG_D1(j + 3), \
                    KG_WG_D1(j + 4), KG_WG_D1(j + 5), KG_WG_D1(j + 6), KG_WG_D1(j + 7)
#define KG_WGMMA_N64(AB)                                                                 \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " {"                       \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"             \
      "}, %32, %33, p, 1, 1, 0, 0;\n}"                                                   \
      : KG_WG_D8(0)                                                                      \
      : "l"(da), "l"(db), "r"(scale_d))

#define KG_WGMMA_N128(AB)                                                                \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." AB "." AB " {"                      \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, " \
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"             \
      "}, %64, %65, p, 1, 1, 0, 0;\n}"                                                   \
      : KG_WG_D8(0), KG_WG_D8(8)                                                         \
      : "l"(da), "l"(db), "r"(scale_d))

#define KG_WGMMA_N256(AB)                                                                    \
  asm volatile(                                                                              \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                          \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." AB "." AB " {"                          \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "     \
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "     \
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "     \
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "     \
      "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "     \
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "     \
      "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
      "%126, %127"                                                                           \
      "}, %128, %129, p, 1, 1, 0, 0;\n}"                                                     \
      : KG_WG_D8(0), KG_WG_D8(8), KG_WG_D8(16), KG_WG_D8(24)                                 \
      : "l"(da), "l"(db), "r"(scale_d))

template <> struct Wgmma<half, 64> {
  static __device__ __forceinline__ void run(float (&d)[8][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N64("f16");
  }
};
template <> struct Wgmma<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void run(float (&d)[8][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N64("bf16");
  }
};
template <> struct Wgmma<half, 128> {
  static __device__ __forceinline__ void run(float (&d)[16][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N128("f16");
  }
};
template <> struct Wgmma<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void run(float (&d)[16][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N128("bf16");
  }
};
template <> struct Wgmma<half, 256> {
  static __device__ __forceinline__ void run(float (&d)[32][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N256("f16");
  }
};
template <> struct Wgmma<__nv_bfloat16, 256> {
  static __device__ __forceinline__ void run(float (&d)[32][4], uint64_t da, uint64_t db,
                                             int scale_d = 1) {
    KG_WGMMA_N256("bf16");
  }
};
#undef KG_WGMMA_N64
#undef KG_WGMMA_N128
#undef KG_WGMMA_N256
#undef KG_WG_D8
#undef KG_WG_D1

}  // namespace kg
