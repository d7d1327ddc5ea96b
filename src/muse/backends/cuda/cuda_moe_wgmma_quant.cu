// The latent experts' two products with NVFP4 / MXFP4 / FP8 weights as a
// grouped GEMM on Hopper's warpgroup MMA (sm_90a), for steps with many
// (token, expert) pairs: prefill. Each warp decodes its A fragments (FP4:
// the codes times their block scales, FP8: the E4M3 codes, both exact in
// bf16) from the staged codes into registers right before its wgmma steps,
// so HBM and shared memory carry only the stored bytes.
//
// Why: the per-tile kernels (cuda_quant_moe.cu) take at most 8 pairs of one
// expert a block and stream that expert's codes once per 8 pairs; an 8K
// prefill of the NVFP4 Spark slice spent 124 ms a layer in them (H100,
// 2026-12-06), 3.8× the BF16 experts' grouped GEMM (cuda_moe_wgmma.cu), whose
// shape this follows: a tile is NX pairs of one expert against 128 weight
// rows, a cluster of four blocks are its four K-slices, and the tiles of one
// expert run side by side over each weight tile.
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
// The sums are then P0 + P1 + P2 + P3 times the row factor (NVFP4 global ·
// 2^64, MXFP4 2^64, FP8 its per-tensor / per-channel scale), as the per-tile
// kernels add and scale them. FP8 with block scales (a factor per granule)
// is not taken.
#include <algorithm>

#include "muse/backends/cuda/cuda_moe_wgmma.cuh"
#include "muse/backends/cuda/cuda_moe_wgmma.h"
#include "muse/backends/cuda/cuda_quant_fp8_int4.cuh"

namespace muse::cuda {
namespace {

constexpr int kQUnit = 128;                              // k a unit
constexpr uint32_t kQCodeBytes = uint32_t(kWgW) * 128;   // FP8: 128 rows × a granule's 128 bytes
constexpr uint32_t kFp4CodeBytes = uint32_t(kWgW) * 64;  // FP4: 128 rows × 4 pieces of 16 bytes
constexpr bool fp8_fmt(QFmt F) { return F == QFmt::Fp8; }
template <QFmt F>
constexpr uint32_t fp4_scale_row() { return F == QFmt::Mxfp4 ? 16 : 32; }  // scale bytes of a granule's row
template <QFmt F, int NX>
constexpr uint32_t q_stage_bytes() {  // x (1024-byte aligned), codes (FP8: 1024-aligned, swizzled), FP4 scales
  return uint32_t(2 * NX * kWgRowBytes) +
         (fp8_fmt(F) ? kQCodeBytes : kFp4CodeBytes + uint32_t(kWgW) * fp4_scale_row<F>());
}
template <QFmt F>
constexpr int q_granule() { return fp8_fmt(F) ? kQGranule : kFp4Granule; }
template <QFmt F>
constexpr int q_gather_run() { return fp8_fmt(F) ? 64 : 32; }  // positions a gather thread writes

// The activation order of a granule (512 k): position 128·j + 32·w + 16·h +
// 8·hi + 2·tq + b holds k = 128·tq + 32·j + 8·w + 2·h + hi + 4·b, the k of
// step (j, w, i = 2h) in mma slot 8·hi + 2·tq + b. From the four 8-k runs
// in[tq] = k 128·tq + 32·j + 8·w .., the 32 positions 128·j + 32·w ..:
// x_pairs_4apart gives (k + m, k + m + 4), m = 0..3, the words of slots
// (2·tq, 2·tq + 1) of step h = m / 2, half hi = m % 2.
__device__ __forceinline__ void fp4_permute32(const uint4 (&in)[4], uint4* dst) {
  uint32_t p[4][4];
#pragma unroll
  for (int tq = 0; tq < 4; ++tq) x_pairs_4apart(in[tq], p[tq]);
#pragma unroll
  for (int m = 0; m < 4; ++m) dst[m] = make_uint4(p[0][m], p[1][m], p[2][m], p[3][m]);
}

// The FP8 order of a granule (128 k): position 64·j + 16·w + 8·hi + 2·tq + b
// holds k = 32·tq + 16·j + 4·w + hi + 2·b, the k of step (j, w) in mma slot
// 8·hi + 2·tq + b (x_pairs_2apart's pairs). From in[tq][2] = k 32·tq + 16·j
// .. + 15, the 64 positions 64·j ..
__device__ __forceinline__ void fp8_permute64(const uint4 (&in)[4][2], uint4* dst) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t p[4][2];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq) {
      const uint4& v = in[tq][w >> 1];
      if (w & 1) x_pairs_2apart(v.z, v.w, p[tq]);
      else x_pairs_2apart(v.x, v.y, p[tq]);
    }
    dst[2 * w] = make_uint4(p[0][0], p[1][0], p[2][0], p[3][0]);
    dst[2 * w + 1] = make_uint4(p[0][1], p[1][1], p[2][1], p[3][1]);
  }
}

// x rows gathered and permuted: grouped row g <- u[order[g] / topk] in the
// format's order (K a multiple of its granule); one thread a run of
// positions: FP4 32, (j, w) of a granule; FP8 64, piece j of a granule.
template <QFmt F>
__global__ void moe_q_gather_kernel(const __nv_bfloat16* __restrict__ u, int64_t Hm, int topk,
                                    const int32_t* __restrict__ order, const int32_t* __restrict__ starts, int E,
                                    int64_t R, __nv_bfloat16* __restrict__ xg) {
  pdl_wait();  // the grouping (and u) come from the kernels before
  pdl_launch_dependents();
  constexpr int kRun = q_gather_run<F>(), kRunsGran = q_granule<F>() / kRun;
  const int64_t runs = Hm / kRun, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * runs) return;
  const int64_t g = i / runs, r = i % runs, k0 = (r / kRunsGran) * q_granule<F>(), jw = r % kRunsGran;
  if (g >= starts[E]) return;
  const __nv_bfloat16* src = u + int64_t(order[g] / topk) * Hm + k0;
  __nv_bfloat16* dst = xg + g * Hm + k0 + kRun * jw;
  if constexpr (fp8_fmt(F)) {  // jw = j
    uint4 in[4][2];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq)
#pragma unroll
      for (int q = 0; q < 2; ++q) in[tq][q] = *reinterpret_cast<const uint4*>(src + 32 * tq + 16 * jw + 8 * q);
    fp8_permute64(in, reinterpret_cast<uint4*>(dst));
  } else {  // jw = 4·j + w
    uint4 in[4];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq) in[tq] = *reinterpret_cast<const uint4*>(src + 8 * jw + 128 * tq);
    fp4_permute32(in, reinterpret_cast<uint4*>(dst));
  }
}

struct QMaps {
  CUtensorMap x;       // grouped activations (permuted), boxes of 64 k × NX rows
  CUtensorMap codes;   // FP4: [E][N][K/128][4][16 bytes], box {16, 1, 4, 64, 1}: piece j of 64 rows;
                       // FP8: [E][N][K], box {128, 64, 1}: a granule of 64 rows, 128-byte swizzle
  CUtensorMap scales;  // FP4: [E][N][K/512][granule's scale bytes], box {bytes, 1, 64, 1}
};

// What the finishes need of the weight: the row factors.
struct QRows {
  const float* global;     // NVFP4: [E · parts], else null
  const uint8_t* scales;   // FP8: per-tensor / per-channel F32 scales
  int64_t N, scales_stride;
  int parts, block_rows;
};
template <QFmt F>
__device__ __forceinline__ float q_row_factor(const QRows& w, int e, int64_t n) {
  if constexpr (fp8_fmt(F)) {  // per tensor / per channel: moe_q_gemm_applies refuses block scales
    return reinterpret_cast<const float*>(w.scales + e * w.scales_stride)[n / w.block_rows];
  } else {
    if (!w.global) return kFp4Unbias;
    const int64_t parts = w.parts > 0 ? w.parts : 1;
    return w.global[e * parts + n / (w.N / parts)] * kFp4Unbias;
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

// A K-slice's units through the copy engine's stages (wg_tma_units' loop
// with the A fragments decoded from codes). FP4: unit u is piece u % 4 of
// the slice's granule u / 4; each lane reads its 16-byte pieces of rows ra
// and ra + 8 and, at a granule's first unit, its scale bytes of the granule
// (NVFP4: 8 of each row's 32, MXFP4 4 of 16), as fp4_granule_mma does. FP8:
// unit u is the slice's granule u; each lane reads chunks 2·tq and 2·tq + 1
// of rows ra and ra + 8 (128-byte swizzle: chunk c of row ρ at c ^ (ρ % 8))
// and decodes them as fp8_accumulate does.
template <QFmt F, int NX, int STAGES, class Refill>
__device__ __forceinline__ void q_units(float (&d)[NX / 2], uint32_t base, uint32_t full, uint32_t empty, int units,
                                        const uint32_t* lut, Refill&& refill) {
  constexpr bool MX = F == QFmt::Mxfp4;
  constexpr uint32_t kStage = q_stage_bytes<F, NX>(), kX = uint32_t(2 * NX * kWgRowBytes);
  constexpr uint32_t kSRow = fp4_scale_row<F>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = threadIdx.x >> 7;
  const int g = lane >> 2, tq = lane & 3, ra = 64 * wg + 16 * (warp & 3) + g;
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  uint32_t code_off[2][2], scale_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = ra + 8 * h;
#pragma unroll
    for (int j = 0; j < 2; ++j)
      code_off[h][j] = fp8_fmt(F) ? kX + uint32_t(row) * 128 + uint32_t(((2 * tq + j) ^ (row & 7)) << 4)
                                  : kX + uint32_t(row) * 64 + 16 * tq;
    scale_off[h] = kX + kFp4CodeBytes + uint32_t(row) * kSRow + (MX ? 4 : 8) * tq;
  }
  uint2 sc[2] = {};
  for (int u = 0; u < units; ++u) {
    const int st = u % STAGES, j = u & 3;
    const uint32_t stage = base + uint32_t(st) * kStage;
    mbar_wait(full + 8 * st, uint32_t((u / STAGES) & 1));
    uint32_t a[8][4];
    if constexpr (fp8_fmt(F)) {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint4 cv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) cv[h] = lds128(stage + code_off[h][jj]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t p[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t word = w == 0 ? cv[h].x : w == 1 ? cv[h].y : w == 2 ? cv[h].z : cv[h].w;
            p[h][0] = bf16x2_mul(e4m3_pair<0>(word), kE4m3Unbias);
            p[h][1] = bf16x2_mul(e4m3_pair<1>(word), kE4m3Unbias);
          }
          uint32_t(&at)[4] = a[4 * jj + w];
          at[0] = p[0][0], at[1] = p[1][0], at[2] = p[0][1], at[3] = p[1][1];
        }
      }
    } else {
      if (j == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sc[h] = MX ? make_uint2(lds32(stage + scale_off[h]), 0u) : lds64(stage + scale_off[h]);
      }
      uint4 cv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) cv[h] = lds128(stage + code_off[h][0]);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t p[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int byte = MX ? j : 2 * j + (w >> 1);
          const uint32_t b = ((byte < 4 ? sc[h].x : sc[h].y) >> (8 * (byte & 3))) & 0xFFu;
          const uint32_t fs = lut[b];
          const uint32_t word = w == 0 ? cv[h].x : w == 1 ? cv[h].y : w == 2 ? cv[h].z : cv[h].w;
          e2m1_pairs(word, p[h]);
#pragma unroll
          for (int i = 0; i < 4; ++i) p[h][i] = bf16x2_mul(p[h][i], fs);
        }
        a[2 * w][0] = p[0][0], a[2 * w][1] = p[1][0], a[2 * w][2] = p[0][1], a[2 * w][3] = p[1][1];
        a[2 * w + 1][0] = p[0][2], a[2 * w + 1][1] = p[1][2], a[2 * w + 1][2] = p[0][3], a[2 * w + 1][3] = p[1][3];
      }
    }
    const uint64_t db[2] = {wg_desc(stage), wg_desc(stage + uint32_t(NX * kWgRowBytes))};
    wg_hold(d);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 8; ++t) wgmma_rs<NX>(d, a[t], db[t >> 2] + 2 * (t & 3));  // +32 bytes a k16 step
    wg_commit();
    if (threadIdx.x == 0 && u >= 1 && u - 1 + STAGES < units) {
      mbar_wait(empty + 8 * ((u - 1) % STAGES), uint32_t(((u - 1) / STAGES) & 1));  // every warp is past unit u - 1
      refill(u - 1 + STAGES);
    }
    wg_wait<0>();
    wg_hold(d);
#pragma unroll
    for (int t = 0; t < 8; ++t) wg_hold(a[t]);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * st);
  }
}

// gate/up's finish: a = bf16(silu(γ·f) · υ·f') in the down product's order.
// FP4: quads 2m and 2m + 1 of a row (neighbouring lanes) are elements 0..3
// and 4..7 of one 8-k run, whose words (element c, element c + 4) sit at
// positions 16·(c / 2) + 8·(c % 2) + 2·tq of the run's 32 (fp4_permute32):
// the lanes swap two values each and store two words each. FP8: a quad is
// one 4-k run, words (0, 2) and (1, 3) at positions 2·tq and 8 + 2·tq of
// its step (fp8_permute64).
template <QFmt F, int NX>
__device__ __forceinline__ void q_swiglu_finish(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                                const MoeTile& tl, int64_t I, const QRows& rows,
                                                __nv_bfloat16* ap) {
  using Q = MoeQuads<NX, 16>;
  float4 v[2][Q::kEach];
  moe_cluster_quads<NX, 16, 2>(d, part_base, s, v);
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
    const int64_t run = i & ~int64_t(7), r = run % 512;
    const int64_t at = (run - r) + 128 * ((r % 128) / 32) + 32 * ((r % 32) / 8) + 2 * (r / 128);
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

// down's finish: Y = (P0 + P1 + P2 + P3) · f(n), fp32, row stride Hm.
template <QFmt F, int NX>
__device__ __forceinline__ void q_down_finish(const float (&d)[NX / 2], uint8_t* part_base, int s,
                                              const MoeTile& tl, int64_t Hm, const QRows& rows, float* Y) {
  using Q = MoeQuads<NX, 32>;
  float4 v[1][Q::kEach];
  moe_cluster_quads<NX, 32, 1>(d, part_base, s, v);
  const int tid = int(threadIdx.x);
#pragma unroll
  for (int j = 0; j < Q::kEach; ++j) {
    const int e = tid + j * kWgThreads;
    const int t = s * Q::kRowsEach + e / 32;
    const int64_t n = int64_t(tl.wt) * 128 + 4 * (e % 32);
    if (t >= tl.rows || n >= Hm) continue;
    const float4 r = make_float4(v[0][j].x * q_row_factor<F>(rows, tl.e, n),
                                 v[0][j].y * q_row_factor<F>(rows, tl.e, n + 1),
                                 v[0][j].z * q_row_factor<F>(rows, tl.e, n + 2),
                                 v[0][j].w * q_row_factor<F>(rows, tl.e, n + 3));
    *reinterpret_cast<float4*>(Y + (tl.g0 + t) * Hm + n) = r;  // Hm % 128 == 0: whole, aligned quads
  }
  cluster_wait();
}
#endif

// One cluster tile: K-slice s = this block's rank in its cluster; the
// weight tile is two boxes of 64 rows (gate rows i0.. and up rows I + i0..
// of expert e for gate/up, rows n0.. and n0 + 64.. of its down matrix).
//   GATE_UP: x = u gathered (K = Hm), out = a, permuted, bf16 [R, I];
//   else:    x = a permuted (K = I), out = Y fp32 [R, Hm].
template <QFmt F, int NX, int STAGES, bool GATE_UP>
__global__ void __launch_bounds__(kWgThreads, NX == 128 ? 2 : 1)
    moe_q_kernel(const __grid_constant__ QMaps maps, QRows rows, const int32_t* starts, const int32_t* tile_starts,
                 int E, int tn, int64_t K, int64_t I, int64_t Hm, void* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX == 128 || NX == 256, "grouped GEMM tiles");
  constexpr uint32_t kStage = q_stage_bytes<F, NX>(), kX = uint32_t(2 * NX * kWgRowBytes);
  constexpr uint32_t kSRow = fp4_scale_row<F>();
  extern __shared__ uint8_t wg_raw[];
  __shared__ alignas(8) uint64_t bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  __shared__ uint32_t lut[256];
  pdl_wait();  // the grouping decides every tile; x comes from the kernel before
  MoeTile tl;
  if (!moe_tile<NX>(starts, tile_starts, E, tn, int64_t(blockIdx.x / kSplit), tl)) return;  // the whole cluster
  if constexpr (!fp8_fmt(F)) fp4_fill_lut<F == QFmt::Mxfp4>(lut);
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
  const uint32_t full = smem_addr(bars), empty = full + 8 * STAGES;
  const int s = int(cg::this_cluster().block_rank());  // this block's K-slice
  const int64_t ngran = K / q_granule<F>();
  const int units = s < ngran ? (fp8_fmt(F) ? 1 : 4) * int((ngran - s + kSplit - 1) / kSplit) : 0;
  const int r0 = GATE_UP ? tl.wt * 64 : tl.wt * 128;
  const int r1 = GATE_UP ? int(I + r0) : r0 + 64;
  const int t0 = int(tl.g0);
  auto load = [&](int u) {  // unit u into its stage (thread 0)
    const uint32_t stage = base + uint32_t(u % STAGES) * kStage, bar = full + 8 * (u % STAGES);
    if constexpr (fp8_fmt(F)) {
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
  q_units<F, NX, STAGES>(d, base, full, empty, units, lut, load);
  pdl_streaming_done();
  uint8_t* part_base = wg_raw + (base - raw);
  if constexpr (GATE_UP) q_swiglu_finish<F, NX>(d, part_base, s, tl, I, rows, static_cast<__nv_bfloat16*>(out));
  else q_down_finish<F, NX>(d, part_base, s, tl, Hm, rows, static_cast<float*>(out));
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
  if constexpr (fp8_fmt(F)) {
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
  const QRows rg{gu.global, gu.scales, gu.N, gu.scales_stride, gu.global_parts, gu.block_rows};
  const QRows rd{dn.global, dn.scales, dn.N, dn.scales_stride, dn.global_parts, dn.block_rows};
  if (cudaError_t e = launch_slice_clusters<moe_q_kernel<F, NX, STAGES, true>>(
          s, max_tiles * tn_gu * kSplit, kWgThreads, smem, mg, rg, a.starts, a.tile_starts, a.E, tn_gu, Hm, I, Hm,
          static_cast<void*>(a.ap));
      e != cudaSuccess)
    return e;
  return launch_slice_clusters<moe_q_kernel<F, NX, STAGES, false>>(s, max_tiles * tn_dn * kSplit, kWgThreads, smem,
                                                                   md, rd, a.starts, a.tile_starts, a.E, tn_dn, I, I,
                                                                   Hm, static_cast<void*>(a.Y));
}

template <QFmt F>
cudaError_t launch_q_format(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn) {
  return a.nx == 128 ? launch_q_products<F, 128, 2>(s, a, gu, dn) : launch_q_products<F, 256, 2>(s, a, gu, dn);
}

}  // namespace

bool moe_q_gemm_applies(QuantKind kind, const QuantDev& gu, const QuantDev& dn, int64_t Hm, int64_t I,
                        const void* u) {
  const bool fp4 = kind == QuantKind::Nvfp4 || kind == QuantKind::Mxfp4, fp8 = kind == QuantKind::Fp8;
  const int64_t gran = fp8 ? kQGranule : kFp4Granule;
  return (fp4 || (fp8 && gu.block_cols >= gu.K && dn.block_cols >= dn.K)) && wgmma_gemm_usable() &&
         tensor_map_encoder() != nullptr && gu.aligned && dn.aligned && gu.K == Hm && dn.K == I && gu.N == 2 * I &&
         dn.N == Hm && Hm % gran == 0 && I % gran == 0 && reinterpret_cast<uintptr_t>(u) % 16 == 0;
}

// Two blocks an SM at 128 pairs a tile (2 stages of 44 KB; MXFP4 42, FP8
// 48), one at 256 (2 of 76 KB; FP8 80).
cudaError_t launch_moe_q_gemm(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn,
                              QuantKind kind) {
  switch (kind) {
    case QuantKind::Nvfp4: return launch_q_format<QFmt::Nvfp4>(s, a, gu, dn);
    case QuantKind::Mxfp4: return launch_q_format<QFmt::Mxfp4>(s, a, gu, dn);
    case QuantKind::Fp8: return launch_q_format<QFmt::Fp8>(s, a, gu, dn);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace muse::cuda
