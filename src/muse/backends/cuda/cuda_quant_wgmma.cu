// Products with NVFP4 / MXFP4 / FP8 / INT4 weights on Hopper's warpgroup
// MMA (sm_90a), for steps with many rows (prefill): the latent experts' two
// products as a grouped GEMM over (token, expert) pairs, and the dense
// projections (q/k/v/o, gate/up/down) as a plain GEMM. Each warp decodes
// its A fragments (FP4: the codes times their block scales, FP8: the E4M3
// codes, INT4: q − z, all exact in bf16) from the staged codes into
// registers right before its wgmma steps, so HBM and shared memory carry
// only the stored bytes.
//
// Why: the per-tile kernels (cuda_quant_moe.cu) take at most 8 pairs of one
// expert a block and stream that expert's codes once per 8 pairs; an 8K
// prefill of the NVFP4 Spark slice spent 124 ms a layer in them (H100,
// 2026-12-06), 3.8× the BF16 experts' grouped GEMM (cuda_moe_wgmma.cu), whose
// shape this follows: a tile is NX pairs of one expert against 128 weight
// rows, a cluster of four blocks are its four K-slices, and the tiles of one
// expert run side by side over each weight tile. The dense projections'
// per-tile kernel (cuda_quant_matmul.cu) re-streams and re-decodes a
// weight's codes once per 64 rows of x: Glimmer's 4 layers at 8K took
// 0.375 s with FP8 weights, 4.4× BF16's wgmma GEMM (H100, 2026-12-06); here
// they are one expert, every row of x a pair, in tiles grouped as the BF16
// GEMM's (wg_t_group) so a group's rows of x stay in L2 while the codes
// stream past them.
//
// The bits are the per-tile kernels' (and so decode's): their K-slices, in
// each granule their mma steps in their order, each step's 16 k in the same
// slots of A and B; the activations are gathered into that k order (one
// pass), and a is stored in it for the down product. A unit of the pipeline
// is 128 k (eight steps, two x boxes of 64 k × NX rows, 128-byte swizzle):
//   FP4 (granules of 512 k; lane tq of a quad owns k 128·tq .., cuda_quant.cuh):
//     unit = piece j of a granule; step (j, w, i) takes k = 128·tq + 32·j +
//     8·w + {i, i + 4, i + 1, i + 5}, i = 0 or 2, from every tq; the four
//     16-byte code pieces of each weight row come by one 5-d box per 64
//     rows, the granule's scales by a 4-d box at j = 0.
//   FP8 (granules of 128 k; lane tq owns k 32·tq .., cuda_quant_fp8_int4.cuh):
//     unit = a granule; step (j, w) takes k = 32·tq + 16·j + 4·w + {0, 2, 1,
//     3}; the codes (128 bytes a row) by a 128-byte-swizzled box per 64 rows.
//   INT4 (granules of 128 k, lane tq owns k 32·tq ..): unit = a granule;
//     step (j, h) takes k = 32·tq + 8·j + {2h, 2h + 4, 2h + 1, 2h + 5}; the
//     words (K-major, GPTQ's [K/8][N]) by a box of 16 word rows × 64
//     columns, the group's scales and zero points by boxes of 64 columns.
// The sums are then P0 + P1 + P2 + P3 times the row factor (NVFP4 global ·
// 2^64, MXFP4 2^64, FP8 its per-tensor / per-channel scale, INT4 none: its
// group scales multiply each granule's partial), as the per-tile kernels add
// and scale them. FP8 with block scales (a factor per granule) is not taken.
// The shared pieces: cuda_quant_wgmma.cuh.
#include <algorithm>

#include "muse/backends/cuda/cuda_quant_wgmma.cuh"
#include "muse/backends/cuda/cuda_quant_wgmma.h"

namespace muse::cuda {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// gate/up's finish: a = bf16(silu(γ·f) · υ·f') in the down product's order.
// FP4: quads 2m and 2m + 1 of a row (neighbouring lanes) are elements 0..3
// and 4..7 of one 8-k run, whose words (element c, element c + 4) sit at
// positions 16·(c / 2) + 8·(c % 2) + 2·tq of the run's 32 (fp4_permute32):
// the lanes swap two values each and store two words each. FP8: a quad is
// one 4-k run, words (0, 2) and (1, 3) at positions 2·tq and 8 + 2·tq of
// its step (fp8_permute64). INT4: as FP4, the run's 32 positions at 32·j
// of its granule of 128 (fp4_permute32's INT4 form).
template <QFmt F, int NX>
__device__ __forceinline__ void q_swiglu_finish(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                                const MoeTile& tl, int64_t I, const QRows& rows,
                                                __nv_bfloat16* ap) {
  using Q = MoeQuads<NX, 16>;
  float4 v[2][Q::kEach];
  moe_cluster_quads<NX, 16, 2, int4_fmt(F)>(d, part_base, s, v);
  const int tid = int(threadIdx.x);
  const bool odd = tid & 1;
#pragma unroll
  for (int j = 0; j < Q::kEach; ++j) {
    const int e = tid + j * kWgThreads;
    const int t = s * Q::kRowsEach + e / 16;
    const int64_t i = int64_t(tl.wt) * 64 + 4 * (e % 16);
    const bool ok = t < tl.rows && i < I;
    const int64_t ic = ok ? i : 0;
    float fg[4], fu[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) fg[c] = q_row_factor<F>(rows, tl.e, ic + c), fu[c] = q_row_factor<F>(rows, tl.e, I + ic + c);
    const uint32_t h0 = moe_silu_mul(v[0][j].x * fg[0], v[1][j].x * fu[0]);
    const uint32_t h1 = moe_silu_mul(v[0][j].y * fg[1], v[1][j].y * fu[1]);
    const uint32_t h2 = moe_silu_mul(v[0][j].z * fg[2], v[1][j].z * fu[2]);
    const uint32_t h3 = moe_silu_mul(v[0][j].w * fg[3], v[1][j].w * fu[3]);
    if constexpr (fp8_fmt(F)) {
      if (!ok) continue;
      const int64_t r = i % 128;  // k 32·tq + 16·j + 4·w of the granule
      const int64_t at = (i - r) + 64 * ((r % 32) / 16) + 16 * ((r % 16) / 4) + 2 * (r / 32);
      uint32_t* row = reinterpret_cast<uint32_t*>(ap + (tl.g0 + t) * I + at);
      row[0] = h0 | (h2 << 16);  // elements 0 and 2
      row[4] = h1 | (h3 << 16);  // 1 and 3: position 8
      continue;
    }
    // The even lane sends elements 2, 3 and gets 4, 5; the odd one sends
    // 4 + 0, 4 + 1 and gets 2, 3 (every lane shuffles: before any `ok`).
    const uint32_t pw = __shfl_xor_sync(0xffffffffu, odd ? (h0 | (h1 << 16)) : (h2 | (h3 << 16)), 1);
    if (!ok) continue;
    const int64_t run = i & ~int64_t(7), r = run % q_granule<F>();
    const int64_t at = int4_fmt(F) ? (run - r) + 32 * ((r % 32) / 8) + 2 * (r / 32)
                                   : (run - r) + 128 * ((r % 128) / 32) + 32 * ((r % 32) / 8) + 2 * (r / 128);
    uint32_t* row = reinterpret_cast<uint32_t*>(ap + (tl.g0 + t) * I + at);
    if (!odd) {
      row[0] = h0 | ((pw & 0xFFFFu) << 16);  // elements 0 and 4
      row[4] = h1 | (pw & 0xFFFF0000u);      // 1 and 5: position 8
    } else {
      row[8] = (pw & 0xFFFFu) | (h2 << 16);  // 2 and 6: position 16
      row[12] = (pw >> 16) | (h3 << 16);     // 3 and 7: position 24
    }
  }
  cluster_wait();  // no block leaves while another reads its partial
}

// The down product's and a dense product's finish: out[t, n] = (P0 + P1 +
// P2 + P3) · f(n) as odt (row stride ldo), the tile's rows and n < N only
// (down: Y, fp32, N = ldo = Hm).
template <QFmt F, int NX>
__device__ __forceinline__ void q_store_finish(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                               const MoeTile& tl, const QRows& rows, void* out, int odt,
                                               int64_t ldo) {
  using Q = MoeQuads<NX, 32>;
  float4 v[1][Q::kEach];
  moe_cluster_quads<NX, 32, 1, int4_fmt(F)>(d, part_base, s, v);
  const int tid = int(threadIdx.x);
#pragma unroll
  for (int j = 0; j < Q::kEach; ++j) {
    const int e = tid + j * kWgThreads;
    const int t = s * Q::kRowsEach + e / 32;
    const int64_t n = int64_t(tl.wt) * 128 + 4 * (e % 32);
    if (t >= tl.rows || n >= rows.N) continue;
    float f[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) f[c] = q_row_factor<F>(rows, tl.e, min(n + c, rows.N - 1));
    const float4 r = make_float4(v[0][j].x * f[0], v[0][j].y * f[1], v[0][j].z * f[2], v[0][j].w * f[3]);
    st4(out, odt, (tl.g0 + t) * ldo + n, r, rows.N - n);
  }
  cluster_wait();
}
#endif

// Which tile a cluster computes.
enum class QMode { GateUp, Down, Dense };
struct QGrid {
  const int32_t* starts = nullptr;       // experts: the grouping's (MoeGemmArgs)
  const int32_t* tile_starts = nullptr;
  int E = 1, tn = 0;                     // tn: weight tiles of the product
  int64_t T = 0, t_group = 1;            // dense: rows of x; activation tiles a group
};
// Dense: groups of t_group activation tiles, every weight tile over each
// group in turn (wg_tile's order), as one expert's tile.
template <int NX>
__device__ __forceinline__ bool dense_tile(const QGrid& g, int64_t c, MoeTile& t) {
  const int64_t tiles_t = (g.T + NX - 1) / NX, per_group = g.t_group * g.tn;
  if (c >= tiles_t * g.tn) return false;
  const int64_t first_t = (c / per_group) * g.t_group, local = c % per_group;
  const int64_t group_size = tiles_t - first_t < g.t_group ? tiles_t - first_t : g.t_group;
  t.e = 0;
  t.wt = int(local / group_size);
  t.g0 = (first_t + local % group_size) * NX;
  t.rows = int(min(int64_t(NX), g.T - t.g0));
  return true;
}

// One cluster tile: K-slice s = this block's rank in its cluster; the
// weight tile is two boxes of 64 rows (gate rows i0.. and up rows I + i0..
// of expert e for gate/up, rows n0.. and n0 + 64.. of the down matrix or
// the dense weight).
//   GateUp: x = u gathered (K = Hm), out = a, permuted, bf16 [R, I];
//   Down:   x = a permuted (K = I), out = Y fp32 [R, Hm];
//   Dense:  x permuted (T rows of K), out [T, N] as odt, row stride ldo.
// Two blocks an SM at 128 pairs a tile; one at 256, and for INT4, whose
// second accumulator set (e, q_units_int4) takes 64 more registers.
template <QFmt F, int NX>
constexpr int q_min_blocks() { return NX == 128 && !int4_fmt(F) ? 2 : 1; }

template <QFmt F, int NX, int STAGES, QMode M>
__global__ void __launch_bounds__(kWgThreads, q_min_blocks<F, NX>())
    q_gemm_kernel(const __grid_constant__ QMaps maps, QRows rows, QGrid grid, int64_t K, int64_t I, void* out,
                  int odt, int64_t ldo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX == 128 || NX == 256, "grouped GEMM tiles");
  constexpr uint32_t kStage = q_stage_bytes<F, NX>(), kX = uint32_t(2 * NX * kWgRowBytes);
  constexpr uint32_t kSRow = fp4_scale_row<F>();
  extern __shared__ uint8_t wg_raw[];
  __shared__ alignas(8) uint64_t bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  __shared__ uint32_t lut[256];
  pdl_wait();  // the grouping decides every tile; x comes from the kernel before
  MoeTile tl;
  const int64_t c = int64_t(blockIdx.x / kSplit);
  if (!(M == QMode::Dense ? dense_tile<NX>(grid, c, tl)
                          : moe_tile<NX>(grid.starts, grid.tile_starts, grid.E, grid.tn, c, tl)))
    return;  // the whole cluster
  if constexpr (fp4_format(F)) fp4_fill_lut<F == QFmt::Mxfp4>(lut);
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
  const uint32_t full = smem_addr(bars), empty = full + 8 * STAGES;
  const int s = int(cg::this_cluster().block_rank());  // this block's K-slice
  const int64_t ngran = K / q_granule<F>();
  const int units = s < ngran ? (fp4_format(F) ? 4 : 1) * int((ngran - s + kSplit - 1) / kSplit) : 0;
  constexpr bool kGateUp = M == QMode::GateUp;
  const int r0 = kGateUp ? tl.wt * 64 : tl.wt * 128;
  const int r1 = kGateUp ? int(I + r0) : r0 + 64;
  const int t0 = int(tl.g0);
  auto load = [&](int u) {  // unit u into its stage (thread 0)
    const uint32_t stage = base + uint32_t(u % STAGES) * kStage, bar = full + 8 * (u % STAGES);
    if constexpr (int4_fmt(F)) {  // coordinates: column (weight row), word row, expert
      const int gi = s + u * kSplit, k = gi * kQGranule;
      const int grp = rows.group >= K ? 0 : int(int64_t(k) / rows.group);
      mbar_expect_tx(bar, kX + 2 * kI4BoxBytes + 256 + (rows.zeros ? 64u : 0u));
      tma_load(stage, &maps.x, k, t0, bar);
      tma_load(stage + uint32_t(NX * kWgRowBytes), &maps.x, k + 64, t0, bar);
      tma_load3(stage + kX, &maps.codes, r0, k / 8, tl.e, bar);
      tma_load3(stage + kX + kI4BoxBytes, &maps.codes, r1, k / 8, tl.e, bar);
      tma_load3(stage + kX + kI4Scales, &maps.scales, r0, grp, tl.e, bar);
      tma_load3(stage + kX + kI4Scales + 128, &maps.scales, r1, grp, tl.e, bar);
      if (rows.zeros) {
        tma_load3(stage + kX + kI4Zeros, &maps.zeros, r0 / 8, grp, tl.e, bar);
        tma_load3(stage + kX + kI4Zeros + 128, &maps.zeros, r1 / 8, grp, tl.e, bar);
      }
    } else if constexpr (fp8_fmt(F)) {
      const int gi = s + u * kSplit, k = gi * kQGranule;
      mbar_expect_tx(bar, kX + kQCodeBytes);
      tma_load(stage, &maps.x, k, t0, bar);
      tma_load(stage + uint32_t(NX * kWgRowBytes), &maps.x, k + 64, t0, bar);
      tma_load3(stage + kX, &maps.codes, k, r0, tl.e, bar);
      tma_load3(stage + kX + kQCodeBytes / 2, &maps.codes, k, r1, tl.e, bar);
    } else {
      const int gi = s + (u >> 2) * kSplit, j = u & 3, k = gi * kFp4Granule + j * kQUnit;
      mbar_expect_tx(bar, kX + kFp4CodeBytes + (j == 0 ? uint32_t(kWgW) * kSRow : 0u));
      tma_load(stage, &maps.x, k, t0, bar);
      tma_load(stage + uint32_t(NX * kWgRowBytes), &maps.x, k + 64, t0, bar);
      tma_load5(stage + kX, &maps.codes, 0, j, 4 * gi, r0, tl.e, bar);
      tma_load5(stage + kX + kFp4CodeBytes / 2, &maps.codes, 0, j, 4 * gi, r1, tl.e, bar);
      if (j == 0) {
        tma_load4(stage + kX + kFp4CodeBytes, &maps.scales, 0, gi, r0, tl.e, bar);
        tma_load4(stage + kX + kFp4CodeBytes + 64 * kSRow, &maps.scales, 0, gi, r1, tl.e, bar);
      }
    }
  };
  if (threadIdx.x == 0) {
    wg_init_barriers<STAGES>(full, empty);
    for (int u = 0; u < STAGES && u < units; ++u) load(u);
  }
  __syncthreads();  // the barriers are initialized

  float d[NX / 2];
  if constexpr (int4_fmt(F)) q_units_int4<NX, STAGES>(d, base, full, empty, units, rows, load);
  else q_units<F, NX, STAGES>(d, base, full, empty, units, lut, load);
  pdl_streaming_done();
  uint8_t* part_base = wg_raw + (base - raw);
  if constexpr (kGateUp) q_swiglu_finish<F, NX>(d, part_base, s, tl, I, rows, static_cast<__nv_bfloat16*>(out));
  else q_store_finish<F, NX>(d, part_base, s, tl, rows, out, odt, ldo);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: moe_q_gemm_applies() is false unless this file's sm_90a code runs
#endif
}

// The code (and FP4 scale) maps of E experts, boxes of 64 rows; rows past
// an expert's N read as zeros, never the next expert's. FP4: QuantDev's
// aligned layouts (K % 512 == 0, canonical scale blocks, 16-byte aligned).
template <QFmt F>
bool q_maps(QMaps* m, const QuantDev& w, int64_t E) {
  const auto encode = tensor_map_encoder();
  const int64_t K = w.K;
  if (!encode || K % q_granule<F>() != 0 || w.codes_stride % 16 != 0 || w.N <= 0 || w.N >= (int64_t(1) << 31) ||
      E <= 0 || E >= (int64_t(1) << 31) || (!fp8_fmt(F) && w.scales_stride % 16 != 0))
    return false;
  if constexpr (int4_fmt(F)) {  // N % 8 == 0 (quant_unsupported); zero points: N % 32 == 0 (q_gemm_layout_ok)
    const int64_t G = w.scale_ld;
    const cuuint64_t cd[3] = {cuuint64_t(w.N), cuuint64_t(K / 8), cuuint64_t(E)};
    const cuuint64_t cs[2] = {cuuint64_t(w.N * 4), cuuint64_t(w.codes_stride)};
    const cuuint32_t cb[3] = {64, 16, 1}, ce[3] = {1, 1, 1};
    const cuuint64_t sd[3] = {cuuint64_t(w.N), cuuint64_t(G), cuuint64_t(E)};
    const cuuint64_t ss[2] = {cuuint64_t(w.N * 2), cuuint64_t(w.scales_stride)};
    const cuuint32_t sbx[3] = {64, 1, 1};
    bool ok = encode(&m->codes, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<uint8_t*>(w.codes), cd, cs, cb, ce,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS &&
              encode(&m->scales, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<uint8_t*>(w.scales), sd, ss, sbx, ce,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    if (ok && w.zeros) {
      const cuuint64_t zd[3] = {cuuint64_t(w.N / 8), cuuint64_t(G), cuuint64_t(E)};
      const cuuint64_t zs[2] = {cuuint64_t(w.N / 2), cuuint64_t(w.zeros_stride)};
      const cuuint32_t zb[3] = {8, 1, 1};
      ok = w.zeros_stride % 16 == 0 &&
           encode(&m->zeros, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<uint8_t*>(w.zeros), zd, zs, zb, ce,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    }
    return ok;
  } else if constexpr (fp8_fmt(F)) {
    const cuuint64_t cd[3] = {cuuint64_t(K), cuuint64_t(w.N), cuuint64_t(E)};
    const cuuint64_t cs[2] = {cuuint64_t(K), cuuint64_t(w.codes_stride)};
    const cuuint32_t cb[3] = {128, 64, 1}, ce[3] = {1, 1, 1};
    return encode(&m->codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(w.codes), cd, cs, cb, ce,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  } else {
    const int64_t sb = fp4_scale_row<F>();
    const cuuint64_t cd[5] = {16, 4, cuuint64_t(K / 128), cuuint64_t(w.N), cuuint64_t(E)};
    const cuuint64_t cs[4] = {16, 64, cuuint64_t(K / 2), cuuint64_t(w.codes_stride)};
    const cuuint32_t cb[5] = {16, 1, 4, 64, 1}, ce[5] = {1, 1, 1, 1, 1};
    const cuuint64_t sd[4] = {cuuint64_t(sb), cuuint64_t(K / kFp4Granule), cuuint64_t(w.N), cuuint64_t(E)};
    const cuuint64_t ss[3] = {cuuint64_t(sb), cuuint64_t(K / (F == QFmt::Mxfp4 ? 32 : 16)),
                              cuuint64_t(w.scales_stride)};
    const cuuint32_t sbx[4] = {cuuint32_t(sb), 1, 64, 1}, se[4] = {1, 1, 1, 1};
    return encode(&m->codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, const_cast<uint8_t*>(w.codes), cd, cs, cb, ce,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS &&
           encode(&m->scales, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<uint8_t*>(w.scales), sd, ss, sbx, se,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }
}

template <QFmt F, int NX, int STAGES>
cudaError_t launch_q_products(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn) {
  constexpr size_t smem = size_t(STAGES) * q_stage_bytes<F, NX>() + 1024;
  static_assert(size_t(NX) * kWgPartStride * sizeof(float) <= size_t(STAGES) * q_stage_bytes<F, NX>(),
                "the partials fit in the stages");
  const int64_t Hm = a.Hm, I = a.I, R = a.R;
  QMaps mg{}, md{};
  if (!encode_rows(&mg.x, a.xg, R, Hm, Hm, NX) || !q_maps<F>(&mg, gu, a.E) || !encode_rows(&md.x, a.ap, R, I, I, NX) ||
      !q_maps<F>(&md, dn, a.E))
    return cudaErrorInvalidValue;
  // Tiles of NX pairs: at most R / NX full ones and one partial one per
  // expert that has pairs; clusters past the grouping's count return at once.
  const int64_t max_tiles = R / NX + std::min<int64_t>(a.E, R) + 1;
  const int tn_gu = int((I + 63) / 64), tn_dn = int((Hm + 127) / 128);
  if (cudaError_t e = launch_pdl<moe_q_gather_kernel<F>>(s, dim3(blocks_for(R * (Hm / q_gather_run<F>()), 256)),
                                                         dim3(256), 0,
                                                         a.u, Hm, a.topk, a.order, a.starts, a.E, R, a.xg);
      e != cudaSuccess)
    return e;
  QGrid grid;
  grid.starts = a.starts, grid.tile_starts = a.tile_starts, grid.E = a.E, grid.tn = tn_gu;
  if (cudaError_t e = launch_slice_clusters<q_gemm_kernel<F, NX, STAGES, QMode::GateUp>>(
          s, max_tiles * tn_gu * kSplit, kWgThreads, smem, mg, q_rows(gu), grid, Hm, I, static_cast<void*>(a.ap),
          int(kBF16), I);
      e != cudaSuccess)
    return e;
  grid.tn = tn_dn;
  return launch_slice_clusters<q_gemm_kernel<F, NX, STAGES, QMode::Down>>(
      s, max_tiles * tn_dn * kSplit, kWgThreads, smem, md, q_rows(dn), grid, I, I, static_cast<void*>(a.Y),
      int(kF32), Hm);
}

// A dense product from x permuted (xq): tiles of NX rows of x in groups of
// about 24 MB of x (the BF16 GEMM's wg_t_group rule: the group stays in L2
// while the weight's codes stream past it).
template <QFmt F, int NX, int STAGES>
cudaError_t launch_q_dense(cudaStream_t s, const __nv_bfloat16* xq, int64_t T, const QuantDev& w, void* out, int odt,
                           int64_t ldo) {
  constexpr size_t smem = size_t(STAGES) * q_stage_bytes<F, NX>() + 1024;
  static_assert(size_t(NX) * kWgPartStride * sizeof(float) <= size_t(STAGES) * q_stage_bytes<F, NX>(),
                "the partials fit in the stages");
  QMaps m{};
  if (!encode_rows(&m.x, xq, T, w.K, w.K, NX) || !q_maps<F>(&m, w, 1)) return cudaErrorInvalidValue;
  QGrid grid;
  grid.tn = int((w.N + 127) / 128);
  grid.T = T;
  grid.t_group = std::clamp<int64_t>((int64_t(24) << 20) / (int64_t(NX) * w.K * 2), 1, 16);
  const int64_t tiles = (T + NX - 1) / NX * grid.tn;
  return launch_slice_clusters<q_gemm_kernel<F, NX, STAGES, QMode::Dense>>(
      s, tiles * kSplit, kWgThreads, smem, m, q_rows(w), grid, w.K, int64_t(0), out, odt, ldo);
}

// INT4 always in tiles of 128 (one block an SM, four stages of 41 KB).
template <QFmt F>
cudaError_t launch_q_format(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn) {
  if constexpr (int4_fmt(F)) {  // the grouping's tiles must be of 128 pairs (moe_experts)
    return a.nx == 128 ? launch_q_products<F, 128, 4>(s, a, gu, dn) : cudaErrorInvalidValue;
  }
  else return a.nx == 128 ? launch_q_products<F, 128, 2>(s, a, gu, dn) : launch_q_products<F, 256, 2>(s, a, gu, dn);
}

// Dense products in tiles of 128 rows of x (two blocks an SM; INT4 one, in
// four stages), as the experts' rule takes them.
template <QFmt F>
cudaError_t launch_q_dense_format(cudaStream_t s, const __nv_bfloat16* xq, int64_t T, const QuantDev& w, void* out,
                                  int odt, int64_t ldo) {
  if constexpr (int4_fmt(F)) return launch_q_dense<F, 128, 4>(s, xq, T, w, out, odt, ldo);
  else return launch_q_dense<F, 128, 2>(s, xq, T, w, out, odt, ldo);
}

bool fp8_kind(QuantKind kind) { return kind == QuantKind::Fp8; }
bool fp4_kind(QuantKind kind) { return kind == QuantKind::Nvfp4 || kind == QuantKind::Mxfp4; }
bool a16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The layouts the GEMMs take: QuantDev's aligned ones, K a multiple of the
// format's granule, FP8 per tensor or per channel (block scales would need
// a second accumulator set per granule), INT4 with groups of whole granules
// and, with zero points, N % 32 == 0 (their rows of words 16-byte strided);
// at least one 64-row box of rows.
bool q_layout_ok(QuantKind kind, const QuantDev& w) {
  if (!w.aligned || w.N < 64 || !wgmma_gemm_usable() || tensor_map_encoder() == nullptr) return false;
  switch (kind) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4: return w.K % kFp4Granule == 0;
    case QuantKind::Fp8: return w.K % kQGranule == 0 && w.block_cols >= w.K;
    case QuantKind::Int4:
      return w.K % kQGranule == 0 && w.N % 8 == 0 && (w.block_cols >= w.K || w.block_cols % kQGranule == 0) &&
             a16(w.codes) && a16(w.scales) && (!w.zeros || (w.N % 32 == 0 && a16(w.zeros)));
    default: return false;
  }
}

}  // namespace

bool moe_q_gemm_applies(QuantKind kind, const QuantDev& gu, const QuantDev& dn, int64_t Hm, int64_t I,
                        const void* u) {
  const int64_t gran = fp4_kind(kind) ? kFp4Granule : kQGranule;
  return q_layout_ok(kind, gu) && q_layout_ok(kind, dn) && gu.K == Hm && dn.K == I && gu.N == 2 * I && dn.N == Hm &&
         Hm % gran == 0 && I % gran == 0 && a16(u);
}

// Two blocks an SM at 128 pairs a tile (2 stages of 44 KB; MXFP4 42, FP8
// 48), one at 256 (2 of 76 KB; FP8 80); INT4 one at 128 (4 of 41 KB).
cudaError_t launch_moe_q_gemm(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn,
                              QuantKind kind) {
  switch (kind) {
    case QuantKind::Nvfp4: return launch_q_format<QFmt::Nvfp4>(s, a, gu, dn);
    case QuantKind::Mxfp4: return launch_q_format<QFmt::Mxfp4>(s, a, gu, dn);
    case QuantKind::Fp8: return launch_q_format<QFmt::Fp8>(s, a, gu, dn);
    case QuantKind::Int4: return launch_q_format<QFmt::Int4>(s, a, gu, dn);
    default: return cudaErrorNotSupported;
  }
}

bool quant_gemm_applies(QuantKind kind, const QuantDev& w, const void* x) { return q_layout_ok(kind, w) && a16(x); }

int quant_gemm_order(QuantKind kind) {
  return fp4_kind(kind) ? 1 : fp8_kind(kind) ? 2 : kind == QuantKind::Int4 ? 3 : 0;
}

cudaError_t launch_quant_gemm_permute(cudaStream_t s, QuantKind kind, const __nv_bfloat16* x, int64_t T, int64_t K,
                                      __nv_bfloat16* xq) {
  auto run = [&]<QFmt F>() {
    return launch_pdl<moe_q_gather_kernel<F>>(s, dim3(blocks_for(T * (K / q_gather_run<F>()), 256)), dim3(256), 0, x,
                                              K, 1, static_cast<const int32_t*>(nullptr),
                                              static_cast<const int32_t*>(nullptr), 0, T, xq);
  };
  if (fp8_kind(kind)) return run.template operator()<QFmt::Fp8>();
  if (fp4_kind(kind)) return run.template operator()<QFmt::Nvfp4>();  // MXFP4's order is NVFP4's
  if (kind == QuantKind::Int4) return run.template operator()<QFmt::Int4>();
  return cudaErrorNotSupported;
}

cudaError_t launch_quant_gemm(cudaStream_t s, QuantKind kind, const __nv_bfloat16* xq, int64_t T, const QuantDev& w,
                              void* out, int odt, int64_t ldo) {
  switch (kind) {
    case QuantKind::Nvfp4: return launch_q_dense_format<QFmt::Nvfp4>(s, xq, T, w, out, odt, ldo);
    case QuantKind::Mxfp4: return launch_q_dense_format<QFmt::Mxfp4>(s, xq, T, w, out, odt, ldo);
    case QuantKind::Fp8: return launch_q_dense_format<QFmt::Fp8>(s, xq, T, w, out, odt, ldo);
    case QuantKind::Int4: return launch_q_dense_format<QFmt::Int4>(s, xq, T, w, out, odt, ldo);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace muse::cuda
