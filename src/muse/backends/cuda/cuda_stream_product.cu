// The streamed ring product (variant 15 and the rule's grouped calls at
// 1..8 rows): the ring kernel's arithmetic with its work cut into equal
// shares of the blocks the GPU holds at once.
//
// Why: the ring gives each 16-row weight tile its own block, so a call
// whose tiles are a little more than the GPU holds runs a second, almost
// empty wave (Glimmer's Q/K/V/gate: 544 tiles against 528 slots), and
// every block ramps up and drains its ring once per tile. Here block b of B
// takes granule rounds [b·W/B, (b+1)·W/B) of the W rounds of all the
// call's tiles in a row (a round: granules 4r .. 4r + 3 of a tile, one a
// K-slice warp), streaming them through one ring without draining it
// between tiles: every block reads the same bytes, and the last block ends
// with the others.
//
// The bits are the ring's (cuda_mma.cuh): warp s of a tile accumulates its
// granules s, s + 4, ... in order from 0.0f, the slices are added
// 0 + 1 + 2 + 3 and stored as ring_tile stores them. A tile cut between
// blocks b - 1 and b is one accumulation handed on: block b - 1 runs the
// tile's first rounds, writes each warp's fp32 accumulators (the values,
// not a sum of partials) and raises the boundary's flag; block b waits for
// it, loads them and continues with the same mma chain. A block takes its
// tiles last to first, so the tile it continues is its last work and the
// tile it hands on is its first: the flag it waits for was raised long
// before (B is at most the tile count, so no block lies inside one tile).
// The waiting block's predecessor has a lower index, so it was scheduled
// first; and the consumer lowers the flag again, so a recorded step
// replays with the flags as it found them.
#include <algorithm>

#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

constexpr int kStreamStages = 4;  // the rule's: 64 KB of ring a block, three blocks an SM
constexpr size_t kStreamHandoffFloats = size_t(kSplit) * 32 * 4;  // a tile's accumulators: 4 warps × 32 lanes × 4

template <int STAGES>
constexpr size_t stream_smem_bytes() {
  return size_t(kSplit) * STAGES * 256 * sizeof(uint4) + size_t(kSplit - 1) * 4 * 32 * sizeof(float);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <int STAGES>
__global__ void __launch_bounds__(32 * kSplit)
    stream_ring_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, int64_t K, const ClusterGroup grp,
                       int64_t rounds, int64_t R, float* __restrict__ handoff, unsigned* __restrict__ flags) {
  extern __shared__ uint4 ring[];
  const int s = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t b = blockIdx.x, B = gridDim.x;
  const int64_t lo = rounds * b / B, hi = rounds * (b + 1) / B;  // this block's rounds
  if (hi <= lo) {
    pdl_wait();  // every block waits before it leaves (this grid ends after the one before)
    return;
  }
  const int64_t tf = lo / R, tl = (hi - 1) / R;  // its tiles, taken tl down to tf
  const int64_t ngran = (K + kGranule - 1) / kGranule;
  const int64_t wrounds = s < ngran ? (ngran - s + kSplit - 1) / kSplit : 0;  // rounds with a granule of warp s
  const int64_t kmine = K - 8 * tq;
  const __nv_bfloat16* xr = x + (g < T ? g : T - 1) * K + 8 * tq;
  const bool xok = g < T;
  // Tile t's rounds in this block, and warp s's granules among them.
  auto r_begin = [&](int64_t t) { return t == tf ? lo - t * R : int64_t(0); };
  auto r_end = [&](int64_t t) { return t == tl ? hi - t * R : R; };
  auto loads = [&](int64_t t) {
    const int64_t a = r_begin(t), e = std::min(r_end(t), wrounds);
    return e > a ? e - a : int64_t(0);
  };
  // Weight rows g and g + 8 of tile t, offset by 8·(lane % 4).
  auto tile_rows = [&](int64_t t, const __nv_bfloat16* (&wr)[2], bool (&wok)[2]) {
    const int j = group_product(grp, t);
    const int64_t n0 = (t - (j ? grp.tile_end[j - 1] : 0)) * 16, N = grp.n[j];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + g + 8 * h;
      wok[h] = n < N;
      wr[h] = grp.w[j] + (n < N ? n : N - 1) * K + 8 * tq;
    }
  };
  uint4* my = ring + size_t(s) * STAGES * 256;
  // The issue cursor: tile it, round ir; its weight rows.
  int64_t it = tl, ir = r_begin(tl), left = loads(tl);
  while (left == 0 && it > tf) --it, ir = r_begin(it), left = loads(it);
  const __nv_bfloat16* iw[2];
  bool iok[2];
  tile_rows(it, iw, iok);
  auto issue = [&](int64_t i) {  // load i of this warp (the cursor's), then advance the cursor
    const int64_t k0 = (int64_t(s) + ir * kSplit) * kGranule;
    copy_granule(my + (i % STAGES) * 256, iw, iok, k0, kmine, lane);
    ++ir;
    if (--left == 0) {
      while (left == 0 && it > tf) --it, ir = r_begin(it), left = loads(it);
      if (left > 0) tile_rows(it, iw, iok);
    }
  };
  int64_t issued = 0;
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (left > 0) issue(issued++);
    cp_async_commit();
  }
  pdl_wait();  // x comes from the kernel before (the weights do not)
  uint4* part = ring + size_t(kSplit) * STAGES * 256;  // the slices' partials (the ring keeps streaming)
  const uint4 zero = make_uint4(0, 0, 0, 0);
  int64_t used = 0;
  for (int64_t t = tl; t >= tf; --t) {
    const int64_t rb = r_begin(t), re = r_end(t);
    float acc[1][1][4] = {};
    if (rb > 0) {  // the tile's first rounds were block b - 1's: its accumulators
      if (threadIdx.x == 0)
        while (ld_acquire(flags + b) == 0) __nanosleep(64);
      __syncthreads();
      const float* h = handoff + size_t(b) * kStreamHandoffFloats + (size_t(s) * 32 + lane) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][0][i] = __ldcg(h + i);
      __syncthreads();
      if (threadIdx.x == 0) flags[b] = 0;  // for the next launch (which starts after this grid ends)
    }
    const int64_t n = loads(t);
    for (int64_t q = 0; q < n; ++q, ++used) {
      cp_async_wait<STAGES - 2>();
      if (left > 0) issue(issued++);
      cp_async_commit();
      const int64_t k0 = (int64_t(s) + (rb + q) * kSplit) * kGranule;
      const uint4* slot = my + (used % STAGES) * 256;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 bv = xok && k0 + 32 * j < kmine ? __ldg(reinterpret_cast<const uint4*>(xr + k0 + 32 * j)) : zero;
        const uint4 a0 = slot[(j * 2) * 32 + lane], a1 = slot[(j * 2 + 1) * 32 + lane];
        mma16816(acc[0][0], a0.x, a1.x, a0.y, a1.y, bv.x, bv.y);
        mma16816(acc[0][0], a0.z, a1.z, a0.w, a1.w, bv.z, bv.w);
      }
    }
    if (t == tf) pdl_streaming_done();
    if (re < R) {  // the tile goes on in block b + 1: hand the accumulators on
      float* h = handoff + size_t(b + 1) * kStreamHandoffFloats + (size_t(s) * 32 + lane) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) __stcg(h + i, acc[0][0][i]);
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) st_release(flags + b + 1, 1u);
      continue;
    }
    // The tile ends here: the ring's reduction (its leading barrier also
    // keeps the next tile's partials from warp 0's reads of these), stored
    // as ring_tile stores.
    const int j = group_product(grp, t);
    const int64_t n0 = (t - (j ? grp.tile_end[j - 1] : 0)) * 16;
    ring_reduce<1, 1>(part, s, lane, acc, [&](int, int, int i, float v) {
      const int64_t nn = n0 + g + 8 * (i >> 1), tt = 2 * tq + (i & 1);
      if (nn < grp.n[j] && tt < T) st(grp.out[j], grp.odt[j], tt * grp.ldo[j] + nn, v);
    });
  }
  cp_async_wait<0>();
}

// The blocks of stream_ring_kernel<S> the GPU holds at once (0: none).
template <int S>
int stream_held() {
  return resident_blocks<stream_ring_kernel<S>>(32 * kSplit, stream_smem_bytes<S>());
}
int stream_held(int stages) {
  switch (stages) {
    case 2: return stream_held<2>();
    case 3: return stream_held<3>();
    case 4: return stream_held<4>();
    case 5: return stream_held<5>();
  }
  return 0;
}

template <int S>
cudaError_t launch_stream(cudaStream_t s, unsigned B, const __nv_bfloat16* x, int64_t T, int64_t K,
                          const ClusterGroup& grp, int64_t W, int64_t R, const StreamSync& sy) {
  return launch_pdl<stream_ring_kernel<S>>(s, dim3(B), dim3(32 * kSplit), stream_smem_bytes<S>(), x, T, K, grp, W, R,
                                           sy.handoff, sy.flags);
}

}  // namespace

Status stream_sync_create(StreamSync& sy, int stages) {
  if (stages == 0) stages = kStreamStages;
  if (stages < 2 || stages > 5)
    return make_error("cuda backend: stream_stages is 2..5 (0: the rule's " + std::to_string(kStreamStages) +
                      "), not " + std::to_string(stages));
  if (sy.slots > 0 || !mma_gemv_built()) return Status::Ok();
  const int rule = stream_held(kStreamStages), held = stream_held(stages);
  if (rule <= 0 || held <= 0) return Status::Ok();  // the rule keeps the ring
  const int slots = std::max(rule, held) + 1;
  if (cudaMalloc(&sy.handoff, size_t(slots) * kStreamHandoffFloats * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&sy.flags, size_t(slots) * sizeof(unsigned)) != cudaSuccess ||
      cudaMemset(sy.flags, 0, size_t(slots) * sizeof(unsigned)) != cudaSuccess) {
    cudaGetLastError();
    stream_sync_free(sy);
    return make_error("stream product: out of GPU memory for its " + std::to_string(slots) + " boundaries");
  }
  sy.slots = slots;
  sy.stages = stages;
  sy.rule_blocks = rule;
  sy.launch_blocks = held;
  return Status::Ok();
}

void stream_sync_free(StreamSync& sy) {
  if (sy.handoff) cudaFree(sy.handoff);
  if (sy.flags) cudaFree(sy.flags);
  sy = StreamSync{};
}

cudaError_t launch_stream_product(cudaStream_t s, const StreamSync& sy, const Tensor& x, std::span<const Tensor> ws,
                                  std::span<const Tensor> outs) {
  const int64_t T = x.rows(), K = x.cols();
  const ClusterGroup grp = make_cluster_group(ws, outs, 16);
  if (grp.count == 0 || T < 1 || T > 8 || sy.blocks() <= 0) return cudaErrorInvalidValue;
  const int64_t R = ((K + kGranule - 1) / kGranule + kSplit - 1) / kSplit;  // rounds a tile
  const unsigned B = unsigned(std::min<int64_t>(grp.tiles_n, sy.launch_blocks));  // never more blocks than tiles
  const auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  const int64_t W = grp.tiles_n * R;
  switch (sy.stages) {
    case 2: return launch_stream<2>(s, B, xp, T, K, grp, W, R, sy);
    case 3: return launch_stream<3>(s, B, xp, T, K, grp, W, R, sy);
    case 5: return launch_stream<5>(s, B, xp, T, K, grp, W, R, sy);
    default: return launch_stream<kStreamStages>(s, B, xp, T, K, grp, W, R, sy);
  }
}

}  // namespace muse::cuda
