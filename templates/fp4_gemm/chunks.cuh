// Where a 16-byte chunk of the tiled FP4 / kbit4 weight layout (fp4_gemm/fp4.cuh) lies, for
// kernels that walk the chunks one a thread (the dense dequantize kernels): chunk i of the
// blocks in tile-major order, Q steps of 128 k a tile, 64 chunks a (tile, step) block; chunk c =
// 32h + 4g + t is lane (g, t)'s chunk of row 16 * tile + 8h + g (its word j: k = 128q + 32j + 8t
// .. + 7). I: the index type (32-bit where the host bounds the chunk count).
#pragma once

namespace kg::fp4 {

struct TiledChunk {
  int tile, q, c, h, g, t, row;
};

template <typename I>
__device__ __forceinline__ TiledChunk tiled_chunk(I i, I Q) {
  TiledChunk r;
  r.c = (int)(i & 63);
  const I blk = i >> 6;
  r.q = (int)(blk % Q);
  r.tile = (int)(blk / Q);
  r.h = r.c >> 5;
  r.g = (r.c >> 2) & 7;
  r.t = r.c & 3;
  r.row = 16 * r.tile + 8 * r.h + r.g;
  return r;
}

}  // namespace kg::fp4
