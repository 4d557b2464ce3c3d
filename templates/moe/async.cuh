// cp.async and ldmatrix wrappers of the MoE grouped GEMM (sm_80+). Kept in the family's folder
// (namespace kg::moe) so that they cannot collide with helpers other families add to
// common/ptx.cuh; candidates to move there.
#pragma once
#include "common/dtypes.cuh"

namespace kg::moe {

// 16-byte global -> shared copy that bypasses L1 (.cg: streamed weights are read once). With
// valid == false nothing is read and the 16 bytes are zero-filled (src-size 0), so rows past a
// segment, N or K contribute zeros to the mma.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Wait until at most N groups of this thread are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four / two 8x8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8.
// volatile + "memory": must not move above the barrier that publishes the stage.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r0), "=r"(r1)
               : "r"(addr)
               : "memory");
}

}  // namespace kg::moe
