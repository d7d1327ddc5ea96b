// The prefill GEMM with all of K in one block (variants 17-19, sm_90a).
//
// Why: the 256-row prefill GEMM (cuda_wgmma_gemm.cu) has a cluster of four
// blocks compute each tile, one K-slice a block, and adds the four partials
// through distributed shared memory. That costs every tile a fixed ~10
// units of 64 k (the pipeline's fill, the partials through shared memory,
// two cluster barriers, the cluster's exit) against 26 units of work on
// Glimmer's q/k/v/gate and gate/up products: they ran at 59-60% of the bf16
// rate, the 78-unit down product at 73% (ncu, bench/NOTES.md 2026-12-05).
//
// The bits. An output is ((P0 + P1) + P2) + P3, P_s the chain of k16 steps
// of K-slice s from 0.0f (cuda_wgmma_gemm.cu's header). Here one block runs
// the four slices in turn: slice 0 into the accumulators d, each later slice
// into a second set e from 0.0f, then d = d + e, the cluster's adds in the
// cluster's order (an empty slice adds +0.0f there too). The k16 steps and
// their operands are the other wgmma kernels': the same bits.
//
// The tile is 128 weight × 128 activation rows (two sets of 64 accumulators
// a thread fit; 256 rows would not), so alone it would move 32 KB a unit
// from L2 for half the flops of the 256-row tile's 48 KB. A cluster of CW
// weight tiles × CT activation tiles shares both operands by TMA multicast:
// the CT blocks of a weight tile each copy 128 / CT of its rows into all of
// them, the CW blocks of an activation tile 128 / CW of its rows. At 2 × 2
// a block moves 16 KB a unit (the 256-row tile: 24 KB per 128 × 128).
#include <cooperative_groups.h>

#include "muse/backends/cuda/cuda_wgmma_stage.cuh"

namespace muse::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kFkNX = 128;     // activation rows a tile
constexpr int kFkStages = 6;   // of 32 KB
constexpr uint32_t kFkStage = uint32_t(wg_stage_bytes<kFkNX>());
constexpr size_t kFkSmem = size_t(kFkStages) * kFkStage + 1024;

struct FkTile {
  int64_t t0, n0, N;
  int j;
};

// Cluster c computes weight tiles CW·i .. CW·i + CW - 1 × activation tiles
// CT·m .. CT·m + CT - 1, in groups of t_group activation tile rows (of CT
// tiles) so a group's x stays in L2 while the weights stream past it; block
// (cw, ct) of it one tile. Spare blocks past the last weight tile load that
// tile again and store nothing (N = 0); activation rows past T are zeros
// and not stored.
template <int CW, int CT>
__device__ __forceinline__ FkTile fk_tile(const ClusterGroup& grp, int64_t T, int64_t t_group, int cw, int ct) {
  const int64_t cl = blockIdx.x / (CW * CT);
  const int64_t rows_t = (T + kFkNX * CT - 1) / (kFkNX * CT), cols_n = (grp.tiles_n + CW - 1) / CW;
  const int64_t per_group = t_group * cols_n;
  const int64_t first_t = (cl / per_group) * t_group;
  const int64_t group_size = rows_t - first_t < t_group ? rows_t - first_t : t_group;
  const int64_t want = ((cl % per_group) / group_size) * CW + cw;
  const int64_t nt = want < grp.tiles_n ? want : grp.tiles_n - 1;
  FkTile tl;
  tl.t0 = ((first_t + (cl % per_group) % group_size) * CT + ct) * kFkNX;
  tl.j = group_product(grp, nt);
  tl.N = want < grp.tiles_n ? grp.n[tl.j] : 0;
  tl.n0 = (nt - (tl.j ? grp.tile_end[tl.j - 1] : 0)) * kWgW;
  return tl;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
#endif

// One tile over all of K. Thread 0 keeps kFkStages units in flight (the
// units of slice 0, then 1, 2, 3: unit g overall); a stage is refilled once
// every block its copies land in is past it, so each warp arrives on the
// `empty` barrier of every block that copies into it (its weight tile's CT
// blocks and its activation tile's CW blocks, itself once).
template <int CW, int CT>
__global__ void __launch_bounds__(kWgThreads, 1)
    wgmma_fullk_kernel(const __grid_constant__ WgMaps maps, int64_t T, int64_t K, const ClusterGroup grp,
                       int64_t t_group) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NX = kFkNX, STAGES = kFkStages;
  constexpr uint32_t kXPart = uint32_t(NX / CW * kWgRowBytes), kWPart = uint32_t(kWgW / CT * kWgRowBytes);
  extern __shared__ uint8_t wg_raw[];
  __shared__ alignas(8) uint64_t bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
  const uint32_t full = smem_addr(bars), empty = full + 8 * STAGES;
  const int rank = int(cg::this_cluster().block_rank());
  const int cw = rank % CW, ct = rank / CW;
  uint16_t xpeers = 0, wpeers = 0;  // the blocks of this activation tile, of this weight tile
#pragma unroll
  for (int i = 0; i < CW; ++i) xpeers |= uint16_t(1u << (i + CW * ct));
#pragma unroll
  for (int i = 0; i < CT; ++i) wpeers |= uint16_t(1u << (cw + CW * i));
  const FkTile tl = fk_tile<CW, CT>(grp, T, t_group, cw, ct);
  const int e0 = wg_units(K, 0), e1 = e0 + wg_units(K, 1), e2 = e1 + wg_units(K, 2), total = e2 + wg_units(K, 3);
  const CUtensorMap* wm = &maps.w[tl.j];
  const CUtensorMap* xm = &maps.x;
  const int n0 = int(tl.n0), t0 = int(tl.t0);
  auto load = [&](int g, bool weights, bool acts) {  // unit g into its stage (thread 0)
    const uint32_t stage = base + uint32_t(g % STAGES) * kFkStage, bar = full + 8 * (g % STAGES);
    const int s = (g >= e0) + (g >= e1) + (g >= e2);
    const int k = int(wg_unit_k(s, g - (s == 0 ? 0 : s == 1 ? e0 : s == 2 ? e1 : e2)));
    if (weights) {
      mbar_expect_tx(bar, kFkStage);
      if constexpr (CT == 1)
        tma_load(stage + NX * kWgRowBytes, wm, k, n0, bar);
      else
        tma_load_multicast(stage + NX * kWgRowBytes + ct * kWPart, wm, k, n0 + ct * (kWgW / CT), bar, wpeers);
    }
    if (acts) {
      if constexpr (CW == 1)
        tma_load(stage, xm, k, t0, bar);
      else
        tma_load_multicast(stage + cw * kXPart, xm, k, t0 + cw * (NX / CW), bar, xpeers);
    }
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < STAGES; ++i) mbar_init(full + 8 * i, 1), mbar_init(empty + 8 * i, kWgWarps * (CW + CT - 1));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cg::this_cluster().sync();  // every block's barriers are initialized before a copy into it
  if (threadIdx.x == 0)
    for (int g = 0; g < STAGES && g < total; ++g) load(g, true, false);  // the weights do not come from the kernel before
  pdl_wait();                                                            // x may
  if (threadIdx.x == 0)
    for (int g = 0; g < STAGES && g < total; ++g) load(g, false, true);

  const int lane = threadIdx.x & 31;
  uint32_t a_off[2];
  wg_a_offsets<NX>(a_off);
  // Unit g into acc: wait for its bytes, run its four k16 steps, refill
  // the stage of unit g - 1, hand this stage back to every block that
  // copies into it.
  auto unit = [&](int g, float(&acc)[NX / 2]) {
    const int st = g % STAGES;
    const uint32_t stage = base + uint32_t(st) * kFkStage;
    mbar_wait(full + 8 * st, uint32_t((g / STAGES) & 1));
    uint32_t a[4][4];
    wg_unit_start<NX>(acc, a, stage, a_off);
    if (threadIdx.x == 0 && g >= 1 && g - 1 + STAGES < total) {
      mbar_wait(empty + 8 * ((g - 1) % STAGES), uint32_t(((g - 1) / STAGES) & 1));
      load(g - 1 + STAGES, true, true);
    }
    wg_unit_end<NX>(acc, a);
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(empty + 8 * st);
#pragma unroll
      for (int i = 0; i < CW; ++i)
        if (i != cw) mbar_arrive_remote(empty + 8 * st, i + CW * ct);
#pragma unroll
      for (int i = 0; i < CT; ++i)
        if (i != ct) mbar_arrive_remote(empty + 8 * st, cw + CW * i);
    }
  };
  float d[NX / 2], e[NX / 2];
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  for (int g = 0; g < e0; ++g) unit(g, d);
  int g = e0;
#pragma unroll 1
  for (int s = 1; s < kSplit; ++s) {
    const int end = s == 1 ? e1 : s == 2 ? e2 : total;
#pragma unroll
    for (int i = 0; i < NX / 2; ++i) e[i] = 0.0f;
    for (; g < end; ++g) unit(g, e);
#pragma unroll
    for (int i = 0; i < NX / 2; ++i) d[i] = __fadd_rn(d[i], e[i]);
  }
  pdl_streaming_done();
  cluster_arrive();  // this block takes no more copies or arrivals; it may leave once every block says so

  // d[i]: weight row ra + 8·((i >> 1) & 1), activation row 8·(i >> 2) + 2·tq + (i & 1) of the tile.
  const int warp = threadIdx.x >> 5, wg = threadIdx.x >> 7, tq = lane & 3;
  const int ra = 64 * wg + 16 * (warp & 3) + (lane >> 2);
  void* out = grp.out[tl.j];
  const int odt = grp.odt[tl.j];
  const int64_t ldo = grp.ldo[tl.j];
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) {
    const int64_t t = tl.t0 + 8 * (i >> 2) + 2 * tq + (i & 1), n = tl.n0 + ra + 8 * ((i >> 1) & 1);
    if (t < T && n < tl.N) st(out, odt, t * ldo + n, d[i]);
  }
  cluster_wait();
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: wgmma_gemm_usable() is false unless this file's sm_90a code runs
#endif
}

template <int CW, int CT>
bool launch_fullk(cudaStream_t s, const __nv_bfloat16* xp, int64_t ldp, int64_t T, int64_t K,
                  const ClusterGroup& grp, cudaError_t* err) {
  WgMaps maps{};
  bool ok = encode_rows(&maps.x, xp, T, ldp, ldp, kFkNX / CW);
  for (int j = 0; ok && j < grp.count; ++j) ok = weight_map(&maps.w[j], grp.w[j], grp.n[j], K, kWgW / CT);
  if (!ok) return false;
  const int64_t clusters = (grp.tiles_n + CW - 1) / CW * ((T + kFkNX * CT - 1) / (kFkNX * CT));
  *err = launch_clusters<wgmma_fullk_kernel<CW, CT>>(s, clusters * CW * CT, CW * CT, kWgThreads, kFkSmem, maps, T, K,
                                                    grp, wg_t_group(kFkNX * CT, K));
  return true;
}

}  // namespace

bool launch_wgmma_fullk(cudaStream_t s, const __nv_bfloat16* xp, int64_t ldp, int64_t T, int64_t K,
                        const ClusterGroup& grp, int variant, cudaError_t* err) {
  switch (variant) {
    case 17: return launch_fullk<2, 2>(s, xp, ldp, T, K, grp, err);
    case 18: return launch_fullk<4, 2>(s, xp, ldp, T, K, grp, err);
    default: return launch_fullk<1, 1>(s, xp, ldp, T, K, grp, err);
  }
}

}  // namespace muse::cuda
