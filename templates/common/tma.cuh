// Bulk tensor copies (the tensor memory accelerator, TMA; sm_90) into shared memory, completing
// on an mbarrier. The tensor map (kernelgen/core/tma.py encodes it on the host with the
// driver's cuTensorMapEncodeTiled) is a kernel parameter passed by value (__grid_constant__):
// its generic address is what the copy instruction takes.
//
// A copy of a box lands in shared memory in the map's swizzle (128-byte: 16-byte chunk c of
// 128-byte line l at chunk c ^ (l % 8), from address bits, so boxes start on 1024-byte
// boundaries), which is the layout wgmma's 128-byte-swizzle descriptor reads. Elements of the box
// outside the tensor are zero-filled and still counted in the transaction bytes.
#pragma once
#include "common/dtypes.cuh"

namespace kg {

// CUtensorMap: 128 opaque bytes, 64-byte aligned
struct alignas(64) TensorMap {
  unsigned long long v[16];
};

// One thread arms `bar` for `bytes` of copies to come (its own arrival included).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Makes this thread's mbarrier.init visible to the async proxy (the copy engine) before a
// barrier publishes it to the CTA.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap& map, uint32_t bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TensorMap& map, uint32_t bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5}], [%2];" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1),
      "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const TensorMap& map, uint32_t bar, int c0,
                                            int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5, %6, %7}], [%2];" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0),
      "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

}  // namespace kg
