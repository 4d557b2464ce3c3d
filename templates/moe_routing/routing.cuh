// MoE token routing: phase 1 (layout), phase 2 (dispatch = row gather), combine.
//
//   ids      [n]         flat topk_ids, n = T * top_k, i = t * top_k + j; IdT = int | long long
//   counts   [E]         pairs routed to expert e (ids outside [0, E) are dropped, not counted)
//   offsets  [E + 1]     start row of expert e in x_perm; segments padded to a multiple of pad_to
//   dest     [n]         row of x_perm of pair i (-1: dropped id)
//   src      [capacity]  pair i of each x_perm row (-1: padding row, or a row >= offsets[E])
//   invalid  [2]         number of dropped ids, smallest dropped flat index (INT_MAX if none)
//
// Layout. A CTA owns a contiguous range of pairs, split into one contiguous span per warp. Pass A
// counts each warp's span into its own smem histogram row (leader lanes of __match_any_sync
// groups add the group size); a per-expert exclusive scan over warps (and, multi-CTA, over CTAs)
// gives each warp the first row of its pairs of e. Pass B walks the span again in the same
// order: a pair's row = its warp's running row for e + the number of lower lanes of its match
// group, so rows within an expert follow increasing i (stable) with no sort.
// Small n: one CTA does both passes and the scan over experts (moe_layout_single). Large n:
// moe_layout_count (pass A per CTA -> per-CTA histograms in global), moe_layout_scan (one CTA:
// scan over CTAs per expert, counts, padded offsets), moe_layout_scatter (pass A again for the
// warp bases, then pass B).
#pragma once
#include "common/dtypes.cuh"
#include "common/ptx.cuh"

namespace kg::moe_routing {

constexpr unsigned FULL = 0xffffffffu;
constexpr int DROPPED = -1;  // an id outside [0, E)
constexpr int PAST_END = -2;  // a lane past the end of its warp's span
constexpr int INT_MAX_ = 0x7fffffff;

template <typename IdT>
__device__ __forceinline__ int expert_of(const IdT* ids, int i, int end, int E) {
  if (i >= end) return PAST_END;
  const long long e = (long long)ids[i];  // widen first: an int64 id must not wrap into range
  return (e >= 0 && e < E) ? (int)e : DROPPED;
}

// The span of warp w of a CTA covering [lo, hi): contiguous, a multiple of 32 pairs long.
__device__ __forceinline__ void warp_span(int lo, int hi, int warps, int w, int& wlo, int& whi) {
  const int per = ((hi - lo + warps - 1) / warps + 31) & ~31;
  wlo = min(lo + w * per, hi);
  whi = min(wlo + per, hi);
}

// Pass A: hist[e] += pairs of e in [wlo, whi); dropped ids tallied per lane.
template <typename IdT, int ITEMS>
__device__ __forceinline__ void count_span(const IdT* __restrict__ ids, int wlo, int whi, int E,
                                           int* hist, int& bad, int& first_bad) {
  const int lane = lane_id();
  for (int i0 = wlo; i0 < whi; i0 += 32 * ITEMS) {
    int e[ITEMS];
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) e[u] = expert_of(ids, i0 + 32 * u + lane, whi, E);
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
      const unsigned peers = __match_any_sync(FULL, e[u]);
      // leaders of different groups touch different experts; smem atomics order the updates of
      // one expert made by different lanes in successive steps
      if (e[u] >= 0 && lane == 31 - __clz(peers)) atomicAdd(&hist[e[u]], __popc(peers));
      if (e[u] == DROPPED) {
        ++bad;
        first_bad = min(first_bad, i0 + 32 * u + lane);
      }
    }
  }
}

// Pass B: run[e] = next row of expert e for this warp; writes dest and src of [wlo, whi).
template <typename IdT, int ITEMS>
__device__ __forceinline__ void scatter_span(const IdT* __restrict__ ids, int wlo, int whi, int E,
                                             int* run, int* __restrict__ dest,
                                             int* __restrict__ src) {
  const int lane = lane_id();
  const unsigned lower = (1u << lane) - 1u;
  for (int i0 = wlo; i0 < whi; i0 += 32 * ITEMS) {
    int e[ITEMS];
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) e[u] = expert_of(ids, i0 + 32 * u + lane, whi, E);
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
      const unsigned peers = __match_any_sync(FULL, e[u]);
      const int i = i0 + 32 * u + lane;
      const int row = e[u] >= 0 ? run[e[u]] + __popc(peers & lower) : -1;
      __syncwarp();  // every lane has read run[] before its group's leader moves it on
      if (e[u] >= 0) {
        src[row] = i;
        if (lane == 31 - __clz(peers)) run[e[u]] = row + 1;  // the leader is the group's last lane
      }
      if (e[u] != PAST_END) dest[i] = row;
      __syncwarp();  // the leader's update is visible before the next step reads run[]
    }
  }
}

// Dropped-id tallies of all lanes into acc[0] (count) and acc[1] (min index), both in smem.
__device__ __forceinline__ void reduce_bad(int bad, int first_bad, int* acc) {
  bad = __reduce_add_sync(FULL, bad);
  first_bad = __reduce_min_sync(FULL, first_bad);
  if (lane_id() == 0 && bad) {
    atomicAdd(&acc[0], bad);
    atomicMin(&acc[1], first_bad);
  }
}

// In-place exclusive scan of v[0, E) (smem) by the whole CTA; returns the total. tot: 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int* v, int E, int* tot) {
  const int nt = blockDim.x, tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int per = (E + nt - 1) / nt;
  const int lo = min(tid * per, E), hi = min(lo + per, E);
  int s = 0;
  for (int i = lo; i < hi; ++i) s += v[i];
  int x = s;  // inclusive scan over the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) tot[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int t = lane < (nt >> 5) ? tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(FULL, t, o);
      if (lane >= o) t += y;
    }
    tot[lane] = t;
  }
  __syncthreads();
  int run = x - s + (warp ? tot[warp - 1] : 0);
  const int total = tot[(nt >> 5) - 1];
  for (int i = lo; i < hi; ++i) {
    const int c = v[i];
    v[i] = run;
    run += c;
  }
  __syncthreads();
  return total;
}

// Offsets from the per-expert counts held in seg[] (smem; becomes the padded exclusive scan),
// the padding rows of every segment and every row past the total marked -1 in src.
__device__ __forceinline__ void write_offsets(int* seg, int* tot, int E, int pad_to, int capacity,
                                              int* __restrict__ offsets, int* __restrict__ src) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) seg[e] = (seg[e] + pad_to - 1) / pad_to * pad_to;
  __syncthreads();
  const int total = block_exclusive_scan(seg, E, tot);
  for (int e = threadIdx.x; e < E; e += blockDim.x) offsets[e] = seg[e];
  if (threadIdx.x == 0) offsets[E] = total;
  for (int r = total + threadIdx.x; r < capacity; r += blockDim.x) src[r] = -1;
}

template <int WARPS>
__device__ __forceinline__ void zero_hist(int* hist, int E, int* acc) {
  for (int k = threadIdx.x; k < WARPS * E; k += blockDim.x) hist[k] = 0;
  if (threadIdx.x == 0) {
    acc[0] = 0;
    acc[1] = INT_MAX_;
  }
  __syncthreads();
}

// smem of a layout CTA: hist [WARPS][E], seg [E], tot [32], acc [2] (bad count, first bad).
template <int WARPS>
struct Smem {
  int *hist, *seg, *tot, *acc;
  __device__ __forceinline__ explicit Smem(int* base, int E)
      : hist(base), seg(base + WARPS * E), tot(base + (WARPS + 1) * E), acc(tot + 32) {}
};

// MAXE: the most experts a launch of this CTA size takes; a thread owns experts
// tid + m * WARPS * 32 (m < EPT) and keeps their counts in registers.
template <typename IdT, int WARPS, int ITEMS, int MAXE>
__device__ __forceinline__ void layout_single(const IdT* __restrict__ ids, int n, int E, int pad_to,
                                              int capacity, int* __restrict__ counts,
                                              int* __restrict__ offsets, int* __restrict__ dest,
                                              int* __restrict__ src, int* __restrict__ invalid) {
  extern __shared__ int smem_raw[];
  Smem<WARPS> s(smem_raw, E);
  const int warp = threadIdx.x >> 5;
  zero_hist<WARPS>(s.hist, E, s.acc);
  int wlo, whi, bad = 0, first_bad = INT_MAX_;
  warp_span(0, n, WARPS, warp, wlo, whi);
  count_span<IdT, ITEMS>(ids, wlo, whi, E, s.hist + warp * E, bad, first_bad);
  reduce_bad(bad, first_bad, s.acc);
  __syncthreads();
  constexpr int EPT = (MAXE + WARPS * 32 - 1) / (WARPS * 32);
  int cnt[EPT];
#pragma unroll
  for (int m = 0; m < EPT; ++m) {  // warp bases within e; counts
    const int e = threadIdx.x + m * WARPS * 32;
    int c = 0;
    if (e < E) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const int h = s.hist[w * E + e];
        s.hist[w * E + e] = c;
        c += h;
      }
      counts[e] = c;
      s.seg[e] = c;
    }
    cnt[m] = c;
  }
  __syncthreads();
  write_offsets(s.seg, s.tot, E, pad_to, capacity, offsets, src);
#pragma unroll
  for (int m = 0; m < EPT; ++m) {  // padding rows; bases become rows
    const int e = threadIdx.x + m * WARPS * 32;
    if (e >= E) continue;
    const int start = s.seg[e], c = cnt[m];
#pragma unroll
    for (int w = 0; w < WARPS; ++w) s.hist[w * E + e] += start;
    for (int r = start + c; r < (start + (c + pad_to - 1) / pad_to * pad_to); ++r) src[r] = -1;
  }
  if (threadIdx.x == 0) {
    invalid[0] = s.acc[0];
    invalid[1] = s.acc[1];
  }
  __syncthreads();
  scatter_span<IdT, ITEMS>(ids, wlo, whi, E, s.hist + warp * E, dest, src);
}

// Multi-CTA pass A: CTA b counts pairs [b * chunk, (b + 1) * chunk) into
// bh[b][0, E) and its dropped ids into bh[b][E] (count), bh[b][E + 1] (first index).
template <typename IdT, int WARPS, int ITEMS>
__device__ __forceinline__ void layout_count(const IdT* __restrict__ ids, int n, int E, int chunk,
                                             int* __restrict__ bh) {
  extern __shared__ int smem_raw[];
  Smem<WARPS> s(smem_raw, E);
  const int warp = threadIdx.x >> 5;
  const int lo = blockIdx.x * chunk, hi = min(lo + chunk, n);
  zero_hist<WARPS>(s.hist, E, s.acc);
  int wlo, whi, bad = 0, first_bad = INT_MAX_;
  warp_span(lo, hi, WARPS, warp, wlo, whi);
  count_span<IdT, ITEMS>(ids, wlo, whi, E, s.hist + warp * E, bad, first_bad);
  reduce_bad(bad, first_bad, s.acc);
  __syncthreads();
  int* row = bh + (long long)blockIdx.x * (E + 2);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) c += s.hist[w * E + e];
    row[e] = c;
  }
  if (threadIdx.x == 0) {
    row[E] = s.acc[0];
    row[E + 1] = s.acc[1];
  }
}

// Multi-CTA scan (one CTA): bh[b][e] becomes the exclusive prefix over CTAs; counts, offsets,
// padding rows, invalid.
template <int WARPS, int MAXE>
__device__ __forceinline__ void layout_scan(int blocks, int E, int pad_to, int capacity,
                                            int* __restrict__ bh, int* __restrict__ counts,
                                            int* __restrict__ offsets, int* __restrict__ src,
                                            int* __restrict__ invalid) {
  extern __shared__ int smem_raw[];
  Smem<WARPS> s(smem_raw, E);
  if (threadIdx.x == 0) {
    s.acc[0] = 0;
    s.acc[1] = INT_MAX_;
  }
  __syncthreads();
  const long long stride = E + 2;
  constexpr int EPT = (MAXE + WARPS * 32 - 1) / (WARPS * 32);
  int cnt[EPT];
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = threadIdx.x + m * WARPS * 32;
    cnt[m] = 0;
    if (e >= E) continue;
    int c = 0;
    int* p = bh + e;
    int b = 0;
    for (; b + 4 <= blocks; b += 4) {  // four loads in flight
      const int h0 = p[b * stride], h1 = p[(b + 1) * stride], h2 = p[(b + 2) * stride],
                h3 = p[(b + 3) * stride];
      p[b * stride] = c;
      p[(b + 1) * stride] = c + h0;
      p[(b + 2) * stride] = c + h0 + h1;
      p[(b + 3) * stride] = c + h0 + h1 + h2;
      c += h0 + h1 + h2 + h3;
    }
    for (; b < blocks; ++b) {
      const int h = p[b * stride];
      p[b * stride] = c;
      c += h;
    }
    counts[e] = c;
    s.seg[e] = c;
    cnt[m] = c;
  }
  int bad = 0, first_bad = INT_MAX_;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    bad += bh[b * stride + E];
    first_bad = min(first_bad, bh[b * stride + E + 1]);
  }
  reduce_bad(bad, first_bad, s.acc);
  __syncthreads();
  write_offsets(s.seg, s.tot, E, pad_to, capacity, offsets, src);
#pragma unroll
  for (int m = 0; m < EPT; ++m) {
    const int e = threadIdx.x + m * WARPS * 32;
    if (e >= E) continue;
    const int start = s.seg[e], c = cnt[m];
    for (int r = start + c; r < start + (c + pad_to - 1) / pad_to * pad_to; ++r) src[r] = -1;
  }
  if (threadIdx.x == 0) {
    invalid[0] = s.acc[0];
    invalid[1] = s.acc[1];
  }
}

// Multi-CTA pass B: CTA b recounts its range per warp, then scatters from
// offsets[e] + bh[b][e] (+ the warps before it).
template <typename IdT, int WARPS, int ITEMS>
__device__ __forceinline__ void layout_scatter(const IdT* __restrict__ ids, int n, int E, int chunk,
                                               const int* __restrict__ bh,
                                               const int* __restrict__ offsets,
                                               int* __restrict__ dest, int* __restrict__ src) {
  extern __shared__ int smem_raw[];
  Smem<WARPS> s(smem_raw, E);
  const int warp = threadIdx.x >> 5;
  const int lo = blockIdx.x * chunk, hi = min(lo + chunk, n);
  zero_hist<WARPS>(s.hist, E, s.acc);
  int wlo, whi, bad = 0, first_bad = INT_MAX_;
  warp_span(lo, hi, WARPS, warp, wlo, whi);
  count_span<IdT, ITEMS>(ids, wlo, whi, E, s.hist + warp * E, bad, first_bad);
  __syncthreads();
  const int* row = bh + (long long)blockIdx.x * (E + 2);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = offsets[e] + row[e];
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const int h = s.hist[w * E + e];
      s.hist[w * E + e] = c;
      c += h;
    }
  }
  __syncthreads();
  scatter_span<IdT, ITEMS>(ids, wlo, whi, E, s.hist + warp * E, dest, src);
}

// -- fused layout + dispatch for small n (graph-safe route) --------------------------------
// One launch, no communication between CTAs. CTAs [0, side) are layout CTAs: each builds the
// histogram and the padded offsets of all n pairs; CTA 0 writes counts, offsets and invalid,
// layout CTA s zero-fills the padding rows of experts s, s + side, ... and a share of src's
// tail. Every later CTA is a copy CTA of np <= PMAX pairs [lo, lo + np): it issues the loads of
// its pairs' x rows first (their tokens are known before the layout), then computes only the
// rows of its own pairs from all n ids held in registers: row of pair p of expert ep = valid
// pairs ordered before it by (expert, index) (pad_to > 1: plus the padding of the lower experts,
// from a smem histogram); one block reduction, then the stores. dest / src of a pair are written
// by its copy CTA.
// Dynamic smem: hist [E], seg [E], tot [32], acc [2] (a copy CTA uses hist when pad_to > 1).

// The ids of thread tid: pairs (c * THREADS + tid) * VEC + u, u < VEC, as raw 16-byte vectors
// (one 16-byte load each when ids is 16-byte aligned and the vector lies below n). Loads only:
// the first use waits, so callers issue every other independent load before ids_to_experts.
template <typename IdT, int THREADS, int NV>
__device__ __forceinline__ void load_ids(const IdT* __restrict__ ids, int n, uint4 (&raw)[NV]) {
  constexpr int VEC = 16 / sizeof(IdT);
  const bool vec = (reinterpret_cast<unsigned long long>(ids) & 15) == 0;
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int i0 = (c * THREADS + (int)threadIdx.x) * VEC;
    if (vec && i0 + VEC <= n) {
      raw[c] = __ldg(reinterpret_cast<const uint4*>(ids + i0));
    } else {
      IdT v[VEC];
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[u] = i0 + u < n ? ids[i0 + u] : IdT(0);
      if constexpr (VEC == 4) {
        raw[c] = make_uint4((unsigned)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3]);
      } else {
        raw[c] = make_uint4((unsigned)v[0], (unsigned)((unsigned long long)v[0] >> 32),
                            (unsigned)v[1], (unsigned)((unsigned long long)v[1] >> 32));
      }
    }
  }
}

// e[c * VEC + u]: the expert of pair (c * THREADS + tid) * VEC + u (PAST_END past n, DROPPED
// outside [0, E); an int64 id is range-checked before it is narrowed).
template <typename IdT, int THREADS, int NV>
__device__ __forceinline__ void ids_to_experts(const uint4 (&raw)[NV], int n, int E,
                                               int (&e)[NV * 16 / sizeof(IdT)]) {
  constexpr int VEC = 16 / sizeof(IdT);
#pragma unroll
  for (int c = 0; c < NV; ++c) {
    const int i0 = (c * THREADS + (int)threadIdx.x) * VEC;
    long long v[VEC];
    if constexpr (VEC == 4) {
      v[0] = (int)raw[c].x, v[1] = (int)raw[c].y, v[2] = (int)raw[c].z, v[3] = (int)raw[c].w;
    } else {
      v[0] = (long long)(((unsigned long long)raw[c].y << 32) | raw[c].x);
      v[1] = (long long)(((unsigned long long)raw[c].w << 32) | raw[c].z);
    }
#pragma unroll
    for (int u = 0; u < VEC; ++u)
      e[c * VEC + u] = i0 + u >= n ? PAST_END : (v[u] >= 0 && v[u] < E) ? (int)v[u] : DROPPED;
  }
}

// Layout CTA s of `side`: histogram, padded offsets; counts / offsets / invalid (s = 0), padding
// rows of its experts (src = -1, x_perm rows zero), its share of src[total, capacity) = -1.
template <typename IdT, int THREADS, int MAXN>
__device__ __forceinline__ void route_layout(const IdT* __restrict__ ids, int n, int E, int pad_to,
                                             int capacity, int side, uint4* __restrict__ xp,
                                             int vpr, int* __restrict__ counts,
                                             int* __restrict__ offsets, int* __restrict__ src,
                                             int* __restrict__ invalid) {
  constexpr int PER = MAXN / THREADS;
  constexpr int VEC = 16 / sizeof(IdT);
  extern __shared__ int smem_raw[];
  int* hist = smem_raw;
  int* seg = hist + E;
  int* tot = seg + E;
  int* acc = tot + 32;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5, s = blockIdx.x;
  uint4 raw[PER / VEC];
  load_ids<IdT, THREADS, PER / VEC>(ids, n, raw);
  for (int k = tid; k < E; k += THREADS) hist[k] = 0;
  if (tid == 0) {
    acc[0] = 0;
    acc[1] = INT_MAX_;
  }
  int e[PER];
  ids_to_experts<IdT, THREADS, PER / VEC>(raw, n, E, e);
  __syncthreads();
  int bad = 0, first_bad = INT_MAX_;
#pragma unroll
  for (int c = 0; c < PER / VEC; ++c) {
    if ((c * THREADS + warp * 32) * VEC >= n) continue;  // warp-uniform: past n for every lane
#pragma unroll
    for (int u = 0; u < VEC; ++u) {
      const int eu = e[c * VEC + u];
      const unsigned peers = __match_any_sync(FULL, eu);
      if (eu >= 0 && lane == 31 - __clz(peers)) atomicAdd(&hist[eu], __popc(peers));
      if (eu == DROPPED) {
        ++bad;
        first_bad = min(first_bad, (c * THREADS + tid) * VEC + u);
      }
    }
  }
  reduce_bad(bad, first_bad, acc);
  __syncthreads();
  for (int k = tid; k < E; k += THREADS) seg[k] = (hist[k] + pad_to - 1) / pad_to * pad_to;
  __syncthreads();
  const int total = block_exclusive_scan(seg, E, tot);  // seg = offsets; ends with a barrier
  if (s == 0) {
    for (int k = tid; k < E; k += THREADS) {
      counts[k] = hist[k];
      offsets[k] = seg[k];
    }
    if (tid == 0) {
      offsets[E] = total;
      invalid[0] = acc[0];
      invalid[1] = acc[1];
    }
  }
  if (pad_to > 1) {
    for (int x_e = s; x_e < E; x_e += side) {  // padding rows of my experts
      const int start = seg[x_e] + hist[x_e];
      const int end = seg[x_e] + (hist[x_e] + pad_to - 1) / pad_to * pad_to;
      for (int r = start; r < end; ++r) {
        if (tid == 0) src[r] = -1;
        for (int v = tid; v < vpr; v += THREADS) xp[(long long)r * vpr + v] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  for (int r = total + s * THREADS + tid; r < capacity; r += side * THREADS) src[r] = -1;
}

// Position of a copy CTA thread's item (pair q of the CTA, 16-byte column v) and the token of
// pair lo + q (tok, rem = (lo + q) / top_k, (lo + q) % top_k), advanced without divisions.
struct RouteItem {
  int q, v, tok, rem;
  __device__ __forceinline__ void next_pair(int top_k) {
    ++q;
    if (++rem == top_k) {
      rem = 0;
      ++tok;
    }
  }
  __device__ __forceinline__ void advance(int step, int vpr, int top_k) {
    v += step;
    while (v >= vpr) {
      v -= vpr;
      next_pair(top_k);
    }
  }
};

// Row of the CTA's pair q from the warps' shares (-1: a dropped id).
template <int PMAX, int WARPS>
__device__ __forceinline__ int route_row(int q, const int* s_ep, const int (*red)[WARPS]) {
  if (s_ep[q] < 0) return -1;
  int r = 0;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) r += red[q][w];
  return r;
}

template <typename IdT, int THREADS, int MAXN, int UNROLL, int PMAX>
__device__ __forceinline__ void route_copy(const IdT* __restrict__ ids, int n, int E, int pad_to,
                                           int lo, int np, const uint4* __restrict__ x,
                                           uint4* __restrict__ xp, int vpr, int top_k,
                                           int* __restrict__ dest, int* __restrict__ src) {
  constexpr int PER = MAXN / THREADS;
  constexpr int VEC = 16 / sizeof(IdT);
  constexpr int WARPS = THREADS / 32;
  __shared__ int red[PMAX][WARPS];  // per pair: each warp's share of its row
  __shared__ int s_ep[PMAX];  // expert of each pair (DROPPED: no row)
  extern __shared__ int smem_raw[];
  int* hist = smem_raw;  // pad_to > 1
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  // 1. the loads of this thread's first UNROLL items (tokens are known before the layout)
  RouteItem it;
  it.q = vpr > 0 ? tid / vpr : np;  // vpr = 0 (H = 0): no items
  it.v = vpr > 0 ? tid - it.q * vpr : 0;
  it.tok = (lo + it.q) / top_k;
  it.rem = lo + it.q - it.tok * top_k;
  const RouteItem first = it;
  uint4 buf[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (it.q < np) {
      buf[u] = __ldg(x + (long long)it.tok * vpr + it.v);
      it.advance(THREADS, vpr, top_k);
    }
  }
  // 2. all ids and the ids of my pairs, then their first use
  uint4 raw[PER / VEC];
  load_ids<IdT, THREADS, PER / VEC>(ids, n, raw);
  IdT epr[PMAX];
#pragma unroll
  for (int q = 0; q < PMAX; ++q) epr[q] = q < np ? ids[lo + q] : IdT(-1);
  int e[PER];
  ids_to_experts<IdT, THREADS, PER / VEC>(raw, n, E, e);
  int ep[PMAX];
#pragma unroll
  for (int q = 0; q < PMAX; ++q) ep[q] = (epr[q] >= 0 && epr[q] < E) ? (int)epr[q] : DROPPED;
  if (pad_to > 1) {
    for (int k = tid; k < E; k += THREADS) hist[k] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if (e[j] >= 0) atomicAdd(&hist[e[j]], 1);
    __syncthreads();
  }
  if (tid == 0) {
#pragma unroll
    for (int q = 0; q < PMAX; ++q)
      if (q < np) s_ep[q] = ep[q];
  }
#pragma unroll
  for (int q = 0; q < PMAX; ++q) {
    if (q >= np) break;  // uniform
    const int eq = ep[q], pq = lo + q;
    int c = 0;
    if (eq >= 0) {
#pragma unroll
      for (int cc = 0; cc < PER / VEC; ++cc) {
        if (cc * THREADS * VEC >= n) break;  // uniform
#pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const int j = cc * VEC + u, i = (cc * THREADS + tid) * VEC + u;
          // pad_to == 1: valid pairs of lower experts; always: pairs of eq before pq
          c += (pad_to == 1 && (unsigned)e[j] < (unsigned)eq) + (e[j] == eq && i < pq);
        }
      }
      if (pad_to > 1)
        for (int k = tid; k < eq; k += THREADS) c += (hist[k] + pad_to - 1) / pad_to * pad_to;
    }
    c = __reduce_add_sync(FULL, c);
    if (lane == 0) red[q][warp] = c;
  }
  __syncthreads();
  if (tid < np) {
    const int row = route_row<PMAX, WARPS>(tid, s_ep, red);
    dest[lo + tid] = row;
    if (row >= 0) src[row] = lo + tid;
  }
  it = first;
  int cur_q = -1, row = -1;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (it.q < np) {
      if (it.q != cur_q) {
        cur_q = it.q;
        row = route_row<PMAX, WARPS>(cur_q, s_ep, red);
      }
      if (row >= 0) xp[(long long)row * vpr + it.v] = buf[u];
      it.advance(THREADS, vpr, top_k);
    }
  }
  while (it.q < np) {  // items past the first UNROLL: UNROLL loads in flight, then the stores
    const RouteItem base = it;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (it.q < np) {
        buf[u] = __ldg(x + (long long)it.tok * vpr + it.v);
        it.advance(THREADS, vpr, top_k);
      }
    }
    it = base;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (it.q < np) {
        if (it.q != cur_q) {
          cur_q = it.q;
          row = route_row<PMAX, WARPS>(cur_q, s_ep, red);
        }
        if (row >= 0) xp[(long long)row * vpr + it.v] = buf[u];
        it.advance(THREADS, vpr, top_k);
      }
    }
  }
}

template <typename IdT, int THREADS, int MAXN, int UNROLL, int PMAX>
__device__ __forceinline__ void route_fused(const IdT* __restrict__ ids, int n, int E, int pad_to,
                                            int capacity, int pairs_per_cta, int side,
                                            const uint4* __restrict__ x, uint4* __restrict__ xp,
                                            int vpr, int top_k, int* __restrict__ counts,
                                            int* __restrict__ offsets, int* __restrict__ dest,
                                            int* __restrict__ src, int* __restrict__ invalid) {
  if ((int)blockIdx.x < side) {
    route_layout<IdT, THREADS, MAXN>(ids, n, E, pad_to, capacity, side, xp, vpr, counts, offsets,
                                     src, invalid);
    return;
  }
  const int lo = ((int)blockIdx.x - side) * pairs_per_cta;
  route_copy<IdT, THREADS, MAXN, UNROLL, PMAX>(ids, n, E, pad_to, lo, min(pairs_per_cta, n - lo),
                                               x, xp, vpr, top_k, dest, src);
}

// -- phase 2: x_perm[r] = x[src[r] / top_k] (padding rows zero), rows of vpr 16-byte vectors --
// A CTA moves one row at a time (grid-stride over rows): each thread issues its UNROLL loads
// before its stores. Plain (non-volatile) __ldg so that the guarded loads become predicated
// instructions the compiler can batch.
template <int THREADS, int UNROLL>
__device__ __forceinline__ void dispatch_rows(const uint4* __restrict__ x, uint4* __restrict__ xp,
                                              const int* __restrict__ src,
                                              const int* __restrict__ total_rows, int vpr,
                                              int top_k) {
  const int total = *total_rows;  // offsets[E]: rows past it are left as they are
  for (int r = blockIdx.x; r < total; r += gridDim.x) {
    const int s = src[r];
    uint4* o = xp + (long long)r * vpr;
    const uint4* in = x + (long long)(s < 0 ? 0 : s / top_k) * vpr;
    for (int v0 = threadIdx.x; v0 < vpr; v0 += THREADS * UNROLL) {
      uint4 buf[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int v = v0 + u * THREADS;
        buf[u] = (s >= 0 && v < vpr) ? __ldg(in + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (v0 + u * THREADS < vpr) o[v0 + u * THREADS] = buf[u];
    }
  }
}

// -- combine: out[t] = sum_j w[t, j] * y[dest[t * top_k + j]], fp32, j in order, no FMA ------
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t u);
template <> __device__ __forceinline__ float2 unpack2<half>(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Two launch shapes, chosen by the host (kernelgen/moe_routing/api.py, measured on an H100):
// combine_token: a CTA per token (grid-stride over tokens), threads loop over the 16-byte
// columns; combine_split (tiny batches): grid.y splits the columns, a thread owns one column of
// a token and loads the GROUP slots' vectors before accumulating them in slot order. rows
// bounds y (dest < rows always holds for a layout's own y_perm; the guard keeps a short y from
// being read out of bounds).
template <typename T>
__device__ __forceinline__ void accumulate(float (&acc)[8], float wj, const uint4& q) {
  const uint32_t word[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = unpack2<T>(word[k]);
    acc[2 * k] = __fadd_rn(acc[2 * k], __fmul_rn(wj, f.x));
    acc[2 * k + 1] = __fadd_rn(acc[2 * k + 1], __fmul_rn(wj, f.y));
  }
}

// (a, b) as two scalar conversions: the same values as kg::pack2's paired conversion, but
// other code on sm_100a / sm_120a (kept so this kernel's SASS did not change).
template <typename T> __device__ __forceinline__ uint32_t pack2_scalar(float a, float b) {
  const T lo = from_float<T>(a), hi = from_float<T>(b);
  return (uint32_t)(*reinterpret_cast<const uint16_t*>(&lo)) |
         ((uint32_t)(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&acc)[8]) {
  return make_uint4(pack2_scalar<T>(acc[0], acc[1]), pack2_scalar<T>(acc[2], acc[3]),
                    pack2_scalar<T>(acc[4], acc[5]), pack2_scalar<T>(acc[6], acc[7]));
}

template <typename T, typename W, int THREADS>
__device__ __forceinline__ void combine_token(const uint4* __restrict__ y, int rows,
                                              const int* __restrict__ dest, const W* __restrict__ w,
                                              uint4* __restrict__ out, int tokens, int top_k,
                                              int vpr) {
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int* d = dest + (long long)t * top_k;
    const W* wt = w + (long long)t * top_k;
    for (int v = threadIdx.x; v < vpr; v += THREADS) {
      float acc[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = 0.f;
#pragma unroll 4
      for (int j = 0; j < top_k; ++j) {
        const int r = d[j];
        if (r < 0 || r >= rows) continue;  // a dropped id (-1) contributes nothing
        accumulate<T>(acc, to_float<W>(wt[j]), ld_nc_v4(y + (long long)r * vpr + v));
      }
      const uint4 o = pack8<T>(acc);
      st_v4(out + (long long)t * vpr + v, o.x, o.y, o.z, o.w);
    }
  }
}

template <typename T, typename W, int THREADS>
__device__ __forceinline__ void combine_split(const uint4* __restrict__ y, int rows,
                                              const int* __restrict__ dest, const W* __restrict__ w,
                                              uint4* __restrict__ out, int tokens, int top_k,
                                              int vpr) {
  constexpr int GROUP = 8;
  const int v = blockIdx.y * THREADS + threadIdx.x;
  if (v >= vpr) return;  // no barriers below
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int* d = dest + (long long)t * top_k;
    const W* wt = w + (long long)t * top_k;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = 0.f;
    for (int j0 = 0; j0 < top_k; j0 += GROUP) {
      uint4 q[GROUP];
      float wj[GROUP];
      bool ok[GROUP];
#pragma unroll
      for (int u = 0; u < GROUP; ++u) {
        const int j = j0 + u;
        const int r = j < top_k ? __ldg(d + j) : -1;
        ok[u] = r >= 0 && r < rows;  // a dropped id (-1) contributes nothing
        wj[u] = ok[u] ? to_float<W>(wt[j]) : 0.f;
        q[u] = ok[u] ? __ldg(y + (long long)r * vpr + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < GROUP; ++u)
        if (ok[u]) accumulate<T>(acc, wj[u], q[u]);
    }
    out[(long long)t * vpr + v] = pack8<T>(acc);
  }
}

}  // namespace kg::moe_routing
