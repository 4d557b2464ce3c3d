// Split-K reduction: the CTA (or warp) that finishes a tile last adds the fp32 partials every
// split stored for it.
#pragma once

namespace kg {

// Outputs p = first, first + step, ... < total: off(p) is the output's offset in one split's
// partials (< 0: nothing to do), split y's partial lies at ws + y * stride + off(p), and
// store(p, v) receives their sum, added in split order (deterministic). U outputs x Y splits
// are loaded before any is added, so U * Y independent L2 loads are in flight instead of one:
// a rolled loop of a dependent load and add waits an L2 round trip for every split and output.
template <int U = 2, int Y = 4, typename Off, typename Store>
__device__ __forceinline__ void sum_splits(const float* __restrict__ ws, size_t stride, int splits,
                                           int first, int total, int step, Off off, Store store) {
#pragma unroll 1
  for (int p0 = first; p0 < total; p0 += U * step) {
    long long o[U];
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = p0 + u * step;
      o[u] = p < total ? off(p) : -1;
      v[u] = 0.0f;
    }
#pragma unroll 1
    for (int y0 = 0; y0 < splits; y0 += Y) {
      float part[Y][U];
#pragma unroll
      for (int y = 0; y < Y; ++y)
#pragma unroll
        for (int u = 0; u < U; ++u)
          part[y][u] = o[u] >= 0 && y0 + y < splits ? __ldcg(ws + (size_t)(y0 + y) * stride + o[u]) : 0.0f;
#pragma unroll
      for (int y = 0; y < Y; ++y)
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (y0 + y < splits) v[u] += part[y][u];
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (o[u] >= 0) store(p0 + u * step, v[u]);
  }
}

}  // namespace kg
