// What the experts' grouped GEMMs share (cuda_moe_wgmma.cu: BF16 weights;
// cuda_quant_wgmma.cu: NVFP4 / MXFP4 / FP8 codes decoded in registers): which
// tile a cluster computes, and the K-slices' partials added across the
// cluster for a finish that is not a plain store. Only for code built for
// sm_90a.
#pragma once

#include "muse/backends/cuda/cuda_wgmma_tile.cuh"

namespace muse::cuda {

// What one cluster computes: pairs g0 .. g0 + rows − 1 (one expert) against
// weight tile wt. Clusters are numbered expert by expert; within an expert,
// weight tile by weight tile, and within that its pair tiles, so the tiles
// of one expert read each weight tile at nearly the same time (once from
// HBM) and its activation rows stay in L2.
struct MoeTile {
  int e, wt;
  int64_t g0;
  int rows;
};
template <int NX>
__device__ __forceinline__ bool moe_tile(const int32_t* starts, const int32_t* tile_starts, int E, int tn,
                                         int64_t c, MoeTile& t) {
  if (c >= int64_t(tn) * tile_starts[E]) return false;
  int lo = 0, hi = E - 1;  // the last e with tn · tile_starts[e] <= c (its tiles are not empty)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (int64_t(tn) * tile_starts[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  const int64_t nb = tile_starts[lo + 1] - tile_starts[lo], local = c - int64_t(tn) * tile_starts[lo];
  t.e = lo;
  t.wt = int(local / nb);
  t.g0 = starts[lo] + (local % nb) * NX;
  t.rows = int(min(int64_t(NX), int64_t(starts[lo + 1]) - t.g0));
  return true;
}

// A finish's share of a tile: block s of the cluster takes activation rows
// s·NX/4 .. of the tile and QUADS quads (4 weight rows) of each; quad e of
// the block (e = thread + j·kWgThreads) is row s·NX/4 + e / QUADS, weight
// rows 4·(e % QUADS) + 64·part (part 1: gate/up's up rows).
template <int NX, int QUADS>
struct MoeQuads {
  static constexpr int kRowsEach = NX / kSplit, kTotal = kRowsEach * QUADS, kEach = kTotal / kWgThreads;
  static_assert(kTotal % kWgThreads == 0, "whole quads a thread");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The four K-slices' partials of this block's quads, P0 + P1 + P2 + P3 (the
// decode kernels' order), into v[part][j]. Ends with the cluster barrier's
// arrive: the caller stores its sums, then calls cluster_wait() (no block
// may leave while another reads its partial). PAIRED: wg_store_partial's.
template <int NX, int QUADS, int PARTS, bool PAIRED = false>
__device__ __forceinline__ void moe_cluster_quads(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                                  float4 (&v)[PARTS][MoeQuads<NX, QUADS>::kEach]) {
  using Q = MoeQuads<NX, QUADS>;
  __syncthreads();  // the stages become this block's partial
  wg_store_partial<NX, PAIRED>(d, part_base);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's partial is in its shared memory
  const int tid = int(threadIdx.x);
  const float* part = reinterpret_cast<const float*>(part_base);
  const float* parts[kSplit];
#pragma unroll
  for (int q = 0; q < kSplit; ++q) parts[q] = cluster.map_shared_rank(part, q);
  int at[Q::kEach];
#pragma unroll
  for (int j = 0; j < Q::kEach; ++j) {
    const int e = tid + j * kWgThreads;
    at[j] = (s * Q::kRowsEach + e / QUADS) * kWgPartStride + 4 * (e % QUADS);
#pragma unroll
    for (int p = 0; p < PARTS; ++p) v[p][j] = *reinterpret_cast<const float4*>(parts[0] + at[j] + 64 * p);
  }
#pragma unroll
  for (int q = 1; q < kSplit; ++q)
#pragma unroll
    for (int j = 0; j < Q::kEach; ++j)
#pragma unroll
      for (int p = 0; p < PARTS; ++p) {
        const float4 o = *reinterpret_cast<const float4*>(parts[q] + at[j] + 64 * p);
        v[p][j].x = __fadd_rn(v[p][j].x, o.x), v[p][j].y = __fadd_rn(v[p][j].y, o.y);
        v[p][j].z = __fadd_rn(v[p][j].z, o.z), v[p][j].w = __fadd_rn(v[p][j].w, o.w);
      }
  cluster_arrive();  // every partial this block adds is in its registers
}
#endif

// a = bf16(silu(γ) · υ), the per-tile kernels' expression, as the low half
// of a word. (Packed through __nv_bfloat162 and memcpy, the fourth element
// of each quad came out wrong on the H100 — a value of another thread's
// quad — while the same sums stored as floats were right: 2026-12-06. The
// halves are put together as integers and stored as whole words.)
__device__ __forceinline__ uint32_t moe_silu_mul(float g, float u) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u)));
}

}  // namespace muse::cuda
