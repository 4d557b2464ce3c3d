// Memory and bit helpers written as PTX where the C++ spelling does not give the instruction
// we need. Shared by every family.
#pragma once
#include "common/dtypes.cuh"

namespace kg {

// Programmatic dependent launch (kernelgen/core/launch.py): the first statement of every entry
// point (Ctx.launch launches them all with PDL). The grid may have been scheduled while the one
// before it on the stream was finishing; this waits until that grid has completed and its memory
// is visible, so nothing the kernel does afterwards can tell the difference from plain stream
// order. A no-op when the launch had no programmatic dependency, and before sm_90 (no such
// launches there).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The other half of PDL: the next grid on the stream may be scheduled from now on (its own
// grid_dependency_wait still waits for this grid's completion and memory).
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A hint: fetch the line holding p into L2 (no register written, no fault reported).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 16/8/4-byte global loads through the read-only path, spelled out: NVVM splits a uint4 access
// through a reinterpret_cast of a 2-byte-aligned pointer into four 4-byte accesses.
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ld_nc_v2(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ld_nc_u32(const void* p) {
  uint32_t r;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
// 16-byte global store (same reason as the loads).
__device__ __forceinline__ void st_v4(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// Shared loads by 32-bit shared-window address (one IMAD forms the address). volatile: a
// non-volatile asm reads no memory as far as the compiler knows, and may be hoisted above the
// barrier that publishes the data.
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t r;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(r) : "r"(addr));
  return r;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 r;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(addr));
  return r;
}

// cp.async (sm_80+): global -> shared without a register round trip.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// 16-byte cp.async through L2 only (.cg); src_bytes < 16 zero-fills the rest (0: a masked-out
// row reads nothing and lands as zeros).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// A bool byte count would be a 1-byte copy: cp_async16(dst, src, ok) does not compile (the
// deleted overload below wins for bool); write ok ? 16 : 0, or cp_async16_zfill.
template <typename B> struct OnlyBool {};
template <> struct OnlyBool<bool> { using type = void; };
template <typename B, typename = typename OnlyBool<B>::type>
void cp_async16(uint32_t dst, const void* src, B valid) = delete;
// The same with a validity flag instead of a byte count: valid == false reads nothing and
// lands 16 zeros (a masked-out row).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
// 4-byte cp.async (.ca: the smallest size cp.async has).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}
// 4-byte cp.async, 4 zeros when !valid (nothing is read).
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src),
               "r"(valid ? 4 : 0) : "memory");
}
// Pipeline bookkeeping: close the current group; wait until at most N groups are pending.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(addr));
  return r;
}

// prmt with the sign-replicate mode (selector nibble bit 3) that __byte_perm does not promise.
template <uint32_t SEL> __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "n"(SEL));
  return r;
}

}  // namespace kg
