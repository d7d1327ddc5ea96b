// The latent experts' two products as a grouped GEMM on Hopper's warpgroup
// MMA (sm_90a), for steps with many (token, expert) pairs: prefill.
//
// Why: the per-tile kernels (cuda_moe.cu) take at most 8 pairs of one
// expert a block and stream that expert's weights once per 8 pairs. An
// 8K-token prefill of the Spark slice has 65,536 pairs, ~256 an expert, so
// each expert's 96 MB crossed L2 ~32 times: 250 ms a layer (H100, 2026-12-06),
// 3% of the bf16 tensor rate. Here a tile is up to NX pairs of one expert
// (128 or 256) against 128 weight rows, the product runs through wgmma, and
// the tiles of one expert run side by side over each weight tile in turn, so
// an expert's weights cross HBM about once a step.
//
// The bits are the per-tile kernels' (and so decode's): each pair's sums
// are the decode kernels' K-slices (granules s, s + 4, ... of 128 k, k16
// steps in their order, cuda_wgmma_gemm.cu), one slice per block of a
// cluster of four, added P0 + P1 + P2 + P3; gate/up forms
// a = bf16(silu(γ) · υ) with the same expression, and down stores the fp32
// sums. A pair's column of the tile depends on its own activation row only,
// so which other pairs (or padding rows) share its tile does not matter.
//
// The pipeline is wgmma_tma_kernel's: the activations gathered into scratch
// in grouped order and in the mma's k order (one pass), both operands
// staged by the copy engine, STAGES units of 64 k in flight.
#include "muse/backends/cuda/cuda_moe_wgmma.h"

#include <algorithm>

#include "muse/backends/cuda/cuda_moe_wgmma.cuh"

namespace muse::cuda {
namespace {

// x rows gathered and permuted: grouped row g <- u[order[g] / topk], each
// 32-k block in the mma's order (wgmma_permute_x_kernel's, K % 32 == 0).
// Rows at or past the grouped count (other ranks' pairs) are left alone.
__global__ void moe_gather_permute_kernel(const __nv_bfloat16* __restrict__ u, int64_t Hm, int topk,
                                          const int32_t* __restrict__ order, const int32_t* __restrict__ starts,
                                          int E, int64_t R, __nv_bfloat16* __restrict__ xg) {
  pdl_wait();  // the grouping (and u) come from the kernels before
  pdl_launch_dependents();
  const int64_t blocks_row = Hm / 32, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * blocks_row) return;
  const int64_t g = i / blocks_row, k0 = (i % blocks_row) * 32;
  if (g >= starts[E]) return;
  const __nv_bfloat16* src = u + int64_t(order[g] / topk) * Hm + k0;
  uint4 in[4];
#pragma unroll
  for (int tq = 0; tq < 4; ++tq) in[tq] = *reinterpret_cast<const uint4*>(src + 8 * tq);
  wg_store_permuted32(in, reinterpret_cast<uint4*>(xg + g * Hm + k0));
}

struct MoeMaps {
  CUtensorMap x;  // grouped activations (permuted), boxes of 64 k × NX rows
  CUtensorMap w;  // the experts' weights as one matrix of rows, boxes of 64 k × 64 rows
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// gate/up's finish: block s's share of the cluster's sums (moe_cluster_quads:
// activation rows s·NX/4 .. of the tile's 64 gate rows and their up rows),
// stored as a = bf16(silu(γ) · υ) in the down product's permuted order (row
// stride I, I % 32 == 0): elements i, i + 1 of a quad are one word, i + 2,
// i + 3 the word four words on.
template <int NX>
__device__ __forceinline__ void moe_swiglu_finish(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                                  const MoeTile& tl, int64_t I, __nv_bfloat16* ap) {
  using Q = MoeQuads<NX, 16>;
  float4 v[2][Q::kEach];
  moe_cluster_quads<NX, 16, 2>(d, part_base, s, v);
  const int tid = int(threadIdx.x);
#pragma unroll
  for (int j = 0; j < Q::kEach; ++j) {
    const int e = tid + j * kWgThreads;
    const int t = s * Q::kRowsEach + e / 16;
    const int64_t i = int64_t(tl.wt) * 64 + 4 * (e % 16);
    if (t >= tl.rows || i >= I) continue;
    const uint32_t lo = moe_silu_mul(v[0][j].x, v[1][j].x) | (moe_silu_mul(v[0][j].y, v[1][j].y) << 16);
    const uint32_t hi = moe_silu_mul(v[0][j].z, v[1][j].z) | (moe_silu_mul(v[0][j].w, v[1][j].w) << 16);
    // Element k of a 32-k block sits at 2·(4·p + tq) + b, k = 8·tq + 2·p + b.
    const int kk = int(i % 32), tq = kk / 8, p = (kk % 8) / 2;
    uint32_t* row = reinterpret_cast<uint32_t*>(ap + (tl.g0 + t) * I + (i - kk));
    row[4 * p + tq] = lo;
    row[4 * (p + 1) + tq] = hi;
  }
  cluster_wait();  // no block leaves while another reads its partial
}
#endif

// One cluster tile of the grouped GEMM, K-slice s = this block's rank in
// its cluster (wgmma_tma_kernel's loop; the weight tile is two boxes of 64
// rows: gate rows i0.. and up rows I + i0.. of expert e for gate/up, rows
// n0.. and n0 + 64.. of its down matrix).
//   GATE_UP: x = u gathered (K = Hm), out = a, permuted, bf16 [R, I];
//   else:    x = a permuted (K = I), out = Y fp32 [R, Hm].
template <int NX, int STAGES, bool GATE_UP>
__global__ void __launch_bounds__(kWgThreads, NX == 128 ? 2 : 1)  // what the shared memory allows
    moe_wgmma_kernel(const __grid_constant__ MoeMaps maps, const int32_t* starts, const int32_t* tile_starts, int E,
                     int tn, int64_t K, int64_t I, int64_t Hm, void* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX == 128 || NX == 256, "grouped GEMM tiles");
  constexpr uint32_t kStage = uint32_t(wg_stage_bytes<NX>()), kXBytes = uint32_t(NX * kWgRowBytes);
  extern __shared__ uint8_t wg_raw[];
  __shared__ alignas(8) uint64_t bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  pdl_wait();  // the grouping decides every tile; x comes from the kernel before
  MoeTile tl;
  if (!moe_tile<NX>(starts, tile_starts, E, tn, int64_t(blockIdx.x / kSplit), tl)) return;  // the whole cluster
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
  const uint32_t full = smem_addr(bars), empty = full + 8 * STAGES;
  const int s = int(cg::this_cluster().block_rank());  // this block's K-slice
  const int units = wg_units(K, s);
  const int r0 = GATE_UP ? int(tl.e * 2 * I + int64_t(tl.wt) * 64) : int(tl.e * Hm + int64_t(tl.wt) * 128);
  const int r1 = GATE_UP ? int(r0 + I) : r0 + 64;
  const int t0 = int(tl.g0);
  auto load = [&](int u) {  // unit u into its stage (thread 0)
    const uint32_t stage = base + uint32_t(u % STAGES) * kStage, bar = full + 8 * (u % STAGES);
    const int k = int(wg_unit_k(s, u));
    mbar_expect_tx(bar, kStage);
    tma_load(stage + kXBytes, &maps.w, k, r0, bar);
    tma_load(stage + kXBytes + 64 * kWgRowBytes, &maps.w, k, r1, bar);
    tma_load(stage, &maps.x, k, t0, bar);
  };
  if (threadIdx.x == 0) {
    wg_init_barriers<STAGES>(full, empty);
    for (int u = 0; u < STAGES && u < units; ++u) load(u);
  }
  __syncthreads();  // the barriers are initialized

  float d[NX / 2];
  wg_tma_units<NX, STAGES>(d, base, full, empty, units, load);
  pdl_streaming_done();
  uint8_t* part_base = wg_raw + (base - raw);
  if constexpr (GATE_UP) {
    moe_swiglu_finish<NX>(d, part_base, s, tl, I, static_cast<__nv_bfloat16*>(out));
  } else {
    ClusterGroup grp{};
    grp.out[0] = out;
    grp.odt[0] = kF32;
    grp.ldo[0] = Hm;
    grp.n[0] = Hm;
    grp.count = 1;
    const WgTile wt{tl.g0, int64_t(tl.wt) * 128, Hm, 0};
    wg_finish<NX>(d, part_base, s, wt, grp, tl.g0 + tl.rows, 0);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: moe_gemm_applies() is false unless this file's sm_90a code runs
#endif
}

template <int NX, int STAGES>
cudaError_t launch_products(cudaStream_t s, const MoeGemmArgs& a) {
  constexpr size_t smem = size_t(STAGES) * wg_stage_bytes<NX>() + 1024;
  static_assert(size_t(NX) * kWgPartStride * sizeof(float) <= size_t(STAGES) * wg_stage_bytes<NX>(),
                "the partials fit in the stages");
  const int64_t Hm = a.Hm, I = a.I, R = a.R;
  MoeMaps gu{}, dn{};
  if (!encode_rows(&gu.x, a.xg, R, Hm, Hm, NX) || !weight_map(&gu.w, a.gate_up, int64_t(a.E) * 2 * I, Hm, 64) ||
      !encode_rows(&dn.x, a.ap, R, I, I, NX) || !weight_map(&dn.w, a.down, int64_t(a.E) * Hm, I, 64))
    return cudaErrorInvalidValue;
  // Tiles of NX pairs: at most R / NX full ones and one partial one per
  // expert that has pairs; clusters past the grouping's count return at once.
  const int64_t max_tiles = R / NX + std::min<int64_t>(a.E, R) + 1;
  const int tn_gu = int((I + 63) / 64), tn_dn = int((Hm + 127) / 128);
  if (cudaError_t e = launch_pdl<moe_gather_permute_kernel>(
          s, dim3(blocks_for(R * (Hm / 32), 256)), dim3(256), 0, a.u, Hm, a.topk, a.order, a.starts, a.E, R, a.xg);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = launch_slice_clusters<moe_wgmma_kernel<NX, STAGES, true>>(
          s, max_tiles * tn_gu * kSplit, kWgThreads, smem, gu, a.starts, a.tile_starts, a.E, tn_gu, Hm, I, Hm,
          static_cast<void*>(a.ap));
      e != cudaSuccess)
    return e;
  return launch_slice_clusters<moe_wgmma_kernel<NX, STAGES, false>>(s, max_tiles * tn_dn * kSplit, kWgThreads, smem,
                                                                    dn, a.starts, a.tile_starts, a.E, tn_dn, I, I, Hm,
                                                                    static_cast<void*>(a.Y));
}

}  // namespace

bool moe_gemm_applies(int64_t Hm, int64_t I, const void* u, const void* gate_up, const void* down) {
  auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return wgmma_gemm_usable() && tensor_map_encoder() != nullptr && Hm % 32 == 0 && I % 32 == 0 && a16(u) &&
         a16(gate_up) && a16(down);
}

cudaError_t launch_moe_gemm(cudaStream_t s, const MoeGemmArgs& a) {
  if (a.nx == 128) return launch_products<128, 3>(s, a);  // 97 KB: two blocks an SM
  return launch_products<256, 4>(s, a);
}

}  // namespace muse::cuda
